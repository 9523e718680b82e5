//! Prompt caching as the providers bill it, simulated over the requests of one conversation (issue 34):
//! what share of each request's input a provider would have read from its prompt cache, and what the
//! request costs at cache prices.
//!
//! - **Anthropic** caches the prefix of a request up to each `cache_control` mark; a later request reads
//!   from the cache the longest such prefix that it begins with, byte for byte.
//! - **OpenAI** (Chat Completions and Responses) caches automatically: a request reads the longest prefix
//!   it shares with an earlier request, counted in whole list elements (OpenAI caches in blocks, not
//!   bytes).
//!
//! A request is measured in the bytes of its input, in a canonical form, in the order the provider
//! caches it: Anthropic's tools, system prompt, then every message's role and blocks (a string content
//! read as the one text block it stands for); OpenAI's instructions, tools, then every list element.
//! Each is compact JSON with its `cache_control` marks taken off (a mark moving is not a change of
//! input). The
//! cost unit is the issue's: 0.1 per byte read from the cache, 1.25 per byte not read from it (a cache
//! write costs 1.25 times an input byte at Anthropic). Time-to-live and minimum cacheable lengths are
//! not modelled.

use condense_formats::wire::Api;
use serde_json::Value;
use std::hash::Hasher;

/// Cost of a byte read from the cache.
pub const CACHED_BYTE: f64 = 0.1;
/// Cost of a byte not read from the cache.
pub const UNCACHED_BYTE: f64 = 1.25;

/// How many earlier prefixes (Anthropic) or requests (OpenAI) a simulation remembers.
const REMEMBERED: usize = 64;
/// How many earlier requests a live conversation's simulation remembers (OpenAI keeps a hash per
/// element of each: a conversation of many messages keeps few of them).
const LIVE_REMEMBERED: usize = 4;

/// Bytes of input and how many of them were read from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Billed {
    /// Input bytes, canonical form.
    pub bytes: u64,
    /// Of those, bytes read from the cache.
    pub cached: u64,
}

impl Billed {
    /// Cost at cache prices ([`CACHED_BYTE`], [`UNCACHED_BYTE`]).
    pub fn cost(&self) -> f64 {
        CACHED_BYTE * self.cached as f64 + UNCACHED_BYTE * (self.bytes - self.cached) as f64
    }

    /// The floor of what these requests could cost: every byte they did not read from the cache (each new
    /// to the provider) once at the uncached price, nothing for what they read again. Of the requests as
    /// the client sent them, it is what no context manager goes below without leaving something new out.
    pub fn floor(&self) -> f64 {
        UNCACHED_BYTE * (self.bytes - self.cached) as f64
    }

    /// Share of the bytes read from the cache (0 when there were none).
    pub fn hit(&self) -> f64 {
        if self.bytes == 0 {
            0.0
        } else {
            self.cached as f64 / self.bytes as f64
        }
    }

    /// This and `other` summed.
    pub fn plus(self, other: Billed) -> Billed {
        Billed { bytes: self.bytes + other.bytes, cached: self.cached + other.cached }
    }
}

/// The prompt cache of one conversation at one provider. It keeps hashes of prefixes, never the input:
/// a prefix is recognised by the hash of the canonical input up to an element's end.
#[derive(Debug, Clone)]
pub struct CacheSim {
    api: Api,
    /// Anthropic: prefixes written to the cache, as (length, hash).
    prefixes: Vec<(usize, u64)>,
    /// OpenAI: the (length, hash) of every element end of earlier requests.
    earlier: Vec<Vec<(usize, u64)>>,
    remembered: usize,
    /// Every request billed so far, summed.
    pub total: Billed,
}

/// The hash of `input` up to each of `ends` (increasing offsets), computed in one pass.
fn running_hashes(input: &[u8], ends: &[(usize, bool)]) -> Vec<(usize, u64)> {
    let mut h = rustc_hash::FxHasher::default();
    let mut from = 0;
    ends.iter()
        .map(|&(end, _)| {
            h.write(&input[from..end]);
            from = end;
            (end, h.finish())
        })
        .collect()
}

/// Removes every `cache_control` key in `v`; whether there was one.
pub(crate) fn strip(v: &mut Value) -> bool {
    match v {
        Value::Object(o) => {
            let mut found = o.remove("cache_control").is_some();
            for x in o.values_mut() {
                found |= strip(x);
            }
            found
        }
        Value::Array(a) => a.iter_mut().fold(false, |f, x| strip(x) | f),
        _ => false,
    }
}

/// The block Anthropic reads a string content (or system prompt) as: the two forms are the same input.
pub(crate) fn text_block(text: &str) -> Value {
    serde_json::json!({"type": "text", "text": text})
}

/// A request body's canonical input, and where each element ends, with whether a cache mark was on it
/// (a marked element's end ends a prefix the provider caches).
pub fn canonical(api: Api, body: &Value) -> (Vec<u8>, Vec<(usize, bool)>) {
    let mut out = Vec::new();
    let mut ends = Vec::new();
    let mut put = |v: &Value| {
        let mut c = v.clone();
        let marked = strip(&mut c);
        serde_json::to_writer(&mut out, &c).expect("JSON of a value");
        out.push(b'\n');
        ends.push((out.len(), marked));
    };
    let each = |v: Option<&Value>, put: &mut dyn FnMut(&Value)| match v {
        Some(Value::Array(a)) => a.iter().for_each(|x| put(x)),
        Some(Value::Null) | None => {}
        Some(other) => put(other),
    };
    let blocks = |v: Option<&Value>, put: &mut dyn FnMut(&Value)| match v {
        Some(Value::String(s)) => put(&text_block(s)),
        other => each(other, put),
    };
    match api {
        Api::Anthropic => {
            // The cache's order: tools, then the system prompt, then the messages.
            each(body.get("tools"), &mut put);
            blocks(body.get("system"), &mut put);
            for m in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                put(m.get("role").unwrap_or(&Value::Null));
                blocks(m.get("content"), &mut put);
            }
        }
        Api::Chat => {
            each(body.get("tools"), &mut put);
            each(body.get("messages"), &mut put);
        }
        Api::Responses => {
            each(body.get("instructions"), &mut put);
            each(body.get("tools"), &mut put);
            each(body.get("input"), &mut put);
        }
        Api::Gemini => {
            each(body.get("systemInstruction"), &mut put);
            each(body.get("tools"), &mut put);
            each(body.get("contents"), &mut put);
        }
    }
    (out, ends)
}

impl CacheSim {
    /// An empty cache for `api`.
    pub fn new(api: Api) -> CacheSim {
        CacheSim::remembering(api, REMEMBERED)
    }

    /// An empty cache for `api` that remembers `n` earlier prefixes or requests.
    pub fn remembering(api: Api, n: usize) -> CacheSim {
        CacheSim { api, prefixes: Vec::new(), earlier: Vec::new(), remembered: n.max(1), total: Billed::default() }
    }

    /// Bills one request body: how many of its input bytes the cache held; then caches what the
    /// provider would.
    pub fn bill(&mut self, body: &Value) -> Billed {
        let (input, ends) = canonical(self.api, body);
        let hashes = running_hashes(&input, &ends);
        let at = |len: usize| hashes.binary_search_by_key(&len, |&(end, _)| end).ok().map(|k| hashes[k]);
        let cached = match self.api {
            Api::Anthropic => {
                let hit = self.prefixes.iter().filter(|&&p| at(p.0) == Some(p)).map(|p| p.0).max().unwrap_or(0);
                for p in ends.iter().filter(|e| e.1).filter_map(|e| at(e.0)) {
                    if !self.prefixes.contains(&p) {
                        self.prefixes.push(p);
                    }
                }
                if self.prefixes.len() > self.remembered {
                    self.prefixes.drain(..self.prefixes.len() - self.remembered);
                }
                hit
            }
            // Gemini's implicit cache, as OpenAI's: the longest prefix shared with an earlier request.
            Api::Chat | Api::Responses | Api::Gemini => {
                let shared = |e: &Vec<(usize, u64)>| e.iter().zip(&hashes).take_while(|(a, b)| a == b).last().map_or(0, |(a, _)| a.0);
                let hit = self.earlier.iter().map(shared).max().unwrap_or(0);
                self.earlier.push(hashes);
                if self.earlier.len() > self.remembered {
                    self.earlier.remove(0);
                }
                hit
            }
        };
        let billed = Billed { bytes: input.len() as u64, cached: cached as u64 };
        self.total = self.total.plus(billed);
        billed
    }
}

/// Which side of the comparison a request body is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// What serve sent upstream (every round).
    Condense,
    /// What the client sent serve: what it would have sent the provider without condense.
    Direct,
}

#[derive(Debug, Default)]
struct Books {
    pending: std::collections::VecDeque<(Api, Side, bytes::Bytes)>,
    condense: Option<CacheSim>,
    direct: Option<CacheSim>,
    /// One point per client request (a body on the direct side), the rounds sent through condense for it
    /// added as they are billed; the first [`POINTS_KEPT`] requests.
    points: Vec<Point>,
    /// Bodies billed on the direct side.
    requests: usize,
}

/// Client requests whose cumulative cost a live conversation keeps (for the dashboard's plot).
const POINTS_KEPT: usize = 2000;

/// The cumulative cache-priced cost after one client request, on both sides, and what its rounds through
/// condense sent and read from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    /// Cost through condense so far.
    pub condense: f64,
    /// Cost as the client sent it so far.
    pub direct: f64,
    /// The floor so far ([`Billed::floor`] of the requests as the client sent them).
    pub floor: f64,
    /// This request's rounds through condense.
    pub billed: Billed,
}

impl Point {
    /// Share of this request's bytes through condense read from the cache.
    pub fn hit(&self) -> f64 {
        round3(self.billed.hit())
    }
}

/// A live conversation's cache-priced cost through condense and as the client sent it, shown by
/// `/condense/status`. Bodies are billed on a blocking thread after they are sent, in the order they
/// were handed in, so a request never waits for its bill.
#[derive(Debug, Default)]
pub struct Ledger {
    books: std::sync::Mutex<Books>,
}

impl Ledger {
    /// Hands in a request body to bill (billed off the request path, in order).
    pub fn record(self: &std::sync::Arc<Self>, api: Api, side: Side, body: bytes::Bytes) {
        self.books.lock().expect("ledger lock").pending.push_back((api, side, body));
        let me = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || me.settle())),
            Err(_) => me.settle(),
        }
    }

    /// Bills every body handed in so far.
    pub fn settle(&self) {
        let mut books = self.books.lock().expect("ledger lock");
        while let Some((api, side, body)) = books.pending.pop_front() {
            let Ok(v) = serde_json::from_slice::<Value>(&body) else { continue };
            let sim = match side {
                Side::Condense => &mut books.condense,
                Side::Direct => &mut books.direct,
            };
            let billed = sim.get_or_insert_with(|| CacheSim::remembering(api, LIVE_REMEMBERED)).bill(&v);
            let (condense, direct) = (books.condense.as_ref().map_or(0.0, |c| c.total.cost()), books.direct.as_ref().map_or(0.0, |d| d.total.cost()));
            match side {
                Side::Direct => {
                    books.requests += 1;
                    if books.points.len() < POINTS_KEPT {
                        let floor = books.direct.as_ref().map_or(0.0, |d| d.total.floor());
                        books.points.push(Point { condense, direct, floor, billed: Billed::default() });
                    }
                }
                // The rounds of the request that has the last point.
                Side::Condense if books.requests == books.points.len() => {
                    if let Some(p) = books.points.last_mut() {
                        p.condense = condense;
                        p.billed = p.billed.plus(billed);
                    }
                }
                Side::Condense => {}
            }
        }
    }

    /// The cumulative cost after each client request (see [`Point`]).
    pub fn points(&self) -> Vec<Point> {
        self.settle();
        self.books.lock().expect("ledger lock").points.clone()
    }

    /// The figures so far: bytes, cache hit and cost on each side, and the cost through condense as a
    /// share of direct (`None` before anything was billed).
    /// The cost through condense, direct, and the floor (see [`Billed::floor`]), once both sides have a
    /// request.
    pub fn costs(&self) -> Option<(f64, f64, f64)> {
        self.settle();
        let books = self.books.lock().expect("ledger lock");
        let direct = books.direct.as_ref()?.total;
        Some((books.condense.as_ref()?.total.cost(), direct.cost(), direct.floor()))
    }

    pub fn figures(&self) -> Option<Value> {
        self.settle();
        let books = self.books.lock().expect("ledger lock");
        let (c, d) = (books.condense.as_ref()?.total, books.direct.as_ref()?.total);
        let side = |b: Billed| serde_json::json!({"bytes": b.bytes, "cached_bytes": b.cached, "cache_hit": round3(b.hit()), "cost": round3(b.cost())});
        let of_direct = |x: f64| if d.cost() > 0.0 { round3(x / d.cost()) } else { 0.0 };
        Some(serde_json::json!({"condense": side(c), "direct": side(d), "cost_vs_direct": of_direct(c.cost()), "floor": round3(d.floor()), "floor_vs_direct": of_direct(d.floor())}))
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn anthropic(messages: Value) -> Value {
        json!({"system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}], "messages": messages})
    }

    #[test]
    fn anthropic_reads_the_longest_marked_prefix_it_begins_with() {
        let mut sim = CacheSim::new(Api::Anthropic);
        let first = anthropic(json!([{"role": "user", "content": [{"type": "text", "text": "hello there", "cache_control": {"type": "ephemeral"}}]}]));
        let b1 = sim.bill(&first);
        assert_eq!(b1.cached, 0, "nothing cached before the first request");
        // The same conversation one turn on, the mark moved to the new last message: the whole first
        // request is read from the cache.
        let second = anthropic(json!([
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}
        ]));
        let b2 = sim.bill(&second);
        assert_eq!(b2.cached, b1.bytes);
        assert!(b2.bytes > b1.bytes);
        // The first message rewritten: only the system prompt is still a cached prefix.
        let third = anthropic(json!([{"role": "user", "content": [{"type": "text", "text": "HELLO there"}]}, {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}]));
        let b3 = sim.bill(&third);
        let (system, _) = canonical(Api::Anthropic, &json!({"system": [{"type": "text", "text": "be brief"}]}));
        assert_eq!(b3.cached, system.len() as u64);
        assert_eq!(sim.total, b1.plus(b2).plus(b3));
        assert!((b2.cost() - (0.1 * b2.cached as f64 + 1.25 * (b2.bytes - b2.cached) as f64)).abs() < 1e-9);
    }

    #[test]
    fn a_ledger_bills_both_sides_in_order() {
        let ledger = std::sync::Arc::new(Ledger::default());
        assert!(ledger.figures().is_none());
        let long = json!({"messages": [{"role": "user", "content": "x".repeat(1000)}, {"role": "assistant", "content": "ok"}]});
        let short = json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"}]});
        for _ in 0..2 {
            ledger.record(Api::Chat, Side::Direct, bytes::Bytes::from(long.to_string()));
            ledger.record(Api::Chat, Side::Condense, bytes::Bytes::from(short.to_string()));
        }
        let f = ledger.figures().unwrap();
        assert_eq!(f["direct"]["cache_hit"], json!(0.5), "{f}");
        assert!(f["cost_vs_direct"].as_f64().unwrap() < 0.1, "{f}");
        // The floor: the direct side's bytes new to the provider (the first request whole, the second's
        // nothing) once, uncached.
        let first = canonical(Api::Chat, &long).0.len() as f64;
        assert!((f["floor"].as_f64().unwrap() - 1.25 * first).abs() < 0.01, "{f}");
        assert!((f["floor_vs_direct"].as_f64().unwrap() - f["floor"].as_f64().unwrap() / f["direct"]["cost"].as_f64().unwrap()).abs() < 0.002, "{f}");
        let points = ledger.points();
        assert_eq!(points.len(), 2);
        assert!((points[0].floor - 1.25 * first).abs() < 0.01 && points[1].floor == points[0].floor, "{points:?}");
    }

    #[test]
    fn a_string_content_is_the_text_block_it_stands_for() {
        let mut sim = CacheSim::new(Api::Anthropic);
        sim.bill(&json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}));
        let next = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]});
        let (first, _) = canonical(Api::Anthropic, &json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(sim.bill(&next).cached, first.len() as u64);
    }

    #[test]
    fn openai_reads_the_longest_prefix_shared_with_an_earlier_request() {
        let mut sim = CacheSim::new(Api::Chat);
        let a = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "one"}]});
        let b = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]});
        let ba = sim.bill(&a);
        let bb = sim.bill(&b);
        assert_eq!(ba.cached, 0);
        assert_eq!(bb.cached, ba.bytes, "the whole first request is a prefix of the second");
        // Unmarked Anthropic requests never read the cache.
        let mut anth = CacheSim::new(Api::Anthropic);
        let plain = json!({"messages": [{"role": "user", "content": "one"}]});
        anth.bill(&plain);
        assert_eq!(anth.bill(&plain).cached, 0);
    }
}
