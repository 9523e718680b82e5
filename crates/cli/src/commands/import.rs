//! `condense import`: files and folders (sessions found by extension, exports restored), each file's
//! outcome, diagnostics and the import's summary.

use anyhow::{anyhow, bail, Result};
use condense_engine::Store;
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

/// The old form of a session name: every normal component of the path as given, joined by `/` (no `..`,
/// no root). Sessions imported before names became relative keep it (see [`name_for`]).
pub(crate) fn name_of(path: &Path) -> String {
    components(path).join("/")
}

fn components(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// The project a session file's folder stands for, when the folder is an agent's project folder: Claude
/// Code keeps a project's sessions in a folder named after its working directory with every character
/// but letters and digits made `-` (`-home-me-src-app`), pi in `--home-me-src-app--`. The working
/// directory is read from the file itself (its first lines carry `cwd`), and the folder must be its
/// encoding; the project is the directory's last component (`app`).
fn project_of(file: &Path) -> Option<String> {
    use std::io::{BufRead, BufReader, Read};
    let folder = file.parent()?.file_name()?.to_str()?;
    if !folder.starts_with('-') {
        return None;
    }
    let reader = BufReader::new(std::fs::File::open(file).ok()?.take(1 << 20));
    let cwd = reader.lines().take(50).map_while(|l| l.ok()).find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(&line).ok()?;
        v.get("cwd").and_then(|c| c.as_str()).map(str::to_string)
    })?;
    let claude: String = cwd.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let pi = format!("--{}--", cwd.trim_start_matches(['/', '\\']).replace(['/', '\\', ':'], "-"));
    if folder != claude && folder != pi {
        return None;
    }
    let project = Path::new(&cwd).file_name()?.to_str()?.to_string();
    (!project.is_empty()).then_some(project)
}

/// The names a session read from `file` may take, most wanted first: its path relative to `root` (the
/// folder given; a file given alone is its own root, so its name is its file name), an agent's project
/// folder shown as its project (see [`project_of`]); then the same with more of the path in front, up to
/// every component of the path as given.
pub(crate) fn candidate_names(root: &Path, file: &Path) -> Vec<String> {
    let full = components(file);
    let mut rel = match file.strip_prefix(root) {
        Ok(r) if !r.as_os_str().is_empty() => components(r),
        _ => full.last().cloned().into_iter().collect(),
    };
    let mut before = full.len().saturating_sub(rel.len());
    if let Some(project) = project_of(file) {
        match rel.len() {
            0 => {}
            1 => {
                rel.insert(0, project);
                before = before.saturating_sub(1);
            }
            n => rel[n - 2] = project,
        }
    }
    let mut out = vec![rel.join("/")];
    for k in (0..before).rev() {
        out.push(format!("{}/{}", full[k..before].join("/"), rel.join("/")));
    }
    let old = full.join("/");
    if !out.contains(&old) {
        out.push(old);
    }
    // Shorter forms last: a session imported by one of them earlier (the file given alone, then its
    // folder) is found under it.
    for k in 1..rel.len() {
        let shorter = rel[k..].join("/");
        if !out.contains(&shorter) {
            out.push(shorter);
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The file a session was imported from (its canonical path), `None` when it was not imported from one;
/// the outer `None` when there is no session of that name or it holds nothing yet.
fn imported_from(store: &Store, name: &str) -> Result<Option<Option<String>>> {
    let Some(id) = store.log().session_id(name)? else { return Ok(None) };
    let head = store.log().head(id)?;
    if head == 0 {
        // Created by an import that stopped before its first events: the import resumes into it.
        return Ok(None);
    }
    let first = store.log().read(id, 1, head.min(4))?;
    Ok(Some(first.into_iter().find_map(|e| match e.body {
        condense_events::Event::Source(condense_events::SourceEvent::ImportStarted { path, .. }) => Some(path),
        _ => None,
    })))
}

/// The name `file` (found under `root`) is imported as: the first of its [`candidate_names`] that no
/// other file holds and that this import has not given out (`taken`). A session imported under the old
/// form of names ([`name_of`]) from the same file keeps it, as does one imported under another form.
pub(crate) fn name_for(store: &Store, root: &Path, file: &Path, taken: &mut std::collections::BTreeSet<String>) -> Result<String> {
    let canonical = file.canonicalize().ok().map(|c| c.to_string_lossy().into_owned());
    let same_file = |held: &Option<String>| held.is_some() && *held == canonical;
    // Each form not given out yet, with what the store holds under it (looked up once).
    let mut free = Vec::new();
    for name in candidate_names(root, file).into_iter().filter(|n| !taken.contains(n)) {
        let held = imported_from(store, &name)?;
        free.push((name, held));
    }
    // A session that holds this file already keeps its name, whatever form it has (the old form of names
    // among them); else the first form no other file holds.
    let pick = free.iter().position(|(_, held)| held.as_ref().is_some_and(same_file)).or_else(|| free.iter().position(|(_, held)| held.is_none()));
    if let Some(k) = pick {
        let name = free.swap_remove(k).0;
        taken.insert(name.clone());
        return Ok(name);
    }
    // Every form is held by another file: the old form, whose import will say which file holds it.
    Ok(name_of(file))
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

/// `condense import`. Sessions are named relative to the folder given (`root`, for `watch`, names every
/// file relative to the folder it follows instead), see [`name_for`].
pub(crate) fn import(store: &Store, paths: &[PathBuf], root: Option<&Path>, json_out: bool) -> Result<ExitCode> {
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    let mut roots: Vec<PathBuf> = Vec::new();
    for path in paths {
        let p = path.display();
        if path.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            roots.extend(found.iter().map(|_| root.unwrap_or(path).to_path_buf()));
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
            roots.push(root.unwrap_or(path).to_path_buf());
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
    let mut taken = std::collections::BTreeSet::new();
    let to_import: Vec<(PathBuf, String)> = files.iter().zip(&roots).map(|((f, _), root)| Ok((f.clone(), name_for(store, root, f, &mut taken)?))).collect::<Result<_>>()?;
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
