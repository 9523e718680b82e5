//! The render phases over the active branch: host compaction and checkpoints, stub replace, the
//! errored-argument purge and condensed turns, chain compression, and the orphan sweep that repairs
//! tool-call pairing.

use super::*;

impl Projection {
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
        if inc.valid {
            inc.settle();
        } else {
            *inc = self.render_full();
        }
        let same = inc.same.min(inc.out.len());
        inc.same = inc.out.len();
        (Rendered { messages: inc.out.clone(), report: inc.report.clone() }, same)
    }

    /// How compressed chain `chain`'s final reply `m` renders: its cut text when the reply was cut
    /// (`ChainReplyCut`), else whole (thinking stripped when `thinkingStrip` is on).
    pub(super) fn chain_reply(&self, cache: &mut PhaseCache, chain: &condense_index::Chain, m: &Arc<Message>) -> Arc<Message> {
        let PhaseCache { base, own } = cache;
        cached(&mut own.replies, &base.replies, (chain.compressed.block, chain.reply.is_some()), || match (&chain.reply, &**m) {
            (Some(text), Message::Assistant { model, stop, usage, .. }) => {
                Arc::new(Message::Assistant { content: vec![Block::Text { text: text.clone() }], model: model.clone(), stop: *stop, usage: usage.clone() })
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
        self.phases(&raw, 3).into_iter().map(|(i, m, _)| (i.map(|i| &*self.items[i].id), m)).collect()
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

    pub(super) fn render_full(&self) -> Incremental {
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
        let newest = path.iter().rposition(|&i| matches!(self.items[i].node, Node::Compaction(_)));
        // Each message with the entry it came from (none for a compaction's summary and replacement).
        let mut raw: Vec<(Option<usize>, &Arc<Message>, &Meta)> = Vec::with_capacity(path.len() + 4);
        let start = match newest {
            None => 0,
            Some(c) => {
                let Node::Compaction(compaction) = &self.items[path[c]].node else {
                    unreachable!("position found by the match above")
                };
                let Compaction { summary, first_kept, replacement } = &**compaction;
                raw.extend(summary.iter().map(|m| (None, m, &Meta::User)));
                raw.extend(replacement.iter().map(|(m, meta)| (None, m, meta)));
                let kept_from = first_kept
                    .as_ref()
                    .and_then(|k| path[..c].iter().position(|&i| *self.items[i].id == **k))
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
    /// everything up to its boundary by its summary, the host context it covered (the newest message of
    /// each kind no later message replaces, verbatim) and the prompts it retained. A checkpoint whose
    /// boundary is not on the branch (another branch's) or was already dropped by a newer host compaction
    /// does not apply; older checkpoints never apply once a newer one does.
    fn apply_checkpoint<'a>(
        &'a self,
        path: &[usize],
        raw: Vec<(Option<usize>, &'a Arc<Message>, &'a Meta)>,
    ) -> Vec<(Option<usize>, &'a Arc<Message>, &'a Meta)> {
        for (n, cp) in self.decisions.checkpoints.iter().rev() {
            let Some(b) = self.position(&cp.boundary) else { continue };
            let Some(pos) = raw.iter().position(|(i, _, _)| *i == Some(b)) else {
                if path.contains(&b) {
                    return raw; // On the branch but before a newer host compaction: that one rules.
                }
                continue;
            };
            let Some(summary) = self.checkpoint_msgs.get(n) else { continue };
            let mut out = Vec::with_capacity(raw.len() - pos + cp.kept.len() + 1);
            out.push((None, summary, &Meta::User));
            // Host context the summary replaced: the newest of each kind, unless a newer one follows.
            let later: BTreeSet<&str> = raw[pos + 1..].iter().filter_map(|(_, m, _)| m.host_kind()).collect();
            let mut carried: BTreeSet<&str> = BTreeSet::new();
            let mut host = Vec::new();
            for &(i, m, meta) in raw[..=pos].iter().rev() {
                if let Some(kind) = m.host_kind() {
                    if !later.contains(&kind) && carried.insert(kind) {
                        host.push((i, m, meta));
                    }
                }
            }
            out.extend(host.into_iter().rev());
            for k in &cp.kept {
                if let Some(i) = self.position(k) {
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
    /// 3. chain compression: a compressed chain keeps its prompt, then the host context inside it
    ///    (verbatim), then its block, then its final reply (thinking stripped);
    /// 4. the orphan sweep is `repair`, which runs after these phases.
    pub(super) fn phases<'a>(&'a self, raw: &[(Option<usize>, &'a Arc<Message>, &'a Meta)], upto: u8) -> Vec<(Option<usize>, Arc<Message>, &'a Meta)> {
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
                    if last >= k && !m.is_prompt() {
                        // A block that does not start at a prompt stands for the older turns of a chain
                        // still running: the host context among them, then the block, in their place.
                        out.extend(raw[k..=last].iter().filter(|(_, h, _)| h.is_host()).map(|&(hi, h, hmeta)| (hi, h.clone(), hmeta)));
                        out.push((None, chain_block(&mut cache, chain), &Meta::User));
                        k = last + 1;
                        continue;
                    }
                    if last > k {
                        out.push((item, m.clone(), meta));
                        // Host context inside the chain stays, verbatim and in order, ahead of the block.
                        out.extend(raw[k + 1..last].iter().filter(|(_, h, _)| h.is_host()).map(|&(hi, h, hmeta)| (hi, h.clone(), hmeta)));
                        out.push((None, chain_block(&mut cache, chain), &Meta::User));
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
    pub(super) fn phase_message(
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
                    let id = &*self.items[i].id;
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
        Message::Assistant { content, model, stop, usage } if content.iter().any(|b| matches!(b, Block::Thinking(_))) => {
            let content: Vec<Block> = content.iter().filter(|b| !matches!(b, Block::Thinking(_))).cloned().collect();
            Arc::new(Message::Assistant { content, model: model.clone(), stop: *stop, usage: usage.clone() })
        }
        _ => m.clone(),
    }
}

/// The stub that stands for a pruned output: same bytes on every render.
pub(super) fn stub(idx: &Index, rec: &condense_events::Record, original: &Message) -> Message {
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
        .filter(|b| !(cfg.thinking_strip && matches!(b, Block::Thinking(_))))
        .map(|b| match b {
            Block::ToolCall(mut c) if cfg.condense_args_chars > 0 => {
                let r = refs.iter().copied().find(|r| idx.records.get(r).is_some_and(|rec| rec.call_id == c.id));
                match r {
                    Some(r) if !idx.purged.contains_key(&(entry.to_string(), c.id.clone())) => {
                        c.arguments = crate::args::shorten(&c.arguments, cfg.condense_args_chars as usize, r);
                    }
                    _ => {}
                }
                Block::ToolCall(c)
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
            Block::ToolCall(c) if idx.purged.contains_key(&(entry.to_string(), c.id.clone())) => {
                let chars = idx.purged[&(entry.to_string(), c.id.clone())];
                Block::tool_call(
                    c.id.clone(),
                    c.name.clone(),
                    format!("{{\"purged\":\"arguments of a failed call ({chars} chars) removed\"}}"),
                )
            }
            other => other.clone(),
        })
        .collect();
    Message::Assistant { content, model: model.clone(), stop: *stop, usage: usage.clone() }
}

pub(super) fn synthetic(id: &str, name: &str) -> Arc<Message> {
    Arc::new(Message::ToolResult {
        call_id: id.to_string(),
        tool_name: name.to_string(),
        content: vec![Block::Text { text: SYNTHETIC_RESULT_TEXT.to_string() }],
        is_error: true,
    })
}

pub(super) fn repair(raw: &[(&Arc<Message>, &Meta)], ids: usize) -> Incremental {
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
            Meta::User | Meta::Failed => {}
        }
    }
    // Pass 2: emit, placing results right after their calls.
    let mut out: Vec<Arc<Message>> = Vec::with_capacity(raw.len());
    let mut slot = 0usize;
    // Where each call's synthetic result landed in `out` and its id in the report, for calls still open
    // at the end.
    let mut synthetic_at: Vec<(usize, usize)> = vec![(usize::MAX, 0); answers.len()];
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
                            synthetic_at[base + k] = (out.len(), report.synthetic_results.len());
                            report.synthetic_results.push(id.to_string());
                            out.push(synthetic(id, name));
                        }
                        r => out.push(raw[r as usize - 1].0.clone()),
                    }
                }
            }
            Meta::Result { .. } => {}
            Meta::Failed => report.failed_turns += 1,
            Meta::User => out.push((*m).clone()),
        }
    }
    let mut pending = HashMap::default();
    for (c, &slot) in open.iter().enumerate() {
        if slot != 0 && synthetic_at[slot as usize - 1].0 != usize::MAX {
            pending.insert(c as u32, synthetic_at[slot as usize - 1]);
        }
    }
    Incremental { valid: true, leaf: None, out: Arc::new(out), report, pending, answered: Vec::new(), same: 0, replace: BTreeMap::new() }
}
