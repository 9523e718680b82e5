//! `condense run AGENT`: a coding agent started through condense. The `condense serve` already holding
//! the store is used when one answers; otherwise one is started in the background (its own process
//! group, so the terminal's Ctrl-C reaches the agent only) on a free loopback port and stopped when the
//! agent exits. The agent is pointed at the server by what it reads besides its own files: environment
//! variables (Claude Code), its command-line overrides (Codex `-c`), an extension file given on its
//! command line (pi) or configuration in an environment variable, merged over the user's (opencode).
//! The agent inherits the terminal, stdin and the environment; condense forwards the signals sent to it
//! (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) to the agent, leaves the terminal's SIGINT and SIGQUIT (which the
//! agent gets itself) to the agent, and exits with the agent's exit code (128 + the signal's number when
//! a signal ended it). docs/run.md tells it for users.

use crate::cli::{Agent, RunArgs};
use crate::shared::{shown, store_folder};
use anyhow::{anyhow, bail, Context as _, Result};
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::time::Duration;

/// The environment variable the agents read the server's token from, when it asks for one (Codex's
/// `env_http_headers`, pi's header values): the token never appears on a command line.
const TOKEN_VAR: &str = "CONDENSE_RUN_AUTH_TOKEN";

/// How long a server started for the agent may take to listen (opening a large store, or waiting for
/// another process's lock on it, takes seconds).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The server the agent talks to.
struct Server {
    addr: SocketAddr,
    /// The token every request must carry, when the server asks for one.
    token: Option<String>,
    /// The process started for this agent (`None`: one was running already).
    started: Option<Child>,
    /// Where the started server's log lines go.
    log: Option<PathBuf>,
}

impl Agent {
    /// The command that starts it.
    fn program(self) -> &'static str {
        match self {
            Agent::Claude => "claude",
            Agent::Codex => "codex",
            Agent::Pi => "pi",
            Agent::Opencode => "opencode",
            Agent::Gemini => "gemini",
        }
    }

    /// How a user installs it.
    fn install_hint(self) -> &'static str {
        match self {
            Agent::Claude => "npm install -g @anthropic-ai/claude-code",
            Agent::Codex => "npm install -g @openai/codex",
            Agent::Pi => "npm install -g @mariozechner/pi-coding-agent",
            Agent::Opencode => "npm install -g opencode-ai",
            Agent::Gemini => "npm install -g @google/gemini-cli",
        }
    }
}

/// The executable `name` on `PATH`, if any.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Runs the agent through condense; its exit code.
pub fn run(store_dir: &Path, a: &RunArgs) -> Result<ExitCode> {
    let program = a.agent.program();
    let Some(exe) = on_path(program) else {
        bail!("{program} is not installed (no `{program}` on PATH); install it with `{}`, then run `condense run {program}` again", a.agent.install_hint());
    };
    // Signals are taken from here on: a Ctrl-C while the server starts stops it and this command; once
    // the agent runs, they are the agent's.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let mut signals = rt.block_on(async { Signals::new() })?;
    let mut server = match crate::serve::answering(store_dir)? {
        Some(running) => Server { addr: running.announced.addr, token: running.auth, started: None, log: None },
        None => rt.block_on(start_server(store_dir, a, &mut signals))?,
    };
    let scratch = tempfile::Builder::new().prefix("condense-run-").tempdir().context("creating a temporary folder for the agent's settings")?;
    let mut cmd = Command::new(&exe);
    point(a.agent, &mut cmd, &server, scratch.path())?;
    cmd.args(&a.args);
    let dashboard = format!("http://{}/condense/", server.addr);
    let how = match (&server.started, a.keep_serve) {
        (None, _) => "the serve already running".to_string(),
        (Some(c), true) => format!("serve pid {} started for it, kept running after (its log: {})", c.id(), server.log.as_ref().map_or_else(String::new, |l| l.display().to_string())),
        (Some(_), false) => "a serve started for it".to_string(),
    };
    errln!("condense: {program} through {how}; dashboard {dashboard}, store {}", shown(store_dir));
    let agent = cmd.spawn().with_context(|| format!("starting {}", exe.display()));
    let status = match agent {
        Ok(child) => rt.block_on(wait_forwarding(child, &mut signals)).context("waiting for the agent"),
        Err(e) => Err(e),
    };
    if !a.keep_serve {
        stop(&mut server);
    }
    drop(scratch);
    let status = status?;
    use std::os::unix::process::ExitStatusExt as _;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(255)),
        (None, None) => ExitCode::from(1),
    })
}

/// The signals condense takes while the agent runs.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    user1: tokio::signal::unix::Signal,
    user2: tokio::signal::unix::Signal,
    /// The terminal's: the agent gets them itself (the same process group); condense only outlives them.
    interrupt: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let take = |kind: SignalKind| signal(kind).context("taking a signal");
        Ok(Signals {
            terminate: take(SignalKind::terminate())?,
            hangup: take(SignalKind::hangup())?,
            user1: take(SignalKind::user_defined1())?,
            user2: take(SignalKind::user_defined2())?,
            interrupt: take(SignalKind::interrupt())?,
            quit: take(SignalKind::quit())?,
        })
    }

    /// The next signal: its number when it is to be forwarded, `None` for the terminal's (which the agent
    /// got already).
    async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            _ = self.terminate.recv() => Some(Signal::TERM),
            _ = self.hangup.recv() => Some(Signal::HUP),
            _ = self.user1.recv() => Some(Signal::USR1),
            _ = self.user2.recv() => Some(Signal::USR2),
            _ = self.interrupt.recv() => None,
            _ = self.quit.recv() => None,
        }
    }
}

/// Waits for the agent, forwarding the signals condense is sent.
async fn wait_forwarding(mut child: Child, signals: &mut Signals) -> std::io::Result<std::process::ExitStatus> {
    let pid = pid_of(&child);
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    // A thread waits for the agent to exit without reaping it (WNOWAIT): until it is reaped below, its pid
    // is its own, and a forwarded signal cannot reach another process that took the pid over.
    std::thread::spawn(move || {
        let exited = pid.map(|pid| rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED | WaitIdOptions::NOWAIT));
        let _ = tx.send(exited);
    });
    loop {
        tokio::select! {
            _ = &mut rx => return child.wait(),
            sig = signals.next() => {
                if let (Some(sig), Some(pid)) = (sig, pid) {
                    let _ = rustix::process::kill_process(pid, sig);
                }
            }
        }
    }
}

/// Starts `condense serve` on the store for the agent: in its own process group, its log lines to a file
/// (the store's `serve.log`, or the temporary folder's for a PostgreSQL store), on a free loopback port
/// unless `--listen` says otherwise; stopped if this process dies (Linux), unless it is to be kept.
async fn start_server(store_dir: &Path, a: &RunArgs, signals: &mut Signals) -> Result<Server> {
    let exe = std::env::current_exe().context("finding the condense executable")?;
    let log = match store_folder(store_dir) {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating the store {}", dir.display()))?;
            dir.join("serve.log")
        }
        None => std::env::temp_dir().join("condense-serve.log"),
    };
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).with_context(|| format!("opening serve's log {}", log.display()))?;
    let start = std::fs::metadata(&log).map_or(0, |m| m.len());
    let mut cmd = Command::new(exe);
    cmd.arg("--store").arg(store_dir).arg("serve").args(a.serve.to_args(SocketAddr::from(([127, 0, 0, 1], 0))));
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log_file);
    use std::os::unix::process::CommandExt as _;
    cmd.process_group(0);
    let mut child = cmd.spawn().context("starting condense serve")?;
    let out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let addr = lines.by_ref().map_while(Result::ok).find_map(|l| l.split("listening on http://").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|a| a.parse::<SocketAddr>().ok()));
        let _ = tx.send(addr);
        // What it prints after is read and dropped, so its stdout stays open.
        for _ in lines {}
    });
    let failed = |child: &mut Child, why: String| -> anyhow::Error {
        let _ = child.kill();
        let _ = child.wait();
        let said = std::fs::read(&log).map(|b| String::from_utf8_lossy(b.get(usize::try_from(start).unwrap_or(0)..).unwrap_or_default()).into_owned()).unwrap_or_default();
        let said: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
        let said = said[said.len().saturating_sub(3)..].join(" / ");
        if said.is_empty() {
            anyhow!("condense serve could not start on {}: {why}", shown(store_dir))
        } else {
            anyhow!("condense serve could not start on {}: {why}: {said}", shown(store_dir))
        }
    };
    let addr = tokio::select! {
        addr = rx => addr.ok().flatten(),
        _ = tokio::time::sleep(START_TIMEOUT) => return Err(failed(&mut child, format!("it did not listen within {} s", START_TIMEOUT.as_secs()))),
        _ = async { while signals.next().await.is_some() {} } => return Err(failed(&mut child, "interrupted".into())),
    };
    let Some(addr) = addr else { return Err(failed(&mut child, "it exited".into())) };
    let token = match &a.serve.auth_token_file {
        Some(f) => Some(std::fs::read_to_string(f).with_context(|| format!("reading the token file {}", f.display()))?.trim().to_string()),
        None => None,
    };
    Ok(Server { addr, token, started: Some(child), log: Some(log) })
}

/// A child's process id as rustix takes it.
fn pid_of(child: &Child) -> Option<Pid> {
    i32::try_from(child.id()).ok().and_then(Pid::from_raw)
}

/// Stops the server started for the agent (SIGTERM, then SIGKILL after ten seconds).
fn stop(server: &mut Server) {
    let Some(child) = server.started.as_mut() else { return };
    if let Some(pid) = pid_of(child) {
        let _ = rustix::process::kill_process(pid, Signal::TERM);
    }
    for _ in 0..100 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Points the agent at the server: what `cmd` is given before the user's own arguments.
fn point(agent: Agent, cmd: &mut Command, server: &Server, scratch: &Path) -> Result<()> {
    let base = format!("http://{}", server.addr);
    let header = condense_serve::AUTH_HEADER;
    if let Some(t) = &server.token {
        cmd.env(TOKEN_VAR, t);
    }
    match agent {
        Agent::Claude => {
            cmd.env("ANTHROPIC_BASE_URL", &base);
            if let Some(t) = &server.token {
                // Claude Code's extra headers, one `Name: value` a line, the user's kept.
                let mut headers = std::env::var("ANTHROPIC_CUSTOM_HEADERS").unwrap_or_default();
                if !headers.is_empty() && !headers.ends_with('\n') {
                    headers.push('\n');
                }
                headers.push_str(&format!("{header}: {t}"));
                cmd.env("ANTHROPIC_CUSTOM_HEADERS", headers);
            }
        }
        Agent::Codex => {
            // A provider of condense's own, selected for this run only: the OpenAI Responses API at the
            // server, with the key from OPENAI_API_KEY when it is set, else the user's own login.
            let auth = if std::env::var_os("OPENAI_API_KEY").is_some() { r#"env_key = "OPENAI_API_KEY""# } else { "requires_openai_auth = true" };
            let headers = if server.token.is_some() { format!(r#", env_http_headers = {{ "{header}" = "{TOKEN_VAR}" }}"#) } else { String::new() };
            cmd.arg("-c").arg(r#"model_provider="condense""#);
            cmd.arg("-c").arg(format!(r#"model_providers.condense={{ name = "condense", base_url = "{base}/v1", wire_api = "responses", {auth}{headers} }}"#));
        }
        Agent::Pi => {
            // An extension for this run: pi's Anthropic and OpenAI providers at the server (their models,
            // keys and settings the user's own).
            let headers = if server.token.is_some() { format!(r#", headers: {{ "{header}": "{TOKEN_VAR}" }}"#) } else { String::new() };
            let ext = scratch.join("condense.js");
            let text = format!(
                "// Written by `condense run pi` for this run only.\nexport default function (pi) {{\n  pi.registerProvider(\"anthropic\", {{ baseUrl: \"{base}\"{headers} }});\n  pi.registerProvider(\"openai\", {{ baseUrl: \"{base}/v1\"{headers} }});\n}}\n"
            );
            std::fs::write(&ext, text).with_context(|| format!("writing {}", ext.display()))?;
            cmd.arg("--extension").arg(&ext);
        }
        Agent::Gemini => {
            // Gemini CLI takes a gateway's address from GOOGLE_GEMINI_BASE_URL (the key from
            // GEMINI_API_KEY, as without it) and extra headers, `Name: value, …`, from
            // GEMINI_CLI_CUSTOM_HEADERS (the user's kept).
            cmd.env("GOOGLE_GEMINI_BASE_URL", &base);
            // (Its authentication must be the API key, chosen in its settings as its first run asks:
            // with that address and none chosen, Gemini CLI 0.61 picks a "gateway" it then refuses.)
            if let Some(t) = &server.token {
                let mut headers = std::env::var("GEMINI_CLI_CUSTOM_HEADERS").unwrap_or_default();
                if !headers.trim().is_empty() {
                    headers.push_str(", ");
                }
                headers.push_str(&format!("{header}: {t}"));
                cmd.env("GEMINI_CLI_CUSTOM_HEADERS", headers);
            }
        }
        Agent::Opencode => {
            // opencode merges OPENCODE_CONFIG_CONTENT over the user's configuration files; one the user
            // set already is kept, with the providers' addresses set over it.
            let mut config: serde_json::Value = match std::env::var("OPENCODE_CONFIG_CONTENT") {
                Ok(text) => serde_json::from_str(&text).context("OPENCODE_CONFIG_CONTENT is not JSON")?,
                Err(_) => serde_json::json!({}),
            };
            let headers = server.token.as_ref().map(|t| serde_json::json!({ header: t }));
            for provider in ["anthropic", "openai"] {
                let options = config
                    .as_object_mut()
                    .ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT is not a JSON object"))?
                    .entry("provider")
                    .or_insert_with(|| serde_json::json!({}))
                    .as_object_mut()
                    .ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT's `provider` is not an object"))?
                    .entry(provider)
                    .or_insert_with(|| serde_json::json!({}))
                    .as_object_mut()
                    .ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT's `provider.{provider}` is not an object"))?
                    .entry("options")
                    .or_insert_with(|| serde_json::json!({}));
                let options = options.as_object_mut().ok_or_else(|| anyhow!("OPENCODE_CONFIG_CONTENT's `provider.{provider}.options` is not an object"))?;
                options.insert("baseURL".into(), serde_json::Value::String(format!("{base}/v1")));
                if let Some(h) = &headers {
                    let all = options.entry("headers").or_insert_with(|| serde_json::json!({}));
                    if let (Some(all), Some(h)) = (all.as_object_mut(), h.as_object()) {
                        all.extend(h.clone());
                    }
                }
            }
            cmd.env("OPENCODE_CONFIG_CONTENT", config.to_string());
        }
    }
    Ok(())
}
