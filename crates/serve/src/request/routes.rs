//! The routes, where every request enters: the three APIs' handlers walk the request down the path once
//! (read, conversation, rounds, upstream, response); `count_tokens`, the status page, the CLI route for
//! other `condense` processes, and the pass-through of every other `/v1/` path.

use crate::api::CONTEXT_COMPACTION_FAILED;
use crate::billing::Side;
use crate::state::State;
use crate::request::read::{read_body, read_request};
use crate::request::conversation::{conv_for, conv_lookup, prepare, with_conv};
use crate::request::rounds::run_rounds;
use crate::request::upstream::{count_upstream, forward_unchanged, unreachable, upstream_body, upstream_for};
use crate::request::response::{conv_error, json_response, stream_back, upstream_headers};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use condense_formats::wire::Api;
use serde_json::{json, Value};
use std::sync::Arc;

/// The routes.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/messages", post(|s, r| handle(s, Api::Anthropic, r)))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(|s, r| handle(s, Api::Chat, r)))
        .route("/v1/responses", post(|s, r| handle(s, Api::Responses, r)))
        .route("/v1beta/models/{*target}", post(gemini))
        .route("/condense/status", get(status))
        .route("/condense/metrics", get(metrics))
        .route("/condense/cli", post(cli))
        .merge(crate::dashboard::routes())
        .fallback(passthrough)
        .layer(axum::middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// The header that carries serve's own token (never forwarded upstream: `x-condense-*` headers stop here).
pub const AUTH_HEADER: &str = "x-condense-auth";

/// With a token configured, every request (the APIs, the pass-through, status, the CLI route) must carry
/// it in [`AUTH_HEADER`]. The comparison takes the same time whatever the header holds (both sides are
/// hashed, and hashes compare in constant time), and a refusal reads the same on every path: it says
/// nothing of the sessions behind it.
async fn authenticate(axum::extract::State(st): S, req: Request, next: axum::middleware::Next) -> Response {
    let Some(token) = &st.cfg.auth_token else { return next.run(req).await };
    let matches = |given: &[u8]| blake3::hash(given) == blake3::hash(token.as_bytes());
    let given = req.headers().get(AUTH_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    if matches(given) || auth_cookie(req.headers()).is_some_and(|c| matches(c.as_bytes())) {
        return next.run(req).await;
    }
    // A browser cannot set a header on a page it opens: the dashboard is opened once as
    // `/condense/?auth=TOKEN`, which stores the token in a cookie for `/condense` and sends the browser on
    // to the page without it in the address.
    let path = req.uri().path().to_string();
    if path.starts_with("/condense") {
        let query = req.uri().query().unwrap_or("");
        if let Some(t) = query.split('&').find_map(|kv| kv.strip_prefix("auth=")) {
            // `%XX` decoded, `+` kept (a base64 token holds `+`; this is not form text).
            let t = percent_encoding::percent_decode_str(t).decode_utf8_lossy();
            if matches(t.as_bytes()) && t.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',') {
                let cookie = format!("{AUTH_COOKIE}={t}; Path=/condense; HttpOnly; SameSite=Strict");
                return (StatusCode::SEE_OTHER, [(axum::http::header::LOCATION, path), (axum::http::header::SET_COOKIE, cookie)]).into_response();
            }
        }
    }
    let message = format!("condense serve: this server needs its token in the `{AUTH_HEADER}` header");
    let path = req.uri().path();
    let api = match path {
        "/v1/messages" | "/v1/messages/count_tokens" => Some(Api::Anthropic),
        p if p.starts_with("/v1/") => Some(Api::Chat),
        p if p.starts_with("/v1beta/") => Some(Api::Gemini),
        _ => None,
    };
    match api {
        Some(api) => json_response(StatusCode::UNAUTHORIZED, &crate::api::error_body(api, "authentication_error", &message)),
        None => (StatusCode::UNAUTHORIZED, format!("{message}\n")).into_response(),
    }
}

/// The cookie that carries serve's token for the dashboard (see [`authenticate`]).
const AUTH_COOKIE: &str = "condense-auth";

/// The value of the [`AUTH_COOKIE`] cookie, when the request carries it.
fn auth_cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(AUTH_COOKIE)?.strip_prefix('='))
}

type S = axum::extract::State<Arc<State>>;

pub(crate) async fn status(axum::extract::State(st): S) -> Response {
    json_response(StatusCode::OK, &st.status().await)
}

/// `/condense/metrics`, in the Prometheus text format.
async fn metrics(axum::extract::State(st): S) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], st.metrics().await).into_response()
}

/// What serve logs of a request, one line when its response starts (target `condense::request`): never a
/// header's value or anything of a body (the session by its id, as `condense sessions` lists it: its name
/// is made of the first prompt's words).
#[derive(Default)]
struct RequestLine {
    session: Option<condense_events::SessionId>,
    /// serve's own time (see [`State::record_latency`]).
    own: Option<std::time::Duration>,
    tokens_received: Option<u64>,
    tokens_sent: Option<u64>,
    stream: bool,
    /// Forwarded unchanged.
    passthrough: bool,
    /// condense refused the request itself: its stable code and the message the client got.
    failure: Option<(&'static str, String)>,
}

/// The stable code of a refusal condense made itself, from its status and message (the engine's codes lead
/// the message of a checkpoint or recovery that could not fit).
fn failure_code(status: StatusCode, message: &str) -> &'static str {
    const CODES: [&str; 3] = ["RECOVERY_BLOCKED", "PROVIDER_OVERFLOW_AFTER_RETRY", "CONTEXT_COMPACTION_FAILED"];
    if let Some(code) = CODES.iter().find(|c| message.starts_with(&format!("{CONTEXT_COMPACTION_FAILED}: {c}")) || message.starts_with(**c)) {
        return code;
    }
    match status.as_u16() {
        400 => "bad_request",
        401 | 403 => "unauthorized",
        408 => "timeout",
        413 => "too_large",
        502 => "upstream_unreachable",
        503 => "unavailable",
        _ => "internal",
    }
}

impl RequestLine {
    fn log(&self, st: &State, api: &str, status: StatusCode) {
        if let Some((code, reason)) = &self.failure {
            st.metrics.request_failures.get_or_create(&crate::metrics::FailureLabel { api: api.to_string(), code }).inc();
            st.live.failure(crate::live::Failure {
                at_ms: crate::live::now_ms(),
                api: api.to_string(),
                status: status.as_u16(),
                code,
                reason: reason.clone(),
                session: self.session,
            });
            // A refusal is what an operator needs to see: at WARN, with its code and the reason the client
            // got (built from counts and names, never from a header or a body's content).
            tracing::warn!(
                target: "condense::request",
                api,
                status = status.as_u16(),
                session = self.session.unwrap_or(0),
                code,
                reason = reason.as_str(),
                "request refused"
            );
            return;
        }
        tracing::info!(
            target: "condense::request",
            api,
            status = status.as_u16(),
            session = self.session.unwrap_or(0),
            own_ms = self.own.map_or(0.0, |d| d.as_secs_f64() * 1000.0),
            tokens_received = self.tokens_received.unwrap_or(0),
            tokens_sent = self.tokens_sent.unwrap_or(0),
            stream = self.stream,
            passthrough = self.passthrough,
            "request"
        );
    }
}

/// How long a database operation may wait before the requests that need the store are answered 503: a
/// PostgreSQL server that stopped answering without refusing connections (a partition, a stopped process)
/// hangs every query until the client gives up; with this, a request waits at most this long plus a tick.
pub const STORE_STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves once the store's oldest operation in flight has waited [`STORE_STALL`] (checked four times a
/// second, the first a tick after the request came: operations a database that just answered again
/// still has in flight finish within it), with how long it has.
async fn store_stalled(st: &State) -> std::time::Duration {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if let Some(d) = st.store().log().stalled_for().filter(|d| *d >= STORE_STALL) {
            return d;
        }
    }
}

/// The Gemini API's `models/MODEL:METHOD`: `generateContent` and `streamGenerateContent` are a
/// conversation's requests, `countTokens` is counted as `count_tokens` is; any other method goes through.
async fn gemini(st: S, req: Request) -> Response {
    let method = crate::request::read::gemini_target(req.uri().path()).map(|(_, m)| m.to_string()).unwrap_or_default();
    match method.as_str() {
        "generateContent" | "streamGenerateContent" => handle(st, Api::Gemini, req).await,
        "countTokens" => count_tokens_of(st, Api::Gemini, req).await,
        _ => passthrough(st, req).await,
    }
}

/// The APIs' conversations: record, prepare, forward, and answer; one log line each. A store that hangs gives a
/// 503 with `retry-after` instead of a request that waits with it (the work in flight on the blocking
/// threads finishes, or fails, when the database answers again; a request given up stops a preparation).
async fn handle(st: S, api: Api, req: Request) -> Response {
    let mut line = RequestLine::default();
    let state = st.0.clone();
    let resp = tokio::select! {
        resp = handle_request(st, api, req, &mut line) => resp,
        waited = store_stalled(&state) => {
            let message = format!(
                "condense serve: the {} has not answered for {} s; send the request again once it does",
                state.store().log().describe(),
                waited.as_secs()
            );
            crate::request::response::retry_after(crate::request::response::api_error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", &message), "5")
        }
    };
    if let Some(crate::request::response::Refused(message)) = resp.extensions().get() {
        line.failure = Some((failure_code(resp.status(), message), message.clone()));
    }
    line.log(&state, api.name(), resp.status());
    resp
}

async fn handle_request(axum::extract::State(st): S, api: Api, req: Request, line: &mut RequestLine) -> Response {
    // A compressed body (Codex compresses for some providers) cannot be read: it goes to the provider as
    // it came, so the agent keeps working, only without condense.
    let compressed = req.headers().get("content-encoding").and_then(|v| v.to_str().ok()).is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
    if compressed {
        line.passthrough = true;
        return forward(&st, req).await;
    }
    let (mut req, bytes, arrived) = match read_request(&st, api, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let parsed = arrived.elapsed();
    line.stream = req.stream;
    if req.raw.units.is_empty() {
        // Nothing of a conversation to manage: forwarded as it came.
        line.passthrough = true;
        return forward_unchanged(&st, &req, bytes.to_vec()).await;
    }
    st.metrics.requests.get_or_create(&crate::metrics::ApiLabel { api: api.name() }).inc();
    let conv = match conv_for(&st, &req).await {
        Ok(c) => c,
        Err(e) => return conv_error(api, &e),
    };
    let prepared = prepare(&st, &conv, &req).await;
    let (rec, built, body, [wait, record, build, write], ledger, session, sent) = match prepared {
        Ok(x) => x,
        Err(e) => {
            line.session = Some(conv.lock().await.session.id());
            return conv_error(api, &e);
        }
    };
    line.session = Some(session);
    let ledger_for_live = ledger.clone();
    // Priced as the providers bill prompt caching with `--price-cache`, and by default for a model whose
    // list prices are known (the dashboard's cost panels and `cache_priced` are then never empty for it).
    if st.cfg.price_cache || (st.cfg.price_known_models && condense_engine::config::list_price_of_request(&st.cfg.file.list_prices, &req.model).is_some()) {
        ledger.record(api, Side::Direct, bytes.clone());
        req.ledger = Some(ledger);
    }
    // Whole requests: the client's system prompt and tool declarations count on both sides.
    let (received, sent_tokens) = (rec.tokens_in + req.overhead, built.request_tokens(req.overhead));
    st.tokens(received, sent_tokens);
    let own = arrived.elapsed();
    st.record_latency(api, own, [parsed, wait, record, build, write]);
    (line.own, line.tokens_received, line.tokens_sent) = (Some(own), Some(received), Some(sent_tokens));
    st.live.record(session, api.name(), &req.model, received, sent_tokens, body.len() as u64, sent, ledger_for_live);
    run_rounds(st, conv, req, rec, body).await
}

/// Forwards a request unchanged (method, path, query, headers, body) and streams the answer back; one log
/// line.
pub(crate) async fn passthrough(axum::extract::State(st): S, req: Request) -> Response {
    let path = req.uri().path();
    let kind = path.strip_prefix("/v1/").or_else(|| path.strip_prefix("/v1beta/")).map(|p| p.split('/').next().unwrap_or("").to_string());
    let resp = forward(&st, req).await;
    let line = RequestLine { passthrough: true, ..RequestLine::default() };
    line.log(&st, kind.as_deref().unwrap_or("other"), resp.status());
    resp
}

async fn forward(st: &State, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if !parts.uri.path().starts_with("/v1/") && !parts.uri.path().starts_with("/v1beta/") {
        return (StatusCode::NOT_FOUND, "condense serve: unknown path (the provider APIs live under /v1/ and /v1beta/, the status at /condense/status)\n").into_response();
    }
    // Forwarded as it is: the body and its copy on the way out.
    let (bytes, _reservation) = match read_body(st, None, &parts.headers, body, 2).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    st.passthrough();
    let base = upstream_for(st, parts.uri.path(), &parts.headers);
    let url = format!("{base}{}", parts.uri.path_and_query().map_or("", |p| p.as_str()));
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
    let sent = st.http.request(method, url).headers(upstream_headers(&parts.headers)).body(bytes).send().await;
    match sent {
        Ok(resp) => stream_back(resp),
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{}\n", unreachable(st, e))).into_response(),
    }
}

/// `count_tokens` counts what condense would send: for a conversation serve holds, the request's message
/// list is replaced by the session's context with the request's new messages after it (a dry run: nothing
/// is recorded, no pipeline decision is made) and condense's tools are added as a request would add them;
/// anything else is forwarded unchanged.
pub(crate) async fn count_tokens(st: S, req: Request) -> Response {
    count_tokens_of(st, Api::Anthropic, req).await
}

/// [`count_tokens`] of `api`'s request (Anthropic's `count_tokens`, Gemini's `countTokens`, whose body
/// takes no tools: condense's are not added).
async fn count_tokens_of(axum::extract::State(st): S, api: Api, req: Request) -> Response {
    let (req, bytes, _) = match read_request(&st, api, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let conv = match conv_lookup(&st, &req, false).await {
        Ok(Some(c)) if !req.raw.units.is_empty() => c,
        Ok(_) => return count_upstream(&st, &req, bytes.to_vec()).await,
        Err(e) => return conv_error(api, &e),
    };
    let (raw, internal) = (req.raw.clone(), req.internal.clone());
    let fields = req.fields.clone();
    let body = with_conv(&conv, move |c| {
        c.dry_run(api, &raw, &internal).map(|mut built| {
            if api == Api::Gemini {
                built.tools.clear();
            }
            upstream_body(api, &raw.buf, &fields, &mut built).0
        })
    })
    .await;
    match body {
        Ok(b) => count_upstream(&st, &req, b).await,
        Err(e) => conv_error(api, &e),
    }
}

/// Runs a CLI command for another `condense` process (authenticated by the token in the store's
/// `serve.json`).
pub(crate) async fn cli(axum::extract::State(st): S, req: Request) -> Response {
    let Some(handler) = st.cfg.cli.clone() else {
        return (StatusCode::NOT_FOUND, "this server runs no CLI commands\n").into_response();
    };
    let (parts, body) = req.into_parts();
    let token = parts.headers.get("x-condense-token").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !crate::lock::token_matches(&st.cfg.store, token) {
        return (StatusCode::FORBIDDEN, "condense serve: a CLI command needs the token from the store's serve.json\n").into_response();
    }
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "condense serve: command too long\n").into_response();
    };
    let argv: Vec<String> = match serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v.get("argv").cloned()).and_then(|a| serde_json::from_value(a).ok()) {
        Some(a) => a,
        None => return (StatusCode::BAD_REQUEST, "condense serve: expected {\"argv\": [..]}\n").into_response(),
    };
    let store = st.store.clone();
    let (out, err, code) = tokio::task::spawn_blocking(move || {
        let r = handler(&store, argv);
        // What a command wrote (an import, a compaction) is durable before it reports done.
        match store.sync() {
            Ok(()) => r,
            Err(e) => (r.0, format!("{}condense: {e}\n", String::from_utf8_lossy(&r.1)).into_bytes(), 2),
        }
    })
    .await
    .unwrap_or_else(|_| (Vec::new(), b"condense: the command panicked\n".to_vec(), 2));
    json_response(StatusCode::OK, &json!({"stdout": String::from_utf8_lossy(&out), "stderr": String::from_utf8_lossy(&err), "code": code}))
}
