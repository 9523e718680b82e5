//! `condense run AGENT` end to end (issue 61): each real agent started by the real `condense` binary,
//! which starts a serve for it (or uses the one running) and points it there without a file of the
//! agent's edited; the scripted provider sees its requests, the store gets its session, the agent's exit
//! code, arguments and signals pass through, and the serve started for it stops with it.

use super::*;

/// The agents' installed commands first on PATH, then the machine's (node, the shell tools).
fn agents_path() -> std::ffi::OsString {
    let mut dirs = vec![clients().join("node_modules/.bin")];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).unwrap()
}

/// The environment each agent needs under `root` besides what `condense run` gives it: dummy keys, its
/// home folders, its network traffic off.
pub(crate) fn agent_env(agent: &str, root: &Path, c: &mut Command) {
    match agent {
        "claude" => {
            c.env("ANTHROPIC_API_KEY", "dummy-SECRET-anthropic")
                .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                .env("DISABLE_AUTOUPDATER", "1")
                .env("DISABLE_TELEMETRY", "1")
                .env("DISABLE_ERROR_REPORTING", "1");
        }
        "codex" => {
            let home = root.join("home/.codex");
            std::fs::create_dir_all(&home).unwrap();
            let config = "model = \"fake-model\"\napproval_policy = \"never\"\nsandbox_mode = \"danger-full-access\"\ncheck_for_update_on_startup = false\n\n[analytics]\nenabled = false\n\n[feedback]\nenabled = false\n\n[features]\nplugins = false\n";
            std::fs::write(home.join("config.toml"), config).unwrap();
            c.env("CODEX_HOME", &home).env("OPENAI_API_KEY", "dummy-SECRET-codex");
        }
        "pi" => {
            let agent = root.join("agent");
            std::fs::create_dir_all(&agent).unwrap();
            c.env("PI_CODING_AGENT_DIR", &agent).env("PI_OFFLINE", "1").env("ANTHROPIC_API_KEY", "dummy-SECRET-pi");
        }
        "opencode" => {
            c.env("ANTHROPIC_API_KEY", "dummy-SECRET-opencode")
                .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
                .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                .env("OPENCODE_DISABLE_SHARE", "1")
                .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
                .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
                // opencode asks a small model for the session's title beside the turn: on OpenAI's API, so
                // it reaches another fake than the turn's script (and the user's own configuration in
                // this variable is kept by `condense run`).
                .env("OPENCODE_CONFIG_CONTENT", r#"{"small_model": "openai/gpt-4o-mini"}"#)
                .env("OPENAI_API_KEY", "dummy-SECRET-opencode");
        }
        "gemini" => {
            let settings = root.join("home/.gemini");
            std::fs::create_dir_all(&settings).unwrap();
            let config = serde_json::json!({"general": {"disableAutoUpdate": true, "disableUpdateNag": true}, "privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false}, "security": {"folderTrust": {"enabled": false}, "auth": {"selectedType": "gemini-api-key"}}});
            std::fs::write(settings.join("settings.json"), config.to_string()).unwrap();
            c.env("GEMINI_API_KEY", "dummy-SECRET-gemini");
        }
        _ => unreachable!("{agent}"),
    }
}

/// The agent's own arguments for one non-interactive turn with `prompt`.
fn agent_args(agent: &str, prompt: &str) -> Vec<String> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match agent {
        "claude" => v(&["-p", prompt, "--allowedTools", "Bash"]),
        "codex" => v(&["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]),
        "pi" => v(&["--provider", "anthropic", "--model", "claude-sonnet-4-5", "-p", prompt]),
        "opencode" => v(&["run", "--model", "anthropic/claude-sonnet-4-5", prompt]),
        "gemini" => v(&["--yolo", "-m", "gemini-2.5-flash", "-p", prompt]),
        _ => unreachable!("{agent}"),
    }
}

/// `condense --store STORE run [FLAGS] AGENT -- ARGS` under `root` (not yet started).
fn run_command(root: &Path, store: &Path, flags: &[&str], agent: &str, args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_condense"));
    base_env(&mut c, root);
    c.env("PATH", agents_path()).env("RUST_LOG", "warn");
    agent_env(agent, root, &mut c);
    c.arg("--store").arg(store).arg("run").args(flags).arg(agent).arg("--").args(args);
    c
}

/// The one turn's script: a shell command, then the answer (opencode's shell tool asks for a description).
fn one_turn(agent: &str) -> Vec<Step> {
    let shell = if agent == "opencode" {
        Step::Call("bash".into(), serde_json::json!({"command": "seq 1 3000", "description": "Count to 3000"}))
    } else {
        Step::Shell("seq 1 3000".into())
    };
    vec![shell, Step::Text("FAKE-FINAL: run done".into())]
}

/// Whether something listens at `addr`.
fn listening(addr: &str) -> bool {
    std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), std::time::Duration::from_secs(1)).is_ok()
}

/// The address in `condense run`'s line on stderr.
fn announced_addr(err: &str) -> String {
    let line = err.lines().find(|l| l.starts_with("condense: ")).unwrap_or_else(|| panic!("no line of condense run's: {err}"));
    line.split("dashboard http://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_else(|| panic!("no dashboard in `{line}`")).to_string()
}

/// One agent through `condense run`, which starts a serve for it: the exit code, the request upstream,
/// the session in the store, the shell output recorded, the serve stopped after.
fn through_run(agent: &str) {
    let e = env_with(one_turn(agent));
    let store = e.root.join("store");
    let titles = e.rt.block_on(Fake::start((0..10).map(|_| Step::Text("A title".into())).collect()));
    let openai = if agent == "opencode" { titles.url() } else { e.fake.url() };
    let flags = ["--anthropic-upstream", &e.fake.url(), "--openai-upstream", &openai, "--gemini-upstream", &e.fake.url()];
    let (code, out, err) = run(&mut run_command(&e.root, &store, &flags, agent, &agent_args(agent, "Count with seq")));
    assert_eq!(code, 0, "{agent}: {out}\n{err}");
    assert!(out.contains("run done"), "{agent}: {out}\n{err}");
    // The one line before the agent starts: the dashboard and the store.
    let line = err.lines().find(|l| l.starts_with("condense: ")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(&format!("condense: {agent} through a serve started for it; dashboard http://127.0.0.1:")) && line.contains(&format!("store {}", store.display())), "{line}");
    let addr = announced_addr(&err);
    // The requests went upstream, in the agent's API, with its shell output in the second.
    let log = e.fake.log();
    let model_requests: Vec<&Logged> = log.iter().filter(|l| l.step.is_some()).collect();
    assert!(model_requests.len() >= 2, "{agent}: {} requests upstream", log.len());
    let expected = match agent {
        "codex" => Api::Responses,
        "gemini" => Api::Gemini,
        _ => Api::Anthropic,
    };
    assert!(model_requests.iter().all(|l| l.api() == expected), "{agent}: {:?}", model_requests.iter().map(|l| &l.path).collect::<Vec<_>>());
    assert!(model_requests.last().unwrap().raw.windows(4).any(|w| w == b"2999"), "{agent}: the shell output went upstream");
    if agent == "opencode" {
        // The user's own OPENCODE_CONFIG_CONTENT was kept (its small model asked for the title), and
        // OpenAI's API went through serve too.
        assert!(titles.log().iter().any(|l| l.api() == Api::Responses), "opencode's title request did not come through serve");
    }
    // The serve started for the agent stopped with it: its address closed, its announcement withdrawn.
    assert!(!listening(&addr), "{agent}: serve still listens at {addr}");
    assert!(!store.join("serve.json").exists(), "{agent}: serve.json left behind");
    // The session is in the store, the shell output recorded in it; no key was stored.
    let st = condense_engine::Store::open(&store).unwrap();
    let outputs: Vec<(String, String)> = st.sessions().unwrap().iter().flat_map(|i| split(&st.session(&i.name).unwrap().projection().unwrap().branch_messages().iter().map(|m| (**m).clone()).collect::<Vec<_>>()).1).collect();
    assert!(outputs.iter().any(|(_, text)| text.contains("2999")), "{agent}: {outputs:?}");
    drop(st);
    assert_no_secret(&store, "SECRET");
    drop(e);
}

#[test]
fn claude_code_through_condense_run() {
    through_run("claude");
}

#[test]
fn codex_through_condense_run() {
    through_run("codex");
}

#[test]
fn pi_through_condense_run() {
    through_run("pi");
}

#[test]
fn opencode_through_condense_run() {
    through_run("opencode");
}

#[test]
fn gemini_cli_through_condense_run() {
    through_run("gemini");
}

/// A serve already running (asking for a token) is used, and left running; `--keep-serve` leaves the one
/// started running for the next; the agent's exit code passes through; an agent not installed, and a
/// store another process holds, get errors that say what to do.
#[test]
fn condense_run_uses_a_running_serve_and_passes_exit_codes_through() {
    let e = env_with([one_turn("pi"), one_turn("claude")].concat());
    let store = e.root.join("store");
    let token_file = e.root.join("token");
    std::fs::write(&token_file, format!("{E2E_TOKEN}\n")).unwrap();
    let serve = Serve::start_auth(&store, &e.fake, Some(&token_file));
    let (code, out, err) = run(&mut run_command(&e.root, &store, &[], "pi", &agent_args("pi", "Count with seq")));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("run done") && err.contains("condense: pi through the serve already running;"), "{out}\n{err}");
    assert_eq!(announced_addr(&err), serve.addr);
    assert!(e.fake.log().iter().all(|l| l.header("x-condense-auth").is_none()), "serve's token went upstream");
    assert!(listening(&serve.addr) && store.join("serve.json").exists(), "the running serve was left running");
    drop(serve);
    // The agent's exit code, as it exits without condense.
    let bad = vec!["--no-such-flag-at-all".to_string()];
    let (direct, _, _) = {
        let mut c = Command::new(bin("claude"));
        base_env(&mut c, &e.root);
        agent_env("claude", &e.root, &mut c);
        run(c.args(&bad))
    };
    let (code, out, err) = run(&mut run_command(&e.root, &store, &["--anthropic-upstream", &e.fake.url()], "claude", &bad));
    assert!(direct != 0 && code == direct, "claude exits {direct} without condense, {code} through it: {out}\n{err}");
    // --keep-serve: the serve started is left running, and the next `condense run` goes through it.
    let (code, out, err) = run(&mut run_command(&e.root, &store, &["--keep-serve", "--anthropic-upstream", &e.fake.url()], "claude", &agent_args("claude", "Count with seq")));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("kept running after"), "{err}");
    let kept = announced_addr(&err);
    assert!(listening(&kept), "{err}");
    let (code, _, err) = run(&mut run_command(&e.root, &store, &[], "claude", &bad));
    assert!(code != 0 && err.contains("through the serve already running") && announced_addr(&err) == kept, "{err}");
    let announced: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(store.join("serve.json")).unwrap()).unwrap();
    let _ = Command::new("kill").arg("-TERM").arg(announced["pid"].to_string()).status();
    for _ in 0..100 {
        if !listening(&kept) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!listening(&kept), "the kept serve stops on SIGTERM");
    // An agent not installed: named with the command that installs it; nothing started.
    let mut c = run_command(&e.root, &store, &[], "claude", &bad);
    c.env("PATH", "/nonexistent");
    let (code, _, err) = run(&mut c);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("claude is not installed") && err.contains("npm install -g @anthropic-ai/claude-code"), "{err}");
    // A store another process holds (this test's own, open here): serve cannot start, and says why.
    let held = condense_engine::Store::open(&store).unwrap();
    let (code, _, err) = run(&mut run_command(&e.root, &store, &[], "claude", &bad));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("condense serve could not start on") && err.contains("in use by another condense process"), "{err}");
    drop(held);
    drop(e);
}

/// SIGTERM sent to `condense run` reaches the agent (a turn that would wait half a minute for the model
/// ends at once), and the serve started for it stops.
#[test]
fn condense_run_forwards_signals_to_the_agent() {
    let e = env_with(vec![Step::Slow(60_000), Step::Text("FAKE-FINAL: too late".into())]);
    let store = e.root.join("store");
    let mut c = run_command(&e.root, &store, &["--anthropic-upstream", &e.fake.url()], "pi", &agent_args("pi", "Wait"));
    let child = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let started = std::time::Instant::now();
    while e.fake.arrived() == 0 {
        assert!(started.elapsed().as_secs() < 60, "the agent's request never arrived");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let sent = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(sent.elapsed().as_secs() < 20, "condense run waited {:?} after SIGTERM: {err}", sent.elapsed());
    assert!(!out.status.success(), "the interrupted turn does not succeed: {err}");
    let addr = announced_addr(&err);
    assert!(!listening(&addr) && !store.join("serve.json").exists(), "the serve started for the agent stopped: {err}");
    drop(e);
}

/// opencode through a `condense serve` it is configured for by hand, as the README says (its
/// `opencode.json`, the token header included): two turns of [`script`]'s kind, the old outputs stubbed
/// in the later turn and one recovered byte for byte, nothing secret stored.
#[test]
fn opencode_through_serve() {
    let bash = |cmd: &str| Step::Call("bash".into(), serde_json::json!({"command": cmd, "description": "Count numbers"}));
    let e = env_with(vec![
        bash("seq 1 30000"),
        bash("seq 2 30001"),
        bash("seq 3 30002"),
        Step::Text("FAKE-FINAL: turn one done".into()),
        Step::QueryNewestStub,
        Step::Text("FAKE-FINAL: found it".into()),
    ]);
    let token_file = e.root.join("token");
    std::fs::write(&token_file, format!("{E2E_TOKEN}\n")).unwrap();
    let serve = Serve::start_auth(&e.root.join("store"), &e.fake, Some(&token_file));
    let config = e.root.join("home/.config/opencode");
    std::fs::create_dir_all(&config).unwrap();
    let provider = serde_json::json!({"provider": {"anthropic": {"options": {"baseURL": format!("http://{}/v1", serve.addr), "headers": {"x-condense-auth": E2E_TOKEN}}}}});
    std::fs::write(config.join("opencode.json"), provider.to_string()).unwrap();
    let turn = |first: bool, prompt: &str| {
        let mut c = Command::new(bin("opencode"));
        base_env(&mut c, &e.root);
        agent_env("opencode", &e.root, &mut c);
        // A title given: opencode asks no model for one.
        c.args(["run", "--model", "anthropic/claude-sonnet-4-5", "--title", "e2e"]);
        if !first {
            c.arg("--continue");
        }
        run(c.arg(prompt))
    };
    let (code, out, err) = turn(true, "Count the numbers with seq");
    assert_eq!(code, 0, "turn 1: {out}\n{err}");
    assert!(out.contains("turn one done"), "{out}\n{err}");
    let (code, out, err) = turn(false, "Look at the last output again");
    assert_eq!(code, 0, "turn 2: {out}\n{err}");
    assert!(out.contains("found it"), "{out}\n{err}");
    let log = e.fake.log();
    assert!(log.iter().all(|l| l.api() == Api::Anthropic && l.header("x-condense-auth").is_none()), "serve's token went upstream");
    check_provider_side(&log);
    drop(serve);
    let (prompts, outputs) = recorded(&e.root.join("store"));
    assert!(prompts.iter().any(|p| p.contains("Look at the last output again")), "{prompts:?}");
    assert!(outputs.len() >= 3, "{outputs:?}");
    assert_no_secret(&e.root.join("store"), "SECRET");
    drop(e.rt);
}
