//! A request body's structure in one pass: where its top-level fields and its message list's elements
//! start and end, each element's `role` and `type`, and how many JSON values it holds — what serve needs
//! before it records anything, found without building a value or reading a string's text.
//!
//! The scan reads text serde_json has already accepted (valid UTF-8, valid JSON): it only finds
//! boundaries, skipping strings by their quotes and backslashes (`memchr`). It never panics, and on
//! anything it does not expect (a body that is not an object, an element that is not one, a duplicate
//! `role`, a role that is not a string…) it gives up with `None`, and the caller reads the body the slower
//! way, whose errors are the ones a client sees.

use std::borrow::Cow;
use std::ops::Range;

/// What [`index`] found in a body.
#[derive(Debug, PartialEq)]
pub struct BodyIndex<'a> {
    /// The top-level fields in the order written (a repeated key each time): name, range of the value.
    pub fields: Vec<(String, Range<usize>)>,
    /// The elements of the message list (`list_field`), when it is an array.
    pub items: Option<Vec<Range<usize>>>,
    /// Each element's `role` and `type`, when given as strings (`null` or missing: `None`).
    pub probes: Vec<Probe<'a>>,
    /// [`crate::wire::count_elements`] summed over the elements.
    pub elements: u64,
}

/// An element's `role` and `type`, when strings.
pub type Probe<'a> = (Option<Cow<'a, str>>, Option<Cow<'a, str>>);

/// How many bytes of a string are looked through one by one before `memchr` takes over.
const SHORT: usize = 32;

/// The first `"` within the first [`SHORT`] bytes of `hay`, eight bytes a step (a byte equal to `"`
/// is a zero byte of the word xor `"` in every byte).
fn quote_in_short(hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut at = 0;
    while at + 8 <= SHORT.min(hay.len()) {
        let word = u64::from_le_bytes(hay[at..at + 8].try_into().expect("eight bytes")) ^ (ONES * u64::from(b'"'));
        let zero = word.wrapping_sub(ONES) & !word & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    hay[at..SHORT.min(hay.len())].iter().position(|&c| c == b'"').map(|k| at + k)
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// `{`, `[` and `,` seen outside strings while counting (the list's elements only).
    count: u64,
    counting: bool,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\n' | b'\r' | b'\t') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Skips a string starting at its opening quote; the range of its contents. Its end is the first
    /// quote after an even run of backslashes (none counts).
    fn string(&mut self) -> Option<Range<usize>> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.i + 1;
        let mut at = start;
        loop {
            // Most strings of a request are short (keys, roles, ids): looked through before `memchr`,
            // whose setup costs more than they do.
            let hay = self.b.get(at..)?;
            let q = at + match quote_in_short(hay) {
                Some(k) => k,
                None => SHORT + memchr::memchr(b'"', hay.get(SHORT..)?)?,
            };
            let run = self.b[start..q].iter().rev().take_while(|&&c| c == b'\\').count();
            at = q + 1;
            if run % 2 == 0 {
                self.i = at;
                return Some(start..q);
            }
        }
    }

    /// A string's text: borrowed when it holds no escape, else read by serde_json.
    fn text(&self, r: Range<usize>) -> Option<Cow<'a, str>> {
        if self.b[r.clone()].contains(&b'\\') {
            serde_json::from_slice::<String>(self.b.get(r.start - 1..r.end + 1)?).ok().map(Cow::Owned)
        } else {
            std::str::from_utf8(&self.b[r]).ok().map(Cow::Borrowed)
        }
    }

    /// Whether the string at `r` is `name` (its text, escapes read).
    fn is(&self, r: Range<usize>, name: &str) -> bool {
        let raw = &self.b[r.clone()];
        if raw == name.as_bytes() {
            true
        } else if raw.len() > name.len() && raw.contains(&b'\\') {
            self.text(r).is_some_and(|t| t == name)
        } else {
            false
        }
    }

    /// Skips one value; its range.
    fn value(&mut self) -> Option<Range<usize>> {
        self.ws();
        let start = self.i;
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => self.container()?,
            _ => {
                while self.i < self.b.len() && !matches!(self.b[self.i], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
            }
        }
        Some(start..self.i)
    }

    /// Skips an object or array and everything in it, counting what it opens and separates.
    fn container(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            let c = self.peek()?;
            match c {
                b'"' => {
                    self.string()?;
                    continue;
                }
                b'{' | b'[' => {
                    depth += 1;
                    self.count += u64::from(self.counting);
                }
                b',' => self.count += u64::from(self.counting),
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        self.i += 1;
                        return Some(());
                    }
                }
                _ => {}
            }
            self.i += 1;
        }
    }

    /// Reads the members of an object or the elements of an array (`open` … `close`) one by one: `f` is
    /// at each (after its spaces), which it must read to its end.
    fn each(&mut self, open: u8, close: u8, mut f: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(open)?;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            f(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                c if c == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads an object's members one by one: `f` gets each key's range and is at its value, which it
    /// must skip.
    fn object(&mut self, mut f: impl FnMut(&mut Self, Range<usize>) -> Option<()>) -> Option<()> {
        self.each(b'{', b'}', |s| {
            let key = s.string()?;
            s.eat(b':')?;
            s.ws();
            f(s, key)
        })
    }

    /// Reads an array's elements one by one: `f` is at each, which it must skip.
    fn array(&mut self, f: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.each(b'[', b']', f)
    }

    /// An element of the message list: its `role` and `type` strings, the rest skipped and counted.
    fn element(&mut self) -> Option<Probe<'a>> {
        let (mut role, mut kind) = (None, None);
        let (mut seen_role, mut seen_kind) = (false, false);
        self.count += 1;
        let mut members = 0u64;
        self.object(|s, key| {
            members += 1;
            let slot = if s.is(key.clone(), "role") {
                Some((&mut role, &mut seen_role))
            } else if s.is(key, "type") {
                Some((&mut kind, &mut seen_kind))
            } else {
                None
            };
            match slot {
                // A duplicate is an error to serde_json's reading: that reading says so.
                Some((_, seen)) if *seen => None,
                Some((value, seen)) => {
                    *seen = true;
                    match s.peek()? {
                        b'"' => {
                            let r = s.string()?;
                            *value = Some(s.text(r)?);
                        }
                        b'n' => {
                            (s.value()?.len() == 4).then_some(())?;
                        }
                        _ => return None,
                    }
                    Some(())
                }
                None => s.value().map(drop),
            }
        })?;
        self.count += members.saturating_sub(1);
        Some((role, kind))
    }

    /// The message list: each element's range and probe.
    fn list(&mut self, items: &mut Vec<Range<usize>>, probes: &mut Vec<Probe<'a>>) -> Option<()> {
        self.array(|s| {
            let start = s.i;
            s.counting = true;
            let probe = s.element();
            s.counting = false;
            probes.push(probe?);
            items.push(start..s.i);
            Some(())
        })
    }
}

/// The structure of `body` (valid JSON, checked by the caller) with `list_field` as its message list;
/// `None` for anything the scan does not expect (see the module's note).
pub fn index<'a>(body: &'a [u8], list_field: &str) -> Option<BodyIndex<'a>> {
    let mut s = Scan { b: body, i: 0, count: 0, counting: false };
    let mut out = BodyIndex { fields: Vec::new(), items: None, probes: Vec::new(), elements: 0 };
    let mut listed = false;
    s.object(|s, key| {
        let key = s.text(key)?;
        let start = s.i;
        if key == list_field && !listed && s.peek()? == b'[' {
            listed = true;
            let (mut items, mut probes) = (Vec::new(), Vec::new());
            s.list(&mut items, &mut probes)?;
            out.items = Some(items);
            out.probes = probes;
        } else if key == list_field {
            // A second list, or one that is not an array: the slower reading decides.
            return None;
        } else {
            s.value()?;
        }
        out.fields.push((key.into_owned(), start..s.i));
        Some(())
    })?;
    s.ws();
    if s.i != body.len() {
        return None;
    }
    out.elements = s.count;
    Some(out)
}

/// The ranges of the elements of the JSON array `list` (valid JSON, checked by the caller, or JSON serve
/// wrote itself); `None` for anything else.
pub fn elements(list: &[u8]) -> Option<Vec<Range<usize>>> {
    let mut s = Scan { b: list, i: 0, count: 0, counting: false };
    let mut out = Vec::new();
    s.array(|s| s.value().map(|r| out.push(r)))?;
    s.ws();
    (s.i == list.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::count_elements;

    /// The scan against serde_json's reading of the same body: the same fields, elements, probes, counts.
    fn agrees(body: &str, list: &str) {
        let ix = index(body.as_bytes(), list).expect("scanned");
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).unwrap();
        let names: Vec<&str> = ix.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, v.keys().map(String::as_str).collect::<Vec<_>>(), "{body}");
        for (k, r) in &ix.fields {
            let parsed: serde_json::Value = serde_json::from_str(&body[r.clone()]).unwrap();
            assert_eq!(parsed, v[k], "{k} in {body}");
        }
        let items = ix.items.unwrap();
        let elems = v[list].as_array().unwrap();
        assert_eq!(items.len(), elems.len());
        for ((r, e), (role, kind)) in items.iter().zip(elems).zip(&ix.probes) {
            let parsed: serde_json::Value = serde_json::from_str(&body[r.clone()]).unwrap();
            assert_eq!(&parsed, e);
            assert_eq!(role.as_deref(), e["role"].as_str());
            assert_eq!(kind.as_deref(), e["type"].as_str());
        }
        assert_eq!(ix.elements, items.iter().map(|r| count_elements(&body.as_bytes()[r.clone()])).sum::<u64>(), "{body}");
    }

    #[test]
    fn the_scan_finds_what_serde_json_reads() {
        agrees(r#"{"model":"m","messages":[{"role":"user","content":"a \"quoted\" \\ back\\slash"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":[1,2]}"}}]}],"stream":true}"#, "messages");
        agrees(" { \"input\" : [ ] , \"n\" : -1.5e3 , \"o\" : { } , \"a\" : [ true , false , null ] } ", "input");
        agrees(r#"{"input":[{"type":"message","role":"\u0075ser","content":[{"type":"input_text","text":"x,{[\"]"}]},{"type":"function_call_output","call_id":"c","output":"\\"}],"tools":[]}"#, "input");
        agrees(r#"{"messages":[{"role":null,"content":"x"},{"content":[1,[2,{"k":{}}]]}],"messages2":1}"#, "messages");
        // Keys with escapes.
        agrees(r#"{"mo\u0064el":"a","messages":[{"r\u006fle":"tool"}],"x":1}"#, "messages");
        // A repeated field outside the list is each time where it is written (as `wire::Fields` has it).
        let body = r#"{"messages":[],"x":1,"x":[2]}"#;
        let ix = index(body.as_bytes(), "messages").unwrap();
        let fields: Vec<(&str, &str)> = ix.fields.iter().map(|(k, r)| (k.as_str(), &body[r.clone()])).collect();
        assert_eq!(fields, [("messages", "[]"), ("x", "1"), ("x", "[2]")]);
    }

    #[test]
    fn a_quote_is_found_wherever_it_is() {
        for len in 0..=40 {
            for at in 0..=len {
                let mut hay = vec![b'a'; len];
                hay.iter_mut().step_by(3).for_each(|c| *c = b'\\');
                if at < len {
                    hay[at] = b'"';
                }
                let want = (at < len && at < SHORT).then_some(at);
                assert_eq!(quote_in_short(&hay), want, "{len} {at}");
            }
        }
    }

    #[test]
    fn the_elements_of_a_list_are_serde_jsons() {
        let list = r#" [ {"a":"x\"]"}, [1,2] , "s" ,3, null ] "#;
        let ranges = elements(list.as_bytes()).unwrap();
        let by_serde: Vec<&serde_json::value::RawValue> = serde_json::from_str(list).unwrap();
        assert_eq!(ranges.iter().map(|r| &list[r.clone()]).collect::<Vec<_>>(), by_serde.iter().map(|v| v.get()).collect::<Vec<_>>());
        assert_eq!(elements(b"[]"), Some(vec![]));
        for bad in ["[1,", "[1] 2", "{}", "[1 2]", ""] {
            assert_eq!(elements(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn the_scan_leaves_to_serde_json_what_it_does_not_expect() {
        for body in [
            r#"[1]"#,
            r#"{"messages":"text"}"#,
            r#"{"messages":[1]}"#,
            r#"{"messages":[{"role":1}]}"#,
            r#"{"messages":[{"role":"a","role":"b"}]}"#,
            r#"{"messages":[],"messages":[]}"#,
            r#"{"messages":[{"role":"a"}]"#,
            r#"{"messages":[{"role":"a"}]} x"#,
            r#"{"messages":[{"role":"a}]}"#,
        ] {
            assert_eq!(index(body.as_bytes(), "messages"), None, "{body}");
        }
        // Whatever it is given, it does not panic.
        let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a\"b"}]}],"x":[1,{"y":null}]}"#;
        for end in 0..body.len() {
            let _ = index(&body[..end], "messages");
        }
        assert!(index(body, "messages").is_some());
    }
}
