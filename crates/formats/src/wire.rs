//! The three provider wire formats of a live request, as `condense serve` meets them: Anthropic Messages,
//! OpenAI Chat Completions and OpenAI Responses. A request's message list is read into neutral messages,
//! each keeping the wire JSON it came from, so a message condense leaves unchanged can be forwarded exactly
//! as the client wrote it (fields condense does not model survive); a message condense changed is written
//! from the neutral model. Replies are read into one neutral assistant message plus the provider's usage.
//!
//! Leading system and developer messages of Chat and Responses requests are the system prompt: they are
//! not part of the conversation condense records, and stay in place. Anthropic's `cache_control` marks are
//! taken off the client's blocks and reported, so the caller can put them back where they belong in the
//! context it sends.

use crate::claude::{assistant_blocks, result_blocks};
use crate::json::{json_text, str_of};
use condense_events::{Block, Message, Usage, UserOrigin};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A provider API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    Chat,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
}

impl Api {
    /// The short name used in session names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::Chat => "chat",
            Api::Responses => "responses",
        }
    }

    /// The request field that holds the message list.
    pub fn list_field(self) -> &'static str {
        match self {
            Api::Anthropic | Api::Chat => "messages",
            Api::Responses => "input",
        }
    }
}

/// A request that cannot be read, with the place that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct WireError {
    /// Where, as a JSON path (`messages[3].content[1]`).
    pub at: String,
    /// What is wrong.
    pub reason: String,
}

fn werr(at: String, reason: impl Into<String>) -> WireError {
    WireError { at, reason: reason.into() }
}

/// One neutral message of a client request, with the wire JSON it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct WireMessage {
    /// The message in the neutral model.
    pub message: Message,
    /// Index of the wire message (or Responses item) it starts at.
    pub wire: usize,
    /// Message-level fields of its wire message other than `content` (Anthropic, Chat; `role` included);
    /// empty for Responses items.
    pub envelope: Map<String, Value>,
    /// Its wire content: Anthropic content blocks, one Chat message object, or Responses items.
    pub parts: Vec<Value>,
}

/// A client request's message list, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireRequest {
    /// Leading wire messages that are the system prompt (Chat, Responses); they stay in place.
    pub system: Vec<Value>,
    /// The conversation, in order.
    pub messages: Vec<WireMessage>,
    /// `cache_control` values taken off the client's blocks: (index into `messages`, value).
    pub cache_marks: Vec<(usize, Value)>,
}

/// A message of the context to send, in one API's wire form: borrowed from the client's request when it
/// goes out unchanged, owned when condense wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutMessage<'a> {
    /// Message-level fields (`role` included for Anthropic and Chat).
    pub envelope: Cow<'a, Map<String, Value>>,
    /// Wire content (see [`WireMessage::parts`]).
    pub parts: Cow<'a, [Value]>,
}

impl OutMessage<'_> {
    /// The wire role, when the API has one per message.
    pub fn role(&self) -> Option<&str> {
        self.envelope.get("role").and_then(Value::as_str)
    }

    /// The message held as JSON text (see [`Written`]).
    pub fn written(&self) -> Written {
        use serde_json::value::to_raw_value;
        Written {
            envelope: to_raw_value(&*self.envelope).expect("JSON of a map"),
            role: self.role().map(Box::from),
            parts: self.parts.iter().map(|p| to_raw_value(p).expect("JSON of a value")).collect(),
        }
    }
}

/// A message in wire form held as its JSON text, written as it would be written from its values: what a
/// message condense wrote (a stub, a summary, a result condense supplies) takes between the render and
/// the write, about a tenth of its form as values (a request of 100,000 calls without results held
/// 1.8 KB a result).
#[derive(Debug, Clone)]
pub struct Written {
    /// The message-level fields, as one JSON object.
    envelope: Box<RawValue>,
    /// The wire role, when the API has one per message.
    role: Option<Box<str>>,
    /// The wire content (see [`WireMessage::parts`]), each part as JSON.
    parts: Vec<Box<RawValue>>,
}

impl Written {
    /// The wire role, when the API has one per message.
    pub fn role(&self) -> Option<&str> {
        self.role.as_deref()
    }

    /// The bytes of JSON it holds.
    pub fn len(&self) -> usize {
        self.envelope.get().len() + self.role.as_ref().map_or(0, |r| r.len()) + self.parts.iter().map(|p| p.get().len()).sum::<usize>()
    }

    /// Whether it holds no JSON at all (never: its envelope is an object).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether any part's JSON text holds `needle`.
    pub fn mentions(&self, needle: &str) -> bool {
        self.parts.iter().any(|p| p.get().contains(needle))
    }

    /// The message as values again, for the few a write changes (a cache mark, a custom tool's output).
    pub fn expand(&self) -> OutMessage<'static> {
        let envelope: Map<String, Value> = serde_json::from_str(self.envelope.get()).expect("an object written from values");
        let parts = self.parts.iter().map(|p| serde_json::from_str(p.get()).expect("a value written from values")).collect();
        OutMessage { envelope: Cow::Owned(envelope), parts: Cow::Owned(parts) }
    }
}

impl WireMessage {
    /// The message as it goes out unchanged (borrowed, not copied).
    pub fn out(&self) -> OutMessage<'_> {
        OutMessage { envelope: Cow::Borrowed(&self.envelope), parts: Cow::Borrowed(&self.parts) }
    }
}

/// The non-blank texts of a message's blocks, trimmed (read in place: a message of many parts is asked
/// this of each part).
fn texts(blocks: &[Block]) -> impl Iterator<Item = &str> + Clone {
    blocks.iter().filter_map(|b| match b { Block::Text { text } => Some(text.trim()), _ => None }).filter(|t| !t.is_empty())
}

/// Whether a message is host context: it has text and every text of it is (`<system-reminder>`,
/// `<environment_context>`, AGENTS.md). A request's user message and a pi extension's message alike.
pub(crate) fn is_host_context(blocks: &[Block]) -> bool {
    all_host(texts(blocks))
}

/// Whether there are texts and every one is host context.
fn all_host<'a>(mut texts: impl Iterator<Item = &'a str> + Clone) -> bool {
    texts.clone().next().is_some() && texts.all(|t| condense_events::host_context_kind(t).is_some())
}

/// Why a user message is there: host context ([`is_host_context`]), injected when it is only other tags
/// (`<command-name>`), else a prompt.
fn origin_of(blocks: &[Block]) -> UserOrigin {
    let mut texts = texts(blocks);
    if texts.clone().next().is_none() {
        UserOrigin::Prompt
    } else if all_host(texts.clone()) {
        UserOrigin::Host
    } else if texts.all(|t| t.starts_with('<') && t.ends_with('>')) {
        UserOrigin::Injected
    } else {
        UserOrigin::Prompt
    }
}

/// Removes `cache_control` from a block (and from the blocks of its `content`); returns the last one.
fn take_cache_control(v: &mut Value) -> Option<Value> {
    let mut found = None;
    if let Value::Object(o) = v {
        if let Some(c) = o.remove("cache_control") {
            found = Some(c);
        }
        if let Some(Value::Array(inner)) = o.get_mut("content") {
            for b in inner {
                if let Some(c) = take_cache_control(b) {
                    found = Some(c);
                }
            }
        }
    }
    found
}

/// Reads a request's message list (`messages`, or `input` for Responses), taking its values (the wire
/// JSON moves into the messages, uncopied).
pub fn parse_request(api: Api, list: Vec<Value>) -> Result<WireRequest, WireError> {
    parse_from(api, list, 0, true)
}

/// Reads list elements that start at index `first`; `prefix` takes leading system and developer messages
/// as the system prompt.
fn parse_from(api: Api, list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    match api {
        Api::Anthropic => parse_anthropic(list, first),
        Api::Chat => parse_chat(list, first, prefix),
        Api::Responses => parse_responses(list, first, prefix),
    }
}

/// The fields of an element that decide how it groups, read without parsing the rest.
#[derive(serde::Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// The wire roles a unit tells apart, by the number a [`Unit`] keeps (roles come from a small set;
/// anything else is `other`).
const ROLES: [&str; 8] = ["", "user", "assistant", "system", "developer", "tool", "function", "other"];

/// The number of role `r` in [`ROLES`] (`other` for any role not named there, `""` for none).
fn role_number(r: Option<&str>) -> u8 {
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
    split_probed(api, buf, items, probes)
}

/// How element `i` groups, by its `role` and `type`: its role's number and whether the model wrote it.
pub fn probe_of(api: Api, i: usize, role: Option<&str>, kind: Option<&str>) -> Result<(u8, bool), WireError> {
    if api != Api::Responses && role.is_none() {
        return Err(werr(format!("{}[{i}]", api.list_field()), "`role` is missing"));
    }
    let assistant_side = match kind {
        Some("message") => role == Some("assistant"),
        Some(t) => !t.ends_with("_output") && !matches!(t, "item_reference" | "compaction" | "compaction_summary"),
        None => role == Some("assistant"),
    };
    Ok((role_number(role), assistant_side))
}

/// [`split_units`] with each element's [`probe_of`] already known (serve finds them as it scans the
/// body: `crate::scan`).
pub fn split_probed(api: Api, buf: bytes::Bytes, items: Vec<std::ops::Range<usize>>, probes: Vec<(u8, bool)>) -> Result<RawRequest, WireError> {
    let keys: Vec<u64> = items.iter().map(|r| item_key(&buf[r.clone()])).collect();
    split_keyed(api, buf, items, probes, keys)
}

/// The key of a list element: a hash of its bytes as the client wrote them.
pub fn item_key(text: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(text);
    h.finish()
}

/// [`split_probed`] with each element's [`item_key`] already known.
pub fn split_keyed(api: Api, buf: bytes::Bytes, items: Vec<std::ops::Range<usize>>, probes: Vec<(u8, bool)>, keys: Vec<u64>) -> Result<RawRequest, WireError> {
    use std::hash::Hasher;
    // A list's element indices are kept in 32 bits (4 G elements would take a body of 8 GB first).
    if u32::try_from(items.len()).is_err() {
        return Err(werr(api.list_field().to_string(), format!("{} elements are more than a list may hold here", items.len())));
    }
    let mut req = RawRequest { system: 0, units: Vec::new(), items: Vec::new(), buf: bytes::Bytes::new() };
    if api != Api::Anthropic {
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
fn lean_unit(api: Api, req: &RawRequest, unit: &Unit) -> Result<WireRequest, WireError> {
    let mut out = WireRequest::default();
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
fn field<'v, 'a>(obj: &'v Value, key: &str, raw: &'v Option<Vec<&'a RawValue>>) -> Field<'v, 'a> {
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
struct Shallow<'a> {
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
enum Field<'v, 'a> {
    Value(Option<&'v Value>),
    Raw(&'v [&'a RawValue]),
}

impl<'v> Field<'v, '_> {
    /// The field's value, unless it is a list kept as text.
    fn value(self) -> Option<&'v Value> {
        match self {
            Field::Value(v) => v,
            Field::Raw(_) => None,
        }
    }

    /// `f` of each element of a list field, in order (none for another field); an element kept as text
    /// is read just before and dropped after. Only such a reading fails (`at` names the field). The list
    /// is made with room for every element at once (collected from results it grew by doubling, the old
    /// and the new room alive together: a message of 200,000 parts held 28 MB of blocks for its 14).
    fn map_list<T>(self, at: &str, mut f: impl FnMut(usize, &Value) -> Result<T, WireError>) -> Result<Vec<T>, WireError> {
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

fn read_raw(t: &RawValue, at: &str, j: usize) -> Result<Value, WireError> {
    serde_json::from_str(t.get()).map_err(|e| werr(format!("{at}[{j}]"), e.to_string()))
}

/// An Anthropic message's `content`: as read, or its blocks as their JSON text (see [`unit_messages`]).
enum Content<'a> {
    Value(Option<Value>),
    Raw(Vec<&'a RawValue>),
}

/// Neutral blocks of one block of Anthropic assistant content, read without taking the block apart.
fn assistant_block(b: &Value, out: &mut Vec<Block>) {
    match str_of(b, "type") {
        Some("text") => out.push(Block::Text { text: str_of(b, "text").unwrap_or("").to_string() }),
        Some("tool_use" | "server_tool_use") => out.push(Block::tool_call(
            str_of(b, "id").unwrap_or("").to_string(),
            str_of(b, "name").unwrap_or("").to_string(),
            b.get("input").map_or_else(|| "{}".to_string(), json_text),
        )),
        _ => out.extend(assistant_blocks(Some(Value::Array(vec![b.clone()])), &mut |_| {})),
    }
}

fn parse_anthropic(list: Vec<Value>, first: usize) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    for (i, m) in list.into_iter().enumerate() {
        let i = first + i;
        let Value::Object(mut obj) = m else { return Err(werr(format!("messages[{i}]"), "expected an object")) };
        let content = Content::Value(obj.remove("content"));
        anthropic_message(&mut req, i, obj, content, true)?;
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// The neutral messages of Anthropic message `i` (its fields other than `content` in `envelope`), pushed
/// to `req` with its wire JSON when `keep`.
fn anthropic_message(req: &mut WireRequest, i: usize, envelope: Map<String, Value>, content: Content<'_>, keep: bool) -> Result<(), WireError> {
    let at = format!("messages[{i}]");
    let role = envelope.get("role").and_then(Value::as_str).ok_or_else(|| werr(at.clone(), "`role` is missing"))?.to_string();
    let string_content = matches!(content, Content::Value(Some(Value::String(_))));
    let (values, raw) = match content {
        Content::Value(Some(Value::String(s))) => (vec![json!({"type": "text", "text": s})], Vec::new()),
        Content::Value(Some(Value::Array(a))) => (a, Vec::new()),
        Content::Raw(raw) => (Vec::new(), raw),
        _ => return Err(werr(at, "`content` must be a string or a list of blocks")),
    };
    let user = match role.as_str() {
        "assistant" => false,
        "user" | "system" => true,
        other => return Err(werr(at, format!("unknown role `{other}`"))),
    };
    let push = |req: &mut WireRequest, message: Message, parts: Vec<Value>| {
        // A string content goes out as it came: a one-block list would change the bytes.
        let (envelope, parts) = match (keep, string_content) {
            (false, _) => (Map::new(), Vec::new()),
            (true, true) => (envelope.clone(), vec![Value::String(message.text())]),
            (true, false) => (envelope.clone(), parts),
        };
        req.messages.push(WireMessage { message, wire: i, envelope, parts });
    };
    let first = req.messages.len();
    let mut mark = None;
    // The blocks gathered for the next message: neutral, and as the client wrote them (when kept). An
    // assistant message is one; a user message is split at each tool result.
    let mut run: (Vec<Block>, Vec<Value>) = Default::default();
    if !user {
        // One message of every block: room for them at once, not by doubling.
        run.0.reserve_exact(values.len() + raw.len());
    }
    let flush = |req: &mut WireRequest, run: &mut (Vec<Block>, Vec<Value>)| {
        if run.0.is_empty() && user {
            return;
        }
        let content = std::mem::take(&mut run.0);
        let message = match (user, role.as_str()) {
            (false, _) => Message::Assistant { content, model: None, stop: None, usage: None },
            (true, "system") => Message::User { content, origin: UserOrigin::Host },
            (true, _) => {
                let origin = origin_of(&content);
                Message::User { content, origin }
            }
        };
        push(req, message, std::mem::take(&mut run.1));
    };
    let content_at = format!("{at}.content");
    let blocks = values.into_iter().map(Ok).chain(raw.iter().enumerate().map(|(j, t)| read_raw(t, &content_at, j)));
    for (j, b) in blocks.enumerate() {
        let mut b = b?;
        if !b.is_object() || str_of(&b, "type").is_none() {
            return Err(werr(format!("{at}.content[{j}]"), "expected a block object with a `type`"));
        }
        if let Some(c) = take_cache_control(&mut b) {
            mark = Some(c);
        }
        if !user {
            assistant_block(&b, &mut run.0);
        } else if str_of(&b, "type") == Some("tool_result") {
            flush(req, &mut run);
            let call_id = str_of(&b, "tool_use_id").unwrap_or("").to_string();
            let content = result_blocks(b.get("content").cloned(), &mut |_| {});
            let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
            push(req, Message::ToolResult { call_id, tool_name: String::new(), content, is_error }, vec![b]);
            continue;
        } else {
            run.0.push(user_block(&b));
        }
        if keep {
            run.1.push(b);
        }
    }
    flush(req, &mut run);
    if let (Some(c), true) = (mark, req.messages.len() > first) {
        req.cache_marks.push((req.messages.len() - 1, c));
    }
    Ok(())
}

/// The neutral block of a block of Anthropic user content: text and images; anything else is an opaque
/// block holding its JSON (sent back as written; recovery fails closed on it).
fn user_block(b: &Value) -> Block {
    match str_of(b, "type") {
        Some("text") => Block::Text { text: str_of(b, "text").unwrap_or("").to_string() },
        Some("image") => crate::claude::image(&mut b.clone()),
        other => Block::opaque(other.unwrap_or("").to_string(), json_text(b)),
    }
}

/// Tool results of Anthropic and Chat name no tool: take the name from the call they answer.
pub fn name_results(messages: &mut [WireMessage]) {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for wm in messages.iter_mut() {
        match &mut wm.message {
            Message::Assistant { .. } => {
                for (id, name, _) in wm.message.tool_calls() {
                    names.insert(id.to_string(), name.to_string());
                }
            }
            Message::ToolResult { call_id, tool_name, .. } if tool_name.is_empty() => {
                if let Some(n) = names.get(call_id) {
                    *tool_name = n.clone();
                }
            }
            _ => {}
        }
    }
}

/// Neutral blocks of a `content` that is a string or a list of parts (Chat, Responses): `image` reads a
/// part as an image when it is one; any other part is its text, or an opaque block holding its JSON when
/// it has none (a file, audio: sent back as written; recovery fails closed on it).
fn content_blocks(content: Field<'_, '_>, at: &str, image: impl Fn(&Value) -> Option<Block>) -> Result<Vec<Block>, WireError> {
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

/// Neutral blocks of a Chat message's `content`.
fn chat_text(content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    content_blocks(content, at, |p| match (str_of(p, "type"), p.get("image_url")) {
        (Some("image_url"), Some(u)) => Some(crate::codex::url_image(u.get("url").and_then(Value::as_str).or(u.as_str()).unwrap_or("").to_string())),
        _ => None,
    })
}

fn parse_chat(list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    let mut in_prefix = prefix;
    for (i, mut part) in list.into_iter().enumerate() {
        let i = first + i;
        let at = format!("messages[{i}]");
        let Value::Object(obj) = &part else { return Err(werr(at, "expected an object")) };
        let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| werr(at.clone(), "`role` is missing"))?;
        if in_prefix && matches!(role, "system" | "developer") {
            req.system.push(part);
            continue;
        }
        in_prefix = false;
        let mark = take_cache_control(&mut part);
        let message = chat_message(&part, Field::Value(part.get("content")), Field::Value(part.get("tool_calls")), &at)?;
        if let Some(c) = mark {
            req.cache_marks.push((req.messages.len(), c));
        }
        req.messages.push(WireMessage { message, wire: i, envelope: Map::new(), parts: vec![part] });
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// The neutral message of a Chat message `obj` at `at`, whose `content` and `tool_calls` are given apart.
fn chat_message(obj: &Value, content: Field<'_, '_>, calls: Field<'_, '_>, at: &str) -> Result<Message, WireError> {
    let role = str_of(obj, "role").ok_or_else(|| werr(at.to_string(), "`role` is missing"))?;
    Ok(match role {
        "user" => {
            let content = chat_text(content, at)?;
            let origin = origin_of(&content);
            Message::User { content, origin }
        }
        "system" | "developer" => Message::User { content: chat_text(content, at)?, origin: UserOrigin::Host },
        "assistant" => {
            let mut content = chat_text(content, at)?;
            if matches!(calls.value(), Some(v) if !v.is_array()) {
                return Err(werr(format!("{at}.tool_calls"), "expected a list"));
            }
            let calls = calls.map_list(&format!("{at}.tool_calls"), |j, c| {
                let f = c.get("function").ok_or_else(|| werr(format!("{at}.tool_calls[{j}]"), "`function` is missing"))?;
                Ok(Block::tool_call(
                    str_of(c, "id").unwrap_or("").to_string(),
                    str_of(f, "name").unwrap_or("").to_string(),
                    match f.get("arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => json_text(v),
                        None => "{}".into(),
                    },
                ))
            })?;
            // A reply of calls alone (most of them) keeps the calls' list rather than copying it.
            if content.is_empty() {
                content = calls;
            } else {
                content.extend(calls);
            }
            Message::Assistant { content, model: None, stop: None, usage: None }
        }
        "tool" | "function" => Message::ToolResult {
            call_id: str_of(obj, "tool_call_id").unwrap_or("").to_string(),
            tool_name: str_of(obj, "name").unwrap_or("").to_string(),
            content: chat_text(content, at)?,
            is_error: false,
        },
        other => return Err(werr(at.to_string(), format!("unknown role `{other}`"))),
    })
}

/// Whether a Responses item is the model's own (it groups into one assistant message with its neighbours).
fn assistant_item(item: &Value) -> bool {
    match str_of(item, "type") {
        Some("message") => str_of(item, "role") == Some("assistant"),
        Some(t) => !t.ends_with("_output") && !matches!(t, "item_reference" | "compaction" | "compaction_summary"),
        None => str_of(item, "role") == Some("assistant"),
    }
}

/// Neutral blocks of a Responses message item's `content`.
fn responses_content(content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    content_blocks(content, at, |p| (str_of(p, "type") == Some("input_image")).then(|| crate::codex::url_image(str_of(p, "image_url").unwrap_or("").to_string())))
}

/// The neutral blocks of one assistant-side Responses item, whose `content` is given apart.
fn responses_assistant_blocks(item: &Value, content: Field<'_, '_>, at: &str) -> Result<Vec<Block>, WireError> {
    Ok(match str_of(item, "type") {
        Some("message") | None => responses_content(content, at)?,
        Some("reasoning") => {
            let text: Vec<&str> = item
                .get("summary")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|p| str_of(p, "text")).collect())
                .unwrap_or_default();
            vec![Block::thinking(text.join("\n"), str_of(item, "encrypted_content").map(str::to_string))]
        }
        Some(t) => {
            let id = str_of(item, "call_id").or_else(|| str_of(item, "id")).unwrap_or("").to_string();
            let name = str_of(item, "name").map_or_else(|| t.trim_end_matches("_call").to_string(), str::to_string);
            let arguments = match (item.get("arguments"), item.get("input"), item.get("action")) {
                (Some(Value::String(a)), _, _) => a.clone(),
                (Some(a), _, _) => json_text(a),
                (None, Some(Value::String(i)), _) => i.clone(),
                (None, _, Some(action)) => json_text(action),
                _ => "{}".to_string(),
            };
            vec![Block::tool_call(id, name, arguments)]
        }
    })
}

/// What a Responses item reads as: blocks of the model's message it belongs to, or a message of its own.
enum ItemRead {
    Assistant(Vec<Block>),
    Message(Message),
}

/// Reads a Responses item (not of the system prefix) at `at`, whose `content` is given apart.
fn responses_item(item: &Value, content: Field<'_, '_>, at: &str) -> Result<ItemRead, WireError> {
    if assistant_item(item) {
        return Ok(ItemRead::Assistant(responses_assistant_blocks(item, content, at)?));
    }
    Ok(ItemRead::Message(match str_of(item, "type") {
        Some("message") | None => {
            let content = responses_content(content, at)?;
            let origin = match str_of(item, "role") {
                Some("user") => origin_of(&content),
                Some("system" | "developer") => UserOrigin::Host,
                Some(other) => return Err(werr(at.to_string(), format!("unknown role `{other}`"))),
                None => return Err(werr(at.to_string(), "a message item needs a `role`")),
            };
            Message::User { content, origin }
        }
        Some(t) if t.ends_with("_output") => {
            let (text, is_error) = crate::codex::output_text(item.get("output").cloned());
            Message::ToolResult { call_id: str_of(item, "call_id").unwrap_or("").to_string(), tool_name: String::new(), content: vec![Block::Text { text }], is_error }
        }
        Some(t) => Message::user_text(format!("[{t} item]"), UserOrigin::Summary),
    }))
}

/// Adds item `i`, read, to `req`: consecutive items of the model form one assistant message
/// (`prev_assistant`: the item before was one). `part` is its wire JSON, kept when given.
fn responses_push(req: &mut WireRequest, item: ItemRead, i: usize, part: Option<Value>, prev_assistant: &mut bool) {
    let (message, assistant) = match item {
        ItemRead::Assistant(blocks) => {
            if let (true, Some(last)) = (*prev_assistant, req.messages.last_mut()) {
                if let Message::Assistant { content, .. } = &mut last.message {
                    content.extend(blocks);
                    last.parts.extend(part);
                    return;
                }
            }
            (Message::Assistant { content: blocks, model: None, stop: None, usage: None }, true)
        }
        ItemRead::Message(m) => (m, false),
    };
    *prev_assistant = assistant;
    req.messages.push(WireMessage { message, wire: i, envelope: Map::new(), parts: part.into_iter().collect() });
}

fn parse_responses(list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    let mut req = WireRequest::default();
    let mut in_prefix = prefix;
    let mut prev_assistant = false;
    for (i, mut part) in list.into_iter().enumerate() {
        let i = first + i;
        let at = format!("input[{i}]");
        if !part.is_object() {
            return Err(werr(at, "expected an item object"));
        }
        if in_prefix && matches!(str_of(&part, "role"), Some("system" | "developer")) {
            req.system.push(part);
            continue;
        }
        in_prefix = false;
        let mark = take_cache_control(&mut part);
        let item = responses_item(&part, Field::Value(part.get("content")), &at)?;
        // Marks are kept on the items of a message of their own (the model's items keep none).
        if let (Some(c), ItemRead::Message(_)) = (mark, &item) {
            req.cache_marks.push((req.messages.len(), c));
        }
        responses_push(&mut req, item, i, Some(part), &mut prev_assistant);
    }
    name_results(&mut req.messages);
    Ok(req)
}

/// A message of a rendered context in `api`'s wire form, written from the neutral model; `None` when it
/// has nothing the API can carry (an assistant message of unsigned thinking only, for Anthropic).
pub fn from_neutral(api: Api, m: &Message) -> Option<OutMessage<'static>> {
    match api {
        Api::Anthropic => {
            // (The one message is taken out of the body written for it, not copied.)
            let mut body = crate::export::anthropic(std::slice::from_ref(&m));
            let Value::Object(mut o) = body.get_mut("messages")?.get_mut(0)?.take() else { return None };
            let parts = match o.remove("content") {
                Some(Value::Array(a)) => a,
                _ => return None,
            };
            Some(OutMessage { envelope: Cow::Owned(o), parts: Cow::Owned(parts) })
        }
        Api::Chat => {
            let v = crate::export::openai(std::slice::from_ref(&m)).get_mut(0)?.take();
            if v["role"] == "assistant" && v["content"].is_null() && v.get("tool_calls").is_none() {
                return None;
            }
            Some(OutMessage { envelope: Cow::Owned(Map::new()), parts: Cow::Owned(vec![v]) })
        }
        Api::Responses => {
            let Value::Array(items) = crate::export::responses(std::slice::from_ref(&m)) else { return None };
            (!items.is_empty()).then_some(OutMessage { envelope: Cow::Owned(Map::new()), parts: Cow::Owned(items) })
        }
    }
}

fn put(out: &mut Vec<u8>, v: &impl serde::Serialize) {
    serde_json::to_writer(&mut *out, v).expect("JSON of a value");
}

/// A piece of the message list to send: elements written exactly as the client sent them, or a message.
#[derive(Debug, Clone)]
pub enum Piece<'a> {
    /// List elements as the client wrote them (a whole unit, unchanged): their ranges in the body.
    Raw(&'a [u8], &'a [std::ops::Range<usize>]),
    /// A message in wire form (boxed: a list of many small unchanged units holds a piece each).
    Msg(Box<OutMessage<'a>>),
    /// A message in wire form held as JSON text (written as the same message in values would be); shared,
    /// as serve keeps what it wrote for a rendered message from one request to the next.
    Written(std::sync::Arc<Written>),
}

impl<'a> Piece<'a> {
    /// The wire role of a message piece, when the API has one per message.
    fn role(&self) -> Option<&str> {
        match self {
            Piece::Msg(m) => m.role(),
            Piece::Written(w) => w.role(),
            Piece::Raw(..) => None,
        }
    }

    /// The message of a message piece as values, to change (a written one is read back first).
    pub fn message_mut(&mut self) -> Option<&mut OutMessage<'a>> {
        if let Piece::Written(w) = self {
            *self = Piece::Msg(Box::new(w.expand()));
        }
        match self {
            Piece::Msg(m) => Some(m),
            _ => None,
        }
    }
}

/// A part of a message piece: a value, or the JSON text of one.
enum Part<'v> {
    Value(&'v Value),
    Text(&'v RawValue),
}

impl Part<'_> {
    /// Whether the part is a plain string (a client's `content` string) rather than a block: a JSON
    /// string's text starts with its quote, so the text is not read.
    fn is_string(&self) -> bool {
        match self {
            Part::Value(v) => v.is_string(),
            Part::Text(t) => t.get().starts_with('"'),
        }
    }

    /// The part's string, when it [is one](Part::is_string).
    fn string(&self) -> Option<Cow<'_, str>> {
        match self {
            Part::Value(Value::String(s)) => Some(Cow::Borrowed(s)),
            Part::Value(_) => None,
            Part::Text(t) => t.get().starts_with('"').then(|| serde_json::from_str(t.get()).ok()).flatten().map(Cow::Owned),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Part::Value(v) => put(out, v),
            Part::Text(t) => out.extend_from_slice(t.get().as_bytes()),
        }
    }
}

/// Writes the wire message list of `api` as JSON: the system prefix, then the pieces in order. For
/// Anthropic, adjacent messages of one role (user or assistant) are merged into one, as the API requires;
/// raw pieces are written as they are. Chat and Responses take every message as it is.
pub fn write_list(api: Api, system: &[&[u8]], pieces: &[Piece<'_>], headroom: usize) -> Vec<u8> {
    let size: usize = system.iter().map(|s| s.len() + 1).sum::<usize>()
        + pieces
            .iter()
            .map(|p| match p {
                Piece::Raw(_, items) => items.iter().map(|i| i.len() + 1).sum(),
                Piece::Msg(_) => 512,
                Piece::Written(w) => w.envelope.get().len() + w.parts.iter().map(|p| p.get().len() + 1).sum::<usize>() + 16,
            })
            .sum::<usize>();
    let mut out = Vec::with_capacity(size + 16 + headroom);
    out.push(b'[');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    for v in system {
        sep(&mut out);
        out.extend_from_slice(v);
    }
    let mut i = 0;
    while i < pieces.len() {
        match &pieces[i] {
            Piece::Raw(buf, items) => {
                for it in *items {
                    sep(&mut out);
                    out.extend_from_slice(&buf[it.clone()]);
                }
                i += 1;
            }
            first @ (Piece::Msg(_) | Piece::Written(_)) if api == Api::Anthropic => {
                let role = first.role();
                let mut j = i + 1;
                while j < pieces.len()
                    && !matches!(pieces[j], Piece::Raw(..))
                    && pieces[j].role() == role
                    && matches!(role, Some("user" | "assistant"))
                {
                    j += 1;
                }
                sep(&mut out);
                out.push(b'{');
                match first {
                    Piece::Written(w) => {
                        // `{"k":v,...}`: its fields, each followed by a comma as below.
                        let fields = w.envelope.get();
                        let fields = &fields[1..fields.len() - 1];
                        if !fields.is_empty() {
                            out.extend_from_slice(fields.as_bytes());
                            out.push(b',');
                        }
                    }
                    Piece::Msg(m) => {
                        for (k, v) in m.envelope.iter() {
                            put(&mut out, k);
                            out.push(b':');
                            put(&mut out, v);
                            out.push(b',');
                        }
                    }
                    Piece::Raw(..) => {}
                }
                out.extend_from_slice(b"\"content\":");
                let parts: Vec<Part<'_>> = pieces[i..j]
                    .iter()
                    .flat_map(|p| match p {
                        Piece::Msg(g) => g.parts.iter().map(Part::Value).collect::<Vec<_>>(),
                        Piece::Written(w) => w.parts.iter().map(|t| Part::Text(t)).collect(),
                        Piece::Raw(..) => Vec::new(),
                    })
                    .collect();
                match parts.as_slice() {
                    // One string stays a string; merged, each string is a text block.
                    [p] if p.is_string() => p.write(&mut out),
                    _ => {
                        out.push(b'[');
                        for (k, p) in parts.iter().enumerate() {
                            if k > 0 {
                                out.push(b',');
                            }
                            match p.string() {
                                Some(s) => put(&mut out, &json!({"type": "text", "text": s})),
                                None => p.write(&mut out),
                            }
                        }
                        out.push(b']');
                    }
                }
                out.push(b'}');
                i = j;
            }
            Piece::Msg(m) => {
                for p in m.parts.iter() {
                    sep(&mut out);
                    put(&mut out, p);
                }
                i += 1;
            }
            Piece::Written(w) => {
                for p in &w.parts {
                    sep(&mut out);
                    out.extend_from_slice(p.get().as_bytes());
                }
                i += 1;
            }
        }
    }
    out.push(b']');
    out
}

/// The wire message list of `api` from the messages of a context, as values (see [`write_list`]).
pub fn assemble(api: Api, messages: Vec<OutMessage<'_>>) -> Vec<Value> {
    let pieces: Vec<Piece<'_>> = messages.into_iter().map(|m| Piece::Msg(Box::new(m))).collect();
    serde_json::from_slice(&write_list(api, &[], &pieces, 0)).expect("a list just written")
}

/// Puts a `cache_control` value on the last block of an Anthropic wire message (a string content becomes
/// one text block).
pub fn mark_cache(message: &mut Value, control: &Value) {
    let content = match message.get_mut("content") {
        Some(c) => c,
        None => return,
    };
    if let Value::String(s) = content {
        *content = json!([{"type": "text", "text": s}]);
    }
    if let Some(Value::Object(last)) = content.as_array_mut().and_then(|a| a.last_mut()) {
        last.insert("cache_control".into(), control.clone());
    }
}

/// Usage as a provider reports it, in the neutral form (input excludes cached tokens).
pub fn usage_of(api: Api, u: &Value) -> Usage {
    let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    match api {
        Api::Anthropic => Usage {
            input: n(u, "input_tokens"),
            output: n(u, "output_tokens"),
            cache_read: n(u, "cache_read_input_tokens"),
            cache_write: n(u, "cache_creation_input_tokens"),
        },
        Api::Chat => {
            let cached = u.get("prompt_tokens_details").map_or(0, |d| n(d, "cached_tokens"));
            Usage { input: n(u, "prompt_tokens").saturating_sub(cached), output: n(u, "completion_tokens"), cache_read: cached, cache_write: 0 }
        }
        Api::Responses => {
            let cached = u.get("input_tokens_details").map_or(0, |d| n(d, "cached_tokens"));
            Usage { input: n(u, "input_tokens").saturating_sub(cached), output: n(u, "output_tokens"), cache_read: cached, cache_write: 0 }
        }
    }
}

/// The assistant message of an Anthropic reply's content blocks.
pub fn anthropic_reply(content: &[Value], model: Option<String>) -> Message {
    Message::Assistant { content: assistant_blocks(Some(Value::Array(content.to_vec())), &mut |_| {}), model, stop: None, usage: None }
}

/// A non-streaming reply of `api`: the assistant message and the usage (serve reads the upstream's with
/// it, the HTTP summarizer its model's).
pub fn reply_of(api: Api, v: &Value) -> Option<(Message, Option<Usage>)> {
    let model = v.get("model").and_then(Value::as_str).map(str::to_string);
    let usage = v.get("usage").filter(|u| u.is_object()).map(|u| usage_of(api, u));
    let m = match api {
        Api::Anthropic => anthropic_reply(v.get("content")?.as_array()?, model),
        Api::Chat => chat_reply(v.get("choices")?.get(0)?.get("message")?, model),
        Api::Responses => responses_reply(v.get("output")?.as_array()?, model),
    };
    Some((m, usage))
}

/// The assistant message of a Chat completion's `message` object.
pub fn chat_reply(message: &Value, model: Option<String>) -> Message {
    let parsed = parse_chat(
        vec![{
            let mut m = message.clone();
            m["role"] = json!("assistant");
            m
        }],
        0,
        false,
    );
    let content = parsed.ok().and_then(|r| r.messages.into_iter().next()).map(|w| w.message.content().to_vec()).unwrap_or_default();
    Message::Assistant { content, model, stop: None, usage: None }
}

/// The assistant message of a Responses reply's output items.
pub fn responses_reply(output: &[Value], model: Option<String>) -> Message {
    // Read from values, the blocks cannot fail (only a list kept as text can).
    let content = output.iter().filter(|i| assistant_item(i)).flat_map(|i| responses_assistant_blocks(i, Field::Value(i.get("content")), "output").unwrap_or_default()).collect();
    Message::Assistant { content, model, stop: None, usage: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_counted_outside_strings() {
        assert_eq!(count_elements(br#"{"role":"user","content":"x"}"#), 2);
        assert_eq!(count_elements(br#"{"a":[1,2,{"b":"{[,]}"}],"c":"\"{,"}"#), 6);
        assert_eq!(count_elements(br#"[{"t":"a\\"},{"t":"b"}]"#), 4, "an escaped backslash ends no string");
        assert_eq!(count_elements(br#""unterminated {,"#), 0);
        assert_eq!(count_elements(b""), 0);
    }

    #[test]
    fn each_element_is_given_in_order_and_a_refusal_stops_the_reading() {
        let mut seen = Vec::new();
        each_element(br#" [{"a": [1, 2]}, "x,]", 3 ] "#, |e| {
            seen.push(e.get().to_string());
            Ok(())
        }).unwrap();
        assert_eq!(seen, [r#"{"a": [1, 2]}"#, r#""x,]""#, "3"]);
        let mut n = 0;
        let e = each_element(b"[1,2,3]", |_| {
            n += 1;
            if n == 2 { Err("no second".into()) } else { Ok(()) }
        });
        assert!(e.unwrap_err().to_string().contains("no second"));
        assert_eq!(n, 2, "nothing after the refusal is read");
        for bad in [&b"{}"[..], b"[1,", b"[1] 2", b""] {
            assert!(each_element(bad, |_| Ok(())).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn anthropic_splits_results_and_keeps_marks() {
        let list = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a\nb"}, {"type": "text", "text": "<system-reminder>x</system-reminder>", "cache_control": {"type": "ephemeral"}}]}),
            json!({"role": "system", "content": "note", "output_config": {"effort": "low"}}),
        ];
        let r = parse_request(Api::Anthropic, list.clone()).unwrap();
        let roles: Vec<&str> = r.messages.iter().map(|m| m.message.role()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user", "user"]);
        assert!(matches!(&r.messages[2].message, Message::ToolResult { tool_name, .. } if tool_name == "Bash"));
        assert!(matches!(&r.messages[3].message, Message::User { origin: UserOrigin::Host, .. }));
        assert_eq!(r.cache_marks, vec![(3, json!({"type": "ephemeral"}))]);
        assert!(r.messages[3].parts[0].get("cache_control").is_none());
        // Unchanged messages reassemble to the client's own list (the mark taken off).
        let out = assemble(Api::Anthropic, r.messages.iter().map(WireMessage::out).collect());
        let mut expect = list.clone();
        expect[2]["content"][1].as_object_mut().unwrap().remove("cache_control");
        assert_eq!(out, expect);
    }

    #[test]
    fn chat_and_responses_keep_the_system_prefix() {
        let chat = parse_request(Api::Chat, vec![json!({"role": "system", "content": "s"}), json!({"role": "user", "content": "u"}), json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}), json!({"role": "tool", "tool_call_id": "c", "content": "out"})]).unwrap();
        assert_eq!(chat.system.len(), 1);
        assert_eq!(chat.messages.len(), 3);
        assert!(matches!(&chat.messages[2].message, Message::ToolResult { tool_name, .. } if tool_name == "bash"));
        let resp = parse_request(Api::Responses, vec![
            json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]}),
            json!({"type": "reasoning", "summary": [], "encrypted_content": "xx"}),
            json!({"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "done"}),
        ]).unwrap();
        assert_eq!(resp.system.len(), 1);
        assert_eq!(resp.messages.iter().map(|m| m.message.role()).collect::<Vec<_>>(), ["user", "assistant", "tool"]);
        assert_eq!(resp.messages[1].parts.len(), 2);
    }

    #[test]
    fn units_read_lazily_give_what_a_full_read_gives() {
        let list = vec![
            json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]}),
            json!({"type": "reasoning", "summary": [], "encrypted_content": "xx"}),
            json!({"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "done"}),
        ];
        let raw = split_values(Api::Responses, &list).unwrap();
        assert_eq!(raw.system, 1);
        assert_eq!(raw.units.iter().map(|u| (u.start(), u.elements().len())).collect::<Vec<_>>(), vec![(1, 1), (2, 2), (4, 1)]);
        assert_eq!(raw.units.iter().map(Unit::role).collect::<Vec<_>>(), ["user", "", ""], "items without a role have none");
        // A request holds one per message while it is served.
        assert_eq!(std::mem::size_of::<Unit>(), 24);
        let chat = split_values(Api::Chat, &[json!({"role": "system", "content": "s"}), json!({"role": "tool", "tool_call_id": "c", "content": "r"}), json!({"role": "critic", "content": "x"}), json!({"role": "function", "name": "f", "content": "y"})]).unwrap();
        assert_eq!(chat.system, 1);
        assert_eq!(chat.units.iter().map(Unit::role).collect::<Vec<_>>(), ["tool", "other", "function"]);
        let full = parse_request(Api::Responses, list.clone()).unwrap();
        let mut lazy: Vec<WireMessage> = (0..raw.units.len()).flat_map(|u| parse_unit(Api::Responses, &raw, u).unwrap().messages).collect();
        // A result's tool name comes from its call in another unit once the units are read together.
        name_results(&mut lazy);
        assert_eq!(lazy.iter().map(|m| (&m.message, m.wire)).collect::<Vec<_>>(), full.messages.iter().map(|m| (&m.message, m.wire)).collect::<Vec<_>>());
        // Equal text, equal key; other text, other key.
        let again = split_values(Api::Responses, &list).unwrap();
        assert_eq!(raw.units, again.units);
        let anth = split_values(Api::Anthropic, &[json!({"role": "user", "content": "a"}), json!({"role": "user", "content": "b", "x": {"cache_control": 1}})]).unwrap();
        assert_ne!(anth.units[0].key, anth.units[1].key);
        assert_eq!(anth.units.iter().map(|u| u.marked).collect::<Vec<_>>(), vec![false, true]);
        assert_eq!(split_values(Api::Chat, &[json!({"content": "x"})]).unwrap_err().reason, "`role` is missing");
    }

    /// Every pi, Claude Code and Codex corpus session with the messages it appends, in order.
    fn corpus_messages() -> Vec<(std::path::PathBuf, Vec<Message>)> {
        let mut out = Vec::new();
        for format in ["pi", "claude-code", "codex"] {
            for f in crate::fast_tests::corpus_files(format) {
                let imported = crate::import_file(&f).unwrap();
                let messages = imported.events.into_iter().filter_map(|e| match e {
                    condense_events::SourceEvent::EntryAppended { entry: condense_events::Entry::Message(m), .. } => Some(m),
                    _ => None,
                });
                out.push((f, messages.collect()));
            }
        }
        out
    }

    /// A message condense wrote, held as JSON text, is written to the byte as it was from its values: alone,
    /// merged with its neighbours of one role (Anthropic), next to the client's own elements; and reads
    /// back to the same values. Every message of the pi, Claude Code and Codex corpus sessions in each API.
    #[test]
    fn messages_held_as_text_are_written_as_from_their_values() {
        let sessions = corpus_messages();
        for (f, messages) in &sessions {
            for api in [Api::Anthropic, Api::Chat, Api::Responses] {
                let outs: Vec<OutMessage<'static>> = messages.iter().filter_map(|m| from_neutral(api, m)).collect();
                // A client element every seventh piece (it ends a run of one role).
                let client = match api {
                    Api::Responses => br#"{"type":"message","role":"user","content":"raw"}"#.as_slice(),
                    _ => br#"{"role":"user","content":"raw"}"#.as_slice(),
                };
                let ranges = [0..client.len()];
                let pieces = |written: &dyn Fn(usize) -> bool| -> Vec<Piece<'_>> {
                    let mut out = Vec::new();
                    for (k, o) in outs.iter().enumerate() {
                        if k % 7 == 3 {
                            out.push(Piece::Raw(client, &ranges));
                        }
                        out.push(match written(k) {
                            true => Piece::Written(std::sync::Arc::new(o.written())),
                            false => Piece::Msg(Box::new(o.clone())),
                        });
                    }
                    out
                };
                let name = format!("{} as {}", f.display(), api.name());
                let values = write_list(api, &[], &pieces(&|_| false), 0);
                assert_eq!(write_list(api, &[], &pieces(&|_| true), 0), values, "{name}");
                assert_eq!(write_list(api, &[], &pieces(&|k| k % 2 == 0), 0), values, "{name}, every other one");
                for o in &outs {
                    assert_eq!(&o.written().expand(), o, "{name}");
                }
            }
        }
        assert!(sessions.len() >= 50, "the corpus sessions: {}", sessions.len());
        // A part that is a plain string (a client's `content` string): alone it stays a string, merged it
        // becomes a text block.
        let msg = |role: &str, parts: Vec<Value>| {
            let Value::Object(envelope) = json!({"role": role}) else { unreachable!() };
            OutMessage { envelope: Cow::Owned(envelope), parts: Cow::Owned(parts) }
        };
        let shapes = [
            vec![msg("user", vec![json!("plain \"quoted\" \u{e9} \u{7}")])],
            vec![msg("user", vec![json!("a")]), msg("user", vec![json!({"type": "text", "text": "b"})])],
            vec![msg("assistant", vec![json!({"type": "text", "text": "c"}), json!("d")]), msg("user", vec![json!("e")])],
        ];
        for outs in shapes {
            let as_values: Vec<Piece<'_>> = outs.iter().map(|o| Piece::Msg(Box::new(o.clone()))).collect();
            let as_text: Vec<Piece<'_>> = outs.iter().map(|o| Piece::Written(std::sync::Arc::new(o.written()))).collect();
            let want = write_list(Api::Anthropic, &[], &as_values, 0);
            assert_eq!(String::from_utf8_lossy(&write_list(Api::Anthropic, &[], &as_text, 0)), String::from_utf8_lossy(&want));
        }
    }

    /// A list read element by element (a message's parts, Chat's `tool_calls`) is made with room for its
    /// elements at once, read lean or in full: collected from results, a message of many parts grew its
    /// blocks by doubling and held up to twice their room; a reply of calls alone keeps the calls' list.
    #[test]
    fn lists_read_element_by_element_take_their_room_once() {
        let parts: Vec<Value> = (0..1000).map(|i| json!({"type": "text", "text": format!("p{i}")})).collect();
        let calls: Vec<Value> = (0..1000).map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": "{}"}})).collect();
        let list = vec![json!({"role": "user", "content": parts}), json!({"role": "assistant", "content": null, "tool_calls": calls})];
        let raw = split_values(Api::Chat, &list).unwrap();
        let lean: Vec<Message> = (0..raw.units.len()).flat_map(|u| unit_messages(Api::Chat, &raw, u).unwrap()).collect();
        let full: Vec<Message> = parse_request(Api::Chat, list).unwrap().messages.into_iter().map(|w| w.message).collect();
        for messages in [&lean, &full] {
            assert_eq!(messages.len(), 2);
            for m in messages.iter() {
                let (Message::User { content, .. } | Message::Assistant { content, .. }) = m else { panic!("{m:?}") };
                assert_eq!((content.len(), content.capacity()), (1000, 1000), "{}", m.role());
            }
        }
        // An Anthropic reply of many blocks.
        let uses: Vec<Value> = (0..1000).map(|i| json!({"type": "tool_use", "id": format!("t{i}"), "name": "bash", "input": {}})).collect();
        let list = vec![json!({"role": "user", "content": "go"}), json!({"role": "assistant", "content": uses})];
        let raw = split_values(Api::Anthropic, &list).unwrap();
        let lean: Vec<Message> = (0..raw.units.len()).flat_map(|u| unit_messages(Api::Anthropic, &raw, u).unwrap()).collect();
        let full: Vec<Message> = parse_request(Api::Anthropic, list).unwrap().messages.into_iter().map(|w| w.message).collect();
        for messages in [&lean, &full] {
            let Message::Assistant { content, .. } = &messages[1] else { panic!("{messages:?}") };
            assert_eq!((content.len(), content.capacity()), (1000, 1000));
        }
    }

    /// Every unit's messages read lean ([`unit_messages`]) are those read in full ([`parse_unit`]), errors
    /// included, and an unmarked unit is read lean, not by falling back: hand-written shapes (repeated
    /// keys, lists where strings go, parts without text, every item kind), then every pi, Claude Code and
    /// Codex session of the corpus written in each API's form.
    #[test]
    fn units_read_lean_give_the_messages_of_a_full_read() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let texts: Vec<(Api, Vec<String>)> = vec![
            (Api::Anthropic, vec![
                r#"{"role":"user","content":[{"type":"text","text":"a"}],"content":"later"}"#.into(),
                r#"{"content":"first","role":"assistant","content":[{"type":"text","text":"b"},{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"}]}"#.into(),
                r#"{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}},{"type":"document","source":{"x":1}}]}"#.into(),
                r#"{"role":"user","content":[{"text":"no type"}]}"#.into(),
                r#"{"role":"user","content":[]}"#.into(),
                r#"{"role":"assistant","content":[]}"#.into(),
                r#"{"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{"q":"x"}},{"type":"web_search_tool_result","tool_use_id":"s1","content":[]},{"type":"tool_use","id":"t1","name":"Bash"}]}"#.into(),
                r#"{"role":"user","content":[{"type":"text","text":"<system-reminder>r</system-reminder>"},{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"out"},{"type":"image","source":{}}],"is_error":true},{"type":"text","text":"<command-name>x</command-name>"}]}"#.into(),
                r#"{"role":"system","content":[{"type":"text","text":"s"}],"tool_calls":[1,2]}"#.into(),
                r#"{"role":"user","content":{"type":"text"}}"#.into(),
                r#"{"role":"pilot","content":[{"type":"text","text":"x"}]}"#.into(),
                r#"{"role":"user","content":[{"type":"text","text":"x"},3]}"#.into(),
                format!(r#"{{"role":"user","content":[{{"type":"text","text":"x","deep":{deep}}}]}}"#),
            ]),
            (Api::Chat, vec![
                r#"{"role":"system","content":"s"}"#.into(),
                r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AA"}},{"type":"image_url","image_url":"http://x/i.png"},{"type":"input_audio","input_audio":{"data":"x"}}]}"#.into(),
                r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":{"cmd":"ls"}}},{"id":"c2","function":{"name":"read"}}],"tool_calls":[{"id":"c3","function":{"name":"x","arguments":"{}"}}]}"#.into(),
                r#"{"role":"tool","tool_call_id":"c3","content":[{"type":"text","text":"out"}]}"#.into(),
                r#"{"role":"function","name":"f","content":"r"}"#.into(),
                r#"{"role":"developer","content":[{"type":"text","text":"d"}]}"#.into(),
                r#"{"role":"assistant","content":"x","tool_calls":null}"#.into(),
                r#"{"role":"assistant","content":[{"type":"refusal","refusal":"no"}],"tool_calls":[{"id":"c4"}]}"#.into(),
                r#"{"role":"user","content":[1,"two",{"text":3}]}"#.into(),
                r#"{"content":"no role"}"#.into(),
            ]),
            (Api::Responses, vec![
                r#"{"type":"message","role":"developer","content":"d"}"#.into(),
                r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"u"},{"type":"input_image","image_url":"data:image/png;base64,AA"},{"type":"input_file","file_id":"f"}]}"#.into(),
                r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"r1"},{"text":"r2"}],"encrypted_content":"xx","content":[{"type":"reasoning_text","text":"t"}]}"#.into(),
                r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"o"}]}"#.into(),
                r#"{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{}"}"#.into(),
                r#"{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin"}"#.into(),
                r#"{"type":"local_shell_call","id":"c3","action":{"command":["ls"]}}"#.into(),
                r#"{"type":"web_search_call","id":"w"}"#.into(),
                r#"{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"a"},{"x":1}]}"#.into(),
                r#"{"type":"custom_tool_call_output","call_id":"c2","output":"Process exited with code 2"}"#.into(),
                r#"{"role":"user","content":"plain"}"#.into(),
                r#"{"type":"item_reference","id":"r"}"#.into(),
                r#"{"type":"compaction","encrypted_content":"e"}"#.into(),
                r#"{"type":"message","content":"no role"}"#.into(),
                r#"{"role":"assistant","content":[{"type":"output_text","text":"p"}],"content":"q"}"#.into(),
            ]),
        ];
        let mut lists: Vec<(String, Api, Vec<Value>)> = Vec::new();
        let check = |name: &str, api: Api, raw: RawRequest| -> usize {
            let mut lean = 0;
            for (u, unit) in raw.units.iter().enumerate() {
                let full = parse_unit(api, &raw, u).map(|r| r.messages.into_iter().map(|w| w.message).collect::<Vec<_>>());
                assert_eq!(unit_messages(api, &raw, u), full, "{name}: unit {u}");
                if let (false, Ok(full)) = (unit.marked, &full) {
                    let read = lean_unit(api, &raw, unit).unwrap_or_else(|e| panic!("{name}: unit {u} not read lean: {e}"));
                    assert_eq!(&read.messages.into_iter().map(|w| w.message).collect::<Vec<_>>(), full, "{name}: unit {u}");
                    lean += 1;
                }
            }
            lean
        };
        let mut checked = 0;
        for (api, items) in &texts {
            // Each element a request of its own (after a prompt, so no element is a system prefix), so one
            // refused element leaves the others to compare.
            for (k, t) in items.iter().enumerate() {
                let lead = r#"{"role":"user","content":"u"}"#;
                let buf = bytes::Bytes::from(format!("[{lead},{t}]"));
                let at = lead.len() + 2;
                let Ok(raw) = split_units(*api, buf, vec![1..1 + lead.len(), at..at + t.len()]) else { continue };
                checked += 1;
                check(&format!("{} element {k}", api.name()), *api, raw);
            }
        }
        assert_eq!(checked, texts.iter().map(|(_, t)| t.len()).sum::<usize>() - 1, "only the element without a role is refused whole");
        for (f, messages) in corpus_messages() {
            let name = f.display().to_string();
            lists.push((name.clone(), Api::Anthropic, crate::export::anthropic(&messages.iter().collect::<Vec<_>>())["messages"].as_array().unwrap().clone()));
            lists.push((name.clone(), Api::Chat, crate::export::openai(&messages.iter().collect::<Vec<_>>()).as_array().unwrap().clone()));
            lists.push((name, Api::Responses, crate::export::responses(&messages.iter().collect::<Vec<_>>()).as_array().unwrap().clone()));
        }
        assert!(lists.len() >= 150, "the corpus sessions: {}", lists.len() / 3);
        let mut lean = 0;
        for (name, api, list) in lists {
            lean += check(&format!("{name} as {}", api.name()), api, split_values(api, &list).unwrap());
        }
        assert!(lean > 20_000, "units read lean: {lean}");
    }

    #[test]
    fn anthropic_never_gets_white_space_only_text() {
        let m = Message::Assistant { content: vec![Block::Text { text: "\n\n".into() }, Block::tool_call("t".into(), "Bash".into(), "{}".into())], model: None, stop: None, usage: None };
        let o = from_neutral(Api::Anthropic, &m).unwrap();
        assert_eq!(o.parts.len(), 1);
        assert_eq!(o.parts[0]["type"], "tool_use");
        let only = Message::Assistant { content: vec![Block::Text { text: " \n".into() }], model: None, stop: None, usage: None };
        assert_eq!(from_neutral(Api::Anthropic, &only), None);
    }

    /// A block of a type condense does not model is read as an opaque block holding its JSON, and a message
    /// rewritten from the neutral model carries it back as the client wrote it, in each API.
    #[test]
    fn unknown_blocks_are_kept_opaque_and_written_back_as_they_came() {
        let document = json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "the spec"}});
        let file = json!({"type": "file", "file": {"file_id": "file-1"}});
        let input_file = json!({"type": "input_file", "file_id": "file-2"});
        for (api, list, block) in [
            (Api::Anthropic, json!({"role": "user", "content": [{"type": "text", "text": "read it"}, document.clone()]}), &document),
            (Api::Chat, json!({"role": "user", "content": [{"type": "text", "text": "read it"}, file.clone()]}), &file),
            (Api::Responses, json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read it"}, input_file.clone()]}), &input_file),
        ] {
            let req = parse_request(api, vec![list]).unwrap();
            let m = &req.messages[0].message;
            assert_eq!(m.content()[1], Block::opaque(block["type"].as_str().unwrap().to_string(), json_text(block)), "{api:?}");
            let out = from_neutral(api, m).unwrap();
            let written = serde_json::to_string(&out.parts).unwrap();
            assert!(written.contains(&json_text(block)), "{api:?}: {written}");
        }
    }

    #[test]
    fn bad_shapes_name_the_place() {
        assert_eq!(parse_request(Api::Anthropic, vec![json!({"content": "x"})]).unwrap_err().at, "messages[0]");
        assert_eq!(parse_request(Api::Anthropic, vec![json!({"role": "user", "content": [1]})]).unwrap_err().at, "messages[0].content[0]");
        assert_eq!(parse_request(Api::Chat, vec![json!({"role": "pilot", "content": "x"})]).unwrap_err().reason, "unknown role `pilot`");
        assert_eq!(parse_request(Api::Responses, vec![json!(3)]).unwrap_err().at, "input[0]");
    }
}
