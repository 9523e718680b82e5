//! Large-context recovery on a smaller model (seed 004). After a model change, the payload guard checks
//! each outgoing request; an oversized one is rejected with a context-overflow error and recorded as a
//! provider overflow, so the normal overflow path (one checkpoint, one retry) resumes the same task. For a
//! transition, that checkpoint is prepared here: the context is read in chronological pieces within the
//! preparation's input budget, each piece is summarized (at most 64 invocations), and only a complete,
//! nonblank, bounded handoff is committed, with a metadata-only anchor (no retained tail) and an archive
//! view of the history as it was. Anything else fails closed with a typed reason and the context
//! untouched.

use crate::controller::context_tokens;
use condense_checkpoint::{path_values, Budget, DEFAULT_RESERVE};
use condense_events::{Block, DecisionEvent, Event, Message};
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
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::Disabled => write!(f, "recoverLargeContext is off"),
            Blocked::Window(w) => write!(f, "the new model's window ({w:?}) is unknown or below {MIN_WINDOW} tokens"),
            Blocked::Image(id) => write!(f, "entry `{id}` holds an image; recovery reads text only"),
            Blocked::SourceTooLarge(b) => write!(f, "{b} bytes of source, more than {MAX_SOURCE_BYTES}"),
            Blocked::TooManyInvocations(n) => write!(f, "{n} pieces need more than {MAX_INVOCATIONS} summarizer invocations"),
            Blocked::SummaryFailed(e) => write!(f, "the summarizer failed: {e}"),
            Blocked::Blank => write!(f, "the handoff is blank"),
            Blocked::Oversized(b, max) => write!(f, "the handoff is {b} bytes, over its bound of {max}"),
            Blocked::NoRoom(t, hard) => write!(f, "with the handoff the context is still {t} tokens, over {hard}"),
            Blocked::Deadline(s) => write!(f, "preparation ran past its {s}-second deadline"),
        }
    }
}

/// The overall deadline of one preparation (summarizer calls included).
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// The stable code of a recovery that failed closed.
pub const RECOVERY_BLOCKED: &str = "RECOVERY_BLOCKED";

/// Whether the payload guard applies: recovery is on, the session is in a model transition, and the new
/// window is known and at least 8,192 tokens.
pub fn guard_active(p: &Projection) -> bool {
    p.config().recover_large_context
        && p.in_model_transition()
        && p.model().and_then(|m| m.context_window).is_some_and(|w| w >= MIN_WINDOW)
}

/// The largest payload, in bytes, the guard lets through: the hard budget at four bytes per token.
pub fn payload_limit(p: &Projection) -> Option<u64> {
    let m = p.model()?;
    Some(Budget::new(m.context_window?, m.max_output, DEFAULT_RESERVE).hard * 4)
}

fn text_of(m: &Message) -> Result<String, ()> {
    let mut out = String::new();
    for b in m.content() {
        match b {
            Block::Text { text } => out.push_str(text),
            Block::ToolCall { name, arguments, .. } => out.push_str(&format!("[call {name} {arguments}]")),
            Block::Thinking { .. } => {}
            Block::Image { .. } => return Err(()),
        }
    }
    Ok(out)
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
    let budget = Budget::new(window, p.model().and_then(|m| m.max_output), DEFAULT_RESERVE);
    let input = input_budget(window) as usize;
    let max_summary = summary_budget(input as u64, 0);
    let branch: Vec<(String, Arc<Message>)> =
        p.branch_entries_in_context().into_iter().map(|(id, m)| (id.to_string(), m.clone())).collect();
    // Keep what comes after the last assistant message (the request being retried) after the boundary.
    let keep_from = branch.iter().rposition(|(_, m)| matches!(**m, Message::Assistant { .. })).map_or(0, |i| {
        if branch[i + 1..].iter().any(|(_, m)| matches!(**m, Message::ToolResult { .. })) { i } else { i + 1 }
    });
    let covered = &branch[..keep_from];
    // Chronological pieces within the input budget (a transport headroom of 4 KiB kept free).
    let piece_max = input.saturating_sub(4096).max(1024);
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0;
    let mut total = 0;
    for (i, (id, m)) in covered.iter().enumerate() {
        let t = text_of(m).map_err(|()| Blocked::Image(id.clone()))?;
        total += t.len();
        if total > MAX_SOURCE_BYTES {
            return Err(Blocked::SourceTooLarge(total));
        }
        if size + t.len() > piece_max && !pieces.last().expect("one piece").is_empty() {
            pieces.push(Vec::new());
            size = 0;
        }
        size += t.len();
        pieces.last_mut().expect("one piece").push(i);
    }
    if pieces.len() > MAX_INVOCATIONS as usize {
        return Err(Blocked::TooManyInvocations(pieces.len()));
    }
    let idx = p.index();
    let n = idx.checkpoints.keys().next_back().map_or(1, |n| n + 1);
    let archive_id = format!("a{}", idx.archives.len() + 1);
    let header = format!(
        "[Checkpoint c{n}: recovered for a {window}-token window; the history before this point is summarized \
         below in {} piece(s) and archived as {archive_id} (history_search, history_read)]\n",
        pieces.len()
    );
    // Each piece gets an equal share of what the bound leaves after the header, in bytes.
    let per_piece = (max_summary as usize).saturating_sub(header.len()) / pieces.len().max(1);
    if per_piece < 64 {
        return Err(Blocked::Oversized(header.len() + 64 * pieces.len(), max_summary));
    }
    let clip = |s: String, max: usize| -> String {
        if s.len() <= max {
            return s;
        }
        // Room for the 3-byte ellipsis, cut at a character boundary.
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    };
    let mut parts = Vec::new();
    for piece in &pieces {
        if started.elapsed() > deadline {
            return Err(Blocked::Deadline(deadline.as_secs()));
        }
        let msgs: Vec<(String, Arc<Message>)> = piece.iter().map(|&i| covered[i].clone()).collect();
        let refs: Vec<u32> = msgs.iter().filter_map(|(id, _)| idx.by_entry.get(id).copied()).collect();
        let text: String = msgs.iter().map(|(_, m)| format!("{}: {}\n", m.role(), text_of(m).unwrap_or_default())).collect();
        let part = match summarizer.handoff(&text, per_piece).map_err(|e| Blocked::SummaryFailed(e.to_string()))? {
            Some(s) if s.len() > per_piece => return Err(Blocked::Oversized(s.len(), per_piece as u64)),
            Some(s) => s,
            // The deterministic default: a one-line digest per piece (the archive holds the detail).
            None => clip(digest(parts.len() + 1, &msgs, &refs), per_piece - 1) + "\n",
        };
        parts.push(part);
    }
    if parts.iter().all(|s| s.trim().is_empty()) {
        return Err(Blocked::Blank);
    }
    let summary = format!("{header}{}", parts.join(""));
    if summary.len() as u64 > max_summary {
        return Err(Blocked::Oversized(summary.len(), max_summary));
    }
    let boundary = covered.last().map(|(id, _)| id.clone()).ok_or(Blocked::Blank)?;
    let covers: Vec<u32> = covered.iter().filter_map(|(id, _)| idx.by_entry.get(id).copied()).collect();
    let archive = DecisionEvent::ArchiveCommitted { id: archive_id, seq: p.seq(), leaf: p.path_ids().last().cloned() };
    let before = context_tokens(p);
    let mut cp = DecisionEvent::CheckpointCommitted {
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
    };
    let mut candidate = p.clone();
    candidate.apply(p.seq(), &Event::Decision(cp.clone()));
    let after = context_tokens(&candidate);
    if after > budget.hard {
        return Err(Blocked::NoRoom(after, budget.hard));
    }
    if let DecisionEvent::CheckpointCommitted { tokens_after, .. } = &mut cp {
        *tokens_after = after;
    }
    Ok(vec![archive, cp])
}

/// One line per piece: the latest prompt in it, the files its calls touched, the refs it holds.
fn digest(k: usize, msgs: &[(String, Arc<Message>)], refs: &[u32]) -> String {
    let prompt = msgs
        .iter()
        .rev()
        .find(|(_, m)| matches!(**m, Message::User { origin: condense_events::UserOrigin::Prompt, .. }))
        .map(|(_, m)| m.text().split_whitespace().collect::<Vec<_>>().join(" "));
    let mut files: Vec<String> = Vec::new();
    for (_, m) in msgs {
        for (_, _, args) in m.tool_calls() {
            for p in path_values(args) {
                let short = p.rsplit('/').next().unwrap_or(&p).to_string();
                if !files.contains(&short) {
                    files.push(short);
                }
            }
        }
    }
    let mut line = format!("• {k}:");
    if let Some(p) = prompt {
        line.push_str(&format!(" asked \"{}\";", p.chars().take(80).collect::<String>()));
    }
    let calls: usize = msgs.iter().map(|(_, m)| m.tool_calls().count()).sum();
    line.push_str(&format!(" {calls} calls"));
    if !files.is_empty() {
        line.push_str(&format!(" on {}", files.iter().take(6).cloned().collect::<Vec<_>>().join(", ")));
    }
    if let (Some(a), Some(b)) = (refs.first(), refs.last()) {
        line.push_str(&format!("; outputs t{a}–t{b}"));
    }
    line
}
