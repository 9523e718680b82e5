//! The branch walk: the path from the root to the active leaf, kept between calls and extended by new
//! entries, and the views of the branch the stages and commands read.

use super::*;

impl Projection {
    /// Entry indices on the path from the root to the leaf.
    pub(super) fn path(&self) -> Arc<Vec<usize>> {
        self.kept_path(&self.path_cache, |_| true, |it| it.depth)
    }

    /// Indices of the message entries on the path from the root to the leaf.
    fn message_path(&self) -> Arc<Vec<usize>> {
        self.kept_path(&self.message_path_cache, |it| matches!(it.node, Node::Message(..)), |it| it.messages_before)
    }

    /// The entries on the path from the root to the leaf that `keep`, kept in `cache` from the last call:
    /// only the entries below the last one the kept list shares are looked at (`at` says where a kept
    /// entry sits in the list), and the list is extended in place when nothing else holds it.
    pub(super) fn kept_path(
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
    pub(super) fn ancestors(&self) -> impl Iterator<Item = usize> + '_ {
        // A cycle cannot be built through `apply`, but never loop forever.
        std::iter::successors(self.leaf, |&i| self.items[i].parent.map(|p| p as usize)).take(self.items.len() + 1)
    }

    /// The id of the current leaf entry (`None` before any entry, or when the leaf is before the root).
    pub fn leaf_id(&self) -> Option<&str> {
        self.leaf.map(|i| &*self.items[i].id)
    }

    /// Every entry of the tree in the order it was appended, on every branch: its id (the projection's
    /// copy, to share), its parent's id and its message (`None` for host compactions and markers).
    pub fn tree(&self) -> impl Iterator<Item = (&Arc<str>, Option<&str>, Option<&Arc<Message>>)> {
        self.items.iter().map(|it| {
            let parent = it.parent.map(|p| &*self.items[p as usize].id);
            let m = match &it.node {
                Node::Message(m, _) => Some(m),
                _ => None,
            };
            (&it.id, parent, m)
        })
    }

    /// The place of entry `id` in the order entries were appended (its place in [`Projection::tree`]),
    /// on any branch: what a view kept beside the projection can index by instead of keeping the id.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(&self.items, id)
    }

    /// The place of the parent of the entry at place `at` (see [`Projection::position`]).
    pub fn parent_position(&self, at: usize) -> Option<usize> {
        self.items.get(at)?.parent.map(|p| p as usize)
    }

    /// The stub output `ref_n` renders as once pruned (its spill preview, its alias line or its summary, as
    /// the index has them now), as the render writes it; `None` for a ref or entry it does not hold.
    pub fn stub_of(&self, ref_n: u32) -> Option<Message> {
        let rec = self.decisions.records.get(&ref_n)?;
        Some(super::phases::stub(&self.decisions, rec, self.entry_message(&rec.entry)?))
    }

    /// Where entry `id`'s message sits in the rendered messages `msgs`, the last place from the end: as
    /// itself, or (a turn condensed, an output stubbed) as the message making the same first call or
    /// answering the same call; `None` when it is not there (inside a block, cut, not an entry).
    pub fn rendered_at(&self, id: &str, msgs: &[Arc<Message>]) -> Option<usize> {
        let m = self.entry_message(id)?;
        fn first_call(x: &Message) -> Option<&str> {
            x.tool_calls().next().map(|(c, _, _)| c)
        }
        msgs.iter().rposition(|x| {
            Arc::ptr_eq(x, m)
                || match (&**x, &**m) {
                    (Message::ToolResult { call_id: a, .. }, Message::ToolResult { call_id: b, .. }) => a == b,
                    (Message::Assistant { .. }, Message::Assistant { .. }) => first_call(m).is_some() && first_call(x) == first_call(m),
                    _ => false,
                }
        })
    }

    /// Which entries are in the context: on the active branch and not cut away by the newest host
    /// compaction on it (what the pipeline made of such an entry's message is rendered, unless a checkpoint
    /// stands in for it). The branch is looked at once; the test it gives takes an entry id.
    pub fn in_context(&self) -> impl Fn(&str) -> bool + '_ {
        let path = self.path();
        // Path positions from here on are in the context.
        let from = match path.iter().rposition(|&i| matches!(self.items[i].node, Node::Compaction(_))) {
            None => 0,
            Some(c) => match &self.items[path[c]].node {
                Node::Compaction(compaction) => compaction
                    .first_kept
                    .as_ref()
                    .and_then(|k| path[..c].iter().position(|&i| *self.items[i].id == **k))
                    .unwrap_or(c),
                _ => c,
            },
        };
        move |id| {
            self.position(id).is_some_and(|i| {
                let d = self.items[i].depth as usize;
                d >= from && path.get(d) == Some(&i)
            })
        }
    }

    /// Whether an entry with this id exists (on any branch).
    pub fn has_entry(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    /// Whether entry `id` is on the path from the root to the leaf (the active branch).
    pub fn on_path(&self, id: &str) -> bool {
        self.position(id).is_some_and(|target| self.ancestors().any(|i| i == target))
    }

    /// Entry ids on the path from the root to the leaf.
    pub fn path_ids(&self) -> Vec<String> {
        self.path().iter().map(|&i| self.items[i].id.to_string()).collect()
    }

    /// The message of entry `id`, on any branch.
    pub fn entry_message(&self, id: &str) -> Option<&Arc<Message>> {
        self.entry(id).map(|(_, m)| m)
    }

    /// The message of entry `id` with the projection's copy of the id (one copy shared by whoever keeps
    /// the id beside the projection); `None` when there is no such entry or it holds no message.
    pub fn entry(&self, id: &str) -> Option<(&Arc<str>, &Arc<Message>)> {
        self.entry_at(self.position(id)?)
    }

    /// [`Projection::entry`] of the entry at place `at` (see [`Projection::position`]).
    pub fn entry_at(&self, at: usize) -> Option<(&Arc<str>, &Arc<Message>)> {
        let it = self.items.get(at)?;
        match &it.node {
            Node::Message(m, _) => Some((&it.id, m)),
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
            if let Some(b) = self.position(&cp.boundary) {
                after.entry(b).or_default().push(*n);
            }
        }
        let mut out = Vec::new();
        for &i in self.path().iter() {
            let id = &*self.items[i].id;
            match &self.items[i].node {
                Node::Message(m, _) => out.push(TranscriptRow::Message(id, m)),
                Node::Compaction(_) => out.push(TranscriptRow::HostCompaction(id)),
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
                Node::Message(m, _) => Some((&*self.items[i].id, m)),
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
}

/// Entry ids and messages of the active branch, root first (see [`Projection::branch_view`]).
pub struct BranchView<'a> {
    items: &'a [Item],
    ids: &'a Ids,
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
            Node::Message(m, _) => (&*it.id, m),
            _ => unreachable!("the message path holds message entries only"),
        }
    }

    /// The entry (its index in the tree) of the `i`th message.
    pub(super) fn item(&self, i: usize) -> usize {
        self.path[i]
    }

    /// Where the message of entry `id` sits on the branch, in constant time (`None` when it is not on it).
    pub fn position(&self, id: &str) -> Option<usize> {
        let ix = self.ids.get(self.items, id)?;
        let pos = self.items.get(ix)?.messages_before as usize;
        (self.path.get(pos) == Some(&ix)).then_some(pos)
    }
}
