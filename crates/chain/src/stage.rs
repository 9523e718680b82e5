//! The chain stage: closed chains older than the rolling window become one block each
//! (`ChainCompressed`), unless a recovery inside one is still in its grace window; the long final reply of
//! a compressed chain is cut (`ChainReplyCut`) at the first prune where its chain is not the newest.
//!
//! A block lists the names its chain's turns used that came from earlier tool outputs, once for the
//! blocks in the context (those after the latest checkpoint on the branch).
//!
//! State: every compressed chain's block by its first entry and the compressed chains whose reply is not
//! cut yet, folded from the log (a block's names are read from its body in the index). Cache: the closed chains of the branch found so far
//! (scanned only where the branch grew) and how many of the first ones are compressed, the facts of the
//! branch's outputs and user messages ([`FactsSeen`]) and the names the blocks in the context list; all
//! are dropped when the branch's shape is rebuilt.

use crate::{block_body_with, names_listed, reply_cut, CallInfo, ChainScan, FactsSeen, Span};
use condense_events::{ChainCompressed, DecisionEvent, Event, Message, Record, QUERY_TOOL_NAME};
use condense_stage::{is_final_reply, Pass, Stage, StageError};
use std::collections::{BTreeMap, BTreeSet};

/// The chain stage.
#[derive(Debug, Clone, Default)]
pub struct Chains {
    /// Every compressed chain's block, by the chain's first entry (folded from the log).
    blocks: BTreeMap<String, u32>,
    /// The shape generation the spans belong to.
    generation: u64,
    /// Messages of the branch scanned.
    covered: usize,
    scan: ChainScan,
    spans: Vec<Span>,
    /// How many of the first spans are compressed (a chain once compressed stays so).
    compressed: usize,
    /// Compressed chains whose final reply is not cut (yet): block → the reply's entry. Folded from the
    /// log; a block whose reply proves too short to cut is dropped when it is looked at (a pure function
    /// of the log all the same).
    uncut: BTreeMap<u32, String>,
    /// Chains the last `decide` compressed whose final reply proved too short to cut (block, first
    /// entry): their compression, once folded, does not put them in `uncut` for the next prune to look at
    /// again (that look would drop them, so the state is the same). Cleared by every `decide`: only the
    /// fold of its own decisions reads it.
    short_now: BTreeSet<(u32, String)>,
    /// Cache: the facts of the branch's outputs and user messages, scanned as far as chains were compressed.
    seen: FactsSeen,
    /// Cache: the names listed by the blocks on the branch after the latest checkpoint (its boundary's
    /// position, `None` before any), the chains those blocks stand for, and how many of the first spans
    /// need no look again.
    listed: BTreeSet<String>,
    listed_firsts: BTreeSet<String>,
    listed_after: Option<Option<usize>>,
    listed_scan: usize,
}

impl Chains {
    /// Takes in the branch's messages not scanned yet (all of them when the shape was rebuilt).
    fn follow(&mut self, pass: &Pass<'_>) {
        if self.generation != pass.shape.generation() || self.covered > pass.branch.count() {
            *self = Chains {
                blocks: std::mem::take(&mut self.blocks),
                uncut: std::mem::take(&mut self.uncut),
                generation: pass.shape.generation(),
                ..Chains::default()
            };
        }
        for i in self.covered..pass.branch.count() {
            let m = pass.branch.entry(i).1;
            let prompt = m.is_prompt();
            if let Some(span) = self.scan.step(i, prompt, is_final_reply(m), m.tool_calls().next().is_some()) {
                self.spans.push(span);
            }
        }
        self.covered = pass.branch.count();
    }
}

impl Chains {
    /// Brings [`Chains::listed`] to the blocks on the branch after the latest checkpoint (a checkpoint
    /// stands for the blocks before its boundary, which leave the context).
    fn follow_listed(&mut self, pass: &Pass<'_>) {
        let branch = pass.branch;
        let boundary = pass.index.checkpoints.values().next_back().and_then(|c| pass.position(&c.boundary));
        if self.listed_after != Some(boundary) {
            self.listed.clear();
            self.listed_firsts.clear();
            self.listed_after = Some(boundary);
            self.listed_scan = 0;
        }
        let mut settled = true;
        for (i, span) in self.spans.iter().enumerate().skip(self.listed_scan) {
            let first = branch.entry(span.first).0;
            // A block before the boundary left the context; a block in it lists its names (read from its
            // body in the index) once.
            let done = boundary.is_some_and(|b| span.first <= b)
                || self.listed_firsts.contains(first)
                || self.blocks.get(first).is_some_and(|b| {
                    let body = pass.index.chains.get(b).map_or("", |c| c.compressed.body.as_str());
                    self.listed.extend(names_listed(body));
                    self.listed_firsts.insert(first.to_string());
                    true
                });
            settled &= done;
            if settled {
                self.listed_scan = i + 1;
            }
        }
    }
}

impl Stage for Chains {
    fn name(&self) -> &'static str {
        "chain"
    }

    fn fold(&mut self, event: &Event) {
        match event {
            Event::Decision(DecisionEvent::ChainCompressed(ch)) => {
                self.blocks.insert(ch.first.clone(), ch.block);
                if !self.short_now.remove(&(ch.block, ch.first.clone())) {
                    self.uncut.insert(ch.block, ch.last.clone());
                }
            }
            Event::Decision(DecisionEvent::ChainReplyCut { block, .. }) => {
                self.uncut.remove(block);
            }
            _ => {}
        }
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        self.short_now.clear();
        self.follow(pass);
        self.follow_listed(pass);
        let branch = pass.branch;
        let compressed = |first: usize| self.blocks.contains_key(branch.entry(first).0);
        let mut done = self.compressed;
        while self.spans.get(done).is_some_and(|s| compressed(s.first)) {
            done += 1;
        }
        let keep = pass.config.rolling_window as usize;
        let mut block = pass.index.next_block();
        // Names a block of this pass lists already.
        let mut listed_now: BTreeSet<String> = BTreeSet::new();
        let newest = self.spans.last().map(|s| s.last);
        let mut blocks = Vec::new();
        // The chains this pass compresses: block and the position of the final reply.
        let mut compressed_now = Vec::new();
        for span in self.spans.iter().take(self.spans.len().saturating_sub(keep)).skip(done) {
            if compressed(span.first) {
                continue;
            }
            let inside: Vec<&Record> = (span.first..=span.last).filter_map(|i| pass.record_of(branch.entry(i).0)).collect();
            if inside.iter().any(|r| held(pass, r)) {
                continue;
            }
            blocks.push(Chains::block_for(&mut self.seen, &self.listed, pass, span.first, span.last, &inside, block, &mut listed_now, false));
            compressed_now.push((block, span.last, Some(span.first)));
            block += 1;
        }
        // The older turns of the chain still running, once long enough (`SEGMENT_MIN_CALLS`).
        if let Some((first, last)) = self.open_segment(pass) {
            let inside: Vec<&Record> = (first..=last).filter_map(|i| pass.record_of(branch.entry(i).0)).collect();
            blocks.push(Chains::block_for(&mut self.seen, &self.listed, pass, first, last, &inside, block, &mut listed_now, true));
            // Its last message is a tool result, no reply to cut.
            self.short_now.insert((block, branch.entry(first).0.to_string()));
        }
        // At a prune (batches closed or chains compressed), the long reply of every compressed chain but
        // the newest closed one (what the user is answering) is cut: those compressed now and those left
        // whole earlier. The cut rides on a cache break that happens anyway.
        if pass.batches_closed() > 0 || !compressed_now.is_empty() {
            let earlier = self.uncut.iter().filter_map(|(&b, last)| Some((b, pass.position(last)?, None)));
            let mut short = Vec::new();
            for (b, i, first) in compressed_now.into_iter().chain(earlier) {
                if Some(i) == newest {
                    continue;
                }
                match reply_cut(b, branch.entry(i).1) {
                    Some(text) => blocks.push(DecisionEvent::ChainReplyCut { block: b, text }),
                    None => short.push((b, first)),
                }
            }
            for (b, first) in short {
                match first {
                    Some(f) => drop(self.short_now.insert((b, branch.entry(f).0.to_string()))),
                    None => drop(self.uncut.remove(&b)),
                }
            }
        }
        self.compressed = done;
        pass.extend(blocks);
        Ok(())
    }
}

/// Whether output `r` holds back the block that would take it out of the context: a recovery still in its
/// grace window (seed 000, Implementation 2), or a file read `liveReadsTokens` keeps verbatim until it is
/// stubbed.
fn held(pass: &Pass<'_>, r: &Record) -> bool {
    let grace = pass.config.recovery_grace_turns as u32;
    (r.tool == QUERY_TOOL_NAME && grace > 0 && pass.shape.utg().saturating_sub(r.utg) <= grace) || (pass.config.live_reads_tokens > 0 && pass.kept_verbatim(r))
}

impl Chains {
    /// The block that stands for the branch's messages `first..=last` (a closed chain from its prompt to
    /// its final reply, or the older turns of a chain still running), `inside` their records: a line per
    /// output and the names the turns carried over from earlier outputs, less those a block in the
    /// context or of this pass (`listed_now`, which takes this block's) lists already; with `running`
    /// (the older turns of a chain still running) each output's names too, which its later turns go on
    /// using.
    #[allow(clippy::too_many_arguments)]
    fn block_for(seen: &mut FactsSeen, listed: &BTreeSet<String>, pass: &Pass<'_>, first: usize, last: usize, inside: &[&Record], block: u32, listed_now: &mut BTreeSet<String>, running: bool) -> DecisionEvent {
        let branch = pass.branch;
        let protected: BTreeMap<u32, std::borrow::Cow<'_, str>> = inside.iter().filter(|r| r.protected).map(|r| (r.ref_n, pass.text_of(r))).collect();
        let mut infos = Vec::new();
        for i in first..=last {
            let (entry, m) = branch.entry(i);
            for (cid, name, args) in m.tool_calls() {
                let rec = inside.iter().find(|r| r.call_id == cid && r.call_entry == entry);
                infos.push(CallInfo {
                    ref_n: rec.map(|r| r.ref_n),
                    tool: name,
                    arguments: args,
                    summary: rec.and_then(|r| pass.summary(r.ref_n)),
                    protected_output: rec.and_then(|r| protected.get(&r.ref_n)).map(|t| &**t),
                    output_chars: rec.map_or(0, |r| r.chars),
                });
            }
        }
        // The names the chain's turns carried over from earlier outputs, less those a block in the
        // context lists already.
        while seen.scanned() <= last {
            seen.add(branch.entry(seen.scanned()).1);
        }
        let used = seen.used_names(last, (first..=last).map(|i| &**branch.entry(i).1));
        let fresh: Vec<&str> = used.iter().map(String::as_str).filter(|n| !listed.contains(*n) && !listed_now.contains(*n)).collect();
        let body = block_body_with(block, &infos, &fresh, running);
        listed_now.extend(names_listed(&body));
        DecisionEvent::ChainCompressed(Box::new(ChainCompressed {
            block,
            first: branch.entry(first).0.to_string(),
            last: branch.entry(last).0.to_string(),
            refs: inside.iter().map(|r| r.ref_n).collect(),
            body,
        }))
    }

    /// The older turns of the chain still running that a block can stand for now, as branch positions
    /// (the first after its prompt or after its last such block, and the last before its
    /// [`SEGMENT_KEEP_TURNS`] newest turns): every call in them answered inside them, every output in
    /// them pruned (its batch closed, no read kept verbatim, no recovery in its grace window), at least
    /// [`SEGMENT_MIN_CALLS`] calls. `None` when there are none (or no chain is running).
    fn open_segment(&self, pass: &Pass<'_>) -> Option<(usize, usize)> {
        let (start, tools) = (self.scan.start?, self.scan.tools);
        if !tools {
            return None;
        }
        let branch = pass.branch;
        let n = branch.count();
        // After the blocks that stand for its older turns already.
        let mut cursor = start + 1;
        while cursor < n
            && let Some(b) = self.blocks.get(branch.entry(cursor).0)
        {
            cursor = pass.index.chains.get(b).and_then(|c| pass.position(&c.compressed.last))? + 1;
        }
        // Where a turn starts with every call before it answered (a block may end before it), with the
        // calls before it; a turn whose outputs may not go yet (not pruned, a read kept verbatim, a
        // recovery in its grace window) ends the search.
        let mut pending: BTreeSet<&str> = BTreeSet::new();
        let (mut starts, mut calls) = (Vec::new(), 0usize);
        for i in cursor..n {
            let (entry, m) = branch.entry(i);
            match &**m {
                Message::Assistant { .. } => {
                    if pending.is_empty() {
                        starts.push((i, calls));
                    }
                    for (cid, _, _) in m.tool_calls() {
                        pending.insert(cid);
                        calls += 1;
                    }
                }
                Message::ToolResult { call_id, .. } => {
                    pending.remove(call_id.as_str());
                    let ready = pass.record_of(entry).is_none_or(|r| pass.outcome(r.batch).is_some() && !held(pass, r));
                    if !ready {
                        // The turn holding it (the newest start) stays, and the newest turns are
                        // counted before it.
                        starts.pop();
                        break;
                    }
                }
                Message::User { .. } => {}
            }
        }
        let end = starts.len().checked_sub(crate::SEGMENT_KEEP_TURNS)?;
        let (next, calls) = *starts.get(end)?;
        (calls >= crate::SEGMENT_MIN_CALLS && next > cursor).then(|| (cursor, next - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::PruneConfig;
    use condense_stage::testing::{calls, prompt, record, reply, result, Given, Recorded};
    use condense_stage::Trigger;

    fn chain(log: &mut Recorded, n: u32) {
        log.message(&format!("u{n}"), prompt("task"), &mut []);
        log.message(&format!("a{n}"), calls(&[(&format!("c{n}"), "read", r#"{"path":"f.rs"}"#)]), &mut []);
        log.message(&format!("r{n}"), result(&format!("c{n}"), "read", "text", false), &mut []);
        log.message(&format!("f{n}"), reply("done"), &mut []);
    }

    /// Against a recorded log: with a rolling window of one, every closed chain but the newest becomes a
    /// block naming its outputs, once; a stage folded afresh from the log compresses nothing twice; a
    /// chain holding a recovery inside its grace window waits.
    #[test]
    fn closed_chains_outside_the_window_are_compressed_once() {
        let mut log = Recorded::new(PruneConfig { rolling_window: 1, ..PruneConfig::default() });
        let mut stage = Chains::default();
        chain(&mut log, 1);
        assert_eq!(log.run(&mut [&mut stage], Trigger::Request).unwrap(), vec![], "the newest chain stays");
        chain(&mut log, 2);
        let given = Given(vec![(record(1, 1, "r1", "a1", "c1", "read", "text", "h"), "text".into())]);
        let d = log.run(&mut [&mut { given }, &mut stage], Trigger::Request).unwrap();
        let DecisionEvent::ChainCompressed(ch) = &d[1] else { panic!("{d:?}") };
        let ChainCompressed { block: 1, first, last, refs, body } = &**ch else { panic!("{d:?}") };
        assert_eq!((first.as_str(), last.as_str(), refs.as_slice()), ("u1", "f1", &[1][..]));
        assert!(body.starts_with("[Compressed chain b1: 1 tool call; outputs t1]"), "{body}");
        let mut fresh = Chains::default();
        for e in log.events() {
            fresh.fold(e);
        }
        assert_eq!(log.run(&mut [&mut fresh], Trigger::Request).unwrap(), vec![]);
        // A recovery in chain 3, read in the grace window: chain 3 waits while chain 4 is the newest.
        log.message("u3", prompt("task"), &mut []);
        log.message("a3", calls(&[("q3", QUERY_TOOL_NAME, "{}")]), &mut []);
        log.message("r3", result("q3", QUERY_TOOL_NAME, "original", false), &mut []);
        log.message("f3", reply("done"), &mut []);
        chain(&mut log, 4);
        let mut q = record(2, 2, "r3", "a3", "q3", QUERY_TOOL_NAME, "original", "q");
        q.utg = 3;
        let d = log.run(&mut [&mut Given(vec![(q, "original".into())]), &mut stage], Trigger::Request).unwrap();
        let blocks: Vec<&str> = d.iter().filter_map(|d| match d { DecisionEvent::ChainCompressed(ch) => Some(ch.first.as_str()), _ => None }).collect();
        assert_eq!(blocks, vec!["u2"], "{d:?}");
    }

    /// A block lists the names its chain's turns used that an earlier output showed them, once for the
    /// blocks in the context: a later block leaves out what an earlier one lists, until a checkpoint
    /// takes the earlier block out of the context. A stage folded afresh from the log decides the same.
    #[test]
    fn blocks_list_the_names_used_once_until_a_checkpoint() {
        let mut log = Recorded::new(PruneConfig { rolling_window: 1, ..PruneConfig::default() });
        let mut stage = Chains::default();
        let turn = |log: &mut Recorded, n: u32, output: &str, answer: &str| {
            log.message(&format!("u{n}"), prompt("go on"), &mut []);
            log.message(&format!("a{n}"), calls(&[(&format!("c{n}"), "read", r#"{"path":"f.rs"}"#)]), &mut []);
            log.message(&format!("r{n}"), result(&format!("c{n}"), "read", output, false), &mut []);
            log.message(&format!("f{n}"), reply(answer), &mut []);
        };
        let given = |n: u32, output: &str| Given(vec![(record(n, n, &format!("r{n}"), &format!("a{n}"), &format!("c{n}"), "read", output, &format!("h{n}")), output.into())]);
        let body = |d: &[DecisionEvent]| {
            d.iter()
                .find_map(|d| match d {
                    DecisionEvent::ChainCompressed(ch) => Some(ch.body.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no block: {d:?}"))
        };
        let (o1, o2, o3) = ("fn parse_config() -> ConfigError", "fn load_all() { parse_config() }", "load_all and parse_config");
        turn(&mut log, 1, o1, "parse_config returns ConfigError; my_new_name is mine");
        log.run(&mut [&mut given(1, o1), &mut stage], Trigger::Request).unwrap();
        turn(&mut log, 2, o2, "load_all calls parse_config");
        let d = log.run(&mut [&mut given(2, o2), &mut stage], Trigger::Request).unwrap();
        assert!(body(&d).ends_with("\nnames used: parse_config, ConfigError"), "{}", body(&d));
        turn(&mut log, 3, o3, "load_all again, with parse_config");
        let mut fresh = Chains::default();
        for e in log.events() {
            fresh.fold(e);
        }
        let d = log.run(&mut [&mut given(3, o3), &mut fresh], Trigger::Request).unwrap();
        assert!(body(&d).ends_with("\nnames used: load_all"), "{}", body(&d));
        // A checkpoint covering chains 1 and 2 takes their blocks out: chain 3's block lists their names again.
        log.append(
            Event::Decision(DecisionEvent::CheckpointCommitted(Box::new(condense_events::CheckpointCommitted {
                n: 1,
                boundary: "f2".into(),
                summary: "s".into(),
                kept: Vec::new(),
                covers: vec![1, 2],
                recovery: false,
                bounded: Vec::new(),
                tokens_before: 0,
                tokens_after: 0,
            }))),
            &mut [&mut fresh],
        );
        turn(&mut log, 4, "x", "done");
        let d = log.run(&mut [&mut given(4, "x"), &mut fresh], Trigger::Request).unwrap();
        assert!(body(&d).ends_with("\nnames used: load_all, parse_config"), "{}", body(&d));
    }
    /// A chain still running: once its turns before the [`crate::SEGMENT_KEEP_TURNS`] newest hold at
    /// least [`crate::SEGMENT_MIN_CALLS`] calls whose outputs are pruned, a block stands for them (from
    /// the first message after the prompt to the last result before the turns that stay); the next
    /// block starts after it; a turn whose output is not pruned yet stays with the turns after it; a
    /// stage folded afresh from the log decides the same; the final reply compresses the chain whole.
    #[test]
    fn the_older_turns_of_a_running_chain_become_a_block() {
        let mut log = Recorded::new(PruneConfig::default());
        let mut stage = Chains::default();
        let (keep, min) = (crate::SEGMENT_KEEP_TURNS as u32, crate::SEGMENT_MIN_CALLS as u32);
        log.message("u", prompt("do it all"), &mut []);
        // Turn n: one call and its result, its output captured in batch n and (when `closed`) pruned.
        let turn = |log: &mut Recorded, stage: &mut Chains, n: u32, closed: bool| {
            let (a, c, r) = (format!("a{n}"), format!("c{n}"), format!("r{n}"));
            log.message(&a, calls(&[(&c, "read", r#"{"path":"f.rs"}"#)]), &mut [&mut *stage]);
            log.message(&r, result(&c, "read", "text of f.rs", false), &mut [&mut *stage]);
            let mut given = Given(vec![(record(n, n, &r, &a, &c, "read", "text of f.rs", &format!("h{n}")), "text of f.rs".into())]);
            let d = log.run(&mut [&mut given], Trigger::Request).unwrap();
            assert_eq!(d.len(), 1, "{d:?}");
            if closed {
                let summaries = vec![(n, format!("t{n} read (f.rs): 12 chars, 1 lines\n  names: item_{n} load_{n}"))];
                log.append(Event::Decision(DecisionEvent::BatchClosed { batch: n, refs: vec![n], outcome: condense_events::BatchOutcome::Summarized, summaries }), &mut [&mut *stage]);
            }
        };
        let segments = |d: &[DecisionEvent]| -> Vec<(String, String, Vec<u32>)> {
            d.iter()
                .filter_map(|d| match d {
                    DecisionEvent::ChainCompressed(ch) => Some((ch.first.clone(), ch.last.clone(), ch.refs.clone())),
                    _ => None,
                })
                .collect()
        };
        // One call short: nothing.
        for n in 1..min + keep {
            turn(&mut log, &mut stage, n, true);
        }
        assert_eq!(log.run(&mut [&mut stage], Trigger::Request).unwrap(), vec![]);
        // The turn that makes `min` calls before the newest `keep`: the first `min` turns become block 1.
        turn(&mut log, &mut stage, min + keep, true);
        let d = log.run(&mut [&mut stage], Trigger::Request).unwrap();
        assert_eq!(segments(&d), vec![("a1".to_string(), format!("r{min}"), (1..=min).collect())], "{d:?}");
        let DecisionEvent::ChainCompressed(ch) = &d[0] else { panic!() };
        assert!(ch.body.starts_with(&format!("[Compressed chain b1]\nt1 read (f.rs): 12 chars\n  names: item_1 load_1\nt2 read")), "{}", ch.body);
        assert_eq!(log.run(&mut [&mut stage], Trigger::Request).unwrap(), vec![], "compressed once");
        // `min` more turns, the newest of them not pruned: it and the `keep` before it stay.
        for n in min + keep + 1..=2 * min + keep {
            turn(&mut log, &mut stage, n, n < 2 * min + keep);
        }
        let mut fresh = Chains::default();
        for e in log.events() {
            fresh.fold(e);
        }
        // The turns after block 1 and before the `keep` that stay hold `min - 1` calls.
        let d = log.run(&mut [&mut fresh], Trigger::Request).unwrap();
        assert_eq!(d, vec![], "{d:?}");
        // Pruned, the newest turn lets the next `min` go, after block 1.
        log.append(
            Event::Decision(DecisionEvent::BatchClosed { batch: 2 * min + keep, refs: vec![2 * min + keep], outcome: condense_events::BatchOutcome::SkippedTrivial, summaries: Vec::new() }),
            &mut [&mut fresh],
        );
        let d = log.run(&mut [&mut fresh], Trigger::Request).unwrap();
        assert_eq!(segments(&d), vec![(format!("a{}", min + 1), format!("r{}", 2 * min), (min + 1..=2 * min).collect())], "{d:?}");
        // The final reply: the chain whole, from its prompt, with every output.
        log.message("f", reply("done"), &mut [&mut fresh]);
        let d = log.run(&mut [&mut fresh], Trigger::Request).unwrap();
        assert_eq!(segments(&d), vec![("u".to_string(), "f".to_string(), (1..=2 * min + keep).collect())], "{d:?}");
        // The chain's block, once it closed, keeps each output's first line alone.
        let DecisionEvent::ChainCompressed(ch) = &d[0] else { panic!() };
        assert!(ch.body.contains("\nt1 read (f.rs): 12 chars\nt2 read") && !ch.body.contains("names: item_"), "{}", ch.body);
    }
}
