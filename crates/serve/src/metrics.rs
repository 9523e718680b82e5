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
use condense_formats::wire::Api;
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

/// A request condense itself refused: the API and the stable code (`CONTEXT_COMPACTION_FAILED`,
/// `RECOVERY_BLOCKED`, `bad_request`, `unavailable`, `internal`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailureLabel {
    pub(crate) api: String,
    pub(crate) code: &'static str,
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
    pub(crate) request_failures: Family<FailureLabel, Counter>,
    pub(crate) overflows: Counter,
    pub(crate) passthrough: Counter,
    pub(crate) summarizer_fallbacks: Counter,
    /// The provider's usage and serve's tool rounds, as `/condense/status` counts them (brought up to its
    /// figures when the metrics are read).
    pub(crate) usage: [Counter; 8],
    pub(crate) sessions: Gauge,
    pub(crate) memory_budget: Gauge,
    pub(crate) sessions_warm: Gauge,
    pub(crate) checkpoints: Gauge,
    pub(crate) recoveries: Gauge,
    pub(crate) stubs: Gauge,
    pub(crate) decisions: Gauge,
    pub(crate) decisions_net_negative: Gauge,
    pub(crate) decisions_net_saving: Gauge<f64, AtomicU64>,
    pub(crate) cache_priced_cost: Family<PathLabel, Gauge<f64, AtomicU64>>,
    pub(crate) memory_reserved: Gauge,
}

/// Registers `metric` under `name` and hands back the handle serve keeps (metrics share their state
/// between clones).
fn add<M: prometheus_client::registry::Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

/// The counters of `/condense/status` kept as atomics and read into metrics of the same names, in the
/// order of [`Metrics::usage`].
pub(crate) const USAGE: [(&str, &str); 8] = [
    ("input_tokens", "Input tokens as the provider reports them (Anthropic leaves cache reads and writes out; OpenAI includes them)"),
    ("uncached_input_tokens", "Input tokens the provider read uncached, for every provider alike"),
    ("output_tokens", "Output tokens the provider reported"),
    ("cache_read_tokens", "Input tokens the provider read from its prompt cache"),
    ("cache_write_tokens", "Input tokens the provider wrote to its prompt cache"),
    ("tool_rounds", "Rounds serve answered itself (condense's own tool calls) and sent on upstream"),
    ("tool_round_limits", "Replies ended by the limit of tool rounds (--max-tool-rounds)"),
    ("upstream_error_answers", "Upstream answers that were errors, all kinds (by kind: upstream_errors)"),
];

const APIS: [Api; 4] = [Api::Anthropic, Api::Chat, Api::Responses, Api::Gemini];

/// Buckets of serve's own time, seconds: 0.25 ms to 1 s.
const OWN_BUCKETS: [f64; 13] = [0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0];

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut r = Registry::with_prefix("condense");
        let m = Metrics {
            requests: add(&mut r, "requests", "Client requests recorded and prepared, by API", Family::default()),
            own_seconds: add(
                &mut r,
                "own_seconds",
                "serve's own time on a request, from the body read in to the rewritten body handed to the HTTP client (first round), by API",
                Family::new_with_constructor(|| Histogram::new(OWN_BUCKETS)),
            ),
            tokens_received: add(&mut r, "tokens_received", "Estimated tokens of the client requests as received (messages, system prompt, tools)", Counter::default()),
            tokens_sent: add(&mut r, "tokens_sent", "Estimated tokens of the upstream requests as sent, every round", Counter::default()),
            upstream_errors: add(&mut r, "upstream_errors", "Upstream answers that were errors, by HTTP status or unreachable, stream_cut, not_a_stream", Family::default()),
            request_failures: add(
                &mut r,
                "request_failures",
                "Client requests condense itself refused (not the provider's errors), by API and code",
                Family::default(),
            ),
            overflows: add(&mut r, "overflows", "Provider context overflows (each answered by a checkpoint and one retry)", Counter::default()),
            passthrough: add(&mut r, "passthrough", "Requests forwarded unchanged (no conversation to manage, or a compressed body)", Counter::default()),
            summarizer_fallbacks: add(&mut r, "summarizer_fallbacks", "Times the configured summarizer failed and the extractive one stood in", Counter::default()),
            usage: USAGE.map(|(name, help)| add(&mut r, name, help, Counter::default())),
            sessions: add(&mut r, "sessions", "Conversations serve knows in its store (open or not)", Gauge::default()),
            memory_budget: add(&mut r, "memory_budget_bytes", "--memory-budget: what requests in flight may hold", Gauge::default()),
            sessions_warm: add(&mut r, "sessions_warm", "Conversations held in memory", Gauge::default()),
            checkpoints: add(&mut r, "checkpoints", "Checkpoints committed in the conversations held in memory", Gauge::default()),
            recoveries: add(&mut r, "recoveries", "Recovery handoffs prepared in the conversations held in memory", Gauge::default()),
            stubs: add(&mut r, "stubs", "Outputs rendered as stubs in the conversations held in memory", Gauge::default()),
            decisions: add(&mut r, "decisions", "Decisions accounted in the conversations held in memory, since this process took each up (kept reads apart)", Gauge::default()),
            decisions_net_negative: add(&mut r, "decisions_net_negative", "Of the decisions accounted, those that had not paid for themselves yet (net below zero)", Gauge::default()),
            decisions_net_saving: add(
                &mut r,
                "decisions_net_saving",
                "What the decisions accounted saved less what their rewrites and summaries cost, in cost units (0.1 a cached and 1.25 an uncached estimated token)",
                Gauge::default(),
            ),
            cache_priced_cost: add(
                &mut r,
                "cache_priced_cost",
                "Cache-priced cost (0.1 per cached byte, 1.25 per uncached byte) of the conversations held in memory, through condense and as the client sent them, and the floor: each byte new to the provider once, uncached (--price-cache)",
                Family::default(),
            ),
            memory_reserved: add(&mut r, "memory_reserved_bytes", "Memory the requests in flight hold of --memory-budget", Gauge::default()),
            registry: r,
        };
        // Every API's request count from the start (zero until used), so a scrape sees the same series
        // whether or not `/condense/status` was read.
        for api in APIS {
            drop(m.requests.get_or_create(&ApiLabel { api: api.name() }));
        }
        m
    }

    /// Client requests over every API (`requests` in `/condense/status`).
    pub(crate) fn requests_total(&self) -> u64 {
        APIS.iter().map(|a| self.requests.get_or_create(&ApiLabel { api: a.name() }).get()).sum()
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
