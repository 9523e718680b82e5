//! The crash harness shared by the test suite (a few rounds) and `cargo xtask crash` (a hundred and more):
//! runs `condense import FILE`, `condense demo` and `condense import BACKUP.export` (a restore), kills each
//! with SIGKILL at a random point of its run, runs the same command again, and checks that the store then
//! verifies clean, has no unfinished import, and renders every session exactly as an uninterrupted run does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the rounds saw.
#[derive(Debug, Default)]
pub struct CrashSummary {
    /// Rounds run, per command (import, demo, restore).
    pub rounds: [u32; 3],
    /// Rounds whose kill came before the command had finished, per command.
    pub interrupted: [u32; 3],
}

const KINDS: [&str; 3] = ["import", "demo", "restore"];

fn run(bin: &Path, store: &Path, args: &[&str]) -> Result<(i32, String), String> {
    let out = Command::new(bin).arg("--store").arg(store).args(args).output().map_err(|e| format!("running condense: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

fn renders(bin: &Path, store: &Path) -> Result<Vec<(String, String)>, String> {
    let (code, list) = run(bin, store, &["sessions", "--json"])?;
    if code != 0 {
        return Err(format!("sessions failed: {list}"));
    }
    let list: serde_json::Value = serde_json::from_str(&list).map_err(|e| format!("sessions --json: {e}: {list}"))?;
    let mut out = Vec::new();
    for s in list.as_array().into_iter().flatten() {
        let Some(name) = s["name"].as_str() else { continue };
        let (code, text) = run(bin, store, &["render", name])?;
        if code != 0 {
            return Err(format!("render {name} failed: {text}"));
        }
        out.push((name.to_string(), text));
    }
    Ok(out)
}

/// Runs `rounds` kill-and-rerun rounds with binary `bin` in folder `work`, importing `input` (a session
/// file); `seed` picks the kill points. An error says which round broke which promise.
pub fn crash_rounds(bin: &Path, work: &Path, input: &Path, rounds: u32, seed: u64) -> Result<CrashSummary, String> {
    let input = input.to_str().ok_or("input path is not UTF-8")?.to_string();
    let backup = work.join("reference.export");
    let backup_arg = backup.to_str().ok_or("work path is not UTF-8")?.to_string();
    // Uninterrupted reference runs: what each command leaves, and how long it takes.
    let mut expected = Vec::new();
    let mut took = Vec::new();
    for (k, args) in [vec!["import", input.as_str()], vec!["demo"], vec!["import", backup_arg.as_str()]].into_iter().enumerate() {
        let store = work.join(format!("reference-{}", KINDS[k]));
        if k == 2 {
            // The backup to restore: an export of a store holding both the imported session and the demo.
            let both = work.join("reference-both");
            for a in [vec!["import", input.as_str()], vec!["demo"]] {
                let (code, text) = run(bin, &both, &a)?;
                if code != 0 {
                    return Err(format!("reference {a:?} failed: {text}"));
                }
            }
            let (code, text) = run(bin, &both, &["export", backup_arg.as_str()])?;
            if code != 0 {
                return Err(format!("reference export failed: {text}"));
            }
        }
        // Timed twice on fresh stores, the shorter taken (the first run pays for cold caches).
        let mut best = Duration::MAX;
        for attempt in 0..2 {
            let at = if attempt == 0 { store.clone() } else { work.join(format!("timing-{}", KINDS[k])) };
            let start = Instant::now();
            let (code, text) = run(bin, &at, &args)?;
            best = best.min(start.elapsed());
            if code != 0 {
                return Err(format!("reference {} failed: {text}", KINDS[k]));
            }
        }
        let _ = std::fs::remove_dir_all(work.join(format!("timing-{}", KINDS[k])));
        took.push(best);
        expected.push(renders(bin, &store)?);
    }
    let mut summary = CrashSummary::default();
    let mut state = seed | 1;
    for round in 0..rounds {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let k = (round % 3) as usize;
        let args: Vec<&str> = match k {
            0 => vec!["import", &input],
            1 => vec!["demo"],
            _ => vec!["import", &backup_arg],
        };
        // Kill points spread over the whole run (process start included), a little past its usual end.
        let span = took[k].as_micros() as u64 * 6 / 5 + 1;
        let delay = Duration::from_micros(state % span);
        let store: PathBuf = work.join(format!("round-{round}"));
        let mut child = Command::new(bin)
            .arg("--store")
            .arg(&store)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning condense: {e}"))?;
        // Watched until the kill point: a command that ends before it ran faster than the reference (which
        // may have been timed while the machine was busier), and the later rounds' kill points follow it.
        let started = Instant::now();
        let finished = loop {
            if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                break Some(started.elapsed());
            }
            let left = delay.saturating_sub(started.elapsed());
            if left.is_zero() {
                break None;
            }
            std::thread::sleep(left.min(Duration::from_millis(1)));
        };
        let _ = child.kill();
        let _ = child.wait();
        summary.rounds[k] += 1;
        match finished {
            None => summary.interrupted[k] += 1,
            Some(t) => took[k] = took[k].min(t),
        }
        let what = format!("round {round} ({} killed after {delay:?})", KINDS[k]);
        let (code, text) = run(bin, &store, &args)?;
        if code != 0 {
            return Err(format!("{what}: running it again failed: {text}"));
        }
        let (code, text) = run(bin, &store, &["verify", "--json"])?;
        if code != 0 {
            return Err(format!("{what}: verify failed: {text}"));
        }
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{what}: verify --json: {e}: {text}"))?;
        if v["incomplete_imports"].as_array().is_some_and(|a| !a.is_empty()) {
            return Err(format!("{what}: an import is still unfinished: {text}"));
        }
        let got = renders(bin, &store)?;
        if got != expected[k] {
            let names: Vec<_> = got.iter().map(|(n, t)| (n.clone(), t.len())).collect();
            let want: Vec<_> = expected[k].iter().map(|(n, t)| (n.clone(), t.len())).collect();
            return Err(format!("{what}: the store differs from an uninterrupted run: {names:?} vs {want:?}"));
        }
        let _ = std::fs::remove_dir_all(&store);
    }
    Ok(summary)
}
