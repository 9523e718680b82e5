//! `retention`, the quality counterweight of `simulate` (issue 10): of the distinctive facts an assistant
//! message uses that came from earlier tool output, how many were still in the context it was answering.
//! The extraction rule is documented in `docs/pruning.md`.

use condense_events::{Block, Message};
pub use condense_index::facts::{facts, facts_into, FactSet};
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
    use condense_index::facts::EXTENSIONS;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The rule written plainly (text split by characters, lines split by quotes), kept as the oracle of
    /// the byte scan.
    fn reference(text: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '~' | '@' | '+' | '-' | '/');
        for run in text.split(|c: char| !path(c)) {
            let run = run.trim_matches(|c| matches!(c, '.' | ',' | '-'));
            let ext = run.rsplit_once('.').is_some_and(|(before, e)| !before.is_empty() && EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)));
            if run.len() >= 4 && run.chars().filter(char::is_ascii_alphanumeric).count() >= 2 && (run.contains('/') || ext) {
                out.insert(run.to_string());
            }
        }
        for run in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let Some(first) = run.chars().next() else { continue };
            let code_like = run.chars().skip(1).any(|c| c == '_' || c.is_ascii_digit() || c.is_ascii_uppercase());
            let identifier = (first.is_ascii_alphabetic() || first == '_') && run.len() >= 6 && code_like;
            let number = run.len() >= 4 && run.bytes().all(|b| b.is_ascii_digit());
            if identifier || number {
                out.insert(run.to_string());
            }
        }
        for line in text.lines() {
            for q in ['"', '\'', '`'] {
                // The quotes of this kind on the line (a `'` between two letters or digits is an apostrophe).
                let chars: Vec<(usize, char)> = line.char_indices().collect();
                let quotes: Vec<usize> = (0..chars.len())
                    .filter(|&k| chars[k].1 == q)
                    .filter(|&k| q != '\'' || !(k > 0 && chars[k - 1].1.is_ascii_alphanumeric() && chars.get(k + 1).is_some_and(|c| c.1.is_ascii_alphanumeric())))
                    .map(|k| chars[k].0)
                    .collect();
                for pair in quotes.chunks_exact(2) {
                    let inner = &line[pair[0] + 1..pair[1]];
                    if (8..=80).contains(&inner.chars().count()) && !inner.starts_with(' ') && !inner.ends_with(' ') {
                        out.insert(inner.to_string());
                    }
                }
            }
        }
        out
    }

    /// The byte scan finds what the rule as first written finds, on random texts built from the
    /// characters that matter (delimiters, quotes, line ends, digits, case, multi-byte characters) and on
    /// every tool output and message of the corpus pi sessions.
    #[test]
    fn the_byte_scan_is_the_rule() {
        let pieces = ["a", "Z", "_", "7", "1234", ".", "/", "-", " ", "\n", "\r\n", "\"", "'", "`", "é", "ß", "ERROR", "Failed", "~", "@", "+", ",", ".rs", ".json", "src/x.rs", "x_y9", "parseConfig", "::", "日本"];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 40) as usize;
            for k in 0..len {
                let r = seed.rotate_left(k as u32 * 5) ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                text.push_str(pieces[(r % pieces.len() as u64) as usize]);
            }
            assert_eq!(facts(&text), reference(&text), "{text:?}");
        }
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/pi/badlogic__pi-mono/session.jsonl");
        let text = std::fs::read_to_string(&corpus).expect("the corpus is beside the project");
        for line in text.lines() {
            assert_eq!(facts(line), reference(line));
        }
    }

    #[test]
    fn each_kind_of_fact_is_extracted_and_nothing_else() {
        assert_eq!(facts("see src/engine/lib.rs and ./a/b."), set(&["src/engine/lib.rs", "/a/b"]));
        assert_eq!(facts("edit lib.rs, package.json and ~/.config/app@2+x/init.lua; not e.g. or v1.2"), set(&["lib.rs", "package.json", "~/.config/app@2+x/init.lua"]));
        assert_eq!(facts("parseConfig and ParseConfig, plain words like engine"), set(&["parseConfig", "ParseConfig"]));
        assert_eq!(facts("call parse_config then run it; _private is a word"), set(&["parse_config"]));
        assert_eq!(facts("abc12 is short, x_y too; but build_42x counts"), set(&["build_42x"]));
        assert_eq!(facts("port 8787, year 2026, 123 and v2 and 12345 but not v1234"), set(&["8787", "2026", "12345"]));
        assert_eq!(facts("it said \"no such file\" and 'ok fine, all good' but ' padded text ' no"), set(&["no such file", "ok fine, all good"]));
        assert_eq!(facts("`assertion failed: x == y` here; don't count the user's words"), set(&["assertion failed: x == y"]));
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
