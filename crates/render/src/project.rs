//! Folding events into the session tree and rendering the active branch.

use condense_events::{Block, Context, Entry, Event, Message, Seq, SourceEvent, UserOrigin};
use std::collections::HashMap;
use std::sync::Arc;

/// Text of the result condense supplies for a call whose result the source never recorded (an aborted
/// turn, a crash). Like pi, condense answers such a call with an error result so the pair stays valid.
pub const SYNTHETIC_RESULT_TEXT: &str = "[no result recorded: the call ended before it returned]";

/// The model in use, as the last `ModelChanged` event gave it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelInfo {
    /// Provider, when known.
    pub provider: Option<String>,
    /// Model id.
    pub model: String,
    /// Context window in tokens.
    pub context_window: Option<u64>,
    /// Output limit in tokens.
    pub max_output: Option<u64>,
}

#[derive(Debug, Clone)]
enum Node {
    Message(Arc<Message>),
    Compaction { summary: Option<Arc<Message>>, first_kept: Option<String>, replacement: Vec<Arc<Message>> },
    Marker,
}

#[derive(Debug, Clone)]
struct Item {
    id: String,
    parent: Option<usize>,
    node: Node,
}

/// The folded state of one session.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    items: Vec<Item>,
    // Used for lookups only, never iterated, so its order cannot reach a rendered byte.
    index: HashMap<String, usize>,
    leaf: Option<usize>,
    model: Option<ModelInfo>,
    seq: Seq,
    source: Option<String>,
}

/// What rendering had to do to make the branch provider-valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderReport {
    /// Calls that got a synthetic error result because the source has none.
    pub synthetic_results: Vec<String>,
    /// Results dropped because no open call precedes them.
    pub orphan_results: Vec<String>,
    /// Assistant messages dropped because they had no content at all.
    pub empty_assistants: usize,
}

/// A rendered context and the report of its repairs.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// The messages, in order.
    pub messages: Context,
    /// Repairs made.
    pub report: RenderReport,
}

/// How a host compaction's summary reads in the context.
fn summary_message(summary: &str) -> Arc<Message> {
    Arc::new(Message::user_text(format!("[Earlier conversation, compacted by the host]\n\n{summary}"), UserOrigin::Summary))
}

impl Projection {
    /// An empty projection.
    pub fn new() -> Projection {
        Projection::default()
    }

    /// Sequence number of the last event absorbed.
    pub fn seq(&self) -> Seq {
        self.seq
    }

    /// The current model, if any event named one.
    pub fn model(&self) -> Option<&ModelInfo> {
        self.model.as_ref()
    }

    /// The source format named by `SessionStarted`.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Number of entries in the tree (all branches).
    pub fn entries(&self) -> usize {
        self.items.len()
    }

    /// Absorbs one event.
    pub fn apply(&mut self, seq: Seq, event: &Event) {
        self.seq = seq;
        let Event::Source(ev) = event else { return };
        match ev {
            SourceEvent::SessionStarted { source, .. } => self.source = Some(source.clone()),
            SourceEvent::EntryAppended { id, parent, entry } => {
                let parent = parent.as_ref().and_then(|p| self.index.get(p).copied());
                let node = match entry {
                    Entry::Message(m) => Node::Message(Arc::new(m.clone())),
                    Entry::HostCompaction { summary, first_kept, replacement, .. } => Node::Compaction {
                        summary: summary.as_deref().map(summary_message),
                        first_kept: first_kept.clone(),
                        replacement: replacement.iter().cloned().map(Arc::new).collect(),
                    },
                    Entry::BranchSummary { summary, .. } => Node::Message(Arc::new(Message::user_text(
                        format!("[Summary of a branch this conversation came back from]\n\n{summary}"),
                        UserOrigin::Summary,
                    ))),
                    Entry::Marker { .. } => Node::Marker,
                };
                let ix = self.items.len();
                self.items.push(Item { id: id.clone(), parent, node });
                // A repeated id points at its newest entry; the importers rename duplicates anyway.
                self.index.insert(id.clone(), ix);
                self.leaf = Some(ix);
            }
            SourceEvent::LeafMoved { leaf } => {
                self.leaf = leaf.as_ref().and_then(|l| self.index.get(l).copied());
            }
            SourceEvent::ModelChanged { provider, model, context_window, max_output } => {
                self.model = Some(ModelInfo {
                    provider: provider.clone(),
                    model: model.clone(),
                    context_window: *context_window,
                    max_output: *max_output,
                });
            }
            _ => {}
        }
    }

    /// Absorbs many events.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = (Seq, &'a Event)>) {
        for (seq, e) in events {
            self.apply(seq, e);
        }
    }

    /// Entry indices on the path from the root to the leaf.
    fn path(&self) -> Vec<usize> {
        let mut path = Vec::new();
        let mut cur = self.leaf;
        while let Some(i) = cur {
            path.push(i);
            cur = self.items[i].parent;
            if path.len() > self.items.len() {
                break; // A cycle cannot be built through `apply`, but never loop forever.
            }
        }
        path.reverse();
        path
    }

    /// Messages on the active branch before compaction and repair: the whole visible transcript.
    pub fn branch_messages(&self) -> Context {
        self.path()
            .into_iter()
            .filter_map(|i| match &self.items[i].node {
                Node::Message(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    /// Renders the context the host itself would send: the newest host compaction on the active branch
    /// replaces what came before it (its summary, its replacement history, the entries it keeps), then
    /// tool-call pairing is repaired (see [`repair`]).
    pub fn render(&self) -> Rendered {
        let path = self.path();
        let newest = path.iter().rposition(|&i| matches!(self.items[i].node, Node::Compaction { .. }));
        let mut raw: Vec<Arc<Message>> = Vec::with_capacity(path.len() + 4);
        let start = match newest {
            None => 0,
            Some(c) => {
                let Node::Compaction { summary, first_kept, replacement } = &self.items[path[c]].node else {
                    unreachable!("position found by the match above")
                };
                raw.extend(summary.iter().cloned());
                raw.extend(replacement.iter().cloned());
                let kept_from = first_kept
                    .as_ref()
                    .and_then(|k| path[..c].iter().position(|&i| &self.items[i].id == k))
                    .unwrap_or(c);
                for &i in &path[kept_from..c] {
                    if let Node::Message(m) = &self.items[i].node {
                        raw.push(m.clone());
                    }
                }
                c + 1
            }
        };
        for &i in &path[start..] {
            if let Node::Message(m) = &self.items[i].node {
                raw.push(m.clone());
            }
        }
        repair(raw)
    }
}

/// Makes a message list provider-valid: each tool call is followed, before the next non-result message,
/// by exactly one result, in call order. A result that arrives later than that (after a user line in
/// Claude Code, say) moves up to its call; a call with no result gets [`SYNTHETIC_RESULT_TEXT`] as an
/// error result; a result with no open call before it is dropped and reported; an assistant message with
/// no content is dropped. Provider call ids can repeat over a session, so a result answers the newest
/// open call with its id.
pub fn repair(raw: Vec<Arc<Message>>) -> Rendered {
    let mut report = RenderReport::default();
    // Pass 1: bind each result to the newest open call with its id.
    let mut open: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut answer: HashMap<(usize, usize), usize> = HashMap::new();
    for (pos, m) in raw.iter().enumerate() {
        match &**m {
            Message::Assistant { .. } => {
                for (k, (id, _, _)) in m.tool_calls().enumerate() {
                    open.insert(id, (pos, k));
                }
            }
            Message::ToolResult { call_id, .. } => {
                if let Some(slot) = open.remove(call_id.as_str()) {
                    answer.insert(slot, pos);
                } else {
                    report.orphan_results.push(call_id.clone());
                }
            }
            Message::User { .. } => {}
        }
    }
    // Pass 2: emit, placing results right after their calls.
    let mut out: Context = Vec::with_capacity(raw.len());
    for (pos, m) in raw.iter().enumerate() {
        match &**m {
            Message::Assistant { content, .. } => {
                if content.is_empty() {
                    report.empty_assistants += 1;
                    continue;
                }
                out.push(m.clone());
                for (k, (id, name, _)) in m.tool_calls().enumerate() {
                    match answer.get(&(pos, k)) {
                        Some(&r) => out.push(raw[r].clone()),
                        None => {
                            report.synthetic_results.push(id.to_string());
                            out.push(Arc::new(Message::ToolResult {
                                call_id: id.to_string(),
                                tool_name: name.to_string(),
                                content: vec![Block::Text { text: SYNTHETIC_RESULT_TEXT.to_string() }],
                                is_error: true,
                            }));
                        }
                    }
                }
            }
            Message::ToolResult { .. } => {}
            Message::User { .. } => out.push(m.clone()),
        }
    }
    Rendered { messages: out, report }
}
