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

/// Issue 60, item 4: a long autonomous run (one prompt, forty turns of reads, no final reply yet) has its
/// older turns compressed into blocks as it runs, through `Session::prepare` before each model request:
/// the context keeps the prompt, the blocks and the newest turns' calls, stays provider-valid and is the
/// render a fresh fold of the log gives; a block's outputs come back byte for byte; the final reply
/// compresses the chain whole into one block.
#[test]
fn a_long_running_chain_has_its_older_turns_compressed_as_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("run").unwrap();
    let output = |n: usize| (0..120).map(|k| format!("fn item_{n}_{k}() -> Value{k} {{ load_{k}() }}\n")).collect::<String>();
    let mut parent = "p".to_string();
    s.append(vec![SourceEvent::EntryAppended { id: parent.clone(), parent: None, entry: Entry::Message(Message::user_text("port every module", UserOrigin::Prompt)) }]).unwrap();
    let calls_in = |r: &condense_render::Rendered| r.messages.iter().flat_map(|m| m.tool_calls()).count();
    let tokens = |r: &condense_render::Rendered| r.messages.iter().map(|m| condense_tokens::estimate(m)).sum::<u64>();
    let mut peak = 0;
    for n in 0..40 {
        let r = s.prepare().unwrap();
        assert!(condense_render::check(&r.messages[..]).is_empty(), "turn {n}");
        peak = peak.max(tokens(&r));
        let said = Message::Assistant {
            content: vec![Block::Text { text: format!("Reading module {n}.") }, Block::tool_call(format!("c{n}"), "read".into(), format!("{{\"path\":\"src/m{n}.rs\"}}"))],
            model: None,
            stop: None,
            usage: None,
        };
        let out = Message::ToolResult { call_id: format!("c{n}"), tool_name: "read".into(), content: vec![Block::Text { text: output(n) }], is_error: false };
        let (a, o) = (format!("a{n}"), format!("o{n}"));
        s.append(vec![
            SourceEvent::EntryAppended { id: a.clone(), parent: Some(parent.clone()), entry: Entry::Message(said) },
            SourceEvent::EntryAppended { id: o.clone(), parent: Some(a), entry: Entry::Message(out) },
        ])
        .unwrap();
        parent = o;
    }
    let running = s.prepare().unwrap();
    assert!(condense_render::check(&running.messages[..]).is_empty());
    assert_eq!(*running.messages, *s.render_at(s.head().unwrap()).unwrap().messages, "a fresh fold renders the same");
    let blocks: Vec<(u32, Vec<u32>)> = s.projection().unwrap().index().chains.values().map(|c| (c.compressed.block, c.compressed.refs.clone())).collect();
    assert!(blocks.len() >= 2, "{blocks:?}");
    let bodies: Vec<String> = running.messages.iter().filter_map(|m| m.content().first().and_then(|b| match b {
        Block::Text { text } if text.starts_with("[Compressed chain b") => Some(text.clone()),
        _ => None,
    })).collect();
    assert_eq!(bodies.len(), blocks.len(), "{bodies:?}");
    // The prompt, the blocks, and the newest turns' calls (more than SEGMENT_KEEP_TURNS, fewer than all).
    let kept = calls_in(&running);
    assert!((condense_chain::SEGMENT_KEEP_TURNS..40 - condense_chain::SEGMENT_MIN_CALLS).contains(&kept), "{kept} calls kept");
    assert!(running.messages.last().unwrap().content().iter().any(|b| matches!(b, Block::Text { text } if text.contains("t40") || text.contains("item_39_"))));
    assert!(tokens(&running) < peak, "the context shrank: {} tokens, {peak} at its largest", tokens(&running));
    // Block 1's outputs, byte for byte.
    let answer = s.query(&["b1".to_string()]).unwrap();
    assert!(!answer.is_error, "{}", answer.text);
    assert_eq!(answer.originals.len(), blocks[0].1.len());
    assert_eq!(answer.originals[0].1, output(0));
    // The final reply: one block for the whole chain.
    s.append(vec![SourceEvent::EntryAppended {
        id: "f".into(),
        parent: Some(parent),
        entry: Entry::Message(Message::Assistant { content: vec![Block::Text { text: "All forty modules are ported.".into() }], model: None, stop: None, usage: None }),
    }])
    .unwrap();
    s.append(vec![SourceEvent::EntryAppended { id: "q".into(), parent: Some("f".into()), entry: Entry::Message(Message::user_text("thanks", UserOrigin::Prompt)) }]).unwrap();
    let closed = s.prepare().unwrap();
    assert!(condense_render::check(&closed.messages[..]).is_empty());
    assert_eq!(calls_in(&closed), 0, "{:?}", closed.messages);
    let whole = s.projection().unwrap().index().chains.values().last().unwrap().compressed.clone();
    assert_eq!((whole.first.as_str(), whole.last.as_str(), whole.refs.len()), ("p", "f", 40));
    assert_eq!(closed.messages.iter().filter(|m| m.content().iter().any(|b| matches!(b, Block::Text { text } if text.starts_with("[Compressed chain b")))).count(), 1);
    assert_eq!(*closed.messages, *s.render_at(s.head().unwrap()).unwrap().messages);
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

/// Issue 60, item 1: every decision that changes the context has an account (what it took out, what its
/// rewrite cost, what it saved since), and the accounts explain what pruning saved: their nets add up to
/// the difference between the session replayed with pruning off and on (within 1%: a stub's size is
/// estimated from its text). Through `simulate::replay`, which prepares each request as a host does.
#[test]
fn each_decision_is_accounted_and_the_accounts_add_up_to_what_pruning_saved() {
    use condense_engine::simulate::{replay, Prices};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // The demo's session: hundreds of calls, large outputs, failures, repeats, chains of turns.
    let demo = condense_engine::demo::generate(condense_engine::demo::DemoConfig { prompts: 8, calls_per_prompt: 20 });
    let events = condense_formats::import_bytes("demo.jsonl", demo.as_bytes()).unwrap().events;
    let on = condense_events::PruneConfig::default();
    let off = condense_events::PruneConfig { enabled: false, ..on.clone() };
    let pruned = replay(&store, "on", events.clone(), on, Prices::default()).unwrap();
    let plain = replay(&store, "off", events, off, Prices::default()).unwrap();
    let a = &pruned.accounts;
    assert!(a.decisions > 10, "{a:?}");
    for kind in [condense_engine::accounts::Kind::Stub, condense_engine::accounts::Kind::Dedup, condense_engine::accounts::Kind::Chain] {
        assert!(a.by_kind.iter().any(|k| k.0 == kind && k.1 > 0), "{kind:?} in {a:?}");
    }
    assert_eq!(plain.accounts.decisions, 0, "nothing to account with pruning off");
    let saved = plain.cost_units_rendered - pruned.cost_units_rendered;
    assert!(saved > 0.0);
    assert!((a.net - saved).abs() <= 0.01 * saved, "the accounts' net {:.0} against {saved:.0} saved", a.net);
    // Kept reads are apart: keeping one costs what a stub would have saved, pruning on or off.
    assert!(a.kept_reads > 0 && a.kept_reads_net < 0.0, "{a:?}");
}

/// Issue 60, item 1, through `Session::prepare_then` and `Session::account` as a host calls them before
/// each model request: a decision pays for its rewrite on a warm cache and nothing on a cold one (where what
/// it took out would have been read uncached), saves its tokens at the cached price on every request after,
/// and saves nothing more once the host compacts its messages away.
#[test]
fn an_account_pays_its_rewrite_then_saves_each_request_until_the_host_compacts_it_away() {
    use condense_engine::accounts::{Accounts, Kind, Models};
    use condense_engine::simulate::Prices;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let prices = Prices { cached: 0.1, uncached: 1.25, cache_ttl: None };
    let said = "Let me think this through. ".repeat(300);
    for cold_at_first in [false, true] {
        let s = store.create_session(if cold_at_first { "cold" } else { "warm" }).unwrap();
        let mut accounts = Accounts::new(prices, Models::default(), 0);
        let request = |s: &condense_engine::Session, accounts: &mut Accounts, cold: bool| {
            s.with_cold_cache(cold, || s.prepare_then(|p, r| s.account(accounts, p, &r.messages, cold))).unwrap().unwrap()
        };
        // Turns, a request before each reply, until the first chain is compressed (in the second run on
        // requests that find the cache cold).
        let mut parent = None;
        'turns: for turn in 0..12 {
            for (k, e) in chain(turn, parent.clone(), &said, 300).into_iter().enumerate() {
                if k == 1 || k == 3 {
                    request(&s, &mut accounts, cold_at_first);
                    if !accounts.is_empty() {
                        break 'turns;
                    }
                }
                s.append(vec![e]).unwrap();
            }
            parent = Some(format!("{turn}-3"));
        }
        let first = accounts.list();
        let chain = first.iter().find(|a| a.kind == Kind::Chain).expect("a chain's account");
        assert!(chain.tokens > 1_000, "{chain:?}");
        assert_eq!(chain.requests, 1);
        if cold_at_first {
            // Nothing was cached: no premium, and what it took out would have been read uncached.
            assert_eq!(chain.premium, 0.0, "{chain:?}");
            assert!((chain.saved - chain.tokens as f64 * 1.25).abs() < 1e-6, "{chain:?}");
        } else {
            assert!(chain.premium > 0.0 && chain.net() < chain.saved, "{chain:?}");
        }
        // Each warm request after saves its tokens at the cached price.
        let seq = chain.seq;
        for _ in 0..3 {
            request(&s, &mut accounts, false);
        }
        let later = accounts.list().into_iter().find(|a| a.seq == seq).unwrap();
        assert_eq!(later.requests, 4);
        assert!((later.saved - chain.saved - 3.0 * 0.1 * chain.tokens as f64).abs() < 1e-6, "{later:?} after {chain:?}");
        assert!(!later.ended);
        // The host compacts everything before a new prompt away: the chain's messages leave the context.
        let leaf = s.with_projection(|p| p.leaf_id().map(str::to_string)).unwrap();
        s.append(vec![
            SourceEvent::EntryAppended {
                id: "compaction".into(),
                parent: leaf,
                entry: Entry::HostCompaction { summary: Some("all of it".into()), first_kept: None, replacement: Vec::new(), tokens_before: None },
            },
            SourceEvent::EntryAppended { id: "after".into(), parent: Some("compaction".into()), entry: Entry::Message(Message::user_text("start over", UserOrigin::Prompt)) },
        ])
        .unwrap();
        request(&s, &mut accounts, false);
        request(&s, &mut accounts, false);
        let ended = accounts.list().into_iter().find(|a| a.seq == seq).unwrap();
        assert!(ended.ended, "{ended:?}");
        assert_eq!((ended.requests, ended.saved), (later.requests, later.saved), "it saves nothing once compacted away");
    }
}
