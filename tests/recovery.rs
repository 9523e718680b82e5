//! Seed 004 on the corpus: every pi, Claude Code and Codex session, run on a 200k window and then switched
//! to a 32k one, either recovers under the new budget or fails closed with a typed reason; no partial
//! checkpoint is ever stored. Plus a snapshot of the handoff request on one session.

use condense_engine::{EngineError, Store};
use condense_events::{PruneConfig, SourceEvent};
use condense_tests::{corpus_name, corpus_sessions, readable};

/// A new session with pruning off (recovery reads the context as it stands).
fn unpruned(store: &Store, name: &str) -> condense_engine::Session {
    let s = store.create_session(name).unwrap();
    s.configure(PruneConfig { enabled: false, ..PruneConfig::default() }).unwrap();
    s
}

fn model(window: u64) -> SourceEvent {
    SourceEvent::ModelChanged { provider: None, model: format!("m{window}"), context_window: Some(window), max_output: None }
}

#[test]
fn every_corpus_session_switched_to_32k_recovers_or_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let budget = condense_checkpoint::Budget::new(32_000, None, condense_checkpoint::DEFAULT_RESERVE);
    let (mut recovered, mut guarded_off, mut blocked) = (0, 0, Vec::new());
    let mut snapshot = None;
    for file in corpus_sessions() {
        let name = corpus_name(&file);
        let imported = condense_formats::import_file(&file).unwrap();
        // The defaults (pruning and chain compression on), as a user runs it.
        let s = store.create_session(&name).unwrap();
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
                let handoff = r.messages[0].text();
                assert!(handoff.contains("## Task") && handoff.contains("## References"), "{name}: the handoff carries the seed's sections");
                // The Task section opens with a request the user typed in this session (issue 36: with chain
                // compression on, compressed-chain blocks used to push every request out of it).
                let task = handoff.split("## Task\n").nth(1).unwrap_or("").split("\n## ").next().unwrap_or("");
                let first_line = task.lines().next().unwrap_or("");
                let asked = first_line.split_once("]: ").map(|(_, t)| t.trim_end_matches('…')).unwrap_or("");
                let typed: Vec<String> = p
                    .branch_messages()
                    .iter()
                    .filter(|m| matches!(***m, condense_events::Message::User { origin: condense_events::UserOrigin::Prompt, .. }))
                    .map(|m| m.typed_text().split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect();
                assert!(
                    first_line.starts_with("- first request [") && !asked.is_empty() && typed.iter().any(|t| t.starts_with(asked)),
                    "{name}: the Task section does not open with a request of the session:\n{task}"
                );
                assert!(handoff.len() as u64 <= condense_recovery::summary_budget(condense_recovery::input_budget(32_000), 0), "{name}: handoff over its bound");
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
    condense_tests::snapshot!("every_corpus_session_switched_to_32k_recovers_or_fails_closed", snapshot.expect("a pi session recovered"));
}

/// The payload guard that `prepare` applies itself judges the context by its serialized size, not by its
/// text: a context of many small tool calls, whose JSON (ids, names, framing) is many times its text,
/// is over the new model's payload limit while its text is far under it.
#[test]
fn prepare_guards_a_context_whose_json_is_over_the_limit_while_its_text_is_small() {
    use condense_events::{Block, Entry, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = unpruned(&store, "many-small-calls");
    s.append(vec![model(200_000)]).unwrap();
    let mut events = Vec::new();
    let mut parent: Option<String> = None;
    let mut push = |events: &mut Vec<SourceEvent>, id: String, m: Message| {
        events.push(SourceEvent::EntryAppended { id: id.clone(), parent: parent.replace(id), entry: Entry::Message(m) });
    };
    push(&mut events, "p".into(), Message::user_text("check every file", UserOrigin::Prompt));
    for k in 0..6_000 {
        let call = format!("call_{k:020}");
        push(&mut events, format!("a{k}"), Message::Assistant { content: vec![Block::tool_call(call.clone(), "r".into(), "{}".into())], model: None, stop: None, usage: None });
        push(&mut events, format!("t{k}"), Message::ToolResult { call_id: call, tool_name: "r".into(), content: vec![Block::Text { text: "ok".into() }], is_error: false });
    }
    s.append(events).unwrap();
    s.append(vec![model(32_000)]).unwrap();
    let limit = condense_engine::recover::payload_limit(&s.projection().unwrap()).unwrap();
    let context = s.render().unwrap();
    // Text and arguments: what the guard's quick test counted.
    let text: usize = context.messages.iter().flat_map(|m| m.content()).map(|b| match b {
        Block::Text { text } => text.len(),
        Block::ToolCall(c) => c.arguments.len(),
        _ => 0,
    }).sum();
    let json = |m: &[std::sync::Arc<Message>]| serde_json::to_vec(&condense_formats::export::neutral(m)).unwrap().len() as u64;
    assert!((text as u64) * 2 < limit && json(&context.messages[..]) > limit, "the case: text {text} bytes, JSON {} bytes, limit {limit}", json(&context.messages[..]));
    drop(context);
    match s.prepare() {
        Ok(r) => {
            assert!(json(&r.messages[..]) <= limit, "prepare sent {} bytes of JSON, over the payload limit {limit}", json(&r.messages[..]));
            assert_eq!(s.projection().unwrap().index().checkpoints.len(), 1, "a recovery checkpoint");
        }
        Err(EngineError::CompactionFailed { .. }) => assert!(s.projection().unwrap().index().checkpoints.is_empty()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn recovery_off_or_small_windows_do_not_guard() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
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
    let store = condense_tests::open_store(dir.path()).unwrap();
    let events = condense_tests::corpus_events("pi/badlogic__pi-mono/large-session.jsonl");
    let s = unpruned(&store, "large");
    s.append(vec![model(200_000)]).unwrap();
    s.append(events.into_iter().filter(|e| !matches!(e, SourceEvent::ModelChanged { .. } | SourceEvent::ProviderUsage(_))).collect()).unwrap();
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
    condense_tests::snapshot!("the_tools_reply_on_a_recovered_corpus_session", out);
}

/// The handoff a test summarizer of kind `kind` gives.
fn fake(kind: &'static str) -> condense_tests::HandoffWith<impl Fn(&str, usize) -> condense_tests::HandoffResult + Send + Sync> {
    condense_tests::HandoffWith(move |_: &str, max: usize| match kind {
        "blank" => Ok(Some("   ".into())),
        "oversized" => Ok(Some("x".repeat(max + 1))),
        "fails" => Err(condense_tests::handoff_failed("unavailable")),
        _ => Ok(None),
    })
}

#[test]
fn each_fail_closed_reason() {
    use condense_engine::recover::{prepare, prepare_within, Blocked};
    use condense_events::{Block, Entry, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
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
    assert!(prepare(&p, &fake("default")).is_ok());
    assert_eq!(prepare(&p, &fake("blank")), Err(Blocked::Blank));
    assert!(matches!(prepare(&p, &fake("oversized")), Err(Blocked::Oversized(..))));
    assert!(matches!(prepare(&p, &fake("fails")), Err(Blocked::SummaryFailed(e)) if e.contains("unavailable")));
    assert_eq!(prepare_within(&p, &fake("default"), std::time::Duration::ZERO), Err(Blocked::Deadline(0)));
    assert_eq!(prepare(&session("off", 32_000, false, "x"), &fake("default")), Err(Blocked::Disabled));
    assert_eq!(prepare(&session("tiny", 4_096, true, "x"), &fake("default")), Err(Blocked::Window(Some(4_096))));
    let huge = "y".repeat(6 << 20);
    assert!(matches!(prepare(&session("huge", 32_000, true, &huge), &fake("default")), Err(Blocked::SourceTooLarge(_))));
    let img = store.create_session("img").unwrap();
    img.append(vec![model(32_000), SourceEvent::EntryAppended {
        id: "i1".into(),
        parent: None,
        entry: Entry::Message(Message::User { content: vec![Block::image("image/png".into(), "AA".into())], origin: UserOrigin::Prompt }),
    }, SourceEvent::EntryAppended {
        id: "i2".into(),
        parent: Some("i1".into()),
        entry: Entry::Message(Message::Assistant { content: vec![Block::Text { text: "seen".into() }], model: None, stop: None, usage: None }),
    }]).unwrap();
    assert_eq!(prepare(&img.projection().unwrap(), &fake("default")), Err(Blocked::Image("i1".into())));
    // A block of an unknown type (imported from a pi session that has one) fails closed before any
    // summarizer call, naming the entry and the type.
    let file = dir.path().join("hologram.jsonl");
    std::fs::write(
        &file,
        "{\"type\":\"session\",\"version\":3,\"id\":\"h\",\"timestamp\":\"t\",\"cwd\":\"/w\"}\n\
         {\"type\":\"message\",\"id\":\"m1\",\"parentId\":null,\"timestamp\":\"t\",\"message\":{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look\"},{\"type\":\"hologram\",\"data\":\"zz\"}]}}\n\
         {\"type\":\"message\",\"id\":\"m2\",\"parentId\":\"m1\",\"timestamp\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"seen\"}]}}\n",
    )
    .unwrap();
    store.import_file(&file, "unknown").unwrap();
    let unknown = store.session("unknown").unwrap();
    unknown.append(vec![model(200_000), model(32_000)]).unwrap();
    let (seen, rec) = recording();
    assert_eq!(prepare(&unknown.projection().unwrap(), &rec), Err(Blocked::Unknown("m1".into(), "hologram".into())));
    assert!(seen.lock().unwrap().is_empty(), "no summarizer call");
}

#[test]
fn only_a_successful_reply_on_the_new_model_ends_the_guard() {
    use condense_events::{Block, Entry, Message, StopReason, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
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

/// Pieces a test summarizer was given.
type Pieces = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A test summarizer that records the pieces it is given and answers each with a short summary.
fn recording() -> (Pieces, condense_tests::HandoffWith<impl Fn(&str, usize) -> condense_tests::HandoffResult + Send + Sync>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    (seen, condense_tests::HandoffWith(move |piece: &str, _: usize| {
        let mut seen = log.lock().unwrap();
        seen.push(piece.to_string());
        Ok(Some(format!("piece {}\n", seen.len())))
    }))
}

/// `first`, then `n` requests (`u0`, `u1`…) of `chars` characters each answered by a reply as long (`a0`,
/// `a1`…), chained; the events and the last entry's id.
fn exchanges(first: SourceEvent, n: usize, chars: usize) -> (Vec<SourceEvent>, Option<String>) {
    use condense_events::{Message, UserOrigin};
    let mut events = vec![first];
    let mut parent: Option<String> = None;
    for i in 0..n {
        events.push(msg(&format!("u{i}"), parent.as_deref(), Message::user_text(format!("request {i}: {}", "x".repeat(chars)), UserOrigin::Prompt)));
        events.push(msg(&format!("a{i}"), Some(&format!("u{i}")), reply(&format!("answer {i}: {}", "y".repeat(chars)))));
        parent = Some(format!("a{i}"));
    }
    (events, parent)
}

fn msg(id: &str, parent: Option<&str>, m: condense_events::Message) -> SourceEvent {
    SourceEvent::EntryAppended { id: id.into(), parent: parent.map(str::to_string), entry: condense_events::Entry::Message(m) }
}

fn call(id: &str, text: &str) -> condense_events::Message {
    use condense_events::{Block, Message};
    Message::Assistant {
        content: vec![Block::Text { text: text.into() }, Block::tool_call(id.into(), "bash".into(), r#"{"command":"cat src/big.log"}"#.into())],
        model: None,
        stop: None,
        usage: None,
    }
}

fn result(id: &str, text: String, is_error: bool) -> condense_events::Message {
    condense_events::Message::ToolResult { call_id: id.into(), tool_name: "bash".into(), content: vec![condense_events::Block::Text { text }], is_error }
}

fn reply(text: &str) -> condense_events::Message {
    condense_events::Message::Assistant { content: vec![condense_events::Block::Text { text: text.into() }], model: None, stop: None, usage: None }
}

#[test]
fn a_message_larger_than_a_piece_is_split_and_every_piece_stays_in_the_input_budget() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = unpruned(&store, "big");
    let big: String = (0..30_000).map(|i| format!("{i:>9}\n")).collect();
    assert_eq!(big.len(), 300_000);
    s.append(vec![
        model(32_000),
        msg("u1", None, Message::user_text("read the log", UserOrigin::Prompt)),
        msg("a1", Some("u1"), call("c1", "Reading it.")),
        msg("r1", Some("a1"), result("c1", big, false)),
        msg("a2", Some("r1"), reply("The log counts to 29999.")),
        msg("u2", Some("a2"), Message::user_text("now summarize it", UserOrigin::Prompt)),
    ])
    .unwrap();
    let (seen, rec) = recording();
    let p = s.projection().unwrap();
    condense_engine::recover::prepare(&p, &rec).expect("recovers");
    let pieces = seen.lock().unwrap();
    let budget = condense_recovery::input_budget(32_000) as usize;
    assert!(pieces.len() >= 300_000 / budget, "{} pieces", pieces.len());
    for piece in pieces.iter() {
        assert!(piece.len() <= budget - 4096, "a piece of {} bytes, over {}", piece.len(), budget - 4096);
    }
    // Nothing is lost between pieces: they join back to the whole source.
    let joined: String = pieces.concat();
    assert!(joined.contains("[r1] tool:") && joined.contains("29999\n") && joined.contains("[a2] assistant: The log counts to 29999."));
}

#[test]
fn recovery_reads_the_canonical_context_and_the_archive_holds_it() {
    use condense_events::{Entry, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = unpruned(&store, "compacted");
    s.append(vec![
        model(200_000),
        msg("u1", None, Message::user_text("the removed request about zebra-stripes", UserOrigin::Prompt)),
        msg("a1", Some("u1"), reply("removed reply")),
        SourceEvent::EntryAppended {
            id: "hc".into(),
            parent: Some("a1".into()),
            entry: Entry::HostCompaction { summary: Some("HOST SUMMARY: the user wants a parser".into()), first_kept: None, replacement: Vec::new(), tokens_before: None },
        },
        msg("u2", Some("hc"), Message::user_text("go on with the parser", UserOrigin::Prompt)),
        msg("a2", Some("u2"), reply("I will use a recursive descent parser because the grammar is small.")),
        msg("u3", Some("a2"), Message::user_text("next", UserOrigin::Prompt)),
        model(32_000),
    ])
    .unwrap();
    let (seen, rec) = recording();
    condense_engine::recover::prepare(&s.projection().unwrap(), &rec).expect("recovers");
    let read: String = seen.lock().unwrap().concat();
    assert!(read.contains("HOST SUMMARY: the user wants a parser"), "the host's summary is read as a summary: {read}");
    assert!(!read.contains("zebra-stripes") && !read.contains("removed reply"), "text the host compaction removed is not read again: {read}");
    // The recovery the session runs itself (default handoff) commits an archive of the same view.
    assert!(matches!(s.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    let r = s.prepare().expect("recovers");
    let handoff = r.messages[0].text();
    for section in ["## Task", "## Decisions", "## Next step", "[u2]", "I will use a recursive descent parser"] {
        assert!(handoff.contains(section), "the handoff lacks {section}: {handoff}");
    }
    let search = |words: &str| s.history_tool("history_search", &format!("{{\"keywords\":[{words}]}}")).unwrap().text;
    assert!(search(r#""zebra""#).contains(r#""hits":[]"#), "the archive holds text the context no longer had");
    assert!(search(r#""host","summary""#).contains("HOST SUMMARY"), "the archive holds the host's summary as a summary");
}

/// A session holding `texts` as prompts answered by short replies, with an archive of it committed.
fn archived(store: &Store, name: &str, texts: &[String]) -> condense_engine::Session {
    use condense_events::{Message, UserOrigin};
    let s = unpruned(store, name);
    let mut events = vec![model(200_000)];
    let mut parent: Option<String> = None;
    for (i, t) in texts.iter().enumerate() {
        events.push(msg(&format!("u{i}"), parent.as_deref(), Message::user_text(t.clone(), UserOrigin::Prompt)));
        events.push(msg(&format!("a{i}"), Some(&format!("u{i}")), reply("noted")));
        parent = Some(format!("a{i}"));
    }
    s.append(events).unwrap();
    assert_eq!(s.archive_now().unwrap(), "a1");
    s
}

#[test]
fn history_replies_stay_within_the_tool_text_ceiling_as_the_model_reads_them() {
    use condense_recovery::{PAGE_BYTES, REPLY_CEILING};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    // Below the ceiling: plain text pages are whole 2,048-byte pages. Above it once escaped: quotes (2 bytes
    // each) and control characters (6 bytes each) make the page shorter, never the reply longer.
    let plain = "abcdefgh ".repeat(1000);
    let quotes = "\"".repeat(9000);
    let controls: String = (0..5000).map(|i| if i % 2 == 0 { '\u{1}' } else { 'x' }).collect();
    let mixed: String = (0..4000).map(|i| ['é', '"', '\n', '€', 'a'][i % 5]).collect();
    let s = archived(&store, "escapes", &[plain.clone(), quotes.clone(), controls.clone(), mixed.clone()]);
    for (id, original) in [("u0", &plain), ("u1", &quotes), ("u2", &controls), ("u3", &mixed)] {
        let (mut offset, mut back, mut pages) = (0u64, String::new(), 0);
        loop {
            let a = s.history_tool("history_read", &format!("{{\"id\":\"{id}\",\"offset\":{offset}}}")).unwrap();
            assert!(!a.is_error, "{}", a.text);
            assert!(a.text.len() <= REPLY_CEILING, "{id}: a reply of {} bytes", a.text.len());
            let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
            let text = v["text"].as_str().unwrap();
            assert!(text.len() <= PAGE_BYTES);
            if id == "u0" && v["nextOffset"].is_u64() {
                assert_eq!(text.len(), PAGE_BYTES, "plain text is not cut short");
            }
            back.push_str(text);
            pages += 1;
            match v["nextOffset"].as_u64() {
                Some(n) => offset = n,
                None => break,
            }
        }
        assert_eq!(&back, original, "{id}: the pages join back to the entry ({pages} pages)");
    }
    // Search: 20 hits of snippets that escape to six times their size.
    let noisy: Vec<String> = (0..30).map(|i| format!("needle {i} {}", "\u{2}\"".repeat(80))).collect();
    let s = archived(&store, "noisy", &noisy);
    let a = s.history_tool("history_search", r#"{"keywords":["needle"]}"#).unwrap();
    assert!(a.text.len() <= REPLY_CEILING, "a search reply of {} bytes", a.text.len());
    let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
    assert!(!v["hits"].as_array().unwrap().is_empty() && v["omitted"].as_str().unwrap().contains("lower-ranked"), "{}", a.text);
    // The newest records rank first among equals, and stay.
    assert_eq!(v["hits"][0]["id"], "u29");
}

#[test]
fn archives_of_a_branch_the_session_left_are_not_listed_searched_or_read() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = archived(&store, "left", &["the first task about walruses".to_string(), "the second task".to_string()]);
    let listed = |s: &condense_engine::Session| s.history_tool("history_archives", "{}").unwrap().text;
    let has_history_tools = |s: &condense_engine::Session| {
        s.with_projection(|p| condense_engine::tools::needed(p).iter().any(|t| t.name == "history_search")).unwrap()
    };
    assert!(listed(&s).contains("a1") && has_history_tools(&s));
    // Going on from the archived leaf keeps it.
    s.append(vec![msg("u9", Some("a1"), Message::user_text("more", UserOrigin::Prompt))]).unwrap();
    assert!(listed(&s).contains("a1"));
    // Rewinding to before it and going another way leaves it.
    s.append(vec![SourceEvent::LeafMoved { leaf: Some("a0".into()) }, msg("v1", Some("a0"), Message::user_text("another way", UserOrigin::Prompt))]).unwrap();
    assert!(!listed(&s).contains("a1"), "{}", listed(&s));
    assert!(!has_history_tools(&s), "the history tools are offered for a branch left");
    let search = s.history_tool("history_search", r#"{"keywords":["walruses"],"archive":"a1"}"#).unwrap();
    assert!(search.is_error && search.text.contains("left"), "{}", search.text);
    let newest = s.history_tool("history_search", r#"{"keywords":["walruses"]}"#).unwrap();
    assert!(newest.is_error && newest.text.contains("no archive"), "{}", newest.text);
    let read = s.history_tool("history_read", r#"{"id":"u0"}"#).unwrap();
    assert!(read.is_error, "{}", read.text);
    // Coming back to the archived branch finds it again.
    s.append(vec![SourceEvent::LeafMoved { leaf: Some("u9".into()) }]).unwrap();
    assert!(listed(&s).contains("a1") && !s.history_tool("history_read", r#"{"id":"u0"}"#).unwrap().is_error);
}

/// The `recovery` notes of a session, in order.
fn recovery_notes(store: &Store, s: &condense_engine::Session) -> Vec<String> {
    store
        .log()
        .read(s.id(), 1, s.head().unwrap())
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            condense_events::Event::Decision(condense_events::DecisionEvent::Note { stage, text }) if stage == "recovery" => Some(text),
            _ => None,
        })
        .collect()
}

#[test]
fn recovery_diagnostics_name_what_happened_without_source_text() {
    use condense_events::{Block, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    // Prepared: piece and call counts and the archive, no source text.
    let s = archived(&store, "prepared", &["a secret-ish request text".to_string(), "go on".to_string()]);
    s.append(vec![model(32_000)]).unwrap();
    assert!(matches!(s.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    s.prepare().unwrap();
    let notes = recovery_notes(&store, &s);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("source_recovery_prepared: 1 piece(s), 1 summarizer call(s), 0 section(s) added to the model's handoff, archive a2"), "{notes:?}");
    assert!(!notes[0].contains("secret-ish"));
    assert_eq!(s.stats().unwrap().recovery, notes, "condense stats lists them");
    // Blocked: the reason.
    let img = store.create_session("img").unwrap();
    img.append(vec![
        model(200_000),
        msg("i1", None, Message::User { content: vec![Block::image("image/png".into(), "AA".into())], origin: UserOrigin::Prompt }),
        msg("i2", Some("i1"), reply("seen")),
        msg("i3", Some("i2"), Message::user_text("and now?", UserOrigin::Prompt)),
        model(32_000),
    ])
    .unwrap();
    assert!(matches!(img.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    assert!(matches!(img.prepare(), Err(EngineError::CompactionFailed { .. })));
    assert_eq!(recovery_notes(&store, &img), vec!["source_recovery_blocked: entry `i1` holds an image; recovery reads text only".to_string()]);
    // Route unsupported: a switch to an unknown window or one below 8,192 tokens, once per switch; none
    // for a supported window, with recovery off, or without a known window to come from.
    let switch = |name: &str, recover: bool, from: Option<u64>, to: Option<u64>| {
        let s = store.create_session(name).unwrap();
        s.configure(PruneConfig { recover_large_context: recover, ..PruneConfig::default() }).unwrap();
        let m = |w: Option<u64>, id: &str| SourceEvent::ModelChanged { provider: None, model: id.into(), context_window: w, max_output: None };
        s.append(vec![m(from, "big"), msg("u1", None, Message::user_text("hi", UserOrigin::Prompt)), msg("a1", Some("u1"), reply("hello"))]).unwrap();
        s.append(vec![m(to, "small")]).unwrap();
        s.append(vec![msg("u2", Some("a1"), Message::user_text("more", UserOrigin::Prompt))]).unwrap();
        recovery_notes(&store, &s)
    };
    let unknown = switch("unknown", true, Some(200_000), None);
    assert_eq!(unknown.len(), 1);
    assert!(unknown[0].starts_with("source_recovery_route_unsupported: model `small` has no known window"), "{unknown:?}");
    let tiny = switch("tiny", true, Some(200_000), Some(4_096));
    assert!(tiny.len() == 1 && tiny[0].contains("4096-token window, below 8192"), "{tiny:?}");
    assert!(switch("at-bound", true, Some(200_000), Some(8_192)).is_empty());
    assert!(switch("off", false, Some(200_000), None).is_empty());
    assert!(switch("from-unknown", true, None, None).is_empty());
}

#[test]
fn the_request_overhead_is_kept_free_by_the_controller_and_the_handoff() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    // About 10,000 tokens of conversation on a 32k window (hard budget 16,000).
    let s = unpruned(&store, "overhead");
    let (mut events, parent) = exchanges(model(32_000), 10, 2000);
    events.push(msg("u10", parent.as_deref(), Message::user_text("go on", UserOrigin::Prompt)));
    s.append(events).unwrap();
    s.prepare().unwrap();
    assert!(s.projection().unwrap().index().checkpoints.is_empty(), "fits without overhead");
    // A 7,000-token system prompt and tool declarations: the same conversation no longer fits.
    s.set_request_overhead(7_000).unwrap();
    let head = s.head().unwrap();
    assert_eq!(s.set_request_overhead(7_000).unwrap(), head, "an unchanged overhead writes nothing");
    s.prepare().unwrap();
    let p = s.projection().unwrap();
    let cp = p.index().checkpoints.values().next().expect("the overhead made a checkpoint due").clone();
    assert!(cp.summary.chars().count() <= 9_000, "the summary leaves room for the overhead: {}", cp.summary.chars().count());
    assert!(condense_engine::controller::context_tokens(&p) <= 16_000);

    // Recovery: the handoff bound shrinks by the overhead's bytes (seed 004).
    let noisy: Vec<String> = (0..60).map(|i| format!("You must keep file_{i}.rs as it is and never touch test_{i}.")).collect();
    let handoff = |name: &str, overhead: u64| {
        let r = archived(&store, name, &noisy);
        r.set_request_overhead(overhead).unwrap();
        r.append(vec![msg("u99", Some("a59"), Message::user_text("next", UserOrigin::Prompt)), model(32_000)]).unwrap();
        assert!(matches!(r.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
        r.prepare().unwrap().messages[0].text()
    };
    let (with, without) = (handoff("with", 200), handoff("without", 0));
    let bound = condense_recovery::summary_budget(condense_recovery::input_budget(32_000), 800);
    assert_eq!(bound, 2_000);
    assert!(with.len() as u64 <= bound, "a handoff of {} bytes for a bound of {bound}", with.len());
    assert!(with.len() < without.len(), "the overhead's room comes out of the handoff: {} vs {}", with.len(), without.len());
}

#[test]
fn simulate_switch_replays_a_session_onto_a_smaller_model() {
    use condense_engine::simulate::{replay_with, Prices, Switch};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let events = condense_tests::corpus_events("pi/badlogic__pi-mono/large-session.jsonl");
    // At request 200 the context is over 16k tokens (under 24k: compressed chains' replies render cut,
    // and the turn pi never replays is left out).
    let f = replay_with(&store, "switched", events.clone(), PruneConfig::default(), Prices::default(), None, Some(Switch { window: 16_000, at: 200 })).unwrap();
    assert!(f.recoveries >= 1 && f.archives == f.recoveries, "{f:?}");
    assert_eq!((f.recoveries_blocked, f.over_budget_requests, f.validity_errors), (0, 0, 0), "{:?}", f.blocked_reasons);
    assert_eq!(f.refs_recovered_exact, f.refs_checked);
    // Without the switch nothing is recovered; a switch past the last request changes nothing.
    let plain = replay_with(&store, "plain", events.clone(), PruneConfig::default(), Prices::default(), None, None).unwrap();
    let late = replay_with(&store, "late", events, PruneConfig::default(), Prices::default(), None, Some(Switch { window: 32_000, at: 100_000 })).unwrap();
    assert_eq!((plain.recoveries, late.recoveries, late.archives), (0, 0, 0));
    assert_eq!(plain.rendered_input_tokens_total, late.rendered_input_tokens_total);
    // A history recovery cannot read (an image) fails closed at every retry, and says why.
    use condense_events::{Block, Message, UserOrigin};
    let mut events = vec![msg("i1", None, Message::User { content: vec![Block::image("image/png".into(), "AA".repeat(40_000)), Block::Text { text: "x".repeat(80_000) }], origin: UserOrigin::Prompt })];
    let mut parent = "i1".to_string();
    for i in 0..4 {
        events.push(msg(&format!("a{i}"), Some(&parent), reply(&format!("reply {i}"))));
        events.push(msg(&format!("u{i}"), Some(&format!("a{i}")), Message::user_text(format!("prompt {i}"), UserOrigin::Prompt)));
        parent = format!("u{i}");
    }
    let f = replay_with(&store, "image", events, PruneConfig::default(), Prices::default(), None, Some(Switch { window: 32_000, at: 2 })).unwrap();
    assert_eq!(f.recoveries, 0);
    assert!(f.recoveries_blocked >= 1, "{f:?}");
    assert_eq!(f.blocked_reasons, vec!["entry `i1` holds an image; recovery reads text only".to_string()]);
}

/// A session whose history before the last request is one prompt of `bytes` bytes of text, on a
/// 1,000,000-token window (input budget 262,144 bytes, pieces of 258,048).
fn prepared(store: &Store, name: &str, text_bytes: usize) -> Result<Vec<condense_events::DecisionEvent>, condense_engine::recover::Blocked> {
    use condense_events::{Message, UserOrigin};
    let s = unpruned(store, name);
    s.append(vec![
        model(1_000_000),
        msg("u0", None, Message::user_text("p".repeat(text_bytes), UserOrigin::Prompt)),
        msg("a0", Some("u0"), reply("ok")),
        msg("u1", Some("a0"), Message::user_text("next", UserOrigin::Prompt)),
    ])
    .unwrap();
    condense_engine::recover::prepare(&s.projection().unwrap(), &fake("default"))
}

#[test]
fn the_invocation_and_source_bounds_hold_at_below_and_above_their_limits() {
    use condense_engine::recover::Blocked;
    use condense_recovery::{input_budget, MAX_INVOCATIONS, MAX_SOURCE_BYTES};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let piece = input_budget(1_000_000) as usize - 4096;
    // The prompt's line is "[u0] user: " (11 bytes) + text + "\n"; "[a0] assistant: ok\n" joins the last piece.
    let line = |pieces: usize, extra: usize| pieces * piece + extra - 12;
    let max = MAX_INVOCATIONS as usize;
    assert!(prepared(&store, "below", line(max - 2, 100)).is_ok(), "63 pieces");
    assert!(prepared(&store, "at", line(max - 1, 100)).is_ok(), "64 pieces");
    assert_eq!(prepared(&store, "above", line(max, 1)).unwrap_err(), Blocked::TooManyInvocations(max + 1));
    // 32 MiB of source: at the bound it is read (and then needs more than 64 pieces); one byte over is refused.
    let text_at = MAX_SOURCE_BYTES - "ok".len();
    assert!(matches!(prepared(&store, "source-at", text_at).unwrap_err(), Blocked::TooManyInvocations(_)));
    assert_eq!(prepared(&store, "source-above", text_at + 1).unwrap_err(), Blocked::SourceTooLarge(MAX_SOURCE_BYTES + 1));
}

#[test]
fn an_oversized_final_batch_gets_a_bounded_copy_instead_of_failing_closed() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = unpruned(&store, "batch");
    // The request being retried ends with a 120,000-character output: alone it is over the 16,000-token
    // hard budget of a 32k window.
    let big: String = (0..12_000).map(|i| format!("row {i:>5}\n")).collect();
    s.append(vec![
        model(200_000),
        msg("u0", None, Message::user_text("dump the table", UserOrigin::Prompt)),
        msg("a0", Some("u0"), call("c1", "Dumping.")),
        msg("r0", Some("a0"), result("c1", big.clone(), false)),
        model(32_000),
    ])
    .unwrap();
    assert!(matches!(s.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    let r = s.prepare().expect("recovers with a bounded copy");
    let p = s.projection().unwrap();
    let cp = p.index().checkpoints.values().next().unwrap().clone();
    assert_eq!(cp.bounded.len(), 1, "the final output gets a bounded copy");
    // The render shows that very copy in the output's place (not a stub, not the whole output): the
    // checkpoint's text of it, its head and its tail rows, the marker between them.
    let results: Vec<String> = r.messages.iter().filter(|m| matches!(***m, Message::ToolResult { .. })).map(|m| m.text()).collect();
    assert_eq!(results.len(), 1, "the one output, once");
    let shown = &results[0];
    assert_eq!((&cp.bounded[0].0, shown), (&"r0".to_string(), &cp.bounded[0].1), "the render shows the checkpoint's bounded copy of r0");
    assert!(shown.starts_with("row     0\n") && shown.trim_end().ends_with("row 11999"), "head and tail kept: …{}", &shown[shown.len().saturating_sub(300)..]);
    assert!(shown.contains("checkpoint truncation") && shown.len() < big.len() / 2, "{}", &shown[..200.min(shown.len())]);
    assert!(condense_engine::controller::context_tokens(&p) <= 16_000);
    assert!(condense_render::check(&r.messages[..]).is_empty());
    // The original stays whole in the log and the transcript.
    assert_eq!(p.entry_message("r0").unwrap().text(), big);
}

/// Seed 001: the request is re-estimated before it continues, so a committed checkpoint never lets a
/// request over the hard budget go out, the budget notice that rides after the last message included. A
/// recovery lands anywhere up to the hard budget; swept over client overheads that bring it there, each
/// prepared request (its messages, the notice, the client's overhead and condense's tools) is within the
/// budget of the new model, or the turn is refused with a typed error.
#[test]
fn no_request_goes_out_over_the_budget_after_a_checkpoint() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let mut sent = 0;
    let out: String = (0..30_000 / 8).map(|n| format!("l{n:06} ")).collect();
    for overhead in (1_500..=4_500).step_by(20) {
        let s = unpruned(&store, &format!("sweep-{overhead}"));
        let (mut events, parent) = exchanges(model(200_000), 8, 4000);
        events.push(msg("u8", parent.as_deref(), Message::user_text("read the log", UserOrigin::Prompt)));
        events.push(msg("c8", Some("u8"), call("r8", "reading")));
        events.push(msg("t8", Some("c8"), result("r8", out.clone(), false)));
        events.push(model(16_000));
        s.append(events).unwrap();
        s.set_request_overhead(overhead).unwrap();
        match s.prepare() {
            Ok(r) => {
                let p = s.projection().unwrap();
                let budget = condense_engine::controller::budget_of(&p).unwrap();
                let fixed = p.request_overhead() + condense_engine::tools::declared_tokens(&p);
                let tokens: u64 = r.messages.iter().map(|m| p.estimate(m)).sum::<u64>() + fixed;
                assert!(tokens <= budget.hard, "{overhead}: {tokens} tokens sent, over the hard budget {}", budget.hard);
                assert!(!p.index().checkpoints.is_empty(), "{overhead}: the switch made a checkpoint");
                sent += 1;
            }
            Err(EngineError::CompactionFailed { .. }) => {}
            Err(e) => panic!("{overhead}: {e}"),
        }
    }
    assert!(sent >= 100, "most overheads are sent ({sent})");
}

/// Seed 004: private thinking and its signatures are not exported: not to the summarizer's pieces, not
/// into the handoff, not into the archive the history tools read.
#[test]
fn thinking_and_signatures_are_never_exported() {
    use condense_events::{Block, Message, Thinking, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = unpruned(&store, "thinking");
    let thought = Message::Assistant {
        content: vec![
            Block::Thinking(Box::new(Thinking { thinking: "PRIVATE-REASONING about the parser".into(), signature: Some("OPAQUE-SIGNATURE-123".into()) })),
            Block::Text { text: "I will write the parser.".into() },
        ],
        model: None,
        stop: None,
        usage: None,
    };
    s.append(vec![
        model(200_000),
        msg("u1", None, Message::user_text("write a parser", UserOrigin::Prompt)),
        msg("a1", Some("u1"), thought),
        msg("u2", Some("a1"), Message::user_text("go on", UserOrigin::Prompt)),
        model(32_000),
    ])
    .unwrap();
    let (seen, rec) = recording();
    condense_engine::recover::prepare(&s.projection().unwrap(), &rec).expect("recovers");
    let read = seen.lock().unwrap().concat();
    assert!(read.contains("I will write the parser."), "{read}");
    assert!(!read.contains("PRIVATE-REASONING") && !read.contains("OPAQUE-SIGNATURE"), "{read}");
    assert!(matches!(s.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    let handoff = s.prepare().unwrap().messages[0].text();
    assert!(!handoff.contains("PRIVATE-REASONING") && !handoff.contains("OPAQUE-SIGNATURE"), "{handoff}");
    let search = s.history_tool("history_search", r#"{"keywords":["PRIVATE-REASONING","OPAQUE-SIGNATURE-123","parser"]}"#).unwrap().text;
    assert!(!search.contains("PRIVATE-REASONING") && !search.contains("OPAQUE-SIGNATURE"), "{search}");
    let page = s.history_tool("history_read", r#"{"id":"a1"}"#).unwrap();
    assert!(!page.is_error && page.text.contains("I will write the parser."), "{}", page.text);
    assert!(!page.text.contains("PRIVATE-REASONING") && !page.text.contains("OPAQUE-SIGNATURE"), "{}", page.text);
}

/// Seed 004: `read` without an archive finds an entry cited by an earlier recovery checkpoint, in the
/// archive that holds it (the newest archive no longer does, the host compacted it away); another session
/// reads none of this session's archives (it fails closed, naming what is missing); at most two committed
/// views plus the one being read stay in memory, and a view built again reads the same.
#[test]
fn read_finds_entries_across_archives_and_another_session_reads_none() {
    use condense_events::{Entry, Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = archived(&store, "several", &["the first task about walruses".to_string(), "the second task".to_string()]);
    s.append(vec![
        SourceEvent::EntryAppended {
            id: "hc".into(),
            parent: Some("a1".into()),
            entry: Entry::HostCompaction { summary: Some("HOST SUMMARY of the first two tasks".into()), first_kept: None, replacement: Vec::new(), tokens_before: None },
        },
        msg("u5", Some("hc"), Message::user_text("the third task about penguins", UserOrigin::Prompt)),
    ])
    .unwrap();
    assert_eq!(s.archive_now().unwrap(), "a2");
    let read = |s: &condense_engine::Session, args: &str| s.history_tool("history_read", args).unwrap();
    // The newest archive does not hold u0; the first does.
    assert!(read(&s, r#"{"id":"u0","archive":"a2"}"#).is_error);
    let found = read(&s, r#"{"id":"u0"}"#);
    assert!(!found.is_error && found.text.contains("walruses") && found.text.contains("\"archive\":\"a1\""), "{}", found.text);
    let newest = read(&s, r#"{"id":"u5"}"#);
    assert!(!newest.is_error && newest.text.contains("penguins") && newest.text.contains("\"archive\":\"a2\""), "{}", newest.text);
    // Another session: nothing of this one.
    let other = unpruned(&store, "other");
    other.append(vec![model(200_000), msg("u0", None, Message::user_text("unrelated", UserOrigin::Prompt))]).unwrap();
    for (tool, args) in [("history_read", r#"{"id":"u0","archive":"a1"}"#), ("history_read", r#"{"id":"u0"}"#), ("history_search", r#"{"keywords":["walruses"]}"#), ("history_search", r#"{"keywords":["walruses"],"archive":"a1"}"#)] {
        let a = other.history_tool(tool, args).unwrap();
        assert!(a.is_error && !a.text.contains("walruses"), "{tool} {args}: {}", a.text);
    }
    // The cache: four archives read, at most three held; the first, built again, reads the same.
    let more = archived(&store, "more", &["a fourth session's text".to_string()]);
    let last = archived(&store, "last", &["a fifth session's text".to_string()]);
    for (session, id) in [(&more, "u0"), (&last, "u0"), (&s, "u5")] {
        assert!(!read(session, &format!("{{\"id\":\"{id}\"}}")).is_error);
        assert!(store.cached_archives() <= 3, "{} views held", store.cached_archives());
    }
    assert_eq!(read(&s, r#"{"id":"u0","archive":"a1"}"#).text, found.text);
}

/// Seed 004: the final payload check runs on every request of the transition, the one carrying a fresh
/// recovery too. A host whose bytes for that request are over the new model's limit (its framing, its
/// own additions) gets a typed refusal that names both figures, failing closed, and no second overflow is
/// recorded for a request the provider never saw; within the limit the request goes.
#[test]
fn the_request_carrying_a_recovery_gets_the_final_payload_check() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let noisy: Vec<String> = (0..60).map(|i| format!("request {i}: {}", "x".repeat(2000))).collect();
    let s = archived(&store, "final", &noisy);
    s.append(vec![msg("u99", Some("a59"), Message::user_text("next", UserOrigin::Prompt)), model(32_000)]).unwrap();
    assert!(matches!(s.guard_payload(10_000_000), Err(EngineError::ContextOverflow { .. })));
    s.prepare().unwrap();
    let p = s.projection().unwrap();
    assert!(p.overflow_answered(), "the recovery is prepared");
    let limit = condense_engine::recover::payload_limit(&p).unwrap();
    match s.guard_payload(limit + 1) {
        Err(EngineError::CompactionFailed { code, reason, .. }) => {
            assert_eq!(code, condense_engine::recover::RECOVERY_BLOCKED);
            assert!(reason.contains(&format!("{} bytes", limit + 1)) && reason.contains(&limit.to_string()), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let p = s.projection().unwrap();
    assert_eq!(p.overflow_streak(), 1, "no second overflow recorded");
    assert!(s.guard_payload(limit).is_ok());
}

/// Seed 004: reopening the store restores the references without a second copy of the transcript: an
/// archive is one small event naming a point of the log (the head grows by one), and after the store is
/// closed and opened again its entries read and search as before.
#[test]
fn a_reopened_store_reads_its_archives_again_from_the_log() {
    use condense_events::{Message, UserOrigin};
    let dir = tempfile::tempdir().unwrap();
    let texts = vec![format!("the first task about walruses {}", "w".repeat(5_000)), "the second task".to_string()];
    let (read_before, search_before) = {
        let store = condense_tests::open_store(dir.path()).unwrap();
        let s = unpruned(&store, "reopened");
        let mut events = vec![model(200_000)];
        for (i, t) in texts.iter().enumerate() {
            let parent = (i > 0).then(|| format!("a{}", i - 1));
            events.push(msg(&format!("u{i}"), parent.as_deref(), Message::user_text(t.clone(), UserOrigin::Prompt)));
            events.push(msg(&format!("a{i}"), Some(&format!("u{i}")), reply("noted")));
        }
        s.append(events).unwrap();
        let head = s.head().unwrap();
        assert_eq!(s.archive_now().unwrap(), "a1");
        assert_eq!(s.head().unwrap(), head + 1, "an archive is one event");
        let last = store.log().read(s.id(), head + 1, head + 1).unwrap();
        let size = serde_json::to_string(&last[0].body).unwrap().len();
        assert!(size < 200, "the archive event holds no transcript ({size} bytes)");
        (s.history_tool("history_read", r#"{"id":"u0"}"#).unwrap().text, s.history_tool("history_search", r#"{"keywords":["walruses"]}"#).unwrap().text)
    };
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = store.session("reopened").unwrap();
    assert_eq!(s.history_tool("history_read", r#"{"id":"u0"}"#).unwrap().text, read_before);
    assert_eq!(s.history_tool("history_search", r#"{"keywords":["walruses"]}"#).unwrap().text, search_before);
    assert!(read_before.contains("walruses"), "{read_before}");
}
