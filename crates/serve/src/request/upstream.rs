//! Sending upstream: the upstream body (the client's fields in its order, its message list replaced,
//! condense's tools added), the headers that go with it, and the provider a request goes to.

use crate::billing::Side;
use crate::state::State;
use crate::request::read::Req;
use crate::request::response::{api_error, stream_back};
use crate::conv::Built;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use condense_formats::wire::Api;
use serde_json::Value;

/// Which upstream a request that is not one of the three APIs goes to.
pub(crate) fn upstream_for(st: &State, h: &HeaderMap) -> String {
    if h.contains_key("anthropic-version") || h.contains_key("x-api-key") {
        st.cfg.anthropic_upstream.clone()
    } else {
        st.cfg.openai_upstream.clone()
    }
}

/// Sends a conversation's request body upstream (and hands it to the conversation's ledger, when it has
/// one, to be billed off the request path).
pub(crate) async fn send(st: &State, req: &Req, body: Vec<u8>) -> Result<reqwest::Response, Response> {
    let body = bytes::Bytes::from(body);
    if let Some(ledger) = &req.ledger {
        ledger.record(req.api, Side::Condense, body.clone());
    }
    let base = match req.api {
        Api::Anthropic => &st.cfg.anthropic_upstream,
        Api::Chat | Api::Responses => &st.cfg.openai_upstream,
    };
    let path = match req.api {
        Api::Anthropic => "/v1/messages",
        Api::Chat => "/v1/chat/completions",
        Api::Responses => "/v1/responses",
    };
    post(st, req, format!("{base}{path}{}", req.query), body).await
}

/// POSTs a JSON `body` to `url` with the client's headers; an upstream that cannot be reached is a 502 in
/// the request's API format.
async fn post(st: &State, req: &Req, url: String, body: impl Into<reqwest::Body>) -> Result<reqwest::Response, Response> {
    let mut headers = (*req.upstream_headers).clone();
    headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    st.http
        .request(Method::POST, url)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|e| api_error(req.api, StatusCode::BAD_GATEWAY, "api_error", &unreachable(st, e)))
}

/// Counts an upstream that could not be reached and says why, as the client reads it (the cause, without
/// the upstream's address).
pub(crate) fn unreachable(st: &State, e: reqwest::Error) -> String {
    st.upstream_error("unreachable");
    format!("condense serve: upstream unreachable: {}", condense_summarize::http::describe_error(e))
}

pub(crate) async fn forward_unchanged(st: &State, req: &Req, body: Vec<u8>) -> Response {
    st.passthrough();
    match send(st, req, body).await {
        Ok(resp) => stream_back(resp),
        Err(r) => r,
    }
}

pub(crate) async fn count_upstream(st: &State, req: &Req, body: Vec<u8>) -> Response {
    let url = format!("{}/v1/messages/count_tokens{}", st.cfg.anthropic_upstream, req.query);
    match post(st, req, url, body).await {
        Ok(resp) => stream_back(resp),
        Err(r) => r,
    }
}

impl Req {
    /// The upstream body for what the engine built.
    pub(crate) fn upstream_body(&self, built: &Built) -> Vec<u8> {
        upstream_body(self.api, &self.raw.buf, &self.fields, built)
    }
}

/// The upstream body: the client's fields in its order and as it wrote them, its message list replaced and
/// condense's tools added after the client's.
pub(crate) fn upstream_body(api: Api, buf: &[u8], fields: &[(String, std::ops::Range<usize>)], built: &Built) -> Vec<u8> {
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
