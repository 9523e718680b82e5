//! The stage contract of condense's pruning pipeline.
//!
//! A stage (capture, dedup, spill, summarize, purge, chain) is a consumer of a session's event log:
//!
//! - [`Stage::fold`] takes in every event appended to the log, in order, and keeps what the stage needs
//!   in its own state. That state after event N depends only on events 1..N, so a replay of the log, a
//!   projection folded again after a restart and a copy of a live session all hold the same state.
//! - [`Stage::decide`], before a model request, adds the stage's decision events to a [`Pass`] from that
//!   state, from what the stages before it decided in the same pass, and from what is new on the branch.
//!   It reads the branch through the [`Shape`] (positional facts kept as the branch grows) and may keep
//!   caches of its own that only spare it work (a cursor past what can no longer change); a cache never
//!   changes a decision, and a cache tied to branch positions is dropped when the shape is rebuilt
//!   ([`Shape::generation`]).
//!
//! The engine composes the stages in a fixed order, appends the pass's decisions to the log, and folds
//! them back into every stage (and the render projection) like any other event. A stage depends only on
//! this crate, the event model and the index, so it can be embedded and tested alone against a recorded
//! log (`testing::Recorded`, with the feature `testing`).
//!
//! # Example
//!
//! A stage of one's own, run against a recorded log (`testing::Recorded`, feature `testing`): its
//! state is folded from the log, so a copy folded afresh from the same events decides the same.
//!
//! ```
//! use condense_events::{DecisionEvent, Entry, Event, PruneConfig, SourceEvent};
//! use condense_stage::testing::{prompt, reply, Recorded};
//! use condense_stage::{Pass, Stage, StageError, Trigger};
//!
//! /// Notes how many prompts the session holds whenever that changed since its last note.
//! #[derive(Default)]
//! struct Prompts {
//!     seen: usize,
//!     noted: usize,
//! }
//!
//! impl Stage for Prompts {
//!     fn name(&self) -> &'static str {
//!         "prompts"
//!     }
//!
//!     fn fold(&mut self, event: &Event) {
//!         match event {
//!             Event::Source(SourceEvent::EntryAppended { entry: Entry::Message(m), .. }) if m.role() == "user" => self.seen += 1,
//!             Event::Decision(DecisionEvent::Note { stage, text }) if stage == "prompts" => self.noted = text.parse().unwrap_or(0),
//!             _ => {}
//!         }
//!     }
//!
//!     fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
//!         if self.seen != self.noted {
//!             pass.push(DecisionEvent::Note { stage: "prompts".into(), text: self.seen.to_string() });
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let mut log = Recorded::new(PruneConfig::default());
//! let mut live = Prompts::default();
//! log.message("u1", prompt("hello"), &mut [&mut live]);
//! log.message("a1", reply("hi"), &mut [&mut live]);
//! assert_eq!(log.run(&mut [&mut live], Trigger::Request).unwrap().len(), 1);
//! log.message("u2", prompt("again"), &mut [&mut live]);
//! // The same stage folded from the log as it stands decides what the live one decides.
//! let mut folded = Prompts::default();
//! log.events().iter().for_each(|e| folded.fold(e));
//! let mut twin = Recorded::new(PruneConfig::default());
//! log.events().iter().for_each(|e| twin.append(e.clone(), &mut []));
//! let (a, b) = (log.run(&mut [&mut live], Trigger::Request).unwrap(), twin.run(&mut [&mut folded], Trigger::Request).unwrap());
//! assert_eq!(a, b);
//! assert_eq!(a, vec![DecisionEvent::Note { stage: "prompts".into(), text: "2".into() }]);
//! ```

use condense_events::{DecisionEvent, Event, Message, PruneConfig, Record, UserOrigin};
use condense_index::Index;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use condense_index::{json_strings, path_arguments, FETCH_TOOLS, FILE_TOOLS, READ_TOOLS};

/// Why the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Before a model request: prune if `pruneOn` or the budget says so.
    Request,
    /// Asked for (`on-demand`): prune everything the model has read.
    Now,
}

/// A stage that could not decide (a summarizer or the blob store failed). Nothing of the pass is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{stage}: {reason}")]
pub struct StageError {
    /// The stage.
    pub stage: &'static str,
    /// What went wrong.
    pub reason: String,
}

/// One stage of the pipeline. See the crate documentation for the contract.
pub trait Stage {
    /// The stage's name, as errors and the documentation give it.
    fn name(&self) -> &'static str;

    /// Takes in one event appended to the session's log (source events and decisions alike, in log
    /// order). Stages that keep nothing of their own ignore it.
    fn fold(&mut self, event: &Event) {
        let _ = event;
    }

    /// Adds this stage's decisions for the request being prepared to `pass`.
    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError>;
}

/// A branch as the stages read it: the render projection's kept view, or (in tests) a list.
pub trait Entries<'a> {
    /// Messages on the branch.
    fn count(&self) -> usize;
    /// The `i`th message and its entry id.
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>);
    /// Where the message of entry `id` sits on the branch (`None` when it is not on it).
    fn position(&self, id: &str) -> Option<usize>;
}

impl<'a> Entries<'a> for [(&'a str, &'a Arc<Message>)] {
    fn count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        self[i]
    }
    fn position(&self, id: &str) -> Option<usize> {
        self.iter().position(|(e, _)| *e == id)
    }
}

impl<'a> Entries<'a> for Vec<(&'a str, &'a Arc<Message>)> {
    fn count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        self[i]
    }
    fn position(&self, id: &str) -> Option<usize> {
        self[..].position(id)
    }
}

/// Whether an assistant message is a final reply: text and no tool calls.
pub fn is_final_reply(m: &Message) -> bool {
    // Some text block holds more than white space (the joined text, without building it).
    matches!(m, Message::Assistant { .. })
        && m.tool_calls().next().is_none()
        && m.content().iter().any(|b| matches!(b, condense_events::Block::Text { text } if !text.trim().is_empty()))
}

/// Positional facts of the branch the stages read: for each message, the turns (assistant messages)
/// before it, the user-turn-groups (prompts) at or before it and the chains closed before it; the newest
/// assistant message and final reply. Entries never change once appended, so the facts of a branch stay
/// true for every branch that extends it: a session keeps its shape and each request takes in only the
/// messages that are new.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// How many times the shape was rebuilt (the branch did not extend the one covered).
    generation: u64,
    /// The last message this shape covers (an id is unique in the tree, so a branch holding it at the same
    /// position holds the same prefix).
    last_id: String,
    turn_at: Vec<u32>,
    utg_at: Vec<u32>,
    chain_at: Vec<u32>,
    turns: u32,
    utg: u32,
    chains: u32,
    last_assistant: Option<usize>,
    last_final: Option<usize>,
    last_prompt: Option<usize>,
    answered: u32,
}

impl Shape {
    /// Brings the shape to `branch`: extended where `branch` grew from what it covers, rebuilt otherwise.
    pub fn follow<'a, B: Entries<'a> + ?Sized>(&mut self, branch: &B) {
        let covered = self.turn_at.len();
        let extends = covered <= branch.count() && (covered == 0 || branch.entry(covered - 1).0 == self.last_id);
        if !extends {
            *self = Shape { generation: self.generation + 1, ..Shape::default() };
        }
        for i in self.turn_at.len()..branch.count() {
            let (_, m) = branch.entry(i);
            if matches!(**m, Message::User { origin: UserOrigin::Prompt, .. }) {
                self.utg += 1;
                if self.last_final.is_some_and(|f| self.last_prompt.is_none_or(|p| f > p)) {
                    self.answered += 1;
                }
                self.last_prompt = Some(i);
            }
            self.turn_at.push(self.turns);
            self.utg_at.push(self.utg);
            self.chain_at.push(self.chains);
            if matches!(**m, Message::Assistant { .. }) {
                self.turns += 1;
                self.last_assistant = Some(i);
            }
            if is_final_reply(m) {
                self.chains += 1;
                self.last_final = Some(i);
            }
        }
        if let Some(last) = branch.count().checked_sub(1) {
            self.last_id = branch.entry(last).0.to_string();
        }
    }

    /// How many times the shape was rebuilt; positions a stage cached under another generation are void.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Assistant messages on the branch.
    pub fn turns(&self) -> u32 {
        self.turns
    }

    /// User prompts on the branch (user-turn-groups).
    pub fn utg(&self) -> u32 {
        self.utg
    }

    /// Assistant messages before message `i`.
    pub fn turn_at(&self, i: usize) -> u32 {
        self.turn_at[i]
    }

    /// Prompts at or before message `i`.
    pub fn utg_at(&self, i: usize) -> u32 {
        self.utg_at[i]
    }

    /// Chains (final replies) closed before message `i`.
    pub fn chain_at(&self, i: usize) -> u32 {
        self.chain_at[i]
    }

    /// Position of the newest assistant message.
    pub fn last_assistant(&self) -> Option<usize> {
        self.last_assistant
    }

    /// Position of the newest final reply.
    pub fn last_final(&self) -> Option<usize> {
        self.last_final
    }

    /// User prompts that answered a final reply (the model replied to the prompt before, and the user
    /// wrote again): how often the user has been in the loop.
    pub fn answered(&self) -> u32 {
        self.answered
    }
}

/// Stores a spilled output's bytes and returns their hash.
pub type PutBlob<'a> = &'a mut dyn FnMut(&[u8]) -> Result<String, String>;

/// One run of the pipeline before a request: what every stage reads, and the decisions made so far.
pub struct Pass<'a> {
    /// The session's pruning configuration.
    pub config: &'a PruneConfig,
    /// The index: every decision of the log so far, folded (refs, records, batches, summaries...).
    pub index: &'a Index,
    /// The active branch.
    pub branch: &'a dyn Entries<'a>,
    /// The branch's positional facts (followed to `branch` before the first stage runs).
    pub shape: &'a Shape,
    /// Why the pipeline runs.
    pub trigger: Trigger,
    decisions: Vec<DecisionEvent>,
    /// This pass's captures: where each one's `OutputCaptured` sits in `decisions`, and its text.
    captured: Vec<(usize, Cow<'a, str>)>,
    captured_by_entry: BTreeMap<String, usize>,
    aliased: BTreeSet<u32>,
    spilled: BTreeSet<u32>,
    summaries: BTreeMap<u32, String>,
    closed: usize,
    put_blob: PutBlob<'a>,
}

impl<'a> Pass<'a> {
    /// A pass with no decision yet.
    pub fn new(config: &'a PruneConfig, index: &'a Index, branch: &'a dyn Entries<'a>, shape: &'a Shape, trigger: Trigger, put_blob: PutBlob<'a>) -> Self {
        Pass {
            config,
            index,
            branch,
            shape,
            trigger,
            decisions: Vec::new(),
            captured: Vec::new(),
            captured_by_entry: BTreeMap::new(),
            aliased: BTreeSet::new(),
            spilled: BTreeSet::new(),
            summaries: BTreeMap::new(),
            closed: 0,
            put_blob,
        }
    }

    /// Adds a decision (in order; later stages see it).
    pub fn push(&mut self, d: DecisionEvent) {
        match &d {
            DecisionEvent::OutputAliased { ref_n, .. } => drop(self.aliased.insert(*ref_n)),
            DecisionEvent::OutputSpilled { ref_n, .. } => drop(self.spilled.insert(*ref_n)),
            DecisionEvent::BatchClosed { summaries, .. } => {
                self.closed += 1;
                self.summaries.extend(summaries.iter().cloned());
            }
            DecisionEvent::OutputStubbed { ref_n, summary } => drop(self.summaries.insert(*ref_n, summary.clone())),
            _ => {}
        }
        self.decisions.push(d);
    }

    /// Adds `decisions` in order, as [`Pass::push`] does, with room for them taken at once (a pass that
    /// closes thousands of batches doubled its list, the old and the new one alive together). For a stage's
    /// decisions gathered whole: room taken exactly each time is not amortized over many small calls.
    pub fn extend(&mut self, decisions: Vec<DecisionEvent>) {
        self.decisions.reserve_exact(decisions.len());
        for d in decisions {
            self.push(d);
        }
    }

    /// Room for `n` more captures and their decisions at once (a first request of many tool results
    /// captures them all in one pass: a list grown by doubling held the old and the new buffer together).
    pub fn reserve_captures(&mut self, n: usize) {
        self.decisions.reserve(n);
        self.captured.reserve(n);
    }

    /// Adds a capture: its decision, and the record with its output text for the stages after.
    pub fn capture(&mut self, record: Record, text: Cow<'a, str>) {
        self.captured_by_entry.insert(record.entry.clone(), self.captured.len());
        self.captured.push((self.decisions.len(), text));
        self.push(DecisionEvent::OutputCaptured(Box::new(record)));
    }

    /// The pass's decisions.
    pub fn into_decisions(self) -> Vec<DecisionEvent> {
        self.decisions
    }

    /// Outputs captured in this pass, with their texts, in ref order.
    pub fn captured(&self) -> impl Iterator<Item = (&Record, &Cow<'a, str>)> + '_ {
        self.captured.iter().map(|(at, text)| (self.captured_record(*at), text))
    }

    /// The record of the capture whose decision is at `at`.
    fn captured_record(&self, at: usize) -> &Record {
        match &self.decisions[at] {
            DecisionEvent::OutputCaptured(r) => r,
            _ => unreachable!("a capture's place in the decisions holds its OutputCaptured"),
        }
    }

    /// Stores bytes in the blob store; the hash.
    pub fn put_blob(&mut self, bytes: &[u8]) -> Result<String, String> {
        (self.put_blob)(bytes)
    }

    /// Where the message of entry `id` sits on the branch.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.branch.position(id)
    }

    /// The record of a tool-result entry, captured earlier or in this pass.
    pub fn record_of(&self, entry: &str) -> Option<&Record> {
        match self.index.by_entry.get(entry).and_then(|n| self.index.records.get(n)) {
            Some(r) => Some(r),
            None => self.captured_by_entry.get(entry).map(|&i| self.captured_record(self.captured[i].0)),
        }
    }

    /// Whether output `ref_n` is a duplicate (decided earlier or in this pass).
    pub fn is_aliased(&self, ref_n: u32) -> bool {
        self.aliased.contains(&ref_n) || self.index.aliases.contains_key(&ref_n)
    }

    /// Whether output `ref_n` is spilled (decided earlier or in this pass).
    pub fn is_spilled(&self, ref_n: u32) -> bool {
        self.spilled.contains(&ref_n) || self.index.spills.contains_key(&ref_n)
    }

    /// The summary of output `ref_n` (written earlier or in this pass).
    pub fn summary(&self, ref_n: u32) -> Option<&str> {
        self.summaries.get(&ref_n).map(String::as_str).or_else(|| self.index.summaries.get(&ref_n).map(|s| &**s))
    }

    /// Whether `r` is a read `liveReadsTokens` may keep verbatim: a file read ([`READ_TOOLS`]), not
    /// protected, aliased or spilled (those render as they do anyway).
    pub fn keepable_read(&self, r: &Record) -> bool {
        condense_index::is_file_read(r) && !self.is_aliased(r.ref_n) && !self.is_spilled(r.ref_n)
    }

    /// Whether `r` is a read `liveReadsTokens` keeps verbatim now: a [`Pass::keepable_read`] whose batch
    /// closed summarized (by this pass or earlier) without a summary for it, and no stub since (the rule
    /// of [`condense_index::Index::unsummarized_reads`], with this pass's decisions counted).
    pub fn kept_verbatim(&self, r: &Record) -> bool {
        self.keepable_read(r) && self.summary(r.ref_n).is_none() && self.outcome(r.batch) == Some(condense_events::BatchOutcome::Summarized)
    }

    /// How batch `batch` was closed, by this pass or earlier (`None`: still open).
    pub fn outcome(&self, batch: u32) -> Option<condense_events::BatchOutcome> {
        self.decisions
            .iter()
            .rev()
            .find_map(|d| match d {
                DecisionEvent::BatchClosed { batch: b, outcome, .. } if *b == batch => Some(*outcome),
                _ => None,
            })
            .or_else(|| self.index.outcomes.get(&batch).copied())
    }

    /// How many batches this pass closed so far.
    pub fn batches_closed(&self) -> usize {
        self.closed
    }

    /// The output text of a record: this pass's capture, or the tool result on the branch.
    pub fn text_of(&self, r: &Record) -> Cow<'a, str> {
        if let Some(&i) = self.captured_by_entry.get(&r.entry) {
            return self.captured[i].1.clone();
        }
        self.position(&r.entry).map_or(Cow::Borrowed(""), |i| output_text_borrowed(self.branch.entry(i).1))
    }
}

/// [`output_text`], borrowed from the message when it is one text block (as most tool results are).
pub fn output_text_borrowed(m: &Message) -> Cow<'_, str> {
    match m.content() {
        [condense_events::Block::Text { text }] => Cow::Borrowed(text),
        _ => Cow::Owned(output_text(m)),
    }
}

/// Text of a tool result: its text blocks joined, images as a marker (they are not text).
pub fn output_text(m: &Message) -> String {
    let mut out = String::new();
    for b in m.content() {
        match b {
            condense_events::Block::Text { text } => out.push_str(text),
            condense_events::Block::Image(i) => out.push_str(&format!("[image {}]", i.mime)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::Block;

    fn branch_of(n: usize) -> Vec<(String, Arc<Message>)> {
        (0..n)
            .map(|i| {
                let m = match i % 5 {
                    0 => Message::user_text(format!("task {i}"), UserOrigin::Prompt),
                    1 | 3 => Message::Assistant {
                        content: vec![Block::tool_call(format!("c{i}"), "bash".into(), "{}".into())],
                        model: None,
                        stop: None,
                        usage: None,
                    },
                    2 => Message::ToolResult { call_id: format!("c{}", i - 1), tool_name: "bash".into(), content: vec![Block::Text { text: "out".into() }], is_error: false },
                    _ => Message::Assistant { content: vec![Block::Text { text: format!("done {i}") }], model: None, stop: None, usage: None },
                };
                (format!("e{i}"), Arc::new(m))
            })
            .collect()
    }

    fn view(b: &[(String, Arc<Message>)]) -> Vec<(&str, &Arc<Message>)> {
        b.iter().map(|(id, m)| (id.as_str(), m)).collect()
    }

    /// The shape without its generation, to compare a followed shape with one built at once.
    fn facts(s: &Shape) -> String {
        format!("{:?}", Shape { generation: 0, ..s.clone() })
    }

    /// A shape brought up to a branch message by message is the shape of that branch built at once, and a
    /// branch that does not extend the covered one (a rewind, another branch) is rebuilt, under a new
    /// generation.
    #[test]
    fn a_shape_followed_step_by_step_is_the_shape_built_at_once() {
        let all = branch_of(43);
        let mut step = Shape::default();
        for k in 0..=all.len() {
            step.follow(&view(&all[..k])[..]);
            let mut once = Shape::default();
            once.follow(&view(&all[..k])[..]);
            assert_eq!(facts(&step), facts(&once), "after {k} messages");
        }
        assert_eq!((step.generation(), step.turns(), step.utg(), step.last_final()), (0, 25, 9, Some(39)));
        // A rewind to 20 messages, then another message in place of the 21st.
        step.follow(&view(&all[..20])[..]);
        assert_eq!(step.generation(), 1);
        let mut other = all[..20].to_vec();
        other.push(("x".into(), Arc::new(Message::user_text("elsewhere", UserOrigin::Prompt))));
        step.follow(&view(&other)[..]);
        let mut once = Shape::default();
        once.follow(&view(&other)[..]);
        assert_eq!(facts(&step), facts(&once));
        // It extends the rewound branch, so nothing was rebuilt again.
        assert_eq!(step.generation(), 1);
    }
}
