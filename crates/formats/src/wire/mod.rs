//! The four provider wire formats of a live request, as `condense serve` meets them: Anthropic Messages,
//! OpenAI Chat Completions, OpenAI Responses and the Gemini API. A request's message list is read into neutral messages,
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

mod anthropic;
mod chat;
mod gemini;
mod responses;
#[cfg(test)]
mod tests;
mod units;
mod write;

pub use anthropic::*;
pub use chat::*;
pub use gemini::*;
pub use responses::*;
pub use units::*;
pub use write::*;

/// A provider API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    Chat,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// The Gemini API (`/v1beta/models/MODEL:generateContent`).
    Gemini,
}

impl Api {
    /// The short name used in session names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Gemini => "gemini",
        }
    }

    /// The request field that holds the message list.
    pub fn list_field(self) -> &'static str {
        match self {
            Api::Anthropic | Api::Chat => "messages",
            Api::Responses => "input",
            Api::Gemini => "contents",
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

pub(crate) fn werr(at: String, reason: impl Into<String>) -> WireError {
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
pub(crate) fn texts(blocks: &[Block]) -> impl Iterator<Item = &str> + Clone {
    blocks.iter().filter_map(|b| match b { Block::Text { text } => Some(text.trim()), _ => None }).filter(|t| !t.is_empty())
}

/// Whether a message is host context: it has text and every text of it is (`<system-reminder>`,
/// `<environment_context>`, AGENTS.md). A request's user message and a pi extension's message alike.
pub(crate) fn is_host_context(blocks: &[Block]) -> bool {
    all_host(texts(blocks))
}

/// Whether there are texts and every one is host context.
pub(crate) fn all_host<'a>(mut texts: impl Iterator<Item = &'a str> + Clone) -> bool {
    texts.clone().next().is_some() && texts.all(|t| condense_events::host_context_kind(t).is_some())
}

/// Why a user message is there: host context ([`is_host_context`]), injected when it is only other tags
/// (`<command-name>`), else a prompt.
pub(crate) fn origin_of(blocks: &[Block]) -> UserOrigin {
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
pub(crate) fn take_cache_control(v: &mut Value) -> Option<Value> {
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
pub(crate) fn parse_from(api: Api, list: Vec<Value>, first: usize, prefix: bool) -> Result<WireRequest, WireError> {
    match api {
        Api::Anthropic => parse_anthropic(list, first),
        Api::Chat => parse_chat(list, first, prefix),
        Api::Responses => parse_responses(list, first, prefix),
        Api::Gemini => parse_gemini(list, first),
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
        Api::Gemini => gemini_message(m),
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
        Api::Gemini => {
            let cached = n(u, "cachedContentTokenCount");
            Usage { input: n(u, "promptTokenCount").saturating_sub(cached), output: n(u, "candidatesTokenCount") + n(u, "thoughtsTokenCount"), cache_read: cached, cache_write: 0 }
        }
    }
}

/// A non-streaming reply of `api`: the assistant message and the usage (serve reads the upstream's with
/// it, the HTTP summarizer its model's).
pub fn reply_of(api: Api, v: &Value) -> Option<(Message, Option<Usage>)> {
    let model = v.get(if api == Api::Gemini { "modelVersion" } else { "model" }).and_then(Value::as_str).map(str::to_string);
    let usage = v.get(if api == Api::Gemini { "usageMetadata" } else { "usage" }).filter(|u| u.is_object()).map(|u| usage_of(api, u));
    let m = match api {
        Api::Anthropic => anthropic_reply(v.get("content")?.as_array()?, model),
        Api::Chat => chat_reply(v.get("choices")?.get(0)?.get("message")?, model),
        Api::Responses => responses_reply(v.get("output")?.as_array()?, model),
        Api::Gemini => gemini_reply(v.get("candidates")?.get(0)?.get("content")?.get("parts")?.as_array()?, model),
    };
    Some((m, usage))
}
