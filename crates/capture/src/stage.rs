//! The capture stage: every tool result on the branch after the frontier gets a ref, a batch and a record
//! (`OutputCaptured`), and the frontier moves past them (`FrontierAdvanced`). Its state is the index's
//! (refs, batches, the frontier), so it keeps nothing of its own.

use crate::is_protected;
use condense_events::{BatchingMode, DecisionEvent, Message, Record};
use condense_stage::{output_text_borrowed, Pass, Stage, StageError};
use condense_tokens::js_len;
use std::collections::BTreeMap;

/// The capture stage.
#[derive(Debug, Clone, Default)]
pub struct Capture;

/// Where a call sits.
struct CallSite<'a> {
    pos: usize,
    entry: &'a str,
    name: &'a str,
    arguments: &'a str,
}

impl Stage for Capture {
    fn name(&self) -> &'static str {
        "capture"
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        let (cfg, idx, branch, shape) = (pass.config, pass.index, pass.branch, pass.shape);
        let mut calls: BTreeMap<&str, CallSite<'_>> = BTreeMap::new();
        let mut next_ref = idx.next_ref();
        let mut next_batch = idx.next_batch();
        let mut batch_of_key: BTreeMap<u32, u32> = BTreeMap::new();
        // In agent-message mode a batch still open from an earlier capture keeps growing.
        let open_batch = idx.open_batches.last().copied();
        let mut captured = Vec::new();
        // Only what follows the frontier is new: start at the turn that holds it (its calls may still get
        // results), or at the root when the frontier is not on this branch.
        let scan_from = idx.frontier.as_deref().and_then(|f| branch.position(f)).map_or(0, |f| {
            (0..=f).rev().find(|&i| matches!(**branch.entry(i).1, Message::Assistant { .. })).unwrap_or(0)
        });
        let mut passed_output = false;
        for pos in scan_from..branch.count() {
            let (id, m) = branch.entry(pos);
            match &**m {
                Message::Assistant { .. } => {
                    for (cid, name, arguments) in m.tool_calls() {
                        calls.insert(cid, CallSite { pos, entry: id, name, arguments });
                    }
                }
                Message::ToolResult { call_id, is_error, tool_name, .. } => {
                    if idx.by_entry.contains_key(id) {
                        continue;
                    }
                    passed_output = true;
                    let Some(call) = calls.get(call_id.as_str()) else { continue };
                    let text = output_text_borrowed(m);
                    let key = match cfg.batching_mode {
                        BatchingMode::Turn => call.pos as u32,
                        BatchingMode::AgentMessage => shape.chain_at(pos),
                    };
                    let batch = *batch_of_key.entry(key).or_insert_with(|| {
                        let reuse = cfg.batching_mode == BatchingMode::AgentMessage
                            && open_batch.is_some_and(|b| {
                                idx.batches[&b].iter().any(|r| {
                                    let e = &idx.records[r].entry;
                                    branch.position(e).is_some_and(|p| shape.chain_at(p) == key)
                                })
                            });
                        if reuse {
                            open_batch.expect("checked")
                        } else {
                            next_batch += 1;
                            next_batch - 1
                        }
                    });
                    let tool = if tool_name.is_empty() { call.name.to_string() } else { tool_name.clone() };
                    let hash = condense_dedup::key(&tool, &text);
                    let ref_n = next_ref;
                    next_ref += 1;
                    let rec = Record {
                        ref_n,
                        batch,
                        entry: id.to_string(),
                        call_entry: call.entry.to_string(),
                        call_id: call_id.clone(),
                        occurrence: format!("{call_id}@{id}"),
                        protected: is_protected(cfg, &tool, call.arguments),
                        tool,
                        arguments: call.arguments.to_string(),
                        is_error: *is_error,
                        chars: js_len(&text) as u64,
                        hash,
                        turn: shape.turn_at(call.pos),
                        utg: shape.utg_at(pos),
                    };
                    captured.push((rec, text));
                }
                Message::User { .. } => {}
            }
        }
        pass.reserve_captures(captured.len());
        for (rec, text) in captured {
            pass.capture(rec, text);
        }
        // The frontier moves when it passes a tool result: messages without outputs leave nothing to
        // capture, and a frontier behind them only makes the next scan start a few messages earlier.
        if let Some(last) = branch.count().checked_sub(1).map(|i| branch.entry(i).0)
            && idx.frontier.as_deref() != Some(last)
            && passed_output
        {
            pass.push(DecisionEvent::FrontierAdvanced { entry: last.to_string() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::{BatchingMode, PruneConfig};
    use condense_stage::testing::{calls, prompt, reply, result, Recorded};
    use condense_stage::Trigger;

    /// Against a recorded log: each tool result is captured once, with the call it answers, a ref in
    /// order and the batch of its turn; the frontier moves past them; a result whose call is not on the
    /// branch is passed over; a second pass finds nothing new.
    #[test]
    fn every_result_is_captured_once_in_the_batch_of_its_turn() {
        let mut log = Recorded::new(PruneConfig::default());
        let mut stage = Capture;
        log.message("u1", prompt("fix it"), &mut [&mut stage]);
        log.message("a1", calls(&[("c1", "read", r#"{"path":"a.rs"}"#), ("c2", "bash", r#"{"command":"ls"}"#)]), &mut [&mut stage]);
        log.message("r1", result("c1", "read", "fn main() {}", false), &mut [&mut stage]);
        log.message("r2", result("c2", "bash", "a.rs\nb.rs", true), &mut [&mut stage]);
        log.message("a2", calls(&[("c3", "read", r#"{"path":"b.rs"}"#)]), &mut [&mut stage]);
        log.message("r3", result("c3", "read", "struct B;", false), &mut [&mut stage]);
        log.message("rx", result("c9", "read", "orphan", false), &mut [&mut stage]);
        let d = log.run(&mut [&mut stage], Trigger::Request).unwrap();
        let recs: Vec<(u32, u32, &str, &str, &str, bool, u32)> = d
            .iter()
            .filter_map(|d| match d {
                DecisionEvent::OutputCaptured(r) => Some((r.ref_n, r.batch, r.entry.as_str(), r.call_entry.as_str(), r.tool.as_str(), r.is_error, r.turn)),
                _ => None,
            })
            .collect();
        assert_eq!(recs, vec![(1, 1, "r1", "a1", "read", false, 0), (2, 1, "r2", "a1", "bash", true, 0), (3, 2, "r3", "a2", "read", false, 1)]);
        assert_eq!(d.last(), Some(&DecisionEvent::FrontierAdvanced { entry: "rx".into() }));
        assert_eq!(log.index().frontier.as_deref(), Some("rx"));
        assert!(log.run(&mut [&mut stage], Trigger::Request).unwrap().is_empty());
        // A new result after the frontier: the next ref, and the batch of its own turn.
        log.message("a3", calls(&[("c4", "bash", "{}")]), &mut [&mut stage]);
        log.message("r4", result("c4", "bash", "ok", false), &mut [&mut stage]);
        let d = log.run(&mut [&mut stage], Trigger::Request).unwrap();
        assert!(matches!(&d[0], DecisionEvent::OutputCaptured(r) if (r.ref_n, r.batch, r.turn) == (4, 3, 2)), "{d:?}");
    }

    /// In agent-message mode a batch still open from an earlier pass takes the results of later turns of
    /// the same agent message, and a final reply starts the next batch.
    #[test]
    fn an_agent_message_batch_grows_across_passes() {
        let mut log = Recorded::new(PruneConfig { batching_mode: BatchingMode::AgentMessage, ..PruneConfig::default() });
        let mut stage = Capture;
        log.message("u1", prompt("go"), &mut []);
        log.message("a1", calls(&[("c1", "bash", "{}")]), &mut []);
        log.message("r1", result("c1", "bash", "one", false), &mut []);
        log.run(&mut [&mut stage], Trigger::Request).unwrap();
        log.message("a2", calls(&[("c2", "bash", "{}")]), &mut []);
        log.message("r2", result("c2", "bash", "two", false), &mut []);
        log.run(&mut [&mut stage], Trigger::Request).unwrap();
        log.message("a3", reply("done"), &mut []);
        log.message("u2", prompt("more"), &mut []);
        log.message("a4", calls(&[("c3", "bash", "{}")]), &mut []);
        log.message("r3", result("c3", "bash", "three", false), &mut []);
        log.run(&mut [&mut stage], Trigger::Request).unwrap();
        let batches: Vec<(u32, u32)> = log.index().records.values().map(|r| (r.ref_n, r.batch)).collect();
        assert_eq!(batches, vec![(1, 1), (2, 1), (3, 2)]);
    }
}
