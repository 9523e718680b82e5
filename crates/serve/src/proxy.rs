//! The HTTP side: routes, the request flow (record, prepare, forward, record the reply, answer
//! condense's tools and continue), streaming, overflow retry, pass-through of everything else, and the
//! status page.

use crate::api::{self, CONTEXT_COMPACTION_FAILED};
use crate::conv::{Built, Conv, ConvError, Internal, Recorded};
use crate::stream::{self, sse};
use crate::{ServeConfig, ServeError};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use condense_engine::config::model_limits;
use condense_engine::{EngineError, Store};
use condense_events::{Message, SessionId, SourceEvent, Usage};
use condense_formats::wire::{self, Api, RawRequest};
use serde_json::value::RawValue;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex as AsyncMutex;

/// Counters of the running server (never anything from a header or a body).
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    tokens_in: AtomicU64,
    tokens_sent: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cache_read_tokens: AtomicU64,
    cache_write_tokens: AtomicU64,
    tool_rounds: AtomicU64,
    round_limits: AtomicU64,
    overflows: AtomicU64,
    upstream_errors: AtomicU64,
    passthrough: AtomicU64,
    /// serve's own time for each of the last requests, microseconds: from the request read in to its
    /// rewritten body handed to the HTTP client (first round only).
    latencies: std::sync::Mutex<std::collections::VecDeque<[u64; PHASES.len() + 1]>>,
}

/// The phases of serve's own time on a request, as `/condense/status` reports them: reading the body's
/// structure, waiting for a blocking thread and the conversation, recording the request, the engine's
/// preparation and the render into the provider's format, and writing the upstream body.
const PHASES: [&str; 5] = ["parse", "wait", "record", "build", "body"];

/// How many recent requests the latency figures cover.
const LATENCY_WINDOW: usize = 100;

type ConvRef = Arc<AsyncMutex<Conv>>;

/// The server's shared state.
pub struct State {
    store: Store,
    cfg: ServeConfig,
    http: reqwest::Client,
    /// Open conversations by identity.
    convs: AsyncMutex<BTreeMap<String, ConvRef>>,
    /// Session name of every identity serve has recorded (read from the log at start, and again for a
    /// conversation it does not know: another server on a shared store may have started it).
    names: std::sync::Mutex<BTreeMap<String, String>>,
    /// The sessions read for `names`: every id up to this one.
    scanned: std::sync::Mutex<SessionId>,
    counters: Counters,
}

impl State {
    pub(crate) async fn new(store: Store, cfg: ServeConfig) -> Result<Arc<State>, ServeError> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| ServeError::Client(e.to_string()))?;
        let s2 = store.clone();
        let (names, scanned) = tokio::task::spawn_blocking(move || identities(&s2, 0))
            .await
            .expect("identity scan task")
            .map_err(|source| ServeError::Store { path: cfg.store.clone(), source })?;
        Ok(Arc::new(State {
            store,
            cfg,
            http,
            convs: AsyncMutex::new(BTreeMap::new()),
            names: std::sync::Mutex::new(names),
            scanned: std::sync::Mutex::new(scanned),
            counters: Counters::default(),
        }))
    }

    /// The store the server owns.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The status figures as JSON.
    pub async fn status(&self) -> Value {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let convs: Vec<(String, ConvRef)> = self.convs.lock().await.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut sessions = Vec::new();
        let (mut stubs, mut checkpoints) = (0, 0);
        for (_, conv) in convs {
            let c = conv.lock().await;
            stubs += c.figures.stubs;
            checkpoints += c.figures.checkpoints;
            sessions.push(json!({
                "name": c.session.name(), "requests": c.figures.requests, "stubs": c.figures.stubs,
                "checkpoints": c.figures.checkpoints, "messages": c.visible_len(),
            }));
        }
        json!({
            "sessions": self.names.lock().expect("names lock").len(),
            "active_sessions": sessions,
            "requests": g(&c.requests),
            "tokens_in": g(&c.tokens_in),
            "tokens_sent": g(&c.tokens_sent),
            "input_tokens": g(&c.input_tokens),
            "output_tokens": g(&c.output_tokens),
            "cache_read_tokens": g(&c.cache_read_tokens),
            "cache_write_tokens": g(&c.cache_write_tokens),
            "stubs": stubs,
            "checkpoints": checkpoints,
            "tool_rounds": g(&c.tool_rounds),
            "tool_round_limits": g(&c.round_limits),
            "overflows": g(&c.overflows),
            "upstream_errors": g(&c.upstream_errors),
            "passthrough": g(&c.passthrough),
            "latency_ms": self.latency_json(),
            "summarizer_fallbacks": self.cfg.summarizer.as_ref().map_or(0, |s| s.fallbacks().count),
        })
    }

    fn record_latency(&self, d: std::time::Duration, phases: [std::time::Duration; PHASES.len()]) {
        let mut l = self.counters.latencies.lock().expect("latency lock");
        if l.len() == LATENCY_WINDOW {
            l.pop_front();
        }
        let mut row = [d.as_micros() as u64; PHASES.len() + 1];
        for (i, p) in phases.iter().enumerate() {
            row[i + 1] = p.as_micros() as u64;
        }
        l.push_back(row);
    }

    fn latency_json(&self) -> Value {
        let rows: Vec<[u64; PHASES.len() + 1]> = self.counters.latencies.lock().expect("latency lock").iter().copied().collect();
        let figures = |col: usize| {
            let mut v: Vec<u64> = rows.iter().map(|r| r[col]).collect();
            v.sort_unstable();
            let at = |p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |us| *us as f64 / 1000.0);
            (at(0.5), at(0.99), at(1.0))
        };
        let (p50, p99, max) = figures(0);
        let mut phases = serde_json::Map::new();
        for (i, name) in PHASES.iter().enumerate() {
            let (p50, p99, max) = figures(i + 1);
            phases.insert((*name).into(), json!({"p50": p50, "p99": p99, "max": max}));
        }
        json!({"requests": rows.len(), "p50": p50, "p99": p99, "max": max, "phases": phases})
    }

    fn count_usage(&self, u: &Option<Usage>) {
        if let Some(u) = u {
            let c = &self.counters;
            c.input_tokens.fetch_add(u.input, Ordering::Relaxed);
            c.output_tokens.fetch_add(u.output, Ordering::Relaxed);
            c.cache_read_tokens.fetch_add(u.cache_read, Ordering::Relaxed);
            c.cache_write_tokens.fetch_add(u.cache_write, Ordering::Relaxed);
        }
    }
}

/// The identity → session name of every session serve started, from each session's first event.
fn identities(store: &Store, after: SessionId) -> Result<(BTreeMap<String, String>, SessionId), EngineError> {
    let mut out = BTreeMap::new();
    let sessions: Vec<_> = store.sessions()?.into_iter().filter(|i| i.id > after).collect();
    // Read again next time: from the first session created and not written yet (its first event names
    // its conversation), else from the newest.
    let upto = sessions.iter().find(|i| i.head == 0).map_or_else(|| sessions.last().map_or(after, |i| i.id), |i| i.id - 1);
    for info in sessions {
        if info.head == 0 {
            continue;
        }
        if let Some(env) = store.log().read(info.id, 1, 1)?.into_iter().next() {
            if let condense_events::Event::Source(SourceEvent::SessionStarted { source, source_id: Some(id), .. }) = env.body {
                if source.starts_with("serve:") {
                    out.insert(id, info.name);
                }
            }
        }
    }
    Ok((out, upto))
}

/// The routes.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/messages", post(|s, r| handle(s, Api::Anthropic, r)))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(|s, r| handle(s, Api::Chat, r)))
        .route("/v1/responses", post(|s, r| handle(s, Api::Responses, r)))
        .route("/condense/status", get(status))
        .route("/condense/cli", post(cli))
        .fallback(passthrough)
        .with_state(state)
}

type S = axum::extract::State<Arc<State>>;

async fn status(axum::extract::State(st): S) -> Response {
    json_response(StatusCode::OK, &st.status().await)
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn api_error(api: Api, status: StatusCode, kind: &str, message: &str) -> Response {
    json_response(status, &api::error_body(api, kind, message))
}

/// Headers that describe one hop, not the request.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-authenticate" | "proxy-authorization" | "te" | "trailer" | "trailers"
            | "transfer-encoding" | "upgrade" | "host" | "content-length" | "accept-encoding"
    ) || name.starts_with("x-condense-")
}

/// The client's headers as they go upstream: everything but hop-by-hop ones, untouched (the API key and
/// authorization included; they are never stored or shown).
fn upstream_headers(h: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (k, v) in h {
        if !hop_by_hop(k.as_str()) {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

/// The upstream's response headers as they go to the client.
fn response_headers(h: &reqwest::header::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    h.iter()
        .filter(|(k, _)| !hop_by_hop(k.as_str()) && k.as_str() != "content-encoding")
        .filter_map(|(k, v)| Some((HeaderName::from_bytes(k.as_str().as_bytes()).ok()?, HeaderValue::from_bytes(v.as_bytes()).ok()?)))
        .collect()
}

fn with_headers(mut r: Response, h: Vec<(HeaderName, HeaderValue)>) -> Response {
    for (k, v) in h {
        r.headers_mut().insert(k, v);
    }
    r
}

/// Which upstream a request that is not one of the three APIs goes to.
fn upstream_for(st: &State, h: &HeaderMap) -> String {
    if h.contains_key("anthropic-version") || h.contains_key("x-api-key") {
        st.cfg.anthropic_upstream.clone()
    } else {
        st.cfg.openai_upstream.clone()
    }
}

/// Forwards a request unchanged (method, path, query, headers, body) and streams the answer back.
async fn passthrough(axum::extract::State(st): S, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if !parts.uri.path().starts_with("/v1/") {
        return (StatusCode::NOT_FOUND, "condense serve: unknown path (the provider APIs live under /v1/, the status at /condense/status)\n").into_response();
    }
    let bytes = match axum::body::to_bytes(body, st.cfg.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, format!("condense serve: the request body is over the {}-byte limit\n", st.cfg.max_body_bytes)).into_response(),
    };
    st.counters.passthrough.fetch_add(1, Ordering::Relaxed);
    let base = upstream_for(&st, &parts.headers);
    let url = format!("{base}{}", parts.uri.path_and_query().map_or("", |p| p.as_str()));
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
    let sent = st.http.request(method, url).headers(upstream_headers(&parts.headers)).body(bytes).send().await;
    match sent {
        Ok(resp) => stream_back(resp),
        Err(e) => {
            st.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
            (StatusCode::BAD_GATEWAY, format!("condense serve: upstream unreachable: {}\n", e.without_url())).into_response()
        }
    }
}

/// An upstream response passed to the client as it arrives.
fn stream_back(resp: reqwest::Response) -> Response {
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response_headers(resp.headers());
    let body = Body::from_stream(resp.bytes_stream().map(|r| r.map_err(std::io::Error::other)));
    with_headers((status, body).into_response(), headers)
}

/// Runs engine work for a conversation on a blocking thread, with the conversation locked.
async fn with_conv<R: Send + 'static>(conv: &ConvRef, f: impl FnOnce(&mut Conv) -> R + Send + 'static) -> R {
    let mut guard = conv.clone().lock_owned().await;
    tokio::task::spawn_blocking(move || {
        let r = f(&mut guard);
        guard.mark_synced();
        r
    })
    .await
    .expect("engine task")
}

/// A JSON object's fields in the client's order, each borrowed as the client's JSON text.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fields<'de>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The range of `part` (a slice of `buf`) within `buf`.
fn range_in(buf: &[u8], part: &str) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// The names a request's tools declare, read without the rest of their definitions.
#[derive(serde::Deserialize)]
struct ToolName {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    function: Option<FunctionName>,
}

#[derive(serde::Deserialize)]
struct FunctionName {
    #[serde(default)]
    name: Option<String>,
}

/// What a request is, once read.
struct Req {
    api: Api,
    headers: HeaderMap,
    query: String,
    /// The client's body, field by field as it wrote them: ranges of the body `raw.buf`.
    fields: Arc<Vec<(String, std::ops::Range<usize>)>>,
    /// Its message list, split into units.
    raw: Arc<RawRequest>,
    internal: Internal,
    stream: bool,
    model: String,
    /// The body's `metadata` (for the conversation's identity).
    metadata: Value,
    /// What it carries besides the conversation (system prompt, instructions, tool declarations), in
    /// estimated tokens (bytes / 4, rounded up).
    overhead: u64,
}

impl Req {
    /// The upstream body for what the engine built.
    fn upstream_body(&self, built: &Built) -> Vec<u8> {
        upstream_body(self.api, &self.raw.buf, &self.fields, built)
    }
}

/// The upstream body: the client's fields in its order and as it wrote them, its message list replaced and
/// condense's tools added after the client's.
fn upstream_body(api: Api, buf: &[u8], fields: &[(String, std::ops::Range<usize>)], built: &Built) -> Vec<u8> {
    {
        let field = api.list_field();
        let mut out = Vec::with_capacity(built.list.len() + 64 * 1024);
        out.push(b'{');
        let ours: Vec<String> = built.tools.iter().map(Value::to_string).collect();
        let mut tools_written = false;
        for (i, (k, r)) in fields.iter().enumerate() {
            let v = std::str::from_utf8(&buf[r.clone()]).unwrap_or("null");
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, k).expect("JSON of a key");
            out.push(b':');
            if k == field {
                out.extend_from_slice(&built.list);
            } else if k == "tools" && !ours.is_empty() && v.trim_start().starts_with('[') {
                let text = v.trim_end();
                let inner = text[..text.len() - 1].trim_end();
                out.extend_from_slice(inner.as_bytes());
                if !inner.ends_with('[') {
                    out.push(b',');
                }
                out.extend_from_slice(ours.join(",").as_bytes());
                out.push(b']');
                tools_written = true;
            } else {
                out.extend_from_slice(v.as_bytes());
            }
        }
        if !tools_written && !ours.is_empty() {
            if !fields.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(format!("\"tools\":[{}]", ours.join(",")).as_bytes());
        }
        out.push(b'}');
        out
    }
}

/// Reads a request of one of the three APIs: its body bytes, and the request, or the error response.
async fn read_request(st: &State, api: Api, req: Request) -> Result<(Req, bytes::Bytes, std::time::Instant), Response> {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, st.cfg.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => {
            return Err(api_error(api, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", &format!("condense serve: the request body is over the {}-byte limit", st.cfg.max_body_bytes)))
        }
    };
    let arrived = std::time::Instant::now();
    let bad = |m: String| api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("condense serve: {m}"));
    let (fields, items, listed) = {
        let fields = match serde_json::from_slice::<Fields<'_>>(&bytes) {
            Ok(f) => f.0,
            Err(e) if e.is_data() => return Err(bad("the request body must be a JSON object".into())),
            Err(e) => return Err(bad(format!("the request body is not JSON: {e}"))),
        };
        let field = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let Some(list) = field(api.list_field()) else { return Err(bad(format!("`{}` must be a list", api.list_field()))) };
        let items: Option<Vec<std::ops::Range<usize>>> =
            serde_json::from_str::<Vec<&RawValue>>(list.get()).ok().map(|v| v.into_iter().map(|i| range_in(&bytes, i.get())).collect());
        // Responses takes `input` as a plain string too: one user message.
        let listed = match (&items, serde_json::from_str::<String>(list.get())) {
            (None, Ok(text)) if api == Api::Responses => Some(json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}])),
            (None, _) => return Err(bad(format!("`{}` must be a list", api.list_field()))),
            _ => None,
        };
        let ranges: Vec<(String, std::ops::Range<usize>)> = fields.iter().map(|(k, v)| (k.clone(), range_in(&bytes, v.get()))).collect();
        (ranges, items, listed)
    };
    let text_of = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, r)| &bytes[r.clone()]);
    let tool_names: Vec<String> = text_of("tools")
        .and_then(|t| serde_json::from_slice::<Vec<ToolName>>(t).ok())
        .map(|ts| ts.into_iter().filter_map(|t| t.name.or(t.function.and_then(|f| f.name))).collect())
        .unwrap_or_default();
    let stream = text_of("stream").and_then(|t| serde_json::from_slice::<bool>(t).ok()).unwrap_or(false);
    let model = text_of("model").and_then(|t| serde_json::from_slice::<String>(t).ok()).unwrap_or_default();
    let metadata = text_of("metadata").and_then(|t| serde_json::from_slice::<Value>(t).ok()).unwrap_or(Value::Null);
    let raw = match (items, listed) {
        (Some(items), _) => wire::split_units(api, bytes.clone(), items),
        (None, Some(list)) => wire::split_values(api, list.as_array().expect("a list")),
        (None, None) => unreachable!("checked above"),
    };
    let mut raw = match raw {
        Ok(r) => r,
        Err(e) => return Err(bad(e.to_string())),
    };
    // The fields' ranges are of the body; a list made from a string input lives in its own buffer.
    if raw.buf.as_ptr() != bytes.as_ptr() {
        let mut joined = bytes.to_vec();
        let offset = joined.len();
        joined.extend_from_slice(&raw.buf);
        raw.items = raw.items.iter().map(|r| r.start + offset..r.end + offset).collect();
        raw.buf = bytes::Bytes::from(joined);
    }
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    // What every request carries besides the conversation: the system prompt (a field, or the leading
    // system/developer messages), instructions and tool declarations.
    let overhead_bytes: usize = ["system", "instructions", "tools"].iter().filter_map(|k| text_of(k)).map(<[u8]>::len).sum::<usize>()
        + raw.items[..raw.system].iter().map(|r| r.len()).sum::<usize>();
    let overhead = overhead_bytes.div_ceil(4) as u64;
    let req = Req { api, headers: parts.headers, query, fields: Arc::new(fields), raw: Arc::new(raw), internal: Internal { client_tools: tool_names }, overhead, stream, model, metadata };
    Ok((req, bytes, arrived))
}

/// The three APIs: record, prepare, forward, and answer.
async fn handle(axum::extract::State(st): S, api: Api, req: Request) -> Response {
    // A compressed body (Codex compresses for some providers) cannot be read: it goes to the provider as
    // it came, so the agent keeps working, only without condense.
    let compressed = req.headers().get("content-encoding").and_then(|v| v.to_str().ok()).is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
    if compressed {
        return passthrough(axum::extract::State(st), req).await;
    }
    let (req, bytes, arrived) = match read_request(&st, api, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let parsed = arrived.elapsed();
    if req.raw.units.is_empty() {
        // Nothing of a conversation to manage: forwarded as it came.
        return forward_unchanged(&st, &req, bytes.to_vec()).await;
    }
    st.counters.requests.fetch_add(1, Ordering::Relaxed);
    let conv = match conv_for(&st, &req).await {
        Ok(c) => c,
        Err(e) => return conv_error(api, &e),
    };
    let model = req.model.clone();
    let limits = model_limits(&st.cfg.file.models, &model);
    let (raw, internal, overhead) = (req.raw.clone(), req.internal.clone(), req.overhead);
    let fields = req.fields.clone();
    let queued = std::time::Instant::now();
    let prepared = with_conv(&conv, move |c| -> Result<(Recorded, Built, Vec<u8>, [std::time::Duration; 4]), ConvError> {
        let t0 = std::time::Instant::now();
        let wait = t0 - queued;
        let rec = c.record_request(api, &raw, &model, limits, overhead, &internal)?;
        let t1 = std::time::Instant::now();
        let mut built = c.build(api, &raw, &rec, &internal)?;
        let t2 = std::time::Instant::now();
        let mut body = upstream_body(api, &raw.buf, &fields, &built);
        let t3 = std::time::Instant::now();
        // The payload guard after a model change, on the bytes about to be sent: an oversized request is
        // recorded as an overflow and prepared once more (recovery).
        match c.session.guard_payload(body.len() as u64) {
            Ok(()) => {}
            Err(EngineError::ContextOverflow { .. }) => {
                built = c.build(api, &raw, &rec, &internal)?;
                body = upstream_body(api, &raw.buf, &fields, &built);
            }
            Err(e) => return Err(e.into()),
        }
        Ok((rec, built, body, [wait, t1 - t0, t2 - t1, t3 - t2]))
    })
    .await;
    let (rec, built, body, [wait, record, build, write]) = match prepared {
        Ok(x) => x,
        Err(e) => return conv_error(api, &e),
    };
    st.counters.tokens_in.fetch_add(rec.tokens_in, Ordering::Relaxed);
    st.counters.tokens_sent.fetch_add(built.tokens_sent, Ordering::Relaxed);
    st.record_latency(arrived.elapsed(), [parsed, wait, record, build, write]);
    run_rounds(st, conv, req, rec, body).await
}

fn conv_error(api: Api, e: &ConvError) -> Response {
    match e {
        ConvError::Engine(e) => engine_error(api, e),
        ConvError::Wire(w) => api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("condense serve: {w}")),
    }
}

fn engine_error(api: Api, e: &EngineError) -> Response {
    match e {
        EngineError::CompactionFailed { code, reason, .. } => api_error(
            api,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("{CONTEXT_COMPACTION_FAILED}: {code}: {reason}"),
        ),
        other => api_error(api, StatusCode::INTERNAL_SERVER_ERROR, "api_error", &format!("condense serve: {other}")),
    }
}

async fn forward_unchanged(st: &State, req: &Req, body: Vec<u8>) -> Response {
    st.counters.passthrough.fetch_add(1, Ordering::Relaxed);
    match send(st, req, body).await {
        Ok(resp) => stream_back(resp),
        Err(r) => r,
    }
}

async fn send(st: &State, req: &Req, body: Vec<u8>) -> Result<reqwest::Response, Response> {
    let base = match req.api {
        Api::Anthropic => &st.cfg.anthropic_upstream,
        Api::Chat | Api::Responses => &st.cfg.openai_upstream,
    };
    let path = match req.api {
        Api::Anthropic => "/v1/messages",
        Api::Chat => "/v1/chat/completions",
        Api::Responses => "/v1/responses",
    };
    let mut headers = upstream_headers(&req.headers);
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    st.http.request(Method::POST, format!("{base}{path}{}", req.query)).headers(headers).body(body).send().await.map_err(|e| {
        st.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        api_error(req.api, StatusCode::BAD_GATEWAY, "api_error", &format!("condense serve: upstream unreachable: {}", e.without_url()))
    })
}

/// The conversation a request belongs to: by the client's own id, else by its first user message.
async fn conv_for(st: &Arc<State>, req: &Req) -> Result<ConvRef, ConvError> {
    conv_lookup(st, req, true).await.map(|c| c.expect("created when missing"))
}

/// The conversation a request belongs to; `create` makes one when there is none.
async fn conv_lookup(st: &Arc<State>, req: &Req, create: bool) -> Result<Option<ConvRef>, ConvError> {
    let first_user = req.raw.units.iter().position(|u| u.role == "user");
    let first_prompt = match first_user {
        Some(u) => wire::parse_unit(req.api, &req.raw, u)?
            .messages
            .iter()
            .find(|m| matches!(m.message, Message::User { .. }))
            .map(|m| m.message.text())
            .unwrap_or_default(),
        None => String::new(),
    };
    let identity = api::client_conversation_id(&req.headers, &json!({"metadata": req.metadata})).unwrap_or_else(|| {
        format!("{}:first:{}", req.api.name(), &blake3::hash(first_prompt.as_bytes()).to_hex()[..16])
    });
    let mut convs = st.convs.lock().await;
    if let Some(c) = convs.get(&identity) {
        return Ok(Some(c.clone()));
    }
    let mut known = st.names.lock().expect("names lock").get(&identity).cloned();
    if known.is_none() {
        // Another server on a shared store may have started this conversation since the names were read.
        let s2 = st.store.clone();
        let after = *st.scanned.lock().expect("scanned lock");
        let (found, upto) = tokio::task::spawn_blocking(move || identities(&s2, after)).await.expect("identity scan task")?;
        let mut names = st.names.lock().expect("names lock");
        names.extend(found);
        let mut scanned = st.scanned.lock().expect("scanned lock");
        *scanned = (*scanned).max(upto);
        known = names.get(&identity).cloned();
    }
    if known.is_none() && !create {
        return Ok(None);
    }
    let store = st.store.clone();
    let internal = req.internal.clone();
    let client = api::client_kind(req.api, &req.headers).to_string();
    let prune = st.cfg.file.raw.normalize();
    let id2 = identity.clone();
    let conv = tokio::task::spawn_blocking(move || -> Result<(Conv, String), EngineError> {
        match known {
            Some(name) => Ok((Conv::open(store.session(&name)?, &internal)?, name)),
            None => {
                let name = session_name(&store, &client, &first_prompt, &id2)?;
                let session = store.create_session(&name)?;
                Ok((Conv::create(session, &id2, &client, prune)?, name))
            }
        }
    })
    .await
    .expect("session task")?;
    st.names.lock().expect("names lock").insert(identity.clone(), conv.1);
    let c = Arc::new(AsyncMutex::new(conv.0));
    convs.insert(identity, c.clone());
    Ok(Some(c))
}

/// A name a person recognises: the client, the first words of the first prompt, and a short id.
fn session_name(store: &Store, client: &str, prompt: &str, identity: &str) -> Result<String, EngineError> {
    // Text a host injects in tags (`<system-reminder>…`) is not what the user typed.
    let typed: String = prompt.lines().filter(|l| !l.trim_start().starts_with('<')).collect::<Vec<_>>().join(" ");
    let mut slug = String::new();
    for word in typed.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).take(6) {
        if slug.len() + word.len() > 40 {
            break;
        }
        if !slug.is_empty() {
            slug.push('-');
        }
        slug.push_str(&word.to_lowercase());
    }
    if slug.is_empty() {
        slug.push_str("session");
    }
    let id = &blake3::hash(identity.as_bytes()).to_hex()[..8];
    let base = format!("{client}/{slug}/{id}");
    let mut name = base.clone();
    let mut n = 2;
    while store.log().session_id(&name)?.is_some() {
        name = format!("{base}-{n}");
        n += 1;
    }
    Ok(name)
}

/// Sends the request, answers overflows and condense's tools, and returns the client's response.
async fn run_rounds(st: Arc<State>, conv: ConvRef, req: Req, rec: Recorded, body: Vec<u8>) -> Response {
    let api = req.api;
    let mut body = body;
    let mut overflowed = false;
    let resp = loop {
        let resp = match send(&st, &req, body.clone()).await {
            Ok(r) => r,
            Err(r) => return r,
        };
        if resp.status().is_success() {
            break resp;
        }
        let status = resp.status();
        let headers = response_headers(resp.headers());
        let bytes = resp.bytes().await.unwrap_or_default();
        if !api::is_overflow(status.as_u16(), &bytes) {
            st.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
            let s = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            return with_headers((s, bytes).into_response(), headers);
        }
        // The provider says the prompt is too long: record it, checkpoint, retry once.
        st.counters.overflows.fetch_add(1, Ordering::Relaxed);
        let text = api::error_text(&bytes);
        let (raw, internal) = (req.raw.clone(), req.internal.clone());
        let units = rec.units.clone();
        let rebuilt = with_conv(&conv, move |c| {
            c.record_overflow(&text)?;
            c.build(api, &raw, &Recorded { units, last: None, tokens_in: 0 }, &internal)
        })
        .await;
        match rebuilt {
            Ok(built) if !overflowed => {
                overflowed = true;
                body = req.upstream_body(&built);
            }
            Ok(_) => {
                return api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("{CONTEXT_COMPACTION_FAILED}: the provider rejected the request as too long after a checkpoint and one retry"));
            }
            Err(e) => return engine_error(api, &e),
        }
    };
    if req.stream {
        stream_rounds(st, conv, req, rec, resp)
    } else {
        json_rounds(st, conv, req, rec, resp).await
    }
}

/// The text that ends a reply cut by the round limit.
pub const ROUND_LIMIT_NOTE: &str = "[condense: the reply stopped after the limit of condense tool rounds for one request]";

/// What happens after one round's reply was recorded.
enum Next {
    /// The reply is the client's: answer it (ending with `note` when the round limit cut it).
    Done { note: Option<String> },
    /// condense answered its tools: send this body for the next round.
    Continue(Vec<u8>),
}

/// Records a round's reply, answers condense's calls in it, and decides whether to continue.
async fn after_round(st: &State, conv: &ConvRef, req: &Req, rec: &mut Recorded, reply: Message, usage: Option<Usage>, round: u32) -> Result<Next, EngineError> {
    st.count_usage(&usage);
    let (api, raw, internal) = (req.api, req.raw.clone(), req.internal.clone());
    let parent = rec.last.clone();
    let units = rec.units.clone();
    let max = st.cfg.max_tool_rounds;
    let (last, next) = with_conv(conv, move |c| -> Result<(Option<String>, Option<Result<Built, bool>>), EngineError> {
        let id = c.record_reply(parent.as_deref(), reply.clone(), usage, &internal)?;
        let calls: Vec<bool> = reply.tool_calls().map(|(_, n, _)| internal.is(n)).collect();
        if !calls.iter().any(|x| *x) {
            return Ok((Some(id), None));
        }
        let (last, _) = c.answer_internal(&id, &reply, &internal)?;
        if !calls.iter().all(|x| *x) {
            // The client has calls of its own to run: the reply is its.
            return Ok((Some(last), None));
        }
        if round + 1 >= max {
            c.session.note("serve", &format!("tool round limit reached: {max} rounds of condense tool calls in one client request; the reply ends here"))?;
            // The reply ends as text the client sees, recorded so its history matches the log.
            let closing = Message::Assistant { content: vec![condense_events::Block::Text { text: ROUND_LIMIT_NOTE.to_string() }], model: None, stop: None, usage: None };
            let id = c.record_reply(Some(&last), closing, None, &internal)?;
            return Ok((Some(id), Some(Err(true))));
        }
        let built = c.build(api, &raw, &Recorded { units, last: Some(last.clone()), tokens_in: 0 }, &internal)?;
        Ok((Some(last), Some(Ok(built))))
    })
    .await?;
    rec.last = last;
    Ok(match next {
        None => Next::Done { note: None },
        Some(Err(_)) => {
            st.counters.round_limits.fetch_add(1, Ordering::Relaxed);
            Next::Done { note: Some(ROUND_LIMIT_NOTE.to_string()) }
        }
        Some(Ok(built)) => {
            st.counters.tool_rounds.fetch_add(1, Ordering::Relaxed);
            st.counters.tokens_sent.fetch_add(built.tokens_sent, Ordering::Relaxed);
            Next::Continue(req.upstream_body(&built))
        }
    })
}

async fn json_rounds(st: Arc<State>, conv: ConvRef, req: Req, mut rec: Recorded, first: reqwest::Response) -> Response {
    let api = req.api;
    let is = |n: &str| req.internal.is(n);
    let headers = response_headers(first.headers());
    let mut resp = first;
    let mut merged: Option<Value> = None;
    let mut round = 0;
    loop {
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return api_error(api, StatusCode::BAD_GATEWAY, "api_error", &format!("condense serve: the upstream reply broke off: {}", e.without_url())),
        };
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            // Not JSON: the client gets it as it came, and nothing is recorded.
            return with_headers((StatusCode::OK, bytes).into_response(), headers);
        };
        let Some((reply, usage)) = api::reply_of(api, &v) else {
            return with_headers(json_response(StatusCode::OK, &v), headers);
        };
        let mut visible = v.clone();
        api::strip_internal(api, &mut visible, &is);
        merged = Some(match merged.take() {
            None => visible,
            Some(m) => api::merge_rounds(api, &m, visible),
        });
        match after_round(&st, &conv, &req, &mut rec, reply, usage, round).await {
            Err(e) => return engine_error(api, &e),
            Ok(Next::Done { note }) => {
                let mut out = merged.take().expect("a reply");
                if let Some(n) = note {
                    api::end_with_note(api, &mut out, &n);
                }
                return with_headers(json_response(StatusCode::OK, &out), headers);
            }
            Ok(Next::Continue(body)) => {
                round += 1;
                resp = match send(&st, &req, body).await {
                    Ok(r) => r,
                    Err(r) => return r,
                };
                if !resp.status().is_success() {
                    let s = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                    let h = response_headers(resp.headers());
                    let b = resp.bytes().await.unwrap_or_default();
                    return with_headers((s, b).into_response(), h);
                }
            }
        }
    }
}

type Chunk = Result<bytes::Bytes, std::io::Error>;

/// Streams the reply: events pass as they arrive, condense's calls are held back and answered, and the
/// continuation streams on as part of the same reply.
fn stream_rounds(st: Arc<State>, conv: ConvRef, req: Req, rec: Recorded, first: reqwest::Response) -> Response {
    let headers = response_headers(first.headers());
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(64);
    tokio::spawn(async move {
        let mut rec = rec;
        let api = req.api;
        let internal = req.internal.clone();
        let mut codec = stream::codec(api, Box::new(move |n| internal.is(n)));
        let mut resp = first;
        let mut round = 0;
        loop {
            let mut events = resp.bytes_stream().eventsource();
            let mut out = Vec::new();
            let mut broke = false;
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ev) => {
                        codec.feed(&ev.event, &ev.data, &mut out);
                        for b in out.drain(..) {
                            if tx.send(Ok(b)).await.is_err() {
                                return; // The client went away: nothing more to do.
                            }
                        }
                    }
                    Err(_) => {
                        broke = true;
                        break;
                    }
                }
            }
            if broke || !codec.complete() {
                // The upstream dropped the stream: the client's stream breaks the same way, and the
                // half-received reply is not recorded.
                st.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send(Err(std::io::Error::other("upstream stream ended before the reply was complete"))).await;
                return;
            }
            let (reply, usage) = codec.reply();
            match after_round(&st, &conv, &req, &mut rec, reply, usage, round).await {
                Err(e) => {
                    let _ = tx.send(Ok(stream_error(api, &format!("condense serve: {e}")))).await;
                    return;
                }
                Ok(Next::Done { note }) => {
                    codec.finish(note.as_deref(), &mut out);
                    for b in out {
                        let _ = tx.send(Ok(b)).await;
                    }
                    return;
                }
                Ok(Next::Continue(body)) => {
                    round += 1;
                    codec.next_round();
                    resp = match send(&st, &req, body).await {
                        Ok(r) if r.status().is_success() => r,
                        Ok(r) => {
                            let status = r.status();
                            let text = api::error_text(&r.bytes().await.unwrap_or_default());
                            let _ = tx.send(Ok(stream_error(api, &format!("upstream {status}: {text}")))).await;
                            return;
                        }
                        Err(_) => {
                            let _ = tx.send(Ok(stream_error(api, "condense serve: upstream unreachable"))).await;
                            return;
                        }
                    };
                }
            }
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) }));
    let mut r = (StatusCode::OK, body).into_response();
    r = with_headers(r, headers);
    r.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r
}

/// An error event in the API's streaming format.
fn stream_error(api: Api, message: &str) -> bytes::Bytes {
    match api {
        Api::Anthropic => sse(Some("error"), &api::error_body(api, "api_error", message).to_string()),
        Api::Chat => sse(None, &api::error_body(api, "api_error", message).to_string()),
        Api::Responses => sse(Some("error"), &json!({"type": "error", "code": "api_error", "message": message}).to_string()),
    }
}

/// `count_tokens` counts what condense would send: for a conversation serve holds, the request's message
/// list is replaced by the session's context with the request's new messages after it (a dry run: nothing
/// is recorded, no pipeline decision is made) and condense's tools are added as a request would add them;
/// anything else is forwarded unchanged.
async fn count_tokens(axum::extract::State(st): S, req: Request) -> Response {
    let api = Api::Anthropic;
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
    let body = with_conv(&conv, move |c| c.dry_run(api, &raw, &internal).map(|built| upstream_body(api, &raw.buf, &fields, &built))).await;
    match body {
        Ok(b) => count_upstream(&st, &req, b).await,
        Err(e) => conv_error(api, &e),
    }
}

async fn count_upstream(st: &State, req: &Req, body: Vec<u8>) -> Response {
    let mut headers = upstream_headers(&req.headers);
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let url = format!("{}/v1/messages/count_tokens{}", st.cfg.anthropic_upstream, req.query);
    match st.http.request(Method::POST, url).headers(headers).body(body).send().await {
        Ok(resp) => stream_back(resp),
        Err(e) => {
            st.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
            api_error(req.api, StatusCode::BAD_GATEWAY, "api_error", &format!("condense serve: upstream unreachable: {}", e.without_url()))
        }
    }
}

/// Runs a CLI command for another `condense` process (authenticated by the token in the store's
/// `serve.json`).
async fn cli(axum::extract::State(st): S, req: Request) -> Response {
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
