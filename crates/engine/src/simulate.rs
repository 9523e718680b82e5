//! Replaying a session turn by turn as if live, with the pruning pipeline on, and measuring what the model
//! would have been sent. Definitions (issue 3, the same as the reference figures): a request is the
//! context before each assistant message of the replayed branch; tokens are pi's chars/4 estimate per
//! message, summed; the cached prefix of a request is its leading messages identical to the same positions
//! of the previous request; a cache break is a request whose cached prefix is shorter than the whole
//! previous request; cost units are `cached_price` per cached-prefix token and `uncached_price` per other
//! input token.

use crate::accounts::{Accounts, Meter, Models, Totals};
use crate::{Result, Store};
use condense_capture::output_text;
use condense_events::{Entry, Event, Message, PruneConfig, SourceEvent};
use condense_render::{check, Projection};
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::prices::{Prices, DEFAULT_CACHE_TTL};

/// The figures of one replayed session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Requests (model calls) replayed.
    pub turns: u64,
    /// Tool calls on the branch.
    pub tool_calls: u64,
    /// Largest raw request, tokens.
    pub raw_tokens_peak: u64,
    /// Largest rendered request, tokens.
    pub rendered_tokens_peak: u64,
    /// Raw input tokens summed over requests.
    pub raw_input_tokens_total: u64,
    /// Rendered input tokens summed over requests.
    pub rendered_input_tokens_total: u64,
    /// Rendered tokens that were a cached prefix, summed (nothing of a cold request: `cold_requests`).
    pub cached_prefix_tokens_total: u64,
    /// Raw tokens that were a cached prefix, summed (nothing of a cold request).
    pub raw_cached_prefix_tokens_total: u64,
    /// Rendered requests that broke the cache (a cold request breaks none: there is none).
    pub cache_breaks: u64,
    /// Raw requests that broke the cache (host compactions).
    pub raw_cache_breaks: u64,
    /// Cost of the raw requests.
    pub cost_units_raw: f64,
    /// Cost of the rendered requests.
    pub cost_units_rendered: f64,
    /// Tokens new to the raw requests: what each did not share with the one before it (as a prefix),
    /// summed. Unlike the uncached tokens, a cold cache (`cold_requests`) adds nothing to it: the
    /// tokens a request re-sends after the cache expired were not new.
    pub raw_new_tokens_total: u64,
    /// The floor: every token new to a raw request ([`Figures::raw_new_tokens_total`]) once, at the
    /// uncached price, and nothing for the prefix it holds again (even after the cache expired): what no
    /// context manager can go below without leaving something new out of the context.
    pub cost_units_floor: f64,
    /// Outputs rendered as summary stubs at the end.
    pub stubs: u64,
    /// Outputs spilled.
    pub spills: u64,
    /// Outputs aliased to an earlier identical one.
    pub dedups: u64,
    /// Chains compressed.
    pub chains: u64,
    /// Refs checked for recovery at the end.
    pub refs_checked: u64,
    /// Refs whose recovery was byte-exact.
    pub refs_recovered_exact: u64,
    /// Provider-validity violations over every rendered request.
    pub validity_errors: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Requests that came longer than the cache's lifetime after the one before ([`Prices::cache_ttl`],
    /// by the session's own timestamps): nothing of them was read from the cache, raw, host baseline and
    /// rendered alike.
    pub cold_requests: u64,
    /// Requests whose rendered context was over the hard budget (only with a window).
    pub over_budget_requests: u64,
    /// Requests before which no checkpoint could bring the context under budget.
    pub compaction_failures: u64,
    /// With a model switch: recoveries committed (seed 004).
    pub recoveries: u64,
    /// With a model switch: recovery attempts that failed closed.
    pub recoveries_blocked: u64,
    /// Why they failed closed, each reason once, in order.
    pub blocked_reasons: Vec<String>,
    /// Archive views committed.
    pub archives: u64,
    /// Needed facts over all requests (see [`crate::retention`]).
    pub facts_needed: u64,
    /// Needed facts that were in the rendered context of their request.
    pub facts_retained: u64,
    /// The host's own compaction at the simulated window (the baseline): input tokens summed over requests.
    /// Without a window the host never compacts beyond what the recorded session did: the raw figures.
    pub host_input_tokens_total: u64,
    /// The host baseline's cached-prefix tokens, summed.
    pub host_cached_prefix_tokens_total: u64,
    /// Input tokens of the host's own summarization calls (each compaction sends what it summarizes).
    pub host_summary_input_tokens_total: u64,
    /// Largest host-baseline request, tokens.
    pub host_tokens_peak: u64,
    /// Host-baseline requests that broke the cache.
    pub host_cache_breaks: u64,
    /// Compactions the host baseline ran.
    pub host_compactions: u64,
    /// Cost of the host baseline's requests and summarization calls.
    pub cost_units_host: f64,
    /// What the decisions cost and saved, taken together (see [`crate::accounts`]).
    pub accounts: Totals,
    /// Each request, in order (for plots and price estimates).
    pub series: Vec<Point>,
}

/// One request of a replay: tokens and cached-prefix tokens of the raw, host-baseline and rendered
/// requests, and what happened before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Raw request, tokens.
    pub raw: u64,
    /// Of which a cached prefix.
    pub raw_cached: u64,
    /// Of which new: not shared, as a prefix, with the request before (the floor's; a cold cache adds
    /// nothing to it).
    pub raw_new: u64,
    /// Host-baseline request, tokens.
    pub host: u64,
    /// Of which a cached prefix.
    pub host_cached: u64,
    /// Input of a host summarization call made before this request (0 without a compaction).
    pub host_summarizing: u64,
    /// Rendered request, tokens.
    pub rendered: u64,
    /// Of which a cached prefix.
    pub rendered_cached: u64,
    /// The rendered request broke the cache.
    pub broke: bool,
    /// condense committed a checkpoint before this request.
    pub checkpoint: bool,
}

impl Point {
    /// The host baseline compacted before this request.
    pub fn host_compacted(&self) -> bool {
        self.host_summarizing > 0
    }
}

/// List prices of a model, US dollars per million tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPrice {
    /// The model's name, as `--price` takes it.
    pub model: String,
    /// An input token that is neither read from nor written to the cache.
    pub input: f64,
    /// An input token read from the cache.
    pub cached_read: f64,
    /// An input token written to the cache (the provider's input price where writes cost nothing extra).
    pub cache_write: f64,
}

/// The embedded price table (providers' published list prices per million input tokens; Anthropic's
/// cache writes at the 5-minute rate). A configuration's `listPrices` adds or replaces entries.
pub const PRICE_TABLE: [(&str, f64, f64, f64); 10] = [
    ("claude-opus-4-5", 5.0, 0.50, 6.25),
    ("claude-opus-4-1", 15.0, 1.50, 18.75),
    ("claude-sonnet-4-5", 3.0, 0.30, 3.75),
    ("claude-haiku-4-5", 1.0, 0.10, 1.25),
    ("gpt-5", 1.25, 0.125, 1.25),
    ("gpt-5-mini", 0.25, 0.025, 0.25),
    ("gpt-5-nano", 0.05, 0.005, 0.05),
    ("gpt-4.1", 2.0, 0.50, 2.0),
    ("gemini-2.5-pro", 1.25, 0.125, 1.25),
    ("gemini-2.5-flash", 0.30, 0.03, 0.30),
];

/// The model `simulate` prices with when none is chosen.
pub const DEFAULT_PRICE_MODEL: &str = "claude-sonnet-4-5";

/// The embedded price table as [`ListPrice`]s.
pub fn price_table() -> Vec<ListPrice> {
    PRICE_TABLE.iter().map(|&(model, input, cached_read, cache_write)| ListPrice { model: model.into(), input, cached_read, cache_write }).collect()
}

impl ListPrice {
    /// Dollars for `total` input tokens of which `cached` were a cached prefix (the rest written to the
    /// cache), plus `plain` tokens sent without caching.
    pub fn dollars(&self, total: u64, cached: u64, plain: u64) -> f64 {
        (cached as f64 * self.cached_read + total.saturating_sub(cached) as f64 * self.cache_write + plain as f64 * self.input) / 1e6
    }

    /// Dollars of the floor: `new` tokens (those no request read from the cache) once, at the cache-write
    /// price, the price every uncached token of a request pays here.
    pub fn floor_dollars(&self, new: u64) -> f64 {
        new as f64 * self.cache_write / 1e6
    }

    /// Dollars for the raw, host-baseline and rendered requests of a replay.
    pub fn of(&self, f: &Figures) -> (f64, f64, f64) {
        (
            self.dollars(f.raw_input_tokens_total, f.raw_cached_prefix_tokens_total, 0),
            self.dollars(f.host_input_tokens_total, f.host_cached_prefix_tokens_total, f.host_summary_input_tokens_total),
            self.dollars(f.rendered_input_tokens_total, f.cached_prefix_tokens_total, 0),
        )
    }
}

impl Figures {
    /// Rendered over raw input tokens.
    pub fn token_ratio(&self) -> f64 {
        ratio(self.rendered_input_tokens_total as f64, self.raw_input_tokens_total as f64)
    }

    /// Rendered over raw cost.
    pub fn cost_ratio(&self) -> f64 {
        ratio(self.cost_units_rendered, self.cost_units_raw)
    }

    /// Tokens new to the raw requests, the floor's tokens ([`Figures::raw_new_tokens_total`]).
    pub fn raw_new_tokens(&self) -> u64 {
        self.raw_new_tokens_total
    }

    /// The floor over raw cost ([`Figures::cost_units_floor`]).
    pub fn floor_cost_ratio(&self) -> f64 {
        ratio(self.cost_units_floor, self.cost_units_raw)
    }

    /// Rendered over host-baseline input tokens.
    pub fn host_token_ratio(&self) -> f64 {
        ratio(self.rendered_input_tokens_total as f64, self.host_input_tokens_total as f64)
    }

    /// Rendered over host-baseline cost.
    pub fn host_cost_ratio(&self) -> f64 {
        ratio(self.cost_units_rendered, self.cost_units_host)
    }

    /// Takes a reason a recovery was blocked for, once.
    fn blocked(&mut self, why: &str) {
        if !self.blocked_reasons.iter().any(|r| r == why) {
            self.blocked_reasons.push(why.to_string());
        }
    }

    /// Retained over needed facts (1.0 when no request needed any).
    pub fn retention(&self) -> f64 {
        ratio(self.facts_retained as f64, self.facts_needed as f64)
    }

    /// Adds another session's figures (peaks take the maximum).
    pub fn add(&mut self, o: &Figures) {
        self.turns += o.turns;
        self.tool_calls += o.tool_calls;
        self.raw_tokens_peak = self.raw_tokens_peak.max(o.raw_tokens_peak);
        self.rendered_tokens_peak = self.rendered_tokens_peak.max(o.rendered_tokens_peak);
        self.raw_input_tokens_total += o.raw_input_tokens_total;
        self.rendered_input_tokens_total += o.rendered_input_tokens_total;
        self.cached_prefix_tokens_total += o.cached_prefix_tokens_total;
        self.raw_cached_prefix_tokens_total += o.raw_cached_prefix_tokens_total;
        self.cache_breaks += o.cache_breaks;
        self.raw_cache_breaks += o.raw_cache_breaks;
        self.cost_units_raw += o.cost_units_raw;
        self.cost_units_rendered += o.cost_units_rendered;
        self.cost_units_floor += o.cost_units_floor;
        self.raw_new_tokens_total += o.raw_new_tokens_total;
        self.stubs += o.stubs;
        self.spills += o.spills;
        self.dedups += o.dedups;
        self.chains += o.chains;
        self.refs_checked += o.refs_checked;
        self.refs_recovered_exact += o.refs_recovered_exact;
        self.validity_errors += o.validity_errors;
        self.checkpoints += o.checkpoints;
        self.cold_requests += o.cold_requests;
        self.over_budget_requests += o.over_budget_requests;
        self.compaction_failures += o.compaction_failures;
        self.recoveries += o.recoveries;
        self.recoveries_blocked += o.recoveries_blocked;
        for r in &o.blocked_reasons {
            self.blocked(r);
        }
        self.archives += o.archives;
        self.facts_needed += o.facts_needed;
        self.facts_retained += o.facts_retained;
        self.host_input_tokens_total += o.host_input_tokens_total;
        self.host_cached_prefix_tokens_total += o.host_cached_prefix_tokens_total;
        self.host_summary_input_tokens_total += o.host_summary_input_tokens_total;
        self.host_tokens_peak = self.host_tokens_peak.max(o.host_tokens_peak);
        self.host_cache_breaks += o.host_cache_breaks;
        self.host_compactions += o.host_compactions;
        self.cost_units_host += o.cost_units_host;
        self.accounts.add(&o.accounts);
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { 1.0 } else { a / b }
}

/// The contexts of the rendered requests as `retention` searches them, kept from one request to the next.
#[derive(Default)]
struct Hay {
    /// The last context's text, and where each of its messages' text starts.
    text: String,
    at: Vec<usize>,
    /// Requests taken in so far.
    requests: u64,
    /// The text kept from one request to the next, as suffix minima: `(request, kept)` with both
    /// increasing, so the text prefix unchanged since request `r` is the `kept` of the first entry after `r`.
    kept: Vec<(u64, usize)>,
    /// Each fact searched: the request it was searched at, and where it was first found (`Ok`) or the text
    /// length it was absent from (`Err`). A later search starts where the unchanged prefix ends.
    searches: HashMap<String, (u64, std::result::Result<usize, usize>)>,
}

impl Hay {
    /// Takes in a request's context: the first `same` messages of the last request's (as
    /// [`Meter::request`] found them), then `new`.
    fn request(&mut self, same: usize, new: &[Arc<Message>]) {
        let keep = self.at.get(same).copied().unwrap_or(self.text.len());
        self.text.truncate(keep);
        self.at.truncate(same);
        self.requests += 1;
        while self.kept.last().is_some_and(|&(_, k)| k >= keep) {
            self.kept.pop();
        }
        self.kept.push((self.requests, keep));
        for m in new {
            self.at.push(self.text.len());
            self.text.push_str(&crate::retention::shown_text(m));
        }
    }

    /// How many of `needed` the last request's context holds (see [`crate::retention::retained`]). A fact
    /// searched before is looked for only past the text prefix that has not changed since.
    fn retained(&mut self, needed: &[String]) -> u64 {
        let mut n = 0;
        for f in needed {
            let len = f.len();
            let searched = self.searches.get(f.as_str()).map(|&(at, result)| {
                // The text prefix unchanged since request `at`.
                let i = self.kept.partition_point(|&(r, _)| r <= at);
                let same = self.kept.get(i).map_or(usize::MAX, |&(_, k)| k);
                match result {
                    Ok(p) if p + len <= same => Ok(p),
                    Ok(p) => Err((p + len - 1).min(same)),
                    Err(absent) => Err(absent.min(same)),
                }
            });
            let hay = self.text.as_bytes();
            let result = match searched {
                Some(Ok(p)) => Ok(p),
                Some(Err(absent)) => {
                    let from = absent.saturating_sub(len.saturating_sub(1)).min(hay.len());
                    memchr::memmem::find(&hay[from..], f.as_bytes()).map(|p| from + p).ok_or(hay.len())
                }
                None => memchr::memmem::find(hay, f.as_bytes()).ok_or(hay.len()),
            };
            n += u64::from(result.is_ok());
            match self.searches.get_mut(f.as_str()) {
                Some(entry) => *entry = (self.requests, result),
                None => drop(self.searches.insert(f.clone(), (self.requests, result))),
            }
        }
        n
    }
}

/// Work the retention thread may have queued before the replay waits for it (a request's context is a
/// list of shared messages, so a full queue holds little).
const RETENTION_QUEUE: usize = 256;

/// What the retention thread is given, in the session's order.
enum Retain {
    /// A user message or tool output of the session (what [`crate::retention::Seen`] takes in).
    Message(Arc<Message>),
    /// A rendered request: how many of its messages the request before it had (as [`Meter::request`]
    /// found them), the messages after those, and the assistant message that answered it. Only what is
    /// new: the render itself stays the session's alone, which extends it in place for the next request.
    Request { same: usize, new: Vec<Arc<Message>>, answer: Arc<Message> },
}

/// The retention thread: the needed facts of each request's answer and how many of them its context held,
/// summed over the replay (`(needed, retained)`).
fn retention(work: &crossbeam_channel::Receiver<Retain>) -> (u64, u64) {
    let (mut seen, mut hay) = (crate::retention::Seen::default(), Hay::default());
    let (mut needed, mut retained) = (0, 0);
    for w in work {
        match w {
            Retain::Message(m) => seen.add(&m),
            Retain::Request { same, new, answer } => {
                hay.request(same, &new);
                let facts = seen.needed(&answer);
                needed += facts.len() as u64;
                retained += hay.retained(&facts);
            }
        }
    }
    (needed, retained)
}

/// A session's timestamp (RFC 3339, as pi, Claude Code and Codex write them) as seconds since the Unix
/// epoch; `None` for one that is not of that form (the request then has no time).
fn host_time(timestamp: &str) -> Option<f64> {
    let t = time::OffsetDateTime::parse(timestamp, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp_nanos() as f64 / 1e9)
}

/// Whether a request at `now` finds the cache cold: it came more than `ttl` seconds after the last request
/// with a time (`last`). A request without a time, or the first with one, is not.
fn cold(ttl: Option<u64>, last: Option<f64>, now: Option<f64>) -> bool {
    matches!((ttl, last, now), (Some(ttl), Some(a), Some(b)) if b - a > ttl as f64)
}

/// pi's native compaction, the host baseline of `simulate --window`: its reserve for the reply.
pub const HOST_RESERVE_TOKENS: u64 = 16_384;
/// The recent tokens pi's compaction keeps verbatim.
pub const HOST_KEEP_RECENT_TOKENS: u64 = 20_000;
/// The size taken for a host summary (pi's is a model's structured summary of what it cut; a summary is
/// never longer than what it summarizes).
pub const HOST_SUMMARY_TOKENS: u64 = 2_000;

/// The host baseline: the raw requests as pi's own compaction would shape them at a window. When a
/// request's context is over the window less [`HOST_RESERVE_TOKENS`], the messages before a cut point are
/// replaced by one summary, keeping at least [`HOST_KEEP_RECENT_TOKENS`] of the newest; the cut is at a
/// user or assistant message (never between a call and its result). Later requests are the summary plus
/// the raw messages from the cut on, until the next compaction.
#[derive(Default)]
struct Host {
    /// Compact above this many tokens (`None`: never, the host is the raw session).
    threshold: Option<u64>,
    /// Tokens of the current summary (0: none yet).
    summary: u64,
    /// The first raw message kept after the summary, and where it was last seen.
    first_kept: Option<Arc<Message>>,
    start: usize,
    started: bool,
}

/// One host-baseline request.
struct HostRequest {
    total: u64,
    cached: u64,
    broke: bool,
    /// Input of the summarization call made before it (0: no compaction).
    summarizing: u64,
}

impl Host {
    fn at_window(window: Option<u64>) -> Host {
        Host { threshold: window.map(|w| w.saturating_sub(HOST_RESERVE_TOKENS)), ..Host::default() }
    }

    /// The host's request for the raw request `msgs` (whose token prefix sums are `sums`, cached prefix
    /// `raw_cached`, cache break `raw_broke`, as the raw meter counted them).
    fn request(&mut self, msgs: &[Arc<Message>], sums: &[u64], raw_cached: u64, raw_broke: bool) -> HostRequest {
        if let Some(kept) = &self.first_kept
            && !msgs.get(self.start).is_some_and(|m| Arc::ptr_eq(m, kept))
        {
            match msgs.iter().position(|m| Arc::ptr_eq(m, kept)) {
                Some(i) => self.start = i,
                // The recorded session left this branch or compacted on its own: start again from it.
                None => (self.first_kept, self.start, self.summary) = (None, 0, 0),
            }
        }
        let raw_total = sums.last().copied().unwrap_or(0);
        let before = sums[self.start];
        let mut r = HostRequest {
            total: self.summary + raw_total - before,
            cached: if raw_cached >= before { self.summary + raw_cached - before } else { 0 },
            broke: raw_broke,
            summarizing: 0,
        };
        if self.threshold.is_some_and(|t| r.total > t) {
            // The newest cut keeping at least the recent tokens, moved back to a user or assistant message.
            let limit = raw_total.saturating_sub(HOST_KEEP_RECENT_TOKENS);
            let mut cut = sums.partition_point(|&s| s <= limit).saturating_sub(1).min(msgs.len().saturating_sub(1));
            while cut > self.start && matches!(*msgs[cut], Message::ToolResult { .. }) {
                cut -= 1;
            }
            if cut > self.start {
                r.summarizing = self.summary + sums[cut] - before;
                self.summary = HOST_SUMMARY_TOKENS.min(r.summarizing);
                self.start = cut;
                self.first_kept = Some(msgs[cut].clone());
                r.total = self.summary + raw_total - sums[cut];
                r.cached = 0;
                r.broke = self.started;
            }
        }
        self.started = true;
        r
    }
}

/// Replays `events` (a session's source events) into a new session `name` of `store` with `config`,
/// preparing a request before each assistant message, and measures both the raw and the rendered
/// requests.
pub fn replay(store: &Store, name: &str, events: impl IntoIterator<Item = SourceEvent>, config: PruneConfig, prices: Prices) -> Result<Figures> {
    replay_with(store, name, events, config, prices, None, None)
}

/// Events handed from the reading thread to the replay at a time.
const READ_CHUNK: usize = 256;

/// A session file read on a thread of its own: its events come out (as an iterator) while the rest of
/// the file is still being parsed, so a replay runs beside the parse instead of after it. The events are
/// those [`condense_formats::import_file`] gives: a line-format file is streamed
/// ([`condense_formats::import_stream`]), any other is read whole.
pub struct Reading {
    chunks: crossbeam_channel::Receiver<std::result::Result<Vec<SourceEvent>, condense_formats::FormatError>>,
    current: std::vec::IntoIter<SourceEvent>,
    failed: Option<condense_formats::FormatError>,
    path: std::path::PathBuf,
    thread: std::thread::JoinHandle<()>,
}

impl Reading {
    /// Starts reading `path`. Fails as [`condense_formats::import_file`] does when the file cannot be read
    /// or is of no known format, before any event.
    pub fn start(path: &std::path::Path) -> std::result::Result<Reading, condense_formats::FormatError> {
        let (tx, chunks) = crossbeam_channel::bounded(16);
        let owned = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("condense-read".into())
            .spawn(move || read_events(&owned, &tx))
            .map_err(|source| condense_formats::FormatError::Io { path: path.to_path_buf(), source })?;
        // The first chunk, or why there is none: a file that fails before its first event fails here.
        let current = match chunks.recv() {
            Ok(Ok(first)) => first.into_iter(),
            Ok(Err(e)) => return Err(e),
            Err(_) => Vec::new().into_iter(),
        };
        Ok(Reading { chunks, current, failed: None, path: path.to_path_buf(), thread })
    }

    /// Why the file stopped being read before its end, once every event is taken (`None`: it was read
    /// whole). The events taken before a failure are not the session's.
    pub fn finish(mut self) -> Option<condense_formats::FormatError> {
        self.by_ref().for_each(drop);
        let panicked = self.thread.join().is_err();
        let path = self.path;
        self.failed.or_else(|| panicked.then(|| condense_formats::FormatError::Unrecognized { path, reason: "the importer panicked".into() }))
    }
}

impl Iterator for Reading {
    type Item = SourceEvent;

    fn next(&mut self) -> Option<SourceEvent> {
        loop {
            if let Some(e) = self.current.next() {
                return Some(e);
            }
            match self.chunks.recv() {
                Ok(Ok(chunk)) => self.current = chunk.into_iter(),
                Ok(Err(e)) => {
                    self.failed = Some(e);
                    return None;
                }
                Err(_) => return None,
            }
        }
    }
}

/// The reading thread of [`Reading`]: `path`'s events in chunks, then its failure if it fails. It stops
/// handing over when the replay is gone.
fn read_events(path: &std::path::Path, tx: &crossbeam_channel::Sender<std::result::Result<Vec<SourceEvent>, condense_formats::FormatError>>) {
    let io = |source| condense_formats::FormatError::Io { path: path.to_path_buf(), source };
    let streamed = std::fs::File::open(path).map_err(io).and_then(|file| {
        let mut chunk = Vec::with_capacity(READ_CHUNK);
        let mut open = true;
        let read = condense_formats::import_stream(&path.display().to_string(), std::io::BufReader::with_capacity(1 << 20, file), &mut |e| {
            chunk.push(e);
            if open && chunk.len() == READ_CHUNK {
                open = tx.send(Ok(std::mem::replace(&mut chunk, Vec::with_capacity(READ_CHUNK)))).is_ok();
            }
        })
        .map_err(io)?;
        if open && !chunk.is_empty() {
            drop(tx.send(Ok(chunk)));
        }
        Ok(read.is_some())
    });
    let whole = match streamed {
        Ok(true) => return,
        // Not a line format: read whole.
        Ok(false) => condense_formats::import_file(path).map(|i| i.events),
        Err(e) => Err(e),
    };
    drop(tx.send(whole));
}

/// A model switch in a replay: from request `at` (1-based) on, the model has a window of `window` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    /// The new model's window, in tokens.
    pub window: u64,
    /// The request the switch happens before (1-based).
    pub at: u64,
}

/// The model a switch moves to (what the replayed replies after it are taken to be written by).
pub const SWITCHED_MODEL: &str = "switched";

/// The model of a simulated window (what the replayed replies are taken to be written by until a switch).
pub const SIMULATED_MODEL: &str = "simulated";

/// [`replay`] as if the model had a context window of `window` tokens (the session's own model changes
/// are replaced by one with that window, and the checkpoint controller runs before each request), and
/// with an optional model switch (`condense simulate --switch WINDOW@REQUEST`): before request `at` the
/// model changes to one with the switch's window; from then on the session's own model changes are left
/// out and its replies count as the new model's, so the payload guard and smaller-model recovery (seed
/// 004) run as they would live. Recoveries, blocked recoveries (with their reasons) and archives are
/// counted.
pub fn replay_with(
    store: &Store,
    name: &str,
    events: impl IntoIterator<Item = SourceEvent>,
    config: PruneConfig,
    prices: Prices,
    window: Option<u64>,
    switch: Option<Switch>,
) -> Result<Figures> {
    let session = store.create_session(name)?;
    session.configure(config)?;
    if let Some(w) = window {
        session.append(vec![SourceEvent::ModelChanged { provider: None, model: SIMULATED_MODEL.into(), context_window: Some(w), max_output: None }])?;
    }
    // Usage recorded in a session describes the original host's requests, not the pruned ones replayed
    // here: it must not anchor the controller's estimate. At a simulated window, the session's own model
    // changes are left out.
    let events = events
        .into_iter()
        .filter(|e| !matches!(e, SourceEvent::ProviderUsage(_)) && !(window.is_some() && matches!(e, SourceEvent::ModelChanged { .. })));
    let mut budget = window.map(|w| condense_checkpoint::Budget::of_model(w, None));
    let mut raw = Projection::new();
    let mut raw_meter = Meter::default();
    let mut host = Host::at_window(window);
    let mut checkpoints = 0;
    let model = session.model_summaries();
    let mut accounts = Accounts::new(prices, Models { stubs: model, handoffs: model }, 0);
    let mut f = Figures::default();
    let mut switched = false;
    // The session's clock: the time of the request about to be replayed, and of the last one that had a
    // time (`SourceEvent::HostTime`).
    let (mut now, mut last) = (None, None);
    // Retention is measured on a thread of its own, given the session's messages and the rendered
    // requests in order: its figures are the same as measured in line, and the replay does not wait on it.
    let (to_retention, work) = crossbeam_channel::bounded(RETENTION_QUEUE);
    let retention = std::thread::Builder::new()
        .name("condense-retention".into())
        .spawn(move || retention(&work))
        .map_err(|e| crate::EngineError::Pipeline { name: name.to_string(), reason: format!("cannot start the retention thread: {e}") })?;
    let gone = || crate::EngineError::Pipeline { name: name.to_string(), reason: "the retention thread stopped".into() };
    for (i, ev) in events.into_iter().enumerate() {
        if let SourceEvent::HostTime { timestamp } = &ev {
            now = host_time(timestamp);
        }
        let is_request = matches!(&ev, SourceEvent::EntryAppended { entry: Entry::Message(Message::Assistant { .. }), .. });
        if let Some(sw) = switch.filter(|sw| is_request && !switched && f.turns + 1 >= sw.at) {
            session.append(vec![SourceEvent::ModelChanged { provider: None, model: SWITCHED_MODEL.into(), context_window: Some(sw.window), max_output: None }])?;
            budget = Some(condense_checkpoint::Budget::of_model(sw.window, None));
            switched = true;
        }
        // After the switch the session's own model changes are left out and its replies are the new model's;
        // before it, at a simulated window, the window's model's: written by another model, they would keep
        // the session in the transition the window's model change opens, where every overflow is a
        // recovery (seed 004) rather than a checkpoint (seed 001).
        let replies_by = if switched { Some(SWITCHED_MODEL) } else { window.map(|_| SIMULATED_MODEL) };
        let ev = match ev {
            SourceEvent::ModelChanged { .. } if switched => continue,
            SourceEvent::EntryAppended { id, parent, entry: Entry::Message(Message::Assistant { content, stop, usage, .. }) } if replies_by.is_some() => {
                SourceEvent::EntryAppended { id, parent, entry: Entry::Message(Message::Assistant { content, model: replies_by.map(str::to_string), stop, usage }) }
            }
            ev => ev,
        };
        if is_request {
            // The raw projection renders once per request, so what it kept since its last render is what
            // the raw meter holds.
            let (r, kept) = raw.render_since();
            let (raw_total, raw_cached, raw_broke) = raw_meter.request_after(&r.messages, kept, |m| condense_tokens::estimate(m));
            let h = host.request(&r.messages, &raw_meter.sums, raw_cached, raw_broke);
            drop(r);
            // The budget the engine itself holds the request to (the reserve yielding to a large fixed
            // context, docs/checkpoints.md), read with the prepared context, else the window's.
            // After a gap longer than the cache's lifetime the provider has nothing cached: every side
            // pays the whole request, and the prunes condense has pending go ahead (they cost no cache).
            let cold = cold(prices.cache_ttl, last, now);
            if now.is_some() {
                last = now.take();
            }
            let prepared = session.with_cold_cache(cold, || {
                session.prepare_then(|p, r| (r.clone(), p.index().checkpoints.len(), crate::controller::budget_of(p), session.account(&mut accounts, p, &r.messages, cold)))
            });
            let (rendered, committed, engine_budget, metered) = match prepared {
                Ok(r) => r,
                Err(crate::EngineError::CompactionFailed { .. }) => {
                    f.compaction_failures += 1;
                    let rendered = session.render()?;
                    let (budget, metered) = session.with_projection(|p| (crate::controller::budget_of(p), session.account(&mut accounts, p, &rendered.messages, cold)))?;
                    (rendered, checkpoints, budget, metered)
                }
                Err(e) => return Err(e),
            };
            let (total, cached, broke) = metered?;
            // (The prefixes are still compared, for the next request and the cache breaks.)
            let raw_new = raw_total.saturating_sub(raw_cached);
            // A rewrite on a cold request breaks no cache: there was none.
            let (raw_cached, cached, h, broke, raw_broke) =
                if cold { (0, 0, HostRequest { cached: 0, broke: false, ..h }, false, false) } else { (raw_cached, cached, h, broke, raw_broke) };
            f.cold_requests += u64::from(cold);
            if let SourceEvent::EntryAppended { entry: Entry::Message(answer), .. } = &ev {
                let same = accounts.meter().same;
                let request = Retain::Request { same, new: rendered.messages[same..].to_vec(), answer: Arc::new(answer.clone()) };
                to_retention.send(request).map_err(|_| gone())?;
            }
            let violations = accounts.meter_mut().violations(&rendered.messages[..]);
            debug_assert_eq!(violations, check(&rendered.messages[..]).len());
            f.validity_errors += violations as u64;
            if engine_budget.or(budget).is_some_and(|b| total > b.hard) {
                f.over_budget_requests += 1;
            }
            drop(rendered);
            f.turns += 1;
            f.raw_tokens_peak = f.raw_tokens_peak.max(raw_total);
            f.rendered_tokens_peak = f.rendered_tokens_peak.max(total);
            f.raw_input_tokens_total += raw_total;
            f.rendered_input_tokens_total += total;
            f.cached_prefix_tokens_total += cached;
            f.raw_cached_prefix_tokens_total += raw_cached;
            f.cache_breaks += u64::from(broke);
            f.raw_cache_breaks += u64::from(raw_broke);
            f.cost_units_raw += prices.units(raw_total, raw_cached, 0);
            f.cost_units_rendered += prices.units(total, cached, 0);
            f.cost_units_floor += prices.units(raw_new, 0, 0);
            f.raw_new_tokens_total += raw_new;
            f.host_input_tokens_total += h.total;
            f.host_cached_prefix_tokens_total += h.cached;
            f.host_summary_input_tokens_total += h.summarizing;
            f.host_tokens_peak = f.host_tokens_peak.max(h.total);
            f.host_cache_breaks += u64::from(h.broke);
            f.host_compactions += u64::from(h.summarizing > 0);
            f.cost_units_host += prices.units(h.total, h.cached, h.summarizing);
            f.series.push(Point {
                raw: raw_total,
                raw_cached,
                raw_new,
                host: h.total,
                host_cached: h.cached,
                host_summarizing: h.summarizing,
                rendered: total,
                rendered_cached: cached,
                broke,
                checkpoint: committed > checkpoints,
            });
            checkpoints = committed;
        }
        // A message goes into the raw projection as the session's projection holds it: one copy for both.
        let shared = match &ev {
            SourceEvent::EntryAppended { id, parent, entry: Entry::Message(_) } => Some((id.clone(), parent.clone())),
            _ => {
                raw.apply(i as u64 + 1, &Event::Source(ev.clone()));
                None
            }
        };
        session.append(vec![ev])?;
        if let Some((id, parent)) = shared {
            let m = session
                .with_projection(|p| p.entry_message(&id).cloned())?
                .ok_or_else(|| crate::EngineError::Pipeline { name: name.to_string(), reason: format!("entry {id} was appended and is not in the projection") })?;
            if !matches!(*m, Message::Assistant { .. }) {
                to_retention.send(Retain::Message(m.clone())).map_err(|_| gone())?;
            }
            raw.push_message(i as u64 + 1, id, parent.as_deref(), m);
        }
    }
    drop(to_retention);
    (f.facts_needed, f.facts_retained) = retention.join().map_err(|_| gone())?;
    f.accounts = accounts.totals();
    let proj = session.projection()?;
    let idx = proj.index();
    f.tool_calls = proj.branch_messages().iter().map(|m| m.tool_calls().count() as u64).sum();
    f.stubs = idx.summaries.len() as u64;
    f.spills = idx.spills.len() as u64;
    f.dedups = idx.aliases.len() as u64;
    f.chains = idx.chains.len() as u64;
    f.checkpoints = idx.checkpoints.len() as u64;
    f.archives = idx.archives.len() as u64;
    f.recoveries = idx.recovery_notes.iter().filter(|n| n.starts_with(crate::recover::DIAG_PREPARED)).count() as u64;
    for (_, why) in idx.checkpoint_failures.iter().filter(|(code, _)| code == crate::recover::RECOVERY_BLOCKED) {
        f.recoveries_blocked += 1;
        f.blocked(why);
    }
    for (r, rec) in idx.records.iter() {
        f.refs_checked += 1;
        let original = proj.entry_message(&rec.entry).map(|m| output_text(m)).unwrap_or_default();
        let answer = session.query(&[format!("t{r}")])?;
        if !answer.is_error && answer.originals.len() == 1 && answer.originals[0].1 == original {
            f.refs_recovered_exact += 1;
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_tokens::estimate;
    use condense_events::UserOrigin;

    /// The host baseline compacts as pi does: over the window less the reserve, it summarizes what lies
    /// before a cut keeping at least the recent tokens, cuts at a user or assistant message, breaks the cache
    /// once, and otherwise grows with the raw requests (their cached prefix included).
    #[test]
    fn the_host_baseline_compacts_as_pi_does() {
        // Each message of 4,000 chars is 1,000 tokens; a call's result follows each assistant message.
        let text = |c: char| c.to_string().repeat(4_000);
        let user = Arc::new(Message::user_text(text('u'), UserOrigin::Prompt));
        let mut msgs = vec![user];
        let mut host = Host::at_window(Some(HOST_RESERVE_TOKENS + 30_000));
        let mut meter = Meter::default();
        let mut seen = Vec::new();
        for i in 0..40 {
            let m = if i % 2 == 0 {
                Message::Assistant { content: vec![condense_events::Block::Text { text: text('a') }], model: None, stop: None, usage: None }
            } else {
                Message::ToolResult { call_id: format!("c{i}"), tool_name: "read".into(), content: vec![condense_events::Block::Text { text: text('r') }], is_error: false }
            };
            msgs.push(Arc::new(m));
            let (raw, raw_cached, raw_broke) = meter.request(&msgs);
            let r = host.request(&msgs, &meter.sums, raw_cached, raw_broke);
            seen.push((raw, r.total, r.cached, r.broke, r.summarizing));
        }
        // Up to 30,000 tokens the host is the raw session.
        assert_eq!(seen[0], (2_000, 2_000, 0, false, 0));
        assert!(seen[1..].iter().take_while(|s| s.0 <= 30_000).all(|s| s.1 == s.0 && s.2 == s.0 - 1_000 && !s.3 && s.4 == 0));
        let compactions: Vec<usize> = seen.iter().enumerate().filter(|(_, s)| s.4 > 0).map(|(i, _)| i).collect();
        assert!(!compactions.is_empty());
        let first = compactions[0];
        // The first request over 30,000 tokens compacts: everything before the cut is summarized (2,000
        // tokens at most), at least 20,000 recent tokens stay, the request is uncached and breaks the cache.
        assert_eq!(seen[first].0, 31_000);
        let (_, total, cached, broke, summarizing) = seen[first];
        assert!(broke && cached == 0);
        assert!(total >= HOST_SUMMARY_TOKENS + HOST_KEEP_RECENT_TOKENS && total <= 31_000 - summarizing + HOST_SUMMARY_TOKENS);
        assert!(matches!(*msgs[host_cut(&host, &msgs)], Message::Assistant { .. }));
        // The next request caches everything the compacted one sent.
        let next = seen[first + 1];
        assert_eq!((next.2, next.3, next.1), (total, false, total + 1_000));
        // A window with no limit is the raw session.
        let mut raw_host = Host::at_window(None);
        let r = raw_host.request(&msgs, &meter.sums, 0, false);
        assert_eq!((r.total, r.summarizing), (*meter.sums.last().unwrap(), 0));
    }

    fn host_cut(host: &Host, msgs: &[Arc<Message>]) -> usize {
        msgs.iter().position(|m| host.first_kept.as_ref().is_some_and(|k| Arc::ptr_eq(m, k))).unwrap()
    }

    /// The meter keeps only what changed between requests: its totals, cached prefixes and retained facts
    /// are those of counting each request from scratch.
    #[test]
    fn the_meter_counts_each_request_as_a_count_from_scratch_would() {
        let m = |t: &str| Arc::new(Message::user_text(t, UserOrigin::Prompt));
        let (a, b, c, d) = (m("read src/alpha_one.rs"), m("then 12345"), m("and src/beta_two.rs"), m("finally"));
        let requests: Vec<Vec<Arc<Message>>> = vec![
            vec![a.clone(), b.clone()],
            vec![a.clone(), b.clone(), c.clone()],
            vec![a.clone(), c.clone(), d.clone()],
            vec![a.clone()],
            vec![a.clone(), b.clone(), c.clone(), d.clone()],
        ];
        let needed = vec!["src/alpha_one.rs".to_string(), "12345".to_string(), "src/beta_two.rs".to_string()];
        let (mut meter, mut hay) = (Meter::default(), Hay::default());
        let mut prev: Vec<Arc<Message>> = Vec::new();
        for r in &requests {
            let (total, cached, broke) = meter.request(r);
            hay.request(meter.same, &r[meter.same..]);
            assert_eq!(total, r.iter().map(|m| estimate(m)).sum::<u64>());
            let same = r.iter().zip(&prev).take_while(|(x, y)| Arc::ptr_eq(x, y)).count();
            assert_eq!(cached, r[..same].iter().map(|m| estimate(m)).sum::<u64>());
            assert_eq!(broke, !prev.is_empty() && same < prev.len());
            assert_eq!(hay.retained(&needed), crate::retention::retained(&needed, r));
            prev = r.clone();
        }
    }

    /// Facts searched again after the context grew, was cut back and was rewritten are found exactly when
    /// a search of the whole context finds them: random requests that keep a random prefix of the last one,
    /// over messages that hold facts at their start, middle and end and across nothing else.
    #[test]
    fn a_fact_searched_again_is_found_as_a_whole_search_finds_it() {
        let pool: Vec<Arc<Message>> = (0..24)
            .map(|i| Arc::new(Message::user_text(format!("f{} middle text f{} and end f{}", i % 7, (i * 5) % 11, (i * 3) % 13), UserOrigin::Prompt)))
            .collect();
        let facts: Vec<String> = (0..14).map(|i| format!("f{i}")).chain(["middle text f1".to_string(), "end f1".to_string()]).collect();
        let (mut meter, mut hay) = (Meter::default(), Hay::default());
        let mut ctx: Vec<Arc<Message>> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut found, mut missed) = (0, 0);
        for _ in 0..3_000 {
            let keep = if next() % 4 == 0 { (next() as usize) % (ctx.len() + 1) } else { ctx.len() };
            ctx.truncate(keep);
            for _ in 0..next() % 3 {
                ctx.push(pool[(next() % pool.len() as u64) as usize].clone());
            }
            meter.request(&ctx);
            hay.request(meter.same, &ctx[meter.same..]);
            let needed: Vec<String> = (0..next() % 4).map(|_| facts[(next() % facts.len() as u64) as usize].clone()).collect();
            let whole = crate::retention::retained(&needed, &ctx);
            assert_eq!(hay.retained(&needed), whole, "{needed:?} in {} messages", ctx.len());
            found += whole;
            missed += needed.len() as u64 - whole;
        }
        assert!(found > 1_000 && missed > 500, "both outcomes are exercised: {found} found, {missed} missed");
    }
}
