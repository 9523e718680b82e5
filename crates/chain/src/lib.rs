//! Chains: a user prompt, the tool-using assistant turns it caused, and the final text-only reply that
//! closed it. Closed chains older than the rolling window are compressed into one block with a `bN` ref
//! whose body fuses the summaries of the outputs inside, each cut to its first line less its line count
//! (or, when none were summarized, a deterministic digest: call count, tool histogram, first and last arguments), and lists
//! the names the chain's turns used that came from earlier tool outputs ([`FactsSeen::used_names`]). Protected
//! outputs are relocated into the block verbatim.
//!
//! # Example
//!
//! ```
//! use condense_chain::{block_body, closed_chains, CallInfo, Span};
//!
//! // prompt, a tool-using turn, its result, the final reply; then a prompt answered without tools.
//! let kinds = ["prompt", "calls", "result", "final", "prompt", "final"];
//! let spans = closed_chains(kinds.len(), |i| kinds[i] == "prompt", |i| kinds[i] == "final", |i| kinds[i] == "calls");
//! assert_eq!(spans, vec![Span { first: 0, last: 3 }]);
//! // The block that stands for the chain names each output by its ref, one line each.
//! let calls = [CallInfo { ref_n: Some(4), tool: "read", arguments: r#"{"path":"src/lib.rs"}"#, summary: Some("t4 read (src/lib.rs): 120 lines"), protected_output: None, output_chars: 4_800 }];
//! let body = block_body(2, &calls, &[]);
//! assert!(body.contains("b2") && body.contains("t4"), "{body}");
//! ```

use condense_events::{Block, Message};
pub use condense_index::facts::FactsSeen;
use std::collections::BTreeMap;

mod stage;
pub use stage::Chains;

/// A closed chain on the branch, as positions in the branch's entry list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Position of the user prompt.
    pub first: usize,
    /// Position of the final reply.
    pub last: usize,
}

/// A call inside a chain, for the block body.
#[derive(Debug, Clone)]
pub struct CallInfo<'a> {
    /// Ref of its output, when captured.
    pub ref_n: Option<u32>,
    /// Tool name.
    pub tool: &'a str,
    /// Arguments (JSON text).
    pub arguments: &'a str,
    /// Summary of its output, when summarized.
    pub summary: Option<&'a str>,
    /// The output, when protected (relocated verbatim).
    pub protected_output: Option<&'a str>,
    /// The output's size in characters (0 when not captured).
    pub output_chars: u64,
}

/// Closed chains among the branch's messages. `is_prompt(i)` says whether entry `i` is a user prompt,
/// `is_final(i)` whether it is a final text-only reply, `has_calls(i)` whether it is an assistant
/// message with tool calls. A chain is a prompt, at least one tool-using turn, and the first final reply
/// after them with no other prompt in between.
pub fn closed_chains(n: usize, is_prompt: impl Fn(usize) -> bool, is_final: impl Fn(usize) -> bool, has_calls: impl Fn(usize) -> bool) -> Vec<Span> {
    let mut scan = ChainScan::default();
    (0..n).filter_map(|i| scan.step(i, is_prompt(i), is_final(i), has_calls(i))).collect()
}

/// [`closed_chains`] one entry at a time, so a branch that grows is scanned only where it grew.
#[derive(Debug, Clone, Default)]
pub struct ChainScan {
    start: Option<usize>,
    tools: bool,
}

impl ChainScan {
    /// Takes in entry `i` (in order); the chain it closes, if it closes one.
    pub fn step(&mut self, i: usize, is_prompt: bool, is_final: bool, has_calls: bool) -> Option<Span> {
        if is_prompt {
            self.start = Some(i);
            self.tools = false;
        } else if has_calls {
            self.tools = true;
        } else if is_final {
            let closed = match (self.start, self.tools) {
                (Some(s), true) => Some(Span { first: s, last: i }),
                _ => None,
            };
            self.start = None;
            self.tools = false;
            return closed;
        }
        None
    }
}

fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Characters of a compressed chain's final reply kept in the context; the rest is one
/// `context_tree_query bN` away (docs/pruning.md, "Final replies of compressed chains").
pub const REPLY_HEAD_CHARS: usize = 100;

/// What the final reply `m` of compressed chain `block` renders as, cut to its first
/// [`REPLY_HEAD_CHARS`] characters (text blocks joined by a line end, cut at a character boundary) and a
/// marker naming the block; `None` when the reply is short enough that the marker would not save anything.
pub fn reply_cut(block: u32, m: &Message) -> Option<String> {
    if !matches!(m, Message::Assistant { .. }) {
        return None;
    }
    let whole = reply_text(m);
    let marker = format!(" […rest: context_tree_query b{block}]");
    let chars = whole.chars().count();
    if chars <= REPLY_HEAD_CHARS + marker.chars().count() {
        return None;
    }
    let end = whole.char_indices().nth(REPLY_HEAD_CHARS).map_or(whole.len(), |(i, _)| i);
    Some(format!("{}{marker}", whole[..end].trim_end()))
}

/// The text of a final reply: its text blocks joined by a line end (what a cut reply shows the head of,
/// and what the chain's query gives back).
pub fn reply_text(m: &Message) -> String {
    let texts: Vec<&str> = m
        .content()
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n")
}

/// The newest turns of a chain still running that stay as they render (their outputs' stubs, their
/// calls) when its older turns are compressed into a block ([`SEGMENT_MIN_CALLS`]).
pub const SEGMENT_KEEP_TURNS: usize = 4;

/// A chain still running (its prompt's calls not answered by a final reply yet) has its older turns
/// compressed into a block once they hold at least this many calls, all of them pruned: what a long
/// autonomous run reads again on every request is then a line an output instead of each call and its
/// stub (docs/pruning.md, "Long chains compressed as they run").
pub const SEGMENT_MIN_CALLS: usize = 8;

/// The most names a block lists as used by its turns (a bound for chains that wrote whole files made of
/// names read earlier; the rest stay one recovery away).
pub const USED_NAMES: usize = 128;

/// A document (a file read, a fetched page, a subagent's report, a shell command that prints files:
/// [`condense_index::is_document_output`]) of
/// at least this many characters keeps its [`DOCUMENT_NAMES`] most frequent names (its summary's first
/// ones) in the block of its chain, under its summary's first line: what the agent later writes comes
/// from the names of the long files it read, and the block outlives their stubs (docs/pruning.md, "The
/// names of long documents").
pub const DOCUMENT_NAMES_FROM: u64 = 16_000;

/// How many of a long document's names a block keeps ([`DOCUMENT_NAMES_FROM`]).
pub const DOCUMENT_NAMES: usize = 16;

/// How a block's line of the names its chain's turns used starts.
const USED_PREFIX: &str = "names used: ";

/// The names a block's body lists as used by its chain's turns (none when it lists none).
pub fn names_listed(body: &str) -> Vec<String> {
    body.lines().find_map(|l| l.strip_prefix(USED_PREFIX)).map_or_else(Vec::new, |names| names.split(", ").map(str::to_string).collect())
}

/// The text of a compressed chain block: a line per summarized output (its summary's first line: ref, tool,
/// what was asked, size in characters; for a long document its first names, [`DOCUMENT_NAMES_FROM`]) or, when none was
/// summarized, a digest of the calls; then `used`, the names the
/// chain's turns carried over from earlier tool outputs (see [`FactsSeen::used_names`]), at most [`USED_NAMES`].
pub fn block_body(block: u32, calls: &[CallInfo<'_>], used: &[&str]) -> String {
    block_body_with(block, calls, used, false)
}

/// [`block_body`], with each output's names (its summary's names line) under its line when
/// `output_names` (the older turns of a chain still running, whose later turns go on using them).
pub fn block_body_with(block: u32, calls: &[CallInfo<'_>], used: &[&str], output_names: bool) -> String {
    let summaries: Vec<&str> = calls.iter().filter_map(|c| c.summary).collect();
    // The refs, when no summary line names them.
    let refs: Vec<String> = if summaries.is_empty() { calls.iter().filter_map(|c| c.ref_n.map(|r| format!("t{r}"))).collect() } else { Vec::new() };
    // The number of calls, unless a line per call shows it.
    let count = if summaries.len() == calls.len() {
        String::new()
    } else {
        format!(": {} tool call{}", calls.len(), if calls.len() == 1 { "" } else { "s" })
    };
    let mut out = format!(
        "{}{block}{count}{}]",
        condense_events::BLOCK_HEADER,
        if refs.is_empty() { String::new() } else { format!("; outputs {}", refs.join(" ")) }
    );
    if summaries.is_empty() {
        let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
        for c in calls {
            *hist.entry(c.tool).or_default() += 1;
        }
        let h: Vec<String> = hist.iter().map(|(t, n)| format!("{t}×{n}")).collect();
        out.push_str(&format!("\ntools: {}", h.join(", ")));
        if let Some(first) = calls.first() {
            out.push_str(&format!("\nfirst: {} {}", first.tool, clip(first.arguments, 160)));
        }
        if calls.len() > 1 {
            if let Some(last) = calls.last() {
                out.push_str(&format!("\nlast: {} {}", last.tool, clip(last.arguments, 160)));
            }
        }
    } else {
        // A summary's first line (ref, tool, size); the original stays one recovery away. A long
        // document keeps its most frequent names too.
        for c in calls {
            let Some(s) = c.summary else { continue };
            out.push('\n');
            out.push_str(&condense_index::without_line_count(s.lines().next().unwrap_or_default()));
            let names = s.lines().find_map(|l| l.strip_prefix(condense_index::SUMMARY_NAMES));
            if c.output_chars >= DOCUMENT_NAMES_FROM
                && condense_index::is_document_output(c.tool, c.arguments)
                && let Some(names) = names
            {
                let kept: Vec<&str> = names.split(' ').take(DOCUMENT_NAMES).collect();
                out.push('\n');
                out.push_str(condense_index::SUMMARY_NAMES);
                out.push_str(&kept.join(" "));
            } else if output_names && let Some(names) = names {
                out.push('\n');
                out.push_str(condense_index::SUMMARY_NAMES);
                out.push_str(names);
            }
        }
    }
    let used: Vec<&str> = used.iter().copied().filter(|n| !out.contains(n)).take(USED_NAMES).collect();
    if !used.is_empty() {
        out.push('\n');
        out.push_str(USED_PREFIX);
        out.push_str(&used.join(", "));
    }
    for c in calls {
        if let (Some(text), Some(r)) = (c.protected_output, c.ref_n) {
            out.push_str(&format!("\n[protected output t{r} ({}), verbatim]\n{text}", c.tool));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_need_tools_and_a_final_reply() {
        // 0 prompt, 1 calls, 2 result-ish (neither), 3 final, 4 prompt, 5 final (no tools), 6 prompt, 7 calls
        let prompt = [0, 4, 6];
        let fin = [3, 5];
        let calls = [1, 7];
        let spans = closed_chains(8, |i| prompt.contains(&i), |i| fin.contains(&i), |i| calls.contains(&i));
        assert_eq!(spans, vec![Span { first: 0, last: 3 }]);
    }

    #[test]
    fn a_reply_is_cut_at_a_character_boundary_only_when_that_saves_something() {
        use condense_events::{Block, Message};
        let reply = |blocks: Vec<Block>| Message::Assistant { content: blocks, model: None, stop: None, usage: None };
        let text = |t: &str| Block::Text { text: t.into() };
        // REPLY_HEAD_CHARS - 1 ASCII characters, then multi-byte ones: the cut falls inside them, on a boundary.
        let h = REPLY_HEAD_CHARS;
        let long = format!("{}{}", "a".repeat(h - 1), "é".repeat(100));
        let cut = reply_cut(7, &reply(vec![text(&long)])).unwrap();
        assert_eq!(cut, format!("{}é […rest: context_tree_query b7]", "a".repeat(h - 1)));
        // Text blocks join with a line end; thinking is not the reply's text.
        let two = reply(vec![Block::thinking("x".repeat(500), None), text("first"), text(&"b".repeat(300))]);
        assert!(reply_cut(1, &two).unwrap().starts_with(&format!("first\n{} […rest", "b".repeat(h - 6))));
        // Within the head and the marker's length: left whole.
        assert_eq!(reply_cut(1, &reply(vec![text(&"c".repeat(h + 30))])), None);
        assert_eq!(reply_cut(1, &Message::user_text("x".repeat(400), condense_events::UserOrigin::Prompt)), None);
    }

    #[test]
    fn body_without_summaries_is_a_digest() {
        let calls = [
            CallInfo { ref_n: Some(1), tool: "read", arguments: "{\"path\":\"a\"}", summary: None, protected_output: None, output_chars: 0 },
            CallInfo { ref_n: None, tool: "bash", arguments: "{\"command\":\"ls\"}", summary: None, protected_output: Some("keep me"), output_chars: 7 },
        ];
        assert_eq!(
            block_body(2, &calls, &[]),
            "[Compressed chain b2: 2 tool calls; outputs t1]\ntools: bash×1, read×1\nfirst: read {\"path\":\"a\"}\nlast: bash {\"command\":\"ls\"}"
        );
    }

    /// With summaries, each output's line is its summary's first line (the header does not repeat the
    /// refs); the names the turns used follow, less those the block shows already, at most
    /// [`USED_NAMES`].
    #[test]
    fn body_with_summaries_keeps_each_first_line_and_the_names_used() {
        let summary = "t3 bash (cargo test): 900 chars, 30 lines\n  ! error: x\n  paths: src/a.rs\n  names: parse_config, ConfigError, load_all\n  | tail";
        let other = "t5 read (src/b.rs): 400 chars, 10 lines\n  names: ConfigError, load_all";
        let calls = [
            CallInfo { ref_n: Some(3), tool: "bash", arguments: "{}", summary: Some(summary), protected_output: None, output_chars: 900 },
            CallInfo { ref_n: Some(5), tool: "read", arguments: "{}", summary: Some(other), protected_output: None, output_chars: 400 },
        ];
        assert_eq!(
            block_body(4, &calls, &["load_all", "src/b.rs", "ConfigError"]),
            "[Compressed chain b4]\nt3 bash (cargo test): 900 chars\nt5 read (src/b.rs): 400 chars\nnames used: load_all, ConfigError"
        );
        assert!(!block_body(4, &calls, &[]).contains("names used"));
        // The header counts the calls only where a call has no line of its own.
        let mixed = [calls[0].clone(), CallInfo { ref_n: Some(6), tool: "bash", arguments: "{}", summary: None, protected_output: None, output_chars: 0 }];
        assert!(block_body(4, &mixed, &[]).starts_with("[Compressed chain b4: 2 tool calls]\nt3 bash (cargo test): 900 chars"), "{}", block_body(4, &mixed, &[]));
        // The older turns of a running chain keep each output's names line under its line.
        assert_eq!(
            block_body_with(4, &calls, &[], true),
            "[Compressed chain b4]\nt3 bash (cargo test): 900 chars\n  names: parse_config, ConfigError, load_all\nt5 read (src/b.rs): 400 chars\n  names: ConfigError, load_all"
        );
        assert_eq!(names_listed(&block_body(4, &calls, &["load_all", "x_y_z"])), vec!["load_all", "x_y_z"]);
        let many: Vec<String> = (0..USED_NAMES + 5).map(|i| format!("name_{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let body = block_body(4, &calls, &many);
        assert!(body.ends_with(&format!(", name_{}", USED_NAMES - 1)) && !body.contains(&format!("name_{},", USED_NAMES)), "{body}");
    }

    /// A long document (a file read, a fetched page, a subagent's report of at least
    /// [`DOCUMENT_NAMES_FROM`] characters) keeps its first [`DOCUMENT_NAMES`] names under its line; a
    /// shorter one, or a command's output of any size, its line alone. A name it keeps is not listed
    /// again as used.
    #[test]
    fn a_long_document_keeps_its_first_names_in_the_block() {
        let names: Vec<String> = (0..40).map(|i| format!("name_{i:02}")).collect();
        let read = format!("t3 Read (src/big.rs): 20000 chars, 500 lines\n  paths: src/a.rs\n{}{}", condense_index::SUMMARY_NAMES, names.join(" "));
        let small = format!("t4 read (src/small.rs): 2000 chars, 50 lines\n{}small_name", condense_index::SUMMARY_NAMES);
        let bash = format!("t5 bash (cat src/big.rs): 20000 chars, 500 lines\n{}bash_name", condense_index::SUMMARY_NAMES);
        let calls = [
            CallInfo { ref_n: Some(3), tool: "Read", arguments: "{}", summary: Some(&read), protected_output: None, output_chars: DOCUMENT_NAMES_FROM },
            CallInfo { ref_n: Some(4), tool: "read", arguments: "{}", summary: Some(&small), protected_output: None, output_chars: DOCUMENT_NAMES_FROM - 1 },
            CallInfo { ref_n: Some(5), tool: "bash", arguments: "{}", summary: Some(&bash), protected_output: None, output_chars: 20_000 },
        ];
        let body = block_body(6, &calls, &["name_03", "other_name"]);
        assert_eq!(
            body,
            format!(
                "[Compressed chain b6]\nt3 Read (src/big.rs): 20000 chars\n{}{}\nt4 read (src/small.rs): 2000 chars\nt5 bash (cat src/big.rs): 20000 chars\nnames used: other_name",
                condense_index::SUMMARY_NAMES,
                names[..DOCUMENT_NAMES].join(" ")
            )
        );
    }
}
