//! The conversation as the client sees it, over the session tree condense records.
//!
//! A client resends its whole history with every request. To record only what is new, serve matches that
//! history against the tree of what it holds. The client's view differs from the log in one way: when the
//! model called one of condense's own tools, serve answered it and continued the request, so the log holds
//! `assistant (condense call) → result → assistant …` where the client saw one assistant message with the
//! condense calls left out. A [`Track`] folds the log's tree into these *visible* nodes, each with a
//! fingerprint of what the client saw, and matches a request against them. It is rebuilt from the
//! projection when serve starts, and kept up to date as serve appends.

use condense_events::{Block, Message};
use condense_render::Projection;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A fingerprint of a message as the client sees it.
pub type Fp = [u8; 16];

/// What the client sees of a message: its role, its text (text blocks joined, white space left out, since
/// clients split, join and trim text blocks when they send them back), the tool calls it knows (condense's
/// own left out) and its images. Thinking and provider metadata are left out: clients drop or rewrite them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Visible {
    role: &'static str,
    text: Vec<u8>,
    calls: Vec<(String, String, String)>,
    result: Option<String>,
    images: Vec<[u8; 32]>,
}

impl Visible {
    /// The visible part of `m`; `internal` tells condense's own tool names.
    pub fn of(m: &Message, internal: &dyn Fn(&str) -> bool) -> Visible {
        let mut v = Visible { role: m.role(), ..Visible::default() };
        for b in m.content() {
            match b {
                // ASCII white space is dropped byte by byte (fast); other white space is rare in what clients
                // rewrite and stays.
                Block::Text { text } => v.text.extend(text.bytes().filter(|b| !b.is_ascii_whitespace())),
                Block::ToolCall(c) if !internal(&c.name) => {
                    v.calls.push((c.id.clone(), c.name.clone(), canonical(&c.arguments)));
                }
                Block::Image(i) => v.images.push(*blake3::hash(i.data.as_bytes()).as_bytes()),
                Block::Opaque(o) => v.text.extend(o.json.bytes().filter(|b| !b.is_ascii_whitespace())),
                _ => {}
            }
        }
        if let Message::ToolResult { call_id, .. } = m {
            v.result = Some(call_id.clone());
        }
        v
    }

    /// This message followed by the continuation `next` (the same assistant reply to the client).
    fn extend(&self, next: &Visible) -> Visible {
        let mut v = self.clone();
        v.text.extend_from_slice(&next.text);
        v.calls.extend(next.calls.iter().cloned());
        v.images.extend(next.images.iter().cloned());
        v
    }

    /// The fingerprint.
    pub fn fp(&self) -> Fp {
        let mut h = blake3::Hasher::new();
        for part in [self.role.as_bytes(), &self.text, self.result.as_deref().unwrap_or("\u{0}").as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for (id, name, args) in &self.calls {
            for part in [id, name, args] {
                h.update(&(part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        for i in &self.images {
            h.update(i);
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out
    }
}

/// A fast key of a message exactly as it stands (every block, thinking included, unnormalized): two
/// messages with the same key have the same fingerprint too, so a client message whose key a node has
/// seen before matches without the normalizing pass.
pub fn exact(m: &Message) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    let mut put = |b: &[u8]| {
        h.write_usize(b.len());
        h.write(b);
    };
    put(m.role().as_bytes());
    if let Message::ToolResult { call_id, is_error, .. } = m {
        put(call_id.as_bytes());
        put(&[u8::from(*is_error)]);
    }
    for b in m.content() {
        match b {
            Block::Text { text } => put(text.as_bytes()),
            Block::Thinking(t) => {
                put(t.thinking.as_bytes());
                put(t.signature.as_deref().unwrap_or("").as_bytes());
            }
            Block::ToolCall(c) => {
                put(c.id.as_bytes());
                put(c.name.as_bytes());
                put(c.arguments.as_bytes());
            }
            Block::Image(i) => {
                put(i.mime.as_bytes());
                put(i.data.as_bytes());
            }
            Block::Opaque(o) => {
                put(o.kind.as_bytes());
                put(o.json.as_bytes());
            }
        }
    }
    h.finish()
}

/// JSON text with object keys sorted, so `{"a":1, "b":2}` and `{"b": 2,"a": 1}` compare equal; text that is
/// not JSON stays as it is. Written as it is read, level by level, without building the value: a call's
/// arguments of a million small values took 15 times their size as a `serde_json::Value`.
pub fn canonical(arguments: &str) -> String {
    let mut out = String::with_capacity(arguments.len());
    match serde_json::from_str::<&serde_json::value::RawValue>(arguments) {
        Ok(v) if write_sorted(v.get(), &mut out).is_ok() => out,
        _ => arguments.to_string(),
    }
}

/// Writes the JSON value `raw` (valid, its nesting within serde_json's limit) compactly with its objects'
/// keys sorted, as `serde_json::Value` would print it once sorted.
fn write_sorted(raw: &str, out: &mut String) -> serde_json::Result<()> {
    use serde_json::value::RawValue;
    match raw.trim_start().as_bytes().first() {
        Some(b'{') => {
            // Keys unescaped and sorted; a repeated key keeps its last value, as a parsed object does.
            let members: std::collections::BTreeMap<String, &RawValue> = serde_json::from_str(raw)?;
            out.push('{');
            for (k, (key, value)) in members.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(key)?);
                out.push(':');
                write_sorted(value.get(), out)?;
            }
            out.push('}');
        }
        Some(b'[') => {
            // Each element written as it is read: a list of a million values is not held as one.
            out.push('[');
            let mut first = true;
            condense_formats::wire::each_element(raw.as_bytes(), |item| {
                if !std::mem::take(&mut first) {
                    out.push(',');
                }
                write_sorted(item.get(), out).map_err(|e| e.to_string())
            })?;
            out.push(']');
        }
        _ => out.push_str(&serde_json::from_str::<serde_json::Value>(raw)?.to_string()),
    }
    Ok(())
}

/// No node: the parent of a root, the sibling before a first child, the child of a leaf.
const NONE: u32 = u32::MAX;

/// A node's index as the links hold it (a tree of 4 G nodes would need ~300 GB first).
fn link(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(NONE)
}

fn unlink(n: u32) -> Option<usize> {
    (n != NONE).then_some(n as usize)
}

/// One message as the client sees it, and where it ends in the log. Kept small (72 bytes and the entry id),
/// since serve holds one per message of every conversation in memory: links instead of child lists, the
/// rare tail beside the tree.
#[derive(Debug, Clone)]
struct Node {
    fp: Fp,
    /// The exact key of the client message this node was last matched with (or recorded from), when
    /// `has_exact`.
    exact: u64,
    /// The entry this node stands for (for a continued reply, its last assistant entry); the id's one
    /// copy, shared with the projection and a request's units.
    entry: Arc<str>,
    /// For an assistant entry whose calls were all condense's own: what the client has seen of the reply
    /// so far (the next assistant entry continues it).
    open: Option<Box<Visible>>,
    parent: u32,
    /// The sibling added just before this one (children are searched newest first).
    prev: u32,
    /// The newest child.
    last_child: u32,
    /// pi's token estimate of what the client sees of it (saturating).
    tokens: u32,
    has_exact: bool,
    /// Whether the node is exactly one entry, so the client's wire JSON can stand for it.
    single: bool,
}

/// The visible tree of one session.
#[derive(Debug, Clone)]
pub struct Track {
    nodes: Vec<Node>,
    /// The newest root.
    last_root: u32,
    /// The entry the client's next message follows when it is not the node's own: the last internal
    /// result after it (few nodes have one).
    tails: BTreeMap<u32, Box<str>>,
    /// The node each entry belongs to, by the entry's place in the projection ([`Projection::position`]):
    /// 4 bytes an entry (a map by id took ~38), [`NONE`] for an entry that belongs to none.
    owner: Vec<u32>,
    /// The calls of condense's own tools (their results are internal).
    internal_calls: BTreeSet<Box<str>>,
    /// Tool-call id → name of every call (a client's tool result names no tool; its call does); the
    /// names shared through `names`.
    call_names: BTreeMap<Box<str>, Arc<str>>,
    names: BTreeSet<Arc<str>>,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            nodes: Vec::new(),
            last_root: NONE,
            tails: BTreeMap::new(),
            owner: Vec::new(),
            internal_calls: BTreeSet::new(),
            call_names: BTreeMap::new(),
            names: BTreeSet::new(),
        }
    }
}

/// Where a request's history leaves the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// How many of the client's messages match nodes, from the first.
    pub count: usize,
    /// The entry the first new message follows (`None`: a new root).
    pub parent: Option<String>,
    /// For each matched message, the entry it stands for when the client's wire JSON can be forwarded
    /// for it (`None` where serve's log holds more than the client saw).
    pub entries: Vec<Option<Arc<str>>>,
}

impl Track {
    /// Folds every entry of a projection's tree, in the order they were appended.
    pub fn build(p: &Projection, internal: &dyn Fn(&str) -> bool) -> Track {
        let mut t = Track::default();
        t.owner.reserve_exact(p.entries());
        for (at, (id, _, m)) in p.tree().enumerate() {
            // The parent's own place: an id given twice names its newest entry, not this one's parent.
            let parent = p.parent_position(at);
            match m {
                Some(m) => t.add(at, id.clone(), parent, m, internal, None),
                // Host compactions and markers are not what a client sends: their children hang on.
                None => {
                    if let Some(o) = t.owner_of(parent) {
                        t.own(at, o);
                    }
                }
            }
        }
        t
    }

    /// The node the entry at `at` in the projection belongs to.
    fn owner_of(&self, at: Option<usize>) -> Option<u32> {
        at.and_then(|a| self.owner.get(a).copied()).filter(|&o| o != NONE)
    }

    /// Notes that the entry at `at` in the projection belongs to node `o`.
    fn own(&mut self, at: usize, o: u32) {
        if self.owner.len() <= at {
            if let Some(more) = condense_render::room_to_reserve(self.owner.len(), self.owner.capacity(), at + 1 - self.owner.len()) {
                self.owner.reserve_exact(more);
            }
            self.owner.resize(at + 1, NONE);
        }
        self.owner[at] = o;
    }

    /// Adds one appended entry, at `at` in the projection ([`Projection::position`]) after the entry at
    /// `parent`; `exact` is the key of the client message it was recorded from (`None` for what serve
    /// recorded itself).
    /// `id` is taken as it comes: the projection's own copy (`Projection::entry`) is shared, not copied.
    pub fn add(&mut self, at: usize, id: impl Into<Arc<str>>, parent: Option<usize>, m: &Message, internal: &dyn Fn(&str) -> bool, exact: Option<u64>) {
        let id: Arc<str> = id.into();
        let owner = self.owner_of(parent);
        if let Message::ToolResult { call_id, .. } = m {
            if self.internal_calls.contains(call_id.as_str()) {
                // condense answered this itself: part of the reply's node, after which the client goes on.
                if let Some(o) = owner {
                    self.tails.insert(o, Box::from(&*id));
                    self.nodes[o as usize].single = false;
                    self.own(at, o);
                }
                return;
            }
        }
        let vis = Visible::of(m, internal);
        let calls: Vec<(&str, &str)> = m.tool_calls().map(|(id, name, _)| (id, name)).collect();
        for (cid, name) in &calls {
            if internal(name) {
                self.internal_calls.insert((*cid).into());
            }
            let shared = match self.names.get(*name) {
                Some(n) => n.clone(),
                None => {
                    let n: Arc<str> = (*name).into();
                    self.names.insert(n.clone());
                    n
                }
            };
            self.call_names.insert((*cid).into(), shared);
        }
        let only_internal = !calls.is_empty() && calls.iter().all(|(_, n)| internal(n));
        // An assistant entry after a reply that called only condense's tools continues that reply.
        let continued = match (m, owner) {
            (Message::Assistant { .. }, Some(o)) => {
                let node = &self.nodes[o as usize];
                node.open.as_deref().map(|prev| (node.parent, prev.clone()))
            }
            _ => None,
        };
        let own_tokens = condense_tokens::estimate(m);
        let (vparent, vis, single, tokens) = match continued {
            Some((vp, prev)) => (vp, prev.extend(&vis), false, owner.map_or(0, |o| u64::from(self.nodes[o as usize].tokens)) + own_tokens),
            None => (owner.unwrap_or(NONE), vis, true, own_tokens),
        };
        let ix = link(self.nodes.len());
        let prev = match unlink(vparent) {
            Some(p) => std::mem::replace(&mut self.nodes[p].last_child, ix),
            None => std::mem::replace(&mut self.last_root, ix),
        };
        self.nodes.push(Node {
            fp: vis.fp(),
            exact: exact.unwrap_or(0),
            entry: id,
            open: only_internal.then(|| Box::new(vis)),
            parent: vparent,
            prev,
            last_child: NONE,
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            has_exact: exact.is_some(),
            single,
        });
        self.own(at, ix);
    }

    /// Room for `n` more nodes (a request recording many messages at once) and the reply's after them,
    /// taken as the projection takes room for its entries ([`condense_render::room_to_reserve`]).
    pub fn reserve(&mut self, n: usize) {
        if let Some(more) = condense_render::room_to_reserve(self.nodes.len(), self.nodes.capacity(), n) {
            self.nodes.reserve_exact(more);
        }
    }

    /// The children of `at` (`None`: the roots), the newest first.
    fn children(&self, at: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        let first = match at {
            Some(a) => self.nodes.get(a).map_or(NONE, |n| n.last_child),
            None => self.last_root,
        };
        std::iter::successors(unlink(first), |&n| unlink(self.nodes[n].prev))
    }

    /// The child of `at` (`None`: the roots) that a client message with exact key `key` matches: the
    /// newest child with that key, else the newest with the same visible fingerprint (`fp` is computed
    /// only then, and the child remembers the key for the next request).
    pub fn step(&mut self, at: Option<usize>, key: u64, fp: &mut dyn FnMut() -> Fp) -> Option<usize> {
        if let Some(n) = self.step_exact(at, key) {
            return Some(n);
        }
        self.children(at).next()?;
        let f = fp();
        let found = self.children(at).find(|&n| self.nodes[n].fp == f);
        if let Some(n) = found {
            let node = &mut self.nodes[n];
            (node.exact, node.has_exact) = (key, true);
        }
        found
    }

    /// The newest child of `at` whose remembered exact key is `key`.
    pub fn step_exact(&self, at: Option<usize>, key: u64) -> Option<usize> {
        self.children(at).find(|&n| self.nodes[n].has_exact && self.nodes[n].exact == key)
    }

    /// The entry node `n` stands for, when it is exactly one entry.
    pub fn single_entry(&self, n: usize) -> Option<Arc<str>> {
        self.nodes[n].single.then(|| self.nodes[n].entry.clone())
    }

    /// The entry the client's next message after node `n` follows.
    pub fn tail(&self, n: usize) -> &str {
        self.tails.get(&link(n)).map_or(&*self.nodes[n].entry, |t| t)
    }

    /// The token estimate of node `n` as the client sees it.
    pub fn tokens(&self, n: usize) -> u64 {
        u64::from(self.nodes[n].tokens)
    }

    /// The name of the tool a call id belongs to, when serve has seen the call.
    pub fn call_name(&self, id: &str) -> Option<&str> {
        self.call_names.get(id).map(|n| &**n)
    }

    /// Matches a request's messages against the tree, step by step (see [`Track::step`]).
    pub fn matching(&mut self, messages: &[&Message], internal: &dyn Fn(&str) -> bool) -> Matched {
        let mut cur: Option<usize> = None;
        let mut entries = Vec::new();
        for m in messages {
            match self.step(cur, exact(m), &mut || Visible::of(m, internal).fp()) {
                Some(n) => {
                    entries.push(self.single_entry(n));
                    cur = Some(n);
                }
                None => break,
            }
        }
        Matched { count: entries.len(), parent: cur.map(|n| self.tail(n).to_string()), entries }
    }

    /// Number of visible nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

    fn internal(n: &str) -> bool {
        n == "context_tree_query"
    }

    fn asst(blocks: Vec<Block>) -> Message {
        Message::Assistant { content: blocks, model: None, stop: None, usage: None }
    }

    fn call(id: &str, name: &str) -> Block {
        Block::tool_call(id.into(), name.into(), "{\"a\": 1, \"b\": [2]}".into())
    }

    fn result(id: &str, text: &str) -> Message {
        Message::ToolResult { call_id: id.into(), tool_name: String::new(), content: vec![Block::Text { text: text.into() }], is_error: false }
    }

    /// Adds entry `eN` at place N-1 of the projection: the tests append their entries in the order of their
    /// names.
    fn add(t: &mut Track, id: &str, parent: Option<&str>, m: &Message, exact: Option<u64>) {
        let at = |id: &str| id[1..].parse::<usize>().expect("an id eN") - 1;
        t.add(at(id), id, parent.map(at), m, &internal, exact);
    }

    fn matched(t: &mut Track, ms: &[Message]) -> Matched {
        let refs: Vec<&Message> = ms.iter().collect();
        t.matching(&refs, &internal)
    }

    /// The client's view keeps the projection's copy of each entry id (one allocation per id, however many
    /// hold it), for the entries it folds and for those it is given.
    #[test]
    fn the_view_shares_the_projections_entry_ids() {
        use condense_events::{Entry, Event, SourceEvent};
        let mut p = Projection::new();
        let texts = ["go", "on", "stop"];
        for (i, text) in texts.iter().enumerate() {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            let entry = Entry::Message(Message::user_text(*text, UserOrigin::Prompt));
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry }));
        }
        let t = Track::build(&p, &internal);
        assert_eq!(t.nodes.len(), 3);
        for (n, node) in t.nodes.iter().enumerate() {
            let (shared, _) = p.entry(&node.entry).expect("an entry of the projection");
            assert!(Arc::ptr_eq(&node.entry, shared), "entry {} is a copy", node.entry);
            // Each entry is owned by its node, by its place in the projection.
            assert_eq!(t.owner[p.position(&node.entry).unwrap()], n as u32);
        }
        // Given the projection's copy, `add` keeps it too.
        let mut t = Track::default();
        let (shared, m) = p.entry("e0").unwrap();
        t.add(0, shared.clone(), None, m, &internal, None);
        assert!(Arc::ptr_eq(&t.nodes[0].entry, shared));
    }

    /// An entry that is no message (a host's marker) belongs to the node before it, so the client's next
    /// message hangs on it; folded again, and added as serve appends it, alike.
    #[test]
    fn the_client_continues_past_an_entry_that_is_no_message() {
        use condense_events::{Entry, Event, SourceEvent};
        let u = Message::user_text("go", UserOrigin::Prompt);
        let a = asst(vec![Block::Text { text: "ok".into() }]);
        let next = Message::user_text("more", UserOrigin::Prompt);
        let mut p = Projection::new();
        let entries = [Entry::Message(u.clone()), Entry::Message(a.clone()), Entry::Marker { kind: "label".into() }, Entry::Message(next.clone())];
        for (i, entry) in entries.into_iter().enumerate() {
            let parent = (i > 0).then(|| format!("e{}", i - 1));
            p.apply(i as u64 + 1, &Event::Source(SourceEvent::EntryAppended { id: format!("e{i}"), parent, entry }));
        }
        let mut folded = Track::build(&p, &internal);
        assert_eq!(folded.nodes.len(), 3);
        let m = matched(&mut folded, &[u.clone(), a.clone(), next.clone()]);
        assert_eq!((m.count, m.parent.as_deref()), (3, Some("e3")));
        // Built as serve appends: the marker's place left to the projection, the message after it added.
        let mut added = Track::default();
        add(&mut added, "e1", None, &u, None);
        add(&mut added, "e2", Some("e1"), &a, None);
        added.own(2, 1);
        add(&mut added, "e4", Some("e3"), &next, None);
        let m = matched(&mut added, &[u, a, next]);
        assert_eq!((m.count, m.parent.as_deref()), (3, Some("e4")));
        assert_eq!(added.owner, [0, 1, 1, 2]);
    }

    #[test]
    fn a_reply_with_condense_calls_is_one_visible_message() {
        let mut t = Track::default();
        let u = Message::user_text("go", UserOrigin::Prompt);
        add(&mut t, "e1", None, &u, None);
        add(&mut t, "e2", Some("e1"), &asst(vec![Block::Text { text: "look".into() }, call("q1", "context_tree_query")]), None);
        add(&mut t, "e3", Some("e2"), &result("q1", "original"), None);
        add(&mut t, "e4", Some("e3"), &asst(vec![Block::Text { text: "done".into() }, call("b1", "bash")]), None);
        // The client saw one message: both texts, the bash call, no condense call.
        let seen = asst(vec![Block::Text { text: "look".into() }, Block::Text { text: "\ndone".into() }, Block::tool_call("b1".into(), "bash".into(), "{\"b\":[2],\"a\":1}".into())]);
        let m = matched(&mut t, &[u.clone(), seen.clone(), result("b1", "out")]);
        assert_eq!(m.count, 2);
        assert_eq!(m.parent.as_deref(), Some("e4"));
        assert_eq!(m.entries, vec![Some("e1".into()), None]);
        add(&mut t, "e5", Some("e4"), &result("b1", "out"), None);
        let m = matched(&mut t, &[u, seen, result("b1", "out")]);
        assert_eq!((m.count, m.parent.as_deref()), (3, Some("e5")));
    }

    #[test]
    fn a_rewound_history_leaves_at_the_fork() {
        let mut t = Track::default();
        let u = Message::user_text("go", UserOrigin::Prompt);
        add(&mut t, "e1", None, &u, None);
        add(&mut t, "e2", Some("e1"), &asst(vec![Block::Text { text: "a".into() }]), None);
        add(&mut t, "e3", Some("e2"), &Message::user_text("first try", UserOrigin::Prompt), None);
        let m = matched(&mut t, &[u.clone(), asst(vec![Block::Text { text: "a ".into() }]), Message::user_text("second try", UserOrigin::Prompt)]);
        assert_eq!((m.count, m.parent.as_deref()), (2, Some("e2")));
        // A different first message starts a new root.
        let m = matched(&mut t, &[Message::user_text("other", UserOrigin::Prompt)]);
        assert_eq!((m.count, m.parent), (0, None));
    }

    /// A client that resends the same message twice from one point (a retry) forked the tree: the newest
    /// branch is the one its next request continues, by exact key and by fingerprint alike, and each root
    /// and child list keeps every branch.
    #[test]
    fn the_newest_of_alike_children_is_the_one_continued() {
        let mut t = Track::default();
        let u = Message::user_text("go", UserOrigin::Prompt);
        add(&mut t, "e1", None, &u, Some(exact(&u)));
        let a = asst(vec![Block::Text { text: "same".into() }]);
        add(&mut t, "e2", Some("e1"), &a, Some(exact(&a)));
        add(&mut t, "e3", Some("e1"), &a, Some(exact(&a)));
        add(&mut t, "e4", None, &u, None);
        // By exact key: e1 (the root remembered with it), then e3, the newer child of e1.
        let m = matched(&mut t, &[u.clone(), a.clone()]);
        assert_eq!((m.count, m.parent.as_deref()), (2, Some("e3")));
        // By fingerprint (white space the client changed): the newest alike root is e4, which has no child.
        let spaced = asst(vec![Block::Text { text: " same ".into() }]);
        let m = matched(&mut t, &[Message::user_text(" go", UserOrigin::Prompt), spaced.clone()]);
        assert_eq!((m.count, m.parent.as_deref()), (1, Some("e4")));
        // From e1 the fingerprint finds e3, which then remembers the new key.
        assert_eq!(t.step(Some(0), exact(&spaced), &mut || Visible::of(&spaced, &internal).fp()), Some(2));
        assert_eq!(t.step_exact(Some(0), exact(&spaced)), Some(2));
        assert_eq!((t.len(), t.tokens(2), t.single_entry(1).as_deref()), (4, condense_tokens::estimate(&a), Some("e2")));
    }

    #[test]
    fn mixed_calls_end_the_reply_after_the_internal_result() {
        let mut t = Track::default();
        add(&mut t, "e1", None, &Message::user_text("go", UserOrigin::Prompt), None);
        add(&mut t, "e2", Some("e1"), &asst(vec![call("b1", "bash"), call("q1", "context_tree_query")]), None);
        add(&mut t, "e3", Some("e2"), &result("q1", "original"), None);
        let m = matched(&mut t, &[Message::user_text("go", UserOrigin::Prompt), asst(vec![call("b1", "bash")])]);
        assert_eq!((m.count, m.parent.as_deref()), (2, Some("e3")));
        assert_eq!(m.entries[1], None);
    }

    #[test]
    fn canonical_sorts_keys() {
        assert_eq!(canonical("{\"b\": 1, \"a\": {\"d\": 2, \"c\": 3}}"), "{\"a\":{\"c\":3,\"d\":2},\"b\":1}");
        assert_eq!(canonical("not json"), "not json");
        // The same text as the sorted value prints, escapes, numbers, repeated keys and nesting included.
        let sorted_value = |t: &str| {
            fn sort(v: serde_json::Value) -> serde_json::Value {
                match v {
                    serde_json::Value::Object(o) => {
                        let mut entries: Vec<(String, serde_json::Value)> = o.into_iter().map(|(k, v)| (k, sort(v))).collect();
                        entries.sort_by(|a, b| a.0.cmp(&b.0));
                        serde_json::Value::Object(entries.into_iter().collect())
                    }
                    serde_json::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(sort).collect()),
                    other => other,
                }
            }
            sort(serde_json::from_str(t).unwrap()).to_string()
        };
        for t in [
            r#" { "z" : [1, 2.50, -0, 1e3, 1E-2, true, null, "\u00e9\n\"q\"", {"b":{}, "a":[]}], "\u0061": "x", "a": "dup" , "": 0} "#,
            r#"[[[[{"k":[{"y":1,"x":2}]}]]]]"#,
            r#""just a string""#,
            "12345678901234567890123",
            r#"{"emoji":"\ud83d\ude00 ü"}"#,
        ] {
            assert_eq!(canonical(t), sorted_value(t), "{t}");
        }
        assert_eq!(canonical("{\"a\": 1} trailing"), "{\"a\": 1} trailing", "not JSON as a whole");
    }
}
