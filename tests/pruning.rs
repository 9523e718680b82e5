//! Seed 000's Testing section, as written there, on hand-built sessions: the recovery grace window in the
//! stub-replace phase, chain-compression deferral, and the other render phases; then the pipeline end to
//! end through the engine (capture, dedup, spill, summarize, chains, recovery).

use condense_events::{
    BatchOutcome, Block, DecisionEvent, Entry, Event, Message, PruneConfig, Record, SourceEvent, UserOrigin, QUERY_TOOL_NAME,
};
use condense_render::Projection;

/// Builds a session event by event.
struct S {
    p: Projection,
    seq: u64,
    n: usize,
    last: Option<String>,
    next_ref: u32,
}

impl S {
    fn new(cfg: PruneConfig) -> S {
        let mut s = S { p: Projection::new(), seq: 0, n: 0, last: None, next_ref: 1 };
        s.ev(Event::Source(SourceEvent::PruneConfigured(cfg)));
        s
    }
    fn ev(&mut self, e: Event) {
        self.seq += 1;
        self.p.apply(self.seq, &e);
    }
    fn msg(&mut self, m: Message) -> String {
        self.n += 1;
        let id = format!("e{}", self.n);
        let parent = self.last.replace(id.clone());
        self.ev(Event::Source(SourceEvent::EntryAppended { id: id.clone(), parent, entry: Entry::Message(m) }));
        id
    }
    fn prompt(&mut self, t: &str) {
        self.msg(Message::user_text(t, UserOrigin::Prompt));
    }
    fn reply(&mut self, t: &str) {
        self.msg(Message::Assistant { content: vec![Block::Text { text: t.into() }], model: None, stop: None, usage: None });
    }
    /// A call and its result; returns (call entry, result entry).
    fn call(&mut self, id: &str, tool: &str, output: &str) -> (String, String) {
        let a = self.msg(Message::Assistant {
            content: vec![Block::tool_call(id.into(), tool.into(), "{\"refs\":[\"t1\"]}".into())],
            model: None,
            stop: None,
            usage: None,
        });
        let r = self.msg(Message::ToolResult {
            call_id: id.into(),
            tool_name: tool.into(),
            content: vec![Block::Text { text: output.into() }],
            is_error: false,
        });
        (a, r)
    }
    /// Records and summarizes the output of `(call entry, result entry)` as one batch.
    fn prune(&mut self, call: &(String, String), call_id: &str, tool: &str, protected: bool) -> u32 {
        let r = self.next_ref;
        self.next_ref += 1;
        let rec = Record {
            ref_n: r,
            batch: r,
            entry: call.1.clone(),
            call_entry: call.0.clone(),
            call_id: call_id.into(),
            occurrence: format!("{call_id}@{}", call.1),
            tool: tool.into(),
            arguments: "{}".into(),
            is_error: false,
            chars: 5000,
            hash: format!("h{r}"),
            turn: 0,
            utg: 0,
            protected,
        };
        self.ev(Event::Decision(DecisionEvent::OutputCaptured(Box::new(rec))));
        self.ev(Event::Decision(DecisionEvent::BatchClosed {
            batch: r,
            refs: vec![r],
            outcome: BatchOutcome::Summarized,
            summaries: vec![(r, format!("summary of t{r}"))],
        }));
        r
    }
    /// Text of the rendered result of `call_id`.
    fn shown(&self, call_id: &str) -> Vec<String> {
        self.p
            .render()
            .messages
            .iter()
            .filter_map(|m| match &**m {
                Message::ToolResult { call_id: c, .. } if c == call_id => Some(m.text()),
                _ => None,
            })
            .collect()
    }
}

const BIG: &str = "recovered original text, long enough to matter\n";

fn grace(k: u64) -> PruneConfig {
    PruneConfig { recovery_grace_turns: k, ..PruneConfig::default() }
}

/// A recovery made in the first user-turn-group, then `age` more user-turn-groups.
fn recovery_aged(k: u64, age: usize, tool: &str, protected: bool) -> S {
    let mut s = S::new(grace(k));
    s.prompt("recover t1");
    let c = s.call("q1", tool, &BIG.repeat(40));
    s.prune(&c, "q1", tool, protected);
    s.reply("done");
    for i in 0..age {
        s.prompt(&format!("next {i}"));
        s.reply("ok");
    }
    s
}

#[test]
fn recovery_output_at_age_0_is_verbatim() {
    let s = recovery_aged(3, 0, QUERY_TOOL_NAME, false);
    assert_eq!(s.shown("q1"), vec![BIG.repeat(40)]);
}

#[test]
fn recovery_output_aged_exactly_k_is_verbatim() {
    let s = recovery_aged(3, 3, QUERY_TOOL_NAME, false);
    assert_eq!(s.shown("q1"), vec![BIG.repeat(40)]);
}

#[test]
fn recovery_output_aged_k_plus_1_is_stubbed() {
    let s = recovery_aged(3, 4, QUERY_TOOL_NAME, false);
    assert!(s.shown("q1")[0].starts_with("summary of t1\n[pruned; context_tree_query t1 for the original]"), "{:?}", s.shown("q1"));
}

#[test]
fn grace_0_stubs_recovery_output_immediately() {
    let s = recovery_aged(0, 0, QUERY_TOOL_NAME, false);
    assert!(s.shown("q1")[0].starts_with("summary of t1"));
}

#[test]
fn other_tools_are_stubbed_at_age_0() {
    let s = recovery_aged(3, 0, "bash", false);
    assert!(s.shown("q1")[0].starts_with("summary of t1"));
}

#[test]
fn protected_recovery_stays_verbatim_at_any_age() {
    let s = recovery_aged(3, 10, QUERY_TOOL_NAME, true);
    assert_eq!(s.shown("q1"), vec![BIG.repeat(40)]);
}

#[test]
fn spilled_recovery_in_grace_is_verbatim_then_a_spill_pointer() {
    for (age, verbatim) in [(0, true), (3, true), (4, false)] {
        let mut s = S::new(grace(3));
        s.prompt("recover");
        let c = s.call("q1", QUERY_TOOL_NAME, &BIG.repeat(2000));
        let r = s.prune(&c, "q1", QUERY_TOOL_NAME, false);
        s.ev(Event::Decision(DecisionEvent::OutputSpilled { ref_n: r, blob: "ab".repeat(32), bytes: 96_000, preview: "recovered original".into() }));
        s.reply("done");
        for i in 0..age {
            s.prompt(&format!("p{i}"));
            s.reply("ok");
        }
        let shown = &s.shown("q1")[0];
        if verbatim {
            assert_eq!(shown, &BIG.repeat(2000), "age {age}");
        } else {
            assert!(shown.starts_with("[t1 · context_tree_query · 96000 bytes, spilled to storage"), "age {age}: {shown}");
        }
    }
}

#[test]
fn repeated_recoveries_are_judged_each_by_its_own_position() {
    let mut s = S::new(grace(1));
    s.prompt("first");
    let c1 = s.call("q1", QUERY_TOOL_NAME, &BIG.repeat(40));
    s.prune(&c1, "q1", QUERY_TOOL_NAME, false);
    s.reply("ok");
    s.prompt("second");
    let c2 = s.call("q2", QUERY_TOOL_NAME, &BIG.repeat(40));
    s.prune(&c2, "q2", QUERY_TOOL_NAME, false);
    s.reply("ok");
    s.prompt("third");
    s.reply("ok");
    // now = 3: q1 (utg 1) is aged 2 > 1 → stub; q2 (utg 2) is aged 1 → verbatim.
    assert!(s.shown("q1")[0].starts_with("summary of t1"));
    assert_eq!(s.shown("q2"), vec![BIG.repeat(40)]);
}

// ---------------------------------------------------------------------------------------------------
// The pipeline through the engine.

use condense_engine::{Session, Store};

struct Live {
    _dir: tempfile::TempDir,
    store: Store,
    s: Session,
    n: usize,
}

impl Live {
    fn new(cfg: PruneConfig) -> Live {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let s = store.create_session("live").unwrap();
        s.configure(cfg).unwrap();
        Live { _dir: dir, store, s, n: 0 }
    }
    fn add(&mut self, m: Message) {
        condense_tests::append_entry(&self.s, &mut self.n, m);
    }
    fn prompt(&mut self, t: &str) {
        self.add(Message::user_text(t, UserOrigin::Prompt));
    }
    /// A request: the pipeline runs, then the assistant answers.
    fn answer(&mut self, content: Vec<Block>) {
        let r = self.s.prepare().unwrap();
        assert!(condense_render::check(&r.messages[..]).is_empty());
        self.add(Message::Assistant { content, model: None, stop: None, usage: None });
    }
    fn tool(&mut self, id: &str, name: &str, args: &str, output: &str, is_error: bool) {
        self.answer(vec![Block::tool_call(id.into(), name.into(), args.into())]);
        self.add(Message::ToolResult { call_id: id.into(), tool_name: name.into(), content: vec![Block::Text { text: output.into() }], is_error });
    }
    fn reply(&mut self, t: &str) {
        self.answer(vec![Block::Text { text: t.into() }]);
    }
    /// A chain: `prompt`, one `bash` call running `command` with 200 lines of `line` as its output, and
    /// the final `reply`.
    fn chain(&mut self, prompt: &str, call: &str, command: &str, line: &str, reply: &str) {
        self.prompt(prompt);
        self.tool(call, "bash", &format!("{{\"command\":\"{command}\"}}"), &format!("{line}\n").repeat(200), false);
        self.reply(reply);
    }
    fn chains(&self) -> usize {
        self.s.projection().unwrap().index().chains.len()
    }
}

fn eager() -> PruneConfig {
    PruneConfig { rolling_window: 0, min_prune_tokens: 0, recovery_grace_turns: 1, ..PruneConfig::default() }
}

#[test]
fn chain_with_in_grace_recovery_is_deferred_then_compressed() {
    let mut l = Live::new(eager());
    l.prompt("look at t1 again");
    l.tool("q1", QUERY_TOOL_NAME, "{\"refs\":[\"t1\"]}", &BIG.repeat(60), false);
    l.reply("here it is");
    l.prompt("and now?");
    l.answer(vec![Block::Text { text: "thinking".into() }]);
    assert_eq!(l.chains(), 0, "recovery at age 1 with grace 1: the chain waits");
    l.prompt("later");
    l.reply("sure");
    assert_eq!(l.chains(), 1, "aged out: the chain is compressed");
}

#[test]
fn chain_without_recovery_is_compressed_at_once() {
    let mut l = Live::new(eager());
    l.chain("run the tests", "b1", "cargo test", "test x ... ok", "all green");
    l.prompt("thanks");
    l.reply("welcome");
    assert_eq!(l.chains(), 1);
    let r = l.s.render().unwrap();
    assert!(r.messages.iter().any(|m| m.text().starts_with("[Compressed chain b1]\nt1 ")), "the block names its output on its line (and needs no count)");
    assert!(!r.messages.iter().any(|m| matches!(**m, Message::ToolResult { .. })));
}

/// A compressed chain's long final reply renders as its first `REPLY_HEAD_CHARS` characters and a marker
/// naming the block (one `ChainReplyCut`); while its chain is the newest closed one the reply stays whole,
/// and the cut comes with the next prune; the block's query gives it back whole; a short reply stays as it
/// is; the render after the decision is the render of a projection folded afresh.
#[test]
fn a_compressed_chains_long_reply_renders_cut_and_its_block_gives_it_back() {
    let mut l = Live::new(eager());
    let long = format!("All green. {}", "The parser now reads every line once and the writer keeps up; ".repeat(8));
    l.chain("run the tests", "b1", "cargo test", "test x ... ok", &long);
    l.prompt("and the docs?");
    l.tool("b2", "bash", "{\"command\":\"cargo doc\"}", &"doc y ... ok\n".repeat(200), false);
    assert_eq!(l.chains(), 1, "the first chain is compressed at the prune after its reply");
    let r = l.s.render().unwrap();
    assert!(r.messages.iter().any(|m| m.text() == long), "the newest closed chain keeps its reply whole");
    assert_eq!(l.s.projection().unwrap().index().chains[&1].reply, None);
    l.reply("fine");
    l.prompt("thanks");
    l.reply("welcome");
    assert_eq!(l.chains(), 2);
    let r = l.s.render().unwrap();
    let head: String = long.chars().take(condense_chain::REPLY_HEAD_CHARS).collect();
    let cut = format!("{} […rest: context_tree_query b1]", head.trim_end());
    assert!(r.messages.iter().any(|m| m.text() == cut), "{:#?}", r.messages.iter().map(|m| m.text()).collect::<Vec<_>>());
    assert!(!r.messages.iter().any(|m| m.text().contains(&long)));
    assert!(r.messages.iter().any(|m| m.text() == "fine"), "a short reply is not cut");
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().chains[&1].reply.as_deref(), Some(cut.as_str()));
    assert_eq!(p.index().chains[&2].reply, None);
    let a = l.s.query(&["b1".into()]).unwrap();
    assert!(!a.is_error && a.text.ends_with(&format!("=== b1 · final reply ===\n{long}")), "{}", a.text);
    assert!(!l.s.query(&["b2".into()]).unwrap().text.contains("final reply"));
    // The kept render patched in place is the render of the same log folded from scratch.
    let events = l.store.log().read(l.s.id(), 1, l.s.head().unwrap()).unwrap();
    let mut fresh = Projection::new();
    for e in &events {
        fresh.apply(e.seq, &e.body);
    }
    assert_eq!(fresh.render().messages, r.messages);
}

#[test]
fn pipeline_stubs_dedups_spills_and_every_ref_recovers_exactly() {
    let cfg = PruneConfig { spill_threshold: 20_000, min_prune_tokens: 0, ..PruneConfig::default() };
    let mut l = Live::new(cfg);
    let log = "line of build output with src/main.rs:10\n".repeat(100);
    let huge = "x".repeat(30_000);
    l.prompt("build it");
    l.tool("c1", "bash", "{\"command\":\"make\"}", &log, false);
    l.tool("c2", "bash", "{\"command\":\"make\"}", &(log.clone() + "   \r\n"), false);
    l.tool("c3", "bash", "{\"command\":\"cat big.txt\"}", &huge, false);
    l.tool("c4", "bash", "{\"command\":\"ls\"}", "a\nb", false);
    l.reply("built");
    l.prompt("next");
    l.reply("ok");
    let p = l.s.projection().unwrap();
    let idx = p.index();
    assert_eq!(idx.records.len(), 4);
    assert_eq!(idx.aliases.get(&2), Some(&1), "c2 repeats c1 up to trailing whitespace");
    assert!(idx.spills.contains_key(&3));
    assert!(idx.summaries.contains_key(&1));
    for (r, text) in [(1, log.clone()), (2, log.clone() + "   \r\n"), (3, huge.clone()), (4, "a\nb".to_string())] {
        let a = l.s.query(&[format!("t{r}")]).unwrap();
        assert!(!a.is_error);
        assert_eq!(a.originals, vec![(r, text)], "t{r}");
    }
    // Raw ids work too, and bad arguments say what to pass.
    assert_eq!(l.s.query(&["c3".into()]).unwrap().originals[0].0, 3);
    let empty = l.s.query_tool("{}").unwrap();
    assert!(empty.is_error && empty.text.contains("Pass {\"refs\": [\"t12\"]}"), "{}", empty.text);
    let unknown = l.s.query_tool("{\"refs\":[\"t99\"]}").unwrap();
    assert!(unknown.is_error && unknown.text.contains("unknown ref t99 (known refs are t1–t4)"), "{}", unknown.text);
    // A stub, once shown, is shown identically on every later turn.
    let before: Vec<String> = l.s.render().unwrap().messages.iter().filter(|m| m.role() == "tool").map(|m| m.text()).collect();
    l.prompt("one more");
    l.reply("fine");
    let after: Vec<String> = l.s.render().unwrap().messages.iter().filter(|m| m.role() == "tool").map(|m| m.text()).collect();
    assert_eq!(before[..before.len().min(after.len())], after[..before.len().min(after.len())]);
}

/// Seed 000: `protectedTools` defaults to `[]`, so under the defaults a recovery's output is captured and
/// indexed like any other, verbatim through its grace window and a stub past it; named in
/// `protectedTools`, the same output stays verbatim at any age (the permanent retention the seed rejects
/// as the default).
#[test]
fn protected_tools_default_to_none_so_a_recovery_ages_into_a_stub() {
    assert!(PruneConfig::default().protected_tools.is_empty());
    let original = BIG.repeat(40);
    for protected in [false, true] {
        // Chains stay open (a wide rolling window): the stub is phase 1's doing alone.
        let mut cfg = PruneConfig { min_prune_tokens: 0, auto_budget_threshold: 0, rolling_window: 100, ..PruneConfig::default() };
        if protected {
            cfg.protected_tools = vec![QUERY_TOOL_NAME.to_string()];
        }
        let mut l = Live::new(cfg);
        l.prompt("recover t1");
        l.tool("q1", QUERY_TOOL_NAME, r#"{"refs":["t1"]}"#, &original, false);
        l.reply("done");
        let shown = |l: &Live| l.s.render().unwrap().messages.iter().find(|m| matches!(***m, Message::ToolResult { .. })).map(|m| m.text());
        for age in 1..=5 {
            l.prompt(&format!("next {age}"));
            l.reply("ok");
            let verbatim = shown(&l).as_ref() == Some(&original);
            assert_eq!(verbatim, protected || age <= 3, "protected {protected}, age {age}: {:?}", shown(&l));
        }
    }
}

#[test]
fn errored_arguments_are_purged_after_two_turns() {
    let cfg = PruneConfig { rolling_window: 1, min_prune_tokens: 0, auto_budget_threshold: 0, ..PruneConfig::default() };
    let mut l = Live::new(cfg);
    l.prompt("edit");
    let big = format!("{{\"path\":\"a.rs\",\"oldText\":\"{}\"}}", "y".repeat(800));
    l.tool("e1", "edit", &big, "Error: oldText not found", true);
    l.tool("e2", "bash", "{\"command\":\"ls\"}", &"z\n".repeat(600), false);
    l.tool("e3", "bash", "{\"command\":\"ls\"}", &"w\n".repeat(600), false);
    l.reply("gave up");
    l.prompt("ok");
    l.reply("yes");
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().purged.get(&("e2".to_string(), "e1".to_string())), Some(&(big.len() as u64)));
    let r = l.s.render().unwrap();
    let args: Vec<String> = r.messages.iter().flat_map(|m| m.tool_calls().filter(|c| c.0 == "e1").map(|c| c.2.to_string()).collect::<Vec<_>>()).collect();
    assert_eq!(args, vec![format!("{{\"purged\":\"arguments of a failed call ({} chars) removed\"}}", big.len())]);
}

/// Over many prunes, every failed call whose arguments are long enough is purged once it is old enough,
/// and calls whose arguments are too short stay; lowering `purgeMinChars` later purges those too (the
/// purge looks only at the errored outputs it has not settled, and settles them anew under a new limit).
#[test]
fn errored_arguments_are_purged_at_every_later_prune_and_again_under_a_new_limit() {
    let cfg = PruneConfig { min_prune_tokens: 0, auto_budget_threshold: 0, ..PruneConfig::default() };
    let mut l = Live::new(cfg.clone());
    let args = |i: usize, long: bool| format!("{{\"path\":\"f{i}.rs\",\"oldText\":\"{}\"}}", "y".repeat(if long { 700 } else { 300 }));
    for i in 0..12 {
        l.prompt(&format!("task {i}"));
        l.tool(&format!("e{i}"), "edit", &args(i, i % 3 != 0), "Error: oldText not found", true);
        l.tool(&format!("ok{i}"), "bash", "{\"command\":\"ls\"}", &format!("{i}\n").repeat(700), false);
        l.reply("next");
    }
    let purged = |l: &Live| -> Vec<String> {
        let p = l.s.projection().unwrap();
        p.index().purged.keys().map(|(_, call)| call.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect()
    };
    // The last task's call is too recent; of the others, the long ones.
    let long: Vec<String> = (0..11).filter(|i| i % 3 != 0).map(|i| format!("e{i}")).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(purged(&l), long);
    l.s.configure(PruneConfig { purge_min_chars: 200, ..cfg }).unwrap();
    for i in 12..15 {
        l.prompt(&format!("task {i}"));
        l.tool(&format!("ok{i}"), "bash", "{\"command\":\"ls\"}", &format!("{i}\n").repeat(700), false);
        l.reply("next");
    }
    let all: Vec<String> = (0..12).map(|i| format!("e{i}")).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(purged(&l), all);
}

#[test]
fn replaying_the_same_events_decides_the_same() {
    let run = || {
        let mut l = Live::new(eager());
        for i in 0..4 {
            l.prompt(&format!("task {i}"));
            l.tool(&format!("c{i}"), "bash", "{\"command\":\"make\"}", &format!("output {i}\n").repeat(300), i % 2 == 0);
            l.reply("done");
        }
        serde_json::to_string(&condense_formats::export::neutral(&l.s.render().unwrap().messages[..])).unwrap()
    };
    assert_eq!(run(), run());
}

/// Random sessions with the pipeline on and eager settings: every prepared context is provider-valid
/// (checked inside `answer`) and every ref recovers its original byte for byte.
#[test]
fn random_sessions_stay_valid_and_recover_exactly() {
    use condense_engine::demo::Rng;
    for seed in 1..=12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let cfg = PruneConfig {
            rolling_window: rng.below(3),
            min_prune_tokens: 0,
            auto_budget_threshold: 200 * rng.below(10),
            spill_threshold: 3000,
            recovery_grace_turns: rng.below(3),
            batching_mode: if rng.below(2) == 0 { condense_events::BatchingMode::Turn } else { condense_events::BatchingMode::AgentMessage },
            ..PruneConfig::default()
        };
        let mut l = Live::new(cfg);
        let mut originals: Vec<(String, String)> = Vec::new();
        let mut call = 0;
        for _ in 0..8 {
            l.prompt("do the next thing");
            for _ in 0..rng.below(5) {
                let calls = 1 + rng.below(3) as usize;
                let mut blocks = Vec::new();
                let mut outs = Vec::new();
                for _ in 0..calls {
                    call += 1;
                    let id = format!("c{}", call % 7); // providers reuse ids
                    let text = match rng.below(4) {
                        0 => "same output every time\n".repeat(60),
                        1 => format!("unique {call}\n").repeat(1 + rng.below(400) as usize),
                        2 => "tiny".to_string(),
                        _ => format!("{call}").repeat(1000 + rng.below(3000) as usize),
                    };
                    let tool = if rng.below(6) == 0 { QUERY_TOOL_NAME } else { "bash" };
                    blocks.push(Block::tool_call(id.clone(), tool.into(), "{\"x\":1}".into()));
                    outs.push((id, tool, text, rng.below(5) == 0));
                }
                l.answer(blocks);
                for (id, tool, text, err) in outs {
                    if rng.below(10) != 0 {
                        l.add(Message::ToolResult { call_id: id.clone(), tool_name: tool.into(), content: vec![Block::Text { text: text.clone() }], is_error: err });
                        originals.push((format!("e{}", l.n), text));
                    }
                }
            }
            l.reply("done");
        }
        l.s.prune_now().unwrap();
        let p = l.s.projection().unwrap();
        let idx = p.index();
        assert!(!idx.records.is_empty(), "seed {seed}");
        for (r, rec) in idx.records.iter() {
            let want = &originals.iter().find(|(e, _)| e == &rec.entry).expect("recorded output exists").1;
            let got = l.s.query(&[format!("t{r}")]).unwrap();
            assert_eq!(&got.originals[0].1, want, "seed {seed} t{r}");
        }
        assert!(condense_render::check(&l.s.render().unwrap().messages[..]).is_empty(), "seed {seed}");
    }
}

#[test]
fn condensed_turn_arguments_come_back_with_the_query() {
    let cfg = PruneConfig { rolling_window: 1, min_prune_tokens: 0, ..PruneConfig::default() };
    let mut l = Live::new(cfg);
    let content = "fn main() { println!(\"hello\"); }\n".repeat(20);
    let args = format!("{{\"path\":\"src/main.rs\",\"content\":{}}}", serde_json::to_string(&content).unwrap());
    l.prompt("write main");
    l.tool("w1", "write", &args, &"wrote 640 bytes\n".repeat(80), false);
    l.reply("written");
    l.prompt("next");
    let r = l.s.prepare().unwrap();
    let shown: Vec<String> = r.messages.iter().flat_map(|m| m.tool_calls().map(|c| c.2.to_string()).collect::<Vec<_>>()).collect();
    assert_eq!(shown, vec!["{\"path\":\"src/main.rs\",\"content\":\"[660 chars; context_tree_query t1]\"}".to_string()]);
    let a = l.s.query(&["t1".into()]).unwrap();
    assert!(a.text.contains(&format!("[arguments] {args}\n[output]\n")), "{}", a.text);
}

#[test]
fn batch_outcomes_trivial_deduped_oversized_summarized() {
    use condense_events::BatchOutcome::*;
    let cfg = PruneConfig { min_prune_tokens: 0, auto_budget_threshold: 0, rolling_window: 10, ..PruneConfig::default() };
    let mut l = Live::new(cfg);
    let log = "compiling module with a fairly long line of output\n".repeat(60);
    l.prompt("go");
    l.tool("a", "bash", "{\"command\":\"make\"}", &log, false); // summarized
    l.tool("b", "bash", "{\"command\":\"make\"}", &log, false); // a duplicate of a: skipped-deduped
    l.tool("c", "bash", "{\"command\":\"true\"}", "ok", false); // under minBatchChars: skipped-trivial
    l.reply("done");
    l.prompt("next");
    l.reply("fine");
    let p = l.s.projection().unwrap();
    let outcomes: Vec<_> = p.index().outcomes.values().copied().collect();
    assert_eq!(outcomes, vec![Summarized, SkippedDeduped, SkippedTrivial]);

    // A batch whose summary is not smaller than its raw text stays as it is.
    let cfg = PruneConfig { rolling_window: 1, min_prune_tokens: 0, min_batch_chars: 0, auto_budget_threshold: 0, ..PruneConfig::default() };
    let mut l = Live::new(cfg);
    l.prompt("go");
    l.tool("a", "bash", "{\"command\":\"echo\"}", "short", false);
    l.reply("done");
    l.prompt("next");
    l.reply("fine");
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().outcomes.values().copied().collect::<Vec<_>>(), vec![SkippedOversized]);
    assert!(l.s.render().unwrap().messages.iter().any(|m| m.role() == "tool" && m.text() == "short"));
}

#[test]
fn retention_is_whole_for_the_unpruned_context_and_reported_for_the_defaults() {
    use condense_engine::simulate::{replay, Prices};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // A session the host never compacted: with pruning off every needed fact is still in the context.
    let events = condense_tests::corpus_events("pi/badlogic__pi-mono/large-session.jsonl");
    let off = replay(&store, "off", events.clone(), PruneConfig { enabled: false, ..PruneConfig::default() }, Prices::default()).unwrap();
    assert!(off.facts_needed > 100, "{off:?}");
    assert_eq!(off.facts_retained, off.facts_needed);
    assert_eq!(off.retention(), 1.0);
    // Pruned with the defaults: some facts leave with their outputs, most stay.
    let on = replay(&store, "on", events, PruneConfig::default(), Prices::default()).unwrap();
    assert_eq!(on.facts_needed, off.facts_needed, "the same requests need the same facts");
    assert!(on.facts_retained < on.facts_needed && on.retention() > 0.5, "{} of {}", on.facts_retained, on.facts_needed);
}

/// The stage contract end to end: a session whose projection and stages leave memory before every request
/// (its store keeps one session warm, and another session is read in between) folds them again from the
/// log, and writes event for event the same decisions as the same session kept warm throughout. A stage
/// that kept state its fold does not rebuild (learned in `decide`, say) decides differently once refolded.
#[test]
fn stages_folded_again_from_the_log_decide_as_the_warm_ones() {
    use condense_engine::StoreOptions;
    let events = condense_tests::corpus_events("pi/badlogic__pi-mono/before-compaction.jsonl");
    let warm = Store::in_memory(StoreOptions { defer_durability: true, ..StoreOptions::default() });
    let cold = Store::in_memory(StoreOptions { defer_durability: true, warm_limit: 1, ..StoreOptions::default() });
    let a = warm.create_session("s").unwrap();
    let b = cold.create_session("s").unwrap();
    let other = cold.create_session("other").unwrap();
    for ev in events {
        if matches!(&ev, SourceEvent::EntryAppended { entry: Entry::Message(Message::Assistant { .. }), .. }) {
            a.prepare().unwrap();
            drop(other.render().unwrap());
            assert_eq!(cold.warm_count(), 1, "only the other session is warm");
            b.prepare().unwrap();
        }
        a.append(vec![ev.clone()]).unwrap();
        b.append(vec![ev]).unwrap();
    }
    let bodies = |store: &Store, s: &Session| store.log().read(s.id(), 1, s.head().unwrap()).unwrap().into_iter().map(|e| e.body).collect::<Vec<_>>();
    let (kept, refolded) = (bodies(&warm, &a), bodies(&cold, &b));
    let count = |f: fn(&DecisionEvent) -> bool| kept.iter().filter(|e| matches!(e, Event::Decision(d) if f(d))).count();
    let kinds = [
        count(|d| matches!(d, DecisionEvent::OutputAliased { .. })),
        count(|d| matches!(d, DecisionEvent::BatchClosed { .. })),
        count(|d| matches!(d, DecisionEvent::ErrorArgsPurged { .. })),
        count(|d| matches!(d, DecisionEvent::ChainCompressed(_))),
    ];
    assert!(kinds.iter().all(|&n| n > 0), "every stage decided something: {kinds:?}");
    assert_eq!(kept.len(), refolded.len());
    for (i, (x, y)) in kept.iter().zip(&refolded).enumerate() {
        assert_eq!(x, y, "event {}", i + 1);
    }
}

/// A line of the file the live-read tests read.
const CONFIG_FILE: &str = "pub fn parse_config_value(input: &str) -> Result<Value, ConfigError> {}\n";

/// The output of call `r1` as the context shows it now (`None`: not there as a tool result).
fn read_shown(s: &Session) -> Option<String> {
    s.render().unwrap().messages.iter().find_map(|m| match &**m {
        Message::ToolResult { call_id, content, .. } if call_id == "r1" => {
            Some(content.iter().filter_map(|b| if let Block::Text { text } = b { Some(text.as_str()) } else { None }).collect::<String>())
        }
        _ => None,
    })
}

/// A session under `cfg` whose first turn writes `src/config.rs`, reads it back (`file`, call `r1`) and
/// lists a folder, and whose second turn answers a question about it: four assistant turns, one prune
/// after the first turn's reply.
fn read_then_answer(cfg: PruneConfig, file: &str) -> Live {
    let mut l = Live::new(cfg);
    l.prompt("write src/config.rs, read it back and list the folder");
    l.tool("w0", "write", r#"{"path":"src/config.rs","content":"pub fn parse_config_value() {}"}"#, "written", false);
    l.tool("r1", "read", r#"{"path":"src/config.rs"}"#, file, false);
    l.tool("b1", "bash", r#"{"command":"ls"}"#, &"listing line\n".repeat(100), false);
    l.reply("read it");
    l.prompt("what does it parse?");
    l.reply("config values");
    l
}

/// Once the user is in the loop, the budget trigger waits for `AWAITING_REPLY_BUDGET` (14,000) tokens of
/// outputs the model has read before a reply: a file of ~52 KB (~13,000 tokens) read whole stays verbatim
/// for the request that writes from it, where at 10,000 it became a stub as soon as the model had seen it
/// once (docs/pruning.md, "Waiting longer for the reply"); the chain's reply still prunes it.
#[test]
fn a_file_read_whole_stays_for_the_write_that_follows_it() {
    let file = CONFIG_FILE.repeat(720);
    assert!((10_000..condense_events::AWAITING_REPLY_BUDGET).contains(&(file.len() as u64 / 4)), "{}", file.len());
    let mut l = Live::new(PruneConfig::default());
    for i in 0..4 {
        l.chain(&format!("task {i}"), &format!("x{i}"), "make", &format!("build line {i}"), "done");
    }
    l.prompt("rewrite src/config.rs from scratch");
    l.tool("r1", "read", r#"{"path":"src/config.rs"}"#, &file, false);
    l.tool("r2", "read", r#"{"path":"src/config.rs","offset":720}"#, "pub fn tail() {}\n", false);
    // The request that writes the new file: the model has seen the whole read once, and it is still there.
    l.s.prepare().unwrap();
    assert_eq!(read_shown(&l.s).as_deref(), Some(file.as_str()), "the read stays for the write");
    l.tool("w1", "write", r#"{"path":"src/config.rs","content":"pub fn parse_config_value() {}"}"#, "written", false);
    l.reply("rewritten");
    l.prompt("thanks");
    l.s.prepare().unwrap();
    assert_ne!(read_shown(&l.s).as_deref(), Some(file.as_str()), "the chain's reply prunes it");
}

/// What the agent asked to read, a file or a web page of ~80,000 characters (above `spillThreshold`,
/// 65,536), reaches the model whole in the request that answers it: a spill pointer there left the model
/// a 2 KB head of a document it was asked about (issue 34, item 3: the corpus subagent that fetched the
/// hooks documentation and answered from it kept 1 of 22 facts). A command's output that large is still
/// spilled, and so is a read past four times the threshold.
#[test]
fn what_the_agent_asked_to_read_reaches_it_whole_and_a_huge_output_is_spilled() {
    let page = CONFIG_FILE.repeat(1_100);
    assert!(page.len() > 65_536 && page.len() as u64 >= PruneConfig::default().spill_threshold, "{}", page.len());
    let huge = CONFIG_FILE.repeat(3_700);
    for (tool, text, spilled) in [("WebFetch", &page, false), ("read", &page, false), ("bash", &page, true), ("Read", &huge, true)] {
        let mut l = Live::new(PruneConfig::default());
        l.prompt("what does it say about parse_config_value?");
        l.tool("r1", tool, r#"{"path":"docs/hooks.md"}"#, text, false);
        l.s.prepare().unwrap();
        let shown = read_shown(&l.s).unwrap();
        if spilled {
            assert!(shown.starts_with(&format!("[t1 · {tool} · ")) && shown.contains("spilled to storage") && shown.len() < 4_000, "{tool}: {}", &shown[..200]);
        } else {
            assert_eq!(&shown, text, "{tool}: whole, for the answer");
            assert!(l.s.projection().unwrap().index().spills.is_empty());
        }
    }
}

/// `liveReadsTokens` (issue 34, item 3): a read of a file the agent wrote stays verbatim after its turn is
/// pruned while it is the newest call on its file and fits the budget, and its turn's chain waits for it;
/// once a later edit of the file supersedes it, the next prune stubs it (`OutputStubbed`) and the chain
/// compresses. Off (0) the same read leaves the context at the first prune. A reopened store folds the
/// setting back from the log.
#[test]
fn live_file_reads_stay_verbatim_until_a_later_edit_supersedes_them() {
    let file = CONFIG_FILE.repeat(60);
    for tokens in [0, 20_000] {
        let mut l = read_then_answer(PruneConfig { live_reads_tokens: tokens, live_reads_turns: 0, ..eager() }, &file);
        let kept = read_shown(&l.s);
        if tokens == 0 {
            assert_ne!(kept.as_deref(), Some(file.as_str()), "off: the read is pruned with its turn");
            continue;
        }
        assert_eq!(kept.as_deref(), Some(file.as_str()), "the newest read of the file stays verbatim");
        assert_eq!(l.chains(), 0, "its turn's chain waits for it");
        let p = l.s.projection().unwrap();
        let bash = p.index().records.values().find(|r| r.tool == "bash").unwrap().ref_n;
        assert!(p.index().summaries.contains_key(&bash), "the other outputs of the batch are stubs");
        drop(p);
        // A later edit of the same file supersedes the read: the next prune stubs it.
        l.prompt("rename it");
        l.tool("e1", "edit", r#"{"path":"src/config.rs","oldText":"parse_config_value","newText":"parse_value"}"#, "edited", false);
        l.reply("renamed");
        l.prompt("thanks");
        l.reply("welcome");
        assert_ne!(read_shown(&l.s).as_deref(), Some(file.as_str()), "superseded, the read is stubbed");
        assert!(l.chains() >= 1, "the chain it held back compresses");
        let stubbed = l.s.projection().unwrap().index().records.values().find(|r| r.tool == "read").unwrap().ref_n;
        let events = l.store.log().read(l.s.id(), 1, l.s.head().unwrap()).unwrap();
        assert!(
            events.iter().any(|e| matches!(&e.body, Event::Decision(DecisionEvent::OutputStubbed { ref_n, summary }) if *ref_n == stubbed && summary.contains("parse_config_value"))),
            "an OutputStubbed decision with the read's stub"
        );
        assert!(condense_render::check(&l.s.render().unwrap().messages[..]).is_empty());
        // The setting is in the log: a fresh fold has it.
        let head = l.s.head().unwrap();
        assert_eq!(l.s.projection_at(head).unwrap().config().live_reads_tokens, tokens);
        assert_eq!(l.s.projection_at(head).unwrap().config(), l.s.projection().unwrap().config(), "the fold in memory is the fold of the log");
    }
}

/// The agent writes a page, checks it in a browser, reads it back through a read selector
/// (`page.html:raw`) and rewrites it four requests later (the corpus's `01-youtube`, which lost 140 facts
/// at the rewrite): with the defaults, the read of its own file stays verbatim until the rewrite, while a
/// read of a file it never wrote, pruned at the same time, becomes a stub; once the rewrite supersedes it,
/// the next prune stubs it too (docs/pruning.md, "Reading back its own files").
#[test]
fn a_file_the_agent_reads_back_stays_until_it_writes_it_again() {
    let page = CONFIG_FILE.repeat(300);
    let mut l = Live::new(PruneConfig::default());
    l.prompt("make a comparison page and check it");
    l.tool("w1", "write", r#"{"path":"/tmp/page.html","content":"<html>first</html>"}"#, "written", false);
    l.tool("c1", "browser", r#"{"action":"open"}"#, "opened", false);
    l.tool("r1", "read", r#"{"path":"/tmp/page.html:raw"}"#, &page, false);
    l.tool("r2", "read", r#"{"path":"docs/guide.md"}"#, &page.replace("parse", "guide"), false);
    for i in 0..3 {
        l.tool(&format!("c{}", i + 2), "browser", r#"{"action":"run"}"#, &format!("checked {i}"), false);
    }
    // The request that rewrites the page: the budget trigger has pruned both reads' turns.
    l.s.prepare().unwrap();
    let p = l.s.projection().unwrap();
    let ref_of = |call: &str| p.index().records.values().find(|r| r.call_id == call).unwrap().ref_n;
    assert!(p.index().outcomes.len() >= 2, "the reads' batches closed: {:?}", p.index().outcomes);
    assert!(p.index().summaries.contains_key(&ref_of("r2")), "a file it never wrote: a stub");
    assert!(!p.index().summaries.contains_key(&ref_of("r1")), "its own file: no stub");
    drop(p);
    assert_eq!(read_shown(&l.s).as_deref(), Some(page.as_str()), "the page it reads back stays for the rewrite");
    l.tool("w2", "write", r#"{"path":"/tmp/page.html","content":"<html>second</html>"}"#, "written", false);
    l.tool("b1", "bash", r#"{"command":"make"}"#, &"build line\n".repeat(2_000), false);
    l.tool("c9", "browser", r#"{"action":"run"}"#, "checked", false);
    l.s.prepare().unwrap();
    assert_ne!(read_shown(&l.s).as_deref(), Some(page.as_str()), "superseded by the rewrite: stubbed");
    let events = l.store.log().read(l.s.id(), 1, l.s.head().unwrap()).unwrap();
    assert!(events.iter().any(|e| matches!(&e.body, Event::Source(SourceEvent::LiveReadsConfigured { tokens: 12_000, turns: 8 }))), "the defaults are in the log");
    assert!(events.iter().any(|e| matches!(&e.body, Event::Decision(DecisionEvent::OutputStubbed { .. }))));
}

/// In an autonomous run (past the first 40 turns of one prompt, as Claude Code and Codex run) a read of
/// the agent's own file is pruned like any output: no reply comes to end the run, so a kept read would
/// stay for all of it.
#[test]
fn in_an_autonomous_run_a_read_back_file_is_pruned_like_any_output() {
    let page = CONFIG_FILE.repeat(300);
    let mut l = Live::new(PruneConfig::default());
    l.prompt("refactor the whole crate");
    l.tool("w1", "write", r#"{"path":"src/page.rs","content":"pub fn first() {}"}"#, "written", false);
    for i in 0..condense_events::AUTONOMOUS_AFTER_TURNS {
        l.tool(&format!("s{i}"), "bash", r#"{"command":"cargo check"}"#, &format!("ok {i}"), false);
    }
    l.tool("r1", "read", r#"{"path":"src/page.rs"}"#, &page, false);
    l.tool("c1", "bash", r#"{"command":"cargo check"}"#, "ok", false);
    l.s.prepare().unwrap();
    assert_ne!(read_shown(&l.s).as_deref(), Some(page.as_str()), "pruned by the autonomous budget");
    let p = l.s.projection().unwrap();
    let r1 = p.index().records.values().find(|r| r.call_id == "r1").unwrap().ref_n;
    assert!(p.index().summaries.contains_key(&r1));
}

/// `liveReadsTurns`: under `liveReadsTokens`, a read nothing supersedes stays verbatim only while it is
/// at most that many assistant turns old; at the first prune past that it gets its stub.
#[test]
fn live_file_reads_age_out_after_live_reads_turns() {
    let file = CONFIG_FILE.repeat(60);
    let mut l = read_then_answer(PruneConfig { live_reads_tokens: 20_000, live_reads_turns: 4, ..eager() }, &file);
    assert_eq!(read_shown(&l.s).as_deref(), Some(file.as_str()), "3 turns old: kept");
    // Other work, with outputs to prune, ages the read past 4 turns.
    for i in 0..3 {
        l.prompt(&format!("task {i}"));
        l.tool(&format!("x{i}"), "bash", r#"{"command":"make"}"#, &format!("build line {i}\n").repeat(100), false);
        l.reply("done");
    }
    l.prompt("thanks");
    l.reply("welcome");
    assert_ne!(read_shown(&l.s).as_deref(), Some(file.as_str()), "older than 4 turns: stubbed though still live");
    let head = l.s.head().unwrap();
    let events = l.store.log().read(l.s.id(), 1, head).unwrap();
    assert!(events.iter().any(|e| matches!(&e.body, Event::Decision(DecisionEvent::OutputStubbed { .. }))));
    assert!(events.iter().any(|e| matches!(&e.body, Event::Source(SourceEvent::LiveReadsConfigured { tokens: 20_000, turns: 4 }))));
    assert_eq!(l.s.projection_at(head).unwrap().config().live_reads_turns, 4);
    assert_eq!(l.s.projection_at(head).unwrap().config(), l.s.projection().unwrap().config(), "the fold in memory is the fold of the log");
}

/// What a server keeps warm is bounded by what the projections hold, not only by their number (a few
/// sessions of many messages held hundreds of megabytes until 64 were warm): with `warm_bytes` for about
/// two sessions, using a third drops the least recently used, which folds again from the log, the same,
/// when used next; a session heavier than the bound on its own stays warm while it is the one in use.
#[test]
fn warm_sessions_are_bounded_by_what_they_hold() {
    use condense_engine::StoreOptions;
    let fill = |s: &Session| {
        let events = (0..10)
            .map(|i| SourceEvent::EntryAppended {
                id: format!("e{i}"),
                parent: (i > 0).then(|| format!("e{}", i - 1)),
                entry: Entry::Message(Message::user_text(format!("{i} {}", "words ".repeat(1_700)), UserOrigin::Prompt)),
            })
            .collect();
        s.append(events).unwrap();
    };
    let probe = Store::in_memory(StoreOptions { defer_durability: true, ..StoreOptions::default() });
    let one = probe.create_session("one").unwrap();
    fill(&one);
    let weight = one.with_projection(|p| p.weight()).unwrap();
    assert!(weight > 10 * 10_000 && weight < 10 * (10_300 + condense_render::ENTRY_WEIGHT), "{weight}");

    let store = Store::in_memory(StoreOptions { defer_durability: true, warm_bytes: 2 * weight + weight / 2, ..StoreOptions::default() });
    let sessions: Vec<Session> = ["a", "b", "c"].iter().map(|n| store.create_session(n).unwrap()).collect();
    let mut first = Vec::new();
    for s in &sessions {
        fill(s);
        first.push(s.render().unwrap().messages);
    }
    assert_eq!(store.warm_count(), 2, "the least recently used of three left memory");
    // `a` comes back, folded again from the log: the same context. It weighs from the next time a session
    // is taken, which drops `b`, the least recently used then; `c` stays.
    let again = sessions[0].render().unwrap().messages;
    assert_eq!(*again, *first[0]);
    assert!(!std::sync::Arc::ptr_eq(&again[0], &first[0][0]), "folded again, not kept");
    let c = sessions[2].render().unwrap().messages;
    assert!(std::sync::Arc::ptr_eq(&c[0], &first[2][0]), "`c` stayed warm");
    assert_eq!(store.warm_count(), 2);
    let b = sessions[1].render().unwrap().messages;
    assert_eq!(*b, *first[1]);
    assert!(!std::sync::Arc::ptr_eq(&b[0], &first[1][0]), "`b` was dropped");

    // A bound below one session: the session in use stays, and is not folded again on every use.
    let small = Store::in_memory(StoreOptions { defer_durability: true, warm_bytes: weight / 2, ..StoreOptions::default() });
    let s = small.create_session("s").unwrap();
    fill(&s);
    let (x, y) = (s.render().unwrap().messages, s.render().unwrap().messages);
    assert!(std::sync::Arc::ptr_eq(&x[0], &y[0]), "kept while in use");
    assert_eq!(small.warm_count(), 1);
}
