//! pi session JSONL, versions 1 to 3. Version 1 files are linear: entries get ids from their position
//! (`e<index>`, the header being index 0) and each follows the one before, which is how pi itself migrates
//! them. Versions 2 and 3 are trees (`id`/`parentId`); the active branch is the path to the last entry.

use crate::json::{json_text, json_text_of_raw, str_of, take_str};
use crate::jsonl::{Diagnostic, FastEntry, Line};
use crate::Output;
use condense_events::{Block, Entry, Message, SourceEvent, StopReason, Usage, UserOrigin};
use serde_json::Value;

pub(crate) fn import(file: &str, lines: impl Iterator<Item = Line>) -> Output {
    let mut events = Vec::new();
    let diagnostics = import_to(file, lines, &mut |e| events.push(e));
    Output { events, diagnostics }
}

/// [`import`], handing each event to `emit` as soon as its line is read (a file is never held whole);
/// the diagnostics are returned at the end.
pub(crate) fn import_to(file: &str, lines: impl Iterator<Item = Line>, emit: &mut dyn FnMut(SourceEvent)) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    let diag = |line: u64, message: String| Diagnostic { file: file.to_string(), line, message };
    let mut iter = lines.peekable();
    let header = match iter.peek() {
        Some(l) if str_of(&l.value, "type") == Some("session") => iter.next(),
        Some(l) => {
            diags.push(diag(l.line, "no session header; version inferred from the entries".into()));
            None
        }
        None => None,
    };
    let version = match &header {
        Some(h) => h.value.get("version").and_then(Value::as_u64).unwrap_or(1),
        None if iter.peek().is_some_and(|l| l.value.get("id").is_some() && l.value.get("parentId").is_some()) => 3,
        None => 1,
    };
    let h = header.as_ref().map(|h| &h.value);
    emit(SourceEvent::SessionStarted {
        source: "pi".into(),
        source_id: h.and_then(|h| str_of(h, "id")).map(str::to_string),
        cwd: h.and_then(|h| str_of(h, "cwd")).map(str::to_string),
        timestamp: h.and_then(|h| str_of(h, "timestamp")).map(str::to_string),
    });
    if let Some(model) = h.and_then(|h| str_of(h, "modelId")) {
        emit(SourceEvent::ModelChanged {
            provider: h.and_then(|h| str_of(h, "provider")).map(str::to_string),
            model: model.to_string(),
            context_window: None,
            max_output: None,
        });
    }
    // Ids seen so far: looked up only, never iterated (three lookups a line, in a session of any length).
    let mut known: rustc_hash::FxHashSet<String> = rustc_hash::FxHashSet::default();
    let mut previous: Option<String> = None;
    // Position among parsed objects, header included, as pi's version-1 `firstKeptEntryIndex` counts.
    let offset = u64::from(header.is_some());
    for (i, mut line) in iter.enumerate() {
        let n = line.line;
        let index = i as u64 + offset;
        // A message line read without a `Value` (see [`fast`]) brings its ids and entry.
        let (fast_ids, fast_entry, fast_time) = match line.fast.take() {
            Some(crate::jsonl::Fast::Entry(f)) => (Some((f.id, f.parent)), Some(f.entry), f.timestamp),
            _ => (None, None, None),
        };
        let (mut id, parent) = if version >= 2 {
            let (id, parent) = fast_ids.unwrap_or_else(|| {
                let id = str_of(&line.value, "id").map(str::to_string);
                let parent = match line.value.get("parentId") {
                    Some(Value::String(p)) => Some(p.clone()),
                    _ => None,
                };
                (id, parent)
            });
            match id {
                Some(id) => (id, parent),
                None => {
                    diags.push(diag(n, "entry without id; given one from its line and attached to the previous entry".into()));
                    (format!("line{n}"), previous.clone())
                }
            }
        } else {
            (format!("e{index}"), previous.clone())
        };
        if known.contains(&id) {
            // A name no entry has: the file may hold `x~4` itself.
            let mut fresh = format!("{id}~{n}");
            let mut k = 1;
            while known.contains(&fresh) {
                k += 1;
                fresh = format!("{id}~{n}.{k}");
            }
            diags.push(diag(n, format!("duplicate entry id `{id}`; renamed `{fresh}`")));
            id = fresh;
        }
        let parent = match parent {
            Some(p) if !known.contains(&p) => {
                diags.push(diag(
                    n,
                    format!("parent `{p}` not found; attached to the previous entry instead"),
                ));
                previous.clone()
            }
            p => p,
        };
        let entry = match fast_entry {
            Some(entry) => entry,
            None => {
                let kind = str_of(&line.value, "type").unwrap_or("").to_string();
                match kind.as_str() {
                    "message" => match line.value.get_mut("message").map(Value::take) {
                        Some(msg) => message(msg, n, &mut |m| diags.push(diag(n, m))),
                        None => {
                            diags.push(diag(n, "message entry without `message`".into()));
                            Entry::Marker { kind: "message".into() }
                        }
                    },
                    "compaction" => {
                        let first_kept = match (str_of(&line.value, "firstKeptEntryId"), line.value.get("firstKeptEntryIndex")) {
                            (Some(id), _) => Some(id.to_string()),
                            (None, Some(ix)) => ix.as_u64().map(|ix| format!("e{ix}")),
                            _ => None,
                        };
                        Entry::HostCompaction {
                            summary: take_str(&mut line.value, "summary"),
                            first_kept,
                            replacement: Vec::new(),
                            tokens_before: line.value.get("tokensBefore").and_then(Value::as_u64),
                        }
                    }
                    "branch_summary" => Entry::BranchSummary {
                        from: str_of(&line.value, "fromId").map(str::to_string),
                        summary: take_str(&mut line.value, "summary").unwrap_or_default(),
                    },
                    "custom_message" => {
                        let content = line.value.get_mut("content").map(Value::take).unwrap_or(Value::Null);
                        let content = user_blocks(content, &mut |m| diags.push(diag(n, m)));
                        Entry::Message(Message::User { origin: custom_origin(&content), content })
                    }
                    "model_change" => {
                        let model = str_of(&line.value, "modelId").or_else(|| str_of(&line.value, "model"));
                        if let Some(model) = model {
                            emit(SourceEvent::ModelChanged {
                                provider: str_of(&line.value, "provider").map(str::to_string),
                                model: model.to_string(),
                                context_window: None,
                                max_output: None,
                            });
                        }
                        Entry::Marker { kind: "model_change".into() }
                    }
                    "custom" => Entry::Marker {
                        kind: format!("custom:{}", str_of(&line.value, "customType").unwrap_or("")),
                    },
                    "thinking_level_change" | "label" | "session_info" => Entry::Marker { kind },
                    "session" => {
                        diags.push(diag(n, "second session header ignored".into()));
                        continue;
                    }
                    other => {
                        diags.push(diag(n, format!("unknown entry type `{other}` kept as a marker outside the context")));
                        Entry::Marker { kind: other.to_string() }
                    }
                }
            }
        };
        known.insert(id.clone());
        previous = Some(id.clone());
        // The time of the request an assistant message answers, as near as the file tells: its line's.
        if matches!(entry, Entry::Message(Message::Assistant { .. })) {
            if let Some(timestamp) = fast_time.or_else(|| str_of(&line.value, "timestamp").map(str::to_string)) {
                emit(SourceEvent::HostTime { timestamp });
            }
        }
        emit(SourceEvent::EntryAppended { id, parent, entry });
    }
    diags
}

/// Converts a pi message (any role) into an entry.
fn message(mut m: Value, _line: u64, diag: &mut dyn FnMut(String)) -> Entry {
    let role = str_of(&m, "role").unwrap_or("").to_string();
    match role.as_str() {
        "user" => {
            let content = m.get_mut("content").map(Value::take).unwrap_or(Value::Null);
            Entry::Message(Message::User { content: user_blocks(content, diag), origin: UserOrigin::Prompt })
        }
        "assistant" => {
            let mut content = Vec::new();
            if let Some(Value::Array(blocks)) = m.get_mut("content").map(Value::take) {
                for mut b in blocks {
                    match str_of(&b, "type") {
                        Some("text") => content.push(Block::Text { text: take_str(&mut b, "text").unwrap_or_default() }),
                        Some("thinking") => content.push(Block::thinking(
                            take_str(&mut b, "thinking").unwrap_or_default(),
                            take_str(&mut b, "thinkingSignature").filter(|s| !s.is_empty()),
                        )),
                        Some("toolCall") => content.push(Block::tool_call(
                            take_str(&mut b, "id").unwrap_or_default(),
                            take_str(&mut b, "name").unwrap_or_default(),
                            b.get("arguments").map_or_else(|| "{}".to_string(), json_text),
                        )),
                        other => {
                            diag(format!("unknown assistant block type {other:?} kept as an opaque block"));
                            content.push(Block::opaque(other.unwrap_or("").to_string(), json_text(&b)));
                        }
                    }
                }
            }
            let stop = stop_reason(str_of(&m, "stopReason"));
            let usage = m.get("usage").map(|u| Usage {
                input: u.get("input").and_then(Value::as_u64).unwrap_or(0),
                output: u.get("output").and_then(Value::as_u64).unwrap_or(0),
                cache_read: u.get("cacheRead").and_then(Value::as_u64).unwrap_or(0),
                cache_write: u.get("cacheWrite").and_then(Value::as_u64).unwrap_or(0),
            });
            Entry::Message(Message::Assistant { content, model: take_str(&mut m, "model"), stop, usage: usage.map(Box::new) })
        }
        "toolResult" => {
            let content = m.get_mut("content").map(Value::take).unwrap_or(Value::Null);
            Entry::Message(Message::ToolResult {
                call_id: take_str(&mut m, "toolCallId").unwrap_or_default(),
                tool_name: take_str(&mut m, "toolName").unwrap_or_default(),
                content: user_blocks(content, diag),
                is_error: m.get("isError").and_then(Value::as_bool).unwrap_or(false),
            })
        }
        "bashExecution" => {
            if m.get("excludeFromContext").and_then(Value::as_bool) == Some(true) {
                return Entry::Marker { kind: "bashExecution:excluded".into() };
            }
            Entry::Message(Message::user_text(bash_text(&m), UserOrigin::Shell))
        }
        "custom" | "hookMessage" => {
            let content = m.get_mut("content").map(Value::take).unwrap_or(Value::Null);
            let content = user_blocks(content, diag);
            Entry::Message(Message::User { origin: custom_origin(&content), content })
        }
        "branchSummary" => Entry::BranchSummary {
            from: str_of(&m, "fromId").map(str::to_string),
            summary: take_str(&mut m, "summary").unwrap_or_default(),
        },
        "compactionSummary" => Entry::Message(Message::user_text(
            condense_events::host_summary_text(&take_str(&mut m, "summary").unwrap_or_default()),
            UserOrigin::Summary,
        )),
        other => {
            diag(format!("unknown message role `{other}` kept as a marker outside the context"));
            Entry::Marker { kind: format!("message:{other}") }
        }
    }
}

/// An assistant message's `stopReason`, where it is one condense knows.
fn stop_reason(s: Option<&str>) -> Option<StopReason> {
    match s {
        Some("stop") => Some(StopReason::Stop),
        Some("toolUse") => Some(StopReason::ToolUse),
        Some("length") => Some(StopReason::Length),
        Some("error") => Some(StopReason::Error),
        Some("aborted") => Some(StopReason::Aborted),
        _ => None,
    }
}

/// How a user-run shell command reads in the rendered context (condense's wording).
fn bash_text(m: &Value) -> String {
    let command = str_of(m, "command").unwrap_or("");
    let output = str_of(m, "output").unwrap_or("");
    let mut text = format!("[User ran a shell command]\n$ {command}\n{output}");
    if m.get("cancelled").and_then(Value::as_bool) == Some(true) {
        text.push_str("\n[command cancelled]");
    } else if let Some(code) = m.get("exitCode").and_then(Value::as_i64).filter(|c| *c != 0) {
        text.push_str(&format!("\n[exit code {code}]"));
    }
    if m.get("truncated").and_then(Value::as_bool) == Some(true) {
        text.push_str("\n[output truncated]");
    }
    text
}

/// Text and image blocks of a user or tool-result message (a plain string is one text block).
pub(crate) fn user_blocks(content: Value, diag: &mut dyn FnMut(String)) -> Vec<Block> {
    match content {
        Value::String(text) => vec![Block::Text { text }],
        Value::Array(blocks) => {
            let mut out = Vec::with_capacity(blocks.len());
            for mut b in blocks {
                match str_of(&b, "type") {
                    Some("text") => out.push(Block::Text { text: take_str(&mut b, "text").unwrap_or_default() }),
                    Some("image") => out.push(Block::image(
                        take_str(&mut b, "mimeType").unwrap_or_else(|| "image/png".into()),
                        take_str(&mut b, "data").unwrap_or_default(),
                    )),
                    other => {
                        diag(format!("unknown content block type {other:?} kept as an opaque block"));
                        out.push(Block::opaque(other.unwrap_or("").to_string(), json_text(&b)));
                    }
                }
            }
            out
        }
        Value::Null => Vec::new(),
        other => vec![Block::Text { text: json_text(&other) }],
    }
}

/// A message line of a pi session read without building a `serde_json::Value` (issue 10, item 4: most of
/// an import's parsing is building values for fields nobody reads): the common shapes only (a `message`
/// entry whose message is a user, assistant or tool-result message with the usual field types and block
/// types), and `None` for anything else, which is then read as a `Value` by [`import_to`] as before; the
/// entry is the one that path builds from the same line.
pub(crate) fn fast(text: &str) -> Option<FastEntry> {
    let line: fast_shape::Line<'_> = crate::json::object(text)?;
    if line.kind != "message" {
        return None;
    }
    let m = line.message?.0;
    let entry = match m.role.as_deref()? {
        "user" => Entry::Message(Message::User { content: fast_user_blocks(m.content)?, origin: UserOrigin::Prompt }),
        "assistant" => {
            let mut content = Vec::new();
            // Only an array of blocks gives the assistant content, as in `message`.
            if let Some(fast_shape::Content::Blocks(blocks)) = m.content {
                for b in blocks {
                    content.push(match b.kind.as_deref()? {
                        "text" => Block::Text { text: owned(b.text) },
                        "thinking" => Block::thinking(owned(b.thinking), b.thinking_signature.map(String::from).filter(|s| !s.is_empty())),
                        "toolCall" => Block::tool_call(
                            owned(b.id),
                            owned(b.name),
                            match b.arguments {
                                None => "{}".to_string(),
                                Some(a) => json_text_of_raw(a)?,
                            },
                        ),
                        _ => return None,
                    });
                }
            }
            let stop = stop_reason(m.stop_reason.as_deref());
            let usage = m.usage.map(|u| {
                let u = u.map(|u| u.0).unwrap_or_default();
                Usage { input: u.input.unwrap_or(0), output: u.output.unwrap_or(0), cache_read: u.cache_read.unwrap_or(0), cache_write: u.cache_write.unwrap_or(0) }
            });
            Entry::Message(Message::Assistant { content, model: m.model.map(String::from), stop, usage: usage.map(Box::new) })
        }
        "toolResult" => Entry::Message(Message::ToolResult {
            call_id: owned(m.tool_call_id),
            tool_name: owned(m.tool_name),
            content: fast_user_blocks(m.content)?,
            is_error: m.is_error.unwrap_or(false),
        }),
        _ => return None,
    };
    let timestamp = line.timestamp.filter(|_| matches!(entry, Entry::Message(Message::Assistant { .. }))).map(String::from);
    Some(FastEntry { id: line.id.map(String::from), parent: line.parent.map(String::from), entry, timestamp })
}

fn owned(s: Option<std::borrow::Cow<'_, str>>) -> String {
    s.map(String::from).unwrap_or_default()
}

/// [`user_blocks`] of content read by [`fast`]; `None` where it would report a block it drops.
fn fast_user_blocks(content: Option<fast_shape::Content<'_>>) -> Option<Vec<Block>> {
    Some(match content {
        None => Vec::new(),
        Some(fast_shape::Content::Text(text)) => vec![Block::Text { text: text.into() }],
        Some(fast_shape::Content::Blocks(blocks)) => {
            let mut out = Vec::with_capacity(blocks.len());
            for b in blocks {
                out.push(match b.kind.as_deref()? {
                    "text" => Block::Text { text: owned(b.text) },
                    "image" => Block::image(b.mime_type.map_or_else(|| "image/png".into(), String::from), owned(b.data)),
                    _ => return None,
                });
            }
            out
        }
    })
}

/// The shapes [`fast`] reads: only the fields the importer uses, strings borrowed from the line where
/// they hold no escape. A field of another type than the `Value` path accepts without a diagnostic, a
/// field given twice, or an array where an object belongs ([`Obj`]), fails the parse, and the line is
/// read as a `Value`.
mod fast_shape {
    use crate::json::Obj;
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::Deserialize;
    use std::borrow::Cow;

    #[derive(Deserialize)]
    pub(super) struct Line<'a> {
        #[serde(rename = "type", borrow)]
        pub kind: Cow<'a, str>,
        #[serde(default, borrow)]
        pub id: Option<Cow<'a, str>>,
        #[serde(rename = "parentId", default, borrow)]
        pub parent: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub message: Option<Obj<Msg<'a>>>,
        #[serde(default, borrow)]
        pub timestamp: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize)]
    pub(super) struct Msg<'a> {
        #[serde(default, borrow)]
        pub role: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub content: Option<Content<'a>>,
        #[serde(default, borrow)]
        pub model: Option<Cow<'a, str>>,
        #[serde(rename = "stopReason", default, borrow)]
        pub stop_reason: Option<Cow<'a, str>>,
        /// Present, even as `null`, it gives a usage (of zeros where a count is missing).
        #[serde(default, deserialize_with = "crate::json::present")]
        pub usage: Option<Option<Obj<Usage>>>,
        #[serde(rename = "toolCallId", default, borrow)]
        pub tool_call_id: Option<Cow<'a, str>>,
        #[serde(rename = "toolName", default, borrow)]
        pub tool_name: Option<Cow<'a, str>>,
        #[serde(rename = "isError", default)]
        pub is_error: Option<bool>,
    }

    #[derive(Deserialize, Default)]
    pub(super) struct Usage {
        #[serde(default)]
        pub input: Option<u64>,
        #[serde(default)]
        pub output: Option<u64>,
        #[serde(rename = "cacheRead", default)]
        pub cache_read: Option<u64>,
        #[serde(rename = "cacheWrite", default)]
        pub cache_write: Option<u64>,
    }

    #[derive(Deserialize)]
    pub(super) struct Block<'a> {
        #[serde(rename = "type", default, borrow)]
        pub kind: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub text: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub thinking: Option<Cow<'a, str>>,
        #[serde(rename = "thinkingSignature", default, borrow)]
        pub thinking_signature: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub id: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub name: Option<Cow<'a, str>>,
        /// Present, even as `null`, the arguments are its JSON text (as written when that is the
        /// value's compact text, which it most often is: no value is built for them then).
        #[serde(default, borrow, deserialize_with = "crate::json::present")]
        pub arguments: Option<&'a serde_json::value::RawValue>,
        #[serde(rename = "mimeType", default, borrow)]
        pub mime_type: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        pub data: Option<Cow<'a, str>>,
    }

    /// A message's content: a string, or an array of blocks (`null` is no content; anything else fails).
    pub(super) enum Content<'a> {
        Text(Cow<'a, str>),
        Blocks(Vec<Block<'a>>),
    }

    impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
                type Value = Content<'a>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string or an array of blocks")
                }
                fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                    Ok(Content::Text(Cow::Borrowed(s)))
                }
                fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                    Ok(Content::Text(Cow::Owned(s.to_string())))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(2));
                    while let Some(Obj(b)) = seq.next_element()? {
                        blocks.push(b);
                    }
                    Ok(Content::Blocks(blocks))
                }
            }
            d.deserialize_any(V(std::marker::PhantomData))
        }
    }

}

/// An extension's message: host context when it is (`<system-reminder>` with the workspace tree, the
/// date and the working directory), as serve classifies the same text in a request; otherwise injected.
fn custom_origin(content: &[Block]) -> UserOrigin {
    if crate::wire::is_host_context(content) {
        UserOrigin::Host
    } else {
        UserOrigin::Injected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast_tests::{both, corpus};

    #[test]
    fn the_fast_reader_gives_the_events_the_value_path_gives() {
        // The corpus pi sessions, whole.
        let fast_lines = corpus("pi", 5, |l| fast(l).is_some());
        assert!(fast_lines > 2000, "{fast_lines} corpus lines read fast");
        // Lines of unusual shapes, after enough ordinary ones that the format is known (the first lines
        // decide it and are always read as values): each is read fast or not as listed, and either way
        // gives what the value path gives.
        let odd = [
            (true, r#"{"type":"message","id":"a1","parentId":"m49","message":{"role":"assistant","content":[{"type":"toolCall","id":"c","name":"read","arguments":null},{"type":"toolCall","id":"d","name":"ls"}],"usage":null}}"#),
            (true, r#"{"type":"message","id":"a2","parentId":"a1","message":{"role":"assistant","content":"a string is no content here","usage":{"input":5,"output":null}}}"#),
            (true, r#"{"type":"message","id":"a3","parentId":"a2","message":{"role":"assistant","content":[{"type":"thinking","thinking":"hm","thinkingSignature":""},{"type":"text","text":"caf\u00e9 \"q\""}],"stopReason":"sideways","model":null}}"#),
            (true, r#"{"type":"message","id":"a4","parentId":"nowhere","message":{"role":"toolResult","toolCallId":"c","content":[{"type":"image","data":"AAAA"},{"type":"text","text":null}],"isError":null}}"#),
            (true, r#"{"type":"message","id":"a45","parentId":"a4","message":{"role":"assistant","content":[{"type":"toolCall","id":"e","name":"bash","arguments":{"command": "ls",  "timeout":1.5e1}},{"type":"toolCall","id":"f","name":"edit","arguments":{"k":1,"k":{"z":"caf\u00e9\/x","y":[-0,1]}}},{"type":"toolCall","id":"g","name":"x","arguments":"raw text"},{"type":"toolCall","id":"h","name":"y","arguments":[1,{"a":"b\n"}]}]}}"#),
            (true, r#"{"type":"message","id":"a4","parentId":"a4","message":{"role":"user","content":null,"extra":{"deep":[1,2,{"x":null}]}}}"#),
            (true, r#"  {"type":"message","message":{"role":"user","content":"no id"},"parentId":null}  "#),
            (false, r#"{"type":"message","id":"a5","message":{"role":"user","content":"a number for a parent"},"parentId":5.5e300}"#),
            (false, r#"{"type":"message","id":"b1","parentId":"a4","message":{"role":"user","content":"twice","content":"again"}}"#),
            (false, r#"{"type":"message","id":"b2","parentId":"b1","message":{"role":"toolResult","toolCallId":7,"content":"n"}}"#),
            (false, r#"{"type":"message","id":"b3","parentId":"b2","message":{"role":"assistant","content":[{"type":"video"}]}}"#),
            (false, r#"{"type":"message","id":"b4","parentId":"b3","message":{"role":"user","content":[{"text":"no type"}]}}"#),
            (false, r#"{"type":"message","id":"b5","parentId":"b4","message":{"role":"assistant","content":[],"usage":{"input":1.5}}}"#),
            (false, r#"{"type":"message","id":"b6","parentId":"b5","message":{"role":"bashExecution","command":"ls","output":"x"}}"#),
            (false, r#"{"type":"message","id":"b7","parentId":"b6","message":null}"#),
            (false, r#"{"type":"message","id":"b8","parentId":"b7","message":{"role":"user","content":{"an":"object"}}}"#),
            (false, r#"{"type":"compaction","id":"b9","parentId":"b8","summary":"s","firstKeptEntryId":"a1"}"#),
            (false, r#"{"type":"message","id":"c1","parentId":"b9","message":{"role":"user","content":"two"}}{"type":"message","id":"c2","parentId":"c1","message":{"role":"user","content":"on a line"}}"#),
            (false, r#"{"type":"message","id":"c3","parentId":"c2","message":{"role":"user","content":"bad \q escape"}}"#),
            (false, r#"{"type":"message","id":"c4","parentId":"c3","message":{"role":"user","content":"cut short"#),
            // Arrays where objects belong: a struct is read from an array field by field, never here.
            (false, r#"["message","x1","c4",{"role":"user","content":"an array line"}]"#),
            (false, r#"{"type":"message","id":"x2","parentId":"x1","message":["user","an array message"]}"#),
            (false, r#"{"type":"message","id":"x3","parentId":"x2","message":{"role":"user","content":[["text","an array block"]]}}"#),
            (false, r#"{"type":"message","id":"x4","parentId":"x3","message":{"role":"assistant","content":[],"usage":[1,2]}}"#),
        ];
        let mut text = String::from("{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\n");
        for i in 0..50 {
            let parent = if i == 0 { "null".to_string() } else { format!("\"m{}\"", i - 1) };
            text.push_str(&format!("{{\"type\":\"message\",\"id\":\"m{i}\",\"parentId\":{parent},\"message\":{{\"role\":\"user\",\"content\":\"line {i}\"}}}}\n"));
        }
        for (is_fast, line) in odd {
            assert_eq!(fast(line).is_some(), is_fast, "{line}");
            text.push_str(line);
            text.push('\n');
        }
        both("odd.jsonl", text.as_bytes());
        let read = crate::import_bytes("odd.jsonl", text.as_bytes()).unwrap();
        assert!(read.diagnostics.len() >= 8, "{:?}", read.diagnostics);
    }
}
