//! Large-context recovery on a smaller model (seed 004): the bounds of a handoff, and the archive the
//! model reads instead of the history it no longer holds.
//!
//! An [`Archive`] is a view over the public context as it was when recovery began: user, assistant and
//! tool text, existing summaries as summaries, tool calls as their name and arguments; thinking, signatures
//! and images are left out. It is built once and indexed by word, so [`Archive::search`] answers from
//! posting lists and [`Archive::read`] pages an entry in 2,048-byte pieces.
//!
//! # Example
//!
//! ```
//! use condense_events::{Message, UserOrigin};
//! use condense_recovery::Archive;
//!
//! let prompt = Message::user_text("the build fails with E0425 in parser.rs", UserOrigin::Prompt);
//! let archive = Archive::build("a1", [("u1", &prompt, None)])?;
//! let hits = archive.search(&["E0425"], 20)?;
//! assert_eq!(hits[0].id, "u1");
//! let page = archive.read("u1", 0)?;
//! assert!(page.text.contains("parser.rs") && page.next_offset.is_none());
//! # Ok::<(), condense_recovery::RecoveryError>(())
//! ```

use condense_events::{Block, Message, UserOrigin};
use std::collections::BTreeMap;

/// Largest source an archive captures, in bytes.
pub const MAX_SOURCE_BYTES: usize = 32 << 20;
/// Most summarizer invocations one preparation may make.
pub const MAX_INVOCATIONS: u32 = 64;
/// Most keywords a search takes.
pub const MAX_KEYWORDS: usize = 16;
/// Bytes of one `history_read` page.
pub const PAGE_BYTES: usize = 2048;
/// Most bytes of tool text in one reply.
pub const REPLY_CEILING: usize = 4096;
/// Windows below this are never switched to automatically.
pub const MIN_WINDOW: u64 = 8192;

/// The preparation's input budget in UTF-8 bytes: `min(262144, floor(contextWindow × 0.7))`.
pub fn input_budget(context_window: u64) -> u64 {
    (context_window * 7 / 10).min(262_144)
}

/// The handoff summary's ceiling in bytes: `min(16384, floor(inputBudget / 8))`, less what protected
/// prompt and tool declarations need.
pub fn summary_budget(input_budget: u64, protected_bytes: u64) -> u64 {
    (input_budget / 8).min(16_384).saturating_sub(protected_bytes)
}

/// What recovery cannot read as text: it stops there rather than pass it on misrepresented (seed 004).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// An image block.
    Image,
    /// A block of a kind condense does not model (its type).
    Unknown(String),
}

/// The public text of a message as recovery reads and archives it: its text, tool calls as `[call NAME
/// ARGUMENTS]`; thinking and signatures are left out. An image or a block of an unknown kind is
/// [`Unreadable`] (recovery is text-only and fails closed on both).
pub fn public_text(m: &Message) -> Result<String, Unreadable> {
    let mut out = String::new();
    for b in m.content() {
        match b {
            Block::Text { text } => out.push_str(text),
            Block::ToolCall(c) => out.push_str(&format!("[call {} {}]", c.name, c.arguments)),
            Block::Thinking(_) => {}
            Block::Image(_) => return Err(Unreadable::Image),
            Block::Opaque(o) => return Err(Unreadable::Unknown(o.kind.clone())),
        }
    }
    Ok(out)
}

/// Why a tool call or an archive build was refused. Each message says what to pass instead.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryError {
    /// No keywords.
    #[error("history_search needs at least one keyword, e.g. {{\"keywords\": [\"parser\", \"error\"]}}")]
    EmptyQuery,
    /// Too many keywords.
    #[error("history_search takes at most {MAX_KEYWORDS} keywords, {0} were given; drop the least specific ones")]
    TooManyKeywords(usize),
    /// An unknown entry id.
    #[error("no entry `{0}` in archive {1}; use an id cited by history_search or a checkpoint")]
    UnknownEntry(String, String),
    /// An offset past the end of the entry.
    #[error("offset {offset} is past the end of entry `{id}` ({len} bytes); start again at 0")]
    OffsetPastEnd {
        /// The entry.
        id: String,
        /// Offset asked for.
        offset: usize,
        /// The entry's length.
        len: usize,
    },
    /// An unknown archive id.
    #[error("no archive `{0}`; history_archives lists the archives of this branch")]
    UnknownArchive(String),
    /// An archive of a branch the session has left.
    #[error("archive `{0}` belongs to a branch this session has left; history_archives lists the archives of this branch")]
    LeftBranch(String),
    /// The source is larger than an archive may capture.
    #[error("the source is {0} bytes, more than the {MAX_SOURCE_BYTES} an archive may capture")]
    SourceTooLarge(usize),
    /// A block type recovery cannot read as text.
    #[error("entry `{0}` holds an image: recovery reads text only and stops here")]
    Image(String),
    /// A block of a kind condense does not model.
    #[error("entry `{0}` holds a block of unknown type `{1}`: recovery reads text only and stops here")]
    Unknown(String, String),
}

/// One record of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The entry id it came from (what the model cites).
    pub id: String,
    /// `user`, `assistant`, `tool` or `summary`.
    pub role: &'static str,
    /// The text.
    pub text: String,
    /// The `tN` ref of a pruned output it stands for, when there is one.
    pub tool_ref: Option<u32>,
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The entry id.
    pub id: String,
    /// Distinct keywords matched.
    pub matched: usize,
    /// A snippet around the first match (may be partial).
    pub snippet: String,
}

/// A page of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The text of this page.
    pub text: String,
    /// Where the next page starts, `None` at the end.
    pub next_offset: Option<usize>,
    /// The entry's total length in bytes.
    pub len: usize,
}

/// A read-only view of the public context when recovery began.
#[derive(Debug, Clone)]
pub struct Archive {
    /// The archive's id (`a<n>`).
    pub id: String,
    records: Vec<Record>,
    by_id: BTreeMap<String, usize>,
    postings: BTreeMap<String, Vec<u32>>,
    bytes: usize,
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| !w.is_empty()).map(str::to_lowercase)
}

impl Archive {
    /// Builds the archive `id` from `(entry id, message, tool ref)` in chronological order. Images stop
    /// the build (recovery is text-only); the whole source may hold at most 32 MiB.
    pub fn build<'a>(id: &str, messages: impl IntoIterator<Item = (&'a str, &'a Message, Option<u32>)>) -> Result<Archive, RecoveryError> {
        let mut records = Vec::new();
        let mut bytes = 0;
        for (eid, m, tool_ref) in messages {
            let text = public_text(m).map_err(|u| match u {
                Unreadable::Image => RecoveryError::Image(eid.to_string()),
                Unreadable::Unknown(kind) => RecoveryError::Unknown(eid.to_string(), kind),
            })?;
            let role = match m {
                Message::User { origin: UserOrigin::Summary, .. } => "summary",
                Message::User { .. } => "user",
                Message::Assistant { .. } => "assistant",
                Message::ToolResult { .. } => "tool",
            };
            bytes += text.len();
            if bytes > MAX_SOURCE_BYTES {
                return Err(RecoveryError::SourceTooLarge(bytes));
            }
            records.push(Record { id: eid.to_string(), role, text, tool_ref });
        }
        let mut postings: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut by_id = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            by_id.insert(r.id.clone(), i);
            for w in words(&r.text) {
                let list = postings.entry(w).or_default();
                if list.last() != Some(&(i as u32)) {
                    list.push(i as u32);
                }
            }
        }
        Ok(Archive { id: id.to_string(), records, by_id, postings, bytes })
    }

    /// Records in order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Bytes of text captured.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Up to `limit` records matching any of the keywords (whole words, case-insensitive): more distinct
    /// keywords matched first, ties to later records. Not an exact-phrase query; snippets can be partial.
    pub fn search(&self, keywords: &[&str], limit: usize) -> Result<Vec<Hit>, RecoveryError> {
        let terms: Vec<String> = {
            let mut t: Vec<String> = keywords.iter().flat_map(|k| words(k).collect::<Vec<_>>()).collect();
            t.sort();
            t.dedup();
            t
        };
        if terms.is_empty() {
            return Err(RecoveryError::EmptyQuery);
        }
        if keywords.len() > MAX_KEYWORDS || terms.len() > MAX_KEYWORDS {
            return Err(RecoveryError::TooManyKeywords(keywords.len().max(terms.len())));
        }
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for t in &terms {
            for &i in self.postings.get(t).map(Vec::as_slice).unwrap_or(&[]) {
                *counts.entry(i).or_default() += 1;
            }
        }
        let mut ranked: Vec<(usize, u32)> = counts.into_iter().map(|(i, c)| (c, i)).collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        Ok(ranked
            .into_iter()
            .take(limit)
            .map(|(matched, i)| {
                let r = &self.records[i as usize];
                Hit { id: r.id.clone(), matched, snippet: snippet(&r.text, &terms) }
            })
            .collect())
    }

    /// Page of entry `id` from byte `offset` (2,048 bytes, cut at a character boundary).
    pub fn read(&self, id: &str, offset: usize) -> Result<Page, RecoveryError> {
        self.read_within(id, offset, PAGE_BYTES)
    }

    /// As [`Archive::read`] with a page of at most `max` bytes (at least one character), for a reply that
    /// must fit the tool-text ceiling once escaped.
    pub fn read_within(&self, id: &str, offset: usize, max: usize) -> Result<Page, RecoveryError> {
        let &i = self.by_id.get(id).ok_or_else(|| RecoveryError::UnknownEntry(id.to_string(), self.id.clone()))?;
        let text = &self.records[i].text;
        if offset > text.len() || (offset == text.len() && offset > 0) {
            return Err(RecoveryError::OffsetPastEnd { id: id.to_string(), offset, len: text.len() });
        }
        let mut start = offset;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let mut end = (start + max.min(PAGE_BYTES)).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end == start && start < text.len() {
            end = start + text[start..].chars().next().map_or(0, char::len_utf8);
        }
        Ok(Page { text: text[start..end].to_string(), next_offset: (end < text.len()).then_some(end), len: text.len() })
    }
}

/// About 160 bytes around the first keyword found, marked partial with `…` where cut.
fn snippet(text: &str, terms: &[String]) -> String {
    let lower = text.to_lowercase();
    let at = terms.iter().filter_map(|t| lower.find(t.as_str())).min().unwrap_or(0);
    // `lower` and `text` have the same byte offsets only for ASCII; clamp to a boundary of `text`.
    let mut start = at.saturating_sub(60).min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + 160).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{}{}", if start > 0 { "…" } else { "" }, text[start..end].replace('\n', " "), if end < text.len() { "…" } else { "" })
}

/// A page of archive references, `page_size` per page, newest first.
pub fn archives_page(ids: &[String], page: usize, page_size: usize) -> (Vec<String>, Option<usize>) {
    // A page far past the end is empty, never an overflow.
    let start = page.saturating_mul(page_size);
    let items: Vec<String> = ids.iter().rev().skip(start).take(page_size).cloned().collect();
    let next = (start.saturating_add(page_size) < ids.len()).then(|| page + 1);
    (items, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_far_past_the_end_is_empty() {
        let ids: Vec<String> = (1..=3).map(|i| format!("a{i}")).collect();
        assert_eq!(archives_page(&ids, 0, 2), (vec!["a3".to_string(), "a2".to_string()], Some(1)));
        assert_eq!(archives_page(&ids, 1, 2), (vec!["a1".to_string()], None));
        assert_eq!(archives_page(&ids, usize::MAX, 20), (Vec::new(), None));
    }

    fn archive() -> Archive {
        let msgs = [
            ("e1", Message::user_text("Fix the parser error in src/parse.rs", UserOrigin::Prompt)),
            ("e2", Message::user_text("Summary: the lexer was rewritten", UserOrigin::Summary)),
            ("e3", Message::user_text("the parser error is gone, now check the lexer", UserOrigin::Prompt)),
            ("e4", Message::user_text(&"é".repeat(3000), UserOrigin::Prompt)),
        ];
        Archive::build("a1", msgs.iter().map(|(id, m)| (*id, m, None))).unwrap()
    }

    #[test]
    fn bounds_at_below_and_above() {
        assert_eq!(input_budget(100_000), 70_000);
        assert_eq!(input_budget(374_491), 262_143);
        assert_eq!(input_budget(374_492), 262_144);
        assert_eq!(input_budget(1_000_000), 262_144);
        assert_eq!(summary_budget(262_144, 0), 16_384);
        assert_eq!(summary_budget(131_072, 0), 16_384);
        assert_eq!(summary_budget(131_064, 0), 16_383);
        assert_eq!(summary_budget(70_000, 1_000), 7_750);
    }

    #[test]
    fn search_ranks_by_distinct_terms_then_later_records() {
        let a = archive();
        let hits = a.search(&["parser", "error", "lexer"], 10).unwrap();
        let order: Vec<(&str, usize)> = hits.iter().map(|h| (h.id.as_str(), h.matched)).collect();
        assert_eq!(order, vec![("e3", 3), ("e1", 2), ("e2", 1)]);
        let tie = a.search(&["lexer"], 10).unwrap();
        assert_eq!(tie.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), vec!["e3", "e2"], "ties favour later records");
        assert_eq!(a.search(&[], 10), Err(RecoveryError::EmptyQuery));
        assert_eq!(a.search(&[" ", "!"], 10), Err(RecoveryError::EmptyQuery));
        let sixteen: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = sixteen.iter().map(String::as_str).collect();
        assert!(a.search(&refs, 10).is_ok());
        let seventeen: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = seventeen.iter().map(String::as_str).collect();
        assert_eq!(a.search(&refs, 10), Err(RecoveryError::TooManyKeywords(17)));
    }

    #[test]
    fn reading_pages_to_the_end_and_past_it() {
        let a = archive();
        let mut offset = 0;
        let mut text = String::new();
        let mut pages = 0;
        loop {
            let p = a.read("e4", offset).unwrap();
            assert!(p.text.len() <= PAGE_BYTES);
            text.push_str(&p.text);
            pages += 1;
            match p.next_offset {
                Some(n) => offset = n,
                None => break,
            }
        }
        assert_eq!(text, "é".repeat(3000));
        assert_eq!(pages, 3);
        assert!(matches!(a.read("e4", 6000), Err(RecoveryError::OffsetPastEnd { len: 6000, .. })));
        assert!(matches!(a.read("e9", 0), Err(RecoveryError::UnknownEntry(..))));
        assert_eq!(a.read("e1", 0).unwrap().next_offset, None);
    }

    #[test]
    fn images_stop_the_build_and_archives_page() {
        let img = Message::User { content: vec![Block::image("image/png".into(), "x".into())], origin: UserOrigin::Prompt };
        assert_eq!(Archive::build("a1", [("e1", &img, None)]).unwrap_err(), RecoveryError::Image("e1".into()));
        let ids: Vec<String> = (1..=5).map(|i| format!("a{i}")).collect();
        assert_eq!(archives_page(&ids, 0, 2), (vec!["a5".to_string(), "a4".to_string()], Some(1)));
        assert_eq!(archives_page(&ids, 2, 2), (vec!["a1".to_string()], None));
    }
}
