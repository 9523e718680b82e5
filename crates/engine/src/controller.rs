//! The checkpoint controller (seed 001): after the pruning pipeline, before a request, it checks the
//! context against the model's hard budget and, when it is over, commits a checkpoint: a handoff summary
//! plus retained recent prompts standing in for the history before the boundary. The final tool batch
//! stays after the boundary with the assistant message that carries its calls, so no cut separates a
//! call from its result. If the summary does not bring the context under budget, a retained-tail
//! recovery without a summary is tried (ADR 0049); if that fails too, the run stops with
//! `CONTEXT_COMPACTION_FAILED`.

use condense_checkpoint::{handoff, retained_tail, Budget, CONTEXT_COMPACTION_FAILED};
use condense_events::{DecisionEvent, Event, Message, QUERY_TOOL_NAME};
use condense_render::Projection;
use condense_tokens::estimate;
use std::sync::Arc;

/// What the controller decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The context fits (or the window is unknown): nothing to do. Carries the tokens measured and the
    /// budget they were measured against, when the window is known, so the budget notice counts neither a
    /// second time.
    Fits(Option<(u64, Budget)>),
    /// Commit this checkpoint (the `CheckpointStarted` event, then the commit).
    Commit(DecisionEvent, DecisionEvent),
    /// Nothing fits: record the start and this failure, and stop before the request.
    Failed(DecisionEvent, DecisionEvent),
}

/// Tokens of what a projection renders: pi's chars/4 estimate, or, when the host reported the provider's
/// usage for the last request and nothing changed the context since, that usage plus the estimate of what
/// came after, whichever is larger.
pub fn context_tokens(p: &Projection) -> u64 {
    let rendered = p.render().messages;
    // The system prompt and tool declarations travel with every request, the host's and condense's own
    // (the provider's usage counts them already; the estimate of the messages does not).
    let estimate_all: u64 = rendered.iter().map(|m| p.estimate(m)).sum::<u64>() + p.request_overhead() + crate::tools::declared_tokens(p);
    p.anchored_tokens(&rendered).map_or(estimate_all, |a| a.max(estimate_all))
}

/// The budget of the projection's current model, if its window is known, with the reserve yielding to
/// the client's fixed context ([`Budget::fitted`]). The host context sent again after a checkpoint is
/// looked for on the branch only where it can matter: a window under four reserves (65,536 tokens) or a
/// fixed context of a quarter of the window without it; elsewhere the reserve is a small part of the
/// window and the walk would cost every request of a long session for nothing.
pub fn budget_of(p: &Projection) -> Option<Budget> {
    let model = p.model()?;
    let window = model.context_window?;
    let cheap = Fixed { overhead: p.request_overhead(), tools: crate::tools::declared_tokens(p), host: 0 };
    let fixed = if window < 4 * condense_checkpoint::DEFAULT_RESERVE || cheap.total() * 4 >= window { Fixed::of(p) } else { cheap };
    Some(Budget::fitted(window, model.max_output, fixed.total()))
}

pub use crate::tools::{NEW_CONTEXT_RESULT, NEW_CONTEXT_TOOL};

/// Why a checkpoint is being considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Before a request: only if over budget or the model asked with `new_context`.
    Threshold,
    /// Asked for by the user on an idle session (`condense compact`): always, failing fast.
    Manual,
}

/// The stable error code of a second provider overflow after the one retry.
pub const PROVIDER_OVERFLOW_AFTER_RETRY: &str = "PROVIDER_OVERFLOW_AFTER_RETRY";

/// Whether the model called `new_context` in its last turn and that turn has finished (every call has
/// its result) with no checkpoint made since.
fn new_context_requested(p: &Projection) -> bool {
    // Nearly always the last turn did not call it: that is found without building the branch.
    if !p.last_assistant().is_some_and(|m| m.tool_calls().any(|(_, name, _)| name == NEW_CONTEXT_TOOL)) {
        return false;
    }
    let branch = p.branch_entries();
    let Some(last_asst) = branch.iter().rposition(|(_, m)| matches!(***m, Message::Assistant { .. })) else { return false };
    let (_, asst) = branch[last_asst];
    if !asst.tool_calls().any(|(_, name, _)| name == NEW_CONTEXT_TOOL) {
        return false;
    }
    let answered = asst.tool_calls().all(|(id, _, _)| {
        branch[last_asst + 1..].iter().any(|(_, m)| matches!(&***m, Message::ToolResult { call_id, .. } if call_id == id))
    });
    let done_after = p.index().checkpoints.values().any(|c| {
        branch.iter().position(|(id, _)| *id == c.boundary).is_some_and(|b| b + 1 >= last_asst)
    });
    answered && !done_after
}

/// Decides whether a checkpoint is due before the next request, with the deterministic handoff.
pub fn decide(p: &Projection) -> Outcome {
    decide_for(p, Reason::Threshold, &condense_summarize::Extractive::default())
}

/// The covered span as plain text for a model summarizer.
fn transcript(covered: &[(String, Arc<Message>)]) -> String {
    let mut out = String::new();
    for (_, m) in covered {
        match &**m {
            Message::User { .. } => out.push_str(&format!("USER: {}\n", m.text())),
            Message::Assistant { .. } => {
                out.push_str(&format!("ASSISTANT: {}\n", m.text()));
                for (_, name, args) in m.tool_calls() {
                    out.push_str(&format!("CALL {name} {args}\n"));
                }
            }
            Message::ToolResult { tool_name, .. } => out.push_str(&format!("RESULT {tool_name}: {}\n", m.text())),
        }
    }
    out
}

/// Decides a checkpoint for `reason`; the summary comes from `summarizer` when it writes handoffs, else
/// from the deterministic handoff.
pub fn decide_for(p: &Projection, reason: Reason, summarizer: &dyn condense_summarize::Summarizer) -> Outcome {
    // A provider overflow: one checkpoint and one retry; a second overflow is terminal.
    match p.overflow_streak() {
        0 => {}
        1 => {}
        n => {
            return Outcome::Failed(
                DecisionEvent::CheckpointStarted { reason: "overflow".into(), tokens: context_tokens(p) },
                DecisionEvent::CheckpointFailed {
                    code: PROVIDER_OVERFLOW_AFTER_RETRY.into(),
                    reason: format!("the provider rejected the request as too long {n} times in a row"),
                },
            )
        }
    }
    let overflowed = p.overflow_pending();
    let requested = reason == Reason::Manual || overflowed || new_context_requested(p);
    let budget = match budget_of(p) {
        Some(b) => b,
        // Without a known window only an explicit request makes a checkpoint; it fits any size.
        None if requested => Budget { window: u64::MAX, headroom: 0, hard: u64::MAX / 4 },
        None => return Outcome::Fits(None),
    };
    // Room is kept for a budget notice, which rides after the last message.
    let hard = budget.hard.saturating_sub(NOTICE_TOKENS);
    let before = context_tokens(p);
    if before <= hard && !requested {
        return Outcome::Fits(Some((before, budget)));
    }
    let branch: Vec<(String, Arc<Message>)> =
        p.branch_entries_in_context().into_iter().map(|(id, m)| (id.to_string(), m.clone())).collect();
    // Keep after the boundary: the last tool batch with its carrier, or the trailing user messages.
    let keep_from = match branch.last().map(|(_, m)| &**m) {
        _ if reason == Reason::Manual => branch.len(),
        Some(Message::ToolResult { .. }) => branch.iter().rposition(|(_, m)| matches!(**m, Message::Assistant { .. })).unwrap_or(0),
        Some(Message::User { .. }) => {
            branch.iter().rposition(|(_, m)| !matches!(**m, Message::User { .. })).map_or(0, |i| i + 1)
        }
        _ => branch.len(),
    };
    let why = match reason {
        Reason::Manual => "manual",
        Reason::Threshold if overflowed => "overflow",
        Reason::Threshold if before > hard => "threshold",
        Reason::Threshold => "new_context",
    };
    let started = DecisionEvent::CheckpointStarted { reason: why.into(), tokens: before };
    let fail = |reason: String| {
        Outcome::Failed(started.clone(), DecisionEvent::CheckpointFailed { code: CONTEXT_COMPACTION_FAILED.into(), reason })
    };
    if keep_from == 0 {
        let after_tail: u64 = branch.iter().map(|(_, m)| estimate(m)).sum();
        let head = if overflowed {
            format!("the provider refused the request as too long, and it holds nothing to condense before its final batch ({before} tokens by condense's estimate)")
        } else {
            format!("{before} tokens exceed the hard budget of {}, and nothing precedes the final batch", budget.hard)
        };
        return fail(too_large(head, p, &budget, after_tail, false));
    }
    let covered = &branch[..keep_from];
    let boundary = covered.last().expect("keep_from > 0").0.clone();
    let idx = p.index();
    let covers: Vec<u32> = covered.iter().filter_map(|(id, _)| idx.by_entry.get(id).copied()).collect();
    let n = idx.checkpoints.keys().next_back().map_or(1, |n| n + 1);
    // The summary takes at most a quarter of the hard budget (in chars, 4 per token), and 16k chars.
    let max_chars = ((budget.hard.saturating_sub(p.request_overhead()) / 4) * 4).min(16_384) as usize;
    // The final batch, when it alone reaches half the hard budget, gets a bounded copy (ADR 0030).
    let final_batch: Vec<&(String, Arc<Message>)> =
        branch[keep_from..].iter().filter(|(_, m)| matches!(**m, Message::ToolResult { .. })).collect();
    let batch_tokens: u64 = final_batch.iter().map(|(_, m)| estimate(m)).sum();
    let bounded: Vec<(String, String)> = if batch_tokens * 2 >= budget.hard && !final_batch.is_empty() {
        bounded_copies(p, final_batch.iter().map(|(id, m)| (id.as_str(), &**m)), budget.hard)
    } else {
        Vec::new()
    };
    // A candidate checkpoint and the tokens of the context it leaves; `tail_target` bounds the retained
    // prompts (0: none), `bounded` replaces final-batch results by their copies.
    let candidate = |summary: String, recovery: bool, tail_target: u64, bounded: &[(String, String)]| {
        let kept: Vec<String> = retained_tail(covered, tail_target).into_iter().map(|i| covered[i].0.clone()).collect();
        let mut d = DecisionEvent::CheckpointCommitted(Box::new(condense_events::CheckpointCommitted {
            n,
            boundary: boundary.clone(),
            summary,
            kept,
            covers: covers.clone(),
            recovery,
            bounded: bounded.to_vec(),
            tokens_before: before,
            tokens_after: 0,
        }));
        let after = tokens_with(p, &d);
        if let DecisionEvent::CheckpointCommitted(c) = &mut d {
            c.tokens_after = after;
        }
        (after, d)
    };
    let tail_for = |summary: &str| {
        let summary_tokens = estimate(&Message::user_text(summary.to_string(), condense_events::UserOrigin::Summary));
        budget.tail_target(summary_tokens + p.request_overhead())
    };
    let summary = match summarizer.handoff(&transcript(covered), max_chars.saturating_sub(200)) {
        Ok(Some(text)) => {
            let refs = match (covers.first(), covers.last()) {
                (Some(a), Some(b)) => format!("\nTool outputs t{a}–t{b} of this span stay recoverable with {QUERY_TOOL_NAME}."),
                _ => String::new(),
            };
            Some(format!("[Checkpoint c{n}: the conversation before this point, summarized]\n{text}{refs}"))
        }
        Ok(None) => Some(handoff(n, covered, &covers, max_chars)),
        // The summary failed: go straight to the retained-tail recovery.
        Err(_) => None,
    };
    // Compaction is abortable (ADR 0030): a preparation stopped while its summary was written commits
    // nothing; the next request prepares again.
    if let Some(why) = summarizer.stopped() {
        return Outcome::Failed(started, DecisionEvent::CheckpointFailed { code: condense_checkpoint::PREPARATION_STOPPED.into(), reason: why });
    }
    // The moves, in order (docs/checkpoints.md, "When even a checkpoint does not fit"): 1. the summary
    // with the retained tail; 2. the retained-tail recovery (a marker instead of the summary); 3. the
    // marker alone, no prompts retained; 4. the final batch cut to the room that is left (a smaller
    // bounded copy, each result naming its ref); 5. a refusal naming what did not fit.
    if let Some(s) = summary {
        let (after, d) = candidate(s.clone(), false, tail_for(&s), &bounded);
        if after <= hard {
            return Outcome::Commit(started, d);
        }
    }
    if reason == Reason::Manual {
        return fail(format!("manual compaction: the summary does not bring {before} tokens under {}", budget.hard));
    }
    let marker = format!(
        "[Checkpoint c{n}: the history before this point was removed to fit the context window (no summary could \
         be made small enough). Tool outputs of that span stay recoverable with {QUERY_TOOL_NAME} c{n}.]"
    );
    let (after, d) = candidate(marker.clone(), true, tail_for(&marker), &bounded);
    if after <= hard {
        return Outcome::Commit(started, d);
    }
    let (after, d) = candidate(marker.clone(), true, 0, &bounded);
    if after <= hard {
        return Outcome::Commit(started, d);
    }
    // What the final batch takes as the last candidate renders it; everything else is fixed now.
    let rendered_batch: u64 = final_batch
        .iter()
        .map(|(id, m)| match bounded.iter().find(|(b, _)| b == id) {
            Some((_, copy)) => (copy.chars().count() as u64).div_ceil(4),
            None => estimate(m),
        })
        .sum();
    let rest = after.saturating_sub(rendered_batch);
    if !final_batch.is_empty() && rest < hard {
        let results = final_batch.len() as u64;
        // Each copy's marker and the result's framing take about 60 tokens of its share.
        let mut share = ((hard - rest) / results).saturating_sub(60) * 4;
        while share >= MIN_BOUNDED_CHARS {
            let copies: Vec<(String, String)> =
                final_batch.iter().map(|(id, m)| (id.clone(), bounded_copy(&m.text(), share as usize, idx.by_entry.get(id).copied()))).collect();
            let (after, d) = candidate(marker.clone(), true, 0, &copies);
            if after <= hard {
                return Outcome::Commit(started, d);
            }
            share = share * 3 / 4;
        }
    }
    let after_tail: u64 = branch[keep_from..].iter().map(|(_, m)| estimate(m)).sum();
    let head = format!(
        "{before} tokens exceed the hard budget of {}; even without history the request takes {after}",
        budget.hard
    );
    fail(too_large(head, p, &budget, after_tail, !final_batch.is_empty()))
}

/// A refusal's reason: `head`, then what the request holds that no checkpoint can take away (the parts of
/// the fixed context, the final batch and what follows it, `tail` tokens) and what the user can do.
fn too_large(head: String, p: &Projection, budget: &Budget, tail: u64, cut: bool) -> String {
    let fixed = Fixed::of(p);
    format!(
        "{head} (a window of {} less {} kept for the reply): the client's own system prompt and tool declarations \
         {}, condense's tools {}, the host context sent again {}, the final batch and what follows {tail}{}. {}",
        budget.window,
        budget.headroom,
        fixed.overhead,
        fixed.tools,
        fixed.host,
        if cut { " (its outputs cut to the least a copy keeps)" } else { "" },
        if fixed.total() >= budget.hard / 2 {
            "The client's own context takes most of the window: use a model with a larger window (or tell condense its \
             real window with `condense config set models`), or fewer tools and a shorter system prompt"
        } else {
            "The newest message alone is too large for this window: send a shorter one, or use a model with a larger window"
        }
    )
}

/// Least characters a bounded copy of one result keeps (head and tail around the marker naming its ref).
pub const MIN_BOUNDED_CHARS: u64 = 400;

/// What every request carries whatever its history, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fixed {
    /// The client's own system prompt and tool declarations (the request's overhead).
    pub overhead: u64,
    /// condense's own tool declarations.
    pub tools: u64,
    /// The host context a checkpoint sends again: the newest message of each kind on the branch.
    pub host: u64,
}

impl Fixed {
    /// The fixed context of the projection's next request.
    pub fn of(p: &Projection) -> Fixed {
        let branch = p.branch_entries_in_context();
        let mut seen = std::collections::BTreeSet::new();
        let mut host = 0;
        for (_, m) in branch.iter().rev() {
            if let Some(kind) = m.host_kind() {
                if seen.insert(kind) {
                    host += p.estimate(m);
                }
            }
        }
        Fixed { overhead: p.request_overhead(), tools: crate::tools::declared_tokens(p), host }
    }

    /// All of it.
    pub fn total(&self) -> u64 {
        self.overhead + self.tools + self.host
    }
}

/// The context's tokens (as [`context_tokens`] counts them) once decision `d` is applied to a copy of
/// `p`: how a checkpoint candidate is re-estimated before it is stored.
pub fn tokens_with(p: &Projection, d: &DecisionEvent) -> u64 {
    let mut candidate = p.clone();
    candidate.apply(p.seq(), &Event::Decision(d.clone()));
    context_tokens(&candidate)
}

/// ADR 0030's bounded copies of `messages` (entry id, message), sharing half of the hard budget `hard`
/// equally: each is the entry id and its copy, naming its ref where the output has one.
pub fn bounded_copies<'a>(p: &Projection, messages: impl ExactSizeIterator<Item = (&'a str, &'a Message)>, hard: u64) -> Vec<(String, String)> {
    let share = ((hard / 2) * 4 / messages.len().max(1) as u64) as usize;
    messages.map(|(id, m)| (id.to_string(), bounded_copy(&m.text(), share, p.index().by_entry.get(id).copied()))).collect()
}

/// A checkpoint-only copy of a tool output: repeated lines dropped, then a fair share of head and tail
/// text around an explicit truncation marker. The original stays complete in the log.
pub fn bounded_copy(text: &str, share: usize, ref_n: Option<u32>) -> String {
    let mut lines: Vec<&str> = Vec::new();
    let mut dropped = 0;
    for l in text.lines() {
        if lines.last() == Some(&l) {
            dropped += 1;
        } else {
            lines.push(l);
        }
    }
    let text = if dropped > 0 { lines.join("\n") } else { text.to_string() };
    let n = text.chars().count();
    if n <= share {
        return text;
    }
    let half = share / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(n - half).collect();
    let how = match ref_n {
        Some(r) => format!("{QUERY_TOOL_NAME} t{r} returns it whole"),
        None => "the full output stays in the log".to_string(),
    };
    format!("{head}\n[… checkpoint truncation: {} of {n} characters omitted ({dropped} repeated lines dropped); {how} …]\n{tail}", n - 2 * half)
}

/// Tokens kept free within the hard budget for a budget notice (the notices are about 60).
pub const NOTICE_TOKENS: u64 = 100;

/// The first budget notice is shown from this share of the hard budget on (in percent).
pub const NOTICE_1_PERCENT: u64 = 75;
/// The second, from this share on.
pub const NOTICE_2_PERCENT: u64 = 90;

/// The budget notice for the next request, if the context has reached a notice threshold: the first at
/// 75% of the hard budget, the second at 90%. It is computed from the render (so from events only) and is
/// appended after the last message of the request, never stored, so every earlier message stays a cached
/// prefix. `tokens` is the context as the controller counts it ([`context_tokens`]), against `budget`
/// ([`budget_of`]).
pub fn notice(budget: Budget, tokens: u64) -> Option<Message> {
    let remaining = budget.hard.saturating_sub(tokens);
    // ADR 0064: the notices tell the model the budget that remains; they do not ask it to call a tool (the
    // hard boundary is what enforces the limit).
    let text = if tokens * 100 >= budget.hard * NOTICE_2_PERCENT {
        format!(
            "[condense notice 2 of 2: about {remaining} tokens of context remain before an automatic checkpoint; \
             at that point earlier context is summarized, and its originals stay recoverable by ref.]"
        )
    } else if tokens * 100 >= budget.hard * NOTICE_1_PERCENT {
        format!("[condense notice 1 of 2: about {remaining} tokens of context remain before an automatic checkpoint.]")
    } else {
        return None;
    };
    Some(Message::user_text(text, condense_events::UserOrigin::Injected))
}
