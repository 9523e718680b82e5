//! The provider-validity check (DESIGN invariant 2), reusable by every render phase and by tests.
//!
//! One rule table ([`RULES`]): each rule the OpenAI Chat Completions and Anthropic Messages APIs document
//! for a message list, as the neutral context must satisfy it before the exporters shape it (they merge
//! adjacent same-role messages, drop whitespace-only text blocks, leave thinking-only assistant messages
//! out of Chat Completions, map tool names outside the providers' pattern, send arguments that are not a
//! JSON object to Anthropic as `{"input": TEXT}` (OpenAI takes the string), and rename for Anthropic a
//! tool-call id repeated in a later message; those are not violations).

use condense_events::{is_provider_identifier, Block, Message};
use std::collections::BTreeSet;

/// One rule of the table: a stable code, the providers that enforce it, and what it requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Stable code, as [`Violation::rule`] names it.
    pub code: &'static str,
    /// `both`, `anthropic` or `openai`.
    pub providers: &'static str,
    /// What the rule requires.
    pub requires: &'static str,
}

/// Every rule the check enforces.
pub const RULES: [Rule; 7] = [
    Rule { code: "first-user", providers: "both", requires: "the first message is a user message (Anthropic; OpenAI rejects a tool message without its call)" },
    Rule { code: "assistant-content", providers: "both", requires: "an assistant message has text that is not blank, a tool call, or thinking" },
    Rule { code: "user-content", providers: "both", requires: "a user message has text that is not blank, or an image" },
    Rule { code: "call-id-unique", providers: "both", requires: "a tool-call id appears once in an assistant message" },
    Rule { code: "call-id-format", providers: "both", requires: "a tool-call id is 1 to 64 characters of `A-Z a-z 0-9 _ -`" },
    Rule { code: "result-follows-call", providers: "both", requires: "every tool call is answered by a result before the next message that is not a result" },
    Rule { code: "result-has-call", providers: "both", requires: "every tool result answers an unanswered call of the assistant message just before it" },
];

/// One way a context would be rejected by OpenAI or Anthropic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The context does not start with a user message.
    StartsWithAssistant,
    /// An assistant message has no content a provider accepts.
    EmptyAssistant {
        /// Index of the message.
        at: usize,
    },
    /// A user message has no content a provider accepts.
    EmptyUser {
        /// Index of the message.
        at: usize,
    },
    /// A tool call id appears twice in one assistant message.
    DuplicateCallId {
        /// Index of the message.
        at: usize,
        /// The id.
        id: String,
    },
    /// A tool call id the providers' id pattern rejects.
    BadCallId {
        /// Index of the message.
        at: usize,
        /// The id.
        id: String,
    },
    /// A tool call has no result before the next non-result message (or the end).
    MissingResult {
        /// Index of the assistant message.
        at: usize,
        /// The call id.
        id: String,
    },
    /// A result does not answer an open call of the assistant message just before it.
    OrphanResult {
        /// Index of the result.
        at: usize,
        /// Its call id.
        id: String,
    },
}

impl Violation {
    /// The message it is about (0 for the context's first message).
    pub fn at(&self) -> usize {
        match self {
            Violation::StartsWithAssistant => 0,
            Violation::EmptyAssistant { at }
            | Violation::EmptyUser { at }
            | Violation::DuplicateCallId { at, .. }
            | Violation::BadCallId { at, .. }
            | Violation::MissingResult { at, .. }
            | Violation::OrphanResult { at, .. } => *at,
        }
    }

    /// The code of the rule it breaks (see [`RULES`]).
    pub fn rule(&self) -> &'static str {
        match self {
            Violation::StartsWithAssistant => "first-user",
            Violation::EmptyAssistant { .. } => "assistant-content",
            Violation::EmptyUser { .. } => "user-content",
            Violation::DuplicateCallId { .. } => "call-id-unique",
            Violation::BadCallId { .. } => "call-id-format",
            Violation::MissingResult { .. } => "result-follows-call",
            Violation::OrphanResult { .. } => "result-has-call",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::StartsWithAssistant => write!(f, "message 0: the context does not start with a user message"),
            Violation::EmptyAssistant { at } => write!(f, "message {at}: assistant message without content"),
            Violation::EmptyUser { at } => write!(f, "message {at}: user message without content"),
            Violation::DuplicateCallId { at, id } => write!(f, "message {at}: tool call `{id}` appears twice"),
            Violation::BadCallId { at, id } => write!(f, "message {at}: tool call id `{id}` is not 1-64 characters of A-Z a-z 0-9 _ -"),
            Violation::MissingResult { at, id } => write!(f, "message {at}: tool call `{id}` has no result after it"),
            Violation::OrphanResult { at, id } => write!(f, "message {at}: tool result `{id}` has no matching call"),
        }
    }
}

fn blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// Every violation in `messages`, in order. An empty list means OpenAI Chat Completions and Anthropic
/// Messages both accept the context once the exporters shaped it.
pub fn check<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Vec<Violation> {
    check_from(messages, 0)
}

/// Turns `violations`, those of a context, into those of `messages`, a context whose first `same` messages
/// are that context's: the messages from the last user or assistant message among the shared ones on are
/// checked, the violations before it kept.
pub fn recheck<M: std::ops::Deref<Target = Message>>(violations: &mut Vec<Violation>, messages: &[M], same: usize) {
    let from = (0..same.min(messages.len())).rev().find(|&i| !matches!(*messages[i], Message::ToolResult { .. })).unwrap_or(0);
    violations.retain(|v| from > 0 && v.at() < from);
    violations.extend(check_from(messages, from));
}

/// The violations [`check`] finds at message `from` and after (positions counted from the start). Every
/// rule is settled within one message and the tool results right after it, so when `from` is a user or
/// assistant message, `check` of the whole is the violations it found before `from` in a context sharing
/// those messages, then `check_from(messages, from)`: a context that only grew is checked for what is new.
pub fn check_from<M: std::ops::Deref<Target = Message>>(messages: &[M], from: usize) -> Vec<Violation> {
    let mut out = Vec::new();
    if from == 0 && messages.first().is_some_and(|first| !matches!(**first, Message::User { .. })) {
        out.push(Violation::StartsWithAssistant);
    }
    let mut pending: Vec<(usize, String)> = Vec::new();
    let close = |pending: &mut Vec<(usize, String)>, out: &mut Vec<Violation>| {
        for (at, id) in pending.drain(..) {
            out.push(Violation::MissingResult { at, id });
        }
    };
    for (at, m) in messages.iter().enumerate().skip(from) {
        match &**m {
            Message::Assistant { content, .. } => {
                close(&mut pending, &mut out);
                let has = content.iter().any(|b| match b {
                    Block::Text { text } => !blank(text),
                    Block::ToolCall(_) | Block::Thinking(_) => true,
                    // Exports carry no assistant block of an unmodelled kind (the client's own bytes do).
                    Block::Image(_) | Block::Opaque(_) => false,
                });
                if !has {
                    out.push(Violation::EmptyAssistant { at });
                }
                let mut here = BTreeSet::new();
                for (id, _, _) in m.tool_calls() {
                    if !is_provider_identifier(id) {
                        out.push(Violation::BadCallId { at, id: id.to_string() });
                    }
                    if here.insert(id) {
                        pending.push((at, id.to_string()));
                    } else {
                        out.push(Violation::DuplicateCallId { at, id: id.to_string() });
                    }
                }
            }
            Message::ToolResult { call_id, .. } => match pending.iter().position(|(_, id)| id == call_id) {
                Some(p) => {
                    pending.remove(p);
                }
                None => out.push(Violation::OrphanResult { at, id: call_id.clone() }),
            },
            Message::User { content, .. } => {
                close(&mut pending, &mut out);
                let has = content.iter().any(|b| match b {
                    Block::Text { text } => !blank(text),
                    // A block of an unmodelled kind goes back as the client wrote it.
                    Block::Image(_) | Block::Opaque(_) => true,
                    Block::ToolCall(_) | Block::Thinking(_) => false,
                });
                if !has {
                    out.push(Violation::EmptyUser { at });
                }
            }
        }
    }
    close(&mut pending, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

    fn user(t: &str) -> Message {
        Message::user_text(t, UserOrigin::Prompt)
    }
    fn asst(content: Vec<Block>) -> Message {
        Message::Assistant { content, model: None, stop: None, usage: None }
    }
    fn call(id: &str, args: &str) -> Block {
        Block::tool_call(id.into(), "bash".into(), args.into())
    }
    fn result(id: &str) -> Message {
        Message::ToolResult { call_id: id.into(), tool_name: "bash".into(), content: vec![Block::Text { text: "ok".into() }], is_error: false }
    }
    fn text(t: &str) -> Block {
        Block::Text { text: t.into() }
    }
    fn rules(ms: Vec<Message>) -> Vec<&'static str> {
        check(&ms.into_iter().map(std::sync::Arc::new).collect::<Vec<_>>()).iter().map(Violation::rule).collect()
    }

    #[test]
    fn a_valid_context_breaks_no_rule() {
        let ok = vec![
            user("go"),
            asst(vec![Block::thinking("hm".into(), None), call("call_1", "{}"), call("toolu_2-x", r#"{"a":1}"#)]),
            result("call_1"),
            result("toolu_2-x"),
            asst(vec![text("done")]),
            Message::User { content: vec![Block::image("image/png".into(), "AA".into())], origin: UserOrigin::Prompt },
            asst(vec![text("  "), text("seen")]),
        ];
        assert_eq!(rules(ok), Vec::<&str>::new());
    }

    #[test]
    fn each_rule_is_broken_by_exactly_its_case() {
        let cases: Vec<(&str, Vec<Message>)> = vec![
            ("first-user", vec![asst(vec![text("hi")]), user("go")]),
            ("assistant-content", vec![user("go"), asst(vec![])]),
            ("assistant-content", vec![user("go"), asst(vec![text(" \n\n ")])]),
            ("user-content", vec![user("go"), asst(vec![text("a")]), user("\n\n")]),
            ("call-id-unique", vec![user("go"), asst(vec![call("c1", "{}"), call("c1", "{}")]), result("c1")]),
            ("call-id-format", vec![user("go"), asst(vec![call("call|1", "{}")]), result("call|1")]),
            ("call-id-format", vec![user("go"), asst(vec![call(&"x".repeat(65), "{}")]), result(&"x".repeat(65))]),
            ("result-follows-call", vec![user("go"), asst(vec![call("c1", "{}")]), user("next")]),
            ("result-follows-call", vec![user("go"), asst(vec![call("c1", "{}")])]),
            ("result-has-call", vec![user("go"), asst(vec![text("a")]), result("c9")]),
        ];
        for (rule, ms) in &cases {
            assert_eq!(rules(ms.clone()), vec![*rule], "{rule}: {ms:?}");
        }
        for r in RULES {
            assert!(cases.iter().any(|(c, _)| *c == r.code), "rule {} has a case", r.code);
        }
        // At the id bound: 64 characters are accepted.
        assert!(is_provider_identifier(&"x".repeat(64)) && !is_provider_identifier("") && !is_provider_identifier(&"x".repeat(65)));
    }

    /// Contexts that keep a prefix of the last one and grow or change after it, with every kind of
    /// violation among the messages: rechecking from the shared prefix finds what checking the whole finds.
    #[test]
    fn a_recheck_from_the_shared_prefix_is_the_whole_check() {
        let mut state = 11u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let mut ctx: Vec<std::sync::Arc<Message>> = Vec::new();
        let mut kept = Vec::new();
        let mut found = std::collections::BTreeSet::new();
        for round in 0..3000 {
            let same = if next() % 4 == 0 { next() % (ctx.len() + 1) } else { ctx.len() };
            ctx.truncate(same);
            for _ in 0..1 + next() % 4 {
                let id = format!("c{}", next() % 6);
                let m = match next() % 9 {
                    0 => user("next"),
                    1 => user(" "),
                    2 => asst(vec![]),
                    3 => asst(vec![call(&id, "{}"), call(&id, "{}")]),
                    4 => asst(vec![call("bad id!", "{}")]),
                    5 | 6 => asst(vec![call(&id, "{}")]),
                    _ => result(&id),
                };
                ctx.push(std::sync::Arc::new(m));
            }
            recheck(&mut kept, &ctx, same);
            let whole = check(&ctx);
            assert_eq!(kept, whole, "round {round}");
            found.extend(whole.iter().map(Violation::rule));
        }
        assert_eq!(found.len(), RULES.len(), "every rule was broken on the way: {found:?}");
    }
}
