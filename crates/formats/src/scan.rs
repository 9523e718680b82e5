//! A request body's structure in one pass: where its top-level fields and its message list's elements
//! start and end, each element's `role` and `type`, and how many JSON values it holds — what serve needs
//! before it records anything, found without building a value or reading a string's text.
//!
//! The scan reads text serde_json has already accepted (valid UTF-8, valid JSON): it only finds
//! boundaries, skipping strings by their quotes and backslashes (`memchr`). It never panics, and on
//! anything it does not expect (a body that is not an object, an element that is not one, a duplicate
//! `role`, a role that is not a string…) it gives up with `None`, and the caller reads the body the slower
//! way, whose errors are the ones a client sees.
//!
//! An agent's next request repeats its last one and adds to it: given a [`Hint`] (what the scan found of
//! an earlier body: each element's place, key, probe and count), an element at the place the hint names
//! whose bytes have the key it names is taken as it is, without being scanned again. The hint is only
//! ever a guess: an element whose bytes differ is scanned, so what [`index`] finds does not depend on it.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

/// What [`index`] found in a body.
#[derive(Debug, PartialEq)]
pub struct BodyIndex<'a> {
    /// The top-level fields in the order written (a repeated key each time): name, range of the value.
    pub fields: Vec<(String, Range<usize>)>,
    /// The elements of the message list (`list_field`), when it is an array.
    pub items: Option<Vec<Range<usize>>>,
    /// Each element's `role` and `type`, when given as strings (`null` or missing: `None`).
    pub probes: Vec<Probe<'a>>,
    /// Each element's key ([`crate::wire::item_key`]).
    pub keys: Vec<u64>,
    /// Each element's [`crate::wire::count_elements`].
    pub counts: Vec<u32>,
}

/// What the scan of an earlier body found of one element of its message list: its place in that body,
/// its key, where its `role` and `type` strings are within it, and its count of values.
#[derive(Debug, Clone, PartialEq)]
pub struct HintItem {
    start: u32,
    end: u32,
    key: u64,
    role: Option<(u32, u32)>,
    kind: Option<(u32, u32)>,
    count: u32,
}

/// What the scan of an earlier body found of its message list's elements, in order.
pub type Hint = Vec<HintItem>;

/// The element of `hint` at `start`, when `body` there has its bytes (by their key): its end, key,
/// probe and count.
fn hinted<'a>(hint: &[HintItem], at: &mut usize, body: &'a [u8], start: usize) -> Option<(usize, u64, Probe<'a>, u32)> {
    while hint.get(*at).is_some_and(|h| (h.start as usize) < start) {
        *at += 1;
    }
    let h = hint.get(*at).filter(|h| h.start as usize == start)?;
    let text = body.get(start..h.end as usize)?;
    if crate::wire::item_key(text) != h.key {
        return None;
    }
    let part = |r: Option<(u32, u32)>| r.and_then(|(a, b)| text.get(a as usize..b as usize)).and_then(|t| std::str::from_utf8(t).ok()).map(Cow::Borrowed);
    Some((h.end as usize, h.key, (part(h.role), part(h.kind)), h.count))
}

impl BodyIndex<'_> {
    /// [`crate::wire::count_elements`] summed over the elements.
    pub fn elements(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// The hint for the next body of the same conversation (elements whose probe had escapes are left
    /// out: they are scanned again).
    pub fn hint(&self, body: &[u8]) -> Hint {
        let Some(items) = &self.items else { return Vec::new() };
        let within = |r: &Range<usize>, v: &Option<Cow<'_, str>>| -> Option<Option<(u32, u32)>> {
            match v {
                None => Some(None),
                Some(Cow::Borrowed(t)) => {
                    let at = (t.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?.checked_sub(r.start)?;
                    Some(Some((u32::try_from(at).ok()?, u32::try_from(at + t.len()).ok()?)))
                }
                Some(Cow::Owned(_)) => None,
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (k, r) in items.iter().enumerate() {
            let (Ok(start), Ok(end)) = (u32::try_from(r.start), u32::try_from(r.end)) else { break };
            let (Some(role), Some(kind)) = (within(r, &self.probes[k].0), within(r, &self.probes[k].1)) else { continue };
            out.push(HintItem { start, end, key: self.keys[k], role, kind, count: self.counts[k] });
        }
        out
    }
}

/// The hint for a body, looked up once its first [`HINT_AFTER`] elements are scanned, by the bytes up to
/// their end.
pub type HintFor<'h> = &'h mut dyn FnMut(&[u8]) -> Option<Arc<Hint>>;

/// How many elements are scanned before the hint is looked up (the system prompt and the first prompt:
/// what tells one conversation from another).
pub const HINT_AFTER: usize = 2;

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
    /// `{`, `[` and `,` seen outside strings so far (an element's count is what it adds).
    count: u64,
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
                    self.count += 1;
                }
                b',' => self.count += 1,
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

    /// The message list: each element's range, probe, key and count (an element the hint has taken as
    /// it is).
    fn list(&mut self, out: &mut BodyIndex<'a>, hint_for: HintFor<'_>) -> Option<()> {
        let (mut items, mut hint, mut at) = (Vec::new(), None::<Arc<Hint>>, 0);
        self.array(|s| {
            let start = s.i;
            if let Some((end, key, probe, count)) = hint.as_deref().and_then(|h| hinted(h, &mut at, s.b, start)) {
                s.i = end;
                out.probes.push(probe);
                out.keys.push(key);
                out.counts.push(count);
            } else {
                let before = s.count;
                out.probes.push(s.element()?);
                out.keys.push(crate::wire::item_key(&s.b[start..s.i]));
                out.counts.push(u32::try_from(s.count - before).ok()?);
            }
            items.push(start..s.i);
            if items.len() == HINT_AFTER {
                hint = hint_for(&s.b[..s.i]);
            }
            Some(())
        })?;
        out.items = Some(items);
        Some(())
    }
}

/// The structure of `body` (valid JSON, checked by the caller) with `list_field` as its message list;
/// `None` for anything the scan does not expect (see the module's note).
/// `hint_for` gives the hint for the rest of the list once its first elements are scanned (see the
/// module's note; `&mut |_| None` for none).
pub fn index<'a>(body: &'a [u8], list_field: &str, hint_for: HintFor<'_>) -> Option<BodyIndex<'a>> {
    let mut s = Scan { b: body, i: 0, count: 0 };
    let mut out = BodyIndex { fields: Vec::new(), items: None, probes: Vec::new(), keys: Vec::new(), counts: Vec::new() };
    // Taken by the list: a second list, or one that is not an array, is left to the slower reading.
    let mut hint_for = Some(hint_for);
    s.object(|s, key| {
        let key = s.text(key)?;
        let start = s.i;
        if key == list_field {
            let hint_for = hint_for.take()?;
            (s.peek()? == b'[').then_some(())?;
            s.list(&mut out, hint_for)?;
        } else {
            s.value()?;
        }
        out.fields.push((key.into_owned(), start..s.i));
        Some(())
    })?;
    s.ws();
    (s.i == body.len()).then_some(out)
}

/// The ranges of the elements of the JSON array `list` (valid JSON, checked by the caller, or JSON serve
/// wrote itself); `None` for anything else.
pub fn elements(list: &[u8]) -> Option<Vec<Range<usize>>> {
    let mut s = Scan { b: list, i: 0, count: 0 };
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
        let ix = index(body.as_bytes(), list, &mut |_| None).expect("scanned");
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).unwrap();
        let names: Vec<&str> = ix.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, v.keys().map(String::as_str).collect::<Vec<_>>(), "{body}");
        for (k, r) in &ix.fields {
            let parsed: serde_json::Value = serde_json::from_str(&body[r.clone()]).unwrap();
            assert_eq!(parsed, v[k], "{k} in {body}");
        }
        let items = ix.items.clone().unwrap();
        let elems = v[list].as_array().unwrap();
        assert_eq!(items.len(), elems.len());
        for ((r, e), (role, kind)) in items.iter().zip(elems).zip(&ix.probes) {
            let parsed: serde_json::Value = serde_json::from_str(&body[r.clone()]).unwrap();
            assert_eq!(&parsed, e);
            assert_eq!(role.as_deref(), e["role"].as_str());
            assert_eq!(kind.as_deref(), e["type"].as_str());
        }
        assert_eq!(ix.elements(), items.iter().map(|r| count_elements(&body.as_bytes()[r.clone()])).sum::<u64>(), "{body}");
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
        let ix = index(body.as_bytes(), "messages", &mut |_| None).unwrap();
        let fields: Vec<(&str, &str)> = ix.fields.iter().map(|(k, r)| (k.as_str(), &body[r.clone()])).collect();
        assert_eq!(fields, [("messages", "[]"), ("x", "1"), ("x", "[2]")]);
    }

    /// A conversation's bodies: `n` messages after a system prompt, the tool outputs long, with escapes.
    fn conversation(n: usize, spacing: &str) -> String {
        let mut items = vec![r#"{"role":"system","content":"be brief"}"#.to_string()];
        for k in 1..=n {
            items.push(match k % 3 {
                1 => format!(r#"{{"role":"user","content":"task {k}: \"fix\" it"}}"#),
                2 => format!(r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c{k}","type":"function","function":{{"name":"bash","arguments":"{{\"command\":\"ls {k}\"}}"}}}}]}}"#),
                _ => format!(r#"{{"role":"tool","tool_call_id":"c{}","content":"{}"}}"#, k - 1, "line\n".repeat(200)),
            });
        }
        format!(r#"{{"model":"m","messages":[{}],"tools":[{{"type":"function"}}]}}"#, items.join(spacing))
    }

    #[test]
    fn a_hint_takes_the_elements_it_names_and_changes_nothing_found() {
        let first = conversation(30, ",");
        let hint = Arc::new(index(first.as_bytes(), "messages", &mut |_| None).unwrap().hint(first.as_bytes()));
        assert_eq!(hint.len(), 31);
        fn with<'b>(body: &'b str, hint: &Arc<Hint>) -> Option<BodyIndex<'b>> {
            let mut asked = 0;
            let found = index(body.as_bytes(), "messages", &mut |opening| {
                asked += 1;
                assert!(body.as_bytes().starts_with(opening));
                Some(hint.clone())
            });
            assert_eq!(asked, 1, "the hint is looked up once, after the opening");
            found
        }
        for next in [
            conversation(32, ","),
            // An element changed in the middle, spacing that moves every element after the first ones,
            // a body of another conversation.
            conversation(32, ",").replace("task 13:", "task 13 (again):"),
            conversation(32, " , "),
            conversation(5, ","),
            r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"z"}]}"#.to_string(),
        ] {
            assert_eq!(with(&next, &hint), index(next.as_bytes(), "messages", &mut |_| None), "{next}");
        }
        // The hint is taken where the bytes are the same: a forged count shows in the total; a forged key
        // is not taken.
        let next = conversation(32, ",");
        let plain = index(next.as_bytes(), "messages", &mut |_| None).unwrap();
        let mut forged = (*hint).clone();
        forged[20].count += 1000;
        assert_eq!(with(&next, &Arc::new(forged.clone())).unwrap().elements(), plain.elements() + 1000);
        forged[20].key ^= 1;
        assert_eq!(with(&next, &Arc::new(forged)).unwrap(), plain);
        // A role written with an escape is left out of the hint (its text is not in the body as is).
        let escaped = r#"{"messages":[{"role":"us\u0065r","content":"x"},{"role":"assistant","content":"y"}]}"#;
        let ix = index(escaped.as_bytes(), "messages", &mut |_| None).unwrap();
        assert_eq!(ix.hint(escaped.as_bytes()).len(), 1);
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
            assert_eq!(index(body.as_bytes(), "messages", &mut |_| None), None, "{body}");
        }
        // Whatever it is given, it does not panic.
        let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a\"b"}]}],"x":[1,{"y":null}]}"#;
        for end in 0..body.len() {
            let _ = index(&body[..end], "messages", &mut |_| None);
        }
        assert!(index(body, "messages", &mut |_| None).is_some());
    }
}
