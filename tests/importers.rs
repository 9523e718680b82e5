//! Hand-built sessions for each importer and each real-world defect: what is kept, what is reported, and
//! the context that renders from it. Expectations are insta snapshots of a readable rendering.

use condense_events::SourceEvent;
use condense_formats::import_bytes;
use condense_render::{check, Projection};

/// Imports `input`, renders it, and prints diagnostics plus one line per rendered message.
fn check_import(input: &str) -> String {
    let imported = import_bytes("t.jsonl", input.as_bytes()).expect("import");
    let mut p = Projection::new();
    for (i, e) in imported.events.iter().enumerate() {
        p.apply(i as u64 + 1, &condense_events::Event::Source(e.clone()));
    }
    let r = p.render();
    let mut out = format!("format: {}\n", imported.format.name());
    for d in &imported.diagnostics {
        out.push_str(&format!("diagnostic: {d}\n"));
    }
    for e in &imported.events {
        if let SourceEvent::ModelChanged { model, context_window, .. } = e {
            out.push_str(&format!("model: {model} window={context_window:?}\n"));
        }
    }
    for v in check(&r.messages) {
        out.push_str(&format!("VIOLATION: {v}\n"));
    }
    out.push_str(&condense_tests::readable(&r.messages[..]));
    out
}

#[test]
fn pi_v1_concatenated_objects_and_indexed_compaction() {
    let input = r#"{"type":"session","id":"s1","timestamp":"t","cwd":"/w","provider":"anthropic","modelId":"m1"}
{"type":"message","message":{"role":"user","content":"first prompt"}}
{"type":"message","message":{"role":"assistant","content":[{"type":"toolCall","id":"c1","name":"read","arguments":{"path":"a.rs"}}],"stopReason":"toolUse"}}{"type":"message","message":{"role":"toolResult","toolCallId":"c1","toolName":"read","content":[{"type":"text","text":"fn a() {}"}],"isError":false}}
{"type":"message","message":{"role":"user","content":[{"type":"text","text":"second prompt"}]}}
{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"ok"}],"stopReason":"stop"}}
{"type":"compaction","summary":"did things","firstKeptEntryIndex":4,"tokensBefore":1000}
{"type":"message","message":{"role":"user","content":"third prompt"}}
{"type":"message","message":{"role":"bashExecution","command":"ls","output":"a.rs\n","exitCode":2,"cancelled":false,"truncated":false}}
"#;
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn pi_v3_tree_branch_summary_custom_and_dangling_parent() {
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"model_change","id":"m0","parentId":null,"timestamp":"t","provider":"openai","modelId":"gpt"}
{"type":"message","id":"a1","parentId":"m0","timestamp":"t","message":{"role":"user","content":"root prompt"}}
{"type":"message","id":"a2","parentId":"a1","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"abandoned answer"}]}}
{"type":"branch_summary","id":"b1","parentId":"a1","timestamp":"t","fromId":"a2","summary":"tried X"}
{"type":"custom","id":"c1","parentId":"b1","timestamp":"t","customType":"ext","data":{"n":1}}
{"type":"custom_message","id":"c2","parentId":"c1","timestamp":"t","customType":"ctx","content":"injected context","display":false}
{"type":"message","id":"a3","parentId":"zzzz","timestamp":"t","message":{"role":"user","content":"after a dangling parent"}}
{"type":"message","id":"a4","parentId":"a3","timestamp":"t","message":{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","thinkingSignature":"sig"},{"type":"toolCall","id":"t1","name":"bash","arguments":{"command":"ls"}},{"type":"toolCall","id":"t2","name":"bash","arguments":{"command":"pwd"}}],"stopReason":"aborted"}}
{"type":"message","id":"a5","parentId":"a4","timestamp":"t","message":{"role":"toolResult","toolCallId":"t1","toolName":"bash","content":[{"type":"text","text":"x"}],"isError":false}}
"#;
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn pi_v3_compaction_keeps_from_first_kept_entry() {
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"message","id":"e1","parentId":null,"timestamp":"t","message":{"role":"user","content":"old"}}
{"type":"message","id":"e2","parentId":"e1","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"old answer"}]}}
{"type":"message","id":"e3","parentId":"e2","timestamp":"t","message":{"role":"user","content":"kept"}}
{"type":"message","id":"e4","parentId":"e3","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"kept answer"}]}}
{"type":"compaction","id":"k1","parentId":"e4","timestamp":"t","summary":"S1","firstKeptEntryId":"e3","tokensBefore":9}
{"type":"message","id":"e5","parentId":"k1","timestamp":"t","message":{"role":"user","content":"new"}}
{"type":"compaction","id":"k2","parentId":"e5","timestamp":"t","summary":"S2","firstKeptEntryId":"e5","tokensBefore":9}
{"type":"message","id":"e6","parentId":"k2","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"newest"}]}}
"#;
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn pi_without_header_and_with_broken_escape() {
    let input = "{\"type\":\"message\",\"id\":\"a\",\"parentId\":null,\"timestamp\":\"t\",\"message\":{\"role\":\"user\",\"content\":\"see C:\\Users\\x\"}}\n\
not json at all\n\
{\"type\":\"message\",\"id\":\"b\",\"parentId\":\"a\",\"timestamp\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"fine\"},{\"type\":\"hologram\"}]}}\n";
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn claude_code_streamed_blocks_parallel_results_and_compaction() {
    let input = r#"{"type":"file-history-snapshot","messageId":"x","snapshot":{},"isSnapshotUpdate":false}
{"type":"user","uuid":"u0","parentUuid":null,"sessionId":"S","cwd":"/w","message":{"role":"user","content":"old prompt"}}
{"type":"system","subtype":"compact_boundary","uuid":"cb","parentUuid":null,"sessionId":"S","compactMetadata":{"trigger":"auto","preTokens":150000}}
{"type":"user","uuid":"u1","parentUuid":"cb","sessionId":"S","isCompactSummary":true,"isVisibleInTranscriptOnly":true,"message":{"role":"user","content":"This session is being continued..."}}
{"type":"user","uuid":"u2","parentUuid":"u1","sessionId":"S","isMeta":true,"message":{"role":"user","content":"<local-command-caveat>caveat</local-command-caveat>"}}
{"type":"user","uuid":"u3","parentUuid":"u2","sessionId":"S","message":{"role":"user","content":[{"type":"text","text":"fix the bug"}]}}
{"type":"assistant","uuid":"a1","parentUuid":"u3","sessionId":"S","message":{"id":"msg_1","model":"claude-x","role":"assistant","content":[{"type":"thinking","thinking":"plan","signature":"s"}],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}
{"type":"assistant","uuid":"a2","parentUuid":"a1","sessionId":"S","message":{"id":"msg_1","model":"claude-x","role":"assistant","content":[{"type":"tool_use","id":"toolu_A","name":"Read","input":{"file_path":"a"}}],"stop_reason":null}}
{"type":"progress","uuid":"p1","parentUuid":"a2","sessionId":"S","data":{"type":"hook_progress"}}
{"type":"user","uuid":"r1","parentUuid":"a2","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_A","content":"1→line"}]}}
{"type":"assistant","uuid":"a3","parentUuid":"a2","sessionId":"S","message":{"id":"msg_1","model":"claude-x","role":"assistant","content":[{"type":"tool_use","id":"toolu_B","name":"Bash","input":{"command":"ls"}}],"stop_reason":"tool_use"}}
{"type":"user","uuid":"r2","parentUuid":"a3","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_B","content":[{"type":"text","text":"Exit code 2"}],"is_error":true}]}}
{"type":"user","uuid":"r3","parentUuid":"r2","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_GHOST","content":"orphan"}]}}
{"type":"assistant","uuid":"a4","parentUuid":"r3","sessionId":"S","message":{"id":"msg_2","model":"claude-x","role":"assistant","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn"}}
"#;
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn codex_calls_outputs_web_search_and_replacement_history() {
    let input = r#"{"timestamp":"t","type":"session_meta","payload":{"id":"c1","timestamp":"t","cwd":"/w"}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions instructions>x</permissions instructions>"}]}}
{"timestamp":"t","type":"event_msg","payload":{"type":"task_started","turn_id":"1","model_context_window":258400}}
{"timestamp":"t","type":"turn_context","payload":{"turn_id":"1","model":"gpt-5"}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"list files"}]}}
{"timestamp":"t","type":"response_item","payload":{"type":"reasoning","summary":[{"type":"summary_text","text":"think"}],"content":null,"encrypted_content":"enc"}}
{"timestamp":"t","type":"response_item","payload":{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","call_id":"call_1"}}
{"timestamp":"t","type":"response_item","payload":{"type":"function_call_output","call_id":"call_1","output":"Process exited with code 1\nOutput:\nnope"}}
{"timestamp":"t","type":"response_item","payload":{"type":"custom_tool_call","status":"completed","call_id":"call_2","name":"apply_patch","input":"*** Begin Patch"}}
{"timestamp":"t","type":"response_item","payload":{"type":"custom_tool_call_output","call_id":"call_2","output":"{\"output\":\"ok\",\"metadata\":{\"exit_code\":0}}"}}
{"timestamp":"t","type":"response_item","payload":{"type":"web_search_call","status":"completed","action":{"type":"search","query":"rust"}}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}}
{"timestamp":"t","type":"compacted","payload":{"message":"","replacement_history":[{"type":"message","role":"user","content":[{"type":"input_text","text":"list files"}]},{"type":"compaction","encrypted_content":"xyz"}]}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"next"}]}}
{"timestamp":"t","type":"response_item","payload":{"type":"function_call","name":"exec_command","arguments":"{}","call_id":"call_3"}}
"#;
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn pretty_printed_objects_are_read_as_a_stream() {
    let input = "{\n  \"type\": \"session_meta\",\n  \"payload\": {\"id\": \"x\"}\n}\n{\n  \"type\": \"response_item\",\n  \"payload\": {\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"hi\"}]}\n}\n";
    insta::assert_snapshot!(check_import(input));
}

#[test]
fn unrecognized_input_is_a_clear_error() {
    assert_eq!(import_bytes("x.jsonl", b"").unwrap_err(), "the file holds no JSON lines");
    assert_eq!(import_bytes("x.jsonl", b"{\"hello\":1}\n").unwrap_err(), "no line has a known shape");
    let err = import_bytes("x.jsonl", b"\xff\xfe garbage\n").unwrap_err();
    assert!(err.starts_with("x.jsonl:1: "), "{err}");
}

#[test]
fn leaf_moved_selects_the_branch() {
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"message","id":"a","parentId":null,"timestamp":"t","message":{"role":"user","content":"q"}}
{"type":"message","id":"b","parentId":"a","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"left"}]}}
{"type":"message","id":"c","parentId":"a","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"right"}]}}
"#;
    let imported = import_bytes("t.jsonl", input.as_bytes()).unwrap();
    let mut p = Projection::new();
    let mut seq = 0;
    for e in &imported.events {
        seq += 1;
        p.apply(seq, &condense_events::Event::Source(e.clone()));
    }
    assert_eq!(p.render().messages.last().unwrap().text(), "right");
    p.apply(seq + 1, &condense_events::Event::Source(SourceEvent::LeafMoved { leaf: Some("b".into()) }));
    assert_eq!(p.render().messages.last().unwrap().text(), "left");
    p.apply(seq + 2, &condense_events::Event::Source(SourceEvent::LeafMoved { leaf: None }));
    assert!(p.render().messages.is_empty());
}

#[test]
fn a_renamed_duplicate_id_never_takes_an_existing_name() {
    // `x`, then an entry really named `x~4`, then `x` again on line 4: the rename must not be `x~4`.
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"message","id":"x","parentId":null,"message":{"role":"user","content":"one"}}
{"type":"message","id":"x~4","parentId":"x","message":{"role":"assistant","content":[{"type":"text","text":"two"}]}}
{"type":"message","id":"x","parentId":"x~4","message":{"role":"user","content":"three"}}
{"type":"message","id":"y","parentId":"x~4","message":{"role":"assistant","content":[{"type":"text","text":"four"}]}}
"#;
    let imported = import_bytes("t.jsonl", input.as_bytes()).expect("import");
    let ids: Vec<String> = imported.events.iter().filter_map(|e| match e { SourceEvent::EntryAppended { id, .. } => Some(id.clone()), _ => None }).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "every entry id is unique: {ids:?}");
    // The branch to `y` is x → x~4 → y: the renamed `three` does not sit on it.
    let mut p = Projection::new();
    for (i, e) in imported.events.iter().enumerate() {
        p.apply(i as u64 + 1, &condense_events::Event::Source(e.clone()));
    }
    let texts: Vec<String> = p.branch_messages().iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["one", "two", "four"]);
}
