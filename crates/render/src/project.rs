//! Folding events into the session tree and rendering the active branch.

use condense_events::{Block, Context, DecisionEvent, Entry, Event, Message, PruneConfig, Seq, SourceEvent, UserOrigin, QUERY_TOOL_NAME};
use condense_index::Index;
use std::collections::BTreeMap;
// Every hash map here is looked up, never iterated in an order that reaches a rendered byte; the Fx hash
// is a fast one for such keys (numbers, entry and call ids).
use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, Mutex};

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

/// What render needs to know of a message without touching its body: its kind and its tool-call ids,
/// interned as numbers when the entry was folded. Keeping this beside the tree makes a render of a long
/// session a walk over small, contiguous records.
#[derive(Debug, Clone)]
enum Meta {
    User,
    /// `calls` holds each distinct call id once; `dedup` is the message with repeated call ids removed,
    /// rendered in place of the original when the provider would reject the repeat.
    Assistant { calls: Box<[u32]>, empty: bool, dedup: Option<Arc<Message>> },
    Result { call: u32 },
}

#[derive(Debug, Clone)]
enum Node {
    Message(Arc<Message>, Meta),
    Compaction { summary: Option<Arc<Message>>, first_kept: Option<String>, replacement: Vec<(Arc<Message>, Meta)> },
    Marker,
}

#[derive(Debug, Clone)]
struct Item {
    id: String,
    parent: Option<usize>,
    node: Node,
    /// Entries on the path from the root to this entry, this entry excluded: its index in the path of
    /// every branch through it.
    depth: u32,
    /// Messages on the path from the root to this entry, this entry excluded: a message entry's index in
    /// `branch_entries` of every branch through it.
    messages_before: u32,
}

/// The render kept up to date as entries extend the branch it was made for, so a render per turn costs
/// what the turn added, not the length of the session.
#[derive(Debug, Clone, Default)]
struct Incremental {
    /// Whether `out` is the render of `leaf`.
    valid: bool,
    leaf: Option<usize>,
    out: Messages,
    report: RenderReport,
    /// Unanswered calls: interned call id → position of its synthetic result in `out`.
    pending: HashMap<u32, usize>,
    /// How many leading messages of `out` are those the last `render` handed out (a push extends `out`
    /// without lowering it; replacing or splicing a message lowers it to that message's position).
    same: usize,
}

/// The messages of a rendered context, shared with the projection that keeps them up to date. Drop a
/// render before appending to the session again, or the next render copies the list instead of extending it.
pub type Messages = Arc<Vec<Arc<Message>>>;

/// The folded state of one session.
#[derive(Debug, Default)]
pub struct Projection {
    // The tree, its id lookup and the interned call ids only grow as entries are appended; they are shared
    // (copy on write) so that a copy of the projection — the cost guard renders a candidate on one — costs
    // no more than the parts a decision changes.
    items: Arc<Vec<Item>>,
    // Used for lookups only, never iterated, so its order cannot reach a rendered byte.
    index: Arc<HashMap<String, usize>>,
    // Tool-call ids interned as numbers (lookups only).
    call_ids: Arc<HashMap<String, u32>>,
    leaf: Option<usize>,
    model: Option<ModelInfo>,
    seq: Seq,
    source: Option<String>,
    inc: Mutex<Incremental>,
    decisions: Index,
    config: PruneConfig,
    phase_cache: Mutex<PhaseCache>,
    // What the decisions say about each entry, by entry index (lookups only, never iterated).
    // Shared copy on write: a candidate copy whose decisions change no mark (a batch closing) copies none.
    // By entry index (dense: every entry has a slot once one is marked).
    marks: MarkList,
    // The summary message of each checkpoint, built once so every render shares the same bytes.
    checkpoint_msgs: std::collections::BTreeMap<u32, Arc<Message>>,
    // Bounded copies of results by (checkpoint, entry index).
    bounded_msgs: std::collections::BTreeMap<(u32, usize), Arc<Message>>,
    // Assistant entries whose request the provider rejected as too long: kept in the transcript, left out
    // of the model context.
    overflowed: std::collections::BTreeSet<usize>,
    // Provider overflows since the last entry that was not a failed assistant message.
    overflow_streak: u32,
    // Whether a checkpoint was committed since the last overflow.
    overflow_checkpointed: bool,
    // The last provider usage the host reported, with the leaf entry at that time; `None` once a decision
    // changed the context since (the usage then describes a request that will not be sent again).
    usage_anchor: Option<(condense_events::Usage, Option<usize>)>,
    // The leaf when the model last changed: a model transition lasts until an assistant message follows.
    model_change_leaf: Option<Option<usize>>,
    // Estimated tokens each request carries besides the messages (system prompt, tool declarations).
    overhead: u64,
    // Token estimates of rendered messages by the message's address (lookups only); each entry holds its
    // message, so an address cannot be reused while it is a key. Shared with copies of the projection
    // (an estimate depends on the message alone) and cleared when it outgrows the tree.
    tokens: Arc<Mutex<HashMap<usize, (Arc<Message>, u64)>>>,
    // The path (root first) of the last leaf asked for. Entries never change once appended, so it stays
    // right for that leaf, and the path of a leaf below it is that path extended.
    path_cache: PathCache,
    // The message entries of that path (what `branch_view` reads), kept the same way.
    message_path_cache: PathCache,
}

/// What the pruning decisions say about one entry, kept by entry index so a render never looks entries
/// up by their id string.
#[derive(Debug, Clone, Default)]
struct Marks {
    /// The ref of the output this tool-result entry holds.
    result_ref: Option<u32>,
    /// The refs of the outputs of this assistant entry's calls.
    call_refs: Vec<u32>,
    /// How many of this assistant entry's calls are purged.
    purged: usize,
    /// The chain block that starts at this entry.
    chain_first: Option<u32>,
    /// The chain block that ends at this entry.
    chain_last: Option<u32>,
}

/// Messages the render phases built, kept so later renders share them instead of building them again:
/// stubs by ref, condensed turns by (entry, closed, purges). What they hold never changes for a key.
/// A path kept with the leaf it was made for (see `Projection::kept_path`).
type PathCache = Mutex<Option<(usize, Arc<Vec<usize>>)>>;

/// Entries per chunk of a [`MarkList`].
const MARK_CHUNK: usize = 4096;

/// The marks of every entry, by entry index, in chunks shared copy-on-write: a copy of the projection
/// copies a pointer per chunk, and a decision that marks an entry copies that entry's chunk only.
#[derive(Debug, Clone, Default)]
struct MarkList {
    chunks: Vec<Arc<Vec<Option<Arc<Marks>>>>>,
}

impl MarkList {
    fn get(&self, i: usize) -> Option<&Arc<Marks>> {
        self.chunks.get(i / MARK_CHUNK).and_then(|c| c.get(i % MARK_CHUNK)).and_then(Option::as_ref)
    }
}

/// The marks of entry `i`, made when missing (copy on write: see [`MarkList`]).
fn mark_of(marks: &mut MarkList, i: usize) -> &mut Marks {
    let (c, k) = (i / MARK_CHUNK, i % MARK_CHUNK);
    if marks.chunks.len() <= c {
        marks.chunks.resize_with(c + 1, Arc::default);
    }
    let chunk = Arc::make_mut(&mut marks.chunks[c]);
    if chunk.len() <= k {
        chunk.resize(k + 1, None);
    }
    // Each entry's marks are shared too: a copy of a chunk copies pointers, not the marks.
    Arc::make_mut(chunk[k].get_or_insert_with(Arc::default))
}

#[derive(Debug, Clone, Default)]
struct PhaseMaps {
    stubs: std::collections::BTreeMap<u32, Arc<Message>>,
    // The block message of each compressed chain (its body never changes once decided).
    chains: std::collections::BTreeMap<u32, Arc<Message>>,
    turns: std::collections::BTreeMap<(usize, bool, usize), Arc<Message>>,
    // The final reply of each compressed chain as it renders, by block and whether it is cut, so every
    // render shares one message (what the render's prefix comparisons and token counts key on).
    replies: std::collections::BTreeMap<(u32, bool), Arc<Message>>,
}

/// The phase cache of a projection: what it shares with the projection it was copied from (`base`), and
/// what it built since (`own`). A copy of a projection (the cost guard's candidate) shares the base instead
/// of copying every stub, and what the candidate builds stays its own, so a candidate that is dropped leaves
/// nothing behind (its decisions may never be made).
#[derive(Debug, Default)]
struct PhaseCache {
    base: Arc<PhaseMaps>,
    own: PhaseMaps,
}

impl PhaseCache {
    /// A copy for a copy of the projection: what this cache built joins its base (in place when nothing
    /// else shares that base), and both share the result.
    fn share(&mut self) -> PhaseCache {
        if !(self.own.stubs.is_empty() && self.own.chains.is_empty() && self.own.turns.is_empty() && self.own.replies.is_empty()) {
            let own = std::mem::take(&mut self.own);
            let base = Arc::make_mut(&mut self.base);
            base.stubs.extend(own.stubs);
            base.chains.extend(own.chains);
            base.turns.extend(own.turns);
            base.replies.extend(own.replies);
        }
        PhaseCache { base: self.base.clone(), own: PhaseMaps::default() }
    }
}

/// The message kept for `key`, or the one `make` builds (then kept in `own`).
fn cached<K: Ord>(
    own: &mut std::collections::BTreeMap<K, Arc<Message>>,
    base: &std::collections::BTreeMap<K, Arc<Message>>,
    key: K,
    make: impl FnOnce() -> Arc<Message>,
) -> Arc<Message> {
    if let Some(m) = base.get(&key) {
        return m.clone();
    }
    own.entry(key).or_insert_with(make).clone()
}

impl Clone for Projection {
    fn clone(&self) -> Projection {
        Projection {
            items: self.items.clone(),
            index: self.index.clone(),
            call_ids: self.call_ids.clone(),
            leaf: self.leaf,
            model: self.model.clone(),
            seq: self.seq,
            source: self.source.clone(),
            inc: Mutex::new(self.inc.lock().expect("render cache lock").clone()),
            decisions: self.decisions.clone(),
            config: self.config.clone(),
            phase_cache: Mutex::new(self.phase_cache.lock().expect("phase cache lock").share()),
            marks: self.marks.clone(),
            checkpoint_msgs: self.checkpoint_msgs.clone(),
            bounded_msgs: self.bounded_msgs.clone(),
            overflowed: self.overflowed.clone(),
            overflow_streak: self.overflow_streak,
            overflow_checkpointed: self.overflow_checkpointed,
            usage_anchor: self.usage_anchor,
            model_change_leaf: self.model_change_leaf,
            overhead: self.overhead,
            tokens: self.tokens.clone(),
            path_cache: Mutex::new(self.path_cache.lock().expect("path cache lock").clone()),
            message_path_cache: Mutex::new(self.message_path_cache.lock().expect("path cache lock").clone()),
        }
    }
}

/// One row of the visible transcript ([`Projection::transcript`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TranscriptRow<'a> {
    /// An entry's message.
    Message(&'a str, &'a Arc<Message>),
    /// A divider: the host compacted its context at this entry.
    HostCompaction(&'a str),
    /// A divider: checkpoint `n` replaced everything up to and including entry `.1`.
    Checkpoint(u32, &'a str),
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
    /// Assistant messages rendered without a repeated tool-call id (the first call with the id stays).
    pub duplicate_calls: usize,
}

/// A rendered context and the report of its repairs.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// The messages, in order.
    pub messages: Messages,
    /// Repairs made.
    pub report: RenderReport,
}

/// How a host compaction's summary reads in the context.
fn summary_message(summary: &str) -> Arc<Message> {
    Arc::new(Message::user_text(condense_events::host_summary_text(summary), UserOrigin::Summary))
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

    /// Absorbs one event the caller gives up, moving its message bodies into the projection instead of
    /// copying them.
    pub fn apply_owned(&mut self, seq: Seq, event: Event) {
        match event {
            Event::Source(SourceEvent::EntryAppended { id, parent, entry: Entry::Message(m) }) => {
                self.push_message(seq, id, parent.as_deref(), Arc::new(m));
            }
            other => self.apply(seq, &other),
        }
    }

    /// Folds the `EntryAppended` of message entry `id` at `seq` with a message already shared: another
    /// projection of the same events (`simulate`'s raw context beside the session's) holds it once for
    /// both.
    pub fn push_message(&mut self, seq: Seq, id: String, parent: Option<&str>, m: Arc<Message>) {
        self.seq = seq;
        let meta = self.meta(&m);
        self.push_entry(id, parent, Node::Message(m, meta));
    }

    /// pi's token estimate of a rendered message, remembered per message (a context counted every request
    /// costs what changed).
    pub fn estimate(&self, m: &Arc<Message>) -> u64 {
        let mut cache = self.tokens.lock().expect("token cache lock");
        if let Some((_, t)) = cache.get(&(Arc::as_ptr(m) as usize)) {
            return *t;
        }
        let t = condense_tokens::estimate(m);
        if cache.len() > 2 * self.items.len() + 1024 {
            // Keep what is still in use (a render holds it): dropping everything would make the next
            // request count the whole context again.
            cache.retain(|_, (m, _)| Arc::strong_count(m) > 1);
            if cache.len() > 2 * self.items.len() + 1024 {
                cache.clear();
            }
        }
        cache.insert(Arc::as_ptr(m) as usize, (m.clone(), t));
        t
    }

    /// Estimated tokens each request carries besides the messages (system prompt, tool declarations), as
    /// last reported (`RequestOverhead`); 0 when never reported.
    pub fn request_overhead(&self) -> u64 {
        self.overhead
    }

    /// Provider overflows since the last entry that was not a failed assistant message: 1 asks for a
    /// checkpoint and one retry, 2 is terminal.
    pub fn overflow_streak(&self) -> u32 {
        self.overflow_streak
    }

    /// The context size the provider's last reported usage implies: its input and output tokens plus the
    /// estimate of every message of `rendered` after the entry that was the leaf when it was reported. `None`
    /// without a usage report, or once a decision has changed the context since.
    pub fn anchored_tokens(&self, rendered: &[Arc<Message>]) -> Option<u64> {
        let (usage, leaf) = self.usage_anchor?;
        let base = usage.context_tokens() + usage.output;
        let path = self.path();
        // Messages on the path after the anchor leaf that are in the rendered context.
        let from = match leaf {
            Some(l) => path.iter().position(|&i| i == l).map_or(path.len(), |p| p + 1),
            None => 0,
        };
        let mut later = 0;
        for &i in &path[from..] {
            if let Node::Message(m, _) = &self.items[i].node {
                if rendered.iter().rev().any(|x| Arc::ptr_eq(x, m)) {
                    later += self.estimate(m);
                }
            }
        }
        Some(base + later)
    }

    /// Whether the session is in a model transition: the model changed and no successful reply on the new
    /// model has been added since (an overflowed reply, a reply that ended in a provider error, or one
    /// another model wrote does not end it).
    pub fn in_model_transition(&self) -> bool {
        let Some(at) = self.model_change_leaf else { return false };
        let path = self.path();
        let from = match at {
            Some(l) => match path.iter().position(|&i| i == l) {
                Some(p) => p + 1,
                None => return false,
            },
            None => 0,
        };
        // Only a successful reply on the new model ends the transition: not an overflowed one, not one that
        // ended in a provider error, not one another model wrote.
        let current = self.model.as_ref().map(|m| m.model.as_str());
        !path[from..].iter().any(|&i| {
            !self.overflowed.contains(&i)
                && matches!(&self.items[i].node, Node::Message(m, _) if matches!(&**m, Message::Assistant { stop, model, .. }
                    if *stop != Some(condense_events::StopReason::Error) && (model.is_none() || model.as_deref() == current)))
        })
    }

    /// Whether an overflow still waits for its checkpoint.
    pub fn overflow_pending(&self) -> bool {
        self.overflow_streak == 1 && !self.overflow_checkpointed
    }

    fn push_entry(&mut self, id: String, parent: Option<&str>, node: Node) {
        if !matches!(&node, Node::Message(m, _) if matches!(**m, Message::Assistant { .. })) {
            self.overflow_streak = 0;
        }
        let parent = parent.and_then(|p| self.index.get(p).copied());
        let ix = self.items.len();
        // A repeated id points at its newest entry; the importers rename duplicates anyway.
        Arc::make_mut(&mut self.index).insert(id.clone(), ix);
        let (depth, messages_before) = parent.map_or((0, 0), |p| {
            let it = &self.items[p];
            (it.depth + 1, it.messages_before + u32::from(matches!(it.node, Node::Message(..))))
        });
        Arc::make_mut(&mut self.items).push(Item { id, parent, node, depth, messages_before });
        self.leaf = Some(ix);
        self.extend_render(parent, ix);
    }

    fn mark(&mut self, d: &DecisionEvent) {
        let at = |id: &str| self.index.get(id).copied();
        let (a, b) = match d {
            DecisionEvent::OutputCaptured(r) => (at(&r.entry), at(&r.call_entry)),
            DecisionEvent::ErrorArgsPurged { entry, .. } => (at(entry), None),
            DecisionEvent::ChainCompressed { first, last, .. } => (at(first), at(last)),
            _ => return,
        };
        match d {
            DecisionEvent::OutputCaptured(r) => {
                if let Some(i) = a {
                    mark_of(&mut self.marks, i).result_ref = Some(r.ref_n);
                }
                if let Some(i) = b {
                    mark_of(&mut self.marks, i).call_refs.push(r.ref_n);
                }
            }
            DecisionEvent::ErrorArgsPurged { .. } => {
                if let Some(i) = a {
                    mark_of(&mut self.marks, i).purged += 1;
                }
            }
            DecisionEvent::ChainCompressed { block, .. } => {
                if let Some(i) = a {
                    mark_of(&mut self.marks, i).chain_first = Some(*block);
                }
                if let Some(i) = b {
                    mark_of(&mut self.marks, i).chain_last = Some(*block);
                }
            }
            _ => {}
        }
    }

    /// Before decision `d` is folded: the entries whose message it changes, with the message each renders
    /// as now, when the kept render can take the change in place (see [`Projection::patch_render`]);
    /// `None` when the next render must start over.
    fn patch_start(&self, d: &DecisionEvent) -> Option<Vec<(usize, Arc<Message>)>> {
        let inc = self.inc.lock().expect("render cache lock");
        if !inc.valid || self.decisions.recoveries > 0 || !self.decisions.checkpoints.is_empty() {
            return None;
        }
        let idx = &self.decisions;
        let entries: Vec<&str> = match d {
            DecisionEvent::OutputSpilled { ref_n, .. } => idx.records.get(ref_n).map(|r| r.entry.as_str()).into_iter().collect(),
            DecisionEvent::BatchClosed { refs, .. } => {
                refs.iter().filter_map(|r| idx.records.get(r)).flat_map(|r| [r.entry.as_str(), r.call_entry.as_str()]).collect()
            }
            DecisionEvent::ErrorArgsPurged { entry, .. } => vec![entry.as_str()],
            // The chain's span is replaced whole, where nothing in the render was repaired.
            DecisionEvent::ChainCompressed { .. } => {
                let r = &inc.report;
                let clean = r.synthetic_results.is_empty() && r.orphan_results.is_empty() && r.empty_assistants == 0 && r.duplicate_calls == 0 && inc.pending.is_empty();
                return clean.then(Vec::new);
            }
            DecisionEvent::ChainReplyCut { block, .. } => idx.chains.get(block).map(|c| c.last.as_str()).into_iter().collect(),
            _ => return None,
        };
        drop(inc);
        let mut cache = self.phase_cache.lock().expect("phase cache lock");
        let mut out: Vec<(usize, Arc<Message>)> =
            entries.iter().filter_map(|id| self.index.get(*id).copied()).filter_map(|i| Some((i, self.phased_at(&mut cache, i)?))).collect();
        out.sort_unstable_by_key(|(i, _)| *i);
        out.dedup_by_key(|(i, _)| *i);
        Some(out)
    }

    /// What the render phases make of entry `i`'s message now: phases 1 and 2, or, for the final reply
    /// of a compressed chain, phase 3's (`None`: the entry is no message).
    fn phased_at(&self, cache: &mut PhaseCache, i: usize) -> Option<Arc<Message>> {
        match (&self.items[i].node, self.marks.get(i)) {
            (Node::Message(m, _), Some(mk)) if let Some(chain) = mk.chain_last.and_then(|b| self.decisions.chains.get(&b)) => {
                Some(self.chain_reply(cache, chain, m))
            }
            (Node::Message(m, meta), Some(mk)) => Some(self.phase_message(cache, i, m, meta, mk, 3, |_| false)),
            (Node::Message(m, _), None) => Some(m.clone()),
            _ => None,
        }
    }

    /// After decision `d` is folded: the kept render takes the touched entries' new messages in place of
    /// the ones `patch_start` saw (and a compressed chain's span becomes its prompt, block and reply), so a
    /// decision costs the entries it changes, not a render of the branch. Debug builds check the result
    /// against the full render.
    fn patch_render(&mut self, d: &DecisionEvent, old: Vec<(usize, Arc<Message>)>) {
        let mut replaced: HashMap<usize, Arc<Message>> = HashMap::default();
        {
            let mut cache = self.phase_cache.lock().expect("phase cache lock");
            for (i, before) in old {
                let Some(now) = self.phased_at(&mut cache, i) else { continue };
                if !Arc::ptr_eq(&before, &now) {
                    replaced.insert(Arc::as_ptr(&before) as usize, now);
                }
            }
        }
        let mut inc = std::mem::take(self.inc.get_mut().expect("render cache lock"));
        if !replaced.is_empty() {
            // From the end, where decisions mostly land, until every message replaced is found (each
            // entry's message sits in the render once).
            let (mut first, mut left) = (usize::MAX, replaced.len());
            for (k, m) in Arc::make_mut(&mut inc.out).iter_mut().enumerate().rev() {
                if let Some(new) = replaced.get(&(Arc::as_ptr(m) as usize)) {
                    *m = new.clone();
                    first = k;
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
            }
            inc.same = inc.same.min(first);
        }
        if let DecisionEvent::ChainCompressed { first, last, block, .. } = d {
            inc.valid = self.splice_chain(&mut inc, first, last, *block);
        }
        if cfg!(debug_assertions) && inc.valid {
            let full = self.render_full();
            assert_eq!((&inc.out, &inc.report), (&full.out, &full.report), "a decision patched into the kept render is the full render");
        }
        *self.inc.get_mut().expect("render cache lock") = inc;
    }

    /// The pruning decisions folded so far.
    pub fn index(&self) -> &Index {
        &self.decisions
    }

    /// The pruning configuration in force.
    pub fn config(&self) -> &PruneConfig {
        &self.config
    }

    /// Absorbs one event.
    pub fn apply(&mut self, seq: Seq, event: &Event) {
        self.seq = seq;
        let ev = match event {
            Event::Source(ev) => ev,
            Event::Decision(d) => {
                // Capturing, aliasing and moving the frontier change nothing on screen until a batch closes.
                let unseen = matches!(
                    d,
                    DecisionEvent::Note { .. }
                        | DecisionEvent::FrontierAdvanced { .. }
                        | DecisionEvent::OutputCaptured(_)
                        | DecisionEvent::OutputAliased { .. }
                        | DecisionEvent::ArchiveCommitted { .. }
                );
                // A decision changes what earlier positions render as: the kept render takes the change
                // in place where it can, else the next render starts over.
                let patch = if unseen { None } else { self.patch_start(d) };
                if !unseen {
                    self.usage_anchor = None;
                    if patch.is_none() {
                        self.inc.get_mut().expect("render cache lock").valid = false;
                    }
                }
                self.mark(d);
                if let DecisionEvent::CheckpointCommitted { n, summary, bounded, .. } = d {
                    self.overflow_checkpointed = true;
                    self.checkpoint_msgs.insert(*n, Arc::new(Message::user_text(summary.clone(), UserOrigin::Summary)));
                    for (entry, text) in bounded {
                        let Some(&i) = self.index.get(entry) else { continue };
                        if let Node::Message(m, _) = &self.items[i].node {
                            let copy = match &**m {
                                Message::ToolResult { call_id, tool_name, is_error, .. } => Message::ToolResult {
                                    call_id: call_id.clone(),
                                    tool_name: tool_name.clone(),
                                    content: vec![Block::Text { text: text.clone() }],
                                    is_error: *is_error,
                                },
                                // An oversized recent user message during recovery (seed 004).
                                Message::User { origin, .. } => Message::User { content: vec![Block::Text { text: text.clone() }], origin: *origin },
                                Message::Assistant { .. } => continue,
                            };
                            self.bounded_msgs.insert((*n, i), Arc::new(copy));
                        }
                    }
                }
                self.decisions.apply(d);
                if let Some(old) = patch {
                    self.patch_render(d, old);
                }
                return;
            }
        };
        match ev {
            SourceEvent::SessionStarted { source, .. } => self.source = Some(source.clone()),
            SourceEvent::EntryAppended { id, parent, entry } => {
                let node = match entry {
                    Entry::Message(m) => Node::Message(Arc::new(m.clone()), self.meta(m)),
                    Entry::HostCompaction { summary, first_kept, replacement, .. } => Node::Compaction {
                        summary: summary.as_deref().map(summary_message),
                        first_kept: first_kept.clone(),
                        replacement: replacement.iter().map(|m| (Arc::new(m.clone()), self.meta(m))).collect(),
                    },
                    Entry::BranchSummary { summary, .. } => Node::Message(
                        Arc::new(Message::user_text(
                            format!("[Summary of a branch this conversation came back from]\n\n{summary}"),
                            UserOrigin::Summary,
                        )),
                        Meta::User,
                    ),
                    Entry::Marker { .. } => Node::Marker,
                };
                self.push_entry(id.clone(), parent.as_deref(), node);
            }
            SourceEvent::LeafMoved { leaf } => {
                self.leaf = leaf.as_ref().and_then(|l| self.index.get(l).copied());
                let inc = self.inc.get_mut().expect("render cache lock");
                if inc.leaf != self.leaf {
                    inc.valid = false;
                }
            }
            SourceEvent::ProviderUsage(u) => self.usage_anchor = Some((*u, self.leaf)),
            SourceEvent::ProviderOverflow { .. } => {
                if let Some(l) = self.leaf.filter(|&l| matches!(&self.items[l].node, Node::Message(m, _) if matches!(**m, Message::Assistant { .. }))) {
                    self.overflowed.insert(l);
                }
                self.overflow_streak += 1;
                self.overflow_checkpointed = false;
                self.inc.get_mut().expect("render cache lock").valid = false;
            }
            SourceEvent::PruneConfigured(cfg) => {
                self.config = cfg.clone();
                *self.phase_cache.get_mut().expect("phase cache lock") = PhaseCache::default();
                self.inc.get_mut().expect("render cache lock").valid = false;
            }
            SourceEvent::ModelChanged { provider, model, context_window, max_output } => {
                self.model_change_leaf = Some(self.leaf);
                self.model = Some(ModelInfo {
                    provider: provider.clone(),
                    model: model.clone(),
                    context_window: *context_window,
                    max_output: *max_output,
                });
            }
            SourceEvent::RequestOverhead { tokens } => self.overhead = *tokens,
            _ => {}
        }
    }

    /// Extends the kept render with entry `ix` when it follows the leaf that render was made for;
    /// anything else (a branch switch, a host compaction) leaves the next render to start over.
    fn extend_render(&mut self, parent: Option<usize>, ix: usize) {
        let inc = self.inc.get_mut().expect("render cache lock");
        if !inc.valid || parent != inc.leaf {
            inc.valid = false;
            return;
        }
        inc.leaf = Some(ix);
        if let Node::Message(m, _) = &self.items[ix].node {
            // A new prompt ages recovery outputs in their grace window: one may turn back into a stub.
            if matches!(**m, Message::User { origin: UserOrigin::Prompt, .. })
                && self.decisions.recoveries > 0
            {
                inc.valid = false;
                return;
            }
        }
        match &self.items[ix].node {
            Node::Marker => {}
            Node::Compaction { .. } => inc.valid = false,
            Node::Message(m, Meta::User) => Arc::make_mut(&mut inc.out).push(m.clone()),
            Node::Message(_, Meta::Assistant { empty: true, .. }) => inc.report.empty_assistants += 1,
            Node::Message(m, Meta::Assistant { calls, dedup, .. }) => {
                let out = Arc::make_mut(&mut inc.out);
                let m = dedup.as_ref().unwrap_or(m);
                if dedup.is_some() {
                    inc.report.duplicate_calls += 1;
                }
                out.push(m.clone());
                for (&c, (id, name, _)) in calls.iter().zip(m.tool_calls()) {
                    inc.pending.insert(c, out.len());
                    inc.report.synthetic_results.push(id.to_string());
                    out.push(synthetic(id, name));
                }
            }
            Node::Message(m, Meta::Result { call }) => match inc.pending.remove(call) {
                Some(pos) => {
                    let out = Arc::make_mut(&mut inc.out);
                    if let Message::ToolResult { call_id, .. } = &*out[pos] {
                        if let Some(k) = inc.report.synthetic_results.iter().rposition(|s| s == call_id) {
                            inc.report.synthetic_results.remove(k);
                        }
                    }
                    out[pos] = m.clone();
                    inc.same = inc.same.min(pos);
                }
                None => {
                    if let Message::ToolResult { call_id, .. } = &**m {
                        inc.report.orphan_results.push(call_id.clone());
                    }
                }
            },
        }
    }

    fn intern(&mut self, id: &str) -> u32 {
        if let Some(&n) = self.call_ids.get(id) {
            return n;
        }
        let n = self.call_ids.len() as u32;
        Arc::make_mut(&mut self.call_ids).insert(id.to_string(), n);
        n
    }

    fn meta(&mut self, m: &Message) -> Meta {
        match m {
            Message::User { .. } => Meta::User,
            Message::Assistant { content, model, stop, usage } => {
                let mut seen: Vec<&str> = Vec::new();
                let mut kept = Vec::with_capacity(content.len());
                for b in content {
                    if let Block::ToolCall { id, .. } = b {
                        if seen.contains(&id.as_str()) {
                            continue;
                        }
                        seen.push(id);
                    }
                    kept.push(b.clone());
                }
                let dedup = (kept.len() != content.len()).then(|| {
                    Arc::new(Message::Assistant { content: kept, model: model.clone(), stop: *stop, usage: *usage })
                });
                let calls = seen.iter().map(|id| id.to_string()).collect::<Vec<_>>();
                Meta::Assistant { calls: calls.iter().map(|id| self.intern(id)).collect(), empty: content.is_empty(), dedup }
            }
            Message::ToolResult { call_id, .. } => Meta::Result { call: self.intern(call_id) },
        }
    }

    /// Absorbs many events.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = (Seq, &'a Event)>) {
        for (seq, e) in events {
            self.apply(seq, e);
        }
    }

    /// Entry indices on the path from the root to the leaf.
    fn path(&self) -> Arc<Vec<usize>> {
        self.kept_path(&self.path_cache, |_| true, |it| it.depth)
    }

    /// Indices of the message entries on the path from the root to the leaf.
    fn message_path(&self) -> Arc<Vec<usize>> {
        self.kept_path(&self.message_path_cache, |it| matches!(it.node, Node::Message(..)), |it| it.messages_before)
    }

    /// The entries on the path from the root to the leaf that `keep`, kept in `cache` from the last call:
    /// only the entries below the last one the kept list shares are looked at (`at` says where a kept
    /// entry sits in the list), and the list is extended in place when nothing else holds it.
    fn kept_path(
        &self,
        cache: &PathCache,
        keep: impl Fn(&Item) -> bool,
        at: impl Fn(&Item) -> u32,
    ) -> Arc<Vec<usize>> {
        let Some(leaf) = self.leaf else { return Arc::default() };
        let mut cache = cache.lock().expect("path cache lock");
        if let Some((l, p)) = &*cache
            && *l == leaf
        {
            return p.clone();
        }
        let mut kept = cache.take().map(|(_, p)| p).unwrap_or_default();
        let mut tail = Vec::new();
        let mut common = 0;
        for i in self.ancestors() {
            let it = &self.items[i];
            if !keep(it) {
                continue;
            }
            let pos = at(it) as usize;
            if kept.get(pos) == Some(&i) {
                common = pos + 1;
                break;
            }
            tail.push(i);
        }
        let path = Arc::make_mut(&mut kept);
        path.truncate(common);
        path.extend(tail.into_iter().rev());
        *cache = Some((leaf, kept.clone()));
        kept
    }

    /// The messages on the active branch, root first, as [`Projection::branch_entries`] lists them, without
    /// building that list: what the pipeline reads before every request.
    pub fn branch_view(&self) -> BranchView<'_> {
        BranchView { items: &self.items, ids: &self.index, path: self.message_path() }
    }

    /// The leaf and its ancestors, leaf first.
    fn ancestors(&self) -> impl Iterator<Item = usize> + '_ {
        // A cycle cannot be built through `apply`, but never loop forever.
        std::iter::successors(self.leaf, |&i| self.items[i].parent).take(self.items.len() + 1)
    }

    /// The id of the current leaf entry (`None` before any entry, or when the leaf is before the root).
    pub fn leaf_id(&self) -> Option<&str> {
        self.leaf.map(|i| self.items[i].id.as_str())
    }

    /// Every entry of the tree in the order it was appended, on every branch: its id, its parent's id and
    /// its message (`None` for host compactions and markers).
    pub fn tree(&self) -> impl Iterator<Item = (&str, Option<&str>, Option<&Arc<Message>>)> {
        self.items.iter().map(|it| {
            let parent = it.parent.map(|p| self.items[p].id.as_str());
            let m = match &it.node {
                Node::Message(m, _) => Some(m),
                _ => None,
            };
            (it.id.as_str(), parent, m)
        })
    }

    /// Whether an entry with this id exists (on any branch).
    pub fn has_entry(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    /// Whether entry `id` is on the path from the root to the leaf (the active branch).
    pub fn on_path(&self, id: &str) -> bool {
        self.index.get(id).is_some_and(|&target| self.ancestors().any(|i| i == target))
    }

    /// Entry ids on the path from the root to the leaf.
    pub fn path_ids(&self) -> Vec<String> {
        self.path().iter().map(|&i| self.items[i].id.clone()).collect()
    }

    /// The message of entry `id`, on any branch.
    pub fn entry_message(&self, id: &str) -> Option<&Arc<Message>> {
        match &self.items[*self.index.get(id)?].node {
            Node::Message(m, _) => Some(m),
            _ => None,
        }
    }

    /// The visible transcript of the active branch, root first: every message, and a divider where each
    /// compaction happened (ADR 0064): a host compaction where its entry stands, a checkpoint right after
    /// its boundary entry. Nothing is hidden or rewritten: the dividers only mark where the model's context
    /// was compacted.
    pub fn transcript(&self) -> Vec<TranscriptRow<'_>> {
        let mut after: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (n, cp) in self.decisions.checkpoints.iter() {
            if let Some(&b) = self.index.get(&cp.boundary) {
                after.entry(b).or_default().push(*n);
            }
        }
        let mut out = Vec::new();
        for &i in self.path().iter() {
            let id = self.items[i].id.as_str();
            match &self.items[i].node {
                Node::Message(m, _) => out.push(TranscriptRow::Message(id, m)),
                Node::Compaction { .. } => out.push(TranscriptRow::HostCompaction(id)),
                Node::Marker => {}
            }
            for n in after.get(&i).into_iter().flatten() {
                out.push(TranscriptRow::Checkpoint(*n, id));
            }
        }
        out
    }

    /// Entry ids and messages on the active branch, root first: the transcript the pipeline works on.
    pub fn branch_entries(&self) -> Vec<(&str, &Arc<Message>)> {
        self.entries_on_path(false)
    }

    /// The newest assistant message on the active branch (found from the leaf up, without building the
    /// branch).
    pub fn last_assistant(&self) -> Option<&Arc<Message>> {
        self.ancestors().find_map(|i| match &self.items[i].node {
            Node::Message(m, _) if matches!(**m, Message::Assistant { .. }) => Some(m),
            _ => None,
        })
    }

    /// As [`Projection::branch_entries`], without assistant messages whose request overflowed (they stay
    /// in the transcript but not in the model context).
    pub fn branch_entries_in_context(&self) -> Vec<(&str, &Arc<Message>)> {
        self.entries_on_path(true)
    }

    fn entries_on_path(&self, skip_overflowed: bool) -> Vec<(&str, &Arc<Message>)> {
        self.path()
            .iter()
            .copied()
            .filter(|i| !(skip_overflowed && self.overflowed.contains(i)))
            .filter_map(|i| match &self.items[i].node {
                Node::Message(m, _) => Some((self.items[i].id.as_str(), m)),
                _ => None,
            })
            .collect()
    }

    /// Messages on the active branch before compaction and repair: the whole visible transcript.
    pub fn branch_messages(&self) -> Context {
        self.path()
            .iter()
            .filter_map(|&i| match &self.items[i].node {
                Node::Message(m, _) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    /// Renders the context the host itself would send: the newest host compaction on the active branch
    /// replaces what came before it (its summary, its replacement history, the entries it keeps), then
    /// tool-call pairing is repaired (see `repair`).
    pub fn render(&self) -> Rendered {
        self.render_since().0
    }

    /// [`Projection::render`], and how many of its leading messages are, pointer for pointer, those of
    /// the render before it (of this projection, or of the one it was copied from): what a caller that
    /// kept the last render need not compare again.
    pub fn render_since(&self) -> (Rendered, usize) {
        let mut inc = self.inc.lock().expect("render cache lock");
        if !inc.valid {
            *inc = self.render_full();
        }
        let same = inc.same.min(inc.out.len());
        inc.same = inc.out.len();
        (Rendered { messages: inc.out.clone(), report: inc.report.clone() }, same)
    }

    /// Replaces, in a render with nothing repaired, the chain's messages from its prompt to its final
    /// reply by the prompt, its block and the reply (thinking stripped), as phase 3 does; false when the
    /// chain's messages there are not exactly its own entries' (a result bound across the chain's edge).
    fn splice_chain(&self, inc: &mut Incremental, first: &str, last: &str, block: u32) -> bool {
        let branch = self.branch_view();
        let (Some(&fi), Some(&li)) = (self.index.get(first), self.index.get(last)) else { return false };
        let (Node::Message(fm, _), Node::Message(lm, _)) = (&self.items[fi].node, &self.items[li].node) else { return false };
        let (Some(bf), Some(bl)) = (branch.position(first), branch.position(last)) else { return false };
        let Some(chain) = self.decisions.chains.get(&block) else { return false };
        let Some(pf) = inc.out.iter().rposition(|m| Arc::ptr_eq(m, fm)) else { return false };
        let Some(pl) = inc.out[pf..].iter().position(|m| Arc::ptr_eq(m, lm)).map(|k| pf + k) else { return false };
        // With nothing repaired, the render holds each entry's message once: the chain's span in the render
        // must hold exactly its entries' messages.
        let own = (bf..=bl).filter(|&k| !self.overflowed.contains(&branch.item(k))).count();
        if bl < bf || pl - pf + 1 != own {
            return false;
        }
        let (block_msg, reply) = {
            let mut cache = self.phase_cache.lock().expect("phase cache lock");
            let PhaseCache { base, own } = &mut *cache;
            let block_msg = cached(&mut own.chains, &base.chains, block, || Arc::new(Message::user_text(chain.body.clone(), UserOrigin::Summary)));
            (block_msg, self.chain_reply(&mut cache, chain, lm))
        };
        Arc::make_mut(&mut inc.out).splice(pf..=pl, [fm.clone(), block_msg, reply]);
        inc.same = inc.same.min(pf);
        true
    }

    /// How compressed chain `chain`'s final reply `m` renders: its cut text when the reply was cut
    /// (`ChainReplyCut`), else whole (thinking stripped when `thinkingStrip` is on).
    fn chain_reply(&self, cache: &mut PhaseCache, chain: &condense_index::Chain, m: &Arc<Message>) -> Arc<Message> {
        let PhaseCache { base, own } = cache;
        cached(&mut own.replies, &base.replies, (chain.block, chain.reply.is_some()), || match (&chain.reply, &**m) {
            (Some(text), Message::Assistant { model, stop, usage, .. }) => {
                Arc::new(Message::Assistant { content: vec![Block::Text { text: text.clone() }], model: model.clone(), stop: *stop, usage: *usage })
            }
            _ if self.config.thinking_strip => strip_thinking(m),
            _ => m.clone(),
        })
    }

    /// Renders from scratch, ignoring the kept render (what `render` does after a branch switch or a
    /// host compaction; public so benchmarks and tests can compare the two paths).
    pub fn render_full_now(&self) -> Rendered {
        let inc = self.render_full();
        Rendered { messages: inc.out, report: inc.report }
    }

    /// The canonical context as the model sees it, before tool-call pairing is repaired: host compactions
    /// and checkpoints applied (their summaries as summaries), pruned outputs as their stubs, compressed
    /// chains as their blocks. Each message comes with the entry it renders (`None` for a summary or a
    /// chain block, which stand for several). What recovery reads and archives capture (seed 004).
    pub fn context_entries(&self) -> Vec<(Option<&str>, Arc<Message>)> {
        let path = self.path();
        let raw = self.raw_messages(&path);
        self.phases(&raw, 3).into_iter().map(|(i, m, _)| (i.map(|i| self.items[i].id.as_str()), m)).collect()
    }

    /// The context after each render phase, for inspection and snapshots: the branch as the host would
    /// send it (no repair), after phase 1 (stub replace), 2 (errored-argument purge and condensed turns),
    /// 3 (chain compression), and 4 (the orphan sweep and pairing repair: what `render` returns).
    pub fn render_stages(&self) -> Vec<(&'static str, Vec<Arc<Message>>)> {
        let path = self.path();
        let raw = self.raw_messages(&path);
        let mut out = vec![("branch", raw.iter().map(|(_, m, _)| (*m).clone()).collect())];
        for (name, upto) in [("phase 1: stub replace", 1), ("phase 2: errored-argument purge", 2), ("phase 3: chain compression", 3)] {
            out.push((name, self.phases(&raw, upto).into_iter().map(|(_, m, _)| m).collect()));
        }
        out.push(("phase 4: orphan sweep", self.render_full_now().messages.to_vec()));
        out
    }

    fn render_full(&self) -> Incremental {
        let path = self.path();
        let raw = self.raw_messages(&path);
        let mut inc = if self.decisions.records.is_empty() && self.decisions.chains.is_empty() && self.decisions.checkpoints.is_empty() {
            let plain: Vec<(&Arc<Message>, &Meta)> = raw.iter().map(|(_, m, meta)| (*m, *meta)).collect();
            repair(&plain, self.call_ids.len())
        } else {
            let phased = self.phases(&raw, 3);
            let refs: Vec<(&Arc<Message>, &Meta)> = phased.iter().map(|(_, m, meta)| (m, *meta)).collect();
            repair(&refs, self.call_ids.len())
        };
        inc.leaf = self.leaf;
        inc
    }

    /// The branch's messages after the newest host compaction, each with the entry it came from (none for
    /// a compaction's summary and replacement history).
    fn raw_messages(&self, path: &[usize]) -> Vec<(Option<usize>, &Arc<Message>, &Meta)> {
        let newest = path.iter().rposition(|&i| matches!(self.items[i].node, Node::Compaction { .. }));
        // Each message with the entry it came from (none for a compaction's summary and replacement).
        let mut raw: Vec<(Option<usize>, &Arc<Message>, &Meta)> = Vec::with_capacity(path.len() + 4);
        let start = match newest {
            None => 0,
            Some(c) => {
                let Node::Compaction { summary, first_kept, replacement } = &self.items[path[c]].node else {
                    unreachable!("position found by the match above")
                };
                raw.extend(summary.iter().map(|m| (None, m, &Meta::User)));
                raw.extend(replacement.iter().map(|(m, meta)| (None, m, meta)));
                let kept_from = first_kept
                    .as_ref()
                    .and_then(|k| path[..c].iter().position(|&i| &self.items[i].id == k))
                    .unwrap_or(c);
                for &i in &path[kept_from..c] {
                    if let Node::Message(m, meta) = &self.items[i].node {
                        if !self.overflowed.contains(&i) {
                            raw.push((Some(i), m, meta));
                        }
                    }
                }
                c + 1
            }
        };
        for &i in &path[start..] {
            if let Node::Message(m, meta) = &self.items[i].node {
                if !self.overflowed.contains(&i) {
                    raw.push((Some(i), m, meta));
                }
            }
        }
        self.apply_checkpoint(path, raw)
    }

    /// The newest checkpoint whose boundary is on this branch and still in the context replaces
    /// everything up to its boundary by its summary and the prompts it retained. A checkpoint whose
    /// boundary is not on the branch (another branch's) or was already dropped by a newer host compaction
    /// does not apply; older checkpoints never apply once a newer one does.
    fn apply_checkpoint<'a>(
        &'a self,
        path: &[usize],
        raw: Vec<(Option<usize>, &'a Arc<Message>, &'a Meta)>,
    ) -> Vec<(Option<usize>, &'a Arc<Message>, &'a Meta)> {
        for (n, cp) in self.decisions.checkpoints.iter().rev() {
            let Some(&b) = self.index.get(&cp.boundary) else { continue };
            let Some(pos) = raw.iter().position(|(i, _, _)| *i == Some(b)) else {
                if path.contains(&b) {
                    return raw; // On the branch but before a newer host compaction: that one rules.
                }
                continue;
            };
            let Some(summary) = self.checkpoint_msgs.get(n) else { continue };
            let mut out = Vec::with_capacity(raw.len() - pos + cp.kept.len() + 1);
            out.push((None, summary, &Meta::User));
            for k in &cp.kept {
                if let Some(&i) = self.index.get(k) {
                    if let Node::Message(m, meta) = &self.items[i].node {
                        out.push((Some(i), m, meta));
                    }
                }
            }
            for (i, m, meta) in raw.into_iter().skip(pos + 1) {
                match i.and_then(|i| self.bounded_msgs.get(&(*n, i))) {
                    Some(copy) => out.push((i, copy, meta)),
                    None => out.push((i, m, meta)),
                }
            }
            return out;
        }
        raw
    }

    /// Render phases over the branch (seed 000 and the pipeline it takes for granted):
    /// 1. stub replace: a pruned output becomes its stub, unless protected or a `context_tree_query`
    ///    output still in its recovery grace window;
    /// 2. errored-argument purge: purged calls show a marker instead of their arguments;
    /// 3. chain compression: a compressed chain keeps its prompt, then its block, then its final reply
    ///    (thinking stripped);
    /// 4. the orphan sweep is `repair`, which runs after these phases.
    fn phases<'a>(&'a self, raw: &[(Option<usize>, &'a Arc<Message>, &'a Meta)], upto: u8) -> Vec<(Option<usize>, Arc<Message>, &'a Meta)> {
        let idx = &self.decisions;
        let grace = self.config.recovery_grace_turns;
        // Positional user-turn-groups: prompts at or before each position, and in all.
        let mut utg_at = Vec::with_capacity(raw.len());
        let mut utg = 0u64;
        for (_, m, _) in raw {
            if matches!(***m, Message::User { origin: UserOrigin::Prompt, .. }) {
                utg += 1;
            }
            utg_at.push(utg);
        }
        let now_utg = utg;
        // Where each chain's final reply sits, found in one pass.
        let mut last_pos: HashMap<u32, usize> = HashMap::default();
        if upto >= 3 && !idx.chains.is_empty() {
            for (k, (i, _, _)) in raw.iter().enumerate() {
                if let Some(block) = i.and_then(|i| self.marks.get(i)).and_then(|mk| mk.chain_last) {
                    last_pos.insert(block, k);
                }
            }
        }
        let mut cache = self.phase_cache.lock().expect("phase cache lock");
        let mut out: Vec<(Option<usize>, Arc<Message>, &Meta)> = Vec::with_capacity(raw.len());
        let mut k = 0;
        while k < raw.len() {
            let (item, m, meta) = raw[k];
            let marks = item.and_then(|i| self.marks.get(i));
            let Some(mk) = marks else {
                out.push((item, m.clone(), meta));
                k += 1;
                continue;
            };
            // Phase 3: a compressed chain starting here.
            if let Some(block) = mk.chain_first.filter(|_| upto >= 3) {
                if let (Some(chain), Some(&last)) = (idx.chains.get(&block), last_pos.get(&block)) {
                    if last > k {
                        out.push((item, m.clone(), meta));
                        let PhaseCache { base, own } = &mut *cache;
                        let block_msg = cached(&mut own.chains, &base.chains, block, || Arc::new(Message::user_text(chain.body.clone(), UserOrigin::Summary)));
                        out.push((None, block_msg, &Meta::User));
                        let (fi, fm, fmeta) = raw[last];
                        out.push((fi, self.chain_reply(&mut cache, chain, fm), fmeta));
                        k = last + 1;
                        continue;
                    }
                }
            }
            let i = item.expect("marked entries have an index");
            let rendered = self.phase_message(&mut cache, i, m, meta, mk, upto, |rec| grace > 0 && now_utg - utg_at[k] <= grace && rec.tool == QUERY_TOOL_NAME);
            out.push((item, rendered, meta));
            k += 1;
        }
        out
    }

    /// What phases 1 and 2 make of message `m` of entry `i`, marked `mk`: a pruned output its stub (unless
    /// protected, or `in_grace` says it is a recovery still in its grace window), a turn whose outputs
    /// are all closed its condensed form, a turn with purged calls its purged form; else `m` itself.
    #[allow(clippy::too_many_arguments)]
    fn phase_message(
        &self,
        cache: &mut PhaseCache,
        i: usize,
        m: &Arc<Message>,
        meta: &Meta,
        mk: &Marks,
        upto: u8,
        in_grace: impl FnOnce(&condense_events::Record) -> bool,
    ) -> Arc<Message> {
        let idx = &self.decisions;
        let PhaseCache { base, own } = cache;
        match meta {
            Meta::Result { .. } if upto >= 1 => match mk.result_ref.and_then(|r| idx.records.get(&r)) {
                Some(rec) if !rec.protected && idx.is_pruned(rec.ref_n) => {
                    if in_grace(rec) {
                        m.clone()
                    } else {
                        cached(&mut own.stubs, &base.stubs, rec.ref_n, || Arc::new(stub(idx, rec, m)))
                    }
                }
                _ => m.clone(),
            },
            Meta::Assistant { dedup: None, .. } if upto >= 2 => {
                let closed = !mk.call_refs.is_empty()
                    && mk.call_refs.iter().all(|r| idx.records.get(r).is_some_and(|rec| idx.outcomes.contains_key(&rec.batch)));
                if !closed && mk.purged == 0 {
                    m.clone()
                } else {
                    // The condensed form changes only when the turn closes or a purge arrives.
                    let id = self.items[i].id.as_str();
                    cached(&mut own.turns, &base.turns, (i, closed, mk.purged), || {
                        if closed {
                            Arc::new(condense_turn(idx, &self.config, id, &mk.call_refs, m))
                        } else {
                            Arc::new(purge(idx, id, m))
                        }
                    })
                }
            }
            _ => m.clone(),
        }
    }
}

/// A copy of an assistant message without its thinking blocks.
fn strip_thinking(m: &Arc<Message>) -> Arc<Message> {
    match &**m {
        Message::Assistant { content, model, stop, usage } if content.iter().any(|b| matches!(b, Block::Thinking { .. })) => {
            let content: Vec<Block> = content.iter().filter(|b| !matches!(b, Block::Thinking { .. })).cloned().collect();
            Arc::new(Message::Assistant { content, model: model.clone(), stop: *stop, usage: *usage })
        }
        _ => m.clone(),
    }
}

/// The stub that stands for a pruned output: same bytes on every render.
fn stub(idx: &Index, rec: &condense_events::Record, original: &Message) -> Message {
    let r = rec.ref_n;
    let recover = format!("{QUERY_TOOL_NAME}({{\"refs\":[\"t{r}\"]}})");
    let text = if let Some(sp) = idx.spills.get(&r) {
        format!(
            "[t{r} · {} · {} bytes, spilled to storage · head preview follows]\n{}\n[… rest of t{r} not shown; recover the full output with {recover}]",
            rec.tool, sp.bytes, sp.preview
        )
    } else if let Some(orig) = idx.aliases.get(&r) {
        format!("[t{r} · {} · identical to the output of t{orig}; recover it with {recover}]", rec.tool)
    } else if let Some(summary) = idx.summaries.get(&r).map(|s| &**s) {
        format!("{summary}\n[pruned; {QUERY_TOOL_NAME} t{r} for the original]")
    } else {
        format!("[t{r} · {} · pruned; recover it with {recover}]", rec.tool)
    };
    let (call_id, tool_name, is_error) = match original {
        Message::ToolResult { call_id, tool_name, is_error, .. } => (call_id.clone(), tool_name.clone(), *is_error),
        _ => (rec.call_id.clone(), rec.tool.clone(), rec.is_error),
    };
    Message::ToolResult { call_id, tool_name, content: vec![Block::Text { text }], is_error }
}

/// An assistant message whose calls' outputs are all in closed batches: thinking stripped (providers drop
/// the thinking of earlier turns anyway), purged calls marked, and every string value of an argument longer
/// than `condense_args_chars` replaced by a marker naming the call's ref (the original arguments come back
/// with `context_tree_query`).
fn condense_turn(idx: &Index, cfg: &PruneConfig, entry: &str, refs: &[u32], m: &Message) -> Message {
    let purged = purge(idx, entry, m);
    let Message::Assistant { content, model, stop, usage } = purged else { return purged };
    let content = content
        .into_iter()
        .filter(|b| !(cfg.thinking_strip && matches!(b, Block::Thinking { .. })))
        .map(|b| match b {
            Block::ToolCall { id, name, arguments } if cfg.condense_args_chars > 0 => {
                let r = refs.iter().copied().find(|r| idx.records.get(r).is_some_and(|rec| rec.call_id == id));
                let arguments = match r {
                    Some(r) if !idx.purged.contains_key(&(entry.to_string(), id.clone())) => {
                        crate::args::shorten(&arguments, cfg.condense_args_chars as usize, r)
                    }
                    _ => arguments,
                };
                Block::ToolCall { id, name, arguments }
            }
            other => other,
        })
        .collect();
    Message::Assistant { content, model, stop, usage }
}

/// A copy of an assistant message whose purged calls show a marker instead of their arguments.
fn purge(idx: &Index, entry: &str, m: &Message) -> Message {
    let Message::Assistant { content, model, stop, usage } = m else { return m.clone() };
    let content = content
        .iter()
        .map(|b| match b {
            Block::ToolCall { id, name, .. } if idx.purged.contains_key(&(entry.to_string(), id.clone())) => {
                let chars = idx.purged[&(entry.to_string(), id.clone())];
                Block::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: format!("{{\"purged\":\"arguments of a failed call ({chars} chars) removed\"}}"),
                }
            }
            other => other.clone(),
        })
        .collect();
    Message::Assistant { content, model: model.clone(), stop: *stop, usage: *usage }
}

fn synthetic(id: &str, name: &str) -> Arc<Message> {
    Arc::new(Message::ToolResult {
        call_id: id.to_string(),
        tool_name: name.to_string(),
        content: vec![Block::Text { text: SYNTHETIC_RESULT_TEXT.to_string() }],
        is_error: true,
    })
}

fn repair(raw: &[(&Arc<Message>, &Meta)], ids: usize) -> Incremental {
    let mut report = RenderReport::default();
    // Pass 1: bind each result to the newest open call with its id. `open[id]` is 1 + the slot of that
    // call in `answers`; `answers[slot]` is 1 + the position of its result.
    let mut open = vec![0u32; ids];
    let mut answers: Vec<u32> = Vec::new();
    for (pos, (m, meta)) in raw.iter().enumerate() {
        match meta {
            Meta::Assistant { calls, .. } => {
                for &c in calls.iter() {
                    answers.push(0);
                    open[c as usize] = answers.len() as u32;
                }
            }
            Meta::Result { call } => match std::mem::take(&mut open[*call as usize]) {
                0 => {
                    if let Message::ToolResult { call_id, .. } = &***m {
                        report.orphan_results.push(call_id.clone());
                    }
                }
                slot => answers[slot as usize - 1] = pos as u32 + 1,
            },
            Meta::User => {}
        }
    }
    // Pass 2: emit, placing results right after their calls.
    let mut out: Vec<Arc<Message>> = Vec::with_capacity(raw.len());
    let mut slot = 0usize;
    // Where each call's synthetic result landed in `out`, for calls still open at the end.
    let mut synthetic_at: Vec<usize> = vec![usize::MAX; answers.len()];
    for (m, meta) in raw {
        match meta {
            Meta::Assistant { calls, empty, dedup } => {
                let base = slot;
                slot += calls.len();
                if *empty {
                    report.empty_assistants += 1;
                    continue;
                }
                let m = dedup.as_ref().unwrap_or(m);
                if dedup.is_some() {
                    report.duplicate_calls += 1;
                }
                out.push(m.clone());
                if calls.is_empty() {
                    continue;
                }
                for (k, (id, name, _)) in m.tool_calls().enumerate() {
                    match answers[base + k] {
                        0 => {
                            report.synthetic_results.push(id.to_string());
                            synthetic_at[base + k] = out.len();
                            out.push(synthetic(id, name));
                        }
                        r => out.push(raw[r as usize - 1].0.clone()),
                    }
                }
            }
            Meta::Result { .. } => {}
            Meta::User => out.push((*m).clone()),
        }
    }
    let mut pending = HashMap::default();
    for (c, &slot) in open.iter().enumerate() {
        if slot != 0 && synthetic_at[slot as usize - 1] != usize::MAX {
            pending.insert(c as u32, synthetic_at[slot as usize - 1]);
        }
    }
    Incremental { valid: true, leaf: None, out: Arc::new(out), report, pending, same: 0 }
}

/// Entry ids and messages of the active branch, root first (see [`Projection::branch_view`]).
pub struct BranchView<'a> {
    items: &'a [Item],
    ids: &'a HashMap<String, usize>,
    path: Arc<Vec<usize>>,
}

impl<'a> BranchView<'a> {
    /// Messages on the branch.
    pub fn len(&self) -> usize {
        self.path.len()
    }

    /// Whether the branch holds no message.
    pub fn is_empty(&self) -> bool {
        self.path.is_empty()
    }

    /// The `i`th message and its entry id (panics past the end, as indexing does).
    pub fn at(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        let it = &self.items[self.path[i]];
        match &it.node {
            Node::Message(m, _) => (it.id.as_str(), m),
            _ => unreachable!("the message path holds message entries only"),
        }
    }

    /// The entry (its index in the tree) of the `i`th message.
    fn item(&self, i: usize) -> usize {
        self.path[i]
    }

    /// Where the message of entry `id` sits on the branch, in constant time (`None` when it is not on it).
    pub fn position(&self, id: &str) -> Option<usize> {
        let ix = *self.ids.get(id)?;
        let pos = self.items.get(ix)?.messages_before as usize;
        (self.path.get(pos) == Some(&ix)).then_some(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::{Entry, SourceEvent, UserOrigin};

    fn prompts(n: usize) -> Projection {
        let mut p = Projection::new();
        for i in 0..n {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            let m = Message::user_text(format!("prompt {i}"), UserOrigin::Prompt);
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry: Entry::Message(m) }));
        }
        p
    }

    /// `render_since` says how many leading messages the render before it handed out too: all of them
    /// when the branch only grew, as far as the first one a later result replaced, none after a branch
    /// move (the render is made again).
    #[test]
    fn a_render_says_how_much_of_the_last_one_it_kept() {
        let mut p = prompts(3);
        let (first, same) = p.render_since();
        assert_eq!((first.messages.len(), same), (3, 0));
        let call = Message::Assistant {
            content: vec![Block::ToolCall { id: "c1".into(), name: "bash".into(), arguments: "{}".into() }],
            model: None,
            stop: None,
            usage: None,
        };
        p.apply(4, &Event::Source(SourceEvent::EntryAppended { id: "a".into(), parent: Some("e2".into()), entry: Entry::Message(call) }));
        drop(first);
        let (grown, same) = p.render_since();
        // The call and the synthetic result standing in for its missing output.
        assert_eq!((grown.messages.len(), same), (5, 3));
        let result = Message::ToolResult { call_id: "c1".into(), tool_name: "bash".into(), content: vec![Block::Text { text: "ok".into() }], is_error: false };
        p.apply(5, &Event::Source(SourceEvent::EntryAppended { id: "r".into(), parent: Some("a".into()), entry: Entry::Message(result) }));
        let (answered, same) = p.render_since();
        assert_eq!((answered.messages.len(), same), (5, 4), "the real result took the synthetic one's place");
        assert!(answered.messages[..4].iter().zip(grown.messages.iter()).all(|(a, b)| Arc::ptr_eq(a, b)));
        drop((grown, answered));
        p.apply(6, &Event::Source(SourceEvent::LeafMoved { leaf: Some("e1".into()) }));
        assert_eq!(p.render_since().1, 0);
        assert_eq!(p.render_since().1, 2, "nothing changed since");
    }

    /// A projection given another's messages (`push_message`) renders what folding the events would, and
    /// holds those messages, not copies of them.
    #[test]
    fn a_message_pushed_shared_renders_as_its_event_and_is_not_copied() {
        let p = prompts(3);
        let mut q = Projection::new();
        for i in 0..3 {
            let id = format!("e{i}");
            let m = p.entry_message(&id).expect("folded").clone();
            q.push_message(i as u64 + 1, id, (i > 0).then(|| format!("e{}", i - 1)).as_deref(), m);
        }
        let (a, b) = (p.render().messages, q.render().messages);
        assert_eq!(a, b);
        assert!(a.iter().zip(b.iter()).all(|(x, y)| Arc::ptr_eq(x, y)), "the messages are shared");
        assert_eq!((q.seq(), q.branch_entries().len()), (3, 3));
    }

    #[test]
    fn the_live_render_stays_counted_when_the_token_cache_is_bounded() {
        let p = prompts(8);
        let rendered = p.render();
        for m in rendered.messages.iter() {
            p.estimate(m);
        }
        assert_eq!(p.tokens.lock().unwrap().len(), 8);
        // Messages counted and dropped push the cache over its bound: what the live render still holds stays.
        for i in 0..3000 {
            p.estimate(&Arc::new(Message::user_text(format!("gone {i}"), UserOrigin::Prompt)));
        }
        let cache = p.tokens.lock().unwrap();
        assert!(cache.len() < 2000, "the bound holds: {}", cache.len());
        for m in rendered.messages.iter() {
            assert!(cache.contains_key(&(Arc::as_ptr(m) as usize)), "a live message was forgotten");
        }
    }

    /// A batch closed on a projection with a current render: the kept render takes the change in place
    /// and is the full render, the closed output's stub and its turn's condensed form in place; so for a
    /// compressed chain; a projection with no current render leaves the next render to start over.
    #[test]
    fn a_render_made_from_the_last_one_is_the_full_render() {
        use condense_events::{BatchOutcome, Block, DecisionEvent, Record};
        let mut p = Projection::new();
        let mut seq = 0u64;
        let mut put = |p: &mut Projection, e: Event| {
            seq += 1;
            p.apply(seq, &e);
        };
        let call = |id: &str| Message::Assistant {
            content: vec![Block::ToolCall { id: id.into(), name: "bash".into(), arguments: format!("{{\"command\":\"{}\"}}", "x".repeat(120)) }],
            model: None,
            stop: None,
            usage: None,
        };
        let result = |id: &str| Message::ToolResult { call_id: id.into(), tool_name: "bash".into(), content: vec![Block::Text { text: "line\n".repeat(400) }], is_error: false };
        let msgs = [
            Message::user_text("go", UserOrigin::Prompt),
            call("c1"),
            result("c1"),
            call("c2"),
            result("c2"),
            Message::Assistant { content: vec![Block::Text { text: "done".into() }], model: None, stop: None, usage: None },
        ];
        for (i, m) in msgs.into_iter().enumerate() {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            put(&mut p, Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry: Entry::Message(m) }));
        }
        for (n, (entry, call_entry, id)) in [("e2", "e1", "c1"), ("e4", "e3", "c2")].into_iter().enumerate() {
            let rec = Record {
                ref_n: n as u32 + 1,
                batch: n as u32 + 1,
                entry: entry.into(),
                call_entry: call_entry.into(),
                call_id: id.into(),
                occurrence: format!("{id}@{entry}"),
                tool: "bash".into(),
                arguments: "{}".into(),
                is_error: false,
                chars: 2000,
                hash: format!("h{n}"),
                turn: n as u32,
                utg: 1,
                protected: false,
            };
            put(&mut p, Event::Decision(DecisionEvent::OutputCaptured(rec)));
        }
        let before = p.render().messages;
        let mut after = p.clone();
        after.apply(seq + 1, &Event::Decision(DecisionEvent::BatchClosed { batch: 1, refs: vec![1], outcome: BatchOutcome::Summarized, summaries: vec![(1, "400 lines of `line`".into())] }));
        let kept = |p: &Projection| p.inc.lock().unwrap().valid;
        assert!(kept(&after), "the batch close was taken in place");
        let made = after.render().messages;
        assert_eq!(made, after.render_full_now().messages);
        let changed: Vec<usize> = (0..made.len()).filter(|&k| made[k] != before[k]).collect();
        assert_eq!(changed, vec![1, 2], "the closed call's turn and its output, nothing else");
        assert!(made[2].text().contains("400 lines of `line`"), "{:?}", made[2]);
        // The chain compressed: its prompt, its block and its reply stand for it.
        let mut chained = after.clone();
        chained.apply(seq + 2, &Event::Decision(DecisionEvent::ChainCompressed { block: 1, first: "e0".into(), last: "e5".into(), refs: vec![1, 2], body: "[b1: 2 calls]".into() }));
        assert!(kept(&chained), "the chain was taken in place");
        let made = chained.render().messages;
        assert_eq!(made, chained.render_full_now().messages);
        assert_eq!(made.iter().map(|m| m.text()).collect::<Vec<_>>(), vec!["go", "[b1: 2 calls]", "done"]);
        // No current render: the decision leaves the next render to start over, and it renders the same.
        let mut stale = p.clone();
        stale.inc.get_mut().unwrap().valid = false;
        stale.apply(seq + 1, &Event::Decision(DecisionEvent::BatchClosed { batch: 2, refs: vec![2], outcome: BatchOutcome::Summarized, summaries: vec![(2, "s".into())] }));
        assert!(!kept(&stale), "the last render is stale");
        assert_eq!(stale.render().messages, stale.render_full_now().messages);
    }

    /// The branch view, kept and extended from one leaf to the next, lists what `branch_entries` builds
    /// from scratch, through forks back to older entries, markers and host compactions on the path, and
    /// copies of the projection holding an older view; every position it reports is where the entry sits.
    #[test]
    fn the_kept_branch_view_is_the_branch_built_from_scratch() {
        let mut p = Projection::new();
        let mut held = Vec::new();
        let mut forks = 0;
        let mut state = 7u64;
        for i in 0..400usize {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (state >> 33) as usize;
            // Mostly the leaf, sometimes an older entry (a fork), sometimes no parent (a new root).
            let parent = match (i, r % 10) {
                (0, _) | (_, 0) if r.is_multiple_of(7) || i == 0 => None,
                (_, 1 | 2) => Some(format!("e{}", r % i)),
                _ => p.leaf_id().map(str::to_string),
            };
            let entry = match r % 13 {
                0 => Entry::Marker { kind: "label".into() },
                1 => Entry::HostCompaction { summary: None, first_kept: None, replacement: Vec::new(), tokens_before: None },
                _ => Entry::Message(Message::user_text(format!("m{i}"), UserOrigin::Prompt)),
            };
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry }));
            let view = p.branch_view();
            let built = p.branch_entries();
            // Both kept lists against a walk from the leaf up.
            let mut walked: Vec<usize> = p.ancestors().collect();
            walked.reverse();
            assert_eq!(*p.path(), walked, "after e{i}");
            let messages: Vec<(&str, &Arc<Message>)> = walked
                .iter()
                .filter_map(|&k| match &p.items[k].node {
                    Node::Message(m, _) => Some((p.items[k].id.as_str(), m)),
                    _ => None,
                })
                .collect();
            assert_eq!(built, messages, "after e{i}");
            assert_eq!(view.len(), built.len(), "after e{i}");
            for (k, (id, m)) in built.iter().enumerate() {
                assert_eq!(view.at(k), (*id, *m), "after e{i}, position {k}");
                assert_eq!(view.position(id), Some(k));
            }
            let on: std::collections::BTreeSet<&str> = built.iter().map(|(id, _)| *id).collect();
            let off = (0..=i).map(|j| format!("e{j}")).filter(|id| !on.contains(id.as_str())).collect::<Vec<_>>();
            assert!(off.iter().all(|id| view.position(id).is_none()), "after e{i}");
            forks += usize::from(off.len() > i / 13 + 3);
            if i % 50 == 0 {
                held.push(p.clone());
            }
        }
        for copy in &held {
            let view = copy.branch_view();
            let built = copy.branch_entries();
            assert_eq!((0..view.len()).map(|k| view.at(k)).collect::<Vec<_>>(), built);
        }
        assert_eq!(p.branch_view().position("nowhere"), None);
        assert!(forks > 100, "the walk left the branch often: {forks}");
    }
}
