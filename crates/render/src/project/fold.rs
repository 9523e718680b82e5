//! The tree fold: each event absorbed into the session tree (entries, branch moves, host compactions,
//! model and usage facts) and each decision marked on the entries it touches.

use super::phases::synthetic;
use super::*;

/// The room to reserve exactly for `n` more elements of a list of `len` in `capacity`, when what is left
/// is short: `n` and a few after them (a reply to a request recording many messages), and at least an
/// eighth of the list, so small appends stay amortized. Asking `Vec::reserve` for `n` and the few again
/// on every append doubled a list of 100,000 for one more element.
pub fn room_to_reserve(len: usize, capacity: usize, n: usize) -> Option<usize> {
    (n > capacity - len).then(|| n.max(len / 8) + 16)
}

impl Projection {
    /// Absorbs one event the caller gives up, moving its message bodies into the projection instead of
    /// copying them (with no more room than they fill: [`Message::shrink_to_fit`]).
    pub fn apply_owned(&mut self, seq: Seq, event: Event) {
        match event {
            Event::Source(SourceEvent::EntryAppended { id, parent, entry: Entry::Message(mut m) }) => {
                m.shrink_to_fit();
                self.push_message(seq, id, parent.as_deref(), Arc::new(m));
            }
            // The index takes what it keeps of a decision as the event held it (a captured output's
            // record), unless the kept render still has to read the decision after it.
            Event::Decision(d) => {
                self.seq = seq;
                match self.take_decision(&d) {
                    Some(old) => {
                        self.decisions.apply(&d);
                        self.patch_render(&d, old);
                    }
                    None => self.decisions.apply_owned(d),
                }
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

    /// Room for `n` more entries, and a few after them, taken only when the room left is short: a request
    /// recording many messages grows the entries once, not by doubling (the old and the new buffer alive
    /// together), and the reply after it fits in the few (asking for them again doubled the room of
    /// 100,000 entries for one more). The room grows by at least an eighth, so small appends stay amortized.
    pub fn reserve_entries(&mut self, n: usize) {
        if let Some(more) = room_to_reserve(self.items.len(), self.items.capacity(), n) {
            Arc::make_mut(&mut self.items).reserve_exact(more);
            Arc::make_mut(&mut self.index).reserve(&self.items, more);
        }
    }

    fn push_entry(&mut self, id: String, parent: Option<&str>, node: Node) {
        if !matches!(&node, Node::Message(m, _) if matches!(**m, Message::Assistant { .. })) {
            self.overflow_streak = 0;
            self.overflow_failed = false;
        }
        self.weight += ENTRY_WEIGHT + match &node {
            Node::Message(m, _) => m.bytes() as u64,
            _ => 0,
        };
        let parent = parent.and_then(|p| self.position(p));
        let ix = self.items.len();
        let id: Arc<str> = id.into();
        let (depth, messages_before) = parent.map_or((0, 0), |p| {
            let it = &self.items[p];
            (it.depth + 1, it.messages_before + u32::from(matches!(it.node, Node::Message(..))))
        });
        let up = parent.map(|p| u32::try_from(p).expect("fewer than 2^32 entries"));
        Arc::make_mut(&mut self.items).push(Item { id, parent: up, node, depth, messages_before });
        // A repeated id points at its newest entry; the importers rename duplicates anyway.
        Arc::make_mut(&mut self.index).insert(&self.items, ix);
        self.leaf = Some(ix);
        self.extend_render(parent, ix);
    }

    pub(super) fn mark(&mut self, d: &DecisionEvent) {
        let at = |id: &str| self.position(id);
        let (a, b) = match d {
            DecisionEvent::OutputCaptured(r) => (at(&r.entry), at(&r.call_entry)),
            DecisionEvent::ErrorArgsPurged { entry, .. } => (at(entry), None),
            DecisionEvent::ChainCompressed(ch) => (at(&ch.first), at(&ch.last)),
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
            DecisionEvent::ChainCompressed(ch) => {
                let block = &ch.block;
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

    /// What decision `d` changes in the projection before the index takes it: the marks of its entries,
    /// the checkpoint's messages, and the kept render, which takes the change in place where it can (the
    /// returned messages: finished by [`Projection::patch_render`] once the index has `d`) or else is made
    /// again at the next render.
    fn take_decision(&mut self, d: &DecisionEvent) -> Option<Vec<(usize, Arc<Message>)>> {
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
        if matches!(d, DecisionEvent::CheckpointFailed { .. }) && self.overflow_streak > 0 {
            self.overflow_failed = true;
        }
        if let DecisionEvent::CheckpointCommitted(c) = d {
            let condense_events::CheckpointCommitted { n, summary, bounded, .. } = &**c;
            self.overflow_checkpointed = true;
            self.checkpoint_msgs.insert(*n, Arc::new(Message::user_text(summary.clone(), UserOrigin::Summary)));
            for (entry, text) in bounded {
                let Some(i) = self.position(entry) else { continue };
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
        patch
    }

    /// Absorbs one event.
    pub fn apply(&mut self, seq: Seq, event: &Event) {
        self.seq = seq;
        let ev = match event {
            Event::Source(ev) => ev,
            Event::Decision(d) => {
                let patch = self.take_decision(d);
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
                    Entry::HostCompaction { summary, first_kept, replacement, .. } => Node::Compaction(Box::new(Compaction {
                        summary: summary.as_deref().map(summary_message),
                        first_kept: first_kept.clone(),
                        replacement: replacement.iter().map(|m| (Arc::new(m.clone()), self.meta(m))).collect(),
                    })),
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
                self.leaf = leaf.as_ref().and_then(|l| self.position(l));
                let inc = self.inc.get_mut().expect("render cache lock");
                if inc.leaf != self.leaf {
                    inc.valid = false;
                }
            }
            SourceEvent::ProviderUsage(u) => self.usage_anchor = Some((*u, self.leaf)),
            SourceEvent::RequestRetried => {
                self.overflow_streak = 0;
                self.overflow_checkpointed = false;
                self.overflow_failed = false;
                self.inc.get_mut().expect("render cache lock").valid = false;
            }
            SourceEvent::ProviderOverflow { .. } => {
                if let Some(l) = self.leaf.filter(|&l| matches!(&self.items[l].node, Node::Message(m, _) if matches!(**m, Message::Assistant { .. }))) {
                    self.overflowed.insert(l);
                }
                self.overflow_streak += 1;
                self.overflow_checkpointed = false;
                self.overflow_failed = false;
                self.inc.get_mut().expect("render cache lock").valid = false;
            }
            SourceEvent::PruneConfigured(_) => {
                self.config.take_in(ev);
                *self.phase_cache.get_mut().expect("phase cache lock") = PhaseCache::default();
                self.inc.get_mut().expect("render cache lock").valid = false;
            }
            // Only the pipeline reads these keys: nothing rendered changes.
            SourceEvent::LiveReadsConfigured { .. } => self.config.take_in(ev),
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
            Node::Compaction(_) => inc.valid = false,
            Node::Message(m, Meta::User) => Arc::make_mut(&mut inc.out).push(m.clone()),
            Node::Message(_, Meta::Assistant { empty: true, .. }) => inc.report.empty_assistants += 1,
            Node::Message(_, Meta::Failed) => inc.report.failed_turns += 1,
            Node::Message(m, Meta::Assistant { calls, dedup, .. }) => {
                let out = Arc::make_mut(&mut inc.out);
                let m = dedup.as_ref().unwrap_or(m);
                if dedup.is_some() {
                    inc.report.duplicate_calls += 1;
                }
                out.push(m.clone());
                for (&c, (id, name, _)) in calls.iter().zip(m.tool_calls()) {
                    inc.pending.insert(c, (out.len(), inc.report.synthetic_results.len()));
                    inc.report.synthetic_results.push(id.to_string());
                    out.push(synthetic(id, name));
                }
            }
            Node::Message(m, Meta::Result { call }) => match inc.pending.remove(call) {
                Some((pos, k)) => {
                    // Its synthetic result leaves the report when the render is next read (searched for and
                    // removed here, many parallel calls' results took time in the square of their number).
                    inc.answered.push(k);
                    Arc::make_mut(&mut inc.out)[pos] = m.clone();
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

    pub(super) fn meta(&mut self, m: &Message) -> Meta {
        match m {
            Message::User { .. } => Meta::User,
            Message::Assistant { stop: Some(condense_events::StopReason::Error | condense_events::StopReason::Aborted), .. } => Meta::Failed,
            Message::Assistant { content, model, stop, usage } => {
                // The calls in order, each id once (a set to look them up: a message of many parallel
                // calls searched a list for each); the blocks are copied only when an id repeats.
                let mut known: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
                let mut calls = Vec::new();
                let mut repeated = false;
                for id in m.tool_calls().map(|(id, _, _)| id) {
                    if known.insert(id) {
                        calls.push(self.intern(id));
                    } else {
                        repeated = true;
                    }
                }
                let dedup = repeated.then(|| {
                    let mut once: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
                    let kept = content.iter().filter(|b| !matches!(b, Block::ToolCall(c) if !once.insert(&c.id))).cloned().collect();
                    Arc::new(Message::Assistant { content: kept, model: model.clone(), stop: *stop, usage: usage.clone() })
                });
                Meta::Assistant { calls: calls.into_boxed_slice(), empty: content.is_empty(), dedup }
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
}
