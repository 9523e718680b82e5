//! JSON helpers every importer shares: a struct read only from an object, fields read or moved out of a
//! value, and a value's compact text (taken as written when it already is that text).

use serde_json::Value;

/// A `T` read only from a JSON object. A struct derived with serde is also read from an array, field by
/// field in order, which no importer's `Value` path would take for the object it expects.
#[derive(Debug, Clone)]
pub(crate) struct Obj<T>(pub T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Map<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Map<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        d.deserialize_map(Map(std::marker::PhantomData))
    }
}

/// A `T` read from JSON text that holds an object ([`Obj`]); `None` for anything else.
pub(crate) fn object<'a, T: serde::Deserialize<'a>>(text: &'a str) -> Option<T> {
    serde_json::from_str::<Obj<T>>(text).ok().map(|o| o.0)
}

impl<T: serde::Serialize> serde::Serialize for Obj<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// A field that is present: `Some` of what it holds, `null` included (with `default`, absent is `None`).
pub(crate) fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A string field, or `None`.
pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Moves a string out of a value, leaving `Null` behind (avoids copying large texts).
pub(crate) fn take_str(v: &mut Value, key: &str) -> Option<String> {
    match v.get_mut(key).map(Value::take) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// Compact JSON text of a value (keys in source order).
pub(crate) fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// [`json_text`] of the value whose JSON text `raw` holds: that text itself when it is already what
/// [`json_text`] writes, so the value is never built. `None` if the value cannot be built (a parser
/// that accepted the raw text builds it too, so it never is in practice).
pub(crate) fn json_text_of_raw(raw: &serde_json::value::RawValue) -> Option<String> {
    let raw = raw.get();
    if is_compact(raw.as_bytes()) {
        return Some(raw.to_string());
    }
    serde_json::from_str::<Value>(raw).ok().map(|v| json_text(&v))
}

/// Whether valid JSON text `raw` is what [`json_text`] writes of its value. Conservative: `false` for
/// anything the value might write otherwise, which is then built and written instead. `true` needs no
/// whitespace between tokens, numbers that are integers of at most 18 digits (not `-0`), string
/// escapes only of the kinds serde_json writes (`\"`, `\\`, `\n`, `\t`, `\r`, `\b`, `\f`; never
/// `\u` or `\/`), and no key given twice in one object (the value keeps one of them) nor objects of
/// more than 64 keys.
fn is_compact(raw: &[u8]) -> bool {
    // Per open container: `None` for an array; for an object, its keys so far, as written (with `\u`
    // and `\/` refused, a string has one spelling, so two equal keys are equal bytes). An object of
    // more keys than `MAX_KEYS` is left to the value, so the search for a repeated key stays short.
    const MAX_KEYS: usize = 64;
    let mut open: Vec<Option<Vec<&[u8]>>> = Vec::new();
    // Whether the next string is a key: after `{`, or after `,` in an object.
    let mut key_next = false;
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                loop {
                    let Some(at) = memchr::memchr2(b'"', b'\\', &raw[i..]) else { return false };
                    i += at;
                    if raw[i] == b'"' {
                        break;
                    }
                    if !matches!(raw.get(i + 1), Some(b'"' | b'\\' | b'n' | b't' | b'r' | b'b' | b'f')) {
                        return false;
                    }
                    i += 2;
                }
                if key_next {
                    let key = &raw[start..i];
                    match open.last_mut() {
                        Some(Some(keys)) if keys.len() < MAX_KEYS && !keys.contains(&key) => keys.push(key),
                        _ => return false,
                    }
                    key_next = false;
                }
                i += 1;
            }
            b'{' => {
                open.push(Some(Vec::new()));
                key_next = true;
                i += 1;
            }
            b'[' => {
                open.push(None);
                i += 1;
            }
            b'}' | b']' => {
                open.pop();
                key_next = false;
                i += 1;
            }
            b',' => {
                key_next = matches!(open.last(), Some(Some(_)));
                i += 1;
            }
            b':' => i += 1,
            b't' | b'f' | b'n' => {
                let word: &[u8] = match raw[i] {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                if !raw[i..].starts_with(word) {
                    return false;
                }
                i += word.len();
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += usize::from(raw[i] == b'-');
                let digits = raw[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                i += digits;
                if digits == 0 || digits > 18 || &raw[start..i] == b"-0" {
                    return false;
                }
                if matches!(raw.get(i), Some(b'.' | b'e' | b'E')) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    open.is_empty()
}

/// `bytes` without a leading UTF-8 byte-order mark, which some editors and Windows tools write at the
/// start of a text file; JSON parsers refuse it. (A stream's first line loses it in `jsonl`.)
pub(crate) fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(BOM).unwrap_or(bytes)
}

/// The UTF-8 byte-order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_text_is_kept_as_written_and_anything_else_is_written_from_its_value() {
        // (whether it is kept as written, text); either way the result is the value's compact text. Some
        // left to the value are compact already (a 19-digit integer, 65 keys): the check is conservative.
        let many_keys = format!("{{{}}}", (0..65).map(|i| format!("\"k{i}\":{i}")).collect::<Vec<_>>().join(","));
        let cases: Vec<(bool, &str)> = vec![
            (true, r#"{"command":"ls -la","timeout":120}"#),
            (true, r#"{"path":"/a/b.rs","edits":[{"old":"x\n\ty","new":"q\"r\\s"}],"n":-42,"ok":true,"no":false,"z":null}"#),
            (true, "{\"s\":\"caf\u{e9} \u{2028} {[:,]}\",\"a\":[],\"o\":{},\"b\":\"\\b\\f\\r\"}"),
            (true, r#"{"a":{"k":1},"b":{"k":2},"k":[{"k":3},{"k":4}]}"#),
            (true, "null"),
            (true, "[1,2,3]"),
            (true, r#""a string""#),
            (true, "123456789012345678"),
            (false, "1234567890123456789"),
            (false, r#"{"command": "ls"}"#),
            (false, "{\"a\":1,\n\"b\":2}"),
            (false, r#"{"x":1.0}"#),
            (false, r#"{"x":1e3}"#),
            (false, r#"{"x":-0}"#),
            (false, r#"{"x":18446744073709551616}"#),
            (false, r#"{"x":"caf\u00e9"}"#),
            (false, r#"{"x":"\u0001"}"#),
            (false, r#"{"x":"a\/b"}"#),
            (false, r#"{"k":1,"k":2}"#),
            (false, r#"{"a":{"k":1,"j":2,"k":3}}"#),
            (false, r#"{"k\n":1,"k\n":2}"#),
            (false, many_keys.as_str()),
        ];
        for (kept, text) in cases {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(is_compact(text.as_bytes()), kept, "{text}");
            let raw: &serde_json::value::RawValue = serde_json::from_str(text).unwrap();
            assert_eq!(json_text_of_raw(raw).as_deref(), Some(json_text(&value).as_str()), "{text}");
            if kept {
                assert_eq!(json_text(&value), text, "kept as written, so it is the value's text");
            }
        }
    }
}
