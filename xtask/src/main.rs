//! `cargo xtask test` (see `test.rs`): the whole test suite on a fresh machine, its set-up included.
//!
//! `cargo xtask bench`: measures import, rebuild and render on the corpus and on generated pi sessions of
//! growing size, side by side with a bare `serde_json` parse of the same bytes, and writes
//! `docs/benchmarks.md`. Timing lives here and only here: tests never assert on speed.

use anyhow::{bail, Context, Result};
use condense_engine::Store;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod postgres;
mod serve;
mod soak;
mod test;

#[path = "../../crates/cli/tests/support/crash_rounds.rs"]
mod crash_rounds;
mod e2e_clients;

// The allocator the condense binary uses, so the figures are what a user's `condense` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench(&args[1..]),
        Some("crash") => crash(&args[1..]),
        Some("soak") => soak::soak(&args[1..]),
        Some("man") => man(&args[1..]),
        Some("test") => test::run(&args[1..]),
        Some("clients") => test::clients(),
        Some("install-check") => test::install_check_only(),
        // A fresh process importing one file into a fresh store, printing its peak memory (for the bench).
        Some("import-peak") => {
            let (file, dir) = (PathBuf::from(&args[1]), PathBuf::from(&args[2]));
            let store = Store::open(&dir)?;
            let t = Instant::now();
            store.import_file(&file, "gen")?;
            println!("{:.0} {:.0}", peak_mib(), ms(t.elapsed()));
            Ok(())
        }
        _ => {
            eprintln!("usage: cargo xtask bench [--quick] [--sizes 1000,10000,...] [--out FILE] [--only import|simulate|quality|pruning|serve|request-memory|e2e|switch|postgres]");
            eprintln!("       cargo xtask crash [--rounds N] [--seed S] [--entries N]");
            eprintln!("       cargo xtask soak [--backend sled|postgres|both] [--conversations N] [--seconds T] [--rate R] [--crashes K]");
            eprintln!("       cargo xtask man [--out DIR]");
            eprintln!("       cargo xtask test [ARGS for cargo test]   (installs what the suite needs, then cargo test --workspace, then the install check)");
            eprintln!("       cargo xtask install-check   (cargo install --path and --git give a condense that runs)");
            Ok(())
        }
    }
}

/// `cargo xtask man`: writes the man pages (`condense.1` and one `condense-COMMAND.1` per command) from
/// the CLI's clap declaration, into `target/man` or `--out DIR`.
fn man(args: &[String]) -> Result<()> {
    let out = match args {
        [] => root().join("target/man"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => bail!("usage: cargo xtask man [--out DIR]"),
    };
    std::fs::create_dir_all(&out)?;
    let cmd = condense_cli::cli::command();
    let mut pages = 0;
    let mut write = |name: String, cmd: clap::Command| -> Result<()> {
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut buf)?;
        std::fs::write(out.join(format!("{name}.1")), buf)?;
        pages += 1;
        Ok(())
    };
    for sub in cmd.get_subcommands() {
        let name = format!("condense-{}", sub.get_name());
        // clap's names are 'static: the page's title is leaked once per command, in a one-shot tool.
        let title: &'static str = Box::leak(name.clone().into_boxed_str());
        write(name, sub.clone().name(title))?;
    }
    write("condense".into(), cmd.clone())?;
    println!("wrote {pages} man pages to {} (man {}/condense.1)", out.display(), out.display());
    Ok(())
}

/// `cargo xtask crash`: kills `condense import`, `condense demo` and a restore at random points, many
/// rounds, and checks after each that running the command again leaves a complete, verified store.
fn crash(args: &[String]) -> Result<()> {
    let (mut rounds, mut seed, mut entries) = (102u32, 0x9E37_79B9_7F4A_7C15u64, 20_000u32);
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).with_context(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--rounds" => rounds = value.parse().context("--rounds takes a number")?,
            "--seed" => seed = value.parse().context("--seed takes a number")?,
            "--entries" => entries = value.parse().context("--entries takes a number")?,
            other => bail!("unknown option {other}"),
        }
        i += 2;
    }
    let bin = release_binary()?;
    let work = root().join("target/crash-scratch");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let input = work.join(format!("gen-{entries}.jsonl"));
    let tool = root().join("../shared/tools/gen_pi_session.py");
    let st = std::process::Command::new("python3").arg(tool).args(["--entries", &entries.to_string(), "--seed", "1", "--out"]).arg(&input).status()?;
    if !st.success() {
        bail!("generating the input session failed");
    }
    let start = Instant::now();
    let result = crash_rounds::crash_rounds(&bin, &work, &input, rounds, seed);
    let _ = std::fs::remove_dir_all(&work);
    let summary = result.map_err(|e| anyhow::anyhow!(e))?;
    println!(
        "crash: {rounds} rounds (seed {seed}, {entries} entries) in {:.0?}, every store complete and verified after the command ran again; killed mid-run: import {}/{}, demo {}/{}, restore {}/{}",
        start.elapsed(),
        summary.interrupted[0], summary.rounds[0], summary.interrupted[1], summary.rounds[1], summary.interrupted[2], summary.rounds[2]
    );
    Ok(())
}

/// Builds the release `condense` binary and returns its path.
pub(crate) fn release_binary() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // `cargo run` gave this process xtask's package variables (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, ...); ring's
    // build script tracks some of them, so passing them on would rebuild the TLS stack (minutes, inside the
    // measurements) whenever `condense` was last built from a shell, and back again.
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "--release", "-p", "condense-cli", "--bin", "condense"]).current_dir(root());
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CARGO_PKG_") || k.starts_with("CARGO_MANIFEST_") || matches!(&*k, "CARGO_PRIMARY_PACKAGE" | "CARGO_CRATE_NAME" | "CARGO_BIN_NAME") {
            build.env_remove(&key);
        }
    }
    let st = build.status()?;
    if !st.success() {
        bail!("building condense failed");
    }
    Ok(root().join("target/release/condense"))
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn corpus() -> PathBuf {
    std::env::var("CONDENSE_CORPUS").map(PathBuf::from).unwrap_or_else(|_| root().join("../shared/corpus"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut v: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    v.sort();
    for p in v {
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            out.push(p);
        }
    }
}

/// Peak resident memory of this process so far (VmHWM), in MiB.
fn peak_mib() -> f64 {
    status_kib("self", "VmHWM:") / 1024.0
}

/// A `kB` figure of `/proc/PROCESS/status` (`key` with its colon, as `VmHWM:`); 0 when unreadable.
pub(crate) fn status_kib(process: impl std::fmt::Display, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok()).unwrap_or(0.0)
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..n {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        last = Some(v);
    }
    (best, last.expect("n > 0"))
}

pub(crate) fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub(crate) fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// The floor: parse every line of the file into a `serde_json::Value`.
fn bare_parse(bytes: &[u8]) -> usize {
    let mut n = 0;
    for line in bytes.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        for v in serde_json::Deserializer::from_slice(line).into_iter::<serde_json::Value>() {
            if v.is_ok() {
                n += 1;
            }
        }
    }
    n
}

fn bench(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(i) = args.iter().position(|a| a == "--only") {
        let section = args.get(i + 1).context("--only needs a section: import, simulate, quality, pruning, serve, switch or postgres")?;
        let scratch = root().join("target/bench-scratch");
        std::fs::create_dir_all(&scratch)?;
        let mut md = String::new();
        match section.as_str() {
            "serve" => serve::bench(&mut md, &scratch)?,
            "request-memory" => serve::request_memory(&mut md, &scratch)?,
            "switch" => switch_bench(&mut md, &scratch)?,
            "postgres" => postgres::bench(&mut md, &scratch)?,
            "import" => import_bench(&mut md, &scratch, true)?,
            "simulate" => simulate_bench(&mut md, &scratch, &[1_000, 10_000, 100_000])?,
            "quality" => quality(&mut md, &scratch)?,
            "pruning" => pruning(&mut md, &scratch, true)?,
            "e2e" => e2e_cost(&mut md)?,
            _ => bail!("--only takes `import`, `simulate`, `quality`, `pruning`, `serve`, `request-memory`, `e2e`, `switch` or `postgres`"),
        }
        let path = root().join("docs/benchmarks.md");
        let mut doc = std::fs::read_to_string(&path).unwrap_or_default();
        // A section may write several `## ` sections (pruning ends with the quality table): each replaces its own.
        let starts: Vec<usize> = md.match_indices("\n## ").map(|(i, _)| i).collect();
        for (k, &from) in starts.iter().enumerate() {
            doc = splice(&doc, &md[from..starts.get(k + 1).copied().unwrap_or(md.len())]);
        }
        if starts.is_empty() {
            doc = splice(&doc, &md);
        }
        std::fs::write(&path, doc)?;
        println!("updated the {section} section of {}", path.display());
        return Ok(());
    }
    let mut sizes: Vec<u64> = if quick { vec![1_000, 10_000, 100_000] } else { vec![1_000, 10_000, 100_000, 1_000_000] };
    let mut out_path = root().join("docs/benchmarks.md");
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--sizes" => {
                i += 1;
                sizes = args.get(i).context("--sizes needs a list")?.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?;
            }
            "--out" => {
                i += 1;
                out_path = PathBuf::from(args.get(i).context("--out needs a file")?);
            }
            "--quick" => {}
            other => bail!("unknown option {other}"),
        }
        i += 1;
    }
    let scratch = root().join("target/bench-scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut md = String::new();
    writeln!(md, "# Benchmarks\n")?;
    writeln!(md, "Written by `cargo xtask bench{}` (release build). Machine: {} cores, {}. Every figure of a section was measured in one run; `cargo xtask bench --only SECTION` measures one section again and splices it in, so sections may come from different runs (and builds).\n",
        if quick { " --quick" } else { "" }, std::thread::available_parallelism().map_or(0, |n| n.get()), mem_total())?;
    import_bench(&mut md, &scratch, sizes.contains(&100_000))?;
    corpus_render(&mut md, &scratch)?;
    generated(&mut md, &scratch, &sizes)?;
    pruning(&mut md, &scratch, sizes.contains(&100_000))?;
    // The 100k-entry replay takes minutes: the full run only.
    let simulated: Vec<u64> = sizes.iter().copied().filter(|n| *n < 100_000 || (*n == 100_000 && !quick)).collect();
    simulate_bench(&mut md, &scratch, &simulated)?;
    if sizes.contains(&100_000) {
        archive_bench(&mut md, &scratch)?;
    }
    switch_bench(&mut md, &scratch)?;
    postgres::bench(&mut md, &scratch)?;
    serve::bench(&mut md, &scratch)?;
    serve::request_memory(&mut md, &scratch)?;
    e2e_cost(&mut md)?;
    writeln!(md, "\n## Reference figures (pi and pi-condense)\n")?;
    writeln!(md, "From `../shared/PEERS.md`: pi 0.73.1 and pi-condense 2.9.1 under Node 20 on a 2-core machine like this one, median of 5 runs. pi `buildSessionContext` on the synthetic sessions: 0.63 ms (1k), 10.4 ms (10k), 715 ms (100k), 55,870 ms (1M). pi-condense render at end of session: 15.5 ms (1k), 269 ms (10k), 50,857 ms (100k). `JSON.parse` of every line: 7.2 ms (1k), 100 ms (10k), 1,306 ms (100k). Corpus pi-mono before-compaction: pi 0.55 ms, pi-condense per call 2.30 ms median. A bare `serde_json::Value` parse ran at about 365 MB/s there.\n")?;
    writeln!(md, "\n## Method\n")?;
    writeln!(md, "- *Bare parse*: every line of the file parsed into a `serde_json::Value` (the floor an importer cannot beat).\n- *Parse to events*: `condense_formats::import_bytes`, the whole importer (tolerant line reading, conversion to source events) without storing.\n- *Store write alone*: the same sessions' events, encoded and packed beforehand as an import packs them (runs of up to 32 KiB, LZ4-compressed), appended to a fresh store (each session created, its values appended, one sync after the last): what the log costs an import without any parsing. An import overlaps parsing with this, on two cores shared with sled's own I/O threads, so it cannot take less than the larger of the two.\n- *Import into store*: the same plus the `Store` writing it: bincode encoding, packing and LZ4 compression, the values appended to the session's value file and their pointers to sled in batches, one flush at the end (`Store::import_files_deferred`, as `condense import` runs it: the new sessions' files are hashed and parsed, in order, on two threads while the chunks before, of the same file or the one before, are written, up to four of them in flight; a file's last appends and its completion marker are acknowledged while the next file starts).\n- *Full rebuild*: folding a fresh projection from every event in the log (what `render --at` and a cold start do).\n- *Full render*: `Projection::render_full_now` on a warm projection: walk the active branch, apply the newest host compaction, repair pairing, from scratch. Median of repeated runs.
- *Per-turn render*: what a host pays before each request: one event applied to the warm projection and `render` called, measured over the session's last 200 events (the projection keeps its render up to date as entries extend the branch, so this does not grow with the session).\n- Import timings: parse to events is the best of 7 runs, store write alone the best of 3. The import into a store is measured in 7 paired rounds (3 for the 100k session, in the paragraph under the corpus table; the generated-sessions table sets one bare parse beside one import), each parsing the same bytes bare and importing them into a fresh store in turn, 3 times, the best of each kept (both sides measured alike and in the same moments, because this machine's speed drifts by as much as half between runs minutes apart, and by a third between runs milliseconds apart): the bare parse and import columns are the rounds' medians, and the last ratio is the median of the rounds' ratios (bare parse time over import time, i.e. import throughput over bare parse throughput). The parse-to-events ratio is the two columns' quotient.\n- Import peak RSS is the VmHWM of a fresh process that opens a fresh store and imports the file (`cargo xtask import-peak FILE DIR`); peak memory is this process's VmHWM after the step, so it only grows down the table (it includes the full rebuild, which holds the whole session).\n- The import into a store is timed as `condense import` runs it: from the first file's import to the return of the sync after the last (one flush for the folder, everything durable), with the store opened and closed outside the timing.")?;
    std::fs::write(&out_path, md)?;
    println!("wrote {}", out_path.display());
    Ok(())
}

/// The real clients through serve for forty turns against the same clients sent direct, with prompt
/// caching priced as the providers bill it: runs the end-to-end tests that measure it
/// (`crates/cli/tests/serve_e2e.rs`, `forty_turns_*`) and tables the rows they write.
fn e2e_cost(md: &mut String) -> Result<()> {
    let rows = root().join("target/e2e-cost");
    let _ = std::fs::remove_dir_all(&rows);
    let status = std::process::Command::new(env!("CARGO"))
        .args(["test", "-p", "condense-cli", "--test", "serve_e2e", "forty_turns"])
        .current_dir(root())
        .status()?;
    if !status.success() {
        bail!("the forty-turn end-to-end tests failed");
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&rows)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    writeln!(md, "\n## condense serve with the real clients: forty turns, cache-priced\n")?;
    writeln!(md, "Claude Code, Codex, pi and Gemini CLI (the pinned versions of `crates/cli/tests/e2e-clients.txt`) each run a 40-turn session twice against the scripted fake provider: once through `condense serve` with the default configuration, once sent direct. Each turn the model runs two shell commands with outputs of about 14 and 12 KB and answers; through serve it also asks for `new_context` in turn 8, the provider rejects the first request of turn 15 as too long (serve checkpoints and retries), serve restarts after turn 20, and turn 25 recalls an output by ref. Prompt caching is simulated as each API bills it (`condense_serve::billing`: Anthropic reads the longest prefix up to an earlier `cache_control` mark, OpenAI the longest prefix shared with an earlier request); cost is 0.1 per cached byte and 1.25 per uncached byte. *Floor*: what the session through condense would cost if it paid full price for nothing but what is new (the bytes the same client sent direct paid full price for: its prompts and the tools' outputs) and the cached price for every other byte it sends — below it only by sending fewer bytes. *Issue 60's floor*: every byte new to the provider once at full price (what direct paid full price for), plus the client's own fixed context (what every request of its direct session begins with: system prompt, tools, environment) at the cached price in every request through condense — all else condense keeps is above it; *× floor* is the cost over it (target 1.10). *Environment*: whether the host's environment message (Claude Code's `# Environment`, Codex's `<environment_context>`) reached the provider in every request through serve. Target (issue 34): cost ≤ 0.30 for each client.\n")?;
    writeln!(md, "| client | requests, condense / direct | bytes sent, condense / direct | cache hit, direct → condense | cost, condense / direct | floor | issue 60's floor | × floor | environment |")?;
    writeln!(md, "|---|---:|---:|---|---:|---:|---:|---:|---|")?;
    for f in files {
        md.push_str(&std::fs::read_to_string(&f)?);
    }
    Ok(())
}

fn mem_total() -> String {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("unknown memory".into(), |kb| format!("{:.0} GiB memory", kb / 1024.0 / 1024.0))
}

/// The import section (`--only import`, and the full run): the corpus import table, then the 100k-entry
/// session's import beside its bare parse in paired rounds, as the corpus's are measured.
fn import_bench(md: &mut String, scratch: &Path, with_100k: bool) -> Result<()> {
    corpus_import(md, scratch)?;
    if !with_100k {
        return Ok(());
    }
    let file = generated_file(scratch, 100_000)?;
    let t_write = timed_writes(&scratch.join("write-100000"), std::slice::from_ref(&file))?;
    let bytes = std::fs::read(&file)?;
    let (t_bare, t_import, ratio) = paired_import(3, &scratch.join("import-100000"), std::slice::from_ref(&file), &[bytes.as_slice()])?;
    let line = format!("bare parse {:.0} ms, store write alone {:.0} ms, import into store {:.0} ms (medians of 3 paired rounds), ratio {ratio:.2} (median of the rounds' ratios)", ms(t_bare), ms(t_write), ms(t_import));
    println!("100k: {line}");
    writeln!(md, "\nThe generated 100k-entry pi session ({:.1} MB), measured the same way: {line}; target ≥ 0.5 (issue 10).", bytes.len() as f64 / 1e6)?;
    Ok(())
}

/// The best of 3 runs of `run` on a fresh store at `dir`, each given what `input` makes for it; making
/// the input and opening and closing the store are outside the timing.
fn best_on_fresh_store<T>(dir: &Path, input: impl FnMut() -> T, run: impl FnMut(&Store, T) -> Result<()>) -> Result<Duration> {
    best_of_on_fresh_store(3, dir, input, run)
}

/// [`best_on_fresh_store`] of `runs` runs.
fn best_of_on_fresh_store<T>(runs: usize, dir: &Path, mut input: impl FnMut() -> T, mut run: impl FnMut(&Store, T) -> Result<()>) -> Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let _ = std::fs::remove_dir_all(dir);
        let store = Store::open(dir)?;
        let given = input();
        let t = Instant::now();
        run(&store, given)?;
        best = best.min(t.elapsed());
        drop(store);
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(best)
}

/// One import of `files` into a fresh store at `dir` as `condense import` does it, from the first file's
/// import to the return of the sync after the last one (everything durable).
fn timed_import(dir: &Path, files: &[PathBuf]) -> Result<Duration> {
    let named: Vec<(PathBuf, String)> = files.iter().enumerate().map(|(i, f)| (f.clone(), format!("s{i}"))).collect();
    best_of_on_fresh_store(1, dir, || (), |store, ()| {
        let mut failed = None;
        store.import_files_deferred(&named, &mut |_, r| {
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        Ok(store.sync()?)
    })
}

/// The import beside the bare parse of the same bytes, in `rounds` paired rounds: each round parses every
/// file bare and imports them into a fresh store, in turn, 3 times, and keeps the best of each (both
/// sides measured alike, and in the same moments: this machine's speed drifts by half between runs
/// minutes apart, and by a third between runs milliseconds apart; the Codex corpus's bare parse measured
/// 15 to 26 ms in one minute). The ratio is taken within each round, and its median reported: the
/// medians of the bare parse and of the import, and the median of the rounds' ratios (bare time over
/// import time).
fn paired_import(rounds: usize, dir: &Path, files: &[PathBuf], data: &[&[u8]]) -> Result<(Duration, Duration, f64)> {
    let (mut bare, mut import, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (mut b, mut i) = (Duration::MAX, Duration::MAX);
        for _ in 0..3 {
            b = b.min(best_of(1, || data.iter().map(|d| bare_parse(d)).sum::<usize>()).0);
            i = i.min(timed_import(dir, files)?);
        }
        ratios.push(b.as_secs_f64() / i.as_secs_f64());
        bare.push(b);
        import.push(i);
    }
    ratios.sort_by(f64::total_cmp);
    Ok((median(bare), median(import), ratios[ratios.len() / 2]))
}

/// The best of 3 writes of already encoded sessions into a fresh store at `dir` (each session created,
/// its values appended, one sync after the last): what an import pays the log, without parsing.
fn timed_writes(dir: &Path, files: &[PathBuf]) -> Result<Duration> {
    // A fresh store numbers its sessions from 1 in the order they are created.
    let encoded: Vec<Vec<Vec<u8>>> = files
        .iter()
        .enumerate()
        .map(|(s, f)| {
            let events = condense_formats::import_file(f)?.events;
            let id = s as u64 + 1;
            let events: Vec<condense_events::Event> = events.into_iter().map(condense_events::Event::Source).collect();
            // Packed as an import into the sled store packs them.
            Ok(condense_log::encode_packed(id, 1, &events))
        })
        .collect::<Result<_>>()?;
    best_on_fresh_store(dir, || encoded.clone(), |store, values| {
        let log = store.log();
        for (i, v) in values.into_iter().enumerate() {
            let id = log.create_session_deferred(&format!("s{i}"))?;
            log.append_encoded(id, 0, v, false)?.recv()??;
        }
        Ok(log.sync()?)
    })
}

fn corpus_import(md: &mut String, scratch: &Path) -> Result<()> {
    writeln!(md, "## Import throughput on the corpus\n")?;
    writeln!(md, "| format | files | MB | bare parse MB/s | parse to events MB/s | ratio | events/s | store write alone MB/s | import into store MB/s | ratio |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for fmt in ["pi", "claude-code", "codex"] {
        let mut files = Vec::new();
        walk(&corpus().join(fmt), &mut files);
        let data: Vec<(PathBuf, Vec<u8>)> = files.iter().map(|f| Ok((f.clone(), std::fs::read(f)?))).collect::<Result<_>>()?;
        let bytes: usize = data.iter().map(|(_, d)| d.len()).sum();
        let mb = bytes as f64 / 1e6;

        let (t_events, events) = best_of(7, || {
            data.iter().map(|(f, d)| condense_formats::import_bytes(&f.display().to_string(), d).map_or(0, |i| i.events.len())).sum::<usize>()
        });
        let t_write = timed_writes(&scratch.join(format!("write-{fmt}")), &files)?;
        let bytes: Vec<&[u8]> = data.iter().map(|(_, d)| d.as_slice()).collect();
        let (t_bare, t_store, ratio) = paired_import(7, &scratch.join(format!("import-{fmt}")), &files, &bytes)?;
        let tp = |t: Duration| mb / t.as_secs_f64();
        writeln!(md, "| {fmt} | {} | {mb:.1} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {ratio:.2} |", files.len(), tp(t_bare), tp(t_events),
            tp(t_events) / tp(t_bare), events as f64 / t_events.as_secs_f64(), tp(t_write), tp(t_store))?;
        println!("import {fmt}: {mb:.1} MB, bare {:.0} MB/s, events {:.0} MB/s, write alone {:.0} MB/s, store {:.0} MB/s, ratio {ratio:.2}", tp(t_bare), tp(t_events), tp(t_write), tp(t_store));
    }
    Ok(())
}

fn corpus_render(md: &mut String, scratch: &Path) -> Result<()> {
    writeln!(md, "\n## Full render per corpus session (warm store)\n")?;
    let dir = scratch.join("render-corpus");
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir)?;
    let mut rows = Vec::new();
    for fmt in ["pi", "claude-code", "codex"] {
        let mut files = Vec::new();
        walk(&corpus().join(fmt), &mut files);
        for f in files {
            let name = f.strip_prefix(corpus()).unwrap_or(&f).display().to_string();
            let size = std::fs::metadata(&f)?.len();
            store.import_file(&f, &name)?;
            let s = store.session(&name)?;
            let _ = s.render()?;
            let proj = s.projection()?;
            let times: Vec<Duration> = (0..25).map(|_| {
                let t = Instant::now();
                let r = proj.render_full_now();
                std::hint::black_box(r);
                t.elapsed()
            }).collect();
            let (t_rebuild, _) = best_of(3, || s.projection_at(s.head().expect("head")).expect("fold"));
            rows.push((name, size, s.head()?, median(times.clone()), percentile(times, 0.99), t_rebuild));
        }
    }
    writeln!(md, "{} sessions. Render median over 25 runs per session; the slowest is {:.3} ms.\n", rows.len(),
        rows.iter().map(|r| ms(r.3)).fold(0.0, f64::max))?;
    writeln!(md, "| session | MB | events | full render median ms | full render p99 ms | full rebuild ms |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|")?;
    rows.sort_by(|a, b| b.1.cmp(&a.1));
    for (name, size, events, med, p99, rebuild) in &rows {
        writeln!(md, "| {name} | {:.2} | {events} | {:.3} | {:.3} | {:.2} |", *size as f64 / 1e6, ms(*med), ms(*p99), ms(*rebuild))?;
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Replays `events` into a session, timing before each request the pipeline, the checkpoint
/// controller's decision and the render. Returns (pipeline, render, controller) times.
fn timed_replay(
    session: &condense_engine::Session,
    events: Vec<condense_events::SourceEvent>,
) -> Result<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
    let (mut pipe, mut rend, mut ctl) = (Vec::new(), Vec::new(), Vec::new());
    for ev in events {
        let request = matches!(
            &ev,
            condense_events::SourceEvent::EntryAppended { entry: condense_events::Entry::Message(condense_events::Message::Assistant { .. }), .. }
        );
        if request {
            let t = Instant::now();
            session.prune_before_request()?;
            pipe.push(t.elapsed());
            let t = Instant::now();
            session.checkpoint_if_due()?;
            ctl.push(t.elapsed());
            let t = Instant::now();
            drop(session.render()?);
            rend.push(t.elapsed());
        }
        session.append(vec![ev])?;
    }
    Ok((pipe, rend, ctl))
}

/// A session of `store` holding all of `file` but its last 2,000 events, pruned once whole (timed), then
/// those events replayed live: the first prune's time and, per request, pipeline, render, controller and
/// `prepare` (the three in a row).
#[allow(clippy::type_complexity)]
fn live_tail(store: &Store, file: &Path) -> Result<(Duration, Vec<Duration>, Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
    let mut events = condense_formats::import_file(file)?.events;
    let tail = events.split_off(events.len() - 2_000);
    let s = store.create_session("gen-100k")?;
    s.append(events)?;
    let t = Instant::now();
    s.prune_now()?;
    let first = t.elapsed();
    let (pipe, rend, ctl) = timed_replay(&s, tail)?;
    let prepare = pipe.iter().zip(&rend).zip(&ctl).map(|((p, r), c)| *p + *r + *c).collect();
    Ok((first, pipe, rend, ctl, prepare))
}

fn pruning(md: &mut String, scratch: &Path, with_100k: bool) -> Result<()> {
    writeln!(md, "\n## Pruning: per-turn cost\n")?;
    writeln!(md, "Each corpus session replayed request by request with the default pipeline: before each assistant message the pipeline runs (capture, dedup, spill, summarize, purge, chains, cost guard) and the context is rendered. Largest sessions first.\n")?;
    writeln!(md, "The model's window is set to 200,000 tokens so the checkpoint controller runs too (its decision with no checkpoint due: estimate plus check).\n")?;
    writeln!(md, "| session | MB | requests | pipeline p50 ms | pipeline p99 ms | render p50 ms | render p99 ms | controller p50 ms | controller p99 ms | pipeline events/s |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let dir = scratch.join("pruning");
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir)?;
    let mut files = Vec::new();
    for fmt in ["pi", "claude-code", "codex"] {
        walk(&corpus().join(fmt), &mut files);
    }
    let mut sized: Vec<(u64, PathBuf)> = files.into_iter().map(|f| (std::fs::metadata(&f).map_or(0, |m| m.len()), f)).collect();
    sized.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (size, f) in sized.iter().take(6) {
        let name = f.strip_prefix(corpus()).unwrap_or(f).display().to_string();
        let imported = condense_formats::import_file(f)?;
        let n = imported.events.len();
        let s = store.create_session(&name)?;
        let events: Vec<_> = std::iter::once(condense_events::SourceEvent::ModelChanged {
            provider: None,
            model: "bench".into(),
            context_window: Some(200_000),
            max_output: None,
        })
        .chain(imported.events.into_iter().filter(|e| !matches!(e, condense_events::SourceEvent::ModelChanged { .. })))
        .collect();
        let (pipe, rend, ctl) = timed_replay(&s, events)?;
        let total: Duration = pipe.iter().sum();
        writeln!(md, "| {name} | {:.2} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |", *size as f64 / 1e6, pipe.len(),
            ms(median(pipe.clone())), ms(percentile(pipe, 0.99)), ms(median(rend.clone())), ms(percentile(rend, 0.99)),
            ms(median(ctl.clone())), ms(percentile(ctl, 0.99)), n as f64 / total.as_secs_f64().max(1e-9))?;
        println!("pruning {name}: done");
    }
    if with_100k {
        let file = scratch.join("pi-v3-100000.jsonl");
        let (first, pipe, rend, ctl, prepare) = live_tail(&store, &file)?;
        writeln!(md, "\nGenerated 100k-entry pi session: one pipeline run over the whole session (captures and prunes everything read) took {:.0} ms; then the last 2,000 events replayed live: pipeline p50 {:.1} ms, p99 {:.1} ms; render p50 {:.2} ms, p99 {:.2} ms; controller p50 {:.2} ms, p99 {:.2} ms; `prepare` (the three, per request) p50 {:.1} ms, p99 {:.1} ms ({} requests; the session names no model window, so the controller only finds no checkpoint due; target p99 < 5 ms).",
            ms(first), ms(median(pipe.clone())), ms(percentile(pipe, 0.99)), ms(median(rend.clone())), ms(percentile(rend.clone(), 0.99)),
            ms(median(ctl.clone())), ms(percentile(ctl, 0.99)), ms(median(prepare.clone())), ms(percentile(prepare, 0.99)), rend.len())?;
        // The same on a store that defers durability, as `condense serve` opens it (the client resends
        // what a crash would lose): `prepare` without waiting for the log's fsync, a spill's blob
        // included.
        let served = Store::open_with(dir.join("served"), condense_engine::StoreOptions { defer_durability: true, ..Default::default() })?;
        let (_, pipe, _, _, prepare) = live_tail(&served, &file)?;
        writeln!(md, "\nThe same on a store opened as `condense serve` opens it (`defer_durability`: appends return once written, before they are durable; the client resends what a crash would lose): `prepare` p50 {:.1} ms, p99 {:.1} ms; pipeline p99 {:.1} ms.",
            ms(median(prepare.clone())), ms(percentile(prepare, 0.99)), ms(percentile(pipe, 0.99)))?;
        println!("pruning 100k: durable and served");
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    quality(md, scratch)
}

/// Archive build, `history_search` and `history_read` on a 32 MiB archive made from the generated
/// 100k-entry session.
fn archive_bench(md: &mut String, scratch: &Path) -> Result<()> {
    let imported = condense_formats::import_file(&scratch.join("pi-v3-100000.jsonl"))?;
    let mut p = condense_render::Projection::new();
    for (i, e) in imported.events.into_iter().enumerate() {
        p.apply_owned(i as u64 + 1, condense_events::Event::Source(e));
    }
    let branch = p.branch_entries();
    // Take messages in order up to 32 MiB of text.
    let mut taken = Vec::new();
    let mut bytes = 0;
    for (id, m) in &branch {
        let b: usize = m.content().iter().map(|b| match b {
            condense_events::Block::Text { text } => text.len(),
            condense_events::Block::ToolCall(c) => c.name.len() + c.arguments.len() + 8,
            _ => 0,
        }).sum();
        if bytes + b > condense_recovery::MAX_SOURCE_BYTES {
            break;
        }
        bytes += b;
        taken.push((*id, &***m, None));
    }
    let t = Instant::now();
    let archive = condense_recovery::Archive::build("a1", taken.iter().map(|(i, m, r)| (*i, *m, *r)))?;
    let build = t.elapsed();
    let queries: [&[&str]; 6] = [
        &["error"],
        &["parser", "config", "timeout"],
        &["src", "main", "rs", "test", "fail", "panic", "retry", "cache"],
        &["nonexistentword"],
        &["session", "token", "budget", "window", "summary", "checkpoint", "render", "prune", "chain", "stub", "ref", "query", "tool", "output", "call", "result"],
        &["the"],
    ];
    let mut times = Vec::new();
    for _ in 0..20 {
        for q in queries {
            let t = Instant::now();
            std::hint::black_box(archive.search(q, 20)?);
            times.push(t.elapsed());
        }
    }
    let ids: Vec<String> = archive.records().iter().step_by(97).map(|r| r.id.clone()).collect();
    let mut reads = Vec::new();
    for id in &ids {
        let t = Instant::now();
        std::hint::black_box(archive.read(id, 0)?);
        reads.push(t.elapsed());
    }
    writeln!(md, "\n## Recovery archive (seed 004)\n")?;
    writeln!(md, "An archive of {:.1} MiB ({} records) from the generated 100k-entry session: built and indexed in {:.0} ms. `history_search` over it, 6 queries of 1 to 16 keywords × 20 runs: p50 {:.2} ms, p99 {:.2} ms (target < 20 ms). `history_read` of a first page, {} entries: p50 {:.4} ms, p99 {:.4} ms (target < 1 ms).",
        archive.bytes() as f64 / (1 << 20) as f64, archive.records().len(), ms(build), ms(median(times.clone())), ms(percentile(times, 0.99)),
        reads.len(), ms(median(reads.clone())), ms(percentile(reads, 0.99)))?;
    Ok(())
}

/// The file with the section that `section` starts (its `## ` heading) replaced by it, or inserted before
/// the serve section, else before the reference figures, else at the end.
fn splice(old: &str, section: &str) -> String {
    let section = section.trim_start_matches('\n');
    let heading = section.lines().next().unwrap_or_default();
    match old.find(&format!("\n{heading}\n")).map(|i| i + 1) {
        Some(s) => {
            let end = old[s + 3..].find("\n## ").map_or(old.len(), |e| s + 3 + e + 1);
            format!("{}{}\n\n{}", &old[..s], section.trim_end(), old[end..].trim_start_matches('\n'))
        }
        None => match ["\n## condense serve\n", "\n## Reference figures"].iter().find_map(|h| old.find(h)) {
            Some(i) => format!("{}\n{}\n{}", &old[..i], section.trim_end(), &old[i..]),
            None => format!("{old}\n{section}"),
        },
    }
}

/// `condense simulate` of the generated sessions, timed as the command runs it (read the file, replay it
/// into a store held in memory), beside pi-condense's replay of the same sessions (PEERS.md).
fn simulate_bench(md: &mut String, scratch: &Path, sizes: &[u64]) -> Result<()> {
    let bin = release_binary()?;
    writeln!(md, "\n## `condense simulate` of the generated sessions\n")?;
    writeln!(md, "The release `condense simulate target/bench-scratch/pi-v3-N.jsonl --json` with the defaults (and `--store` naming an empty folder, so no configuration is read), each run a fresh process timed from its start to its exit (the file read and parsed on a thread of its own while the replay into a store held in memory takes its events, retention measured on another, the figures); 7 runs at 1k and 10k, alternating, the best and the median of them; one run at 100k. The 10k session's file is 13.2× the 1k session's bytes. pi-condense: its own handlers replaying the same session (PEERS.md: 4.7 s and 148 s; not run at 100k).\n")?;
    writeln!(md, "| entries | requests | best s | median s | growth (best / median) | ms per MB of file (best) | peak RSS MiB | tokens % of raw | cost % of raw | cache breaks | retention | pi-condense seconds | pi-condense tokens / cost / breaks |")?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let peers = |n: u64| match n {
        1_000 => ("4.7", "9.1% / 14.5% / 31"),
        10_000 => ("148", "2.9% / 3.5% / 319"),
        _ => ("—", "—"),
    };
    let store = scratch.join("simulate-store");
    // One run of the command: its wall time, its peak RSS (the child's VmHWM) and its figures.
    let run = |file: &Path| -> Result<(Duration, f64, serde_json::Value)> {
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store)?;
        let t = Instant::now();
        let child = std::process::Command::new(&bin).arg("--store").arg(&store).arg("simulate").arg(file).arg("--json")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let (out, rss) = output_with_peak(child)?;
        let took = t.elapsed();
        if !out.status.success() {
            bail!("condense simulate {} failed: {}", file.display(), String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        Ok((took, rss, v["total"].clone()))
    };
    let files: Vec<(u64, PathBuf)> = sizes.iter().filter(|n| **n <= 100_000).map(|&n| Ok((n, generated_file(scratch, n)?))).collect::<Result<_>>()?;
    // The small sessions' runs alternate, so a slow spell of the machine falls on both sizes alike.
    let mut times: BTreeMap<u64, Vec<Duration>> = BTreeMap::new();
    let mut last: BTreeMap<u64, (f64, serde_json::Value)> = BTreeMap::new();
    for round in 0..7 {
        for (n, file) in &files {
            if *n >= 100_000 && round > 0 {
                continue;
            }
            let (t, rss, figures) = run(file)?;
            times.entry(*n).or_default().push(t);
            let peak = last.get(n).map_or(rss, |(r, _)| r.max(rss));
            last.insert(*n, (peak, figures));
        }
    }
    let _ = std::fs::remove_dir_all(&store);
    let mut previous: Option<(f64, f64)> = None;
    for (n, file) in &files {
        let ts = &times[n];
        let best = ts.iter().min().expect("at least one run").as_secs_f64();
        let med = median(ts.clone()).as_secs_f64();
        let (rss, f) = &last[n];
        let growth = previous.map_or("—".to_string(), |(b, m)| format!("{:.1}× / {:.1}×", best / b, med / m));
        previous = Some((best, med));
        let (ps, pf) = peers(*n);
        let mb = std::fs::metadata(file)?.len() as f64 / 1e6;
        let num = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        writeln!(md, "| {n} | {} | {best:.2} | {med:.2} | {growth} | {:.1} | {rss:.0} | {:.1} | {:.1} | {} | {:.3} | {ps} | {pf} |", f["turns"], best * 1e3 / mb, num("token_ratio") * 100.0, num("cost_ratio") * 100.0, f["cache_breaks"], num("retention"))?;
        println!("simulate {n}: best {best:.2} s, median {med:.2} s");
    }
    writeln!(md, "\nTargets (issue 10): 10k entries < 10 s, 100k < 2 min, growth from 1k to 10k ≤ 12×. Most of the work is per byte of the session (parsing, fact extraction, hashing, summaries), and the 10k file is 13.2× the 1k file's bytes (the entries 10×, the tool outputs' bytes 15×): the ms-per-MB column separates the files' growth from the cost per byte. Parsing and the retention scan run beside the replay, on the second core. A fresh process pays for first touching every page it allocates, which a process that ran the replay before does not: earlier runs of this table timed the replay inside the benchmark's own process, best of 7, and gave 0.66–0.85 s at 10k where the command takes 0.8–1.4 s.")?;
    Ok(())
}

/// Waits for `child` (stdout and stderr piped) and returns its output and its peak resident memory in
/// MiB: the VmHWM of its `/proc` status, read every 5 ms while it runs (a high-water mark, so the last read
/// before the process lets go of its memory holds the peak).
fn output_with_peak(mut child: std::process::Child) -> Result<(std::process::Output, f64)> {
    use std::io::Read as _;
    let pid = child.id();
    let mut stdout = child.stdout.take().context("stdout piped")?;
    let mut stderr = child.stderr.take().context("stderr piped")?;
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let mut peak: f64 = 0.0;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        peak = peak.max(status_kib(pid, "VmHWM:") / 1024.0);
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = out.join().map_err(|_| anyhow::anyhow!("reading stdout panicked"))?;
    let stderr = err.join().map_err(|_| anyhow::anyhow!("reading stderr panicked"))?;
    Ok((std::process::Output { status, stdout, stderr }, peak))
}

/// `condense simulate --switch`: every pi, Claude Code and Codex session of the corpus replayed with the
/// model moving to a smaller window part-way (seed 004).
fn switch_bench(md: &mut String, scratch: &Path) -> Result<()> {
    use condense_engine::simulate::{replay_with, Figures, Switch};
    writeln!(md, "\n## Smaller-model recovery: `simulate --switch` over the corpus\n")?;
    writeln!(md, "Every pi, Claude Code and Codex session of the corpus replayed with the defaults (`condense simulate ../shared/corpus/pi ../shared/corpus/claude-code ../shared/corpus/codex --switch WINDOW@REQUEST`): before request REQUEST the model moves to one with a WINDOW-token context; the payload guard and recovery run as they would live (sessions with fewer requests never switch). Over budget: requests whose rendered context was over the new hard budget; compaction failures include blocked recoveries.\n")?;
    writeln!(md, "| switch | sessions | requests | recoveries | blocked | archives | over budget | compaction failures | validity errors | refs exact | tokens | cost | why blocked |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let mut files = Vec::new();
    for fmt in ["pi", "claude-code", "codex"] {
        walk(&corpus().join(fmt), &mut files);
    }
    for sw in [Switch { window: 32_000, at: 50 }, Switch { window: 32_000, at: 200 }, Switch { window: 16_000, at: 50 }, Switch { window: 8_192, at: 20 }] {
        let dir = scratch.join("switch");
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir)?;
        let (mut total, mut sessions) = (Figures::default(), 0);
        for f in &files {
            let Ok(imported) = condense_formats::import_file(f) else { continue };
            let name = f.strip_prefix(corpus()).unwrap_or(f).display().to_string();
            total.add(&replay_with(&store, &name, imported.events, Default::default(), Default::default(), None, Some(sw))?);
            sessions += 1;
        }
        writeln!(md, "| {}@{} | {sessions} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {:.1}% | {:.1}% | {} |", sw.window, sw.at, total.turns, total.recoveries,
            total.recoveries_blocked, total.archives, total.over_budget_requests, total.compaction_failures, total.validity_errors,
            total.refs_recovered_exact, total.refs_checked, total.token_ratio() * 100.0, total.cost_ratio() * 100.0, total.blocked_reasons.join("; "))?;
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// pi-condense on the corpus pi sessions (PEERS.md): tokens %, cost %, cache breaks, and its retention
/// (issue 34's table, where it was measured).
const PEERS: [(&str, f64, f64, u64, Option<f64>); 6] = [
    ("badlogic__pi-mono/before-compaction", 35.9, 51.2, 32, Some(0.852)),
    ("badlogic__pi-mono/large-session", 25.4, 35.4, 67, Some(0.920)),
    ("badlogic__pi-mono/session.jsonl", 13.8, 27.1, 30, Some(0.911)),
    ("01-youtube", 39.8, 58.9, 14, Some(0.987)),
    ("02-inline", 77.1, 95.7, 4, None),
    ("03-raddit", 45.2, 71.6, 17, Some(0.956)),
];

/// The median of ratios (the mean of the middle two for an even count; 0 when empty).
fn median_ratio(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 { 0.0 } else if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Every pi, Claude Code and Codex session of the corpus replayed under `config` into a scratch store:
/// each session's name (its path in the corpus) and figures.
fn replay_corpus(scratch: &Path, config: &condense_events::PruneConfig) -> Result<Vec<(String, condense_engine::simulate::Figures)>> {
    let dir = scratch.join("quality");
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir)?;
    let mut files = Vec::new();
    for fmt in ["pi", "claude-code", "codex"] {
        walk(&corpus().join(fmt), &mut files);
    }
    let mut out = Vec::with_capacity(files.len());
    for f in &files {
        let name = f.strip_prefix(corpus()).unwrap_or(f).display().to_string();
        let imported = condense_formats::import_file(f)?;
        let fig = condense_engine::simulate::replay(&store, &name, imported.events, config.clone(), Default::default())?;
        out.push((name, fig));
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// The simulate figures over the corpus with the defaults.
fn quality(md: &mut String, scratch: &Path) -> Result<()> {
    writeln!(md, "\n## Pruning: quality over the corpus (defaults)\n")?;
    writeln!(md, "`condense simulate` with the defaults it ships, every pi, Claude Code and Codex session of the corpus. Ratios are rendered over raw input tokens summed over requests, and rendered over raw cost (0.1 per cached-prefix token, 1.25 per other input token). pi-condense 2.9.1 figures from `PEERS.md` where it was measured.\n")?;
    writeln!(md, "| session | tool calls | requests | raw peak | rendered peak | tokens | cost | cache breaks | retention | stubs | spills | dedups | chains | refs exact | validity errors | pi-condense tokens / cost / breaks |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let (mut tok, mut cost, mut all_cost, mut retention) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The corpus pi sessions with at least 100 tool calls (issue 10, item 2): cost ratios, and against
    // pi-condense: (fewer tokens, lower cost, no more breaks).
    let (mut pi_cost, mut beats) = (Vec::new(), Vec::new());
    let mut total = condense_engine::simulate::Figures::default();
    for (name, fig) in replay_corpus(scratch, &Default::default())? {
        let peer = PEERS.iter().find(|(k, ..)| name.contains(k));
        let peer_text = peer.map_or(String::new(), |(_, t, c, b, _)| format!("{t:.1}% / {c:.1}% / {b}"));
        writeln!(md, "| {name} | {} | {} | {} | {} | {:.1}% | {:.1}% | {} | {:.3} | {} | {} | {} | {} | {}/{} | {} | {peer_text} |", fig.tool_calls, fig.turns,
            fig.raw_tokens_peak, fig.rendered_tokens_peak, fig.token_ratio() * 100.0, fig.cost_ratio() * 100.0, fig.cache_breaks, fig.retention(), fig.stubs,
            fig.spills, fig.dedups, fig.chains, fig.refs_recovered_exact, fig.refs_checked, fig.validity_errors)?;
        if fig.tool_calls >= 100 {
            tok.push(fig.token_ratio());
            cost.push(fig.cost_ratio());
            if name.starts_with("pi/") {
                pi_cost.push(fig.cost_ratio());
                if let Some((_, t, c, b, _)) = peer {
                    beats.push((fig.token_ratio() * 100.0 < *t, fig.cost_ratio() * 100.0 < *c, fig.cache_breaks <= *b));
                }
            }
        }
        if fig.turns > 0 {
            all_cost.push(fig.cost_ratio());
        }
        if fig.facts_needed > 0 {
            retention.push(fig.retention());
        }
        total.add(&fig);
    }
    let n_big = tok.len();
    writeln!(md, "\nSessions with at least 100 tool calls: {n_big}; median tokens {:.2}% of raw (target ≤ 25%), median cost {:.2}% of raw (target ≤ 35%). Highest cost ratio of any session: {:.1}%. Retention {:.3} in total (issue 34 target: ≥ 0.90), median {:.3} (issue 10 target: ≥ 0.85). Refs recovered byte-exact: {}/{}; validity errors: {}.",
        median_ratio(tok) * 100.0, median_ratio(cost) * 100.0, all_cost.iter().copied().fold(0.0, f64::max) * 100.0, total.retention(), median_ratio(retention), total.refs_recovered_exact, total.refs_checked, total.validity_errors)?;
    let count = |pick: fn(&(bool, bool, bool)) -> bool| beats.iter().filter(|b| pick(b)).count();
    writeln!(md, "\nThe {} corpus pi sessions with at least 100 tool calls (issue 10, target 2): median cost {:.2}% of raw (target ≤ 22%); against pi-condense, fewer tokens on {}, lower cost on {}, no more cache breaks on {} of {}.",
        pi_cost.len(), median_ratio(pi_cost) * 100.0, count(|b| b.0), count(|b| b.1), count(|b| b.2), beats.len())?;
    live_reads_pass(md, scratch)
}

/// The same sessions with live reads off and with larger `liveReadsTokens` than the defaults' 12,000 and
/// 8 turns (for as long as a read is live, then at most 12 turns): what keeping the agent's own files
/// read back buys, against pi-condense's retention on the corpus pi sessions (issue 34's table).
fn live_reads_pass(md: &mut String, scratch: &Path) -> Result<()> {
    for (tokens, turns) in [(0, 0), (20_000, 0), (20_000, 12)] {
        let config = condense_events::PruneConfig { live_reads_tokens: tokens, live_reads_turns: turns, ..Default::default() };
        let (mut cost, mut pi_cost, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        let mut total = condense_engine::simulate::Figures::default();
        for (name, fig) in replay_corpus(scratch, &config)? {
            if fig.tool_calls >= 100 {
                cost.push(fig.cost_ratio());
                if name.starts_with("pi/") {
                    pi_cost.push(fig.cost_ratio());
                }
            }
            if let Some(peer) = PEERS.iter().find(|(k, ..)| name.contains(k)).and_then(|p| p.4) {
                rows.push(format!("{name}: {:.3} (pi-condense {peer:.3}), cost {:.1}%", fig.retention(), fig.cost_ratio() * 100.0));
            }
            total.add(&fig);
        }
        let setting = match (tokens, turns) {
            (0, _) => "live reads off, `liveReadsTokens` 0".to_string(),
            (t, 0) => format!("`liveReadsTokens` {t} and no turn limit"),
            (t, n) => format!("`liveReadsTokens` {t}, `liveReadsTurns` {n}"),
        };
        writeln!(md, "\nWith {setting} (the defaults keep the agent's own files read back, 12,000 tokens for 8 turns; docs/pruning.md, \"Reading back its own files\"): retention {:.3} in total; median cost {:.2}% of raw for the sessions with at least 100 tool calls, {:.2}% for the pi ones; {} cache breaks. The pi sessions' retention: {}.",
            total.retention(), median_ratio(cost) * 100.0, median_ratio(pi_cost) * 100.0, total.cache_breaks, rows.join("; "))?;
    }
    Ok(())
}

/// The generated pi session of `n` entries (`gen_pi_session.py --seed 1`), made once in `scratch`.
pub(crate) fn generated_file(scratch: &Path, n: u64) -> Result<PathBuf> {
    let file = scratch.join(format!("pi-v3-{n}.jsonl"));
    if !file.exists() {
        println!("generating {n} entries…");
        let generator = root().join("../shared/tools/gen_pi_session.py");
        let st = std::process::Command::new("python3")
            .arg(&generator).args(["--entries", &n.to_string(), "--seed", "1", "--out"]).arg(&file)
            .status().context("running python3 gen_pi_session.py")?;
        if !st.success() {
            bail!("gen_pi_session.py failed for {n} entries");
        }
    }
    Ok(file)
}

fn generated(md: &mut String, scratch: &Path, sizes: &[u64]) -> Result<()> {
    writeln!(md, "\n## Generated pi sessions of growing size\n")?;
    writeln!(md, "`../shared/tools/gen_pi_session.py --entries N --seed 1` (v3), generated into `target/bench-scratch`.\n")?;
    writeln!(md, "| entries | MB | bare parse ms | import into store ms | import MB/s | events | full rebuild ms | full render median ms | per-turn render median ms | per-turn p99 ms | rendered messages | import peak RSS MiB | peak RSS MiB |")?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for &n in sizes {
        let file = generated_file(scratch, n)?;
        let size = std::fs::metadata(&file)?.len();
        let t_bare = {
            let bytes = std::fs::read(&file)?;
            let t = Instant::now();
            std::hint::black_box(bare_parse(&bytes));
            t.elapsed()
        };
        let dir = scratch.join(format!("store-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        // The import's own peak memory, in a process of its own (this one holds the earlier sizes).
        let out = std::process::Command::new(std::env::current_exe()?).arg("import-peak").arg(&file).arg(&dir).output()?;
        if !out.status.success() {
            bail!("import-peak failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let import_peak: f64 = String::from_utf8_lossy(&out.stdout).split_whitespace().next().and_then(|v| v.parse().ok()).context("import-peak output")?;
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir)?;
        let t = Instant::now();
        let o = store.import_file(&file, "gen")?;
        let t_import = t.elapsed();
        let s = store.session("gen")?;
        let head = s.head()?;
        let t = Instant::now();
        let fresh = s.projection_at(head)?;
        let t_rebuild = t.elapsed();
        drop(fresh);
        let reps = if n >= 1_000_000 { 5 } else { 21 };
        let mut msgs = 0;
        let warm = s.projection()?;
        let times: Vec<Duration> = (0..reps).map(|_| {
            let t = Instant::now();
            let r = warm.render_full_now();
            msgs = r.messages.len();
            t.elapsed()
        }).collect();
        // Per turn: fold all but the last 200 events, render, then apply each remaining event and render
        // after it, as a host does before each request.
        let tail = 200.min(head - 1);
        let mut live = s.projection_at(head - tail)?;
        drop(live.render());
        let events = store.log().read(s.id(), head - tail + 1, head)?;
        let turns: Vec<Duration> = events.iter().map(|env| {
            let t = Instant::now();
            live.apply(env.seq, &env.body);
            drop(live.render());
            t.elapsed()
        }).collect();
        drop(warm);
        let peak = peak_mib();
        writeln!(md, "| {n} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {:.0} | {:.2} | {:.4} | {:.4} | {msgs} | {import_peak:.0} | {peak:.0} |", size as f64 / 1e6, ms(t_bare), ms(t_import),
            size as f64 / 1e6 / t_import.as_secs_f64(), o.events, ms(t_rebuild), ms(median(times)), ms(median(turns.clone())), ms(percentile(turns, 0.99)))?;
        println!("{n}: import {:.0} ms, rebuild {:.0} ms", ms(t_import), ms(t_rebuild));
        drop(s);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
