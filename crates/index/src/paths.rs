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

/// The file a path argument names, without a read selector after it: `src/app.ts:120-180` (a line range)
/// and `page.html:raw` name `src/app.ts` and `page.html`. A selector is a `:` and letters, digits, `-` or `,`
/// after a file name with an extension; anything else (`C:\dir`, `host:port/x`, a name without a dot) is
/// the path as it is.
pub fn file_of(path: &str) -> &str {
    let Some(i) = path.rfind(':') else { return path };
    let (name, selector) = (&path[..i], &path[i + 1..]);
    let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let is_selector = !selector.is_empty() && selector.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b',');
    if is_selector && file.contains('.') && !file.ends_with('.') {
        name
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::file_of;

    #[test]
    fn a_read_selector_is_not_part_of_the_file() {
        assert_eq!(file_of("src/app.ts:120-180"), "src/app.ts");
        assert_eq!(file_of("/tmp/page.html:raw"), "/tmp/page.html");
        assert_eq!(file_of("a.rs:1-5,9"), "a.rs");
        for kept in ["src/app.ts", "C:\\work\\x", "C:", "dir/Makefile:12", "x.rs:", "x.rs:a b", "host:8080/a.rs", "notes.:1"] {
            assert_eq!(file_of(kept), kept);
        }
    }
}
