//! `retention`, the quality counterweight of `simulate` (issue 10): of the distinctive facts an assistant
//! message uses that came from earlier tool output, how many were still in the context it was answering.
//! The extraction rule is documented in `docs/pruning.md`.

use condense_events::{Block, Message};
use condense_index::facts::{argument_facts_into, facts_into, for_each_argument_value, FactSet};
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
/// as it is, a tool call as its name, a space and its arguments (as sent; when they hold an escape, each
/// value follows decoded on a line of its own, as the model reads it), thinking and images as nothing.
fn shown_blocks(m: &Message) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
    m.content().iter().map(|b| match b {
        Block::Text { text } => std::borrow::Cow::Borrowed(text.as_str()),
        Block::ToolCall(c) => {
            let (name, arguments) = (&c.name, &c.arguments);
            let mut shown = format!("{name} {arguments}");
            if arguments.contains('\\') {
                for_each_argument_value(arguments, |v| {
                    shown.push('\n');
                    shown.push_str(v);
                });
            }
            std::borrow::Cow::Owned(shown)
        }
        Block::Thinking(_) | Block::Image(_) | Block::Opaque(_) => std::borrow::Cow::Borrowed(""),
    })
}

/// The facts of a user message or tool output: of its text blocks.
fn text_facts(m: &Message, out: &mut impl FactSet) {
    for b in m.content() {
        if let Block::Text { text } = b {
            facts_into(text, out);
        }
    }
}

/// The facts an assistant message uses (issue 34): of its text and of its tool calls' argument values
/// ([`argument_facts_into`]; not the tool's name, not the arguments' keys).
fn used_facts(m: &Message, out: &mut impl FactSet) {
    for b in m.content() {
        match b {
            Block::Text { text } => facts_into(text, out),
            Block::ToolCall(c) => argument_facts_into(&c.arguments, out),
            Block::Thinking(_) | Block::Image(_) | Block::Opaque(_) => {}
        }
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
            Message::ToolResult { .. } => text_facts(m, &mut self.from_tools),
            Message::User { .. } => text_facts(m, &mut self.from_users),
            Message::Assistant { .. } => {}
        }
    }

    /// The needed facts of `answer` (the assistant message answering a request): its facts that some
    /// earlier tool output held and no user message did.
    pub fn needed(&self, answer: &Message) -> Vec<String> {
        let mut all = BTreeSet::new();
        used_facts(answer, &mut all);
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
                Block::tool_call("c2".into(), "edit".into(), r#"{"path":"src/user_given.rs"}"#.into()),
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

    #[test]
    fn a_call_uses_its_argument_values_not_its_keys_or_its_name() {
        let mut seen = Seen::default();
        seen.add(&Message::ToolResult {
            call_id: "c".into(),
            tool_name: "bash".into(),
            content: vec![Block::Text { text: "edit_file takes file_path and new_string; parse_config(\"some quoted text\") in src/a.rs".into() }],
            is_error: false,
        });
        let call = Block::tool_call(
            "c2".into(),
            "edit_file".into(),
            r#"{"file_path":"src/a.rs","new_string":"x\nparse_config(\"some quoted text\")"}"#.into(),
        );
        let answer = Message::Assistant { content: vec![call], model: None, stop: None, usage: None };
        let needed = seen.needed(&answer);
        // The escapes decoded: the value's second line starts with the name, and the quotes pair.
        assert_eq!(needed, ["parse_config", "some quoted text", "src/a.rs"], "no key, no tool name");
        // The call as sent (its quotes escaped) holds the quoted string for a later request: the context
        // shows each value decoded too.
        let shown = shown_text(&answer);
        assert!(shown.contains("\nparse_config(\"some quoted text\")"), "the value decoded on a line of its own: {shown}");
        assert_eq!(retained(&needed, &[std::sync::Arc::new(answer)]), 3);
    }
}
