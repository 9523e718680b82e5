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
use std::collections::BTreeMap;

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
                Block::ToolCall { id, name, arguments } if !internal(name) => {
                    v.calls.push((id.clone(), name.clone(), canonical(arguments)));
                }
                Block::Image { data, .. } => v.images.push(*blake3::hash(data.as_bytes()).as_bytes()),
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
            Block::Thinking { thinking, signature } => {
                put(thinking.as_bytes());
                put(signature.as_deref().unwrap_or("").as_bytes());
            }
            Block::ToolCall { id, name, arguments } => {
                put(id.as_bytes());
                put(name.as_bytes());
                put(arguments.as_bytes());
            }
            Block::Image { mime, data } => {
                put(mime.as_bytes());
                put(data.as_bytes());
            }
        }
    }
    h.finish()
}

/// JSON text with object keys sorted, so `{"a":1, "b":2}` and `{"b": 2,"a": 1}` compare equal; text that is
/// not JSON stays as it is.
pub fn canonical(arguments: &str) -> String {
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
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(v) => sort(v).to_string(),
        Err(_) => arguments.to_string(),
    }
}

/// One message as the client sees it, and where it ends in the log.
#[derive(Debug, Clone)]
struct Node {
    parent: Option<usize>,
    fp: Fp,
    /// The exact key of the client message this node was last matched with (or recorded from).
    exact: Option<u64>,
    /// The entry this node stands for (for a continued reply, its last assistant entry).
    entry: String,
    /// The entry the client's next message follows when it is not `entry`: the last internal result
    /// after it.
    tail: Option<String>,
    /// Whether the node is exactly one entry, so the client's wire JSON can stand for it.
    single: bool,
    /// pi's token estimate of what the client sees of it.
    tokens: u64,
    /// For an assistant entry whose calls were all condense's own: what the client has seen of the reply
    /// so far (the next assistant entry continues it).
    open: Option<Box<Visible>>,
}

/// The visible tree of one session.
#[derive(Debug, Clone, Default)]
pub struct Track {
    nodes: Vec<Node>,
    children: BTreeMap<Option<usize>, Vec<usize>>,
    /// The node each entry belongs to.
    owner: BTreeMap<String, usize>,
    /// Tool-call id → name, for the calls of condense's own tools (their results are internal).
    internal_calls: BTreeMap<String, String>,
    /// Tool-call id → name of every call (a client's tool result names no tool; its call does).
    call_names: BTreeMap<String, String>,
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
    pub entries: Vec<Option<String>>,
}

impl Track {
    /// Folds every entry of a projection's tree, in the order they were appended.
    pub fn build(p: &Projection, internal: &dyn Fn(&str) -> bool) -> Track {
        let mut t = Track::default();
        for (id, parent, m) in p.tree() {
            match m {
                Some(m) => t.add(id, parent, m, internal, None),
                // Host compactions and markers are not what a client sends: their children hang on.
                None => {
                    if let Some(&o) = parent.and_then(|p| t.owner.get(p)) {
                        t.owner.insert(id.to_string(), o);
                    }
                }
            }
        }
        t
    }

    /// Adds one appended entry; `exact` is the key of the client message it was recorded from (`None` for
    /// what serve recorded itself).
    pub fn add(&mut self, id: &str, parent: Option<&str>, m: &Message, internal: &dyn Fn(&str) -> bool, exact: Option<u64>) {
        let owner = parent.and_then(|p| self.owner.get(p).copied());
        if let Message::ToolResult { call_id, .. } = m {
            if self.internal_calls.contains_key(call_id) {
                // condense answered this itself: part of the reply's node, after which the client goes on.
                if let Some(o) = owner {
                    self.nodes[o].tail = Some(id.to_string());
                    self.nodes[o].single = false;
                    self.owner.insert(id.to_string(), o);
                }
                return;
            }
        }
        let vis = Visible::of(m, internal);
        let calls: Vec<(&str, &str)> = m.tool_calls().map(|(id, name, _)| (id, name)).collect();
        for (cid, name) in &calls {
            if internal(name) {
                self.internal_calls.insert(cid.to_string(), name.to_string());
            }
            self.call_names.insert(cid.to_string(), name.to_string());
        }
        let only_internal = !calls.is_empty() && calls.iter().all(|(_, n)| internal(n));
        // An assistant entry after a reply that called only condense's tools continues that reply.
        let continued = match (m, owner) {
            (Message::Assistant { .. }, Some(o)) => self.nodes[o].open.as_deref().map(|prev| (self.nodes[o].parent, prev.clone())),
            _ => None,
        };
        let own_tokens = condense_tokens::estimate(m);
        let (vparent, vis, single, tokens) = match continued {
            Some((vp, prev)) => (vp, prev.extend(&vis), false, owner.map_or(0, |o| self.nodes[o].tokens) + own_tokens),
            None => (owner, vis, true, own_tokens),
        };
        let ix = self.nodes.len();
        self.nodes.push(Node {
            parent: vparent,
            fp: vis.fp(),
            exact,
            entry: id.to_string(),
            tail: None,
            single,
            tokens,
            open: only_internal.then(|| Box::new(vis)),
        });
        // Most nodes have one child: room for one, not the four a first push makes.
        self.children.entry(vparent).or_insert_with(|| Vec::with_capacity(1)).push(ix);
        self.owner.insert(id.to_string(), ix);
    }

    /// Room for `n` more nodes (a request recording many messages at once) and the reply's after them,
    /// which would otherwise double the room at once.
    pub fn reserve(&mut self, n: usize) {
        self.nodes.reserve(n + 16);
    }

    /// The child of `at` (`None`: the roots) that a client message with exact key `key` matches: the
    /// newest child with that key, else the newest with the same visible fingerprint (`fp` is computed
    /// only then, and the child remembers the key for the next request).
    pub fn step(&mut self, at: Option<usize>, key: u64, fp: &mut dyn FnMut() -> Fp) -> Option<usize> {
        if let Some(n) = self.step_exact(at, key) {
            return Some(n);
        }
        let children = self.children.get(&at)?;
        let f = fp();
        let found = children.iter().rev().find(|&&n| self.nodes[n].fp == f).copied();
        if let Some(n) = found {
            self.nodes[n].exact = Some(key);
        }
        found
    }

    /// The newest child of `at` whose remembered exact key is `key`.
    pub fn step_exact(&self, at: Option<usize>, key: u64) -> Option<usize> {
        self.children.get(&at)?.iter().rev().find(|&&n| self.nodes[n].exact == Some(key)).copied()
    }

    /// The entry node `n` stands for, when it is exactly one entry.
    pub fn single_entry(&self, n: usize) -> Option<String> {
        self.nodes[n].single.then(|| self.nodes[n].entry.clone())
    }

    /// The entry the client's next message after node `n` follows.
    pub fn tail(&self, n: usize) -> &str {
        let node = &self.nodes[n];
        node.tail.as_deref().unwrap_or(&node.entry)
    }

    /// The token estimate of node `n` as the client sees it.
    pub fn tokens(&self, n: usize) -> u64 {
        self.nodes[n].tokens
    }

    /// The name of the tool a call id belongs to, when serve has seen the call.
    pub fn call_name(&self, id: &str) -> Option<&str> {
        self.call_names.get(id).map(String::as_str)
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
        Block::ToolCall { id: id.into(), name: name.into(), arguments: "{\"a\": 1, \"b\": [2]}".into() }
    }

    fn result(id: &str, text: &str) -> Message {
        Message::ToolResult { call_id: id.into(), tool_name: String::new(), content: vec![Block::Text { text: text.into() }], is_error: false }
    }

    fn matched(t: &mut Track, ms: &[Message]) -> Matched {
        let refs: Vec<&Message> = ms.iter().collect();
        t.matching(&refs, &internal)
    }

    #[test]
    fn a_reply_with_condense_calls_is_one_visible_message() {
        let mut t = Track::default();
        let u = Message::user_text("go", UserOrigin::Prompt);
        t.add("e1", None, &u, &internal, None);
        t.add("e2", Some("e1"), &asst(vec![Block::Text { text: "look".into() }, call("q1", "context_tree_query")]), &internal, None);
        t.add("e3", Some("e2"), &result("q1", "original"), &internal, None);
        t.add("e4", Some("e3"), &asst(vec![Block::Text { text: "done".into() }, call("b1", "bash")]), &internal, None);
        // The client saw one message: both texts, the bash call, no condense call.
        let seen = asst(vec![Block::Text { text: "look".into() }, Block::Text { text: "\ndone".into() }, Block::ToolCall { id: "b1".into(), name: "bash".into(), arguments: "{\"b\":[2],\"a\":1}".into() }]);
        let m = matched(&mut t, &[u.clone(), seen.clone(), result("b1", "out")]);
        assert_eq!(m.count, 2);
        assert_eq!(m.parent.as_deref(), Some("e4"));
        assert_eq!(m.entries, vec![Some("e1".to_string()), None]);
        t.add("e5", Some("e4"), &result("b1", "out"), &internal, None);
        let m = matched(&mut t, &[u, seen, result("b1", "out")]);
        assert_eq!((m.count, m.parent.as_deref()), (3, Some("e5")));
    }

    #[test]
    fn a_rewound_history_leaves_at_the_fork() {
        let mut t = Track::default();
        let u = Message::user_text("go", UserOrigin::Prompt);
        t.add("e1", None, &u, &internal, None);
        t.add("e2", Some("e1"), &asst(vec![Block::Text { text: "a".into() }]), &internal, None);
        t.add("e3", Some("e2"), &Message::user_text("first try", UserOrigin::Prompt), &internal, None);
        let m = matched(&mut t, &[u.clone(), asst(vec![Block::Text { text: "a ".into() }]), Message::user_text("second try", UserOrigin::Prompt)]);
        assert_eq!((m.count, m.parent.as_deref()), (2, Some("e2")));
        // A different first message starts a new root.
        let m = matched(&mut t, &[Message::user_text("other", UserOrigin::Prompt)]);
        assert_eq!((m.count, m.parent), (0, None));
    }

    #[test]
    fn mixed_calls_end_the_reply_after_the_internal_result() {
        let mut t = Track::default();
        t.add("e1", None, &Message::user_text("go", UserOrigin::Prompt), &internal, None);
        t.add("e2", Some("e1"), &asst(vec![call("b1", "bash"), call("q1", "context_tree_query")]), &internal, None);
        t.add("e3", Some("e2"), &result("q1", "original"), &internal, None);
        let m = matched(&mut t, &[Message::user_text("go", UserOrigin::Prompt), asst(vec![call("b1", "bash")])]);
        assert_eq!((m.count, m.parent.as_deref()), (2, Some("e3")));
        assert_eq!(m.entries[1], None);
    }

    #[test]
    fn canonical_sorts_keys() {
        assert_eq!(canonical("{\"b\": 1, \"a\": {\"d\": 2, \"c\": 3}}"), "{\"a\":{\"c\":3,\"d\":2},\"b\":1}");
        assert_eq!(canonical("not json"), "not json");
    }
}
