//! The `condense serve` benchmarks: the server's own latency per request (request in → upstream request
//! out, against a fake upstream that answers at once) for conversations of 10, 100 and 1,000 messages,
//! and its peak memory holding 1,000 sessions of 200 messages. The server is the release `condense`
//! binary in its own process; the client and the fake upstream run here.

use crate::{ms, percentile, release_binary, status_kib};
use anyhow::{Context, Result};
use condense_serve::fake::Fake;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A coding-agent conversation of `n` messages after the system prompt: prompts, tool calls with outputs
/// of about 1 KB (each different), and a text reply closing every fifth call.
fn conversation(n: usize, seed: usize) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": "You are a coding agent. Use the bash tool."})];
    let mut call = 0;
    while out.len() <= n {
        let k = out.len();
        if k == 1 || out.last().is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_none()) {
            out.push(json!({"role": "user", "content": format!("Task {k} of session {seed}: look at the files under src/module_{k} and fix the failing test.")}));
        } else if out.last().is_some_and(|m| m["role"] == "tool") && call % 5 == 4 {
            out.push(json!({"role": "assistant", "content": format!("Done with step {call}: the test in module {k} passes now.")}));
            call += 1;
        } else if out.last().is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_some()) {
            let id = format!("call_{seed}_{call}");
            let body: String = (0..16).map(|l| format!("-rw-r--r-- 1 dev dev {:>6} Nov 30 12:{:02} src/module_{k}/file_{l}_{seed}.rs\n", 1000 + l * 37 + k, l)).collect();
            out.push(json!({"role": "tool", "tool_call_id": id, "content": body}));
            call += 1;
        } else {
            let id = format!("call_{seed}_{call}");
            out.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash", "arguments": format!("{{\"command\":\"ls -l src/module_{k}\"}}")}}]}));
        }
    }
    out.truncate(n + 1);
    out
}

fn body_of(messages: &[Value]) -> String {
    json!({"model": "gpt-4o", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]}).to_string()
}

fn post(agent: &reqwest::blocking::Client, addr: &str, session: &str, messages: &[Value]) -> Result<Value> {
    post_body(agent, addr, session, &body_of(messages))
}

fn post_body(agent: &reqwest::blocking::Client, addr: &str, session: &str, body: &str) -> Result<Value> {
    let r = agent
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer bench")
        .header("x-condense-session", session)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()?;
    let text = r.text()?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("serve answered {text}"))?;
    Ok(v["choices"][0]["message"].clone())
}

fn status(agent: &reqwest::blocking::Client, addr: &str) -> Result<Value> {
    let text = agent.get(format!("http://{addr}/condense/status")).send()?.text()?;
    Ok(serde_json::from_str(&text)?)
}

/// The words of `CONDENSE_BENCH_SHAPES` (comma-separated): the shapes a bench measures alone.
fn bench_shapes() -> Vec<String> {
    std::env::var("CONDENSE_BENCH_SHAPES").map(|v| v.split(',').map(|w| w.trim().to_string()).collect()).unwrap_or_default()
}

/// Starts the release `condense serve` on `store` (a folder or a database URL) in front of `fake`, with
/// `extra` flags (`--listen` among them, else a free loopback port); returns the child and the address it
/// listens on.
pub(crate) fn spawn_serve(bin: &Path, store: impl AsRef<std::ffi::OsStr>, fake: &Fake, extra: &[&str]) -> Result<(std::process::Child, String)> {
    let listen = if extra.contains(&"--listen") { Vec::new() } else { vec!["--listen", "127.0.0.1:0"] };
    let mut child = Command::new(bin)
        .arg("--store")
        .arg(store)
        .arg("serve")
        .args(listen)
        .args(["--openai-upstream", &fake.url(), "--anthropic-upstream", &fake.url(), "--gemini-upstream", &fake.url()])
        .args(extra)
        // serve's line per request would flood the terminal: warnings and errors, unless RUST_LOG says.
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let addr = line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).with_context(|| format!("serve did not start: `{line}`"))?.to_string();
    Ok((child, addr))
}

/// A plain forwarding proxy on loopback, the baseline a gateway's overhead is measured against: each
/// request's body read whole and posted to `upstream` at the same path with its headers, the answer
/// returned as it came. It runs on a runtime of its own (two workers, as serve's machine has two cores);
/// returns the runtime (dropping it stops the proxy) and the address.
fn plain_proxy(upstream: String) -> Result<(tokio::runtime::Runtime, String)> {
    use axum::response::IntoResponse;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?.to_string();
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (client, upstream) = (client.clone(), upstream.clone());
        async move {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            let mut rb = client.post(format!("{upstream}{}", parts.uri.path())).body(bytes);
            for (k, v) in parts.headers.iter().filter(|(k, _)| *k != axum::http::header::HOST && *k != axum::http::header::CONTENT_LENGTH) {
                rb = rb.header(k.as_str(), v.as_bytes());
            }
            match rb.send().await {
                Ok(r) => {
                    let status = axum::http::StatusCode::from_u16(r.status().as_u16()).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
                    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], r.bytes().await.unwrap_or_default()).into_response()
                }
                Err(e) => (axum::http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
    });
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((rt, addr))
}

/// Runs the benchmarks and writes their section.
pub fn bench(md: &mut String, scratch: &Path) -> Result<()> {
    let bin = release_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let fake = rt.block_on(Fake::start(Vec::new()));
    let store = scratch.join("serve-store");
    let _ = std::fs::remove_dir_all(&store);
    let (mut child, addr) = spawn_serve(&bin, &store, &fake, &[])?;
    let pid = child.id();
    let agent = reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build()?;
    writeln!(md, "\n## condense serve\n")?;
    writeln!(md, "The release `condense serve` in its own process, a client and a fake upstream that answers at once on loopback (Chat Completions, JSON). *Serve's own* latency is what the server reports in `/condense/status` (`latency_ms`, its last 100 requests): from the request read in to the rewritten request handed to the HTTP client — recording, pipeline, checkpoint check, render, rewriting. *With both loopback transfers* adds reading the request and forwarding it: from the client starting to send (its body already serialized) to the fake upstream having received the whole rewritten request. Each measured request is an agent's next request in an active conversation: the server holds half as many conversations as requests measured, each recorded whole beforehand by an unmeasured request; after a 3-second pause (recording them wrote tens of megabytes; the store's background writes settle, as they do between an agent's requests, which are seconds apart), the measured requests go round-robin over them, each adding a prompt (a conversation grows by two messages between its two measured requests). Messages are coding-agent shaped: prompts, `bash` calls, outputs of about 1 KB each (pruned as the defaults decide), text replies.\n")?;
    writeln!(md, "*Plain proxy* is the baseline of the same requests, measured the same way (client to fake upstream, both loopback transfers), through a plain forwarding proxy instead: the body read whole and posted on, nothing parsed (`plain_proxy` in `xtask/src/serve.rs`, axum and reqwest as serve uses them). *Overhead* is serve's p99 with both transfers less the proxy's: what condense adds over a gateway that only forwards.\n")?;
    writeln!(md, "| conversation | requests measured | request body | serve's own p50 | serve's own p99 | with both loopback transfers p50 | p99 | plain proxy p50 | plain proxy p99 | overhead p99 | target |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let (proxy_rt, proxy) = plain_proxy(fake.url())?;
    let mut phase_rows = Vec::new();
    // `CONDENSE_BENCH_SHAPES=1000` measures only the conversations of that many messages, and nothing after.
    let only = bench_shapes();
    for (n, reqs) in [(10usize, 200usize), (100, 200), (1000, 100)] {
        if !only.is_empty() && !only.contains(&n.to_string()) {
            continue;
        }
        // Conversations of n - 1 messages the server holds (recorded by unmeasured requests first), then
        // the measured requests, round-robin over them, each adding a prompt as an agent's next request.
        let convs = reqs / 2;
        let mut histories = Vec::with_capacity(convs);
        for c in 0..convs {
            let session = format!("latency-{n}-{c}");
            let mut history = conversation(n.saturating_sub(2), n * 1000 + c);
            let reply = post(&agent, &addr, &session, &history)?;
            history.push(reply);
            histories.push((session, history));
        }
        // Recording the conversations wrote megabytes; the store's background writes settle first, as they
        // would between an agent's requests.
        std::thread::sleep(Duration::from_secs(3));
        let mut lat = Vec::with_capacity(reqs);
        let mut bodies = Vec::with_capacity(reqs);
        let mut body_bytes = 0;
        for i in 0..reqs {
            let (session, history) = &mut histories[i % convs];
            history.push(json!({"role": "user", "content": format!("Next step {i}: run the tests again.")}));
            fake.clear_log();
            let body = body_of(history);
            body_bytes = body.len();
            let t = Instant::now();
            let reply = post_body(&agent, &addr, session, &body)?;
            bodies.push(body);
            let arrived = fake.log().last().context("the fake saw the request")?.at;
            lat.push(arrived.saturating_duration_since(t));
            history.push(reply);
        }
        // The same requests through the plain proxy: the measured bodies again, in order.
        let mut base = Vec::with_capacity(reqs);
        for body in bodies {
            fake.clear_log();
            let t = Instant::now();
            let r = agent.post(format!("http://{proxy}/v1/chat/completions")).header("authorization", "Bearer bench").header("content-type", "application/json").body(body).send()?;
            r.bytes()?;
            let arrived = fake.log().last().context("the fake saw the proxied request")?.at;
            base.push(arrived.saturating_duration_since(t));
        }
        let target = match n {
            100 => "serve's own p99 ≤ 1 ms",
            1000 => "serve's own p99 ≤ 2 ms",
            _ => "",
        };
        // The server's own figures cover its last 100 requests: measured ones only.
        let own = status(&agent, &addr)?["latency_ms"].clone();
        let phases: Vec<String> = ["parse", "wait", "record", "build", "body"]
            .iter()
            .map(|p| format!("{p} {:.2}/{:.2}", own["phases"][p]["p50"].as_f64().unwrap_or(0.0), own["phases"][p]["p99"].as_f64().unwrap_or(0.0)))
            .collect();
        phase_rows.push(format!("{n} messages: {}", phases.join(", ")));
        let (p99, base_p99) = (percentile(lat.clone(), 0.99), percentile(base.clone(), 0.99));
        writeln!(
            md,
            "| {n} messages | {reqs} | {:.0} KB | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {target} |",
            body_bytes as f64 / 1024.0,
            own["p50"].as_f64().unwrap_or(0.0),
            own["p99"].as_f64().unwrap_or(0.0),
            ms(percentile(lat, 0.5)),
            ms(p99),
            ms(percentile(base.clone(), 0.5)),
            ms(base_p99),
            ms(p99) - ms(base_p99)
        )?;
    }
    drop(proxy_rt);
    writeln!(
        md,
        "\nWhere serve's own time goes (p50/p99 per phase, ms; `latency_ms.phases` in `/condense/status`): parsing the body's structure, waiting for a blocking thread and the conversation, recording the request, preparing and rendering the context, writing the upstream body.\n"
    )?;
    for row in phase_rows {
        writeln!(md, "- {row}")?;
    }
    if !only.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(());
    }
    fake.clear_log();
    // Memory: 1,000 sessions of 200 messages held by one server.
    let t = Instant::now();
    for s in 0..1000 {
        post(&agent, &addr, &format!("memory-{s}"), &conversation(200, 10_000 + s))?;
        if s % 100 == 99 {
            fake.clear_log();
        }
    }
    let load = t.elapsed();
    let hwm = status_kib(pid, "VmHWM:") / 1024.0;
    let rss = status_kib(pid, "VmRSS:") / 1024.0;
    writeln!(md, "\nMemory: one server holding **1,000 sessions of 200 messages** each (recorded through the endpoint, one request of 200 messages per session, {:.1} s in all): peak RSS **{hwm:.0} MiB**, {rss:.0} MiB at the end (target: peak < 500 MB). Warm projections are bounded to 256 and 512 MiB by their weight (the least recently used are folded again from the log on demand) and sled's page cache to 64 MiB; the client's view of every conversation stays in memory.", load.as_secs_f64())?;
    // The dashboard's sessions list over those 1,000 sessions (what its page polls every two seconds).
    let mut list = Vec::new();
    let (mut bytes, mut sessions) = (0, 0);
    for _ in 0..20 {
        let t = Instant::now();
        let r = agent.get(format!("http://{addr}/condense/api/sessions")).send()?;
        anyhow::ensure!(r.status().is_success(), "the dashboard's list answered {}", r.status());
        let body = r.bytes()?;
        list.push(t.elapsed());
        bytes = body.len();
        sessions = serde_json::from_slice::<Value>(&body)?["sessions"].as_array().map_or(0, Vec::len);
    }
    writeln!(md, "
The dashboard's sessions list (`/condense/api/sessions`, what `/condense/` polls) on that server, {sessions} sessions with their live figures, {:.0} KB of JSON: p50 **{:.1} ms**, slowest of 20 {:.1} ms (target: a 1,000-session store lists in < 200 ms).", bytes as f64 / 1024.0, ms(percentile(list.clone(), 0.5)), ms(percentile(list, 1.0)))?;
    let _ = child.kill();
    let _ = child.wait();
    drop(rt);
    Ok(())
}

/// The peak memory of one request by shape (`--only request-memory`): each shape sent once to a fresh
/// release server, its VmHWM over the baseline, beside the reservation serve's memory budget takes for it
/// (`PER_BODY_BYTE` per byte of body and `PER_ELEMENT` per value of the message list, `crates/serve/src/budget.rs`).
/// Besides agent-shaped bodies, the smallest messages, calls and results each API accepts, many of them:
/// what serve keeps per message weighs most against a body made of those.
/// The request-memory shape of the overflow path, and of a recovery's.
const OVERFLOW_PARTS: &str = "one message of 150,000 one-letter parts over a 16,000-token window";
const RECOVERY_PARTS: &str = "the same after 80 messages on a 200,000-token model (a recovery first)";

pub fn request_memory(md: &mut String, scratch: &Path) -> Result<()> {
    use condense_formats::wire::Api;
    let bin = release_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let fake = rt.block_on(Fake::start((0..8).map(|_| condense_serve::fake::Step::Text("ok".into())).collect()));
    let role = |i: usize| if i % 2 == 0 { "user" } else { "assistant" };
    let tiny = |n: usize, text: &str| (0..n).map(|i| json!({"role": role(i), "content": text})).collect::<Vec<_>>();
    // Pairs of a call and its empty result, one call per assistant message: the API's smallest of each,
    // as many as the message limit (100,000) lets through.
    let pairs = |api: Api| {
        let mut m = vec![match api {
            Api::Gemini => json!({"role": "user", "parts": [{"text": "go"}]}),
            _ => json!({"role": "user", "content": "go"}),
        }];
        for i in 0..49_999 {
            let id = format!("a{i}");
            m.extend(match api {
                Api::Chat => [
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": ""}}]}),
                    json!({"role": "tool", "tool_call_id": id, "content": ""}),
                ],
                Api::Anthropic => [
                    json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": {}}]}),
                    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": ""}]}),
                ],
                Api::Responses => [
                    json!({"type": "function_call", "call_id": id, "name": "f", "arguments": ""}),
                    json!({"type": "function_call_output", "call_id": id, "output": ""}),
                ],
                Api::Gemini => [
                    json!({"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}),
                    json!({"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": ""}}}]}),
                ],
            });
        }
        m
    };
    let shapes: Vec<(&str, Api, Vec<Value>)> = vec![
        ("one one-letter message", Api::Chat, tiny(1, "x")),
        ("100 messages of ~1 KB", Api::Chat, (0..100).map(|i| json!({"role": role(i), "content": format!("line of text {i} ").repeat(60)})).collect()),
        ("10,000 messages of ~1 KB", Api::Chat, (0..10_000).map(|i| json!({"role": role(i), "content": format!("line of text {i} ").repeat(60)})).collect()),
        ("one message of 60 MB", Api::Chat, vec![json!({"role": "user", "content": "word ".repeat(12_000_000)})]),
        ("100,000 one-letter messages", Api::Chat, tiny(100_000, "x")),
        ("100,000 empty messages", Api::Chat, tiny(100_000, "")),
        ("100,000 one-letter messages, Anthropic", Api::Anthropic, tiny(100_000, "x")),
        ("100,000 one-letter messages, Responses", Api::Responses, tiny(100_000, "x")),
        ("100,000 one-letter messages, Gemini", Api::Gemini, (0..100_000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "model" }, "parts": [{"text": "x"}]})).collect()),
        ("500,000 one-letter messages", Api::Chat, tiny(500_000, "x")),
        ("one message of 500,000 one-letter parts", Api::Chat, vec![json!({"role": "user", "content": (0..500_000).map(|_| json!({"type": "text", "text": "p"})).collect::<Vec<_>>()})]),
        ("one reply of 60,000 parallel calls, then their results", Api::Chat, {
            let calls: Vec<Value> = (0..60_000).map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"ls {i}\"}}")}})).collect();
            let mut m = vec![json!({"role": "user", "content": "go"}), json!({"role": "assistant", "content": null, "tool_calls": calls})];
            m.extend((0..60_000).map(|i| json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("out {i}")})));
            m
        }),
        // Calls without results: the render answers each with a result of its own, written from the neutral
        // model (condense's messages are held as JSON text until the list is written).
        ("one reply of 100,000 parallel calls without results", Api::Chat, vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": null, "tool_calls": (0..100_000).map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": "{}"}})).collect::<Vec<_>>()}),
        ]),
        ("49,999 calls and their empty results", Api::Chat, pairs(Api::Chat)),
        ("49,999 calls and their empty results, Anthropic", Api::Anthropic, pairs(Api::Anthropic)),
        ("49,999 calls and their empty results, Responses", Api::Responses, pairs(Api::Responses)),
        ("49,999 calls and their empty results, Gemini", Api::Gemini, pairs(Api::Gemini)),
        ("25,000 turns of prompt, call, ~1 KB output and reply", Api::Chat, (0..25_000).flat_map(|i| [
            json!({"role": "user", "content": format!("task {i}: please look")}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"cat f{i}\"}}")}}]}),
            json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("line {i} of output\n").repeat(40)}),
            json!({"role": "assistant", "content": format!("done with {i}")}),
        ]).collect()),
        ("a call's arguments of 1,000,000 values", Api::Chat, vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": json!({"a": vec!["x"; 1_000_000]}).to_string()}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}),
        ]),
        // The overflow path (issue 62, item 6): on a model whose window (`small-model`, 16,000 tokens, in the
        // store's config.json) the message cannot fit, the controller's moves run and the request is
        // refused; after 40 turns on a 200,000-token model, the switch to it runs a recovery first.
        (OVERFLOW_PARTS, Api::Chat, vec![
            json!({"role": "user", "content": (0..150_000).map(|_| json!({"type": "text", "text": "p"})).collect::<Vec<_>>()}),
        ]),
        (RECOVERY_PARTS, Api::Chat, {
            let mut m: Vec<Value> = (0..80).map(|i| json!({"role": role(i), "content": format!("line of text {i} ").repeat(60)})).collect();
            m.push(json!({"role": "user", "content": (0..150_000).map(|_| json!({"type": "text", "text": "p"})).collect::<Vec<_>>()}));
            m
        }),
    ];
    // `CONDENSE_BENCH_SHAPES=overflow,recovery` measures only the shapes whose names hold one of the words.
    let only = bench_shapes();
    let shapes: Vec<(&str, Api, Vec<Value>)> = shapes.into_iter().filter(|(name, _, _)| only.is_empty() || only.iter().any(|w| name.contains(w.as_str()))).collect();
    writeln!(md, "\n## Memory of one request\n")?;
    writeln!(md, "Each shape sent once (JSON; Chat Completions unless named) to a fresh release `condense serve` (`--max-body-bytes` 200 MB, the default 2 GiB memory budget) against a fake upstream; *reply in* the time from sending the body to the end of the reply (the fake upstream answers at once), *peak* is the server's VmHWM minus its RSS before the request, *kept after the reply* its RSS once the reply has come back, minus the same (what the session's warm projection, the client's view, sled's page cache and the allocator's free pages hold on to; docs/serve.md, \"Memory\"). The *reservation* is what serve's memory budget takes for the request before recording it (`crates/serve/src/budget.rs`); a request whose reservation exceeds the whole budget is refused with a 413 (docs/serve.md, \"Limits\"). Besides agent-shaped bodies, bodies of the smallest messages, calls and results each API accepts, as many as the message limit lets through: serve keeps a few hundred bytes of every message, which weighs most against such a body. The *peak per byte of body* is left out below a megabyte, where what any request takes (buffers, the store's structures a first request touches) outweighs what it takes by the byte.\n")?;
    writeln!(md, "| body | size | status | reply in | peak | peak per byte of body | kept after the reply | promised | reservation |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let (mut over, mut worst) = (Vec::new(), (0.0f64, ""));
    let agent = reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build()?;
    for (name, api, messages) in shapes {
        let store = scratch.join("request-memory-store");
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store)?;
        std::fs::write(store.join("config.json"), json!({"models": {"small-model": {"contextWindow": 16_000}, "big-model": {"contextWindow": 200_000}}}).to_string())?;
        let (mut child, addr) = spawn_serve(&bin, &store, &fake, &["--max-body-bytes", &(200u64 << 20).to_string()])?;
        let model = if name == OVERFLOW_PARTS || name == RECOVERY_PARTS { "small-model" } else { "m" };
        if name == RECOVERY_PARTS {
            // The conversation's turns on the big model first (unmeasured), then the switch.
            let history = &messages[..messages.len() - 1];
            let r = agent.post(format!("http://{addr}/v1/chat/completions")).header("authorization", "Bearer bench").header("content-type", "application/json")
                .body(json!({"model": "big-model", "messages": history}).to_string()).send()?;
            let _ = r.bytes();
        }
        let (path, body) = match api {
            Api::Chat => ("/v1/chat/completions", json!({"model": model, "messages": messages})),
            Api::Anthropic => ("/v1/messages", json!({"model": "m", "max_tokens": 100, "messages": messages})),
            Api::Responses => ("/v1/responses", json!({"model": "m", "input": messages})),
            Api::Gemini => ("/v1beta/models/m:generateContent", json!({"contents": messages})),
        };
        let body = body.to_string();
        let before = status_kib(child.id(), "VmRSS:");
        let sent = Instant::now();
        let r = agent
            .post(format!("http://{addr}{path}"))
            .header("authorization", "Bearer bench")
            .header("x-api-key", "bench")
            .header("x-goog-api-key", "bench")
            .header("anthropic-version", "2023-06-01")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()?;
        let code = r.status().as_u16();
        let _ = r.bytes();
        let took = sent.elapsed();
        let peak = (status_kib(child.id(), "VmHWM:") - before) * 1024.0;
        let kept = (status_kib(child.id(), "VmRSS:") - before) * 1024.0;
        let elements: u64 = messages.iter().map(|m| condense_formats::wire::count_elements(m.to_string().as_bytes()) + 1).sum();
        let reservation = condense_serve::budget::reservation(body.len() as u64, elements) as f64;
        let promised = promised_peak(body.len(), api, &messages);
        let multiple = peak / body.len() as f64;
        // Every request held, served or refused after it was read (a window nothing fits): a 413 only is
        // refused before.
        if code != 413 && (peak > promised || peak > MULTIPLE * body.len() as f64 + FLOOR) {
            over.push(name);
        }
        // Below a megabyte what any request takes (the floor) outweighs what it takes by the byte.
        if code == 200 && body.len() >= 1_000_000 && multiple > worst.0 {
            worst = (multiple, name);
        }
        let per_byte = if body.len() >= 1_000_000 { format!("{multiple:.1}") } else { "–".into() };
        writeln!(md, "| {name} | {:.1} MB | {code} | {:.2} s | {:.0} MB | {per_byte} | {:.0} MB | {:.0} MB | {:.0} MB |", body.len() as f64 / 1e6, took.as_secs_f64(), peak / 1e6, kept / 1e6, promised / 1e6, reservation / 1e6)?;
        let _ = child.kill();
        let _ = child.wait();
    }
    let promise = format!(
        "(*promised*: {0:.0} MB, 10 bytes per byte of body, 1.1 KB per message or tool call and 0.5 KB per other content part; and whatever the shape at most {MULTIPLE:.0} times the body plus the same {0:.0} MB)",
        FLOOR / 1e6
    );
    writeln!(md, "\nThe largest peak per byte of body among the requests served of a megabyte or more: {:.1} ({}).", worst.0, worst.1)?;
    match over.as_slice() {
        [] => writeln!(md, "\nEvery request held (served, or refused once read) peaked under what docs/serve.md promises {promise}.")?,
        names => writeln!(md, "\n**Over what docs/serve.md promises** {promise}: {}.", names.join("; "))?,
    }
    drop(rt);
    Ok(())
}

/// The multiple of its body a request's peak stays under whatever its shape (docs/serve.md, "Limits"),
/// above [`FLOOR`].
const MULTIPLE: f64 = 30.0;

/// What any request may take besides [`MULTIPLE`] times its body: buffers and the store's structures a
/// first request touches, whatever its size.
const FLOOR: f64 = 8e6;

/// What docs/serve.md ("Limits") promises a request's peak stays under: [`FLOOR`], 10 bytes per byte of
/// body, 1.1 KB per message or tool call and 0.5 KB per other content part of the message list.
fn promised_peak(body: usize, api: condense_formats::wire::Api, messages: &[Value]) -> f64 {
    use condense_formats::wire::Api;
    let blocks = |m: &Value| m["content"].as_array().or(m["parts"].as_array()).map_or(0, Vec::len);
    let calls_in = |m: &Value| match api {
        Api::Gemini => m["parts"].as_array().map_or(0, |p| p.iter().filter(|p| p.get("functionCall").is_some()).count()),
        Api::Chat => m["tool_calls"].as_array().map_or(0, Vec::len),
        Api::Anthropic => m["content"].as_array().map_or(0, |c| c.iter().filter(|b| b["type"] == "tool_use").count()),
        Api::Responses => usize::from(m["type"] == "function_call"),
    };
    let calls: usize = messages.iter().map(calls_in).sum();
    let parts: usize = messages.iter().map(|m| blocks(m) - if matches!(api, Api::Anthropic | Api::Gemini) { calls_in(m) } else { 0 }).sum();
    FLOOR + 10.0 * body as f64 + 1100.0 * (messages.len() + calls) as f64 + 500.0 * parts as f64
}
