//! Checkpoint compaction (seed 001, ADR 0030 as amended by ADRs 0049, 0061 and 0064): the budget a request
//! must fit, where a checkpoint cuts, which recent user messages it retains, and the deterministic
//! handoff summary that stands in for the history before the cut.
//!
//! Budget: headroom is the largest of the configured reserve (never more than half the window), the
//! model's output allowance capped at 25% of the window, and 5% of the window; the hard budget is the
//! window minus headroom. The retained tail is recent user messages only, capped at 20,000 tokens and at
//! half of the hard budget that remains after the summary.
//!
//! # Example
//!
//! ```
//! use condense_checkpoint::{handoff, Budget};
//! use condense_events::{Block, Message, UserOrigin};
//! use std::sync::Arc;
//!
//! // A 200k-token model with 32k of output: the output allowance is the headroom.
//! let budget = Budget::of_model(200_000, Some(32_000));
//! assert_eq!((budget.headroom, budget.hard), (32_000, 168_000));
//! // The handoff that stands in for the history before a cut.
//! let read = Message::Assistant {
//!     content: vec![Block::tool_call("c1".into(), "read".into(), r#"{"path":"src/main.rs"}"#.into())],
//!     model: None,
//!     stop: None,
//!     usage: None,
//! };
//! let history = vec![("u1".to_string(), Arc::new(Message::user_text("fix the parser", UserOrigin::Prompt))), ("a1".to_string(), Arc::new(read))];
//! let text = handoff(1, &history, &[1], 4_000);
//! assert!(text.contains("fix the parser") && text.contains("src/main.rs"), "{text}");
//! ```

use condense_events::{Block, Message, UserOrigin};
use condense_index::facts::FactsSeen;
use condense_tokens::estimate;
use std::collections::{BTreeMap, BTreeSet};

/// pi's default reserve, in tokens.
pub const DEFAULT_RESERVE: u64 = 16_384;
/// The retained tail never holds more than this many tokens.
pub const TAIL_CAP: u64 = 20_000;
/// The stable error code of a checkpoint that could not bring the context under budget.
pub const CONTEXT_COMPACTION_FAILED: &str = "CONTEXT_COMPACTION_FAILED";
/// The stable code of a checkpoint or recovery whose preparation was stopped (its request given up, or new
/// owner input arrived) before it committed anything.
pub const PREPARATION_STOPPED: &str = "PREPARATION_STOPPED";

/// The token budget of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The model's context window.
    pub window: u64,
    /// Tokens kept free for the reply and the request's overhead.
    pub headroom: u64,
    /// What a request may hold: `window - headroom`.
    pub hard: u64,
}

impl Budget {
    /// The budget of a model with `window` tokens of context and `max_output` tokens of output, under a
    /// configured `reserve`.
    pub fn new(window: u64, max_output: Option<u64>, reserve: u64) -> Budget {
        let reserve = reserve.min(window / 2);
        let output = max_output.unwrap_or(0).min(window / 4);
        let five = window.div_ceil(20);
        let headroom = reserve.max(output).max(five);
        Budget { window, headroom, hard: window.saturating_sub(headroom) }
    }

    /// The budget of a model. ADR 0061 derives the reserve from the window instead of a setting, and
    /// there is no reserve setting: [`DEFAULT_RESERVE`] (pi's default), which [`Budget::new`] caps at half
    /// the window so small windows stay compactable.
    pub fn of_model(window: u64, max_output: Option<u64>) -> Budget {
        Budget::new(window, max_output, DEFAULT_RESERVE)
    }

    /// The budget of a model for a client whose every request carries `fixed` tokens whatever its history
    /// (its own system prompt and tool declarations, condense's tools, the host context a checkpoint sends
    /// again). The reserve (not the output allowance, not the 5% floor) yields to that fixed context so the
    /// history keeps at least a quarter of the window beside it: with a 32,000-token window and a client
    /// whose fixed context is 12,500 tokens, the seed's 16,000 reserve left 3,500 tokens for the whole
    /// conversation, and a single tool output more could be fitted by nothing (docs/checkpoints.md, "The
    /// client's fixed context"). A deviation from ADR 0030's "at least the configured reserve", which ADR
    /// 0061 already derives from the model instead of a setting.
    pub fn fitted(window: u64, max_output: Option<u64>, fixed: u64) -> Budget {
        let room = window.saturating_sub(fixed).saturating_sub(window / 4);
        Budget::new(window, max_output, DEFAULT_RESERVE.min(room))
    }

    /// The retained-tail target once a summary of `summary_tokens` is in place.
    pub fn tail_target(&self, summary_tokens: u64) -> u64 {
        (self.hard.saturating_sub(summary_tokens) / 2).min(TAIL_CAP)
    }
}

/// The recent user prompts to retain, newest last: walking back from the newest, each prompt is taken
/// while the total stays within `target` tokens. Returns positions in `messages`.
pub fn retained_tail(messages: &[(String, std::sync::Arc<Message>)], target: u64) -> Vec<usize> {
    let mut out = Vec::new();
    let mut total = 0;
    for (i, (_, m)) in messages.iter().enumerate().rev() {
        if !matches!(**m, Message::User { origin: UserOrigin::Prompt, .. }) {
            continue;
        }
        let t = estimate(m);
        if total + t > target {
            break;
        }
        total += t;
        out.push(i);
    }
    out.reverse();
    out
}

fn clip(s: &str, max: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `s` in at most `max` bytes, cut at a character boundary, `…` marking a cut.
fn clip_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A deterministic handoff summary of `messages` with the sections a handoff needs: goal, constraints,
/// progress, decisions, files read and modified (each when there is one), next steps, and the refs it
/// covers. At most `max_chars`.
pub fn handoff(n: u32, messages: &[(String, std::sync::Arc<Message>)], refs: &[u32], max_chars: usize) -> String {
    let prompts: Vec<String> = messages
        .iter()
        .filter(|(_, m)| matches!(**m, Message::User { origin: UserOrigin::Prompt, .. }))
        .map(|(_, m)| m.typed_text())
        .filter(|t| !t.trim().is_empty())
        .collect();
    let replies: Vec<String> = messages
        .iter()
        .filter(|(_, m)| matches!(**m, Message::Assistant { .. }))
        .map(|(_, m)| m.text())
        .filter(|t| !t.trim().is_empty())
        .collect();
    let mut read = BTreeSet::new();
    let mut modified = BTreeSet::new();
    let mut failures = Vec::new();
    for (_, m) in messages {
        for b in m.content() {
            if let Block::ToolCall(c) = b {
                let (name, arguments) = (&c.name, &c.arguments);
                let lower = name.to_ascii_lowercase();
                let paths = path_values(arguments);
                let target = if ["edit", "write", "apply_patch", "multiedit", "notebookedit"].iter().any(|w| lower.contains(w)) {
                    &mut modified
                } else if ["read", "view", "cat", "open"].iter().any(|w| lower.contains(w)) {
                    &mut read
                } else {
                    continue;
                };
                target.extend(paths);
            }
        }
        if let Message::ToolResult { tool_name, is_error: true, .. } = &**m {
            failures.push(format!("{tool_name}: {}", clip(&m.text(), 100)));
        }
    }
    let mut s = format!("[Checkpoint c{n}: the conversation before this point, summarized]\n");
    // The first and the latest request come before anything else (issue 36).
    s.push_str(&format!("## Goal\n{}\n", prompts.first().map_or("(no user prompt)".to_string(), |p| clip(p, 400))));
    if prompts.len() > 1 {
        s.push_str(&format!("## Latest request\n{}\n", clip(prompts.last().expect("more than one"), 400)));
    }
    if prompts.len() > 2 {
        s.push_str("## Constraints and later requests\n");
        for p in prompts[1..prompts.len() - 1].iter().rev().take(5).rev() {
            s.push_str(&format!("- {}\n", clip(p, 200)));
        }
    }
    s.push_str("## Progress\n");
    for r in replies.iter().rev().take(4).rev() {
        s.push_str(&format!("- {}\n", clip(r, 300)));
    }
    if !failures.is_empty() {
        s.push_str("## Decisions and failures to remember\n");
        for f in failures.iter().rev().take(5).rev() {
            s.push_str(&format!("- {f}\n"));
        }
    }
    // A file section is written when the span read or modified a file: an empty one says nothing.
    for (heading, files) in [("Files read", &read), ("Files modified", &modified)] {
        if !files.is_empty() {
            s.push_str(&format!("## {heading}\n{}\n", files.iter().take(30).map(String::as_str).collect::<Vec<_>>().join(", ")));
        }
    }
    // The latest request is quoted above, not again.
    s.push_str("## Next steps\n");
    s.push_str(match prompts.len() {
        0 => "Continue from the messages that follow.\n",
        1 => "Continue from the goal.\n",
        _ => "Continue from the latest request.\n",
    });
    if let (Some(first), Some(last)) = (refs.first(), refs.last()) {
        s.push_str(&format!("## Originals\nt{first}–t{last}, with {}.\n", condense_events::QUERY_TOOL_NAME));
    }
    // The names the agent used that came from what tools showed it, in what room the sections leave (and
    // at most NAMES_SHARE percent of the handoff): a compressed chain's block lists them, and a checkpoint
    // summarizes the blocks away.
    let room = (max_chars * NAMES_SHARE / 100).min(max_chars.saturating_sub(s.len()));
    let names = names_used(messages, room.saturating_sub("## Names used\n\n".len()));
    if !names.is_empty() {
        s.push_str(&format!("## Names used\n{names}\n"));
    }
    clip(&s, max_chars)
}

/// The share of a handoff, in percent, its "Names used" section may take at most.
pub const NAMES_SHARE: usize = 50;

/// The names (facts, [`condense_index::facts`]) the assistant messages of `messages` used that one of its
/// tool outputs held and none of its user messages did ([`FactsSeen::used_names`] over the whole span),
/// the newest use first (a message's own in sorted order), each once, joined by `, ` in at most `room`
/// bytes.
fn names_used(messages: &[(String, std::sync::Arc<Message>)], room: usize) -> String {
    let mut seen = FactsSeen::default();
    for (_, m) in messages {
        seen.add(m);
    }
    let last = messages.len().saturating_sub(1);
    let mut out = String::new();
    let mut listed = BTreeSet::new();
    for (_, m) in messages.iter().rev().filter(|(_, m)| matches!(**m, Message::Assistant { .. })) {
        let mut used = seen.used_names(last, [&**m]);
        used.sort();
        for name in used {
            if !listed.insert(name.clone()) {
                continue;
            }
            let sep = if out.is_empty() { 0 } else { 2 };
            if out.len() + sep + name.len() > room {
                return out;
            }
            if sep > 0 {
                out.push_str(", ");
            }
            out.push_str(&name);
        }
    }
    out
}

/// The Task section's share of a recovery handoff, in percent.
const TASK_SHARE: usize = 22;

/// The sections of a recovery handoff, as seed 004 names them, in order: the extracted handoff writes
/// them, a model is asked for them, and [`repair_recovery_handoff`] checks a model's answer has them.
pub const RECOVERY_SECTIONS: [&str; 8] =
    ["Task", "Constraints", "Decisions", "Completed actions", "Uncertain actions", "Dependencies", "References", "Next step"];

/// A model-written recovery handoff with every section of [`RECOVERY_SECTIONS`]: the sections its answer
/// lacks are added, saying the model named nothing there, and the count of sections added; `None` when the
/// repaired text is over `max` bytes (the caller extracts the handoff instead).
pub fn repair_recovery_handoff(text: &str, max: usize) -> Option<(String, usize)> {
    let lower = text.to_lowercase();
    let mut out = text.trim_end().to_string();
    let mut added = 0;
    for section in RECOVERY_SECTIONS {
        let section_lower = section.to_lowercase();
        let has = lower.lines().any(|l| l.starts_with('#') && l.trim_start_matches('#').trim().starts_with(&section_lower));
        if !has {
            out.push_str(&format!("\n## {section}\n- (none named)"));
            added += 1;
        }
    }
    out.push('\n');
    (out.len() <= max).then_some((out, added))
}

/// The recovery handoff seed 004 lists, extracted verbatim when no summarizer compute is configured: the
/// current task, constraints, decisions, completed and uncertain actions, dependencies, source references
/// and the next step, each line cited by the entry it comes from (`[id]`, readable with `history_read`)
/// and its output ref where it has one. `cite(k)` names message `k`; `tool_ref` maps an entry id to its
/// ref. Sections share `max` bytes; a section over its share keeps its newest lines.
pub fn recovery_handoff(
    context: &[(Option<String>, std::sync::Arc<Message>)],
    cite: &dyn Fn(usize) -> String,
    tool_ref: &dyn Fn(&str) -> Option<u32>,
    max: usize,
) -> String {
    let one_line = |t: &str, n: usize| clip(&t.split_whitespace().collect::<Vec<_>>().join(" "), n);
    // The user's prompts with what they typed, each read once.
    let prompts: Vec<(usize, String)> = context
        .iter()
        .enumerate()
        .filter(|(_, (_, m))| matches!(**m, Message::User { origin: UserOrigin::Prompt, .. }))
        .map(|(k, (_, m))| (k, m.typed_text()))
        .filter(|(_, t)| !t.trim().is_empty())
        .collect();
    // The first and the latest request lead the Task section and are kept before anything else of it;
    // earlier summaries fill what room is left, newest first (issue 36: compressed-chain blocks, being the
    // newest lines, used to push the user's requests out).
    // The latest request is the one being worked on: it always shows whole within the section's room; the
    // first gets at most half of it while the latest needs the rest, and gives back what the latest does
    // not take (issue 59: a long first request filled the section and the latest was dropped).
    let mut task = Vec::new();
    let task_room = (max * TASK_SHARE / 100).saturating_sub("## Task\n".len() + 2);
    let first = prompts.first().map(|(k, text)| format!("- first request [{}]: {}", cite(*k), one_line(text, 600)));
    let latest = prompts.last().filter(|_| prompts.len() > 1).map(|(k, text)| format!("- latest request [{}]: {}", cite(*k), one_line(text, 600)));
    match (first, latest) {
        (Some(first), Some(latest)) => {
            let first = clip_bytes(&first, task_room.saturating_sub(latest.len().min(task_room / 2)));
            let latest = clip_bytes(&latest, task_room.saturating_sub(first.len()));
            task.push(first);
            task.push(latest);
        }
        (Some(first), None) => task.push(first),
        _ => {}
    }
    for (k, (_, m)) in context.iter().enumerate().rev() {
        if matches!(**m, Message::User { origin: UserOrigin::Summary, .. }) {
            task.push(format!("- earlier summary [{}]: {}", cite(k), one_line(&m.text(), 400)));
        }
    }
    // Sentences of the user's that bind the work, and of the assistant's that settle a choice.
    let sentences = |t: &str| -> Vec<String> {
        t.split(['\n', '.', '!', '?']).map(str::trim).filter(|x| x.len() > 8).map(str::to_string).collect()
    };
    let has = |s: &str, words: &[&str]| {
        let l = format!(" {} ", s.to_lowercase());
        words.iter().any(|w| l.contains(w))
    };
    let mut constraints = Vec::new();
    for (k, text) in &prompts {
        let k = *k;
        for s in sentences(text) {
            if has(&s, &[" must ", " never ", " don't ", " do not ", " always ", " only ", " avoid ", " without ", " should not "]) {
                constraints.push(format!("- [{}] {}", cite(k), one_line(&s, 200)));
            }
        }
    }
    let mut decisions = Vec::new();
    let mut last_reply = None;
    for (k, (_, m)) in context.iter().enumerate() {
        if let Message::Assistant { .. } = **m {
            let text: String = m.content().iter().filter_map(|b| if let Block::Text { text } = b { Some(text.as_str()) } else { None }).collect();
            if !text.trim().is_empty() {
                last_reply = Some((k, text.clone()));
            }
            for s in sentences(&text) {
                if has(&s, &[" decided ", " decide ", " will ", " chose ", " instead ", " going to ", " plan ", " use ", " because "]) {
                    decisions.push(format!("- [{}] {}", cite(k), one_line(&s, 200)));
                }
            }
        }
    }
    // Calls and what became of them in this context.
    let mut outcome: BTreeMap<&str, (usize, bool)> = BTreeMap::new();
    for (k, (_, m)) in context.iter().enumerate() {
        if let Message::ToolResult { call_id, is_error, .. } = &**m {
            outcome.insert(call_id.as_str(), (k, *is_error));
        }
    }
    let (mut done, mut uncertain) = (Vec::new(), Vec::new());
    let mut deps = BTreeSet::new();
    for (k, (_, m)) in context.iter().enumerate() {
        for (id, name, args) in m.tool_calls() {
            deps.extend(path_values(args));
            let call = format!("{name} {}", one_line(args, 120));
            match outcome.get(id) {
                Some(&(r, false)) => {
                    let t = context[r].0.as_deref().and_then(tool_ref).map_or(String::new(), |t| format!(" → t{t}"));
                    done.push(format!("- [{}] {call}{t}", cite(r)));
                }
                Some(&(r, true)) => uncertain.push(format!("- [{}] {call}: failed: {}", cite(r), one_line(&context[r].1.text(), 120))),
                None => uncertain.push(format!("- [{}] {call}: no result seen; check before repeating it", cite(k))),
            }
        }
    }
    let refs: Vec<u32> = context.iter().filter_map(|(id, _)| id.as_deref().and_then(tool_ref)).collect();
    let mut references = vec!["- every [id] above is readable with history_read; history_search finds others".to_string()];
    if let (Some(a), Some(b)) = (refs.iter().min(), refs.iter().max()) {
        references.push(format!("- tool outputs t{a}–t{b}: originals with {}", condense_events::QUERY_TOOL_NAME));
    }
    let next = match (last_reply, prompts.last()) {
        (Some((k, t)), _) => vec![format!("- the assistant last said [{}]: {}", cite(k), one_line(&t, 400))],
        (None, Some((p, _))) => vec![format!("- answer the latest request [{}]", cite(*p))],
        _ => Vec::new(),
    };
    // (lines, a hint after the title, share of `max` in percent, whether the first lines are kept rather
    // than the newest), in the order of RECOVERY_SECTIONS
    let sections: [(Vec<String>, &str, usize, bool); 8] = [
        (task, "", TASK_SHARE, true),
        (constraints, "", 10, false),
        (decisions, "", 14, false),
        (done, "", 16, false),
        (uncertain, " (reconcile, do not repeat blindly)", 10, false),
        (deps.into_iter().map(|d| format!("- {d}")).collect(), "", 10, false),
        (references, "", 6, false),
        (next, "", 12, false),
    ];
    let mut out = String::new();
    for (title, (lines, hint, share, first_kept)) in RECOVERY_SECTIONS.into_iter().zip(sections) {
        let room = max * share / 100;
        let head = format!("## {title}{hint}\n");
        if lines.is_empty() {
            continue;
        }
        // The lines in the order they are kept: the first ones, or the newest.
        let order: Vec<&String> = if first_kept { lines.iter().collect() } else { lines.iter().rev().collect() };
        let mut kept: Vec<String> = Vec::new();
        let mut used = head.len();
        for l in order {
            if used + l.len() < room {
                used += l.len() + 1;
                kept.push(l.clone());
            } else if room > used + 8 && (kept.is_empty() || (first_kept && kept.len() < 2)) {
                // A line over the room is cut to it rather than dropped: the section's leading line (a
                // request, for Task) always shows.
                let cut = clip_bytes(l, room - used - 1);
                used += cut.len() + 1;
                kept.push(cut);
                break;
            } else {
                break;
            }
        }
        if kept.is_empty() {
            continue;
        }
        if !first_kept {
            kept.reverse();
        }
        out.push_str(&head);
        for l in kept {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// String values under keys naming a path or file in a JSON argument text.
pub fn path_values(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = json;
    while let Some(k) = rest.find('"') {
        rest = &rest[k + 1..];
        let Some(end) = rest.find('"') else { break };
        let key = rest[..end].to_ascii_lowercase();
        rest = &rest[end + 1..];
        let after = rest.trim_start();
        if let Some(v) = after.strip_prefix(':') {
            let v = v.trim_start();
            if (key.contains("path") || key.contains("file")) && v.starts_with('"') {
                if let Some(e) = v[1..].find('"') {
                    out.push(v[1..1 + e].to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn budget_math() {
        // 200k window, 32k output, 16k reserve: output capped at 50k is 32k, 5% is 10k → headroom 32k.
        let b = Budget::new(200_000, Some(32_000), DEFAULT_RESERVE);
        assert_eq!((b.headroom, b.hard), (32_000, 168_000));
        // A small window: the reserve is capped at half the window, 5% and 25% lose.
        let b = Budget::new(20_000, Some(8_000), 16_384);
        assert_eq!((b.headroom, b.hard), (10_000, 10_000));
        // No output limit known: reserve wins over 5%.
        let b = Budget::new(1_000_000, None, DEFAULT_RESERVE);
        assert_eq!((b.headroom, b.hard), (50_000, 950_000));
        // The output allowance is capped at 25% of the window: 60k of 100k counts 25k (uncapped: 60k).
        let b = Budget::new(100_000, Some(60_000), 0);
        assert_eq!((b.headroom, b.hard), (25_000, 75_000));
        // Below every other term the 5% floor holds.
        assert_eq!(Budget::new(100_000, Some(1_000), 0).headroom, 5_000);
        assert_eq!(Budget::new(200_000, Some(32_000), DEFAULT_RESERVE).tail_target(8_000), 20_000);
        // 32k window: the 16,384 reserve is capped at 16,000, so the hard budget is 16,000.
        assert_eq!(Budget::new(32_000, None, DEFAULT_RESERVE).tail_target(2_000), 7_000);
    }

    #[test]
    fn the_reserve_yields_to_the_clients_fixed_context() {
        // A small fixed context changes nothing.
        assert_eq!(Budget::fitted(32_000, None, 2_000), Budget::new(32_000, None, DEFAULT_RESERVE));
        assert_eq!(Budget::fitted(200_000, Some(32_000), 20_000), Budget::new(200_000, Some(32_000), DEFAULT_RESERVE));
        // 12,500 fixed in 32,000: the reserve leaves a quarter of the window (8,000) to the history.
        let b = Budget::fitted(32_000, None, 12_500);
        assert_eq!((b.headroom, b.hard), (11_500, 20_500));
        assert_eq!(b.hard - 12_500, 8_000);
        // Fixed context past three quarters of the window: the 5% floor is all that is kept.
        assert_eq!(Budget::fitted(24_000, None, 19_500).headroom, 1_200);
        // The output allowance never yields (the reply needs it): 4,096 of 16,000 is capped at 4,000.
        assert_eq!(Budget::fitted(16_000, Some(4_096), 9_000).headroom, 4_000);
    }

    #[test]
    fn tail_takes_recent_prompts_within_target() {
        let m = |t: &str, o| (String::new(), Arc::new(Message::user_text(t, o)));
        let msgs = vec![m(&"a".repeat(400), UserOrigin::Prompt), m("injected", UserOrigin::Injected), m(&"b".repeat(40), UserOrigin::Prompt), m(&"c".repeat(40), UserOrigin::Prompt)];
        assert_eq!(retained_tail(&msgs, 20), vec![2, 3]);
        assert_eq!(retained_tail(&msgs, 200), vec![0, 2, 3]);
        assert!(retained_tail(&msgs, 5).is_empty());
    }

    #[test]
    fn handoff_has_the_sections() {
        // The goal is what the user typed: not the host's environment or the reminder ahead of the words.
        let first = Message::User {
            content: vec![Block::Text { text: "<system-reminder>\nAttribution for git commits\n</system-reminder>".into() }, Block::Text { text: "Port the parser to Rust".into() }],
            origin: UserOrigin::Prompt,
        };
        let msgs = vec![
            (String::new(), Arc::new(Message::user_text("<environment_context><cwd>/w</cwd></environment_context>", UserOrigin::Host))),
            (String::new(), Arc::new(first)),
            (
                String::new(),
                Arc::new(Message::Assistant {
                    content: vec![
                        Block::Text { text: "Reading the grammar first.".into() },
                        Block::tool_call("1".into(), "read".into(), "{\"path\":\"grammar.y\"}".into()),
                        Block::tool_call("2".into(), "write".into(), "{\"file_path\":\"src/parse.rs\",\"content\":\"x\"}".into()),
                    ],
                    model: None,
                    stop: None,
                    usage: None,
                }),
            ),
        ];
        let s = handoff(1, &msgs, &[3, 9], 4000);
        assert!(s.starts_with("[Checkpoint c1"));
        assert!(!s.contains("## Names used"), "no tool output, no names: {s}");
        for section in ["## Goal\nPort the parser to Rust", "## Progress\n- Reading the grammar first.", "## Files read\ngrammar.y", "## Files modified\nsrc/parse.rs", "## Next steps", "## Originals\nt3–t9, with context_tree_query."] {
            assert!(s.contains(section), "missing {section:?} in\n{s}");
        }
        // A span that read or wrote no file has no file section: an empty one says nothing.
        let s = handoff(1, &msgs[..2], &[], 4000);
        assert!(!s.contains("## Files") && !s.contains("(none)") && !s.contains("## Originals"), "{s}");
        assert!(s.contains("## Goal\nPort the parser to Rust\n"), "{s}");
        // A span without a prompt (a long run whose prompt an earlier checkpoint covered) points to what
        // follows, not to a latest request it does not have.
        let s = handoff(2, &msgs[2..], &[3, 9], 4000);
        assert!(s.contains("## Goal\n(no user prompt)\n") && s.contains("## Next steps\nContinue from the messages that follow.\n"), "{s}");
        assert!(!s.contains("(none)"), "{s}");
    }

    /// The names the agent used that a tool output showed it (not the user), newest use first, in what
    /// room the other sections leave, at most half the handoff.
    #[test]
    fn handoff_lists_the_names_used_newest_first_within_its_room() {
        let prompt = (String::new(), Arc::new(Message::user_text("fix parse_config", UserOrigin::Prompt)));
        let said = |t: &str| (String::new(), Arc::new(Message::Assistant { content: vec![Block::Text { text: t.into() }], model: None, stop: None, usage: None }));
        let output = |t: &str| (String::new(), Arc::new(Message::ToolResult { call_id: "c".into(), tool_name: "read".into(), content: vec![Block::Text { text: t.into() }], is_error: false }));
        let msgs = vec![
            prompt,
            output("fn parse_config() -> ConfigError { load_all(); NEVER_USED }"),
            said("ConfigError first, my_own_name too"),
            said("then load_all and parse_config"),
        ];
        let s = handoff(1, &msgs, &[], 4000);
        assert!(s.ends_with("## Names used\nload_all, ConfigError"), "{s:?}");
        // Cut to its room: only the newest names that fit.
        let many: Vec<String> = (0..400).map(|i| format!("name_{i:03}")).collect();
        let msgs = vec![output(&many.join(" ")), said(&many.join(" "))];
        let s = handoff(1, &msgs, &[], 2000);
        let names = s.split("## Names used\n").nth(1).unwrap();
        assert!(names.len() <= 2000 * NAMES_SHARE / 100 && names.starts_with("name_000, name_001"), "{s}");
        assert!(s.len() <= 2000);
    }

    /// Issue 59: a recovery handoff without a section the seed names gets it, saying so, and the count;
    /// none when the repair is over the bound.
    #[test]
    fn a_recovery_handoff_missing_sections_is_repaired_within_its_bound() {
        let full: String = RECOVERY_SECTIONS.iter().map(|s| format!("## {s}\n- x [e1]\n")).collect();
        assert_eq!(repair_recovery_handoff(&full, 10_000), Some((full.clone(), 0)));
        let (text, added) = repair_recovery_handoff("## Task\n- port the parser [e3]\n### Next step:\n- run the tests [e9]\n## Uncertain actions (reconcile)\n- y [e4]", 10_000).unwrap();
        assert_eq!(added, 5);
        for s in RECOVERY_SECTIONS {
            assert_eq!(text.matches(&format!("# {s}")).count(), 1, "{s} in {text}");
        }
        assert_eq!(repair_recovery_handoff("## Task\n- x", 100), None);
    }

    /// Issue 59: a first request that fills the Task section on its own no longer pushes the latest out.
    #[test]
    fn the_latest_request_always_shows_in_the_task() {
        let prompt = |t: &str| (None, Arc::new(Message::user_text(t, UserOrigin::Prompt)));
        let ctx = vec![prompt(&format!("Task 1 {}", "port every module of src/server.rs ".repeat(40))), prompt("Task 12: bump the version in Cargo.toml")];
        for max in [1_000, 2_000, 8_000] {
            let r = recovery_handoff(&ctx, &|k| format!("e{k}"), &|_| None, max);
            let task = r.split("## Task\n").nth(1).unwrap().split("\n## ").next().unwrap();
            assert!(task.contains("- latest request [e1]: Task 12: bump the version in Cargo.toml"), "{max}: {r}");
            assert!(task.contains("- first request [e0]: Task 1 port"), "{max}: {r}");
        }
    }

    #[test]
    fn the_first_and_latest_requests_come_before_anything_else() {
        let prompt = |t: &str| (String::new(), Arc::new(Message::user_text(t, UserOrigin::Prompt)));
        let reply = |t: &str| (String::new(), Arc::new(Message::Assistant { content: vec![Block::Text { text: t.into() }], model: None, stop: None, usage: None }));
        let msgs = vec![prompt("Port the parser"), reply("ok"), prompt("Keep the old API"), reply("ok"), prompt("Now add the tests"), reply("working")];
        let s = handoff(2, &msgs, &[], 4000);
        let body = s.split_once('\n').unwrap().1;
        assert!(body.starts_with("## Goal\nPort the parser\n## Latest request\nNow add the tests\n## Constraints and later requests\n- Keep the old API\n## Progress"), "{s}");
        // The next steps point to the latest request without quoting it a second time.
        assert!(s.contains("## Next steps\nContinue from the latest request.") && s.matches("Now add the tests").count() == 1, "{s}");
        let one = handoff(1, &msgs[..2], &[], 4000);
        assert!(one.contains("## Next steps\nContinue from the goal.") && one.matches("Port the parser").count() == 1, "{one}");
        // The recovery handoff's Task section: the requests first, then the summaries, whatever their size.
        let mut ctx: Vec<(Option<String>, Arc<Message>)> = msgs.into_iter().map(|(_, m)| (None, m)).collect();
        for k in 0..30 {
            ctx.push((None, Arc::new(Message::user_text(format!("[Compressed chain b{k}: {}]", "t1 read (src/x.rs): 1350 chars ".repeat(20)), UserOrigin::Summary))));
        }
        let r = recovery_handoff(&ctx, &|k| format!("e{k}"), &|_| None, 4000);
        let task = r.split("## Task\n").nth(1).unwrap();
        assert!(task.starts_with("- first request [e0]: Port the parser\n- latest request [e4]: Now add the tests\n- earlier summary [e35]"), "{r}");
    }
}
