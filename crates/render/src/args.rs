//! Shortening tool-call arguments without parsing them into a tree: string literals longer than a limit
//! are replaced, in place, by a marker string; everything else is copied byte for byte, so the result is
//! still the same JSON shape (and stays valid JSON when the input was).

/// `arguments` with every string value longer than `max` characters replaced by
/// `"[N chars; context_tree_query tR]"`, except values of keys naming a path or file (the model needs to
/// know which file it touched) and object keys. Text that is not JSON is treated as one string.
pub fn shorten(arguments: &str, max: usize, ref_n: u32) -> String {
    let marker = |n: usize| format!("\"[{n} chars; {} t{ref_n}]\"", condense_events::QUERY_TOOL_NAME);
    let trimmed = arguments.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        let n = arguments.chars().count();
        return if n > max { marker(n) } else { arguments.to_string() };
    }
    let mut out = String::with_capacity(arguments.len().min(4096));
    let mut chars = arguments.char_indices().peekable();
    // The key whose value comes next, lower-cased; cleared by `,`, `{` and `[`.
    let mut key: Option<String> = None;
    let mut last_string: Option<String> = None;
    while let Some((start, c)) = chars.next() {
        if c != '"' {
            match c {
                ':' => key = last_string.take().map(|k| k.to_ascii_lowercase()),
                ',' | '{' => key = None,
                _ => {}
            }
            out.push(c);
            continue;
        }
        let mut end = arguments.len();
        let mut len = 0usize;
        let mut escaped = false;
        for (i, c) in chars.by_ref() {
            if escaped {
                escaped = false;
                continue;
            }
            match c {
                '\\' => {
                    escaped = true;
                    len += 1;
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                _ => len += 1,
            }
        }
        let literal = &arguments[start..end];
        let is_key = arguments[end..].trim_start().starts_with(':');
        let keeps = is_key || key.as_deref().is_some_and(|k| k.contains("path") || k.contains("file"));
        if len > max && !keeps {
            out.push_str(&marker(len));
        } else {
            out.push_str(literal);
        }
        last_string = Some(literal.trim_matches('"').to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::shorten;

    #[test]
    fn long_strings_become_markers() {
        let long = "x".repeat(50);
        let args = format!("{{\"path\":\"src/a.rs\",\"content\":\"{long}\",\"n\":3}}");
        assert_eq!(shorten(&args, 20, 7), "{\"path\":\"src/a.rs\",\"content\":\"[50 chars; context_tree_query t7]\",\"n\":3}");
        assert_eq!(shorten("{\"a\":\"q\\\"uote\"}", 20, 1), "{\"a\":\"q\\\"uote\"}");
        assert_eq!(shorten("plain text", 3, 2), "\"[10 chars; context_tree_query t2]\"");
        assert_eq!(shorten("{\"a\":1}", 5, 1), "{\"a\":1}");
        let long_path = format!("{{\"file_path\":\"/{}/x.rs\",\"new_string\":\"{}\"}}", "d".repeat(40), "y".repeat(40));
        assert_eq!(
            shorten(&long_path, 20, 3),
            format!("{{\"file_path\":\"/{}/x.rs\",\"new_string\":\"[40 chars; context_tree_query t3]\"}}", "d".repeat(40))
        );
    }
}
