//! `condense import`: files and folders (sessions found by extension, exports restored), each file's
//! outcome, diagnostics and the import's summary.

use anyhow::{anyhow, bail, Result};
use condense_engine::Store;
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

/// A session name from the path as given: its normal components joined by `/` (no `..`, no root), so
/// importing the same tree from anywhere gives the same names.
pub(crate) fn name_of(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    parts.join("/")
}

pub(crate) fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
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
pub(crate) fn walk_all(dir: &Path, out: &mut Vec<PathBuf>, unreadable: &mut Vec<(PathBuf, std::io::Error)>) {
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

pub(crate) fn is_export(path: &Path) -> bool {
    let mut head = [0u8; 15];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head)).is_ok() && &head == b"CONDENSE-EXPORT"
}

pub(crate) fn import(store: &Store, paths: &[PathBuf], json_out: bool) -> Result<ExitCode> {
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
