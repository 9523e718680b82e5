//! The distinctive tokens of a text, its *facts* (issue 34): the paths, identifiers, numbers and quoted
//! strings an agent carries from a tool output into what it writes. `simulate`'s retention counts them;
//! a compressed chain keeps the ones its turns used. The rule is documented in `docs/pruning.md`.

use condense_events::{Block, Message};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Whether a run of `A-Z a-z 0-9 _` is a code identifier rather than a word or a number: at least 6
/// characters, a letter or `_` first, and an `_`, a digit or an upper-case letter after the first
/// character (`parse_config`, `ConfigError`, `build_42x`). The rule of the identifier facts and of the
/// names a summary keeps.
#[inline]
pub fn is_code_identifier(run: &[u8]) -> bool {
    run.len() >= 6 && (run[0].is_ascii_alphabetic() || run[0] == b'_') && run[1..].iter().any(|&c| c == b'_' || c.is_ascii_digit() || c.is_ascii_uppercase())
}

/// Byte classes of the fact scan.
const PATH: u8 = 1; // A-Z a-z 0-9 _ . ~ @ + - /
const WORD: u8 = 2; // A-Z a-z 0-9 _
const SLASH: u8 = 4;
const DOT: u8 = 8;

static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || c == b'_' {
            t[b] = PATH | WORD;
        } else if c == b'.' {
            t[b] = PATH | DOT;
        } else if c == b'-' || c == b'~' || c == b'@' || c == b'+' {
            t[b] = PATH;
        } else if c == b'/' {
            t[b] = PATH | SLASH;
        }
        b += 1;
    }
    t
};

/// File extensions that make a run without a `/` a path (`lib.rs`, `package.json`).
pub const EXTENSIONS: &[&str] = &[
    "bash", "c", "cc", "cfg", "cjs", "conf", "cpp", "cs", "css", "csv", "dart", "env", "ex", "exs", "go", "gradle", "h", "hpp", "hs", "html", "ini",
    "ipynb", "java", "jl", "js", "json", "jsonl", "jsx", "kt", "lock", "log", "lua", "md", "mdx", "mjs", "mk", "ml", "nix", "php", "proto", "py",
    "r", "rb", "rs", "scala", "scss", "sh", "sql", "svelte", "swift", "toml", "ts", "tsx", "txt", "vue", "xml", "yaml", "yml", "zsh",
];

/// Whether `run` ends in a known file extension after at least one character.
fn has_extension(run: &[u8]) -> bool {
    match run.iter().rposition(|&c| c == b'.') {
        Some(dot) if dot > 0 && run.len() - dot - 1 <= 6 => {
            let ext = &run[dot + 1..];
            EXTENSIONS.iter().any(|e| e.as_bytes().eq_ignore_ascii_case(ext))
        }
        _ => false,
    }
}

/// A path-class run as a path fact: trimmed of `.`, `,` and `-` at both ends, at least 4 characters and
/// 2 alphanumerics, holding a `/` or ending in a file extension.
fn path_fact(run: &[u8]) -> Option<&[u8]> {
    let keep = |c: &u8| !matches!(c, b'.' | b',' | b'-');
    let start = run.iter().position(keep)?;
    let end = run.iter().rposition(keep)? + 1;
    let run = &run[start..end];
    (run.len() >= 4 && run.iter().filter(|c| c.is_ascii_alphanumeric()).count() >= 2 && (run.contains(&b'/') || has_extension(run))).then_some(run)
}

/// Whether the `'` at `at` stands free: not an apostrophe between two letters or digits (`don't`).
fn free_quote(b: &[u8], at: usize) -> bool {
    !(at > 0 && b[at - 1].is_ascii_alphanumeric() && b.get(at + 1).is_some_and(u8::is_ascii_alphanumeric))
}

/// A set the fact scan adds to.
pub trait FactSet {
    /// Whether `fact` is in the set.
    fn has(&self, fact: &str) -> bool;
    /// Adds `fact`.
    fn add(&mut self, fact: String);
}

impl FactSet for BTreeSet<String> {
    fn has(&self, fact: &str) -> bool {
        self.contains(fact)
    }
    fn add(&mut self, fact: String) {
        self.insert(fact);
    }
}

impl FactSet for HashSet<String> {
    fn has(&self, fact: &str) -> bool {
        self.contains(fact)
    }
    fn add(&mut self, fact: String) {
        self.insert(fact);
    }
}

/// The distinctive tokens of `text` (issue 34):
/// - paths: runs of `A-Z a-z 0-9 _ . ~ @ + - /` holding a `/` or ending in a file extension (`.rs`,
///   `.json`, …), at least 4 characters and 2 alphanumerics once `.`, `,` and `-` are trimmed off both ends;
/// - identifiers: `[A-Za-z_][A-Za-z0-9_]{5,}` holding an `_`, a digit or an upper-case letter after the
///   first character;
/// - numbers: runs of at least 4 digits not glued to letters (nor to `_`);
/// - quoted strings: 8 to 80 characters between a pair of `"`, `` ` `` or free-standing `'` on one line,
///   not starting or ending with a space.
pub fn facts(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    facts_into(text, &mut out);
    out
}

/// Calls `f` with each string (decoded) and number of a tool call's JSON arguments, in order, neither
/// the keys nor the tool's name: the *values* issue 34 takes a call's facts from. Returns whether the
/// arguments were JSON (a host's free-form tool input is not).
pub fn for_each_argument_value(arguments: &str, mut f: impl FnMut(&str)) -> bool {
    fn walk(v: &serde_json::Value, f: &mut impl FnMut(&str)) {
        match v {
            serde_json::Value::String(s) => f(s),
            serde_json::Value::Number(n) => f(&n.to_string()),
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
            serde_json::Value::Object(o) => o.values().for_each(|x| walk(x, f)),
            serde_json::Value::Bool(_) | serde_json::Value::Null => {}
        }
    }
    serde_json::from_str::<serde_json::Value>(arguments).map(|v| walk(&v, &mut f)).is_ok()
}

/// The facts of a tool call's arguments: of its values ([`for_each_argument_value`], so a line of code
/// written by an edit starts its line as it does in the file), or of the whole text when it is not JSON.
pub fn argument_facts_into(arguments: &str, out: &mut impl FactSet) {
    if !for_each_argument_value(arguments, |v| facts_into(v, out)) {
        facts_into(arguments, out);
    }
}

/// [`facts`], added to `out`, in one pass over the bytes: every delimiter is ASCII, so a run of ASCII
/// bytes between delimiters is valid UTF-8 on its own.
pub fn facts_into(text: &str, out: &mut impl FactSet) {
    let b = text.as_bytes();
    let mut add = |run: &[u8]| {
        let s = std::str::from_utf8(run).expect("cut at ASCII delimiters");
        if !out.has(s) {
            out.add(s.to_string());
        }
    };
    let (mut path_from, mut path_marked, mut word_from) = (0, false, 0);
    for i in 0..=b.len() {
        let class = b.get(i).map_or(0, |&c| CLASS[c as usize]);
        if class & WORD == 0 {
            if i - word_from >= 4 {
                let run = &b[word_from..i];
                if run.iter().all(u8::is_ascii_digit) || is_code_identifier(run) {
                    add(run);
                }
            }
            word_from = i + 1;
        }
        if class & PATH == 0 {
            // Only a run holding a `/` or a `.` can be a path.
            if path_marked && i - path_from >= 4 {
                if let Some(run) = path_fact(&b[path_from..i]) {
                    add(run);
                }
            }
            path_from = i + 1;
            path_marked = false;
        } else if class & (SLASH | DOT) != 0 {
            path_marked = true;
        }
    }
    // Quoted strings: on each line, the text between the 1st and 2nd quote of a kind, the 3rd and 4th,
    // ... Quotes are visited in order; a line end between two of them starts the pairing over.
    let mut open: [Option<usize>; 3] = [None; 3];
    let mut last = 0;
    for at in memchr::memchr3_iter(b'"', b'\'', b'`', b) {
        if memchr::memchr(b'\n', &b[last..at]).is_some() {
            open = [None; 3];
        }
        last = at;
        let k = match b[at] {
            b'"' => 0,
            b'\'' if free_quote(b, at) => 1,
            b'\'' => continue,
            _ => 2,
        };
        let Some(from) = open[k].take() else {
            open[k] = Some(at);
            continue;
        };
        let inner = &text[from + 1..at];
        // 8 to 80 characters: at least 8 bytes, at most 320.
        if inner.len() < 8 || inner.len() > 320 || !(8..=80).contains(&inner.chars().count()) || inner.starts_with(' ') || inner.ends_with(' ') {
            continue;
        }
        add(inner.as_bytes());
    }
}

/// Where each fact ([`facts`]) of a branch's tool outputs and user messages first
/// appears, as positions on the branch, taken in one message at a time: what a compressed chain's
/// "names used" line is chosen from.
#[derive(Debug, Clone, Default)]
pub struct FactsSeen {
    outputs: BTreeMap<String, usize>,
    users: BTreeMap<String, usize>,
    scanned: usize,
}

/// A fact set that records where each fact was first added.
struct FirstAt<'a>(&'a mut BTreeMap<String, usize>, usize);

impl FactSet for FirstAt<'_> {
    fn has(&self, fact: &str) -> bool {
        self.0.contains_key(fact)
    }
    fn add(&mut self, fact: String) {
        self.0.insert(fact, self.1);
    }
}

/// A fact set that keeps the order facts were first added in.
#[derive(Default)]
struct InOrder {
    seen: BTreeSet<String>,
    list: Vec<String>,
}

impl FactSet for InOrder {
    fn has(&self, fact: &str) -> bool {
        self.seen.contains(fact)
    }
    fn add(&mut self, fact: String) {
        self.seen.insert(fact.clone());
        self.list.push(fact);
    }
}

impl FactsSeen {
    /// How many messages of the branch were taken in.
    pub fn scanned(&self) -> usize {
        self.scanned
    }

    /// Takes in the branch's next message (position [`FactsSeen::scanned`]).
    pub fn add(&mut self, m: &Message) {
        let at = self.scanned;
        self.scanned += 1;
        let into = match m {
            Message::ToolResult { .. } => &mut self.outputs,
            Message::User { .. } => &mut self.users,
            Message::Assistant { .. } => return,
        };
        for b in m.content() {
            if let Block::Text { text } = b {
                facts_into(text, &mut FirstAt(into, at));
            }
        }
    }

    /// The names `messages` used (the facts of the assistant ones' text and call argument values, in the order
    /// they first appear) that a tool output at or before position `upto` held and no user message at or
    /// before it did: what the turns carried over from what tools showed them.
    pub fn used_names<'m>(&self, upto: usize, messages: impl IntoIterator<Item = &'m Message>) -> Vec<String> {
        let mut found = InOrder::default();
        for m in messages.into_iter().filter(|m| matches!(m, Message::Assistant { .. })) {
            for b in m.content() {
                match b {
                    Block::Text { text } => facts_into(text, &mut found),
                    Block::ToolCall(c) => argument_facts_into(&c.arguments, &mut found),
                    _ => {}
                }
            }
        }
        let before = |map: &BTreeMap<String, usize>, f: &str| map.get(f).is_some_and(|&at| at <= upto);
        found.list.into_iter().filter(|f| before(&self.outputs, f) && !before(&self.users, f)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

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

    #[test]
    fn a_call_s_facts_are_its_argument_values() {
        let of = |args: &str| {
            let mut out = BTreeSet::new();
            argument_facts_into(args, &mut out);
            out
        };
        let args = r#"{"file_path":"src/lib.rs","offset":12000,"edits":[{"old_text":"a\nload_all(\"quoted value\")"}],"replace_all":true}"#;
        assert_eq!(of(args), set(&["12000", "load_all", "quoted value", "src/lib.rs"]), "values only, escapes decoded");
        // Not JSON (a free-form tool input): the whole text.
        assert_eq!(of("*** Update File: src/main.rs\n+fn parse_config()"), facts("*** Update File: src/main.rs\n+fn parse_config()"));
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

    /// The names used are the facts of the assistant messages (text and call argument values, in the order
    /// they appear) that an output at or before the position held and no user message at or before it did.
    #[test]
    fn names_used_came_from_an_earlier_output_and_not_from_the_user() {
        let text = |t: &str| vec![Block::Text { text: t.into() }];
        let branch = [
            Message::user_text("fix parse_config in src/lib.rs", UserOrigin::Prompt),
            Message::Assistant { content: vec![Block::tool_call("c1".into(), "read".into(), r#"{"path":"src/lib.rs"}"#.into())], model: None, stop: None, usage: None },
            Message::ToolResult { call_id: "c1".into(), tool_name: "read".into(), content: text("fn parse_config() -> ConfigError { load_all(); LATE_NAME }"), is_error: false },
            Message::Assistant { content: text("ConfigError comes from load_all; parse_config stays; NEW_NAME is mine"), model: None, stop: None, usage: None },
            Message::ToolResult { call_id: "c2".into(), tool_name: "bash".into(), content: text("NEW_NAME"), is_error: false },
        ];
        let mut seen = FactsSeen::default();
        for m in &branch {
            seen.add(m);
        }
        assert_eq!(seen.scanned(), 5);
        assert_eq!(seen.used_names(3, &branch[..4]), vec!["ConfigError".to_string(), "load_all".to_string()]);
        // An output after the position does not count.
        assert!(!seen.used_names(3, &branch[3..4]).contains(&"NEW_NAME".to_string()));
        assert!(seen.used_names(4, &branch[3..4]).contains(&"NEW_NAME".to_string()));
        // A call's argument values, decoded: the name that starts the second line of an edit is
        // `load_all`, not `nload_all`, and the key `new_text` is not a name used.
        let edit = Message::Assistant {
            content: vec![Block::tool_call("c3".into(), "edit".into(), r#"{"new_text":"x\nload_all()"}"#.into())],
            model: None,
            stop: None,
            usage: None,
        };
        assert_eq!(seen.used_names(4, [&edit]), vec!["load_all".to_string()]);
    }
}
