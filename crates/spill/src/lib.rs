//! Spilling: an output of at least `spillThreshold` characters goes to a blob file before summarization,
//! and its stub shows a head preview of `spillPreviewBytes` bytes (cut at a character boundary). What the
//! agent read on purpose, a file read or a fetched page ([`threshold`]), is spilled only from
//! [`READ_SPILL_FACTOR`] times that: the model is shown what it asked to read.
//!
//! The spill stage ([`Spill`]) keeps no state: each capture of the pass that is large enough and not
//! protected is stored as a blob (`OutputSpilled`).
//!
//! # Example
//!
//! ```
//! // An output of 65,536 characters or more is spilled; its stub shows a head that ends on a character.
//! assert!(condense_spill::should_spill(70_000, 65_536));
//! assert!(!condense_spill::should_spill(1_000, 65_536));
//! let head = condense_spill::preview("héllo world", 2);
//! assert!("héllo world".starts_with(&head) && head.len() <= 2);
//! ```

use condense_events::DecisionEvent;
use condense_stage::{Pass, Stage, StageError, FETCH_TOOLS, READ_TOOLS};

/// The spill stage.
#[derive(Debug, Clone, Default)]
pub struct Spill;

impl Stage for Spill {
    fn name(&self) -> &'static str {
        "spill"
    }

    fn decide(&mut self, pass: &mut Pass<'_>) -> Result<(), StageError> {
        let cfg = pass.config;
        let todo: Vec<(u32, std::borrow::Cow<'_, str>)> = pass
            .captured()
            .filter(|(r, _)| should_spill(r.chars, threshold(&r.tool, cfg.spill_threshold)) && !r.protected)
            .map(|(r, text)| (r.ref_n, text.clone()))
            .collect();
        for (ref_n, text) in todo {
            let blob = pass.put_blob(text.as_bytes()).map_err(|reason| StageError { stage: "spill", reason })?;
            pass.push(DecisionEvent::OutputSpilled { ref_n, blob, bytes: text.len() as u64, preview: preview(&text, cfg.spill_preview_bytes) });
        }
        Ok(())
    }
}

/// How many times `spillThreshold` a file read ([`READ_TOOLS`]) or fetched page ([`FETCH_TOOLS`]) must reach to be spilled.
/// A spilled output reaches the model as a 2 KB head: a file or page it asked for and answers from
/// would have to be recalled whole. The hosts bound these reads themselves (pi's `read` at 50 KB, Claude
/// Code's `Read` at 256 KB), while a command can print without limit. With the default threshold a
/// read is spilled from 262,144 characters (~65,000 tokens).
pub const READ_SPILL_FACTOR: u64 = 4;

/// The spill threshold of an output of `tool` under `spill_threshold` (0 disables spilling).
pub fn threshold(tool: &str, spill_threshold: u64) -> u64 {
    if READ_TOOLS.contains(&tool) || FETCH_TOOLS.contains(&tool) {
        spill_threshold.saturating_mul(READ_SPILL_FACTOR)
    } else {
        spill_threshold
    }
}

/// Whether an output of `chars` characters is spilled under `threshold` (0 disables spilling).
pub fn should_spill(chars: u64, threshold: u64) -> bool {
    threshold > 0 && chars >= threshold
}

/// The head of `text`, at most `bytes` bytes, ending on a character boundary.
pub fn preview(text: &str, bytes: u64) -> String {
    let max = usize::try_from(bytes).unwrap_or(usize::MAX).min(text.len());
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_and_preview() {
        assert!(!should_spill(65_535, 65_536));
        assert!(should_spill(65_536, 65_536));
        assert!(!should_spill(1 << 30, 0));
        assert_eq!(threshold("bash", 65_536), 65_536);
        assert_eq!(threshold("Read", 65_536), 262_144);
        assert_eq!(threshold("WebFetch", 0), 0, "off stays off");
        assert_eq!(preview("héllo", 2), "h");
        assert_eq!(preview("héllo", 3), "hé");
        assert_eq!(preview("abc", 2048), "abc");
    }

    use condense_events::PruneConfig;
    use condense_stage::testing::{record, Given, Recorded};
    use condense_stage::Trigger;

    /// Against a recorded log: a capture at the threshold is stored as a blob, byte for byte, with its
    /// preview; a smaller one and a protected one are not; a threshold of 0 spills nothing.
    #[test]
    fn a_large_unprotected_capture_is_stored_as_a_blob() {
        let big = "é".repeat(40);
        let mut protected = record(3, 1, "r3", "a", "c3", "read", &big, "h3");
        protected.protected = true;
        let given = || Given(vec![(record(1, 1, "r1", "a", "c1", "bash", &big, "h1"), big.clone()), (record(2, 1, "r2", "a", "c2", "bash", "small", "h2"), "small".into()), (protected.clone(), big.clone())]);
        let mut log = Recorded::new(PruneConfig { spill_threshold: 40, spill_preview_bytes: 5, ..PruneConfig::default() });
        let d = log.run(&mut [&mut given(), &mut Spill], Trigger::Request).unwrap();
        assert_eq!(&d[3..], &[DecisionEvent::OutputSpilled { ref_n: 1, blob: "blob1".into(), bytes: 80, preview: "éé".into() }]);
        assert_eq!(log.blobs["blob1"], big.as_bytes());
        let mut off = Recorded::new(PruneConfig { spill_threshold: 0, ..PruneConfig::default() });
        assert_eq!(off.run(&mut [&mut given(), &mut Spill], Trigger::Request).unwrap().len(), 3);
    }
}
