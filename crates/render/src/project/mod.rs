//! Folding events into the session tree and rendering the active branch.

use condense_events::{Block, Context, DecisionEvent, Entry, Event, Message, PruneConfig, Seq, SourceEvent, UserOrigin, QUERY_TOOL_NAME};
use condense_index::Index;
use std::collections::{BTreeMap, BTreeSet};
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
    /// An assistant message that ended in a provider error or was aborted: the host does not replay it
    /// (pi leaves such turns out of every request), so neither does the render, and its calls open
    /// nothing (results answering them are orphans).
    Failed,
}

#[derive(Debug, Clone)]
enum Node {
    Message(Arc<Message>, Meta),
    /// A host compaction (rare: boxed, so the entry of every message stays small).
    Compaction(Box<Compaction>),
    Marker,
}

#[derive(Debug, Clone)]
struct Compaction {
    summary: Option<Arc<Message>>,
    first_kept: Option<String>,
    replacement: Vec<(Arc<Message>, Meta)>,
}

#[derive(Debug, Clone)]
struct Item {
    /// The entry's id, the one copy the index shares.
    id: Arc<str>,
    parent: Option<u32>,
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
    /// Unanswered calls: interned call id → position of its synthetic result in `out` and of its id in
    /// the report's `synthetic_results`.
    pending: HashMap<u32, (usize, usize)>,
    /// Places in the report's `synthetic_results` of calls answered since, taken out when the render is
    /// next read ([`Incremental::settle`]).
    answered: Vec<usize>,
    /// How many leading messages of `out` are those the last `render` handed out (a push extends `out`
    /// without lowering it; replacing or splicing a message lowers it to that message's position).
    same: usize,
    /// Messages decisions replaced and `out` does not show yet, by entry index: the message `out` holds
    /// for the entry and the one it renders as now. Taken in by one pass over `out` when it is next read
    /// ([`Incremental::settle`]): a pass per decision cost the length of the render each time (33,000
    /// batches closing on a first request of 100,000 messages scanned 1.7 billion of them).
    replace: BTreeMap<usize, (Arc<Message>, Arc<Message>)>,
}

/// The entries by id: the place of each entry in the tree, its id read from the entry itself (a map
/// keyed by a second pointer to the id took 33 bytes an entry; this takes about 6). Lookups only.
#[derive(Debug, Clone, Default)]
struct Ids(hashbrown::HashTable<u32>);

fn hash_id(id: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(id)
}

impl Ids {
    /// The place of entry `id` in `items`.
    fn get(&self, items: &[Item], id: &str) -> Option<usize> {
        self.0.find(hash_id(id), |&i| &*items[i as usize].id == id).map(|&i| i as usize)
    }

    /// Takes the entry at place `at` of `items` in; an id given before points at its newest entry from now on.
    fn insert(&mut self, items: &[Item], at: usize) {
        let id = &*items[at].id;
        let place = u32::try_from(at).expect("fewer than 2^32 entries");
        match self.0.entry(hash_id(id), |&i| &*items[i as usize].id == id, hash_at(items)) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => *slot.get_mut() = place,
            hashbrown::hash_table::Entry::Vacant(slot) => drop(slot.insert(place)),
        }
    }

    /// Room for `more` entries.
    fn reserve(&mut self, items: &[Item], more: usize) {
        self.0.reserve(more, hash_at(items));
    }
}

/// The hash of the id of the entry at a place of `items` (what the table rehashes by when it grows).
fn hash_at(items: &[Item]) -> impl Fn(&u32) -> u64 + '_ {
    move |&i| hash_id(&items[i as usize].id)
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
    index: Arc<Ids>,
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
    // Whether a checkpoint failed since the last overflow (the request it answered went unsent).
    overflow_failed: bool,
    // The last provider usage the host reported, with the leaf entry at that time; `None` once a decision
    // changed the context since (the usage then describes a request that will not be sent again).
    usage_anchor: Option<(condense_events::Usage, Option<usize>)>,
    // The leaf when the model last changed: a model transition lasts until an assistant message follows.
    model_change_leaf: Option<Option<usize>>,
    // Estimated tokens each request carries besides the messages (system prompt, tool declarations).
    overhead: u64,
    // What the entries hold, about ([`Projection::weight`]).
    weight: u64,
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

/// The block message compressed chain `chain` renders as, built once and shared by every render.
fn chain_block(cache: &mut PhaseCache, chain: &condense_index::Chain) -> Arc<Message> {
    let PhaseCache { base, own } = cache;
    let c = &chain.compressed;
    cached(&mut own.chains, &base.chains, c.block, || Arc::new(Message::user_text(c.body.clone(), UserOrigin::Summary)))
}

/// What [`Projection::weight`] counts for an entry besides its message's bytes: a warm session of
/// 100,000 one-letter messages (its entries, messages, index, token cache, render and pipeline stages)
/// took about 400–450 bytes of memory a message.
pub const ENTRY_WEIGHT: u64 = 512;

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
            overflow_failed: self.overflow_failed,
            usage_anchor: self.usage_anchor,
            model_change_leaf: self.model_change_leaf,
            overhead: self.overhead,
            weight: self.weight,
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
    /// Assistant messages left out because they ended in a provider error or were aborted (the host
    /// does not replay them).
    pub failed_turns: usize,
    /// Assistant messages rendered without a repeated tool-call id (the first call with the id stays).
    pub duplicate_calls: usize,
}

impl RenderReport {
    /// Whether rendering repaired nothing (every field at its default).
    pub fn is_clean(&self) -> bool {
        *self == RenderReport::default()
    }
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

mod branch;
mod fold;
pub use fold::room_to_reserve;
mod measure;
mod patch;
mod phases;

pub use branch::BranchView;

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

    /// The pruning decisions folded so far.
    pub fn index(&self) -> &Index {
        &self.decisions
    }

    /// Whether `m` is the summary message of a checkpoint as the render places it (the same message, not
    /// a look-alike text).
    pub fn is_checkpoint_summary(&self, m: &Arc<Message>) -> bool {
        self.checkpoint_msgs.values().any(|c| Arc::ptr_eq(c, m))
    }

    /// About how many bytes of memory the projection holds: its messages' bytes ([`Message::bytes`]) and
    /// [`ENTRY_WEIGHT`] for each entry (the entry, its message, its index and cache slots, its share of the
    /// render). What a store's warm projections may hold together is bounded by it
    /// (`condense_engine::StoreOptions::warm_bytes`).
    pub fn weight(&self) -> u64 {
        self.weight
    }

    /// The pruning configuration in force.
    pub fn config(&self) -> &PruneConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::{Entry, SourceEvent, UserOrigin};

    fn prompts(n: usize) -> Projection {
        prompts_of(n, "")
    }

    /// [`prompts`], each prompt's text followed by `tail`.
    fn prompts_of(n: usize, tail: &str) -> Projection {
        let mut p = Projection::new();
        for i in 0..n {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            let m = Message::user_text(format!("prompt {i}{tail}"), UserOrigin::Prompt);
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry: Entry::Message(m) }));
        }
        p
    }

    /// Room for a request's entries is taken once, exactly, and the reply after them fits in what is left:
    /// asking for `n + 16` again at the reply doubled the room of 100,000 entries for one more.
    #[test]
    fn room_for_many_entries_is_taken_once_and_the_reply_does_not_double_it() {
        let mut p = Projection::new();
        p.reserve_entries(10_000);
        let room = p.items.capacity();
        assert!((10_000..=10_016).contains(&room), "exactly the entries and a few: {room}");
        for i in 0..10_000 {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            let m = Message::user_text("x", UserOrigin::Prompt);
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry: Entry::Message(m) }));
        }
        p.reserve_entries(1);
        assert_eq!(p.items.capacity(), room, "the reply fits in the few left");
        // Past the few, the room grows by an eighth, not by doubling.
        for _ in 0..17 {
            p.reserve_entries(1);
            let n = p.items.len();
            let m = Message::user_text("y", UserOrigin::Prompt);
            p.apply(n as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{n}"), parent: Some(format!("e{}", n - 1)), entry: Entry::Message(m) }));
        }
        let grown = p.items.capacity();
        assert!(grown > room && grown <= room + room / 8 + 32, "{room} -> {grown}");
    }

    /// Entries are found by id through the places kept for them, each read from its entry: thousands of
    /// them (the table grows past its first room several times), and an id given twice names its newest
    /// entry, as the log says it does.
    #[test]
    fn entries_are_found_by_id_and_a_repeated_id_names_the_newest() {
        let mut p = prompts(5_000);
        assert_eq!((p.position("e0"), p.position("e4321"), p.position("e4999")), (Some(0), Some(4321), Some(4999)));
        assert_eq!((p.position("e5000"), p.has_entry("x")), (None, false));
        let again = Message::user_text("again", UserOrigin::Prompt);
        p.apply(5_001, &Event::Source(SourceEvent::EntryAppended { id: "e7".into(), parent: Some("e4999".into()), entry: Entry::Message(again) }));
        assert_eq!(p.position("e7"), Some(5_000));
        assert!(p.on_path("e7") && p.on_path("e4999"));
        assert_eq!(p.render().messages.last().map(|m| m.text()), Some("again".to_string()));
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
            content: vec![Block::tool_call("c1".into(), "bash".into(), "{}".into())],
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
        let long = " and more".repeat(40);
        let p = prompts_of(8, &long);
        let rendered = p.render();
        for m in rendered.messages.iter() {
            p.estimate(m);
        }
        assert_eq!(p.tokens.lock().unwrap().len(), 8);
        // Messages counted and dropped push the cache over its bound: what the live render still holds stays.
        for i in 0..3000 {
            p.estimate(&Arc::new(Message::user_text(format!("gone {i}{long}"), UserOrigin::Prompt)));
        }
        let cache = p.tokens.lock().unwrap();
        assert!(cache.len() < 2000, "the bound holds: {}", cache.len());
        for m in rendered.messages.iter() {
            assert!(cache.contains_key(&(Arc::as_ptr(m) as usize)), "a live message was forgotten");
        }
    }

    /// A short message is counted each time it is asked for, not remembered: the same count, and no
    /// entry (a request of 100,000 one-line messages kept 3 MB of them).
    #[test]
    fn short_messages_are_counted_without_being_remembered() {
        let p = prompts(8);
        let rendered = p.render();
        let counts: Vec<u64> = rendered.messages.iter().map(|m| p.estimate(m)).collect();
        assert_eq!(counts, rendered.messages.iter().map(|m| condense_tokens::estimate(m)).collect::<Vec<_>>());
        // "prompt N": 8 characters, 2 tokens by pi's rule.
        assert_eq!(counts, [2; 8]);
        assert!(p.tokens.lock().unwrap().is_empty());
    }

    /// A message given up to the projection is kept with no spare room: a list of blocks built by pushing
    /// holds room for four (a message of one tool call took 288 bytes for its block, not 72).
    #[test]
    fn messages_given_up_are_kept_without_spare_room() {
        let mut content = Vec::new();
        content.push(Block::tool_call("c1".into(), "bash".into(), String::with_capacity(64) + "{}"));
        assert!(content.capacity() > 1);
        let m = Message::Assistant { content, model: None, stop: None, usage: None };
        let expected = m.clone();
        let mut p = Projection::new();
        p.apply_owned(1, Event::Source(SourceEvent::EntryAppended { id: "e0".into(), parent: None, entry: Entry::Message(m) }));
        let (_, kept) = p.entry("e0").expect("the entry");
        assert_eq!(**kept, expected);
        assert_eq!(kept.content().len(), 1);
        let Message::Assistant { content, .. } = &**kept else { panic!("{kept:?}") };
        assert_eq!(content.capacity(), 1);
        let Block::ToolCall(c) = &content[0] else { panic!("{content:?}") };
        let arguments = &c.arguments;
        assert_eq!(arguments.capacity(), 2);
    }

    /// The capture of a bash call's output `entry` (its call in `call_entry`), ref and batch `n`.
    fn captured(n: u32, entry: &str, call_entry: &str, call_id: &str, chars: u64, turn: u32, utg: u32) -> Event {
        Event::Decision(condense_events::DecisionEvent::OutputCaptured(Box::new(condense_events::Record {
            ref_n: n,
            batch: n,
            entry: entry.into(),
            call_entry: call_entry.into(),
            call_id: call_id.into(),
            occurrence: format!("{call_id}@{entry}"),
            tool: "bash".into(),
            arguments: "{}".into(),
            is_error: false,
            chars,
            hash: format!("h{}", n - 1),
            turn,
            utg,
            protected: false,
        })))
    }

    /// Applies events to a projection in order, each at the next seq.
    fn in_order() -> impl FnMut(&mut Projection, Event) {
        let mut seq = 0u64;
        move |p, e| {
            seq += 1;
            p.apply(seq, &e);
        }
    }

    /// Parallel calls answered one by one while the render is kept: each render, its report included (the
    /// synthetic results of the calls still open), is the full render's.
    #[test]
    fn parallel_calls_answered_in_any_order_render_as_the_full_render() {
        use condense_events::Block;
        let mut p = Projection::new();
        let mut apply = in_order();
        let mut parent: Option<String> = None;
        let mut put = |p: &mut Projection, id: &str, m: Message| {
            apply(p, Event::Source(SourceEvent::EntryAppended { id: id.into(), parent: parent.replace(id.into()), entry: Entry::Message(m) }));
        };
        let calls = |ids: &[&str]| Message::Assistant {
            content: ids.iter().map(|c| Block::tool_call((*c).into(), "bash".into(), "{}".into())).collect(),
            model: None,
            stop: None,
            usage: None,
        };
        let result = |c: &str| Message::ToolResult { call_id: c.into(), tool_name: "bash".into(), content: vec![Block::Text { text: format!("out {c}") }], is_error: false };
        let same = |p: &Projection| {
            let (kept, full) = (p.render(), p.render_full_now());
            assert_eq!((&kept.messages, &kept.report), (&full.messages, &full.report));
            kept.report.synthetic_results
        };
        put(&mut p, "u", Message::user_text("go", UserOrigin::Prompt));
        put(&mut p, "a1", calls(&["c1", "c2", "c3", "c4"]));
        assert_eq!(same(&p), ["c1", "c2", "c3", "c4"]);
        put(&mut p, "r3", result("c3"));
        put(&mut p, "r1", result("c1"));
        assert_eq!(same(&p), ["c2", "c4"]);
        // More calls while two are open; one of them answered before the next read.
        put(&mut p, "a2", calls(&["c5", "c6"]));
        put(&mut p, "r6", result("c6"));
        assert_eq!(same(&p), ["c2", "c4", "c5"]);
        put(&mut p, "r4", result("c4"));
        put(&mut p, "r2", result("c2"));
        put(&mut p, "r5", result("c5"));
        assert_eq!(same(&p), Vec::<String>::new());
    }

    /// A long history whose old outputs close one batch each, then chains compressed far back and near
    /// the end: the replacements wait for the next read of the render, a chain far back leaves the next
    /// render to start over (splicing each in turn moved the rest of the render every time), and every
    /// render is the full render (checked after each decision as well, in debug builds).
    #[test]
    fn many_decisions_on_a_long_history_render_as_the_full_render() {
        use condense_events::{BatchOutcome, Block, DecisionEvent};
        let mut p = Projection::new();
        let mut put = in_order();
        let turns = 1200;
        let mut parent: Option<String> = None;
        for t in 0..turns {
            let id = format!("c{t}");
            let msgs = [
                Message::user_text(format!("task {t}"), UserOrigin::Prompt),
                Message::Assistant { content: vec![Block::tool_call(id.clone(), "bash".into(), format!("{{\"command\":\"cat f{t}\"}}"))], model: None, stop: None, usage: None },
                Message::ToolResult { call_id: id.clone(), tool_name: "bash".into(), content: vec![Block::Text { text: format!("line {t}\n").repeat(300) }], is_error: false },
                Message::Assistant { content: vec![Block::Text { text: format!("done {t}") }], model: None, stop: None, usage: None },
            ];
            for (k, m) in msgs.into_iter().enumerate() {
                let e = format!("t{t}e{k}");
                put(&mut p, Event::Source(SourceEvent::EntryAppended { id: e.clone(), parent: parent.clone(), entry: Entry::Message(m) }));
                parent = Some(e);
            }
            put(&mut p, captured(t + 1, &format!("t{t}e2"), &format!("t{t}e1"), &id, 2400, t, t + 1));
        }
        let kept = |p: &Projection| p.inc.lock().unwrap().valid;
        let pending = |p: &Projection| p.inc.lock().unwrap().replace.len();
        assert_eq!(p.render().messages.len(), 4 * turns as usize);
        // Every output closes in its own batch, oldest first: taken in place, left pending until read.
        for t in 0..turns {
            put(&mut p, Event::Decision(DecisionEvent::BatchClosed { batch: t + 1, refs: vec![t + 1], outcome: BatchOutcome::Summarized, summaries: vec![(t + 1, format!("300 lines of output {t}"))] }));
        }
        assert!(kept(&p), "the batches were taken in place");
        assert!(pending(&p) > 0, "the replacements wait for the next read");
        let chain = |t: u32| Event::Decision(DecisionEvent::ChainCompressed(Box::new(condense_events::ChainCompressed { block: t + 1, first: format!("t{t}e0"), last: format!("t{t}e3"), refs: vec![t + 1], body: format!("[b{t}: cat f{t}]") })));
        // A chain near the end, over a turn whose output waits to be replaced: spliced in place.
        let mut near = p.clone();
        put(&mut near, chain(turns - 1));
        assert!(kept(&near), "a chain near the end is spliced in place");
        let made = near.render().messages;
        assert_eq!(made, near.render_full_now().messages);
        assert!(made.iter().any(|m| m.text() == format!("[b{}: cat f{}]", turns - 1, turns - 1)));
        assert_eq!(pending(&near), 0, "a read takes every replacement in");
        // The oldest chains, further back than a splice reaches: the next render starts over, and is the same.
        let mut far = p.clone();
        for t in 0..3 {
            put(&mut far, chain(t));
        }
        assert!(!kept(&far), "a chain far back leaves the next render to start over");
        let made = far.render().messages;
        assert_eq!(made, far.render_full_now().messages);
        assert_eq!(made.len(), 4 * turns as usize - 3);
        assert!(made[1].text().starts_with("[b0: cat f0]"), "{:?}", made[1]);
        // Pending replacements read by the render itself, with no decision after them.
        let made = p.render().messages;
        assert_eq!(made, p.render_full_now().messages);
        assert!(made[2].text().contains("300 lines of output 0"), "{:?}", made[2]);
    }

    /// A batch closed on a projection with a current render: the kept render takes the change in place
    /// and is the full render, the closed output's stub and its turn's condensed form in place; so for a
    /// compressed chain; a projection with no current render leaves the next render to start over.
    #[test]
    fn a_render_made_from_the_last_one_is_the_full_render() {
        use condense_events::{BatchOutcome, Block, DecisionEvent};
        let mut p = Projection::new();
        let mut seq = 0u64;
        let mut put = |p: &mut Projection, e: Event| {
            seq += 1;
            p.apply(seq, &e);
        };
        let call = |id: &str| Message::Assistant {
            content: vec![Block::tool_call(id.into(), "bash".into(), format!("{{\"command\":\"{}\"}}", "x".repeat(120)))],
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
            put(&mut p, captured(n as u32 + 1, entry, call_entry, id, 2000, n as u32, 1));
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
        chained.apply(seq + 2, &Event::Decision(DecisionEvent::ChainCompressed(Box::new(condense_events::ChainCompressed { block: 1, first: "e0".into(), last: "e5".into(), refs: vec![1, 2], body: "[b1: 2 calls]".into() }))));
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
                    Node::Message(m, _) => Some((&*p.items[k].id, m)),
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
