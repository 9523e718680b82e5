//! The pruning pipeline: capture → index → spill → dedup → summarize → chain, run before a model request.
//! It reads the warm projection, decides, and returns decision events; the session appends them, and the
//! render reads only those events. Every choice here depends only on the events and the configuration,
//! so a replay decides the same.

use condense_capture::{is_final_reply, is_protected, output_text};
use condense_events::{BatchOutcome, BatchingMode, DecisionEvent, Message, PruneOn, Record, UserOrigin, QUERY_TOOL_NAME};
use condense_render::{BranchView, Projection};
use condense_summarize::{Item, Summarizer};
use condense_tokens::js_len;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why the pipeline prunes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Before a model request: prune if `pruneOn` or the budget says so.
    Request,
    /// Asked for (`on-demand`): prune everything the model has read.
    Now,
}

/// A branch as the pipeline reads it: the projection's view, or (in tests) a list.
pub trait Entries<'a> {
    /// Messages on the branch.
    fn count(&self) -> usize;
    /// The `i`th message and its entry id.
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>);
}

impl<'a> Entries<'a> for BranchView<'a> {
    fn count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        self.at(i)
    }
}

impl<'a> Entries<'a> for [(&'a str, &'a Arc<Message>)] {
    fn count(&self) -> usize {
        self.len()
    }
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        self[i]
    }
}

/// Where a call sits.
struct CallSite<'a> {
    pos: usize,
    entry: &'a str,
    name: &'a str,
    arguments: &'a str,
}

/// Positional facts of the branch the pipeline reads: for each message, the turns (assistant messages)
/// before it, the user-turn-groups (prompts) at or before it and the chains closed before it; the newest
/// assistant message and final reply; the closed chains. Entries never change once appended, so the facts
/// of a branch stay true for every branch that extends it: a session keeps its shape and each request
/// takes in only the messages that are new.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// The last message this shape covers (an id is unique in the tree, so a branch holding it at the same
    /// position holds the same prefix).
    last_id: String,
    turn_at: Vec<u32>,
    utg_at: Vec<u32>,
    chain_at: Vec<u32>,
    turns: u32,
    utg: u32,
    chains: u32,
    last_assistant: Option<usize>,
    last_final: Option<usize>,
    spans: Vec<condense_chain::Span>,
    /// How many of the first spans are compressed (a chain once compressed stays so), so each request
    /// looks only at the spans after them.
    spans_compressed: usize,
    /// The errored-argument purge's cursor: with `purgeMinChars` at `.0`, every errored output up to ref
    /// `.1` is settled (purged, on no call of this branch, or with arguments too short), so a prune looks
    /// only at those after it.
    purge_settled: Option<(u64, u32)>,
    scan: condense_chain::ChainScan,
}

impl Shape {
    /// Assistant messages on the branch it covers.
    pub fn turns(&self) -> u32 {
        self.turns
    }

    /// Brings the shape to `branch`: extended where `branch` grew from what it covers, rebuilt otherwise.
    pub fn follow<'a, B: Entries<'a> + ?Sized>(&mut self, branch: &B) {
        let covered = self.turn_at.len();
        let extends = covered <= branch.count() && (covered == 0 || branch.entry(covered - 1).0 == self.last_id);
        if !extends {
            *self = Shape::default();
        }
        for i in self.turn_at.len()..branch.count() {
            let (_, m) = branch.entry(i);
            let prompt = matches!(**m, Message::User { origin: UserOrigin::Prompt, .. });
            let assistant = matches!(**m, Message::Assistant { .. });
            let last = is_final_reply(m);
            if prompt {
                self.utg += 1;
            }
            self.turn_at.push(self.turns);
            self.utg_at.push(self.utg);
            self.chain_at.push(self.chains);
            if assistant {
                self.turns += 1;
                self.last_assistant = Some(i);
            }
            if last {
                self.chains += 1;
                self.last_final = Some(i);
            }
            if let Some(span) = self.scan.step(i, prompt, last, m.tool_calls().next().is_some()) {
                self.spans.push(span);
            }
        }
        if let Some(last) = branch.count().checked_sub(1) {
            self.last_id = branch.entry(last).0.to_string();
        }
    }
}

/// Decides what the pipeline does now. `put_blob` stores a spilled output and returns its hash.
pub fn plan(
    p: &Projection,
    shape: &mut Shape,
    summarizer: &dyn Summarizer,
    trigger: Trigger,
    put_blob: &mut dyn FnMut(&[u8]) -> Result<String, String>,
) -> Result<Vec<DecisionEvent>, String> {
    let cfg = p.config();
    if !cfg.enabled {
        return Ok(Vec::new());
    }
    let idx = p.index();
    let branch = p.branch_view();
    let mut out = Vec::new();

    shape.follow(&branch);
    let compressed = |first: usize| idx.chain_firsts.contains(branch.at(first).0);
    while shape.spans.get(shape.spans_compressed).is_some_and(|s| compressed(s.first)) {
        shape.spans_compressed += 1;
    }
    let position = |id: &str| branch.position(id);
    let Shape { turn_at, utg_at, chain_at, turns, utg, last_assistant, last_final, spans, spans_compressed, purge_settled, .. } = &mut *shape;
    let (turns, utg, last_assistant, last_final) = (*turns, *utg, *last_assistant, *last_final);

    // Capture: every tool result on the branch not captured yet, with the call it answers.
    let mut calls: BTreeMap<&str, CallSite<'_>> = BTreeMap::new();
    let seen_hash = &idx.first_by_hash;
    let mut new_hash: BTreeMap<String, u32> = BTreeMap::new();
    let mut next_ref = idx.next_ref();
    let mut next_batch = idx.next_batch();
    let mut batch_of_key: BTreeMap<u32, u32> = BTreeMap::new();
    // In agent-message mode a batch still open from an earlier capture keeps growing.
    let open_batch = idx.pending_batches().last().copied();
    let mut new_records: Vec<Record> = Vec::new();
    let mut texts: BTreeMap<u32, String> = BTreeMap::new();
    // Only what follows the frontier is new: start at the turn that holds it (its calls may still get
    // results), or at the root when the frontier is not on this branch.
    let scan_from = idx
        .frontier
        .as_deref()
        .and_then(position)
        .map_or(0, |f| (0..=f).rev().find(|&i| matches!(**branch.at(i).1, Message::Assistant { .. })).unwrap_or(0));
    for (pos, (id, m)) in branch.iter_from(scan_from) {
        match &**m {
            Message::Assistant { .. } => {
                for (cid, name, arguments) in m.tool_calls() {
                    calls.insert(cid, CallSite { pos, entry: id, name, arguments });
                }
            }
            Message::ToolResult { call_id, is_error, .. } => {
                if idx.by_entry.contains_key(id) {
                    continue;
                }
                let Some(call) = calls.get(call_id.as_str()) else { continue };
                let text = output_text(m);
                let key = match cfg.batching_mode {
                    BatchingMode::Turn => call.pos as u32,
                    BatchingMode::AgentMessage => chain_at[pos],
                };
                let batch = *batch_of_key.entry(key).or_insert_with(|| {
                    let reuse = cfg.batching_mode == BatchingMode::AgentMessage
                        && open_batch.is_some_and(|b| {
                            idx.batches[&b].iter().any(|r| {
                                let e = &idx.records[r].entry;
                                position(e).is_some_and(|p| chain_at[p] == key)
                            })
                        });
                    if reuse {
                        open_batch.expect("checked")
                    } else {
                        next_batch += 1;
                        next_batch - 1
                    }
                });
                let tool = if m.role() == "tool" { tool_name(m, call.name) } else { call.name.to_string() };
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
                    hash: hash.clone(),
                    turn: turn_at[call.pos],
                    utg: utg_at[pos],
                };
                out.push(DecisionEvent::OutputCaptured(rec.clone()));
                if cfg.dedup {
                    if let Some(&orig) = seen_hash.get(&hash).or(new_hash.get(&hash)) {
                        out.push(DecisionEvent::OutputAliased { ref_n, original: orig });
                    } else {
                        new_hash.insert(hash, ref_n);
                    }
                }
                if condense_spill::should_spill(rec.chars, cfg.spill_threshold) && !rec.protected {
                    let blob = put_blob(text.as_bytes())?;
                    out.push(DecisionEvent::OutputSpilled {
                        ref_n,
                        blob,
                        bytes: text.len() as u64,
                        preview: condense_spill::preview(&text, cfg.spill_preview_bytes),
                    });
                }
                texts.insert(ref_n, text);
                new_records.push(rec);
            }
            Message::User { .. } => {}
        }
    }
    // The frontier moves when it passes a tool result: messages without outputs leave nothing to capture,
    // and a frontier behind them only makes the next scan start a few messages earlier.
    if let Some((last, _)) = branch.last() {
        let passed_output = branch.iter_from(scan_from).any(|(_, (id, m))| matches!(**m, Message::ToolResult { .. }) && !idx.by_entry.contains_key(id))
            || !new_records.is_empty();
        if idx.frontier.as_deref() != Some(last) && passed_output {
            out.push(DecisionEvent::FrontierAdvanced { entry: last.to_string() });
        }
    }

    // Which pending batches close now.
    let mut pending: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for b in idx.pending_batches() {
        pending.insert(b, idx.batches[&b].iter().map(|r| &idx.records[r]).collect());
    }
    for r in &new_records {
        pending.entry(r.batch).or_default().push(r);
    }
    let pos_of = |r: &Record| position(r.entry.as_str());
    let read_before = |limit: Option<usize>, recs: &[&Record]| {
        limit.is_some_and(|l| recs.iter().all(|r| pos_of(r).is_some_and(|p| p < l)))
    };
    let seen: Vec<u32> = pending.iter().filter(|(_, recs)| read_before(last_assistant, recs)).map(|(b, _)| *b).collect();
    let closing: Vec<u32> = match trigger {
        Trigger::Now => seen.clone(),
        Trigger::Request => {
            let by_reply: Vec<u32> = if cfg.prune_on == PruneOn::AgentMessage {
                pending.iter().filter(|(_, recs)| read_before(last_final, recs)).map(|(b, _)| *b).collect()
            } else {
                Vec::new()
            };
            let verbatim_tokens: u64 = seen
                .iter()
                .flat_map(|b| pending[b].iter())
                .filter(|r| !r.protected && !idx.spills.contains_key(&r.ref_n))
                .map(|r| r.chars.div_ceil(4))
                .sum();
            if cfg.auto_budget_threshold > 0 && verbatim_tokens >= cfg.auto_budget_threshold {
                seen.clone()
            } else {
                by_reply
            }
        }
    };

    // Close them: trivial, deduplicated, summarized or oversized.
    // Refs aliased or spilled, by this run or earlier ones.
    let mut aliased_now = std::collections::BTreeSet::new();
    let mut spilled_now = std::collections::BTreeSet::new();
    for d in &out {
        match d {
            DecisionEvent::OutputAliased { ref_n, .. } => drop(aliased_now.insert(*ref_n)),
            DecisionEvent::OutputSpilled { ref_n, .. } => drop(spilled_now.insert(*ref_n)),
            _ => {}
        }
    }
    let is_aliased = |r: u32| aliased_now.contains(&r) || idx.aliases.contains_key(&r);
    let is_spilled = |r: u32| spilled_now.contains(&r) || idx.spills.contains_key(&r);
    let mut new_summaries: BTreeMap<u32, String> = BTreeMap::new();
    for b in &closing {
        let recs = &pending[b];
        let refs: Vec<u32> = recs.iter().map(|r| r.ref_n).collect();
        let total: u64 = recs.iter().map(|r| r.chars).sum();
        let (outcome, summaries) = if total < cfg.min_batch_chars {
            (BatchOutcome::SkippedTrivial, Vec::new())
        } else if recs.iter().all(|r| is_aliased(r.ref_n)) {
            (BatchOutcome::SkippedDeduped, Vec::new())
        } else {
            let todo: Vec<&&Record> =
                recs.iter().filter(|r| !is_aliased(r.ref_n) && !is_spilled(r.ref_n) && !r.protected).collect();
            let bodies: Vec<String> = todo.iter().map(|r| text_of(&branch, r, &texts)).collect();
            let items: Vec<Item<'_>> = todo
                .iter()
                .zip(&bodies)
                .map(|(r, text)| Item { ref_n: r.ref_n, tool: &r.tool, arguments: &r.arguments, text, is_error: r.is_error })
                .collect();
            let sums = if items.is_empty() { Vec::new() } else { summarizer.summarize(&items).map_err(|e| e.to_string())? };
            let raw: usize = bodies.iter().map(|b| b.len()).sum();
            let short: usize = sums.iter().map(String::len).sum();
            if !items.is_empty() && short >= raw {
                (BatchOutcome::SkippedOversized, Vec::new())
            } else {
                (BatchOutcome::Summarized, todo.iter().map(|r| r.ref_n).zip(sums).collect())
            }
        };
        for (r, s) in &summaries {
            new_summaries.insert(*r, s.clone());
        }
        out.push(DecisionEvent::BatchClosed { batch: *b, refs, outcome, summaries });
    }

    // Errored-argument purge, at the same prune so it shares its cache break. The calls looked at are
    // those with an errored output (kept by the index as captures fold, and this run's captures), never
    // the whole branch; a call counts when its last output on the branch was an error.
    if cfg.purge_errors && !closing.is_empty() {
        let settled_to = purge_settled.filter(|(min, _)| *min == cfg.purge_min_chars).map(|(_, r)| r);
        let from = settled_to.map_or(0, |r| r + 1);
        let errored = idx.errored.range(from..).filter_map(|n| idx.records.get(n)).map(|r| (true, r)).chain(new_records.iter().filter(|r| r.is_error).map(|r| (false, r)));
        let mut found: Vec<(usize, usize, &str, &str, u64)> = Vec::new();
        // Whether every errored output looked at so far is settled, and the last of them.
        let (mut settling, mut settled) = (true, settled_to);
        for (kept, r) in errored {
            // `None`: settled, never to be purged on this branch under this limit.
            let candidate = position(&r.call_entry).and_then(|pos| {
                if turns.saturating_sub(turn_at[pos]) < cfg.purge_after_turns as u32 + 1 {
                    return Some(None); // Not old enough yet.
                }
                let (id, m) = branch.at(pos);
                let (k, (cid, _, args)) = m.tool_calls().enumerate().find(|(_, (cid, _, _))| *cid == r.call_id)?;
                let chars = js_len(args) as u64;
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
            let outputs = idx.by_call.get(cid).into_iter().flatten().filter_map(|n| idx.records.get(n)).chain(new_records.iter().filter(|n| n.call_id == cid));
            let last = outputs.filter_map(|o| position(&o.entry).map(|p| (p, o.is_error))).max_by_key(|(p, _)| *p);
            if last.is_some_and(|(_, e)| e) {
                found.push((pos, k, id, cid, chars));
            }
        }
        if let Some(r) = settled {
            *purge_settled = Some((cfg.purge_min_chars, r));
        }
        // In branch order, then call order, once per call.
        found.sort_unstable();
        found.dedup();
        for (_, _, id, cid, chars) in found {
            out.push(DecisionEvent::ErrorArgsPurged { entry: id.to_string(), call_id: cid.to_string(), chars });
        }
    }

    // Chain compression: closed chains older than the rolling window.
    let keep = cfg.rolling_window as usize;
    let mut block = idx.next_block();
    let new_by_entry: BTreeMap<&str, &Record> = new_records.iter().map(|r| (r.entry.as_str(), r)).collect();
    let record_of = |entry: &str| idx.by_entry.get(entry).and_then(|n| idx.records.get(n)).or_else(|| new_by_entry.get(entry).copied());
    for span in spans.iter().take(spans.len().saturating_sub(keep)).skip(*spans_compressed) {
        if compressed(span.first) {
            continue;
        }
        let inside: Vec<&Record> = (span.first..=span.last).filter_map(|i| record_of(branch.at(i).0)).collect();
        let grace = cfg.recovery_grace_turns as u32;
        let in_grace = inside.iter().any(|r| r.tool == QUERY_TOOL_NAME && grace > 0 && utg.saturating_sub(r.utg) <= grace);
        if in_grace {
            continue; // Deferred until the recovery ages out (seed 000, Implementation 2).
        }
        let mut infos = Vec::new();
        let protected_texts: BTreeMap<u32, String> =
            inside.iter().filter(|r| r.protected).map(|r| (r.ref_n, text_of(&branch, r, &texts))).collect();
        for i in span.first..=span.last {
            let (entry, m) = branch.at(i);
            for (cid, name, args) in m.tool_calls() {
                let rec = inside.iter().find(|r| r.call_id == cid && r.call_entry == entry);
                infos.push(condense_chain::CallInfo {
                    ref_n: rec.map(|r| r.ref_n),
                    tool: name,
                    arguments: args,
                    summary: rec.and_then(|r| new_summaries.get(&r.ref_n).map(String::as_str).or(idx.summaries.get(&r.ref_n).map(|s| &**s))),
                    protected_output: rec.and_then(|r| protected_texts.get(&r.ref_n)).map(String::as_str),
                });
            }
        }
        let body = condense_chain::block_body(block, &infos);
        out.push(DecisionEvent::ChainCompressed {
            block,
            first: branch.at(span.first).0.to_string(),
            last: branch.at(span.last).0.to_string(),
            refs: inside.iter().map(|r| r.ref_n).collect(),
            body,
        });
        block += 1;
    }
    Ok(out)
}

fn tool_name(m: &Message, call_name: &str) -> String {
    match m {
        Message::ToolResult { tool_name, .. } if !tool_name.is_empty() => tool_name.clone(),
        _ => call_name.to_string(),
    }
}

/// The output text of a record, from this run's captures or from the branch.
fn text_of(branch: &BranchView<'_>, r: &Record, texts: &BTreeMap<u32, String>) -> String {
    if let Some(t) = texts.get(&r.ref_n) {
        return t.clone();
    }
    branch.position(&r.entry).map(|i| output_text(branch.at(i).1)).unwrap_or_default()
}

#[cfg(test)]
mod shape_tests {
    use super::*;
    use condense_events::Block;

    fn branch_of(n: usize) -> Vec<(String, Arc<Message>)> {
        (0..n)
            .map(|i| {
                let m = match i % 5 {
                    0 => Message::user_text(&format!("task {i}"), UserOrigin::Prompt),
                    1 | 3 => Message::Assistant {
                        content: vec![Block::ToolCall { id: format!("c{i}"), name: "bash".into(), arguments: "{}".into() }],
                        model: None,
                        stop: None,
                        usage: None,
                    },
                    2 => Message::ToolResult { call_id: format!("c{}", i - 1), tool_name: "bash".into(), content: vec![Block::Text { text: "out".into() }], is_error: false },
                    _ => Message::Assistant { content: vec![Block::Text { text: format!("done {i}") }], model: None, stop: None, usage: None },
                };
                (format!("e{i}"), Arc::new(m))
            })
            .collect()
    }

    fn view(b: &[(String, Arc<Message>)]) -> Vec<(&str, &Arc<Message>)> {
        b.iter().map(|(id, m)| (id.as_str(), m)).collect()
    }

    /// A shape brought up to a branch message by message is the shape of that branch built at once, and a
    /// branch that does not extend the covered one (a rewind, another branch) is rebuilt.
    #[test]
    fn a_shape_followed_step_by_step_is_the_shape_built_at_once() {
        let all = branch_of(43);
        let mut step = Shape::default();
        for k in 0..=all.len() {
            step.follow(&view(&all[..k])[..]);
            let mut once = Shape::default();
            once.follow(&view(&all[..k])[..]);
            assert_eq!(format!("{step:?}"), format!("{once:?}"), "after {k} messages");
        }
        assert_eq!(step.spans.len(), 8, "{:?}", step.spans);
        // A rewind to 20 messages, then another message in place of the 21st.
        step.follow(&view(&all[..20])[..]);
        let mut other = all[..20].to_vec();
        other.push(("x".into(), Arc::new(Message::user_text("elsewhere", UserOrigin::Prompt))));
        step.follow(&view(&other)[..]);
        let mut once = Shape::default();
        once.follow(&view(&other)[..]);
        assert_eq!(format!("{step:?}"), format!("{once:?}"));
    }
}
