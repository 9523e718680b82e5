//! `cargo xtask soak`: conversations through the release `condense serve` for a while, with crashes: on
//! sled, `kill -9` of serve and a restart on the same store; on PostgreSQL, `pg_ctl stop -m immediate` of
//! the database and a start, serve running on. Each conversation is a client thread resending its whole
//! history (about 200 messages to begin with) plus one prompt per request, paced so that all together
//! send about the rate asked for. A reply the client got is an *acknowledged turn*; after the run the
//! store is read and every acknowledged turn must be in its session, prompt and reply. Reports turns,
//! errors, serve's own latency (its `/condense/status` figures over its last 100 requests, sampled every
//! 5 s: the median sample and the worst), the client's, peak RSS and acknowledged turns lost.

use crate::serve::spawn_serve;
use crate::{percentile, release_binary, status_kib};
use anyhow::{bail, Context, Result};
use condense_serve::fake::Fake;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the soak is asked to do.
#[derive(Clone)]
pub struct Plan {
    /// `sled` or `postgres`.
    pub backend: String,
    pub conversations: usize,
    pub seconds: u64,
    /// Requests per second, all conversations together.
    pub rate: f64,
    /// Crash rounds, spread over the run.
    pub crashes: u32,
}

/// What one soak saw.
#[derive(Debug, Default)]
pub struct Report {
    pub turns: u64,
    pub errors: u64,
    pub own_p50_ms: f64,
    pub own_p99_ms: f64,
    pub own_p99_worst_ms: f64,
    pub client_p50_ms: f64,
    pub client_p99_ms: f64,
    pub peak_rss_mib: f64,
    pub acknowledged: u64,
    pub lost: u64,
    pub crashes: u32,
    /// serve's own time by phase in the last sample (p50/p99 ms).
    pub phases: String,
}

fn parse_args(args: &[String]) -> Result<Plan> {
    let mut plan = Plan { backend: "sled".into(), conversations: 50, seconds: 60, rate: 100.0, crashes: 3 };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--backend" => plan.backend = value()?.clone(),
            "--conversations" => plan.conversations = value()?.parse()?,
            "--seconds" => plan.seconds = value()?.parse()?,
            "--rate" => plan.rate = value()?.parse()?,
            "--crashes" => plan.crashes = value()?.parse()?,
            other => bail!("unknown flag {other}; usage: cargo xtask soak [--backend sled|postgres|both] [--conversations N] [--seconds T] [--rate R] [--crashes K]"),
        }
    }
    Ok(plan)
}

/// A coding-agent history of about `n` messages (a prompt, `bash` calls with ~1 KB outputs, replies).
fn history(n: usize, seed: usize) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": "You are a coding agent. Use the bash tool."})];
    let mut k = 0;
    while out.len() < n {
        out.push(json!({"role": "user", "content": format!("Task {k} of conversation {seed}: fix the failing test in module {k}.")}));
        for c in 0..3 {
            let id = format!("call_{seed}_{k}_{c}");
            out.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash", "arguments": format!("{{\"command\":\"ls -l src/m{k}_{c}\"}}")}}]}));
            let body: String = (0..16).map(|l| format!("-rw-r--r-- 1 dev dev {:>6} Nov 30 12:{:02} src/m{k}_{c}/file_{l}_{seed}.rs\n", 1000 + l * 37 + k, l)).collect();
            out.push(json!({"role": "tool", "tool_call_id": id, "content": body}));
        }
        out.push(json!({"role": "assistant", "content": format!("Module {k} passes now.")}));
        k += 1;
    }
    out
}

/// Runs the soak on one backend.
pub fn run(plan: &Plan, scratch: &Path) -> Result<Report> {
    let bin = release_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let fake = rt.block_on(Fake::start(Vec::new()));
    let cluster = (plan.backend == "postgres").then(condense_log::testing::Cluster::start);
    let store = match &cluster {
        Some(c) => c.database(),
        None => {
            let dir = scratch.join("soak-store");
            let _ = std::fs::remove_dir_all(&dir);
            dir.to_string_lossy().into_owned()
        }
    };
    let (child, addr) = spawn_serve(&bin, &store, &fake, &[])?;
    let pid = Arc::new(AtomicU64::new(u64::from(child.id())));
    let child = Arc::new(Mutex::new(child));
    let addr = Arc::new(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::<Duration>::new()));
    // Per conversation: the prompts whose reply the client got.
    let acked: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(vec![Vec::new(); plan.conversations]));
    let interval = Duration::from_secs_f64(plan.conversations as f64 / plan.rate);
    let mut clients = Vec::new();
    let (start, n) = (Instant::now(), plan.conversations as f64);
    for c in 0..plan.conversations {
        let (addr, stop, errors, latencies, acked) = (addr.clone(), stop.clone(), errors.clone(), latencies.clone(), acked.clone());
        clients.push(std::thread::spawn(move || {
            let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().expect("HTTP client");
            let mut messages = history(200, c);
            let mut turn = 0;
            // Spread the conversations over the interval, each at a phase of its own that it keeps: a
            // conversation sends on its own beat, skipping the beats a slow or failed request missed, so
            // that an outage does not leave every conversation sending at the same instant afterwards
            // (agents retry at times of their own too).
            let phase = start + interval.mul_f64(c as f64 / n);
            std::thread::sleep(phase.saturating_duration_since(Instant::now()));
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let prompt = format!("soak {c} turn {turn}: run the tests again");
                messages.push(json!({"role": "user", "content": prompt}));
                let body = json!({"model": "gpt-4o", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}).to_string();
                let sent = http.post(format!("http://{addr}/v1/chat/completions")).header("authorization", "Bearer soak").header("x-condense-session", format!("soak-{c}")).header("content-type", "application/json").body(body).send();
                let reply = match sent {
                    Ok(r) if r.status().is_success() => r.bytes().ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).map(|v| v["choices"][0]["message"].clone()).filter(|m| m.is_object()),
                    Ok(r) => {
                        let status = r.status();
                        eprintln!("conversation {c} turn {turn}: {status} {}", r.text().unwrap_or_default().chars().take(300).collect::<String>());
                        None
                    }
                    Err(e) => {
                        eprintln!("conversation {c} turn {turn}: {e}");
                        None
                    }
                };
                match reply {
                    Some(m) => {
                        latencies.lock().expect("latencies").push(started.elapsed());
                        acked.lock().expect("acked")[c].push(prompt);
                        messages.push(m);
                        turn += 1;
                    }
                    None => {
                        // A failed request: the client drops its prompt and tries again, as agents retry.
                        errors.fetch_add(1, Ordering::SeqCst);
                        messages.pop();
                    }
                }
                let beats = (phase.elapsed().as_secs_f64() / interval.as_secs_f64()).floor() + 1.0;
                std::thread::sleep((phase + interval.mul_f64(beats)).saturating_duration_since(Instant::now()));
            }
        }));
    }
    // The serve process's status, sampled, and the crash rounds.
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let t0 = Instant::now();
    let total = Duration::from_secs(plan.seconds);
    let crash_at: Vec<Duration> = (1..=plan.crashes).map(|k| total.mul_f64(k as f64 / (plan.crashes as f64 + 1.0))).collect();
    let mut crashes = 0;
    let mut own50 = Vec::new();
    let mut own99: Vec<f64> = Vec::new();
    let mut peak: f64 = 0.0;
    let mut next_sample = Duration::from_secs(5);
    let mut phases = String::new();
    while t0.elapsed() < total {
        std::thread::sleep(Duration::from_millis(200));
        peak = peak.max(status_kib(pid.load(Ordering::SeqCst), "VmHWM:") / 1024.0);
        if t0.elapsed() >= next_sample {
            next_sample += Duration::from_secs(5);
            if let Some(v) = http.get(format!("http://{addr}/condense/status")).send().and_then(|r| r.bytes()).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
                own50.push(v["latency_ms"]["p50"].as_f64().unwrap_or(0.0));
                own99.push(v["latency_ms"]["p99"].as_f64().unwrap_or(0.0));
                if std::env::var_os("SOAK_VERBOSE").is_some() {
                    eprintln!("{:>5.1} s: p50 {} p99 {} record p50 {}", t0.elapsed().as_secs_f64(), v["latency_ms"]["p50"], v["latency_ms"]["p99"], v["latency_ms"]["phases"]["record"]["p50"]);
                }
                let ph = &v["latency_ms"]["phases"];
                phases = ["parse", "wait", "record", "build", "body"]
                    .iter()
                    .map(|p| format!("{p} {:.1}/{:.1}", ph[p]["p50"].as_f64().unwrap_or(0.0), ph[p]["p99"].as_f64().unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(", ");
            }
        }
        if crash_at.get(crashes as usize).is_some_and(|&at| t0.elapsed() >= at) {
            crashes += 1;
            match &cluster {
                Some(c) => {
                    c.down("immediate");
                    c.up();
                }
                None => {
                    let mut ch = child.lock().expect("child");
                    let _ = ch.kill();
                    let _ = ch.wait();
                    // The same address, so the clients find it again.
                    let (fresh, _) = spawn_serve(&bin, &store, &fake, &["--listen", addr.as_str()])?;
                    pid.store(u64::from(fresh.id()), Ordering::SeqCst);
                    *ch = fresh;
                }
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    {
        let mut ch = child.lock().expect("child");
        let _ = ch.kill();
        let _ = ch.wait();
    }
    // Every acknowledged turn in its session: the prompt, and a reply after it.
    let st = condense_engine::Store::open(&store)?;
    let acked = acked.lock().expect("acked").clone();
    let (mut acknowledged, mut lost) = (0, 0);
    // Each session is a conversation's: its first prompt names it ("Task 0 of conversation C: …").
    let mut texts_of: Vec<Option<Vec<(bool, String)>>> = vec![None; acked.len()];
    for info in st.sessions()? {
        let p = st.session(&info.name)?.projection()?;
        let texts: Vec<(bool, String)> = p.branch_messages().iter().map(|m| (matches!(**m, condense_events::Message::Assistant { .. }), m.text())).collect();
        let c = texts.iter().find(|(a, t)| !a && t.starts_with("Task 0 of conversation ")).and_then(|(_, t)| t["Task 0 of conversation ".len()..].split(':').next()?.parse::<usize>().ok());
        if let Some(c) = c.filter(|&c| c < texts_of.len()) {
            if texts_of[c].is_some() {
                eprintln!("conversation {c} has more than one session: {}", info.name);
            }
            texts_of[c] = Some(texts);
        }
    }
    for (c, prompts) in acked.iter().enumerate() {
        acknowledged += prompts.len() as u64;
        let Some(texts) = &texts_of[c] else {
            for info in st.sessions()?.iter().filter(|i| i.name.contains(&format!("conversation-{c}-"))) {
                let p = st.session(&info.name)?.projection()?;
                let b = p.branch_messages();
                let texts: Vec<String> = b.iter().take(4).map(|m| format!("{:?}", m).chars().take(150).collect()).collect();
                let tree_roots = p.tree().filter(|(_, parent, _)| parent.is_none()).count();
                eprintln!("conversation {c}: {} head {}: branch of {} messages, {tree_roots} roots, starting {texts:?}", info.name, info.head, b.len());
            }
            lost += prompts.len() as u64;
            continue;
        };
        for prompt in prompts {
            let at = texts.iter().position(|(a, t)| !a && t == prompt);
            if !at.is_some_and(|i| texts[i + 1..].iter().any(|(a, _)| *a)) {
                if lost < 5 {
                    eprintln!("lost: `{prompt}` (found: {})", at.is_some());
                }
                lost += 1;
            }
        }
    }
    let lat = latencies.lock().expect("latencies").clone();
    let turns = lat.len() as u64;
    own50.sort_by(f64::total_cmp);
    own99.sort_by(f64::total_cmp);
    Ok(Report {
        turns,
        errors: errors.load(Ordering::SeqCst),
        own_p50_ms: own50.get(own50.len() / 2).copied().unwrap_or(0.0),
        own_p99_ms: own99.get(own99.len() / 2).copied().unwrap_or(0.0),
        own_p99_worst_ms: own99.last().copied().unwrap_or(0.0),
        client_p50_ms: crate::ms(percentile(lat.clone(), 0.5)),
        client_p99_ms: crate::ms(percentile(lat, 0.99)),
        peak_rss_mib: peak,
        acknowledged,
        lost,
        crashes,
        phases,
    })
}

/// `cargo xtask soak ARGS`: runs the plan on the backend(s) asked for and prints the figures.
pub fn soak(args: &[String]) -> Result<()> {
    let plan = parse_args(args)?;
    let scratch = crate::root().join("target/bench-scratch");
    std::fs::create_dir_all(&scratch)?;
    let backends: Vec<&str> = if plan.backend == "both" { vec!["sled", "postgres"] } else { vec![plan.backend.as_str()] };
    println!("| backend | conversations | seconds | crashes | turns | turns/s | errors | serve's own p50 | serve's own p99 | worst p99 | client p50 | client p99 | peak RSS | acknowledged | lost |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for b in backends {
        let p = Plan { backend: b.to_string(), ..plan.clone() };
        let r = run(&p, &scratch)?;
        println!(
            "| {b} | {} | {} | {} | {} | {:.0} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {:.1} ms | {:.0} MiB | {} | {} |",
            p.conversations, p.seconds, r.crashes, r.turns, r.turns as f64 / p.seconds as f64, r.errors, r.own_p50_ms, r.own_p99_ms, r.own_p99_worst_ms, r.client_p50_ms, r.client_p99_ms, r.peak_rss_mib, r.acknowledged, r.lost
        );
        eprintln!("{b}: serve's own time by phase in the last sample (p50/p99 ms): {}", r.phases);
    }
    Ok(())
}
