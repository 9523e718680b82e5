//! A request's message list as the client wrote it: its elements split into units (the elements that
//! make one or more neutral messages), their keys and probes, and their reading into neutral messages.

use super::*;

/// The fields of an element that decide how it groups, read without parsing the rest.
#[derive(serde::Deserialize)]
pub(crate) struct Probe<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// The wire roles a unit tells apart, by the number a [`Unit`] keeps (roles come from a small set;
/// anything else is `other`).
pub(crate) const ROLES: [&str; 9] = ["", "user", "assistant", "system", "developer", "tool", "function", "model", "other"];

/// The number of role `r` in [`ROLES`] (`other` for any role not named there, `""` for none).
pub(crate) fn role_number(r: Option<&str>) -> u8 {
    match r {
        None => 0,
        Some(r) => ROLES.iter().position(|&n| n == r && !n.is_empty()).unwrap_or(ROLES.len() - 1) as u8,
    }
}

/// Consecutive list elements that make one or more neutral messages, as the client sent them: an
/// Anthropic message (tool results and text split into several), a Chat message, a run of Responses
/// items the model produced (one assistant message), or another Responses item.
///
/// Kept small (24 bytes), since a request holds one per message it sends while it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Index of its first element in the list.
    start: u32,
    /// Number of elements.
    len: u32,
    /// A fast key of the elements' JSON text: equal text, equal key.
    pub key: u64,
    /// The wire role of its first element (Anthropic merges adjacent messages of one role), by its number
    /// in [`ROLES`].
    role: u8,
    /// Whether its text mentions `cache_control` (it is then always read in full, so the marks come off).
    pub marked: bool,
}

impl Unit {
    /// Index of its first element in the list.
    pub fn start(&self) -> usize {
        self.start as usize
    }

    /// Index of the element after its last.
    pub fn end(&self) -> usize {
        self.start as usize + self.len as usize
    }

    /// Its elements' indices in the list.
    pub fn elements(&self) -> std::ops::Range<usize> {
        self.start()..self.end()
    }

    /// The wire role of its first element (`user`, `assistant`, `system`, `developer`, `tool`,
    /// `function`, `other` for any other, `""` for none).
    pub fn role(&self) -> &'static str {
        ROLES[usize::from(self.role)]
    }
}

/// A request's message list, split into units without reading the messages themselves. The elements are
/// byte ranges of the request body, which the request keeps (nothing is copied).
#[derive(Debug, Default)]
pub struct RawRequest {
    /// The request body.
    pub buf: bytes::Bytes,
    /// Every element of the list, as a range of `buf`.
    pub items: Vec<std::ops::Range<usize>>,
    /// How many leading elements are the system prompt (Chat, Responses).
    pub system: usize,
    /// The conversation's units, in order.
    pub units: Vec<Unit>,
}

impl RawRequest {
    /// Element `i` as the client wrote it.
    pub fn item(&self, i: usize) -> &[u8] {
        &self.buf[self.items[i].clone()]
    }

    /// The elements `from..to` as the client wrote them.
    pub fn slice(&self, from: usize, to: usize) -> Vec<&[u8]> {
        (from..to).map(|i| self.item(i)).collect()
    }

    /// The elements `from..to`, as a piece of a list to write ([`write_list`]).
    pub fn piece(&self, from: usize, to: usize) -> Piece<'_> {
        Piece::Raw(&self.buf, &self.items[from..to])
    }
}

/// Splits a request's message list into units, reading only each element's role and type. `items` are
/// the elements' ranges in `buf`.
pub fn split_units(api: Api, buf: bytes::Bytes, items: Vec<std::ops::Range<usize>>) -> Result<RawRequest, WireError> {
    let mut probes: Vec<(u8, bool)> = Vec::with_capacity(items.len());
    for (i, r) in items.iter().enumerate() {
        let p: Probe<'_> = serde_json::from_slice(&buf[r.clone()]).map_err(|_| werr(format!("{}[{i}]", api.list_field()), "expected an object"))?;
        probes.push(probe_of(api, i, p.role.as_deref(), p.kind.as_deref())?);
    }
    let keys: Vec<u64> = items.iter().map(|r| item_key(&buf[r.clone()])).collect();
    split_keyed(api, buf, items, probes, keys)
}

/// [`split_units`] of what the body's scan found ([`crate::scan::index`]): the elements' ranges, their
/// `role` and `type`, and their keys.
pub fn split_scanned(api: Api, buf: bytes::Bytes, items: Vec<std::ops::Range<usize>>, probes: &[crate::scan::Probe<'_>], keys: Vec<u64>) -> Result<RawRequest, WireError> {
    let probes = probes.iter().enumerate().map(|(i, (role, kind))| probe_of(api, i, role.as_deref(), kind.as_deref())).collect::<Result<Vec<_>, _>>()?;
    split_keyed(api, buf, items, probes, keys)
}

/// How element `i` groups, by its `role` and `type`: its role's number and whether the model wrote it.
fn probe_of(api: Api, i: usize, role: Option<&str>, kind: Option<&str>) -> Result<(u8, bool), WireError> {
    // (A Gemini content without a role is the user's.)
    if matches!(api, Api::Anthropic | Api::Chat) && role.is_none() {
        return Err(werr(format!("{}[{i}]", api.list_field()), "`role` is missing"));
    }
    let assistant_side = match kind {
        Some("message") => role == Some("assistant"),
        Some(t) => !t.ends_with("_output") && !matches!(t, "item_reference" | "compaction" | "compaction_summary"),
        None => role == Some("assistant"),
    };
    Ok((role_number(role), assistant_side))
}

/// The key of a list element: a hash of its bytes as the client wrote them.
pub fn item_key(text: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(text);
    h.finish()
}

/// The units of the elements `items` of `buf`, each element's probe ([`probe_of`]) and key
/// ([`item_key`]) known.
fn split_keyed(api: Api, buf: bytes::Bytes, items: Vec<std::ops::Range<usize>>, probes: Vec<(u8, bool)>, keys: Vec<u64>) -> Result<RawRequest, WireError> {
    use std::hash::Hasher;
    // A list's element indices are kept in 32 bits (4 G elements would take a body of 8 GB first).
    if u32::try_from(items.len()).is_err() {
        return Err(werr(api.list_field().to_string(), format!("{} elements are more than a list may hold here", items.len())));
    }
    let mut req = RawRequest { system: 0, units: Vec::new(), items: Vec::new(), buf: bytes::Bytes::new() };
    if matches!(api, Api::Chat | Api::Responses) {
        req.system = probes.iter().take_while(|(r, _)| matches!(ROLES[usize::from(*r)], "system" | "developer")).count();
    }
    // At most one unit per item: room for them at once, not by doubling.
    req.units.reserve_exact(items.len() - req.system);
    let cache_mark = memchr::memmem::Finder::new(b"cache_control");
    let mut i = req.system;
    while i < items.len() {
        let mut j = i + 1;
        if api == Api::Responses && probes[i].1 {
            while j < items.len() && probes[j].1 {
                j += 1;
            }
        }
        let mut h = rustc_hash::FxHasher::default();
        for k in &keys[i..j] {
            h.write_u64(*k);
        }
        let marked = items[i..j].iter().any(|r| cache_mark.find(&buf[r.clone()]).is_some());
        // Both under the list's length, which fits 32 bits (above).
        req.units.push(Unit { start: i as u32, len: (j - i) as u32, key: h.finish(), role: probes[i].0, marked });
        i = j;
    }
    req.items = items;
    req.buf = buf;
    Ok(req)
}

/// Calls `f` with each element of the JSON array `list`, in order, as the array is read: a list of many
/// elements never stands whole as a list of pieces (16 bytes an element, doubled as it grows). An error
/// `f` gives stops the reading and comes back as the error.
pub fn each_element<'a>(list: &'a [u8], f: impl FnMut(&'a RawValue) -> Result<(), String>) -> serde_json::Result<()> {
    struct Elements<F>(F);
    impl<'de, F: FnMut(&'de RawValue) -> Result<(), String>> serde::de::Visitor<'de> for Elements<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            while let Some(item) = seq.next_element::<&'de RawValue>()? {
                (self.0)(item).map_err(serde::de::Error::custom)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(list);
    serde::Deserializer::deserialize_seq(&mut de, Elements(f))?;
    de.end()
}

/// How many JSON values `text` opens or separates outside its strings (each `{`, `[` and `,`): what the
/// memory of recording a request grows with beyond its bytes, whatever its shape (messages, content
/// blocks, the values of a call's input), counted in one pass without parsing.
pub fn count_elements(text: &[u8]) -> u64 {
    let commas = |span: &[u8]| memchr::memchr_iter(b',', span).count() as u64;
    let mut n = 0;
    let mut at = 0;
    while let Some(k) = memchr::memchr3(b'"', b'{', b'[', &text[at..]).map(|k| at + k) {
        n += commas(&text[at..k]);
        at = k + 1;
        if text[k] != b'"' {
            n += 1;
            continue;
        }
        // Past the string: its end is the first quote after an even run of backslashes (none counts).
        loop {
            let Some(q) = memchr::memchr(b'"', &text[at..]).map(|q| at + q) else { return n };
            let escaped = text[at..q].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1;
            at = q + 1;
            if !escaped {
                break;
            }
        }
    }
    n + commas(&text[at..])
}

/// How many cache marks a request body holds (a mention of the key in a text counts too: the count errs
/// high).
pub fn cache_marks(body: &[u8]) -> usize {
    memchr::memmem::find_iter(body, b"\"cache_control\"").count()
}

/// Splits a list given as JSON values (tests and tools; serve passes the request body itself).
pub fn split_values(api: Api, list: &[Value]) -> Result<RawRequest, WireError> {
    let mut buf = Vec::new();
    let mut items = Vec::with_capacity(list.len());
    for v in list {
        let start = buf.len();
        serde_json::to_writer(&mut buf, v).expect("JSON of a value");
        items.push(start..buf.len());
    }
    split_units(api, bytes::Bytes::from(buf), items)
}

/// Reads unit `u` in full: its neutral messages (each keeping its wire JSON) and its cache marks (indices
/// into the unit's messages). Tool results name no tool yet when their call is in another unit.
pub fn parse_unit(api: Api, req: &RawRequest, u: usize) -> Result<WireRequest, WireError> {
    let unit = &req.units[u];
    let mut values = Vec::with_capacity(unit.elements().len());
    for k in unit.elements() {
        values.push(serde_json::from_slice::<Value>(req.item(k)).map_err(|e| werr(format!("{}[{k}]", api.list_field()), e.to_string()))?);
    }
    parse_from(api, values, unit.start(), false)
}

/// The neutral messages of unit `u`, the same as [`parse_unit`]'s, without its wire JSON: the lists an
/// element holds many of (content parts and blocks, Chat's tool calls) are read one element at a time and
/// each is dropped once converted, so a message of many small parts never stands whole as a JSON tree
/// (~470 bytes a part, against its ~30 bytes of text). A unit with cache marks, or one this reading
/// refuses, is read by [`parse_unit`], so the errors are its own.
pub fn unit_messages(api: Api, req: &RawRequest, u: usize) -> Result<Vec<Message>, WireError> {
    let unit = &req.units[u];
    if !unit.marked {
        if let Ok(out) = lean_unit(api, req, unit) {
            return Ok(out.messages.into_iter().map(|wm| wm.message).collect());
        }
    }
    Ok(parse_unit(api, req, u)?.messages.into_iter().map(|wm| wm.message).collect())
}

/// [`unit_messages`] of a unit without cache marks (nothing to take off): messages with no wire JSON.
pub(crate) fn lean_unit(api: Api, req: &RawRequest, unit: &Unit) -> Result<WireRequest, WireError> {
    let mut out = WireRequest::default();
    if api == Api::Gemini {
        // (Read by `parse_unit`: a Gemini content's parts are few.)
        return Err(werr(format!("contents[{}]", unit.start()), "read in full"));
    }
    let mut prev_assistant = false;
    for k in unit.elements() {
        let at = format!("{}[{k}]", api.list_field());
        let Shallow { mut obj, content, tool_calls } = Shallow::read(req.item(k)).map_err(|e| werr(at.clone(), e.to_string()))?;
        if api == Api::Anthropic {
            let blocks = match content {
                Some(raw) => Content::Raw(raw),
                None => Content::Value(obj.remove("content")),
            };
            anthropic_message(&mut out, k, obj, blocks, false)?;
            continue;
        }
        let obj = Value::Object(obj);
        if api == Api::Chat {
            let message = chat_message(&obj, field(&obj, "content", &content), field(&obj, "tool_calls", &tool_calls), &at)?;
            out.messages.push(WireMessage { message, wire: k, envelope: Map::new(), parts: Vec::new() });
        } else {
            let item = responses_item(&obj, field(&obj, "content", &content), &at)?;
            responses_push(&mut out, item, k, None, &mut prev_assistant);
        }
    }
    name_results(&mut out.messages);
    Ok(out)
}

/// Field `key` of `obj` as the conversions read it: its list kept as text when there is one (`raw`).
pub(crate) fn field<'v, 'a>(obj: &'v Value, key: &str, raw: &'v Option<Vec<&'a RawValue>>) -> Field<'v, 'a> {
    match raw {
        Some(raw) => Field::Raw(raw),
        None => Field::Value(obj.get(key)),
    }
}

/// A JSON object's fields in the client's order (a repeated key as often as it is written), each borrowed
/// as the client's JSON text.
pub struct Fields<'a>(pub Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fields<'de>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A list element read one level deep: its fields as values, except `content` and `tool_calls` when they
/// are lists, which are kept as their elements' JSON text (see [`unit_messages`]).
pub(crate) struct Shallow<'a> {
    /// The element without the lists kept as text.
    obj: Map<String, Value>,
    content: Option<Vec<&'a RawValue>>,
    tool_calls: Option<Vec<&'a RawValue>>,
}

impl<'a> Shallow<'a> {
    /// Reads element `text` ([`Fields`], then each field but the lists).
    fn read(text: &'a [u8]) -> serde_json::Result<Shallow<'a>> {
        let Fields(fields) = serde_json::from_slice(text)?;
        let mut s = Shallow { obj: Map::new(), content: None, tool_calls: None };
        // A repeated key counts as its last value, as in a `Value` (which keeps the first place).
        for (key, raw) in fields {
            let slot = match key.as_str() {
                "content" => &mut s.content,
                "tool_calls" => &mut s.tool_calls,
                _ => {
                    s.obj.insert(key, serde_json::from_str(raw.get())?);
                    continue;
                }
            };
            if raw.get().starts_with('[') {
                s.obj.remove(&key);
                *slot = Some(serde_json::from_str(raw.get())?);
            } else {
                *slot = None;
                s.obj.insert(key, serde_json::from_str(raw.get())?);
            }
        }
        Ok(s)
    }
}

/// A field of a list element that can hold many values: as read, or a list's elements as their JSON text
/// (see [`unit_messages`]).
#[derive(Clone, Copy)]
pub(crate) enum Field<'v, 'a> {
    Value(Option<&'v Value>),
    Raw(&'v [&'a RawValue]),
}

impl<'v> Field<'v, '_> {
    /// The field's value, unless it is a list kept as text.
    pub(crate) fn value(self) -> Option<&'v Value> {
        match self {
            Field::Value(v) => v,
            Field::Raw(_) => None,
        }
    }

    /// `f` of each element of a list field, in order (none for another field); an element kept as text
    /// is read just before and dropped after. Only such a reading fails (`at` names the field). The list
    /// is made with room for every element at once (collected from results it grew by doubling, the old
    /// and the new room alive together: a message of 200,000 parts held 28 MB of blocks for its 14).
    pub(crate) fn map_list<T>(self, at: &str, mut f: impl FnMut(usize, &Value) -> Result<T, WireError>) -> Result<Vec<T>, WireError> {
        let mut out = Vec::new();
        match self {
            Field::Value(Some(Value::Array(a))) => {
                out.reserve_exact(a.len());
                for (j, v) in a.iter().enumerate() {
                    out.push(f(j, v)?);
                }
            }
            Field::Raw(raw) => {
                out.reserve_exact(raw.len());
                for (j, t) in raw.iter().enumerate() {
                    out.push(f(j, &read_raw(t, at, j)?)?);
                }
            }
            Field::Value(_) => {}
        }
        Ok(out)
    }
}

pub(crate) fn read_raw(t: &RawValue, at: &str, j: usize) -> Result<Value, WireError> {
    serde_json::from_str(t.get()).map_err(|e| werr(format!("{at}[{j}]"), e.to_string()))
}

/// An Anthropic message's `content`: as read, or its blocks as their JSON text (see [`unit_messages`]).
pub(crate) enum Content<'a> {
    Value(Option<Value>),
    Raw(Vec<&'a RawValue>),
}

/// Neutral blocks of a `content` that is a string or a list of parts (Chat, Responses): `image` reads a
/// part as an image when it is one; any other part is its text, or an opaque block holding its JSON when
/// it has none (a file, audio: sent back as written; recovery fails closed on it).
pub(crate) fn content_blocks(content: Field<'_, '_>, at: &str, image: impl Fn(&Value) -> Option<Block>) -> Result<Vec<Block>, WireError> {
    if let Some(Value::String(s)) = content.value() {
        return Ok(vec![Block::Text { text: s.clone() }]);
    }
    content.map_list(&format!("{at}.content"), |_, p| {
        Ok(image(p).unwrap_or_else(|| match str_of(p, "text") {
            Some(text) => Block::Text { text: text.to_string() },
            None => Block::opaque(str_of(p, "type").unwrap_or("").to_string(), json_text(p)),
        }))
    })
}
