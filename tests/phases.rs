//! Snapshots of the rendered context after each render phase, on a hand-built session that exercises
//! every phase and on corpus sessions replayed with the default pipeline.

use condense_engine::Store;
use condense_events::{Block, Message, PruneConfig, UserOrigin, QUERY_TOOL_NAME};
use condense_tests::{corpus_dir, readable, shape};

fn stages_text(p: &condense_render::Projection, show: &dyn Fn(&[std::sync::Arc<Message>]) -> String) -> String {
    let mut out = String::new();
    for (name, msgs) in p.render_stages() {
        out.push_str(&format!("== {name} ({} messages)\n{}", msgs.len(), show(&msgs)));
    }
    out
}

#[test]
fn every_phase_on_a_hand_built_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.create_session("phases").unwrap();
    s.configure(PruneConfig { min_prune_tokens: 0, spill_threshold: 5000, recovery_grace_turns: 1, ..PruneConfig::default() }).unwrap();
    let mut n = 0;
    let mut add = |m: Message| condense_tests::append_entry(&s, &mut n, m);
    let asst = |blocks: Vec<Block>| Message::Assistant { content: blocks, model: None, stop: None, usage: None };
    let call = |id: &str, name: &str, args: &str| Block::tool_call(id.into(), name.into(), args.into());
    let result = |id: &str, name: &str, text: String, is_error: bool| Message::ToolResult {
        call_id: id.into(),
        tool_name: name.into(),
        content: vec![Block::Text { text }],
        is_error,
    };
    // Chain 1: a failed edit with long arguments, a build log, and the same log again.
    add(Message::user_text("fix the build", UserOrigin::Prompt));
    s.prepare().unwrap();
    add(asst(vec![
        Block::thinking("check the log first".into(), Some("sig".into())),
        call("c1", "edit", &format!("{{\"path\":\"src/a.rs\",\"oldText\":\"{}\"}}", "x".repeat(600))),
    ]));
    add(result("c1", "edit", "Error: oldText not found in src/a.rs".into(), true));
    s.prepare().unwrap();
    add(asst(vec![call("c2", "bash", "{\"command\":\"make\"}")]));
    add(result("c2", "bash", "gcc -c src/a.c\nsrc/a.c:3: error: expected ';'\n".repeat(30), false));
    s.prepare().unwrap();
    add(asst(vec![call("c3", "bash", "{\"command\":\"make\"}")]));
    add(result("c3", "bash", "gcc -c src/a.c\nsrc/a.c:3: error: expected ';'\n".repeat(30), false));
    s.prepare().unwrap();
    add(asst(vec![Block::Text { text: "Fixed the missing semicolon.".into() }]));
    // Chain 2: a huge read (spilled: a read spills from four times the threshold).
    add(Message::user_text("show me the data file", UserOrigin::Prompt));
    s.prepare().unwrap();
    add(asst(vec![call("c4", "read", "{\"path\":\"data.csv\"}")]));
    add(result("c4", "read", "row,value\n".repeat(2_100), false));
    s.prepare().unwrap();
    add(asst(vec![Block::Text { text: "The file has 2100 rows.".into() }]));
    // Chain 3: the model recovers t2; the host also recorded an orphan result without its call.
    add(Message::user_text("what exactly did make print?", UserOrigin::Prompt));
    s.prepare().unwrap();
    add(asst(vec![call("c5", QUERY_TOOL_NAME, "{\"refs\":[\"t2\"]}")]));
    let recovered = s.query_tool("{\"refs\":[\"t2\"]}").unwrap();
    add(result("c5", QUERY_TOOL_NAME, recovered.text, false));
    add(result("ghost", "read", "a result nobody asked for".into(), false));
    s.prepare().unwrap();
    add(asst(vec![Block::Text { text: "It printed a syntax error.".into() }]));
    add(Message::user_text("thanks", UserOrigin::Prompt));
    s.prepare().unwrap();
    let p = s.projection().unwrap();
    insta::assert_snapshot!(stages_text(&p, &|m| readable(m)));
}

#[test]
fn every_phase_on_corpus_sessions() {
    for rel in ["pi/badlogic__pi-mono/session.jsonl", "claude-code/marot__spotter/6adcf0da-e8ac-4760-8026-66fb75b5ee45.jsonl"] {
        let file = corpus_dir().join(rel);
        let imported = condense_formats::import_file(&file).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let f = condense_engine::simulate::replay(&store, rel, imported.events, PruneConfig::default(), Default::default()).unwrap();
        assert_eq!(f.validity_errors, 0);
        assert_eq!(f.refs_recovered_exact, f.refs_checked);
        let p = store.session(rel).unwrap().projection().unwrap();
        insta::assert_snapshot!(rel.replace(['/', '.'], "_"), stages_text(&p, &|m| shape(m)));
    }
}
