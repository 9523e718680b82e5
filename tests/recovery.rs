//! Seed 004 on the corpus: every pi, Claude Code and Codex session, run on a 200k window and then switched
//! to a 32k one, either recovers under the new budget or fails closed with a typed reason; no partial
//! checkpoint is ever stored. Plus a snapshot of the handoff request on one session.

use condense_engine::{EngineError, Store};
use condense_events::{PruneConfig, SourceEvent};
use condense_tests::{corpus_name, corpus_sessions, readable};

fn model(window: u64) -> SourceEvent {
    SourceEvent::ModelChanged { provider: None, model: format!("m{window}"), context_window: Some(window), max_output: None }
}

#[test]
fn every_corpus_session_switched_to_32k_recovers_or_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let budget = condense_checkpoint::Budget::new(32_000, None, condense_checkpoint::DEFAULT_RESERVE);
    let (mut recovered, mut guarded_off, mut blocked) = (0, 0, Vec::new());
    let mut snapshot = None;
    for file in corpus_sessions() {
        let name = corpus_name(&file);
        let imported = condense_formats::import_file(&file).unwrap();
        let s = store.create_session(&name).unwrap();
        s.configure(PruneConfig { enabled: false, ..PruneConfig::default() }).unwrap();
        s.append(vec![model(200_000)]).unwrap();
        s.append(imported.events.into_iter().filter(|e| !matches!(e, SourceEvent::ModelChanged { .. } | SourceEvent::ProviderUsage(_))).collect()).unwrap();
        s.append(vec![model(32_000)]).unwrap();
        let request = s.render().unwrap();
        let bytes = serde_json::to_vec(&condense_formats::export::openai(&request.messages[..])).unwrap().len() as u64;
        match s.guard_payload(bytes) {
            Ok(()) => {
                guarded_off += 1;
                continue;
            }
            Err(EngineError::ContextOverflow { .. }) => {}
            Err(e) => panic!("{name}: {e}"),
        }
        match s.prepare() {
            Ok(r) => {
                let tokens: u64 = r.messages.iter().map(|m| condense_tokens::estimate(m)).sum();
                assert!(tokens <= budget.hard, "{name}: recovered to {tokens} tokens, over {}", budget.hard);
                assert!(condense_render::check(&r.messages[..]).is_empty(), "{name}");
                let p = s.projection().unwrap();
                assert_eq!(p.index().archives.len(), 1, "{name}: the archive view is committed with the checkpoint");
                recovered += 1;
                if snapshot.is_none() && name.starts_with("pi/") {
                    snapshot = Some(format!("{name}\n{}--- handoff head ---\n{}", readable(&r.messages[..]), r.messages[0].text().chars().take(1200).collect::<String>()));
                }
            }
            Err(EngineError::CompactionFailed { code, reason, .. }) => {
                let p = s.projection().unwrap();
                assert!(p.index().checkpoints.is_empty(), "{name}: a failed recovery stores no checkpoint ({code}: {reason})");
                blocked.push(format!("{name}: {code}: {reason}"));
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert!(recovered > 0, "some sessions are large enough to need recovery");
    eprintln!("recovered {recovered}, under the limit already {guarded_off}, blocked {}:\n{}", blocked.len(), blocked.join("\n"));
    insta::assert_snapshot!(snapshot.expect("a pi session recovered"));
}

#[test]
fn recovery_off_or_small_windows_do_not_guard() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("x").unwrap();
    s.configure(PruneConfig { recover_large_context: false, ..PruneConfig::default() }).unwrap();
    s.append(vec![model(32_000)]).unwrap();
    assert!(s.guard_payload(10_000_000).is_ok(), "recoverLargeContext false: no guard");
    let t = store.create_session("y").unwrap();
    t.append(vec![model(4_096)]).unwrap();
    assert!(t.guard_payload(10_000_000).is_ok(), "windows below 8192 tokens are not certified");
    let u = store.create_session("z").unwrap();
    u.append(vec![model(32_000)]).unwrap();
    assert!(matches!(u.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
}

#[test]
fn the_tools_reply_on_a_recovered_corpus_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let file = condense_tests::corpus_dir().join("pi/badlogic__pi-mono/large-session.jsonl");
    let imported = condense_formats::import_file(&file).unwrap();
    let s = store.create_session("large").unwrap();
    s.configure(PruneConfig { enabled: false, ..PruneConfig::default() }).unwrap();
    s.append(vec![model(200_000)]).unwrap();
    s.append(imported.events.into_iter().filter(|e| !matches!(e, SourceEvent::ModelChanged { .. } | SourceEvent::ProviderUsage(_))).collect()).unwrap();
    s.append(vec![model(32_000)]).unwrap();
    let bytes = serde_json::to_vec(&condense_formats::export::openai(&s.render().unwrap().messages[..])).unwrap().len() as u64;
    assert!(matches!(s.guard_payload(bytes), Err(EngineError::ContextOverflow { .. })));
    s.prepare().unwrap();
    let mut out = String::new();
    for (tool, args) in [
        ("history_archives", "{}"),
        ("history_search", r#"{"keywords":["theme","selector"]}"#),
        ("history_search", r#"{"keywords":[]}"#),
        ("history_search", r#"{"keywords":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}"#),
        ("history_read", r#"{"id":"nope"}"#),
        ("history_read", r#"{}"#),
    ] {
        let a = s.history_tool(tool, args).unwrap();
        let shown: String = a.text.chars().take(700).collect();
        out.push_str(&format!("== {tool} {args} (error={})\n{shown}\n", a.is_error));
    }
    // Page an entry cited by a search to its end and past it, without naming the archive.
    let hits: serde_json::Value = serde_json::from_str(&s.history_tool("history_search", r#"{"keywords":["theme"]}"#).unwrap().text).unwrap();
    let id = hits["hits"][0]["id"].as_str().unwrap().to_string();
    let mut offset = 0u64;
    let mut pages = 0;
    loop {
        let a = s.history_tool("history_read", &format!("{{\"id\":\"{id}\",\"offset\":{offset}}}")).unwrap();
        assert!(!a.is_error, "{}", a.text);
        let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
        assert!(v["text"].as_str().unwrap().len() <= 2048);
        pages += 1;
        match v["nextOffset"].as_u64() {
            Some(n) => offset = n,
            None => {
                let past = s.history_tool("history_read", &format!("{{\"id\":\"{id}\",\"offset\":{}}}", v["length"].as_u64().unwrap() + 1)).unwrap();
                assert!(past.is_error && past.text.contains("past the end"));
                break;
            }
        }
    }
    out.push_str(&format!("== read {id}: {pages} page(s) to the end, then an error past it\n"));
    insta::assert_snapshot!(out);
}

struct Fake(&'static str);
impl condense_summarize::Summarizer for Fake {
    fn name(&self) -> &str {
        "fake"
    }
    fn summarize(&self, b: &[condense_summarize::Item<'_>]) -> Result<Vec<String>, condense_summarize::SummarizeError> {
        condense_summarize::Extractive::default().summarize(b)
    }
    fn handoff(&self, _: &str, max: usize) -> Result<Option<String>, condense_summarize::SummarizeError> {
        match self.0 {
            "blank" => Ok(Some("   ".into())),
            "oversized" => Ok(Some("x".repeat(max + 1))),
            "fails" => Err(condense_summarize::SummarizeError::Failed { name: "fake".into(), reason: "unavailable".into() }),
            _ => Ok(None),
        }
    }
}

#[test]
fn each_fail_closed_reason() {
    use condense_engine::recover::{prepare, prepare_within, Blocked};
    use condense_events::{Block, Entry, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let session = |name: &str, window: u64, recover: bool, text: &str| {
        let s = store.create_session(name).unwrap();
        s.configure(PruneConfig { enabled: false, recover_large_context: recover, ..PruneConfig::default() }).unwrap();
        let mut events = vec![model(window)];
        for i in 0..6 {
            let parent = (i > 0).then(|| format!("e{}", 2 * i - 1));
            events.push(SourceEvent::EntryAppended { id: format!("e{}", 2 * i), parent, entry: Entry::Message(Message::user_text(format!("{text} {i}"), UserOrigin::Prompt)) });
            events.push(SourceEvent::EntryAppended {
                id: format!("e{}", 2 * i + 1),
                parent: Some(format!("e{}", 2 * i)),
                entry: Entry::Message(Message::Assistant { content: vec![Block::Text { text: "done".into() }], model: None, stop: None, usage: None }),
            });
        }
        s.append(events).unwrap();
        s.projection().unwrap()
    };
    let p = session("ok", 32_000, true, "a request");
    assert!(prepare(&p, &Fake("default")).is_ok());
    assert_eq!(prepare(&p, &Fake("blank")), Err(Blocked::Blank));
    assert!(matches!(prepare(&p, &Fake("oversized")), Err(Blocked::Oversized(..))));
    assert!(matches!(prepare(&p, &Fake("fails")), Err(Blocked::SummaryFailed(e)) if e.contains("unavailable")));
    assert_eq!(prepare_within(&p, &Fake("default"), std::time::Duration::ZERO), Err(Blocked::Deadline(0)));
    assert_eq!(prepare(&session("off", 32_000, false, "x"), &Fake("default")), Err(Blocked::Disabled));
    assert_eq!(prepare(&session("tiny", 4_096, true, "x"), &Fake("default")), Err(Blocked::Window(Some(4_096))));
    let huge = "y".repeat(6 << 20);
    assert!(matches!(prepare(&session("huge", 32_000, true, &huge), &Fake("default")), Err(Blocked::SourceTooLarge(_))));
    let img = store.create_session("img").unwrap();
    img.append(vec![model(32_000), SourceEvent::EntryAppended {
        id: "i1".into(),
        parent: None,
        entry: Entry::Message(Message::User { content: vec![Block::Image { mime: "image/png".into(), data: "AA".into() }], origin: UserOrigin::Prompt }),
    }, SourceEvent::EntryAppended {
        id: "i2".into(),
        parent: Some("i1".into()),
        entry: Entry::Message(Message::Assistant { content: vec![Block::Text { text: "seen".into() }], model: None, stop: None, usage: None }),
    }]).unwrap();
    assert_eq!(prepare(&img.projection().unwrap(), &Fake("default")), Err(Blocked::Image("i1".into())));
}

#[test]
fn only_a_successful_reply_on_the_new_model_ends_the_guard() {
    use condense_events::{Block, Entry, Message, StopReason, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("x").unwrap();
    let reply = |id: &str, parent: &str, model: Option<&str>, stop: Option<StopReason>| SourceEvent::EntryAppended {
        id: id.into(),
        parent: Some(parent.into()),
        entry: Entry::Message(Message::Assistant { content: vec![Block::Text { text: "ok".into() }], model: model.map(str::to_string), stop, usage: None }),
    };
    s.append(vec![
        model(200_000),
        SourceEvent::EntryAppended { id: "u1".into(), parent: None, entry: Entry::Message(Message::user_text("go", UserOrigin::Prompt)) },
        model(32_000),
    ])
    .unwrap();
    let active = || s.with_projection(condense_engine::recover::guard_active).unwrap();
    assert!(active());
    // A reply that ended in a provider error keeps the guard on.
    s.append(vec![reply("a1", "u1", Some("m32000"), Some(StopReason::Error))]).unwrap();
    assert!(active(), "an error reply ended the guard");
    // So does one the old model wrote.
    s.append(vec![reply("a2", "a1", Some("m200000"), Some(StopReason::Stop))]).unwrap();
    assert!(active(), "a reply of another model ended the guard");
    // A successful reply on the new model ends it.
    s.append(vec![reply("a3", "a2", Some("m32000"), Some(StopReason::Stop))]).unwrap();
    assert!(!active());
}
