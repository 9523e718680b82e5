//! Reading a configuration file: JSON with the seed's camelCase keys. Unknown keys and values of the wrong
//! type are errors that name the key; numbers are normalized as the seed says (see `RawConfig`).

use crate::simulate::{ListPrice, Prices};
use condense_events::{BatchingMode, PruneConfig, PruneOn, RawConfig};
use serde_json::Value;

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    /// The key at fault (`(file)` for the file as a whole).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

/// Which summarizer the pipeline uses.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum SummarizerChoice {
    /// The embedded deterministic extractive summarizer.
    #[default]
    Extractive,
    /// An OpenAI-compatible endpoint, falling back to the extractive summarizer on failure.
    Http {
        /// Base URL (`.../v1`).
        base_url: String,
        /// Model name.
        model: String,
        /// Name of the environment variable holding the API key.
        api_key_env: Option<String>,
        /// Idle timeout, seconds.
        idle_secs: u64,
        /// Total timeout, seconds.
        total_secs: u64,
    },
}

/// Everything a configuration file sets.
#[derive(Debug, Clone, Default)]
pub struct FileConfig {
    /// The pruning configuration as written.
    pub raw: RawConfig,
    /// The simulation's prices.
    pub prices: Prices,
    /// The summarizer.
    pub summarizer: SummarizerChoice,
    /// Model windows and output limits the file sets (over [`DEFAULT_MODELS`]).
    pub models: Vec<(String, ModelLimits)>,
    /// List prices the file sets (over [`crate::simulate::PRICE_TABLE`]).
    pub list_prices: Vec<ListPrice>,
    /// Values the file set that were taken as something else (each names the key and what was done).
    pub warnings: Vec<String>,
}

/// A model's context window and output limit, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Context window.
    pub context_window: u64,
    /// Output limit, when known.
    pub max_output: Option<u64>,
}

/// Windows and output limits of current Anthropic, OpenAI and Gemini models, by model id or by a prefix ending in
/// `*`. The config's `models` table overrides or extends it.
pub const DEFAULT_MODELS: &[(&str, u64, u64)] = &[
    ("claude-*", 200_000, 64_000),
    ("claude-opus-4-1*", 200_000, 32_000),
    ("claude-opus-4-0*", 200_000, 32_000),
    ("claude-opus-4-2*", 200_000, 32_000),
    ("claude-3-5-haiku*", 200_000, 8_192),
    ("claude-3-haiku*", 200_000, 4_096),
    ("gpt-5*", 400_000, 128_000),
    ("gpt-4.1*", 1_047_576, 32_768),
    ("gpt-4o*", 128_000, 16_384),
    ("o1*", 200_000, 100_000),
    ("o3*", 200_000, 100_000),
    ("o4-mini*", 200_000, 100_000),
    ("codex-mini*", 200_000, 100_000),
    ("gemini-2.5*", 1_048_576, 65_536),
    ("gemini-3*", 1_048_576, 65_536),
];

/// The limits of `model`: an exact entry first, then the longest matching `prefix*` entry; the file's
/// table before the defaults.
pub fn model_limits(table: &[(String, ModelLimits)], model: &str) -> Option<ModelLimits> {
    model_lookup(table, model).map(|(l, _)| l)
}

/// [`model_limits`] and where they were found: `the models table, "KEY"` or `the built-in table, "KEY"`
/// (the key matched: the model id, or the longest prefix ending in `*`).
pub fn model_lookup(table: &[(String, ModelLimits)], model: &str) -> Option<(ModelLimits, String)> {
    let defaults: Vec<(String, ModelLimits)> = DEFAULT_MODELS
        .iter()
        .map(|(k, w, o)| (k.to_string(), ModelLimits { context_window: *w, max_output: Some(*o) }))
        .collect();
    for (t, name) in [(table, "the models table"), (&defaults[..], "the built-in table")] {
        if let Some((k, l)) = t.iter().find(|(k, _)| k == model) {
            return Some((*l, format!("{name}, \"{k}\"")));
        }
        let best = t
            .iter()
            .filter_map(|(k, l)| k.strip_suffix('*').filter(|p| model.starts_with(p)).map(|p| (p.len(), k, *l)))
            .max_by_key(|(n, _, _)| *n);
        if let Some((_, k, l)) = best {
            return Some((l, format!("{name}, \"{k}\"")));
        }
    }
    None
}

fn models_table(value: &Value) -> Result<Vec<(String, ModelLimits)>, ConfigError> {
    let Value::Object(o) = value else { return Err(err("models", "expected an object of model id to {\"contextWindow\": N, \"maxOutput\": N}")) };
    let mut out = Vec::new();
    for (model, v) in o {
        let key = format!("models.{model}");
        let Value::Object(f) = v else { return Err(err(&key, "expected {\"contextWindow\": N, \"maxOutput\": N}")) };
        for k in f.keys() {
            if k != "contextWindow" && k != "maxOutput" {
                return Err(err(&format!("{key}.{k}"), "unknown key (contextWindow, maxOutput)"));
            }
        }
        let window = f.get("contextWindow").and_then(Value::as_u64).filter(|w| *w >= 1024)
            .ok_or_else(|| err(&format!("{key}.contextWindow"), "expected a whole number of tokens, at least 1024"))?;
        let max_output = match f.get("maxOutput") {
            None => None,
            Some(v) => Some(v.as_u64().filter(|n| *n > 0 && *n < window).ok_or_else(|| err(&format!("{key}.maxOutput"), "expected a whole number of tokens below the window"))?),
        };
        out.push((model.clone(), ModelLimits { context_window: window, max_output }));
    }
    Ok(out)
}

fn list_prices(value: &Value) -> Result<Vec<ListPrice>, ConfigError> {
    let shape = "{\"input\": N, \"cachedRead\": N, \"cacheWrite\": N} (dollars per million tokens)";
    let Value::Object(o) = value else { return Err(err("listPrices", format!("expected an object of model name to {shape}"))) };
    let mut out = Vec::new();
    for (model, v) in o {
        let key = format!("listPrices.{model}");
        let Value::Object(f) = v else { return Err(err(&key, format!("expected {shape}"))) };
        for k in f.keys() {
            if !["input", "cachedRead", "cacheWrite"].contains(&k.as_str()) {
                return Err(err(&format!("{key}.{k}"), "unknown key (input, cachedRead, cacheWrite)"));
            }
        }
        let price = |name: &str| {
            f.get(name).and_then(Value::as_f64).filter(|p| p.is_finite() && *p >= 0.0)
                .ok_or_else(|| err(&format!("{key}.{name}"), "expected dollars per million tokens, a number of at least 0"))
        };
        let input = price("input")?;
        let cached_read = price("cachedRead")?;
        // A provider that does not charge for cache writes bills them as input.
        let cache_write = if f.contains_key("cacheWrite") { price("cacheWrite")? } else { input };
        out.push(ListPrice { model: model.clone(), input, cached_read, cache_write });
    }
    Ok(out)
}

/// The price of `model`: the configuration's `listPrices` over the embedded table.
pub fn list_price(overrides: &[ListPrice], model: &str) -> Option<ListPrice> {
    overrides.iter().find(|p| p.model == model).cloned().or_else(|| crate::simulate::price_table().into_iter().find(|p| p.model == model))
}

/// The price of a model as a request names it: [`list_price`] of the name, else of the longest priced name
/// it extends with a dash (a dated snapshot: `claude-sonnet-4-5-20250929` is priced as `claude-sonnet-4-5`).
pub fn list_price_of_request(overrides: &[ListPrice], model: &str) -> Option<ListPrice> {
    list_price(overrides, model).or_else(|| {
        let names = overrides.iter().map(|p| p.model.as_str()).chain(crate::simulate::PRICE_TABLE.iter().map(|p| p.0));
        let base = names.filter(|n| model.strip_prefix(n).is_some_and(|rest| rest.starts_with('-'))).max_by_key(|n| n.len())?;
        list_price(overrides, base)
    })
}

fn summarizer_choice(value: &Value) -> Result<SummarizerChoice, ConfigError> {
    let key = "summarizer";
    match value {
        Value::String(s) if s == "extractive" => Ok(SummarizerChoice::Extractive),
        Value::Object(o) => {
            let field = |name: &str| o.get(name).and_then(Value::as_str).map(str::to_string);
            let secs = |name: &str, default: u64| match o.get(name) {
                None => Ok(default),
                Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| err(&format!("summarizer.{name}"), "expected a whole number of seconds")),
            };
            for k in o.keys() {
                if !["kind", "baseUrl", "model", "apiKeyEnv", "idleTimeoutSecs", "totalTimeoutSecs"].contains(&k.as_str()) {
                    return Err(err(&format!("summarizer.{k}"), "unknown key"));
                }
            }
            match field("kind").as_deref() {
                Some("extractive") => Ok(SummarizerChoice::Extractive),
                Some("http") => Ok(SummarizerChoice::Http {
                    base_url: field("baseUrl").ok_or_else(|| err("summarizer.baseUrl", "required for kind \"http\""))?,
                    model: field("model").ok_or_else(|| err("summarizer.model", "required for kind \"http\""))?,
                    api_key_env: field("apiKeyEnv"),
                    idle_secs: secs("idleTimeoutSecs", 20)?,
                    total_secs: secs("totalTimeoutSecs", 180)?,
                }),
                _ => Err(err("summarizer.kind", "expected \"extractive\" or \"http\"")),
            }
        }
        _ => Err(err(key, format!("expected \"extractive\" or an object with kind \"http\", found {value}"))),
    }
}

/// Every key the file may hold.
pub const KEYS: &[&str] = &[
    "enabled", "batchingMode", "minBatchChars", "protectedTools", "protectedPaths", "spillThreshold",
    "spillPreviewBytes", "pruneOn", "autoBudgetThreshold", "rollingWindow", "recoveryGraceTurns", "purgeErrors",
    "purgeMinChars", "purgeAfterTurns", "dedup", "thinkingStrip", "condenseArgsChars", "minPruneTokens", "cachedPrice", "uncachedPrice", "summarizer", "recoverLargeContext", "liveReadsTokens", "liveReadsTurns", "models", "listPrices",
];

fn err(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_string(), reason: reason.into() }
}

/// Parses a configuration file's text into the raw configuration and the simulation's prices.
pub fn parse(text: &str) -> Result<(RawConfig, Prices), ConfigError> {
    parse_file(text).map(|f| (f.raw, f.prices))
}

/// Parses a configuration file's text, summarizer included.
pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    let v: Value = serde_json::from_str(text).map_err(|e| err("(file)", format!("not JSON: {e}")))?;
    let Value::Object(map) = v else { return Err(err("(file)", "expected a JSON object")) };
    let mut raw = RawConfig::default();
    let mut prices = Prices::default();
    let mut summarizer = SummarizerChoice::Extractive;
    let mut models = Vec::new();
    let mut list_prices = Vec::new();
    let mut warnings = Vec::new();
    for (key, value) in &map {
        let num = || match value {
            Value::Number(n) => n.as_f64().ok_or_else(|| err(key, "not a finite number")),
            _ => Err(err(key, format!("expected a number, found {value}"))),
        };
        let boolean = || value.as_bool().ok_or_else(|| err(key, format!("expected true or false, found {value}")));
        let strings = || match value {
            Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| err(key, "expected a list of strings"))).collect(),
            _ => Err(err(key, "expected a list of strings")),
        };
        match key.as_str() {
            "enabled" => raw.enabled = Some(boolean()?),
            "batchingMode" => {
                raw.batching_mode = Some(match value.as_str() {
                    Some("turn") => BatchingMode::Turn,
                    Some("agent-message") => BatchingMode::AgentMessage,
                    _ => return Err(err(key, format!("expected \"turn\" or \"agent-message\", found {value}"))),
                })
            }
            "pruneOn" => {
                raw.prune_on = Some(match value.as_str() {
                    Some("agent-message") => PruneOn::AgentMessage,
                    Some("on-demand") => PruneOn::OnDemand,
                    _ => return Err(err(key, format!("expected \"agent-message\" or \"on-demand\", found {value}"))),
                })
            }
            "minBatchChars" => raw.min_batch_chars = Some(num()?),
            "protectedTools" => raw.protected_tools = Some(strings()?),
            "protectedPaths" => raw.protected_paths = Some(strings()?),
            "spillThreshold" => raw.spill_threshold = Some(num()?),
            "spillPreviewBytes" => raw.spill_preview_bytes = Some(num()?),
            "autoBudgetThreshold" => raw.auto_budget_threshold = Some(num()?),
            "rollingWindow" => raw.rolling_window = Some(num()?),
            "recoveryGraceTurns" => raw.recovery_grace_turns = Some(num()?),
            "purgeErrors" => raw.purge_errors = Some(boolean()?),
            "purgeMinChars" => raw.purge_min_chars = Some(num()?),
            "purgeAfterTurns" => raw.purge_after_turns = Some(num()?),
            "dedup" => raw.dedup = Some(boolean()?),
            "thinkingStrip" => raw.thinking_strip = Some(boolean()?),
            "condenseArgsChars" => raw.condense_args_chars = Some(num()?),
            "minPruneTokens" => raw.min_prune_tokens = Some(num()?),
            "liveReadsTokens" => raw.live_reads_tokens = Some(num()?),
            "liveReadsTurns" => raw.live_reads_turns = Some(num()?),
            "cachedPrice" => prices.cached = num()?,
            "uncachedPrice" => prices.uncached = num()?,
            "summarizer" => summarizer = summarizer_choice(value)?,
            "models" => models = models_table(value)?,
            "listPrices" => list_prices = self::list_prices(value)?,
            // Seed 004: an invalid explicit value turns recovery off, and says so.
            "recoverLargeContext" => match value.as_bool() {
                Some(b) => raw.recover_large_context = Some(b),
                None => {
                    raw.recover_large_context = Some(false);
                    warnings.push(format!("config key `recoverLargeContext`: {value} is not true or false; recovery is off"));
                }
            },
            other => return Err(err(other, format!("unknown key (known keys: {})", KEYS.join(", ")))),
        }
    }
    Ok(FileConfig { raw, prices, summarizer, models, list_prices, warnings })
}

/// The configuration as a file would write it (every key, normalized values).
pub fn to_json(c: &PruneConfig, prices: Prices) -> Value {
    serde_json::json!({
        "enabled": c.enabled,
        "batchingMode": match c.batching_mode { BatchingMode::Turn => "turn", BatchingMode::AgentMessage => "agent-message" },
        "minBatchChars": c.min_batch_chars,
        "protectedTools": c.protected_tools,
        "protectedPaths": c.protected_paths,
        "spillThreshold": c.spill_threshold,
        "spillPreviewBytes": c.spill_preview_bytes,
        "pruneOn": match c.prune_on { PruneOn::AgentMessage => "agent-message", PruneOn::OnDemand => "on-demand" },
        "autoBudgetThreshold": c.auto_budget_threshold,
        "rollingWindow": c.rolling_window,
        "recoveryGraceTurns": c.recovery_grace_turns,
        "purgeErrors": c.purge_errors,
        "purgeMinChars": c.purge_min_chars,
        "purgeAfterTurns": c.purge_after_turns,
        "dedup": c.dedup,
        "thinkingStrip": c.thinking_strip,
        "condenseArgsChars": c.condense_args_chars,
        "minPruneTokens": c.min_prune_tokens,
        "recoverLargeContext": c.recover_large_context,
        "liveReadsTokens": c.live_reads_tokens,
        "liveReadsTurns": c.live_reads_turns,
        "cachedPrice": prices.cached,
        "uncachedPrice": prices.uncached,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key() {
        assert_eq!(parse(r#"{"rollingWindow":"x"}"#).unwrap_err().key, "rollingWindow");
        assert_eq!(parse(r#"{"rollingWindw":3}"#).unwrap_err().key, "rollingWindw");
        assert_eq!(parse(r#"{"pruneOn":"never"}"#).unwrap_err().key, "pruneOn");
        assert_eq!(parse("[1]").unwrap_err().key, "(file)");
        let (raw, prices) = parse(r#"{"recoveryGraceTurns":2.7,"minBatchChars":0,"rollingWindow":-4,"cachedPrice":0.2}"#).unwrap();
        let c = raw.normalize();
        assert_eq!((c.recovery_grace_turns, c.min_batch_chars, c.rolling_window), (2, 0, 0));
        assert_eq!(prices.cached, 0.2);
        let back = to_json(&c, prices);
        assert_eq!(back["recoveryGraceTurns"], 2);
        let f = parse_file(r#"{"summarizer":{"kind":"http","baseUrl":"http://127.0.0.1:9/v1","model":"m","apiKeyEnv":"KEY"}}"#).unwrap();
        assert!(matches!(f.summarizer, SummarizerChoice::Http { idle_secs: 20, total_secs: 180, .. }));
        assert_eq!(parse_file(r#"{"summarizer":{"kind":"http","model":"m"}}"#).unwrap_err().key, "summarizer.baseUrl");
        assert_eq!(parse_file(r#"{"summarizer":{"kind":"gpt"}}"#).unwrap_err().key, "summarizer.kind");
        // liveReadsTokens: 12,000 and 8 turns by default, capped, shown back; written to the log as its
        // own event only when on, so a store that turns it off holds the events stores held before it.
        let d = parse("{}").unwrap().0.normalize();
        assert_eq!((d.live_reads_tokens, d.live_reads_turns), (condense_events::DEFAULT_LIVE_READS_TOKENS, condense_events::DEFAULT_LIVE_READS_TURNS));
        assert!(matches!(condense_events::SourceEvent::configured(d)[..], [_, condense_events::SourceEvent::LiveReadsConfigured { tokens: 12_000, turns: 8 }]));
        let off = parse(r#"{"liveReadsTokens":0}"#).unwrap().0.normalize();
        assert_eq!(condense_events::SourceEvent::configured(off).len(), 1);
        let live = parse(r#"{"liveReadsTokens":20000.5,"liveReadsTurns":0}"#).unwrap().0.normalize();
        assert_eq!(live.live_reads_tokens, 20_000);
        assert_eq!(to_json(&live, Prices::default())["liveReadsTokens"], 20_000);
        assert_eq!(parse(r#"{"liveReadsTokens":1e12}"#).unwrap().0.normalize().live_reads_tokens, condense_events::LIVE_READS_CAP);
        assert_eq!(parse(r#"{"liveReadsTokens":"all"}"#).unwrap_err().key, "liveReadsTokens");
        assert!(matches!(condense_events::SourceEvent::configured(live)[..], [_, condense_events::SourceEvent::LiveReadsConfigured { tokens: 20_000, turns: 0 }]));
        let aged = parse(r#"{"liveReadsTokens":8000,"liveReadsTurns":10}"#).unwrap().0.normalize();
        assert_eq!((aged.live_reads_tokens, aged.live_reads_turns), (8_000, 10));
        assert_eq!(to_json(&aged, Prices::default())["liveReadsTurns"], 10);
        assert!(matches!(condense_events::SourceEvent::configured(aged)[..], [_, condense_events::SourceEvent::LiveReadsConfigured { tokens: 8_000, turns: 10 }]));
        // recoverLargeContext: on when omitted, false turns it off, an invalid value turns it off and says so.
        assert!(parse_file("{}").unwrap().raw.normalize().recover_large_context);
        assert!(!parse_file(r#"{"recoverLargeContext":false}"#).unwrap().raw.normalize().recover_large_context);
        let bad = parse_file(r#"{"recoverLargeContext":"yes"}"#).unwrap();
        assert!(!bad.raw.normalize().recover_large_context);
        assert_eq!(bad.warnings, vec!["config key `recoverLargeContext`: \"yes\" is not true or false; recovery is off".to_string()]);
    }

    #[test]
    fn model_table_overrides_defaults() {
        let f = parse_file(r#"{"models":{"fake-model":{"contextWindow":32000,"maxOutput":4096},"claude-opus-9*":{"contextWindow":1000000}}}"#).unwrap();
        assert_eq!(model_limits(&f.models, "fake-model"), Some(ModelLimits { context_window: 32_000, max_output: Some(4096) }));
        assert_eq!(model_limits(&f.models, "claude-opus-9-1").map(|l| l.context_window), Some(1_000_000));
        assert_eq!(model_limits(&f.models, "claude-sonnet-4-5").map(|l| l.context_window), Some(200_000));
        assert_eq!(model_limits(&f.models, "claude-opus-4-1-2025").and_then(|l| l.max_output), Some(32_000));
        assert_eq!(model_limits(&f.models, "mystery"), None);
        assert_eq!(parse_file(r#"{"models":{"m":{"contextWindow":10}}}"#).unwrap_err().key, "models.m.contextWindow");
        assert_eq!(parse_file(r#"{"models":{"m":{"window":10}}}"#).unwrap_err().key, "models.m.window");
    }

    #[test]
    fn list_prices_override_the_table_and_name_a_bad_key() {
        let f = parse_file(r#"{"listPrices":{"claude-sonnet-4-5":{"input":2,"cachedRead":0.2,"cacheWrite":2.5},"house":{"input":1,"cachedRead":0.1}}}"#).unwrap();
        assert_eq!(list_price(&f.list_prices, "claude-sonnet-4-5").map(|p| (p.input, p.cached_read, p.cache_write)), Some((2.0, 0.2, 2.5)));
        assert_eq!(list_price(&f.list_prices, "house").map(|p| p.cache_write), Some(1.0));
        assert_eq!(list_price(&[], "gpt-5").map(|p| p.cached_read), Some(0.125));
        assert_eq!(list_price(&[], "mystery"), None);
        assert_eq!(parse_file(r#"{"listPrices":{"m":{"input":-1,"cachedRead":0}}}"#).unwrap_err().key, "listPrices.m.input");
        assert_eq!(parse_file(r#"{"listPrices":{"m":{"input":1}}}"#).unwrap_err().key, "listPrices.m.cachedRead");
        assert_eq!(parse_file(r#"{"listPrices":{"m":{"input":1,"cachedRead":0,"write":2}}}"#).unwrap_err().key, "listPrices.m.write");
        assert_eq!(parse_file(r#"{"listPrices":3}"#).unwrap_err().key, "listPrices");
    }
}
