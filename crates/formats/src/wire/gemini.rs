//! The Gemini API (`generateContent`): its `contents` and their `parts` read into neutral messages, the
//! neutral model written back, and its replies. A `user` content is split at each `functionResponse`
//! part, as an Anthropic user message at each tool result; a `model` content is one assistant message.
//!
//! Gemini's calls and responses pair by their order: a `functionCall` carries an `id` only when the
//! model gave one. A call without one gets `gemini-call-I-J` (the content's index in the list, the call's
//! among its calls), and the K-th response of the content after it the K-th call's; such ids are
//! condense's own and never written to the provider.

use super::*;

/// The prefix of the call ids condense makes for Gemini calls that have none.
pub const GEMINI_CALL_PREFIX: &str = "gemini-call-";

fn made_id(content: usize, j: usize) -> String {
    format!("{GEMINI_CALL_PREFIX}{content}-{j}")
}

/// The neutral block of a part of a `model` content (`j`: its place among the content's calls so far).
fn model_part(p: &Value, content: usize, calls: &mut usize) -> Block {
    if let Some(c) = p.get("functionCall") {
        let id = str_of(c, "id").map_or_else(|| made_id(content, *calls), str::to_string);
        *calls += 1;
        return Block::tool_call(id, str_of(c, "name").unwrap_or("").to_string(), c.get("args").map_or_else(|| "{}".to_string(), json_text));
    }
    if p.get("thought").and_then(Value::as_bool) == Some(true) {
        return Block::thinking(str_of(p, "text").unwrap_or("").to_string(), str_of(p, "thoughtSignature").map(str::to_string));
    }
    user_part(p)
}

/// The neutral block of a part of a `user` content other than a `functionResponse`.
fn user_part(p: &Value) -> Block {
    if let Some(text) = str_of(p, "text") {
        return Block::Text { text: text.to_string() };
    }
    if let Some(d) = p.get("inlineData") {
        return Block::image(str_of(d, "mimeType").unwrap_or("").to_string(), str_of(d, "data").unwrap_or("").to_string());
    }
    let kind = p.as_object().and_then(|o| o.keys().find(|k| *k != "thoughtSignature")).cloned().unwrap_or_default();
    Block::opaque(kind, json_text(p))
}

/// The text of a `functionResponse`'s `response`: its `output` (or `content`, or `error`) when that is its
/// one field and a string (as Gemini CLI writes it), else the object as JSON; and whether it reports an
/// error.
fn response_text(r: Option<&Value>) -> (String, bool) {
    let Some(r) = r else { return (String::new(), false) };
    let error = r.get("error").is_some() && r.get("output").is_none();
    for key in ["output", "content", "error"] {
        if let (Some(Value::String(s)), Some(1)) = (r.get(key), r.as_object().map(Map::len)) {
            return (s.clone(), key == "error");
        }
    }
    (json_text(r), error)
}

pub(crate) fn parse_gemini(list: Vec<Value>, first: usize) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    for (i, m) in list.into_iter().enumerate() {
        let i = first + i;
        let at = format!("contents[{i}]");
        let Value::Object(mut obj) = m else { return Err(werr(at, "expected an object")) };
        let parts = match obj.remove("parts") {
            Some(Value::Array(a)) => a,
            None => Vec::new(),
            Some(_) => return Err(werr(format!("{at}.parts"), "expected a list of parts")),
        };
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("user").to_string();
        let envelope = obj;
        if let Some(j) = parts.iter().position(|p| !p.is_object()) {
            return Err(werr(format!("{at}.parts[{j}]"), "expected a part object"));
        }
        match role.as_str() {
            "model" => {
                let mut calls = 0;
                let content = parts.iter().map(|p| model_part(p, i, &mut calls)).collect();
                req.messages.push(WireMessage { message: Message::Assistant { content, model: None, stop: None, usage: None }, wire: i, envelope, parts });
            }
            "user" | "function" | "tool" => {
                let mut run: (Vec<Block>, Vec<Value>) = Default::default();
                let mut responses = 0;
                let flush = |req: &mut WireRequest, run: &mut (Vec<Block>, Vec<Value>)| {
                    if run.0.is_empty() {
                        return;
                    }
                    let content = std::mem::take(&mut run.0);
                    let origin = origin_of(&content);
                    req.messages.push(WireMessage { message: Message::User { content, origin }, wire: i, envelope: envelope.clone(), parts: std::mem::take(&mut run.1) });
                };
                for p in parts {
                    let Some(r) = p.get("functionResponse") else {
                        run.0.push(user_part(&p));
                        run.1.push(p);
                        continue;
                    };
                    flush(&mut req, &mut run);
                    let call_id = match str_of(r, "id") {
                        Some(id) => id.to_string(),
                        None => made_id(i.wrapping_sub(1), responses),
                    };
                    responses += 1;
                    let (text, is_error) = response_text(r.get("response"));
                    let tool_name = str_of(r, "name").unwrap_or("").to_string();
                    let message = Message::ToolResult { call_id, tool_name, content: vec![Block::Text { text }], is_error };
                    req.messages.push(WireMessage { message, wire: i, envelope: envelope.clone(), parts: vec![p] });
                }
                flush(&mut req, &mut run);
            }
            other => return Err(werr(at, format!("unknown role `{other}`"))),
        }
    }
    Ok(req)
}

/// A neutral message as one Gemini content (`role` in the envelope, its parts); `None` when nothing of it
/// can be carried (an assistant message of reasoning only).
pub(crate) fn gemini_message(m: &Message) -> Option<OutMessage<'static>> {
    let id_of = |id: &str| (!id.starts_with(GEMINI_CALL_PREFIX) && !id.is_empty()).then(|| id.to_string());
    let block_part = |b: &Block| -> Option<Value> {
        Some(match b {
            Block::Text { text } => json!({ "text": text }),
            Block::Image(i) => json!({"inlineData": {"mimeType": i.mime, "data": i.data}}),
            Block::Opaque(o) => serde_json::from_str(&o.json).unwrap_or_else(|_| json!({ "text": o.json })),
            Block::Thinking(_) | Block::ToolCall(_) => return None,
        })
    };
    let (role, parts): (&str, Vec<Value>) = match m {
        Message::User { content, .. } => ("user", content.iter().filter_map(block_part).collect()),
        Message::Assistant { content, .. } => (
            "model",
            content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolCall(c) => {
                        let args: Value = serde_json::from_str(&c.arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                        let mut call = json!({"name": c.name, "args": args});
                        if let Some(id) = id_of(&c.id) {
                            call["id"] = json!(id);
                        }
                        Some(json!({ "functionCall": call }))
                    }
                    other => block_part(other),
                })
                .collect(),
        ),
        Message::ToolResult { call_id, tool_name, content, is_error } => {
            let text: String = content.iter().filter_map(|b| match b { Block::Text { text } => Some(text.as_str()), _ => None }).collect::<Vec<_>>().join("\n");
            let response = if *is_error { json!({ "error": text }) } else { json!({ "output": text }) };
            let mut r = json!({"name": tool_name, "response": response});
            if let Some(id) = id_of(call_id) {
                r["id"] = json!(id);
            }
            ("user", vec![json!({ "functionResponse": r })])
        }
    };
    if parts.is_empty() {
        return None;
    }
    let mut envelope = Map::new();
    envelope.insert("role".into(), json!(role));
    Some(OutMessage { envelope: Cow::Owned(envelope), parts: Cow::Owned(parts) })
}

/// The assistant message of a Gemini reply's first candidate's parts.
pub fn gemini_reply(parts: &[Value], model: Option<String>) -> Message {
    let mut calls = 0;
    // A reply's calls without ids get ids of the place the reply will take; the client sends them back
    // with that content, where they are read again.
    let content = parts.iter().map(|p| model_part(p, usize::MAX, &mut calls)).collect();
    Message::Assistant { content, model, stop: None, usage: None }
}
