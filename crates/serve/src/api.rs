//! What differs between the four APIs outside the message list: error bodies, how an overflow reads,
//! the reply of a non-streaming response and how several rounds merge into the one reply the client
//! sees, and how a conversation identifies itself.

use condense_formats::wire::Api;
use serde_json::{json, Value};

/// The stable code a client sees when no request can be sent (seed 001).
pub const CONTEXT_COMPACTION_FAILED: &str = "CONTEXT_COMPACTION_FAILED";

/// An error body in the API's own format.
pub fn error_body(api: Api, kind: &str, message: &str) -> Value {
    match api {
        Api::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        Api::Chat | Api::Responses => json!({"error": {"message": message, "type": kind, "param": null, "code": kind}}),
        Api::Gemini => json!({"error": {"message": message, "status": gemini_status(kind)}}),
    }
}

/// The Gemini API's status name for an error kind of condense's.
fn gemini_status(kind: &str) -> &'static str {
    match kind {
        "invalid_request_error" => "INVALID_ARGUMENT",
        "authentication_error" => "UNAUTHENTICATED",
        "request_too_large" => "INVALID_ARGUMENT",
        "overloaded_error" => "UNAVAILABLE",
        "request_timeout" => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// Whether an upstream error says the prompt was too long for the model's context window.
pub fn is_overflow(status: u16, body: &[u8]) -> bool {
    if !(400..500).contains(&status) {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    let err = v.get("error").unwrap_or(&v);
    let code = err.get("code").and_then(Value::as_str).unwrap_or("");
    let msg = err.get("message").and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
    code == "context_length_exceeded"
        || msg.contains("prompt is too long")
        || msg.contains("context_length_exceeded")
        || msg.contains("maximum context length")
        || msg.contains("exceeds the context window")
        || msg.contains("input length and `max_tokens` exceed context limit")
        || msg.contains("exceeds the maximum number of tokens allowed")
}

/// The provider's error text of an error body (for the overflow event).
pub fn error_text(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v.get("error").and_then(|e| e.get("message")).and_then(Value::as_str).map_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect(), str::to_string)
}

pub use condense_formats::wire::reply_of;

/// Removes the calls of condense's tools from a non-streaming reply body, so the client never sees them.
pub fn strip_internal(api: Api, v: &mut Value, internal: &dyn Fn(&str) -> bool) {
    match api {
        Api::Anthropic => {
            if let Some(Value::Array(c)) = v.get_mut("content") {
                c.retain(|b| !(b["type"] == "tool_use" && b["name"].as_str().is_some_and(internal)));
            }
        }
        Api::Chat => {
            if let Some(msg) = v.get_mut("choices").and_then(|c| c.get_mut(0)).and_then(|c| c.get_mut("message")) {
                if let Some(Value::Array(calls)) = msg.get_mut("tool_calls") {
                    calls.retain(|c| !c["function"]["name"].as_str().is_some_and(internal));
                    if calls.is_empty() {
                        msg.as_object_mut().expect("message object").remove("tool_calls");
                    }
                }
            }
        }
        Api::Responses => {
            if let Some(Value::Array(items)) = v.get_mut("output") {
                items.retain(|i| !(i["type"] == "function_call" && i["name"].as_str().is_some_and(internal)));
            }
        }
        Api::Gemini => {
            if let Some(Value::Array(parts)) = v.pointer_mut("/candidates/0/content/parts") {
                parts.retain(|p| !p["functionCall"]["name"].as_str().is_some_and(internal));
            }
        }
    }
}

/// Folds the reply of a later round into the reply the client will get: its content follows what came
/// before, and its stop reason, usage and ids take over.
/// `a` then `b` as one text, a paragraph break between them unless one of them is empty or already
/// breaks the line there: Chat has one text per message, and the text before a condense round and the
/// continuation's would otherwise run into each other ("…behind t48.FAKE-FINAL").
pub fn join_text(a: &str, b: &str) -> String {
    if a.is_empty() || b.is_empty() || a.ends_with('\n') || b.starts_with('\n') {
        format!("{a}{b}")
    } else {
        format!("{a}\n\n{b}")
    }
}

pub fn merge_rounds(api: Api, first: &Value, later: Value) -> Value {
    let mut out = later;
    match api {
        Api::Anthropic => {
            let mut content = first["content"].as_array().cloned().unwrap_or_default();
            content.extend(out["content"].as_array().cloned().unwrap_or_default());
            out["content"] = Value::Array(content);
        }
        Api::Chat => {
            let a = &first["choices"][0]["message"];
            let b = out["choices"][0]["message"].clone();
            let text = join_text(a["content"].as_str().unwrap_or(""), b["content"].as_str().unwrap_or(""));
            let mut calls = a["tool_calls"].as_array().cloned().unwrap_or_default();
            calls.extend(b["tool_calls"].as_array().cloned().unwrap_or_default());
            let msg = &mut out["choices"][0]["message"];
            msg["content"] = if text.is_empty() { Value::Null } else { json!(text) };
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
        }
        Api::Responses => {
            let mut items = first["output"].as_array().cloned().unwrap_or_default();
            items.extend(out["output"].as_array().cloned().unwrap_or_default());
            out["output"] = Value::Array(items);
        }
        Api::Gemini => {
            let mut parts = first.pointer("/candidates/0/content/parts").and_then(Value::as_array).cloned().unwrap_or_default();
            parts.extend(out.pointer("/candidates/0/content/parts").and_then(Value::as_array).cloned().unwrap_or_default());
            if let Some(content) = out.pointer_mut("/candidates/0/content") {
                content["parts"] = Value::Array(parts);
            }
        }
    }
    out
}

/// A reply whose round limit was reached while it still called only condense's tools ends with `note` as
/// text, as a plain answer.
pub fn end_with_note(api: Api, v: &mut Value, note: &str) {
    match api {
        Api::Anthropic => {
            if let Some(Value::Array(c)) = v.get_mut("content") {
                c.push(json!({"type": "text", "text": note}));
            }
            v["stop_reason"] = json!("end_turn");
        }
        Api::Chat => {
            let msg = &mut v["choices"][0]["message"];
            msg["content"] = json!(join_text(msg["content"].as_str().unwrap_or(""), note));
            v["choices"][0]["finish_reason"] = json!("stop");
        }
        Api::Responses => {
            if let Some(Value::Array(items)) = v.get_mut("output") {
                items.push(json!({"type": "message", "id": "msg_condense_note", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": note, "annotations": []}]}));
            }
        }
        Api::Gemini => {
            if let Some(Value::Array(parts)) = v.pointer_mut("/candidates/0/content/parts") {
                parts.push(json!({ "text": note }));
            }
            if let Some(c) = v.pointer_mut("/candidates/0") {
                c["finishReason"] = json!("STOP");
            }
        }
    }
}

/// Gives a Gemini reply's function calls ids the client keeps as they are: a call without one, or with
/// one not of the form `NAME__…`, gets `NAME__` and an id made from `seed` (the request's), the round and
/// its place (Gemini CLI renames any other id so, in the history it sends back, which then would not be
/// the reply condense recorded). `next` counts the round's calls so far.
pub fn name_gemini_calls(parts: &mut [Value], seed: u64, round: u32, next: &mut usize) {
    for p in parts {
        let Some(call) = p.get_mut("functionCall").and_then(Value::as_object_mut) else { continue };
        let name = call.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let kept = call.get("id").and_then(Value::as_str).is_some_and(|id| id.starts_with(&format!("{name}__")));
        if !kept {
            let id = match call.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => format!("{name}__{id}"),
                _ => {
                    let key = condense_formats::wire::item_key(format!("{seed}/{round}/{next}").as_bytes());
                    format!("{name}__condense_{key:016x}")
                }
            };
            call.insert("id".into(), Value::String(id));
        }
        *next += 1;
    }
}

/// Who is calling, read from its headers: the session name's first part.
pub fn client_kind(api: Api, headers: &axum::http::HeaderMap) -> &'static str {
    let ua = headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or("");
    if ua.starts_with("claude-cli") || headers.contains_key("x-claude-code-session-id") {
        "claude-code"
    } else if ua.starts_with("codex") || headers.contains_key("x-codex-window-id") {
        "codex"
    } else if ua.starts_with("GeminiCLI") {
        "gemini-cli"
    } else {
        api.name()
    }
}

/// The client's own id for the conversation, when it sends one: the `x-condense-session` header, Claude
/// Code's session id (header or `metadata.user_id`), Codex's thread id.
pub fn client_conversation_id(headers: &axum::http::HeaderMap, body: &Value) -> Option<String> {
    let h = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(s) = h("x-condense-session") {
        return Some(format!("explicit:{s}"));
    }
    if let Some(s) = h("x-claude-code-session-id") {
        return Some(format!("claude-code:{s}"));
    }
    if let Some(uid) = body.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str) {
        // Newer Claude Code sends JSON with `session_id`; older ones `user_…_session_<uuid>`.
        if let Some(sid) = serde_json::from_str::<Value>(uid).ok().and_then(|v| v.get("session_id").and_then(Value::as_str).map(str::to_string)) {
            return Some(format!("claude-code:{sid}"));
        }
        if let Some((_, sid)) = uid.rsplit_once("_session_") {
            return Some(format!("claude-code:{sid}"));
        }
    }
    if let Some(s) = h("thread-id").or_else(|| h("session-id")).or_else(|| h("session_id")) {
        return Some(format!("codex:{s}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_errors_of_both_providers() {
        assert!(is_overflow(400, br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#));
        assert!(is_overflow(400, br#"{"error":{"message":"This model's maximum context length is 128000 tokens","code":"context_length_exceeded"}}"#));
        assert!(!is_overflow(400, br#"{"error":{"message":"bad tool","code":"invalid"}}"#));
        assert!(!is_overflow(500, br#"{"error":{"code":"context_length_exceeded"}}"#));
        assert!(!is_overflow(400, b"not json"));
        assert!(is_overflow(400, br#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#));
    }

    #[test]
    fn identity_from_each_client() {
        let mut h = axum::http::HeaderMap::new();
        let body = json!({"metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s-1\"}"}});
        assert_eq!(client_conversation_id(&h, &body).as_deref(), Some("claude-code:s-1"));
        assert_eq!(client_conversation_id(&h, &json!({"metadata": {"user_id": "user_x_account_y_session_abc"}})).as_deref(), Some("claude-code:abc"));
        h.insert("thread-id", "t-9".parse().unwrap());
        assert_eq!(client_conversation_id(&h, &json!({})).as_deref(), Some("codex:t-9"));
        h.insert("x-condense-session", "mine".parse().unwrap());
        assert_eq!(client_conversation_id(&h, &body).as_deref(), Some("explicit:mine"));
        assert_eq!(client_conversation_id(&axum::http::HeaderMap::new(), &json!({})), None);
    }
}

/// The headers that carry a provider credential, in the order they are fingerprinted.
const KEY_HEADERS: [&str; 5] = ["x-api-key", "authorization", "api-key", "x-goog-api-key", QUERY_KEY_HEADER];

/// Where serve keeps a Gemini request's `?key=` for its fingerprint (an `x-condense-` header: never sent
/// upstream, where the key goes in the query as the client sent it).
pub(crate) const QUERY_KEY_HEADER: &str = "x-condense-query-key";

/// Feeds `put` a request's credentials as they are hashed wherever requests are told apart by them: each
/// credential header's name, the length of its value (8 bytes, little-endian) and the value.
pub(crate) fn credential_bytes(headers: &axum::http::HeaderMap, mut put: impl FnMut(&[u8])) {
    for name in KEY_HEADERS {
        for v in headers.get_all(name) {
            put(name.as_bytes());
            put(&(v.len() as u64).to_le_bytes());
            put(v.as_bytes());
        }
    }
}
