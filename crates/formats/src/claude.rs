//! Claude Code session JSONL. Assistant responses are streamed one content block per line and are
//! regrouped by `message.id`; tool results are paired with their calls by `tool_use_id`, never by walking
//! `parentUuid` (parallel calls make that graph a tree). Progress, snapshot, queue and title lines carry no
//! model context and are skipped. The context after a `compact_boundary` is what follows it.

use crate::json::{json_text, str_of, take_str};
use crate::jsonl::{Diagnostic, Line};
use crate::Output;
use condense_events::{Block, Entry, Message, SourceEvent, StopReason, Usage, UserOrigin};
use serde_json::Value;
use std::collections::BTreeMap;

pub(crate) fn import(file: &str, lines: impl Iterator<Item = Line>) -> Output {
    let mut events = Vec::new();
    let diagnostics = import_to(file, lines, &mut |e| events.push(e));
    Output { events, diagnostics }
}

/// [`import`], handing the events to `emit` as the lines are read: an entry leaves once no later line
/// can change it (everything before the assistant message still open for merging), after the session's
/// start (known from its first message line); the diagnostics are returned at the end.
pub(crate) fn import_to(file: &str, lines: impl Iterator<Item = Line>, emit: &mut dyn FnMut(SourceEvent)) -> Vec<Diagnostic> {
    let mut chain = crate::Chain::new(emit);
    let mut diags = Vec::new();
    let diag = |line: u64, message: String| Diagnostic { file: file.to_string(), line, message };
    // The session's identity comes from its first message line, read as the lines stream by.
    // Older Claude Code wrote subagent lines into the main file; a file whose first message is not a
    // sidechain keeps only the main thread.
    let mut main_is_sidechain = false;
    let mut b = Builder::default();
    let mut model: Option<String> = None;
    let mut skipped_sidechain = 0u64;
    let mut unknown = crate::UnknownTypes::default();
    for mut line in lines {
        let n = line.line;
        let v = &mut line.value;
        let kind = str_of(v, "type").unwrap_or("").to_string();
        if !chain.started() && matches!(kind.as_str(), "user" | "assistant") {
            main_is_sidechain = v.get("isSidechain").and_then(Value::as_bool) == Some(true);
            chain.start(SourceEvent::SessionStarted {
                source: "claude-code".into(),
                source_id: str_of(v, "sessionId").map(str::to_string),
                cwd: str_of(v, "cwd").map(str::to_string),
                timestamp: str_of(v, "timestamp").map(str::to_string),
            });
        }
        if matches!(kind.as_str(), "user" | "assistant")
            && v.get("isSidechain").and_then(Value::as_bool) == Some(true)
            && !main_is_sidechain
        {
            skipped_sidechain += 1;
            continue;
        }
        let uuid = str_of(v, "uuid").map_or_else(|| format!("line{n}"), str::to_string);
        match kind.as_str() {
            "assistant" => {
                let Some(mut msg) = v.get_mut("message").map(Value::take) else {
                    diags.push(diag(n, "assistant line without `message`".into()));
                    continue;
                };
                let msg_id = str_of(&msg, "id").map(str::to_string);
                if let Some(m) = str_of(&msg, "model").filter(|m| *m != "<synthetic>") {
                    if model.as_deref() != Some(m) {
                        model = Some(m.to_string());
                        b.side_event(&mut chain, SourceEvent::ModelChanged {
                            provider: Some("anthropic".into()),
                            model: m.to_string(),
                            context_window: None,
                            max_output: None,
                        });
                    }
                }
                let blocks = assistant_blocks(msg.get_mut("content").map(Value::take), &mut |m| diags.push(diag(n, m)));
                for blk in &blocks {
                    if let Block::ToolCall(c) = blk {
                        b.names.insert(c.id.clone(), c.name.clone());
                    }
                }
                let stop = match str_of(&msg, "stop_reason") {
                    Some("end_turn" | "stop_sequence") => Some(StopReason::Stop),
                    Some("tool_use") => Some(StopReason::ToolUse),
                    Some("max_tokens") => Some(StopReason::Length),
                    Some("refusal") => Some(StopReason::Error),
                    _ => None,
                };
                let usage = msg.get("usage").map(|u| Usage {
                    input: u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
                    output: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
                    cache_read: u.get("cache_read_input_tokens").and_then(Value::as_u64).unwrap_or(0),
                    cache_write: u.get("cache_creation_input_tokens").and_then(Value::as_u64).unwrap_or(0),
                });
                // The time of the request a new assistant message answers, as near as the file tells: the
                // line of its first block (the blocks streamed after it join it).
                if !b.continues(msg_id.as_deref()) {
                    if let Some(timestamp) = str_of(v, "timestamp") {
                        b.side_event(&mut chain, SourceEvent::HostTime { timestamp: timestamp.to_string() });
                    }
                }
                b.assistant(uuid, msg_id, blocks, take_str(&mut msg, "model"), stop, usage);
            }
            "user" => {
                // Lines shown only in the transcript are not sent to the model, except the continuation
                // summary after a compaction, which Claude Code marks that way and does send.
                if v.get("isVisibleInTranscriptOnly").and_then(Value::as_bool) == Some(true)
                    && v.get("isCompactSummary").and_then(Value::as_bool) != Some(true)
                {
                    continue;
                }
                let origin = if v.get("isCompactSummary").and_then(Value::as_bool) == Some(true) {
                    UserOrigin::Summary
                } else if v.get("isMeta").and_then(Value::as_bool) == Some(true) {
                    UserOrigin::Injected
                } else {
                    UserOrigin::Prompt
                };
                let Some(mut msg) = v.get_mut("message").map(Value::take) else {
                    diags.push(diag(n, "user line without `message`".into()));
                    continue;
                };
                match msg.get_mut("content").map(Value::take) {
                    Some(Value::String(text)) => {
                        let origin = refine_origin(origin, &text);
                        b.push(uuid, Entry::Message(Message::User { content: vec![Block::Text { text }], origin }));
                    }
                    Some(Value::Array(blocks)) => {
                        let mut rest = Vec::new();
                        let mut k = 0;
                        for mut blk in blocks {
                            match str_of(&blk, "type") {
                                Some("tool_result") => {
                                    let call_id = take_str(&mut blk, "tool_use_id").unwrap_or_default();
                                    let tool_name = b.names.get(&call_id).cloned().unwrap_or_default();
                                    if tool_name.is_empty() {
                                        diags.push(diag(n, format!("tool result `{call_id}` has no matching call")));
                                    }
                                    let content = result_blocks(blk.get_mut("content").map(Value::take), &mut |m| diags.push(diag(n, m)));
                                    let is_error = blk.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                                    let id = if k == 0 { uuid.clone() } else { format!("{uuid}#{k}") };
                                    k += 1;
                                    b.push(id, Entry::Message(Message::ToolResult { call_id, tool_name, content, is_error }));
                                }
                                Some("text") => rest.push(Block::Text { text: take_str(&mut blk, "text").unwrap_or_default() }),
                                Some("image") => rest.push(image(&mut blk)),
                                other => diags.push(diag(n, format!("unknown user block type {other:?} dropped"))),
                            }
                        }
                        if !rest.is_empty() {
                            let text: String = rest.iter().filter_map(|b| match b { Block::Text { text } => Some(text.as_str()), _ => None }).collect();
                            let origin = refine_origin(origin, &text);
                            let id = if k == 0 { uuid } else { format!("{uuid}#{k}") };
                            b.push(id, Entry::Message(Message::User { content: rest, origin }));
                        }
                    }
                    _ => diags.push(diag(n, "user message without content".into())),
                }
            }
            "system" => {
                if str_of(v, "subtype") == Some("compact_boundary") {
                    let tokens_before = v.get("compactMetadata").and_then(|m| m.get("preTokens")).and_then(Value::as_u64);
                    b.push(uuid, Entry::HostCompaction { summary: None, first_kept: None, replacement: Vec::new(), tokens_before });
                }
            }
            other if crate::skipped_line_type("claude-code", other) => {}
            other => diags.extend(unknown.first(file, n, other)),
        }
        if chain.started() {
            b.release(&mut chain);
        }
    }
    if skipped_sidechain > 0 {
        diags.push(diag(0, format!("{skipped_sidechain} sidechain (subagent) lines skipped; import the subagent file itself")));
    }
    if !chain.started() {
        chain.start(SourceEvent::SessionStarted { source: "claude-code".into(), source_id: None, cwd: None, timestamp: None });
    }
    b.open = None;
    b.release(&mut chain);
    chain.finish();
    diags
}

/// Command wrappers and interrupt markers are sent to the model but are not user prompts; a
/// `<system-reminder>` (meta or not) is host context.
fn refine_origin(origin: UserOrigin, text: &str) -> UserOrigin {
    let t = text.trim_start();
    if matches!(origin, UserOrigin::Prompt | UserOrigin::Injected) && condense_events::host_context_kind(t).is_some() {
        UserOrigin::Host
    } else if origin == UserOrigin::Prompt
        && (t.starts_with("<command-name>")
            || t.starts_with("<command-message>")
            || t.starts_with("<local-command-")
            || t.starts_with("[Request interrupted by user"))
    {
        UserOrigin::Injected
    } else {
        origin
    }
}

pub(crate) fn image(blk: &mut Value) -> Block {
    let src = blk.get_mut("source").map(Value::take).unwrap_or(Value::Null);
    Block::image(
        str_of(&src, "media_type").unwrap_or("image/png").to_string(),
        str_of(&src, "data").or_else(|| str_of(&src, "url")).unwrap_or("").to_string(),
    )
}

pub(crate) fn assistant_blocks(content: Option<Value>, diag: &mut dyn FnMut(String)) -> Vec<Block> {
    let mut out = Vec::new();
    match content {
        Some(Value::Array(blocks)) => {
            for mut b in blocks {
                match str_of(&b, "type") {
                    Some("text") => out.push(Block::Text { text: take_str(&mut b, "text").unwrap_or_default() }),
                    Some("thinking") => out.push(Block::thinking(
                        take_str(&mut b, "thinking").unwrap_or_default(),
                        take_str(&mut b, "signature").filter(|s| !s.is_empty()),
                    )),
                    Some("redacted_thinking") => out.push(Block::thinking(
                        String::new(),
                        take_str(&mut b, "data"),
                    )),
                    Some("tool_use" | "server_tool_use") => out.push(Block::tool_call(
                        take_str(&mut b, "id").unwrap_or_default(),
                        take_str(&mut b, "name").unwrap_or_default(),
                        b.get("input").map_or_else(|| "{}".to_string(), json_text),
                    )),
                    other => {
                        diag(format!("unknown assistant block type {other:?} kept as an opaque block"));
                        out.push(Block::opaque(other.unwrap_or("").to_string(), json_text(&b)));
                    }
                }
            }
        }
        Some(Value::String(text)) => out.push(Block::Text { text }),
        _ => {}
    }
    out
}

pub(crate) fn result_blocks(content: Option<Value>, diag: &mut dyn FnMut(String)) -> Vec<Block> {
    match content {
        Some(Value::String(text)) => vec![Block::Text { text }],
        Some(Value::Array(blocks)) => {
            let mut out = Vec::new();
            for mut b in blocks {
                match str_of(&b, "type") {
                    Some("text") => out.push(Block::Text { text: take_str(&mut b, "text").unwrap_or_default() }),
                    Some("image") => out.push(image(&mut b)),
                    Some("tool_reference") => out.push(Block::Text { text: json_text(&b) }),
                    other => {
                        diag(format!("unknown tool-result block type {other:?} kept as an opaque block"));
                        out.push(Block::opaque(other.unwrap_or("").to_string(), json_text(&b)));
                    }
                }
            }
            out
        }
        Some(Value::Null) | None => Vec::new(),
        Some(other) => vec![Block::Text { text: json_text(&other) }],
    }
}

/// Builds a linear entry chain, merging streamed assistant lines that share a `message.id` into the open
/// assistant message. The open message and the entries after it are held back until it closes, so a
/// merge never rewrites an emitted event; the entries before it go to the chain.
#[derive(Default)]
struct Builder {
    /// Entries not handed to the chain yet (the first is the chain's next).
    entries: Vec<(String, Entry)>,
    /// The index in `entries` of the assistant message still open for merging, with its provider message id.
    open: Option<(usize, String)>,
    names: BTreeMap<String, String>,
}

impl Builder {
    fn push(&mut self, id: String, entry: Entry) {
        if matches!(entry, Entry::Message(Message::User { .. }) | Entry::HostCompaction { .. }) {
            self.open = None;
        }
        self.entries.push((id, entry));
    }

    /// Model changes are reported just before the entry that first used the model.
    fn side_event(&mut self, chain: &mut crate::Chain<'_>, ev: SourceEvent) {
        chain.side(chain.emitted() + self.entries.len(), ev);
    }

    /// Whether an assistant line of provider message id `msg_id` joins the open assistant message.
    fn continues(&self, msg_id: Option<&str>) -> bool {
        matches!((&self.open, msg_id), (Some((ix, open_id)), Some(id)) if open_id == id && matches!(self.entries[*ix].1, Entry::Message(Message::Assistant { .. })))
    }

    fn assistant(
        &mut self,
        uuid: String,
        msg_id: Option<String>,
        blocks: Vec<Block>,
        model: Option<String>,
        stop: Option<StopReason>,
        usage: Option<Usage>,
    ) {
        if let (Some((ix, open_id)), Some(id)) = (&self.open, &msg_id) {
            if open_id == id {
                if let Entry::Message(Message::Assistant { content, stop: s, usage: u, .. }) = &mut self.entries[*ix].1 {
                    content.extend(blocks);
                    if stop.is_some() {
                        *s = stop;
                    }
                    if usage.is_some() {
                        *u = usage.map(Box::new);
                    }
                    return;
                }
            }
        }
        self.entries.push((uuid, Entry::Message(Message::Assistant { content: blocks, model, stop, usage: usage.map(Box::new) })));
        self.open = msg_id.map(|id| (self.entries.len() - 1, id));
    }

    /// Hands the entries before the open assistant message (all, if none is open) to the chain.
    fn release(&mut self, chain: &mut crate::Chain<'_>) {
        let upto = self.open.as_ref().map_or(self.entries.len(), |(ix, _)| *ix);
        self.entries.drain(..upto).for_each(|(id, e)| chain.entry(id, e));
        // The open message is now the first held.
        if let Some((ix, _)) = &mut self.open {
            *ix = 0;
        }
    }
}
