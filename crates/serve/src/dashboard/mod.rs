//! The dashboard at `/condense/`: a page (HTML, CSS and script embedded in the binary; nothing from a
//! CDN) and the JSON it polls. The sessions list reads the store's session table and the live figures of
//! the conversations this server has served; a session page shows context tokens per request (received
//! and sent, the window, checkpoints and cache breaks), the cumulative cache-priced cost, the context as
//! condense sends it now with every stub expandable to its original (through [`Session::query`], the
//! path `context_tree_query` takes), and the timeline of the engine's decisions read from the log.
//!
//! The per-request figures live in memory, for the requests this process served (the last
//! [`crate::live::ROWS_KEPT`] of each conversation); the context, the originals and the timeline come from the log,
//! so they are there for every session of the store, after a restart too. See `docs/serve.md`.

use crate::live::{now_ms, summary_json, Row};
use crate::state::State;
use axum::extract::{Path, Query};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use condense_engine::Session;
use condense_events::{Block, DecisionEvent, Event, Message, SessionId, SourceEvent};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// Decisions one timeline answer carries at most (the newest).
const TIMELINE_MAX: usize = 300;
/// Characters of one message's text the context view shows (the rest is cut, with a note).
const TEXT_MAX: usize = 4000;

/// The routes under `/condense/` (the status, metrics and CLI routes are the router's own).
pub(crate) fn routes() -> axum::Router<Arc<State>> {
    use axum::routing::get;
    axum::Router::new()
        .route("/condense", get(|| async { axum::response::Redirect::permanent("/condense/") }))
        .route("/condense/", get(|| async { asset("text/html; charset=utf-8", PAGE) }))
        .route("/condense/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/condense/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/condense/api/sessions", get(sessions))
        .route("/condense/api/sessions/{id}", get(session))
        .route("/condense/api/sessions/{id}/context", get(context))
        .route("/condense/api/sessions/{id}/query", get(query))
        .route("/condense/api/sessions/{id}/timeline", get(timeline))
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

type S = axum::extract::State<Arc<State>>;

fn json_ok(v: &Value) -> Response {
    crate::request::response::json_response(StatusCode::OK, v)
}

fn not_found(what: String) -> Response {
    crate::request::response::json_response(StatusCode::NOT_FOUND, &json!({"error": what}))
}

fn failed(e: impl std::fmt::Display) -> Response {
    crate::request::response::json_response(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": e.to_string()}))
}

/// Every session of the store, newest first, with the live figures of those this server served.
async fn sessions(axum::extract::State(st): S) -> Response {
    let store = st.store.clone();
    let infos = match tokio::task::spawn_blocking(move || store.sessions()).await.expect("sessions task") {
        Ok(i) => i,
        Err(e) => return failed(e),
    };
    let (list, failures): (Vec<Value>, Vec<Value>) = {
        let live = st.live.sessions.lock().expect("live lock");
        let f = st.live.failures.lock().expect("failures lock");
        let list = infos
            .iter()
            .rev()
            .map(|i| {
                let failures = f.by_session.get(&i.id).copied().unwrap_or(0);
                json!({"id": i.id, "name": i.name, "events": i.head, "live": live.get(&i.id).map(summary_json), "failures": failures})
            })
            .collect();
        // The newest refusals first, each with the name of the session it belongs to.
        let failures = f
            .recent
            .iter()
            .rev()
            .map(|x| {
                let name = x.session.and_then(|id| infos.iter().find(|i| i.id == id).map(|i| i.name.clone()));
                json!({"at_ms": x.at_ms, "api": x.api, "status": x.status, "code": x.code, "reason": x.reason, "session": x.session, "name": name})
            })
            .collect();
        (list, failures)
    };
    let status = totals(&st).await;
    let priced = st.cfg.price_cache || list.iter().any(|s| !s["live"]["cache_priced"].is_null());
    json_ok(&json!({"now_ms": now_ms(), "price_cache": priced, "sessions": list, "failures": failures, "status": status}))
}

/// The server's totals: `/condense/status` without the conversations' own figures.
async fn totals(st: &State) -> Value {
    let mut status = st.status().await;
    if let Some(o) = status.as_object_mut() {
        o.remove("active_sessions");
    }
    status
}

/// The session `id` names, opened from the store.
async fn open(st: &State, id: &str) -> Result<Session, Response> {
    let Ok(id) = id.parse::<SessionId>() else { return Err(not_found(format!("no session `{id}` (sessions are addressed by their id here)"))) };
    let store = st.store.clone();
    match tokio::task::spawn_blocking(move || store.session_by_id(id)).await.expect("session task") {
        Ok(s) => Ok(s),
        Err(condense_engine::EngineError::UnknownSession(_)) => Err(not_found(format!("no session {id}"))),
        Err(e) => Err(failed(e)),
    }
}

/// One session: its live figures and the per-request series (with the cumulative cache-priced cost when
/// serve prices requests).
async fn session(axum::extract::State(st): S, Path(id): Path<String>) -> Response {
    let s = match open(&st, &id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (summary, rows, ledger) = {
        let live = st.live.sessions.lock().expect("live lock");
        match live.get(&s.id()) {
            Some(l) => (Some(summary_json(l)), l.rows.iter().cloned().collect::<Vec<Row>>(), l.ledger.clone()),
            None => (None, Vec::new(), None),
        }
    };
    let points = ledger.map(|l| l.points()).unwrap_or_default();
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let cost = r.n.checked_sub(1).and_then(|k| points.get(k as usize));
            json!({
                "n": r.n, "at_ms": r.at_ms, "received": r.received, "sent": r.sent, "sent_rounds": r.sent_rounds, "sent_bytes": r.sent_bytes, "window": r.window,
                "checkpoints": r.figures.checkpoints, "recoveries": r.figures.recoveries, "stubs": r.figures.stubs, "chains": r.figures.chains,
                "cache_break": r.cache_break,
                "cost_condense": cost.map(|p| p.condense), "cost_direct": cost.map(|p| p.direct), "cost_floor": cost.map(|p| p.floor), "cache_hit": cost.map(|p| p.hit()),
            })
        })
        .collect();
    let head = s.head().unwrap_or(0);
    // Priced: every conversation with `--price-cache`, else those whose model's list prices are known.
    let priced = st.cfg.price_cache || !points.is_empty();
    let accounts = st.accounts_of(s.id()).await.map(|a| account_totals_json(&a));
    json_ok(&json!({
        "id": s.id(), "name": s.name(), "events": head, "live": summary, "rows": rows, "price_cache": priced, "started_ms": st.started_ms,
        "accounts": accounts, "status": totals(&st).await,
    }))
}

/// The text a block shows in the context view.
fn block_text(b: &Block) -> String {
    match b {
        Block::Text { text } => text.clone(),
        Block::Thinking(t) => format!("(thinking) {}", t.thinking),
        Block::ToolCall(c) => format!("→ {}({})  [{}]", c.name, c.arguments, c.id),
        Block::Image(i) => format!("(image, {})", i.mime),
        Block::Opaque(o) => format!("({} block) {}", o.kind, o.json),
    }
}

/// The refs (`tN`, `bN`) a message's text names: what its stubs can be expanded to.
fn refs_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let b = text.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if (c == b't' || c == b'b') && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let digits = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
            let end = i + 1 + digits;
            if digits > 0 && digits < 9 && b.get(end).is_none_or(|d| !d.is_ascii_alphanumeric()) {
                let r = text[i..end].to_string();
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
    }
    out
}

fn message_json(i: usize, m: &Message) -> Value {
    let text: String = m.content().iter().map(block_text).collect::<Vec<_>>().join("\n");
    let refs = refs_in(&text);
    let cut = text.len() > TEXT_MAX;
    let shown = if cut {
        let end = (0..=TEXT_MAX).rev().find(|&k| text.is_char_boundary(k)).unwrap_or(0);
        format!("{}…", &text[..end])
    } else {
        text.clone()
    };
    let kind = match m {
        Message::User { origin, .. } => format!("{origin:?}").to_lowercase(),
        Message::Assistant { .. } => "assistant".into(),
        Message::ToolResult { tool_name, is_error, .. } => if *is_error { format!("{tool_name} (error)") } else { tool_name.clone() },
    };
    json!({"i": i, "role": m.role(), "kind": kind, "text": shown, "chars": text.chars().count(), "cut": cut, "refs": refs, "tokens": condense_tokens::estimate(m)})
}

/// The context condense would send now: every message, its refs, and the total estimate.
async fn context(axum::extract::State(st): S, Path(id): Path<String>) -> Response {
    let s = match open(&st, &id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let rendered = tokio::task::spawn_blocking(move || s.render()).await.expect("render task");
    match rendered {
        Ok(r) => {
            let messages: Vec<Value> = r.messages.iter().enumerate().map(|(i, m)| message_json(i, m)).collect();
            let tokens: u64 = r.messages.iter().map(|m| condense_tokens::estimate(m)).sum();
            json_ok(&json!({"messages": messages, "tokens": tokens}))
        }
        Err(e) => failed(e),
    }
}

#[derive(serde::Deserialize)]
struct RefQuery {
    r#ref: String,
}

/// The original behind a ref, as `context_tree_query` returns it.
async fn query(axum::extract::State(st): S, Path(id): Path<String>, Query(q): Query<RefQuery>) -> Response {
    let s = match open(&st, &id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let answer = tokio::task::spawn_blocking(move || s.query(&[q.r#ref])).await.expect("query task");
    match answer {
        Ok(a) => json_ok(&json!({"text": a.text, "is_error": a.is_error})),
        Err(e) => failed(e),
    }
}

#[derive(serde::Deserialize)]
struct After {
    #[serde(default)]
    after: u64,
}

/// One line of the timeline for an event, or `None` for events the timeline leaves out (entries,
/// captures, usage).
fn describe(e: &Event) -> Option<(&'static str, String)> {
    let refs = |r: &[u32]| r.iter().map(|n| format!("t{n}")).collect::<Vec<_>>().join(", ");
    let cut_at = |s: &str, n: usize| if s.chars().count() > n { format!("{}…", s.chars().take(n).collect::<String>()) } else { s.to_string() };
    let cut = |s: &str| cut_at(s, 160);
    Some(match e {
        Event::Decision(d) => match d {
            DecisionEvent::BatchClosed { batch, refs: r, outcome, .. } => ("batch", format!("batch {batch} ({}): {}", refs(r), outcome.name())),
            DecisionEvent::OutputSpilled { ref_n, bytes, .. } => ("spill", format!("t{ref_n} spilled to a blob ({bytes} bytes); the context keeps a preview")),
            DecisionEvent::OutputAliased { ref_n, original } => ("alias", format!("t{ref_n} repeats t{original}: shown as a reference to it")),
            DecisionEvent::OutputStubbed { ref_n, .. } => ("batch", format!("t{ref_n} (a file read kept whole while live) stubbed")),
            DecisionEvent::ErrorArgsPurged { call_id, chars, .. } => ("purge", format!("arguments of the failed call {call_id} purged ({chars} characters)")),
            DecisionEvent::ChainCompressed(ch) => ("chain", format!("chain compressed into b{}{}", ch.block, if ch.refs.is_empty() { String::new() } else { format!(" ({})", refs(&ch.refs)) })),
            DecisionEvent::ChainReplyCut { block, .. } => ("chain", format!("final reply of b{block} cut to its head")),
            DecisionEvent::CheckpointStarted { reason, tokens } => ("checkpoint", format!("checkpoint started ({reason}, {tokens} tokens)")),
            DecisionEvent::CheckpointCommitted(c) => {
                let condense_events::CheckpointCommitted { n, tokens_before, tokens_after, recovery, .. } = &**c;
                ("checkpoint", format!("checkpoint c{n}{}: {tokens_before} → {tokens_after} tokens", if *recovery { " (recovery)" } else { "" }))
            }
            // An error is shown whole: its reason says what did not fit and what to do.
            DecisionEvent::CheckpointFailed { code, reason } => ("error", format!("{code}: {reason}")),
            DecisionEvent::ArchiveCommitted { id, .. } => ("archive", format!("archive {id} committed")),
            DecisionEvent::Note { stage, text } => ("note", format!("{stage}: {}", cut(text))),
            DecisionEvent::OutputCaptured(_) | DecisionEvent::FrontierAdvanced { .. } => return None,
        },
        Event::Source(s) => match s {
            SourceEvent::SessionStarted { source, .. } => ("session", format!("session started ({source})")),
            SourceEvent::ModelChanged { model, context_window, .. } => {
                ("model", format!("model {model}{}", context_window.map_or(String::new(), |w| format!(", window {w} tokens"))))
            }
            SourceEvent::ProviderOverflow { message } => ("error", format!("provider overflow: {}", cut_at(message, 4000))),
            SourceEvent::RequestRetried => ("retry", "request retried after a double overflow".to_string()),
            SourceEvent::PruneConfigured(_) | SourceEvent::ConfigChanged { .. } => ("config", "pruning configured".to_string()),
            SourceEvent::LiveReadsConfigured { tokens, turns } => ("config", match turns {
                0 => format!("live file reads kept verbatim up to {tokens} tokens"),
                n => format!("live file reads kept verbatim up to {tokens} tokens, {n} turns each at most"),
            }),
            _ => return None,
        },
    })
}

/// One decision's account as the dashboard shows it (cost units, rounded).
fn account_json(a: &condense_engine::accounts::Account) -> Value {
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({
        "kind": a.kind.name(), "label": a.label, "tokens": a.tokens, "premium": r(a.premium), "saved": r(a.saved),
        "summarizer": r(a.summarizer), "net": r(a.net()), "requests": a.requests, "ended": a.ended,
    })
}

/// The accounts of a session's decisions taken together, as the dashboard shows them.
pub(crate) fn account_totals_json(accounts: &[condense_engine::accounts::Account]) -> Value {
    let t = condense_engine::accounts::Totals::of(accounts);
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({"decisions": t.decisions, "net_negative": t.net_negative, "net": r(t.net), "kept_reads": t.kept_reads, "kept_reads_net": r(t.kept_reads_net)})
}

/// The engine's decisions after event `after` (the newest [`TIMELINE_MAX`]), read from the log.
async fn timeline(axum::extract::State(st): S, Path(id): Path<String>, Query(a): Query<After>) -> Response {
    let s = match open(&st, &id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let store = st.store.clone();
    let sid = s.id();
    let read = tokio::task::spawn_blocking(move || -> condense_engine::Result<(u64, Vec<Value>)> {
        let head = s.head()?;
        let mut out = VecDeque::new();
        let mut from = a.after + 1;
        while from <= head {
            let to = head.min(from + 4095);
            for env in store.log().read(s.id(), from, to)? {
                if let Some((kind, text)) = describe(&env.body) {
                    if out.len() == TIMELINE_MAX {
                        out.pop_front();
                    }
                    out.push_back(json!({"seq": env.seq, "kind": kind, "text": text}));
                }
            }
            from = to + 1;
        }
        Ok((head, out.into_iter().collect()))
    })
    .await
    .expect("timeline task");
    // Each decision's account, where this process keeps one (see `condense_engine::accounts`).
    let accounts = st.accounts_of(sid).await.unwrap_or_default();
    match read {
        Ok((head, mut events)) => {
            for e in &mut events {
                let seq = e["seq"].as_u64().unwrap_or(0);
                let of: Vec<Value> = accounts.iter().filter(|a| a.seq == seq).map(account_json).collect();
                if !of.is_empty() {
                    e["accounts"] = Value::Array(of);
                }
            }
            json_ok(&json!({"head": head, "events": events}))
        }
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::refs_in;

    #[test]
    fn refs_are_found_as_whole_words() {
        assert_eq!(refs_in("[t12 · Bash · pruned; recover it with context_tree_query] and b3, not bt4 or t5x"), vec!["t12", "b3"]);
        assert!(refs_in("the text, with tabs").is_empty());
    }
}
