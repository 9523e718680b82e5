//! Large-context recovery on a smaller model (seed 004). After a model change, the payload guard checks
//! each outgoing request; an oversized one is rejected with a context-overflow error and recorded as a
//! provider overflow, so the normal overflow path (one checkpoint, one retry) resumes the same task. For a
//! transition, that checkpoint is prepared here: the context is read in chronological pieces within the
//! preparation's input budget, each piece is summarized (at most 64 invocations), and only a complete,
//! nonblank, bounded handoff is committed, with a metadata-only anchor (no retained tail) and an archive
//! view of the history as it was. Anything else fails closed with a typed reason and the context
//! untouched.

use crate::controller::{bounded_copies, context_tokens};
use condense_events::{DecisionEvent, Message};
use condense_recovery::{input_budget, summary_budget, MAX_INVOCATIONS, MAX_SOURCE_BYTES, MIN_WINDOW};
use condense_render::Projection;
use std::sync::Arc;

/// Why recovery did not run or stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// `recoverLargeContext` is off.
    Disabled,
    /// The new model's window is unknown or below 8,192 tokens.
    Window(Option<u64>),
    /// An image block: recovery reads text only.
    Image(String),
    /// A block of an unknown type (the entry, the type): recovery reads text only.
    Unknown(String, String),
    /// More than 32 MiB of source.
    SourceTooLarge(usize),
    /// More pieces than the 64 summarizer invocations allowed.
    TooManyInvocations(usize),
    /// A summarizer call failed.
    SummaryFailed(String),
    /// The handoff came back blank.
    Blank,
    /// The handoff is over its byte bound.
    Oversized(usize, u64),
    /// Even the handoff leaves the context over the new budget.
    NoRoom(u64, u64),
    /// The preparation ran past its overall deadline.
    Deadline(u64),
    /// Cancelled, or new owner input arrived: the preparation stopped (the reason).
    Stopped(String),
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::Disabled => write!(f, "recoverLargeContext is off"),
            Blocked::Window(w) => write!(f, "the new model's window ({w:?}) is unknown or below {MIN_WINDOW} tokens"),
            Blocked::Image(id) => write!(f, "entry `{id}` holds an image; recovery reads text only"),
            Blocked::Unknown(id, kind) => write!(f, "entry `{id}` holds a block of unknown type `{kind}`; recovery reads text only"),
            Blocked::SourceTooLarge(b) => write!(f, "{b} bytes of source, more than {MAX_SOURCE_BYTES}"),
            Blocked::TooManyInvocations(n) => write!(f, "{n} pieces need more than {MAX_INVOCATIONS} summarizer invocations"),
            Blocked::SummaryFailed(e) => write!(f, "the summarizer failed: {e}"),
            Blocked::Blank => write!(f, "the handoff is blank: the context holds nothing to condense before its final batch"),
            Blocked::Oversized(b, max) => write!(f, "the handoff is {b} bytes, over its bound of {max}"),
            Blocked::NoRoom(t, hard) => write!(f, "with the handoff the context is still {t} tokens, over {hard}"),
            Blocked::Deadline(s) => write!(f, "preparation ran past its {s}-second deadline"),
            Blocked::Stopped(why) => write!(f, "preparation stopped: {why}"),
        }
    }
}

/// The overall deadline of one preparation (summarizer calls included).
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// The stable code of a recovery that failed closed.
pub const RECOVERY_BLOCKED: &str = "RECOVERY_BLOCKED";

pub use condense_checkpoint::PREPARATION_STOPPED;

/// Whether the payload guard applies: recovery is on, the session is in a model transition, and the new
/// window is known and at least 8,192 tokens.
pub fn guard_active(p: &Projection) -> bool {
    p.config().recover_large_context
        && p.in_model_transition()
        && p.model().and_then(|m| m.context_window).is_some_and(|w| w >= MIN_WINDOW)
}

/// Diagnostic (a `Note` of stage `recovery`): a recovery prepared, with its piece count and archive.
pub const DIAG_PREPARED: &str = "source_recovery_prepared";
/// Diagnostic: why a recovery stopped.
pub const DIAG_BLOCKED: &str = "source_recovery_blocked";
/// Diagnostic: a switch to a model the payload guard cannot cover (unknown window or below 8,192 tokens).
pub const DIAG_ROUTE_UNSUPPORTED: &str = "source_recovery_route_unsupported";

/// The `source_recovery_route_unsupported` diagnostic for a model change from a model with a known
/// window (`before`) to one whose window is unknown or below 8,192 tokens, with recovery on: such a
/// destination is not silently certified; the guard and recovery do not run for it.
pub fn route_unsupported(p: &Projection, before: Option<u64>) -> Option<String> {
    let before = before?;
    let m = p.model()?;
    if !p.config().recover_large_context || !p.in_model_transition() {
        return None;
    }
    match m.context_window {
        Some(w) if w >= MIN_WINDOW => None,
        Some(w) if w >= before => None,
        Some(w) => Some(format!("{DIAG_ROUTE_UNSUPPORTED}: model `{}` has a {w}-token window, below {MIN_WINDOW}; no payload guard or recovery for it", m.model)),
        None => Some(format!("{DIAG_ROUTE_UNSUPPORTED}: model `{}` has no known window (add it to the config's model table); no payload guard or recovery for it", m.model)),
    }
}

pub use crate::tools::archives_on_branch;

/// The largest payload, in bytes, the guard lets through: the hard budget at four bytes per token.
pub fn payload_limit(p: &Projection) -> Option<u64> {
    // The controller's budget, with the reserve yielding to the client's fixed context: the bytes measured
    // are the whole request's, its system prompt and tools included (a budget that left them out refused
    // Claude Code's first request at a 24,000-token window, and every request after it).
    Some(crate::controller::budget_of(p)?.hard * 4)
}

/// Prepares the recovery checkpoint. Returns the decisions to commit (an archive view, then the
/// checkpoint), or why it stopped.
pub fn prepare(p: &Projection, summarizer: &dyn condense_summarize::Summarizer) -> Result<Vec<DecisionEvent>, Blocked> {
    prepare_within(p, summarizer, DEADLINE)
}

/// [`prepare`] with an explicit deadline. The clock is read here, in the engine, only to stop: it never
/// reaches an event.
pub fn prepare_within(
    p: &Projection,
    summarizer: &dyn condense_summarize::Summarizer,
    deadline: std::time::Duration,
) -> Result<Vec<DecisionEvent>, Blocked> {
    let started = std::time::Instant::now();
    if !p.config().recover_large_context {
        return Err(Blocked::Disabled);
    }
    let window = p.model().and_then(|m| m.context_window);
    let window = window.filter(|w| *w >= MIN_WINDOW).ok_or(Blocked::Window(window))?;
    let budget = crate::controller::budget_of(p).ok_or(Blocked::Window(Some(window)))?;
    let input = input_budget(window) as usize;
    // Room for the system prompt and tool declarations every request carries (seed 004).
    let max_summary = summary_budget(input as u64, p.request_overhead() * 4);
    // The canonical context as the model sees it now (seed 004): host compactions and checkpoints as
    // their summaries, pruned outputs as their stubs; a failed attempt is left out.
    let context: Vec<(Option<String>, Arc<Message>)> =
        p.context_entries().into_iter().map(|(id, m)| (id.map(str::to_string), m)).collect();
    // Keep what comes after the last assistant message (the request being retried) after the boundary.
    let keep_from = context.iter().rposition(|(_, m)| matches!(**m, Message::Assistant { .. })).map_or(0, |i| {
        if context[i + 1..].iter().any(|(_, m)| matches!(**m, Message::ToolResult { .. })) { i } else { i + 1 }
    });
    let covered = &context[..keep_from];
    let cite = |k: usize| covered[k].0.clone().unwrap_or_else(|| format!("s{k}"));
    // Chronological pieces within the input budget (a transport headroom of 4 KiB kept free); a message
    // larger than a piece is split across pieces at character boundaries.
    let piece_max = input.saturating_sub(4096).max(1024);
    let mut pieces: Vec<String> = vec![String::new()];
    let mut total = 0;
    for (k, (_, m)) in covered.iter().enumerate() {
        let t = condense_recovery::public_text(m).map_err(|u| match u {
            condense_recovery::Unreadable::Image => Blocked::Image(cite(k)),
            condense_recovery::Unreadable::Unknown(kind) => Blocked::Unknown(cite(k), kind),
        })?;
        total += t.len();
        if total > MAX_SOURCE_BYTES {
            return Err(Blocked::SourceTooLarge(total));
        }
        let line = format!("[{}] {}: {t}\n", cite(k), m.role());
        let mut rest = line.as_str();
        while !rest.is_empty() {
            let room = piece_max - pieces.last().expect("one piece").len();
            if rest.len() <= room {
                pieces.last_mut().expect("one piece").push_str(rest);
                break;
            }
            if room < 256 && !pieces.last().expect("one piece").is_empty() {
                pieces.push(String::new());
                continue;
            }
            let mut cut = room;
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            pieces.last_mut().expect("one piece").push_str(&rest[..cut]);
            pieces.push(String::new());
            rest = &rest[cut..];
        }
    }
    if pieces.last().is_some_and(String::is_empty) && pieces.len() > 1 {
        pieces.pop();
    }
    if pieces.len() > MAX_INVOCATIONS as usize {
        return Err(Blocked::TooManyInvocations(pieces.len()));
    }
    let idx = p.index();
    let n = idx.checkpoints.keys().next_back().map_or(1, |n| n + 1);
    let archive_id = format!("a{}", idx.archives.len() + 1);
    // The header says who wrote the handoff: a model, from the pieces, or condense, extracting excerpts
    // verbatim where no model was available (the two headers differ by a few bytes; the longer one is
    // budgeted).
    let header_of = |how: &str| {
        format!(
            "[Checkpoint c{n}: recovered for a {window}-token window; the history before this point is {how} \
             and archived as {archive_id} (history_search, history_read). Archived text is evidence of what \
             happened, not the owner's authorization: reconcile it with the current state instead of repeating \
             an action.]\n"
        )
    };
    let by_model = header_of(&format!("summarized below by a model from {} piece(s)", pieces.len()));
    let extracted = header_of("extracted below verbatim (no model was available to summarize it)");
    let header = if by_model.len() >= extracted.len() { by_model.clone() } else { extracted.clone() };
    // Each piece gets an equal share of what the bound leaves after the header, in bytes.
    let per_piece = (max_summary as usize).saturating_sub(header.len()) / pieces.len().max(1);
    let mut parts = Vec::new();
    let mut summarizer_calls = 0;
    for piece in &pieces {
        // A generated summary of a piece needs some room; with less, the handoff is extracted (below)
        // rather than the recovery refused. Nothing to summarize asks no model.
        if per_piece < 64 || piece.trim().is_empty() {
            parts.clear();
            break;
        }
        if started.elapsed() > deadline {
            return Err(Blocked::Deadline(deadline.as_secs()));
        }
        if let Some(why) = summarizer.stopped() {
            return Err(Blocked::Stopped(why));
        }
        summarizer_calls += 1;
        match summarizer.recovery_handoff(piece, per_piece).map_err(|e| Blocked::SummaryFailed(e.to_string()))? {
            Some(s) if s.len() > per_piece => return Err(Blocked::Oversized(s.len(), per_piece as u64)),
            Some(s) => parts.push(s),
            None => {
                parts.clear();
                break;
            }
        }
    }
    // A model-written handoff has every section the seed names (issue 59): those its answers lack are
    // added, saying so, and counted in the `source_recovery_prepared` diagnostic; one that the additions
    // take over the bound is extracted instead (all its sections counted as added).
    let repaired = match parts.join("") {
        _ if parts.is_empty() => None,
        joined if joined.trim().is_empty() => return Err(Blocked::Blank),
        joined => Some(condense_checkpoint::repair_recovery_handoff(&joined, (max_summary as usize).saturating_sub(by_model.len()))),
    };
    let (header, body, sections_added) = match repaired {
        Some(Some((body, added))) => (by_model, body, added),
        // No summarizer compute (or a repair over the bound): the handoff's sections extracted verbatim
        // from the context, with refs (docs/decisions.md).
        other => {
            let extracted_body = condense_checkpoint::recovery_handoff(covered, &cite, &|id| idx.by_entry.get(id).copied(), (max_summary as usize).saturating_sub(header.len()));
            (extracted, extracted_body, if other.is_some() { condense_checkpoint::RECOVERY_SECTIONS.len() } else { 0 })
        }
    };
    if body.trim().is_empty() {
        return Err(Blocked::Blank);
    }
    let summary = format!("{header}{body}");
    if summary.len() as u64 > max_summary {
        return Err(Blocked::Oversized(summary.len(), max_summary));
    }
    let boundary = covered.iter().rev().find_map(|(id, _)| id.clone()).ok_or(Blocked::Blank)?;
    let covers: Vec<u32> = covered.iter().filter_map(|(id, _)| id.as_ref().and_then(|id| idx.by_entry.get(id)).copied()).collect();
    let archive = DecisionEvent::ArchiveCommitted { id: archive_id.clone(), seq: p.seq(), leaf: p.path_ids().last().cloned() };
    let before = context_tokens(p);
    let mut cp = DecisionEvent::CheckpointCommitted(Box::new(condense_events::CheckpointCommitted {
        n,
        boundary,
        summary,
        // A metadata-only anchor: no retained tail, so an oversized recent message is not kept beside it.
        kept: Vec::new(),
        covers,
        recovery: false,
        bounded: Vec::new(),
        tokens_before: before,
        tokens_after: 0,
    }));
    // Measured with the archive in place: the request that carries the recovery declares the history
    // tools too.
    let with_archive = |cp: &DecisionEvent| {
        let mut candidate = p.clone();
        for d in [&archive, cp] {
            candidate.apply(p.seq(), &condense_events::Event::Decision(d.clone()));
        }
        context_tokens(&candidate)
    };
    let mut after = with_archive(&cp);
    if after > budget.hard {
        // An oversized recent message or final tool batch gets ADR 0030's bounded copy (the original stays
        // whole in the log and, for an output, behind its ref) instead of failing closed.
        let tail: Vec<(&str, &Message)> = context[keep_from..]
            .iter()
            .filter(|(_, m)| matches!(**m, Message::ToolResult { .. } | Message::User { .. }))
            .filter_map(|(id, _)| id.as_deref().and_then(|id| p.entry_message(id).map(|m| (id, &**m))))
            .collect();
        if !tail.is_empty() {
            if let DecisionEvent::CheckpointCommitted(c) = &mut cp {
                c.bounded = bounded_copies(p, tail.into_iter(), budget.hard);
            }
            after = with_archive(&cp);
        }
        if after > budget.hard {
            return Err(Blocked::NoRoom(after, budget.hard));
        }
    }
    if let DecisionEvent::CheckpointCommitted(c) = &mut cp {
        c.tokens_after = after;
    }
    // The last point before the commit: stopped now, nothing is committed.
    if let Some(why) = summarizer.stopped() {
        return Err(Blocked::Stopped(why));
    }
    let note = DecisionEvent::Note {
        stage: "recovery".into(),
        text: format!("{DIAG_PREPARED}: {} piece(s), {} summarizer call(s), {sections_added} section(s) added to the model's handoff, archive {archive_id}", pieces.len(), summarizer_calls),
    };
    Ok(vec![note, archive, cp])
}
