//! Hand-built sessions for each importer and each real-world defect: what is kept, what is reported, and
//! the context that renders from it. Expectations are insta snapshots of a readable rendering.

use condense_events::SourceEvent;
use condense_formats::import_bytes;
use condense_render::{check, Projection};

/// A projection folded from an import's events, in order.
fn fold(events: &[SourceEvent]) -> Projection {
    let mut p = Projection::new();
    for (i, e) in events.iter().enumerate() {
        p.apply(i as u64 + 1, &condense_events::Event::Source(e.clone()));
    }
    p
}

/// Imports `input`, renders it, and prints diagnostics plus one line per rendered message.
fn check_import(input: &str) -> String {
    let imported = import_bytes("t.jsonl", input.as_bytes()).expect("import");
    let p = fold(&imported.events);
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
    assert_eq!(import_bytes("x.jsonl", b"{\"hello\":1}\n").unwrap_err(), "it looks like a JSON object of no session format condense reads (keys: hello)");
    assert_eq!(
        import_bytes("x.jsonl", b"{\"hello\":1}\n{\"world\":2}\n").unwrap_err(),
        "no line has a known shape; line 1 looks like a JSON object of no session format condense reads (keys: hello)"
    );
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
    let p = fold(&imported.events);
    let texts: Vec<String> = p.branch_messages().iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["one", "two", "four"]);
}

/// A small deterministic generator for the fuzz loops below (reproducible failures).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random mutilation of `bytes`: cut short, flipped or overwritten bytes, a range deleted, a range
/// repeated, random bytes spliced in, lines shuffled, or a number field replaced by a huge one.
fn mutilate(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let n = b.len().max(1);
    match rng.below(8) {
        0 => b.truncate(rng.below(n)),
        1 => {
            for _ in 0..1 + rng.below(16) {
                let i = rng.below(n);
                if let Some(x) = b.get_mut(i) {
                    *x ^= 1 << rng.below(8);
                }
            }
        }
        2 => {
            let i = rng.below(n);
            let j = (i + rng.below(4096)).min(b.len());
            b.drain(i.min(j)..j);
        }
        3 => {
            let i = rng.below(n).min(b.len());
            let j = (i + rng.below(2048)).min(b.len());
            let copy = b[i..j].to_vec();
            b.splice(i..i, copy);
        }
        4 => {
            let i = rng.below(n).min(b.len());
            let noise: Vec<u8> = (0..rng.below(512)).map(|_| rng.next() as u8).collect();
            b.splice(i..i, noise);
        }
        5 => {
            let mut lines: Vec<&[u8]> = bytes.split(|c| *c == b'\n').collect();
            for _ in 0..lines.len().min(8) {
                let (x, y) = (rng.below(lines.len()), rng.below(lines.len()));
                lines.swap(x, y);
            }
            b = lines.join(&b'\n');
        }
        6 => {
            // Quotes, brackets and backslashes dropped or doubled: broken JSON structure.
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(n).min(b.len().saturating_sub(1));
                if b.is_empty() {
                    break;
                }
                let c = [b'"', b'{', b'}', b'[', b']', b'\\', b':', b','][rng.below(8)];
                b[i] = c;
            }
        }
        _ => {
            // A number replaced by one far out of range.
            if let Some(i) = b.iter().position(|c| c.is_ascii_digit()).map(|p| p + rng.below(n - p)) {
                let huge: &[u8] = [&b"18446744073709551616"[..], b"-9223372036854775809", b"1e999", b"99999999999999999999999"][rng.below(4)];
                let i = i.min(b.len());
                b.splice(i..i, huge.iter().copied());
            }
        }
    }
    b
}

/// Imports `bytes` and, when that succeeds, renders the result and runs the provider-rule check: neither
/// may panic, whatever the input.
fn import_and_render(name: &str, bytes: &[u8]) -> bool {
    // Read as a stream, a file of a line format gives the events of the whole-file read, diagnostics
    // included; anything else is left to the whole-file read, with nothing emitted.
    let mut streamed = Vec::new();
    let read = condense_formats::import_stream(name, bytes, &mut |e| streamed.push(e)).expect("a slice reads");
    let whole = import_bytes(name, bytes);
    match (&read, &whole) {
        (Some(r), Ok(w)) => {
            assert_eq!(streamed, w.events, "{name}: streamed events differ");
            assert_eq!((r.format, &r.diagnostics), (w.format, &w.diagnostics));
        }
        (Some(_), Err(e)) => panic!("{name}: streamed, but the whole-file read refused it: {e}"),
        (None, _) => assert!(streamed.is_empty()),
    }
    let Ok(imported) = whole else { return false };
    let p = fold(&imported.events);
    let r = p.render();
    let _ = check(&r.messages);
    for d in &imported.diagnostics {
        assert!(d.line >= 1 && d.file == name, "a diagnostic must name its file and line: {d}");
    }
    true
}

#[test]
fn fuzz_each_importer_with_mutilated_corpus_files_and_random_bytes() {
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let corpus = condense_tests::corpus_dir();
    for format in ["pi", "claude-code", "codex", "opencode", "gemini-cli", "openhands", "swe-agent-traj", "mini-swe-agent-traj"] {
        let lines = ["pi", "claude-code", "codex"].contains(&format);
        let mut files = Vec::new();
        condense_tests::walk_files(&corpus.join(format), &["jsonl", "json", "traj"], &mut files);
        files.retain(|f| !f.ends_with("output.jsonl"));
        files.sort();
        assert!(files.len() >= 2, "too few {format} files in the corpus");
        let (mut imported, mut rounds) = (0, 0);
        // Four files of each JSON-lines format and two of each document format, spread over the sorted list.
        for k in 0..4 {
            let file = &files[k * (files.len() - 1) / 3];
            if !lines && k % 2 == 1 {
                // Document formats: two files each (the corpus holds as few as two).
                continue;
            }
            let bytes = std::fs::read(file).unwrap();
            // JSON lines: at most 256 KB of each (a cut between lines is still a session). A document
            // must be whole to be one.
            let bytes = if lines { &bytes[..bytes.len().min(256 << 10)] } else { &bytes[..] };
            assert!(import_and_render("t.jsonl", bytes) || bytes.is_empty(), "{} does not import unharmed", file.display());
            for _ in 0..40 {
                let mut m = mutilate(bytes, &mut rng);
                if rng.below(3) == 0 {
                    m = mutilate(&m, &mut rng);
                }
                rounds += 1;
                imported += usize::from(import_and_render("t.jsonl", &m));
            }
        }
        // Most mutilations of a JSON-lines file still import (every good line is kept); the rest are a
        // clear error. A JSON document cut or broken anywhere no longer parses as one: an error, never a panic.
        eprintln!("{format}: {imported} of {rounds} mutilated files imported");
        assert!(!lines || imported * 2 > rounds, "{format}: only {imported} of {rounds} mutilated files imported");
    }
    // Random bytes, bare and behind a first line that makes each importer take the file.
    let heads: [&[u8]; 4] = [
        b"",
        b"{\"type\":\"session\",\"version\":3,\"id\":\"x\",\"timestamp\":\"2025-01-01T00:00:00Z\",\"cwd\":\"/\"}\n",
        b"{\"type\":\"user\",\"uuid\":\"u\",\"sessionId\":\"s\",\"message\":{\"role\":\"user\",\"content\":\"hi\"}}\n",
        b"{\"type\":\"session_meta\",\"payload\":{\"id\":\"x\"}}\n",
    ];
    for round in 0..400 {
        let mut b = heads[round % 4].to_vec();
        let len = rng.below(4096);
        if round % 2 == 0 {
            b.extend((0..len).map(|_| rng.next() as u8));
        } else {
            // JSON-shaped noise: random tokens of the format's vocabulary.
            let tokens = ["{", "}", "[", "]", ",", ":", "\"type\"", "\"message\"", "\"content\"", "\"role\"", "\"tool_use\"", "\"id\"", "null", "1", "\"x\"", "\n", "\"payload\"", "\"parentId\""];
            for _ in 0..len / 4 {
                b.extend_from_slice(tokens[rng.below(tokens.len())].as_bytes());
            }
        }
        import_and_render("t.jsonl", &b);
    }
}

/// A new session is imported as a stream (parsed on one thread while the log is written, never held
/// whole, not folded): the log holds the same events as the whole-file import (which an existing empty
/// session takes), for every corpus session and for damaged files.
#[test]
fn streamed_import_writes_what_the_whole_file_import_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    let mut files = condense_tests::corpus_sessions();
    let damaged = [
        ("two-on-a-line.jsonl", "{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\n{\"type\":\"message\",\"id\":\"a\",\"parentId\":null,\"message\":{\"role\":\"user\",\"content\":\"hi\"}}{\"type\":\"message\",\"id\":\"b\",\"parentId\":\"a\",\"message\":{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"yo\"}]}}\r\n\n"),
        ("bad-escape-dangling.jsonl", "{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\n{\"type\":\"message\",\"id\":\"a\",\"parentId\":\"zz\",\"message\":{\"role\":\"user\",\"content\":\"c:\\q\"}}\nnot json\n{\"type\":\"message\",\"id\":\"a\",\"parentId\":\"a\",\"message\":{\"role\":\"user\",\"content\":\"no newline at the end\"}}"),
    ];
    for (name, text) in damaged {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        files.push(f);
    }
    let events = |name: &str| {
        let s = store.session(name).unwrap();
        store.log().read(s.id(), 1, s.head().unwrap()).unwrap().into_iter().map(|e| e.body).collect::<Vec<_>>()
    };
    let mut streams = 0;
    for (i, f) in files.iter().enumerate() {
        let reader = std::io::BufReader::new(std::fs::File::open(f).unwrap());
        streams += usize::from(condense_formats::import_stream("f", reader, &mut |_| {}).unwrap().is_some());
        let (a, b) = (format!("streamed{i}"), format!("whole{i}"));
        let streamed = store.import_file(f, &a).unwrap();
        store.create_session(&b).unwrap();
        let whole = store.import_file(f, &b).unwrap();
        assert_eq!(events(&a), events(&b), "{}", f.display());
        assert_eq!((streamed.events, streamed.format, &streamed.diagnostics), (whole.events, whole.format, &whole.diagnostics), "{}", f.display());
        assert_eq!(store.session(&a).unwrap().render().unwrap().messages, store.session(&b).unwrap().render().unwrap().messages);
    }
    // All but the odd file (pretty-printed objects, read whole) took the streaming path.
    assert!(streams + 3 >= files.len(), "{streams} of {} streamed", files.len());
    // The damaged files were read with their defects reported, not refused.
    let last = store.import_file(&files[files.len() - 1], "again").unwrap();
    assert!(last.diagnostics.len() >= 3, "{:?}", last.diagnostics);
}

/// A folder's sessions are made durable together, by the sync after its last file: files read whole (a
/// document format) are written without a flush, as streamed ones are. The heads manifest, which learns
/// heads only at a flush, shows it: empty until the sync, then one record per session.
#[test]
fn files_read_whole_in_a_folder_wait_for_the_sync_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = condense_tests::corpus_dir();
    let mut documents = Vec::new();
    condense_tests::walk_files(&corpus.join("gemini-cli"), &["json"], &mut documents);
    documents.sort();
    assert!(documents.len() >= 2, "document-format files in the corpus");
    let pi = condense_tests::corpus_sessions().into_iter().find(|f| f.starts_with(corpus.join("pi"))).unwrap();
    let files = vec![(documents[0].clone(), "doc0".to_string()), (pi, "streamed".into()), (documents[1].clone(), "doc1".into())];
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    let mut imported = Vec::new();
    store.import_files_deferred(&files, &mut |_, r| imported.push(r.unwrap()[0].events));
    assert!(imported.len() == 3 && imported.iter().all(|&n| n > 2), "{imported:?}");
    let manifest = dir.path().join("s").join("heads");
    let recorded = || std::fs::metadata(&manifest).map(|m| m.len()).unwrap_or(0);
    assert_eq!(recorded(), 0, "a flush came before the sync");
    store.sync().unwrap();
    assert_eq!(recorded(), 3 * 16, "one record (session, head) per session");
    for (name, n) in ["doc0", "streamed", "doc1"].iter().zip(&imported) {
        assert_eq!(store.session(name).unwrap().head().unwrap(), *n, "{name}");
    }
}

/// Files imported together are read ahead (one hashed and parsed while the one before is written), and
/// the store ends as it ends when they are imported one at a time: the same results in the same order,
/// the same sessions holding the same events. Among the files: every corpus line-format session, files of
/// document formats (read whole), a damaged file, one that does not exist, two files under one name (the
/// second is refused), a session imported before (left as it is), one created empty (imported into),
/// and one file twice in a row under one name (the second finds the first import complete).
#[test]
fn files_read_ahead_end_as_files_imported_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = condense_tests::corpus_dir();
    let mut files: Vec<(std::path::PathBuf, String)> = condense_tests::corpus_sessions().into_iter().enumerate().map(|(i, f)| (f, format!("s{i}"))).collect();
    let mut documents = Vec::new();
    condense_tests::walk_files(&corpus.join("gemini-cli"), &["json"], &mut documents);
    condense_tests::walk_files(&corpus.join("openhands"), &["jsonl", "json"], &mut documents);
    documents.sort();
    assert!(documents.len() >= 2, "document-format files in the corpus");
    let damaged = dir.path().join("damaged.jsonl");
    std::fs::write(&damaged, "{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\nnot json\n{\"type\":\"message\",\"id\":\"a\",\"parentId\":\"zz\",\"message\":{\"role\":\"user\",\"content\":\"hi\"}}").unwrap();
    let pi = condense_tests::corpus_sessions().into_iter().filter(|f| f.starts_with(corpus.join("pi"))).collect::<Vec<_>>();
    let extra = [
        (documents[0].clone(), "doc0".to_string()),
        (damaged.clone(), "damaged".into()),
        (dir.path().join("missing.jsonl"), "missing".into()),
        (pi[0].clone(), "twice".into()),
        (pi[1].clone(), "twice".into()),
        (pi[2].clone(), "before".into()),
        (pi[3].clone(), "empty".into()),
        (documents[1].clone(), "doc1".into()),
        // Read whole straight after its first import.
        (pi[4].clone(), "again".into()),
        (pi[4].clone(), "again".into()),
    ];
    // Spread among the corpus files, so files read ahead come before and after each of them (the two
    // "again" files next to each other).
    for (k, e) in extra.into_iter().enumerate() {
        let at = if k == 9 { files.iter().position(|(_, n)| n == "again").unwrap() + 1 } else { (k * 7).min(files.len()) };
        files.insert(at, e);
    }
    let open = |name: &str| {
        let store = condense_engine::Store::open(dir.path().join(name)).unwrap();
        store.import_file(&pi[2], "before").unwrap();
        store.create_session("empty").unwrap();
        store
    };
    let shown = |r: condense_engine::Result<Vec<condense_engine::ImportOutcome>>| match r {
        Ok(outcomes) => outcomes.iter().map(|o| format!("{} {:?} {:?} {} {} {:?}", o.name, o.action, o.format, o.events, o.bytes, o.diagnostics)).collect::<Vec<_>>().join("; "),
        Err(e) => format!("error: {e}"),
    };
    let together = open("together");
    let mut results = Vec::new();
    together.import_files_deferred(&files, &mut |i, r| results.push((i, shown(r))));
    together.sync().unwrap();
    let alone = open("alone");
    let expected: Vec<(usize, String)> = files.iter().enumerate().map(|(i, (f, name))| (i, shown(alone.import_file_all_deferred(f, name)))).collect();
    alone.sync().unwrap();
    assert_eq!(results, expected);
    // The cases the files were chosen for.
    let result = |name: &str| &results[files.iter().position(|(_, n)| n == name).unwrap()].1;
    assert!(result("missing").starts_with("error: "), "{}", result("missing"));
    assert!(results.iter().filter(|(_, r)| r.contains("twice ")).count() == 1 && results.iter().any(|(_, r)| r.starts_with("error: ") && r.contains("twice")), "{results:?}");
    assert!(result("before").contains("Unchanged"), "{}", result("before"));
    let again: Vec<&String> = files.iter().zip(&results).filter(|((_, n), _)| n == "again").map(|(_, (_, r))| r).collect();
    assert!(again.len() == 2 && again[0].contains("Imported") && again[1].contains("Unchanged"), "{again:?}");
    assert!(result("empty").contains("Resumed"), "{}", result("empty"));
    assert!(result("damaged").contains("Imported") && result("damaged").contains("line: 2"), "{}", result("damaged"));
    assert!(result("doc0").contains("Imported") && result("doc1").contains("Imported"), "{} / {}", result("doc0"), result("doc1"));
    let sessions = |s: &condense_engine::Store| s.sessions().unwrap().into_iter().map(|i| i.name).collect::<Vec<_>>();
    assert_eq!(sessions(&together), sessions(&alone));
    assert!(sessions(&together).len() > files.len() - 4, "{} sessions from {} files", sessions(&together).len(), files.len());
    for name in sessions(&together) {
        let events = |s: &condense_engine::Store| {
            let session = s.session(&name).unwrap();
            s.log().read(session.id(), 1, session.head().unwrap()).unwrap().into_iter().map(|e| e.body).collect::<Vec<_>>()
        };
        assert_eq!(events(&together), events(&alone), "{name}");
    }
}

/// A reader that counts the bytes consumed from it.
struct Counted<'a> {
    inner: &'a [u8],
    consumed: std::rc::Rc<std::cell::Cell<usize>>,
}

impl std::io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.set(self.consumed.get() + n);
        Ok(n)
    }
}

impl std::io::BufRead for Counted<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(self.inner)
    }
    fn consume(&mut self, amount: usize) {
        self.consumed.set(self.consumed.get() + amount);
        self.inner = &self.inner[amount..];
    }
}

#[test]
fn every_line_format_hands_its_entries_over_while_the_file_is_still_being_read() {
    let corpus = condense_tests::corpus_dir();
    let mut files = Vec::new();
    for format in ["pi", "claude-code", "codex"] {
        let mut all = Vec::new();
        condense_tests::walk_files(&corpus.join(format), &["jsonl"], &mut all);
        // The largest session of each format: far more lines than format detection reads first.
        all.sort_by_key(|f| std::cmp::Reverse(std::fs::metadata(f).map_or(0, |m| m.len())));
        files.push((format, all.remove(0)));
    }
    for (format, f) in files {
        let bytes = std::fs::read(&f).unwrap();
        let consumed = std::rc::Rc::new(std::cell::Cell::new(0));
        let reader = Counted { inner: &bytes, consumed: consumed.clone() };
        // How much of the file had been read when each entry was handed over.
        let mut at = Vec::new();
        condense_formats::import_stream("f", reader, &mut |e| {
            if matches!(e, SourceEvent::EntryAppended { .. }) {
                at.push(consumed.get());
            }
        })
        .unwrap()
        .expect("a line format");
        assert!(at.len() > 20, "{format}: {} entries", at.len());
        let half = at[at.len() / 2];
        assert!(half < bytes.len() * 9 / 10, "{format} {}: the middle entry left after {half} of {} bytes were read", f.display(), bytes.len());
    }
}

#[test]
fn fuzz_the_export_reader_with_mutilated_exports() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_engine::Store::open(dir.path().join("a")).unwrap();
    let files = condense_tests::corpus_sessions();
    for f in files.iter().take(3) {
        store.import_file(f, &f.display().to_string()).unwrap();
    }
    let export = dir.path().join("a.export");
    store.log().export(&export).unwrap();
    let good = std::fs::read(&export).unwrap();
    let target = condense_engine::Store::open(dir.path().join("b")).unwrap();
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let path = dir.path().join("m.export");
    let mut refused = 0;
    for round in 0..300 {
        let mut m = mutilate(&good, &mut rng);
        if round % 5 == 0 {
            // A length field made huge: the reader must not trust it.
            let at = 16 + 1 + rng.below(good.len().saturating_sub(24)).min(good.len() - 21);
            m = good.clone();
            m[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }
        std::fs::write(&path, &m).unwrap();
        match target.log().import(&path) {
            Ok(_) => assert_eq!(m, good, "round {round}: a changed export was accepted"),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
        }
    }
    eprintln!("{refused} of 300 mutilated exports refused");
    assert!(refused >= 250, "only {refused} of 300 mutilated exports were refused");
    // Nothing a refused import read was stored.
    assert_eq!(target.log().verify().unwrap().events, 0);
}

#[test]
fn opencode_steps_tool_parts_synthetic_text_and_compaction() {
    let doc = r#"{"info":{"id":"ses_1","directory":"/w","time":{"created":1700000000000}},"messages":[
 {"info":{"id":"msg_1","role":"user"},"parts":[{"type":"text","text":"fix the bug"},{"type":"text","synthetic":true,"text":"Called the Read tool: a.rs"},{"type":"file","filename":"a.rs"}]},
 {"info":{"id":"msg_2","role":"assistant","modelID":"gpt-5"},"parts":[
   {"type":"step-start"},{"type":"reasoning","text":"look first"},
   {"type":"tool","id":"prt_1","callID":"c1","tool":"read","state":{"status":"completed","input":{"path":"a.rs"},"output":"fn main() {}"}},
   {"type":"tool","id":"prt_2","callID":"c2","tool":"bash","state":{"status":"error","input":{"cmd":"cargo t"},"error":"exit 101"}},
   {"type":"step-finish"},{"type":"step-start"},
   {"type":"text","text":"done"},
   {"type":"tool","id":"prt_3","callID":"c3","tool":"bash","state":{"status":"running","input":{"cmd":"sleep"}}},
   {"type":"mystery"},{"type":"step-finish"}]},
 {"info":{"id":"msg_5","role":"user"},"parts":[{"type":"text","text":"thanks"}]}
]}"#;
    insta::assert_snapshot!(check_import(doc));
    // A compaction request and its summary: the context after it starts from the summary.
    let compacted = r#"{"info":{"id":"ses_2"},"messages":[
 {"info":{"id":"msg_1","role":"user"},"parts":[{"type":"text","text":"fix the bug"}]},
 {"info":{"id":"msg_2","role":"assistant"},"parts":[{"type":"step-start"},{"type":"text","text":"fixed"},{"type":"step-finish"}]},
 {"info":{"id":"msg_3","role":"user"},"parts":[{"type":"compaction","auto":true}]},
 {"info":{"id":"msg_4","role":"assistant","mode":"compaction","summary":true},"parts":[{"type":"text","text":"Summary: fixed a.rs"}]},
 {"info":{"id":"msg_5","role":"user"},"parts":[{"type":"text","text":"thanks"}]}
]}"#;
    insta::assert_snapshot!("opencode_compaction", check_import(compacted));
}

#[test]
fn gemini_cli_calls_with_embedded_results() {
    let doc = r#"{"sessionId":"s1","projectHash":"p","startTime":"2025-12-01T21:45:00Z","messages":[
 {"id":"u1","type":"user","content":"list files"},
 {"id":"g1","type":"gemini","content":"","thoughts":[{"subject":"Plan","description":"list the folder"}],"model":"gemini-2.5-pro",
  "toolCalls":[{"id":"ls-1","name":"list_directory","args":{"dir_path":"/w"},"result":[{"functionResponse":{"id":"ls-1","name":"list_directory","response":{"output":"a.rs\nb.rs"}}}],"status":"success"},
               {"id":"rd-2","name":"read_file","args":{"file_path":"/w/c.rs"},"result":[{"functionResponse":{"id":"rd-2","name":"read_file","response":{"error":"no such file"}}}],"status":"error"},
               {"id":"x-3","name":"shell","args":{}}]},
 {"id":"i1","type":"info","content":"Request cancelled."},
 {"id":"g2","type":"gemini","content":"Two files: a.rs and b.rs."},
 {"id":"q1","type":"question","content":"?"}
]}"#;
    insta::assert_snapshot!(check_import(doc));
}

#[test]
fn openhands_actions_observations_and_one_response_with_two_calls() {
    let mr = |id: &str| format!(r#"{{"id":"{id}","choices":[{{"message":{{"tool_calls":[{{"id":"t1","function":{{"name":"execute_bash","arguments":"{{\"command\":\"ls\"}}"}}}},{{"id":"t2","function":{{"name":"str_replace_editor","arguments":"{{\"command\":\"view\",\"path\":\"/w\"}}"}}}}]}}}}]}}"#);
    let doc = format!(
        r#"[{{"id":0,"source":"agent","action":"system","args":{{"content":"You are OpenHands"}}}},
 {{"id":1,"source":"user","action":"message","args":{{"content":"list the repo"}},"message":"list the repo"}},
 {{"id":2,"source":"agent","action":"run","args":{{"command":"ls","thought":"Start by listing."}},"tool_call_metadata":{{"function_name":"execute_bash","tool_call_id":"t1","model_response":{}}}}},
 {{"id":3,"source":"agent","action":"read","args":{{"path":"/w"}},"tool_call_metadata":{{"function_name":"str_replace_editor","tool_call_id":"t2","model_response":{}}}}},
 {{"id":4,"source":"agent","observation":"run","cause":2,"content":"a.py\nb.py","tool_call_metadata":{{"function_name":"execute_bash","tool_call_id":"t1"}}}},
 {{"id":5,"source":"agent","observation":"error","cause":3,"content":"permission denied","tool_call_metadata":{{"function_name":"str_replace_editor","tool_call_id":"t2"}}}},
 {{"id":6,"source":"environment","observation":"agent_state_changed","content":""}},
 {{"id":7,"source":"agent","action":"message","args":{{"content":"There are two files."}}}}]"#,
        mr("r1"),
        mr("r1")
    );
    insta::assert_snapshot!(check_import(&doc));
}

#[test]
fn swe_agent_and_mini_swe_agent_chat_histories() {
    let swe = r#"{"environment":"swe_main","trajectory":[],"info":{"exit_status":"submitted"},"history":[
 {"role":"system","content":"SETTING: you are an autonomous programmer","agent":"main"},
 {"role":"user","content":"ISSUE: division by zero","agent":"main","message_type":"observation"},
 {"role":"assistant","content":"Find the file.","thought":"Find the file.","action":"find_file x.py","tool_calls":[{"id":"call_1","type":"function","function":{"name":"find_file","arguments":"{\"file_name\":\"x.py\"}"}}]},
 {"role":"tool","content":"Found 1 match: tests/x.py","tool_call_ids":["call_1"]},
 {"role":"assistant","content":"open it\n```\nopen tests/x.py\n```"},
 {"role":"user","content":"[File: tests/x.py (3 lines total)]","message_type":"observation"},
 {"role":"narrator","content":"?"}
]}"#;
    let mini = r#"{"trajectory_format":"mini-swe-agent-1.1","instance_id":"repo__x-1","info":{"exit_status":"Submitted"},"messages":[
 {"role":"system","content":"You are a helpful assistant."},
 {"role":"user","content":"<pr_description>fix x</pr_description>"},
 {"role":"assistant","content":"Look around.","reasoning_content":"Need the layout first.","tool_calls":[{"id":"call_a","type":"function","function":{"name":"bash","arguments":"{\"command\": \"ls\"}"}}]},
 {"role":"tool","tool_call_id":"call_a","content":"<returncode>0</returncode>\n<output>x.py</output>","extra":{"returncode":0}},
 {"role":"assistant","content":"Submit.","tool_calls":[{"id":"call_b","type":"function","function":{"name":"bash","arguments":"{\"command\": \"submit\"}"}}]},
 {"role":"exit","content":"","extra":{"exit_status":"Submitted"}}
]}"#;
    insta::assert_snapshot!("swe_agent", check_import(swe));
    insta::assert_snapshot!("mini_swe_agent", check_import(mini));
}

#[test]
fn every_corpus_session_of_the_document_formats_imports_valid_or_is_named_with_a_reason() {
    let corpus = condense_tests::corpus_dir();
    let mut imported = std::collections::BTreeMap::new();
    let mut refused = Vec::new();
    for folder in ["opencode", "gemini-cli", "openhands", "swe-agent-traj", "mini-swe-agent-traj"] {
        let mut files = Vec::new();
        condense_tests::walk_files(&corpus.join(folder), &["json", "jsonl", "traj"], &mut files);
        files.sort();
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let name = condense_tests::corpus_name(&f);
            match condense_formats::import_sessions(&name, &bytes) {
                Ok(sessions) => {
                    for (_, i) in sessions {
                        let p = fold(&i.events);
                        let r = p.render();
                        assert!(check(&r.messages).is_empty(), "{name}: {:?}", check(&r.messages));
                        // (A session that ends in a host compaction renders as its summary alone.)
                        assert!(!r.messages.is_empty(), "{name}: nothing rendered");
                        *imported.entry(i.format.name()).or_insert(0) += 1;
                    }
                }
                Err(reason) => refused.push((name, reason)),
            }
        }
    }
    let counts: Vec<_> = imported.into_iter().collect();
    // OpenHands: three trajectories saved one per file, and three instances of an evaluation output (one
    // trajectory per line, a session each).
    assert_eq!(counts, [("gemini-cli", 2), ("mini-swe-agent", 95), ("opencode", 14), ("openhands", 6), ("swe-agent", 22)]);
    // The resolver's mock output holds histories of an older event shape: refused, saying so.
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].0.ends_with("mock_output/output.jsonl") && refused[0].1.contains("older event shape"), "{refused:?}");
}

#[test]
fn every_corpus_file_imports_or_says_what_it_looks_like() {
    let (mut ok, mut skipped) = (0, Vec::new());
    for f in &condense_tests::corpus_files() {
        let name = condense_tests::corpus_name(f);
        match condense_formats::import_sessions(&name, &std::fs::read(f).unwrap()) {
            Ok(_) => ok += 1,
            Err(reason) => {
                assert!(reason.contains("looks like"), "{name}: a skip must say what the file looks like: {reason}");
                skipped.push(name);
            }
        }
    }
    assert!(ok >= 190, "{ok} imported");
    // What the corpus holds that condense does not read: managed-agent event transcripts, normalized
    // exports, an OpenHands resolver output of an older event shape and one fixture manifest.
    assert_eq!(skipped.len(), 12, "{skipped:#?}");
}

#[test]
fn an_openhands_evaluation_output_holds_a_session_per_instance() {
    let line = |id: &str, task: &str| {
        format!(
            r#"{{"instance_id":"{id}","instruction":"{task}","history":[{{"id":1,"source":"user","action":"message","args":{{"content":"{task}"}}}},{{"id":2,"source":"agent","action":"message","args":{{"content":"done"}}}}]}}"#
        )
    };
    let file = format!("{}\n{{broken\n{}\n", line("repo__a-1", "fix a"), line("repo__b-2", "fix b"));
    let sessions = condense_formats::import_sessions("output.jsonl", file.as_bytes()).unwrap();
    let keys: Vec<_> = sessions.iter().map(|(k, _)| k.clone().unwrap()).collect();
    assert_eq!(keys, ["repo__a-1", "repo__b-2"]);
    // The broken line is named, on the first session.
    let d = &sessions[0].1.diagnostics;
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].file.as_str(), d[0].line), ("output.jsonl", 2));
    assert!(matches!(&sessions[1].1.events[0], SourceEvent::SessionStarted { source_id: Some(id), .. } if id == "repo__b-2"));
    // Any other file is one session, keyed by nothing.
    let one = condense_formats::import_sessions("s.jsonl", b"{\"type\":\"session\",\"version\":3,\"id\":\"x\"}\n").unwrap();
    assert_eq!(one.len(), 1);
    assert!(one[0].0.is_none());
}

#[test]
fn a_codex_prompt_recorded_only_as_an_event_is_imported_once() {
    let only_event = concat!(
        r#"{"type":"session_meta","payload":{"id":"x"}}"#, "\n",
        r#"{"type":"event_msg","payload":{"type":"user_message","message":"fix the build"}}"#, "\n",
        r#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"on it"}]}}"#, "\n",
    );
    let both = concat!(
        r#"{"type":"session_meta","payload":{"id":"x"}}"#, "\n",
        r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the build"}]}}"#, "\n",
        r#"{"type":"event_msg","payload":{"type":"user_message","message":"fix the build"}}"#, "\n",
        r#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"on it"}]}}"#, "\n",
        r#"{"type":"event_msg","payload":{"type":"user_message","message":"and the tests"}}"#, "\n",
    );
    let a = check_import(only_event);
    assert!(a.contains("user(Prompt): text \"fix the build\"\nassistant: text \"on it\""), "{a}");
    let b = check_import(both);
    assert_eq!(b.matches("fix the build").count(), 1, "{b}");
    // A prompt at the end of the file with no reply yet is kept too.
    assert!(b.trim_end().ends_with("user(Prompt): text \"and the tests\""), "{b}");
}

#[test]
fn a_call_id_a_trajectory_uses_again_is_renamed_with_its_result() {
    let swe = r#"{"environment":"swe_main","trajectory":[],"history":[
 {"role":"user","content":"ISSUE: fix it"},
 {"role":"assistant","content":"look","tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
 {"role":"tool","content":"first","tool_call_ids":["call_1"]},
 {"role":"assistant","content":"again","tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
 {"role":"tool","content":"second","tool_call_ids":["call_1"]},
 {"role":"assistant","content":"and again","tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
 {"role":"tool","tool_call_id":"call_1","content":"third"}
]}"#;
    let sessions = condense_formats::import_sessions("t.traj", swe.as_bytes()).unwrap();
    let p = fold(&sessions[0].1.events);
    let rendered = p.render();
    assert!(condense_render::check(&rendered.messages[..]).is_empty(), "{:?}", condense_render::check(&rendered.messages[..]));
    let ids: Vec<String> = rendered.messages.iter().flat_map(|m| m.tool_calls().map(|(id, _, _)| id.to_string()).collect::<Vec<_>>()).collect();
    assert_eq!(ids, ["call_1", "call_1_2", "call_1_3"]);
    let answered: Vec<(String, String)> = rendered
        .messages
        .iter()
        .filter_map(|m| match &**m {
            condense_events::Message::ToolResult { call_id, .. } => Some((call_id.clone(), m.text())),
            _ => None,
        })
        .collect();
    assert_eq!(answered, [("call_1".into(), "first".into()), ("call_1_2".into(), "second".into()), ("call_1_3".into(), "third".into())]);
    let diags = sessions[0].1.events.iter().filter(|e| matches!(e, SourceEvent::ImportDiagnostic { message, .. } if message.contains("used again"))).count();
    assert_eq!(diags, 2);
}

/// `simulate` reads a file on a thread of its own and replays its events as they are parsed: every corpus
/// file gives the events the whole-file import gives, in order, or fails before its first event as that
/// import does; a folder fails at once and names itself.
#[test]
fn a_file_read_beside_the_replay_gives_the_events_of_the_whole_file_import() {
    use condense_engine::simulate::Reading;
    let (mut streamed, mut failed) = (0, 0);
    for f in &condense_tests::corpus_files() {
        match (condense_formats::import_file(f), Reading::start(f)) {
            (Ok(whole), Ok(reading)) => {
                let mut reading = reading;
                let events: Vec<SourceEvent> = reading.by_ref().collect();
                assert!(reading.finish().is_none(), "{}", f.display());
                assert!(events == whole.events, "{}: {} events read beside, {} whole", f.display(), events.len(), whole.events.len());
                streamed += 1;
            }
            (Err(whole), Err(beside)) => {
                assert_eq!(beside.to_string(), whole.to_string());
                failed += 1;
            }
            (whole, beside) => panic!("{}: whole {:?}, beside {:?}", f.display(), whole.err(), beside.err()),
        }
    }
    assert!(streamed >= 180 && failed >= 1, "{streamed} read, {failed} failed");
    let folder = condense_tests::corpus_dir().join("pi");
    let err = Reading::start(&folder).err().expect("a folder is not a session file").to_string();
    assert!(err.contains(&folder.display().to_string()), "{err}");
}

/// A streaming import keeps several appends in flight. When another writer appends to the session
/// meanwhile, the import's next append fails at a head it no longer finds, and so do those queued
/// behind it: the error reported is the first, naming the head the other writer took, and what the
/// session held stays (the events imported until then, and the other writer's).
#[test]
fn an_import_cut_into_by_another_writer_reports_the_first_append_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    // 40,000 entries of about 1 KB: about 20 hand-overs of 2,048 events.
    let mut text = String::from("{\"type\":\"session\",\"version\":3,\"id\":\"s\"}\n");
    let filler = "lorem ipsum dolor sit amet ".repeat(40);
    for i in 0..40_000 {
        let parent = if i == 0 { "null".to_string() } else { format!("\"m{}\"", i - 1) };
        text.push_str(&format!("{{\"type\":\"message\",\"id\":\"m{i}\",\"parentId\":{parent},\"message\":{{\"role\":\"user\",\"content\":\"{i} {filler}\"}}}}\n"));
    }
    let file = dir.path().join("big.jsonl");
    std::fs::write(&file, text).unwrap();
    let log = store.log().clone();
    let other = std::thread::spawn(move || {
        // Once the import has written two hand-overs, append to its session at the head it has then.
        loop {
            let Some(id) = log.session_id("big").unwrap() else {
                std::thread::yield_now();
                continue;
            };
            // The name is there before the session's head is (its creation is not flushed yet).
            let head = match log.head(id) {
                Ok(h) => h,
                Err(condense_log::LogError::UnknownSession(_)) => continue,
                Err(e) => panic!("{e}"),
            };
            if head < 4096 {
                std::thread::yield_now();
                continue;
            }
            let event = condense_events::Event::Source(SourceEvent::TurnEnded);
            match log.append(id, head, vec![event]) {
                Ok(_) => return (id, head),
                Err(condense_log::LogError::HeadMismatch { .. }) => continue,
                Err(e) => panic!("{e}"),
            }
        }
    });
    let result = store.import_file(&file, "big");
    let (id, taken) = other.join().unwrap();
    match result {
        Err(condense_engine::EngineError::Log(condense_log::LogError::HeadMismatch { session, expected, actual })) => {
            assert_eq!((session, expected, actual), (id, taken, taken + 1));
        }
        other => panic!("the import should fail at the head the other writer took ({taken}): {other:?}"),
    }
    assert!((4096..40_000).contains(&taken), "the other writer appended mid-import, at {taken}");
    assert_eq!(store.log().head(id).unwrap(), taken + 1, "nothing written before is lost");
}

/// A session's import keeps its first MiB of values in sled, so a folder of small sessions costs no
/// value file (and no sync of one each); a larger session's values go on to its own file
/// (`values/<session>`), and both read back the same.
#[test]
fn a_small_sessions_values_stay_in_sled_and_a_large_ones_go_to_its_value_file() {
    let dir = tempfile::tempdir().unwrap();
    let codex = condense_tests::corpus_sessions().into_iter().find(|f| f.starts_with(condense_tests::corpus_dir().join("codex"))).unwrap();
    // The demo's generated pi session, long enough for over a MiB of values.
    let large = dir.path().join("large.jsonl");
    let text = condense_engine::demo::generate(condense_engine::demo::DemoConfig { prompts: 30, calls_per_prompt: 30 });
    std::fs::write(&large, &text).unwrap();
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    let files = vec![(codex, "small".to_string()), (large, "large".into())];
    let mut imported = Vec::new();
    store.import_files_deferred(&files, &mut |_, r| imported.push(r.unwrap()[0].events));
    store.sync().unwrap();
    let values = dir.path().join("s").join("values");
    let small = store.session("small").unwrap().id();
    let big = store.session("large").unwrap().id();
    assert!(!values.join(small.to_string()).exists(), "a value file for a small session");
    let file_len = std::fs::metadata(values.join(big.to_string())).unwrap().len();
    assert!(file_len > 200_000 && (file_len as usize) < text.len(), "value file of {file_len} bytes for {} of text", text.len());
    let entries = |events: Vec<SourceEvent>| events.into_iter().filter(|e| matches!(e, SourceEvent::EntryAppended { .. })).collect::<Vec<_>>();
    for ((file, name), &n) in files.iter().zip(&imported) {
        let s = store.session(name).unwrap();
        let stored: Vec<SourceEvent> = store.log().read(s.id(), 1, s.head().unwrap()).unwrap().into_iter().filter_map(|e| match e.body {
            condense_events::Event::Source(s) => Some(s),
            condense_events::Event::Decision(_) => None,
        }).collect();
        assert_eq!(stored.len() as u64, n, "{name}");
        assert_eq!(entries(stored), entries(condense_formats::import_file(file).unwrap().events), "{name}");
    }
    assert_eq!(store.log().verify().unwrap().events, imported.iter().sum::<u64>());
}

/// A file that starts with a UTF-8 byte-order mark (as some editors and Windows tools save it) imports as
/// the same file without one: every corpus format, through the whole-file import and through the store
/// (a line format's streaming import). The mark used to cost a JSON-lines file its first line (the
/// session header) and made every JSON-document importer refuse the file (issue 35, item 8).
#[test]
fn a_byte_order_mark_changes_nothing() {
    let corpus = condense_tests::corpus_dir();
    let dir = tempfile::tempdir().unwrap();
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    for (format, ext) in [("pi", "jsonl"), ("claude-code", "jsonl"), ("codex", "jsonl"), ("opencode", "json"), ("gemini-cli", "json"), ("swe-agent-traj", "traj"), ("mini-swe-agent-traj", "json")] {
        let mut files = Vec::new();
        condense_tests::walk_files(&corpus.join(format), &[ext], &mut files);
        files.sort();
        let file = files.first().unwrap_or_else(|| panic!("a corpus {format} file"));
        let bytes = std::fs::read(file).unwrap();
        let marked = [b"\xEF\xBB\xBF".as_slice(), &bytes].concat();
        let plain = condense_formats::import_sessions("f", &bytes).unwrap();
        let with = condense_formats::import_sessions("f", &marked).unwrap_or_else(|e| panic!("{format} with a BOM: {e}"));
        assert_eq!(with.len(), plain.len(), "{format}");
        for ((_, a), (_, b)) in plain.iter().zip(&with) {
            assert_eq!(a.format, b.format, "{format}");
            assert_eq!(a.events, b.events, "{format}: the events with and without the mark");
        }
        let copy = dir.path().join(format!("{format}-bom.{ext}"));
        std::fs::write(&copy, &marked).unwrap();
        store.import_file(&copy, &format!("{format}-bom")).unwrap();
        store.import_file(file, &format!("{format}-plain")).unwrap();
        let entries = |name: &str| store.session(name).unwrap().projection().unwrap().entries();
        assert_eq!(entries(&format!("{format}-bom")), entries(&format!("{format}-plain")), "{format} through the store");
    }
}

/// An OpenHands evaluation output with one damaged line (cut short, as a run killed mid-write leaves the
/// last; or any other) imports every other instance, and the damaged line is a diagnostic naming it. A
/// damaged first line used to hide that the file is an evaluation output, and the file was refused whole
/// (issue 35, item 8).
#[test]
fn an_evaluation_output_with_a_damaged_line_keeps_the_other_instances() {
    let file = condense_tests::corpus_dir().join("openhands/All-Hands-AI__OpenHands/evaluation/benchmarks/multi_swe_bench/examples/output.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    let whole = condense_formats::import_sessions("output.jsonl", text.as_bytes()).unwrap();
    for damaged in 0..3 {
        let cut: Vec<String> = lines.iter().enumerate().map(|(i, l)| if i == damaged { l[..l.len() / 2].to_string() } else { l.to_string() }).collect();
        let sessions = condense_formats::import_sessions("output.jsonl", cut.join("\n").as_bytes())
            .unwrap_or_else(|e| panic!("line {} damaged: refused whole: {e}", damaged + 1));
        let expected: Vec<_> = whole.iter().enumerate().filter(|(i, _)| *i != damaged).map(|(_, s)| s).collect();
        let kept: Vec<&Option<String>> = sessions.iter().map(|(k, _)| k).collect();
        assert_eq!(kept, expected.iter().map(|(k, _)| k).collect::<Vec<_>>(), "line {} damaged", damaged + 1);
        let entries = |s: &condense_formats::Imported| s.events.iter().filter(|e| matches!(e, SourceEvent::EntryAppended { .. })).count();
        for ((_, a), (_, b)) in sessions.iter().zip(expected) {
            assert_eq!(entries(a), entries(b));
        }
        let said = sessions.iter().flat_map(|(_, s)| &s.diagnostics).any(|d| d.line == damaged as u64 + 1 && d.message.contains("not JSON"));
        assert!(said, "line {} damaged: a diagnostic names it", damaged + 1);
    }
}

/// A JSON-document session cut short (a copy that stopped, a tool killed while writing) is refused with
/// an error that says so and where, through `import_sessions` and the store's import alike; before it was
/// "line 2 looks like a bare JSON value" (issue 35, item 8).
#[test]
fn a_cut_short_document_is_refused_as_cut_short() {
    let corpus = condense_tests::corpus_dir();
    let dir = tempfile::tempdir().unwrap();
    let store = condense_engine::Store::open(dir.path().join("s")).unwrap();
    for (format, ext) in [("opencode", "json"), ("gemini-cli", "json"), ("swe-agent-traj", "traj"), ("mini-swe-agent-traj", "json")] {
        let mut files = Vec::new();
        condense_tests::walk_files(&corpus.join(format), &[ext], &mut files);
        files.sort();
        let bytes = std::fs::read(&files[0]).unwrap();
        let cut = &bytes[..bytes.len() / 2];
        let err = condense_formats::import_sessions("f.json", cut).expect_err(format);
        assert!(err.contains("cut short") && err.contains(&format!("byte {}", cut.len())), "{format}: {err}");
        let copy = dir.path().join(format!("{format}-cut.{ext}"));
        std::fs::write(&copy, cut).unwrap();
        let err = store.import_file(&copy, &format!("{format}-cut")).expect_err(format).to_string();
        assert!(err.contains("cut short"), "{format} through the store: {err}");
    }
}

/// The line types Claude Code 2.1 and Codex 0.169 write for themselves are skipped by name without a word
/// (issue 37: 232 and 79 "unknown line type" diagnostics on their own session files); a type nobody
/// knows is reported once, on its first line, however many lines have it.
#[test]
fn clients_own_bookkeeping_lines_are_skipped_quietly_and_an_unknown_type_is_named_once() {
    let claude = r#"{"type":"atis-latch","sessionId":"S"}
{"type":"user","uuid":"u1","parentUuid":null,"sessionId":"S","cwd":"/w","message":{"role":"user","content":"hello"}}
{"type":"api-request-start","sessionId":"S"}
{"type":"file-history-delta","sessionId":"S"}
{"type":"assistant","uuid":"a1","parentUuid":"u1","sessionId":"S","message":{"id":"m1","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}]}}
{"type":"cost-state","sessionId":"S"}
{"type":"brand-new-kind","sessionId":"S"}
{"type":"brand-new-kind","sessionId":"S"}
{"type":"mode","sessionId":"S"}
"#;
    let imported = import_bytes("t.jsonl", claude.as_bytes()).expect("import");
    let said: Vec<String> = imported.diagnostics.iter().map(|d| format!("{}: {}", d.line, d.message)).collect();
    assert_eq!(said, ["7: unknown line type `brand-new-kind` skipped (and every later line of this type)"]);
    assert_eq!(fold(&imported.events).render().messages.len(), 2);
    let codex = r#"{"timestamp":"t","type":"session_meta","payload":{"id":"c1","timestamp":"t","cwd":"/w"}}
{"timestamp":"t","type":"world_state","payload":{"cwd":"/w"}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}}
{"timestamp":"t","type":"token_usage_record","payload":{"response_id":"r","usage":{"total_tokens":3}}}
{"timestamp":"t","type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}}
{"timestamp":"t","type":"world_state","payload":{"cwd":"/w"}}
"#;
    let imported = import_bytes("t.jsonl", codex.as_bytes()).expect("import");
    assert!(imported.diagnostics.is_empty(), "{:?}", imported.diagnostics);
    assert_eq!(fold(&imported.events).render().messages.len(), 2);
}

/// pi leaves a turn that ended in a provider error or was aborted out of every request it sends (its
/// `transformMessages`): the render does too, with the results that answer its calls, and the turns
/// after it render as pi sends them.
#[test]
fn pi_turns_that_failed_are_not_replayed() {
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"message","id":"e1","parentId":null,"timestamp":"t","message":{"role":"user","content":"edit the files"}}
{"type":"message","id":"e2","parentId":"e1","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"Editing both"},{"type":"toolCall","id":"c1","name":"edit","arguments":{"path":"a.rs","oldText":"x","newText":"y"}},{"type":"toolCall","id":"c2","name":"edit","arguments":{"path":"b.rs","oldText":"x","newText":"y"}}],"stopReason":"error","errorMessage":"terminated"}}
{"type":"message","id":"e3","parentId":"e2","timestamp":"t","message":{"role":"user","content":"go on"}}
{"type":"message","id":"e4","parentId":"e3","timestamp":"t","message":{"role":"assistant","content":[{"type":"toolCall","id":"c3","name":"bash","arguments":{"command":"sleep 100"}}],"stopReason":"aborted"}}
{"type":"message","id":"e5","parentId":"e4","timestamp":"t","message":{"role":"toolResult","toolCallId":"c3","toolName":"bash","content":[{"type":"text","text":"aborted"}],"isError":true}}
{"type":"message","id":"e6","parentId":"e5","timestamp":"t","message":{"role":"user","content":"read it instead"}}
{"type":"message","id":"e7","parentId":"e6","timestamp":"t","message":{"role":"assistant","content":[{"type":"toolCall","id":"c4","name":"read","arguments":{"path":"a.rs"}}],"stopReason":"toolUse"}}
{"type":"message","id":"e8","parentId":"e7","timestamp":"t","message":{"role":"toolResult","toolCallId":"c4","toolName":"read","content":[{"type":"text","text":"fn a() {}"}],"isError":false}}
{"type":"message","id":"e9","parentId":"e8","timestamp":"t","message":{"role":"assistant","content":[{"type":"text","text":"done"}],"stopReason":"stop"}}
"#;
    let imported = import_bytes("t.jsonl", input.as_bytes()).expect("import");
    let r = fold(&imported.events).render();
    assert!(check(&r.messages).is_empty(), "{:?}", check(&r.messages));
    assert_eq!(r.report.failed_turns, 2);
    assert_eq!(r.report.synthetic_results, Vec::<String>::new(), "the failed turns' calls get no synthetic results");
    assert_eq!(r.report.orphan_results, vec!["c3".to_string()], "the result answering an aborted call is dropped");
    let shown: Vec<String> = r.messages.iter().map(|m| condense_tests::readable(std::slice::from_ref(m))).collect();
    assert_eq!(r.messages.len(), 6, "{shown:#?}");
    assert!(shown.iter().all(|m| !m.contains("Editing both") && !m.contains("sleep 100") && !m.contains("aborted")), "{shown:#?}");
}

/// A pi extension's `custom_message` that describes the world (a `<system-reminder>` with the workspace
/// tree, the date and the working directory, as the corpus's `volatile-project-context`) is host context,
/// as the same text is when serve reads it in a request (issue 34, item 1); other custom messages stay
/// injected.
#[test]
fn pi_custom_messages_that_describe_the_world_are_host_context() {
    let input = r#"{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}
{"type":"custom_message","id":"c1","parentId":null,"timestamp":"t","customType":"volatile-project-context","content":"<system-reminder>\n<workspace-tree>\n- src/\n</workspace-tree>\nToday is 2026-07-14.\n</system-reminder>","display":false}
{"type":"message","id":"a1","parentId":"c1","timestamp":"t","message":{"role":"user","content":"go"}}
{"type":"custom_message","id":"c2","parentId":"a1","timestamp":"t","customType":"ctx","content":"injected context","display":false}
"#;
    let imported = import_bytes("t.jsonl", input.as_bytes()).expect("import");
    let origins: Vec<(String, condense_events::UserOrigin)> = imported
        .events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::EntryAppended { id, entry: condense_events::Entry::Message(condense_events::Message::User { origin, .. }), .. } => Some((id.clone(), *origin)),
            _ => None,
        })
        .collect();
    use condense_events::UserOrigin::{Host, Injected, Prompt};
    assert_eq!(origins, [("c1".to_string(), Host), ("a1".to_string(), Prompt), ("c2".to_string(), Injected)]);
}

/// The times of the requests (issue 60, item 3): each importer writes the time of the line that opens an
/// assistant message (`SourceEvent::HostTime`) just before it — once for Claude Code's blocks streamed
/// over several lines, and for Codex's items of one reply — and nothing for a line without a time.
#[test]
fn each_new_assistant_message_is_preceded_by_the_time_of_its_line() {
    let times = |input: &str| -> Vec<(String, String)> {
        let events = import_bytes("t.jsonl", input.as_bytes()).expect("import").events;
        let mut out = Vec::new();
        for (i, e) in events.iter().enumerate() {
            if let SourceEvent::HostTime { timestamp } = e {
                match events.get(i + 1) {
                    Some(SourceEvent::EntryAppended { id, entry: condense_events::Entry::Message(condense_events::Message::Assistant { .. }), .. }) => out.push((timestamp.clone(), id.clone())),
                    other => panic!("a time before {other:?}"),
                }
            }
        }
        out
    };
    let pi = r#"{"type":"session","version":3,"id":"s","timestamp":"2026-03-01T10:00:00.000Z","cwd":"/w"}
{"type":"message","id":"u1","parentId":null,"timestamp":"2026-03-01T10:00:01.000Z","message":{"role":"user","content":"hi"}}
{"type":"message","id":"a1","parentId":"u1","timestamp":"2026-03-01T10:00:02.000Z","message":{"role":"assistant","content":[{"type":"toolCall","id":"c1","name":"bash","arguments":{"command":"ls"}}]}}
{"type":"message","id":"r1","parentId":"a1","timestamp":"2026-03-01T10:00:03.000Z","message":{"role":"toolResult","toolCallId":"c1","toolName":"bash","content":[{"type":"text","text":"a"}]}}
{"type":"message","id":"a2","parentId":"r1","message":{"role":"assistant","content":[{"type":"text","text":"no time"}]}}
{"type":"message","id":"u2","parentId":"a2","timestamp":"2026-03-01T10:09:00.000Z","message":{"role":"user","content":"more"}}
{"type":"message","id":"a3","parentId":"u2","timestamp":"2026-03-01T10:09:04.000Z","message":{"role":"assistant","content":[{"type":"text","text":"done"}]}}
"#;
    assert_eq!(times(pi), [("2026-03-01T10:00:02.000Z".to_string(), "a1".to_string()), ("2026-03-01T10:09:04.000Z".into(), "a3".into())]);
    let claude = r#"{"type":"user","uuid":"u1","parentUuid":null,"sessionId":"S","timestamp":"2026-03-01T10:00:00.000Z","message":{"role":"user","content":"go"}}
{"type":"assistant","uuid":"a1","parentUuid":"u1","sessionId":"S","timestamp":"2026-03-01T10:00:05.000Z","message":{"id":"msg_1","role":"assistant","content":[{"type":"thinking","thinking":"plan","signature":"s"}]}}
{"type":"assistant","uuid":"a2","parentUuid":"a1","sessionId":"S","timestamp":"2026-03-01T10:00:07.000Z","message":{"id":"msg_1","role":"assistant","content":[{"type":"tool_use","id":"toolu_A","name":"Bash","input":{"command":"ls"}}],"stop_reason":"tool_use"}}
{"type":"user","uuid":"r1","parentUuid":"a2","sessionId":"S","timestamp":"2026-03-01T10:00:08.000Z","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_A","content":"x"}]}}
{"type":"assistant","uuid":"a3","parentUuid":"r1","sessionId":"S","timestamp":"2026-03-01T10:20:00.000Z","message":{"id":"msg_2","role":"assistant","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn"}}
"#;
    assert_eq!(times(claude), [("2026-03-01T10:00:05.000Z".to_string(), "a1".to_string()), ("2026-03-01T10:20:00.000Z".into(), "a3".into())]);
    let codex = r#"{"timestamp":"2026-03-01T10:00:00.000Z","type":"session_meta","payload":{"id":"c1","timestamp":"2026-03-01T10:00:00.000Z","cwd":"/w"}}
{"timestamp":"2026-03-01T10:00:01.000Z","type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"list files"}]}}
{"timestamp":"2026-03-01T10:00:02.000Z","type":"response_item","payload":{"type":"reasoning","summary":[{"type":"summary_text","text":"think"}],"content":null,"encrypted_content":"enc"}}
{"timestamp":"2026-03-01T10:00:03.000Z","type":"response_item","payload":{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","call_id":"call_1"}}
{"timestamp":"2026-03-01T10:00:04.000Z","type":"response_item","payload":{"type":"function_call_output","call_id":"call_1","output":"a"}}
{"timestamp":"2026-03-01T10:30:00.000Z","type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}}
"#;
    let codex_times = times(codex);
    assert_eq!(codex_times.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["2026-03-01T10:00:02.000Z", "2026-03-01T10:30:00.000Z"]);
}
