//! Answering the client: JSON and API-shaped error responses, the upstream's headers and body passed
//! back, and engine errors as the API's errors.

use crate::api::{self, CONTEXT_COMPACTION_FAILED};
use crate::conv::ConvError;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use condense_engine::EngineError;
use condense_formats::wire::Api;
use futures_util::StreamExt;
use serde_json::Value;

/// Headers that describe one hop, not the request.
pub(crate) fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-authenticate" | "proxy-authorization" | "te" | "trailer" | "trailers"
            | "transfer-encoding" | "upgrade" | "host" | "content-length" | "accept-encoding"
    ) || name.starts_with("x-condense-")
}

/// The client's headers as they go upstream: everything but hop-by-hop ones, untouched (the API key and
/// authorization included; they are never stored or shown).
pub(crate) fn upstream_headers(h: &axum::http::HeaderMap) -> axum::http::HeaderMap {
    let mut out = axum::http::HeaderMap::new();
    for (k, v) in h {
        if !hop_by_hop(k.as_str()) {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

pub(crate) fn api_error(api: Api, status: StatusCode, kind: &str, message: &str) -> Response {
    let mut body = api::error_body(api, kind, message);
    // The Gemini API's errors carry the HTTP status as their `code` too.
    if api == Api::Gemini {
        body["error"]["code"] = status.as_u16().into();
    }
    let mut r = json_response(status, &body);
    r.extensions_mut().insert(Refused(message.to_string()));
    r
}

/// Marks a response condense made itself to refuse a request (not the provider's answer), with the
/// message the client got: the request's log line and `condense_request_failures_total` read it.
#[derive(Clone, Debug)]
pub(crate) struct Refused(pub(crate) String);

/// The upstream's response headers as they go to the client.
pub(crate) fn response_headers(h: &reqwest::header::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    h.iter()
        .filter(|(k, _)| !hop_by_hop(k.as_str()) && k.as_str() != "content-encoding")
        .filter_map(|(k, v)| Some((HeaderName::from_bytes(k.as_str().as_bytes()).ok()?, HeaderValue::from_bytes(v.as_bytes()).ok()?)))
        .collect()
}

pub(crate) fn with_headers(mut r: Response, h: Vec<(HeaderName, HeaderValue)>) -> Response {
    for (k, v) in h {
        r.headers_mut().insert(k, v);
    }
    r
}

/// An upstream response passed to the client as it arrives.
pub(crate) fn stream_back(resp: reqwest::Response) -> Response {
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response_headers(resp.headers());
    let body = Body::from_stream(resp.bytes_stream().map(|r| r.map_err(std::io::Error::other)));
    with_headers((status, body).into_response(), headers)
}

pub(crate) fn conv_error(api: Api, e: &ConvError) -> Response {
    match e {
        ConvError::Engine(e) => engine_error(api, e),
        ConvError::Wire(w) => api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("condense serve: {w}")),
    }
}

/// `r` with a `retry-after` of `seconds`.
pub(crate) fn retry_after(mut r: Response, seconds: &'static str) -> Response {
    r.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from_static(seconds));
    r
}

pub(crate) fn engine_error(api: Api, e: &EngineError) -> Response {
    match e {
        // A preparation stopped (its request given up, or newer input waiting) committed nothing: the
        // request may be sent again.
        EngineError::CompactionFailed { code, reason, .. } if code == condense_engine::recover::PREPARATION_STOPPED => {
            retry_after(api_error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", &format!("condense serve: {code}: {reason}")), "1")
        }
        EngineError::CompactionFailed { code, reason, .. } => {
            // The stable code first; a more specific one (PROVIDER_OVERFLOW_AFTER_RETRY) after it.
            let message = if code == CONTEXT_COMPACTION_FAILED { format!("{code}: {reason}") } else { format!("{CONTEXT_COMPACTION_FAILED}: {code}: {reason}") };
            api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &message)
        }
        // The store's database is down or restarting, or lost what this request chained onto: nothing was
        // recorded, and the client's own retry (every client retries a 503) succeeds once it is back.
        EngineError::Log(condense_log::LogError::Unavailable { .. }) | EngineError::ParentLost { .. } => {
            retry_after(api_error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", &format!("condense serve: {e}")), "5")
        }
        // The session moved in the store between this server's read of it and its append (a database
        // restart lost what was not yet durable, or another server appended): nothing was written, and the
        // retry is folded from what the store holds. A request's recording is tried again at once
        // (`conversation::prepare`); a reply's append meets it here.
        EngineError::Log(condense_log::LogError::HeadMismatch { .. }) => {
            let message = format!("condense serve: the session changed in the store while this was being recorded (a database restart, or another server); nothing was written: send the request again ({e})");
            retry_after(api_error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", &message), "1")
        }
        // Another server on the same database started this conversation at the same moment (the first
        // request reached both): nothing was written here, and the retry finds the other's session (issue
        // 62: a 500 before).
        EngineError::Log(condense_log::LogError::SessionExists(_)) => {
            let message = format!("condense serve: another server started this conversation at the same moment; nothing was written here: send the request again ({e})");
            retry_after(api_error(api, StatusCode::SERVICE_UNAVAILABLE, "api_error", &message), "1")
        }
        other => api_error(api, StatusCode::INTERNAL_SERVER_ERROR, "api_error", &format!("condense serve: {other}")),
    }
}
