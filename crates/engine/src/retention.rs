//! `retention`, the quality counterweight of `simulate` (issue 10): of the distinctive facts an assistant
//! message uses that came from earlier tool output, how many were still in the context it was answering.
//! The extraction rule is documented in `docs/pruning.md`.

use condense_events::{Block, Message};
use condense_index::facts::{facts_into, FactSet};
use std::collections::{BTreeSet, HashSet};

/// The text a message shows, tool-call arguments included (what an assistant message uses, and where a
/// fact can be found in a context).
pub fn shown_text(m: &Message) -> String {
    let mut out = String::new();
    for line in shown_blocks(m) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Each block of a message as [`shown_text`] shows it, before the line end that follows every block: text
/// as it is, a tool call as its name, a space and its arguments, thinking and images as nothing.
fn shown_blocks(m: &Message) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
    m.content().iter().map(|b| match b {
        Block::Text { text } => std::borrow::Cow::Borrowed(text.as_str()),
        Block::ToolCall { name, arguments, .. } => std::borrow::Cow::Owned(format!("{name} {arguments}")),
        Block::Thinking { .. } | Block::Image { .. } => std::borrow::Cow::Borrowed(""),
    })
}

/// The facts of a message's [`shown_text`], block by block: every block ends a line there, and a tool
/// call's name and arguments are separated by a space, so no fact spans two blocks.
fn facts_of(m: &Message, out: &mut impl FactSet) {
    for block in shown_blocks(m) {
        facts_into(&block, out);
    }
}

/// What a session has shown so far: the facts of its tool outputs and of its user messages.
#[derive(Debug, Default)]
pub struct Seen {
    // Looked up only, never iterated.
    from_tools: HashSet<String>,
    from_users: HashSet<String>,
}

impl Seen {
    /// Takes in a message of the session (in order).
    pub fn add(&mut self, m: &Message) {
        match m {
            Message::ToolResult { .. } => facts_of(m, &mut self.from_tools),
            Message::User { .. } => facts_of(m, &mut self.from_users),
            Message::Assistant { .. } => {}
        }
    }

    /// The needed facts of `answer` (the assistant message answering a request): its facts that some
    /// earlier tool output held and no user message did.
    pub fn needed(&self, answer: &Message) -> Vec<String> {
        let mut all = BTreeSet::new();
        facts_of(answer, &mut all);
        all.into_iter().filter(|f| self.from_tools.contains(f) && !self.from_users.contains(f)).collect()
    }
}

/// How many of `needed` appear verbatim somewhere in `context`.
pub fn retained<M: std::ops::Deref<Target = Message>>(needed: &[String], context: &[M]) -> u64 {
    if needed.is_empty() {
        return 0;
    }
    let hay: String = context.iter().map(|m| shown_text(m)).collect();
    needed.iter().filter(|f| hay.contains(f.as_str())).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

    #[test]
    fn needed_facts_come_from_tool_output_and_not_from_the_user() {
        let mut seen = Seen::default();
        seen.add(&Message::user_text("fix src/user_given.rs please", UserOrigin::Prompt));
        seen.add(&Message::ToolResult {
            call_id: "c".into(),
            tool_name: "bash".into(),
            content: vec![Block::Text { text: "src/user_given.rs:12 calls frobnicate_all at line 4096".into() }],
            is_error: false,
        });
        let answer = Message::Assistant {
            content: vec![
                Block::Text { text: "frobnicate_all at 4096 in src/user_given.rs; also invented_name".into() },
                Block::ToolCall { id: "c2".into(), name: "edit".into(), arguments: r#"{"path":"src/user_given.rs"}"#.into() },
            ],
            model: None,
            stop: None,
            usage: None,
        };
        let needed = seen.needed(&answer);
        assert_eq!(needed, ["4096", "frobnicate_all"], "not the user's path, not what no tool showed");
        let kept = Message::user_text("[summary] frobnicate_all was called", UserOrigin::Summary);
        assert_eq!(retained(&needed, &[std::sync::Arc::new(kept)]), 1);
    }
}
