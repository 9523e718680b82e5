//! `context_tree_query`: the model-facing recovery tool. It takes refs (`t12` for a tool output, `b3` for
//! a compressed chain) or raw tool-call ids and returns the originals byte for byte: from the log for
//! outputs kept there, from the blob file for spilled ones. An empty or unknown argument is answered with
//! an error result that says what to pass.

use condense_capture::output_text;
use condense_index::Target;
use condense_render::Projection;

pub use condense_events::QUERY_TOOL_NAME;

/// What the tool returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The tool result text.
    pub text: String,
    /// Whether it is an error result.
    pub is_error: bool,
    /// Each recovered output: its ref and the original text.
    pub originals: Vec<(u32, String)>,
}

fn usage(what: &str) -> Answer {
    Answer {
        text: format!(
            "{QUERY_TOOL_NAME}: {what}. Pass {{\"refs\": [\"t12\"]}} with the refs shown in stubs (tN for a tool \
             output, bN for a compressed chain, cN for a checkpoint) or the raw tool-call ids of the calls you want back."
        ),
        is_error: true,
        originals: Vec::new(),
    }
}

/// Reads the keys from the tool's JSON arguments; an error answer when there are none.
pub fn keys_from_arguments(arguments: &str) -> Result<Vec<String>, Answer> {
    let v: serde_json::Value = serde_json::from_str(arguments).map_err(|_| usage("the arguments are not JSON"))?;
    let mut keys = Vec::new();
    for field in ["refs", "ids", "toolCallIds"] {
        match v.get(field) {
            Some(serde_json::Value::Array(a)) => keys.extend(a.iter().filter_map(|x| x.as_str()).map(str::to_string)),
            Some(serde_json::Value::String(s)) => keys.push(s.clone()),
            _ => {}
        }
    }
    keys.retain(|k| !k.trim().is_empty());
    if keys.is_empty() {
        return Err(usage("no refs given"));
    }
    Ok(keys)
}

/// Answers a query against a projection; `blob` reads a spilled output by hash.
pub fn answer(p: &Projection, keys: &[String], blob: &dyn Fn(&str) -> Result<Vec<u8>, String>) -> Answer {
    if keys.iter().all(|k| k.trim().is_empty()) {
        return usage("no refs given");
    }
    let idx = p.index();
    let mut refs = Vec::new();
    let mut checkpoints = Vec::new();
    let mut unknown = Vec::new();
    // Compressed chains whose final reply renders cut: the whole reply follows their outputs.
    let mut replies = Vec::new();
    for k in keys {
        match idx.lookup(k) {
            Some(Target::Output(r)) => refs.push(r),
            Some(Target::Chain(b)) => {
                refs.extend(idx.chains[&b].compressed.refs.iter().copied());
                if idx.chains[&b].reply.is_some() {
                    replies.push(b);
                }
            }
            Some(Target::Checkpoint(c)) => checkpoints.push(c),
            None => unknown.push(k.trim().to_string()),
        }
    }
    if !unknown.is_empty() {
        let known = match (idx.records.first_key(), idx.records.last_key()) {
            (Some(a), Some(b)) => format!("known refs are t{a}–t{b}"),
            _ => "nothing has been pruned in this session yet".to_string(),
        };
        return usage(&format!("unknown ref{} {} ({known})", if unknown.len() > 1 { "s" } else { "" }, unknown.join(", ")));
    }
    if !checkpoints.is_empty() {
        return checkpoint_originals(p, &checkpoints, &refs, blob);
    }
    if refs.is_empty() && replies.is_empty() {
        return Answer {
            text: format!("{QUERY_TOOL_NAME}: {} covers no captured tool outputs; nothing to recover", keys.join(", ")),
            is_error: true,
            originals: Vec::new(),
        };
    }
    let mut text = String::new();
    let mut originals = Vec::new();
    for r in refs {
        let rec = &idx.records[&r];
        let original = match original_output(p, r, blob) {
            Ok(o) => o,
            Err(a) => return a,
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("=== t{r} · {} · call {} ===\n", rec.tool, rec.call_id));
        // Long arguments may render shortened in a condensed turn; the original comes back here.
        if rec.arguments.chars().count() > p.config().condense_args_chars as usize && p.config().condense_args_chars > 0 {
            text.push_str(&format!("[arguments] {}\n[output]\n", rec.arguments));
        }
        text.push_str(&original);
        originals.push((r, original));
    }
    for b in replies {
        let whole = p.entry_message(&idx.chains[&b].compressed.last).map(|m| condense_chain::reply_text(m)).unwrap_or_default();
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("=== b{b} · final reply ===\n{whole}"));
    }
    Answer { text, is_error: false, originals }
}

/// The original text of tool output `r`: from its blob when it was spilled, else from the log.
fn original_output(p: &Projection, r: u32, blob: &dyn Fn(&str) -> Result<Vec<u8>, String>) -> Result<String, Answer> {
    let idx = p.index();
    match idx.spills.get(&r) {
        Some(sp) => blob(&sp.blob).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).map_err(|e| Answer {
            text: format!("{QUERY_TOOL_NAME}: t{r} is spilled but its blob cannot be read: {e}"),
            is_error: true,
            originals: Vec::new(),
        }),
        None => Ok(idx.records.get(&r).and_then(|rec| p.entry_message(&rec.entry)).map(|m| output_text(m)).unwrap_or_default()),
    }
}

/// What checkpoints `cN` replaced, byte for byte: every message on the active branch after the previous
/// checkpoint's boundary up to and including this one's (earlier ones are what the previous checkpoint
/// replaced), each under a header naming its entry and role; text verbatim, tool calls with their
/// arguments, tool outputs as the tool returned them (read back from the blob when spilled). Plain refs
/// asked for beside a checkpoint follow.
fn checkpoint_originals(p: &Projection, checkpoints: &[u32], refs: &[u32], blob: &dyn Fn(&str) -> Result<Vec<u8>, String>) -> Answer {
    use condense_events::{Block, Message};
    let idx = p.index();
    let branch = p.branch_entries();
    let position = |id: &str| branch.iter().position(|(e, _)| *e == id);
    let mut text = String::new();
    let mut originals = Vec::new();
    for &c in checkpoints {
        let cp = &idx.checkpoints[&c];
        let Some(end) = position(&cp.boundary) else {
            return Answer {
                text: format!("{QUERY_TOOL_NAME}: c{c} belongs to a branch the session has left; nothing to recover on this one"),
                is_error: true,
                originals: Vec::new(),
            };
        };
        let start = idx.checkpoints.range(..c).next_back().and_then(|(_, prev)| position(&prev.boundary)).map_or(0, |i| i + 1).min(end + 1);
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("=== c{c} replaced {} messages (entries {} to {}) ===\n", end + 1 - start, branch.get(start).map_or("-", |b| b.0), cp.boundary));
        for (entry, m) in &branch[start..=end] {
            text.push_str(&format!("--- {entry} · {} ---\n", m.role()));
            match m.as_ref() {
                Message::ToolResult { .. } => {
                    let original = match idx.by_entry.get(*entry) {
                        Some(&r) => match original_output(p, r, blob) {
                            Ok(o) => {
                                originals.push((r, o.clone()));
                                o
                            }
                            Err(a) => return a,
                        },
                        None => output_text(m),
                    };
                    text.push_str(&original);
                    text.push('\n');
                }
                _ => {
                    for b in m.content() {
                        match b {
                            Block::Text { text: t, .. } => text.push_str(t),
                            Block::Thinking(t) => {
                                let thinking = &t.thinking;
                                text.push_str("[thinking]\n");
                                text.push_str(thinking);
                            }
                            Block::ToolCall(c) => text.push_str(&format!("[tool call {} {}] {}", c.name, c.id, c.arguments)),
                            Block::Image(_) => text.push_str("[image]"),
                            Block::Opaque(o) => text.push_str(&format!("[{} block] {}", o.kind, o.json)),
                        }
                        text.push('\n');
                    }
                }
            }
        }
    }
    for &r in refs {
        match original_output(p, r, blob) {
            Ok(o) => {
                text.push_str(&format!("=== t{r} ===\n{o}\n"));
                originals.push((r, o));
            }
            Err(a) => return a,
        }
    }
    Answer { text, is_error: false, originals }
}
