//! Summaries through the upstream (issue 36, seed 004's "compute"): in `condense serve`, a recovery's
//! handoff is written by a model reached through the same upstream as the request being prepared, with
//! the client's own credentials, one call per chronological piece (the engine's `recover::prepare` bounds
//! the pieces, their count and the deadline). By default the model is the session's previous one, the
//! native model the history was written for (`--summary-model` names another); `--summaries upstream`
//! sends checkpoint handoffs and batch summaries the same way (pi-condense's behaviour). A call that fails, times out or answers
//! out of bounds falls back to condense's extractive summarizer, and every fallback is counted
//! (`summarizer_fallbacks` in `/condense/status`) and logged (target `condense::summary`).

use condense_formats::wire::Api;
use condense_summarize::{Extractive, HttpConfig, HttpSummarizer, Item, SummarizeError, Summarizer, WithFallback};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Which summaries serve asks the upstream for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Summaries {
    /// The handoffs of recoveries onto a smaller model through the upstream (the default); batch
    /// summaries and checkpoint handoffs extractive.
    #[default]
    Handoffs,
    /// Every summary through the upstream: recovery and checkpoint handoffs, batch summaries.
    Upstream,
    /// Nothing through the upstream: every summary and handoff extractive.
    Extractive,
}

/// How a request's summaries reach the upstream: its API and base URL, the client's headers (its
/// credentials; held for the request only, never written or shown), and what to ask for.
#[derive(Clone)]
pub struct Route {
    pub(crate) api: Api,
    /// The upstream's base URL with `/v1`.
    pub(crate) base: String,
    /// The client's headers as they go upstream with its requests (the request's own, shared).
    pub(crate) headers: Arc<axum::http::HeaderMap>,
    /// `--summary-model`, when given.
    pub(crate) model: Option<String>,
    /// Batch summaries and checkpoint handoffs too (`--summaries upstream`).
    pub(crate) all: bool,
    pub(crate) fallbacks: Arc<AtomicU64>,
    /// The request's reasoning setting, carried into its summary requests.
    pub(crate) reasoning: Vec<(String, serde_json::Value)>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The headers hold the client's credentials: their names only.
        let names: Vec<&str> = self.headers.keys().map(|k| k.as_str()).collect();
        f.debug_struct("Route").field("api", &self.api).field("base", &self.base).field("headers", &names).field("model", &self.model).field("all", &self.all).finish()
    }
}

/// Why a preparation must stop now, if it must (see [`Summarizer::stopped`]).
pub(crate) type Stop = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Per call: connecting and every wait for the server.
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);
/// Per call, the whole of it, and never past the recovery's deadline (`recover::DEADLINE`, 600 s, from
/// the start of the preparation).
const TOTAL: std::time::Duration = std::time::Duration::from_secs(120);

impl Route {
    /// The summarizer for a preparation of a session whose native model is `native`: the upstream's
    /// model, the extractive summarizer standing in for every call that fails.
    pub(crate) fn summarizer(&self, native: &str, stop: Option<Stop>) -> Arc<dyn Summarizer> {
        let model = self.model.clone().unwrap_or_else(|| native.to_string());
        let mut cfg = HttpConfig::new(&self.base, &model, None);
        (cfg.idle, cfg.total) = (IDLE, TOTAL);
        cfg.api = self.api;
        cfg.extra = self.reasoning.clone();
        let upstream = Through { cfg, headers: self.headers.clone(), all: self.all, started: std::time::Instant::now(), stop };
        let fallbacks = self.fallbacks.clone();
        let notice = move |_: u64, reason: &str| {
            fallbacks.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "condense::summary", "a summary through the upstream failed ({reason}); condense's extractive summary stands in");
        };
        Arc::new(WithFallback::new(upstream, Extractive::default()).with_notice(notice))
    }
}

/// The upstream's model for recovery handoffs, and for batch summaries and checkpoint handoffs when
/// `all`; the extractive summarizer and the engine's own checkpoint handoff otherwise.
struct Through {
    cfg: HttpConfig,
    /// The client's headers, made the summarizer's only when a call is made (most preparations make none).
    headers: Arc<axum::http::HeaderMap>,
    all: bool,
    /// When the preparation that uses it began: no call runs past the recovery's deadline.
    started: std::time::Instant,
    /// What stops the preparation (its request given up, newer input waiting).
    stop: Option<Stop>,
}

impl Through {
    /// The HTTP summarizer for one call, its total time cut to what the deadline leaves.
    fn http(&self) -> Result<HttpSummarizer, SummarizeError> {
        let left = condense_engine::recover::DEADLINE.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            return Err(SummarizeError::Failed { name: "upstream".into(), reason: format!("the recovery's deadline of {} s has passed", condense_engine::recover::DEADLINE.as_secs()) });
        }
        let mut cfg = self.cfg.clone();
        cfg.total = cfg.total.min(left);
        cfg.headers = self.headers
            .iter()
            .filter(|(k, _)| *k != axum::http::header::CONTENT_TYPE)
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        Ok(HttpSummarizer::new(cfg))
    }
}

impl Summarizer for Through {
    fn name(&self) -> &str {
        "upstream"
    }

    fn summarize(&self, batch: &[Item<'_>]) -> Result<Vec<String>, SummarizeError> {
        if self.all {
            self.http()?.summarize(batch)
        } else {
            Extractive::default().summarize(batch)
        }
    }

    fn handoff(&self, transcript: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        if self.all {
            self.http()?.handoff(transcript, max_chars)
        } else {
            Ok(None)
        }
    }

    fn recovery_handoff(&self, piece: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.http()?.recovery_handoff(piece, max_chars)
    }

    fn stopped(&self) -> Option<String> {
        self.stop.as_ref().and_then(|s| s())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that would start past the recovery's deadline is not made: it fails at once (and the
    /// extractive handoff stands in).
    #[test]
    fn no_call_starts_past_the_deadline() {
        // An address nothing listens on: a call that were made would fail otherwise, and slowly.
        let cfg = HttpConfig::new("http://127.0.0.1:9/v1", "m", None);
        let late = Through { cfg: cfg.clone(), headers: Default::default(), all: true, started: std::time::Instant::now() - condense_engine::recover::DEADLINE - std::time::Duration::from_secs(1), stop: None };
        let t = std::time::Instant::now();
        let e = late.recovery_handoff("[e1] user: hello\n", 1000).unwrap_err();
        assert!(e.to_string().contains("deadline"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // In time, the call is made (and fails here on the closed port, with the cause).
        let on_time = Through { cfg, headers: Default::default(), all: true, started: std::time::Instant::now(), stop: None };
        let e = on_time.recovery_handoff("[e1] user: hello\n", 1000).unwrap_err();
        assert!(!e.to_string().contains("deadline"), "{e}");
        // Batch summaries and checkpoint handoffs stay extractive unless `all`.
        let handoffs_only = Through { cfg: HttpConfig::new("http://127.0.0.1:9/v1", "m", None), headers: Default::default(), all: false, started: std::time::Instant::now(), stop: None };
        assert_eq!(handoffs_only.handoff("[e1] user: hello\n", 1000).unwrap(), None);
    }
}
