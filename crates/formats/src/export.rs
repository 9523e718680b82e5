//! Exporters: a rendered context as an OpenAI Chat Completions `messages` array, as an Anthropic Messages
//! request body, or as condense's own neutral JSON.
//!
//! Rules where the providers differ from the neutral model (documented in `docs/events.md`):
//! OpenAI gets no thinking blocks and no images inside tool messages (replaced by a marker text);
//! Anthropic gets thinking blocks only when they carry a signature, tool arguments that are not a JSON
//! object wrapped as `{"input": <text>}`, no empty or white-space-only text blocks (the API rejects them),
//! and adjacent messages of the same role
//! merged into one (tool results travel inside user messages).

use condense_events::{Block, Message};
use serde_json::{json, Map, Value};

/// The neutral JSON form of a context (the serde form of the message model).
pub fn neutral<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Value {
    Value::Array(messages.iter().map(|m| neutral_message(m)).collect())
}

/// The length in bytes of `serde_json::to_vec(&neutral(messages))`, without building it: a message's
/// JSON with no blocks, and each block's on its own (the payload guard measures every request of a
/// model transition this way; the whole tree of a message of 150,000 parts took 100 MB).
pub fn neutral_len<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> u64 {
    let len = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len() as u64);
    let mut total = 2 + messages.len().saturating_sub(1) as u64;
    for m in messages {
        let empty = neutral_message_with(m, Vec::new());
        let blocks: u64 = m.content().iter().map(|b| len(&neutral_block(b))).sum();
        total += len(&empty) + blocks + m.content().len().saturating_sub(1) as u64;
    }
    total
}

fn neutral_message(m: &Message) -> Value {
    neutral_message_with(m, m.content().iter().map(neutral_block).collect())
}

fn neutral_message_with(m: &Message, blocks: Vec<Value>) -> Value {
    match m {
        Message::User { origin, .. } => json!({"role": "user", "origin": format!("{origin:?}").to_lowercase(), "content": blocks}),
        Message::Assistant { model, stop, .. } => {
            let mut o = json!({"role": "assistant", "content": blocks});
            if let Some(model) = model {
                o["model"] = json!(model);
            }
            if let Some(stop) = stop {
                o["stop"] = json!(format!("{stop:?}").to_lowercase());
            }
            o
        }
        Message::ToolResult { call_id, tool_name, is_error, .. } => {
            json!({"role": "tool", "call_id": call_id, "tool_name": tool_name, "is_error": is_error, "content": blocks})
        }
    }
}

/// A block of an unmodelled kind as the client wrote it: it goes back to the API it came from unchanged.
fn as_written(o: &condense_events::Opaque) -> Option<Value> {
    serde_json::from_str(&o.json).ok()
}

fn neutral_block(b: &Block) -> Value {
    match b {
        Block::Text { text } => json!({"type": "text", "text": text}),
        Block::Thinking(t) => json!({"type": "thinking", "thinking": t.thinking, "signature": t.signature}),
        Block::ToolCall(c) => json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}),
        Block::Image(i) => json!({"type": "image", "mime": i.mime, "data": i.data}),
        Block::Opaque(o) => json!({"type": "opaque", "kind": o.kind, "json": o.json}),
    }
}

fn data_url(mime: &str, data: &str) -> String {
    if data.starts_with("data:") || data.starts_with("http") {
        data.to_string()
    } else {
        format!("data:{mime};base64,{data}")
    }
}

/// A tool name as both providers accept it (`^[a-zA-Z0-9_-]{1,64}$`: Anthropic allows 128 characters,
/// OpenAI 64). A recorded name that does not match (a sanitized log holds names such as
/// `[REDACTED_NAME len=43 …]`) is mapped the same way in every request: each other character becomes `_`,
/// cut to 55 characters, then `_` and 8 hex digits of a hash of the whole original name, so two names
/// never meet.
pub fn provider_tool_name(name: &str) -> std::borrow::Cow<'_, str> {
    if condense_events::is_provider_identifier(name) {
        return std::borrow::Cow::Borrowed(name);
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    // FNV-1a, 64 bits: fixed, so the mapping never changes between runs or builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let base: String = name.chars().map(|c| if ok(c) { c } else { '_' }).take(55).collect();
    std::borrow::Cow::Owned(format!("{}_{:08x}", if base.is_empty() { "tool".into() } else { base }, h as u32))
}

/// The context as OpenAI Chat Completions messages.
pub fn openai<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Value {
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        match &**m {
            Message::User { content, .. } => {
                let only_text = content.iter().all(|b| matches!(b, Block::Text { .. }));
                let c = if only_text {
                    json!(m.text())
                } else {
                    Value::Array(
                        content
                            .iter()
                            .filter_map(|b| match b {
                                Block::Text { text } => Some(json!({"type": "text", "text": text})),
                                Block::Image(i) => {
                                    Some(json!({"type": "image_url", "image_url": {"url": data_url(&i.mime, &i.data)}}))
                                }
                                Block::Opaque(o) => as_written(o),
                                _ => None,
                            })
                            .collect(),
                    )
                };
                out.push(json!({"role": "user", "content": c}));
            }
            Message::Assistant { .. } => {
                let text = m.text();
                let calls: Vec<Value> = m
                    .tool_calls()
                    .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": provider_tool_name(name), "arguments": args}}))
                    .collect();
                // Thinking does not travel in Chat Completions: an assistant message of thinking only would
                // be `content: null` without calls, which OpenAI rejects. It carries nothing here: left out.
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut o = Map::new();
                o.insert("role".into(), json!("assistant"));
                o.insert("content".into(), if text.is_empty() { Value::Null } else { json!(text) });
                if !calls.is_empty() {
                    o.insert("tool_calls".into(), Value::Array(calls));
                }
                out.push(Value::Object(o));
            }
            Message::ToolResult { call_id, content, .. } => {
                let mut text = String::new();
                for b in content {
                    match b {
                        Block::Text { text: t } => text.push_str(t),
                        Block::Image(_) => text.push_str("[image omitted: tool messages carry text only]"),
                        _ => {}
                    }
                }
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
            }
        }
    }
    Value::Array(out)
}

/// The context as OpenAI Responses input items. Thinking is left out (a reasoning item can only go back
/// to its provider with its own id and encrypted content, which a rewritten message no longer carries);
/// consecutive text blocks of an assistant message make one message item.
pub fn responses<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Value {
    let mut out = Vec::new();
    for m in messages {
        match &**m {
            Message::User { content, .. } => {
                // A message of one text is the API's short form, a string: fewer bytes for the provider to
                // read in every later request, with the same meaning (condense's blocks, checkpoints, notes).
                if let [Block::Text { text }] = content.as_slice() {
                    out.push(json!({"type": "message", "role": "user", "content": text}));
                    continue;
                }
                let parts: Vec<Value> = content
                    .iter()
                    .filter_map(|b| match b {
                        Block::Text { text } => Some(json!({"type": "input_text", "text": text})),
                        Block::Image(i) => Some(json!({"type": "input_image", "image_url": data_url(&i.mime, &i.data)})),
                        Block::Opaque(o) => as_written(o),
                        _ => None,
                    })
                    .collect();
                out.push(json!({"type": "message", "role": "user", "content": parts}));
            }
            Message::Assistant { content, .. } => {
                let mut texts: Vec<Value> = Vec::new();
                let flush = |texts: &mut Vec<Value>, out: &mut Vec<Value>| {
                    if !texts.is_empty() {
                        out.push(json!({"type": "message", "role": "assistant", "content": std::mem::take(texts)}));
                    }
                };
                for b in content {
                    match b {
                        Block::Text { text } if !text.is_empty() => texts.push(json!({"type": "output_text", "text": text, "annotations": []})),
                        Block::ToolCall(c) => {
                            flush(&mut texts, &mut out);
                            out.push(json!({"type": "function_call", "call_id": c.id, "name": provider_tool_name(&c.name), "arguments": c.arguments}));
                        }
                        _ => {}
                    }
                }
                flush(&mut texts, &mut out);
            }
            Message::ToolResult { call_id, content, .. } => {
                let mut text = String::new();
                for b in content {
                    match b {
                        Block::Text { text: t } => text.push_str(t),
                        Block::Image(_) => text.push_str("[image omitted: tool outputs carry text only]"),
                        _ => {}
                    }
                }
                out.push(json!({"type": "function_call_output", "call_id": call_id, "output": text}));
            }
        }
    }
    Value::Array(out)
}

fn anthropic_image(mime: &str, data: &str) -> Value {
    if data.starts_with("http") {
        json!({"type": "image", "source": {"type": "url", "url": data}})
    } else {
        let raw = data.split_once(";base64,").map_or(data, |(_, d)| d);
        json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": raw}})
    }
}

/// `id`, or, when `used` holds it already, the first of `ID_2`, `ID_3`, … it does not; the result is added
/// to `used`. How a tool-call id that appears again is renamed (the Anthropic exporter, the SWE-agent
/// importer).
pub fn unique_call_id(id: &str, used: &mut std::collections::BTreeSet<String>) -> String {
    let mut unique = id.to_string();
    let mut n = 1;
    while used.contains(&unique) {
        n += 1;
        unique = format!("{id}_{n}");
    }
    used.insert(unique.clone());
    unique
}

/// The context as an Anthropic Messages request body (`{"messages": [...]}`; model, system prompt and
/// tool definitions are the host's to add).
pub fn anthropic<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Value {
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    // Anthropic rejects a tool_use id that appears twice in a request; some providers' ids repeat across
    // messages (`call_0` every turn). A repeat becomes `ID_2`, `ID_3`, … and the results after it follow.
    let mut used: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut current: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for m in messages {
        if let Message::Assistant { .. } = &**m {
            current.clear();
            for (id, _, _) in m.tool_calls() {
                if !current.contains_key(id) {
                    // A repeat within one message is answered once (the render's repair).
                    current.insert(id.to_string(), unique_call_id(id, &mut used));
                }
            }
        }
        let id_of = |id: &str| current.get(id).cloned().unwrap_or_else(|| id.to_string());
        let (role, blocks) = match &**m {
            Message::User { content, .. } => (
                "user",
                content
                    .iter()
                    .filter_map(|b| match b {
                        Block::Text { text } if !text.trim().is_empty() => Some(json!({"type": "text", "text": text})),
                        Block::Image(i) => Some(anthropic_image(&i.mime, &i.data)),
                        Block::Opaque(o) => as_written(o),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            ),
            Message::Assistant { content, .. } => (
                "assistant",
                content
                    .iter()
                    .filter_map(|b| match b {
                        Block::Text { text } if !text.trim().is_empty() => Some(json!({"type": "text", "text": text})),
                        Block::Thinking(t) if !t.thinking.is_empty() && t.signature.is_some() => {
                            Some(json!({"type": "thinking", "thinking": t.thinking, "signature": t.signature}))
                        }
                        Block::ToolCall(c) => {
                            let input = match serde_json::from_str::<Value>(&c.arguments) {
                                Ok(v @ Value::Object(_)) => v,
                                _ => json!({"input": c.arguments}),
                            };
                            Some(json!({"type": "tool_use", "id": id_of(&c.id), "name": provider_tool_name(&c.name), "input": input}))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
            Message::ToolResult { call_id, content, is_error, .. } => {
                let inner: Vec<Value> = content
                    .iter()
                    .filter_map(|b| match b {
                        Block::Text { text } if !text.trim().is_empty() => Some(json!({"type": "text", "text": text})),
                        Block::Image(i) => Some(anthropic_image(&i.mime, &i.data)),
                        Block::Opaque(o) => as_written(o),
                        _ => None,
                    })
                    .collect();
                let mut r = json!({"type": "tool_result", "tool_use_id": id_of(call_id), "content": inner});
                if *is_error {
                    r["is_error"] = json!(true);
                }
                ("user", vec![r])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((r, b)) if r == role => b.extend(blocks),
            _ => out.push((role.to_string(), blocks)),
        }
    }
    json!({"messages": out.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect::<Vec<_>>()})
}

/// A checkpoint as a pi session `compaction` entry line, so pi itself rebuilds the same context: pi keeps
/// the entries from `firstKeptEntryId` on after the summary, so the retained prompts (which sit before the
/// boundary) are appended to the summary text under "Recent requests". `id` is derived from the session
/// and checkpoint, `parent` is the entry the line is appended after (the session's leaf).
#[allow(clippy::too_many_arguments)]
pub fn pi_compaction(
    session: &str,
    n: u32,
    parent: &str,
    first_kept: Option<&str>,
    summary: &str,
    kept_prompts: &[String],
    tokens_before: u64,
    timestamp: &str,
) -> String {
    // FNV-1a of session and number: a stable 8-hex-digit id like pi's.
    let mut h: u32 = 0x811c_9dc5;
    for b in format!("{session}#c{n}").bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let mut text = summary.to_string();
    if !kept_prompts.is_empty() {
        text.push_str("\n\n## Recent requests\n");
        for p in kept_prompts {
            text.push_str(&format!("- {p}\n"));
        }
    }
    let mut v = json!({
        "type": "compaction",
        "id": format!("{h:08x}"),
        "parentId": parent,
        "timestamp": timestamp,
        "summary": text,
        "tokensBefore": tokens_before,
        "fromHook": true,
    });
    if let Some(k) = first_kept {
        v["firstKeptEntryId"] = json!(k);
    }
    serde_json::to_string(&v).expect("JSON of a compaction line")
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

    /// The payload guard's measure without the tree is the tree's length, byte for byte, for every kind of
    /// message and block (none, one, many; escapes; optional fields present and absent).
    #[test]
    fn neutral_len_is_the_length_of_the_neutral_json() {
        let ms = vec![
            Message::user_text("go \"quoted\" é\n", UserOrigin::Prompt),
            Message::User { content: vec![], origin: UserOrigin::Injected },
            Message::User { content: (0..50).map(|i| Block::Text { text: format!("p{i}") }).chain([Block::image("image/png".into(), "AAAA".into())]).collect(), origin: UserOrigin::Prompt },
            Message::Assistant { content: vec![Block::thinking("hm".into(), Some("sig".into())), Block::tool_call("c1".into(), "bash".into(), r#"{"a":1}"#.into())], model: Some("m".into()), stop: Some(condense_events::StopReason::ToolUse), usage: None },
            Message::Assistant { content: vec![Block::Text { text: "done".into() }, Block::opaque("x".into(), r#"{"type":"x"}"#.into())], model: None, stop: None, usage: None },
            Message::ToolResult { call_id: "c1".into(), tool_name: "bash".into(), content: vec![Block::Text { text: "out".into() }], is_error: true },
        ];
        let ms: Vec<std::sync::Arc<Message>> = ms.into_iter().map(std::sync::Arc::new).collect();
        for k in 0..=ms.len() {
            let some = &ms[..k];
            assert_eq!(neutral_len(some), serde_json::to_vec(&neutral(some)).unwrap().len() as u64, "the first {k} messages");
        }
    }

    /// A Responses user message of one text goes as the API's short form, a string (fewer bytes read again
    /// in every later request); one of several texts or an image keeps its list of parts, and both read
    /// back as the message they were written from.
    #[test]
    fn a_responses_user_message_of_one_text_is_a_string() {
        let one = Message::user_text("[Compressed chain b1]\nt1 bash (ls): 9 chars", UserOrigin::Summary);
        let two = Message::User { content: vec![Block::Text { text: "a".into() }, Block::Text { text: "b".into() }], origin: UserOrigin::Prompt };
        let image = Message::User { content: vec![Block::Text { text: "see".into() }, Block::image("image/png".into(), "AAAA".into())], origin: UserOrigin::Prompt };
        let items = responses(&[&one, &two, &image]);
        assert_eq!(items[0], json!({"type": "message", "role": "user", "content": "[Compressed chain b1]\nt1 bash (ls): 9 chars"}));
        assert_eq!(items[1]["content"], json!([{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]));
        assert_eq!(items[2]["content"].as_array().map(Vec::len), Some(2));
        let read = crate::wire::parse_request(crate::wire::Api::Responses, items.as_array().unwrap().clone()).unwrap();
        let texts: Vec<String> = read.messages.iter().map(|m| m.message.text()).collect();
        assert_eq!(texts, ["[Compressed chain b1]\nt1 bash (ls): 9 chars", "ab", "see"]);
    }

    #[test]
    fn a_tool_use_id_repeated_across_messages_is_made_unique_for_anthropic() {
        let call = |id: &str| Message::Assistant { content: vec![Block::tool_call(id.into(), "bash".into(), "{}".into())], model: None, stop: None, usage: None };
        let result = |id: &str, t: &str| Message::ToolResult { call_id: id.into(), tool_name: "bash".into(), content: vec![Block::Text { text: t.into() }], is_error: false };
        let ms = vec![Message::user_text("go", UserOrigin::Prompt), call("call_0"), result("call_0", "a"), call("call_0"), result("call_0", "b"), call("call_0_2"), result("call_0_2", "c")];
        let v = anthropic(&ms.into_iter().map(std::sync::Arc::new).collect::<Vec<_>>());
        let pairs: Vec<(String, String)> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().unwrap().clone())
            .filter_map(|b| match b["type"].as_str() {
                Some("tool_use") => Some(("use".to_string(), b["id"].as_str().unwrap().to_string())),
                Some("tool_result") => Some((b["content"][0]["text"].as_str().unwrap().to_string(), b["tool_use_id"].as_str().unwrap().to_string())),
                _ => None,
            })
            .collect();
        let expect = [("use", "call_0"), ("a", "call_0"), ("use", "call_0_2"), ("b", "call_0_2"), ("use", "call_0_2_2"), ("c", "call_0_2_2")];
        assert_eq!(pairs, expect.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn tool_names_a_provider_rejects_are_mapped_the_same_way_every_time() {
        assert_eq!(provider_tool_name("exec_command"), "exec_command");
        assert_eq!(provider_tool_name("mcp__server-1__read"), "mcp__server-1__read");
        let odd = "[REDACTED_NAME len=43 sha=1a2b3c4d]";
        let a = provider_tool_name(odd);
        assert_eq!(a, provider_tool_name(odd));
        let valid = |n: &str| !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        assert!(valid(&a), "{a}");
        assert_ne!(a, provider_tool_name("[REDACTED_NAME len=43 sha=ffffffff]"));
        let long = "x".repeat(100);
        assert!(valid(&provider_tool_name(&long)) && provider_tool_name(&long).len() == 64);
        assert!(valid(&provider_tool_name("")));
        // In every provider format.
        let m = Message::Assistant { content: vec![Block::tool_call("c1".into(), odd.into(), "{}".into())], model: None, stop: None, usage: None };
        let ms = [&m];
        assert_eq!(openai(&ms)[0]["tool_calls"][0]["function"]["name"], a.as_ref());
        assert_eq!(anthropic(&ms)["messages"][0]["content"][0]["name"], a.as_ref());
        assert_eq!(responses(&ms)[0]["name"], a.as_ref());
    }

    #[test]
    fn a_thinking_only_assistant_message_is_left_out_of_chat_completions() {
        let messages = [
            Message::user_text("hi", UserOrigin::Prompt),
            Message::Assistant { content: vec![Block::thinking("hmm".into(), None)], model: None, stop: None, usage: None },
            Message::user_text("again", UserOrigin::Prompt),
            Message::Assistant { content: vec![Block::Text { text: "hello".into() }], model: None, stop: None, usage: None },
        ];
        let v = openai(&messages.iter().collect::<Vec<_>>());
        let roles: Vec<&str> = v.as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "user", "assistant"]);
        assert!(v.as_array().unwrap().iter().all(|m| !m["content"].is_null() || m.get("tool_calls").is_some()));
    }
}

