//! The wire formats' tests.

use super::*;

#[test]
fn elements_are_counted_outside_strings() {
    assert_eq!(count_elements(br#"{"role":"user","content":"x"}"#), 2);
    assert_eq!(count_elements(br#"{"a":[1,2,{"b":"{[,]}"}],"c":"\"{,"}"#), 6);
    assert_eq!(count_elements(br#"[{"t":"a\\"},{"t":"b"}]"#), 4, "an escaped backslash ends no string");
    assert_eq!(count_elements(br#""unterminated {,"#), 0);
    assert_eq!(count_elements(b""), 0);
}

#[test]
fn each_element_is_given_in_order_and_a_refusal_stops_the_reading() {
    let mut seen = Vec::new();
    each_element(br#" [{"a": [1, 2]}, "x,]", 3 ] "#, |e| {
        seen.push(e.get().to_string());
        Ok(())
    }).unwrap();
    assert_eq!(seen, [r#"{"a": [1, 2]}"#, r#""x,]""#, "3"]);
    let mut n = 0;
    let e = each_element(b"[1,2,3]", |_| {
        n += 1;
        if n == 2 { Err("no second".into()) } else { Ok(()) }
    });
    assert!(e.unwrap_err().to_string().contains("no second"));
    assert_eq!(n, 2, "nothing after the refusal is read");
    for bad in [&b"{}"[..], b"[1,", b"[1] 2", b""] {
        assert!(each_element(bad, |_| Ok(())).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn anthropic_splits_results_and_keeps_marks() {
    let list = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a\nb"}, {"type": "text", "text": "<system-reminder>x</system-reminder>", "cache_control": {"type": "ephemeral"}}]}),
        json!({"role": "system", "content": "note", "output_config": {"effort": "low"}}),
    ];
    let r = parse_request(Api::Anthropic, list.clone()).unwrap();
    let roles: Vec<&str> = r.messages.iter().map(|m| m.message.role()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user", "user"]);
    assert!(matches!(&r.messages[2].message, Message::ToolResult { tool_name, .. } if tool_name == "Bash"));
    assert!(matches!(&r.messages[3].message, Message::User { origin: UserOrigin::Host, .. }));
    assert_eq!(r.cache_marks, vec![(3, json!({"type": "ephemeral"}))]);
    assert!(r.messages[3].parts[0].get("cache_control").is_none());
    // Unchanged messages reassemble to the client's own list (the mark taken off).
    let out = assemble(Api::Anthropic, r.messages.iter().map(WireMessage::out).collect());
    let mut expect = list.clone();
    expect[2]["content"][1].as_object_mut().unwrap().remove("cache_control");
    assert_eq!(out, expect);
}

#[test]
fn chat_and_responses_keep_the_system_prefix() {
    let chat = parse_request(Api::Chat, vec![json!({"role": "system", "content": "s"}), json!({"role": "user", "content": "u"}), json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}), json!({"role": "tool", "tool_call_id": "c", "content": "out"})]).unwrap();
    assert_eq!(chat.system.len(), 1);
    assert_eq!(chat.messages.len(), 3);
    assert!(matches!(&chat.messages[2].message, Message::ToolResult { tool_name, .. } if tool_name == "bash"));
    let resp = parse_request(Api::Responses, vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]}),
        json!({"type": "reasoning", "summary": [], "encrypted_content": "xx"}),
        json!({"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "done"}),
    ]).unwrap();
    assert_eq!(resp.system.len(), 1);
    assert_eq!(resp.messages.iter().map(|m| m.message.role()).collect::<Vec<_>>(), ["user", "assistant", "tool"]);
    assert_eq!(resp.messages[1].parts.len(), 2);
}

#[test]
fn units_read_lazily_give_what_a_full_read_gives() {
    let list = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]}),
        json!({"type": "reasoning", "summary": [], "encrypted_content": "xx"}),
        json!({"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "done"}),
    ];
    let raw = split_values(Api::Responses, &list).unwrap();
    assert_eq!(raw.system, 1);
    assert_eq!(raw.units.iter().map(|u| (u.start(), u.elements().len())).collect::<Vec<_>>(), vec![(1, 1), (2, 2), (4, 1)]);
    assert_eq!(raw.units.iter().map(Unit::role).collect::<Vec<_>>(), ["user", "", ""], "items without a role have none");
    // A request holds one per message while it is served.
    assert_eq!(std::mem::size_of::<Unit>(), 24);
    let chat = split_values(Api::Chat, &[json!({"role": "system", "content": "s"}), json!({"role": "tool", "tool_call_id": "c", "content": "r"}), json!({"role": "critic", "content": "x"}), json!({"role": "function", "name": "f", "content": "y"})]).unwrap();
    assert_eq!(chat.system, 1);
    assert_eq!(chat.units.iter().map(Unit::role).collect::<Vec<_>>(), ["tool", "other", "function"]);
    let full = parse_request(Api::Responses, list.clone()).unwrap();
    let mut lazy: Vec<WireMessage> = (0..raw.units.len()).flat_map(|u| parse_unit(Api::Responses, &raw, u).unwrap().messages).collect();
    // A result's tool name comes from its call in another unit once the units are read together.
    name_results(&mut lazy);
    assert_eq!(lazy.iter().map(|m| (&m.message, m.wire)).collect::<Vec<_>>(), full.messages.iter().map(|m| (&m.message, m.wire)).collect::<Vec<_>>());
    // Equal text, equal key; other text, other key.
    let again = split_values(Api::Responses, &list).unwrap();
    assert_eq!(raw.units, again.units);
    let anth = split_values(Api::Anthropic, &[json!({"role": "user", "content": "a"}), json!({"role": "user", "content": "b", "x": {"cache_control": 1}})]).unwrap();
    assert_ne!(anth.units[0].key, anth.units[1].key);
    assert_eq!(anth.units.iter().map(|u| u.marked).collect::<Vec<_>>(), vec![false, true]);
    assert_eq!(split_values(Api::Chat, &[json!({"content": "x"})]).unwrap_err().reason, "`role` is missing");
}

/// Every pi, Claude Code and Codex corpus session with the messages it appends, in order.
fn corpus_messages() -> Vec<(std::path::PathBuf, Vec<Message>)> {
    let mut out = Vec::new();
    for format in ["pi", "claude-code", "codex"] {
        for f in crate::fast_tests::corpus_files(format) {
            let imported = crate::import_file(&f).unwrap();
            let messages = imported.events.into_iter().filter_map(|e| match e {
                condense_events::SourceEvent::EntryAppended { entry: condense_events::Entry::Message(m), .. } => Some(m),
                _ => None,
            });
            out.push((f, messages.collect()));
        }
    }
    out
}

/// A message condense wrote, held as JSON text, is written to the byte as it was from its values: alone,
/// merged with its neighbours of one role (Anthropic), next to the client's own elements; and reads
/// back to the same values. Every message of the pi, Claude Code and Codex corpus sessions in each API.
#[test]
fn messages_held_as_text_are_written_as_from_their_values() {
    let sessions = corpus_messages();
    for (f, messages) in &sessions {
        for api in [Api::Anthropic, Api::Chat, Api::Responses] {
            let outs: Vec<OutMessage<'static>> = messages.iter().filter_map(|m| from_neutral(api, m)).collect();
            // A client element every seventh piece (it ends a run of one role).
            let client = match api {
                Api::Responses => br#"{"type":"message","role":"user","content":"raw"}"#.as_slice(),
                _ => br#"{"role":"user","content":"raw"}"#.as_slice(),
            };
            let ranges = [0..client.len()];
            let pieces = |written: &dyn Fn(usize) -> bool| -> Vec<Piece<'_>> {
                let mut out = Vec::new();
                for (k, o) in outs.iter().enumerate() {
                    if k % 7 == 3 {
                        out.push(Piece::Raw(client, &ranges));
                    }
                    out.push(match written(k) {
                        true => Piece::Written(std::sync::Arc::new(o.written())),
                        false => Piece::Msg(Box::new(o.clone())),
                    });
                }
                out
            };
            let name = format!("{} as {}", f.display(), api.name());
            let values = write_list(api, &[], &pieces(&|_| false), 0);
            assert_eq!(write_list(api, &[], &pieces(&|_| true), 0), values, "{name}");
            assert_eq!(write_list(api, &[], &pieces(&|k| k % 2 == 0), 0), values, "{name}, every other one");
            for o in &outs {
                assert_eq!(&o.written().expand(), o, "{name}");
            }
        }
    }
    assert!(sessions.len() >= 50, "the corpus sessions: {}", sessions.len());
    // A part that is a plain string (a client's `content` string): alone it stays a string, merged it
    // becomes a text block.
    let msg = |role: &str, parts: Vec<Value>| {
        let Value::Object(envelope) = json!({"role": role}) else { unreachable!() };
        OutMessage { envelope: Cow::Owned(envelope), parts: Cow::Owned(parts) }
    };
    let shapes = [
        vec![msg("user", vec![json!("plain \"quoted\" \u{e9} \u{7}")])],
        vec![msg("user", vec![json!("a")]), msg("user", vec![json!({"type": "text", "text": "b"})])],
        vec![msg("assistant", vec![json!({"type": "text", "text": "c"}), json!("d")]), msg("user", vec![json!("e")])],
    ];
    for outs in shapes {
        let as_values: Vec<Piece<'_>> = outs.iter().map(|o| Piece::Msg(Box::new(o.clone()))).collect();
        let as_text: Vec<Piece<'_>> = outs.iter().map(|o| Piece::Written(std::sync::Arc::new(o.written()))).collect();
        let want = write_list(Api::Anthropic, &[], &as_values, 0);
        assert_eq!(String::from_utf8_lossy(&write_list(Api::Anthropic, &[], &as_text, 0)), String::from_utf8_lossy(&want));
    }
}

/// A list read element by element (a message's parts, Chat's `tool_calls`) is made with room for its
/// elements at once, read lean or in full: collected from results, a message of many parts grew its
/// blocks by doubling and held up to twice their room; a reply of calls alone keeps the calls' list.
#[test]
fn lists_read_element_by_element_take_their_room_once() {
    let parts: Vec<Value> = (0..1000).map(|i| json!({"type": "text", "text": format!("p{i}")})).collect();
    let calls: Vec<Value> = (0..1000).map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": "{}"}})).collect();
    let list = vec![json!({"role": "user", "content": parts}), json!({"role": "assistant", "content": null, "tool_calls": calls})];
    let raw = split_values(Api::Chat, &list).unwrap();
    let lean: Vec<Message> = (0..raw.units.len()).flat_map(|u| unit_messages(Api::Chat, &raw, u).unwrap()).collect();
    let full: Vec<Message> = parse_request(Api::Chat, list).unwrap().messages.into_iter().map(|w| w.message).collect();
    for messages in [&lean, &full] {
        assert_eq!(messages.len(), 2);
        for m in messages.iter() {
            let (Message::User { content, .. } | Message::Assistant { content, .. }) = m else { panic!("{m:?}") };
            assert_eq!((content.len(), content.capacity()), (1000, 1000), "{}", m.role());
        }
    }
    // An Anthropic reply of many blocks.
    let uses: Vec<Value> = (0..1000).map(|i| json!({"type": "tool_use", "id": format!("t{i}"), "name": "bash", "input": {}})).collect();
    let list = vec![json!({"role": "user", "content": "go"}), json!({"role": "assistant", "content": uses})];
    let raw = split_values(Api::Anthropic, &list).unwrap();
    let lean: Vec<Message> = (0..raw.units.len()).flat_map(|u| unit_messages(Api::Anthropic, &raw, u).unwrap()).collect();
    let full: Vec<Message> = parse_request(Api::Anthropic, list).unwrap().messages.into_iter().map(|w| w.message).collect();
    for messages in [&lean, &full] {
        let Message::Assistant { content, .. } = &messages[1] else { panic!("{messages:?}") };
        assert_eq!((content.len(), content.capacity()), (1000, 1000));
    }
}

/// Every unit's messages read lean ([`unit_messages`]) are those read in full ([`parse_unit`]), errors
/// included, and an unmarked unit is read lean, not by falling back: hand-written shapes (repeated
/// keys, lists where strings go, parts without text, every item kind), then every pi, Claude Code and
/// Codex session of the corpus written in each API's form.
#[test]
fn units_read_lean_give_the_messages_of_a_full_read() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let texts: Vec<(Api, Vec<String>)> = vec![
        (Api::Anthropic, vec![
            r#"{"role":"user","content":[{"type":"text","text":"a"}],"content":"later"}"#.into(),
            r#"{"content":"first","role":"assistant","content":[{"type":"text","text":"b"},{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"}]}"#.into(),
            r#"{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}},{"type":"document","source":{"x":1}}]}"#.into(),
            r#"{"role":"user","content":[{"text":"no type"}]}"#.into(),
            r#"{"role":"user","content":[]}"#.into(),
            r#"{"role":"assistant","content":[]}"#.into(),
            r#"{"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{"q":"x"}},{"type":"web_search_tool_result","tool_use_id":"s1","content":[]},{"type":"tool_use","id":"t1","name":"Bash"}]}"#.into(),
            r#"{"role":"user","content":[{"type":"text","text":"<system-reminder>r</system-reminder>"},{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"out"},{"type":"image","source":{}}],"is_error":true},{"type":"text","text":"<command-name>x</command-name>"}]}"#.into(),
            r#"{"role":"system","content":[{"type":"text","text":"s"}],"tool_calls":[1,2]}"#.into(),
            r#"{"role":"user","content":{"type":"text"}}"#.into(),
            r#"{"role":"pilot","content":[{"type":"text","text":"x"}]}"#.into(),
            r#"{"role":"user","content":[{"type":"text","text":"x"},3]}"#.into(),
            format!(r#"{{"role":"user","content":[{{"type":"text","text":"x","deep":{deep}}}]}}"#),
        ]),
        (Api::Chat, vec![
            r#"{"role":"system","content":"s"}"#.into(),
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AA"}},{"type":"image_url","image_url":"http://x/i.png"},{"type":"input_audio","input_audio":{"data":"x"}}]}"#.into(),
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":{"cmd":"ls"}}},{"id":"c2","function":{"name":"read"}}],"tool_calls":[{"id":"c3","function":{"name":"x","arguments":"{}"}}]}"#.into(),
            r#"{"role":"tool","tool_call_id":"c3","content":[{"type":"text","text":"out"}]}"#.into(),
            r#"{"role":"function","name":"f","content":"r"}"#.into(),
            r#"{"role":"developer","content":[{"type":"text","text":"d"}]}"#.into(),
            r#"{"role":"assistant","content":"x","tool_calls":null}"#.into(),
            r#"{"role":"assistant","content":[{"type":"refusal","refusal":"no"}],"tool_calls":[{"id":"c4"}]}"#.into(),
            r#"{"role":"user","content":[1,"two",{"text":3}]}"#.into(),
            r#"{"content":"no role"}"#.into(),
        ]),
        (Api::Responses, vec![
            r#"{"type":"message","role":"developer","content":"d"}"#.into(),
            r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"u"},{"type":"input_image","image_url":"data:image/png;base64,AA"},{"type":"input_file","file_id":"f"}]}"#.into(),
            r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"r1"},{"text":"r2"}],"encrypted_content":"xx","content":[{"type":"reasoning_text","text":"t"}]}"#.into(),
            r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"o"}]}"#.into(),
            r#"{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{}"}"#.into(),
            r#"{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin"}"#.into(),
            r#"{"type":"local_shell_call","id":"c3","action":{"command":["ls"]}}"#.into(),
            r#"{"type":"web_search_call","id":"w"}"#.into(),
            r#"{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"a"},{"x":1}]}"#.into(),
            r#"{"type":"custom_tool_call_output","call_id":"c2","output":"Process exited with code 2"}"#.into(),
            r#"{"role":"user","content":"plain"}"#.into(),
            r#"{"type":"item_reference","id":"r"}"#.into(),
            r#"{"type":"compaction","encrypted_content":"e"}"#.into(),
            r#"{"type":"message","content":"no role"}"#.into(),
            r#"{"role":"assistant","content":[{"type":"output_text","text":"p"}],"content":"q"}"#.into(),
        ]),
    ];
    let mut lists: Vec<(String, Api, Vec<Value>)> = Vec::new();
    let check = |name: &str, api: Api, raw: RawRequest| -> usize {
        let mut lean = 0;
        for (u, unit) in raw.units.iter().enumerate() {
            let full = parse_unit(api, &raw, u).map(|r| r.messages.into_iter().map(|w| w.message).collect::<Vec<_>>());
            assert_eq!(unit_messages(api, &raw, u), full, "{name}: unit {u}");
            if let (false, Ok(full)) = (unit.marked, &full) {
                let read = lean_unit(api, &raw, unit).unwrap_or_else(|e| panic!("{name}: unit {u} not read lean: {e}"));
                assert_eq!(&read.messages.into_iter().map(|w| w.message).collect::<Vec<_>>(), full, "{name}: unit {u}");
                lean += 1;
            }
        }
        lean
    };
    let mut checked = 0;
    for (api, items) in &texts {
        // Each element a request of its own (after a prompt, so no element is a system prefix), so one
        // refused element leaves the others to compare.
        for (k, t) in items.iter().enumerate() {
            let lead = r#"{"role":"user","content":"u"}"#;
            let buf = bytes::Bytes::from(format!("[{lead},{t}]"));
            let at = lead.len() + 2;
            let Ok(raw) = split_units(*api, buf, vec![1..1 + lead.len(), at..at + t.len()]) else { continue };
            checked += 1;
            check(&format!("{} element {k}", api.name()), *api, raw);
        }
    }
    assert_eq!(checked, texts.iter().map(|(_, t)| t.len()).sum::<usize>() - 1, "only the element without a role is refused whole");
    for (f, messages) in corpus_messages() {
        let name = f.display().to_string();
        lists.push((name.clone(), Api::Anthropic, crate::export::anthropic(&messages.iter().collect::<Vec<_>>())["messages"].as_array().unwrap().clone()));
        lists.push((name.clone(), Api::Chat, crate::export::openai(&messages.iter().collect::<Vec<_>>()).as_array().unwrap().clone()));
        lists.push((name, Api::Responses, crate::export::responses(&messages.iter().collect::<Vec<_>>()).as_array().unwrap().clone()));
    }
    assert!(lists.len() >= 150, "the corpus sessions: {}", lists.len() / 3);
    let mut lean = 0;
    for (name, api, list) in lists {
        lean += check(&format!("{name} as {}", api.name()), api, split_values(api, &list).unwrap());
    }
    assert!(lean > 20_000, "units read lean: {lean}");
}

#[test]
fn anthropic_never_gets_white_space_only_text() {
    let m = Message::Assistant { content: vec![Block::Text { text: "\n\n".into() }, Block::tool_call("t".into(), "Bash".into(), "{}".into())], model: None, stop: None, usage: None };
    let o = from_neutral(Api::Anthropic, &m).unwrap();
    assert_eq!(o.parts.len(), 1);
    assert_eq!(o.parts[0]["type"], "tool_use");
    let only = Message::Assistant { content: vec![Block::Text { text: " \n".into() }], model: None, stop: None, usage: None };
    assert_eq!(from_neutral(Api::Anthropic, &only), None);
}

/// A block of a type condense does not model is read as an opaque block holding its JSON, and a message
/// rewritten from the neutral model carries it back as the client wrote it, in each API.
#[test]
fn unknown_blocks_are_kept_opaque_and_written_back_as_they_came() {
    let document = json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "the spec"}});
    let file = json!({"type": "file", "file": {"file_id": "file-1"}});
    let input_file = json!({"type": "input_file", "file_id": "file-2"});
    for (api, list, block) in [
        (Api::Anthropic, json!({"role": "user", "content": [{"type": "text", "text": "read it"}, document.clone()]}), &document),
        (Api::Chat, json!({"role": "user", "content": [{"type": "text", "text": "read it"}, file.clone()]}), &file),
        (Api::Responses, json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read it"}, input_file.clone()]}), &input_file),
    ] {
        let req = parse_request(api, vec![list]).unwrap();
        let m = &req.messages[0].message;
        assert_eq!(m.content()[1], Block::opaque(block["type"].as_str().unwrap().to_string(), json_text(block)), "{api:?}");
        let out = from_neutral(api, m).unwrap();
        let written = serde_json::to_string(&out.parts).unwrap();
        assert!(written.contains(&json_text(block)), "{api:?}: {written}");
    }
}

#[test]
fn bad_shapes_name_the_place() {
    assert_eq!(parse_request(Api::Anthropic, vec![json!({"content": "x"})]).unwrap_err().at, "messages[0]");
    assert_eq!(parse_request(Api::Anthropic, vec![json!({"role": "user", "content": [1]})]).unwrap_err().at, "messages[0].content[0]");
    assert_eq!(parse_request(Api::Chat, vec![json!({"role": "pilot", "content": "x"})]).unwrap_err().reason, "unknown role `pilot`");
    assert_eq!(parse_request(Api::Responses, vec![json!(3)]).unwrap_err().at, "input[0]");
}

#[test]
fn gemini_contents_read_into_the_neutral_model_and_back() {
    let list = vec![
        json!({"role": "user", "parts": [{"text": "<session_context>\nos: linux\n</session_context>"}, {"text": "count"}]}),
        json!({"role": "model", "parts": [{"text": "thinking it over", "thought": true, "thoughtSignature": "sig"}, {"functionCall": {"name": "run_shell_command", "args": {"command": "seq 3"}}}, {"functionCall": {"id": "run_shell_command__c2", "name": "run_shell_command", "args": {"command": "ls"}}}]}),
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "run_shell_command", "response": {"output": "1\n2\n3"}}},
            {"functionResponse": {"id": "run_shell_command__c2", "name": "run_shell_command", "response": {"error": "denied"}}},
            {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
            {"fileData": {"fileUri": "gs://x", "mimeType": "text/plain"}}
        ]}),
    ];
    let r = parse_request(Api::Gemini, list.clone()).unwrap();
    let roles: Vec<&str> = r.messages.iter().map(|m| m.message.role()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "user"]);
    assert!(r.system.is_empty());
    // The calls: the one without an id gets the content's place, the other keeps its own; the responses
    // pair with them by order.
    let calls: Vec<(String, String)> = r.messages[1].message.tool_calls().map(|(i, _, a)| (i.to_string(), a.to_string())).collect();
    assert_eq!(calls, [("gemini-call-1-0".to_string(), r#"{"command":"seq 3"}"#.to_string()), ("run_shell_command__c2".to_string(), r#"{"command":"ls"}"#.to_string())]);
    match (&r.messages[2].message, &r.messages[3].message) {
        (Message::ToolResult { call_id: a, tool_name, is_error: false, .. }, Message::ToolResult { call_id: b, is_error: true, .. }) => {
            assert_eq!((a.as_str(), tool_name.as_str(), b.as_str()), ("gemini-call-1-0", "run_shell_command", "run_shell_command__c2"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.messages[2].message.text(), "1\n2\n3");
    assert!(matches!(r.messages[1].message.content()[0], Block::Thinking(_)));
    assert!(matches!(r.messages[4].message.content()[0], Block::Image(_)));
    assert!(matches!(&r.messages[4].message.content()[1], Block::Opaque(o) if o.kind == "fileData"));
    // Each message keeps its own parts as the client wrote them.
    assert_eq!(r.messages[2].parts, vec![list[2]["parts"][0].clone()]);
    assert_eq!(r.messages[0].envelope.get("role"), Some(&json!("user")));
    // Written from the neutral model: the made id is not sent, a real one is; results of one call side
    // are one content again.
    let out: Vec<OutMessage<'static>> = r.messages.iter().filter_map(|m| from_neutral(Api::Gemini, &m.message)).collect();
    let written = assemble(Api::Gemini, out);
    assert_eq!(written.len(), 3, "{written:?}");
    // (Reasoning is not written back: only the provider's own bytes carry it.)
    assert_eq!(written[1]["parts"][0], json!({"functionCall": {"name": "run_shell_command", "args": {"command": "seq 3"}}}));
    assert_eq!(written[1]["parts"][1]["functionCall"]["id"], "run_shell_command__c2");
    assert_eq!(written[2]["parts"][0], json!({"functionResponse": {"name": "run_shell_command", "response": {"output": "1\n2\n3"}}}));
    assert_eq!(written[2]["parts"][1]["functionResponse"]["response"], json!({"error": "denied"}));
    // A reply's parts, and its usage.
    let reply = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 40, "candidatesTokenCount": 5, "thoughtsTokenCount": 3}, "modelVersion": "gemini-2.5-flash"});
    let (m, u) = reply_of(Api::Gemini, &reply).unwrap();
    assert_eq!(m.text(), "done");
    assert_eq!(u.map(|u| (u.input, u.cache_read, u.output)), Some((60, 40, 8)));
}

#[test]
fn gemini_contents_that_cannot_be_read_name_their_place() {
    for (list, at) in [
        (vec![json!("text")], "contents[0]"),
        (vec![json!({"role": "user", "parts": "x"})], "contents[0].parts"),
        (vec![json!({"role": "user", "parts": [{"text": "a"}, 3]})], "contents[0].parts[1]"),
        (vec![json!({"role": "user", "parts": []}), json!({"role": "narrator", "parts": [{"text": "a"}]})], "contents[1]"),
    ] {
        let e = parse_request(Api::Gemini, list).unwrap_err();
        assert_eq!(e.at, at, "{e}");
    }
    // A content without a role is the user's, as the API reads it.
    let r = parse_request(Api::Gemini, vec![json!({"parts": [{"text": "hi"}]})]).unwrap();
    assert_eq!(r.messages[0].message.role(), "user");
}
