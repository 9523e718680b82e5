//! The dispatcher: parses the command line and runs a command, in this process, inside a running
//! `condense serve` (the route other commands take while a server holds the store), or captured for
//! another process.

use crate::cli::{Cli, Command};
use crate::commands;
use crate::output::{err_write, error_text};
use crate::shared::{now_rfc3339, session_of, shown, store_folder};
use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser as _;
use condense_engine::Store;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// Runs a command with its output captured: `(stdout, stderr, exit code)`.
pub fn run_captured(store: &Store, argv: Vec<String>) -> (Vec<u8>, Vec<u8>, i32) {
    capture(argv.into_iter().map(OsString::from).collect(), Some(store))
}

/// Runs a command (inside a server when `served` is given) with its output captured.
pub(crate) fn capture(argv: Vec<OsString>, served: Option<&Store>) -> (Vec<u8>, Vec<u8>, i32) {
    crate::output::start_capture();
    let code = match run_with(argv, served) {
        Ok(code) if code == ExitCode::SUCCESS => 0,
        Ok(code) if code == ExitCode::from(2) => 2,
        Ok(_) => 1,
        Err(e) => {
            err_write(format_args!("condense: {}\n", error_text(&e)));
            2
        }
    };
    let (out, err) = crate::output::take_capture();
    (out, err, code)
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
            return crate::serve::serve(&store_dir, args, run_captured);
        }
        Command::Run(args) => {
            if served.is_some() {
                bail!("`run` starts an agent beside a server, not inside it");
            }
            return crate::launch::run(&store_dir, args);
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
            return crate::watch::watch(&store_dir, paths, std::time::Duration::from_millis(*settle), capture);
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
        Command::Serve(_) | Command::Run(_) | Command::Completions { .. } | Command::Watch { .. } => unreachable!("handled above"),
        Command::Import { paths, json, relative_to } => commands::import::import(&open()?, &paths, relative_to.as_deref(), json),
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
        Command::Sessions { json } => commands::inspect::sessions(&open()?, json),
        Command::Stats { session, entry_ids, json } => {
            let store = open()?;
            let session = session_of(&store, &session)?;
            commands::inspect::print_stats(&session, json, entry_ids)?;
            if entry_ids && !json {
                commands::inspect::print_entries(&session, false)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Render { session, format, after_event, entry_ids, model } => {
            let store = open()?;
            let session = session_of(&store, &session)?;
            if entry_ids {
                commands::inspect::print_entries(&session, false)?;
                return Ok(ExitCode::SUCCESS);
            }
            commands::inspect::render(&session, format, after_event, model.as_deref(), &store_dir)
        }
        Command::Verify { json } => commands::verify::verify(&open()?, json),
        Command::Demo { json } => commands::demo::run_demo(&open()?, &store_dir, json),
        Command::Simulate { paths, window, switch, cache_ttl, config, plot, price, keep, force, json } => {
            let store = if keep { Some(open()?) } else { None };
            let cache_ttl = (cache_ttl > 0).then_some(cache_ttl);
            commands::simulate::simulate(store.as_ref(), &store_dir, &commands::simulate::SimulateOptions { paths, window, switch, cache_ttl, config, plot, price, force, json })
        }
        Command::Query { session, refs, json, raw } => commands::inspect::query(&open()?, &session, &refs, json, raw),
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
        Command::History(verb) => commands::history::history(&open()?, verb),
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
        Command::Config { action, config: file, json } => commands::config::config(&store_dir, action, file.as_deref(), json),
    }
}
