//! Content-hash aliasing: two outputs of the same tool whose normalized texts are equal are the same
//! output. Normalization folds CRLF to LF, drops trailing whitespace on every line and trims the text.

/// The text as dedup compares it.
pub fn normalize(text: &str) -> String {
    let unified = text.replace("\r\n", "\n");
    let lines: Vec<&str> = unified.split('\n').map(str::trim_end).collect();
    lines.join("\n").trim().to_string()
}

/// The dedup key of an output: blake3 of the tool name, a NUL, and the normalized text, as hex.
pub fn key(tool: &str, text: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(tool.as_bytes());
    h.update(&[0]);
    h.update(normalize(text).as_bytes());
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_ignores_line_endings_and_trailing_space() {
        assert_eq!(key("bash", "a  \r\nb\t\n\n"), key("bash", "a\nb"));
        assert_ne!(key("bash", "a\nb"), key("read", "a\nb"));
        assert_ne!(key("bash", "a\n b"), key("bash", "a\nb"));
        assert_eq!(normalize("  x \r\n y  \n"), "x\n y");
    }
}
