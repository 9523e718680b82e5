//! The server's shared state: the store, the configuration, the HTTP client to the upstreams, the open
//! conversations by identity, and the counters `/condense/status` reports.

use crate::conv::Conv;
use crate::{ServeConfig, ServeError};
use condense_engine::{EngineError, Store};
use condense_events::{SessionId, SourceEvent, Usage};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex as AsyncMutex;

/// Counters of the running server (never anything from a header or a body).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) input_tokens: AtomicU64,
    pub(crate) uncached_input_tokens: AtomicU64,
    pub(crate) output_tokens: AtomicU64,
    pub(crate) cache_read_tokens: AtomicU64,
    pub(crate) cache_write_tokens: AtomicU64,
    pub(crate) tool_rounds: AtomicU64,
    pub(crate) round_limits: AtomicU64,
    pub(crate) upstream_errors: AtomicU64,
    /// serve's own time for each of the last requests, microseconds: from the request read in to its
    /// rewritten body handed to the HTTP client (first round only).
    pub(crate) latencies: std::sync::Mutex<std::collections::VecDeque<[u64; PHASES.len() + 1]>>,
}

/// The phases of serve's own time on a request, as `/condense/status` reports them: reading the body's
/// structure, waiting for a blocking thread and the conversation, recording the request, the engine's
/// preparation and the render into the provider's format, and writing the upstream body.
const PHASES: [&str; 5] = ["parse", "wait", "record", "build", "body"];

/// How long the status and the metrics wait for a conversation a request holds before they answer
/// without it.
const QUICK: std::time::Duration = std::time::Duration::from_millis(200);

/// How many recent requests the latency figures cover.
const LATENCY_WINDOW: usize = 100;

pub(crate) type ConvRef = Arc<ConvCell>;

/// An open conversation: the lock its requests take in turn, and the requests waiting for it (a
/// preparation that sees one with more messages than its own waiting stops: seed 004's "new owner input").
pub(crate) struct ConvCell {
    pub(crate) cell: Arc<AsyncMutex<Conv>>,
    pub(crate) waiting: Arc<std::sync::Mutex<Waiting>>,
    /// The fingerprint of the credentials its requests carry (a request of other credentials is never
    /// taken for it).
    pub(crate) key: String,
}

/// The requests waiting for a conversation: a ticket each, with how many messages its list holds.
#[derive(Default)]
pub(crate) struct Waiting {
    pub(crate) next: u64,
    pub(crate) items: BTreeMap<u64, usize>,
}

impl ConvCell {
    pub(crate) fn new(conv: Conv, key: String) -> ConvCell {
        ConvCell { cell: Arc::new(AsyncMutex::new(conv)), waiting: Arc::default(), key }
    }
}

impl std::ops::Deref for ConvCell {
    type Target = AsyncMutex<Conv>;
    fn deref(&self) -> &AsyncMutex<Conv> {
        &self.cell
    }
}

/// The open conversations by identity, each with when a request last took it (a count of lookups), and
/// what serve keeps of those it closed to bound its memory ([`crate::conv::Parked`]).
#[derive(Default)]
pub(crate) struct Convs {
    pub(crate) open: BTreeMap<String, (ConvRef, u64)>,
    pub(crate) parked: BTreeMap<String, crate::conv::Parked>,
    pub(crate) tick: u64,
}

impl Convs {
    /// The open conversations (to lock one by one once this is released), and the totals of the closed
    /// ones, which count with the figures and bills they had.
    fn split(&self) -> (Vec<ConvRef>, Totals) {
        let mut closed = Totals::default();
        for p in self.parked.values() {
            closed.add(&p.figures, &p.ledger);
            closed.decisions.add(&p.accounts.totals());
        }
        (self.open.values().map(|(c, _)| c.clone()).collect(), closed)
    }
}

/// What status and the metrics sum over the conversations.
#[derive(Default)]
struct Totals {
    stubs: u64,
    checkpoints: u64,
    recoveries: u64,
    condense: f64,
    direct: f64,
    floor: f64,
    /// The decisions' accounts (see `condense_engine::accounts`).
    decisions: condense_engine::accounts::Totals,
}

impl Totals {
    fn add(&mut self, f: &crate::conv::ConvFigures, ledger: &crate::billing::Ledger) {
        self.stubs += f.stubs;
        self.checkpoints += f.checkpoints;
        self.recoveries += f.recoveries;
        if let Some((a, b, floor)) = ledger.costs() {
            self.condense += a;
            self.direct += b;
            self.floor += floor;
        }
    }
}

/// The server's shared state.
pub struct State {
    pub(crate) store: Store,
    pub(crate) cfg: ServeConfig,
    /// When this server started, milliseconds since the epoch (the dashboard says its live figures cover
    /// the time since; display only, never written to the log).
    pub(crate) started_ms: u64,
    pub(crate) http: reqwest::Client,
    /// Open conversations by identity, and what is kept of those closed.
    pub(crate) convs: AsyncMutex<Convs>,
    /// Session name of every identity serve has recorded (read from the log at start, and again for a
    /// conversation it does not know: another server on a shared store may have started it).
    pub(crate) names: std::sync::Mutex<BTreeMap<String, String>>,
    /// The sessions read for `names`: every id up to this one.
    pub(crate) scanned: std::sync::Mutex<SessionId>,
    pub(crate) counters: Counters,
    /// The memory requests may hold at once.
    pub(crate) budget: Arc<crate::budget::Budget>,
    /// What `/condense/metrics` reports.
    pub(crate) metrics: crate::metrics::Metrics,
    /// Summaries through the upstream that fell back to the extractive summarizer.
    pub(crate) upstream_fallbacks: Arc<AtomicU64>,
    /// The per-request figures the dashboard plots.
    pub(crate) live: crate::live::Live,
    /// The models this process has seen a request for (each is logged once, with the window assumed).
    models_seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// What the scans of recent request bodies found, for the next body of each conversation.
    pub(crate) hints: std::sync::Mutex<Hints>,
}

/// How many bodies' scan hints are kept, and how many elements they may hold in all (about 48 bytes
/// each: 24 MB).
const HINTS_KEPT: usize = 256;
const HINT_ITEMS_KEPT: u64 = 500_000;

/// The scan hints of recent request bodies (`condense_formats::scan`), by a hash of the client's
/// credentials and the body's opening (see `request::read`); the least recently used go first. A hint is
/// only a guess at where the next body's elements are (every element it names is checked against the
/// body), so a wrong one costs time, never a wrong reading.
#[derive(Default)]
pub(crate) struct Hints {
    /// Each hint and when it was last used.
    map: BTreeMap<u64, (Arc<condense_formats::scan::Hint>, u64)>,
    tick: u64,
}

impl Hints {
    pub(crate) fn get(&mut self, key: u64) -> Option<Arc<condense_formats::scan::Hint>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(&key).map(|(h, used)| {
            *used = tick;
            h.clone()
        })
    }

    pub(crate) fn put(&mut self, key: u64, hint: condense_formats::scan::Hint) {
        if hint.len() as u64 > HINT_ITEMS_KEPT {
            return;
        }
        self.tick += 1;
        self.map.insert(key, (Arc::new(hint), self.tick));
        // Weighed by their elements; one a request holds is weighed as the rest (it is only read).
        let entries = self.map.iter().map(|(k, (h, used))| (*used, *k, Some(h.len() as u64), true));
        for k in condense_engine::least_recently_used(entries, HINTS_KEPT, HINT_ITEMS_KEPT) {
            self.map.remove(&k);
        }
    }
}

impl State {
    pub(crate) async fn new(store: Store, cfg: ServeConfig) -> Result<Arc<State>, ServeError> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| ServeError::Client(e.to_string()))?;
        let s2 = store.clone();
        let (names, scanned) = tokio::task::spawn_blocking(move || identities(&s2, 0))
            .await
            .expect("identity scan task")
            .map_err(|source| ServeError::Store { path: cfg.store.clone(), source })?;
        Ok(Arc::new(State {
            store,
            http,
            convs: AsyncMutex::new(Convs::default()),
            names: std::sync::Mutex::new(names),
            scanned: std::sync::Mutex::new(scanned),
            counters: Counters::default(),
            budget: crate::budget::Budget::new(cfg.memory_budget),
            metrics: crate::metrics::Metrics::new(),
            models_seen: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            live: crate::live::Live::default(),
            upstream_fallbacks: Arc::default(),
            started_ms: crate::live::now_ms(),
            hints: std::sync::Mutex::default(),
            cfg,
        }))
    }

    /// The store the server owns.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs `f` on each open conversation, one at a time, and sums their figures with those of the
    /// conversations closed; says whether any could not be read within [`QUICK`] (a request holds it: with
    /// a hung store, the status and the metrics answer without it rather than hang with it).
    async fn read_convs(&self, mut f: impl FnMut(&Conv)) -> (Totals, bool) {
        let Ok(map) = tokio::time::timeout(QUICK, self.convs.lock()).await else { return (Totals::default(), true) };
        let (convs, mut totals) = map.split();
        drop(map);
        let mut busy = false;
        for conv in convs {
            match tokio::time::timeout(QUICK, conv.lock()).await {
                Ok(c) => {
                    totals.add(&c.figures, &c.ledger);
                    totals.decisions.add(&c.accounts.totals());
                    f(&c);
                }
                Err(_) => busy = true,
            }
        }
        (totals, busy)
    }

    /// The decisions' accounts of the conversation of session `id` held in memory (open or closed), to
    /// date; `None` when this process holds none of it.
    pub(crate) async fn accounts_of(&self, id: condense_events::SessionId) -> Option<Vec<condense_engine::accounts::Account>> {
        let open: Vec<ConvRef> = {
            let map = tokio::time::timeout(QUICK, self.convs.lock()).await.ok()?;
            if let Some(p) = map.parked.values().find(|p| p.session == id) {
                return Some(p.accounts.list());
            }
            map.open.values().map(|(c, _)| c.clone()).collect()
        };
        for conv in open {
            if let Ok(c) = tokio::time::timeout(QUICK, conv.lock()).await
                && c.session.id() == id
            {
                return Some(c.accounts.list());
            }
        }
        None
    }

    /// The status figures as JSON.
    pub async fn status(&self) -> Value {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut sessions = Vec::new();
        let (totals, busy) = self
            .read_convs(|c| {
                sessions.push(json!({
                    "name": c.session.name(), "id": c.session.id(), "requests": c.figures.requests, "stubs": c.figures.stubs,
                    "checkpoints": c.figures.checkpoints, "recoveries": c.figures.recoveries, "messages": c.visible_len(),
                    "failures": self.live.failures_of(c.session.id()),
                    "cache_priced": c.ledger.figures(),
                }))
            })
            .await;
        json!({
            "sessions": self.names.lock().expect("names lock").len(),
            "active_sessions": sessions,
            "busy": busy,
            "requests": self.metrics.requests_total(),
            "tokens_in": self.metrics.tokens_received.get(),
            "tokens_sent": self.metrics.tokens_sent.get(),
            "input_tokens": g(&c.input_tokens),
            "uncached_input_tokens": g(&c.uncached_input_tokens),
            "output_tokens": g(&c.output_tokens),
            "cache_read_tokens": g(&c.cache_read_tokens),
            "cache_write_tokens": g(&c.cache_write_tokens),
            "stubs": totals.stubs,
            "decisions": totals.decisions.decisions,
            "decisions_net_negative": totals.decisions.net_negative,
            "decisions_net_saving": (totals.decisions.net * 100.0).round() / 100.0,
            "checkpoints": totals.checkpoints,
            "recoveries": totals.recoveries,
            "tool_rounds": g(&c.tool_rounds),
            "tool_round_limits": g(&c.round_limits),
            "overflows": self.metrics.overflows.get(),
            "upstream_errors": g(&c.upstream_errors),
            "passthrough": self.metrics.passthrough.get(),
            "memory_reserved_bytes": self.budget.used(),
            "memory_budget_bytes": self.cfg.memory_budget,
            "latency_ms": self.latency_json(),
            "summarizer_fallbacks": self.summarizer_fallbacks(),
        })
    }

    pub(crate) fn record_latency(&self, api: condense_formats::wire::Api, d: std::time::Duration, phases: [std::time::Duration; PHASES.len()]) {
        self.metrics.own_seconds.get_or_create(&crate::metrics::ApiLabel { api: api.name() }).observe(d.as_secs_f64());
        let mut l = self.counters.latencies.lock().expect("latency lock");
        if l.len() == LATENCY_WINDOW {
            l.pop_front();
        }
        let mut row = [d.as_micros() as u64; PHASES.len() + 1];
        for (i, p) in phases.iter().enumerate() {
            row[i + 1] = p.as_micros() as u64;
        }
        l.push_back(row);
    }

    fn latency_json(&self) -> Value {
        let rows: Vec<[u64; PHASES.len() + 1]> = self.counters.latencies.lock().expect("latency lock").iter().copied().collect();
        let figures = |col: usize| {
            let mut v: Vec<u64> = rows.iter().map(|r| r[col]).collect();
            v.sort_unstable();
            let at = |p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |us| *us as f64 / 1000.0);
            (at(0.5), at(0.99), at(1.0))
        };
        let (p50, p99, max) = figures(0);
        let mut phases = serde_json::Map::new();
        for (i, name) in PHASES.iter().enumerate() {
            let (p50, p99, max) = figures(i + 1);
            phases.insert((*name).into(), json!({"p50": p50, "p99": p99, "max": max}));
        }
        json!({"requests": rows.len(), "p50": p50, "p99": p99, "max": max, "phases": phases})
    }

    /// The window and output limit assumed for `model` (see [`condense_engine::config::model_lookup`]); the
    /// first request for a model logs what is assumed, where it comes from, and how to change it.
    pub(crate) fn model_limits(&self, model: &str) -> Option<condense_engine::config::ModelLimits> {
        let found = condense_engine::config::model_lookup(&self.cfg.file.models, model);
        if self.models_seen.lock().expect("models lock").insert(model.to_string()) {
            let change = format!("change it with `condense config set models '{{\"{model}\": {{\"contextWindow\": N, \"maxOutput\": N}}}}'` and restart serve");
            match &found {
                Some((l, from)) => tracing::info!(target: "condense::model", model, context_window = l.context_window, max_output = l.max_output, from = from.as_str(), "model {model}: a context window of {} tokens assumed (from {from}); {change}", l.context_window),
                None => tracing::warn!(target: "condense::model", model, "model {model}: no context window known (pruning still runs; checkpoints come only on new_context or a provider overflow); {change}"),
            }
        }
        found.map(|(l, _)| l)
    }

    /// Summaries the configured summarizer or the upstream did not write (the extractive one stood in).
    pub(crate) fn summarizer_fallbacks(&self) -> u64 {
        self.cfg.summarizer.as_ref().map_or(0, |s| s.fallbacks().count) + self.upstream_fallbacks.load(Ordering::Relaxed)
    }

    /// Counts an upstream answer that was an error (see [`crate::metrics::StatusLabel`]).
    pub(crate) fn upstream_error(&self, status: impl Into<String>) {
        self.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        self.metrics.upstream_error(status);
    }

    /// Counts a provider overflow.
    pub(crate) fn overflow(&self) {
        self.metrics.overflows.inc();
    }

    /// Counts a request forwarded unchanged.
    pub(crate) fn passthrough(&self) {
        self.metrics.passthrough.inc();
    }

    /// Counts tokens received from a client and sent upstream.
    pub(crate) fn tokens(&self, received: u64, sent: u64) {
        self.metrics.tokens_received.inc_by(received);
        self.metrics.tokens_sent.inc_by(sent);
    }

    /// The metrics in the Prometheus text format, the figures of the conversations in memory read now.
    pub async fn metrics(&self) -> String {
        let m = &self.metrics;
        let mut warm = 0;
        let (totals, busy) = self.read_convs(|_| warm += 1).await;
        // With a conversation unreadable (a request holds it on a hung store), the gauges summed over the
        // conversations keep their last values rather than drop.
        if !busy {
            m.sessions_warm.set(warm);
            m.checkpoints.set(totals.checkpoints as i64);
            m.recoveries.set(totals.recoveries as i64);
            m.stubs.set(totals.stubs as i64);
            m.decisions.set(totals.decisions.decisions as i64);
            m.decisions_net_negative.set(totals.decisions.net_negative as i64);
            m.decisions_net_saving.set(totals.decisions.net);
            if self.cfg.price_cache || totals.direct > 0.0 {
                m.cache_priced_cost.get_or_create(&crate::metrics::PathLabel { path: "condense" }).set(totals.condense);
                m.cache_priced_cost.get_or_create(&crate::metrics::PathLabel { path: "direct" }).set(totals.direct);
                m.cache_priced_cost.get_or_create(&crate::metrics::PathLabel { path: "floor" }).set(totals.floor);
            }
        }
        let fallbacks = self.summarizer_fallbacks();
        m.summarizer_fallbacks.inc_by(fallbacks.saturating_sub(m.summarizer_fallbacks.get()));
        m.memory_reserved.set(self.budget.used() as i64);
        m.memory_budget.set(self.cfg.memory_budget as i64);
        m.sessions.set(self.names.lock().expect("names lock").len() as i64);
        let c = &self.counters;
        let now = [&c.input_tokens, &c.uncached_input_tokens, &c.output_tokens, &c.cache_read_tokens, &c.cache_write_tokens, &c.tool_rounds, &c.round_limits, &c.upstream_errors];
        for (counter, figure) in m.usage.iter().zip(now) {
            counter.inc_by(figure.load(Ordering::Relaxed).saturating_sub(counter.get()));
        }
        m.encode()
    }

    /// Counts a reply's usage: `input_tokens` as the provider reports its input (Anthropic leaves cache
    /// reads and writes out of it, OpenAI's `prompt_tokens`/`input_tokens` include cached tokens),
    /// `uncached_input_tokens` the same for every provider.
    pub(crate) fn count_usage(&self, api: condense_formats::wire::Api, u: &Option<Usage>) {
        if let Some(u) = u {
            let c = &self.counters;
            let reported = match api {
                condense_formats::wire::Api::Anthropic => u.input,
                _ => u.input + u.cache_read,
            };
            c.input_tokens.fetch_add(reported, Ordering::Relaxed);
            c.uncached_input_tokens.fetch_add(u.input, Ordering::Relaxed);
            c.output_tokens.fetch_add(u.output, Ordering::Relaxed);
            c.cache_read_tokens.fetch_add(u.cache_read, Ordering::Relaxed);
            c.cache_write_tokens.fetch_add(u.cache_write, Ordering::Relaxed);
        }
    }
}

/// The identity → session name of every session serve started, from each session's first event.
pub(crate) fn identities(store: &Store, after: SessionId) -> Result<(BTreeMap<String, String>, SessionId), EngineError> {
    let mut out = BTreeMap::new();
    let sessions: Vec<_> = store.sessions()?.into_iter().filter(|i| i.id > after).collect();
    // Read again next time: from the first session created and not written yet (its first event names
    // its conversation), else from the newest.
    let upto = sessions.iter().find(|i| i.head == 0).map_or_else(|| sessions.last().map_or(after, |i| i.id), |i| i.id - 1);
    for info in sessions {
        if info.head == 0 {
            continue;
        }
        if let Some(id) = identity_of(store, info.id)? {
            out.insert(id, info.name);
        }
    }
    Ok((out, upto))
}

/// The conversation identity a session serve started names in its first event (`None` for a session
/// serve did not start, or one with nothing written yet).
pub(crate) fn identity_of(store: &Store, session: SessionId) -> Result<Option<String>, EngineError> {
    Ok(store.log().read(session, 1, 1)?.into_iter().next().and_then(|env| match env.body {
        condense_events::Event::Source(SourceEvent::SessionStarted { source, source_id: Some(id), .. }) if source.starts_with("serve:") => Some(id),
        _ => None,
    }))
}
