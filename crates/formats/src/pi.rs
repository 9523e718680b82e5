//! pi session JSONL, versions 1 to 3. Version 1 files are linear: entries get ids from their position
//! (`e<index>`, the header being index 0) and each follows the one before, which is how pi itself migrates
//! them. Versions 2 and 3 are trees (`id`/`parentId`); the active branch is the path to the last entry.

use crate::jsonl::{json_text, str_of, take_str, Diagnostic, Line};
use crate::Output;
use condense_events::{Block, Entry, Message, SourceEvent, StopReason, Usage, UserOrigin};
use serde_json::Value;
use std::collections::BTreeSet;

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
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut previous: Option<String> = None;
    // Position among parsed objects, header included, as pi's version-1 `firstKeptEntryIndex` counts.
    let offset = u64::from(header.is_some());
    for (i, mut line) in iter.enumerate() {
        let n = line.line;
        let index = i as u64 + offset;
        let (mut id, parent) = if version >= 2 {
            let id = str_of(&line.value, "id").map(str::to_string);
            let parent = match line.value.get("parentId") {
                Some(Value::String(p)) => Some(p.clone()),
                _ => None,
            };
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
        let kind = str_of(&line.value, "type").unwrap_or("").to_string();
        let entry = match kind.as_str() {
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
                Entry::Message(Message::User {
                    content: user_blocks(content, &mut |m| diags.push(diag(n, m))),
                    origin: UserOrigin::Injected,
                })
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
        };
        known.insert(id.clone());
        previous = Some(id.clone());
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
                        Some("thinking") => content.push(Block::Thinking {
                            thinking: take_str(&mut b, "thinking").unwrap_or_default(),
                            signature: take_str(&mut b, "thinkingSignature").filter(|s| !s.is_empty()),
                        }),
                        Some("toolCall") => content.push(Block::ToolCall {
                            id: take_str(&mut b, "id").unwrap_or_default(),
                            name: take_str(&mut b, "name").unwrap_or_default(),
                            arguments: b.get("arguments").map_or_else(|| "{}".to_string(), json_text),
                        }),
                        other => diag(format!("unknown assistant block type {other:?} dropped")),
                    }
                }
            }
            let stop = match str_of(&m, "stopReason") {
                Some("stop") => Some(StopReason::Stop),
                Some("toolUse") => Some(StopReason::ToolUse),
                Some("length") => Some(StopReason::Length),
                Some("error") => Some(StopReason::Error),
                Some("aborted") => Some(StopReason::Aborted),
                _ => None,
            };
            let usage = m.get("usage").map(|u| Usage {
                input: u.get("input").and_then(Value::as_u64).unwrap_or(0),
                output: u.get("output").and_then(Value::as_u64).unwrap_or(0),
                cache_read: u.get("cacheRead").and_then(Value::as_u64).unwrap_or(0),
                cache_write: u.get("cacheWrite").and_then(Value::as_u64).unwrap_or(0),
            });
            Entry::Message(Message::Assistant { content, model: take_str(&mut m, "model"), stop, usage })
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
            Entry::Message(Message::User { content: user_blocks(content, diag), origin: UserOrigin::Injected })
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
                    Some("image") => out.push(Block::Image {
                        mime: take_str(&mut b, "mimeType").unwrap_or_else(|| "image/png".into()),
                        data: take_str(&mut b, "data").unwrap_or_default(),
                    }),
                    other => diag(format!("unknown content block type {other:?} dropped")),
                }
            }
            out
        }
        Value::Null => Vec::new(),
        other => vec![Block::Text { text: json_text(&other) }],
    }
}
