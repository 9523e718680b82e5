//! The facade: large appends go in pipelined chunks and the warm render equals a fresh one and a render
//! after reopening; a session can be extended event by event, as a live host does.

use condense_engine::Store;
use condense_events::{Block, Entry, Message, SourceEvent, UserOrigin};

fn entry(n: usize) -> SourceEvent {
    let message = match n % 3 {
        0 => Message::user_text(format!("prompt {n}"), UserOrigin::Prompt),
        1 => Message::Assistant {
            content: vec![Block::ToolCall { id: format!("c{n}"), name: "bash".into(), arguments: "{}".into() }],
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
