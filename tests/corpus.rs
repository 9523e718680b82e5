//! Every pi, Claude Code and Codex session of the corpus: it imports, its rendered shape matches the
//! snapshot, the context is provider-valid, and the render is identical live, after reopening the store,
//! and after an export/import round trip.

use condense_engine::Store;
use condense_render::check;
use condense_tests::{corpus_name, corpus_sessions, shape};

fn neutral_bytes(store: &Store, name: &str) -> Vec<u8> {
    let r = store.session(name).unwrap().render().unwrap();
    serde_json::to_vec(&condense_formats::export::neutral(&r.messages)).unwrap()
}

#[test]
fn corpus_renders_valid_stable_and_as_snapshotted() {
    let files = corpus_sessions();
    assert!(files.len() >= 50, "expected the corpus's pi, Claude Code and Codex sessions, found {}", files.len());
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path().join("a")).unwrap();
    let mut names = Vec::new();
    let mut failures = Vec::new();
    for file in &files {
        let name = corpus_name(file);
        store.import_file(file, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let rendered = store.session(&name).unwrap().render().unwrap();
        let violations = check(&rendered.messages);
        if !violations.is_empty() {
            failures.push(format!("{name}: {}", violations[0]));
        }
        let snap = name.replace(['/', '.'], "_");
        condense_tests::snapshot!(snap, shape(&rendered.messages));
        names.push(name);
    }
    assert!(failures.is_empty(), "invalid contexts:\n{}", failures.join("\n"));

    let live: Vec<Vec<u8>> = names.iter().map(|n| neutral_bytes(&store, n)).collect();
    let export = dir.path().join("store.export");
    store.log().export(&export).unwrap();
    drop(store);
    let reopened = condense_tests::open_store(dir.path().join("a")).unwrap();
    let other = condense_tests::open_store(dir.path().join("b")).unwrap();
    other.log().import(&export).unwrap();
    for (n, bytes) in names.iter().zip(&live) {
        assert_eq!(&neutral_bytes(&reopened, n), bytes, "{n}: reopened store renders differently");
        assert_eq!(&neutral_bytes(&other, n), bytes, "{n}: imported export renders differently");
    }
}

/// The render kept up to date event by event equals a render from scratch after every single event.
#[test]
fn incremental_render_equals_full_render_after_every_event() {
    for file in corpus_sessions() {
        let name = corpus_name(&file);
        let imported = condense_formats::import_file(&file).unwrap();
        let mut p = condense_render::Projection::new();
        for (i, e) in imported.events.into_iter().enumerate() {
            p.apply(i as u64 + 1, &condense_events::Event::Source(e));
            let kept = p.render();
            let full = p.render_full_now();
            assert_eq!(*kept.messages, *full.messages, "{name}: after event {}", i + 1);
            assert_eq!(kept.report, full.report, "{name}: report after event {}", i + 1);
        }
    }
}
