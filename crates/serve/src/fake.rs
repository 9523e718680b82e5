//! A scripted fake model provider on loopback, for tests and benchmarks: it speaks the three APIs
//! (streaming and not), logs every request it receives, and answers from a script — call the client's
//! shell tool with a command, call `context_tree_query` on a ref it finds in a stub, answer with text,
//! reject the request as too long, or break the stream off half-way. Only the model provider is faked;
//! everything between the client and it is real.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use condense_engine::controller::NEW_CONTEXT_TOOL;
use condense_events::{Block, Message};
use condense_formats::wire::{self, Api};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// One step of the script.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call the client's shell tool with this command.
    Shell(String),
    /// Call `context_tree_query` with the newest ref found in a stub of the request (falls through to the
    /// next step when there is none).
    QueryNewestStub,
    /// Call a tool by name with these arguments.
    Call(String, Value),
    /// Call condense's `new_context` (falls through to the next step when the request does not declare
    /// it, as in a request sent direct).
    NewContext,
    /// Answer with this text.
    Text(String),
    /// Reject the request as too long for the context window.
    Overflow,
    /// Start the reply and break the connection off half-way.
    Drop,
    /// Answer with this HTTP status and error message.
    Fail(u16, String),
    /// Wait this many milliseconds, then answer with the next step.
    Slow(u64),
    /// Answer with this text, a stream preceded by bytes that are not UTF-8.
    Garbled(String),
    /// Answer 200 with this content type and body, whatever was asked.
    Raw(String, String),
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The request path.
    pub path: String,
    /// The request's query, without its `?`.
    pub query: String,
    /// Header names and values, lower-case names.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: Value,
    /// The body as it arrived.
    pub raw: bytes::Bytes,
    /// The step it was answered with.
    pub step: Option<Step>,
    /// When its body had arrived (for latency measurements).
    pub at: std::time::Instant,
    /// A summary request condense made through the upstream (`handoff` or `batch`), answered outside the
    /// script.
    pub summary: Option<&'static str>,
}

impl Logged {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The API of the request.
    pub fn api(&self) -> Api {
        if self.path.starts_with("/v1beta/") {
            Api::Gemini
        } else if self.path.contains("/messages") {
            Api::Anthropic
        } else if self.path.contains("/chat/") {
            Api::Chat
        } else {
            Api::Responses
        }
    }

    /// The request's conversation in the neutral model.
    pub fn messages(&self) -> Vec<Message> {
        let api = self.api();
        let list = self.body.get(api.list_field()).and_then(Value::as_array).cloned().unwrap_or_default();
        wire::parse_request(api, list).map(|r| r.messages.into_iter().map(|m| m.message).collect()).unwrap_or_default()
    }

    /// Names of the tools the request declares.
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .flat_map(|t| match t.get("functionDeclarations").and_then(Value::as_array) {
                        // Gemini's tools each declare functions.
                        Some(decls) => decls.iter().filter_map(|d| d.get("name")).collect::<Vec<_>>(),
                        None => t.get("name").or_else(|| t.get("function").and_then(|f| f.get("name"))).into_iter().collect(),
                    })
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Inner {
    steps: Vec<Step>,
    next: usize,
    log: Vec<Logged>,
    counter: u64,
    /// Summary requests are answered with a 500 instead of a summary.
    fail_summaries: bool,
    /// Summary requests are answered after this many milliseconds.
    summary_delay_ms: u64,
}

/// A running fake provider.
#[derive(Clone)]
pub struct Fake {
    /// Where it listens.
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

impl Fake {
    /// Starts a fake on a free loopback port with a script.
    pub async fn start(steps: Vec<Step>) -> Fake {
        let inner = Arc::new(Mutex::new(Inner { steps, ..Inner::default() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake provider");
        let addr = listener.local_addr().expect("local address");
        let state = inner.clone();
        let app = axum::Router::new().fallback(move |req: Request| {
            let state = state.clone();
            async move { answer(state, req).await }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Fake { addr, inner }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn log(&self) -> Vec<Logged> {
        self.inner.lock().expect("fake lock").log.clone()
    }

    /// How many requests other than summaries have arrived, counted as each arrives (the log takes a
    /// request once it is answered, after any delay of its step).
    pub fn arrived(&self) -> u64 {
        self.inner.lock().expect("fake lock").counter
    }

    /// Forgets the requests logged so far (long benchmarks keep memory flat).
    pub fn clear_log(&self) {
        self.inner.lock().expect("fake lock").log.clear();
    }

    /// Appends steps to the script.
    pub fn push(&self, steps: Vec<Step>) {
        self.inner.lock().expect("fake lock").steps.extend(steps);
    }

    /// Whether summary requests fail (a 500) from now on.
    pub fn fail_summaries(&self, fail: bool) {
        self.inner.lock().expect("fake lock").fail_summaries = fail;
    }

    /// Summary requests are answered after `ms` milliseconds from now on (logged as they arrive).
    pub fn delay_summaries(&self, ms: u64) {
        self.inner.lock().expect("fake lock").summary_delay_ms = ms;
    }
}

/// The instructions of a request, whichever API it uses.
fn instructions(api: Api, body: &Value) -> Option<&str> {
    match api {
        Api::Anthropic => body.get("system").and_then(Value::as_str),
        Api::Chat => body["messages"].get(0).filter(|m| m["role"] == "system").and_then(|m| m["content"].as_str()),
        Api::Responses => body.get("instructions").and_then(Value::as_str),
        Api::Gemini => body.pointer("/systemInstruction/parts/0/text").and_then(Value::as_str),
    }
}

/// The input text of a summary request.
pub fn summary_input(api: Api, body: &Value) -> String {
    match api {
        Api::Anthropic => body["messages"][0]["content"].as_str(),
        Api::Chat => body["messages"][1]["content"].as_str(),
        Api::Responses => body["input"].as_str(),
        Api::Gemini => body.pointer("/contents/0/parts/0/text").and_then(Value::as_str),
    }
    .unwrap_or_default()
    .to_string()
}

/// The fake model's answer to a summary request: a handoff names the first and the last entry the piece
/// cites (`[id] role: …` lines), a batch summary has one block per ref.
pub fn summary_answer(kind: &str, input: &str) -> String {
    if kind == "handoff" {
        let ids: Vec<&str> = input.lines().filter_map(|l| l.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(id, _)| id)).collect();
        format!("## Goal\nFAKE-HANDOFF of [{}] to [{}], {} entries\n", ids.first().unwrap_or(&""), ids.last().unwrap_or(&""), ids.len())
    } else {
        input.match_indices("### t").filter_map(|(i, _)| input[i + 5..].split(' ').next()).map(|r| format!("t{r}: FAKE-SUMMARY of t{r}\n")).collect()
    }
}

/// A reply of `api` whose text is `text` (no stream, no tools).
fn text_reply(api: Api, model: &str, text: &str) -> Value {
    json_reply(api, model, 0, &Reply { text: text.to_string(), calls: Vec::new() })
}

/// The newest `tN` ref a stub or a compressed chain's block in the messages names.
pub fn newest_stub_ref(messages: &[Message]) -> Option<String> {
    let mut best: Option<u32> = None;
    for m in messages {
        // A stub names its ref beside the recovery tool; a block begins with its header.
        let names_refs = |text: &str| match m {
            Message::ToolResult { .. } => text.contains(condense_events::QUERY_TOOL_NAME),
            Message::User { .. } => text.starts_with(condense_events::BLOCK_HEADER),
            Message::Assistant { .. } => false,
        };
        for b in m.content() {
            let Block::Text { text } = b else { continue };
            if !names_refs(text) {
                continue;
            }
            for (i, _) in text.match_indices("t") {
                let digits: String = text[i + 1..].chars().take_while(char::is_ascii_digit).collect();
                let before_ok = i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric();
                if before_ok && let Ok(n) = digits.parse::<u32>() {
                    best = Some(best.map_or(n, |b| b.max(n)));
                }
            }
        }
    }
    best.map(|n| format!("t{n}"))
}

fn shell_call(tools: &[String], cmd: &str) -> (String, Value) {
    for name in ["bash", "Bash", "exec_command", "shell", "run_shell_command"] {
        if tools.iter().any(|t| t == name) {
            let args = if name == "exec_command" { json!({"cmd": cmd}) } else { json!({"command": cmd}) };
            return (name.to_string(), args);
        }
    }
    ("bash".to_string(), json!({"command": cmd}))
}

/// What the reply holds: text and tool calls `(id, name, arguments)`.
struct Reply {
    text: String,
    calls: Vec<(String, String, Value)>,
}

async fn answer(state: Arc<Mutex<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 256 << 20).await.unwrap_or_default();
    let at = std::time::Instant::now();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut logged = Logged {
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        headers: parts.headers.iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect(),
        body,
        raw: bytes,
        step: None,
        at,
        summary: None,
    };
    if logged.path.ends_with("/count_tokens") {
        state.lock().expect("fake lock").log.push(logged);
        return axum::Json(json!({"input_tokens": 42})).into_response();
    }
    if logged.path.ends_with(":countTokens") {
        state.lock().expect("fake lock").log.push(logged);
        return axum::Json(json!({"totalTokens": 42})).into_response();
    }
    let api = logged.api();
    // condense's summary requests are answered apart from the script.
    let kind = match instructions(api, &logged.body) {
        Some(i) if i == condense_summarize::http::HANDOFF || i == condense_summarize::http::RECOVERY_HANDOFF => Some("handoff"),
        Some(i) if i == condense_summarize::http::SYSTEM => Some("batch"),
        _ => None,
    };
    if let Some(kind) = kind {
        let input = summary_input(api, &logged.body);
        let model = model_of(&logged);
        logged.summary = Some(kind);
        let (fail, delay) = {
            let mut s = state.lock().expect("fake lock");
            s.log.push(logged);
            (s.fail_summaries, s.summary_delay_ms)
        };
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        if fail {
            return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": "summaries are down", "type": "api_error"}}))).into_response();
        }
        return axum::Json(text_reply(api, &model, &summary_answer(kind, &input))).into_response();
    }
    let messages = logged.messages();
    let tools = logged.tool_names();
    let (step, n, delay) = {
        let mut s = state.lock().expect("fake lock");
        s.counter += 1;
        let mut step = None;
        let mut delay = 0;
        while s.next < s.steps.len() {
            let st = s.steps[s.next].clone();
            s.next += 1;
            if let Step::Slow(ms) = st {
                delay += ms;
                continue;
            }
            if st == Step::QueryNewestStub && (newest_stub_ref(&messages).is_none() || !tools.iter().any(|t| t == condense_events::QUERY_TOOL_NAME)) {
                continue;
            }
            if st == Step::NewContext && !tools.iter().any(|t| t == NEW_CONTEXT_TOOL) {
                continue;
            }
            step = Some(st);
            break;
        }
        (step.unwrap_or(Step::Text("FAKE-FINAL: done".into())), s.counter, delay)
    };
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    logged.step = Some(step.clone());
    let stream = logged.body.get("stream").and_then(Value::as_bool).unwrap_or(false) || logged.path.ends_with(":streamGenerateContent");
    let model = model_of(&logged);
    state.lock().expect("fake lock").log.push(logged);
    let reply = match step {
        Step::Overflow => {
            let body = match api {
                Api::Anthropic => json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"}}),
                Api::Gemini => json!({"error": {"code": 400, "message": "The input token count (1250000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}),
                _ => json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 250000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
            };
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
        Step::Fail(status, message) => {
            return (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(json!({"error": {"message": message, "type": "api_error"}}))).into_response();
        }
        Step::Shell(cmd) => {
            let (name, args) = shell_call(&tools, &cmd);
            Reply { text: String::new(), calls: vec![(format!("call_{n}"), name, args)] }
        }
        Step::QueryNewestStub => {
            let r = newest_stub_ref(&messages).expect("checked");
            Reply { text: format!("Let me look at {r} again."), calls: vec![(format!("call_{n}"), condense_events::QUERY_TOOL_NAME.to_string(), json!({"refs": [r]}))] }
        }
        Step::Call(name, args) => Reply { text: String::new(), calls: vec![(format!("call_{n}"), name, args)] },
        Step::NewContext => Reply { text: String::new(), calls: vec![(format!("call_{n}"), NEW_CONTEXT_TOOL.to_string(), json!({}))] },
        Step::Text(t) => Reply { text: t, calls: Vec::new() },
        Step::Raw(content_type, body) => return (StatusCode::OK, [("content-type", content_type)], body).into_response(),
        Step::Garbled(t) if stream => {
            let mut events: Vec<Result<bytes::Bytes, std::io::Error>> = vec![Ok(bytes::Bytes::from_static(b"\xff\xfe: not UTF-8\n\n"))];
            events.extend(sse_events(api, &model, n, &Reply { text: t, calls: Vec::new() }).into_iter().map(Ok));
            return (StatusCode::OK, [("content-type", "text/event-stream")], Body::from_stream(futures_util::stream::iter(events))).into_response();
        }
        Step::Garbled(t) => Reply { text: t, calls: Vec::new() },
        Step::Slow(_) => unreachable!("a delay is folded into the step after it"),
        Step::Drop => {
            let events = sse_events(api, &model, n, &Reply { text: "this reply never ends".into(), calls: Vec::new() });
            let half: Vec<Result<bytes::Bytes, std::io::Error>> = events.into_iter().take(2).map(Ok).collect();
            // The break comes after the first events are out, as a provider's dropped connection does.
            let broken = futures_util::stream::iter(half).chain(futures_util::stream::once(async {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Err(std::io::Error::other("dropped"))
            }));
            return (StatusCode::OK, [("content-type", "text/event-stream")], Body::from_stream(broken)).into_response();
        }
    };
    if stream {
        let events: Vec<Result<bytes::Bytes, std::io::Error>> = sse_events(api, &model, n, &reply).into_iter().map(Ok).collect();
        (StatusCode::OK, [("content-type", "text/event-stream")], Body::from_stream(futures_util::stream::iter(events))).into_response()
    } else {
        axum::Json(json_reply(api, &model, n, &reply)).into_response()
    }
}

fn usage(api: Api) -> Value {
    match api {
        Api::Anthropic => json!({"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 10}),
        Api::Chat => json!({"prompt_tokens": 150, "completion_tokens": 20, "total_tokens": 170, "prompt_tokens_details": {"cached_tokens": 50}}),
        Api::Responses => json!({"input_tokens": 150, "output_tokens": 20, "total_tokens": 170, "input_tokens_details": {"cached_tokens": 50}}),
        Api::Gemini => json!({"promptTokenCount": 150, "candidatesTokenCount": 20, "totalTokenCount": 170, "cachedContentTokenCount": 50}),
    }
}

/// The model a request names: in its body, or (Gemini) its path.
fn model_of(l: &Logged) -> String {
    let from_path = l.path.rsplit_once('/').and_then(|(_, t)| t.split_once(':')).map(|(m, _)| m.to_string());
    l.body.get("model").and_then(Value::as_str).map(str::to_string).or(from_path).unwrap_or_else(|| "fake-model".into())
}

/// A Gemini reply's parts: the text, then the calls (without ids, as the Gemini API gives them).
fn gemini_parts(r: &Reply) -> Vec<Value> {
    let mut parts = Vec::new();
    if !r.text.is_empty() {
        parts.push(json!({ "text": r.text }));
    }
    for (_, name, args) in &r.calls {
        parts.push(json!({"functionCall": {"name": name, "args": args}}));
    }
    parts
}

fn json_reply(api: Api, model: &str, n: u64, r: &Reply) -> Value {
    match api {
        Api::Anthropic => {
            let mut content = Vec::new();
            if !r.text.is_empty() {
                content.push(json!({"type": "text", "text": r.text}));
            }
            for (id, name, args) in &r.calls {
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": args}));
            }
            let stop = if r.calls.is_empty() { "end_turn" } else { "tool_use" };
            json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model, "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage(api)})
        }
        Api::Chat => {
            let mut msg = json!({"role": "assistant", "content": if r.text.is_empty() { Value::Null } else { json!(r.text) }});
            if !r.calls.is_empty() {
                msg["tool_calls"] = r.calls.iter().map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})).collect();
            }
            let finish = if r.calls.is_empty() { "stop" } else { "tool_calls" };
            json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 0, "model": model, "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage(api)})
        }
        Api::Responses => json!({"id": format!("resp_{n}"), "object": "response", "status": "completed", "model": model, "output": responses_items(n, r), "usage": usage(api)}),
        Api::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": gemini_parts(r)}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage(api),
            "modelVersion": model,
            "responseId": format!("resp_{n}"),
        }),
    }
}

fn responses_items(n: u64, r: &Reply) -> Vec<Value> {
    let mut items = Vec::new();
    if !r.text.is_empty() {
        items.push(json!({"type": "message", "id": format!("msg_{n}"), "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": r.text, "annotations": []}]}));
    }
    for (id, name, args) in &r.calls {
        items.push(json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": name, "arguments": args.to_string(), "status": "completed"}));
    }
    items
}

fn ev(event: Option<&str>, data: &Value) -> bytes::Bytes {
    crate::stream::sse(event, &data.to_string())
}

fn sse_events(api: Api, model: &str, n: u64, r: &Reply) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    match api {
        Api::Anthropic => {
            out.push(ev(Some("message_start"), &json!({"type": "message_start", "message": {"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 100, "output_tokens": 1, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 10}}})));
            let mut i = 0;
            if !r.text.is_empty() {
                out.push(ev(Some("content_block_start"), &json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})));
                let mid = r.text.char_indices().nth(r.text.chars().count() / 2).map_or(0, |(b, _)| b);
                for part in [&r.text[..mid], &r.text[mid..]] {
                    out.push(ev(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": part}})));
                }
                out.push(ev(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": i})));
                i += 1;
            }
            for (id, name, args) in &r.calls {
                out.push(ev(Some("content_block_start"), &json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
                let s = args.to_string();
                let mid = s.len() / 2;
                let mid = (0..=mid).rev().find(|m| s.is_char_boundary(*m)).unwrap_or(0);
                for part in [&s[..mid], &s[mid..]] {
                    out.push(ev(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": part}})));
                }
                out.push(ev(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": i})));
                i += 1;
            }
            let stop = if r.calls.is_empty() { "end_turn" } else { "tool_use" };
            out.push(ev(Some("message_delta"), &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 20}})));
            out.push(ev(Some("message_stop"), &json!({"type": "message_stop"})));
        }
        Api::Chat => {
            let base = |choices: Value| json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices});
            out.push(ev(None, &base(json!([{"index": 0, "delta": {"role": "assistant", "content": if r.text.is_empty() { Value::Null } else { json!(r.text) }}, "finish_reason": null}]))));
            for (i, (id, name, args)) in r.calls.iter().enumerate() {
                out.push(ev(None, &base(json!([{"index": 0, "delta": {"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}, "finish_reason": null}]))));
                out.push(ev(None, &base(json!([{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": args.to_string()}}]}, "finish_reason": null}]))));
            }
            let finish = if r.calls.is_empty() { "stop" } else { "tool_calls" };
            out.push(ev(None, &base(json!([{"index": 0, "delta": {}, "finish_reason": finish}]))));
            let mut u = base(json!([]));
            u["usage"] = usage(Api::Chat);
            out.push(ev(None, &u));
            out.push(crate::stream::sse(None, "[DONE]"));
        }
        Api::Responses => {
            let mut seq = 0;
            let mut e = |out: &mut Vec<bytes::Bytes>, mut v: Value| {
                v["sequence_number"] = json!(seq);
                seq += 1;
                let t = v["type"].as_str().unwrap_or("").to_string();
                out.push(ev(Some(&t), &v));
            };
            e(&mut out, json!({"type": "response.created", "response": {"id": format!("resp_{n}"), "model": model, "status": "in_progress", "output": []}}));
            for (i, item) in responses_items(n, r).into_iter().enumerate() {
                let mut added = item.clone();
                added["status"] = json!("in_progress");
                e(&mut out, json!({"type": "response.output_item.added", "output_index": i, "item": added}));
                if item["type"] == "message" {
                    e(&mut out, json!({"type": "response.output_text.delta", "output_index": i, "content_index": 0, "item_id": item["id"], "delta": r.text}));
                } else {
                    e(&mut out, json!({"type": "response.function_call_arguments.delta", "output_index": i, "item_id": item["id"], "delta": item["arguments"]}));
                }
                e(&mut out, json!({"type": "response.output_item.done", "output_index": i, "item": item}));
            }
            e(&mut out, json!({"type": "response.completed", "response": {"id": format!("resp_{n}"), "model": model, "status": "completed", "output": responses_items(n, r), "usage": usage(Api::Responses)}}));
        }
        Api::Gemini => {
            // The text in two chunks, the calls in one each, the last chunk with the finish reason and
            // the usage (as the Gemini API streams).
            let chunk = |parts: Vec<Value>, last: bool| {
                let mut c = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], "modelVersion": model, "responseId": format!("resp_{n}")});
                if last {
                    c["candidates"][0]["finishReason"] = json!("STOP");
                    c["usageMetadata"] = usage(Api::Gemini);
                }
                c
            };
            let mut chunks = Vec::new();
            if !r.text.is_empty() {
                let mid = r.text.char_indices().nth(r.text.chars().count() / 2).map_or(0, |(b, _)| b);
                chunks.push(vec![json!({ "text": &r.text[..mid] })]);
                chunks.push(vec![json!({ "text": &r.text[mid..] })]);
            }
            for (_, name, args) in &r.calls {
                chunks.push(vec![json!({"functionCall": {"name": name, "args": args}})]);
            }
            let count = chunks.len();
            for (k, parts) in chunks.into_iter().enumerate() {
                out.push(ev(None, &chunk(parts, k + 1 == count)));
            }
            if count == 0 {
                out.push(ev(None, &chunk(vec![json!({ "text": "" })], true)));
            }
        }
    }
    out
}
