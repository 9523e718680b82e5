//! The facade: large appends go in pipelined chunks and the warm render equals a fresh one and a render
//! after reopening; a session can be extended event by event, as a live host does.

use condense_engine::Store;
use condense_events::{Block, Entry, Message, SourceEvent, UserOrigin};

fn entry(n: usize) -> SourceEvent {
    let message = match n % 3 {
        0 => Message::user_text(format!("prompt {n}"), UserOrigin::Prompt),
        1 => Message::Assistant {
            content: vec![Block::tool_call(format!("c{n}"), "bash".into(), "{}".into())],
            model: None,
            stop: None,
            usage: None,
        },
        _ => Message::ToolResult {
            call_id: format!("c{}", n - 1),
            tool_name: "bash".into(),
            content: vec![Block::Text { text: "x".repeat(n % 97) }],
            is_error: false,
        },
    };
    SourceEvent::EntryAppended { id: format!("e{n}"), parent: n.checked_sub(1).map(|p| format!("e{p}")), entry: Entry::Message(message) }
}

#[test]
fn large_append_then_live_appends_render_the_same_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("big").unwrap();
    let head = s.append((0..10_000).map(entry).collect()).unwrap();
    assert_eq!(head, 10_000);
    for n in 10_000..10_050 {
        assert_eq!(s.append(vec![entry(n)]).unwrap(), n as u64 + 1);
        let live = s.render().unwrap();
        assert!(condense_render::check(&live.messages[..]).is_empty());
    }
    let live = s.render().unwrap();
    assert_eq!(live.messages.len(), 10_050);
    let fresh = s.render_at(s.head().unwrap()).unwrap();
    assert_eq!(*live.messages, *fresh.messages);
    drop((s, store));
    let store = Store::open(dir.path()).unwrap();
    let again = store.session("big").unwrap().render().unwrap();
    assert_eq!(*live.messages, *again.messages);
    assert!(matches!(store.session("big").unwrap().render_at(99_999), Err(condense_engine::EngineError::PastHead { .. })));
}

/// `append_chain` (how serve records a request's new messages, made into events as the log writes them)
/// writes what the same events appended as a list write, across the log's chunks; and when the log no
/// longer holds the chain's first parent it writes nothing.
#[test]
fn a_chain_writes_its_events_and_nothing_when_its_parent_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (listed, chained) = (store.create_session("listed").unwrap(), store.create_session("chained").unwrap());
    let head: Vec<SourceEvent> = (0..10).map(entry).collect();
    listed.append(head.clone()).unwrap();
    chained.append(head).unwrap();
    let overhead = SourceEvent::RequestOverhead { tokens: 42 };
    let rest = 10..9_000;
    let mut events = vec![overhead.clone()];
    events.extend(rest.clone().map(entry));
    assert_eq!(listed.append_continuing(events).unwrap(), 9_001);
    let entries = rest.map(|n| match entry(n) {
        SourceEvent::EntryAppended { id, entry, .. } => (id, entry),
        _ => unreachable!(),
    });
    let entries: Vec<(String, Entry)> = entries.collect();
    assert_eq!(chained.append_chain(vec![overhead.clone()], Some("e9".into()), entries.into_iter()).unwrap(), 9_001);
    for at in [11, 4_000, 9_001] {
        assert_eq!(*listed.render_at(at).unwrap().messages, *chained.render_at(at).unwrap().messages, "at {at}");
    }
    assert_eq!(listed.projection().unwrap().request_overhead(), chained.projection().unwrap().request_overhead());
    let lost = chained.append_chain(vec![overhead], Some("e99999".into()), std::iter::once(("x".to_string(), Entry::Message(Message::user_text("x", UserOrigin::Prompt)))));
    assert!(matches!(lost, Err(condense_engine::EngineError::ParentLost { ref parent, .. }) if parent == "e99999"), "{lost:?}");
    assert_eq!(chained.head().unwrap(), 9_001);
    drop((listed, chained, store));
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.session("chained").unwrap().head().unwrap(), 9_001);
}

/// The entries of one agent turn as a chain: the prompt, a reply with `said` and a `bash` call, its
/// output of `out` bytes, and a final text reply; ids `{turn}-0` to `{turn}-3` after `parent`.
fn chain(turn: usize, parent: Option<String>, said: &str, out: usize) -> Vec<SourceEvent> {
    let id = |k: usize| format!("{turn}-{k}");
    let messages = [
        Message::user_text(format!("step {turn}: check the build"), UserOrigin::Prompt),
        Message::Assistant {
            content: vec![Block::Text { text: said.to_string() }, Block::tool_call(format!("c{turn}"), "bash".into(), format!("{{\"command\":\"make {turn}\"}}"))],
            model: None,
            stop: None,
            usage: None,
        },
        Message::ToolResult { call_id: format!("c{turn}"), tool_name: "bash".into(), content: vec![Block::Text { text: "ok ".repeat(out / 3) }], is_error: false },
        Message::Assistant { content: vec![Block::Text { text: format!("turn {turn} is done") }], model: None, stop: None, usage: None },
    ];
    messages
        .into_iter()
        .enumerate()
        .map(|(k, m)| SourceEvent::EntryAppended { id: id(k), parent: if k == 0 { parent.clone() } else { Some(id(k - 1)) }, entry: Entry::Message(m) })
        .collect()
}

/// Before a request a prune must save `minPruneTokens` (and pay for its cache break): a chain whose
/// messages render in fewer tokens is turned down without the candidate context being built — the same
/// verdict as building it (checked against it in debug builds) — and one whose messages render in more
/// is compressed, both through `Session::prepare` before each model request.
#[test]
fn a_chain_too_short_to_save_the_minimum_is_turned_down_and_a_long_one_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    for (name, said, want_chains) in [("short", "Let me check.".to_string(), false), ("long", "Let me think this through. ".repeat(300), true)] {
        let s = store.create_session(name).unwrap();
        let mut parent = None;
        for turn in 0..12 {
            for (k, e) in chain(turn, parent.clone(), &said, 300).into_iter().enumerate() {
                // A model request before each reply.
                if k == 1 || k == 3 {
                    let r = s.prepare().unwrap();
                    assert!(condense_render::check(&r.messages[..]).is_empty());
                }
                s.append(vec![e]).unwrap();
            }
            parent = Some(format!("{turn}-3"));
        }
        let chains = s.projection().unwrap().index().chains.len();
        assert_eq!(chains > 0, want_chains, "{name}: {chains} chains compressed");
    }
}

/// Issue 60, item 3: prunes held back because re-sending the rewritten context would cost more than they
/// save go ahead on a request the host says finds the provider's cache cold (`Session::with_cold_cache`):
/// the whole context is sent uncached then anyway.
#[test]
fn prunes_held_back_go_ahead_when_the_cache_is_cold() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("cold").unwrap();
    let mut parent = None;
    for turn in 0..8 {
        for (k, e) in chain(turn, parent.clone(), "Let me check.", 300).into_iter().enumerate() {
            if k == 1 || k == 3 {
                s.with_cold_cache(false, || s.prepare()).unwrap();
            }
            s.append(vec![e]).unwrap();
        }
        parent = Some(format!("{turn}-3"));
    }
    let chains = |s: &condense_engine::Session| s.projection().unwrap().index().chains.len();
    let tokens = |r: &condense_render::Rendered| r.messages.iter().map(|m| condense_tokens::estimate(m)).sum::<u64>();
    let warm = s.prepare().unwrap();
    assert_eq!(chains(&s), 0, "held back while the cache is warm");
    s.append(vec![SourceEvent::EntryAppended { id: "p".into(), parent, entry: Entry::Message(Message::user_text("and now?", UserOrigin::Prompt)) }]).unwrap();
    let cold = s.with_cold_cache(true, || s.prepare()).unwrap();
    assert!(chains(&s) >= 7, "the held chains went ahead: {}", chains(&s));
    assert!(tokens(&cold) < tokens(&warm), "{} tokens against {}", tokens(&cold), tokens(&warm));
    assert!(condense_render::check(&cold.messages[..]).is_empty());
}
