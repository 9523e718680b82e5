//! A minimal agent loop with condense embedded: a scripted "model" stands in for a provider and a fake
//! shell for the tools, and every request the agent sends is the context condense prepared. It prints,
//! per request, the tokens the agent's whole history holds against the tokens condense sends, and ends
//! by recovering a pruned output by its ref, as the model would with `context_tree_query`.
//!
//! `cargo run -p condense-engine --example agent_loop`

use condense_engine::{Store, StoreOptions};
use condense_events::{Block, Entry, Message, SourceEvent, UserOrigin};

/// The stand-in model: a prompt gets one shell call per file it names; once every call has its result,
/// a text reply.
fn model(context: &[std::sync::Arc<Message>], turn: usize) -> Message {
    let last = context.last().expect("a context holds the prompt at least");
    let content = match &**last {
        Message::User { .. } => {
            let files = last.text().split_whitespace().filter(|w| w.ends_with(".log")).map(str::to_string).collect::<Vec<_>>();
            files
                .iter()
                .enumerate()
                .map(|(k, f)| Block::tool_call(format!("call-{turn}-{k}"), "bash".into(), format!(r#"{{"command":"cat {f}"}}"#)))
                .collect()
        }
        _ => vec![Block::Text { text: format!("Read them all; turn {turn} is done.") }],
    };
    Message::Assistant { content, model: Some("scripted".into()), stop: None, usage: None }
}

/// The stand-in shell: a long log for every file.
fn shell(arguments: &str) -> String {
    (0..400).map(|i| format!("{arguments} line {i}: nothing unusual here\n")).collect()
}

fn main() -> Result<(), condense_engine::EngineError> {
    let store = Store::in_memory(StoreOptions::default());
    let session = store.create_session("agent-loop")?;
    // Each entry follows the one before it.
    let (mut leaf, mut n): (Option<String>, u32) = (None, 0);
    let mut append = |m: Message| -> Result<(), condense_engine::EngineError> {
        n += 1;
        let id = format!("e{n}");
        session.append(vec![SourceEvent::EntryAppended { id: id.clone(), parent: leaf.replace(id), entry: Entry::Message(m) }])?;
        Ok(())
    };
    let prompts = ["read build.log and test.log", "now read deploy.log", "and finally audit.log and access.log"];
    let mut request = 0;
    for (turn, prompt) in prompts.iter().enumerate() {
        append(Message::user_text(*prompt, UserOrigin::Prompt))?;
        loop {
            // Before every model request: condense prunes what the model has read and renders the context.
            let context = session.prepare()?;
            request += 1;
            let held: u64 = session.with_projection(|p| p.branch_messages().iter().map(|m| condense_tokens::estimate(m)).sum())?;
            let sent: u64 = context.messages.iter().map(|m| condense_tokens::estimate(m)).sum();
            println!("request {request}: the history holds {held} tokens, condense sends {sent}");
            let reply = model(&context.messages, turn);
            let calls: Vec<(String, String)> = reply.tool_calls().map(|(id, _, args)| (id.to_string(), args.to_string())).collect();
            append(reply)?;
            if calls.is_empty() {
                break;
            }
            for (id, args) in calls {
                let output = Message::ToolResult { call_id: id, tool_name: "bash".into(), content: vec![Block::Text { text: shell(&args) }], is_error: false };
                append(output)?;
            }
        }
    }
    // A pruned output is one query away, byte for byte.
    let answer = session.query_tool(r#"{"refs": ["t1"]}"#)?;
    println!("t1 recovered: {} bytes, first line: {}", answer.text.len(), answer.text.lines().nth(1).unwrap_or(""));
    Ok(())
}
