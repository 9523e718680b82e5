//! The provider-validity check (DESIGN invariant 2), reusable by every render phase and by tests.

use condense_events::{Message, UserOrigin};
use std::collections::BTreeSet;

/// One way a context would be rejected by OpenAI or Anthropic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The context does not start with a user message.
    StartsWithAssistant,
    /// An assistant message has no content blocks.
    EmptyAssistant {
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

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::StartsWithAssistant => write!(f, "message 0: the context starts with an assistant message"),
            Violation::EmptyAssistant { at } => write!(f, "message {at}: assistant message without content"),
            Violation::DuplicateCallId { at, id } => write!(f, "message {at}: tool call `{id}` appears twice"),
            Violation::MissingResult { at, id } => write!(f, "message {at}: tool call `{id}` has no result after it"),
            Violation::OrphanResult { at, id } => write!(f, "message {at}: tool result `{id}` has no matching call"),
        }
    }
}

/// Every violation in `messages`, in order. An empty list means OpenAI Chat Completions and Anthropic
/// Messages both accept the context (after the exporters merge adjacent same-role messages, which both
/// providers allow).
pub fn check<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> Vec<Violation> {
    let mut out = Vec::new();
    if let Some(first) = messages.first() {
        if !matches!(**first, Message::User { .. }) {
            out.push(Violation::StartsWithAssistant);
        }
    }
    let mut pending: Vec<(usize, String)> = Vec::new();
    let close = |pending: &mut Vec<(usize, String)>, out: &mut Vec<Violation>| {
        for (at, id) in pending.drain(..) {
            out.push(Violation::MissingResult { at, id });
        }
    };
    for (at, m) in messages.iter().enumerate() {
        match &**m {
            Message::Assistant { content, .. } => {
                close(&mut pending, &mut out);
                if content.is_empty() {
                    out.push(Violation::EmptyAssistant { at });
                }
                let mut seen = BTreeSet::new();
                for (id, _, _) in m.tool_calls() {
                    if !seen.insert(id) {
                        out.push(Violation::DuplicateCallId { at, id: id.to_string() });
                    } else {
                        pending.push((at, id.to_string()));
                    }
                }
            }
            Message::ToolResult { call_id, .. } => match pending.iter().position(|(_, id)| id == call_id) {
                Some(p) => {
                    pending.remove(p);
                }
                None => out.push(Violation::OrphanResult { at, id: call_id.clone() }),
            },
            Message::User { origin: UserOrigin::Prompt | UserOrigin::Injected | UserOrigin::Shell | UserOrigin::Summary, .. } => {
                close(&mut pending, &mut out);
            }
        }
    }
    close(&mut pending, &mut out);
    out
}
