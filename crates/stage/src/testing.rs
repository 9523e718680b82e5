//! A recorded log for testing a stage on its own (feature `testing`): events are appended and folded
//! into the index and the stages given, and a pass runs the stages in the order given, appending what
//! they decide. The branch is the plain one: the message entries from the root to the leaf (markers and
//! host compactions are left out; the render projection is what handles those).

use crate::{Entries, Pass, Shape, Stage, StageError, Trigger};
use condense_events::{DecisionEvent, Entry, Event, Message, PruneConfig, SourceEvent};
use condense_index::Index;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A session's log as a stage sees it.
#[derive(Debug, Default)]
pub struct Recorded {
    events: Vec<Event>,
    config: PruneConfig,
    index: Index,
    /// Entry id → (parent, message when the entry is one).
    entries: BTreeMap<String, (Option<String>, Option<Arc<Message>>)>,
    leaf: Option<String>,
    shape: Shape,
    /// Blobs stored by spills, by hash.
    pub blobs: BTreeMap<String, Vec<u8>>,
}

impl Recorded {
    /// An empty log under `config`.
    pub fn new(config: PruneConfig) -> Self {
        Recorded { config, ..Recorded::default() }
    }

    /// Appends an event and folds it into the index and `stages`.
    pub fn append(&mut self, event: Event, stages: &mut [&mut dyn Stage]) {
        match &event {
            Event::Source(SourceEvent::EntryAppended { id, parent, entry }) => {
                let m = match entry {
                    Entry::Message(m) => Some(Arc::new(m.clone())),
                    _ => None,
                };
                self.entries.insert(id.clone(), (parent.clone(), m));
                self.leaf = Some(id.clone());
            }
            Event::Source(SourceEvent::LeafMoved { leaf }) => self.leaf = leaf.clone(),
            Event::Source(e @ (SourceEvent::PruneConfigured(_) | SourceEvent::LiveReadsConfigured { .. })) => self.config.take_in(e),
            Event::Decision(d) => self.index.apply(d),
            _ => {}
        }
        for s in stages.iter_mut() {
            s.fold(&event);
        }
        self.events.push(event);
    }

    /// Appends a message entry after the leaf.
    pub fn message(&mut self, id: &str, m: Message, stages: &mut [&mut dyn Stage]) {
        let parent = self.leaf.clone();
        self.append(Event::Source(SourceEvent::EntryAppended { id: id.to_string(), parent, entry: Entry::Message(m) }), stages);
    }

    /// The message entries from the root to the leaf.
    pub fn branch(&self) -> Vec<(String, Arc<Message>)> {
        let mut out = Vec::new();
        let mut at = self.leaf.clone();
        while let Some(id) = at {
            let Some((parent, m)) = self.entries.get(&id) else { break };
            if let Some(m) = m {
                out.push((id.clone(), m.clone()));
            }
            at = parent.clone();
        }
        out.reverse();
        out
    }

    /// Runs `stages` in order as before a request, appends their decisions (folding them into the index
    /// and every stage) and returns them.
    pub fn run(&mut self, stages: &mut [&mut dyn Stage], trigger: Trigger) -> Result<Vec<DecisionEvent>, StageError> {
        let branch = self.branch();
        let view: Vec<(&str, &Arc<Message>)> = branch.iter().map(|(id, m)| (id.as_str(), m)).collect();
        self.shape.follow(&view[..]);
        let blobs = &mut self.blobs;
        let mut put = |bytes: &[u8]| {
            let hash = format!("blob{}", blobs.len() + 1);
            blobs.insert(hash.clone(), bytes.to_vec());
            Ok(hash)
        };
        let entries: &dyn Entries<'_> = &view;
        let mut pass = Pass::new(&self.config, &self.index, entries, &self.shape, trigger, &mut put);
        for s in stages.iter_mut() {
            s.decide(&mut pass)?;
        }
        let decisions = pass.into_decisions();
        for d in &decisions {
            self.append(Event::Decision(d.clone()), stages);
        }
        Ok(decisions)
    }

    /// The index folded from the log.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Every event appended, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

/// An assistant message making `calls` (id, tool, arguments).
pub fn calls(calls: &[(&str, &str, &str)]) -> Message {
    let content = calls
        .iter()
        .map(|(id, name, arguments)| condense_events::Block::tool_call(id.to_string(), name.to_string(), arguments.to_string()))
        .collect();
    Message::Assistant { content, model: None, stop: None, usage: None }
}

/// The result of call `call_id` of `tool`.
pub fn result(call_id: &str, tool: &str, text: &str, is_error: bool) -> Message {
    Message::ToolResult {
        call_id: call_id.to_string(),
        tool_name: tool.to_string(),
        content: vec![condense_events::Block::Text { text: text.to_string() }],
        is_error,
    }
}

/// A final text-only reply.
pub fn reply(text: &str) -> Message {
    Message::Assistant { content: vec![condense_events::Block::Text { text: text.to_string() }], model: None, stop: None, usage: None }
}

/// A user prompt.
pub fn prompt(text: &str) -> Message {
    Message::user_text(text, condense_events::UserOrigin::Prompt)
}

/// A stand-in for the capture stage: captures the records given, once, in order (for testing a later
/// stage without the capture crate).
#[derive(Debug, Default)]
pub struct Given(pub Vec<(condense_events::Record, String)>);

impl Stage for Given {
    fn name(&self) -> &'static str {
        "given"
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        for (r, text) in std::mem::take(&mut self.0) {
            pass.capture(r, text.into());
        }
        Ok(())
    }
}

/// A record of output `text` of `tool` at tool-result entry `entry`, answering call `call_id` of
/// assistant entry `call_entry`, in `batch`; `hash` is its dedup key as the test wants it.
#[allow(clippy::too_many_arguments)]
pub fn record(ref_n: u32, batch: u32, entry: &str, call_entry: &str, call_id: &str, tool: &str, text: &str, hash: &str) -> condense_events::Record {
    condense_events::Record {
        ref_n,
        batch,
        entry: entry.to_string(),
        call_entry: call_entry.to_string(),
        call_id: call_id.to_string(),
        occurrence: format!("{call_id}@{entry}"),
        protected: false,
        tool: tool.to_string(),
        arguments: "{}".to_string(),
        is_error: false,
        chars: text.chars().count() as u64,
        hash: hash.to_string(),
        turn: 0,
        utg: 0,
    }
}
