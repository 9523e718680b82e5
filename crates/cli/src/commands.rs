//! The commands. Each returns its exit code; errors bubble up to one line on stderr.

use crate::cli::{Cli, Command, ConfigAction, Format, History};
use crate::plot;
use clap::Parser as _;
use std::ffi::OsString;
use anyhow::{anyhow, bail, Context as _, Result};
use condense_engine::{demo, Session, Stats, Store};
use condense_events::Message;
use condense_render::{check, Projection};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

thread_local! {
    /// Where output goes when a command runs inside `condense serve` for another process: captured
    /// stdout and stderr instead of the terminal.
    static CAPTURE: std::cell::RefCell<Option<(Vec<u8>, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
}

/// Writes to stdout, or to the capture buffer when one is set.
pub fn out_write(args: std::fmt::Arguments) -> std::io::Result<()> {
    CAPTURE.with(|c| match &mut *c.borrow_mut() {
        Some((out, _)) => out.write_fmt(args),
        None => std::io::stdout().write_fmt(args),
    })
}

/// Writes to stderr, or to the capture buffer when one is set.
pub fn err_write(args: std::fmt::Arguments) {
    CAPTURE.with(|c| match &mut *c.borrow_mut() {
        Some((_, err)) => {
            let _ = err.write_fmt(args);
        }
        None => {
            let _ = std::io::stderr().write_fmt(args);
        }
    })
}

/// An error and its causes on one line; a cause whose text the message already carries is not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.ends_with(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

/// Runs a command with its output captured: `(stdout, stderr, exit code)`.
pub fn run_captured(store: &Store, argv: Vec<String>) -> (Vec<u8>, Vec<u8>, i32) {
    capture(argv.into_iter().map(OsString::from).collect(), Some(store))
}

/// Runs a command (inside a server when `served` is given) with its output captured.
pub(crate) fn capture(argv: Vec<OsString>, served: Option<&Store>) -> (Vec<u8>, Vec<u8>, i32) {
    CAPTURE.with(|c| *c.borrow_mut() = Some((Vec::new(), Vec::new())));
    let code = match run_with(argv, served) {
        Ok(code) if code == ExitCode::SUCCESS => 0,
        Ok(code) if code == ExitCode::from(2) => 2,
        Ok(_) => 1,
        Err(e) => {
            err_write(format_args!("condense: {}\n", error_text(&e)));
            2
        }
    };
    let (out, err) = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, err, code)
}

/// `println!` that returns the write error instead of panicking (a closed pipe ends the command quietly).
macro_rules! outln {
    ($($t:tt)*) => { crate::commands::out_write(format_args!("{}\n", format_args!($($t)*)))? };
}
macro_rules! out {
    ($($t:tt)*) => { crate::commands::out_write(format_args!($($t)*))? };
}
macro_rules! errln {
    ($($t:tt)*) => { crate::commands::err_write(format_args!("{}\n", format_args!($($t)*))) };
}

/// The `condense` binary: parses `argv` (without the program name), runs the command, prints an error
/// as one line on stderr; the exit code follows [`crate::cli::EXIT_CODES`].
pub fn main(argv: Vec<OsString>) -> ExitCode {
    match run_with(argv, None) {
        Ok(code) => code,
        Err(e) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)) => {
            // The reader went away (`condense … | head`): not an error of ours.
            ExitCode::SUCCESS
        }
        Err(e) => {
            errln!("condense: {}", error_text(&e));
            ExitCode::from(2)
        }
    }
}

/// Runs a command; `served` is the store of a running `condense serve` when the command runs inside it.
pub fn run_with(argv: Vec<OsString>, served: Option<&Store>) -> Result<ExitCode> {
    let cli = match Cli::try_parse_from(std::iter::once(OsString::from("condense")).chain(argv.iter().cloned())) {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.render().to_string();
            return Ok(match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    out!("{text}");
                    ExitCode::SUCCESS
                }
                _ => {
                    err_write(format_args!("{text}"));
                    ExitCode::from(2)
                }
            });
        }
    };
    let store_dir = cli.store.clone();
    match &cli.command {
        Command::Serve(args) => {
            if served.is_some() {
                bail!("`serve` cannot run inside a running server");
            }
            return crate::serve::serve(&store_dir, args);
        }
        Command::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut crate::cli::command(), "condense", &mut buf);
            out!("{}", String::from_utf8_lossy(&buf));
            return Ok(ExitCode::SUCCESS);
        }
        Command::Watch { paths, settle } => {
            if served.is_some() {
                bail!("`watch` runs beside a server, not inside it");
            }
            return crate::watch::watch(&store_dir, paths, std::time::Duration::from_millis(*settle));
        }
        Command::Rm { .. } if served.is_some() => {
            bail!("`rm` does not run while `condense serve` holds the store (it may be serving that session); stop the server first");
        }
        _ => {}
    }
    if served.is_none() && !cli.command.needs_no_store() {
        let takes_paths = matches!(cli.command, Command::Import { .. } | Command::Simulate { .. } | Command::Export { .. });
        if let Some(code) = crate::serve::through_server(&store_dir, &argv, takes_paths)? {
            return Ok(code);
        }
    }
    let creates = cli.command.creates_store();
    let open = || -> Result<Store> {
        if let Some(s) = served {
            return Ok(s.clone());
        }
        if !creates && store_folder(&store_dir).is_some_and(|d| !d.join("db").is_dir()) {
            bail!(
                "no store at {} (`condense import` or `condense demo` creates one; pick another with --store or CONDENSE_STORE)",
                store_dir.display()
            );
        }
        Store::open(&store_dir).with_context(|| format!("opening store {}", shown(&store_dir)))
    };
    match cli.command {
        Command::Serve(_) | Command::Completions { .. } | Command::Watch { .. } => unreachable!("handled above"),
        Command::Import { paths, json } => import(&open()?, &paths, json),
        Command::Export { file, force } => {
            if file.exists() && !force {
                bail!("{} exists already; pass --force to replace it", file.display());
            }
            let inside = |t: &Path| -> bool {
                let (Ok(store), Some(parent)) = (store_dir.canonicalize(), t.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })) else { return false };
                parent.canonicalize().is_ok_and(|p| p.starts_with(&store))
            };
            if inside(&file) {
                bail!("{} is inside the store {}; export to a file outside it", file.display(), store_dir.display());
            }
            let s = open()?.log().export(&file)?;
            outln!("exported {} sessions, {} events, {} blobs ({} bytes) to {}", s.sessions, s.events, s.blobs, s.bytes, file.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Sessions { json } => sessions(&open()?, json),
        Command::Stats { session, entry_ids, json } => {
            let store = open()?;
            let session = session_of(&store, &session)?;
            print_stats(&session, json)?;
            if entry_ids {
                print_entries(&session, json)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Render { session, format, after_event, entry_ids, model } => {
            let store = open()?;
            let session = session_of(&store, &session)?;
            if entry_ids {
                print_entries(&session, false)?;
                return Ok(ExitCode::SUCCESS);
            }
            render(&session, format, after_event, model.as_deref(), &store_dir)
        }
        Command::Verify { json } => verify(&open()?, json),
        Command::Demo { json } => run_demo(&open()?, &store_dir, json),
        Command::Simulate { paths, window, switch, config, plot, price, keep, force, json } => {
            let store = if keep { Some(open()?) } else { None };
            simulate(store.as_ref(), &store_dir, &SimulateOptions { paths, window, switch, config, plot, price, force, json })
        }
        Command::Query { session, refs, json } => query(&open()?, &session, &refs, json),
        Command::CheckpointLine { session, checkpoint, timestamp } => {
            let n = match &checkpoint {
                None => None,
                Some(c) => Some(c.strip_prefix('c').unwrap_or(c).parse::<u32>().map_err(|_| anyhow!("`{c}` is not a checkpoint ref (cN)"))?),
            };
            let ts = timestamp.unwrap_or_else(now_rfc3339);
            let store = open()?;
            outln!("{}", session_of(&store, &session)?.checkpoint_as_pi_line(n, &ts)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::History(verb) => history(&open()?, verb),
        Command::Fork { session, name, at } => {
            let store = open()?;
            let src = session_of(&store, &session)?.name().to_string();
            let forked = store.fork(&src, &name, at.as_deref())?;
            let p = forked.projection()?;
            outln!("forked {src} into {name}: {} entries, {} refs, {} checkpoints", p.entries(), p.index().records.len(), p.index().checkpoints.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact { session } => {
            let store = open()?;
            let session = session_of(&store, &session)?;
            session.compact_now()?;
            let p = session.projection()?;
            let cp = p.index().checkpoints.values().next_back().expect("a checkpoint was just committed");
            outln!("checkpoint c{} committed over {} refs; {} prompts retained", cp.n, cp.covers.len(), cp.kept.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Rm { session } => {
            let store = open()?;
            let name = session_of(&store, &session)?.name().to_string();
            store.remove_session(&name)?;
            outln!("removed session {name}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { action, config: file, json } => config(&store_dir, action, file.as_deref(), json),
    }
}

/// A session by name, or by the numeric id `condense sessions` prints (a name wins over an id).
fn session_of(store: &Store, key: &str) -> Result<Session> {
    match store.session(key) {
        Ok(s) => Ok(s),
        Err(e) => {
            if let Ok(id) = key.parse::<u64>()
                && let Some(info) = store.sessions()?.into_iter().find(|s| s.id == id)
            {
                return Ok(store.session(&info.name)?);
            }
            Err(e.into())
        }
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), for a pi entry written now.
fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, ms) = (d.as_secs() as i64, d.subsec_millis());
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The active branch's entries: id, role, and the start of the text.
fn print_entries(session: &Session, json_out: bool) -> Result<()> {
    use condense_render::TranscriptRow;
    let p = session.projection()?;
    let preview = |m: &Message| {
        let calls: Vec<String> = m.tool_calls().map(|(_, name, _)| format!("[{name}]")).collect();
        let text = format!("{} {}", m.text(), calls.join(" "));
        text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(70).collect::<String>()
    };
    let checkpoints = &p.index().checkpoints;
    // Each compaction is a divider in the transcript (ADR 0064).
    let checkpoint_divider = |n: &u32| {
        format!(
            "checkpoint c{n}: the context up to here was compacted ({} tokens before; originals: context_tree_query c{n})",
            checkpoints.get(n).map_or(0, |c| c.tokens_before)
        )
    };
    const HOST_DIVIDER: &str = "the host compacted its context here";
    let rows = p.transcript();
    let messages = rows.iter().filter(|r| matches!(r, TranscriptRow::Message(..))).count();
    if json_out {
        let mut entries = Vec::new();
        let mut dividers = Vec::new();
        for row in &rows {
            match row {
                TranscriptRow::Message(id, m) => entries.push(json!({"entry": id, "role": m.role(), "text": preview(m)})),
                TranscriptRow::HostCompaction(id) => dividers.push(json!({"at": id, "kind": "host_compaction", "text": HOST_DIVIDER})),
                TranscriptRow::Checkpoint(n, id) => dividers.push(json!({"after": id, "kind": "checkpoint", "checkpoint": format!("c{n}"), "text": checkpoint_divider(n)})),
            }
        }
        outln!("{}", serde_json::to_string_pretty(&json!({"session": session.name(), "entries": entries, "dividers": dividers}))?);
    } else {
        outln!("entries on the active branch ({messages}):");
        for row in &rows {
            match row {
                TranscriptRow::Message(id, m) => outln!("  {id}  {:<9}  {}", m.role(), preview(m)),
                TranscriptRow::HostCompaction(_) => outln!("  ──── {HOST_DIVIDER} ────"),
                TranscriptRow::Checkpoint(n, _) => outln!("  ──── {} ────", checkpoint_divider(n)),
            }
        }
    }
    Ok(())
}

/// The store argument as shown in messages: a folder, or a PostgreSQL URL without its password.
pub(crate) fn shown(store: &Path) -> String {
    condense_log::Location::parse(store).to_string()
}

/// The store's folder; `None` for a PostgreSQL store (which has no folder, and no lock: any number of
/// processes open it at once).
pub(crate) fn store_folder(store: &Path) -> Option<&Path> {
    condense_log::Location::parse(store).dir().is_some().then_some(store)
}

/// The configuration in force: `--config FILE`, else the store's `config.json`, else the defaults (a
/// PostgreSQL store has no folder for a `config.json`: `--config` or the defaults).
pub(crate) fn load_config(file: Option<&Path>, store_dir: &Path) -> Result<condense_engine::config::FileConfig> {
    let path = match (file, store_folder(store_dir)) {
        (Some(p), _) => p.to_path_buf(),
        (None, None) => return Ok(Default::default()),
        (None, Some(store_dir)) => {
            let p = store_dir.join("config.json");
            if !p.exists() {
                return Ok(Default::default());
            }
            p
        }
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let f = condense_engine::config::parse_file(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    for w in &f.warnings {
        errln!("condense: {}: {w}", path.display());
    }
    Ok(f)
}

fn config(store_dir: &Path, action: Option<ConfigAction>, file: Option<&Path>, json_out: bool) -> Result<ExitCode> {
    match action {
        None => {
            let f = load_config(file, store_dir)?;
            let mut v = condense_engine::config::to_json(&f.raw.normalize(), f.prices);
            v["summarizer"] = match &f.summarizer {
                condense_engine::config::SummarizerChoice::Extractive => json!("extractive"),
                condense_engine::config::SummarizerChoice::Http { base_url, model, api_key_env, idle_secs, total_secs } => json!({
                    "kind": "http", "baseUrl": base_url, "model": model, "apiKeyEnv": api_key_env,
                    "idleTimeoutSecs": idle_secs, "totalTimeoutSecs": total_secs,
                }),
            };
            outln!("{}", serde_json::to_string_pretty(&v)?);
            if !json_out {
                outln!(
                    "presets: recoveryGraceTurns {:?}, minBatchChars {:?}, rollingWindow {:?}, autoBudgetThreshold {:?}",
                    condense_events::RECOVERY_GRACE_PRESETS,
                    condense_events::MIN_BATCH_CHARS_PRESETS,
                    condense_events::ROLLING_WINDOW_PRESETS,
                    condense_events::AUTO_BUDGET_PRESETS
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(ConfigAction::Set { key, value }) => {
            let Some(store_dir) = store_folder(store_dir) else {
                bail!("a PostgreSQL store has no folder to keep a config.json in: keep the file yourself and pass --config FILE to the commands that read it");
            };
            let path = store_dir.join("config.json");
            let mut current: serde_json::Map<String, Value> = if path.exists() {
                let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", path.display()))?
            } else {
                serde_json::Map::new()
            };
            let v: Value = serde_json::from_str(&value).unwrap_or_else(|_| Value::String(value.clone()));
            check_range(&key, &v)?;
            current.insert(key.clone(), v);
            let text = serde_json::to_string_pretty(&Value::Object(current))?;
            condense_engine::config::parse_file(&text).map_err(|e| anyhow!("{e}"))?;
            std::fs::create_dir_all(store_dir).with_context(|| format!("creating {}", store_dir.display()))?;
            std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
            outln!("set {key} = {value} in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The values `config set` takes for the numeric keys: a file written by hand is normalized as the seed
/// says, but a value set here that normalization would change is refused, naming the allowed range.
fn check_range(key: &str, v: &Value) -> Result<()> {
    // (minimum, whole numbers only)
    let range: Option<(f64, bool)> = match key {
        "minBatchChars" | "rollingWindow" | "spillPreviewBytes" | "purgeMinChars" | "purgeAfterTurns" | "recoveryGraceTurns" | "condenseArgsChars" | "minPruneTokens" | "autoBudgetThreshold" => Some((0.0, true)),
        "spillThreshold" => Some((1.0, true)),
        "cachedPrice" | "uncachedPrice" => Some((0.0, false)),
        _ => None,
    };
    let Some((min, whole)) = range else { return Ok(()) };
    let n = v.as_f64().filter(|n| n.is_finite()).ok_or_else(|| anyhow!("config key `{key}`: expected a number, found {v}"))?;
    if n < min || (whole && n.fract() != 0.0) {
        let kind = if whole { "a whole number" } else { "a number" };
        bail!("config key `{key}`: {v} is out of range; expected {kind} of at least {min}");
    }
    Ok(())
}

fn figures_json(f: &condense_engine::simulate::Figures) -> Value {
    json!({
        "turns": f.turns, "tool_calls": f.tool_calls,
        "raw_tokens_peak": f.raw_tokens_peak, "rendered_tokens_peak": f.rendered_tokens_peak,
        "raw_input_tokens_total": f.raw_input_tokens_total, "rendered_input_tokens_total": f.rendered_input_tokens_total,
        "cached_prefix_tokens_total": f.cached_prefix_tokens_total, "cache_breaks": f.cache_breaks,
        "raw_cached_prefix_tokens_total": f.raw_cached_prefix_tokens_total,
        "cost_units_raw": (f.cost_units_raw * 100.0).round() / 100.0,
        "cost_units_rendered": (f.cost_units_rendered * 100.0).round() / 100.0,
        "stubs": f.stubs, "spills": f.spills, "dedups": f.dedups, "chains": f.chains,
        "refs_checked": f.refs_checked, "refs_recovered_exact": f.refs_recovered_exact,
        "validity_errors": f.validity_errors,
        "checkpoints": f.checkpoints, "over_budget_requests": f.over_budget_requests,
        "compaction_failures": f.compaction_failures,
        "recoveries": f.recoveries, "recoveries_blocked": f.recoveries_blocked, "blocked_reasons": f.blocked_reasons,
        "archives": f.archives,
        "facts_needed": f.facts_needed, "facts_retained": f.facts_retained,
        "retention": (f.retention() * 10000.0).round() / 10000.0,
        "token_ratio": (f.token_ratio() * 10000.0).round() / 10000.0,
        "cost_ratio": (f.cost_ratio() * 10000.0).round() / 10000.0,
        "host_input_tokens_total": f.host_input_tokens_total, "host_cached_prefix_tokens_total": f.host_cached_prefix_tokens_total,
        "host_summary_input_tokens_total": f.host_summary_input_tokens_total, "host_tokens_peak": f.host_tokens_peak,
        "host_cache_breaks": f.host_cache_breaks, "host_compactions": f.host_compactions,
        "cost_units_host": (f.cost_units_host * 100.0).round() / 100.0,
        "host_token_ratio": (f.host_token_ratio() * 10000.0).round() / 10000.0,
        "host_cost_ratio": (f.host_cost_ratio() * 10000.0).round() / 10000.0,
    })
}

/// Estimated dollars of the raw, host-baseline and condense requests at `price`.
fn dollars_json(f: &condense_engine::simulate::Figures, price: &condense_engine::simulate::ListPrice) -> Value {
    let (raw, host, condense) = price.of(f);
    let round = |d: f64| (d * 10000.0).round() / 10000.0;
    json!({"raw": round(raw), "host": round(host), "condense": round(condense)})
}

/// Absolute tokens and estimated dollars, condense beside raw (and, with a window, beside the host's own
/// compaction at that window).
fn money_line(f: &condense_engine::simulate::Figures, price: &condense_engine::simulate::ListPrice, window: Option<u64>) -> String {
    let (raw, host, condense) = price.of(f);
    let mut line = format!(
        "{} input tokens, ${condense:.2} at {} list prices; raw {} tokens, ${raw:.2}",
        f.rendered_input_tokens_total, price.model, f.raw_input_tokens_total
    );
    if let Some(w) = window {
        line.push_str(&format!(
            "; the host's own compaction at {w} tokens {} tokens, ${host:.2} ({} compactions, {} cache breaks): condense takes {:.1}% of its tokens, {:.1}% of its cost",
            f.host_input_tokens_total, f.host_compactions, f.host_cache_breaks, f.host_token_ratio() * 100.0, f.host_cost_ratio() * 100.0
        ));
    }
    line
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// The summarizer a configuration names (`None`: the embedded extractive one).
/// With `warn_each`, a fallback to the extractive summarizer prints a warning on stderr as it happens (the
/// 1st, 10th, 100th, … time); without, the caller reports the count when it is done.
pub(crate) fn summarizer_of(file_config: &condense_engine::config::FileConfig, warn_each: bool) -> Option<Arc<dyn condense_summarize::Summarizer>> {
    match &file_config.summarizer {
        condense_engine::config::SummarizerChoice::Extractive => None,
        condense_engine::config::SummarizerChoice::Http { base_url, model, api_key_env, idle_secs, total_secs } => {
            // The key is read here, in the binary; it never reaches an event.
            let key = api_key_env.as_ref().and_then(|v| std::env::var(v).ok());
            let mut c = condense_summarize::HttpConfig::new(base_url, model, key);
            c.idle = std::time::Duration::from_secs(*idle_secs);
            c.total = std::time::Duration::from_secs(*total_secs);
            let s = condense_summarize::WithFallback::new(condense_summarize::HttpSummarizer::new(c), condense_summarize::Extractive::default());
            Some(if warn_each {
                Arc::new(s.with_notice(|n, reason| {
                    let digits = n.to_string();
                    if digits.starts_with('1') && digits[1..].bytes().all(|b| b == b'0') {
                        eprintln!("condense: warning: the configured summarizer failed ({n} times so far); the extractive summarizer stood in: {reason}");
                    }
                }))
            } else {
                Arc::new(s)
            })
        }
    }
}

/// `simulate`'s inputs.
pub(crate) struct SimulateOptions {
    paths: Vec<PathBuf>,
    window: Option<u64>,
    switch: Option<condense_engine::simulate::Switch>,
    config: Option<PathBuf>,
    plot: Option<PathBuf>,
    price: String,
    force: bool,
    json: bool,
}

/// Replays sessions with pruning on; into `kept` (the store, with `--keep`) or a private scratch store.
fn simulate(kept: Option<&Store>, store_dir: &Path, o: &SimulateOptions) -> Result<ExitCode> {
    let window = o.window;
    let file_config = load_config(o.config.as_deref(), store_dir)?;
    let prices = file_config.prices;
    let config = file_config.raw.normalize();
    let Some(list_price) = condense_engine::config::list_price(&file_config.list_prices, &o.price) else {
        let mut known: Vec<String> = condense_engine::simulate::price_table().into_iter().map(|p| p.model).collect();
        known.extend(file_config.list_prices.iter().map(|p| p.model.clone()));
        bail!("--price {}: no list prices for that model (known: {}; add one under `listPrices` in the configuration)", o.price, known.join(", "));
    };
    if let Some(plot) = &o.plot {
        plot::check_path(plot)?;
    }
    let summarizer = summarizer_of(&file_config, false);
    let mut files = Vec::new();
    for path in &o.paths {
        if path.is_dir() {
            walk(path, &mut files)?;
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            bail!("{}: no such file or folder", path.display());
        }
    }
    // Replays not kept go into a store held in memory: nothing in it needs to survive the command, and no
    // append waits for a writer thread or the disk.
    let scratch_options = condense_engine::StoreOptions { defer_durability: true, ..Default::default() };
    let temp = if kept.is_some() { None } else { Some(Store::in_memory(scratch_options)) };
    let target = match (&temp, kept) {
        (Some(t), _) => t,
        (None, Some(k)) => k,
        (None, None) => unreachable!("a scratch store or the kept one"),
    };
    if let Some(s) = &summarizer {
        target.set_summarizer(s.clone());
    }
    let mut total = condense_engine::simulate::Figures::default();
    let mut rows = Vec::new();
    let (mut token_ratios, mut cost_ratios, mut retentions) = (Vec::new(), Vec::new(), Vec::new());
    let (mut host_token_ratios, mut host_cost_ratios) = (Vec::new(), Vec::new());
    let mut plot = Vec::new();
    for file in &files {
        // Read on a thread of its own, the file's events are replayed as they are parsed.
        let mut reading = match condense_engine::simulate::Reading::start(file) {
            Ok(r) => r,
            Err(e) => {
                errln!("condense: skipped {e}");
                continue;
            }
        };
        let name = format!("simulated/{}", name_of(file));
        if kept.is_some() && target.log().session_id(&name)?.is_some() {
            if !o.force {
                bail!("session {name} exists from an earlier `simulate --keep`; pass --force to replace it");
            }
            target.remove_session(&name)?;
        }
        let mut f = condense_engine::simulate::replay_with(target, &name, &mut reading, config.clone(), prices, window, o.switch)?;
        if let Some(e) = reading.finish() {
            // A file that fails part way is skipped as one that fails at once: what was replayed goes.
            target.remove_session(&name)?;
            errln!("condense: skipped {e}");
            continue;
        }
        if !o.json {
            let recovery = match o.switch {
                Some(_) => format!(
                    ", {} recoveries, {} blocked{}, {} archives",
                    f.recoveries,
                    f.recoveries_blocked,
                    if f.blocked_reasons.is_empty() { String::new() } else { format!(" ({})", f.blocked_reasons.join("; ")) },
                    f.archives
                ),
                None => String::new(),
            };
            outln!(
                "{name}: {} requests, {} tool calls, tokens {:.1}% of raw, cost {:.1}% of raw, {} cache breaks, {} stubs, {} chains, {} checkpoints, {} over budget, {} compaction failures{recovery}, retention {:.3} ({}/{} facts), refs {}/{} exact, {} validity errors",
                f.turns, f.tool_calls, f.token_ratio() * 100.0, f.cost_ratio() * 100.0, f.cache_breaks, f.stubs, f.chains,
                f.checkpoints, f.over_budget_requests, f.compaction_failures, f.retention(), f.facts_retained, f.facts_needed,
                f.refs_recovered_exact, f.refs_checked, f.validity_errors
            );
            outln!("  {}", money_line(&f, &list_price, window));
        }
        if f.turns > 0 {
            token_ratios.push(f.token_ratio());
            cost_ratios.push(f.cost_ratio());
            host_token_ratios.push(f.host_token_ratio());
            host_cost_ratios.push(f.host_cost_ratio());
        }
        if f.facts_needed > 0 {
            retentions.push(f.retention());
        }
        let mut row = figures_json(&f);
        row["session"] = json!(name);
        row["dollars"] = dollars_json(&f, &list_price);
        rows.push(row);
        total.add(&f);
        plot.push((name, std::mem::take(&mut f.series)));
    }
    drop(temp);
    if let Some(path) = &o.plot {
        let sessions: Vec<plot::Session> = plot.iter().map(|(name, series)| plot::Session { name, series }).collect();
        plot::write(path, &sessions, window, &list_price)?;
    }
    let mut t = figures_json(&total);
    t["dollars"] = dollars_json(&total, &list_price);
    t["sessions"] = json!(rows.len());
    // A configured summarizer that could not answer is said out loud: the figures above are then partly
    // the extractive stand-in's.
    let fallbacks = summarizer.as_ref().map(|s| s.fallbacks()).unwrap_or_default();
    t["summarizer_fallbacks"] = json!(fallbacks.count);
    if fallbacks.count > 0 {
        errln!(
            "condense: warning: the configured summarizer failed {} times and the extractive summarizer stood in (last: {})",
            fallbacks.count,
            fallbacks.last.as_deref().unwrap_or("?")
        );
    }
    t["median_token_ratio"] = json!((median(token_ratios) * 10000.0).round() / 10000.0);
    t["median_cost_ratio"] = json!((median(cost_ratios) * 10000.0).round() / 10000.0);
    t["median_retention"] = json!((median(retentions) * 10000.0).round() / 10000.0);
    t["median_host_token_ratio"] = json!((median(host_token_ratios) * 10000.0).round() / 10000.0);
    t["median_host_cost_ratio"] = json!((median(host_cost_ratios) * 10000.0).round() / 10000.0);
    if o.json {
        let price = json!({"model": list_price.model, "input": list_price.input, "cachedRead": list_price.cached_read, "cacheWrite": list_price.cache_write});
        outln!("{}", serde_json::to_string_pretty(&json!({"config": condense_engine::config::to_json(&config, prices), "window": window, "price": price, "total": t, "sessions": rows}))?);
    } else {
        outln!(
            "total: {} sessions, tokens {:.1}% of raw (median {:.1}%), cost {:.1}% of raw (median {:.1}%), {} cache breaks, retention {:.3} (median {:.3}), refs {}/{} exact, {} validity errors",
            rows.len(), total.token_ratio() * 100.0, t["median_token_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            total.cost_ratio() * 100.0, t["median_cost_ratio"].as_f64().unwrap_or(0.0) * 100.0, total.cache_breaks,
            total.retention(), t["median_retention"].as_f64().unwrap_or(0.0),
            total.refs_recovered_exact, total.refs_checked, total.validity_errors
        );
        outln!("  {}", money_line(&total, &list_price, window));
        if window.is_some() {
            outln!(
                "  against the host's own compaction: median tokens {:.1}%, median cost {:.1}%",
                t["median_host_token_ratio"].as_f64().unwrap_or(0.0) * 100.0, t["median_host_cost_ratio"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
        if let Some(sw) = o.switch {
            outln!(
                "switch to a {}-token window at request {}: {} recoveries, {} blocked, {} archives, {} over budget",
                sw.window, sw.at, total.recoveries, total.recoveries_blocked, total.archives, total.over_budget_requests
            );
            for r in &total.blocked_reasons {
                outln!("  blocked: {r}");
            }
        }
    }
    let ok = total.validity_errors == 0 && total.refs_recovered_exact == total.refs_checked;
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn history(store: &Store, verb: History) -> Result<ExitCode> {
    match verb {
        History::Archive { session } => {
            let id = session_of(store, &session)?.archive_now()?;
            outln!("archive {id} committed");
        }
        History::Archives { session, page } => {
            let (ids, next) = session_of(store, &session)?.history_archives(page, 20)?;
            outln!("{}", serde_json::to_string_pretty(&json!({"archives": ids, "nextPage": next}))?);
        }
        History::Search { session, keywords, archive } => {
            let session = session_of(store, &session)?;
            let archive = session.archive(archive.as_deref())?;
            let words: Vec<&str> = keywords.iter().map(String::as_str).collect();
            let hits = archive.search(&words, 20).map_err(|e| anyhow!("{e}"))?;
            let rows: Vec<Value> = hits.iter().map(|h| json!({"id": h.id, "matched": h.matched, "snippet": h.snippet})).collect();
            outln!("{}", serde_json::to_string_pretty(&json!({"archive": archive.id, "hits": rows, "note": "snippets can be partial; ranking is not a completeness guarantee"}))?);
        }
        History::Read { session, entry, offset, archive } => {
            let session = session_of(store, &session)?;
            let archive = session.archive(archive.as_deref())?;
            let page = archive.read(&entry, offset).map_err(|e| anyhow!("{e}"))?;
            outln!("{}", serde_json::to_string_pretty(&json!({"archive": archive.id, "id": entry, "text": page.text, "nextOffset": page.next_offset, "length": page.len}))?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the originals behind refs; exits 1 (a finding) when a ref recovers nothing, with or without
/// `--json`.
fn query(store: &Store, session: &str, refs: &[String], json_out: bool) -> Result<ExitCode> {
    let answer = session_of(store, session)?.query(refs)?;
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&json!({"is_error": answer.is_error, "text": answer.text}))?);
    } else {
        outln!("{}", answer.text);
    }
    Ok(if answer.is_error { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// A session name from the path as given: its normal components joined by `/` (no `..`, no root), so
/// importing the same tree from anywhere gives the same names.
fn name_of(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    parts.join("/")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut unreadable = Vec::new();
    walk_all(dir, out, &mut unreadable);
    match unreadable.first() {
        // The folder given itself cannot be read: that is the error.
        Some((p, e)) if p == dir => Err(anyhow!("reading folder {}: {e}", p.display())),
        _ => {
            for (p, e) in unreadable {
                errln!("condense: skipped {}: cannot be read ({e})", p.display());
            }
            Ok(())
        }
    }
}

/// Whether `path` may hold a session, by its extension (`.jsonl`, `.json`, `.traj`): what a folder import
/// and `watch` read.
pub(crate) fn is_session_file(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "jsonl" || x == "json" || x == "traj")
}

/// Every session file candidate under `dir` ([`is_session_file`]), sorted; a subfolder or entry that cannot be read is noted with why,
/// and the rest is still walked.
fn walk_all(dir: &Path, out: &mut Vec<PathBuf>, unreadable: &mut Vec<(PathBuf, std::io::Error)>) {
    let mut entries: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).collect(),
        Err(e) => {
            unreadable.push((dir.to_path_buf(), e));
            return;
        }
    };
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let ft = match e.file_type() {
            Ok(ft) => ft,
            Err(err) => {
                unreadable.push((p, err));
                continue;
            }
        };
        if ft.is_dir() {
            walk_all(&p, out, unreadable);
        } else if ft.is_file() && is_session_file(&p) {
            out.push(p);
        }
    }
}

fn is_export(path: &Path) -> bool {
    let mut head = [0u8; 15];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head)).is_ok() && &head == b"CONDENSE-EXPORT"
}

fn import(store: &Store, paths: &[PathBuf], json_out: bool) -> Result<ExitCode> {
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    for path in paths {
        let p = path.display();
        if path.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            files.extend(found.into_iter().map(|f| (f, false)));
        } else if path.is_file() {
            if is_export(path) {
                let s = store.log().import(path)?;
                outln!(
                    "restored {} sessions, {} events, {} blobs from {p}{}",
                    s.sessions,
                    s.events,
                    s.blobs,
                    if s.present > 0 { format!(" ({} sessions were there in full already)", s.present) } else { String::new() }
                );
                continue;
            }
            files.push((path.clone(), true));
        } else {
            bail!("{p}: no such file or folder");
        }
    }
    let progress = files.len() > 20 && std::io::stderr().is_terminal() && !json_out;
    let mut reports = Vec::new();
    let mut failed = false;
    let (mut imported, mut skipped, mut diags) = (0u64, 0u64, 0u64);
    // The files are read ahead, one while the one before is written; what each gave is reported as it is
    // imported. Every new session is made durable at once after the last file (one flush, not one per file).
    let to_import: Vec<(PathBuf, String)> = files.iter().map(|(f, _)| (f.clone(), name_of(f))).collect();
    let mut report = |i: usize, result: Result<Vec<condense_engine::ImportOutcome>, condense_engine::EngineError>| -> Result<()> {
        let (file, named) = (&files[i].0, files[i].1);
        if progress {
            let width = 30;
            let done = (i + 1) * width / files.len();
            eprint!("\r[{}{}] {}/{} ", "#".repeat(done), " ".repeat(width - done), i + 1, files.len());
            let _ = std::io::stderr().flush();
        }
        match result {
            Ok(outcomes) => {
                for o in outcomes {
                    let name = &o.name;
                    if o.action == condense_engine::ImportAction::Unchanged {
                        skipped += 1;
                        reports.push(json!({"file": file.display().to_string(), "status": "exists", "session": name}));
                        continue;
                    }
                    imported += 1;
                    diags += o.diagnostics.len() as u64;
                    let status = match o.action {
                        condense_engine::ImportAction::Resumed => "resumed",
                        condense_engine::ImportAction::Grown => "grown",
                        _ => "imported",
                    };
                    if !json_out && !progress {
                        let how = if status == "imported" { String::new() } else { format!(", {status}") };
                        outln!("{name}: {} ({} events{how}, {} diagnostics)", o.format.name(), o.events, o.diagnostics.len());
                        for d in o.diagnostics.iter().take(5) {
                            outln!("  {d}");
                        }
                        if o.diagnostics.len() > 5 {
                            outln!("  … {} more (stored as import_diagnostic events)", o.diagnostics.len() - 5);
                        }
                    }
                    reports.push(json!({
                        "file": file.display().to_string(), "status": status, "session": name,
                        "format": o.format.name(), "events": o.events, "bytes": o.bytes,
                        "diagnostics": o.diagnostics.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
                    }));
                }
            }
            Err(condense_engine::EngineError::Format(e)) if !named => {
                skipped += 1;
                if !json_out {
                    errln!("condense: skipped {e}");
                }
                reports.push(json!({"file": file.display().to_string(), "status": "skipped", "reason": e.to_string()}));
            }
            Err(e) => {
                failed = true;
                if !json_out {
                    errln!("condense: {e}");
                }
                reports.push(json!({"file": file.display().to_string(), "status": "failed", "reason": e.to_string()}));
            }
        }
        Ok(())
    };
    // Output that cannot be written (a closed pipe) ends the command once the import is done and durable.
    let mut unwritten = None;
    store.import_files_deferred(&to_import, &mut |i, result| {
        if unwritten.is_none() {
            unwritten = report(i, result).err();
        }
    });
    if progress {
        eprintln!();
    }
    store.sync()?;
    if let Some(e) = unwritten {
        return Err(e);
    }
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&json!({"imported": imported, "skipped": skipped, "diagnostics": diags, "files": reports}))?);
    } else {
        outln!("imported {imported} sessions, skipped {skipped} files ({diags} diagnostics)");
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn sessions(store: &Store, json_out: bool) -> Result<ExitCode> {
    let list = store.sessions()?;
    if json_out {
        let v: Vec<Value> = list.iter().map(|s| json!({"id": s.id, "name": s.name, "events": s.head})).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for s in &list {
            outln!("{:>5}  {:>8} events  {}", s.id, s.head, s.name);
        }
        outln!("{} sessions", list.len());
    }
    Ok(ExitCode::SUCCESS)
}

fn stats_json(s: &Stats) -> Value {
    json!({
        "entries": s.entries, "messages": s.messages, "turns": s.turns, "user_turn_groups": s.user_turn_groups,
        "tool_calls": s.tool_calls, "tool_results": s.tool_results, "tool_errors": s.tool_errors,
        "branch_tokens": s.branch_tokens, "context_messages": s.context_messages, "context_tokens": s.context_tokens,
        "tokens_by_role": s.tokens_by_role, "tokens_by_tool": s.tokens_by_tool, "recovery": s.recovery,
    })
}

fn print_stats(session: &Session, json_out: bool) -> Result<()> {
    let s = session.stats()?;
    if json_out {
        let mut v = stats_json(&s);
        v["session"] = json!(session.name());
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!("session            {}", session.name());
    outln!("entries            {}", s.entries);
    outln!("messages (branch)  {}", s.messages);
    outln!("turns              {}", s.turns);
    outln!("user-turn-groups   {}", s.user_turn_groups);
    outln!("tool calls         {} ({} results, {} errors)", s.tool_calls, s.tool_results, s.tool_errors);
    outln!("tokens (branch)    {}  [chars/4, pi's estimate]", s.branch_tokens);
    for (role, t) in &s.tokens_by_role {
        outln!("  {role:<16} {t}");
    }
    outln!("tokens by tool");
    let mut tools: Vec<_> = s.tokens_by_tool.iter().collect();
    tools.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (tool, t) in tools {
        outln!("  {tool:<16} {t}");
    }
    outln!("rendered context   {} messages, {} tokens", s.context_messages, s.context_tokens);
    for d in &s.recovery {
        outln!("recovery           {d}");
    }
    Ok(())
}

fn encode(messages: &[Arc<Message>], how: Format) -> Value {
    match how {
        Format::Neutral => condense_formats::export::neutral(messages),
        Format::Openai => condense_formats::export::openai(messages),
        Format::Anthropic => condense_formats::export::anthropic(messages),
    }
}

/// A complete request body for the provider: the model (`--model`, else the session's newest), the output
/// limit the model table gives it, the messages, and condense's tool definitions when the context refers
/// to them (the agent's own tools and system prompt are not in the log: a host adds them).
fn request_body(session: &Session, how: Format, messages: &[Arc<Message>], model: Option<&str>, store_dir: &Path) -> Result<Value> {
    let p = session.projection()?;
    let recorded = p.model().map(|m| m.model.clone()).filter(|m| !m.is_empty());
    let model = model.map(str::to_string).or(recorded);
    if model.is_none() {
        errln!("condense: no model is recorded for {}: the body names none (pass --model NAME)", session.name());
    }
    let file = load_config(None, store_dir)?;
    let max_output = model
        .as_deref()
        .and_then(|m| condense_engine::config::model_limits(&file.models, m))
        .and_then(|l| l.max_output)
        .or_else(|| p.model().and_then(|m| m.max_output))
        .unwrap_or(8192);
    use condense_formats::wire::Api;
    let (api, limit_key) = match how {
        Format::Anthropic => (Api::Anthropic, "max_tokens"),
        _ => (Api::Chat, "max_completion_tokens"),
    };
    let mut body = json!({"model": model, limit_key: max_output});
    // The Messages export is an object (messages, and system when there is one); Chat is a message list.
    match (body.as_object_mut(), encode(messages, how)) {
        (Some(b), Value::Object(fields)) => b.extend(fields),
        (_, list) => body["messages"] = list,
    }
    let needed = condense_engine::tools::needed(&p);
    if !needed.is_empty() {
        body["tools"] = needed.iter().map(|t| condense_engine::tools::tool_json(api, t)).collect();
    }
    Ok(body)
}

fn render(session: &Session, how: Format, after_event: Option<u64>, model: Option<&str>, store_dir: &Path) -> Result<ExitCode> {
    let name = session.name();
    let rendered = match after_event {
        Some(seq) => session.render_at(seq)?,
        None => session.render()?,
    };
    let v = match how {
        Format::Neutral => encode(&rendered.messages, how),
        _ => request_body(session, how, &rendered.messages, model, store_dir)?,
    };
    outln!("{}", serde_json::to_string_pretty(&v)?);
    // A context a provider would reject is printed (it is what the log holds) but said so, and the
    // command fails like `verify` does.
    let violations = check(&rendered.messages);
    if !violations.is_empty() {
        for v in &violations {
            errln!("condense: {name}: the rendered context breaks a provider rule: {v}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The bytes a render is compared by.
fn bytes_of(p: &Projection) -> Vec<u8> {
    serde_json::to_vec(&condense_formats::export::neutral(&p.render().messages)).expect("JSON of a context")
}

fn verify(store: &Store, json_out: bool) -> Result<ExitCode> {
    let report = store.log().verify()?;
    let mut rows = Vec::new();
    let mut bad = 0;
    for info in store.sessions()? {
        let session = store.session(&info.name)?;
        // A: one fresh fold of the whole log. B: the warm path, folded in turn-sized steps with a render
        // after each, as a live host would. They must agree byte for byte.
        let fresh = session.projection_at(info.head)?;
        let mut live = Projection::new();
        let mut steps = 0u64;
        store.log().for_each(info.id, 1, info.head, |env| {
            live.apply(env.seq, &env.body);
            if env.seq % 64 == 0 {
                let _ = live.render();
                steps += 1;
            }
            Ok(())
        })?;
        let rendered = fresh.render();
        let violations = check(&rendered.messages);
        let same = bytes_of(&fresh) == bytes_of(&live) && bytes_of(&fresh) == bytes_of(&session.projection()?);
        if !same || !violations.is_empty() {
            bad += 1;
        }
        rows.push(json!({
            "session": info.name, "events": info.head, "messages": rendered.messages.len(), "identical": same,
            "violations": violations.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "synthetic_results": rendered.report.synthetic_results.len(),
            "orphan_results": rendered.report.orphan_results.len(),
            "empty_assistants": rendered.report.empty_assistants,
            "duplicate_calls": rendered.report.duplicate_calls,
        }));
        if !json_out && (!same || !violations.is_empty()) {
            outln!("FAIL {}: identical={same}", info.name);
            for v in violations.iter().take(5) {
                outln!("  {v}");
            }
        }
    }
    // An import that began and never finished: the session holds only part of its file.
    let incomplete = store.incomplete_imports()?;
    if !json_out {
        for name in &incomplete {
            outln!("INCOMPLETE {name}: its import stopped part-way; import the same file again to finish it");
        }
    }
    let bad = bad + incomplete.len();
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&json!({
            "sessions": report.sessions, "events": report.events, "blobs": report.blobs, "failed": bad,
            "incomplete_imports": incomplete, "results": rows,
        }))?);
    } else {
        outln!("verified {} sessions, {} events, {} blobs: {} failed", report.sessions, report.events, report.blobs, bad);
    }
    Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn run_demo(store: &Store, dir: &Path, json_out: bool) -> Result<ExitCode> {
    let name = "demo";
    let pruned = "demo/pruned";
    // The generated session is the same bytes every time: a demo that stopped part-way is finished, a
    // complete one is left as it is.
    let text = demo::generate(demo::DemoConfig::default());
    let folder = dir.join("demo");
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let file = folder.join("demo-session.jsonl");
    if std::fs::read(&file).ok().as_deref() != Some(text.as_bytes()) {
        std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    }
    let o = store.import_file(&file, name)?;
    if !json_out && o.action != condense_engine::ImportAction::Unchanged {
        outln!("generated {} ({} bytes) and imported it as session `{name}` ({} events)", file.display(), text.len(), o.events);
    }
    // The main job: the same session replayed request by request with condense in the loop, as `simulate`
    // does. The replay is deterministic, so one left by an earlier (or interrupted) demo is replaced.
    let file_config = load_config(None, dir)?;
    if store.log().session_id(pruned)?.is_some() {
        store.remove_session(pruned)?;
    }
    let events = condense_formats::import_file(&file)?.events;
    let f = condense_engine::simulate::replay_with(store, pruned, events, file_config.raw.normalize(), file_config.prices, None, None)?;
    let plot = folder.join("demo.svg");
    let price = condense_engine::config::list_price(&file_config.list_prices, condense_engine::simulate::DEFAULT_PRICE_MODEL).expect("the default price model is in the table");
    plot::write(&plot, &[plot::Session { name: pruned, series: &f.series }], None, &price)?;
    let ok = f.validity_errors == 0 && f.refs_recovered_exact == f.refs_checked;
    if json_out {
        let s = store.session(name)?.stats()?;
        let mut v = stats_json(&s);
        v["session"] = json!(name);
        v["simulation"] = figures_json(&f);
        v["simulation"]["session"] = json!(pruned);
        v["plot"] = json!(plot.display().to_string());
        v["simulation"]["dollars"] = dollars_json(&f, &price);
        v["simulation"]["price_model"] = json!(price.model);
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    let s = store.session(name)?.stats()?;
    outln!(
        "\nThe agent's session: {} requests, {} tool calls ({} failed), {} tokens of history by the end.",
        f.turns, s.tool_calls, s.tool_errors, f.raw_tokens_peak
    );
    outln!("Replayed request by request with condense in the loop (session `{pruned}`):");
    outln!(
        "  input tokens sent   {:.1}% of what the agent alone sends ({} vs {})",
        f.token_ratio() * 100.0, f.rendered_input_tokens_total, f.raw_input_tokens_total
    );
    outln!("  cost                {:.1}% of the agent alone's, prompt caching counted", f.cost_ratio() * 100.0);
    let (raw_dollars, _, condense_dollars) = price.of(&f);
    outln!("  estimated cost      ${condense_dollars:.2} instead of ${raw_dollars:.2} at {} list prices", price.model);
    outln!("  largest context     {} tokens instead of {}", f.rendered_tokens_peak, f.raw_tokens_peak);
    outln!("  cache breaks        {} (the agent alone: {})", f.cache_breaks, f.raw_cache_breaks);
    outln!("  pruned              {} stubs, {} spilled outputs, {} duplicates, {} chains", f.stubs, f.spills, f.dedups, f.chains);
    outln!("  refs recovered      {}/{} byte-exact; {} provider-rule violations", f.refs_recovered_exact, f.refs_checked, f.validity_errors);
    outln!("  plot                {}", plot.display());
    let store_flag = if dir == Path::new(".condense") { String::new() } else { format!(" --store {}", dir.display()) };
    outln!("\nNext:");
    let next = [
        (format!("condense render {pruned} --as anthropic{store_flag}"), "the context condense would send now"),
        (format!("condense query {pruned} t12{store_flag}"), "an original behind a stub, byte for byte"),
        (format!("condense serve{store_flag}"), "put condense between your agent and its provider (README)"),
    ];
    let width = next.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (command, what) in next {
        outln!("  {command:<width$}   {what}");
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
