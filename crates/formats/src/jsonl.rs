//! Tolerant JSON-lines reading: blank lines skipped, several objects on one line split apart, invalid
//! escapes repaired, and anything that still does not parse reported with its line number.

use serde_json::Value;

/// A problem met while importing, tied to a file and a 1-based line (0 when not tied to a line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File as named to the importer.
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// What was wrong and what was done.
    pub message: String,
}

impl Diagnostic {
    /// The diagnostic as the event that keeps it in the log beside the session.
    pub fn event(&self) -> condense_events::SourceEvent {
        condense_events::SourceEvent::ImportDiagnostic { file: self.file.clone(), line: self.line, message: self.message.clone() }
    }
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// One JSON value and the line it came from.
#[derive(Debug, Clone)]
pub struct Line {
    /// 1-based line number.
    pub line: u64,
    /// The parsed value (`Null` when the line was read by a fast reader instead).
    pub value: Value,
    /// What a format's fast reader made of the line (pi's and Codex's), when
    /// it read it as more than a value; `value` is then not parsed.
    pub(crate) fast: Option<Fast>,
}

/// A format's reader of its most common line shapes that skips building all of a `serde_json::Value`:
/// `None` when the line is not of those shapes, which is then parsed into a `Value` as any other.
pub(crate) type FastRead = fn(&str) -> Option<Fast>;


/// A line's entry as a fast reader built it: the entry with its id and its parent's.
#[derive(Debug, Clone)]
pub(crate) struct FastEntry {
    pub(crate) id: Option<String>,
    pub(crate) parent: Option<String>,
    pub(crate) entry: condense_events::Entry,
    /// The line's `timestamp`, for an assistant message (see `SourceEvent::HostTime`).
    pub(crate) timestamp: Option<String>,
}

/// What a fast reader made of a line.
#[derive(Debug, Clone)]
pub(crate) enum Fast {
    /// The line's entry itself (pi's message lines).
    Entry(FastEntry),
    /// The fields the importer reads of a Codex `response_item` line's payload, and the line's
    /// `timestamp`.
    Item(Box<crate::codex_item::Item>, Option<String>),
    /// The line's value holding only what the importer reads of it, the rest skipped unbuilt (Codex).
    Value(Value),
}

/// Parses every line of `bytes` at once (the tests' view of [`Lines`]).
#[cfg(test)]
pub fn read_lines(file: &str, bytes: &[u8]) -> (Vec<Line>, Vec<Diagnostic>) {
    let mut lines = Lines::new(file, bytes);
    let out: Vec<Line> = lines.by_ref().collect();
    (out, lines.diagnostics)
}

/// The lines of a buffer as parsed JSON values, one at a time, so an importer converts each value while
/// it is still in cache and never holds the whole file as values. Problems collect in `diagnostics`.
pub struct Lines<'a> {
    file: &'a str,
    rest: &'a [u8],
    n: u64,
    queue: std::collections::VecDeque<Line>,
    /// Problems met so far.
    pub diagnostics: Vec<Diagnostic>,
    /// The fast reader tried on each line from now on, once the format is known.
    pub(crate) fast: Option<FastRead>,
}

impl<'a> Lines<'a> {
    /// Lines of `bytes`; `file` names them in diagnostics.
    pub fn new(file: &'a str, bytes: &'a [u8]) -> Lines<'a> {
        Lines { file, rest: bytes, n: 0, queue: std::collections::VecDeque::new(), diagnostics: Vec::new(), fast: None }
    }

    /// Parses the next non-blank line into the queue; false at the end of the buffer.
    fn fill(&mut self) -> bool {
        while !self.rest.is_empty() {
            let (raw, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &self.rest[self.rest.len()..]),
            };
            self.rest = rest;
            self.n += 1;
            if take_line(self.file, self.n, raw, self.fast, &mut self.queue, &mut self.diagnostics) {
                return true;
            }
        }
        false
    }
}

/// Parses one raw line (numbered `n`) into `queue`, with its problems in `diagnostics`; false for a line
/// that gave nothing (blank, or nothing parsed).
fn take_line(file: &str, n: u64, raw: &[u8], fast: Option<FastRead>, queue: &mut std::collections::VecDeque<Line>, diagnostics: &mut Vec<Diagnostic>) -> bool {
    let mut diag = |message: String| diagnostics.push(Diagnostic { file: file.to_string(), line: n, message });
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    // A file saved with a byte-order mark: the first line without it (as the whole-file import reads it).
    let raw = if n == 1 { crate::json::without_bom(raw) } else { raw };
    if raw.iter().all(u8::is_ascii_whitespace) {
        return false;
    }
    let text = match std::str::from_utf8(raw) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        Err(e) => {
            diag(format!("invalid UTF-8 at byte {}; replaced with U+FFFD", e.valid_up_to()));
            String::from_utf8_lossy(raw)
        }
    };
    match fast.and_then(|read| read(&text)) {
        Some(Fast::Value(value)) => {
            queue.push_back(Line { line: n, value, fast: None });
            return true;
        }
        Some(read) => {
            queue.push_back(Line { line: n, value: Value::Null, fast: Some(read) });
            return true;
        }
        None => {}
    }
    let before = queue.len();
    match parse_line(&text) {
        Ok(values) => {
            if values.len() > 1 {
                diag(format!("{} JSON objects on one line; each kept as its own entry", values.len()));
            }
            queue.extend(values.into_iter().map(|value| Line { line: n, value, fast: None }));
        }
        Err((values, err)) => {
            if let Some(Ok(values)) = repair_escapes(&text).map(|r| parse_line(&r)) {
                diag(format!("invalid escape repaired ({err})"));
                queue.extend(values.into_iter().map(|value| Line { line: n, value, fast: None }));
            } else {
                let kept = values.len();
                queue.extend(values.into_iter().map(|value| Line { line: n, value, fast: None }));
                let what = if kept > 0 { format!("kept {kept} object(s) before it, ") } else { String::new() };
                diag(format!("malformed JSON ({err}); {what}rest of line skipped"));
            }
        }
    }
    queue.len() > before
}

/// [`Lines`] read from a stream instead of a buffer: a file of any size is read a line at a time. A read
/// error ends the lines and is kept in `error`.
pub struct ReadLines<R> {
    file: String,
    reader: R,
    buf: Vec<u8>,
    n: u64,
    queue: std::collections::VecDeque<Line>,
    /// Problems met so far.
    pub diagnostics: Vec<Diagnostic>,
    /// The read error that ended the lines, if one did.
    pub error: Option<std::io::Error>,
    /// The fast reader tried on each line from now on, once the format is known.
    pub(crate) fast: Option<FastRead>,
}

impl<R: std::io::BufRead> ReadLines<R> {
    /// Lines of `reader`; `file` names them in diagnostics.
    pub fn new(file: &str, reader: R) -> ReadLines<R> {
        ReadLines { file: file.to_string(), reader, buf: Vec::new(), n: 0, queue: std::collections::VecDeque::new(), diagnostics: Vec::new(), error: None, fast: None }
    }
}

impl<R: std::io::BufRead> Iterator for ReadLines<R> {
    type Item = Line;

    fn next(&mut self) -> Option<Line> {
        while self.queue.is_empty() {
            // A line whole in the reader's buffer is parsed where it lies; one that runs past it is copied out.
            match self.reader.fill_buf() {
                Ok(ahead) => {
                    if let Some(end) = memchr::memchr(b'\n', ahead) {
                        self.n += 1;
                        take_line(&self.file, self.n, &ahead[..end], self.fast, &mut self.queue, &mut self.diagnostics);
                        self.reader.consume(end + 1);
                        continue;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {
                    self.n += 1;
                    let raw = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
                    take_line(&self.file, self.n, raw, self.fast, &mut self.queue, &mut self.diagnostics);
                }
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
        }
        self.queue.pop_front()
    }
}

impl Iterator for Lines<'_> {
    type Item = Line;

    fn next(&mut self) -> Option<Line> {
        if self.queue.is_empty() && !self.fill() {
            return None;
        }
        self.queue.pop_front()
    }
}

/// Reads the whole buffer as a stream of JSON values (for pretty-printed files). `None` if any part of it
/// is not JSON.
pub fn read_stream(bytes: &[u8]) -> Option<Vec<Line>> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    let mut line = 1u64;
    let mut counted = 0usize;
    loop {
        // The value starts after any whitespace following the previous one.
        let mut start = stream.byte_offset();
        while bytes.get(start).is_some_and(u8::is_ascii_whitespace) {
            start += 1;
        }
        let value = match stream.next() {
            None => return Some(out),
            Some(Ok(v)) => v,
            Some(Err(_)) => return None,
        };
        line += bytes[counted..start].iter().filter(|&&b| b == b'\n').count() as u64;
        counted = start;
        out.push(Line { line, value, fast: None });
    }
}

/// Parses one or more concatenated JSON values; on error returns the values before it.
fn parse_line(text: &str) -> Result<Vec<Value>, (Vec<Value>, serde_json::Error)> {
    let mut values = Vec::with_capacity(1);
    for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        match v {
            Ok(v) => values.push(v),
            Err(e) => return Err((values, e)),
        }
    }
    Ok(values)
}

/// Doubles every backslash that does not start a valid JSON escape inside a string. Returns `None` when
/// nothing needed repair.
fn repair_escapes(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let mut in_string = false;
    let mut changed = false;
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        match b[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                let next = b.get(i + 1).copied();
                let valid = match next {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => true,
                    Some(b'u') => b.get(i + 2..i + 6).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)),
                    _ => false,
                };
                if valid {
                    i += 2;
                    continue;
                }
                out.push_str(&text[last..i]);
                out.push_str("\\\\");
                last = i + 1;
                changed = true;
            }
            _ => {}
        }
        i += 1;
    }
    out.push_str(&text[last..]);
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_concatenated_objects_and_repairs_escapes() {
        let input = b"{\"a\":1}{\"b\":2}\n\n{\"c\":\"x\\*y\"}\n{\"d\":\n{\"e\":3}\n";
        let (lines, diags) = read_lines("f.jsonl", input);
        let got: Vec<_> = lines.iter().map(|l| (l.line, l.value.to_string())).collect();
        assert_eq!(
            got,
            vec![(1, r#"{"a":1}"#.into()), (1, r#"{"b":2}"#.into()), (3, r#"{"c":"x\\*y"}"#.into()), (5, r#"{"e":3}"#.into())]
        );
        let lines_of: Vec<_> = diags.iter().map(|d| d.line).collect();
        assert_eq!(lines_of, vec![1, 3, 4]);
        assert!(diags[2].to_string().starts_with("f.jsonl:4: malformed JSON"));
    }
}
