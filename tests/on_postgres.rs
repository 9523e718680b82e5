//! The determinism and replay suites once more, on the PostgreSQL backend: every store they open is a
//! database of a throwaway cluster (see `condense_tests::open_store`), and their snapshots are the same
//! files the sled run checks.

#[path = "checkpoints.rs"]
mod checkpoints;
#[path = "corpus.rs"]
mod corpus;
#[path = "recovery.rs"]
mod recovery;

#[test]
fn this_binary_runs_on_postgres() {
    assert!(condense_tests::on_postgres());
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    assert!(store.log().describe().starts_with("PostgreSQL store postgres://"), "{}", store.log().describe());
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing was written to the folder");
}

use condense_engine::{EngineError, Store};
use condense_events::{Entry, Message, SourceEvent, UserOrigin};
use condense_log::LogError;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const APPENDS: usize = 300;

/// The child half of the two-writer test: appends `APPENDS` user messages to the session `shared`, each
/// under the leaf it last saw, retrying when the other process moved the head first; prints `ack ID HEAD`
/// for each acknowledged one. Once the session holds both writers' messages it prints the hash of its
/// render.
#[test]
#[ignore = "run by two_processes_append_to_one_session_exactly_once as a child process"]
fn concurrent_writer_child() {
    let (Ok(url), Ok(worker)) = (std::env::var("CONDENSE_PG_URL"), std::env::var("CONDENSE_PG_WORKER")) else { return };
    let store = Store::open(&url).unwrap();
    let session = store.session("shared").unwrap();
    let mut rng = worker.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3));
    for i in 0..APPENDS {
        let id = format!("{worker}-{i}");
        loop {
            let parent = session.with_projection(|p| p.leaf_id().map(str::to_string)).unwrap();
            let m = Message::user_text(&format!("message {i} of writer {worker}"), UserOrigin::Prompt);
            match session.append(vec![SourceEvent::EntryAppended { id: id.clone(), parent, entry: Entry::Message(m) }]) {
                Ok(head) => {
                    println!("ack {id} {head}");
                    break;
                }
                Err(EngineError::Log(LogError::HeadMismatch { .. })) => continue,
                Err(e) => panic!("{e}"),
            }
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng % 4 == 0 {
            std::thread::sleep(std::time::Duration::from_micros(rng % 2000));
        }
    }
    while session.head().unwrap() < 2 * APPENDS as u64 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = session.render().unwrap();
    let bytes = serde_json::to_vec(&condense_formats::export::neutral(&r.messages)).unwrap();
    println!("render {} {}", blake3::hash(&bytes).to_hex(), r.messages.len());
}

/// Two processes append to one session on one database at once, in a random interleaving: every
/// acknowledged event is stored exactly once and at the head it was acknowledged at, the seqs run without
/// a gap, and both processes render the same context (the same bytes as a fresh fold here).
#[test]
fn two_processes_append_to_one_session_exactly_once() {
    let url = condense_log::testing::Cluster::shared().database();
    let store = Store::open(&url).unwrap();
    let session = store.create_session("shared").unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|w| {
            Command::new(&exe)
                .args(["--exact", "concurrent_writer_child", "--ignored", "--nocapture", "--test-threads=1"])
                .env("CONDENSE_PG_URL", &url)
                .env("CONDENSE_PG_WORKER", w)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut acked = Vec::new();
    let mut renders = Vec::new();
    for mut child in children {
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            // (libtest's `test NAME ... ` starts the first line the child prints.)
            let line = line.unwrap();
            let line = ["ack ", "render "].iter().find_map(|k| line.find(k).map(|i| line[i..].to_string())).unwrap_or_default();
            let mut parts = line.split(' ');
            match parts.next() {
                Some("ack") => acked.push((parts.next().unwrap().to_string(), parts.next().unwrap().parse::<u64>().unwrap())),
                Some("render") => renders.push(line.clone()),
                _ => {}
            }
        }
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(session.head().unwrap(), 2 * APPENDS as u64);
    assert_eq!(acked.len(), 2 * APPENDS, "every append was acknowledged once: {:?}", {
        let mut ids: Vec<&String> = acked.iter().map(|(i, _)| i).collect();
        ids.sort();
        ids.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0].clone()).collect::<Vec<_>>()
    });
    store.log().verify().unwrap();
    let stored: Vec<String> = store
        .log()
        .read(session.id(), 1, 2 * APPENDS as u64)
        .unwrap()
        .into_iter()
        .map(|e| match e.body {
            condense_events::Event::Source(SourceEvent::EntryAppended { id, .. }) => id,
            other => panic!("{other:?}"),
        })
        .collect();
    for (id, head) in &acked {
        assert_eq!(&stored[*head as usize - 1], id, "{id} acknowledged at {head}");
    }
    let mut once = stored.clone();
    once.sort();
    once.dedup();
    assert_eq!(once.len(), stored.len(), "an event was stored twice");
    // The writers raced: neither wrote all of its messages in one run.
    let switches = stored.windows(2).filter(|w| w[0].as_bytes()[0] != w[1].as_bytes()[0]).count();
    assert!(switches > 10, "the writers took turns only {switches} times: no race was tested");
    assert_eq!(renders.len(), 2);
    let fresh = store.session("shared").unwrap().projection_at(2 * APPENDS as u64).unwrap().render();
    let bytes = serde_json::to_vec(&condense_formats::export::neutral(&fresh.messages)).unwrap();
    let here = format!("render {} {}", blake3::hash(&bytes).to_hex(), fresh.messages.len());
    assert_eq!(renders, [here.clone(), here], "the processes render different contexts");
}

/// Render equality after every event, through the database: corpus sessions appended to a PostgreSQL
/// store one event at a time render, after each, exactly what a fresh fold of the log up to that event
/// renders, and a second handle (another process's view) agrees at the end.
#[test]
fn render_after_every_event_equals_a_fresh_fold_of_the_database() {
    let url = condense_log::testing::Cluster::shared().database();
    let store = Store::open(&url).unwrap();
    let mut files = condense_tests::corpus_sessions();
    files.sort();
    // Two sessions of a few hundred events each (every event is a durable commit here).
    let picked: Vec<_> = files
        .iter()
        .map(|f| (f, condense_formats::import_file(f).unwrap().events))
        .filter(|(_, e)| (150..=600).contains(&e.len()))
        .take(2)
        .collect();
    assert_eq!(picked.len(), 2, "two corpus sessions of 150 to 600 events");
    let mut checked = 0;
    for (file, events) in picked {
        let name = condense_tests::corpus_name(file);
        let session = store.create_session(&name).unwrap();
        for e in events {
            let head = session.append(vec![e]).unwrap();
            let live = session.render().unwrap();
            let fresh = session.projection_at(head).unwrap().render_full_now();
            assert_eq!(*live.messages, *fresh.messages, "{name}: after event {head}");
            checked += 1;
        }
        let other = Store::open(&url).unwrap();
        let theirs = other.session(&name).unwrap().render().unwrap();
        assert_eq!(*theirs.messages, *session.render().unwrap().messages, "{name}: another handle renders differently");
    }
    assert!(checked > 100, "only {checked} events checked");
}
