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
    // Events name absolute paths; sessions are named relative to the watched path a file lies in (as
    // `import` of that folder names them), so each event path is mapped back under it.
    let roots: Vec<(PathBuf, PathBuf)> = paths
        .iter()
        .map(|p| p.canonicalize().map(|c| (c, p.clone())).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<_>>()?;
    let as_given = |p: &Path| -> (PathBuf, PathBuf) {
        for (canonical, given) in &roots {
            if let Ok(rest) = p.strip_prefix(canonical) {
                return (given.clone(), if rest.as_os_str().is_empty() { given.clone() } else { given.join(rest) });
            }
        }
        (p.to_path_buf(), p.to_path_buf())
    };
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut watcher = notify::recommended_watcher(tx).context("starting the file watcher")?;
    for p in paths {
        watcher.watch(p, RecursiveMode::Recursive).with_context(|| format!("watching {}", p.display()))?;
    }
    // What is there already, then every change.
    for p in paths {
        import(store_dir, p, vec![p.clone()], capture)?;
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    outln!("watching {} (Ctrl-C to stop)", names.join(", "));
    loop {
        let mut changed: BTreeSet<(PathBuf, PathBuf)> = BTreeSet::new();
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
        // One import per watched path, its files named relative to it.
        let mut by_root: std::collections::BTreeMap<PathBuf, Vec<PathBuf>> = std::collections::BTreeMap::new();
        for (root, file) in changed.into_iter().filter(|(_, p)| p.is_file()) {
            by_root.entry(root).or_default().push(file);
        }
        for (root, files) in by_root {
            import(store_dir, &root, files, capture)?;
        }
    }
}

/// Imports `files` (or folders) found under the watched `root` with `condense import --json`, named
/// relative to it, and prints one line per session that
/// changed, and one per file that could not be imported.
fn import(store_dir: &Path, root: &Path, files: Vec<PathBuf>, capture: Capture) -> Result<()> {
    let mut argv: Vec<OsString> = vec!["--store".into(), store_dir.as_os_str().to_owned(), "import".into(), "--json".into(), "--relative-to".into(), root.as_os_str().to_owned()];
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
