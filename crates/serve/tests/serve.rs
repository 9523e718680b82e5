//! `condense serve` against a scripted fake provider on loopback, driven by a small agent that behaves
//! as a coding agent does: it resends its whole history every request, runs the shell tool calls it gets
//! for real, and stops at a text reply. Each API is exercised streaming and not.

use condense_engine::config::{FileConfig, ModelLimits};
use condense_events::{Block, Message};
use condense_formats::wire::{self, Api};
use condense_serve::fake::{newest_stub_ref, Fake, Step};
use condense_serve::{start, Running, ServeConfig};
use serde_json::{json, Value};
use std::path::Path;

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
}

fn bash_tool(api: Api) -> Value {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]});
    match api {
        Api::Anthropic => json!({"name": "bash", "description": "Run a shell command", "input_schema": schema}),
        Api::Chat => json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": schema}}),
        Api::Responses => json!({"type": "function", "name": "bash", "description": "Run a shell command", "parameters": schema}),
    }
}

impl Agent {
    fn new(api: Api, stream: bool, base: &str) -> Agent {
        let history = match api {
            Api::Anthropic => Vec::new(),
            Api::Chat => vec![json!({"role": "system", "content": "You are a test agent."})],
            Api::Responses => vec![json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a test agent."}]})],
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
        }
    }

    fn user(&mut self, text: &str) {
        self.history.push(match self.api {
            Api::Anthropic | Api::Chat => json!({"role": "user", "content": text}),
            Api::Responses => json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}),
        });
    }

    fn body(&self) -> Value {
        let mut b = json!({"model": self.model, "stream": self.stream, "tools": [bash_tool(self.api)]});
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

    fn path(&self) -> &'static str {
        match self.api {
            Api::Anthropic => "/v1/messages",
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
        }
    }

    /// One request; the reply as the agent saw it (or the error status and body).
    async fn request(&mut self) -> Result<Message, (u16, String)> {
        let mut rb = self.http.post(format!("{}{}", self.base, self.path())).header("content-type", "application/json").body(self.body().to_string());
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
            let mut codec = condense_serve::stream::codec(self.api, Box::new(|_| false));
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

async fn setup(steps: Vec<Step>, models: Vec<(String, ModelLimits)>) -> Setup {
    let fake = Fake::start(steps).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = ServeConfig::new(dir.path().join("store"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.anthropic_upstream = fake.url();
    cfg.openai_upstream = format!("{}/v1", fake.url());
    cfg.file = FileConfig { models, ..FileConfig::default() };
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
        walk(self.dir.path(), &mut out);
        out
    }
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
async fn full_path(api: Api, stream: bool) {
    let steps = vec![
        Step::Shell(BIG.into()),
        Step::Shell("seq 2 30001".into()),
        Step::Shell("seq 3 30002".into()),
        Step::Text("turn one done".into()),
        Step::QueryNewestStub,
        Step::Text("found it".into()),
    ];
    let s = setup(steps, vec![]).await;
    let mut agent = Agent::new(api, stream, &s.url());
    assert_eq!(agent.turn("count the numbers").await.unwrap(), "turn one done");
    // One reply to the client: the text before the condense call and the continuation's.
    assert_eq!(agent.turn("look at the last output again").await.unwrap(), "Let me look at t3 again.found it");
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
    // Secrets passed through and were never stored or shown.
    let first = &log[0];
    assert_eq!(first.header("x-api-key"), Some("sk-test-SECRET-key-0123"));
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
