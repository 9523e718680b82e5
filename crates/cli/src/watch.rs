//! `condense watch`: follows agents' session folders with the platform's file notifications (the
//! `notify` crate) and imports each session file that appears or changes, once it has been quiet for a
//! moment. Each import is an ordinary `condense import` (through a running `condense serve` when one holds
//! the store), so new files become sessions and grown files append what they grew by; one line per change.

use crate::commands::import::is_session_file;
use anyhow::{anyhow, bail, Context as _, Result};
use notify::{EventKind, RecursiveMode, Watcher as _};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Runs a command with its output captured: `(stdout, stderr, exit code)`.
pub type Capture = fn(Vec<OsString>, Option<&condense_engine::Store>) -> (Vec<u8>, Vec<u8>, i32);

/// Follows `paths` until the process is stopped; `capture` runs each import as a command with its output
/// captured (the dispatcher's, handed down so this module does not call back up into it).
pub fn watch(store_dir: &Path, paths: &[PathBuf], settle: Duration, capture: Capture) -> Result<ExitCode> {
    for p in paths {
        if !p.exists() {
            bail!("{}: no such file or folder", p.display());
        }
    }
    // The store may lie inside a watched folder: its own writes are not session changes.
    // (A PostgreSQL store has no folder to leave out.)
    let store = match crate::shared::store_folder(store_dir) {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Some(dir.canonicalize().with_context(|| format!("reading {}", dir.display()))?)
        }
        None => None,
    };
    let outside = |p: &Path| match &store {
        Some(store) => !p.starts_with(store) && p.canonicalize().map_or(true, |c| !c.starts_with(store)),
        None => true,
    };
    // Events name absolute paths; sessions are named after the path as the user gave it (as `import`
    // names them), so each event path is mapped back under the watched path it lies in.
    let roots: Vec<(PathBuf, PathBuf)> = paths
        .iter()
        .map(|p| p.canonicalize().map(|c| (c, p.clone())).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<_>>()?;
    let as_given = |p: &Path| -> PathBuf {
        for (canonical, given) in &roots {
            if let Ok(rest) = p.strip_prefix(canonical) {
                return if rest.as_os_str().is_empty() { given.clone() } else { given.join(rest) };
            }
        }
        p.to_path_buf()
    };
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut watcher = notify::recommended_watcher(tx).context("starting the file watcher")?;
    for p in paths {
        watcher.watch(p, RecursiveMode::Recursive).with_context(|| format!("watching {}", p.display()))?;
    }
    // What is there already, then every change.
    import(store_dir, paths.to_vec(), capture)?;
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    outln!("watching {} (Ctrl-C to stop)", names.join(", "));
    loop {
        let mut changed: BTreeSet<PathBuf> = BTreeSet::new();
        let mut note = |event: notify::Result<notify::Event>| match event {
            Ok(e) if matches!(e.kind, EventKind::Create(_) | EventKind::Modify(_)) => {
                for p in e.paths {
                    if is_session_file(&p) && outside(&p) {
                        changed.insert(as_given(&p));
                    }
                }
            }
            Ok(_) => {}
            Err(e) => crate::output::err_write(format_args!("condense watch: {e}\n")),
        };
        let Ok(first) = rx.recv() else { return Ok(ExitCode::SUCCESS) };
        note(first);
        // Wait until the writers have been quiet for `settle`.
        loop {
            match rx.recv_timeout(settle) {
                Ok(e) => note(e),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(ExitCode::SUCCESS),
            }
        }
        let files: Vec<PathBuf> = changed.into_iter().filter(|p| p.is_file()).collect();
        if !files.is_empty() {
            import(store_dir, files, capture)?;
        }
    }
}

/// Imports `files` (or folders) with `condense import --json` and prints one line per session that
/// changed, and one per file that could not be imported.
fn import(store_dir: &Path, files: Vec<PathBuf>, capture: Capture) -> Result<()> {
    let mut argv: Vec<OsString> = vec!["--store".into(), store_dir.as_os_str().to_owned(), "import".into(), "--json".into()];
    argv.extend(files.into_iter().map(PathBuf::into_os_string));
    let (out, err, code) = capture(argv, None);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out) else {
        // The import as a whole failed (the store cannot be opened, a path vanished): say so and go on.
        let text = String::from_utf8_lossy(&err);
        if code == 2 && text.contains("in use by another condense process") {
            return Err(anyhow!("{}", text.trim().trim_start_matches("condense: ")));
        }
        crate::output::err_write(format_args!("{}", text));
        return Ok(());
    };
    for f in v["files"].as_array().into_iter().flatten() {
        let session = f["session"].as_str().unwrap_or("");
        let events = f["events"].as_u64().unwrap_or(0);
        match f["status"].as_str().unwrap_or("") {
            "exists" => {}
            "imported" => outln!("imported  {session}  ({} session, {events} events)", f["format"].as_str().unwrap_or("?")),
            "grown" => outln!("grown     {session}  (+{events} events)"),
            "resumed" => outln!("resumed   {session}  (+{events} events)"),
            _ => {
                let file = f["file"].as_str().unwrap_or("");
                let reason = f["reason"].as_str().unwrap_or("");
                outln!("skipped   {file}: {}", reason.strip_prefix(&format!("{file}: ")).unwrap_or(reason));
            }
        }
    }
    Ok(())
}
