//! What the dashboard plots of each conversation this process served: one row per request (tokens
//! received and sent, the window, the conversation's figures, whether it broke the prompt cache), kept
//! in memory for the last [`ROWS_KEPT`] requests. Written on the request path, read by `dashboard`.

use crate::billing::Ledger;
use crate::conv::{ConvFigures, Sent};
use condense_events::SessionId;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Requests of one conversation whose figures are kept for the plot.
pub const ROWS_KEPT: usize = 2000;

/// One request as the plot shows it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The conversation's request number.
    pub(crate) n: u64,
    /// Wall-clock time, milliseconds since the epoch (display only: never written to the log).
    pub(crate) at_ms: u64,
    pub(crate) received: u64,
    pub(crate) sent: u64,
    /// Tokens sent in the rounds of condense's own tools that followed.
    pub(crate) sent_rounds: u64,
    pub(crate) sent_bytes: u64,
    pub(crate) window: Option<u64>,
    pub(crate) figures: ConvFigures,
    pub(crate) cache_break: bool,
}

#[derive(Default)]
pub(crate) struct LiveSession {
    pub(crate) rows: VecDeque<Row>,
    pub(crate) api: &'static str,
    pub(crate) model: String,
    pub(crate) received: u64,
    pub(crate) sent: u64,
    pub(crate) ledger: Option<Arc<Ledger>>,
    pub(crate) breaks: u64,
}

/// The live figures of every conversation this process served.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) sessions: Mutex<BTreeMap<SessionId, LiveSession>>,
    pub(crate) failures: Mutex<Failures>,
}

/// How many refusals the dashboard lists.
pub const FAILURES_KEPT: usize = 50;

/// A request condense refused itself (its own 400s, 413, 503…), as the dashboard lists it.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// Wall-clock time, milliseconds since the epoch (display only).
    pub(crate) at_ms: u64,
    pub(crate) api: String,
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    /// The reason the client got (built from counts and names, never from a header or a body).
    pub(crate) reason: String,
    /// The conversation it belongs to, when it got that far.
    pub(crate) session: Option<SessionId>,
}

/// The newest refusals, and how many each conversation had since this process started.
#[derive(Default)]
pub(crate) struct Failures {
    pub(crate) recent: VecDeque<Failure>,
    pub(crate) by_session: BTreeMap<SessionId, u64>,
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Live {
    /// Records a request of `session` as it went upstream.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(&self, session: SessionId, api: &'static str, model: &str, received: u64, sent: u64, sent_bytes: u64, s: Sent, ledger: Arc<Ledger>) {
        let mut all = self.sessions.lock().expect("live lock");
        let live = all.entry(session).or_default();
        let cache_break = s.kept < s.before;
        live.breaks += u64::from(cache_break);
        (live.api, live.model) = (api, model.to_string());
        live.received += received;
        live.sent += sent;
        live.ledger = Some(ledger);
        if live.rows.len() == ROWS_KEPT {
            live.rows.pop_front();
        }
        live.rows.push_back(Row { n: s.figures.requests, at_ms: now_ms(), received, sent, sent_rounds: 0, sent_bytes, window: s.window, figures: s.figures, cache_break });
    }

    /// Records a refusal.
    pub(crate) fn failure(&self, f: Failure) {
        let mut all = self.failures.lock().expect("failures lock");
        if let Some(s) = f.session {
            *all.by_session.entry(s).or_default() += 1;
        }
        if all.recent.len() == FAILURES_KEPT {
            all.recent.pop_front();
        }
        all.recent.push_back(f);
    }

    /// How many refusals conversation `session` had.
    pub(crate) fn failures_of(&self, session: SessionId) -> u64 {
        self.failures.lock().expect("failures lock").by_session.get(&session).copied().unwrap_or(0)
    }

    /// Counts a round of condense's own tools within the newest request of `session`: its tokens sent,
    /// and the conversation's figures after it.
    pub(crate) fn round(&self, session: SessionId, sent: u64, figures: ConvFigures) {
        let mut all = self.sessions.lock().expect("live lock");
        if let Some(live) = all.get_mut(&session) {
            live.sent += sent;
            if let Some(row) = live.rows.back_mut() {
                row.sent_rounds += sent;
                row.figures = figures;
            }
        }
    }
}

pub(crate) fn figures_json(f: &ConvFigures) -> Value {
    json!({"requests": f.requests, "stubs": f.stubs, "chains": f.chains, "checkpoints": f.checkpoints, "recoveries": f.recoveries})
}

pub(crate) fn summary_json(live: &LiveSession) -> Value {
    let last = live.rows.back();
    json!({
        "api": live.api,
        "model": live.model,
        "tokens_received": live.received,
        "tokens_sent": live.sent,
        "cache_breaks": live.breaks,
        "last_activity_ms": last.map_or(0, |r| r.at_ms),
        "figures": last.map(|r| figures_json(&r.figures)),
        "window": last.and_then(|r| r.window),
        "cache_priced": live.ledger.as_ref().and_then(|l| l.figures()),
    })
}

