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
    let mut unknown = Vec::new();
    for k in keys {
        match idx.lookup(k) {
            Some(Target::Output(r)) => refs.push(r),
            Some(Target::Chain(b)) => refs.extend(idx.chains[&b].refs.iter().copied()),
            Some(Target::Checkpoint(c)) => refs.extend(idx.checkpoints[&c].covers.iter().copied()),
            None => unknown.push(k.trim().to_string()),
        }
    }
    if !unknown.is_empty() {
        let known = match (idx.records.keys().next(), idx.records.keys().next_back()) {
            (Some(a), Some(b)) => format!("known refs are t{a}–t{b}"),
            _ => "nothing has been pruned in this session yet".to_string(),
        };
        return usage(&format!("unknown ref{} {} ({known})", if unknown.len() > 1 { "s" } else { "" }, unknown.join(", ")));
    }
    if refs.is_empty() {
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
        let original = match idx.spills.get(&r) {
            Some(sp) => match blob(&sp.blob) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => return Answer { text: format!("{QUERY_TOOL_NAME}: t{r} is spilled but its blob cannot be read: {e}"), is_error: true, originals: Vec::new() },
            },
            None => p.entry_message(&rec.entry).map(|m| output_text(m)).unwrap_or_default(),
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
    Answer { text, is_error: false, originals }
}
