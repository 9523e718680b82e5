//! Property test of the render: random event sequences (trees, branch switches, results out of order or
//! missing, reused call ids, host compactions) always render provider-valid contexts, and the render kept
//! up to date equals a render from scratch after every event.

use condense_events::{Block, Entry, Event, Message, SourceEvent, UserOrigin};
use condense_engine::demo::Rng;
use condense_render::{check, Projection};

fn random_event(rng: &mut Rng, n: u64, ids: &[String], calls: &[String]) -> SourceEvent {
    let parent = match rng.below(10) {
        0 => None,
        1 | 2 if !ids.is_empty() => Some(ids[rng.below(ids.len() as u64) as usize].clone()),
        _ => ids.last().cloned(),
    };
    let entry = match rng.below(12) {
        0..=2 => Entry::Message(Message::user_text(format!("prompt {n}"), UserOrigin::Prompt)),
        3..=5 => {
            let k = rng.below(4);
            let mut content: Vec<Block> = (0..k)
                .map(|i| Block::tool_call(format!("c{}", rng.below(30)), "bash".into(), format!("{{\"i\":{i}}}")))
                .collect();
            if rng.below(3) == 0 {
                content.insert(0, Block::Text { text: format!("step {n}") });
            }
            Entry::Message(Message::Assistant { content, model: None, stop: None, usage: None })
        }
        6..=8 => {
            let call_id = if !calls.is_empty() && rng.below(5) != 0 {
                calls[rng.below(calls.len() as u64) as usize].clone()
            } else {
                format!("c{}", rng.below(30))
            };
            Entry::Message(Message::ToolResult { call_id, tool_name: "bash".into(), content: vec![Block::Text { text: format!("out {n}") }], is_error: false })
        }
        9 => Entry::HostCompaction {
            summary: Some(format!("summary {n}")),
            first_kept: ids.get(rng.below(ids.len() as u64 + 1) as usize).cloned(),
            replacement: vec![],
            tokens_before: None,
        },
        10 => Entry::BranchSummary { from: None, summary: format!("branch {n}") },
        _ => Entry::Marker { kind: "custom:x".into() },
    };
    SourceEvent::EntryAppended { id: format!("e{n}"), parent, entry }
}

#[test]
fn random_sequences_render_valid_and_incrementally_equal() {
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut p = Projection::new();
        let mut ids: Vec<String> = Vec::new();
        let mut calls: Vec<String> = Vec::new();
        for n in 1..=120u64 {
            let ev = if rng.below(15) == 0 && !ids.is_empty() {
                SourceEvent::LeafMoved { leaf: Some(ids[rng.below(ids.len() as u64) as usize].clone()) }
            } else {
                let ev = random_event(&mut rng, n, &ids, &calls);
                if let SourceEvent::EntryAppended { id, entry, .. } = &ev {
                    ids.push(id.clone());
                    if let Entry::Message(m) = entry {
                        calls.extend(m.tool_calls().map(|(id, _, _)| id.to_string()));
                    }
                }
                ev
            };
            p.apply(n, &Event::Source(ev));
            if rng.below(3) == 0 {
                continue; // Not every event is followed by a request.
            }
            let kept = p.render();
            let full = p.render_full_now();
            assert_eq!(*kept.messages, *full.messages, "seed {seed} event {n}");
            assert_eq!(kept.report, full.report, "seed {seed} event {n}");
            // Pairing is always valid; a branch may start with an assistant message (the generator
            // roots branches anywhere), which only the first-message rule reports.
            let violations: Vec<_> = check(&kept.messages[..])
                .into_iter()
                .filter(|v| *v != condense_render::Violation::StartsWithAssistant)
                .collect();
            assert!(violations.is_empty(), "seed {seed} event {n}: {violations:?}");
        }
    }
}
