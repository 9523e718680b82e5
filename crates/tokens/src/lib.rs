//! Token counting. [`estimate`] is pi's heuristic (characters / 4, rounded up), which the figures in the
//! issues and in `PEERS.md` are defined by; [`Exact`] counts real BPE tokens with a tiktoken encoding and
//! caches the count of each text by its blake3 hash, so a context rendered every turn is counted once.
//!
//! # Example
//!
//! ```
//! use condense_events::{Message, UserOrigin};
//!
//! let m = Message::user_text("twelve chars", UserOrigin::Prompt);
//! // pi's heuristic: characters / 4, rounded up.
//! assert_eq!(condense_tokens::estimate(&m), 3);
//! ```

use condense_events::{Block, Message};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Characters an image counts for in the estimate (pi's rule).
pub const IMAGE_CHARS: usize = 4800;

/// Length in UTF-16 code units, which is what pi (JavaScript `String.length`) counts.
pub fn js_len(s: &str) -> usize {
    // Counted from the bytes, without decoding: every character has one leading byte (a byte that is
    // not 0b10xxxxxx), and a character of four bytes (leading byte 0b11110xxx) is two UTF-16 units. The
    // loop has no branch, so it runs as fast on text that is not ASCII as on text that is.
    s.bytes().map(|b| usize::from((b as i8) >= -0x40) + usize::from(b >= 0xF0)).sum()
}

/// Characters of one message as pi's estimator counts them: text and thinking, tool names and the JSON
/// text of arguments, 4800 per image.
pub fn message_chars(m: &Message) -> usize {
    m.content()
        .iter()
        .map(|b| match b {
            Block::Text { text } => js_len(text),
            Block::Thinking(t) => js_len(&t.thinking),
            Block::ToolCall(c) => js_len(&c.name) + js_len(&c.arguments),
            Block::Image(_) => IMAGE_CHARS,
            Block::Opaque(o) => js_len(&o.json),
        })
        .sum()
}

/// pi's token estimate of one message: `ceil(chars / 4)`.
pub fn estimate(m: &Message) -> u64 {
    message_chars(m).div_ceil(4) as u64
}

/// Sum of [`estimate`] over a context.
pub fn estimate_all<'a>(messages: impl IntoIterator<Item = &'a Message>) -> u64 {
    messages.into_iter().map(estimate).sum()
}

/// A tiktoken encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Encoding {
    /// GPT-4o and later.
    O200kBase,
    /// GPT-4 and GPT-3.5.
    Cl100kBase,
}

impl Encoding {
    /// Parses `o200k_base` or `cl100k_base`.
    pub fn parse(name: &str) -> Option<Encoding> {
        match name {
            "o200k_base" => Some(Encoding::O200kBase),
            "cl100k_base" => Some(Encoding::Cl100kBase),
            _ => None,
        }
    }
}

/// Exact token counts with one encoding, cached by content hash.
pub struct Exact {
    bpe: &'static tiktoken_rs::CoreBPE,
    cache: Mutex<BTreeMap<[u8; 32], u64>>,
}

impl Exact {
    /// A counter for `encoding`. The encoding's tables are built once per process.
    pub fn new(encoding: Encoding) -> Exact {
        let bpe = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        };
        Exact { bpe, cache: Mutex::new(BTreeMap::new()) }
    }

    /// Tokens of `text`, from the cache when this text was counted before.
    pub fn count_text(&self, text: &str) -> u64 {
        let key = *blake3::hash(text.as_bytes()).as_bytes();
        if let Some(&n) = self.cache.lock().expect("token cache lock").get(&key) {
            return n;
        }
        let n = self.bpe.encode_ordinary(text).len() as u64;
        self.cache.lock().expect("token cache lock").insert(key, n);
        n
    }

    /// Tokens of one message's content: texts, thinking, tool names and arguments, and pi's image allowance
    /// (4800 chars / 4) per image, since images are not text.
    pub fn count(&self, m: &Message) -> u64 {
        m.content()
            .iter()
            .map(|b| match b {
                Block::Text { text } => self.count_text(text),
                Block::Thinking(t) => self.count_text(&t.thinking),
                Block::ToolCall(c) => self.count_text(&c.name) + self.count_text(&c.arguments),
                Block::Image(_) => (IMAGE_CHARS / 4) as u64,
                Block::Opaque(o) => self.count_text(&o.json),
            })
            .sum()
    }

    /// Number of distinct texts in the cache.
    pub fn cached(&self) -> usize {
        self.cache.lock().expect("token cache lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::UserOrigin;

    #[test]
    fn js_len_counts_utf16_units() {
        for s in ["", "abc", "é", "naïve café", "→ ✓", "𝄞", "a😀b", "日本語のテキスト", "mixed é 😀 ok\n"] {
            assert_eq!(js_len(s), s.encode_utf16().count(), "{s:?}");
        }
    }

    #[test]
    fn estimate_follows_pi_rules() {
        let user = Message::user_text("abcde", UserOrigin::Prompt);
        assert_eq!(estimate(&user), 2);
        let asst = Message::Assistant {
            content: vec![
                Block::thinking("1234".into(), Some("sig-not-counted".into())),
                Block::tool_call("id-not-counted".into(), "bash".into(), r#"{"c":"ls"}"#.into()),
            ],
            model: None,
            stop: None,
            usage: None,
        };
        assert_eq!(estimate(&asst), (4 + 4 + 10_u64).div_ceil(4));
        let img = Message::ToolResult {
            call_id: "x".into(),
            tool_name: "read".into(),
            content: vec![Block::image("image/png".into(), "AAAA".into())],
            is_error: false,
        };
        assert_eq!(estimate(&img), 1200);
        // UTF-16 units: an astral character counts 2, a Hangul syllable 1.
        assert_eq!(js_len("😀하"), 3);
    }

    #[test]
    fn exact_counts_and_caches() {
        let ex = Exact::new(Encoding::Cl100kBase);
        assert_eq!(ex.count_text("hello world"), 2);
        assert_eq!(ex.count_text("hello world"), 2);
        assert_eq!(ex.cached(), 1);
        let o = Exact::new(Encoding::O200kBase);
        assert!(o.count_text("fn main() { println!(\"hi\"); }") > 5);
        assert_eq!(Encoding::parse("o200k_base"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::parse("p50k"), None);
    }
}
