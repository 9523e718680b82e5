//! The summarize stage: which pending batches close before this request, and how (trivial, all
//! duplicates, summarized, or kept because the summaries would be longer). Its state is the index's
//! pending batches, so it keeps nothing of its own: it is made for a pass, with the summarizer the host
//! uses now.

use crate::{Item, Summarizer};
use condense_events::{BatchOutcome, DecisionEvent, PruneConfig, PruneOn, Record, AUTONOMOUS_AFTER_TURNS, AWAITING_REPLY_BUDGET, FIRST_TURNS_BUDGET, IN_THE_LOOP_PROMPTS};
use condense_stage::{Pass, Shape, Stage, StageError, Trigger};
use std::collections::{BTreeMap, BTreeSet};

/// The summarize stage, for one pass.
pub struct Close<'s> {
    summarizer: &'s dyn Summarizer,
}

impl<'s> Close<'s> {
    /// The stage, summarizing with `summarizer`.
    pub fn new(summarizer: &'s dyn Summarizer) -> Self {
        Close { summarizer }
    }

    /// The summaries of `recs`, one each, and how many bytes their originals hold.
    fn summaries(&self, pass: &Pass<'_>, recs: &[&Record]) -> Result<(Vec<String>, usize), StageError> {
        if recs.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let bodies: Vec<std::borrow::Cow<'_, str>> = recs.iter().map(|r| pass.text_of(r)).collect();
        let items: Vec<Item<'_>> =
            recs.iter().zip(&bodies).map(|(r, text)| Item { ref_n: r.ref_n, tool: &r.tool, arguments: &r.arguments, text, is_error: r.is_error }).collect();
        let sums = self.summarizer.summarize(&items).map_err(|e| StageError { stage: "summarize", reason: e.to_string() })?;
        Ok((sums, bodies.iter().map(|b| b.len()).sum()))
    }
}

impl Stage for Close<'_> {
    fn name(&self) -> &'static str {
        "summarize"
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        let (cfg, idx, shape) = (pass.config, pass.index, pass.shape);
        let mut pending: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
        for &b in idx.open_batches.iter() {
            pending.insert(b, idx.batches[&b].iter().map(|r| &*idx.records[r]).collect());
        }
        for (r, _) in pass.captured() {
            pending.entry(r.batch).or_default().push(r);
        }
        let read_before = |limit: Option<usize>, recs: &[&Record]| {
            limit.is_some_and(|l| recs.iter().all(|r| pass.position(&r.entry).is_some_and(|p| p < l)))
        };
        let seen: Vec<u32> = pending.iter().filter(|(_, recs)| read_before(shape.last_assistant(), recs)).map(|(b, _)| *b).collect();
        let closing: Vec<u32> = match pass.trigger {
            Trigger::Now => seen,
            Trigger::Request => {
                // Outputs a checkpoint took in are not in the context any more: they weigh nothing on
                // the budget (counted, they pruned the turn after a checkpoint early, a break of its own).
                let boundary = idx.checkpoints.values().filter_map(|c| pass.position(&c.boundary)).max();
                let visible = |r: &Record| boundary.is_none_or(|b| pass.position(&r.entry).is_none_or(|p| p > b));
                let verbatim_tokens: u64 = seen
                    .iter()
                    .flat_map(|b| pending[b].iter())
                    .filter(|r| visible(r) && !r.protected && !idx.spills.contains_key(&r.ref_n))
                    .map(|r| r.chars.div_ceil(4))
                    .sum();
                let threshold = budget_threshold(cfg, shape);
                if threshold > 0 && verbatim_tokens >= threshold {
                    seen
                } else if cfg.prune_on == PruneOn::AgentMessage {
                    pending.iter().filter(|(_, recs)| read_before(shape.last_final(), recs)).map(|(b, _)| *b).collect()
                } else {
                    Vec::new()
                }
            }
        };
        // `liveReadsTokens`: the newest live file reads that fit stay verbatim; earlier ones no longer
        // live or no longer in the budget get their stubs now.
        // In an autonomous run none is kept (those kept before it get their stubs as its batches close).
        let (keep, stub_now) = if cfg.live_reads_tokens > 0 && !closing.is_empty() {
            live_reads(pass, &closing, &pending, if autonomous_run(cfg, shape) { 0 } else { cfg.live_reads_tokens })
        } else {
            (BTreeSet::new(), Vec::new())
        };
        let mut closed = Vec::with_capacity(closing.len() + stub_now.len());
        for b in closing {
            let recs = &pending[&b];
            let refs: Vec<u32> = recs.iter().map(|r| r.ref_n).collect();
            let total: u64 = recs.iter().map(|r| r.chars).sum();
            let (outcome, summaries) = if total < cfg.min_batch_chars {
                (BatchOutcome::SkippedTrivial, Vec::new())
            } else if recs.iter().all(|r| pass.is_aliased(r.ref_n)) {
                (BatchOutcome::SkippedDeduped, Vec::new())
            } else {
                let todo: Vec<&Record> =
                    recs.iter().copied().filter(|r| !pass.is_aliased(r.ref_n) && !pass.is_spilled(r.ref_n) && !r.protected && !keep.contains(&r.ref_n)).collect();
                let (sums, raw) = self.summaries(pass, &todo)?;
                let short: usize = sums.iter().map(String::len).sum();
                if !todo.is_empty() && short >= raw {
                    (BatchOutcome::SkippedOversized, Vec::new())
                } else {
                    (BatchOutcome::Summarized, todo.iter().map(|r| r.ref_n).zip(sums).collect())
                }
            };
            closed.push(DecisionEvent::BatchClosed { batch: b, refs, outcome, summaries });
        }
        let (sums, _) = self.summaries(pass, &stub_now)?;
        closed.extend(stub_now.iter().zip(sums).map(|(r, summary)| DecisionEvent::OutputStubbed { ref_n: r.ref_n, summary }));
        pass.extend(closed);
        Ok(())
    }
}

/// The budget trigger's threshold for this request (0: off). Under `pruneOn: agent-message` it depends
/// on whether a final reply is to be expected, since the reply prunes everything read at once and each
/// prune before it is one more cache break:
/// - the user is in the loop ([`IN_THE_LOOP_PROMPTS`] prompts have answered a final reply): the trigger
///   waits for [`AWAITING_REPLY_BUDGET`] tokens;
/// - not yet, in the first [`AUTONOMOUS_AFTER_TURNS`] turns: [`FIRST_TURNS_BUDGET`];
/// - not yet, after that: an autonomous run, where no reply comes to prune: `autoBudgetThreshold`.
///
/// A configured threshold larger than these applies everywhere.
pub fn budget_threshold(cfg: &PruneConfig, shape: &Shape) -> u64 {
    let t = cfg.auto_budget_threshold;
    if t == 0 || cfg.prune_on != PruneOn::AgentMessage || autonomous_run(cfg, shape) {
        t
    } else if shape.answered() >= IN_THE_LOOP_PROMPTS {
        t.max(AWAITING_REPLY_BUDGET)
    } else {
        t.max(FIRST_TURNS_BUDGET)
    }
}

/// Whether the session is in an autonomous run (under `pruneOn: agent-message`, past the first
/// [`AUTONOMOUS_AFTER_TURNS`] turns with the user not in the loop), where [`budget_threshold`] prunes by
/// `autoBudgetThreshold` and `liveReadsTokens` keeps no read: no reply comes to end the run, so a kept
/// read would stay its whole length, and the measured Claude Code runs did not write from them.
pub fn autonomous_run(cfg: &PruneConfig, shape: &Shape) -> bool {
    cfg.prune_on == PruneOn::AgentMessage && shape.answered() < IN_THE_LOOP_PROMPTS && shape.turns() >= AUTONOMOUS_AFTER_TURNS
}

/// The reads to keep verbatim as the batches `closing` close, and the reads kept by earlier prunes that
/// get their stubs now. A read is *live* while it reads one of the agent's own files (one it wrote or
/// edited before the read) and is the newest call on that file (by the arguments naming a path or file,
/// a read selector such as `:120-180` left out) among every read and edit so far, and, under
/// `liveReadsTurns`, at most that many assistant turns old; the newest live reads are kept while their
/// outputs fit in `budget` tokens (chars/4).
fn live_reads<'a>(pass: &Pass<'a>, closing: &[u32], pending: &BTreeMap<u32, Vec<&Record>>, budget: u64) -> (BTreeSet<u32>, Vec<&'a Record>) {
    let idx = pass.index;
    // The newest call on each file: the index's, and the calls this pass captured (newer).
    let (mut captured, mut written): (BTreeMap<String, u32>, BTreeMap<String, u32>) = Default::default();
    for (r, _) in pass.captured().filter(|(r, _)| condense_stage::FILE_TOOLS.contains(&r.tool.as_str())) {
        condense_index::note_file_call(&mut captured, r);
        condense_index::note_file_write(&mut written, r);
    }
    let newest = |p: &str| captured.get(p).or_else(|| idx.newest_file_call.get(p)).copied();
    // The first write of a file: the index's, else one this pass captured (newer).
    let first_write = |p: &str| idx.written_files.get(p).or_else(|| written.get(p)).copied();
    // `liveReadsTurns`: a read older than that many assistant turns is no longer kept, live or not.
    let (turns, max_age) = (u64::from(pass.shape.turns()), pass.config.live_reads_turns);
    let young = |r: &Record| max_age == 0 || turns.saturating_sub(u64::from(r.turn)) <= max_age;
    let live = |r: &Record| {
        young(r)
            && condense_stage::path_arguments(&r.arguments).iter().map(|p| condense_index::file_of(p)).any(|f| newest(f) == Some(r.ref_n) && first_write(f).is_some_and(|w| w < r.ref_n))
    };
    // Reads earlier prunes kept verbatim (the index follows them), and the reads of the batches closing now.
    let earlier: Vec<&'a Record> = idx.unsummarized_reads.iter().filter_map(|r| idx.records.get(r).map(|r| &**r)).collect();
    let now = closing.iter().flat_map(|b| pending[b].iter().copied()).filter(|r| pass.keepable_read(r));
    let mut candidates: Vec<&Record> = earlier.iter().copied().chain(now).filter(|r| live(r)).collect();
    candidates.sort_by_key(|r| std::cmp::Reverse(r.ref_n));
    let mut keep = BTreeSet::new();
    let mut used = 0;
    for r in candidates {
        used += r.chars.div_ceil(4);
        if used > budget {
            break;
        }
        keep.insert(r.ref_n);
    }
    let stub_now = earlier.into_iter().filter(|r| !keep.contains(&r.ref_n)).collect();
    (keep, stub_now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_stage::testing::{calls, prompt, record, reply, result, Given, Recorded};

    /// Against a recorded log: under `pruneOn: agent-message` a batch stays open until a final reply
    /// follows it, then closes summarized (one summary per output, naming its ref) or, below
    /// `minBatchChars`, as trivial; `Trigger::Now` closes what the model has read without a final reply.
    #[test]
    fn a_batch_closes_once_a_final_reply_has_read_it() {
        let long = "line of output\n".repeat(100);
        let cfg = PruneConfig { auto_budget_threshold: 0, ..PruneConfig::default() };
        let mut log = Recorded::new(cfg.clone());
        let extractive = crate::Extractive::default();
        let mut stage = Close::new(&extractive);
        log.message("u1", prompt("go"), &mut []);
        log.message("a1", calls(&[("c1", "bash", "{}"), ("c2", "bash", "{}")]), &mut []);
        log.message("r1", result("c1", "bash", &long, false), &mut []);
        log.message("r2", result("c2", "bash", "short", false), &mut []);
        log.message("a2", calls(&[("c3", "bash", "{}")]), &mut []);
        log.message("r3", result("c3", "bash", "tiny", false), &mut []);
        let given = Given(vec![
            (record(1, 1, "r1", "a1", "c1", "bash", &long, "h1"), long.clone()),
            (record(2, 1, "r2", "a1", "c2", "bash", "short", "h2"), "short".into()),
            (record(3, 2, "r3", "a2", "c3", "bash", "tiny", "h3"), "tiny".into()),
        ]);
        let d = log.run(&mut [&mut { given }, &mut stage], Trigger::Request).unwrap();
        assert_eq!(d.len(), 3, "nothing closes before a final reply: {d:?}");
        log.message("a3", reply("done"), &mut []);
        let d = log.run(&mut [&mut stage], Trigger::Request).unwrap();
        let [DecisionEvent::BatchClosed { batch: 1, refs, outcome: BatchOutcome::Summarized, summaries }, DecisionEvent::BatchClosed { batch: 2, outcome: BatchOutcome::SkippedTrivial, .. }] = &d[..] else {
            panic!("{d:?}")
        };
        assert_eq!(refs, &[1, 2]);
        assert_eq!(summaries.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![1, 2]);
        assert!(summaries[0].1.contains("t1") && summaries[0].1.len() < long.len(), "{}", summaries[0].1);
        assert!(log.index().pending_batches().is_empty());

        // Without a final reply, only an explicit prune closes what the model has read.
        let mut log = Recorded::new(cfg);
        log.message("a1", calls(&[("c1", "bash", "{}")]), &mut []);
        log.message("r1", result("c1", "bash", &long, false), &mut []);
        log.message("a2", calls(&[("c2", "bash", "{}")]), &mut []);
        let given = Given(vec![(record(1, 1, "r1", "a1", "c1", "bash", &long, "h1"), long.clone())]);
        assert_eq!(log.run(&mut [&mut { given }, &mut stage], Trigger::Request).unwrap().len(), 1);
        let d = log.run(&mut [&mut stage], Trigger::Now).unwrap();
        assert!(matches!(&d[..], [DecisionEvent::BatchClosed { batch: 1, outcome: BatchOutcome::Summarized, .. }]), "{d:?}");
    }

    /// The budget trigger's threshold follows the session's shape: 2,000 tokens of read output close
    /// their batch in an autonomous run (no prompt has answered a reply, `AUTONOMOUS_AFTER_TURNS` turns
    /// in) and under `pruneOn: on-demand`, not in the first turns (`FIRST_TURNS_BUDGET`); 5,000 close it
    /// in the first turns but not once the user is in the loop (`AWAITING_REPLY_BUDGET`); 0 turns the
    /// trigger off, a larger configured budget applies everywhere.
    #[test]
    fn the_budget_waits_for_a_reply_unless_the_run_is_autonomous() {
        // `answered` prompts each answering a final reply, then `turns_before` turns of small outputs,
        // then one output of `tokens` tokens the model has read.
        let closes_at = |tokens: usize, cfg: PruneConfig, answered: usize, turns_before: usize| -> bool {
            let big = "x".repeat(tokens * 4);
            let mut log = Recorded::new(cfg);
            let extractive = crate::Extractive::default();
            let mut stage = Close::new(&extractive);
            log.message("u0", prompt("go"), &mut []);
            for i in 0..answered {
                log.message(&format!("f{i}"), reply("done"), &mut []);
                log.message(&format!("u{}", i + 1), prompt("more"), &mut []);
            }
            for i in 0..turns_before {
                log.message(&format!("p{i}"), calls(&[(&format!("d{i}"), "bash", "{}")]), &mut []);
                log.message(&format!("q{i}"), result(&format!("d{i}"), "bash", "ok", false), &mut []);
            }
            log.message("a1", calls(&[("c1", "bash", "{}")]), &mut []);
            log.message("r1", result("c1", "bash", &big, false), &mut []);
            log.message("a2", calls(&[("c2", "bash", "{}")]), &mut []);
            let given = Given(vec![(record(1, 1, "r1", "a1", "c1", "bash", &big, "h1"), big.clone())]);
            let d = log.run(&mut [&mut { given }, &mut stage], Trigger::Request).unwrap();
            d.iter().any(|d| matches!(d, DecisionEvent::BatchClosed { batch: 1, .. }))
        };
        let closes = |cfg, answered, turns_before| closes_at(2_000, cfg, answered, turns_before);
        let d = PruneConfig::default();
        assert!(d.auto_budget_threshold < 2_000 && 2_000 < FIRST_TURNS_BUDGET && FIRST_TURNS_BUDGET < 5_000 && 5_000 < AWAITING_REPLY_BUDGET);
        let autonomous = AUTONOMOUS_AFTER_TURNS as usize;
        let in_loop = IN_THE_LOOP_PROMPTS as usize;
        assert!(!closes(d.clone(), 0, 0), "the first turns wait for the first-turns budget");
        assert!(!closes(d.clone(), 0, autonomous - 3), "still the first turns: {} turns", autonomous - 1);
        assert!(closes(d.clone(), 0, autonomous), "an autonomous run prunes at the small budget");
        assert!(closes(d.clone(), in_loop - 1, autonomous), "one answered reply is not the loop yet");
        assert!(closes_at(5_000, d.clone(), 0, 0), "over the first-turns budget");
        assert!(!closes_at(5_000, d.clone(), in_loop, autonomous + 10), "a user in the loop: the trigger waits for the reply");
        let on_demand = PruneConfig { prune_on: PruneOn::OnDemand, ..d.clone() };
        assert!(closes(on_demand, in_loop, 0), "no reply prunes under on-demand: the configured budget");
        let off = PruneConfig { auto_budget_threshold: 0, ..d.clone() };
        assert!(!closes(off, 0, autonomous), "0 turns the trigger off");
        let large = PruneConfig { auto_budget_threshold: 20_000, ..d };
        assert!(!closes(large, 0, autonomous), "a larger configured budget applies everywhere");
    }
}
