//! The path arguments of a tool call: the string values under a key naming a path or file, read from
//! the arguments' JSON text as it is (capture's protected paths, the live reads of `liveReadsTokens`).

/// String values whose key names a path or file.
pub fn path_arguments(json: &str) -> Vec<String> {
    let strings = json_strings_with_role(json);
    let mut out = Vec::new();
    let mut key: Option<String> = None;
    for (s, is_key) in strings {
        if is_key {
            key = Some(s.to_ascii_lowercase());
        } else if key.as_deref().is_some_and(|k| k.contains("path") || k.contains("file")) {
            out.push(s);
        }
    }
    out
}

/// String literals of a JSON text, each with whether it is an object key (followed by `:`).
fn json_strings_with_role(json: &str) -> Vec<(String, bool)> {
    let strings = json_strings(json);
    // Re-scan for what follows each literal; json_strings walked the same literals in the same order.
    let mut roles = Vec::with_capacity(strings.len());
    let b = json.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            let mut j = i;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            roles.push(b.get(j) == Some(&b':'));
            continue;
        }
        i += 1;
    }
    strings.into_iter().zip(roles).collect()
}

/// Every string literal in a JSON text, unescaped (keys too: they never look like paths).
pub fn json_strings(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = json.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
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
        out.push(s);
    }
    out
}