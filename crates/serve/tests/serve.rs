//! `condense serve` against a scripted fake provider on loopback, driven by a small agent that behaves
//! as a coding agent does: it resends its whole history every request, runs the shell tool calls it gets
//! for real, and stops at a text reply. Each API is exercised streaming and not.

use condense_engine::config::ModelLimits;
use condense_events::{Block, Message};
use condense_formats::wire::{self, Api};
use condense_serve::fake::{newest_stub_ref, Fake, Logged, Step};
use condense_serve::{start, Running, ServeConfig};
use serde_json::{json, Value};
use std::path::Path;

mod dashboard;

/// A minimal agent: its history in the API's wire form, a `bash` tool it runs for real.
struct Agent {
    api: Api,
    stream: bool,
    base: String,
    history: Vec<Value>,
    headers: Vec<(String, String)>,
    model: String,
    http: reqwest::Client,
    /// Every reply the agent got, as it saw it.
    seen: Vec<Message>,
    /// The output of every command it ran, in order.
    outputs: Vec<String>,
    /// Servers to send requests to in turn, when there are several (else `base`).
    bases: Vec<String>,
    /// Requests sent.
    sent: usize,
    /// Fields set in every request body besides the usual (a reasoning setting).
    extra: Vec<(String, Value)>,
}

fn bash_tool(api: Api) -> Value {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]});
    match api {
        Api::Anthropic => json!({"name": "bash", "description": "Run a shell command", "input_schema": schema}),
        Api::Chat => json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": schema}}),
        Api::Responses => json!({"type": "function", "name": "bash", "description": "Run a shell command", "parameters": schema}),
        Api::Gemini => json!({"functionDeclarations": [{"name": "bash", "description": "Run a shell command", "parameters": schema}]}),
    }
}

impl Agent {
    fn new(api: Api, stream: bool, base: &str) -> Agent {
        let history = match api {
            Api::Anthropic => Vec::new(),
            Api::Chat => vec![json!({"role": "system", "content": "You are a test agent."})],
            Api::Responses => vec![json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a test agent."}]})],
            Api::Gemini => Vec::new(),
        };
        Agent {
            api,
            stream,
            base: base.to_string(),
            history,
            headers: vec![("x-api-key".into(), "sk-test-SECRET-key-0123".into()), ("authorization".into(), "Bearer sk-test-SECRET-bearer-4567".into())],
            model: "fake-model".into(),
            http: reqwest::Client::new(),
            seen: Vec::new(),
            outputs: Vec::new(),
            bases: Vec::new(),
            sent: 0,
            extra: Vec::new(),
        }
    }

    fn user(&mut self, text: &str) {
        self.history.push(match self.api {
            Api::Anthropic | Api::Chat => json!({"role": "user", "content": text}),
            Api::Responses => json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}),
            Api::Gemini => json!({"role": "user", "parts": [{ "text": text }]}),
        });
    }

    fn body(&self) -> Value {
        let mut b = json!({"model": self.model, "stream": self.stream, "tools": [bash_tool(self.api)]});
        if self.api == Api::Gemini {
            // The model and streaming are in the path.
            b = json!({"systemInstruction": {"parts": [{"text": "You are a test agent."}]}, "tools": [bash_tool(self.api)]});
        }
        for (k, v) in &self.extra {
            b[k.as_str()] = v.clone();
        }
        b[self.api.list_field()] = Value::Array(self.history.clone());
        if self.api == Api::Anthropic {
            b["max_tokens"] = json!(4096);
            b["system"] = json!([{"type": "text", "text": "You are a test agent.", "cache_control": {"type": "ephemeral"}}]);
            // The client marks its last message, as Claude Code does.
            if let Some(last) = b["messages"].as_array_mut().and_then(|m| m.last_mut()) {
                wire::mark_cache(last, &json!({"type": "ephemeral"}));
            }
        }
        b
    }

    fn path(&self) -> String {
        match self.api {
            Api::Anthropic => "/v1/messages".into(),
            Api::Chat => "/v1/chat/completions".into(),
            Api::Responses => "/v1/responses".into(),
            // The key in the query, as Gemini clients may send it.
            Api::Gemini if self.stream => format!("/v1beta/models/{}:streamGenerateContent?alt=sse&key=sk-test-SECRET-query-89", self.model),
            Api::Gemini => format!("/v1beta/models/{}:generateContent?key=sk-test-SECRET-query-89", self.model),
        }
    }

    /// One request; the reply as the agent saw it (or the error status and body).
    async fn request(&mut self) -> Result<Message, (u16, String)> {
        let base = if self.bases.is_empty() { &self.base } else { &self.bases[self.sent % self.bases.len()] };
        self.sent += 1;
        let mut rb = self.http.post(format!("{base}{}", self.path())).header("content-type", "application/json").body(self.body().to_string());
        for (k, v) in &self.headers {
            rb = rb.header(k, v);
        }
        let resp = rb.send().await.map_err(|e| (0, e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err((status, resp.text().await.unwrap_or_default()));
        }
        let reply = if self.stream {
            let text = resp.text().await.map_err(|e| (0, e.to_string()))?;
            let mut codec = condense_serve::stream::codec(self.api, Box::new(|_| false), 0);
            let mut sink = Vec::new();
            for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
                let mut event = String::new();
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push(d);
                    }
                }
                codec.feed(&event, &data.join("\n"), &mut sink);
            }
            assert!(codec.complete(), "the stream the client got is complete:\n{text}");
            codec.reply().0
        } else {
            let v: Value = serde_json::from_slice(&resp.bytes().await.map_err(|e| (0, e.to_string()))?).map_err(|e| (0, e.to_string()))?;
            condense_serve::api::reply_of(self.api, &v).expect("a reply").0
        };
        Ok(reply)
    }

    /// A user turn: runs tool calls until the model answers with text; returns that text.
    async fn turn(&mut self, prompt: &str) -> Result<String, (u16, String)> {
        self.user(prompt);
        self.run().await
    }

    /// Requests until the model answers with text (running its tool calls); returns that text.
    async fn run(&mut self) -> Result<String, (u16, String)> {
        for _ in 0..50 {
            let reply = self.request().await?;
            for (_, name, _) in reply.tool_calls() {
                assert!(!condense_engine::tools::is_condense_tool(name), "the client saw condense's tool `{name}`");
            }
            self.seen.push(reply.clone());
            let out = wire::from_neutral(self.api, &reply).expect("a reply the API can carry");
            self.history.extend(wire::assemble(self.api, vec![out]));
            let calls: Vec<(String, String)> = reply
                .tool_calls()
                .map(|(id, _, args)| (id.to_string(), serde_json::from_str::<Value>(args).ok().and_then(|a| a["command"].as_str().map(str::to_string)).unwrap_or_default()))
                .collect();
            if calls.is_empty() {
                return Ok(reply.text());
            }
            let mut results = Vec::new();
            for (id, cmd) in calls {
                let out = std::process::Command::new("sh").arg("-c").arg(&cmd).output().expect("sh");
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                self.outputs.push(text.clone());
                let m = Message::ToolResult { call_id: id, tool_name: "bash".into(), content: vec![Block::Text { text }], is_error: false };
                results.push(wire::from_neutral(self.api, &m).expect("a result"));
            }
            self.history.extend(wire::assemble(self.api, results));
        }
        panic!("the turn did not end");
    }
}

struct Setup {
    fake: Fake,
    serve: Running,
    dir: tempfile::TempDir,
}

/// A server's configuration on `store`, listening on a free loopback port, forwarding to `fake`.
fn config_for(store: impl Into<std::path::PathBuf>, fake: &Fake) -> ServeConfig {
    let mut cfg = ServeConfig::new(store);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.anthropic_upstream = fake.url();
    cfg.openai_upstream = format!("{}/v1", fake.url());
    cfg.gemini_upstream = format!("{}/v1beta", fake.url());
    // The scripts query stubs of the turn before: a rolling window of one keeps that turn's outputs as
    // stubs in place (with the default 0 the turn is folded into a chain block at the next prune).
    cfg.file.raw.rolling_window = Some(1.0);
    cfg
}

/// A server with the default configuration (the rolling window 0) in front of a fake with `steps`.
async fn with_defaults(steps: Vec<Step>) -> Setup {
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.file.raw.rolling_window = None;
    cfg.price_cache = true;
    let serve = start(cfg).await.expect("serve starts");
    Setup { fake, serve, dir }
}

async fn setup(steps: Vec<Step>, models: Vec<(String, ModelLimits)>) -> Setup {
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.file.models = models;
    let serve = start(cfg).await.expect("serve starts");
    Setup { fake, serve, dir }
}

impl Setup {
    fn url(&self) -> String {
        format!("http://{}", self.serve.addr)
    }

    async fn status(&self) -> Value {
        self.serve.state.status().await
    }

    /// Every byte condense wrote to disk, as one string (for "no secret was stored").
    fn store_bytes(&self) -> Vec<u8> {
        dir_bytes(self.dir.path())
    }
}

/// Every byte of the files under `dir`.
fn dir_bytes(dir: &Path) -> Vec<u8> {
    fn walk(p: &Path, out: &mut Vec<u8>) {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if let Ok(b) = std::fs::read(&p) {
                out.extend(b);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The text of the tool result answering `call_id` in a request, if it holds one.
fn result_text(messages: &[Message], call_id: &str) -> Option<String> {
    messages.iter().find_map(|m| match m {
        Message::ToolResult { call_id: c, .. } if c == call_id => Some(m.text()),
        _ => None,
    })
}

const BIG: &str = "seq 1 30000";

/// The whole path for one API and mode: recording, pruned later contexts, a condense tool call answered
/// by serve with the original byte for byte, the client never seeing it, and the log matching what the
/// client holds.
/// Turn one: three large outputs and a text reply; turn two: the model queries the newest stub, then
/// answers.
fn outputs_then_a_query() -> Vec<Step> {
    vec![
        Step::Shell(BIG.into()),
        Step::Shell("seq 2 30001".into()),
        Step::Shell("seq 3 30002".into()),
        Step::Text("turn one done".into()),
        Step::QueryNewestStub,
        Step::Text("found it".into()),
    ]
}

async fn full_path(api: Api, stream: bool) {
    let s = setup(outputs_then_a_query(), vec![]).await;
    let mut agent = Agent::new(api, stream, &s.url());
    assert_eq!(agent.turn("count the numbers").await.unwrap(), "turn one done");
    // One reply to the client: the text before the condense call and the continuation's, a paragraph apart
    // where the API has one text per message (Chat), in blocks or items of their own otherwise.
    let text = agent.turn("look at the last output again").await.unwrap();
    let expected = if api == Api::Chat { "Let me look at t3 again.\n\nfound it" } else { "Let me look at t3 again.found it" };
    assert_eq!(text, expected, "{api:?} stream={stream}");
    let log = s.fake.log();
    // Later requests carry stubs, not the outputs.
    let last_turn_one = log.iter().rposition(|l| l.step == Some(Step::Text("turn one done".into()))).unwrap();
    let msgs = log[last_turn_one].messages();
    let texts: Vec<String> = msgs.iter().filter(|m| matches!(m, Message::ToolResult { .. })).map(Message::text).collect();
    assert!(texts.iter().any(|t| t.contains("context_tree_query") && t.len() < 5000), "a stub in {texts:?}");
    let raw_total: usize = agent.outputs.iter().map(String::len).sum();
    let sent: usize = texts.iter().map(String::len).sum();
    assert!(sent * 4 < raw_total, "the fake received pruned context ({sent} of {raw_total} bytes)");
    // The query was answered by serve: the next request upstream carries its result, byte for byte.
    let q = log.iter().position(|l| l.step == Some(Step::QueryNewestStub)).expect("the model queried");
    let qmsgs = log[q].messages();
    let r = newest_stub_ref(&qmsgs).unwrap();
    assert_eq!(r, "t3");
    let cont = &log[q + 1];
    let cmsgs = cont.messages();
    let call_id = cmsgs.iter().flat_map(|m| m.tool_calls().filter(|(_, n, _)| *n == "context_tree_query").map(|(i, _, _)| i.to_string()).collect::<Vec<_>>()).last().expect("the query call is in the continuation");
    let answer = result_text(&cmsgs, &call_id).expect("the query's result");
    let original = &agent.outputs[2];
    let (header, body) = answer.split_once('\n').unwrap();
    assert!(header.starts_with("=== t3 · bash"), "{header}");
    assert_eq!(body, original, "the original comes back byte for byte");
    assert!(cont.tool_names().iter().any(|t| t == "context_tree_query"));
    // The session holds the history once: the client's view of it matches the log.
    let store = s.serve.state.store().clone();
    let sessions = store.sessions().unwrap();
    assert_eq!(sessions.len(), 1, "one conversation, one session");
    let session = store.session(&sessions[0].name).unwrap();
    let branch = session.projection().unwrap().branch_messages();
    let tool_results = branch.iter().filter(|m| matches!(***m, Message::ToolResult { .. })).count();
    assert_eq!(tool_results, 4, "three outputs and the query's result, each once");
    let status = s.status().await;
    assert_eq!(status["tool_rounds"], 1);
    assert!(status["stubs"].as_u64().unwrap() >= 2, "{status}");
    assert!(status["cache_read_tokens"].as_u64().unwrap() > 0);
    assert!(status["active_sessions"][0]["cache_priced"].is_null(), "pricing is off unless asked for: {status}");
    // Secrets passed through and were never stored or shown.
    let first = &log[0];
    assert_eq!(first.header("x-api-key"), Some("sk-test-SECRET-key-0123"));
    if api == Api::Gemini {
        // The key given in the query went upstream in the query, the model and method in the path.
        assert!(first.query.contains("key=sk-test-SECRET-query-89"), "{}", first.query);
        assert_eq!(first.path, format!("/v1beta/models/fake-model:{}", if stream { "streamGenerateContent" } else { "generateContent" }));
        assert!(first.header("x-condense-query-key").is_none(), "serve's own header went upstream");
    }
    assert_eq!(first.header("authorization"), Some("Bearer sk-test-SECRET-bearer-4567"));
    drop(session);
    drop(store);
    let bytes = s.store_bytes();
    assert!(!contains(&bytes, "SECRET"), "a secret reached the store");
    assert!(!status.to_string().contains("SECRET"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_json() {
    full_path(Api::Anthropic, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_json() {
    full_path(Api::Gemini, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_stream() {
    full_path(Api::Gemini, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_stream() {
    full_path(Api::Anthropic, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_json() {
    full_path(Api::Chat, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream() {
    full_path(Api::Chat, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_json() {
    full_path(Api::Responses, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_stream() {
    full_path(Api::Responses, true).await;
}

fn store_of(s: &Setup) -> (condense_engine::Store, condense_engine::Session) {
    let store = s.serve.state.store().clone();
    let sessions = store.sessions().unwrap();
    assert_eq!(sessions.len(), 1, "one session: {sessions:?}");
    let session = store.session(&sessions[0].name).unwrap();
    (store, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_history_moves_the_branch_and_a_retry_moves_the_leaf() {
    let s = setup(vec![Step::Text("one".into()), Step::Text("two".into()), Step::Text("two again".into()), Step::Text("other".into())], vec![]).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    agent.turn("first").await.unwrap();
    agent.turn("second").await.unwrap();
    let (_, session) = store_of(&s);
    let entries_before = session.projection().unwrap().entries();
    assert_eq!(entries_before, 4);
    // A retry of the same request (the client never got the reply): no new entry, the old reply leaves
    // the context.
    agent.history.pop();
    let again = agent.request().await.unwrap();
    assert_eq!(again.text(), "two again");
    let p = session.projection().unwrap();
    assert_eq!(p.entries(), 5, "only the new reply is recorded");
    let branch: Vec<String> = p.branch_messages().iter().map(|m| m.text()).collect();
    assert_eq!(branch, ["first", "one", "second", "two again"]);
    // The user rewinds to before the second prompt and asks something else: a branch from `one`.
    agent.history.pop();
    agent.turn("something else").await.unwrap();
    let p = session.projection().unwrap();
    assert_eq!(p.entries(), 7, "two new entries, nothing copied");
    let branch: Vec<String> = p.branch_messages().iter().map(|m| m.text()).collect();
    assert_eq!(branch, ["first", "one", "something else", "other"]);
    // Both earlier replies are still in the tree.
    let all: Vec<String> = p.tree().filter_map(|(_, _, m)| m.map(|m| m.text())).collect();
    assert!(all.contains(&"two".to_string()) && all.contains(&"two again".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_checkpoints_and_retries_once() {
    let s = setup(vec![Step::Shell("seq 1 3000".into()), Step::Text("done".into()), Step::Overflow, Step::Text("after the retry".into())], vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, true, &s.url());
    agent.turn("count").await.unwrap();
    assert_eq!(agent.turn("more").await.unwrap(), "after the retry");
    let log = s.fake.log();
    let retry = log.last().unwrap();
    let text: String = retry.messages().iter().map(|m| m.text()).collect();
    assert!(text.contains("[Checkpoint c1"), "the retry carries the checkpoint: {text}");
    let status = s.status().await;
    assert_eq!((status["overflows"].as_u64(), status["checkpoints"].as_u64()), (Some(1), Some(1)), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_overflow_reaches_the_client_as_compaction_failed() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses] {
        let s = setup(vec![Step::Text("done".into()), Step::Overflow, Step::Overflow, Step::Text("never".into())], vec![]).await;
        let mut agent = Agent::new(api, false, &s.url());
        agent.turn("one").await.unwrap();
        let (status, body) = agent.turn("two").await.unwrap_err();
        assert_eq!(status, 400);
        let v: Value = serde_json::from_str(&body).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with("CONTEXT_COMPACTION_FAILED"), "{msg}");
        if api == Api::Anthropic {
            assert_eq!(v["type"], "error");
        }
        assert_eq!(s.fake.log().len(), 3, "one request, one retry, nothing more");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_model_goes_through_the_payload_guard_and_recovery() {
    let models = vec![
        ("big-model".to_string(), ModelLimits { context_window: 200_000, max_output: Some(8_000) }),
        ("small-model".to_string(), ModelLimits { context_window: 16_000, max_output: Some(2_000) }),
    ];
    let s = setup(vec![], models).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    agent.model = "big-model".into();
    for i in 0..4 {
        let long: String = (0..2500).map(|n| format!("w{i}x{n} ")).collect();
        agent.turn(&long).await.unwrap();
    }
    agent.model = "small-model".into();
    agent.turn("now continue on the small model").await.unwrap();
    let log = s.fake.log();
    let last = log.last().unwrap();
    let bytes = serde_json::to_vec(&last.body).unwrap().len();
    let budget = condense_checkpoint_budget(16_000, 2_000);
    assert!((bytes as u64) <= budget * 4, "the request after the switch fits: {bytes} bytes");
    assert!(last.tool_names().iter().any(|t| t == "history_search"), "{:?}", last.tool_names());
    let (_, session) = store_of(&s);
    assert_eq!(session.projection().unwrap().index().archives.len(), 1);
}

fn condense_checkpoint_budget(window: u64, out: u64) -> u64 {
    let m = condense_engine::config::ModelLimits { context_window: window, max_output: Some(out) };
    let _ = m;
    // The hard budget as the controller computes it.
    let b = condense_checkpoint::Budget::new(window, Some(out), condense_checkpoint::DEFAULT_RESERVE);
    b.hard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_in_the_api_format() {
    let fake = Fake::start(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(dir.path().join("store"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.anthropic_upstream = fake.url();
    cfg.openai_upstream = fake.url();
    cfg.max_body_bytes = 10_000;
    let serve = start(cfg).await.unwrap();
    let http = reqwest::Client::new();
    let post = |path: &str, body: Vec<u8>| http.post(format!("http://{}{path}", serve.addr)).header("content-type", "application/json").body(body).send();
    let r = post("/v1/messages", vec![b'x'; 20_000]).await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["type"], "error");
    let r = post("/v1/chat/completions", b"{not json".to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("not JSON"));
    let r = post("/v1/messages", json!({"model": "m", "messages": [{"role": "pilot", "content": "x"}]}).to_string().into_bytes()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("messages[0]: unknown role `pilot`"), "{v}");
    let r = post("/v1/responses", json!({"model": "m", "input": 5}).to_string().into_bytes()).await.unwrap();
    assert_eq!(r.status(), 400);
    // Broken JSON the body's one-pass scan steps over (inside a message, or in another field) is still
    // refused, naming where it is (the scan reads only the structure: serde_json reads the rest).
    let r = post("/v1/chat/completions", br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"} {"x":1}]}]}"#.to_vec()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("messages[0]"), "{v}");
    for body in [r#"{"model":"m","temperature":1.2.3,"messages":[{"role":"user","content":"x"}]}"#, r#"{"model":"m","stream":tru,"messages":[{"role":"user","content":"x"}]}"#, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\u{1}b\"}]}"] {
        let r = post("/v1/chat/completions", body.as_bytes().to_vec()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("not JSON") || message.contains("messages[0]"), "{body}: {v}");
    }
    // The Gemini API: its error shape, the place named in `contents`.
    let gemini = "/v1beta/models/gemini-2.5-flash:generateContent";
    for (body, says) in [
        (b"{not json".to_vec(), "not JSON"),
        (json!({"contents": [{"role": "pilot", "parts": [{"text": "x"}]}]}).to_string().into_bytes(), "contents[0]: unknown role `pilot`"),
    ] {
        let r = post(gemini, body).await.unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!((v["error"]["code"].as_u64(), v["error"]["status"].as_str()), (Some(400), Some("INVALID_ARGUMENT")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{v}");
    }
    assert!(fake.log().is_empty(), "nothing bad went upstream");
    // Each refusal is condense's own failure, counted by API and code (issue 62, item 2).
    let m = metric_values(&reqwest::get(format!("http://{}/condense/metrics", serve.addr)).await.unwrap().text().await.unwrap());
    let failures = |api: &str, code: &str| m.get(&format!(r#"condense_request_failures_total{{api="{api}",code="{code}"}}"#)).copied();
    assert_eq!(failures("anthropic", "too_large"), Some(1.0), "{m:?}");
    assert_eq!(failures("chat", "bad_request"), Some(5.0), "{m:?}");
    assert_eq!(failures("anthropic", "bad_request"), Some(1.0), "{m:?}");
    assert_eq!(failures("responses", "bad_request"), Some(1.0), "{m:?}");
    assert_eq!(failures("gemini", "bad_request"), Some(2.0), "{m:?}");
}

/// Messages condense leaves unchanged go upstream exactly as the client wrote them — spacing, key order,
/// escapes — whether read this request or matched from the last, and however many follow each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_messages_go_upstream_as_the_client_wrote_their_bytes() {
    let s = setup(vec![Step::Text("ok".into()), Step::Text("again".into())], vec![]).await;
    let http = reqwest::Client::new();
    let history = [
        r#"{"role" : "user",  "content":"caf\u00e9 \/ one"}"#,
        r#"{"content":"ok","role":"assistant" , "name":"x"}"#,
        r#"{"role":"user","content":[ {"type":"text","text":"two"} , {"text":"three","type":"text"} ]}"#,
    ];
    let more = [r#"{"role":"assistant","content":"again"}"#, r#"{ "role":"user","content":"four" }"#];
    for list in [history.join(" ,\n  "), format!("{},{}", history.join(","), more.join(" , "))] {
        let body = format!(r#"{{"model":"m","messages":[ {list} ]}}"#);
        let r = http.post(format!("{}/v1/chat/completions", s.url())).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let log = s.fake.log();
    assert_eq!(log.len(), 2);
    let first = String::from_utf8(log[0].raw.to_vec()).unwrap();
    assert!(first.contains(&history.join(",")), "{first}");
    let second = String::from_utf8(log[1].raw.to_vec()).unwrap();
    assert!(second.contains(&format!("{},{}", history.join(","), more.join(","))), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_pass_through_and_a_down_upstream_is_502() {
    let s = setup(vec![Step::Fail(429, "slow down".into()), Step::Text("ok".into())], vec![]).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    let (status, body) = agent.turn("hi").await.unwrap_err();
    assert_eq!(status, 429);
    assert!(body.contains("slow down"));
    assert_eq!(agent.request().await.unwrap().text(), "ok");
    // An upstream that is not there.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(dir.path().join("store"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    cfg.openai_upstream = format!("http://{closed}");
    let serve = start(cfg).await.unwrap();
    let mut agent = Agent::new(Api::Chat, true, &format!("http://{}", serve.addr));
    let (status, body) = agent.turn("hi").await.unwrap_err();
    assert_eq!(status, 502);
    assert!(body.contains("upstream unreachable"), "{body}");
    // The cause is named (issue 35, item 8), and the upstream's address with it is not repeated.
    assert!(body.to_lowercase().contains("connection refused"), "the cause is named: {body}");
    assert!(!body.contains(&closed.to_string()), "{body}");
}

/// The metric lines of `text` (Prometheus text format) as name-with-labels → value.
fn metric_values(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not a metric line: {l}"));
            (k.to_string(), v.parse().unwrap_or_else(|_| panic!("not a number: {l}")))
        })
        .collect()
}

/// `/condense/metrics` (Prometheus text format): requests and serve's own time per API, tokens received
/// and sent, upstream errors by status, overflows, checkpoints, cache-priced cost: each what
/// `/condense/status` says, or what the script made happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_happened_as_status_does() {
    let steps = vec![Step::Text("one".into()), Step::Fail(429, "slow down".into()), Step::Overflow, Step::Text("two".into()), Step::Text("three".into())];
    let s = with_defaults(steps).await;
    let mut chat = Agent::new(Api::Chat, false, &s.url());
    assert_eq!(chat.turn("first question").await.unwrap(), "one");
    assert_eq!(chat.turn("second question").await.unwrap_err().0, 429);
    // The provider overflows once: a checkpoint and a retry.
    assert_eq!(chat.request().await.unwrap().text(), "two");
    let mut anthropic = Agent::new(Api::Anthropic, true, &s.url());
    assert_eq!(anthropic.turn("another conversation").await.unwrap(), "three");
    let resp = reqwest::get(format!("{}/condense/metrics", s.url())).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().contains("openmetrics-text"));
    let m = metric_values(&resp.text().await.unwrap());
    let status = s.status().await;
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in {m:?}"));
    assert_eq!(get(r#"condense_requests_total{api="chat"}"#), 3.0);
    assert_eq!(get(r#"condense_requests_total{api="anthropic"}"#), 1.0);
    assert_eq!(get(r#"condense_requests_total{api="chat"}"#) + get(r#"condense_requests_total{api="anthropic"}"#), status["requests"].as_f64().unwrap());
    assert_eq!(get(r#"condense_own_seconds_count{api="chat"}"#), 3.0);
    assert!(get(r#"condense_own_seconds_sum{api="chat"}"#) > 0.0);
    assert_eq!(get(r#"condense_own_seconds_bucket{le="+Inf",api="anthropic"}"#), 1.0);
    assert_eq!(get("condense_tokens_received_total"), status["tokens_in"].as_f64().unwrap());
    assert_eq!(get("condense_tokens_sent_total"), status["tokens_sent"].as_f64().unwrap());
    assert!(get("condense_tokens_received_total") > 0.0);
    assert_eq!(get(r#"condense_upstream_errors_total{status="429"}"#), 1.0);
    assert_eq!(get("condense_overflows_total"), 1.0);
    assert_eq!(get("condense_overflows_total"), status["overflows"].as_f64().unwrap());
    assert_eq!(get("condense_sessions_warm"), 2.0);
    assert_eq!(get("condense_checkpoints"), status["checkpoints"].as_f64().unwrap());
    assert!(get("condense_checkpoints") >= 1.0, "the overflow's checkpoint");
    assert_eq!(get("condense_summarizer_fallbacks_total"), status["summarizer_fallbacks"].as_f64().unwrap());
    let priced: f64 = status["active_sessions"].as_array().unwrap().iter().filter_map(|c| c["cache_priced"]["condense"]["cost"].as_f64()).sum();
    assert!((get(r#"condense_cache_priced_cost{path="condense"}"#) - priced).abs() < 0.01 * priced.max(1.0), "{priced}");
    assert!(get(r#"condense_cache_priced_cost{path="direct"}"#) > 0.0);
    let floor: f64 = status["active_sessions"].as_array().unwrap().iter().filter_map(|c| c["cache_priced"]["floor"].as_f64()).sum();
    assert!(floor > 0.0 && (get(r#"condense_cache_priced_cost{path="floor"}"#) - floor).abs() < 0.01 * floor.max(1.0), "{floor}");
    assert!(floor < get(r#"condense_cache_priced_cost{path="direct"}"#));
    // Every numeric figure of /condense/status has its metric, with the same value (issue 62, item 3): a
    // figure added to status without one fails here. Series of one name are summed over their labels.
    let status = s.status().await;
    let m = metric_values(&reqwest::get(format!("{}/condense/metrics", s.url())).await.unwrap().text().await.unwrap());
    let series = |name: &str| -> Option<f64> {
        let v: Vec<f64> = m.iter().filter(|(k, _)| k.split('{').next() == Some(name)).map(|(_, v)| *v).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    fn renamed(key: &str) -> &str {
        match key {
            "tokens_in" => "tokens_received",
            "upstream_errors" => "upstream_error_answers",
            k => k,
        }
    }
    let mut checked = 0;
    for (key, value) in status.as_object().unwrap().iter().filter(|(_, v)| v.is_number()) {
        let name = format!("condense_{}", renamed(key));
        let metric = series(&format!("{name}_total")).or_else(|| series(&name)).unwrap_or_else(|| panic!("status figure `{key}` has no metric ({name})"));
        assert_eq!(metric, value.as_f64().unwrap(), "`{key}`");
        checked += 1;
    }
    assert!(checked >= 20, "{checked} figures");
    assert!(get("condense_output_tokens_total") > 0.0 && get("condense_upstream_error_answers_total") == 1.0);
}

/// `/condense/status` counts as docs/serve.md says (issue 37): a client request once, whatever condense's
/// rounds behind it, the same in the session and in all; tokens of whole requests, system prompt and tool
/// declarations included; the provider's usage as it reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_as_documented() {
    let s = setup(outputs_then_a_query(), vec![]).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    // A long system prompt: counted on both sides, as the provider counts it.
    agent.history[0] = json!({"role": "system", "content": "You are a careful agent. ".repeat(400)});
    agent.turn("count the numbers").await.unwrap();
    agent.turn("look at the last output again").await.unwrap();
    let status = s.status().await;
    let client_requests = agent.sent as u64;
    assert_eq!(status["requests"], client_requests, "{status}");
    assert_eq!(status["active_sessions"][0]["requests"], client_requests, "the session counts the same requests: {status}");
    assert_eq!(status["tool_rounds"], 1);
    // Every reply reported prompt_tokens 150 with 50 cached (the fake): as reported, and uncached.
    let replies = s.fake.log().len() as u64;
    assert_eq!(status["input_tokens"], 150 * replies, "{status}");
    assert_eq!(status["uncached_input_tokens"], 100 * replies, "{status}");
    assert_eq!(status["cache_read_tokens"], 50 * replies, "{status}");
    // The 9,600-character system prompt is in both token figures, once per client request received and
    // once per upstream request sent.
    let tokens_in = status["tokens_in"].as_u64().unwrap();
    let tokens_sent = status["tokens_sent"].as_u64().unwrap();
    assert!(tokens_in >= 2_400 * client_requests, "{tokens_in}");
    assert!(tokens_sent >= 2_400 * replies, "{tokens_sent}");
    assert_eq!(status["active_sessions"][0]["id"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_half_way_is_not_recorded() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses] {
        let s = setup(vec![Step::Drop, Step::Text("whole".into())], vec![]).await;
        let mut agent = Agent::new(api, true, &s.url());
        agent.user("hi");
        let mut rb = reqwest::Client::new().post(format!("{}{}", s.url(), agent.path())).header("content-type", "application/json").body(agent.body().to_string());
        for (k, v) in &agent.headers {
            rb = rb.header(k, v);
        }
        let resp = rb.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.text().await.is_err(), "the client's stream breaks as the upstream's did");
        let (_, session) = store_of(&s);
        let p = session.projection().unwrap();
        assert!(!p.branch_messages().iter().any(|m| matches!(**m, Message::Assistant { .. })), "no half reply recorded");
        // The client's retry succeeds and is recorded once.
        assert_eq!(agent.request().await.unwrap().text(), "whole");
        let p = session.projection().unwrap();
        assert_eq!(p.branch_messages().iter().filter(|m| matches!(***m, Message::Assistant { .. })).count(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_round_limit_ends_the_reply_and_says_so_in_the_log() {
    let call = || Step::Call("new_context".into(), json!({}));
    let fake = Fake::start(vec![call(), call(), call(), Step::Text("late".into())]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(dir.path().join("store"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.anthropic_upstream = fake.url();
    cfg.max_tool_rounds = 2;
    let serve = start(cfg).await.unwrap();
    let mut agent = Agent::new(Api::Anthropic, true, &format!("http://{}", serve.addr));
    agent.turn("go").await.unwrap();
    assert_eq!(fake.log().len(), 2, "two rounds, then the bound");
    let status = serve.state.status().await;
    assert_eq!(status["tool_round_limits"], 1);
    let store = serve.state.store().clone();
    let name = store.sessions().unwrap()[0].name.clone();
    let session = store.session(&name).unwrap();
    let events = store.log().read(session.id(), 1, session.head().unwrap()).unwrap();
    assert!(events.iter().any(|e| matches!(&e.body, condense_events::Event::Decision(condense_events::DecisionEvent::Note { text, .. }) if text.contains("tool round limit"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_messages_keep_their_bytes_and_the_cache_mark_moves_with_the_end() {
    let s = setup(vec![Step::Shell("echo a".into()), Step::Shell("echo b".into()), Step::Text("done".into()), Step::Text("again".into())], vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    agent.turn("one").await.unwrap();
    agent.turn("two").await.unwrap();
    let log = s.fake.log();
    // The client itself writes its marked last message as a block list and the same message unmarked as
    // a string a request later (Claude Code does the same): compare the two as equal.
    let strip = |v: &Value| {
        let mut v = v.clone();
        for m in v.as_array_mut().unwrap() {
            if let Some(Value::String(s)) = m.get("content").cloned() {
                m["content"] = json!([{"type": "text", "text": s}]);
            }
            if let Some(Value::Array(c)) = m.get_mut("content") {
                for b in c {
                    b.as_object_mut().map(|o| o.remove("cache_control"));
                }
            }
        }
        v
    };
    for w in log.windows(2) {
        let (a, b) = (strip(&w[0].body["messages"]), strip(&w[1].body["messages"]));
        let n = a.as_array().unwrap().len();
        assert_eq!(a.as_array().unwrap()[..n], b.as_array().unwrap()[..n], "the earlier messages go out byte for byte the same");
        // One mark in the messages, on the last one; the system prompt's mark untouched.
        let marks = w[1].body["messages"].to_string().matches("cache_control").count();
        assert_eq!(marks, 1);
        assert!(w[1].body["messages"].as_array().unwrap().last().unwrap().to_string().contains("cache_control"));
        assert_eq!(w[1].body["system"], json!([{"type": "text", "text": "You are a test agent.", "cache_control": {"type": "ephemeral"}}]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_are_told_apart_and_count_tokens_and_other_paths_pass_through() {
    let s = setup(vec![], vec![]).await;
    let mut a = Agent::new(Api::Chat, false, &s.url());
    a.headers.push(("x-condense-session".into(), "alpha".into()));
    let mut b = Agent::new(Api::Chat, false, &s.url());
    b.headers.push(("x-condense-session".into(), "beta".into()));
    let (ra, rb) = tokio::join!(a.turn("same words"), b.turn("same words"));
    ra.unwrap();
    rb.unwrap();
    let names: Vec<String> = s.serve.state.store().sessions().unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("chat/same-words/")), "{names:?}");
    let http = reqwest::Client::new();
    let r = http.post(format!("{}/v1/messages/count_tokens", s.url())).header("x-api-key", "k").body(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap()["input_tokens"], 42);
    let r = http.get(format!("{}/v1/models", s.url())).send().await.unwrap();
    assert_eq!(r.status(), 200, "other /v1/ paths reach the upstream");
    assert_eq!(s.fake.log().last().unwrap().path, "/v1/models");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_counts_what_condense_would_send_and_records_nothing() {
    let s = setup(vec![Step::Shell(BIG.into()), Step::Shell("seq 5 30004".into()), Step::Text("done".into())], vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    agent.turn("count").await.unwrap();
    agent.user("how many tokens is this?");
    let (_, session) = store_of(&s);
    let head = session.head().unwrap();
    let body = agent.body().to_string();
    let count = |headers: &[(String, String)]| {
        let mut rb = reqwest::Client::new().post(format!("{}/v1/messages/count_tokens", s.url())).header("content-type", "application/json").body(body.clone());
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        rb.send()
    };
    // Another key's count of the same words is not this conversation's: it goes upstream as it came.
    let r = count(&[("x-api-key".into(), "another-users-key".into())]).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.fake.log().last().unwrap().body.to_string().len(), serde_json::from_str::<Value>(&body).unwrap().to_string().len());
    let r = count(&agent.headers).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(session.head().unwrap(), head, "a count records nothing");
    let logged = s.fake.log().into_iter().rfind(|l| l.path.ends_with("/count_tokens")).expect("the count went upstream");
    let sent = logged.body.to_string();
    assert!(sent.len() * 4 < body.len(), "the count is of the pruned context ({} of {} bytes)", sent.len(), body.len());
    assert!(sent.contains("context_tree_query") && sent.contains("how many tokens is this?"));
    assert!(logged.tool_names().iter().any(|t| t == "context_tree_query"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_body_goes_through_unchanged() {
    let s = setup(vec![], vec![]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/responses", s.url()))
        .header("content-encoding", "zstd")
        .header("content-type", "application/json")
        .body(vec![0x28u8, 0xb5, 0x2f, 0xfd, 1, 2, 3])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the provider answered");
    let logged = s.fake.log().pop().expect("forwarded");
    assert_eq!(logged.path, "/v1/responses");
    assert_eq!(logged.header("content-encoding"), Some("zstd"));
    assert!(s.serve.state.store().sessions().unwrap().is_empty(), "nothing recorded");
    assert_eq!(s.status().await["passthrough"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_prompt_and_tool_declarations_are_counted_as_request_overhead() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses] {
        let s = setup(vec![Step::Text("one".into()), Step::Text("two".into())], vec![]).await;
        let mut agent = Agent::new(api, false, &s.url());
        agent.turn("first").await.unwrap();
        agent.turn("second").await.unwrap();
        let (store, session) = store_of(&s);
        // What the agent sends besides its conversation: the system prompt and the tool declarations.
        let body = agent.body();
        let mut bytes = serde_json::to_string(&body["tools"]).unwrap().len();
        bytes += match api {
            Api::Anthropic => serde_json::to_string(&body["system"]).unwrap().len(),
            _ => serde_json::to_string(&agent.history[0]).unwrap().len(),
        };
        let p = session.projection().unwrap();
        assert_eq!(p.request_overhead(), bytes.div_ceil(4) as u64, "{api:?}");
        // Recorded once: the same overhead on the second request writes nothing.
        let recorded = store
            .log()
            .read(session.id(), 1, session.head().unwrap())
            .unwrap()
            .iter()
            .filter(|e| matches!(e.body, condense_events::Event::Source(condense_events::SourceEvent::RequestOverhead { .. })))
            .count();
        assert_eq!(recorded, 1, "{api:?}");
    }
}

fn two_server_script() -> Vec<Step> {
    let mut steps = outputs_then_a_query();
    steps.extend([Step::Shell("seq 4 30003".into()), Step::Shell("seq 5 30004".into()), Step::Text("turn three done".into())]);
    steps
}

/// One conversation through `servers` (its requests sent to each in turn), all on the store `store`:
/// what the provider received, and the session's events as stored.
async fn run_conversation(api: Api, store: &str, servers: usize) -> (Vec<Value>, Vec<Vec<u8>>, Vec<Message>) {
    let fake = Fake::start(two_server_script()).await;
    let mut running = Vec::new();
    for _ in 0..servers {
        running.push(start(config_for(store, &fake)).await.expect("serve starts"));
    }
    let mut agent = Agent::new(api, false, &format!("http://{}", running[0].addr));
    agent.bases = running.iter().map(|r| format!("http://{}", r.addr)).collect();
    assert_eq!(agent.turn("count the numbers").await.unwrap(), "turn one done");
    let expected = if api == Api::Chat { "Let me look at t3 again.\n\nfound it" } else { "Let me look at t3 again.found it" };
    assert_eq!(agent.turn("look at the last output again").await.unwrap(), expected);
    assert_eq!(agent.turn("two more counts").await.unwrap(), "turn three done");
    assert!(agent.sent >= 6, "{} requests", agent.sent);
    let sent: Vec<Value> = fake.log().into_iter().map(|l| l.body).collect();
    for r in running {
        r.stop().await.unwrap();
    }
    // The PostgreSQL client blocks: it runs off the async threads, as serve runs the engine.
    let store = store.to_string();
    let (events, rendered) = tokio::task::spawn_blocking(move || {
        let store = condense_engine::Store::open(store).unwrap();
        let sessions = store.sessions().unwrap();
        assert_eq!(sessions.len(), 1, "one conversation, one session, whichever server took each request");
        // Each event as stored on its own (sled packs the events of one append into one value).
        let events: Vec<Vec<u8>> = store
            .log()
            .read(sessions[0].id, 1, sessions[0].head)
            .unwrap()
            .into_iter()
            .map(|e| condense_log::encode_event(sessions[0].id, e.seq, &e.body))
            .collect();
        let rendered: Vec<Message> = store.session(&sessions[0].name).unwrap().render().unwrap().messages.iter().map(|m| (**m).clone()).collect();
        (events, rendered)
    })
    .await
    .unwrap();
    (sent, events, rendered)
}

/// A new database of the shared test cluster (made off the async threads: the client blocks).
async fn pg_database() -> String {
    tokio::task::spawn_blocking(|| condense_log::testing::Cluster::shared().database()).await.unwrap()
}

/// Two `condense serve` instances on one PostgreSQL database, a client's consecutive requests alternating
/// between them: what the provider receives, the session's log (byte for byte) and its render are those of
/// one server on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_database_serve_a_conversation_as_one() {
    for api in [Api::Anthropic, Api::Chat] {
        let (one_sent, one_log, one_render) = run_conversation(api, &pg_database().await, 1).await;
        let (two_sent, two_log, two_render) = run_conversation(api, &pg_database().await, 2).await;
        assert_eq!(two_sent.len(), one_sent.len(), "{api:?}: requests upstream");
        for (i, (a, b)) in one_sent.iter().zip(&two_sent).enumerate() {
            assert_eq!(a, b, "{api:?}: upstream request {i} differs");
        }
        assert_eq!(two_log.len(), one_log.len(), "{api:?}: events");
        for (i, (a, b)) in one_log.iter().zip(&two_log).enumerate() {
            assert!(a == b, "{api:?}: event {} differs", i + 1);
        }
        assert_eq!(one_render, two_render, "{api:?}: render");
        // And the same as on the embedded store.
        let dir = tempfile::tempdir().unwrap();
        let (sled_sent, sled_log, _) = run_conversation(api, dir.path().join("store").to_str().unwrap(), 1).await;
        assert_eq!(sled_sent, one_sent, "{api:?}: sled and PostgreSQL sent different requests");
        assert_eq!(sled_log, one_log, "{api:?}: sled and PostgreSQL stored different events");
    }
}

/// With the defaults, a first turn of three calls (a large output and two long ones) ending in "turn one
/// done", then one turn per `(prompt, reply)`, through Chat Completions.
async fn three_outputs_then_turns(turns: &[(&str, &str)]) -> (Setup, Agent) {
    let mut steps = vec![Step::Shell(BIG.into()), Step::Shell("seq 2 30001".into()), Step::Shell("seq 3 30002".into()), Step::Text("turn one done".into())];
    steps.extend(turns.iter().map(|(_, reply)| Step::Text(reply.to_string())));
    let s = with_defaults(steps).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    assert_eq!(agent.turn("count the numbers").await.unwrap(), "turn one done");
    for (say, reply) in turns {
        assert_eq!(agent.turn(say).await.unwrap(), *reply);
    }
    (s, agent)
}

/// With the configuration condense ships (`rollingWindow` 0), a finished turn reaches the provider folded
/// into a chain block at the next prune: the prompt, the block naming its outputs' refs and the reply;
/// the model can query a ref the block names and gets the original back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_a_finished_turn_reaches_the_provider_as_a_chain_block() {
    let (s, agent) = three_outputs_then_turns(&[("thanks", "noted"), ("and now?", "still here")]).await;
    let log = s.fake.log();
    let last = log.last().unwrap().messages();
    let block = last.iter().map(Message::text).find(|t| t.starts_with("[Compressed chain b1")).unwrap_or_else(|| panic!("a chain block in {:#?}", last.iter().map(Message::text).collect::<Vec<_>>()));
    assert!(block.contains("t3"), "{block}");
    assert!(!last.iter().any(|m| matches!(m, Message::ToolResult { .. })), "no tool result of turn one is sent as it was");
    assert!(last.iter().any(|m| m.text() == "turn one done"), "the short reply follows the block");
    // The status page prices both sides as the provider bills caching: the chain block made the later
    // requests cheaper than the client's own.
    let priced = s.status().await["active_sessions"][0]["cache_priced"].clone();
    let (sent, direct) = (priced["condense"]["bytes"].as_u64().unwrap(), priced["direct"]["bytes"].as_u64().unwrap());
    let log_bytes: usize = log.iter().map(|l| condense_serve::billing::canonical(Api::Chat, &l.body).0.len()).sum();
    assert_eq!(sent as usize, log_bytes, "every request sent upstream is billed: {priced}");
    assert!(sent < direct, "{priced}");
    let ratio = priced["cost_vs_direct"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio < 1.0, "{priced}");
    // The ref the block names gives the original back.
    let (_, session) = store_of(&s);
    let answer = session.query(&["t3".into()]).unwrap();
    assert!(!answer.is_error);
    assert_eq!(answer.text.split_once('\n').unwrap().1, agent.outputs[2], "byte for byte");
}

/// Host context (issue 34), as Claude Code sends it: a `<system-reminder>` ahead of the first prompt and
/// an environment message of role `system` after it. With the defaults the first turn becomes a chain
/// block; the environment still reaches the provider in every request, verbatim, and the session is
/// named by what the user typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_environment_reaches_every_request_and_the_name_is_the_users_words() {
    let s = with_defaults(vec![
        Step::Shell(BIG.into()),
        Step::Shell("seq 2 30001".into()),
        Step::Text("turn one done".into()),
        Step::Text("noted".into()),
        Step::Text("still here".into()),
    ])
    .await;
    let mut agent = Agent::new(Api::Anthropic, true, &s.url());
    let env = json!({"role": "system", "content": "# Environment\nYou have been invoked in the following environment:\n - Primary working directory: /w"});
    agent.history.push(json!({"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAttribution for git commits and pull requests\n</system-reminder>"},
        {"type": "text", "text": "Count the numbers with seq"}
    ]}));
    agent.history.push(env.clone());
    assert_eq!(agent.run().await.unwrap(), "turn one done");
    assert_eq!(agent.turn("thanks").await.unwrap(), "noted");
    assert_eq!(agent.turn("and now?").await.unwrap(), "still here");
    // The client's cache mark is on its last message; the environment is compared without it.
    let unmarked = |m: &Value| {
        let mut m = m.clone();
        if let Some(Value::Array(blocks)) = m.get_mut("content") {
            for b in blocks.iter_mut() {
                b.as_object_mut().map(|o| o.remove("cache_control"));
            }
            if let [b] = &blocks[..] {
                if b["type"] == "text" {
                    let text = b["text"].clone();
                    m["content"] = text;
                }
            }
        }
        m
    };
    let log = s.fake.log();
    assert!(log.len() >= 5, "{} requests", log.len());
    for (i, l) in log.iter().enumerate() {
        let messages = l.body["messages"].as_array().unwrap();
        assert_eq!(messages.iter().filter(|m| unmarked(m) == env).count(), 1, "request {i} holds the environment once, verbatim: {messages:#?}");
    }
    let last: Vec<Value> = log.last().unwrap().body["messages"].as_array().unwrap().iter().map(unmarked).collect();
    assert!(last[0]["content"].to_string().contains("Count the numbers"), "the first message is the prompt: {last:#?}");
    assert_eq!(last[1], env, "the environment follows it: {last:#?}");
    assert!(last[2].to_string().contains("[Compressed chain b1"), "then the block: {last:#?}");
    let (store, _) = store_of(&s);
    let name = store.sessions().unwrap()[0].name.clone();
    assert!(name.contains("/count-the-numbers-with-seq/"), "{name}");
}

/// The prompt cache (issue 34): condense's tools are declared from the first request on, so the tool
/// list never changes under the cache; and when `new_context` checkpoints in a round serve runs itself,
/// the request it sends still carries the client's cache mark at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_list_is_stable_and_a_checkpoint_round_keeps_the_cache_mark() {
    let s = with_defaults(vec![Step::Shell(BIG.into()), Step::Shell("seq 2 30001".into()), Step::NewContext, Step::Text("checkpointed".into())]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    assert_eq!(agent.turn("count the numbers").await.unwrap(), "checkpointed");
    let log = s.fake.log();
    assert_eq!(log.len(), 4, "three client requests and serve's own round");
    let tools: Vec<Vec<String>> = log.iter().map(Logged::tool_names).collect();
    assert!(tools.iter().all(|t| t == &tools[0]) && tools[0].iter().any(|t| t == "new_context"), "{tools:?}");
    let (_, session) = store_of(&s);
    assert_eq!(session.projection().unwrap().index().checkpoints.len(), 1);
    let round = &log[3].body["messages"];
    let marked = round.as_array().unwrap().last().unwrap().to_string().contains("cache_control");
    assert!(marked, "the round after the checkpoint ends with the client's mark: {round:#}");
}

/// Issue 34, item 2: outputs a checkpoint took in no longer weigh on the budget trigger. Before, the
/// output read before a `new_context` (pending: its turn had not ended) still counted as read and
/// verbatim, so the next turn's first output was stubbed before the turn's final reply: a prune, and a
/// cache break, the turn after every mid-turn checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_behind_a_checkpoint_do_not_prune_the_next_turn_early() {
    // Twelve short turns (a session long enough for the cost guard to let a prune through), a turn that
    // reads two outputs of 14 KB and asks for a checkpoint, then a turn of two such outputs: the two
    // behind the checkpoint and the first of the new turn reach the 10,000-token budget together.
    let mut steps = Vec::new();
    for k in 1..=12 {
        steps.extend([Step::Shell(format!("seq {k} {}", 100 * k)), Step::Text(format!("turn {k} done"))]);
    }
    steps.extend([Step::Shell("seq 1 3000".into()), Step::Shell("seq 2 3001".into()), Step::NewContext, Step::Text("turn 13 done".into())]);
    steps.extend([Step::Shell("seq 4 3003".into()), Step::Shell("seq 5 3004".into()), Step::Text("turn 14 done".into())]);
    let s = setup(steps, vec![("fake-model".to_string(), ModelLimits { context_window: 200_000, max_output: Some(8_000) })]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    for k in 1..=14 {
        assert_eq!(agent.turn(&format!("turn {k}")).await.unwrap(), format!("turn {k} done"));
    }
    let log = s.fake.log();
    let last = log.iter().rfind(|l| l.step == Some(Step::Text("turn 14 done".into()))).expect("turn 14's last request");
    let first_output = agent_output_len(&last.messages(), "4\n5\n6\n");
    assert!(first_output > 13_000, "turn 14's first output went out as {first_output} characters before the turn ended");
    let (_, session) = store_of(&s);
    assert_eq!(session.projection().unwrap().index().checkpoints.len(), 1);
}

/// The length of the tool result whose text starts with `head` (0 when none does).
fn agent_output_len(messages: &[Message], head: &str) -> usize {
    messages.iter().filter_map(|m| match m {
        Message::ToolResult { .. } if m.text().starts_with(head) => Some(m.text().len()),
        _ => None,
    }).max().unwrap_or(0)
}

/// Issue 34, item 2: what serve sends after a checkpoint and after its own tool round is read from the
/// prompt cache by the request that follows (Anthropic billing: the longest prefix up to an earlier
/// request's mark). Before, the retry after an overflow sent the kept prompt and the client's prompt as
/// one message (the marked unit was read and merged) and the next request as two, and a
/// `context_tree_query` round left the client's mark on the prompt before it, so the next request paid
/// for the round's call and output again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_checkpoint_and_a_query_round_the_next_request_reads_them_from_the_cache() {
    let steps = vec![
        Step::Shell(BIG.into()),
        Step::Text("one done".into()),
        Step::Shell("seq 2 3001".into()),
        Step::Text("two done".into()),
        Step::Overflow,
        Step::Shell("seq 3 3002".into()),
        Step::Shell("seq 4 3003".into()),
        Step::Text("three done".into()),
        Step::QueryNewestStub,
        Step::Shell("seq 5 3004".into()),
        Step::Text("four done".into()),
    ];
    let s = setup(steps, vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    // The host's environment message first, as Claude Code sends it: after the checkpoint it stands
    // between the summary and the kept prompts, which then go out as the client's own units.
    agent.history.push(json!({"role": "system", "content": "# Environment\nWorking directory: /work"}));
    for (prompt, done) in [("one", "one done"), ("two", "two done"), ("three", "three done"), ("four", "four done")] {
        assert_eq!(agent.turn(prompt).await.unwrap(), done);
    }
    let log: Vec<Logged> = s.fake.log().into_iter().filter(|l| l.step != Some(Step::Overflow)).collect();
    let mut sim = condense_serve::billing::CacheSim::new(Api::Anthropic);
    let billed: Vec<_> = log.iter().map(|l| (l.step.clone(), sim.bill(&l.body))).collect();
    let text = |l: &Logged| l.messages().iter().map(|m| m.text()).collect::<String>();
    let retry = log.iter().position(|l| text(l).contains("[Checkpoint c1")).expect("a request carries the checkpoint");
    // serve's own round after the model's query is the request the next step answers.
    let round = log.iter().position(|l| l.step == Some(Step::Shell("seq 5 3004".into()))).expect("serve's round after the query");
    for (at, what) in [(retry, "the retry after the overflow checkpoint"), (round, "serve's query round")] {
        let (next, sent) = (&billed[at + 1].1, &billed[at].1);
        assert!(next.cached >= sent.bytes, "the request after {what} reads only {} of its {} bytes from the cache", next.cached, sent.bytes);
    }
}

/// Issue 34, item 2: after a checkpoint condense marks the end of what stays until the next one (the
/// summary, the host context, the kept prompts: Anthropic allows four marks and the client uses two
/// here). The chain of the turn that asked for the checkpoint is compressed turns later, in front of
/// the client's newer marks; without condense's mark that request re-sent everything after the system
/// prompt (here the 6 KB environment message with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_checkpoint_condense_marks_what_stays_and_a_later_chain_reads_it_from_the_cache() {
    let mut steps = Vec::new();
    for k in 1..=3 {
        steps.extend([Step::Shell(format!("seq {k} {}", 1000 * k)), Step::Text(format!("turn {k} done"))]);
    }
    steps.extend([Step::Shell("seq 4 3003".into()), Step::NewContext, Step::Text("turn 4 done".into())]);
    for k in 5..=7 {
        steps.extend([Step::Shell(format!("seq {k} {}", 3000 + k)), Step::Text(format!("turn {k} done"))]);
    }
    let s = setup(steps, vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    agent.history.push(json!({"role": "system", "content": format!("# Environment\n{}", "Working directory: /work/project\n".repeat(200))}));
    for k in 1..=7 {
        assert_eq!(agent.turn(&format!("turn {k}")).await.unwrap(), format!("turn {k} done"));
    }
    let log = s.fake.log();
    let mut sim = condense_serve::billing::CacheSim::new(Api::Anthropic);
    let billed: Vec<_> = log.iter().map(|l| sim.bill(&l.body)).collect();
    let checkpointed = |l: &Logged| l.messages().first().is_some_and(|m| m.text().starts_with("[Checkpoint c1"));
    let first = log.iter().position(checkpointed).expect("a request after the checkpoint");
    assert!(first + 4 < log.len(), "turns after the checkpoint");
    for (i, l) in log.iter().enumerate().skip(first) {
        assert!(checkpointed(l), "request {i} still opens with the checkpoint");
        let marks = l.body.to_string().matches("cache_control").count();
        assert!(marks <= 4, "request {i} has {marks} cache marks");
        let messages = l.body["messages"].as_array().unwrap();
        let opening = messages.iter().position(|m| m["role"] == "assistant").unwrap_or(messages.len()) - 1;
        assert!(messages[opening].to_string().contains("cache_control"), "request {i}: the last message before the first reply is not marked: {:#}", l.body["messages"]);
        if i > first {
            // What is new since the model's last message (its call and the output, or its reply and the
            // prompt) and little more goes at full price; a chain compressed in front of it too.
            let last_reply = messages.iter().rposition(|m| m["role"] == "assistant").unwrap_or(0);
            let new: usize = messages[last_reply..].iter().map(|m| m.to_string().len()).sum();
            let b = &billed[i];
            let full = (b.bytes - b.cached) as usize;
            assert!(full <= new + 2_000, "request {i} pays for {full} bytes at full price, {new} of them new");
        }
    }
}

/// Issue 35: two users whose conversations open with the same words, with and without a client id of
/// the same value, get a session each; the second one's query of `t1` never reads the first one's
/// output, and a condense tool serve did not declare is not answered from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_starting_alike_never_share_a_session() {
    const SECRET: &str = "aws_secret_access_key = AKIAOTHERUSERS0SECRET";
    for client_id in [None, Some("same-id")] {
        let steps = vec![
            Step::Shell(format!("echo '{SECRET}'; {BIG}")),
            Step::Text("first user done".into()),
            Step::Call("context_tree_query".into(), json!({"refs": ["t1"]})),
            Step::Text("second user done".into()),
            Step::Call("history_read".into(), json!({"archive": "a1", "entry": 1})),
            Step::Text("third round done".into()),
        ];
        let s = setup(steps, vec![]).await;
        let mut a = Agent::new(Api::Anthropic, false, &s.url());
        let mut b = Agent::new(Api::Anthropic, false, &s.url());
        b.headers = vec![("x-api-key".into(), "sk-test-other-users-key-89".into())];
        if let Some(id) = client_id {
            a.headers.push(("x-condense-session".into(), id.into()));
            b.headers.push(("x-condense-session".into(), id.into()));
        }
        assert_eq!(a.turn("fix the failing test").await.unwrap(), "first user done");
        assert_eq!(b.turn("fix the failing test").await.unwrap(), "second user done");
        let names: Vec<String> = s.serve.state.store().sessions().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names.len(), 2, "a session per user ({client_id:?}): {names:?}");
        let log = s.fake.log();
        for l in log.iter().filter(|l| l.header("x-api-key") == Some("sk-test-other-users-key-89")) {
            assert!(!l.body.to_string().contains("AKIAOTHERUSERS0SECRET"), "the second user's request carried the first one's output ({client_id:?})");
        }
        // The query was answered (from the second user's own session, which holds no `t1`).
        assert!(log.iter().any(|l| l.header("x-api-key") == Some("sk-test-other-users-key-89") && l.body.to_string().contains("t1")));
        // A history tool serve never declared (no archive yet) is not answered from the log: the client
        // gets the call as the model made it.
        let mut c = Agent::new(Api::Anthropic, false, &s.url());
        c.history.push(json!({"role": "user", "content": "one more"}));
        let reply = c.request().await.unwrap();
        assert!(reply.tool_calls().any(|(_, n, _)| n == "history_read"), "an undeclared condense tool reaches the client: {reply:?}");
    }
}

/// Issue 62, item 5: a PostgreSQL server that stops answering without refusing connections (every process
/// stopped) makes a request wait at most `STORE_STALL` and a tick: it is answered 503 with `retry-after`
/// and a message naming the store, within 10 s, as is one that arrives while the store still hangs; once
/// the server answers again, serve goes on by itself and the client's next request is a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_database_gets_a_503_within_seconds_and_serve_recovers_by_itself() {
    use condense_log::testing::Cluster;
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let url = tokio::task::block_in_place(|| cluster.database());
    let fake = Fake::start((0..20).map(|i| Step::Text(format!("reply {i}"))).collect()).await;
    let serve = start(config_for(&url, &fake)).await.expect("serve starts");
    let mut agent = Agent::new(Api::Anthropic, false, &format!("http://{}", serve.addr));
    agent.turn("before the hang").await.unwrap();
    tokio::task::block_in_place(|| cluster.pause());
    for k in 0..2 {
        agent.user(&format!("while it hangs {k}"));
        let t0 = std::time::Instant::now();
        let (status, body) = agent.request().await.expect_err("no answer while the store hangs");
        let waited = t0.elapsed();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("has not answered") && body.contains("PostgreSQL"), "{body}");
        assert!(waited < std::time::Duration::from_secs(10), "answered after {waited:?}");
        agent.history.pop();
    }
    // The status and the metrics answer while the store hangs (a request held the conversation then).
    for path in ["/condense/status", "/condense/metrics"] {
        let t0 = std::time::Instant::now();
        let r = reqwest::get(format!("http://{}{path}", serve.addr)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(3), "{path} answered after {:?}", t0.elapsed());
        if path == "/condense/status" {
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["busy"], true, "{text}");
        }
    }
    tokio::task::block_in_place(|| cluster.resume());
    // serve recovers by itself: what hung finishes once the database answers (the status is no longer
    // busy), and the next request is a 200.
    let mut busy = true;
    for _ in 0..100 {
        let v: Value = serde_json::from_slice(&reqwest::get(format!("http://{}/condense/status", serve.addr)).await.unwrap().bytes().await.unwrap()).unwrap();
        busy = v["busy"] == true;
        if !busy {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!busy, "serve still busy 10 s after the database answered");
    let reply = agent.turn("after the hang").await.unwrap();
    assert!(reply.starts_with("reply "), "{reply}");
    serve.stop().await.unwrap();
}

/// Issue 35, item 1, through serve on PostgreSQL, with one server and with two taking turns: every reply
/// the client got survives `pg_ctl stop -m immediate` right after it; the first requests after the
/// database comes back succeed (no stale pooled connection reaches a client); a session whose tail the
/// database lost (its head moved back under the servers) is folded again and the conversation carries
/// on; while the database is down a request fails within seconds with a 503 in the API's error format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_acknowledged_turns_survive_crashes_and_a_down_database_fails_fast() {
    use condense_log::testing::Cluster;
    let block = |f: &dyn Fn()| tokio::task::block_in_place(f);
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    for servers in [1usize, 2] {
        let url = tokio::task::block_in_place(|| cluster.database());
        let steps: Vec<Step> = (0..40).map(|i| Step::Text(format!("reply {i}"))).collect();
        let fake = Fake::start(steps).await;
        let mut running = Vec::new();
        for _ in 0..servers {
            running.push(start(config_for(&url, &fake)).await.expect("serve starts"));
        }
        let mut agent = Agent::new(Api::Anthropic, false, &format!("http://{}", running[0].addr));
        agent.bases = running.iter().map(|r| format!("http://{}", r.addr)).collect();
        let mut acked = Vec::new();
        for round in 0..3 {
            for t in 0..2 {
                let reply = agent.turn(&format!("turn {round}.{t}")).await.unwrap_or_else(|e| panic!("{servers} server(s), round {round}.{t}: {e:?}"));
                acked.push(reply);
            }
            block(&|| {
                cluster.down("immediate");
                cluster.up();
            });
        }
        // The database loses the session's last two events (the newest reply and its usage): the head
        // moves back under the servers, which hold the session folded further.
        block(&|| cluster.execute(&url, "DELETE FROM condense_events WHERE seq > (SELECT head - 2 FROM condense_sessions); UPDATE condense_sessions SET head = head - 2"));
        acked.pop();
        for t in 0..2 {
            let reply = agent.turn(&format!("after the loss {t}")).await.unwrap_or_else(|e| panic!("{servers} server(s), after the loss {t}: {e:?}"));
            acked.push(reply);
        }
        // Every reply the client holds is in the session, in order.
        let url2 = url.clone();
        let replies: Vec<String> = tokio::task::spawn_blocking(move || {
            let store = condense_engine::Store::open(url2).unwrap();
            let sessions = store.sessions().unwrap();
            assert_eq!(sessions.len(), 1, "{sessions:?}");
            let p = store.session(&sessions[0].name).unwrap().projection().unwrap();
            p.branch_messages().iter().filter(|m| matches!(***m, Message::Assistant { .. })).map(|m| m.text()).collect()
        })
        .await
        .unwrap();
        let lost: Vec<&String> = acked.iter().filter(|r| !replies.contains(r)).collect();
        assert!(lost.is_empty(), "{servers} server(s): acknowledged replies lost: {lost:?} (the session holds {replies:?})");
        // A database that is down: a clear 503 in the API's format, well before a client gives up.
        block(&|| cluster.down("fast"));
        agent.user("while the database is down");
        let t0 = std::time::Instant::now();
        let err = agent.request().await.expect_err("no database, no reply");
        let waited = t0.elapsed();
        assert_eq!(err.0, 503, "{err:?}");
        let body: Value = serde_json::from_str(&err.1).unwrap();
        assert_eq!(body["type"], "error", "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("PostgreSQL"), "{body}");
        assert!(waited < std::time::Duration::from_secs(10), "a down database answered after {waited:?}");
        block(&|| cluster.up());
        let reply = agent.run().await.unwrap_or_else(|e| panic!("{servers} server(s), the first request after the restart: {e:?}"));
        assert!(reply.starts_with("reply "), "{reply}");
        for r in running {
            r.stop().await.unwrap();
        }
    }
}

/// Issue 35, item 4: with a token, every route refuses a request without it or with a wrong one (the
/// same refusal, in the API's format on the API paths) and serves one with it; the token never goes
/// upstream or into the store; a non-loopback address without a token does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_and_other_addresses_need_one() {
    const TOKEN: &str = "tok-SECRET-7f3a9c";
    let fake = Fake::start(vec![Step::Text("hello".into())]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.auth_token = Some(TOKEN.into());
    let serve = start(cfg.clone()).await.expect("serve starts");
    let url = format!("http://{}", serve.addr);
    let http = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let routes: [(&str, &str, Option<&str>); 10] = [
        ("POST", "/v1/messages", Some(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)),
        ("POST", "/v1/chat/completions", Some(chat.as_str())),
        ("POST", "/v1/responses", Some(r#"{"model":"m","input":"hi"}"#)),
        ("GET", "/v1/models", None),
        ("GET", "/condense/status", None),
        ("GET", "/condense/metrics", None),
        ("POST", "/condense/cli", Some(r#"{"argv":["sessions"]}"#)),
        ("GET", "/condense/", None),
        ("GET", "/condense/api/sessions", None),
        ("GET", "/condense/?auth=tok-SECRET-7f3a9", None),
    ];
    for (method, path, body) in routes {
        let mut refusals = Vec::new();
        for token in [None, Some("wrong"), Some("tok-SECRET-7f3a9")] {
            let mut rb = http.request(method.parse().unwrap(), format!("{url}{path}")).header("content-type", "application/json").header("x-api-key", "k");
            if let Some(t) = token {
                rb = rb.header("x-condense-auth", t);
            }
            if let Some(b) = body {
                rb = rb.body(b.to_string());
            }
            let r = rb.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {token:?}");
            let text = r.text().await.unwrap();
            assert!(text.contains("x-condense-auth"), "{path}: {text}");
            if path == "/v1/messages" {
                assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["type"], "authentication_error");
            }
            refusals.push(text);
        }
        refusals.dedup();
        assert_eq!(refusals.len(), 1, "{path}: a missing and a wrong token are refused alike: {refusals:?}");
    }
    assert!(fake.log().is_empty(), "a refused request reached the provider");
    // With the token: the API works, the token stays here.
    let mut agent = Agent::new(Api::Chat, false, &url);
    agent.headers.push(("x-condense-auth".into(), TOKEN.into()));
    assert_eq!(agent.turn("hi").await.unwrap(), "hello");
    let status = http.get(format!("{url}/condense/status")).header("x-condense-auth", TOKEN).send().await.unwrap();
    assert_eq!(status.status(), 200);
    for l in fake.log() {
        assert!(l.header("x-condense-auth").is_none(), "the token went upstream");
    }
    // The dashboard in a browser: opened once with the token in the address, which becomes a cookie for
    // /condense and is dropped from the address; the cookie then stands for the header.
    let browser = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let login = browser.get(format!("{url}/condense/?auth={}", TOKEN.replace('-', "%2D"))).send().await.unwrap();
    assert_eq!(login.status(), 303);
    assert_eq!(login.headers()["location"], "/condense/");
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.starts_with(&format!("condense-auth={TOKEN};")) && cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/condense"), "{cookie}");
    for path in ["/condense/", "/condense/api/sessions", "/condense/status"] {
        let r = browser.get(format!("{url}{path}")).header("cookie", format!("theme=dark; condense-auth={TOKEN}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} with the cookie");
        let r = browser.get(format!("{url}{path}")).header("cookie", "condense-auth=tok-SECRET-7f3a9").send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong cookie");
    }
    serve.stop().await.unwrap();
    assert!(!contains(&dir_bytes(dir.path()), "SECRET"), "the token reached the store");
    // Another address: refused without a token, and an empty token is no token.
    let mut open = cfg.clone();
    open.listen = "0.0.0.0:0".parse().unwrap();
    open.auth_token = None;
    let err = start(open.clone()).await.err().expect("no token, no listening on 0.0.0.0").to_string();
    assert!(err.contains("--auth-token-file"), "{err}");
    open.auth_token = Some("  \n".into());
    assert!(start(open).await.is_err(), "an empty token is refused");
}

/// Sends raw bytes on a new connection and returns what came back before the server closed it or
/// `wait` passed (with whether it closed).
async fn raw_exchange(addr: std::net::SocketAddr, bytes: &[u8], wait: std::time::Duration) -> (String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// Issue 35, item 3: a declared length over the limit is refused before anything is read; headers and
/// bodies that do not arrive in time end the request; a request whose recording could never fit the
/// memory budget gets a 413, one that would take the server past it while others hold it a 503 with
/// `retry-after`; a stopping server waits for a hung upstream request no longer than its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_size_time_and_memory_hold() {
    use std::time::{Duration, Instant};
    let mut steps = vec![Step::Slow(1500), Step::Text("slow answer".into())];
    steps.extend((0..4).map(|i| Step::Text(format!("quick {i}"))));
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.timeouts.header_read = Duration::from_millis(500);
    cfg.timeouts.body_read = Duration::from_millis(500);
    cfg.timeouts.shutdown_grace = Duration::from_secs(1);
    cfg.memory_budget = 4 << 20;
    let serve = start(cfg).await.unwrap();
    let addr = serve.addr;
    // A declared 10 GB body: a 413 at once, nothing read.
    let (resp, _) = raw_exchange(addr, b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000000\r\n\r\n", Duration::from_secs(5)).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(resp.contains("request_too_large"), "{resp}");
    // Headers that never finish: the connection is closed.
    let t0 = Instant::now();
    let (_, closed) = raw_exchange(addr, b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n", Duration::from_secs(5)).await;
    assert!(closed, "a connection with unfinished headers stayed open {:?}", t0.elapsed());
    // A body that stops short of its declared length: a 408.
    let (resp, _) = raw_exchange(addr, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":", Duration::from_secs(5)).await;
    assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    // Three thousand tiny messages need more than the 4 MiB budget to record: a 413 that says so.
    let url = format!("http://{addr}");
    let many: Vec<Value> = (0..3000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "x"})).collect();
    let r = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).header("x-api-key", "k").header("content-type", "application/json").body(json!({"model": "m", "messages": many}).to_string()).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.text().await.unwrap().contains("memory budget"));
    // So do three thousand one-letter content blocks in one message (an 80 KB body): what recording
    // takes grows with the values of the list, not with its messages alone.
    let parts: Vec<Value> = (0..3000).map(|_| json!({"type": "text", "text": "p"})).collect();
    let r = reqwest::Client::new().post(format!("{url}/v1/messages")).header("x-api-key", "k").header("content-type", "application/json").body(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": parts}]}).to_string()).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.text().await.unwrap().contains("memory budget"));
    // One request in flight holds ~1.2 MB of it (a 100 KB body); two more at once would pass the budget.
    let big = "y".repeat(100_000);
    let mut slow = Agent::new(Api::Chat, false, &url);
    slow.user(&big);
    let held = tokio::spawn(async move { slow.request().await.map(|m| m.text()) });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let others = (0..3).map(|i| {
        let mut a = Agent::new(Api::Chat, false, &url);
        a.headers.push(("x-condense-session".into(), format!("other-{i}")));
        a.user(&big);
        async move { a.request().await }
    });
    let rest = futures_util::future::join_all(others).await;
    let busy: Vec<&(u16, String)> = rest.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!busy.is_empty() && busy.iter().all(|(s, b)| *s == 503 && b.contains("busy")), "{rest:?}");
    assert_eq!(held.await.unwrap().unwrap(), "slow answer");
    let mut after = Agent::new(Api::Chat, false, &url);
    after.user(&big);
    assert!(after.request().await.unwrap().text().starts_with("quick "), "the budget came back when the requests ended");
    assert_eq!(serve.state.status().await["memory_reserved_bytes"], 0);
    serve.stop().await.unwrap();
    // A request hanging on the upstream does not hold up a stop past the grace.
    let fake = Fake::start(vec![Step::Slow(60_000), Step::Text("never".into())]).await;
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.timeouts.shutdown_grace = Duration::from_secs(1);
    let serve = start(cfg).await.unwrap();
    let url = format!("http://{}", serve.addr);
    let mut hung = Agent::new(Api::Chat, false, &url);
    hung.user("this one hangs");
    let pending = tokio::spawn(async move { hung.request().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    serve.stop().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(8), "the stop waited {:?} for a hung request", t0.elapsed());
    pending.abort();
}

/// Issue 35, item 3: a body of 500,000 one-letter messages took 719 MB to record (~1.4 KB a message,
/// a body of 33 bytes each); past the Anthropic API's own limit of 100,000 messages a request is refused
/// with a 413 in its API's format before anything is split or recorded, and the conversation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_more_messages_than_the_limit_is_refused_before_it_is_recorded() {
    let s = setup(vec![Step::Text("after the refusal".into())], vec![]).await;
    for api in [Api::Chat, Api::Anthropic, Api::Responses] {
        let mut agent = Agent::new(api, false, &s.url());
        while agent.history.len() <= condense_serve::DEFAULT_MAX_MESSAGES {
            agent.user("x");
        }
        let (status, body) = agent.request().await.expect_err("over the limit");
        assert_eq!(status, 413, "{api:?}: {body}");
        assert!(body.contains("100001 messages, over the 100000"), "{api:?}: {body}");
        let kind = if api == Api::Anthropic { "\"type\":\"error\"" } else { "\"error\":{" };
        assert!(body.contains(kind), "{api:?}: not in the API's error format: {body}");
    }
    assert!(s.fake.log().is_empty(), "nothing reached the provider");
    assert_eq!(s.status().await["active_sessions"].as_array().map(Vec::len), Some(0), "nothing was recorded");
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    assert_eq!(agent.turn("a request of one message").await.unwrap(), "after the refusal");
}

/// Issue 35, item 8: an upstream stream with bytes that are not UTF-8 ahead of its events reaches the
/// client whole (the bytes are read as the SSE format says: replaced, not fatal), and a 200 that is not an
/// event stream, to a streaming request, reaches the client as it came instead of as a broken stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_upstream_streams_reach_the_client_whole() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses] {
        let s = setup(vec![Step::Garbled("through the noise".into()), Step::Raw("text/html".into(), "<html>gateway page</html>".into())], vec![]).await;
        let mut agent = Agent::new(api, true, &s.url());
        assert_eq!(agent.turn("hi").await.unwrap(), "through the noise", "{api:?}");
        agent.user("again");
        let mut rb = reqwest::Client::new().post(format!("{}{}", s.url(), agent.path())).header("content-type", "application/json").body(agent.body().to_string());
        for (k, v) in &agent.headers {
            rb = rb.header(k, v);
        }
        let resp = rb.send().await.unwrap();
        assert_eq!(resp.status(), 200, "{api:?}");
        assert_eq!(resp.headers()["content-type"], "text/html", "{api:?}");
        assert_eq!(resp.text().await.expect("a whole body, not a broken stream"), "<html>gateway page</html>", "{api:?}");
    }
}

/// Issue 35, item 8: after the provider refused a request twice (CONTEXT_COMPACTION_FAILED), the client's
/// identical retry reaches the provider again instead of a 400 from serve alone; and a conversation whose
/// very first request overflowed can send that prompt again (it was RECOVERY_BLOCKED, the handoff blank).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_double_overflow_the_clients_retry_reaches_the_provider() {
    for (first, window) in [(false, None), (true, None), (true, Some(200_000))] {
        let mut steps = vec![Step::Overflow, Step::Overflow, Step::Text("fits now".into())];
        if first {
            steps.remove(1);
        } else {
            steps.insert(0, Step::Text("done".into()));
        }
        let models = window.map(|w| vec![("fake-model".to_string(), ModelLimits { context_window: w, max_output: Some(8_000) })]).unwrap_or_default();
        let s = setup(steps, models).await;
        let mut agent = Agent::new(Api::Anthropic, false, &s.url());
        if !first {
            agent.turn("one").await.unwrap();
        }
        let before = s.fake.log().len();
        let (status, body) = agent.turn("the big prompt").await.unwrap_err();
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("CONTEXT_COMPACTION_FAILED"), "{body}");
        // A request and one retry after a checkpoint; a first request holds nothing to condense, so
        // nothing is retried and the error says why.
        assert_eq!(s.fake.log().len(), before + if first { 1 } else { 2 }, "first: {first}: {body}");
        if first {
            assert!(body.contains("nothing to condense") && !body.contains("CONTEXT_COMPACTION_FAILED: CONTEXT_COMPACTION_FAILED"), "{body}");
        }
        // The client retries the same request (as agents do, or the user presses enter again).
        let reply = agent.run().await.unwrap_or_else(|e| panic!("first request overflowed: {first}: the retry: {e:?}"));
        assert_eq!(reply, "fits now", "first: {first}");
        assert_eq!(s.fake.log().len(), before + if first { 2 } else { 3 }, "first: {first}: the retry reached the provider");
    }
}

/// Issue 35, item 1 (found by `cargo xtask soak`): the database loses the newest events of a request
/// while its reply is on the way (commits not yet durable, lost in a crash). The reply must not be
/// chained onto the lost message — that made it a second root of the session and cut every acknowledged
/// turn before it off the branch — but refused with a 503; the client's retry records what was lost. The
/// loss comes while the upstream answers (the reply finds its parent gone), or while the reply's append
/// waits for the session's row, held by the test as a second writer would (the append finds the head it
/// read gone: it was a 500 `append expected head …`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_whose_request_the_database_lost_is_refused_not_rooted() {
    for while_appending in [false, true] {
        let url = pg_database().await;
        let fake = Fake::start(vec![Step::Text("first".into()), Step::Slow(1500), Step::Text("lost on the way".into()), Step::Text("second".into())]).await;
        let serve = start(config_for(&url, &fake)).await.unwrap();
        let mut agent = Agent::new(Api::Chat, false, &format!("http://{}", serve.addr));
        assert_eq!(agent.turn("one").await.unwrap(), "first");
        let cluster = condense_log::testing::Cluster::shared();
        tokio::task::block_in_place(|| cluster.execute(&url, "CREATE TABLE mark AS SELECT head FROM condense_sessions"));
        agent.user("two");
        let asked = tokio::spawn(async move {
            let reply = agent.run().await;
            (agent, reply)
        });
        // Once the request reached the upstream it is recorded; the upstream takes its time.
        for _ in 0..3000 {
            if fake.arrived() >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(fake.arrived(), 2, "the second request reached the upstream within 60 s");
        tokio::task::block_in_place(|| match while_appending {
            false => cluster.execute(&url, "DELETE FROM condense_events WHERE seq > (SELECT head FROM mark); UPDATE condense_sessions SET head = (SELECT head FROM mark)"),
            true => lose_the_newest_event_once_an_append_waits(cluster.hold(&url, "SELECT head FROM condense_sessions FOR UPDATE")),
        });
        let (mut agent, reply) = asked.await.unwrap();
        let err = reply.expect_err("the reply chained onto a lost message is refused");
        assert_eq!(err.0, 503, "while appending: {while_appending}: {err:?}");
        assert!(err.1.contains("send the request again"), "{err:?}");
        assert_eq!(agent.run().await.unwrap(), "second", "the client's retry");
        assert_eq!(only_branch(url).await, ["one", "first", "two", "second"]);
        serve.stop().await.unwrap();
    }
}

/// The texts of the branch of the one session in the store at `url`, which has one root.
async fn only_branch(url: String) -> Vec<String> {
    tokio::task::spawn_blocking(move || {
        let store = condense_engine::Store::open(url).unwrap();
        let name = store.sessions().unwrap()[0].name.clone();
        let p = store.session(&name).unwrap().projection().unwrap();
        assert_eq!(p.tree().filter(|(_, parent, _)| parent.is_none()).count(), 1, "one root");
        p.branch_messages().iter().map(|m| m.text()).collect()
    })
    .await
    .unwrap()
}

/// Once serve's append waits for the session's row that `held` holds, the database loses the session's
/// newest event (as a restart loses one not yet durable) and lets the append go on.
fn lose_the_newest_event_once_an_append_waits(held: condense_log::testing::Held) {
    held.wait_for_a_waiter();
    held.commit("DELETE FROM condense_events WHERE seq = (SELECT head FROM condense_sessions); UPDATE condense_sessions SET head = head - 1");
}

/// Issue 35, item 1 (found by `cargo xtask soak`): the session's head moves in the database while serve
/// records a request — a restart of the database lost an event not yet durable, or another server
/// appended — so the append finds the head it expected gone. serve folds the session again from the
/// database and records the request once more, and the client gets its reply (it got a 500 `append
/// expected head 7, but the head is 6`). The test holds the session's row, as a second writer would,
/// until serve's append waits for it, and meanwhile takes the session's newest event away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_moves_while_a_request_is_recorded_is_folded_again_and_the_request_carries_on() {
    let url = pg_database().await;
    let fake = Fake::start(vec![Step::Text("first".into()), Step::Text("second".into()), Step::Text("third".into())]).await;
    let serve = start(config_for(&url, &fake)).await.unwrap();
    let mut agent = Agent::new(Api::Chat, false, &format!("http://{}", serve.addr));
    assert_eq!(agent.turn("one").await.unwrap(), "first");
    let cluster = condense_log::testing::Cluster::shared();
    let held = tokio::task::block_in_place(|| cluster.hold(&url, "SELECT head FROM condense_sessions FOR UPDATE"));
    agent.user("two");
    let asked = tokio::spawn(async move {
        let reply = agent.run().await;
        (agent, reply)
    });
    tokio::task::block_in_place(|| lose_the_newest_event_once_an_append_waits(held));
    let (mut agent, reply) = asked.await.unwrap();
    assert_eq!(reply.unwrap_or_else(|e| panic!("the request whose session moved: {e:?}")), "second");
    assert_eq!(only_branch(url.clone()).await, ["one", "first", "two", "second"]);
    // The request prepared twice is one request of the conversation.
    let status = serve.state.status().await;
    assert_eq!(status["active_sessions"][0]["requests"], 2, "{status}");
    assert_eq!(agent.turn("three").await.unwrap(), "third", "the conversation goes on");
    serve.stop().await.unwrap();
}

/// Issue 36, item 1: after a switch to a 16k model, a prompt near the window (just below, at and above
/// what fits) either reaches the provider with the recovery serve prepared, or is refused because it
/// cannot fit at all — never as PROVIDER_OVERFLOW_AFTER_RETRY with nothing sent (the payload guard took the
/// bytes of the request as sent, condense's tool declarations and JSON included, for a second overflow
/// after the recovery had fitted the context by its own estimate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_recovery_is_sent_near_the_window() {
    for api in [Api::Chat, Api::Anthropic, Api::Responses] {
        let mut sent_some = 0;
        for chars in (20_000..=34_000).step_by(2_000) {
            let models = vec![
                ("big-model".to_string(), ModelLimits { context_window: 200_000, max_output: Some(8_000) }),
                ("small-model".to_string(), ModelLimits { context_window: 16_000, max_output: Some(2_000) }),
            ];
            let s = setup(vec![], models).await;
            let mut agent = Agent::new(api, false, &s.url());
            agent.model = "big-model".into();
            for i in 0..6 {
                let long: String = (0..2500).map(|n| format!("w{i}x{n} ")).collect();
                agent.turn(&long).await.unwrap();
            }
            let before = s.fake.log().len();
            agent.model = "small-model".into();
            let prompt: String = (0..chars / 8).map(|n| format!("p{n:06} ")).collect();
            match agent.turn(&prompt).await {
                Ok(_) => {
                    assert!(s.fake.log().len() > before, "{api:?} {chars}: answered without the provider");
                    // One measure for "fits": what went to the small model is within its hard budget by the
                    // payload guard's own measure (the bytes sent, condense's tool declarations included).
                    let limit = condense_checkpoint_budget(16_000, 2_000) * 4;
                    for l in s.fake.log()[before..].iter().filter(|l| l.summary.is_none()) {
                        let bytes = serde_json::to_vec(&l.body).unwrap().len() as u64;
                        assert!(bytes <= limit, "{api:?} {chars}: {bytes} bytes sent, over {limit}");
                    }
                    sent_some += 1;
                }
                Err((status, body)) => {
                    assert!(!body.contains("PROVIDER_OVERFLOW_AFTER_RETRY"), "{api:?} {chars}: {status} {body}");
                    assert_eq!(status, 400, "{api:?} {chars}: {body}");
                }
            }
        }
        assert!(sent_some >= 2, "{api:?}: prompts that fit were sent ({sent_some})");
    }
}

/// A server whose models are a 200k `big-model` and a 32k `small-model`, with `tweak` applied to its
/// configuration; an agent of `api` that wrote ten long turns (about 40,000 tokens) on the big model.
async fn switched_setup(api: Api, tweak: impl FnOnce(&mut ServeConfig)) -> (Setup, Agent) {
    let fake = Fake::start(vec![]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.file.models = vec![
        ("big-model".to_string(), ModelLimits { context_window: 200_000, max_output: Some(8_000) }),
        ("small-model".to_string(), ModelLimits { context_window: 32_000, max_output: Some(2_000) }),
    ];
    tweak(&mut cfg);
    let serve = start(cfg).await.expect("serve starts");
    let s = Setup { fake, serve, dir };
    let mut agent = Agent::new(api, false, &s.url());
    agent.model = "big-model".into();
    for i in 0..10 {
        let long: String = (0..2500).map(|n| format!("w{i}x{n} ")).collect();
        agent.turn(&long).await.unwrap();
    }
    (s, agent)
}

/// The newest checkpoint's summary in the session's log.
fn newest_checkpoint_summary(s: &Setup) -> String {
    let (_, session) = store_of(s);
    let p = session.projection().unwrap();
    p.index().checkpoints.values().next_back().expect("a checkpoint").summary.to_string()
}

/// Polls `done` every 50 ms for at most 20 s.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("not within 20 s: {what}");
}

/// Seeds 001 and 004 (issue 59): a preparation whose handoff a model writes through the upstream stops,
/// committing nothing, when new owner input arrives (a request of the same conversation with more
/// messages waits behind it: the first is answered 503 `PREPARATION_STOPPED` with `retry-after`, the new
/// one recovers and goes through) and when its client gives the request up (the recovery stops at its
/// next step; the client's retry recovers). Each stop is recorded as a failure; no checkpoint is
/// committed but the one of the request that went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preparation_stops_for_new_owner_input_or_a_request_given_up_and_commits_nothing() {
    let state = |s: &Setup| {
        let (_, session) = store_of(s);
        let p = session.projection().unwrap();
        let stopped = p.index().checkpoint_failures.iter().filter(|(code, _)| code == condense_engine::recover::PREPARATION_STOPPED).count();
        (p.index().checkpoints.len(), stopped)
    };
    let send = |agent: &Agent| {
        let mut rb = agent.http.post(format!("{}{}", agent.base, agent.path())).header("content-type", "application/json").body(agent.body().to_string());
        for (k, v) in &agent.headers {
            rb = rb.header(k, v);
        }
        tokio::spawn(rb.send())
    };
    // A switch to the small model whose first request is sent, and waits on its first handoff (1.5 s).
    let slow_switch = || async {
        let (s, mut agent) = switched_setup(Api::Chat, |_| {}).await;
        s.fake.delay_summaries(1_500);
        agent.model = "small-model".into();
        agent.user("now continue on the small model");
        let first = send(&agent);
        eventually("a handoff request", || s.fake.log().iter().any(|l| l.summary == Some("handoff"))).await;
        s.fake.delay_summaries(0);
        (s, agent, first)
    };

    // New owner input while the first request's handoff is being written.
    let (s, mut agent, first) = slow_switch().await;
    agent.user("no, stop: do this instead");
    let second = send(&agent);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 503);
    assert_eq!(first.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let text = first.text().await.unwrap();
    assert!(text.contains("PREPARATION_STOPPED") && text.contains("new owner input"), "{text}");
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.status(), 200, "{}", second.text().await.unwrap());
    assert_eq!(state(&s), (1, 1), "one stop recorded; one checkpoint, the second request's");
    assert!(newest_checkpoint_summary(&s).contains("summarized below by a model"));

    // The client gives its request up while the handoff is being written.
    let (s, mut agent, given_up) = slow_switch().await;
    given_up.abort();
    eventually("the preparation stopped", || state(&s).1 == 1).await;
    assert_eq!(state(&s).0, 0, "nothing committed");
    agent.run().await.unwrap();
    assert_eq!(state(&s), (1, 1), "the retry recovers");
}

/// Issue 36 item 3: after a switch to a smaller model, serve has the recovery's handoff written by the
/// session's native model through the same upstream, with the client's own credentials, one request per
/// chronological piece within the input budget; the model's answers are the handoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_handoff_is_written_by_the_native_model_through_the_upstream() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses] {
        let (s, mut agent) = switched_setup(api, |_| {}).await;
        assert!(s.fake.log().iter().all(|l| l.summary.is_none()), "{api:?}: no summary before the switch");
        agent.model = "small-model".into();
        // The session's reasoning setting, which the handoff requests carry too (issue 59).
        let reasoning = match api {
            Api::Chat => ("reasoning_effort", json!("high")),
            Api::Responses => ("reasoning", json!({"effort": "high"})),
            Api::Anthropic => ("thinking", json!({"type": "enabled", "budget_tokens": 1024})),
            Api::Gemini => unreachable!("not among the APIs here"),
        };
        agent.extra = vec![(reasoning.0.to_string(), reasoning.1.clone())];
        agent.turn("now continue on the small model").await.unwrap();
        let log = s.fake.log();
        let handoffs: Vec<&Logged> = log.iter().filter(|l| l.summary == Some("handoff")).collect();
        for h in &handoffs {
            assert_eq!(h.body.get(reasoning.0), Some(&reasoning.1), "{api:?}: the reasoning setting in {}", h.body);
            if api == Api::Anthropic {
                assert!(h.body["max_tokens"].as_u64().unwrap() > 1024, "{api:?}: room beside the thinking budget");
            }
        }
        assert!(!handoffs.is_empty() && handoffs.len() <= 64, "{api:?}: {} handoff requests", handoffs.len());
        let budget = condense_recovery::input_budget(32_000) as usize;
        let (_, session) = store_of(&s);
        let order: Vec<String> = session.projection().unwrap().path_ids();
        let mut last_seen = 0;
        for h in &handoffs {
            // The client's API and credentials, the native model.
            assert_eq!(h.api(), api);
            assert_eq!(h.body["model"], "big-model", "{api:?}: the session's previous model");
            assert_eq!(h.header("x-api-key"), Some("sk-test-SECRET-key-0123"));
            assert_eq!(h.header("authorization"), Some("Bearer sk-test-SECRET-bearer-4567"));
            // Bounded, and in chronological order: each piece starts after the one before.
            let input = condense_serve::fake::summary_input(api, &h.body);
            assert!(input.len() <= budget, "{api:?}: a piece of {} bytes over {budget}", input.len());
            // Every entry a piece cites (`[id] role: …` lines; a message longer than a piece goes on in
            // the next one) comes after those the pieces before cited.
            for id in input.lines().filter_map(|l| l.strip_prefix('[').and_then(|l| l.split_once(']')).map(|(id, _)| id)) {
                if let Some(at) = order.iter().position(|x| x == id) {
                    assert!(at >= last_seen, "{api:?}: pieces in order");
                    last_seen = at;
                }
            }
        }
        assert!(last_seen > 0, "{api:?}: the pieces cite the session's entries: {:?} {:?}", order, handoffs.iter().map(|h| condense_serve::fake::summary_input(api, &h.body).chars().take(300).collect::<String>()).collect::<Vec<_>>());
        // The answers are the handoff, in the order of the pieces, under a header that says a model wrote it.
        let summary = newest_checkpoint_summary(&s);
        assert!(summary.contains("summarized below by a model"), "{summary}");
        // Asked for the seed's sections (issue 59); the fake's answer has none of them but its Goal, so each
        // is added, saying the model named nothing there. No `temperature`: reasoning models refuse it.
        for h in &handoffs {
            assert!(h.body.get("temperature").is_none(), "{api:?}: {}", h.body);
        }
        for section in condense_checkpoint::RECOVERY_SECTIONS {
            assert!(summary.contains(&format!("## {section}\n")), "{api:?}: no {section} in {summary}");
        }
        let mut from = 0;
        for h in &handoffs {
            let input = condense_serve::fake::summary_input(api, &h.body);
            let answer = condense_serve::fake::summary_answer("handoff", &input);
            let at = summary[from..].find(&answer).unwrap_or_else(|| panic!("{api:?}: the answer {answer:?} in the handoff {summary}"));
            from += at + answer.len();
        }
        // The request after them carried the handoff to the small model.
        let sent = log.iter().rev().find(|l| l.summary.is_none()).unwrap();
        assert_eq!(sent.body["model"], "small-model");
        assert!(sent.messages().iter().any(|m| m.text().contains("FAKE-HANDOFF")), "{api:?}: the handoff went upstream");
        let status = s.status().await;
        assert_eq!(status["summarizer_fallbacks"], 0);
        drop(session);
        assert!(!contains(&s.store_bytes(), "SECRET"), "a credential reached the store");
    }
}

/// `--summary-model` names the model summaries ask; a summary request that fails falls back to the
/// extractive handoff, which says so, and the fallback is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_take_the_summary_model_and_fall_back_to_extractive() {
    let (s, mut agent) = switched_setup(Api::Anthropic, |c| c.summary_model = Some("summary-model".into())).await;
    agent.model = "small-model".into();
    agent.turn("now continue on the small model").await.unwrap();
    let log = s.fake.log();
    let handoffs: Vec<&Logged> = log.iter().filter(|l| l.summary == Some("handoff")).collect();
    assert!(!handoffs.is_empty());
    assert!(handoffs.iter().all(|h| h.body["model"] == "summary-model"));

    let (s, mut agent) = switched_setup(Api::Chat, |_| {}).await;
    s.fake.fail_summaries(true);
    agent.model = "small-model".into();
    agent.turn("now continue on the small model").await.unwrap();
    assert!(s.fake.log().iter().any(|l| l.summary == Some("handoff")), "the model was asked first");
    let summary = newest_checkpoint_summary(&s);
    assert!(summary.contains("extracted below verbatim (no model was available"), "{summary}");
    assert!(!summary.contains("FAKE-HANDOFF"));
    assert!(s.status().await["summarizer_fallbacks"].as_u64().unwrap() >= 1);

    // Extractive: nothing goes to the upstream but the requests.
    let (s, mut agent) = switched_setup(Api::Chat, |c| c.summaries = condense_serve::summary::Summaries::Extractive).await;
    agent.model = "small-model".into();
    agent.turn("now continue on the small model").await.unwrap();
    assert!(s.fake.log().iter().all(|l| l.summary.is_none()));
    assert!(newest_checkpoint_summary(&s).contains("extracted below verbatim"));
}

/// `--summaries upstream`: the summaries of pruned outputs are the model's too (pi-condense's way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_summaries_upstream_pruned_outputs_are_summarized_by_the_model() {
    // Outputs under the spill threshold: pruned by summary.
    let fake = Fake::start(vec![Step::Shell("seq 1 3000".into()), Step::Shell("seq 2 3001".into()), Step::Text("turn one done".into()), Step::Text("ok".into())]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    cfg.summaries = condense_serve::summary::Summaries::Upstream;
    let serve = start(cfg).await.expect("serve starts");
    let s = Setup { fake, serve, dir };
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    agent.turn("count the numbers").await.unwrap();
    agent.turn("look at the last output again").await.unwrap();
    let log = s.fake.log();
    let batches: Vec<&Logged> = log.iter().filter(|l| l.summary == Some("batch")).collect();
    assert!(!batches.is_empty(), "a batch was summarized through the upstream");
    assert!(batches.iter().all(|b| b.body["model"] == "fake-model"));
    let later = log.iter().rev().find(|l| l.summary.is_none()).unwrap();
    assert!(later.messages().iter().any(|m| m.text().contains("FAKE-SUMMARY of t")), "the model's summaries are the stubs");
}

/// Issue 34 item 4: `condense stats` (`Session::stats`) of a served session reports the provider's usage
/// as serve recorded it, one per upstream round, priced as prompt caching is billed, beside the same
/// requests as the client sent them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_the_providers_usage_at_cache_prices_beside_direct() {
    let s = setup(outputs_then_a_query(), vec![]).await;
    let mut agent = Agent::new(Api::Anthropic, false, &s.url());
    agent.turn("count the numbers").await.unwrap();
    agent.turn("look at the last output again").await.unwrap();
    let rounds = s.fake.log().iter().filter(|l| l.summary.is_none()).count() as u64;
    let (_, session) = store_of(&s);
    let p = session.stats().unwrap().provider.expect("usage was reported");
    assert!(p.served);
    assert_eq!(p.requests, rounds, "one usage per upstream round");
    // The fake reports 100 uncached, 50 cached, 10 written, 20 out for every Anthropic request.
    assert_eq!((p.usage.input, p.usage.cache_read, p.usage.cache_write, p.usage.output), (100 * rounds, 50 * rounds, 10 * rounds, 20 * rounds));
    assert!((p.cost - (0.1 * 50.0 + 1.25 * 110.0) * rounds as f64).abs() < 1e-6);
    let direct = p.direct.expect("a direct estimate for a served session");
    assert!(direct > p.cost, "the client's whole history costs more than the fake's tiny usage: {direct}");
}

/// What serve keeps of conversations between their requests is bounded too (`--warm-bytes`): past the
/// bound, opening a conversation closes the least recently used idle ones; one that comes back is opened
/// from the log, the same session with its history whole and the figures its status showed, and status
/// counts what the closed ones did meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_conversations_close_past_the_memory_bound_and_come_back_whole() {
    let steps = (0..4).map(|i| Step::Text(format!("reply {i}"))).collect();
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = config_for(dir.path().join("store"), &fake);
    // A conversation below holds 42 messages: the bound is one and a half of them.
    cfg.warm_bytes = 63 * condense_serve::conv::VIEW_WEIGHT;
    let s = Setup { serve: start(cfg).await.expect("serve starts"), fake, dir };
    let mut agents: Vec<Agent> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| {
            let mut a = Agent::new(Api::Chat, false, &s.url());
            for i in 0..20 {
                a.user(&format!("{name}: note {i}"));
                a.history.push(json!({"role": "assistant", "content": format!("noted {i}")}));
            }
            a
        })
        .collect();
    for a in agents.iter_mut() {
        a.turn("carry on").await.unwrap();
    }
    let active = |st: &Value| st["active_sessions"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let status = s.status().await;
    let open = active(&status);
    assert_eq!(open.len(), 2, "the least recently used of three closed: {status}");
    assert!(open.iter().all(|n| !n.contains("alpha")), "{open:?}");
    assert_eq!(status["requests"], 3);
    // `alpha` comes back: the same session, its whole history sent, its figures where they were.
    assert_eq!(agents[0].turn("and again").await.unwrap(), "reply 3");
    let sent = s.fake.log().last().unwrap().body.to_string();
    assert!(sent.contains("alpha: note 0") && sent.contains("reply 0") && sent.contains("and again"), "{sent}");
    let sessions = s.serve.state.store().sessions().unwrap();
    assert_eq!(sessions.len(), 3, "no second session for the conversation that came back");
    let status = s.status().await;
    let alpha = status["active_sessions"].as_array().unwrap().iter().find(|x| x["name"].as_str().unwrap().contains("alpha")).cloned().unwrap();
    assert_eq!(alpha["requests"], 2, "{status}");
    assert_eq!(alpha["messages"], 44, "the client's view folded again from the log: {status}");
    assert_eq!(status["requests"], 4);
}

/// The tokens a Chat request upstream takes as condense counts them: its system prompt, its tool
/// declarations and its messages but the host context (as the tight-window tests count them).
fn chat_request_tokens(l: &Logged) -> u64 {
    let system = l.body["messages"][0]["content"].as_str().map_or(0, str::len) as u64 / 4;
    let tools = (l.body["tools"].to_string().len() as u64).div_ceil(4);
    let messages: Vec<Message> = l.messages().into_iter().filter(|m| !m.is_host()).collect();
    system + tools + condense_tokens::estimate_all(&messages)
}

/// Issue 59 through serve: at a 16,000-token window a client whose system prompt takes half of it runs
/// turns of outputs larger than the room left (the final batch cut to fit, each copy naming its ref),
/// never more than the window upstream; a system prompt larger than the window gets one refusal naming
/// it, logged and counted as condense's own failure (`condense_request_failures_total`), and the next
/// request that can fit goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_window_cuts_what_it_must_and_refuses_only_what_cannot_fit() {
    let mut steps = Vec::new();
    for k in 0..4 {
        steps.push(Step::Shell("seq 1 9000".into()));
        steps.push(Step::Text(format!("done {k}")));
    }
    steps.push(Step::Text("after the refusal".into()));
    let s = setup(steps, vec![("fake-model".into(), ModelLimits { context_window: 16_000, max_output: None })]).await;
    let mut agent = Agent::new(Api::Chat, false, &s.url());
    // ~8,000 tokens of system prompt: half the window.
    agent.history[0] = json!({"role": "system", "content": "You are a careful agent. ".repeat(1_280)});
    for k in 0..4 {
        assert_eq!(agent.turn(&format!("count, turn {k}")).await.unwrap(), format!("done {k}"));
    }
    for (i, l) in s.fake.log().iter().enumerate() {
        let tokens = chat_request_tokens(l);
        assert!(tokens <= 16_000, "request {i} takes {tokens} tokens");
    }
    let last = s.fake.log().last().unwrap().messages();
    assert!(last.iter().any(|m| m.text().contains("checkpoint truncation") && m.text().contains("context_tree_query t")), "the newest output went as a copy naming its ref");
    // A system prompt of 20,000 tokens cannot fit a 16,000-token window: one clear refusal.
    let small = agent.history[0].clone();
    agent.history[0] = json!({"role": "system", "content": "You are a careful agent. ".repeat(3_200)});
    let (status, body) = agent.turn("one more").await.unwrap_err();
    assert_eq!(status, 400, "{body}");
    for part in ["CONTEXT_COMPACTION_FAILED", "the client's own system prompt and tool declarations", "use a model with a larger window"] {
        assert!(body.contains(part), "missing {part:?} in {body}");
    }
    let m = metric_values(&reqwest::get(format!("{}/condense/metrics", s.url())).await.unwrap().text().await.unwrap());
    assert_eq!(m.get(r#"condense_request_failures_total{api="chat",code="CONTEXT_COMPACTION_FAILED"}"#), Some(&1.0), "{m:?}");
    // The client goes back to its own size: the conversation carries on.
    agent.history[0] = small;
    assert_eq!(agent.run().await.unwrap(), "after the refusal");
}

/// Issue 62, item 8: without `--price-cache`, a conversation whose model's list prices condense knows (a
/// dated snapshot of a priced model here) is priced as the provider bills prompt caching — its
/// `cache_priced` in the status, the dashboard's cost panel — and one whose prices are unknown is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_priced_costs_show_by_default_for_a_model_with_known_prices() {
    for (model, priced) in [("claude-sonnet-4-5-20250929", true), ("fake-model", false)] {
        let s = setup((0..3).map(|i| Step::Text(format!("answer {i}"))).collect(), vec![]).await;
        let mut agent = Agent::new(Api::Anthropic, false, &s.url());
        agent.model = model.into();
        for t in 0..2 {
            agent.turn(&format!("question {t}")).await.unwrap();
        }
        let state = s.serve.state.clone();
        if priced {
            for _ in 0..100 {
                if !state.status().await["active_sessions"][0]["cache_priced"].is_null() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let status = state.status().await;
        assert_eq!(!status["active_sessions"][0]["cache_priced"].is_null(), priced, "{model}: {status}");
        let id = status["active_sessions"][0]["id"].as_u64().unwrap();
        let page: Value = serde_json::from_slice(&reqwest::get(format!("{}/condense/api/sessions/{id}", s.url())).await.unwrap().bytes().await.unwrap()).unwrap();
        assert_eq!(page["price_cache"], priced, "{model}: the dashboard's cost panel");
    }
}

/// Issue 59, item 1, each move through serve: at a 16,000-token window, conversations of long prompts and
/// outputs whose client's own system prompt grows from little to more than the window. As the room left
/// shrinks, the checkpoint takes the moves in their order (docs/checkpoints.md, "When even a checkpoint
/// does not fit"): the summary with retained prompts; the marker with retained prompts; the marker alone;
/// the final batch cut below its ordinary bounded copy; then one refusal naming the parts. Every request
/// that goes is within the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_window_takes_each_move_in_order_through_serve() {
    let expected = [(500u64, "summary"), (2_200, "marker+prompts"), (4_000, "marker"), (12_000, "cut"), (17_000, "refused")];
    for (system_tokens, want) in expected {
        let mut steps = Vec::new();
        for k in 0..3 {
            steps.push(Step::Shell("seq 1 3000".into()));
            steps.push(Step::Text(format!("done {k}")));
        }
        let s = setup(steps, vec![("fake-model".into(), ModelLimits { context_window: 16_000, max_output: None })]).await;
        let mut agent = Agent::new(Api::Chat, false, &s.url());
        agent.history[0] = json!({"role": "system", "content": "You are a careful agent. ".repeat((system_tokens * 4 / 25) as usize)});
        let mut refused = false;
        for k in 0..3 {
            match agent.turn(&format!("count, turn {k}: {}", "please count carefully ".repeat(100))).await {
                Ok(_) => {}
                Err((400, body)) => {
                    assert!(body.contains("CONTEXT_COMPACTION_FAILED") && body.contains("the client's own system prompt"), "{body}");
                    refused = true;
                    break;
                }
                Err(e) => panic!("{system_tokens}: {e:?}"),
            }
        }
        for (i, l) in s.fake.log().iter().enumerate() {
            let tokens = chat_request_tokens(l);
            assert!(tokens <= 16_000, "{system_tokens}: request {i} takes {tokens} tokens");
        }
        let (_, session) = store_of(&s);
        let p = session.projection().unwrap();
        let hard = condense_engine::controller::budget_of(&p).unwrap().hard;
        let moves: Vec<&'static str> = p
            .index()
            .checkpoints
            .values()
            .map(|c| match (c.recovery, c.kept.is_empty(), c.bounded.iter().map(|(_, b)| b.chars().count() as u64).max()) {
                (false, _, _) => "summary",
                (true, false, _) => "marker+prompts",
                (true, true, Some(n)) if n < (hard / 2) * 4 * 9 / 10 => "cut",
                (true, true, _) => "marker",
            })
            .collect();
        let taken = if refused { "refused" } else { moves.last().copied().unwrap_or("none") };
        assert_eq!(taken, want, "a system prompt of {system_tokens} tokens (hard budget {hard}): moves {moves:?}");
    }
}

/// Issue 62, item 4: the first request of a new conversation reaching two servers on one PostgreSQL
/// database at once never answers 500 (``session `…` exists already``): each is a 200, or the loser a 503
/// with `retry-after`, whose retry is a 200 in the same, one session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_starting_one_conversation_at_once_never_answer_500() {
    let store = pg_database().await;
    let fake = Fake::start((0..200).map(|i| Step::Text(format!("answer {i}"))).collect()).await;
    let a = start(config_for(&store, &fake)).await.expect("serve starts");
    let b = start(config_for(&store, &fake)).await.expect("serve starts");
    let (mut retried, pairs) = (0, 20);
    for k in 0..pairs {
        let mut one = Agent::new(Api::Chat, false, &format!("http://{}", a.addr));
        let mut two = Agent::new(Api::Chat, false, &format!("http://{}", b.addr));
        for agent in [&mut one, &mut two] {
            agent.user(&format!("conversation {k}: the same first words"));
        }
        let (r1, r2) = tokio::join!(one.request(), two.request());
        for (r, agent) in [(r1, &mut one), (r2, &mut two)] {
            match r {
                Ok(_) => {}
                Err((503, body)) => {
                    assert!(body.contains("send the request again"), "{body}");
                    retried += 1;
                    // As a client honours `retry-after` (sooner here): the other server may still be writing
                    // the session's first event when the first retry comes.
                    let mut tries = 0;
                    loop {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        match agent.request().await {
                            Ok(_) => break,
                            Err((503, _)) if tries < 20 => tries += 1,
                            Err(e) => panic!("pair {k}: the retry: {e:?}"),
                        }
                    }
                }
                Err(e) => panic!("pair {k}: {e:?}"),
            }
        }
    }
    let names = tokio::task::spawn_blocking(move || condense_engine::Store::open(store).unwrap().sessions().unwrap().len()).await.unwrap();
    assert_eq!(names, pairs, "one session a conversation ({retried} retried)");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// The dashboard's cache breaks are changes of the message prefix as the provider reads it (issue 60,
/// item 5): Claude Code's moving cache mark, which turns the marked message's string content into a text
/// block and back once the mark moves on, is none; a changed message is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moving_cache_mark_is_not_a_cache_break() {
    let s = setup(["one", "two", "three", "four"].into_iter().map(|t| Step::Text(t.into())).collect(), vec![]).await;
    let http = reqwest::Client::new();
    let marked = |t: &str| json!({"role": "user", "content": [{"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}]});
    let plain = |t: &str| json!({"role": "user", "content": t});
    let reply = |t: &str| json!({"role": "assistant", "content": [{"type": "text", "text": t}]});
    let breaks = || async {
        let status = s.status().await;
        let id = status["active_sessions"][0]["id"].as_u64().expect("a session");
        let page: Value = serde_json::from_slice(&reqwest::get(format!("{}/condense/api/sessions/{id}", s.url())).await.unwrap().bytes().await.unwrap()).unwrap();
        page["live"]["cache_breaks"].as_u64().expect("the live figures")
    };
    let bodies = [
        vec![marked("first question")],
        vec![plain("first question"), reply("one"), marked("second question")],
        vec![plain("first question"), reply("one"), plain("second question"), reply("two"), marked("third question")],
        // The assistant's first reply changed: the prefix the provider cached is gone.
        vec![plain("first question"), reply("one, changed"), plain("second question"), reply("two"), plain("third question"), reply("three"), marked("fourth")],
    ];
    for (k, messages) in bodies.into_iter().enumerate() {
        let body = json!({"model": "m", "max_tokens": 100, "messages": messages});
        let r = http.post(format!("{}/v1/messages", s.url())).header("content-type", "application/json").header("x-api-key", "k").body(body.to_string()).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        assert_eq!(breaks().await, u64::from(k == 3), "after request {}", k + 1);
    }
}

/// Issue 60, item 3: a request that comes longer than the cache's lifetime after its conversation's last
/// one finds the provider's cache cold, and the prunes held back to keep the cache (short outputs and
/// chains that save less than they would cost re-sent) go ahead then; with the cache warm they stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_held_back_for_the_cache_goes_ahead_when_the_cache_is_cold() {
    let mut sent = Vec::new();
    for ttl in [None, Some(std::time::Duration::from_millis(300))] {
        let steps: Vec<Step> = (0..6).flat_map(|k| [Step::Shell(format!("seq {k} 120")), Step::Text(format!("step {k} done"))]).collect();
        let fake = Fake::start(steps).await;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config_for(dir.path().join("store"), &fake);
        cfg.file.raw.rolling_window = None;
        cfg.cache_ttl = ttl;
        let serve = start(cfg).await.unwrap();
        let mut agent = Agent::new(Api::Chat, false, &format!("http://{}", serve.addr));
        for k in 0..6 {
            if k == 5 {
                tokio::time::sleep(std::time::Duration::from_millis(600)).await;
            }
            assert_eq!(agent.turn(&format!("run step {k}")).await.unwrap(), format!("step {k} done"));
        }
        let log = fake.log();
        let last = log.last().unwrap().body["messages"].to_string();
        sent.push(last);
    }
    let (warm, cold) = (&sent[0], &sent[1]);
    // Warm: every output goes upstream whole (six, each ending `119\n120\n`), nothing compressed.
    assert_eq!(warm.matches("119\\n120\\n").count(), 6, "{warm}");
    assert!(!warm.contains("[Compressed chain"), "{warm}");
    // Cold: the five earlier turns went into chain blocks at once, the turn running stays whole.
    assert!((1..=5).all(|b| cold.contains(&format!("[Compressed chain b{b}:"))), "{cold}");
    assert_eq!(cold.matches("119\\n120\\n").count(), 1, "{cold}");
    assert!(cold.len() < warm.len());
}

/// Issue 60, item 1, through serve: the dashboard's decision list gives each decision its account (tokens
/// taken out, the rewrite's premium, what it saved since, its net) and the session page the session's;
/// `/condense/status` and `/condense/metrics` carry the net saving of the conversations held in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_shows_what_it_cost_and_saved() {
    let (s, _) = three_outputs_then_turns(&[("thanks", "noted"), ("and now?", "still here"), ("go on", "and more")]).await;
    let status = s.status().await;
    let id = status["active_sessions"][0]["id"].as_u64().expect("a session");
    let get = |path: String| async move { serde_json::from_slice::<Value>(&reqwest::get(path).await.unwrap().bytes().await.unwrap()).unwrap() };
    let timeline = get(format!("{}/condense/api/sessions/{id}/timeline?after=0", s.url())).await;
    let accounts: Vec<&Value> = timeline["events"].as_array().unwrap().iter().filter_map(|e| e["accounts"].as_array()).flatten().collect();
    let chain = accounts.iter().find(|a| a["kind"] == "chain").unwrap_or_else(|| panic!("a chain's account in {timeline:#}"));
    let n = |a: &Value, k: &str| a[k].as_f64().unwrap_or_else(|| panic!("{k} in {a}"));
    // The three large outputs were spilled as they arrived: new to the provider, so their previews
    // rewrote nothing (no premium) and saved their tokens uncached once, then cached on every request.
    let spills: Vec<&&Value> = accounts.iter().filter(|a| a["kind"] == "spill").collect();
    assert_eq!(spills.len(), 3, "{accounts:?}");
    for a in &spills {
        let tokens = n(a, "tokens");
        assert!(tokens > 10_000.0 && n(a, "premium") == 0.0, "{a}");
        let expected = tokens * (1.25 + 0.1 * (n(a, "requests") - 1.0));
        assert!((n(a, "saved") - expected).abs() < 0.01 * expected, "{a}: {expected}");
    }
    // The chain rewrote what the model had seen: a premium, paid back by later requests.
    assert!(n(chain, "tokens") > 0.0 && n(chain, "premium") > 0.0, "{chain}");
    assert!(n(chain, "requests") >= 2.0 && n(chain, "saved") > n(chain, "premium"), "{chain}");
    assert!((n(chain, "net") - (n(chain, "saved") - n(chain, "premium") - n(chain, "summarizer"))).abs() < 0.02, "{chain}");
    let page = get(format!("{}/condense/api/sessions/{id}", s.url())).await;
    let total = &page["accounts"];
    assert_eq!(total["decisions"].as_u64(), Some(accounts.iter().filter(|a| a["kind"] != "kept_read").count() as u64), "{total}");
    let net: f64 = accounts.iter().filter(|a| a["kind"] != "kept_read").map(|a| n(a, "net")).sum();
    assert!((n(total, "net") - net).abs() < 0.05 * accounts.len() as f64, "{total} against {net}");
    // Status and metrics: the same net saving.
    let status = s.status().await;
    assert!((n(&status, "decisions_net_saving") - n(total, "net")).abs() < 0.01, "{status}");
    let metrics = metric_values(&reqwest::get(format!("{}/condense/metrics", s.url())).await.unwrap().text().await.unwrap());
    assert!((metrics["condense_decisions_net_saving"] - n(&status, "decisions_net_saving")).abs() < 0.01, "{metrics:?}");
    assert_eq!(metrics["condense_decisions"], n(&status, "decisions"));
}

/// Issue 60, item 4, through serve, on every API: one prompt running into forty calls before its reply.
/// The older turns of the running chain go upstream as blocks while it runs (the prompt first, then the
/// blocks, then the newest turns), every request stays provider-valid (each result right after its call,
/// read back from the body serve sent), and the final reply compresses the chain whole at the next prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_running_chain_goes_upstream_compressed_as_it_runs() {
    for api in [Api::Anthropic, Api::Chat, Api::Responses, Api::Gemini] {
        let mut steps: Vec<Step> = (0..40).map(|k| Step::Shell(format!("seq {k} 2000"))).collect();
        steps.push(Step::Text("all forty done".into()));
        steps.push(Step::Text("noted".into()));
        let fake = Fake::start(steps).await;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config_for(dir.path().join("store"), &fake);
        cfg.file.raw.rolling_window = None;
        let serve = start(cfg).await.unwrap();
        let mut agent = Agent::new(api, false, &format!("http://{}", serve.addr));
        assert_eq!(agent.turn("run the forty steps").await.unwrap(), "all forty done");
        assert_eq!(agent.turn("thanks").await.unwrap(), "noted");
        let log = fake.log();
        let list = |l: &Logged| -> Vec<Value> {
                l.body[api.list_field()].as_array().cloned().unwrap_or_default()
        };
        let neutral = |l: &Logged| -> Vec<Message> { wire::parse_request(api, list(l)).unwrap().messages.into_iter().map(|w| w.message).collect() };
        for (k, l) in log.iter().enumerate() {
            let messages: Vec<Box<Message>> = neutral(l).into_iter().map(Box::new).collect();
            let violations = condense_render::check(&messages);
            assert!(violations.is_empty(), "{api:?}, request {k}: {violations:?}");
        }
        // Each text block with its message's place (Anthropic sends the prompt and the blocks after it as
        // one user message).
        let texts = |ms: &[Message]| -> Vec<(usize, String)> {
            ms.iter().enumerate().flat_map(|(i, m)| m.content().iter().filter_map(move |b| match b {
                Block::Text { text } => Some((i, text.clone())),
                _ => None,
            })).collect()
        };
        let blocks_in = |ms: &[Message]| texts(ms).into_iter().filter(|(_, t)| t.starts_with("[Compressed chain b")).collect::<Vec<_>>();
        // The last request of the running chain: the prompt, its blocks, the newest turns.
        let running = neutral(&log[log.len() - 2]);
        let blocks = blocks_in(&running);
        assert!(!blocks.is_empty(), "{api:?}: no block while the chain runs: {running:?}");
        let all = texts(&running);
        let prompt = all.iter().position(|(_, t)| t.contains("run the forty steps")).expect("the prompt");
        let first_block = all.iter().position(|(_, t)| t.starts_with("[Compressed chain b")).unwrap();
        assert!(first_block > prompt, "{api:?}");
        let calls = running.iter().flat_map(|m| m.tool_calls()).count();
        assert!((condense_chain::SEGMENT_KEEP_TURNS..40 - condense_chain::SEGMENT_MIN_CALLS).contains(&calls), "{api:?}: {calls} calls");
        let last_block = blocks.last().unwrap().0;
        assert!(running[last_block + 1..].iter().any(|m| m.tool_calls().next().is_some()), "{api:?}: the newest turns follow the blocks");
        assert!(running[..last_block].iter().all(|m| m.tool_calls().next().is_none()), "{api:?}: no call before the blocks");
        // After the reply: one block for the chain, no calls.
        let after = neutral(log.last().unwrap());
        assert_eq!(blocks_in(&after).len(), 1, "{api:?}: {after:?}");
        assert_eq!(after.iter().flat_map(|m| m.tool_calls()).count(), 0, "{api:?}");
        serve.stop().await.unwrap();
    }
}
