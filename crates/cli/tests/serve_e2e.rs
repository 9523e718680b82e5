//! `condense serve` end to end: the real `condense` binary between a scripted fake provider on loopback
//! and the real coding agents — Claude Code, pi, Codex, opencode and Gemini CLI, installed from npm at pinned versions by this
//! test itself (cached under `target/e2e-clients`). Each client runs two turns non-interactively; the
//! fake model runs shell commands with large outputs, later asks `context_tree_query` for a ref it saw in
//! a stub, and finishes. Each also runs forty turns through serve and direct, priced as providers bill
//! prompt caching. Also here: `kill -9` of serve in the middle of a request, and CLI commands on the
//! store while serve holds it.

use condense_events::Message;
use condense_formats::wire::Api;
use condense_serve::fake::{newest_stub_ref, Fake, Logged, Step};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

#[path = "../../../xtask/src/e2e_clients.rs"]
mod e2e_clients;
#[path = "support/run_agents.rs"]
mod run_agents;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// The folder with the clients' `node_modules`, installing them on first use (issue 8's pins).
fn clients() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("CONDENSE_E2E_CLIENTS").map(PathBuf::from).unwrap_or_else(|| workspace().join("target/e2e-clients"));
        e2e_clients::install(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    })
}

fn bin(name: &str) -> PathBuf {
    clients().join("node_modules/.bin").join(name)
}

/// A running `condense serve` child process.
struct Serve {
    child: Child,
    addr: String,
}

/// The token the two-turn sessions' serve asks for, and every client sends (README, "Authentication").
const E2E_TOKEN: &str = "e2e-SECRET-token-5d1";

impl Serve {
    fn start(store: &Path, fake: &Fake) -> Serve {
        Serve::start_auth(store, fake, None)
    }

    /// A server that asks every request for the token in `token_file`, when one is given.
    fn start_auth(store: &Path, fake: &Fake, token_file: Option<&Path>) -> Serve {
        // The script queries a stub of the turn before: a rolling window of one keeps that turn's outputs
        // as stubs in place (with the default 0 the turn is folded into a chain block at the next prune).
        std::fs::create_dir_all(store).unwrap();
        if !store.join("config.json").exists() {
            std::fs::write(store.join("config.json"), r#"{"rollingWindow": 1}"#).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_condense"));
        cmd.arg("--store")
            .arg(store)
            .args(["serve", "--listen", "127.0.0.1:0", "--anthropic-upstream", &fake.url(), "--openai-upstream", &fake.url(), "--gemini-upstream", &fake.url()])
            .args(token_file.map(|f| vec![std::ffi::OsString::from("--auth-token-file"), f.as_os_str().to_owned()]).unwrap_or_default())
            // A line per request would bury the test's own output: warnings and errors only.
            .env("RUST_LOG", "warn")
            .stderr(Stdio::inherit());
        let (child, addr) = Serve::spawn(&mut cmd);
        Serve { child, addr }
    }

    /// Starts `cmd` (a `condense serve`) and reads the address it announces; what it prints after that
    /// is read and dropped, so its stdout never closes under it.
    fn spawn(cmd: &mut Command) -> (Child, String) {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("condense serve starts");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let addr = line.split("http://").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| panic!("no address in `{line}`")).to_string();
        (child, addr)
    }

    fn kill9(&mut self) {
        let _ = Command::new("kill").arg("-9").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("the client runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Two turns of shell commands with large outputs, then a query of a stub's ref.
fn script() -> Vec<Step> {
    vec![
        Step::Shell("seq 1 30000".into()),
        Step::Shell("seq 2 30001".into()),
        Step::Shell("seq 3 30002".into()),
        Step::Text("FAKE-FINAL: turn one done".into()),
        Step::QueryNewestStub,
        Step::Text("FAKE-FINAL: found it".into()),
    ]
}

/// The assertions every client shares, on what the fake provider received.
fn check_provider_side(log: &[Logged]) -> String {
    // Later turns carry stubs in place of the old outputs.
    let q = log.iter().position(|l| l.step == Some(Step::QueryNewestStub)).expect("the model saw a stub and queried it");
    let at_query = log[q].messages();
    let r = newest_stub_ref(&at_query).unwrap();
    let stubs = at_query.iter().filter(|m| matches!(m, Message::ToolResult { .. }) && m.text().contains("context_tree_query")).count();
    assert!(stubs >= 2, "old outputs are stubbed in the later turn ({stubs})");
    // The query's result, as the fake received it in the continuation, is the original byte for byte.
    let cont = log[q + 1].messages();
    let call = cont.iter().flat_map(|m| m.tool_calls().filter(|(_, n, _)| *n == "context_tree_query").map(|(i, _, _)| i.to_string()).collect::<Vec<_>>()).last().expect("the continuation holds the query");
    let answer = cont.iter().find_map(|m| match m { Message::ToolResult { call_id, .. } if *call_id == call => Some(m.text()), _ => None }).expect("its result");
    let (_, body) = answer.split_once('\n').unwrap();
    // Long arguments (opencode's shell calls carry a description) come back before the output.
    let body = body.strip_prefix("[arguments] ").and_then(|b| b.split_once("\n[output]\n")).map_or(body, |(_, out)| out);
    // The original as the client sent it, the first time it went upstream whole.
    let n: usize = r[1..].parse().unwrap();
    let originals: Vec<String> = log.iter().find_map(|l| {
        let outs: Vec<String> = l.messages().iter().filter(|m| matches!(m, Message::ToolResult { .. })).map(Message::text).collect();
        (outs.len() >= n && !outs[n - 1].contains("context_tree_query")).then_some(outs)
    }).expect("the output went upstream whole once");
    assert_eq!(body, originals[n - 1], "the recovered output equals the original byte for byte");
    body.to_string()
}

/// What serve recorded, as the client saw it: user prompts and tool results, with condense's own
/// exchanges left out.
fn recorded(store: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let st = condense_engine::Store::open(store).unwrap();
    let infos = st.sessions().unwrap();
    assert_eq!(infos.len(), 1, "one conversation, one session: {infos:?}");
    let p = st.session(&infos[0].name).unwrap().projection().unwrap();
    split(&p.branch_messages().iter().map(|m| (**m).clone()).collect::<Vec<_>>())
}

fn split(ms: &[Message]) -> (Vec<String>, Vec<(String, String)>) {
    let condense: Vec<String> = ms.iter().flat_map(|m| m.tool_calls().filter(|(_, n, _)| condense_engine::tools::is_condense_tool(n)).map(|(i, _, _)| i.to_string()).collect::<Vec<_>>()).collect();
    let prompts = ms.iter().filter(|m| matches!(m, Message::User { origin: condense_events::UserOrigin::Prompt, .. })).map(|m| m.text()).collect();
    let results = ms
        .iter()
        .filter_map(|m| match m {
            Message::ToolResult { call_id, .. } if !condense.contains(call_id) => Some((call_id.clone(), m.text())),
            _ => None,
        })
        .collect();
    (prompts, results)
}

/// The client's own session file, imported by condense.
fn imported(file: &Path) -> Vec<Message> {
    let imp = condense_formats::import_file(file).expect("the client's session file imports");
    // The client's own bookkeeping lines are skipped by name (issue 37): nothing of them is reported.
    let unknown: Vec<String> = imp.diagnostics.iter().filter(|d| d.message.contains("unknown line type")).map(|d| d.to_string()).collect();
    assert!(unknown.is_empty(), "{}: {unknown:?}", file.display());
    let mut p = condense_render::Projection::new();
    for (i, e) in imp.events.into_iter().enumerate() {
        p.apply(i as u64 + 1, &condense_events::Event::Source(e));
    }
    p.branch_messages().iter().map(|m| (**m).clone()).collect()
}

fn find_jsonl(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(find_jsonl(&p));
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            out.push(p);
        }
    }
    out
}

/// The client's file and serve's log agree: the same tool results (condense's own left out), and the
/// client's file never holds a condense tool.
fn check_client_file(file: &Path, store: &Path) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(!text.contains("\"context_tree_query\""), "the client never saw a condense tool call");
    let (_, theirs) = split(&imported(file));
    let (_, ours) = recorded(store);
    assert_eq!(theirs.len(), ours.len(), "the same tool results:\nclient {theirs:?}\nserve {ours:?}");
    for ((ci, ct), (si, stext)) in theirs.iter().zip(&ours) {
        assert_eq!(ci, si);
        assert_eq!(ct.trim_end(), stext.trim_end(), "result of {ci}");
    }
}

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    fake: Fake,
    rt: tokio::runtime::Runtime,
}

fn env() -> Env {
    env_with(script())
}

/// A root folder and a fake provider answering with `steps`.
fn env_with(steps: Vec<Step>) -> Env {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = rt.block_on(Fake::start(steps));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    for d in ["home", "tmp", "work", "store"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    Env { _dir: dir, root, fake, rt }
}

fn base_env(cmd: &mut Command, root: &Path) {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", root.join("home"))
        .env("TMPDIR", root.join("tmp"))
        .current_dir(root.join("work"));
}

/// The two turns of [`script`] through serve: the model's shell calls, a stub queried and answered byte
/// for byte, the client's own session file matching serve's log, no secret stored.
fn two_turns(c: Client) {
    let e = env();
    // Through a server that asks for a token: the client sends it as the README says.
    let token_file = e.root.join("token");
    std::fs::write(&token_file, format!("{E2E_TOKEN}\n")).unwrap();
    let serve = Serve::start_auth(&e.root.join("store"), &e.fake, Some(&token_file));
    let base = format!("http://{}", serve.addr);
    let (code, out, err) = (c.turn)(&e.root, &base, 1, "Count the numbers with seq");
    assert_eq!(code, 0, "turn 1: {out}\n{err}");
    assert!(out.contains("turn one done"), "{out}");
    let (code, out, err) = (c.turn)(&e.root, &base, 2, "Look at the last output again");
    assert_eq!(code, 0, "turn 2: {out}\n{err}");
    assert!(out.contains("found it"), "{out}");
    check_provider_side(&e.fake.log());
    assert!(e.fake.log().iter().all(|l| l.header("x-condense-auth").is_none()), "serve's token went upstream");
    drop(serve);
    let files = find_jsonl(&e.root.join(c.sessions));
    assert_eq!(files.len(), 1, "{files:?}");
    check_client_file(&files[0], &e.root.join("store"));
    assert_no_secret(&e.root.join("store"), "SECRET");
    drop(e.rt);
}

#[test]
fn claude_code_through_serve() {
    two_turns(claude());
}

#[test]
fn pi_through_serve() {
    two_turns(pi());
}

#[test]
fn codex_through_serve() {
    two_turns(codex());
}

fn assert_no_secret(dir: &Path, needle: &str) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            assert_no_secret(&p, needle);
        } else if let Ok(b) = std::fs::read(&p) {
            assert!(!b.windows(needle.len()).any(|w| w == needle.as_bytes()), "{} holds a secret", p.display());
        }
    }
}

/// A chat request through serve; `(status, body)`.
fn chat(addr: &str, messages: &serde_json::Value) -> Result<(u16, serde_json::Value), String> {
    let body = serde_json::json!({"model": "fake-model", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]});
    let r = reqwest::blocking::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer dummy")
        .header("x-condense-session", "kill-test")
        .header("x-condense-auth", E2E_TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let text = r.text().map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)))
}

fn condense(store: &Path, args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_condense"));
    c.arg("--store").arg(store).args(args);
    run(&mut c)
}

/// `condense verify` on a store serve has traffic on (routed through the running server) reports no
/// corruption that is not there (issue 35: 7 runs of 8 reported `head is 264 but events end at 266`).
#[test]
fn verify_while_serve_has_traffic_passes() {
    let e = env_with((0..2000).map(|i| Step::Text(format!("answer {i}"))).collect());
    let (fake, store) = (&e.fake, e.root.join("store"));
    let serve = Serve::start(&store, &fake);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, stop2) = (serve.addr.clone(), stop.clone());
    let traffic = std::thread::spawn(move || {
        let mut history = serde_json::json!([{"role": "system", "content": "sys"}]);
        let mut turns = 0;
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            history.as_array_mut().unwrap().push(serde_json::json!({"role": "user", "content": format!("question {turns}")}));
            let (status, v) = chat(&addr, &history).unwrap();
            assert_eq!(status, 200, "{v}");
            history.as_array_mut().unwrap().push(v["choices"][0]["message"].clone());
            turns += 1;
        }
        turns
    });
    let runs: Vec<(i32, String, String)> = (0..8).map(|_| condense(&store, &["verify"])).collect();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let turns = traffic.join().unwrap();
    for (code, out, err) in &runs {
        assert_eq!(*code, 0, "verify under traffic: {out}{err}");
    }
    assert!(turns >= 8, "the traffic ran while verify did ({turns} turns)");
    drop(serve);
    drop(e);
}

#[test]
fn kill_9_in_the_middle_of_a_request_loses_nothing_and_the_retry_succeeds() {
    let e = env_with(vec![Step::Text("first answer".into()), Step::Slow(3000), Step::Text("lost answer".into()), Step::Text("second answer".into())]);
    let (fake, store) = (&e.fake, e.root.join("store"));
    let mut serve = Serve::start(&store, &fake);
    let mut history = serde_json::json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "one"}]);
    let (status, v) = chat(&serve.addr, &history).unwrap();
    assert_eq!(status, 200);
    history.as_array_mut().unwrap().push(v["choices"][0]["message"].clone());
    history.as_array_mut().unwrap().push(serde_json::json!({"role": "user", "content": "two"}));
    // The second request waits on the slow upstream; serve is killed meanwhile.
    let addr = serve.addr.clone();
    let h2 = history.clone();
    let pending = std::thread::spawn(move || chat(&addr, &h2));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    serve.kill9();
    assert!(pending.join().unwrap().is_err(), "the client's request broke with the server");
    // Restarted on the same store: the session resumes and the client's retry succeeds.
    let serve = Serve::start(&store, &fake);
    let (status, v) = chat(&serve.addr, &history).unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "second answer");
    // Through the running server: one session holding each message once.
    let (code, out, err) = condense(&store, &["sessions"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().filter(|l| l.contains("events")).count(), 1, "{out}");
    let name = out.lines().next().unwrap().split_whitespace().last().unwrap().to_string();
    let (code, out, _) = condense(&store, &["render", &name]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let texts: Vec<String> = v.as_array().unwrap().iter().map(|m| m["content"][0]["text"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(texts, ["one", "first answer", "two", "second answer"]);
    let (code, out, err) = condense(&store, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    drop(serve);
    drop(e);
}

/// Issue 35: a command routed to a server that is stopped (SIGSTOP: it still accepts connections) fails in
/// seconds, saying what to do, instead of waiting forever; and a `serve.json` left by a killed server whose
/// port another process took no longer makes every command fail (it was 403 from the other process).
#[test]
fn commands_neither_hang_on_a_stopped_server_nor_trust_a_stale_announcement() {
    let e = env_with(vec![]);
    let (fake, store) = (&e.fake, e.root.join("store"));
    let mut serve = Serve::start(&store, &fake);
    let pid = serve.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let t0 = std::time::Instant::now();
    let (code, _, err) = condense(&store, &["sessions"]);
    let waited = t0.elapsed();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("does not answer") && err.contains("kill -CONT"), "{err}");
    assert!(waited < std::time::Duration::from_secs(30), "the command waited {waited:?}");
    assert_eq!(condense(&store, &["sessions"]).0, 0, "a continued server answers again");
    // Killed, its serve.json stays; another process takes the port (here the fake provider's).
    serve.kill9();
    let announced = std::fs::read_to_string(store.join("serve.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&announced).unwrap();
    v["addr"] = serde_json::json!(fake.url().trim_start_matches("http://"));
    std::fs::write(store.join("serve.json"), v.to_string()).unwrap();
    let (code, out, err) = condense(&store, &["sessions"]);
    assert_eq!(code, 0, "a stale announcement: {out}{err}");
    drop(e);
}

/// A second `condense serve` on a store a running server holds says so at once, naming the running one
/// (issue 37: it waited seconds in silence for the store's lock, then said only that another process
/// held it).
#[test]
fn a_second_serve_on_a_served_store_names_the_first() {
    let e = env_with(vec![]);
    let (fake, store) = (&e.fake, e.root.join("store"));
    let serve = Serve::start(&store, fake);
    let (code, _, err) = condense(&store, &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already runs") && err.contains(&format!("pid {}", serve.child.id())) && err.contains(&serve.addr), "{err}");
    drop(serve);
    drop(e);
}

/// A serve killed with -9 whose parent has not reaped it (a zombie: its pid still exists) does not block
/// the next serve on the store, nor a command (issue 62, item 1: "already runs … point the agent at it"
/// while nothing listened).
#[test]
fn a_killed_serve_not_yet_reaped_does_not_block_the_next() {
    let e = env_with(vec![]);
    let (fake, store) = (&e.fake, e.root.join("store"));
    let mut first = Serve::start(&store, fake);
    let pid = first.child.id();
    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    // Not waited for: the process stays a zombie until this test reaps it, as a busy supervisor would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z")) {
        assert!(std::time::Instant::now() < deadline, "the killed serve did not become a zombie");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, out, err) = condense(&store, &["sessions"]);
    assert_eq!(code, 0, "a command on the store: {out}{err}");
    let second = Serve::start(&store, fake);
    assert_ne!(second.addr, first.addr);
    let (code, _, err) = condense(&store, &["serve", "--listen", "127.0.0.1:0"]);
    assert!(code == 2 && err.contains(&format!("pid {}", second.child.id())), "the live one is named: {err}");
    let _ = first.child.wait();
    drop(second);
    drop(e);
}

#[test]
fn cli_commands_go_through_a_running_server() {
    let e = env_with(vec![]);
    let (fake, store) = (&e.fake, e.root.join("store"));
    // A server that asks for a token: a command routed through it sends the token from the file serve
    // names in serve.json (the file holds the path, not the token).
    let token_file = e.root.join("token");
    std::fs::write(&token_file, E2E_TOKEN).unwrap();
    let serve = Serve::start_auth(&store, &fake, Some(&token_file));
    assert!(!std::fs::read_to_string(store.join("serve.json")).unwrap().contains(E2E_TOKEN));
    let (status, _) = chat(&serve.addr, &serde_json::json!([{"role": "user", "content": "hello there"}])).unwrap();
    assert_eq!(status, 200);
    let (code, out, err) = condense(&store, &["sessions"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("chat/hello-there/"), "{out}");
    let name = out.lines().next().unwrap().split_whitespace().last().unwrap().to_string();
    for args in [vec!["stats", name.as_str()], vec!["render", name.as_str(), "--as", "openai"], vec!["history", "archives", name.as_str()]] {
        let (code, out, err) = condense(&store, &args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    }
    // A relative path means the caller's folder, wherever serve runs.
    let corpus = workspace().join("../shared/corpus/claude-code/DRMacIver__claude-reliability/snapshot-tests/tests/hello-world-script");
    let mut c = Command::new(env!("CARGO_BIN_EXE_condense"));
    c.arg("--store").arg(&store).args(["simulate", "--keep", "transcript.jsonl"]).current_dir(&corpus);
    let (code, out, err) = run(&mut c);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = condense(&store, &["sessions"]);
    assert!(out.contains("simulated/"), "{out}");
    // Errors keep their exit code and one-line form.
    let (code, _, err) = condense(&store, &["stats", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(err.trim(), "condense: no session named `nope`");
    drop(serve);
    drop(e);
}

// ---------------------------------------------------------------------------------------------------
// Forty turns per client, through serve and direct (issues 34 and 60): the host's environment reaches the
// provider in every request, and the cache-priced cost of the session through condense is measured
// against the same client's requests sent straight to the provider.

/// The turns of the long session.
const TURNS: usize = 40;
/// The turn whose model asks condense for `new_context`, the turn that overflows once (through serve),
/// and the turn after which serve restarts.
const NEW_CONTEXT_TURN: usize = 8;
const OVERFLOW_TURN: usize = 15;
const RESTART_AFTER: usize = 20;
/// The turn that recalls a stubbed output.
const QUERY_TURN: usize = 25;

/// Each turn runs two commands with outputs of ~15 KB (under Claude Code's own cut-off, so the outputs
/// go upstream whole) and answers. Through serve the script also asks for `new_context`, overflows once
/// and, when `recall`, recalls a stub; sent direct those steps fall through (or are left out: the overflow).
fn long_script(through: bool, recall: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    for k in 1..=TURNS {
        if k == OVERFLOW_TURN && through {
            steps.push(Step::Overflow);
        }
        if k == QUERY_TURN && recall {
            steps.push(Step::QueryNewestStub);
        }
        steps.push(Step::Shell(format!("seq {k} {}", k + 3000)));
        steps.push(Step::Shell(format!("seq -w {} {}", 100 * k, 100 * k + 2500)));
        if k == NEW_CONTEXT_TURN {
            steps.push(Step::NewContext);
        }
        steps.push(Step::Text(format!("FAKE-FINAL: turn {k} done")));
    }
    steps
}

/// A real client, set up under a root folder and run a turn at a time against a base URL.
struct Client {
    name: &'static str,
    api: Api,
    /// Runs turn `k` (1-based, later turns continue the session) with the prompt against `base`
    /// (`http://host:port`), under `root`.
    turn: Box<dyn Fn(&Path, &str, usize, &str) -> (i32, String, String)>,
    /// Where under the root the client writes its session files.
    sessions: &'static str,
    /// Whether a request the fake logged carries the host's environment (`None`: the client sends none).
    environment: Option<fn(&Logged) -> bool>,
}

fn claude() -> Client {
    Client {
        name: "Claude Code",
        api: Api::Anthropic,
        sessions: "home/.claude/projects",
        turn: Box::new(|root, base, k, prompt| {
            let mut c = Command::new(bin("claude"));
            base_env(&mut c, root);
            c.env("ANTHROPIC_BASE_URL", base)
                .env("ANTHROPIC_API_KEY", "dummy-SECRET-anthropic")
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .env("DISABLE_AUTOUPDATER", "1")
                .env("DISABLE_TELEMETRY", "1")
                .env("DISABLE_ERROR_REPORTING", "1")
                .env("ANTHROPIC_CUSTOM_HEADERS", format!("x-condense-auth: {E2E_TOKEN}"))
                .args(["-p", prompt, "--allowedTools", "Bash"]);
            if k > 1 {
                c.arg("--continue");
            }
            run(&mut c)
        }),
        environment: Some(|l| {
            l.body["messages"].as_array().is_some_and(|ms| ms.iter().any(|m| m["role"] == "system" && m["content"].to_string().contains("# Environment")))
        }),
    }
}

fn codex() -> Client {
    Client {
        name: "Codex",
        api: Api::Responses,
        sessions: "home/.codex/sessions",
        turn: Box::new(|root, base, k, prompt| {
            let home = root.join("home/.codex");
            std::fs::create_dir_all(&home).unwrap();
            std::fs::write(home.join("config.toml"), codex_config(base)).unwrap();
            let mut c = Command::new(bin("codex"));
            base_env(&mut c, root);
            c.env("CODEX_HOME", &home).env("FAKE_KEY", "dummy-SECRET-codex");
            let flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"];
            if k == 1 {
                c.arg("exec").args(flags).arg(prompt);
            } else {
                c.args(["exec", "resume", "--last"]).args(flags).arg(prompt);
            }
            run(&mut c)
        }),
        environment: Some(|l| l.body["input"].as_array().is_some_and(|items| items.iter().any(|i| i.to_string().contains("<environment_context>")))),
    }
}

fn pi() -> Client {
    Client {
        name: "pi",
        api: Api::Chat,
        sessions: "agent/sessions",
        turn: Box::new(|root, base, k, prompt| {
            let agent = root.join("agent");
            std::fs::create_dir_all(&agent).unwrap();
            let models = serde_json::json!({"providers": {"fake": {
                "baseUrl": format!("{base}/v1"), "api": "openai-completions", "apiKey": "FAKE_KEY", "headers": {"x-condense-auth": E2E_TOKEN},
                "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                "models": [{"id": "fake-model", "name": "Fake", "reasoning": false, "contextWindow": 128000, "maxTokens": 4096}]}}});
            std::fs::write(agent.join("models.json"), models.to_string()).unwrap();
            let mut c = Command::new(bin("pi"));
            base_env(&mut c, root);
            c.env("PI_CODING_AGENT_DIR", &agent).env("PI_OFFLINE", "1").env("FAKE_KEY", "dummy-SECRET-pi").args(["--provider", "fake", "--model", "fake-model"]);
            if k > 1 {
                c.arg("-c");
            }
            c.args(["-p", prompt]);
            run(&mut c)
        }),
        environment: None,
    }
}

fn gemini() -> Client {
    Client {
        name: "Gemini CLI",
        api: Api::Gemini,
        sessions: "home/.gemini/tmp",
        turn: Box::new(|root, base, k, prompt| {
            let mut c = Command::new(bin("gemini"));
            base_env(&mut c, root);
            run_agents::agent_env("gemini", root, &mut c);
            c.env("GOOGLE_GEMINI_BASE_URL", base).args(["--yolo", "-m", "gemini-2.5-flash"]);
            if k > 1 {
                c.args(["--resume", "latest"]);
            }
            c.args(["-p", prompt]);
            run(&mut c)
        }),
        environment: Some(|l| {
            l.body["contents"].as_array().is_some_and(|cs| cs.iter().any(|c| c["parts"].as_array().is_some_and(|ps| ps.iter().any(|p| p["text"].as_str().is_some_and(|t| t.contains("<session_context>"))))))
        }),
    }
}

/// Codex's configuration for a provider at `base`.
fn codex_config(base: &str) -> String {
    format!(
        r#"model = "fake-model"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake local provider"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "FAKE_KEY"
http_headers = {{ "x-condense-auth" = "{E2E_TOKEN}" }}
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 20000

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
unbounded_connection_retries = false
"#
    )
}

/// What one session cost: bytes, cached bytes, cache-priced cost, requests.
struct Billing {
    billed: condense_serve::billing::Billed,
    requests: usize,
}

/// The bytes every request of `log` begins with, the same in each, in whole elements as the provider
/// caches them: the client's own system prompt, tools and the context it sends unchanged every time (its
/// environment, its first prompt), what no context manager takes out.
fn fixed_prefix(api: Api, log: &[Logged]) -> u64 {
    let mut bodies = log.iter().filter(|l| !l.path.ends_with("/count_tokens")).map(|l| condense_serve::billing::canonical(api, &l.body));
    let Some((first, ends)) = bodies.next() else { return 0 };
    let common = bodies.fold(first.len(), |common, (b, _)| common.min(first.iter().zip(&b).take_while(|(x, y)| x == y).count()));
    ends.iter().map(|e| e.0).filter(|&e| e <= common).max().unwrap_or(0) as u64
}

fn bill(api: Api, log: &[Logged]) -> Billing {
    let mut sim = condense_serve::billing::CacheSim::new(api);
    let mut requests = 0;
    // CONDENSE_E2E_BILL=1 prints each request's bytes and cached bytes (where the cost goes).
    let print = std::env::var_os("CONDENSE_E2E_BILL").is_some();
    for l in log.iter().filter(|l| !l.path.ends_with("/count_tokens")) {
        let b = sim.bill(&l.body);
        if print {
            let n = l.body.get("messages").or_else(|| l.body.get("input")).and_then(serde_json::Value::as_array).map_or(0, Vec::len);
            eprintln!("bill {api:?} request {requests}: {} bytes, {} cached, {} uncached, {n} messages", b.bytes, b.cached, b.bytes - b.cached);
            if let Some(dir) = std::env::var_os("CONDENSE_E2E_BILL_DIR") {
                let _ = std::fs::write(PathBuf::from(dir).join(format!("{api:?}-{}-{requests}.json", log.len())), serde_json::to_string_pretty(&l.body).unwrap());
            }
        }
        requests += 1;
    }
    Billing { billed: sim.total, requests }
}

/// When the environment variable `var` names a folder, a copy of `store` there under `name` (for
/// `condense log`, `render`, `stats` after the test); its path.
fn keep_store(var: &str, store: &Path, name: &str) -> Option<PathBuf> {
    let to = PathBuf::from(std::env::var_os(var)?).join(name);
    let _ = std::fs::remove_dir_all(&to);
    let status = Command::new("cp").arg("-r").arg(store).arg(&to).status().unwrap();
    assert!(status.success(), "copying the store to {}", to.display());
    Some(to)
}

/// Runs the client's forty turns against `base()` (called before each turn: serve's address changes
/// when it restarts); `between(k)` runs after turn `k`.
fn session_turns(c: &Client, root: &Path, mut base: impl FnMut() -> String, mut between: impl FnMut(usize)) {
    for k in 1..=TURNS {
        let prompt = format!("Turn {k}: count the numbers with seq");
        let (code, out, err) = (c.turn)(root, &base(), k, &prompt);
        assert_eq!(code, 0, "{} turn {k}: {out}\n{err}", c.name);
        assert!(out.contains(&format!("turn {k} done")), "{} turn {k}: {out}\n{err}", c.name);
        between(k);
    }
}

fn long_session(c: Client) {
    // The script recalls a stub at QUERY_TURN unless CONDENSE_E2E_NO_RECALL is set (a measurement: what
    // the recall and its grace window cost against issue 60's floor, docs/pruning.md).
    let recall = std::env::var_os("CONDENSE_E2E_NO_RECALL").is_none();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    // Direct: the client talks to the fake provider itself.
    let direct_fake = rt.block_on(Fake::start(long_script(false, recall)));
    let direct_dir = tempfile::tempdir().unwrap();
    for d in ["home", "tmp", "work"] {
        std::fs::create_dir_all(direct_dir.path().join(d)).unwrap();
    }
    session_turns(&c, direct_dir.path(), || direct_fake.url(), |_| {});
    // Through serve, with the defaults, restarted once.
    let fake = rt.block_on(Fake::start(long_script(true, recall)));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in ["home", "tmp", "work", "store"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let store = root.join("store");
    std::fs::write(store.join("config.json"), "{}").unwrap();
    let serve = std::cell::RefCell::new(Some(Serve::start(&store, &fake)));
    session_turns(
        &c,
        root,
        || format!("http://{}", serve.borrow().as_ref().expect("serve runs").addr),
        |k| {
            if k == RESTART_AFTER {
                drop(serve.borrow_mut().take());
                *serve.borrow_mut() = Some(Serve::start(&store, &fake));
            }
        },
    );
    drop(serve.borrow_mut().take());
    // CONDENSE_E2E_BILL_DIR also keeps the store through serve there (for `condense log`, `render`).
    keep_store("CONDENSE_E2E_BILL_DIR", &store, &format!("store-{}", c.name.replace(' ', "-")));
    let through_log = fake.log();
    let direct_log = direct_fake.log();
    // The session went through what the script asks for.
    let st = condense_engine::Store::open(&store).unwrap();
    let infos = st.sessions().unwrap();
    // One conversation, one session. Gemini CLI 0.61's own context management drops its first prompt
    // from the history it resumes once it has masked old outputs (turn 7 here); serve follows the
    // conversation to its new first prompt while it runs, but after its restart (turn 20) that first
    // prompt names no session it knows, and the turns after go on in a second (docs/serve.md, "Gemini").
    let split = c.api == Api::Gemini && infos.len() == 2 && infos[1].name.starts_with("gemini-cli/turn-2-");
    assert!(infos.len() == 1 || split, "one conversation, one session: {infos:?}");
    let checkpoints: usize = infos.iter().map(|i| st.session(&i.name).unwrap().projection().unwrap().index().checkpoints.len()).sum();
    assert!(checkpoints >= 2, "{}: new_context and the overflow each checkpointed ({checkpoints})", c.name);
    assert!(!recall || through_log.iter().any(|l| l.step == Some(Step::QueryNewestStub)), "{}: a stub was recalled", c.name);
    // The environment reached every request, through serve as direct.
    let environment = c.environment.map(|has| {
        for (i, l) in through_log.iter().enumerate().filter(|(_, l)| !l.path.ends_with("/count_tokens")) {
            assert!(has(l), "{}: request {i} through serve lacks the environment: {}", c.name, serde_json::to_string_pretty(&l.body).unwrap());
        }
        assert!(direct_log.iter().all(has), "{}: the client sends its environment every time", c.name);
        "every request"
    });
    // A call's arguments, where the API carries them as a string (Chat Completions, Responses), go
    // upstream as the client sent them, byte for byte (issue 60: pi's came back re-serialized, which broke
    // the prompt cache twice a session): each is one the same client sent direct. condense's own calls are
    // not the client's.
    let args = |log: &[Logged]| -> std::collections::BTreeSet<String> {
        let mut all = std::collections::BTreeSet::new();
        for l in log {
            let list = l.body.get("messages").or_else(|| l.body.get("input")).and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
            for m in &list {
                let calls = m.get("tool_calls").and_then(serde_json::Value::as_array).cloned().unwrap_or_else(|| vec![m.clone()]);
                for call in calls {
                    let f = call.get("function").unwrap_or(&call);
                    if let (Some(name), Some(a)) = (f.get("name").and_then(serde_json::Value::as_str), f.get("arguments").and_then(serde_json::Value::as_str)) {
                        if !condense_engine::tools::is_condense_tool(name) {
                            all.insert(a.to_string());
                        }
                    }
                }
            }
        }
        all
    };
    if matches!(c.api, Api::Chat | Api::Responses) {
        let (through, direct) = (args(&through_log), args(&direct_log));
        assert!(!through.is_empty(), "{}: calls went upstream", c.name);
        let changed: Vec<&String> = through.difference(&direct).collect();
        assert!(changed.is_empty(), "{}: arguments not as the client sent them: {changed:?}", c.name);
    }
    let (t, d) = (bill(c.api, &through_log), bill(c.api, &direct_log));
    // The floor: condense paying full price for nothing but what is new (what direct paid full price
    // for) and the cached price for every other byte it sends.
    let new_bytes = d.billed.bytes - d.billed.cached;
    let floor = condense_serve::billing::Billed { bytes: t.billed.bytes, cached: t.billed.bytes.saturating_sub(new_bytes) }.cost();
    // Issue 60's floor: each byte new to the provider once uncached (what direct sent uncached), plus the
    // client's own fixed context (system prompt, tools, environment: what every request of its direct
    // session begins with) read from the cache in every request condense sent.
    let fixed = fixed_prefix(c.api, &direct_log);
    let floor_issue = condense_serve::billing::UNCACHED_BYTE * new_bytes as f64 + condense_serve::billing::CACHED_BYTE * (fixed * t.requests as u64) as f64;
    let row = format!(
        "| {} | {} / {} | {:.3} | {:.1}% → {:.1}% | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
        c.name,
        t.requests,
        d.requests,
        t.billed.bytes as f64 / d.billed.bytes as f64,
        100.0 * d.billed.hit(),
        100.0 * t.billed.hit(),
        t.billed.cost() / d.billed.cost(),
        floor / d.billed.cost(),
        floor_issue / d.billed.cost(),
        t.billed.cost() / floor_issue,
        environment.unwrap_or("(none sent)"),
    );
    let report = workspace().join("target/e2e-cost");
    std::fs::create_dir_all(&report).unwrap();
    std::fs::write(report.join(format!("{}.md", c.name.replace(' ', "-"))), &row).unwrap();
    eprint!("{row}");
    // condense costs less than sending direct, and within 5% of its floor: what it pays beyond the new
    // content is the few rewrites it cannot avoid (the checkpoints, a recall), not cache breaks (before
    // the fixes of 2026-12-04 Claude Code paid about 8% over it: 0.329 against 0.305). The issue's target, 0.30, is below the floor
    // of this session for Claude Code and Codex: docs/pruning.md, "The prompt cache through serve".
    assert!(t.billed.cost() < d.billed.cost(), "{row}");
    assert!(t.billed.cost() <= 1.05 * floor, "more than 5% over the floor: {row}");
    // Against issue 60's floor, which leaves condense only the client's own fixed context: Claude Code
    // 1.082, Codex 1.105, pi 1.116 of it over forty turns (2026-12-07, with a summary without empty sections; the
    // issue's target is 1.10, not met for Codex and pi: docs/pruning.md, "Forty turns against issue 60's floor"; without the recall at
    // turn 25 and its grace window, CONDENSE_E2E_NO_RECALL, 1.065, 1.086 and 1.091). Held here so it does not grow.
    // Gemini CLI's direct session breaks its own cache (its floor is no bound, as above).
    if c.api != Api::Gemini {
        assert!(t.billed.cost() <= 1.15 * floor_issue, "more than 15% over issue 60's floor: {row}");
    }
    drop(rt);
}

#[test]
fn forty_turns_of_claude_code_through_serve_and_direct() {
    long_session(claude());
}

#[test]
fn forty_turns_of_codex_through_serve_and_direct() {
    long_session(codex());
}

#[test]
fn forty_turns_of_pi_through_serve_and_direct() {
    long_session(pi());
}

#[test]
fn forty_turns_of_gemini_cli_through_serve_and_direct() {
    long_session(gemini());
}

/// `--log-format json`: one JSON line per request on stderr (session id, API, status, serve's own time,
/// tokens), a pass-through request too; `RUST_LOG` filters them; never an API key or a body.
#[test]
fn serve_logs_one_json_line_per_request_without_keys_or_bodies() {
    let e = env_with((0..8).map(|i| Step::Text(format!("ANSWER-words {i}"))).collect());
    let store = e.root.join("store");
    let run_serve = |rust_log: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_condense"));
        cmd.arg("--store")
            .arg(&store)
            .args(["serve", "--listen", "127.0.0.1:0", "--openai-upstream", &e.fake.url(), "--log-format", "json"])
            .env("RUST_LOG", rust_log)
            .stderr(Stdio::piped());
        let (child, addr) = Serve::spawn(&mut cmd);
        let http = reqwest::blocking::Client::new();
        let body = serde_json::json!({"model": "fake-model", "messages": [{"role": "user", "content": "PROMPT-secret-words"}]}).to_string();
        let r = http.post(format!("http://{addr}/v1/chat/completions")).header("authorization", "Bearer sk-LOGTEST-key-123").header("content-type", "application/json").body(body).send().unwrap();
        assert_eq!(r.status(), 200);
        // A second conversation on the same model: the model is logged once.
        let body = serde_json::json!({"model": "fake-model", "messages": [{"role": "user", "content": "PROMPT-secret-other"}]}).to_string();
        let r = http.post(format!("http://{addr}/v1/chat/completions")).header("authorization", "Bearer sk-LOGTEST-key-123").header("content-type", "application/json").body(body).send().unwrap();
        assert_eq!(r.status(), 200);
        let r = http.get(format!("http://{addr}/v1/models")).header("authorization", "Bearer sk-LOGTEST-key-123").send().unwrap();
        assert_eq!(r.status(), 200, "the fake answers every path");
        // One condense refuses itself: a WARN line with its code and reason (issue 62, item 2).
        let body = serde_json::json!({"model": "fake-model", "messages": "PROMPT-secret-bad"}).to_string();
        let r = http.post(format!("http://{addr}/v1/chat/completions")).header("authorization", "Bearer sk-LOGTEST-key-123").header("content-type", "application/json").body(body).send().unwrap();
        assert_eq!(r.status(), 400);
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let output = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let err = run_serve("info");
    let lines: Vec<serde_json::Value> = err.lines().filter_map(|l| serde_json::from_str(l).ok()).filter(|v: &serde_json::Value| v["target"] == "condense::request").collect();
    assert_eq!(lines.len(), 4, "one line per request: {err}");
    let (chat, models, refused) = (&lines[0], &lines[2], &lines[3]);
    assert_eq!((refused["level"].as_str(), refused["message"].as_str(), refused["code"].as_str(), refused["status"].as_u64()), (Some("WARN"), Some("request refused"), Some("bad_request"), Some(400)), "{refused}");
    assert!(refused["reason"].as_str().unwrap().contains("`messages` must be a list"), "{refused}");
    // The model nobody configured: one warning, saying how to set its window.
    let model_lines: Vec<serde_json::Value> = err.lines().filter_map(|l| serde_json::from_str(l).ok()).filter(|v: &serde_json::Value| v["target"] == "condense::model").collect();
    assert_eq!(model_lines.len(), 1, "{err}");
    assert_eq!((model_lines[0]["level"].as_str(), model_lines[0]["model"].as_str()), (Some("WARN"), Some("fake-model")), "{err}");
    assert!(model_lines[0]["message"].as_str().unwrap().contains("condense config set models"), "{err}");
    assert_eq!((chat["api"].as_str(), chat["status"].as_u64(), chat["passthrough"].as_bool()), (Some("chat"), Some(200), Some(false)), "{chat}");
    assert!(chat["session"].as_u64().unwrap() >= 1, "{chat}");
    assert!(chat["own_ms"].as_f64().unwrap() > 0.0, "{chat}");
    assert!(chat["tokens_received"].as_u64().unwrap() > 0 && chat["tokens_sent"].as_u64().unwrap() > 0, "{chat}");
    assert_eq!((models["api"].as_str(), models["status"].as_u64(), models["passthrough"].as_bool()), (Some("models"), Some(200), Some(true)), "{models}");
    for secret in ["LOGTEST", "PROMPT-secret", "ANSWER-words"] {
        assert!(!err.contains(secret), "`{secret}` in the log: {err}");
    }
    // A filter that leaves the request lines out but the refusals (WARN); a window from the config's table
    // is logged as such.
    let (code, out, cerr) = condense(&store, &["config", "set", "models", r#"{"fake-*": {"contextWindow": 32000}}"#]);
    assert_eq!(code, 0, "{out}{cerr}");
    let quiet = run_serve("warn,condense::model=info");
    let request_lines: Vec<&str> = quiet.lines().filter(|l| l.contains("condense::request")).collect();
    assert!(request_lines.len() == 1 && request_lines[0].contains("request refused"), "{quiet}");
    assert!(quiet.contains(r#"a context window of 32000 tokens assumed (from the models table, \"fake-*\")"#), "{quiet}");
    drop(e);
}

// ---------------------------------------------------------------------------------------------------
// Tight windows (issue 59): each client through serve at a 16k, 24k and 32k model window, every turn with
// large outputs and a recall now and then. No turn fails, the host's environment is in every request,
// every request the provider gets is valid.

/// The script of a tight-window session of `turns` turns: two outputs of ~8–15 KB a turn, a recall of
/// the newest stub every fourth turn.
fn tight_script(turns: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for k in 1..=turns {
        if k % 4 == 0 {
            steps.push(Step::QueryNewestStub);
        }
        steps.push(Step::Shell(format!("seq {k} {}", k + 3000)));
        steps.push(Step::Shell(format!("seq -w {} {}", 100 * k, 100 * k + 1500)));
        steps.push(Step::Text(format!("FAKE-FINAL: turn {k} done")));
    }
    steps
}

/// `turns` turns of client `c` through serve with a model window of `window` tokens (the store's models
/// table, for every model the client may name). Returns the turns that failed, with what the client said.
fn tight_window(c: &Client, window: u64, turns: usize) -> Vec<(usize, String)> {
    let e = env_with(tight_script(turns));
    let (root, fake) = (e.root.as_path(), &e.fake);
    let store = root.join("store");
    let models = serde_json::json!({"models": {"claude-*": {"contextWindow": window}, "fake-*": {"contextWindow": window}, "gpt-*": {"contextWindow": window}}});
    std::fs::write(store.join("config.json"), models.to_string()).unwrap();
    let serve = Serve::start(&store, fake);
    let base = format!("http://{}", serve.addr);
    let mut failed = Vec::new();
    for k in 1..=turns {
        let (code, out, err) = (c.turn)(root, &base, k, &format!("Turn {k}: count the numbers with seq"));
        if code != 0 || !out.contains(&format!("turn {k} done")) {
            let said = format!("{out}{err}");
            let tail: String = said.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
            failed.push((k, format!("exit {code}: …{tail}")));
        }
    }
    drop(serve);
    // CONDENSE_E2E_KEEP keeps the store there, with the first request the provider got.
    if let Some(to) = keep_store("CONDENSE_E2E_KEEP", &store, &format!("tight-{}-{window}", c.name.replace(' ', "-"))) {
        if let Some(first) = fake.log().first() {
            std::fs::write(to.join("first-request.json"), first.body.to_string()).unwrap();
        }
    }
    let log = fake.log();
    let mut largest = 0;
    for (i, l) in log.iter().enumerate().filter(|(_, l)| !l.path.ends_with("/count_tokens")) {
        let ms: Vec<std::sync::Arc<Message>> = l.messages().into_iter().map(std::sync::Arc::new).collect();
        // What the request takes of the window, counted as condense counts it (chars / 4 of the messages,
        // bytes / 4 of the system prompt, instructions and tool declarations): never more than the window.
        let overhead: u64 = ["system", "instructions", "tools"].iter().filter_map(|k| l.body.get(*k)).map(|v| (v.to_string().len() as u64).div_ceil(4)).sum();
        let tokens = overhead + condense_tokens::estimate_all(ms.iter().map(|m| &**m));
        largest = largest.max(tokens);
        assert!(tokens <= window, "{} at {window}: request {i} takes {tokens} tokens ({overhead} of them the client's system prompt and tools)", c.name);
        let problems = condense_render::check(&ms);
        assert!(problems.is_empty(), "{} at {window}: request {i} is not valid: {problems:?}", c.name);
        if let Some(has) = c.environment {
            assert!(has(l), "{} at {window}: request {i} lacks the environment", c.name);
        }
    }
    // Every recall was answered: the original whole where it fits the window, else a copy cut to the room
    // left that names the ref that returns it whole (docs/checkpoints.md, "When even a checkpoint does not
    // fit").
    let (mut whole, mut cut, mut recalls) = (0, 0, 0);
    let outputs: std::collections::BTreeSet<String> = log.iter().flat_map(|l| l.messages()).filter(|m| matches!(m, Message::ToolResult { .. })).map(|m| m.text()).collect();
    for (q, l) in log.iter().enumerate().filter(|(_, l)| l.step == Some(Step::QueryNewestStub)) {
        recalls += 1;
        let _ = l;
        let cont = log.get(q + 1).map(Logged::messages).unwrap_or_default();
        let call = cont.iter().flat_map(|m| m.tool_calls().filter(|(_, n, _)| *n == "context_tree_query").map(|(i, _, _)| i.to_string()).collect::<Vec<_>>()).last();
        let answer = call.and_then(|call| cont.iter().find_map(|m| match m {
            Message::ToolResult { call_id, .. } if *call_id == call => Some(m.text()),
            _ => None,
        }));
        let answer = answer.unwrap_or_else(|| panic!("{} at {window}: recall {q} never answered upstream", c.name));
        let body = answer.split_once('\n').map_or("", |(_, b)| b);
        if outputs.contains(body) && !body.contains("checkpoint truncation") {
            whole += 1;
        } else {
            assert!(answer.contains("checkpoint truncation") && answer.contains("returns it whole"), "{} at {window}: recall {q} answered neither whole nor as a copy naming its ref: {answer}", c.name);
            cut += 1;
        }
    }
    assert!(recalls >= turns / 4 - 1, "{} at {window}: {recalls} recalls", c.name);
    eprintln!(
        "tight window: {} at {window}: {} of {turns} turns failed, {} requests, the largest {largest} tokens, {recalls} recalls ({whole} whole, {cut} cut to fit)",
        c.name,
        failed.len(),
        log.len()
    );
    drop(e);
    failed
}

/// The tight windows and the turns run at each (fewer at the smallest, to keep the suite in CI's time).
const TIGHT: [(u64, usize); 3] = [(16_000, 30), (24_000, 50), (32_000, 50)];
// CONDENSE_E2E_TIGHT=16000:3 runs only that window, for that many turns (a quick look).

fn tight_windows(c: Client) {
    let mut report = String::new();
    let mut failures = Vec::new();
    let only: Option<(u64, usize)> = std::env::var("CONDENSE_E2E_TIGHT").ok().and_then(|v| v.split_once(':').and_then(|(w, t)| Some((w.parse().ok()?, t.parse().ok()?))));
    for (window, turns) in only.map_or(TIGHT.to_vec(), |o| vec![o]) {
        let failed = tight_window(&c, window, turns);
        report.push_str(&format!("| {} | {window} | {turns} | {} |\n", c.name, failed.len()));
        if !failed.is_empty() {
            failures.push(format!("{} at {window}: {} of {turns} turns failed: {failed:#?}", c.name, failed.len()));
        }
    }
    let dir = workspace().join("target/e2e-tight");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{}.md", c.name.replace(' ', "-"))), &report).unwrap();
    eprint!("{report}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn tight_windows_claude_code() {
    tight_windows(claude());
}

#[test]
fn tight_windows_codex() {
    tight_windows(codex());
}

#[test]
fn tight_windows_pi() {
    tight_windows(pi());
}
