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

/// Which upstream a request that is not one of the APIs' conversations goes to (by its path and headers).
pub(crate) fn upstream_for(st: &State, path: &str, h: &HeaderMap) -> String {
    if path.starts_with("/v1beta/") || h.contains_key("x-goog-api-key") {
        st.cfg.gemini_upstream.clone()
    } else if h.contains_key("anthropic-version") || h.contains_key("x-api-key") {
        st.cfg.anthropic_upstream.clone()
    } else {
        st.cfg.openai_upstream.clone()
    }
}

/// Sends a conversation's request body upstream (and hands it to the conversation's ledger, when it has
/// one, to be billed off the request path).
pub(crate) async fn send(st: &State, req: &Req, body: bytes::Bytes) -> Result<reqwest::Response, Response> {
    if let Some(ledger) = &req.ledger {
        ledger.record(req.api, Side::Condense, body.clone());
    }
    let base = match req.api {
        Api::Anthropic => &st.cfg.anthropic_upstream,
        Api::Chat | Api::Responses => &st.cfg.openai_upstream,
        Api::Gemini => &st.cfg.gemini_upstream,
    };
    let path = match req.api {
        Api::Anthropic => "/v1/messages",
        Api::Chat => "/v1/chat/completions",
        Api::Responses => "/v1/responses",
        // The model and the method are in the client's path.
        Api::Gemini => req.path.as_str(),
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
    match send(st, req, body.into()).await {
        Ok(resp) => stream_back(resp),
        Err(r) => r,
    }
}

pub(crate) async fn count_upstream(st: &State, req: &Req, body: Vec<u8>) -> Response {
    let url = match req.api {
        Api::Gemini => format!("{}{}{}", st.cfg.gemini_upstream, req.path, req.query),
        _ => format!("{}/v1/messages/count_tokens{}", st.cfg.anthropic_upstream, req.query),
    };
    match post(st, req, url, body).await {
        Ok(resp) => stream_back(resp),
        Err(r) => r,
    }
}

impl Req {
    /// What the ids condense gives a reply's calls are made from (Gemini: [`crate::api::name_gemini_calls`]):
    /// the request's newest message and the number of its units, so each request's differ.
    pub(crate) fn call_seed(&self) -> u64 {
        self.raw.units.last().map_or(0, |u| u.key) ^ (self.raw.units.len() as u64).rotate_left(32)
    }

    /// The upstream body for what the engine built (its message list moved into it).
    pub(crate) fn upstream_body(&self, built: &mut Built) -> Vec<u8> {
        upstream_body(self.api, &self.raw.buf, &self.fields, built).0
    }
}

/// The upstream body: the client's fields in its order and as it wrote them, its message list replaced and
/// condense's tools added after the client's; and where the list stands in it. The list is taken out of
/// `built`, and its buffer becomes the body: the fields before it go in front (into the room
/// [`crate::conv`] wrote the list with), those after it behind, so a long list is never in memory twice.
pub(crate) fn upstream_body(api: Api, buf: &[u8], fields: &[(String, std::ops::Range<usize>)], built: &mut Built) -> (Vec<u8>, std::ops::Range<usize>) {
    let field = api.list_field();
    let list = std::mem::take(&mut built.list);
    let ours = &built.tools;
    let mut tools_written = false;
    // What goes before the list's value, and after it.
    let (mut head, mut tail) = (vec![b'{'], Vec::new());
    let mut placed = false;
    for (i, (k, r)) in fields.iter().enumerate() {
        let out = if placed { &mut tail } else { &mut head };
        // (Read as text only where written: the list's own text, most of the body, is not.)
        let v = || std::str::from_utf8(&buf[r.clone()]).unwrap_or("null");
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, k).expect("JSON of a key");
        out.push(b':');
        if k == field {
            // (A list field the client repeated gets the list again.)
            match placed {
                true => out.extend_from_slice(&list),
                false => placed = true,
            }
        } else if k == "tools" && !ours.is_empty() && api == Api::Gemini {
            out.extend_from_slice(gemini_tools(v(), ours).as_bytes());
            tools_written = true;
        } else if k == "tools" && !ours.is_empty() && v().trim_start().starts_with('[') {
            let text = v().trim_end();
            let inner = text[..text.len() - 1].trim_end();
            out.extend_from_slice(inner.as_bytes());
            if !inner.ends_with('[') {
                out.push(b',');
            }
            out.extend_from_slice(ours.join(",").as_bytes());
            out.push(b']');
            tools_written = true;
        } else {
            out.extend_from_slice(v().as_bytes());
        }
    }
    let out = if placed { &mut tail } else { &mut head };
    if !tools_written && !ours.is_empty() {
        if !fields.is_empty() {
            out.push(b',');
        }
        let tools = if api == Api::Gemini { gemini_tools("[]", ours) } else { format!("[{}]", ours.join(",")) };
        out.extend_from_slice(format!("\"tools\":{tools}").as_bytes());
    }
    out.push(b'}');
    if !placed {
        return (head, 0..0);
    }
    let mut body = list;
    let at = head.len()..head.len() + body.len();
    body.reserve(head.len() + tail.len());
    body.splice(0..0, head);
    body.extend_from_slice(&tail);
    (body, at)
}

/// A Gemini request's `tools` with condense's function declarations added to the client's first tool that
/// declares functions (a tool of their own when none does).
fn gemini_tools(client: &str, ours: &[String]) -> String {
    let ours: Vec<serde_json::Value> = ours.iter().filter_map(|t| serde_json::from_str(t).ok()).collect();
    let mut tools: Vec<serde_json::Value> = serde_json::from_str(client).unwrap_or_default();
    match tools.iter_mut().find_map(|t| t.get_mut("functionDeclarations").and_then(serde_json::Value::as_array_mut)) {
        Some(decls) => decls.extend(ours),
        None => tools.push(serde_json::json!({ "functionDeclarations": ours })),
    }
    serde_json::Value::Array(tools).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's fields with their ranges in `buf`, as the request reader finds them.
    fn fields_of(buf: &[u8]) -> Vec<(String, std::ops::Range<usize>)> {
        let fields: condense_formats::wire::Fields<'_> = serde_json::from_slice(buf).unwrap();
        fields.0.iter().map(|(k, v)| (k.clone(), crate::request::read::range_in(buf, v.get()))).collect()
    }

    #[test]
    fn the_upstream_body_is_written_around_the_list_in_the_lists_buffer() {
        let buf = br#"{"model":"m", "messages":[{"role":"user","content":"a long history"}], "tools":[{"name":"bash"}],"stream":true}"#;
        let fields = fields_of(buf);
        let list = br#"[{"role":"user","content":"condensed"}]"#;
        let ours = serde_json::json!({"name": "context_tree_query"}).to_string();
        let want = br#"{"model":"m","messages":[{"role":"user","content":"condensed"}],"tools":[{"name":"bash"},{"name":"context_tree_query"}],"stream":true}"#;
        // With room for the other fields (what the context's writer leaves), the list's buffer is the
        // body: the list is not copied.
        let mut roomy = Vec::with_capacity(list.len() + buf.len() + 64);
        roomy.extend_from_slice(list);
        let at_first = roomy.as_ptr();
        let mut built = Built { list: roomy, tools: vec![ours.clone()], tokens_sent: 0 };
        let (body, at) = upstream_body(Api::Anthropic, buf, &fields, &mut built);
        assert_eq!(String::from_utf8_lossy(&body), String::from_utf8_lossy(want));
        assert_eq!(&body[at], list);
        assert_eq!(body.as_ptr(), at_first, "the body is written in the list's own buffer");
        assert!(built.list.is_empty(), "the list is moved into the body");
        // Without the room, the same body.
        let mut built = Built { list: list.to_vec(), tools: vec![ours], tokens_sent: 0 };
        assert_eq!(upstream_body(Api::Anthropic, buf, &fields, &mut built).0, want);
        // The list first, no tools of the client's, no tools of condense's: fields after the list go
        // behind it.
        let buf = br#"{"messages":[1],"model":"m"}"#;
        let mut built = Built { list: b"[2]".to_vec(), tools: vec![], tokens_sent: 0 };
        let (body, at) = upstream_body(Api::Chat, buf, &fields_of(buf), &mut built);
        assert_eq!((&body[..], at), (&br#"{"messages":[2],"model":"m"}"#[..], 12..15));
    }
}
