//! `retention`, the quality counterweight of `simulate` (issue 10): of the distinctive facts an assistant
//! message uses that came from earlier tool output, how many were still in the context it was answering.
//! The extraction rule is documented in `docs/pruning.md`.

use condense_events::{Block, Message};
use std::collections::BTreeSet;

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The distinctive tokens of `text`:
/// - paths: runs of `A-Z a-z 0-9 _ . / -` that hold a `/` and a letter, at least 4 characters, without
///   leading or trailing `.`, `/`, `-`;
/// - identifiers: runs of `A-Z a-z 0-9 _` starting with a letter or `_`, at least 6 characters, that
///   look like code rather than a word: they hold a `_`, a digit, or an upper-case letter after the first;
/// - numbers: runs of at least 4 digits (not part of an identifier);
/// - quoted error strings: text of 8 to 200 characters between a pair of `"`, `'` or `` ` `` on one line
///   that holds `error`, `failed`, `exception` or `panic` (any case).
pub fn facts(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for run in text.split(|c: char| !is_path_char(c)) {
        let run = run.trim_matches(|c| matches!(c, '.' | '/' | '-'));
        if run.len() >= 4 && run.contains('/') && run.chars().any(|c| c.is_ascii_alphabetic()) {
            out.insert(run.to_string());
        }
    }
    for run in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        let Some(first) = run.chars().next() else { continue };
        let code_like = run.chars().skip(1).any(|c| c == '_' || c.is_ascii_digit() || c.is_ascii_uppercase()) || first == '_';
        let identifier = (first.is_ascii_alphabetic() || first == '_') && run.len() >= 6 && code_like;
        let number = run.len() >= 4 && run.bytes().all(|b| b.is_ascii_digit());
        if identifier || number {
            out.insert(run.to_string());
        }
    }
    for line in text.lines() {
        for q in ['"', '\'', '`'] {
            let parts: Vec<&str> = line.split(q).collect();
            // Odd positions are between a pair of quotes.
            for inner in parts.iter().skip(1).step_by(2).take(parts.len().saturating_sub(1) / 2) {
                let n = inner.chars().count();
                let lower = inner.to_lowercase();
                if (8..=200).contains(&n) && ["error", "failed", "exception", "panic"].iter().any(|w| lower.contains(w)) {
                    out.insert(inner.to_string());
                }
            }
        }
    }
    out
}

/// The text a message shows, tool-call arguments included (what an assistant message uses, and where a
/// fact can be found in a context).
pub fn shown_text(m: &Message) -> String {
    let mut out = String::new();
    for b in m.content() {
        match b {
            Block::Text { text } => out.push_str(text),
            Block::ToolCall { name, arguments, .. } => {
                out.push_str(name);
                out.push(' ');
                out.push_str(arguments);
            }
            Block::Thinking { .. } | Block::Image { .. } => {}
        }
        out.push('\n');
    }
    out
}

/// What a session has shown so far: the facts of its tool outputs and of its user messages.
#[derive(Debug, Default)]
pub struct Seen {
    from_tools: BTreeSet<String>,
    from_users: BTreeSet<String>,
}

impl Seen {
    /// Takes in a message of the session (in order).
    pub fn add(&mut self, m: &Message) {
        match m {
            Message::ToolResult { .. } => self.from_tools.extend(facts(&shown_text(m))),
            Message::User { .. } => self.from_users.extend(facts(&shown_text(m))),
            Message::Assistant { .. } => {}
        }
    }

    /// The needed facts of `answer` (the assistant message answering a request): its facts that some
    /// earlier tool output held and no user message did.
    pub fn needed(&self, answer: &Message) -> Vec<String> {
        facts(&shown_text(answer)).into_iter().filter(|f| self.from_tools.contains(f) && !self.from_users.contains(f)).collect()
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

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_kind_of_fact_is_extracted_and_nothing_else() {
        assert_eq!(facts("see src/engine/lib.rs and ./a/b."), set(&["src/engine/lib.rs"]));
        assert_eq!(facts("parseConfig and ParseConfig, plain words like engine"), set(&["parseConfig", "ParseConfig"]));
        assert_eq!(facts("call parse_config then run it"), set(&["parse_config"]));
        assert_eq!(facts("abc12 is short, x_y too; but build_42x counts"), set(&["build_42x"]));
        assert_eq!(facts("port 8787, year 2026, 123 and v2 and 12345"), set(&["8787", "2026", "12345"]));
        assert_eq!(facts("it said \"Error: no such file\" and 'ok fine'"), set(&["Error: no such file"]));
        assert_eq!(facts("`assertion failed: x == y` here"), set(&["assertion failed: x == y"]));
        assert!(facts("a / b // c").is_empty(), "slashes alone are not a path");
    }

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
