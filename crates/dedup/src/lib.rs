//! Content-hash aliasing: two outputs of the same tool whose normalized texts are equal are the same
//! output. Normalization folds CRLF to LF, drops trailing whitespace on every line and trims the text.
//!
//! The dedup stage ([`Dedup`]) keeps the first ref captured with each key, folded from the log's
//! captures, and aliases every later capture with a key seen before (`OutputAliased`).
//!
//! # Example
//!
//! The dedup stage over a recorded log, fed two captures with the same key (the capture stage stood in
//! for by `condense_stage::testing::Given`, feature `testing`):
//!
//! ```
//! use condense_dedup::{key, Dedup};
//! use condense_events::{DecisionEvent, PruneConfig};
//! use condense_stage::testing::{record, Given, Recorded};
//! use condense_stage::Trigger;
//!
//! // Line endings and trailing blanks do not make two outputs differ.
//! assert_eq!(key("bash", "a\r\nb  \n"), key("bash", "a\nb"));
//! let captures = vec![
//!     (record(1, 1, "r1", "a1", "c1", "bash", "a\nb", &key("bash", "a\nb")), "a\nb".to_string()),
//!     (record(2, 1, "r2", "a1", "c2", "bash", "a\r\nb", &key("bash", "a\r\nb")), "a\r\nb".to_string()),
//! ];
//! let mut log = Recorded::new(PruneConfig::default());
//! let mut dedup = Dedup::default();
//! let decisions = log.run(&mut [&mut Given(captures), &mut dedup], Trigger::Request).unwrap();
//! assert_eq!(decisions.last(), Some(&DecisionEvent::OutputAliased { ref_n: 2, original: 1 }));
//! ```

use condense_events::{DecisionEvent, Event};
use condense_stage::{Pass, Stage, StageError};
use std::collections::BTreeMap;

/// The dedup stage. Its state: the first ref captured with each dedup key.
#[derive(Debug, Clone, Default)]
pub struct Dedup {
    /// By the key's bytes ([`stored`]): a session holds one per output it captured.
    first_by_hash: BTreeMap<[u8; 32], u32>,
}

impl Dedup {
    /// The first ref captured with `key`.
    pub fn first(&self, key: &str) -> Option<u32> {
        self.first_by_hash.get(&stored(key)).copied()
    }
}

/// A dedup key as the stage keeps it: the 32 bytes its hex stands for (held as text, a key took ~108
/// bytes with its share of the map, as bytes ~50). Text that is not a key's hex as [`key`] writes it
/// (no capture writes such) stands for the blake3 of itself, so two texts are one key only when they
/// are the same text.
fn stored(key: &str) -> [u8; 32] {
    match blake3::Hash::from_hex(key) {
        Ok(h) if h.to_hex().as_str() == key => *h.as_bytes(),
        _ => *blake3::hash(key.as_bytes()).as_bytes(),
    }
}

impl Stage for Dedup {
    fn name(&self) -> &'static str {
        "dedup"
    }

    fn fold(&mut self, event: &Event) {
        if let Event::Decision(DecisionEvent::OutputCaptured(r)) = event {
            self.first_by_hash.entry(stored(&r.hash)).or_insert(r.ref_n);
        }
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        if !pass.config.dedup {
            return Ok(());
        }
        // Captures of this pass count as seen from their own ref on.
        let mut new: BTreeMap<[u8; 32], u32> = BTreeMap::new();
        let mut aliases = Vec::new();
        for (r, _) in pass.captured() {
            let k = stored(&r.hash);
            match self.first_by_hash.get(&k).or(new.get(&k)) {
                Some(&original) => aliases.push(DecisionEvent::OutputAliased { ref_n: r.ref_n, original }),
                None => drop(new.insert(k, r.ref_n)),
            }
        }
        pass.extend(aliases);
        Ok(())
    }
}

/// The normalized text in pieces, to be joined by `\n`: the lines with their trailing white space dropped
/// (a `\r` before a line end is trailing white space, so CRLF needs no folding first), without the blank
/// lines at either end, and the first of them without its leading white space.
fn normalized_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').map(str::trim_end).collect();
    lines.truncate(lines.iter().rposition(|l| !l.is_empty()).map_or(0, |l| l + 1));
    lines.drain(..lines.iter().position(|l| !l.is_empty()).unwrap_or(0));
    if let Some(first) = lines.first_mut() {
        *first = first.trim_start();
    }
    lines
}

/// The text as dedup compares it.
pub fn normalize(text: &str) -> String {
    normalized_lines(text).join("\n")
}

/// The dedup key of an output: blake3 of the tool name, a NUL, and the normalized text, as hex (fed piece
/// by piece, without building it).
pub fn key(tool: &str, text: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(tool.as_bytes());
    h.update(&[0]);
    for (i, l) in normalized_lines(text).into_iter().enumerate() {
        if i > 0 {
            h.update(b"\n");
        }
        h.update(l.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule as first written (CRLF folded, trailing white space dropped per line, the whole trimmed),
    /// kept as the oracle of the piecewise form.
    fn reference(text: &str) -> String {
        let unified = text.replace("\r\n", "\n");
        let lines: Vec<&str> = unified.split('\n').map(str::trim_end).collect();
        lines.join("\n").trim().to_string()
    }

    /// The key hashes the normalized text, on texts built from white space, line ends and a few
    /// characters; `normalize` is that text.
    #[test]
    fn the_key_hashes_the_normalized_text() {
        let pieces = ["a", " ", "\t", "\n", "\r", "\r\n", "\u{a0}", "é", "\u{2028}", "b c"];
        let mut seed = 0x243f_6a88_85a3_08d3u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let text: String = (0..seed % 12).map(|k| pieces[(seed.rotate_left(k as u32 * 7) % pieces.len() as u64) as usize]).collect();
            let mut h = blake3::Hasher::new();
            h.update(b"bash\0");
            h.update(reference(&text).as_bytes());
            assert_eq!(key("bash", &text), h.finalize().to_hex().to_string(), "{text:?}");
            assert_eq!(normalize(&text), reference(&text), "{text:?}");
        }
    }

    /// The stage keeps a key as the bytes its hex stands for, and any other text apart from every key.
    #[test]
    fn keys_are_kept_as_their_bytes_and_other_text_apart() {
        let k = key("bash", "x");
        let h = blake3::Hash::from_hex(&k).unwrap();
        assert_eq!(stored(&k), *h.as_bytes());
        let upper = k.to_uppercase();
        assert_ne!(stored(&upper), stored(&k), "the same bytes written otherwise are another text");
        assert_eq!(stored("not hex"), *blake3::hash(b"not hex").as_bytes());
        assert_ne!(stored("not hex"), stored("not hex "));
    }

    #[test]
    fn normalization_ignores_line_endings_and_trailing_space() {
        assert_eq!(key("bash", "a  \r\nb\t\n\n"), key("bash", "a\nb"));
        assert_ne!(key("bash", "a\nb"), key("read", "a\nb"));
        assert_ne!(key("bash", "a\n b"), key("bash", "a\nb"));
        assert_eq!(normalize("  x \r\n y  \n"), "x\n y");
    }
}


#[cfg(test)]
mod stage_tests {
    use super::*;
    use condense_events::PruneConfig;
    use condense_stage::testing::{record, Given, Recorded};
    use condense_stage::Trigger;

    /// Against a recorded log: a capture whose key was seen before, in an earlier pass (the stage's
    /// folded state) or earlier in the same pass, is aliased to the first ref with that key; a fresh
    /// stage folded from the same log decides the same; `dedup: false` aliases nothing.
    #[test]
    fn a_repeated_output_is_aliased_to_the_first_even_across_passes_and_replays() {
        let rec = |n: u32, text: &str| record(n, n, &format!("r{n}"), "a", &format!("c{n}"), "bash", text, &key("bash", text));
        let mut log = Recorded::new(PruneConfig::default());
        let mut stage = Dedup::default();
        let d = log.run(&mut [&mut Given(vec![(rec(1, "x\r\n"), "x\r\n".into()), (rec(2, "y"), "y".into()), (rec(3, "x  "), "x  ".into())]), &mut stage], Trigger::Request).unwrap();
        assert_eq!(&d[3..], &[DecisionEvent::OutputAliased { ref_n: 3, original: 1 }]);
        assert_eq!(stage.first(&key("bash", "y")), Some(2));
        let later = vec![(rec(4, "y\n"), "y\n".to_string()), (rec(5, "z"), "z".to_string())];
        let mut replayed = Dedup::default();
        for e in log.events() {
            replayed.fold(e);
        }
        let mut twin = Recorded::new(PruneConfig::default());
        for e in log.events() {
            twin.append(e.clone(), &mut []);
        }
        let d = log.run(&mut [&mut Given(later.clone()), &mut stage], Trigger::Request).unwrap();
        let e = twin.run(&mut [&mut Given(later.clone()), &mut replayed], Trigger::Request).unwrap();
        assert_eq!(&d[2..], &[DecisionEvent::OutputAliased { ref_n: 4, original: 2 }]);
        assert_eq!(d, e);
        let mut off = Recorded::new(PruneConfig { dedup: false, ..PruneConfig::default() });
        let d = off.run(&mut [&mut Given(later.clone()), &mut Given(later), &mut Dedup::default()], Trigger::Request).unwrap();
        assert!(d.iter().all(|d| matches!(d, DecisionEvent::OutputCaptured(_))), "{d:?}");
    }
}
