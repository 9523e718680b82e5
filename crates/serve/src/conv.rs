//! One client conversation and its condense session: recording what a request adds, preparing the
//! context, building the wire messages to send, recording the reply and answering condense's own tools.
//! Everything here is synchronous engine work; the server runs it on blocking threads, one request of a
//! conversation at a time.

use crate::track::Track;
use condense_engine::config::ModelLimits;
use condense_engine::{tools, EngineError, Session};
use condense_events::{Block, Entry, Message, PruneConfig, SourceEvent, Usage};
use condense_formats::wire::{self, Api, OutMessage, WireRequest};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether a tool name is one of condense's own (and the client has no tool of that name).
#[derive(Debug, Clone, Default)]
pub struct Internal {
    /// Tool names the client itself declared: condense never intercepts those.
    pub client_tools: Vec<String>,
}

impl Internal {
    /// Whether serve answers a call of `name` itself.
    pub fn is(&self, name: &str) -> bool {
        tools::is_condense_tool(name) && !self.client_tools.iter().any(|t| t == name)
    }
}

/// A conversation: its session and the client's view of it.
pub struct Conv {
    /// The session.
    pub session: Session,
    track: Track,
    next_entry: u64,
    /// Counters shown by `/condense/status`, as of the last request.
    pub figures: ConvFigures,
}

/// What `/condense/status` shows of one conversation.
#[derive(Debug, Clone, Default)]
pub struct ConvFigures {
    /// Requests served.
    pub requests: u64,
    /// Outputs rendered as stubs (summaries and spills).
    pub stubs: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
}

/// Where a request's messages went in the log.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// For each client message, the entry its wire JSON stands for (when it is exactly one entry).
    pub entry_of: Vec<Option<String>>,
    /// The entry the reply follows.
    pub last: Option<String>,
    /// Tokens of the client's messages (pi's estimate).
    pub tokens_in: u64,
}

/// The messages and tools to send upstream.
#[derive(Debug, Clone)]
pub struct Built {
    /// The message list in the API's wire form, as JSON (the system prefix included).
    pub list: Vec<u8>,
    /// condense's tools the context needs, in the API's wire form.
    pub tools: Vec<Value>,
    /// Tokens of the rendered context (pi's estimate).
    pub tokens_sent: u64,
}

/// An error of the engine while serving a request.
pub type Result<T> = std::result::Result<T, EngineError>;

impl Conv {
    /// Opens the conversation over `session`, folding the client's view from what it holds.
    pub fn open(session: Session, internal: &Internal) -> Result<Conv> {
        let (track, entries) = session.with_projection(|p| (Track::build(p, &|n| internal.is(n)), p.entries() as u64))?;
        Ok(Conv { session, track, next_entry: entries + 1, figures: ConvFigures::default() })
    }

    /// Starts a new session for a conversation.
    pub fn create(session: Session, identity: &str, client: &str, prune: PruneConfig) -> Result<Conv> {
        session.append(vec![
            SourceEvent::SessionStarted { source: format!("serve:{client}"), source_id: Some(identity.to_string()), cwd: None, timestamp: None },
            SourceEvent::PruneConfigured(prune),
        ])?;
        Ok(Conv { session, track: Track::default(), next_entry: 1, figures: ConvFigures::default() })
    }

    fn next_id(&mut self, p: &condense_render::Projection) -> String {
        loop {
            let id = format!("e{}", self.next_entry);
            self.next_entry += 1;
            if !p.has_entry(&id) {
                return id;
            }
        }
    }

    /// Records what the request adds: a model change, the messages after the part of the history the
    /// session holds (a branch move when the history left the recorded branch), or only a move of the leaf
    /// when the request repeats a recorded history (a retry).
    pub fn record_request(&mut self, req: &WireRequest, model: &str, limits: Option<ModelLimits>, internal: &Internal) -> Result<Recorded> {
        let is = |n: &str| internal.is(n);
        let messages: Vec<&Message> = req.messages.iter().map(|m| &m.message).collect();
        let matched = self.track.matching(&messages, &is);
        let tokens_in = req.messages.iter().map(|m| condense_tokens::estimate(&m.message)).sum();
        let mut events = Vec::new();
        let mut new_entries: Vec<(String, Option<String>, Message)> = Vec::new();
        let (leaf, model_changed) = self.session.with_projection(|p| {
            let changed = match p.model() {
                Some(m) => m.model != model || m.context_window != limits.map(|l| l.context_window),
                None => true,
            };
            (p.leaf_id().map(str::to_string), changed)
        })?;
        if model_changed {
            events.push(SourceEvent::ModelChanged {
                provider: None,
                model: model.to_string(),
                context_window: limits.map(|l| l.context_window),
                max_output: limits.and_then(|l| l.max_output),
            });
        }
        let mut parent = matched.parent.clone();
        let session = self.session.clone();
        let ids: Vec<String> = session.with_projection(|p| (matched.count..req.messages.len()).map(|_| self.next_id(p)).collect::<Vec<_>>())?;
        for (wm, id) in req.messages[matched.count..].iter().zip(ids) {
            new_entries.push((id.clone(), parent.clone(), wm.message.clone()));
            parent = Some(id);
        }
        if new_entries.is_empty() && leaf != matched.parent {
            events.push(SourceEvent::LeafMoved { leaf: matched.parent.clone() });
        }
        for (id, parent, m) in &new_entries {
            events.push(SourceEvent::EntryAppended { id: id.clone(), parent: parent.clone(), entry: Entry::Message(m.clone()) });
        }
        if !events.is_empty() {
            self.session.append(events)?;
        }
        for (id, parent, m) in &new_entries {
            self.track.add(id, parent.as_deref(), m, &is, Some(crate::track::exact(m)));
        }
        let mut entry_of = matched.entries;
        entry_of.extend(new_entries.iter().map(|(id, _, _)| Some(id.clone())));
        Ok(Recorded { entry_of, last: parent, tokens_in })
    }

    /// Prepares the context (pruning, checkpoints, recovery, notices) and writes it in `api`'s wire form:
    /// each rendered message that is a client message condense left unchanged goes out as the client wrote
    /// it; the rest are written from the neutral model. The client's `cache_control` marks go back on the
    /// messages they were on, or, for the last message, on the last message sent before any notice.
    pub fn build(&mut self, api: Api, req: &WireRequest, rec: &Recorded, internal: &Internal) -> Result<Built> {
        let (outs, src, notice, tools, tokens_sent, figures) = self.session.prepare_then(|p, r| {
            let mut raw: BTreeMap<usize, usize> = BTreeMap::new();
            for (i, e) in rec.entry_of.iter().enumerate() {
                if let Some(m) = e.as_deref().and_then(|e| p.entry_message(e)) {
                    raw.insert(Arc::as_ptr(m) as usize, i);
                }
            }
            let mut outs: Vec<OutMessage> = Vec::with_capacity(r.messages.len());
            let mut src: Vec<Option<usize>> = Vec::with_capacity(r.messages.len());
            for m in r.messages.iter() {
                match raw.get(&(Arc::as_ptr(m) as usize)) {
                    Some(&i) => {
                        outs.push(req.messages[i].out());
                        src.push(Some(i));
                    }
                    None => {
                        if let Some(o) = wire::from_neutral(api, m) {
                            outs.push(o);
                            src.push(None);
                        }
                    }
                }
            }
            let notice = r.messages.last().is_some_and(|m| m.text().starts_with("[condense notice")) && src.last() == Some(&None);
            let tools: Vec<tools::ToolDef> = tools::needed(p).into_iter().filter(|t| internal.is(t.name)).collect();
            let tokens: u64 = r.messages.iter().map(|m| condense_tokens::estimate(m)).sum();
            let idx = p.index();
            let figures = ((idx.summaries.len() + idx.spills.len()) as u64, idx.checkpoints.len() as u64);
            (outs, src, notice, tools, tokens, figures)
        })?;
        self.figures.requests += 1;
        self.figures.stubs = figures.0;
        self.figures.checkpoints = figures.1;
        let mut outs = outs;
        if api == Api::Anthropic {
            let last_client = req.messages.len().checked_sub(1);
            for (i, control) in &req.cache_marks {
                let at = src.iter().rposition(|s| *s == Some(*i)).or_else(|| {
                    (Some(*i) == last_client).then(|| outs.len().saturating_sub(1 + usize::from(notice)))
                });
                if let Some(o) = at.and_then(|a| outs.get_mut(a)) {
                    mark_last_part(o, control);
                }
            }
        }
        // Responses: a rewritten output answers a custom tool call with the custom output type.
        if api == Api::Responses {
            let custom: Vec<String> = req
                .messages
                .iter()
                .flat_map(|m| m.parts.iter())
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("custom_tool_call"))
                .filter_map(|p| p.get("call_id").and_then(Value::as_str).map(str::to_string))
                .collect();
            for (o, s) in outs.iter_mut().zip(&src) {
                if s.is_none() {
                    for part in o.parts.to_mut().iter_mut() {
                        if part["type"] == "function_call_output" && part["call_id"].as_str().is_some_and(|c| custom.iter().any(|x| x == c)) {
                            part["type"] = json!("custom_tool_call_output");
                        }
                    }
                }
            }
        }
        let tools = tools.iter().map(|t| tool_json(api, t)).collect();
        Ok(Built { list: wire::write_list(api, &req.system, &outs), tools, tokens_sent })
    }

    /// Records the model's reply after `parent` and the usage the provider reported for it; returns the
    /// reply's entry id.
    pub fn record_reply(&mut self, parent: Option<&str>, reply: Message, usage: Option<Usage>, internal: &Internal) -> Result<String> {
        let session = self.session.clone();
        let id = session.with_projection(|p| self.next_id(p))?;
        let mut events = vec![SourceEvent::EntryAppended { id: id.clone(), parent: parent.map(str::to_string), entry: Entry::Message(reply.clone()) }];
        if let Some(u) = usage {
            events.push(SourceEvent::ProviderUsage(u));
        }
        self.session.append(events)?;
        self.track.add(&id, parent, &reply, &|n| internal.is(n), None);
        Ok(id)
    }

    /// Answers the calls of condense's own tools in `reply` (recorded as entry `parent`) and records each
    /// result; returns the last entry recorded, and the answers in call order.
    pub fn answer_internal(&mut self, parent: &str, reply: &Message, internal: &Internal) -> Result<(String, Vec<(String, String)>)> {
        let mut last = parent.to_string();
        let mut answers = Vec::new();
        let calls: Vec<(String, String, String)> =
            reply.tool_calls().filter(|(_, n, _)| internal.is(n)).map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
        for (call_id, name, arguments) in calls {
            let answer = self.session.run_tool(&name, &arguments)?.expect("a condense tool");
            let m = Message::ToolResult { call_id: call_id.clone(), tool_name: name.clone(), content: vec![Block::Text { text: answer.text.clone() }], is_error: answer.is_error };
            let session = self.session.clone();
        let id = session.with_projection(|p| self.next_id(p))?;
            self.session.append(vec![SourceEvent::EntryAppended { id: id.clone(), parent: Some(last.clone()), entry: Entry::Message(m.clone()) }])?;
            self.track.add(&id, Some(&last), &m, &|n| internal.is(n), None);
            answers.push((call_id, answer.text));
            last = id;
        }
        Ok((last, answers))
    }

    /// Records a provider overflow (the provider's error text).
    pub fn record_overflow(&mut self, message: &str) -> Result<()> {
        self.session.append(vec![SourceEvent::ProviderOverflow { message: message.to_string() }]).map(drop)
    }

    /// The number of visible messages held.
    pub fn visible_len(&self) -> usize {
        self.track.len()
    }
}

fn mark_last_part(o: &mut OutMessage<'_>, control: &Value) {
    if let Some(last) = o.parts.to_mut().last_mut() {
        if let Value::String(s) = last {
            *last = json!({"type": "text", "text": s});
        }
        if let Value::Object(b) = last {
            b.insert("cache_control".into(), control.clone());
        }
    }
}

/// A tool definition in `api`'s wire form.
pub fn tool_json(api: Api, t: &tools::ToolDef) -> Value {
    match api {
        Api::Anthropic => json!({"name": t.name, "description": t.description, "input_schema": t.schema}),
        Api::Chat => json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}}),
        Api::Responses => json!({"type": "function", "name": t.name, "description": t.description, "parameters": t.schema, "strict": false}),
    }
}
