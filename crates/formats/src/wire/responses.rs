//! OpenAI Responses: its items read into neutral messages (a run of items the model produced is one
//! assistant message), and its replies.

use super::*;

/// Whether a Responses item is the model's own (it groups into one assistant message with its neighbours).
pub(crate) fn assistant_item(item: &Value) -> bool {
    match str_of(item, "type") {
        Some("message") => str_of(item, "role") == Some("assistant"),
        Some(t) => !t.ends_with("_output") && !matches!(t, "item_reference" | "compaction" | "compaction_summary"),
        None => str_of(item, "role") == Some("assistant"),
    }
}

/// Neutral blocks of a Responses message item's `content`.
pub(crate) fn responses_content(content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    content_blocks(content, at, |p| (str_of(p, "type") == Some("input_image")).then(|| crate::codex::url_image(str_of(p, "image_url").unwrap_or("").to_string())))
}

/// The neutral blocks of one assistant-side Responses item, whose `content` is given apart.
pub(crate) fn responses_assistant_blocks(item: &Value, content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    Ok(match str_of(item, "type") {
        Some("message") | None => responses_content(content, at)?,
        Some("reasoning") => {
            let text: Vec<&str> = item
                .get("summary")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|p| str_of(p, "text")).collect())
                .unwrap_or_default();
            vec![Block::thinking(text.join("\n"), str_of(item, "encrypted_content").map(str::to_string))]
        }
        Some(t) => {
            let id = str_of(item, "call_id").or_else(|| str_of(item, "id")).unwrap_or("").to_string();
            let name = str_of(item, "name").map_or_else(|| t.trim_end_matches("_call").to_string(), str::to_string);
            let arguments = match (item.get("arguments"), item.get("input"), item.get("action")) {
                (Some(Value::String(a)), _, _) => a.clone(),
                (Some(a), _, _) => json_text(a),
                (None, Some(Value::String(i)), _) => i.clone(),
                (None, _, Some(action)) => json_text(action),
                _ => "{}".to_string(),
            };
            vec![Block::tool_call(id, name, arguments)]
        }
    })
}

/// What a Responses item reads as: blocks of the model's message it belongs to, or a message of its own.
pub(crate) enum ItemRead {
    Assistant(Vec<Block>),
    Message(Message),
}

/// Reads a Responses item (not of the system prefix) at `at`, whose `content` is given apart.
pub(crate) fn responses_item(item: &Value, content: Field<'_, '_>, at: &str) -> Result<ItemRead, WireError> {
    if assistant_item(item) {
        return Ok(ItemRead::Assistant(responses_assistant_blocks(item, content, at)?));
    }
    Ok(ItemRead::Message(match str_of(item, "type") {
        Some("message") | None => {
            let content = responses_content(content, at)?;
            let origin = match str_of(item, "role") {
                Some("user") => origin_of(&content),
                Some("system" | "developer") => UserOrigin::Host,
                Some(other) => return Err(werr(at.to_string(), format!("unknown role `{other}`"))),
                None => return Err(werr(at.to_string(), "a message item needs a `role`")),
            };
            Message::User { content, origin }
        }
        Some(t) if t.ends_with("_output") => {
            let (text, is_error) = crate::codex::output_text(item.get("output").cloned());
            Message::ToolResult { call_id: str_of(item, "call_id").unwrap_or("").to_string(), tool_name: String::new(), content: vec![Block::Text { text }], is_error }
        }
        Some(t) => Message::user_text(format!("[{t} item]"), UserOrigin::Summary),
    }))
}

/// Adds item `i`, read, to `req`: consecutive items of the model form one assistant message
/// (`prev_assistant`: the item before was one). `part` is its wire JSON, kept when given.
pub(crate) fn responses_push(req: &mut WireRequest, item: ItemRead, i: usize, part: Option<Value>, prev_assistant: &mut bool) {
    let (message, assistant) = match item {
        ItemRead::Assistant(blocks) => {
            if let (true, Some(last)) = (*prev_assistant, req.messages.last_mut()) {
                if let Message::Assistant { content, .. } = &mut last.message {
                    content.extend(blocks);
                    last.parts.extend(part);
                    return;
                }
            }
            (Message::Assistant { content: blocks, model: None, stop: None, usage: None }, true)
        }
        ItemRead::Message(m) => (m, false),
    };
    *prev_assistant = assistant;
    req.messages.push(WireMessage { message, wire: i, envelope: Map::new(), parts: part.into_iter().collect() });
}

pub(crate) fn parse_responses(list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    let mut in_prefix = prefix;
    let mut prev_assistant = false;
    for (i, mut part) in list.into_iter().enumerate() {
        let i = first + i;
        let at = format!("input[{i}]");
        if !part.is_object() {
            return Err(werr(at, "expected an item object"));
        }
        if in_prefix && matches!(str_of(&part, "role"), Some("system" | "developer")) {
            req.system.push(part);
            continue;
        }
        in_prefix = false;
        let mark = take_cache_control(&mut part);
        let item = responses_item(&part, Field::Value(part.get("content")), &at)?;
        // Marks are kept on the items of a message of their own (the model's items keep none).
        if let (Some(c), ItemRead::Message(_)) = (mark, &item) {
            req.cache_marks.push((req.messages.len(), c));
        }
        responses_push(&mut req, item, i, Some(part), &mut prev_assistant);
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// The assistant message of a Responses reply's output items.
pub fn responses_reply(output: &[Value], model: Option<String>) -> Message {
    // Read from values, the blocks cannot fail (only a list kept as text can).
    let content = output.iter().filter(|i| assistant_item(i)).flat_map(|i| responses_assistant_blocks(i, Field::Value(i.get("content")), "output").unwrap_or_default()).collect();
    Message::Assistant { content, model, stop: None, usage: None }
}
