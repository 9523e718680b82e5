//! OpenAI Chat Completions: its messages read into neutral messages, and its replies.

use super::*;

/// Neutral blocks of a Chat message's `content`.
pub(crate) fn chat_text(content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    content_blocks(content, at, |p| match (str_of(p, "type"), p.get("image_url")) {
        (Some("image_url"), Some(u)) => Some(crate::codex::url_image(u.get("url").and_then(Value::as_str).or(u.as_str()).unwrap_or("").to_string())),
        _ => None,
    })
}

pub(crate) fn parse_chat(list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    let mut in_prefix = prefix;
    for (i, mut part) in list.into_iter().enumerate() {
        let i = first + i;
        let at = format!("messages[{i}]");
        let Value::Object(obj) = &part else { return Err(werr(at, "expected an object")) };
        let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| werr(at.clone(), "`role` is missing"))?;
        if in_prefix && matches!(role, "system" | "developer") {
            req.system.push(part);
            continue;
        }
        in_prefix = false;
        let mark = take_cache_control(&mut part);
        let message = chat_message(&part, Field::Value(part.get("content")), Field::Value(part.get("tool_calls")), &at)?;
        if let Some(c) = mark {
            req.cache_marks.push((req.messages.len(), c));
        }
        req.messages.push(WireMessage { message, wire: i, envelope: Map::new(), parts: vec![part] });
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// The neutral message of a Chat message `obj` at `at`, whose `content` and `tool_calls` are given apart.
pub(crate) fn chat_message(obj: &Value, content: Field<'_, '_>, calls: Field<'_, '_>, at: &str) -> Result<Message, WireError> {
    let role = str_of(obj, "role").ok_or_else(|| werr(at.to_string(), "`role` is missing"))?;
    Ok(match role {
        "user" => {
            let content = chat_text(content, at)?;
            let origin = origin_of(&content);
            Message::User { content, origin }
        }
        "system" | "developer" => Message::User { content: chat_text(content, at)?, origin: UserOrigin::Host },
        "assistant" => {
            let mut content = chat_text(content, at)?;
            if matches!(calls.value(), Some(v) if !v.is_array()) {
                return Err(werr(format!("{at}.tool_calls"), "expected a list"));
            }
            let calls = calls.map_list(&format!("{at}.tool_calls"), |j, c| {
                let f = c.get("function").ok_or_else(|| werr(format!("{at}.tool_calls[{j}]"), "`function` is missing"))?;
                Ok(Block::tool_call(
                    str_of(c, "id").unwrap_or("").to_string(),
                    str_of(f, "name").unwrap_or("").to_string(),
                    match f.get("arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => json_text(v),
                        None => "{}".into(),
                    },
                ))
            })?;
            // A reply of calls alone (most of them) keeps the calls' list rather than copying it.
            if content.is_empty() {
                content = calls;
            } else {
                content.extend(calls);
            }
            Message::Assistant { content, model: None, stop: None, usage: None }
        }
        "tool" | "function" => Message::ToolResult {
            call_id: str_of(obj, "tool_call_id").unwrap_or("").to_string(),
            tool_name: str_of(obj, "name").unwrap_or("").to_string(),
            content: chat_text(content, at)?,
            is_error: false,
        },
        other => return Err(werr(at.to_string(), format!("unknown role `{other}`"))),
    })
}

/// The assistant message of a Chat completion's `message` object.
pub fn chat_reply(message: &Value, model: Option<String>) -> Message {
    let parsed = parse_chat(
        vec![{
            let mut m = message.clone();
            m["role"] = json!("assistant");
            m
        }],
        0,
        false,
    );
    let content = parsed.ok().and_then(|r| r.messages.into_iter().next()).map(|w| w.message.content().to_vec()).unwrap_or_default();
    Message::Assistant { content, model, stop: None, usage: None }
}
