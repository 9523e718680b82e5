//! Codex CLI rollout JSONL. The model-visible history is the `response_item` stream: consecutive
//! assistant-side items (reasoning, messages, tool calls) form one assistant message; tool outputs pair
//! with calls by `call_id`. A `compacted` line replaces the history with its `replacement_history`.
//! `event_msg` lines are UI telemetry; only token counts and context windows are taken from them.

use crate::codex_item::Item;
use crate::json::{json_text, str_of, take_str, Obj};
use crate::jsonl::{Diagnostic, Fast, Line};
use crate::Output;
use condense_events::{Block, Entry, Message, SourceEvent, Usage, UserOrigin};
use serde_json::Value;
use std::collections::BTreeMap;

pub(crate) fn import(file: &str, lines: impl Iterator<Item = Line>) -> Output {
    let mut events = Vec::new();
    let diagnostics = import_to(file, lines, &mut |e| events.push(e));
    Output { events, diagnostics }
}

/// [`import`], handing the events to `emit` as the lines are read: once the session's start is known
/// (its `session_meta` line), every entry but an assistant message still open for more items leaves as
/// its line is read; the diagnostics are returned at the end.
pub(crate) fn import_to(file: &str, lines: impl Iterator<Item = Line>, emit: &mut dyn FnMut(SourceEvent)) -> Vec<Diagnostic> {
    let mut chain = crate::Chain::new(emit);
    let mut diags = Vec::new();
    let diag = |line: u64, message: String| Diagnostic { file: file.to_string(), line, message };
    let mut h = History::default();
    let mut model: Option<String> = None;
    let mut window: Option<u64> = None;
    let mut unknown = crate::UnknownTypes::default();
    for mut line in lines {
        let n = line.line;
        // A `response_item` line the fast reader read brings its payload's fields (its value is `Null`).
        let (fast_item, fast_time) = match line.fast.take() {
            Some(Fast::Item(item, time)) => (Some(item), time),
            _ => (None, None),
        };
        let time = fast_time.or_else(|| str_of(&line.value, "timestamp").map(str::to_string));
        let kind = if fast_item.is_some() { "response_item" } else { str_of(&line.value, "type").unwrap_or("") }.to_string();
        let mut payload = line.value.get_mut("payload").map(Value::take).unwrap_or(Value::Null);
        let ptype = str_of(&payload, "type").unwrap_or("").to_string();
        let mut model_event = None;
        match kind.as_str() {
            "session_meta" if !chain.started() => chain.start(SourceEvent::SessionStarted {
                source: "codex".into(),
                source_id: str_of(&payload, "id").map(str::to_string),
                cwd: str_of(&payload, "cwd").map(str::to_string),
                timestamp: str_of(&payload, "timestamp").map(str::to_string),
            }),
            "session_meta" => {}
            "response_item" => {
                let item = fast_item.map_or_else(|| Item::of_value(payload), |i| *i);
                h.item(item, n, &mut |m| diags.push(diag(n, m)));
                // The time of the request an assistant message answers, as near as the file tells: the
                // line of its first item.
                if let (Some(ix), Some(timestamp)) = (h.opened.take(), time) {
                    chain.side(chain.emitted() + ix, SourceEvent::HostTime { timestamp });
                }
            }
            "compacted" => {
                let mut replacement = History::default();
                if let Some(Value::Array(items)) = payload.get_mut("replacement_history").map(Value::take) {
                    for item in items {
                        replacement.item(Item::of_value(item), n, &mut |m| diags.push(diag(n, m)));
                    }
                }
                let summary = take_str(&mut payload, "message").filter(|s| !s.is_empty());
                h.names.extend(replacement.names);
                let replacement = replacement.entries.into_iter().filter_map(|e| match e {
                    Entry::Message(m) => Some(m),
                    _ => None,
                });
                h.push(Entry::HostCompaction {
                    summary,
                    first_kept: None,
                    replacement: replacement.collect(),
                    tokens_before: None,
                });
            }
            "turn_context" => {
                if let Some(m) = str_of(&payload, "model") {
                    if model.as_deref() != Some(m) {
                        model = Some(m.to_string());
                        model_event = Some(());
                    }
                }
            }
            "event_msg" => match ptype.as_str() {
                "task_started" => {
                    let w = payload.get("model_context_window").and_then(Value::as_u64);
                    if w.is_some() && w != window {
                        window = w;
                        model_event = model.as_ref().map(|_| ());
                    }
                }
                // Some rollouts record the user's prompt only as this event (no `response_item` message):
                // it is kept, and becomes the turn's prompt if no prompt message comes before the reply.
                "user_message" => {
                    let text = str_of(&payload, "message").unwrap_or("").to_string();
                    if !text.trim().is_empty() && !h.prompted {
                        h.event_prompt = Some(text);
                    }
                }
                "token_count" => {
                    let info = payload.get("info");
                    if let Some(w) = info.and_then(|i| i.get("model_context_window")).and_then(Value::as_u64) {
                        if Some(w) != window {
                            window = Some(w);
                            model_event = model.as_ref().map(|_| ());
                        }
                    }
                    if let Some(u) = info.and_then(|i| i.get("last_token_usage")) {
                        let total_in = u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0);
                        let cached = u.get("cached_input_tokens").and_then(Value::as_u64).unwrap_or(0);
                        h.side(&mut chain, SourceEvent::ProviderUsage(Usage {
                            input: total_in.saturating_sub(cached),
                            output: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
                            cache_read: cached,
                            cache_write: 0,
                        }));
                    }
                }
                _ => {}
            },
            other if crate::skipped_line_type("codex", other) => {}
            other => diags.extend(unknown.first(file, n, other)),
        }
        if model_event.is_some() {
            h.side(&mut chain, SourceEvent::ModelChanged {
                provider: Some("openai".into()),
                model: model.clone().unwrap_or_default(),
                context_window: window,
                max_output: None,
            });
        }
        if chain.started() {
            h.release(&mut chain);
        }
    }
    if !chain.started() {
        chain.start(SourceEvent::SessionStarted { source: "codex".into(), source_id: None, cwd: None, timestamp: None });
    }
    h.flush_event_prompt();
    h.open = false;
    h.release(&mut chain);
    chain.finish();
    diags
}

/// The fast reader of Codex lines: a line's value with only the fields [`import_to`] reads of lines of its
/// kind. Half a rollout's bytes are telemetry the importer takes a field or two from (token counts, turn
/// contexts, command ends, agent messages): their other fields are skipped by the parser instead of built
/// into maps. A `response_item` payload is read into its [`Item`]; a `compacted` payload, which the
/// importer reads through, is built whole. `None` (the line is then parsed as a value) for any line whose
/// fields are not of the types read here, so what the importer sees is what the value path gives it.
pub(crate) fn fast(text: &str) -> Option<Fast> {
    use fast_shape::*;
    let line: Line<'_> = crate::json::object(text)?;
    let raw = line.payload?.get();
    let payload = match line.kind.as_ref() {
        "session_meta" => reduced::<Meta<'_>>(raw)?,
        "turn_context" => reduced::<TurnContext<'_>>(raw)?,
        "event_msg" => reduced::<Event<'_>>(raw)?,
        "response_item" => return Some(Fast::Item(Box::new(crate::json::object(raw)?), line.timestamp.map(String::from))),
        // Read through by the importer: built whole.
        _ => serde_json::from_str(raw).ok()?,
    };
    if !payload.is_object() {
        return None;
    }
    // Built by hand: `json!` would serialize (copy) the payload into the value.
    let mut value = serde_json::Map::new();
    value.insert("type".into(), Value::String(line.kind.into_owned()));
    value.insert("payload".into(), payload);
    Some(Fast::Value(Value::Object(value)))
}

/// The fields of `raw` that `T` declares, as a value holding those present (`null` included where `T`
/// keeps it apart from absent).
fn reduced<'a, T: serde::Deserialize<'a> + serde::Serialize>(raw: &'a str) -> Option<Value> {
    serde_json::to_value(crate::json::object::<T>(raw)?).ok()
}

/// The fields [`fast`] reads; serde skips every other without building it. A field of another type than
/// declared fails the read (the line is then parsed as a value), and so does an array where an object
/// belongs ([`Obj`]).
mod fast_shape {
    use crate::json::Obj;
    use serde::{Deserialize, Serialize};
    use std::borrow::Cow;

    #[derive(Deserialize)]
    pub(super) struct Line<'a> {
        #[serde(rename = "type", borrow)]
        pub kind: Cow<'a, str>,
        #[serde(default, borrow)]
        pub payload: Option<&'a serde_json::value::RawValue>,
        #[serde(default, borrow)]
        pub timestamp: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct Meta<'a> {
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub id: Option<Cow<'a, str>>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub cwd: Option<Cow<'a, str>>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub timestamp: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct TurnContext<'a> {
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub model: Option<Cow<'a, str>>,
    }

    /// Every field any event the importer reads has (each event reads its own).
    #[derive(Deserialize, Serialize)]
    pub(super) struct Event<'a> {
        #[serde(rename = "type", default, borrow, skip_serializing_if = "Option::is_none")]
        pub kind: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub model_context_window: Option<u64>,
        #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
        pub message: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub info: Option<Obj<Info>>,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct Info {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub model_context_window: Option<u64>,
        /// `Some(None)`: present as `null`, which still gives a usage (of zeros), as in the value.
        #[serde(default, deserialize_with = "crate::json::present", skip_serializing_if = "Option::is_none")]
        pub last_token_usage: Option<Option<Obj<TokenUsage>>>,
    }

    #[derive(Deserialize, Serialize)]
    pub(super) struct TokenUsage {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub input_tokens: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cached_input_tokens: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub output_tokens: Option<u64>,
    }
}

#[derive(Default)]
struct History {
    /// Entries not handed to the chain yet (the first is the chain's next).
    entries: Vec<Entry>,
    /// Whether the last entry is an assistant message still open for more assistant-side items.
    open: bool,
    names: BTreeMap<String, String>,
    /// A prompt seen only as a `user_message` event so far in this turn.
    event_prompt: Option<String>,
    /// Whether a user prompt was recorded since the last assistant message.
    prompted: bool,
    /// Where in `entries` the line just read opened an assistant message.
    opened: Option<usize>,
}

/// Developer messages and the environment, permission and AGENTS.md blocks Codex injects are host
/// context; other tagged messages (`<turn_aborted>`, `<user_shell_command>`) are injected, not prompts.
pub(crate) fn user_origin(role: &str, text: &str) -> UserOrigin {
    let t = text.trim();
    if role != "user" || condense_events::host_context_kind(t).is_some() {
        UserOrigin::Host
    } else if t.starts_with('<') && t.ends_with('>') {
        UserOrigin::Injected
    } else {
        UserOrigin::Prompt
    }
}

impl History {
    /// Every entry is added here.
    fn add(&mut self, e: Entry) {
        match &e {
            Entry::Message(Message::Assistant { .. }) => self.prompted = false,
            Entry::Message(Message::User { origin: UserOrigin::Prompt, .. }) => self.prompted = true,
            _ => {}
        }
        self.entries.push(e);
    }

    /// A prompt known only from its `user_message` event becomes a message before the reply to it.
    fn flush_event_prompt(&mut self) {
        if let Some(text) = self.event_prompt.take() {
            self.open = false;
            self.add(Entry::Message(Message::User { content: vec![Block::Text { text }], origin: UserOrigin::Prompt }));
        }
    }

    fn side(&mut self, chain: &mut crate::Chain<'_>, ev: SourceEvent) {
        chain.side(chain.emitted() + self.entries.len(), ev);
    }

    /// Hands every entry but an open assistant message to the chain, named `r1`, `r2`, … in session order.
    fn release(&mut self, chain: &mut crate::Chain<'_>) {
        let upto = self.entries.len() - usize::from(self.open && !self.entries.is_empty());
        for e in self.entries.drain(..upto) {
            let id = format!("r{}", chain.emitted() + 1);
            chain.entry(id, e);
        }
    }

    fn push(&mut self, e: Entry) {
        if !matches!(e, Entry::Message(Message::User { .. })) {
            self.flush_event_prompt();
        }
        self.open = false;
        self.add(e);
    }

    fn assistant_block(&mut self, b: Block) {
        self.flush_event_prompt();
        if let Block::ToolCall(c) = &b {
            self.names.insert(c.id.clone(), c.name.clone());
        }
        if self.open {
            if let Some(Entry::Message(Message::Assistant { content, .. })) = self.entries.last_mut() {
                content.push(b);
                return;
            }
        }
        self.opened = Some(self.entries.len());
        self.add(Entry::Message(Message::Assistant { content: vec![b], model: None, stop: None, usage: None }));
        self.open = true;
    }

    fn result(&mut self, call_id: String, output: Option<Value>) {
        let tool_name = self.names.get(&call_id).cloned().unwrap_or_default();
        let (text, is_error) = output_text(output);
        self.push(Entry::Message(Message::ToolResult { call_id, tool_name, content: vec![Block::Text { text }], is_error }));
    }

    fn item(&mut self, it: Item, n: u64, diag: &mut dyn FnMut(String)) {
        let t = it.kind.unwrap_or_default();
        match t.as_str() {
            "message" => {
                let role = it.role.unwrap_or_default();
                let mut blocks = Vec::new();
                for Obj(c) in it.content.unwrap_or_default() {
                    match c.kind.as_deref() {
                        Some("input_text" | "output_text" | "text") => blocks.push(Block::Text { text: c.text.unwrap_or_default() }),
                        Some("input_image") => blocks.push(url_image(c.image_url.unwrap_or_default())),
                        other => diag(format!("unknown message content type {other:?} dropped")),
                    }
                }
                if role == "assistant" {
                    for b in blocks {
                        self.assistant_block(b);
                    }
                } else {
                    let text: String = blocks.iter().filter_map(|b| match b { Block::Text { text } => Some(text.as_str()), _ => None }).collect();
                    let origin = user_origin(&role, &text);
                    // The turn's prompt as a message: its `user_message` event is not needed.
                    if origin == UserOrigin::Prompt {
                        self.event_prompt = None;
                    }
                    self.push(Entry::Message(Message::User { content: blocks, origin }));
                }
            }
            "reasoning" => {
                let mut thinking = String::new();
                for text in it.summary.unwrap_or_default().into_iter().filter_map(|Obj(part)| part.text) {
                    if !thinking.is_empty() {
                        thinking.push('\n');
                    }
                    thinking.push_str(&text);
                }
                self.assistant_block(Block::thinking(thinking, it.encrypted_content));
            }
            "function_call" | "custom_tool_call" | "local_shell_call" | "tool_search_call" => {
                let id = it.call_id.or(it.id).unwrap_or_else(|| format!("call_line{n}"));
                let name = it.name.unwrap_or_else(|| t.trim_end_matches("_call").to_string());
                let arguments = match (it.arguments, it.input, it.action) {
                    (Some(Value::String(a)), _, _) => a,
                    (Some(a), _, _) => json_text(&a),
                    (None, Some(Value::String(i)), _) => i,
                    (None, _, Some(action)) => json_text(&action),
                    _ => "{}".to_string(),
                };
                self.assistant_block(Block::tool_call(id, name, arguments));
            }
            "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" | "tool_search_output" => {
                let id = it.call_id.unwrap_or_default();
                if !self.names.contains_key(&id) {
                    diag(format!("tool output `{id}` has no matching call"));
                }
                self.result(id, it.output.or(it.tools));
            }
            "web_search_call" => {
                // Codex records a web search without a separate output item; condense gives the call a
                // result that states its status, so the pair stays valid for every provider.
                let id = it.id.unwrap_or_else(|| format!("ws_line{n}"));
                let arguments = it.action.as_ref().map_or_else(|| "{}".to_string(), json_text);
                self.assistant_block(Block::tool_call(id.clone(), "web_search".into(), arguments));
                let status = it.status.unwrap_or_else(|| "unknown".into());
                self.result(id, Some(Value::String(format!("web search {status}"))));
            }
            "compaction" | "compaction_summary" => {
                // A remote compaction's summary is encrypted by the provider; condense keeps a marker in
                // its place (the encrypted bytes mean nothing to any other model).
                let len = it.encrypted_content.map_or(0, |c| c.len());
                self.push(Entry::Message(Message::user_text(
                    format!("[Codex compaction summary, encrypted by the provider ({len} bytes)]"),
                    UserOrigin::Summary,
                )));
            }
            "ghost_snapshot" => {}
            other => diag(format!("unknown response item `{other}` skipped")),
        }
    }
}

/// The image an image URL stands for (OpenAI's `image_url` and `input_image`): a data URL names its MIME
/// type, anything else is taken as PNG.
pub(crate) fn url_image(url: String) -> Block {
    let mime = url.strip_prefix("data:").and_then(|r| r.split(';').next()).unwrap_or("image/png").to_string();
    Block::image(mime, url)
}

/// Text of a tool output and whether it reports a failure (a non-zero exit code).
pub(crate) fn output_text(output: Option<Value>) -> (String, bool) {
    let text = match output {
        Some(Value::String(s)) => s,
        Some(Value::Array(items)) => {
            let mut s = String::new();
            for it in &items {
                match str_of(it, "text") {
                    Some(t) => s.push_str(t),
                    None => s.push_str(&json_text(it)),
                }
            }
            s
        }
        Some(Value::Null) | None => String::new(),
        Some(other) => json_text(&other),
    };
    const EXITED: &str = "Process exited with code ";
    let exit = if let Some(at) = memchr::memmem::find(text.as_bytes(), EXITED.as_bytes()) {
        let rest = &text[at + EXITED.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|d| d.parse::<i64>().ok())
    } else if text.starts_with('{') {
        exit_code_of_json(&text)
    } else {
        None
    };
    (text, exit.is_some_and(|c| c != 0))
}

/// `metadata.exit_code` of a tool output that is a JSON object (Codex's shell output with its metadata):
/// the output beside it is skipped unbuilt. A text that does not read so (not an object, a key given
/// twice) is parsed as a value, as before.
fn exit_code_of_json(text: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Shell {
        #[serde(default)]
        metadata: Option<Value>,
    }
    let code = |metadata: Option<&Value>| metadata.and_then(|m| m.get("exit_code")).and_then(Value::as_i64);
    match serde_json::from_str::<Shell>(text) {
        Ok(shell) => code(shell.metadata.as_ref()),
        Err(_) => code(serde_json::from_str::<Value>(text).ok().as_ref().and_then(|v| v.get("metadata"))),
    }
}

#[cfg(test)]
mod tests {
    use crate::fast_tests::{both, corpus};

    /// Every corpus Codex rollout, and lines of every shape the fast reader takes or refuses, give the
    /// events and diagnostics the value path gives.
    #[test]
    fn the_fast_reader_gives_the_events_the_value_path_gives() {
        let fast_lines = corpus("codex", 10, |l| super::fast(l).is_some());
        assert!(fast_lines > 3_000, "{fast_lines} corpus lines read fast");
        let odd = [
            (true, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"last_token_usage":null,"model_context_window":null}}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"last_token_usage":{"input_tokens":9,"output_tokens":null},"total":{"x":[1]}}}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"token_count","info":null,"rate_limits":{"primary":{"used_percent":1.5}}}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"model_context_window":64000,"last_token_usage":{"input_tokens":100,"cached_input_tokens":40,"output_tokens":7}}}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"task_started","model_context_window":200000}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"user_message","message":"only here \u00e9","images":[]}}"#),
            (true, r#"{"type":"event_msg","payload":{"type":"exec_command_end","stdout":"a lot","exit_code":0,"duration":{"secs":1}}}"#),
            (true, r#"{"type":"event_msg","payload":{"message":"no type"}}"#),
            (true, r#"{"type":"turn_context","payload":{"model":"gpt-5","cwd":"/w","sandbox_policy":{"mode":"x"}}}"#),
            (true, r#"{"type":"turn_context","payload":{"model":null}}"#),
            (true, r#"{"type":"mystery","payload":{"a":1}}"#),
            (true, r#"{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"task_started","model_context_window":1.5e5}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"last_token_usage":7}}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"last_token_usage":{"input_tokens":-1}}}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"error","message":{"code":1}}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":5}}"#),
            (false, r#"{"type":"event_msg","payload":"a string"}"#),
            (false, r#"{"type":"event_msg"}"#),
            (false, r#"{"type":"turn_context","payload":{"model":["a"]}}"#),
            (false, r#"{"type":7,"payload":{}}"#),
            (false, r#"{"type":"turn_context","type":"event_msg","payload":{}}"#),
            (false, r#"{"type":"response_item","payload":[1,2]}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"token_count"}} trailing"#),
            // Response items, read into their fields or refused.
            (true, r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:image/jpeg;base64,AAAA"},{"type":"refusal","refusal":"no"},{"type":"input_text","text":null},{"text":"no type"}]}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"reasoning","summary":[{"type":"summary_text","text":""},{"text":"b"},{"no":"text"},{"text":"c\u00e9"}],"encrypted_content":"xyz","content":null}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"function_call","name":"shell","arguments":null,"call_id":"c9"}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"custom_tool_call","call_id":"c10","input":"*** Begin Patch"}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"local_shell_call","id":"ls1","action":{"type":"exec","command":["ls"],"env":{"b":1,"a":null}},"status":"completed"}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"function_call","call_id":"c11","arguments":{"b":1,"a":[true,1.5e3]},"input":7}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"tool_search_call","input":[1],"action":{"q":"x"}}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"tool_search_output","call_id":"c9","output":null,"tools":[{"name":"t"}]}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"tool_search_output","call_id":"nowhere","tools":[{"name":"t"}]}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"function_call_output","call_id":"c11","output":[{"type":"input_text","text":"a"},{"x":1}]}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"function_call_output","call_id":"c10","output":"{\"output\":\"boom\",\"metadata\":{\"exit_code\":2}}"}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"function_call_output","call_id":"ls1","output":{"an":"object"}}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"web_search_call","status":null}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"compaction","encrypted_content":"abcd"}}"#),
            (true, r#"{"type":"response_item","payload":{"type":"mystery_item","extra":{"deep":[1]}}}"#),
            (true, r#"{"type":"response_item","payload":{"role":"user"}}"#),
            (false, r#"{"type":"response_item","payload":["function_call","x"]}"#),
            (false, r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[["input_text","hi"]]}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"message","role":5,"content":[]}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"function_call","name":"a","name":"b","arguments":"{}"}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"reasoning","summary":["plain"]}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"message","role":"user","content":"just a string"}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":7}]}}"#),
            (false, r#"{"type":"response_item","payload":{"type":"function_call","call_id":{"not":"a string"}}}"#),
            // Arrays where objects belong: a struct is read from an array field by field, never here.
            (false, r#"["turn_context",{"model":"array-line"}]"#),
            (false, r#"{"type":"turn_context","payload":["array-payload"]}"#),
            (false, r#"{"type":"event_msg","payload":["task_started",1000]}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"token_count","info":[64000,[5,1,2]]}}"#),
            (false, r#"{"type":"event_msg","payload":{"type":"token_count","info":{"last_token_usage":[100,40,7]}}}"#),
        ];
        let mut text = String::from("{\"type\":\"session_meta\",\"payload\":{\"id\":\"s\",\"cwd\":\"/w\",\"instructions\":\"long\"}}\n");
        for i in 0..60 {
            text.push_str(&format!("{{\"type\":\"event_msg\",\"payload\":{{\"type\":\"agent_message\",\"message\":\"line {i}\"}}}}\n"));
        }
        for (is_fast, line) in odd {
            assert_eq!(super::fast(line).is_some(), is_fast, "{line}");
            text.push_str(line);
            text.push('\n');
            text.push_str(r#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}}"#);
            text.push('\n');
        }
        both("odd.jsonl", text.as_bytes());
    }

    /// A tool output's failure: a shell's exit code in its text, or in the metadata of a JSON object
    /// (the last of a key given twice, as a value keeps it).
    #[test]
    fn a_tool_output_fails_by_its_exit_code() {
        let failed = |text: &str| super::output_text(Some(serde_json::Value::String(text.into()))).1;
        assert!(failed("ok\nProcess exited with code 1\n"));
        assert!(!failed("Process exited with code 0"));
        assert!(!failed("Process exited with code "));
        assert!(failed(r#"{"output":"boom","metadata":{"exit_code":2,"duration_seconds":0.1}}"#));
        assert!(!failed(r#"{"output":"fine","metadata":{"exit_code":0}}"#));
        assert!(failed(r#"{"metadata":{"exit_code":0},"metadata":{"exit_code":3}}"#));
        assert!(!failed(r#"{"metadata":{"exit_code":3},"metadata":null}"#));
        assert!(!failed(r#"{"metadata":null}"#));
        assert!(!failed(r#"{"metadata":{"exit_code":"2"}}"#));
        assert!(!failed(r#"{"metadata":{"exit_code":2}} and more"#));
        assert!(!failed("{ not json"));
    }
}
