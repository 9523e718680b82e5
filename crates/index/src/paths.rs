//! The path arguments of a tool call: the string values under a key naming a path or file, read from
//! the arguments' JSON text as it is (capture's protected paths, the live reads of `liveReadsTokens`).

/// String values whose key names a path or file (every string after such a key up to the next key, so a
/// list of paths too). One pass over the text; only the keys and those values are unescaped, not the
/// other strings (an edit's old and new text).
pub fn path_arguments(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut wanted = false;
    for (raw, is_key) in literals(json) {
        if is_key {
            let key = unescape(raw).to_ascii_lowercase();
            wanted = key.contains("path") || key.contains("file");
        } else if wanted {
            out.push(unescape(raw));
        }
    }
    out
}

/// Every string literal in a JSON text, unescaped (keys too: they never look like paths).
pub fn json_strings(json: &str) -> Vec<String> {
    literals(json).map(|(raw, _)| unescape(raw)).collect()
}

/// The string literals of a JSON text as written (between their quotes, escapes kept), each with whether
/// it is an object key (followed by `:`).
fn literals(json: &str) -> impl Iterator<Item = (&str, bool)> {
    let b = json.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i + b.get(i..)?.iter().position(|&c| c == b'"')? + 1;
        let mut j = start;
        while j < b.len() && b[j] != b'"' {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        // At the closing quote or the end of the text: a character boundary either way.
        let end = j.min(b.len());
        i = end + 1;
        let next = b.get(i..).and_then(|rest| rest.iter().find(|c| !c.is_ascii_whitespace()));
        Some((&json[start..end], next == Some(&b':')))
    })
}

/// A literal's text with its escapes read: `\n`, `\t`, `\uXXXX`, and any other escaped character as
/// itself.
fn unescape(raw: &str) -> String {
    if !raw.contains('\\') {
        return raw.to_string();
    }
    let mut s = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => s.push('\n'),
                Some('t') => s.push('\t'),
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    if let Some(ch) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                        s.push(ch);
                    }
                }
                Some(other) => s.push(other),
                None => break,
            },
            c => s.push(c),
        }
    }
    s
}
