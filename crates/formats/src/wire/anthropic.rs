//! Anthropic Messages: its messages and content blocks read into neutral messages, and its replies.

use super::*;

/// Neutral blocks of one block of Anthropic assistant content, read without taking the block apart.
pub(crate) fn assistant_block(b: &Value, out: &mut Vec<Block>) {
    match str_of(b, "type") {
        Some("text") => out.push(Block::Text { text: str_of(b, "text").unwrap_or("").to_string() }),
        Some("tool_use" | "server_tool_use") => out.push(Block::tool_call(
            str_of(b, "id").unwrap_or("").to_string(),
            str_of(b, "name").unwrap_or("").to_string(),
            b.get("input").map_or_else(|| "{}".to_string(), json_text),
        )),
        _ => out.extend(assistant_blocks(Some(Value::Array(vec![b.clone()])), &mut |_| {})),
    }
}

pub(crate) fn parse_anthropic(list: Vec<Value>, first: usize) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    for (i, m) in list.into_iter().enumerate() {
        let i = first + i;
        let Value::Object(mut obj) = m else { return Err(werr(format!("messages[{i}]"), "expected an object")) };
        let content = Content::Value(obj.remove("content"));
        anthropic_message(&mut req, i, obj, content, true)?;
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// The neutral messages of Anthropic message `i` (its fields other than `content` in `envelope`), pushed
/// to `req` with its wire JSON when `keep`.
pub(crate) fn anthropic_message(req: &mut WireRequest, i: usize, envelope: Map<String, Value>, content: Content<'_>, keep: bool) -> Result<(), WireError> {
    let at = format!("messages[{i}]");
    let role = envelope.get("role").and_then(Value::as_str).ok_or_else(|| werr(at.clone(), "`role` is missing"))?.to_string();
    let string_content = matches!(content, Content::Value(Some(Value::String(_))));
    let (values, raw) = match content {
        Content::Value(Some(Value::String(s))) => (vec![json!({"type": "text", "text": s})], Vec::new()),
        Content::Value(Some(Value::Array(a))) => (a, Vec::new()),
        Content::Raw(raw) => (Vec::new(), raw),
        _ => return Err(werr(at, "`content` must be a string or a list of blocks")),
    };
    let user = match role.as_str() {
        "assistant" => false,
        "user" | "system" => true,
        other => return Err(werr(at, format!("unknown role `{other}`"))),
    };
    let push = |req: &mut WireRequest, message: Message, parts: Vec<Value>| {
        // A string content goes out as it came: a one-block list would change the bytes.
        let (envelope, parts) = match (keep, string_content) {
            (false, _) => (Map::new(), Vec::new()),
            (true, true) => (envelope.clone(), vec![Value::String(message.text())]),
            (true, false) => (envelope.clone(), parts),
        };
        req.messages.push(WireMessage { message, wire: i, envelope, parts });
    };
    let first = req.messages.len();
    let mut mark = None;
    // The blocks gathered for the next message: neutral, and as the client wrote them (when kept). An
    // assistant message is one; a user message is split at each tool result.
    let mut run: (Vec<Block>, Vec<Value>) = Default::default();
    if !user {
        // One message of every block: room for them at once, not by doubling.
        run.0.reserve_exact(values.len() + raw.len());
    }
    let flush = |req: &mut WireRequest, run: &mut (Vec<Block>, Vec<Value>)| {
        if run.0.is_empty() && user {
            return;
        }
        let content = std::mem::take(&mut run.0);
        let message = match (user, role.as_str()) {
            (false, _) => Message::Assistant { content, model: None, stop: None, usage: None },
            (true, "system") => Message::User { content, origin: UserOrigin::Host },
            (true, _) => {
                let origin = origin_of(&content);
                Message::User { content, origin }
            }
        };
        push(req, message, std::mem::take(&mut run.1));
    };
    let content_at = format!("{at}.content");
    let blocks = values.into_iter().map(Ok).chain(raw.iter().enumerate().map(|(j, t)| read_raw(t, &content_at, j)));
    for (j, b) in blocks.enumerate() {
        let mut b = b?;
        if !b.is_object() || str_of(&b, "type").is_none() {
            return Err(werr(format!("{at}.content[{j}]"), "expected a block object with a `type`"));
        }
        if let Some(c) = take_cache_control(&mut b) {
            mark = Some(c);
        }
        if !user {
            assistant_block(&b, &mut run.0);
        } else if str_of(&b, "type") == Some("tool_result") {
            flush(req, &mut run);
            let call_id = str_of(&b, "tool_use_id").unwrap_or("").to_string();
            let content = result_blocks(b.get("content").cloned(), &mut |_| {});
            let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
            push(req, Message::ToolResult { call_id, tool_name: String::new(), content, is_error }, vec![b]);
            continue;
        } else {
            run.0.push(user_block(&b));
        }
        if keep {
            run.1.push(b);
        }
    }
    flush(req, &mut run);
    if let (Some(c), true) = (mark, req.messages.len() > first) {
        req.cache_marks.push((req.messages.len() - 1, c));
    }
    Ok(())
}

/// The neutral block of a block of Anthropic user content: text and images; anything else is an opaque
/// block holding its JSON (sent back as written; recovery fails closed on it).
pub(crate) fn user_block(b: &Value) -> Block {
    match str_of(b, "type") {
        Some("text") => Block::Text { text: str_of(b, "text").unwrap_or("").to_string() },
        Some("image") => crate::claude::image(&mut b.clone()),
        other => Block::opaque(other.unwrap_or("").to_string(), json_text(b)),
    }
}

/// The assistant message of an Anthropic reply's content blocks.
pub fn anthropic_reply(content: &[Value], model: Option<String>) -> Message {
    Message::Assistant { content: assistant_blocks(Some(Value::Array(content.to_vec())), &mut |_| {}), model, stop: None, usage: None }
}
