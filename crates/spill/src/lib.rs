//! Spilling: an output of at least `spillThreshold` characters goes to a blob file before summarization,
//! and its stub shows a head preview of `spillPreviewBytes` bytes (cut at a character boundary).

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
        assert_eq!(preview("héllo", 2), "h");
        assert_eq!(preview("héllo", 3), "hé");
        assert_eq!(preview("abc", 2048), "abc");
    }
}
