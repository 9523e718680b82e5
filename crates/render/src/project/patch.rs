//! The prune-time views: a decision folded into the kept render in place (only the touched entries'
//! messages made again, a compressed chain spliced in) instead of the next render starting over.

use super::*;

/// How far from the end of the kept render a compressed chain is spliced in place (messages).
const SPLICE_REACH: usize = 4096;

impl Projection {
    /// Before decision `d` is folded: the entries whose message it changes, with the message each renders
    /// as now, when the kept render can take the change in place (see [`Projection::patch_render`]);
    /// `None` when the next render must start over.
    pub(super) fn patch_start(&self, d: &DecisionEvent) -> Option<Vec<(usize, Arc<Message>)>> {
        let mut inc = self.inc.lock().expect("render cache lock");
        if !inc.valid || self.decisions.recoveries > 0 || !self.decisions.checkpoints.is_empty() {
            return None;
        }
        let idx = &self.decisions;
        let entries: Vec<&str> = match d {
            DecisionEvent::OutputSpilled { ref_n, .. } | DecisionEvent::OutputStubbed { ref_n, .. } => idx.records.get(ref_n).map(|r| r.entry.as_str()).into_iter().collect(),
            DecisionEvent::BatchClosed { refs, .. } => {
                refs.iter().filter_map(|r| idx.records.get(r)).flat_map(|r| [r.entry.as_str(), r.call_entry.as_str()]).collect()
            }
            DecisionEvent::ErrorArgsPurged { entry, .. } => vec![entry.as_str()],
            // The chain's span is replaced whole, where nothing in the render was repaired.
            DecisionEvent::ChainCompressed(_) => {
                inc.drop_answered();
                return (inc.report.is_clean() && inc.pending.is_empty()).then(Vec::new);
            }
            DecisionEvent::ChainReplyCut { block, .. } => idx.chains.get(block).map(|c| c.compressed.last.as_str()).into_iter().collect(),
            _ => return None,
        };
        drop(inc);
        let mut cache = self.phase_cache.lock().expect("phase cache lock");
        let mut out: Vec<(usize, Arc<Message>)> =
            entries.iter().filter_map(|id| self.position(id)).filter_map(|i| Some((i, self.phased_at(&mut cache, i)?))).collect();
        out.sort_unstable_by_key(|(i, _)| *i);
        out.dedup_by_key(|(i, _)| *i);
        Some(out)
    }

    /// What the render phases make of entry `i`'s message now: phases 1 and 2, or, for the final reply
    /// of a compressed chain, phase 3's (`None`: the entry is no message).
    fn phased_at(&self, cache: &mut PhaseCache, i: usize) -> Option<Arc<Message>> {
        match (&self.items[i].node, self.marks.get(i)) {
            (Node::Message(m, _), Some(mk))
                if let Some(chain) = mk.chain_last.and_then(|b| self.decisions.chains.get(&b))
                    && self.entry_message(&chain.compressed.first).is_some_and(|f| f.is_prompt()) =>
            {
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
    pub(super) fn patch_render(&mut self, d: &DecisionEvent, old: Vec<(usize, Arc<Message>)>) {
        let mut inc = std::mem::take(self.inc.get_mut().expect("render cache lock"));
        {
            let mut cache = self.phase_cache.lock().expect("phase cache lock");
            for (i, before) in old {
                let Some(now) = self.phased_at(&mut cache, i) else { continue };
                if Arc::ptr_eq(&before, &now) {
                    continue;
                }
                // Left for the next read of the render; an entry replaced again keeps the message the
                // render still holds for it.
                match inc.replace.get_mut(&i) {
                    Some((_, pending)) => *pending = now,
                    None => {
                        inc.replace.insert(i, (before, now));
                    }
                }
            }
        }
        // Replacements still pending stay valid through a splice that takes none of their messages: they
        // find them by identity wherever the splice moves them (see `splice_chain`).
        if let DecisionEvent::ChainCompressed(ch) = d {
            inc.valid = self.splice_chain(&mut inc, &ch.first, &ch.last, ch.block);
        }
        // Checked on a copy, so the replacements stay pending in debug builds as they do in release ones.
        if cfg!(debug_assertions) && inc.valid {
            let mut settled = inc.clone();
            settled.settle();
            let full = self.render_full();
            assert_eq!((&settled.out, &settled.report), (&full.out, &full.report), "a decision patched into the kept render is the full render");
        }
        *self.inc.get_mut().expect("render cache lock") = inc;
    }

    /// Replaces, in a render with nothing repaired, the chain's messages from its prompt to its final
    /// reply by the prompt, the host context between, its block and the reply (thinking stripped), as
    /// phase 3 does; false when the
    /// chain's messages there are not exactly its own entries' (a result bound across the chain's edge).
    fn splice_chain(&self, inc: &mut Incremental, first: &str, last: &str, block: u32) -> bool {
        let branch = self.branch_view();
        let (Some(fi), Some(li)) = (self.position(first), self.position(last)) else { return false };
        let (Node::Message(fm, _), Node::Message(lm, _)) = (&self.items[fi].node, &self.items[li].node) else { return false };
        // The older turns of a chain still running leave the next render to start over.
        if !fm.is_prompt() {
            return false;
        }
        let (Some(bf), Some(bl)) = (branch.position(first), branch.position(last)) else { return false };
        let Some(chain) = self.decisions.chains.get(&block) else { return false };
        // Spliced in place only near the end of the render, where chains are compressed as a session
        // goes on; one further back (a first request carrying a long history) leaves the next render to
        // start over, once, where splicing each chain in turn moved the rest of the render every time.
        // A chain over an entry whose replacement is pending is spliced as the render stands after the
        // replacements, as when each decision took its own in at once.
        if (bf..=bl).any(|k| inc.replace.contains_key(&branch.item(k))) {
            inc.settle();
        }
        let reach = inc.out.len().saturating_sub(SPLICE_REACH);
        let Some(pf) = inc.out[reach..].iter().rposition(|m| Arc::ptr_eq(m, fm)).map(|k| reach + k) else { return false };
        let Some(pl) = inc.out[pf..].iter().position(|m| Arc::ptr_eq(m, lm)).map(|k| pf + k) else { return false };
        // With nothing repaired, the render holds each entry's message once: the chain's span in the render
        // must hold exactly its entries' messages.
        let own = (bf..=bl).filter(|&k| !self.overflowed.contains(&branch.item(k))).count();
        if bl < bf || pl - pf + 1 != own {
            return false;
        }
        let (block_msg, reply) = {
            let mut cache = self.phase_cache.lock().expect("phase cache lock");
            (chain_block(&mut cache, chain), self.chain_reply(&mut cache, chain, lm))
        };
        let host: Vec<Arc<Message>> = inc.out[pf + 1..pl].iter().filter(|m| m.is_host()).cloned().collect();
        Arc::make_mut(&mut inc.out).splice(pf..=pl, std::iter::once(fm.clone()).chain(host).chain([block_msg, reply]));
        inc.same = inc.same.min(pf);
        true
    }
}

impl Incremental {
    /// Takes the replacements decisions left pending into `out`: one pass from the end, where decisions
    /// mostly land, until every message replaced is found (each entry's message sits in the render once).
    pub(super) fn settle(&mut self) {
        self.drop_answered();
        if self.replace.is_empty() {
            return;
        }
        let replaced: HashMap<usize, Arc<Message>> = std::mem::take(&mut self.replace)
            .into_values()
            .filter(|(before, now)| !Arc::ptr_eq(before, now))
            .map(|(before, now)| (Arc::as_ptr(&before) as usize, now))
            .collect();
        if replaced.is_empty() {
            return;
        }
        let (mut first, mut left) = (usize::MAX, replaced.len());
        for (k, m) in Arc::make_mut(&mut self.out).iter_mut().enumerate().rev() {
            if let Some(new) = replaced.get(&(Arc::as_ptr(m) as usize)) {
                *m = new.clone();
                first = k;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        self.same = self.same.min(first);
    }

    /// Takes the synthetic results of calls answered since out of the report, in one pass, and moves the
    /// places the open calls keep for theirs accordingly.
    pub(super) fn drop_answered(&mut self) {
        if self.answered.is_empty() {
            return;
        }
        let mut gone = std::mem::take(&mut self.answered);
        gone.sort_unstable();
        gone.dedup();
        let mut next = gone.iter().peekable();
        let mut k = 0;
        self.report.synthetic_results.retain(|_| {
            let keep = next.next_if_eq(&&k).is_none();
            k += 1;
            keep
        });
        for (_, at) in self.pending.values_mut() {
            *at -= gone.partition_point(|&g| g < *at);
        }
    }
}
