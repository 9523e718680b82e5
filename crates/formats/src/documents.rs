//! Sessions saved as one JSON document rather than JSON lines: opencode exports, Gemini CLI chats,
//! OpenHands event streams, SWE-agent trajectories and mini-swe-agent trajectories (`../shared/corpus/
//! FORMATS.md` §4–§8). JSON values carry no line numbers, so a diagnostic names the file, line 1 (where the
//! document starts) and the JSON path of the record it is about (`messages[4].parts[2]`).
//!
//! Each importer keeps every record it can read and reports the rest; a tool call whose result never came
//! is left to the render's pairing repair, like in the other formats.

use crate::json::{json_text, str_of};
use crate::jsonl::Diagnostic;
use crate::{linear_chain, Format, Output};
use condense_events::{Block, Entry, Message, SourceEvent, UserOrigin};
use serde_json::Value;
use std::collections::BTreeMap;

/// The document format `v` is, if condense reads it.
pub(crate) fn detect(v: &Value) -> Option<Format> {
    match v {
        Value::Object(o) => {
            let messages = o.get("messages").and_then(Value::as_array);
            if o.get("info").and_then(|i| i.get("id")).and_then(Value::as_str).is_some_and(|id| id.starts_with("ses_"))
                && messages.is_some_and(|m| m.iter().all(|m| m.get("parts").is_some()))
            {
                return Some(Format::OpenCode);
            }
            if o.contains_key("sessionId") && messages.is_some_and(|m| m.iter().any(|m| matches!(str_of(m, "type"), Some("user" | "gemini")))) {
                return Some(Format::GeminiCli);
            }
            if o.get("trajectory_format").and_then(Value::as_str).is_some_and(|f| f.starts_with("mini-swe-agent")) && messages.is_some() {
                return Some(Format::MiniSweAgent);
            }
            // SWE-agent's chat history has `role`s; an OpenHands evaluation output's `history` holds events.
            if o.get("history").and_then(Value::as_array).is_some_and(|h| h.iter().any(|m| m.get("role").is_some()) && !h.iter().any(is_openhands_event)) {
                return Some(Format::SweAgent);
            }
            None
        }
        Value::Array(events) if !events.is_empty() && events.iter().any(is_openhands_event) => Some(Format::OpenHands),
        _ => None,
    }
}

fn is_openhands_event(e: &Value) -> bool {
    e.get("source").and_then(Value::as_str).is_some() && (e.get("action").is_some() || e.get("observation").is_some())
}

/// Lines of an evaluation output looked at for one that shows what the file is.
const DETECT_LINES: usize = 8;

/// An OpenHands evaluation output (`output.jsonl`: one evaluated instance per line, its trajectory under
/// `history`): `None` when `bytes` is not one; else each trajectory as a session, keyed by the instance id
/// (or `line<N>`), or why none could be read. A line that cannot be read is a diagnostic of the first
/// session, naming its line.
pub(crate) fn evaluation_output(file: &str, bytes: &[u8]) -> Option<Result<Vec<(String, crate::Imported)>, String>> {
    let lines: Vec<(usize, &[u8])> = bytes.split(|b| *b == b'\n').enumerate().filter(|(_, l)| !l.trim_ascii().is_empty()).collect();
    // The first line that parses decides: a damaged first line (a run killed mid-write) does not hide
    // what the file is.
    let head: Value = lines.iter().take(DETECT_LINES).find_map(|(_, l)| serde_json::from_slice(l).ok())?;
    if !(head.get("history").is_some_and(Value::is_array) && (head.get("instance_id").is_some() || head.get("instruction").is_some())) {
        return None;
    }
    let mut sessions: Vec<(String, crate::Imported)> = Vec::new();
    let mut skipped: Vec<Diagnostic> = Vec::new();
    for (i, line) in lines {
        let n = i as u64 + 1;
        let diag = |message: String| Diagnostic { file: file.to_string(), line: n, message };
        let mut v: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                skipped.push(diag(format!("not JSON ({e}); line skipped")));
                continue;
            }
        };
        let key = match v.get("instance_id") {
            Some(Value::String(s)) => s.clone(),
            Some(other) if !other.is_null() => json_text(other),
            _ => format!("line{n}"),
        };
        let history = v.get_mut("history").map(Value::take).unwrap_or(Value::Null);
        if !history.as_array().is_some_and(|h| h.iter().any(is_openhands_event)) {
            skipped.push(diag(format!("instance `{key}`: its history holds no OpenHands events condense reads (an older event shape); line skipped")));
            continue;
        }
        let mut out = import(Format::OpenHands, file, history);
        if let Some(SourceEvent::SessionStarted { source_id, .. }) = out.events.first_mut() {
            *source_id = Some(key.clone());
        }
        for d in &mut out.diagnostics {
            d.line = n;
        }
        let mut events = out.events;
        events.extend(out.diagnostics.iter().map(Diagnostic::event));
        sessions.push((key, crate::Imported { format: Format::OpenHands, events, diagnostics: out.diagnostics }));
    }
    if sessions.is_empty() {
        let why = skipped.first().map_or_else(|| "no lines".to_string(), |d| d.to_string());
        return Some(Err(format!("it looks like an OpenHands evaluation output, but none of its trajectories could be read ({why})")));
    }
    if let Some((_, first)) = sessions.first_mut() {
        first.events.extend(skipped.iter().map(Diagnostic::event));
        first.diagnostics.extend(skipped);
    }
    Some(Ok(sessions))
}

/// What a JSON document that condense does not import looks like, for the message that says why.
pub(crate) fn looks_like(v: &Value) -> String {
    match v {
        Value::Object(o) if o.get("raw").and_then(|r| r.get("type")).is_some() && o.contains_key("kind") => {
            "an Anthropic managed-agent event transcript (one backend event per line), which condense does not read".into()
        }
        Value::Object(o) if o.contains_key("messages") && o.contains_key("meta") => {
            "a normalized session export (`messages` + `meta`), which condense does not read; import the agent's own session file instead".into()
        }
        Value::Object(o) => {
            let keys: Vec<&str> = o.keys().map(String::as_str).take(8).collect();
            format!("a JSON object of no session format condense reads (keys: {})", keys.join(", "))
        }
        Value::Array(a) => format!("a JSON array of {} items of no session format condense reads", a.len()),
        _ => "a bare JSON value, not a session".into(),
    }
}

/// Imports a document of `format`.
pub(crate) fn import(format: Format, file: &str, v: Value) -> Output {
    let mut d = Doc { file: file.to_string(), diagnostics: Vec::new(), entries: Vec::new() };
    let started = match format {
        Format::OpenCode => d.opencode(v),
        Format::GeminiCli => d.gemini(v),
        Format::OpenHands => d.openhands(v),
        Format::SweAgent => d.chat("swe-agent", v, "history"),
        Format::MiniSweAgent => d.chat("mini-swe-agent", v, "messages"),
        Format::Pi | Format::ClaudeCode | Format::Codex => unreachable!("JSON-lines formats are not documents"),
    };
    let mut events = vec![started];
    events.extend(linear_chain(d.entries, Vec::new()));
    Output { events, diagnostics: d.diagnostics }
}

struct Doc {
    file: String,
    diagnostics: Vec<Diagnostic>,
    entries: Vec<(String, Entry)>,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        // OpenAI-style content parts: the text of each text part.
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                p => p.get("text").and_then(Value::as_str).map(str::to_string),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => json_text(other),
    }
}

fn started(source: &str, id: Option<&str>, cwd: Option<&str>, timestamp: Option<String>) -> SourceEvent {
    SourceEvent::SessionStarted { source: source.into(), source_id: id.map(str::to_string), cwd: cwd.map(str::to_string), timestamp }
}

fn assistant(content: Vec<Block>, model: Option<String>) -> Entry {
    Entry::Message(Message::Assistant { content, model, stop: None, usage: None })
}

fn user(text: String, origin: UserOrigin) -> Entry {
    Entry::Message(Message::User { content: vec![Block::Text { text }], origin })
}

fn result(call_id: &str, tool: &str, text: String, is_error: bool) -> Entry {
    Entry::Message(Message::ToolResult { call_id: call_id.into(), tool_name: tool.into(), content: vec![Block::Text { text }], is_error })
}

impl Doc {
    fn diag(&mut self, path: String, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic { file: self.file.clone(), line: 1, message: format!("{path}: {}", message.into()) });
    }

    fn push(&mut self, id: String, entry: Entry) {
        self.entries.push((id, entry));
    }

    /// opencode export (§4): one assistant message per model step (`step-start` … `step-finish`), tool
    /// parts holding call and result; a compaction request and its summary become a host compaction.
    fn opencode(&mut self, mut v: Value) -> SourceEvent {
        let info = v.get("info").cloned().unwrap_or(Value::Null);
        let created = info.get("time").and_then(|t| t.get("created")).and_then(Value::as_u64).map(|ms| ms.to_string());
        let start = started("opencode", str_of(&info, "id"), str_of(&info, "directory"), created);
        let messages = match v.get_mut("messages").map(Value::take) {
            Some(Value::Array(m)) => m,
            _ => Vec::new(),
        };
        let mut compaction_asked = false;
        for (i, m) in messages.into_iter().enumerate() {
            let info = m.get("info").cloned().unwrap_or(Value::Null);
            let id = str_of(&info, "id").map_or_else(|| format!("m{i}"), str::to_string);
            let parts = m.get("parts").and_then(Value::as_array).cloned().unwrap_or_default();
            match str_of(&info, "role") {
                Some("user") => {
                    if parts.iter().any(|p| str_of(p, "type") == Some("compaction")) {
                        compaction_asked = true;
                        continue;
                    }
                    let mut texts = Vec::new();
                    let mut typed = false;
                    for (k, p) in parts.iter().enumerate() {
                        match str_of(p, "type") {
                            Some("text") => {
                                typed |= p.get("synthetic").and_then(Value::as_bool) != Some(true);
                                texts.push(str_of(p, "text").unwrap_or("").to_string());
                            }
                            Some("file") => texts.push(format!("[file {}]", str_of(p, "filename").or_else(|| str_of(p, "url")).unwrap_or("?"))),
                            Some("agent" | "patch" | "step-start" | "step-finish") => {}
                            other => self.diag(format!("messages[{i}].parts[{k}]"), format!("part type `{}` skipped", other.unwrap_or("(none)"))),
                        }
                    }
                    if !texts.is_empty() {
                        self.push(id, user(texts.join("\n"), if typed { UserOrigin::Prompt } else { UserOrigin::Injected }));
                    }
                }
                Some("assistant") => {
                    let model = str_of(&info, "modelID").map(str::to_string);
                    let summary = info.get("summary").and_then(Value::as_bool) == Some(true) || str_of(&info, "mode") == Some("compaction");
                    if summary || compaction_asked {
                        compaction_asked = false;
                        let text: Vec<&str> = parts.iter().filter(|p| str_of(p, "type") == Some("text")).filter_map(|p| str_of(p, "text")).collect();
                        self.push(id, Entry::HostCompaction { summary: Some(text.join("\n")), first_kept: None, replacement: Vec::new(), tokens_before: None });
                        continue;
                    }
                    // One assistant message per model step.
                    let mut step = 0;
                    let mut content = Vec::new();
                    let mut results = Vec::new();
                    let flush = |doc: &mut Doc, step: &mut usize, content: &mut Vec<Block>, results: &mut Vec<(String, Entry)>| {
                        if content.is_empty() && results.is_empty() {
                            return;
                        }
                        let sid = if *step == 0 { id.clone() } else { format!("{id}:{step}") };
                        doc.push(sid, assistant(std::mem::take(content), model.clone()));
                        for (rid, r) in results.drain(..) {
                            doc.push(rid, r);
                        }
                        *step += 1;
                    };
                    for (k, p) in parts.iter().enumerate() {
                        match str_of(p, "type") {
                            Some("step-start") => flush(self, &mut step, &mut content, &mut results),
                            Some("text") => content.push(Block::Text { text: str_of(p, "text").unwrap_or("").to_string() }),
                            Some("reasoning") => content.push(Block::thinking(str_of(p, "text").unwrap_or("").to_string(), None)),
                            Some("tool") => {
                                let call = str_of(p, "callID").map_or_else(|| format!("{id}-call{k}"), str::to_string);
                                let tool = str_of(p, "tool").unwrap_or("tool").to_string();
                                let state = p.get("state").cloned().unwrap_or(Value::Null);
                                let input = state.get("input").map(json_text).unwrap_or_else(|| "{}".into());
                                content.push(Block::tool_call(call.clone(), tool.clone(), input));
                                let rid = str_of(p, "id").map_or_else(|| format!("{id}-result{k}"), str::to_string);
                                match str_of(&state, "status") {
                                    Some("completed") => results.push((rid, result(&call, &tool, text_of(state.get("output").unwrap_or(&Value::Null)), false))),
                                    Some("error") => results.push((rid, result(&call, &tool, text_of(state.get("error").unwrap_or(&Value::Null)), true))),
                                    status => self.diag(format!("messages[{i}].parts[{k}]"), format!("tool call {call} has no result (status `{}`)", status.unwrap_or("(none)"))),
                                }
                            }
                            Some("step-finish" | "patch" | "file" | "agent" | "snapshot" | "compaction") => {}
                            other => self.diag(format!("messages[{i}].parts[{k}]"), format!("part type `{}` skipped", other.unwrap_or("(none)"))),
                        }
                    }
                    flush(self, &mut step, &mut content, &mut results);
                }
                other => self.diag(format!("messages[{i}]"), format!("message role `{}` skipped", other.unwrap_or("(none)"))),
            }
        }
        start
    }

    /// Gemini CLI chat (§5): tool calls carry their results inside the `gemini` message.
    fn gemini(&mut self, v: Value) -> SourceEvent {
        let start = started("gemini-cli", str_of(&v, "sessionId"), None, str_of(&v, "startTime").map(str::to_string));
        let messages = v.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
        for (i, m) in messages.iter().enumerate() {
            let id = str_of(m, "id").map_or_else(|| format!("m{i}"), str::to_string);
            match str_of(m, "type") {
                Some("user") => self.push(id, user(text_of(m.get("content").unwrap_or(&Value::Null)), UserOrigin::Prompt)),
                Some("gemini") => {
                    let mut content = Vec::new();
                    for t in m.get("thoughts").and_then(Value::as_array).into_iter().flatten() {
                        let thinking = [str_of(t, "subject"), str_of(t, "description")].into_iter().flatten().collect::<Vec<_>>().join(": ");
                        content.push(Block::thinking(thinking, None));
                    }
                    let text = text_of(m.get("content").unwrap_or(&Value::Null));
                    if !text.is_empty() {
                        content.push(Block::Text { text });
                    }
                    let mut results = Vec::new();
                    for (k, c) in m.get("toolCalls").and_then(Value::as_array).into_iter().flatten().enumerate() {
                        let call = str_of(c, "id").map_or_else(|| format!("{id}-call{k}"), str::to_string);
                        let name = str_of(c, "name").unwrap_or("tool").to_string();
                        content.push(Block::tool_call(call.clone(), name.clone(), c.get("args").map(json_text).unwrap_or_else(|| "{}".into())));
                        let output: Vec<String> = c
                            .get("result")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter_map(|r| r.get("functionResponse").and_then(|f| f.get("response")))
                            .map(|r| match r.get("output").or_else(|| r.get("error")) {
                                Some(o) => text_of(o),
                                None => json_text(r),
                            })
                            .collect();
                        if output.is_empty() && c.get("result").is_none() {
                            self.diag(format!("messages[{i}].toolCalls[{k}]"), format!("tool call {call} has no result"));
                            continue;
                        }
                        let is_error = str_of(c, "status").is_some_and(|s| s != "success");
                        results.push((format!("{call}:result"), result(&call, &name, output.join("\n"), is_error)));
                    }
                    if content.is_empty() {
                        continue;
                    }
                    self.push(id, assistant(content, str_of(m, "model").map(str::to_string)));
                    for (rid, r) in results {
                        self.push(rid, r);
                    }
                }
                // Notices the CLI shows (info, error, warning) are not part of the model context.
                Some("info" | "error" | "warning") => {}
                other => self.diag(format!("messages[{i}]"), format!("message type `{}` skipped", other.unwrap_or("(none)"))),
            }
        }
        start
    }

    /// OpenHands event stream (§6): actions with `tool_call_metadata` are tool calls (the actions of one
    /// model response form one assistant message), observations answer them by `tool_call_id`.
    fn openhands(&mut self, v: Value) -> SourceEvent {
        let events = v.as_array().cloned().unwrap_or_default();
        let first_ts = events.first().and_then(|e| str_of(e, "timestamp")).map(str::to_string);
        let start = started("openhands", None, None, first_ts);
        let mut open: Option<(String, String, Vec<Block>)> = None; // (response id, entry id, content)
        let close = |doc: &mut Doc, open: &mut Option<(String, String, Vec<Block>)>| {
            if let Some((_, id, content)) = open.take() {
                doc.push(id, assistant(content, None));
            }
        };
        for (i, e) in events.iter().enumerate() {
            let id = e.get("id").map_or_else(|| format!("e{i}"), |v| format!("e{}", json_text(v)));
            let source = str_of(e, "source").unwrap_or("");
            let meta = e.get("tool_call_metadata");
            let args = e.get("args").cloned().unwrap_or(Value::Null);
            if let Some(action) = str_of(e, "action") {
                match (source, action, meta) {
                    ("user", "message", _) => {
                        close(self, &mut open);
                        let text = str_of(&args, "content").or_else(|| str_of(e, "message")).unwrap_or("").to_string();
                        self.push(id, user(text, UserOrigin::Prompt));
                    }
                    (_, "system" | "recall" | "change_agent_state", _) => {}
                    ("agent", _, Some(meta)) => {
                        let response = meta.get("model_response").and_then(|r| str_of(r, "id")).unwrap_or("").to_string();
                        let call = str_of(meta, "tool_call_id").map_or_else(|| format!("{id}-call"), str::to_string);
                        let name = str_of(meta, "function_name").unwrap_or(action).to_string();
                        // The arguments as the model wrote them, from the raw response; else the action's own.
                        let raw = meta
                            .get("model_response")
                            .and_then(|r| r.pointer("/choices/0/message/tool_calls"))
                            .and_then(Value::as_array)
                            .and_then(|calls| calls.iter().find(|c| str_of(c, "id") == Some(call.as_str())))
                            .and_then(|c| c.pointer("/function/arguments"))
                            .map(text_of);
                        let arguments = raw.unwrap_or_else(|| {
                            let mut a = args.clone();
                            if let Some(o) = a.as_object_mut() {
                                o.remove("thought");
                            }
                            json_text(&a)
                        });
                        if open.as_ref().is_none_or(|(r, _, _)| r != &response || response.is_empty()) {
                            close(self, &mut open);
                            let mut content = Vec::new();
                            if let Some(t) = str_of(&args, "thought").filter(|t| !t.is_empty()) {
                                content.push(Block::Text { text: t.to_string() });
                            }
                            open = Some((response, id.clone(), content));
                        }
                        if let Some((_, _, content)) = open.as_mut() {
                            content.push(Block::tool_call(call, name, arguments));
                        }
                    }
                    ("agent", "message", None) => {
                        close(self, &mut open);
                        let text = str_of(&args, "content").or_else(|| str_of(e, "message")).unwrap_or("").to_string();
                        self.push(id, assistant(vec![Block::Text { text }], None));
                    }
                    _ => self.diag(format!("[{i}]"), format!("{source} action `{action}` without a tool call skipped")),
                }
            } else if let Some(observation) = str_of(e, "observation") {
                // Observations without a tool call (state changes, recalls) are not model context.
                if let Some(meta) = meta {
                    close(self, &mut open);
                    let call = str_of(meta, "tool_call_id").unwrap_or("").to_string();
                    let name = str_of(meta, "function_name").unwrap_or(observation).to_string();
                    self.push(id, result(&call, &name, str_of(e, "content").unwrap_or("").to_string(), observation == "error"));
                }
            }
        }
        close(self, &mut open);
        start
    }

    /// SWE-agent `history` (§7) and mini-swe-agent `messages` (§8): OpenAI-style chat messages. The first
    /// user message is the task; later user messages are observations and feedback from the harness.
    fn chat(&mut self, source: &str, v: Value, field: &str) -> SourceEvent {
        let id = str_of(&v, "instance_id").or_else(|| v.pointer("/environment").and_then(Value::as_str));
        let start = started(source, id, None, None);
        let messages = v.get(field).and_then(Value::as_array).cloned().unwrap_or_default();
        let mut tools: BTreeMap<String, String> = BTreeMap::new();
        // A call id the trajectory uses again (replayed demonstrations do) is renamed, with the results
        // that answer it: providers reject a tool-call id that appears twice in one context.
        let mut current: BTreeMap<String, String> = BTreeMap::new();
        let mut used = std::collections::BTreeSet::new();
        let mut seen_user = false;
        for (i, m) in messages.iter().enumerate() {
            let id = format!("m{i}");
            let content = text_of(m.get("content").unwrap_or(&Value::Null));
            match str_of(m, "role") {
                Some("system") => {}
                Some("user") => {
                    let origin = if seen_user { UserOrigin::Injected } else { UserOrigin::Prompt };
                    seen_user = true;
                    self.push(id, user(content, origin));
                }
                Some("assistant") => {
                    let mut blocks = Vec::new();
                    if let Some(r) = str_of(m, "reasoning_content").filter(|r| !r.is_empty()) {
                        blocks.push(Block::thinking(r.to_string(), None));
                    }
                    if !content.is_empty() {
                        blocks.push(Block::Text { text: content });
                    }
                    for (k, c) in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
                        let original = str_of(c, "id").map_or_else(|| format!("{id}-call{k}"), str::to_string);
                        let call = crate::export::unique_call_id(&original, &mut used);
                        if call != original {
                            self.diag(format!("{field}[{i}]"), format!("tool call id `{original}` used again; renamed `{call}` with its result"));
                        }
                        current.insert(original, call.clone());
                        let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or("tool").to_string();
                        let arguments = c.pointer("/function/arguments").map(text_of).unwrap_or_else(|| "{}".into());
                        tools.insert(call.clone(), name.clone());
                        blocks.push(Block::tool_call(call, name, arguments));
                    }
                    if blocks.is_empty() {
                        self.diag(format!("{field}[{i}]"), "empty assistant message skipped");
                        continue;
                    }
                    self.push(id, assistant(blocks, None));
                }
                Some("tool") => {
                    let call = str_of(m, "tool_call_id")
                        .map(str::to_string)
                        .or_else(|| m.get("tool_call_ids").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str).map(str::to_string));
                    let Some(call) = call else {
                        self.diag(format!("{field}[{i}]"), "tool message without a tool_call_id kept as an observation");
                        self.push(id, user(content, UserOrigin::Injected));
                        continue;
                    };
                    let call = current.get(&call).cloned().unwrap_or(call);
                    let name = tools.get(&call).cloned().unwrap_or_else(|| "tool".into());
                    self.push(id, result(&call, &name, content, false));
                }
                // mini-swe-agent's closing record: the harness's, not the model's.
                Some("exit") => self.push(id, Entry::Marker { kind: "exit".into() }),
                other => self.diag(format!("{field}[{i}]"), format!("message role `{}` skipped", other.unwrap_or("(none)"))),
            }
        }
        start
    }
}
