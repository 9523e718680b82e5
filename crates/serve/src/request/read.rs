//! Reading a request of one of the three APIs: the body's fields as the client wrote them, its message
//! list split into units, the tools it declares, and what it carries besides the conversation.

use crate::budget::{Refusal, Reservation, PER_BODY_BYTE};
use crate::state::State;
use axum::response::IntoResponse;
use crate::request::response::{api_error, retry_after};
use crate::conv::Internal;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use condense_formats::wire::{self, Api, Fields, RawRequest};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::sync::Arc;

/// The range of `part` (a slice of `buf`) within `buf`.
pub(crate) fn range_in(buf: &[u8], part: &str) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// The names a request's tools declare, read without the rest of their definitions.
#[derive(serde::Deserialize)]
struct ToolName {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) function: Option<FunctionName>,
    /// Gemini's: a tool of many functions.
    #[serde(default, rename = "functionDeclarations")]
    pub(crate) function_declarations: Option<Vec<FunctionName>>,
}

#[derive(serde::Deserialize)]
struct FunctionName {
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// What a request is, once read.
pub(crate) struct Req {
    pub(crate) api: Api,
    pub(crate) headers: HeaderMap,
    /// The client's headers as they go upstream (hop-by-hop ones left out), worked out once: the forward
    /// and the summaries through the upstream both send them.
    pub(crate) upstream_headers: Arc<HeaderMap>,
    pub(crate) query: String,
    /// The request's path (a Gemini request's names its model and method: it goes upstream as it came).
    pub(crate) path: String,
    /// The client's body, field by field as it wrote them: ranges of the body `raw.buf`.
    pub(crate) fields: Arc<Vec<(String, std::ops::Range<usize>)>>,
    /// Its message list, split into units.
    pub(crate) raw: Arc<RawRequest>,
    pub(crate) internal: Internal,
    pub(crate) stream: bool,
    pub(crate) model: String,
    /// The body's `metadata` (for the conversation's identity).
    pub(crate) metadata: Value,
    /// What it carries besides the conversation (system prompt, instructions, tool declarations), in
    /// estimated tokens (bytes / 4, rounded up).
    pub(crate) overhead: u64,
    /// The conversation's ledger, once the conversation is known (what is sent upstream is billed there).
    pub(crate) ledger: Option<Arc<crate::billing::Ledger>>,
    /// The memory it holds of the server's budget, until its response has ended.
    pub(crate) _reservation: Reservation,
}

/// Reads a request's body within the limits: a declared length over `--max-body-bytes` is refused before
/// anything is read; the body must arrive within the body-read timeout; its reservation of the memory
/// budget (`per_byte` times its length, the limit when it declares none) is taken before it is read.
/// `api`: the API whose error format a refusal takes (`None`: plain text).
pub(crate) async fn read_body(st: &State, api: Option<Api>, headers: &HeaderMap, body: axum::body::Body, per_byte: u64) -> Result<(bytes::Bytes, Reservation), Response> {
    let max = st.cfg.max_body_bytes;
    let too_large = || error(api, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", &format!("condense serve: the request body is over the {max}-byte limit (--max-body-bytes)"));
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let reservation = st.budget.reserve(declared.unwrap_or(max as u64) * per_byte).map_err(|r| refused(api, &r))?;
    let limit = st.cfg.timeouts.body_read;
    match tokio::time::timeout(limit, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => Ok((b, reservation)),
        // Within its declared length, a body that fails broke off; without one, it ran over the limit.
        Ok(Err(_)) if declared.is_some() => Err(error(api, StatusCode::BAD_REQUEST, "invalid_request_error", "condense serve: the request body broke off before its declared length")),
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(error(api, StatusCode::REQUEST_TIMEOUT, "request_timeout", &format!("condense serve: the request body did not arrive within {} s", limit.as_secs_f64()))),
    }
}

/// An error in `api`'s format, or as plain text.
fn error(api: Option<Api>, status: StatusCode, kind: &str, message: &str) -> Response {
    match api {
        Some(api) => api_error(api, status, kind, message),
        None => (status, format!("{message}\n")).into_response(),
    }
}

/// A refused reservation: 413 when the request could never fit, else 503 with `retry-after`.
pub(crate) fn refused(api: Option<Api>, r: &Refusal) -> Response {
    let message = format!("condense serve: {r}");
    match r {
        Refusal::TooLarge { .. } => error(api, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", &message),
        Refusal::Busy { .. } => retry_after(error(api, StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", &message), "1"),
    }
}

/// Reads a request of one of the three APIs: its body bytes, and the request, or the error response.
pub(crate) async fn read_request(st: &State, api: Api, req: Request) -> Result<(Req, bytes::Bytes, std::time::Instant), Response> {
    let (mut parts, body) = req.into_parts();
    // A Gemini key given as `?key=` tells clients apart as a key header does (it goes upstream in the
    // query, as it came).
    if api == Api::Gemini {
        let key = parts.uri.query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("key=")));
        if let Some(v) = key.and_then(|k| axum::http::HeaderValue::from_str(k).ok()) {
            parts.headers.insert(crate::api::QUERY_KEY_HEADER, v);
        }
    }
    let (bytes, mut reservation) = read_body(st, Some(api), &parts.headers, body, PER_BODY_BYTE).await?;
    let arrived = std::time::Instant::now();
    let bad = |m: String| api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("condense serve: {m}"));
    // The body's structure in one scan (`condense_formats::scan`): its fields besides the message list
    // are then read by serde_json, and each message the conversation has not seen is when it is recorded
    // (a seen one is the same bytes as one read before; the messages are most of the body). Anything
    // the scan does not expect, and every error, is left to the reading below, which names it.
    // The scan takes as they are the elements the same client's last body of the same opening had at
    // the same places with the same bytes (an agent's next request repeats its last one).
    let list_field = api.list_field();
    let seed = hint_seed(api, &parts.headers);
    let mut hint_key = None;
    let mut hint_for = |opening: &[u8]| {
        let key = seed ^ wire::item_key(opening);
        hint_key = Some(key);
        st.hints.lock().expect("hints lock").get(key)
    };
    let scanned = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|_| condense_formats::scan::index(&bytes, list_field, &mut hint_for))
        .filter(|ix| ix.items.is_some())
        .filter(|ix| ix.fields.iter().all(|(k, r)| k == list_field || serde_json::from_slice::<serde::de::IgnoredAny>(&bytes[r.clone()]).is_ok()));
    if let (Some(ix), Some(key)) = (&scanned, hint_key) {
        let hint = ix.hint(&bytes);
        st.hints.lock().expect("hints lock").put(key, hint);
    }
    // Counted before anything is split or recorded: recording takes memory by the message.
    let max = st.cfg.max_messages;
    let too_many = |n: usize| {
        let m = format!("condense serve: the request holds {n} messages, over the {max} a request may hold (--max-messages)");
        api_error(api, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", &m)
    };
    // The request's fields, its message list split into units, and its count of values when the scan
    // found it.
    let (fields, raw, counted) = if let Some(ix) = scanned {
        let counted = ix.elements();
        let condense_formats::scan::BodyIndex { fields, items, probes, keys, .. } = ix;
        let items = items.expect("filtered");
        if items.len() > max {
            return Err(too_many(items.len()));
        }
        (fields, wire::split_scanned(api, bytes.clone(), items, &probes, keys), Some(counted))
    } else {
        let fields = match serde_json::from_slice::<Fields<'_>>(&bytes) {
            Ok(f) => f.0,
            Err(e) if e.is_data() => return Err(bad("the request body must be a JSON object".into())),
            Err(e) => return Err(bad(format!("the request body is not JSON: {e}"))),
        };
        let field = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let Some(list) = field(api.list_field()) else { return Err(bad(format!("`{}` must be a list", api.list_field()))) };
        let items: Option<Vec<std::ops::Range<usize>>> =
            serde_json::from_str::<Vec<&RawValue>>(list.get()).ok().map(|v| v.into_iter().map(|i| range_in(&bytes, i.get())).collect());
        if let Some(n) = items.as_ref().map(Vec::len).filter(|&n| n > max) {
            return Err(too_many(n));
        }
        let raw = match (items, serde_json::from_str::<String>(list.get())) {
            (Some(items), _) => wire::split_units(api, bytes.clone(), items),
            // Responses takes `input` as a plain string too: one user message.
            (None, Ok(text)) if api == Api::Responses => {
                wire::split_values(api, &[json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})])
            }
            (None, _) => return Err(bad(format!("`{}` must be a list", api.list_field()))),
        };
        let ranges: Vec<(String, std::ops::Range<usize>)> = fields.iter().map(|(k, v)| (k.clone(), range_in(&bytes, v.get()))).collect();
        (ranges, raw, None)
    };
    let text_of = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, r)| &bytes[r.clone()]);
    let tool_names: Vec<String> = text_of("tools")
        .and_then(|t| serde_json::from_slice::<Vec<ToolName>>(t).ok())
        .map(|ts| {
            ts.into_iter()
                .flat_map(|t| {
                    let one = t.name.or(t.function.and_then(|f| f.name));
                    one.into_iter().chain(t.function_declarations.unwrap_or_default().into_iter().filter_map(|f| f.name))
                })
                .collect()
        })
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let (model, stream) = match api {
        // `/v1beta/models/MODEL:METHOD`: the model and whether the reply streams are in the path.
        Api::Gemini => {
            let (model, method) = gemini_target(&path).unwrap_or_default();
            (model.to_string(), method == "streamGenerateContent")
        }
        _ => (
            text_of("model").and_then(|t| serde_json::from_slice::<String>(t).ok()).unwrap_or_default(),
            text_of("stream").and_then(|t| serde_json::from_slice::<bool>(t).ok()).unwrap_or(false),
        ),
    };
    let metadata = text_of("metadata").and_then(|t| serde_json::from_slice::<Value>(t).ok()).unwrap_or(Value::Null);
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
    // Now that its message list is read, the request holds what recording it takes: its bytes and its
    // values (messages, content blocks, a call's input), whatever their sizes.
    let elements = counted.unwrap_or_else(|| raw.items.iter().map(|r| wire::count_elements(&raw.buf[r.clone()])).sum::<u64>()) + raw.items.len() as u64;
    let need = crate::budget::reservation(bytes.len() as u64, elements);
    if let Err(r) = reservation.resize(need) {
        return Err(refused(Some(api), &r));
    }
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    // What every request carries besides the conversation: the system prompt (a field, or the leading
    // system/developer messages), instructions and tool declarations.
    let overhead_bytes: usize = ["system", "instructions", "tools", "systemInstruction"].iter().filter_map(|k| text_of(k)).map(<[u8]>::len).sum::<usize>()
        + raw.items[..raw.system].iter().map(|r| r.len()).sum::<usize>();
    let overhead = overhead_bytes.div_ceil(4) as u64;
    let upstream_headers = Arc::new(crate::request::response::upstream_headers(&parts.headers));
    // The session's reasoning setting, which its handoff requests carry too (seed 004).
    // (Gemini's is inside `generationConfig`, with settings a handoff must not take: none is carried.)
    let reasoning_field = match api {
        Api::Chat => Some("reasoning_effort"),
        Api::Responses => Some("reasoning"),
        Api::Anthropic => Some("thinking"),
        Api::Gemini => None,
    };
    let reasoning: Vec<(String, Value)> = reasoning_field
        .and_then(|f| text_of(f).and_then(|t| serde_json::from_slice::<Value>(t).ok()).map(|v| vec![(f.to_string(), v)]))
        .unwrap_or_default();
    let summary = summary_route(st, api, &upstream_headers, reasoning);
    let req = Req { api, headers: parts.headers, upstream_headers, query, path, fields: Arc::new(fields), raw: Arc::new(raw), internal: Internal { client_tools: tool_names, summary, ..Internal::default() }, overhead, stream, model, metadata, ledger: None, _reservation: reservation };
    Ok((req, bytes, arrived))
}

/// The model and the method a Gemini API path names (`/v1beta/models/MODEL:METHOD`).
pub(crate) fn gemini_target(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1beta/models/").or_else(|| path.strip_prefix("/v1/models/"))?;
    rest.rsplit_once(':')
}

/// What a body's scan hint is looked up by besides its opening: the API and the client's credentials
/// (a hash kept in memory only), so one client's bodies are never a hint for another's.
fn hint_seed(api: Api, headers: &HeaderMap) -> u64 {
    let mut text = api.name().as_bytes().to_vec();
    crate::api::credential_bytes(headers, |b| text.extend_from_slice(b));
    wire::item_key(&text)
}

/// How this request's summaries reach the upstream: its API, the upstream it goes to, and the client's
/// headers as they go with it (`None` when a summarizer is configured or `--summaries extractive`).
fn summary_route(st: &State, api: Api, headers: &Arc<HeaderMap>, reasoning: Vec<(String, Value)>) -> Option<crate::summary::Route> {
    use crate::summary::Summaries;
    if st.cfg.summarizer.is_some() || st.cfg.summaries == Summaries::Extractive {
        return None;
    }
    let base = match api {
        Api::Anthropic => format!("{}/v1", st.cfg.anthropic_upstream),
        Api::Chat | Api::Responses => format!("{}/v1", st.cfg.openai_upstream),
        Api::Gemini => format!("{}/v1beta", st.cfg.gemini_upstream),
    };
    Some(crate::summary::Route {
        api,
        base,
        headers: headers.clone(),
        model: st.cfg.summary_model.clone(),
        all: st.cfg.summaries == Summaries::Upstream,
        fallbacks: st.upstream_fallbacks.clone(),
        reasoning,
    })
}
