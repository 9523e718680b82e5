//! The commands that read a session: `sessions`, `stats` (with `--entry-ids`), `render` (as a provider
//! request or the neutral form), and `query` for the originals behind refs.

use crate::cli::Format;
use crate::shared::{load_config, session_of};
use anyhow::Result;
use condense_engine::{Session, Stats, Store};
use condense_events::Message;
use condense_render::check;
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// The active branch's entries: id, role, and the start of the text.
pub(crate) fn print_entries(session: &Session, json_out: bool) -> Result<()> {
    use condense_render::TranscriptRow;
    let p = session.projection()?;
    let checkpoint_divider = |n: &u32| checkpoint_divider(&p, *n);
    let rows = p.transcript();
    let messages = rows.iter().filter(|r| matches!(r, TranscriptRow::Message(..))).count();
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&entries_json(session)?)?);
        return Ok(());
    }
    outln!("entries on the active branch ({messages}):");
    for row in &rows {
        match row {
            TranscriptRow::Message(id, m) => outln!("  {id}  {:<9}  {}", m.role(), preview(m)),
            TranscriptRow::HostCompaction(_) => outln!("  ──── {HOST_DIVIDER} ────"),
            TranscriptRow::Checkpoint(n, _) => outln!("  ──── {} ────", checkpoint_divider(n)),
        }
    }
    Ok(())
}

/// Each compaction is a divider in the transcript (ADR 0064): checkpoint `n`'s line.
fn checkpoint_divider(p: &condense_render::Projection, n: u32) -> String {
    format!(
        "checkpoint c{n}: the context up to here was compacted ({} tokens before; originals: context_tree_query c{n})",
        p.index().checkpoints.get(&n).map_or(0, |c| c.tokens_before)
    )
}

/// The first 70 characters of a message and its calls, on one line.
fn preview(m: &Message) -> String {
    let calls: Vec<String> = m.tool_calls().map(|(_, name, _)| format!("[{name}]")).collect();
    let text = format!("{} {}", m.text(), calls.join(" "));
    text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(70).collect::<String>()
}

const HOST_DIVIDER: &str = "the host compacted its context here";

/// The active branch's entries and dividers as one JSON document (`session`, `entries`, `dividers`).
fn entries_json(session: &Session) -> Result<Value> {
    use condense_render::TranscriptRow;
    let p = session.projection()?;
    let checkpoint_divider = |n: &u32| checkpoint_divider(&p, *n);
    let rows = p.transcript();
    {
        let mut entries = Vec::new();
        let mut dividers = Vec::new();
        for row in &rows {
            match row {
                TranscriptRow::Message(id, m) => entries.push(json!({"entry": id, "role": m.role(), "text": preview(m)})),
                TranscriptRow::HostCompaction(id) => dividers.push(json!({"at": id, "kind": "host_compaction", "text": HOST_DIVIDER})),
                TranscriptRow::Checkpoint(n, id) => dividers.push(json!({"after": id, "kind": "checkpoint", "checkpoint": format!("c{n}"), "text": checkpoint_divider(n)})),
            }
        }
        Ok(json!({"session": session.name(), "entries": entries, "dividers": dividers}))
    }
}

/// Prints the originals behind refs; exits 1 (a finding) when a ref recovers nothing, with or without
/// `--json`.
pub(crate) fn query(store: &Store, session: &str, refs: &[String], json_out: bool, raw: bool) -> Result<ExitCode> {
    let answer = session_of(store, session)?.query(refs)?;
    if raw && !answer.is_error {
        // The originals alone, one after another, exactly as the tools returned them.
        for (_, original) in &answer.originals {
            crate::output::out_write(format_args!("{original}"))?;
        }
    } else if json_out {
        outln!("{}", serde_json::to_string_pretty(&json!({"is_error": answer.is_error, "text": answer.text}))?);
    } else {
        outln!("{}", answer.text);
    }
    Ok(if answer.is_error { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

pub(crate) fn sessions(store: &Store, json_out: bool) -> Result<ExitCode> {
    let list = store.sessions()?;
    if json_out {
        let v: Vec<Value> = list.iter().map(|s| json!({"id": s.id, "name": s.name, "events": s.head})).collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for s in &list {
            outln!("{:>5}  {:>8} events  {}", s.id, s.head, s.name);
        }
        outln!("{} sessions", list.len());
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn stats_json(s: &Stats) -> Value {
    json!({
        "entries": s.entries, "messages": s.messages, "turns": s.turns, "user_turn_groups": s.user_turn_groups,
        "tool_calls": s.tool_calls, "tool_results": s.tool_results, "tool_errors": s.tool_errors,
        "branch_tokens": s.branch_tokens, "context_messages": s.context_messages, "context_tokens": s.context_tokens,
        "tokens_by_role": s.tokens_by_role, "tokens_by_tool": s.tokens_by_tool, "recovery": s.recovery,
        "provider": s.provider.map(|p| json!({
            "served": p.served, "requests": p.requests, "input_tokens": p.usage.input, "cache_read_tokens": p.usage.cache_read,
            "cache_write_tokens": p.usage.cache_write, "output_tokens": p.usage.output, "cache_priced_cost": (p.cost * 10.0).round() / 10.0,
            "direct_cost": p.direct.map(|d| (d * 10.0).round() / 10.0),
            "cost_vs_direct": p.direct.filter(|d| *d > 0.0).map(|d| (p.cost / d * 1000.0).round() / 1000.0),
        })),
    })
}

/// The session's statistics; with `entry_ids` its entries too, in the same JSON document under `--json`
/// (`entries`, `dividers`) and after the figures otherwise.
pub(crate) fn print_stats(session: &Session, json_out: bool, entry_ids: bool) -> Result<()> {
    let s = session.stats()?;
    if json_out {
        let mut v = stats_json(&s);
        v["session"] = json!(session.name());
        if entry_ids {
            let e = entries_json(session)?;
            v["entries"] = e["entries"].clone();
            v["dividers"] = e["dividers"].clone();
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!("session            {}", session.name());
    outln!("entries            {}", s.entries);
    outln!("messages (branch)  {}", s.messages);
    outln!("turns              {}", s.turns);
    outln!("user-turn-groups   {}", s.user_turn_groups);
    outln!("tool calls         {} ({} results, {} errors)", s.tool_calls, s.tool_results, s.tool_errors);
    outln!("tokens (branch)    {}  [chars/4, pi's estimate]", s.branch_tokens);
    for (role, t) in &s.tokens_by_role {
        outln!("  {role:<16} {t}");
    }
    outln!("tokens by tool");
    let mut tools: Vec<_> = s.tokens_by_tool.iter().collect();
    tools.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (tool, t) in tools {
        outln!("  {tool:<16} {t}");
    }
    outln!("rendered context   {} messages, {} tokens", s.context_messages, s.context_tokens);
    for d in &s.recovery {
        outln!("recovery           {d}");
    }
    if let Some(p) = &s.provider {
        let whose = if p.served { "through condense" } else { "the host's own requests" };
        let u = &p.usage;
        outln!("provider usage     {} requests ({whose}): input {} uncached, {} read from the cache, {} written to it; output {}", p.requests, u.input, u.cache_read, u.cache_write, u.output);
        match p.direct {
            Some(d) if d > 0.0 => outln!(
                "cache-priced cost  {:.0} through condense, {:.0} direct (estimated: the history as the client sent it): {:.1}%  [0.1 a cached token, 1.25 an uncached one]",
                p.cost,
                d,
                100.0 * p.cost / d
            ),
            _ => outln!("cache-priced cost  {:.0}  [0.1 a cached token, 1.25 an uncached one]", p.cost),
        }
    }
    Ok(())
}

pub(crate) fn encode(messages: &[Arc<Message>], how: Format) -> Value {
    match how {
        Format::Neutral => condense_formats::export::neutral(messages),
        Format::Openai => condense_formats::export::openai(messages),
        Format::Anthropic => condense_formats::export::anthropic(messages),
    }
}

/// A complete request body for the provider: the model (`--model`, else the session's newest), the output
/// limit the model table gives it, the messages, and condense's tool definitions when the context refers
/// to them (the agent's own tools and system prompt are not in the log: a host adds them).
pub(crate) fn request_body(session: &Session, how: Format, messages: &[Arc<Message>], model: Option<&str>, store_dir: &Path) -> Result<Value> {
    let p = session.projection()?;
    let recorded = p.model().map(|m| m.model.clone()).filter(|m| !m.is_empty());
    let model = model.map(str::to_string).or(recorded);
    if model.is_none() {
        errln!("condense: no model is recorded for {}: the body names none (pass --model NAME)", session.name());
    }
    let file = load_config(None, store_dir)?;
    let max_output = model
        .as_deref()
        .and_then(|m| condense_engine::config::model_limits(&file.models, m))
        .and_then(|l| l.max_output)
        .or_else(|| p.model().and_then(|m| m.max_output))
        .unwrap_or(8192);
    use condense_formats::wire::Api;
    let (api, limit_key) = match how {
        Format::Anthropic => (Api::Anthropic, "max_tokens"),
        _ => (Api::Chat, "max_completion_tokens"),
    };
    let mut body = json!({"model": model, limit_key: max_output});
    // The Messages export is an object (messages, and system when there is one); Chat is a message list.
    match (body.as_object_mut(), encode(messages, how)) {
        (Some(b), Value::Object(fields)) => b.extend(fields),
        (_, list) => body["messages"] = list,
    }
    let needed = condense_engine::tools::needed(&p);
    if !needed.is_empty() {
        body["tools"] = needed.iter().map(|t| condense_engine::tools::tool_json(api, t)).collect();
    }
    Ok(body)
}

pub(crate) fn render(session: &Session, how: Format, after_event: Option<u64>, model: Option<&str>, store_dir: &Path) -> Result<ExitCode> {
    let name = session.name();
    let rendered = match after_event {
        Some(seq) => session.render_at(seq)?,
        None => session.render()?,
    };
    let v = match how {
        Format::Neutral => encode(&rendered.messages, how),
        _ => request_body(session, how, &rendered.messages, model, store_dir)?,
    };
    outln!("{}", serde_json::to_string_pretty(&v)?);
    // A context a provider would reject is printed (it is what the log holds) but said so, and the
    // command fails like `verify` does.
    let violations = check(&rendered.messages);
    if !violations.is_empty() {
        for v in &violations {
            errln!("condense: {name}: the rendered context breaks a provider rule: {v}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
