//! `/condense/metrics`: serve's figures in the Prometheus text format, through the Prometheus project's
//! own client (`prometheus-client`). Counters and the latency histogram move as requests go; the figures
//! of the conversations in memory (checkpoints, recoveries, stubs, cache-priced cost) and of the summarizer
//! are read when the metrics are asked for. Nothing from a header or a body is ever a label.

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// A label of the API a request came in on.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApiLabel {
    pub(crate) api: &'static str,
}

/// Why an upstream answer counts as an error: its HTTP status, or `unreachable`, `stream_cut` (the
/// event stream ended before the reply was complete) or `not_a_stream` (a 200 to a streaming request
/// that was not an event stream).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabel {
    pub(crate) status: String,
}

/// Which side of the cache-priced comparison: what condense sent, or the client's requests as sent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PathLabel {
    pub(crate) path: &'static str,
}

/// The metrics serve keeps.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) requests: Family<ApiLabel, Counter>,
    pub(crate) own_seconds: Family<ApiLabel, Histogram>,
    pub(crate) tokens_received: Counter,
    pub(crate) tokens_sent: Counter,
    pub(crate) upstream_errors: Family<StatusLabel, Counter>,
    pub(crate) overflows: Counter,
    pub(crate) passthrough: Counter,
    pub(crate) summarizer_fallbacks: Counter,
    pub(crate) sessions_warm: Gauge,
    pub(crate) checkpoints: Gauge,
    pub(crate) recoveries: Gauge,
    pub(crate) stubs: Gauge,
    pub(crate) cache_priced_cost: Family<PathLabel, Gauge<f64, AtomicU64>>,
    pub(crate) memory_reserved: Gauge,
}

/// Buckets of serve's own time, seconds: 0.25 ms to 1 s.
const OWN_BUCKETS: [f64; 13] = [0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0];

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("condense");
        let requests = Family::<ApiLabel, Counter>::default();
        registry.register("requests", "Client requests recorded and prepared, by API", requests.clone());
        let own_seconds = Family::<ApiLabel, Histogram>::new_with_constructor(|| Histogram::new(OWN_BUCKETS));
        registry.register(
            "own_seconds",
            "serve's own time on a request, from the body read in to the rewritten body handed to the HTTP client (first round), by API",
            own_seconds.clone(),
        );
        let tokens_received = Counter::default();
        registry.register("tokens_received", "Estimated tokens of the conversations as the clients sent them", tokens_received.clone());
        let tokens_sent = Counter::default();
        registry.register("tokens_sent", "Estimated tokens of the conversations as condense sent them upstream", tokens_sent.clone());
        let upstream_errors = Family::<StatusLabel, Counter>::default();
        registry.register("upstream_errors", "Upstream answers that were errors, by HTTP status or unreachable, stream_cut, not_a_stream", upstream_errors.clone());
        let overflows = Counter::default();
        registry.register("overflows", "Provider context overflows (each answered by a checkpoint and one retry)", overflows.clone());
        let passthrough = Counter::default();
        registry.register("passthrough", "Requests forwarded unchanged (no conversation to manage, or a compressed body)", passthrough.clone());
        let summarizer_fallbacks = Counter::default();
        registry.register("summarizer_fallbacks", "Times the configured summarizer failed and the extractive one stood in", summarizer_fallbacks.clone());
        let sessions_warm = Gauge::default();
        registry.register("sessions_warm", "Conversations held in memory", sessions_warm.clone());
        let checkpoints = Gauge::default();
        registry.register("checkpoints", "Checkpoints committed in the conversations held in memory", checkpoints.clone());
        let recoveries = Gauge::default();
        registry.register("recoveries", "Recovery handoffs prepared in the conversations held in memory", recoveries.clone());
        let stubs = Gauge::default();
        registry.register("stubs", "Outputs rendered as stubs in the conversations held in memory", stubs.clone());
        let cache_priced_cost = Family::<PathLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cache_priced_cost",
            "Cache-priced cost (0.1 per cached byte, 1.25 per uncached byte) of the conversations held in memory, through condense and as the client sent them (--price-cache)",
            cache_priced_cost.clone(),
        );
        let memory_reserved = Gauge::default();
        registry.register("memory_reserved_bytes", "Memory the requests in flight hold of --memory-budget", memory_reserved.clone());
        Metrics {
            registry,
            requests,
            own_seconds,
            tokens_received,
            tokens_sent,
            upstream_errors,
            overflows,
            passthrough,
            summarizer_fallbacks,
            sessions_warm,
            checkpoints,
            recoveries,
            stubs,
            cache_priced_cost,
            memory_reserved,
        }
    }

    /// Counts an upstream error.
    pub(crate) fn upstream_error(&self, status: impl Into<String>) {
        self.upstream_errors.get_or_create(&StatusLabel { status: status.into() }).inc();
    }

    /// The text format.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
