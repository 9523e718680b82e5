//! Checkpoint paths (seed 001): the exact model request after a threshold checkpoint, with a bounded
//! copy of an oversized final batch, after CONTEXT_COMPACTION_FAILED, after reopening the store, and on
//! forks with and without the boundary; and a property test that no request leaves the controller over
//! budget and no cut separates a call from its result.

use condense_engine::{EngineError, Session, Store};
use condense_events::{Block, Entry, Message, PruneConfig, SourceEvent, UserOrigin};
use condense_tests::readable;

struct Live {
    dir: tempfile::TempDir,
    s: Session,
    n: usize,
}

fn no_pruning() -> PruneConfig {
    PruneConfig { enabled: false, ..PruneConfig::default() }
}

impl Live {
    fn new(window: u64) -> Live {
        let dir = tempfile::tempdir().unwrap();
        let store = condense_tests::open_store(dir.path()).unwrap();
        let s = store.create_session("cp").unwrap();
        s.configure(no_pruning()).unwrap();
        s.append(vec![SourceEvent::ModelChanged { provider: None, model: "m".into(), context_window: Some(window), max_output: None }]).unwrap();
        Live { dir, s, n: 0 }
    }
    fn add(&mut self, m: Message) {
        condense_tests::append_entry(&self.s, &mut self.n, m);
    }
    fn prompt(&mut self, t: &str) {
        self.add(Message::user_text(t, UserOrigin::Prompt));
    }
    fn turn(&mut self, id: &str, output: String) -> Result<(), EngineError> {
        let r = self.s.prepare()?;
        assert!(condense_render::check(&r.messages[..]).is_empty());
        self.add(Message::Assistant {
            content: vec![Block::tool_call(id.into(), "read".into(), format!("{{\"path\":\"src/{id}.rs\"}}"))],
            model: None,
            stop: None,
            usage: None,
        });
        self.add(Message::ToolResult { call_id: id.into(), tool_name: "read".into(), content: vec![Block::Text { text: output }], is_error: false });
        Ok(())
    }
    /// The exact request: one line per message, then the checkpoint summary in full.
    fn request(&self) -> String {
        let r = self.s.prepare().unwrap();
        let mut out = readable(&r.messages[..]);
        if let Some(m) = r.messages.first().filter(|m| m.text().starts_with("[Checkpoint")) {
            out.push_str(&format!("--- checkpoint summary ---\n{}\n", m.text()));
        }
        for m in r.messages.iter().filter(|m| m.text().contains("checkpoint truncation")) {
            let t = m.text();
            let at = t.find("[… checkpoint truncation").unwrap_or(0);
            out.push_str(&format!("--- bounded copy ---\n{}\n", &t[at..at + t[at..].find('\n').unwrap_or(t.len() - at)]));
        }
        out
    }
}

fn lines(tag: &str, n: usize) -> String {
    (0..n).map(|i| format!("{tag} line {i}: some source text\n")).collect()
}

#[test]
fn threshold_checkpoint_request() {
    let mut l = Live::new(8_000);
    l.prompt("Port the parser to Rust and keep the tests green.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("file{i}"), 80)).unwrap();
    }
    let req = l.request();
    let p = l.s.projection().unwrap();
    assert!(!p.index().checkpoints.is_empty());
    condense_tests::snapshot!("threshold_checkpoint_request", req);
}

#[test]
fn oversized_final_batch_gets_a_bounded_copy() {
    let mut l = Live::new(20_000);
    l.prompt("Read the two logs.");
    l.turn("a", lines("a", 20)).unwrap();
    l.turn("big", lines("huge", 1500)).unwrap();
    let req = l.request();
    let p = l.s.projection().unwrap();
    let cp = p.index().checkpoints.values().next().expect("a checkpoint").clone();
    assert_eq!(cp.bounded.len(), 1);
    assert!(req.contains("checkpoint truncation") || cp.bounded[0].1.contains("checkpoint truncation"));
    // The original stays complete in the log.
    assert_eq!(p.branch_messages().last().unwrap().text(), lines("huge", 1500));
    condense_tests::snapshot!("oversized_final_batch_gets_a_bounded_copy", req);
}

/// ADR 0030: the bounded copy is made when the final batch *reaches half* the hard budget, even when it
/// would fit the budget whole; below half it stays as it is. On a 20,000-token window (hard budget
/// 10,000) after 7,000 tokens of history: a batch of about 5,900 tokens is copied, one of 3,500 is not.
#[test]
fn a_final_batch_between_half_and_the_whole_budget_gets_a_bounded_copy() {
    for (lines_n, copied) in [(750, true), (450, false)] {
        let mut l = Live::new(20_000);
        l.prompt("Read the logs.");
        l.turn("a", lines("a", 1_000)).unwrap();
        l.turn("big", lines("big", lines_n)).unwrap();
        let r = l.s.prepare().unwrap();
        let p = l.s.projection().unwrap();
        let hard = condense_engine::controller::budget_of(&p).unwrap().hard;
        let batch = condense_tokens::estimate(&Message::ToolResult { call_id: "big".into(), tool_name: "read".into(), content: vec![Block::Text { text: lines("big", lines_n) }], is_error: false });
        assert!(batch < hard, "{lines_n}: the batch alone fits ({batch} of {hard})");
        assert_eq!(batch * 2 >= hard, copied, "{lines_n}: {batch} against half of {hard}");
        let cp = p.index().checkpoints.values().next().expect("a checkpoint").clone();
        assert_eq!(cp.bounded.len(), usize::from(copied), "{lines_n} lines");
        let last = r.messages.iter().rev().find(|m| matches!(***m, Message::ToolResult { .. })).unwrap().text();
        assert_eq!(last.contains("checkpoint truncation"), copied, "{lines_n} lines");
        assert_eq!(last == lines("big", lines_n), !copied, "{lines_n} lines: the batch below half goes whole");
    }
}

#[test]
fn nothing_fits_is_context_compaction_failed() {
    let mut l = Live::new(4_000);
    l.prompt("short");
    l.turn("a", lines("a", 10)).unwrap();
    l.prompt(&"an enormous pasted prompt ".repeat(2_000));
    let err = l.s.prepare().unwrap_err();
    assert!(matches!(&err, EngineError::CompactionFailed { code, .. } if code == "CONTEXT_COMPACTION_FAILED"), "{err}");
    condense_tests::snapshot!("nothing_fits_is_context_compaction_failed", err.to_string());
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().checkpoint_failures.len(), 1);
    assert!(p.index().checkpoints.is_empty(), "nothing partial is stored");
}

#[test]
fn resume_after_reopening_the_store() {
    let mut l = Live::new(8_000);
    l.prompt("Port the parser.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    let before = readable(&l.s.prepare().unwrap().messages[..]);
    let Live { dir, s, .. } = l;
    drop(s);
    let store = condense_tests::open_store(dir.path()).unwrap();
    let again = readable(&store.session("cp").unwrap().render().unwrap().messages[..]);
    assert_eq!(before, again);
    condense_tests::snapshot!("resume_after_reopening_the_store", again);
}

#[test]
fn forks_with_and_without_the_boundary() {
    let mut l = Live::new(8_000);
    l.prompt("Port the parser.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    l.request();
    let p = l.s.projection().unwrap();
    let cp = p.index().checkpoints.values().next_back().unwrap().clone();
    // A branch from before the boundary does not see the checkpoint.
    l.s.append(vec![SourceEvent::LeafMoved { leaf: Some("e3".into()) }]).unwrap();
    let early = l.s.render().unwrap();
    assert!(!early.messages.iter().any(|m| m.text().starts_with("[Checkpoint c")));
    condense_tests::snapshot!("fork_without_the_boundary", readable(&early.messages[..]));
    // A branch that keeps the boundary does.
    l.s.append(vec![SourceEvent::LeafMoved { leaf: Some(cp.boundary.clone()) }]).unwrap();
    l.s.append(vec![SourceEvent::EntryAppended {
        id: "fork1".into(),
        parent: Some(cp.boundary.clone()),
        entry: Entry::Message(Message::user_text("a different next step", UserOrigin::Prompt)),
    }])
    .unwrap();
    let late = l.s.render().unwrap();
    assert!(late.messages[0].text().starts_with(&format!("[Checkpoint c{}", cp.n)));
    condense_tests::snapshot!("fork_with_the_boundary", readable(&late.messages[..]));
    assert_eq!(late.messages.last().unwrap().text(), "a different next step");
}

#[test]
fn no_request_leaves_the_controller_over_budget() {
    use condense_engine::demo::Rng;
    for seed in 1..=10u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let window = 6_000 + 2_000 * rng.below(5);
        let mut l = Live::new(window);
        if rng.below(2) == 0 {
            l.s.configure(PruneConfig::default()).unwrap();
        }
        let budget = condense_checkpoint::Budget::new(window, None, condense_checkpoint::DEFAULT_RESERVE);
        l.prompt("start");
        for t in 0..30 {
            if rng.below(6) == 0 {
                l.prompt(&format!("next task {t}"));
            }
            let out = lines(&format!("t{t}"), 5 + rng.below(120) as usize);
            match l.turn(&format!("c{t}"), out) {
                Ok(()) => {}
                Err(EngineError::CompactionFailed { .. }) => panic!("seed {seed}: nothing should be too big here"),
                Err(e) => panic!("{e}"),
            }
            let r = l.s.prepare().unwrap();
            let tokens: u64 = r.messages.iter().map(|m| condense_tokens::estimate(m)).sum();
            assert!(tokens <= budget.hard, "seed {seed} turn {t}: {tokens} > {}", budget.hard);
            assert!(condense_render::check(&r.messages[..]).is_empty(), "seed {seed} turn {t}");
        }
        let failures = l.s.projection().unwrap().index().checkpoint_failures.len();
        assert_eq!(failures, 0);
    }
}

#[test]
fn new_context_checkpoints_after_its_tool_turn() {
    use condense_engine::controller::{NEW_CONTEXT_RESULT, NEW_CONTEXT_TOOL};
    let mut l = Live::new(200_000);
    l.prompt("Refactor the module.");
    l.turn("c1", lines("a", 30)).unwrap();
    // The model asks for a checkpoint; its call and result stay a normal, visible pair.
    l.s.prepare().unwrap();
    l.add(Message::Assistant {
        content: vec![Block::tool_call("nc".into(), NEW_CONTEXT_TOOL.into(), "{}".into())],
        model: None,
        stop: None,
        usage: None,
    });
    assert!(l.s.projection().unwrap().index().checkpoints.is_empty(), "not before the tool turn finished");
    l.add(Message::ToolResult { call_id: "nc".into(), tool_name: NEW_CONTEXT_TOOL.into(), content: vec![Block::Text { text: NEW_CONTEXT_RESULT.into() }], is_error: false });
    let req = l.request();
    assert_eq!(l.s.projection().unwrap().index().checkpoints.len(), 1);
    // The next request does not checkpoint again.
    l.request();
    assert_eq!(l.s.projection().unwrap().index().checkpoints.len(), 1);
    condense_tests::snapshot!("new_context_checkpoints_after_its_tool_turn", req);
}

#[test]
fn manual_compaction_of_an_idle_session() {
    let mut l = Live::new(200_000);
    l.prompt("Summarize the repository layout.");
    l.turn("c1", lines("tree", 50)).unwrap();
    l.s.prepare().unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "It has src/ and tests/.".into() }], model: None, stop: None, usage: None });
    l.s.compact_now().unwrap();
    let req = readable(&l.s.render().unwrap().messages[..]);
    assert!(req.starts_with("user(Summary): text \"[Checkpoint c1"), "{req}");
    condense_tests::snapshot!("manual_compaction_of_an_idle_session", req);
}

#[test]
fn provider_overflow_then_retry_then_second_overflow() {
    let mut l = Live::new(200_000);
    l.prompt("Analyse the logs.");
    for i in 0..3 {
        l.turn(&format!("c{i}"), lines(&format!("log{i}"), 30)).unwrap();
    }
    // The provider rejects the request; the host records the failed assistant message and the overflow.
    l.s.prepare().unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "(request failed)".into() }], model: None, stop: Some(condense_events::StopReason::Error), usage: None });
    l.s.append(vec![SourceEvent::ProviderOverflow { message: "prompt is too long: 212000 tokens > 200000 maximum".into() }]).unwrap();
    let retry = l.request();
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().checkpoints.len(), 1, "one checkpoint before the retry");
    assert!(retry.starts_with("user(Summary): text \"[Checkpoint c1"), "{retry}");
    assert!(!retry.contains("(request failed)"), "the failed message leaves the model context");
    assert!(p.branch_messages().iter().any(|m| m.text() == "(request failed)"), "but stays in the transcript");
    condense_tests::snapshot!("provider_overflow_then_retry_then_second_overflow", retry);
    // Preparing again does not checkpoint again.
    l.request();
    assert_eq!(l.s.projection().unwrap().index().checkpoints.len(), 1);
    // The retry overflows too: terminal.
    l.add(Message::Assistant { content: vec![Block::Text { text: "(failed again)".into() }], model: None, stop: Some(condense_events::StopReason::Error), usage: None });
    l.s.append(vec![SourceEvent::ProviderOverflow { message: "prompt is too long".into() }]).unwrap();
    let err = l.s.prepare().unwrap_err();
    assert!(matches!(&err, EngineError::CompactionFailed { code, .. } if code == "PROVIDER_OVERFLOW_AFTER_RETRY"), "{err}");
    condense_tests::snapshot!("second_overflow_is_terminal", err.to_string());
}

#[test]
fn budget_notices_ride_at_the_end_and_are_never_stored() {
    let mut l = Live::new(8_000); // hard budget 4,000 tokens: notices at 3,000 and 3,600
    l.prompt("Go through the files.");
    let mut seen = Vec::new();
    for i in 0..30 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 25)).unwrap();
        let r = l.s.prepare().unwrap();
        let last = r.messages.last().unwrap().text();
        if last.starts_with("[condense notice") {
            // ADR 0064: a notice tells the remaining budget; it does not ask for a tool call.
            assert!(last.contains("tokens of context remain") && !last.contains("call ") && !last.contains("new_context"), "{last}");
            seen.push(last[..27].to_string());
        }
        assert!(condense_render::check(&r.messages[..]).is_empty());
    }
    assert!(seen.iter().any(|s| s.starts_with("[condense notice 1 of 2")), "{seen:?}");
    assert!(seen.iter().any(|s| s.starts_with("[condense notice 2 of 2")), "{seen:?}");
    let p = l.s.projection().unwrap();
    assert!(!p.branch_messages().iter().any(|m| m.text().starts_with("[condense notice")));
}

#[test]
fn a_checkpoint_exports_as_a_pi_compaction_line_that_pi_rebuilds_from() {
    let mut l = Live::new(8_000);
    l.prompt("Port the parser.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    l.request();
    let line = l.s.checkpoint_as_pi_line(None, "2026-11-30T00:00:00.000Z").unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["type"], "compaction");
    assert_eq!(v["id"].as_str().unwrap().len(), 8);
    assert!(v["summary"].as_str().unwrap().starts_with("[Checkpoint c"));
    // Append it to a pi file of the same session and import: pi's rebuild keeps the summary and what
    // follows firstKeptEntryId.
    let p = l.s.projection().unwrap();
    let mut file = String::from("{\"type\":\"session\",\"version\":3,\"id\":\"s\",\"timestamp\":\"t\",\"cwd\":\"/w\"}\n");
    let mut parent = serde_json::Value::Null;
    for (id, m) in p.branch_entries() {
        let msg = match &**m {
            Message::User { .. } => serde_json::json!({"role": "user", "content": m.text()}),
            Message::Assistant { .. } => {
                let calls: Vec<_> = m.tool_calls().map(|(id, name, args)| serde_json::json!({"type": "toolCall", "id": id, "name": name, "arguments": serde_json::from_str::<serde_json::Value>(args).unwrap()})).collect();
                serde_json::json!({"role": "assistant", "content": calls})
            }
            Message::ToolResult { call_id, tool_name, .. } => serde_json::json!({"role": "toolResult", "toolCallId": call_id, "toolName": tool_name, "content": [{"type": "text", "text": m.text()}], "isError": false}),
        };
        file.push_str(&serde_json::json!({"type": "message", "id": id, "parentId": parent, "timestamp": "t", "message": msg}).to_string());
        file.push('\n');
        parent = serde_json::json!(id);
    }
    file.push_str(&line);
    file.push('\n');
    let imported = condense_formats::import_bytes("pi.jsonl", file.as_bytes()).unwrap();
    let mut q = condense_render::Projection::new();
    for (i, e) in imported.events.into_iter().enumerate() {
        q.apply_owned(i as u64 + 1, condense_events::Event::Source(e));
    }
    let rebuilt = q.render();
    assert!(rebuilt.messages[0].text().contains("[Checkpoint c"));
    assert_eq!(rebuilt.messages.last().unwrap().text(), p.branch_messages().last().unwrap().text());
}

#[test]
fn summary_failure_then_retained_tail_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    store.set_summarizer(std::sync::Arc::new(condense_tests::HandoffWith(|_: &str, _: usize| Err(condense_tests::handoff_failed("model unavailable")))));
    let s = store.create_session("cp").unwrap();
    s.configure(no_pruning()).unwrap();
    s.append(vec![SourceEvent::ModelChanged { provider: None, model: "m".into(), context_window: Some(8_000), max_output: None }]).unwrap();
    let mut l = Live { dir, s, n: 0 };
    l.prompt("Port the parser.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    let req = l.request();
    let p = l.s.projection().unwrap();
    let cp = p.index().checkpoints.values().next().unwrap();
    assert!(cp.recovery, "the retained-tail recovery was used");
    condense_tests::snapshot!("summary_failure_then_retained_tail_recovery", req);
}

/// A summarizer that writes a handoff and then says its preparation must stop (its request given up).
struct StoppedAfterwards;

impl condense_summarize::Summarizer for StoppedAfterwards {
    fn name(&self) -> &str {
        "stopped"
    }
    fn summarize(&self, batch: &[condense_summarize::Item<'_>]) -> Result<Vec<String>, condense_summarize::SummarizeError> {
        condense_summarize::Extractive::default().summarize(batch)
    }
    fn handoff(&self, _: &str, _: usize) -> condense_tests::HandoffResult {
        Ok(Some("a handoff written as the request was given up".into()))
    }
    fn stopped(&self) -> Option<String> {
        Some("the client gave the request up".into())
    }
}

/// ADR 0030: compaction is abortable. A checkpoint whose summary was being written when its preparation
/// was stopped commits nothing (a `PREPARATION_STOPPED` failure is recorded); the next request checkpoints
/// as before.
#[test]
fn a_stopped_compaction_commits_nothing_and_the_next_request_checkpoints() {
    let mut l = Live::new(8_000);
    l.prompt("Port the parser.");
    for i in 0..8 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    l.turn("c8", lines("f8", 400)).unwrap();
    let s = l.s.projection().unwrap().index().checkpoints.len();
    let stopped: std::sync::Arc<dyn condense_summarize::Summarizer> = std::sync::Arc::new(StoppedAfterwards);
    let err = l.s.with_summarizer(Some(stopped), || l.s.prepare()).unwrap_err();
    assert!(matches!(&err, EngineError::CompactionFailed { code, .. } if code == condense_engine::recover::PREPARATION_STOPPED), "{err}");
    let p = l.s.projection().unwrap();
    assert_eq!(p.index().checkpoints.len(), s, "nothing committed");
    assert_eq!(p.index().checkpoint_failures.last().unwrap().0, condense_engine::recover::PREPARATION_STOPPED);
    l.s.prepare().unwrap();
    assert_eq!(l.s.projection().unwrap().index().checkpoints.len(), s + 1);
}

#[test]
fn provider_usage_anchors_the_estimate() {
    // Hard budget of a 20k window: 10,000 tokens, 100 of them kept for a notice.
    let mut l = Live::new(20_000);
    l.prompt("Check the build.");
    l.turn("c1", lines("log", 20)).unwrap();
    l.s.prepare().unwrap();
    assert!(l.s.projection().unwrap().index().checkpoints.is_empty(), "the estimate alone is far below the budget");
    // The host reports what the provider counted for that request (system prompt, tools, images …).
    l.s.append(vec![SourceEvent::ProviderUsage(condense_events::Usage { input: 9_800, output: 300, cache_read: 0, cache_write: 0 })]).unwrap();
    l.add(Message::user_text("and the tests?", UserOrigin::Prompt));
    l.s.prepare().unwrap();
    assert_eq!(l.s.projection().unwrap().index().checkpoints.len(), 1, "usage plus what came after is over the budget");
}

#[test]
fn a_fork_copies_a_checkpoint_only_with_its_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = store.create_session("src").unwrap();
    s.configure(PruneConfig { min_prune_tokens: 0, auto_budget_threshold: 0, ..PruneConfig::default() }).unwrap();
    s.append(vec![SourceEvent::ModelChanged { provider: None, model: "m".into(), context_window: Some(8_000), max_output: None }]).unwrap();
    let mut l = Live { dir, s, n: 0 };
    l.prompt("Port the parser.");
    for i in 0..10 {
        l.turn(&format!("c{i}"), lines(&format!("f{i}"), 80)).unwrap();
    }
    l.request();
    let p = l.s.projection().unwrap();
    let cp = p.index().checkpoints.values().next_back().expect("a checkpoint").clone();
    let boundary_pos: usize = cp.boundary.trim_start_matches('e').parse().unwrap();
    let with = store.fork("src", "with", Some(&format!("e{}", l.n))).unwrap();
    let without = store.fork("src", "without", Some(&format!("e{}", boundary_pos - 1))).unwrap();
    let w = with.projection().unwrap();
    assert_eq!(w.index().checkpoints.len(), p.index().checkpoints.len());
    assert_eq!(
        readable(&with.render().unwrap().messages[..]),
        readable(&l.s.render().unwrap().messages[..]),
        "a fork at the leaf renders the same context"
    );
    let wo = without.projection().unwrap();
    assert!(wo.index().checkpoints.values().all(|c| c.n != cp.n), "the fork before the boundary has no copy of c{}", cp.n);
    // Refs keep their numbers and recover the same originals in the fork.
    for r in w.index().records.keys().take(3) {
        assert_eq!(with.query(&[format!("t{r}")]).unwrap().originals, l.s.query(&[format!("t{r}")]).unwrap().originals);
    }
}

#[test]
fn each_compaction_is_a_divider_in_the_transcript() {
    use condense_render::TranscriptRow;
    let mut l = Live::new(200_000);
    l.prompt("Summarize the repository layout.");
    l.turn("c1", lines("tree", 50)).unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "It has src/ and tests/.".into() }], model: None, stop: None, usage: None });
    // The host compacts its own context, then the conversation goes on and condense checkpoints it.
    l.n += 1;
    l.s.append(vec![SourceEvent::EntryAppended {
        id: format!("e{}", l.n),
        parent: Some(format!("e{}", l.n - 1)),
        entry: condense_events::Entry::HostCompaction { summary: Some("the layout was summarized".into()), first_kept: None, replacement: Vec::new(), tokens_before: None },
    }])
    .unwrap();
    let host_at = format!("e{}", l.n);
    l.prompt("Now list the tests.");
    l.turn("c2", lines("tests", 20)).unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "Two test files.".into() }], model: None, stop: None, usage: None });
    l.s.compact_now().unwrap();
    let p = l.s.projection().unwrap();
    let rows = p.transcript();
    let boundary = p.index().checkpoints[&1].boundary.clone();
    let messages: Vec<&str> = rows.iter().filter_map(|r| if let TranscriptRow::Message(id, _) = r { Some(*id) } else { None }).collect();
    assert_eq!(messages.len(), p.branch_entries().len(), "no message is hidden");
    let host = rows.iter().position(|r| *r == TranscriptRow::HostCompaction(&host_at)).expect("the host compaction is a divider");
    let cp = rows.iter().position(|r| *r == TranscriptRow::Checkpoint(1, &boundary)).expect("the checkpoint is a divider");
    assert!(matches!(rows[cp - 1], TranscriptRow::Message(id, _) if id == boundary), "right after its boundary");
    assert!(host < cp);
}

/// A session on an 8,000-token window (hard budget 4,000) whose history a long summary cannot replace
/// within budget but the retained-tail marker can: prompts of about 500 tokens, a final batch of about
/// 1,600.
fn ineffective(store: &Store, name: &str) -> Session {
    let s = store.create_session(name).unwrap();
    s.configure(no_pruning()).unwrap();
    s.append(vec![SourceEvent::ModelChanged { provider: None, model: "m".into(), context_window: Some(8_000), max_output: None }]).unwrap();
    let mut n = 0;
    for i in 0..5 {
        condense_tests::append_entry(&s, &mut n, Message::user_text(format!("prompt {i}: {}", "p".repeat(2_000)), UserOrigin::Prompt));
        condense_tests::append_entry(&s, &mut n, Message::Assistant { content: vec![Block::Text { text: format!("reply {i}") }], model: None, stop: None, usage: None });
    }
    condense_tests::append_entry(&s, &mut n, Message::user_text("the last prompt", UserOrigin::Prompt));
    condense_tests::append_entry(&s, &mut n, Message::Assistant {
        content: vec![Block::tool_call("c1".into(), "read".into(), "{\"path\":\"big.txt\"}".into())],
        model: None,
        stop: None,
        usage: None,
    });
    condense_tests::append_entry(&s, &mut n, Message::ToolResult { call_id: "c1".into(), tool_name: "read".into(), content: vec![Block::Text { text: "r".repeat(6_400) }], is_error: false });
    s
}

#[test]
fn an_ineffective_summary_takes_the_retained_tail_path_and_manual_compaction_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    // Every handoff is a 3,800-character summary: long enough to be ineffective.
    store.set_summarizer(std::sync::Arc::new(condense_tests::HandoffWith(|_: &str, max: usize| Ok(Some("s".repeat(3_800.min(max)))))));
    // Automatic: the summary leaves the context over budget, so the retained-tail recovery (ADR 0049)
    // commits instead.
    let auto = ineffective(&store, "auto");
    let r = auto.prepare().expect("the retained-tail recovery fits");
    let p = auto.projection().unwrap();
    let cp = &p.index().checkpoints[&1];
    assert!(cp.recovery, "the retained-tail recovery, not the summary");
    assert!(r.messages[0].text().contains("no summary could be made small enough"), "{}", r.messages[0].text());
    assert!(condense_engine::controller::context_tokens(&p) <= 4_000);
    // Manual compaction covers everything, so only what every request carries can leave it over budget:
    // with a 7,500-token system prompt and tools in the 8,000-token window no summary fits (the reserve
    // yields to them, down to the 5% floor: a hard budget of 7,600). It fails fast with
    // CONTEXT_COMPACTION_FAILED, without the retained-tail attempt, and commits nothing; the automatic
    // path on the same session tries the retained tail too before it fails.
    let manual = ineffective(&store, "manual");
    manual.set_request_overhead(7_500).unwrap();
    let reason = compaction_failed(manual.compact_now());
    assert!(reason.starts_with("manual compaction: the summary does not bring"), "{reason}");
    assert!(manual.projection().unwrap().index().checkpoints.is_empty());
    let reason = compaction_failed(manual.prepare().map(drop));
    assert!(reason.contains("even without history"), "{reason}");
    assert!(manual.projection().unwrap().index().checkpoints.is_empty());
}

/// The reason of a `CONTEXT_COMPACTION_FAILED` failure (anything else fails the test).
fn compaction_failed(r: Result<(), EngineError>) -> String {
    match r {
        Err(EngineError::CompactionFailed { code, reason, .. }) if code == "CONTEXT_COMPACTION_FAILED" => reason,
        other => panic!("expected CONTEXT_COMPACTION_FAILED: {other:?}"),
    }
}

#[test]
fn a_checkpoint_that_cannot_be_stored_is_context_compaction_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let s = ineffective(&store, "closed");
    s.projection().unwrap();
    store.log().close();
    let reason = compaction_failed(s.prepare().map(drop));
    assert!(reason.contains("could not be stored"), "{reason}");
}

/// Host context (issue 34): the host's environment message stays verbatim through chain compression and
/// is sent again after a checkpoint, the newest of each kind once; the goal is what the user typed.
#[test]
fn host_context_survives_chains_and_checkpoints() {
    let mut l = Live::new(12_000);
    l.s.configure(PruneConfig { min_prune_tokens: 0, ..PruneConfig::default() }).unwrap();
    let env = |cwd: &str| format!("<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n</environment_context>");
    let has = |ms: &[std::sync::Arc<Message>], text: &str| ms.iter().filter(|m| m.is_host() && m.text() == text).count();
    l.add(Message::User {
        content: vec![Block::Text { text: "<system-reminder>\nAttribution for git commits\n</system-reminder>".into() }, Block::Text { text: "Port the parser to Rust.".into() }],
        origin: UserOrigin::Prompt,
    });
    l.add(Message::user_text(env("/w/one"), UserOrigin::Host));
    l.turn("c1", lines("a", 30)).unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "Done with the first part.".into() }], model: None, stop: None, usage: None });
    l.prompt("Now the lexer.");
    // The first turn is a chain block now; the environment is still there, right after the prompt.
    let r = l.s.prepare().unwrap();
    assert!(!l.s.projection().unwrap().index().chains.is_empty(), "{}", readable(&r.messages[..]));
    assert_eq!(has(&r.messages, &env("/w/one")), 1, "{}", readable(&r.messages[..]));
    assert!(r.messages[1].is_host() && r.messages[2].text().starts_with("[Compressed chain"), "{}", readable(&r.messages[..]));
    // A checkpoint: the environment comes back verbatim after the summary, once.
    l.turn("c2", lines("b", 40)).unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "Lexer ported.".into() }], model: None, stop: None, usage: None });
    l.s.compact_now().unwrap();
    let r = l.s.prepare().unwrap();
    assert!(r.messages[0].text().starts_with("[Checkpoint"), "{}", readable(&r.messages[..]));
    assert!(r.messages[0].text().contains("## Goal\nPort the parser to Rust."), "{}", r.messages[0].text());
    assert_eq!(has(&r.messages, &env("/w/one")), 1, "{}", readable(&r.messages[..]));
    // A newer environment replaces the older one at the next checkpoint.
    l.prompt("And the tests.");
    l.add(Message::user_text(env("/w/two"), UserOrigin::Host));
    l.turn("c3", lines("c", 40)).unwrap();
    l.add(Message::Assistant { content: vec![Block::Text { text: "Tests pass.".into() }], model: None, stop: None, usage: None });
    l.s.compact_now().unwrap();
    let r = l.s.prepare().unwrap();
    assert_eq!((has(&r.messages, &env("/w/one")), has(&r.messages, &env("/w/two"))), (0, 1), "{}", readable(&r.messages[..]));
}

/// `simulate --window` replays a session as if its model had that window from the start: the replies are
/// that model's, so no model switch is pending, and what outgrows the window is checkpointed (seed 001,
/// with its retained tail), not recovered as after a switch to a smaller model (seed 004). Before the
/// replies were taken as the window's model's, all 20 of this session's checkpoints were recoveries.
#[test]
fn a_simulated_window_checkpoints_rather_than_recovers() {
    use condense_engine::simulate::{replay_with, Prices};
    let dir = tempfile::tempdir().unwrap();
    let store = condense_tests::open_store(dir.path()).unwrap();
    let events = condense_tests::corpus_events("pi/badlogic__pi-mono/before-compaction.jsonl");
    let f = replay_with(&store, "windowed", events, condense_events::PruneConfig::default(), Prices::default(), Some(32_000), None).unwrap();
    assert!(f.checkpoints >= 10, "{} checkpoints", f.checkpoints);
    assert_eq!((f.recoveries, f.archives, f.compaction_failures, f.validity_errors), (0, 0, 0, 0));
}

/// The tokens of the request `prepare` gives, as the controller counts them (the messages, the host's
/// overhead and condense's tools).
fn request_tokens(s: &Session) -> u64 {
    s.prepare().unwrap();
    s.with_projection(condense_engine::controller::context_tokens).unwrap()
}

fn newest_checkpoint(s: &Session) -> condense_events::CheckpointCommitted {
    s.projection().unwrap().index().checkpoints.values().next_back().expect("a checkpoint").clone()
}

/// Issue 59, the moves when even a checkpoint does not fit, each through `Session::prepare`. Move 3: the
/// marker alone, no prompts retained, when the retained prompts and the final batch do not fit together.
#[test]
fn a_tight_window_drops_the_retained_prompts_before_it_refuses() {
    let mut l = Live::new(16_000);
    l.s.set_request_overhead(6_000).unwrap();
    let hard = l.s.with_projection(|p| condense_engine::controller::budget_of(p).unwrap().hard).unwrap();
    for k in 0..7 {
        l.prompt(&format!("request {k}: {}", "keep the parser's old API and its error messages ".repeat(24)));
    }
    // ~3,000 tokens: under half the hard budget (no ADR 0030 copy), too much beside the prompts.
    l.turn("a", lines("file", 360)).unwrap();
    let tokens = request_tokens(&l.s);
    let cp = newest_checkpoint(&l.s);
    assert!(cp.recovery && cp.kept.is_empty() && cp.bounded.is_empty(), "{cp:?}");
    assert!(tokens <= hard, "{tokens} over {hard}");
    // The batch went whole.
    assert!(l.s.prepare().unwrap().messages.iter().any(|m| m.text() == lines("file", 360)));
}

/// Move 4: the final batch cut to the room that is left (a smaller bounded copy than ADR 0030's half of
/// the hard budget), each result naming its ref; the originals stay whole in the log and by ref.
#[test]
fn a_tight_window_cuts_the_final_batch_to_the_room_left() {
    let mut l = Live::new(16_000);
    l.s.set_request_overhead(8_000).unwrap();
    let hard = l.s.with_projection(|p| condense_engine::controller::budget_of(p).unwrap().hard).unwrap();
    // Half the window is the client's: the reserve yields so the history keeps a quarter of it.
    assert!(hard >= 11_000, "{hard}");
    l.prompt("Read both logs.");
    l.turn("a", lines("a", 20)).unwrap();
    // Two results of ~2,500 tokens each: together under half the hard budget, more than the room.
    l.s.prepare().unwrap();
    condense_tests::append_entry(&l.s, &mut l.n, Message::Assistant {
        content: vec![Block::tool_call("x".into(), "read".into(), "{}".into()), Block::tool_call("y".into(), "read".into(), "{}".into())],
        model: None,
        stop: None,
        usage: None,
    });
    for id in ["x", "y"] {
        l.add(Message::ToolResult { call_id: id.into(), tool_name: "read".into(), content: vec![Block::Text { text: lines(id, 300) }], is_error: false });
    }
    let tokens = request_tokens(&l.s);
    assert!(tokens <= hard, "{tokens} over {hard}");
    let cp = newest_checkpoint(&l.s);
    assert_eq!(cp.bounded.len(), 2, "{cp:?}");
    // A fair share each: two outputs of the same size get copies of the same size.
    assert_eq!(cp.bounded[0].1.len(), cp.bounded[1].1.len(), "{cp:?}");
    let sent = l.s.prepare().unwrap();
    for (id, copy) in &cp.bounded {
        // No pruning here, so no refs: the copy says where the original is.
        assert!(copy.contains("checkpoint truncation") && copy.contains("the full output stays in the log"), "{id}: {copy}");
        assert!(sent.messages.iter().any(|m| m.text() == *copy), "the copy is what goes out");
    }
    let p = l.s.projection().unwrap();
    assert!(p.branch_messages().iter().any(|m| m.text() == lines("y", 300)), "the original stays in the log");
}

/// Move 5: nothing fits (the client's own context takes the whole window): one refusal that names the
/// parts and what to do; and the next request that can fit goes through.
#[test]
fn a_window_the_clients_own_context_fills_is_refused_with_its_parts_named() {
    let mut l = Live::new(16_000);
    l.prompt("hello");
    l.turn("a", lines("a", 400)).unwrap();
    l.s.set_request_overhead(15_500).unwrap();
    let reason = compaction_failed(l.s.prepare().map(drop));
    for part in ["the client's own system prompt and tool declarations 15500", "condense's tools", "a window of 16000", "use a model with a larger window"] {
        assert!(reason.contains(part), "missing {part:?} in {reason}");
    }
    // On the first request too, with nothing before it to condense.
    let mut first = Live::new(16_000);
    first.s.set_request_overhead(15_500).unwrap();
    first.prompt("hello");
    let reason = compaction_failed(first.s.prepare().map(drop));
    assert!(reason.contains("the client's own system prompt and tool declarations 15500"), "{reason}");
    // The client drops most of its tools: the same conversation goes through.
    l.s.set_request_overhead(4_000).unwrap();
    l.s.prepare().unwrap();
}
