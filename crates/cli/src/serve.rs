//! `condense serve`, and the route other commands take while a server holds the store: they run inside
//! the server, which is the one process that may open the sled database.

use crate::cli::ServeArgs;
use crate::shared::{load_config, shown, store_folder, summarizer_of};
use std::ffi::OsString;
use anyhow::{anyhow, bail, Context as _, Result};
use condense_serve::{lock, ServeConfig};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// serve's log lines on stderr, filtered by `RUST_LOG` (default `info`; a filter that does not parse is
/// named and the default used). Once per process: a second call (a test running serve twice) keeps the
/// first.
fn start_logging(format: crate::cli::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("condense serve: RUST_LOG `{spec}` is not a filter ({e}); logging at info");
            EnvFilter::new("info")
        }),
        Err(_) => EnvFilter::new("info"),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(true);
    let _ = match format {
        crate::cli::LogFormat::Text => builder.try_init(),
        crate::cli::LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Runs the server until Ctrl-C or SIGTERM; `run_captured` runs the commands other processes route
/// through it (the dispatcher's, handed down so this module does not call back up into it).
pub fn serve(store_dir: &Path, a: &ServeArgs, run_captured: fn(&condense_engine::Store, Vec<String>) -> (Vec<u8>, Vec<u8>, i32)) -> Result<ExitCode> {
    // A server already holding this store is named at once (opening the store would wait seconds for its
    // lock, then say only that another process holds it).
    if let Some(running) = store_folder(store_dir).and_then(lock::read).filter(|r| r.pid != std::process::id() && server_alive(r)) {
        bail!(
            "condense serve already runs on {} (pid {}, http://{}): point the agent at it, or stop it first",
            shown(store_dir),
            running.pid,
            running.addr
        );
    }
    let mut cfg = ServeConfig::new(store_dir);
    cfg.listen = a.listen.unwrap_or_else(|| crate::cli::DEFAULT_LISTEN.parse().expect("the default address parses"));
    if let Some(u) = &a.anthropic_upstream {
        cfg.anthropic_upstream = u.clone();
    }
    if let Some(u) = &a.openai_upstream {
        cfg.openai_upstream = u.clone();
    }
    if let Some(u) = &a.gemini_upstream {
        cfg.gemini_upstream = u.clone();
    }
    if let Some(n) = a.max_body_bytes {
        cfg.max_body_bytes = usize::try_from(n).map_err(|_| anyhow!("--max-body-bytes {n} is more than this machine can address"))?;
    }
    if let Some(n) = a.max_messages {
        cfg.max_messages = usize::try_from(n).map_err(|_| anyhow!("--max-messages {n} is more than this machine can address"))?;
    }
    if let Some(n) = a.max_tool_rounds {
        cfg.max_tool_rounds = n;
    }
    if let Some(ttl) = a.cache_ttl {
        cfg.cache_ttl = (ttl > 0).then(|| std::time::Duration::from_secs(ttl));
    }
    cfg.price_cache = a.price_cache;
    cfg.price_known_models = !a.no_price_cache;
    cfg.summaries = match a.summaries {
        crate::cli::SummariesArg::Handoffs => condense_serve::summary::Summaries::Handoffs,
        crate::cli::SummariesArg::Upstream => condense_serve::summary::Summaries::Upstream,
        crate::cli::SummariesArg::Extractive => condense_serve::summary::Summaries::Extractive,
    };
    cfg.summary_model = a.summary_model.clone();
    if let Some(b) = a.memory_budget {
        cfg.memory_budget = b;
    }
    if let Some(b) = a.warm_bytes {
        cfg.warm_bytes = b;
    }
    let file = load_config(a.config.as_deref(), store_dir)?;
    cfg.summarizer = summarizer_of(&file, true);
    cfg.file = file;
    cfg.cli = Some(std::sync::Arc::new(run_captured));
    let auth_file = match &a.auth_token_file {
        Some(f) => {
            let f = std::path::absolute(f).with_context(|| format!("--auth-token-file {}", f.display()))?;
            let text = std::fs::read_to_string(&f).with_context(|| format!("reading the token file {}", f.display()))?;
            cfg.auth_token = Some(text.trim().to_string());
            Some(f)
        }
        None => None,
    };
    start_logging(a.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let running = condense_serve::start(cfg.clone()).await?;
        // A folder store is announced in a lock file so other commands go through this server; a PostgreSQL
        // store is shared: other commands and other servers open it themselves.
        let addr = match store_folder(&cfg.store) {
            Some(dir) => lock::announce(dir, running.addr, auth_file.as_deref()).with_context(|| format!("writing {}", lock::path(dir).display()))?.addr,
            None => running.addr,
        };
        // A closed stdout (the starter stopped reading) must not stop the server: errors are ignored.
        use std::io::Write;
        let mut o = std::io::stdout();
        let _ = writeln!(o, "condense serve: listening on http://{addr} (store {})", shown(&cfg.store));
        let _ = writeln!(o, "  Claude Code: ANTHROPIC_BASE_URL=http://{addr}");
        let _ = writeln!(o, "  OpenAI-compatible agents (pi, Codex, opencode): base URL http://{addr}/v1");
        let _ = writeln!(o, "  Gemini CLI: GOOGLE_GEMINI_BASE_URL=http://{addr}");
        if let Some(f) = &auth_file {
            let _ = writeln!(o, "  every request needs the header {}: <the token in {}> (README, \"Authentication\")", condense_serve::AUTH_HEADER, f.display());
        }
        let _ = o.flush();
        let stop = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {},
            }
        };
        stop.await;
        if let Some(dir) = store_folder(&cfg.store) {
            lock::withdraw(dir);
        }
        running.stop().await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Relative paths in a command mean the caller's folder: the server runs elsewhere, so they are made
/// absolute before the command is sent.
fn absolute_args(argv: &[String], takes_paths: bool) -> Vec<String> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let path_valued = ["--store", "--config", "--plot", "--relative-to"];
    let mut out = Vec::with_capacity(argv.len());
    let mut prev: Option<&str> = None;
    for a in argv {
        let is_value_of_path = prev.is_some_and(|p| path_valued.contains(&p));
        // Positional arguments are paths only for the commands that take paths (import, simulate,
        // export); elsewhere they are session names, which may look like relative paths.
        let positional_path = takes_paths && !a.starts_with('-') && !["import", "simulate", "export"].contains(&a.as_str());
        let inline = path_valued.iter().find_map(|p| a.strip_prefix(p).and_then(|r| r.strip_prefix('=')).map(|v| (p, v)));
        if let Some((flag, v)) = inline.filter(|(_, v)| Path::new(v).is_relative()) {
            out.push(format!("{flag}={}", cwd.join(v).to_string_lossy()));
        } else if (is_value_of_path || positional_path) && Path::new(a).is_relative() {
            out.push(cwd.join(a).to_string_lossy().into_owned());
        } else {
            out.push(a.clone());
        }
        prev = Some(a.as_str());
    }
    out
}

/// Whether process `pid` exists (on Linux, by `/proc`; elsewhere every announced server is taken as
/// running, and a gone one is found by its refused connection).
fn process_alive(pid: u32) -> bool {
    if !cfg!(target_os = "linux") {
        return true;
    }
    // A process killed but not yet reaped by its parent (a supervisor, a shell script) keeps its entry as
    // a zombie (`Z`, or `X` while it goes): it holds nothing and serves nothing (issue 62).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X')),
        Err(_) => false,
    }
}

/// Whether the server `serve.json` announces is still there: its process alive, and something accepting
/// connections on its address (a pid the dead server's was reused for listens there by chance only).
/// A server stopped with SIGSTOP still accepts connections: it counts as running (and is named).
fn server_alive(running: &lock::Announced) -> bool {
    process_alive(running.pid) && std::net::TcpStream::connect_timeout(&running.addr, std::time::Duration::from_secs(1)).is_ok()
}

/// How long a command waits for the server holding its store to answer at all.
const ROUTE_PROBE: std::time::Duration = std::time::Duration::from_secs(5);

/// A `condense serve` holding a store and answering: what it announced, and the token its requests must
/// carry when it asks for one.
pub(crate) struct Answering {
    pub announced: lock::Announced,
    pub auth: Option<String>,
}

/// The `condense serve` holding this store folder, if one answers; `None` when none runs (or the one
/// announced is gone), an error when one runs and does not answer.
pub(crate) fn answering(store_dir: &Path) -> Result<Option<Answering>> {
    let Some(announced) = store_folder(store_dir).and_then(lock::read) else { return Ok(None) };
    if !server_alive(&announced) {
        // A server killed without withdrawing its serve.json: the store is free, and whatever listens on
        // that port now is not it.
        return Ok(None);
    }
    // The server asks every request for its token when it has one: the command sends it too, read from
    // the file the server named (never from serve.json itself).
    let auth = match &announced.auth_file {
        Some(f) => Some(std::fs::read_to_string(f).with_context(|| format!("reading the token file {} of the condense serve holding {}", f.display(), store_dir.display()))?.trim().to_string()),
        None => None,
    };
    // First whether it answers at all: a server that is stopped (SIGSTOP) or hung still accepts
    // connections, and the command would wait for it forever.
    let probe = reqwest::blocking::Client::builder().timeout(ROUTE_PROBE).build().context("starting the HTTP client")?;
    let mut req = probe.get(format!("http://{}/condense/status", announced.addr));
    if let Some(t) = &auth {
        req = req.header(condense_serve::AUTH_HEADER, t);
    }
    match req.send() {
        Ok(_) => Ok(Some(Answering { announced, auth })),
        Err(e) if e.is_timeout() => bail!(
            "the condense serve holding {} (pid {}, http://{}) does not answer within {} s; if it was stopped, continue it (kill -CONT {}), else stop it",
            store_dir.display(),
            announced.pid,
            announced.addr,
            ROUTE_PROBE.as_secs(),
            announced.pid
        ),
        // A server that announced itself and is gone (killed): the store is free again.
        Err(_) => Ok(None),
    }
}

/// Runs the command inside a `condense serve` that holds this store, if one answers; `None` when no
/// server runs here (the caller opens the store itself).
pub fn through_server(store_dir: &Path, argv: &[OsString], takes_paths: bool) -> Result<Option<ExitCode>> {
    let Some(Answering { announced, auth }) = answering(store_dir)? else { return Ok(None) };
    let mut utf8 = Vec::with_capacity(argv.len());
    for (i, a) in argv.iter().enumerate() {
        match a.to_str() {
            Some(s) => utf8.push(s.to_string()),
            None => bail!(
                "argument {} ({}) is not UTF-8 and cannot be passed to the condense serve holding {}; stop the server or use a UTF-8 path",
                i + 1,
                a.to_string_lossy(),
                store_dir.display()
            ),
        }
    }
    let argv = &utf8;
    let with_auth = |rb: reqwest::blocking::RequestBuilder| match &auth {
        Some(t) => rb.header(condense_serve::AUTH_HEADER, t),
        None => rb,
    };
    let url = format!("http://{}/condense/cli", announced.addr);
    let body = serde_json::json!({"argv": absolute_args(argv, takes_paths)}).to_string();
    // No overall timeout: a command (an import of a large folder) runs as long as it needs.
    let client = reqwest::blocking::Client::builder().timeout(None).build().context("starting the HTTP client")?;
    let req = with_auth(client.post(&url).header("x-condense-token", &announced.token).header("content-type", "application/json"));
    let resp = req.body(body).send();
    let resp = match resp {
        Ok(r) => r,
        // A server that announced itself and is gone (killed): the store is free again.
        Err(_) => return Ok(None),
    };
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    if status != 200 {
        bail!("the condense serve holding {} refused the command ({status}): {}", store_dir.display(), text.trim());
    }
    let v: serde_json::Value = serde_json::from_str(&text).context("reading the server's answer")?;
    crate::output::out_write(format_args!("{}", v["stdout"].as_str().unwrap_or("")))?;
    crate::output::err_write(format_args!("{}", v["stderr"].as_str().unwrap_or("")));
    Ok(Some(match v["code"].as_i64().unwrap_or(2) {
        0 => ExitCode::SUCCESS,
        1 => ExitCode::from(1),
        _ => ExitCode::from(2),
    }))
}
