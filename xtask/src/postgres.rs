//! The PostgreSQL backend beside sled, in the same run on the same machine: group-commit append
//! throughput, `prepare` latency on a warm 10k-entry session, and the catch-up of a cold one. The database
//! is a throwaway cluster on loopback (`condense_log::testing::Cluster`), with PostgreSQL's defaults
//! (`fsync` and `synchronous_commit` on).

use crate::{generated_file, median, ms, percentile};
use anyhow::Result;
use condense_engine::Store;
use condense_events::{Entry, Event, Message, SourceEvent};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writers appending at once (each to its own session), and events per append.
const WRITERS: usize = 8;
const CHUNK: usize = 64;

struct Figures {
    mb_per_s: f64,
    appends_per_s: f64,
    prepare_p50: Duration,
    prepare_p99: Duration,
    requests: usize,
    catch_up: Duration,
    events: u64,
}

/// The 10k session's events with a 200k window set first (so the checkpoint controller runs), split
/// where the last 400 begin.
fn session_events(scratch: &Path) -> Result<(Vec<SourceEvent>, Vec<SourceEvent>)> {
    let file = generated_file(scratch, 10_000)?;
    let imported = condense_formats::import_file(&file)?;
    let mut events: Vec<SourceEvent> = std::iter::once(SourceEvent::ModelChanged { provider: None, model: "bench".into(), context_window: Some(200_000), max_output: None })
        .chain(imported.events.into_iter().filter(|e| !matches!(e, SourceEvent::ModelChanged { .. })))
        .collect();
    let tail = events.split_off(events.len() - 400);
    Ok((events, tail))
}

fn measure(store_at: &str, events: &[SourceEvent], tail: &[SourceEvent], reopen: &dyn Fn() -> Result<Store>) -> Result<Figures> {
    let store = Store::open(store_at)?;
    // Append throughput: WRITERS sessions written at once, CHUNK events per durable append; the log's writer
    // commits whatever waits as one group.
    let encoded: Vec<Event> = events.iter().cloned().map(Event::Source).collect();
    let log = store.log().clone();
    let t = Instant::now();
    let (bytes, appends) = std::thread::scope(|s| -> Result<(u64, u64)> {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let log = log.clone();
                let encoded = &encoded;
                s.spawn(move || -> Result<(u64, u64)> {
                    let id = log.create_session(&format!("append-{w}"))?;
                    let (mut head, mut bytes, mut appends) = (0u64, 0u64, 0u64);
                    for chunk in encoded.chunks(CHUNK) {
                        let values: Vec<Vec<u8>> = chunk.iter().enumerate().map(|(i, e)| condense_log::encode_event(id, head + 1 + i as u64, e)).collect();
                        bytes += values.iter().map(|v| v.len() as u64).sum::<u64>();
                        head = log.append_encoded(id, head, values, true)?.recv()??;
                        appends += 1;
                    }
                    Ok((bytes, appends))
                })
            })
            .collect();
        let mut total = (0, 0);
        for h in handles {
            let (b, a) = h.join().expect("writer thread")?;
            total.0 += b;
            total.1 += a;
        }
        Ok(total)
    })?;
    let took = t.elapsed().as_secs_f64();
    drop(log);
    // prepare on a warm session: all but the last 400 events in, then the tail replayed live, `prepare`
    // timed before each assistant message.
    let s = store.create_session("warm")?;
    for chunk in events.chunks(4096) {
        s.append(chunk.to_vec())?;
    }
    drop(s.prepare()?);
    let mut prepares = Vec::new();
    for ev in tail {
        if matches!(ev, SourceEvent::EntryAppended { entry: Entry::Message(Message::Assistant { .. }), .. }) {
            let t = Instant::now();
            drop(s.prepare()?);
            prepares.push(t.elapsed());
        }
        s.append(vec![ev.clone()])?;
    }
    let head = s.head()?;
    drop(s);
    drop(store);
    // A cold session: another handle (another process, another server) folds it from the log and renders.
    let mut colds = Vec::new();
    for _ in 0..3 {
        let other = reopen()?;
        let s = other.session("warm")?;
        let t = Instant::now();
        drop(s.render()?);
        colds.push(t.elapsed());
    }
    Ok(Figures {
        mb_per_s: bytes as f64 / 1e6 / took,
        appends_per_s: appends as f64 / took,
        requests: prepares.len(),
        prepare_p50: median(prepares.clone()),
        prepare_p99: percentile(prepares, 0.99),
        catch_up: colds.into_iter().min().unwrap_or_default(),
        events: head,
    })
}

pub(crate) fn bench(md: &mut String, scratch: &Path) -> Result<()> {
    writeln!(md, "\n## PostgreSQL beside sled\n")?;
    writeln!(md, "The same work on both backends in the same run: a throwaway PostgreSQL cluster on loopback (the distribution's server, its defaults: `fsync` and `synchronous_commit` on) and a sled store in `target/bench-scratch`. The events are those of the generated 10k-entry pi session, with a 200,000-token window set first.\n")?;
    writeln!(md, "- *Append*: {WRITERS} writers at once, each appending the session's events to a session of its own, {CHUNK} events per durable append (the writer commits whatever waits as one group: one transaction on PostgreSQL, one batch and flush on sled); MB/s of encoded event bytes.")?;
    writeln!(md, "- *prepare*: the session minus its last 400 events in the store, then those replayed live with `Session::prepare` (pipeline, controller, render; on PostgreSQL each reads the head from the database first) timed before each assistant message.")?;
    writeln!(md, "- *Cold catch-up*: a second handle (as another process or server has) folds the whole session from the log and renders it; best of 3.\n")?;
    writeln!(md, "| backend | append MB/s | appends/s | prepare p50 ms | prepare p99 ms | requests | cold catch-up ms | events |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let (events, tail) = session_events(scratch)?;
    let dir = scratch.join("sled-vs-postgres");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.to_string_lossy().into_owned();
    let sled = measure(&dir_s, &events, &tail, &|| Ok(Store::open(&dir)?))?;
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = condense_log::testing::Cluster::start();
    let url = cluster.database();
    let pg = measure(&url, &events, &tail, &|| Ok(Store::open(&url)?))?;
    for (name, f) in [("sled (embedded)", &sled), ("PostgreSQL (loopback)", &pg)] {
        writeln!(md, "| {name} | {:.1} | {:.0} | {:.2} | {:.2} | {} | {:.0} | {} |", f.mb_per_s, f.appends_per_s, ms(f.prepare_p50), ms(f.prepare_p99), f.requests, ms(f.catch_up), f.events)?;
        println!("{name}: append {:.1} MB/s, prepare p99 {:.2} ms, cold catch-up {:.0} ms", f.mb_per_s, ms(f.prepare_p99), ms(f.catch_up));
    }
    writeln!(md, "\nTargets (issue 13): append ≥ 20 MB/s, `prepare` p99 < 10 ms at 10k entries, cold catch-up < 200 ms, on PostgreSQL.")?;
    Ok(())
}
