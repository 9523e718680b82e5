//! Streaming replies. Each API's server-sent events are passed to the client as they arrive, except the
//! events of a condense tool call, which are held back; events are renumbered so the client sees one
//! gap-free reply even when serve answered a condense tool and continued the request in further rounds.
//! The events that end a reply (stop reason, usage, the end marker) are held until the last round, then
//! sent once. Each codec also assembles the round's reply for the log.

use condense_events::{Message, Usage};
use condense_formats::wire::{self, Api};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One server-sent event as bytes on the wire.
pub fn sse(event: Option<&str>, data: &str) -> bytes::Bytes {
    let mut s = String::with_capacity(data.len() + 32);
    if let Some(e) = event.filter(|e| !e.is_empty() && *e != "message") {
        s.push_str("event: ");
        s.push_str(e);
        s.push('\n');
    }
    for line in data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    bytes::Bytes::from(s)
}

/// A streaming reply's codec (one per client request, across its rounds).
pub trait Codec: Send {
    /// Takes one upstream event; pushes what to send the client now.
    fn feed(&mut self, event: &str, data: &str, out: &mut Vec<bytes::Bytes>);
    /// Whether the round's stream ended as the API says a complete reply ends.
    fn complete(&self) -> bool;
    /// The round's reply (condense calls included) and its usage.
    fn reply(&self) -> (Message, Option<Usage>);
    /// Starts the next round of the same reply.
    fn next_round(&mut self);
    /// Sends the held-back end of the reply; `note` when the round limit cut a reply that still called
    /// only condense's tools (the note ends the reply as text, and the reply ends as a plain answer).
    fn finish(&mut self, note: Option<&str>, out: &mut Vec<bytes::Bytes>);
}

/// The codec for `api`; `internal` tells condense's tool names.
/// An upstream's stream bytes as UTF-8, each invalid sequence replaced by U+FFFD as the SSE format reads
/// a stream (the event parser refuses the whole stream at the first invalid byte otherwise). A sequence
/// cut by a chunk boundary is completed with the next chunk.
pub fn lossy_utf8<S, E>(chunks: S) -> impl futures_util::Stream<Item = Result<bytes::Bytes, E>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>>,
{
    use futures_util::StreamExt;
    chunks.scan(Vec::<u8>::new(), |carry, chunk| {
        let out = chunk.map(|c| {
            carry.extend_from_slice(&c);
            let mut text = String::new();
            let mut rest: &[u8] = carry;
            loop {
                match std::str::from_utf8(rest) {
                    Ok(t) => {
                        text.push_str(t);
                        rest = &[];
                        break;
                    }
                    Err(e) => {
                        let (good, bad) = rest.split_at(e.valid_up_to());
                        text.push_str(std::str::from_utf8(good).expect("valid up to here"));
                        match e.error_len() {
                            Some(n) => {
                                text.push('\u{FFFD}');
                                rest = &bad[n..];
                            }
                            // Cut short at the chunk's end: kept for the next chunk.
                            None => {
                                rest = bad;
                                break;
                            }
                        }
                    }
                }
            }
            *carry = rest.to_vec();
            bytes::Bytes::from(text)
        });
        std::future::ready(Some(out))
    })
}

/// `seed`: what the ids condense gives Gemini's calls are made from ([`crate::api::name_gemini_calls`]).
pub fn codec(api: Api, internal: Box<dyn Fn(&str) -> bool + Send>, seed: u64) -> Box<dyn Codec> {
    match api {
        Api::Anthropic => Box::new(AnthropicCodec { internal, ..AnthropicCodec::default() }),
        Api::Chat => Box::new(ChatCodec { internal, ..ChatCodec::default() }),
        Api::Responses => Box::new(ResponsesCodec { internal, ..ResponsesCodec::default() }),
        Api::Gemini => Box::new(GeminiCodec { internal, seed, round: 0, calls: 0, parts: Vec::new(), model: None, usage: Value::Null, end: None }),
    }
}

fn parse(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or(Value::Null)
}

fn merge_usage(into: &mut Value, from: &Value) {
    if let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in b {
            if !v.is_null() {
                a.insert(k.clone(), v.clone());
            }
        }
    } else if from.is_object() {
        *into = from.clone();
    }
}

#[derive(Default)]
struct Block {
    start: Value,
    text: String,
    thinking: String,
    signature: String,
    json: String,
}

struct AnthropicCodec {
    internal: Box<dyn Fn(&str) -> bool + Send>,
    round: u32,
    next_index: u64,
    /// Upstream block index → the client's index (`None`: held back).
    map: BTreeMap<u64, Option<u64>>,
    blocks: BTreeMap<u64, Block>,
    model: Option<String>,
    usage: Value,
    delta: Option<Value>,
    stopped: bool,
}

impl Default for AnthropicCodec {
    fn default() -> Self {
        AnthropicCodec {
            internal: Box::new(|_| false),
            round: 0,
            next_index: 0,
            map: BTreeMap::new(),
            blocks: BTreeMap::new(),
            model: None,
            usage: Value::Null,
            delta: None,
            stopped: false,
        }
    }
}

impl Codec for AnthropicCodec {
    fn feed(&mut self, event: &str, data: &str, out: &mut Vec<bytes::Bytes>) {
        let mut v = parse(data);
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event).to_string();
        match kind.as_str() {
            "message_start" => {
                self.model = v["message"]["model"].as_str().map(str::to_string);
                merge_usage(&mut self.usage, &v["message"]["usage"]);
                if self.round == 0 {
                    out.push(sse(Some(event), data));
                }
            }
            "content_block_start" | "content_block_delta" | "content_block_stop" => {
                let Some(i) = v["index"].as_u64() else { return out.push(sse(Some(event), data)) };
                if kind == "content_block_start" {
                    let cb = &v["content_block"];
                    let held = cb["type"] == "tool_use" && cb["name"].as_str().is_some_and(|n| (self.internal)(n));
                    let to = (!held).then(|| {
                        self.next_index += 1;
                        self.next_index - 1
                    });
                    self.map.insert(i, to);
                    self.blocks.insert(i, Block { start: cb.clone(), ..Block::default() });
                } else if let Some(b) = self.blocks.get_mut(&i) {
                    let d = &v["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => b.text.push_str(d["text"].as_str().unwrap_or("")),
                        Some("thinking_delta") => b.thinking.push_str(d["thinking"].as_str().unwrap_or("")),
                        Some("signature_delta") => b.signature.push_str(d["signature"].as_str().unwrap_or("")),
                        Some("input_json_delta") => b.json.push_str(d["partial_json"].as_str().unwrap_or("")),
                        _ => {}
                    }
                }
                match self.map.get(&i) {
                    Some(None) => {}
                    Some(Some(to)) => {
                        v["index"] = json!(to);
                        out.push(sse(Some(event), &v.to_string()));
                    }
                    None => out.push(sse(Some(event), data)),
                }
            }
            "message_delta" => {
                merge_usage(&mut self.usage, &v["usage"]);
                self.delta = Some(v);
            }
            "message_stop" => self.stopped = true,
            _ => out.push(sse(Some(event), data)),
        }
    }

    fn complete(&self) -> bool {
        self.stopped
    }

    fn reply(&self) -> (Message, Option<Usage>) {
        let blocks: Vec<Value> = self
            .blocks
            .values()
            .map(|b| {
                let mut s = b.start.clone();
                match s["type"].as_str() {
                    Some("text") => s["text"] = json!(format!("{}{}", s["text"].as_str().unwrap_or(""), b.text)),
                    Some("thinking") => {
                        s["thinking"] = json!(format!("{}{}", s["thinking"].as_str().unwrap_or(""), b.thinking));
                        s["signature"] = json!(format!("{}{}", s["signature"].as_str().unwrap_or(""), b.signature));
                    }
                    Some("tool_use" | "server_tool_use") if !b.json.is_empty() => {
                        s["input"] = serde_json::from_str(&b.json).unwrap_or_else(|_| json!({"input": b.json}));
                    }
                    _ => {}
                }
                s
            })
            .collect();
        let usage = self.usage.is_object().then(|| wire::usage_of(Api::Anthropic, &self.usage));
        (wire::anthropic_reply(&blocks, self.model.clone()), usage)
    }

    fn next_round(&mut self) {
        self.round += 1;
        self.map.clear();
        self.blocks.clear();
        self.usage = Value::Null;
        self.delta = None;
        self.stopped = false;
    }

    fn finish(&mut self, note: Option<&str>, out: &mut Vec<bytes::Bytes>) {
        let end_turn = note.is_some();
        if let Some(text) = note {
            let i = self.next_index;
            self.next_index += 1;
            out.push(sse(Some("content_block_start"), &json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}).to_string()));
            out.push(sse(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": text}}).to_string()));
            out.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": i}).to_string()));
        }
        let mut d = self.delta.take().unwrap_or_else(|| json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 0}}));
        if end_turn {
            d["delta"]["stop_reason"] = json!("end_turn");
        }
        out.push(sse(Some("message_delta"), &d.to_string()));
        out.push(sse(Some("message_stop"), r#"{"type":"message_stop"}"#));
    }
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

struct ChatCodec {
    internal: Box<dyn Fn(&str) -> bool + Send>,
    round: u32,
    /// The text the client has been sent so far in this reply, all rounds (its last character is what
    /// tells whether a later round's text needs a paragraph break before it: [`crate::api::join_text`]).
    sent_text: String,
    /// Whether this round's text has started.
    round_text: bool,
    next_index: u64,
    map: BTreeMap<u64, Option<u64>>,
    calls: BTreeMap<u64, Call>,
    text: String,
    model: Option<String>,
    usage: Value,
    usage_chunk: Option<Value>,
    finish_reason: Option<Value>,
    template: Value,
    done: bool,
}

impl Default for ChatCodec {
    fn default() -> Self {
        ChatCodec {
            internal: Box::new(|_| false),
            round: 0,
            sent_text: String::new(),
            round_text: false,
            next_index: 0,
            map: BTreeMap::new(),
            calls: BTreeMap::new(),
            text: String::new(),
            model: None,
            usage: Value::Null,
            usage_chunk: None,
            finish_reason: None,
            template: Value::Null,
            done: false,
        }
    }
}

impl Codec for ChatCodec {
    fn feed(&mut self, _event: &str, data: &str, out: &mut Vec<bytes::Bytes>) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let mut v = parse(data);
        if !v.is_object() {
            return out.push(sse(None, data));
        }
        if let Some(m) = v["model"].as_str() {
            self.model = Some(m.to_string());
        }
        self.template = json!({"id": v["id"], "object": v["object"], "created": v["created"], "model": v["model"]});
        if v["usage"].is_object() {
            merge_usage(&mut self.usage, &v["usage"]);
        }
        let no_choices = v["choices"].as_array().is_none_or(|c| c.is_empty());
        if no_choices {
            if v["usage"].is_object() {
                self.usage_chunk = Some(v);
            } else {
                out.push(sse(None, data));
            }
            return;
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("usage");
        }
        let choice = &mut v["choices"][0];
        if !choice["finish_reason"].is_null() {
            self.finish_reason = Some(choice["finish_reason"].clone());
            choice["finish_reason"] = Value::Null;
        }
        let delta = &mut choice["delta"];
        if self.round > 0 {
            if let Some(d) = delta.as_object_mut() {
                d.remove("role");
            }
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()).map(str::to_string) {
            self.text.push_str(&t);
            // The first text of a later round, after text an earlier round sent: a paragraph break first.
            let shown = if self.round_text { t } else { crate::api::join_text(&self.sent_text, &t)[self.sent_text.len()..].to_string() };
            self.round_text = true;
            // Only the end of what was sent matters for the next break.
            self.sent_text = shown.chars().last().map(String::from).unwrap_or_default();
            delta["content"] = json!(shown);
        }
        if let Some(Value::Array(tcs)) = delta.get_mut("tool_calls") {
            let mut kept = Vec::new();
            for mut tc in std::mem::take(tcs) {
                let i = tc["index"].as_u64().unwrap_or(0);
                let c = self.calls.entry(i).or_default();
                if let Some(id) = tc["id"].as_str() {
                    c.id.push_str(id);
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    c.name.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    c.arguments.push_str(a);
                }
                if !self.map.contains_key(&i) {
                    let held = (self.internal)(&c.name);
                    let to = (!held).then(|| {
                        self.next_index += 1;
                        self.next_index - 1
                    });
                    self.map.insert(i, to);
                }
                if let Some(Some(to)) = self.map.get(&i) {
                    tc["index"] = json!(to);
                    kept.push(tc);
                }
            }
            if kept.is_empty() {
                delta.as_object_mut().expect("delta object").remove("tool_calls");
            } else {
                *tcs = kept;
            }
        }
        let meaningful = delta.as_object().is_some_and(|d| d.iter().any(|(k, x)| k != "role" && !x.is_null()))
            || (self.round == 0 && delta.get("role").is_some());
        if meaningful {
            out.push(sse(None, &v.to_string()));
        }
    }

    fn complete(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    fn reply(&self) -> (Message, Option<Usage>) {
        let calls: Vec<Value> = self
            .calls
            .values()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let mut msg = json!({"role": "assistant", "content": if self.text.is_empty() { Value::Null } else { json!(self.text) }});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        let usage = self.usage.is_object().then(|| wire::usage_of(Api::Chat, &self.usage));
        (wire::chat_reply(&msg, self.model.clone()), usage)
    }

    fn next_round(&mut self) {
        self.round += 1;
        self.round_text = false;
        self.map.clear();
        self.calls.clear();
        self.text.clear();
        self.usage = Value::Null;
        self.usage_chunk = None;
        self.finish_reason = None;
        self.done = false;
    }

    fn finish(&mut self, note: Option<&str>, out: &mut Vec<bytes::Bytes>) {
        let reason = if note.is_some() { json!("stop") } else { self.finish_reason.clone().unwrap_or(json!("stop")) };
        let mut chunk = self.template.clone();
        if let Some(text) = note {
            let mut c = self.template.clone();
            let text = &crate::api::join_text(&self.sent_text, text)[self.sent_text.len()..];
            c["choices"] = json!([{"index": 0, "delta": {"content": text}, "finish_reason": null}]);
            out.push(sse(None, &c.to_string()));
        }
        chunk["choices"] = json!([{"index": 0, "delta": {}, "finish_reason": reason}]);
        out.push(sse(None, &chunk.to_string()));
        if let Some(u) = self.usage_chunk.take() {
            out.push(sse(None, &u.to_string()));
        }
        out.push(sse(None, "[DONE]"));
    }
}

struct ResponsesCodec {
    internal: Box<dyn Fn(&str) -> bool + Send>,
    round: u32,
    next_index: u64,
    seq: u64,
    map: BTreeMap<u64, Option<u64>>,
    items: BTreeMap<u64, Value>,
    visible: Vec<Value>,
    completed: Option<Value>,
    model: Option<String>,
}

impl Default for ResponsesCodec {
    fn default() -> Self {
        ResponsesCodec {
            internal: Box::new(|_| false),
            round: 0,
            next_index: 0,
            seq: 0,
            map: BTreeMap::new(),
            items: BTreeMap::new(),
            visible: Vec::new(),
            completed: None,
            model: None,
        }
    }
}

impl ResponsesCodec {
    fn place(&mut self, i: u64, item: &Value) -> Option<u64> {
        if let Some(to) = self.map.get(&i) {
            return *to;
        }
        let held = item["type"] == "function_call" && item["name"].as_str().is_some_and(|n| (self.internal)(n));
        let to = (!held).then(|| {
            self.next_index += 1;
            self.next_index - 1
        });
        self.map.insert(i, to);
        to
    }

    fn send(&mut self, event: &str, mut v: Value, out: &mut Vec<bytes::Bytes>) {
        if v.get("sequence_number").is_some() {
            v["sequence_number"] = json!(self.seq);
            self.seq += 1;
        }
        out.push(sse(Some(event), &v.to_string()));
    }
}

impl Codec for ResponsesCodec {
    fn feed(&mut self, event: &str, data: &str, out: &mut Vec<bytes::Bytes>) {
        let mut v = parse(data);
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event).to_string();
        let event = if event.is_empty() || event == "message" { kind.as_str() } else { event };
        match kind.as_str() {
            "response.created" | "response.in_progress" => {
                if let Some(m) = v["response"]["model"].as_str() {
                    self.model = Some(m.to_string());
                }
                if self.round == 0 {
                    self.send(event, v, out);
                }
            }
            "response.completed" => {
                if let Some(m) = v["response"]["model"].as_str() {
                    self.model = Some(m.to_string());
                }
                self.completed = Some(v);
            }
            _ => {
                let Some(i) = v["output_index"].as_u64() else { return self.send(event, v, out) };
                let item = v.get("item").cloned().unwrap_or(Value::Null);
                let to = if item.is_object() { self.place(i, &item) } else { self.map.get(&i).copied().flatten() };
                if kind == "response.output_item.done" {
                    self.items.insert(i, item.clone());
                    if to.is_some() {
                        self.visible.push(item);
                    }
                }
                if let Some(to) = to {
                    v["output_index"] = json!(to);
                    self.send(event, v, out);
                }
            }
        }
    }

    fn complete(&self) -> bool {
        self.completed.is_some()
    }

    fn reply(&self) -> (Message, Option<Usage>) {
        let usage = self.completed.as_ref().map(|c| &c["response"]["usage"]).filter(|u| u.is_object()).map(|u| wire::usage_of(Api::Responses, u));
        let items: Vec<Value> = self.items.values().cloned().collect();
        (wire::responses_reply(&items, self.model.clone()), usage)
    }

    fn next_round(&mut self) {
        self.round += 1;
        self.map.clear();
        self.items.clear();
        self.completed = None;
    }

    fn finish(&mut self, note: Option<&str>, out: &mut Vec<bytes::Bytes>) {
        if let Some(text) = note {
            let i = self.next_index;
            self.next_index += 1;
            let item = json!({"type": "message", "id": format!("msg_condense_{i}"), "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]});
            self.send("response.output_item.added", json!({"type": "response.output_item.added", "output_index": i, "item": item}), out);
            self.send("response.output_item.done", json!({"type": "response.output_item.done", "output_index": i, "item": item}), out);
            self.visible.push(item);
        }
        let mut c = self.completed.take().unwrap_or_else(|| json!({"type": "response.completed", "response": {}}));
        c["response"]["output"] = Value::Array(std::mem::take(&mut self.visible));
        self.send("response.completed", c, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_bytes_read_as_utf8_with_replacements_and_split_sequences_joined() {
        use futures_util::StreamExt;
        // "é" is split across two chunks; 0xff is invalid wherever it is.
        let chunks = vec![Ok::<_, ()>(bytes::Bytes::from_static(b"\xffdata: caf\xc3")), Ok(bytes::Bytes::from_static(b"\xa9\n\n"))];
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let out: Vec<bytes::Bytes> = rt.block_on(lossy_utf8(futures_util::stream::iter(chunks)).map(|c| c.unwrap()).collect());
        assert_eq!(text(&out), "\u{FFFD}data: café\n\n");
    }

    fn text(out: &[bytes::Bytes]) -> String {
        out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }

    #[test]
    fn anthropic_holds_condense_calls_and_renumbers_rounds() {
        let mut c = codec(Api::Anthropic, Box::new(|n| n == "context_tree_query"), 0);
        let mut out = Vec::new();
        let ev = |c: &mut Box<dyn Codec>, out: &mut Vec<bytes::Bytes>, e: &str, d: Value| c.feed(e, &d.to_string(), out);
        ev(&mut c, &mut out, "message_start", json!({"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 5}}}));
        ev(&mut c, &mut out, "content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
        ev(&mut c, &mut out, "content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look"}}));
        ev(&mut c, &mut out, "content_block_stop", json!({"type": "content_block_stop", "index": 0}));
        ev(&mut c, &mut out, "content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "q", "name": "context_tree_query", "input": {}}}));
        ev(&mut c, &mut out, "content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"refs\":[\"t1\"]}"}}));
        ev(&mut c, &mut out, "content_block_stop", json!({"type": "content_block_stop", "index": 1}));
        ev(&mut c, &mut out, "message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}));
        ev(&mut c, &mut out, "message_stop", json!({"type": "message_stop"}));
        assert!(c.complete());
        let (m, u) = c.reply();
        assert_eq!(m.tool_calls().map(|(_, n, a)| (n.to_string(), a.to_string())).collect::<Vec<_>>(), vec![("context_tree_query".to_string(), "{\"refs\":[\"t1\"]}".to_string())]);
        assert_eq!(u.map(|u| (u.input, u.output)), Some((5, 7)));
        let first = text(&out);
        assert!(!first.contains("context_tree_query") && !first.contains("message_stop"), "{first}");
        c.next_round();
        out.clear();
        ev(&mut c, &mut out, "message_start", json!({"type": "message_start", "message": {"model": "m"}}));
        ev(&mut c, &mut out, "content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
        ev(&mut c, &mut out, "message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}));
        ev(&mut c, &mut out, "message_stop", json!({"type": "message_stop"}));
        c.finish(None, &mut out);
        let second = text(&out);
        assert!(!second.contains("message_start"));
        assert!(second.contains("\"index\":1"), "{second}");
        assert!(second.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    }

    #[test]
    fn chat_holds_condense_calls_and_the_end() {
        let mut c = codec(Api::Chat, Box::new(|n| n == "context_tree_query"), 0);
        let mut out = Vec::new();
        c.feed("", &json!({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi", "tool_calls": [{"index": 0, "id": "q", "type": "function", "function": {"name": "context_tree_query", "arguments": ""}}]}, "finish_reason": null}]}).to_string(), &mut out);
        c.feed("", &json!({"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}).to_string(), &mut out);
        c.feed("", "[DONE]", &mut out);
        assert!(c.complete());
        let s = text(&out);
        assert!(!s.contains("context_tree_query") && !s.contains("[DONE]") && !s.contains("tool_calls\"}"), "{s}");
        assert_eq!(c.reply().0.tool_calls().count(), 1);
        c.finish(Some("[limit]"), &mut out);
        assert!(text(&out).ends_with("data: [DONE]\n\n"));
        assert!(text(&out).contains("\"finish_reason\":\"stop\""));
    }

    #[test]
    fn responses_places_items_seen_only_when_done() {
        let mut c = codec(Api::Responses, Box::new(|n| n == "context_tree_query"), 0);
        let mut out = Vec::new();
        c.feed("response.output_item.done", &json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "function_call", "call_id": "q", "name": "context_tree_query", "arguments": "{}"}}).to_string(), &mut out);
        c.feed("response.output_item.done", &json!({"type": "response.output_item.done", "output_index": 1, "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}}).to_string(), &mut out);
        c.feed("response.completed", &json!({"type": "response.completed", "response": {"id": "r", "usage": {"input_tokens": 3, "output_tokens": 1}}}).to_string(), &mut out);
        let s = text(&out);
        assert!(!s.contains("context_tree_query"));
        assert!(s.contains("\"output_index\":0"));
        assert_eq!(c.reply().0.tool_calls().count(), 1);
        c.finish(None, &mut out);
        assert!(text(&out).contains("response.completed"));
    }

    #[test]
    fn gemini_holds_condense_calls_and_the_end_and_names_the_calls() {
        let mut c = codec(Api::Gemini, Box::new(|n| n == "context_tree_query"), 7);
        let mut out = Vec::new();
        let chunk = |parts: Value, finish: Option<&str>| {
            let mut v = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], "modelVersion": "gemini-2.5-flash"});
            if let Some(f) = finish {
                v["candidates"][0]["finishReason"] = json!(f);
                v["usageMetadata"] = json!({"promptTokenCount": 10, "candidatesTokenCount": 2});
            }
            v.to_string()
        };
        c.feed("", &chunk(json!([{"text": "Let me "}]), None), &mut out);
        c.feed("", &chunk(json!([{"text": "look."}, {"functionCall": {"name": "context_tree_query", "args": {"refs": ["t1"]}}}]), Some("STOP")), &mut out);
        assert!(c.complete());
        let s = text(&out);
        assert!(s.contains("Let me ") && s.contains("look.") && !s.contains("context_tree_query") && !s.contains("finishReason"), "{s}");
        // The round's reply: the texts as one, the call with an id of the form Gemini CLI keeps.
        let (reply, usage) = c.reply();
        assert_eq!(reply.text(), "Let me look.");
        let ids: Vec<String> = reply.tool_calls().map(|(i, _, _)| i.to_string()).collect();
        assert!(ids.len() == 1 && ids[0].starts_with("context_tree_query__condense_"), "{ids:?}");
        assert_eq!(usage.map(|u| u.input), Some(10));
        c.next_round();
        out.clear();
        c.feed("", &chunk(json!([{"text": "found it"}, {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]), Some("STOP")), &mut out);
        let s = text(&out);
        assert!(s.contains("found it") && s.contains("run_shell_command__condense_") && !s.contains("finishReason"), "{s}");
        c.finish(None, &mut out);
        let end = text(&out);
        let last = end.trim_end().rsplit("data: ").next().unwrap();
        let v: Value = serde_json::from_str(last).unwrap();
        assert_eq!(v["candidates"][0]["finishReason"], "STOP", "{end}");
        assert!(v["candidates"][0].get("content").is_none(), "the parts went before the end: {end}");
        assert_eq!(v["usageMetadata"]["promptTokenCount"], 10);
    }
}

/// The Gemini API's stream: each event a whole `GenerateContentResponse` whose first candidate holds the
/// next parts (text a piece at a time, a call whole). Calls of condense's tools are taken out of the
/// events; the event that ends the round (the one with a `finishReason`) is held, with the usage, and sent
/// at the end of the last round.
struct GeminiCodec {
    internal: Box<dyn Fn(&str) -> bool + Send>,
    seed: u64,
    round: u32,
    /// The round's calls so far (for their ids).
    calls: usize,
    /// The round's parts, condense's calls included.
    parts: Vec<Value>,
    model: Option<String>,
    usage: Value,
    /// The event that ended the round, without its usage (its parts the client's).
    end: Option<Value>,
}

impl Codec for GeminiCodec {
    fn feed(&mut self, event: &str, data: &str, out: &mut Vec<bytes::Bytes>) {
        let mut v = parse(data);
        if !v.is_object() {
            return out.push(sse(Some(event), data));
        }
        if let Some(m) = v["modelVersion"].as_str() {
            self.model = Some(m.to_string());
        }
        if let Some(u) = v.as_object_mut().and_then(|o| o.remove("usageMetadata")) {
            merge_usage(&mut self.usage, &u);
        }
        if let Some(Value::Array(parts)) = v.pointer_mut("/candidates/0/content/parts") {
            crate::api::name_gemini_calls(parts, self.seed, self.round, &mut self.calls);
            self.parts.extend(parts.iter().cloned());
            parts.retain(|p| !p["functionCall"]["name"].as_str().is_some_and(|n| (self.internal)(n)));
        }
        let shown = v.pointer("/candidates/0/content/parts").and_then(Value::as_array).is_none_or(|p| !p.is_empty());
        if v.pointer("/candidates/0/finishReason").is_some_and(|f| !f.is_null()) {
            // The parts go now, the end of the reply when the last round has ended.
            let mut end = v.clone();
            if let Some(c) = end.pointer_mut("/candidates/0/content") {
                c["parts"] = json!([]);
            }
            self.end = Some(end);
            if !shown || v.pointer("/candidates/0/content").is_none() {
                return;
            }
            if let Some(c) = v.pointer_mut("/candidates/0").and_then(Value::as_object_mut) {
                c.remove("finishReason");
            }
        }
        if shown {
            out.push(sse(None, &v.to_string()));
        }
    }

    fn complete(&self) -> bool {
        self.end.is_some()
    }

    fn reply(&self) -> (Message, Option<Usage>) {
        // Adjacent texts are one, as Gemini CLI keeps a streamed reply in its history.
        let mut parts: Vec<Value> = Vec::new();
        for p in &self.parts {
            let plain = |p: &Value| p.as_object().is_some_and(|o| o.len() == 1 && o.get("text").is_some_and(Value::is_string));
            match parts.last_mut() {
                Some(last) if plain(last) && plain(p) => {
                    let joined = format!("{}{}", last["text"].as_str().unwrap_or(""), p["text"].as_str().unwrap_or(""));
                    last["text"] = json!(joined);
                }
                _ => parts.push(p.clone()),
            }
        }
        let usage = self.usage.is_object().then(|| wire::usage_of(Api::Gemini, &self.usage));
        (wire::gemini_reply(&parts, self.model.clone()), usage)
    }

    fn next_round(&mut self) {
        self.round += 1;
        self.calls = 0;
        self.parts.clear();
        self.usage = Value::Null;
        self.end = None;
    }

    fn finish(&mut self, note: Option<&str>, out: &mut Vec<bytes::Bytes>) {
        let mut end = self.end.take().unwrap_or_else(|| json!({"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}]}));
        if let Some(text) = note {
            if let Some(c) = end.pointer_mut("/candidates/0") {
                c["finishReason"] = json!("STOP");
                match c.pointer_mut("/content/parts").and_then(Value::as_array_mut) {
                    Some(parts) => parts.push(json!({ "text": text })),
                    None => c["content"] = json!({"role": "model", "parts": [{ "text": text }]}),
                }
            }
        }
        // An ending event whose parts were all condense's calls ends the reply without content.
        if let Some(c) = end.pointer_mut("/candidates/0").and_then(Value::as_object_mut) {
            if c.get("content").and_then(|x| x.get("parts")).and_then(Value::as_array).is_some_and(Vec::is_empty) {
                c.remove("content");
            }
        }
        if self.usage.is_object() {
            end["usageMetadata"] = self.usage.clone();
        }
        out.push(sse(None, &end.to_string()));
    }
}
