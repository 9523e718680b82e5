//! The prompt-cache price model `simulate` and the decisions' accounts price requests with.

/// The prompt-cache price model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// Cost of a token in the cached prefix.
    pub cached: f64,
    /// Cost of any other input token.
    pub uncached: f64,
    /// How long the provider keeps a prefix cached after the request that last read or wrote it, in
    /// seconds (`None`: for ever). A request whose session says (`SourceEvent::HostTime`) it came later
    /// than that after the one before reads nothing from the cache.
    pub cache_ttl: Option<u64>,
}

/// The cache's lifetime `simulate` takes when none is given: the providers' default (Anthropic's and
/// OpenAI's prompt caches keep a prefix five minutes after its last use; Anthropic sells an hour too).
pub const DEFAULT_CACHE_TTL: u64 = 300;

impl Prices {
    /// Cost units of `total` input tokens of which `cached` were a cached prefix, plus `plain` tokens sent
    /// without caching (a host's summarization call).
    pub fn units(&self, total: u64, cached: u64, plain: u64) -> f64 {
        self.cached * cached as f64 + self.uncached * (total - cached + plain) as f64
    }
}

impl Default for Prices {
    fn default() -> Self {
        Prices { cached: 0.1, uncached: 1.25, cache_ttl: Some(DEFAULT_CACHE_TTL) }
    }
}
