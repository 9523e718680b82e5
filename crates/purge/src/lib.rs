//! The errored-argument purge (seed 000): a call whose last output on the branch was an error, at least
//! `purgeAfterTurns` turns old and with arguments of at least `purgeMinChars` characters, shows a marker
//! instead of its arguments. It runs only in a pass that closes a batch, so it shares that prune's cache
//! break.
//!
//! State: the refs of errored outputs, folded from the log's captures. Cache: a cursor past the errored
//! outputs that can never be purged on this branch under this limit (purged already, on no call of the
//! branch, or with short arguments), so a pass looks only at those after it; it is dropped when the
//! branch's shape is rebuilt or `purgeMinChars` changes.
//!
//! # Example
//!
//! Against a recorded log: a failed call's long arguments are purged once the call is two turns old and
//! a prune closes a batch (here a stand-in stage closes one in every pass).
//!
//! ```
//! use condense_events::{BatchOutcome, DecisionEvent, PruneConfig};
//! use condense_purge::Purge;
//! use condense_stage::testing::{calls, record, reply, result, Given, Recorded};
//! use condense_stage::{Pass, Stage, StageError, Trigger};
//!
//! struct Closes;
//! impl Stage for Closes {
//!     fn name(&self) -> &'static str {
//!         "closes"
//!     }
//!     fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
//!         pass.push(DecisionEvent::BatchClosed { batch: 1, refs: vec![], outcome: BatchOutcome::SkippedTrivial, summaries: vec![] });
//!         Ok(())
//!     }
//! }
//!
//! let long = format!(r#"{{"command":"{}"}}"#, "x".repeat(600));
//! let mut log = Recorded::new(PruneConfig::default());
//! let mut purge = Purge::default();
//! log.message("a1", calls(&[("c1", "bash", &long)]), &mut []);
//! log.message("r1", result("c1", "bash", "boom", true), &mut []);
//! let mut failed = record(1, 1, "r1", "a1", "c1", "bash", "boom", "h");
//! failed.is_error = true;
//! log.run(&mut [&mut Given(vec![(failed, "boom".into())]), &mut purge], Trigger::Request).unwrap();
//! log.message("a2", calls(&[("c2", "bash", "{}")]), &mut []);
//! log.message("a3", reply("done"), &mut []);
//! let decisions = log.run(&mut [&mut Closes, &mut purge], Trigger::Request).unwrap();
//! let chars = long.chars().count() as u64;
//! assert_eq!(&decisions[1..], &[DecisionEvent::ErrorArgsPurged { entry: "a1".into(), call_id: "c1".into(), chars }]);
//! ```

use condense_events::{DecisionEvent, Event};
use condense_stage::{Pass, Stage, StageError};
use std::collections::BTreeSet;

/// The purge stage.
#[derive(Debug, Clone, Default)]
pub struct Purge {
    errored: BTreeSet<u32>,
    /// (shape generation, `purgeMinChars`, last settled ref).
    settled: Option<(u64, u64, u32)>,
}

impl Stage for Purge {
    fn name(&self) -> &'static str {
        "purge"
    }

    fn fold(&mut self, event: &Event) {
        if let Event::Decision(DecisionEvent::OutputCaptured(r)) = event
            && r.is_error
        {
            self.errored.insert(r.ref_n);
        }
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        let (cfg, idx, shape, branch) = (pass.config, pass.index, pass.shape, pass.branch);
        if !cfg.purge_errors || pass.batches_closed() == 0 {
            return Ok(());
        }
        let settled_to = self.settled.filter(|(g, min, _)| (*g, *min) == (shape.generation(), cfg.purge_min_chars)).map(|(_, _, r)| r);
        let from = settled_to.map_or(0, |r| r + 1);
        let kept = self.errored.range(from..).filter_map(|n| idx.records.get(n)).map(|r| (true, &**r));
        let errored = kept.chain(pass.captured().map(|(r, _)| r).filter(|r| r.is_error).map(|r| (false, r)));
        let mut found: Vec<(usize, usize, &str, &str, u64)> = Vec::new();
        // Whether every errored output looked at so far is settled, and the last of them.
        let (mut settling, mut settled) = (true, settled_to);
        for (kept, r) in errored {
            // `None`: settled, never to be purged on this branch under this limit.
            let candidate = pass.position(&r.call_entry).and_then(|pos| {
                if shape.turns().saturating_sub(shape.turn_at(pos)) < cfg.purge_after_turns as u32 + 1 {
                    return Some(None); // Not old enough yet.
                }
                let (id, m) = branch.entry(pos);
                let (k, (cid, _, args)) = m.tool_calls().enumerate().find(|(_, (cid, _, _))| *cid == r.call_id)?;
                let chars = condense_tokens::js_len(args) as u64;
                let purged = idx.purged.contains_key(&(id.to_string(), cid.to_string()));
                (chars >= cfg.purge_min_chars && !purged).then_some(Some((pos, k, id, cid, chars)))
            });
            let Some(candidate) = candidate else {
                if settling && kept {
                    settled = Some(r.ref_n);
                }
                continue;
            };
            settling = false;
            let Some((pos, k, id, cid, chars)) = candidate else { continue };
            // The call's last output on the branch, captured earlier or now.
            let earlier = idx.by_call.get(cid).into_iter().flatten().filter_map(|n| idx.records.get(n)).map(|r| &**r);
            let outputs = earlier.chain(pass.captured().map(|(r, _)| r).filter(|n| n.call_id == cid));
            let last = outputs.filter_map(|o| pass.position(&o.entry).map(|p| (p, o.is_error))).max_by_key(|(p, _)| *p);
            if last.is_some_and(|(_, e)| e) {
                found.push((pos, k, id, cid, chars));
            }
        }
        if let Some(r) = settled {
            self.settled = Some((shape.generation(), cfg.purge_min_chars, r));
        }
        // In branch order, then call order, once per call.
        found.sort_unstable();
        found.dedup();
        let purges: Vec<DecisionEvent> =
            found.into_iter().map(|(_, _, id, cid, chars)| DecisionEvent::ErrorArgsPurged { entry: id.to_string(), call_id: cid.to_string(), chars }).collect();
        pass.extend(purges);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::{BatchOutcome, PruneConfig};
    use condense_stage::testing::{calls, record, reply, result, Given, Recorded};
    use condense_stage::Trigger;

    /// Closes batch 1 in every pass (the purge runs only in a pass that prunes).
    struct Closes;

    impl Stage for Closes {
        fn name(&self) -> &'static str {
            "closes"
        }
        fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
            pass.push(DecisionEvent::BatchClosed { batch: 1, refs: vec![], outcome: BatchOutcome::SkippedTrivial, summaries: vec![] });
            Ok(())
        }
    }

    /// Against a recorded log: the long arguments of a call whose output was an error are purged once
    /// the call is `purgeAfterTurns` turns old and a batch closes, once; short arguments and successful
    /// calls are kept; a stage folded afresh from the log decides the same.
    #[test]
    fn an_old_errored_call_loses_its_long_arguments_once() {
        let long = format!("{{\"command\":\"{}\"}}", "x".repeat(600));
        let mut log = Recorded::new(PruneConfig::default());
        let mut stage = Purge::default();
        log.message("a1", calls(&[("c1", "bash", &long), ("c2", "bash", "{}"), ("c3", "bash", &long)]), &mut []);
        log.message("r1", result("c1", "bash", "boom", true), &mut []);
        log.message("r2", result("c2", "bash", "boom", true), &mut []);
        log.message("r3", result("c3", "bash", "fine", false), &mut []);
        let mut e1 = record(1, 1, "r1", "a1", "c1", "bash", "boom", "h");
        e1.is_error = true;
        let mut e2 = record(2, 1, "r2", "a1", "c2", "bash", "boom", "h");
        e2.is_error = true;
        let ok = record(3, 1, "r3", "a1", "c3", "bash", "fine", "g");
        let given = Given(vec![(e1, "boom".into()), (e2, "boom".into()), (ok, "fine".into())]);
        let d = log.run(&mut [&mut { given }, &mut Closes, &mut stage], Trigger::Request).unwrap();
        assert!(!d.iter().any(|d| matches!(d, DecisionEvent::ErrorArgsPurged { .. })), "too young: {d:?}");
        log.message("a2", calls(&[("c4", "bash", "{}")]), &mut []);
        log.message("a3", reply("done"), &mut []);
        assert_eq!(log.run(&mut [&mut stage], Trigger::Request).unwrap(), vec![], "no batch closes");
        let mut fresh = Purge::default();
        for e in log.events() {
            fresh.fold(e);
        }
        let d = log.run(&mut [&mut Closes, &mut stage], Trigger::Request).unwrap();
        let chars = long.chars().count() as u64;
        assert_eq!(&d[1..], &[DecisionEvent::ErrorArgsPurged { entry: "a1".into(), call_id: "c1".into(), chars }]);
        // The fresh stage, run on the same log before the purge was appended, decides the same.
        let mut twin = Recorded::new(PruneConfig::default());
        for e in &log.events()[..log.events().len() - 2] {
            twin.append(e.clone(), &mut []);
        }
        assert_eq!(twin.run(&mut [&mut Closes, &mut fresh], Trigger::Request).unwrap(), d);
        assert_eq!(log.run(&mut [&mut Closes, &mut stage], Trigger::Request).unwrap().len(), 1, "purged once");
    }
}
