//! Reading a configuration file: JSON with the seed's camelCase keys. Unknown keys and values of the wrong
//! type are errors that name the key; numbers are normalized as the seed says (see `RawConfig`).

use crate::simulate::Prices;
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
    /// Values the file set that were taken as something else (each names the key and what was done).
    pub warnings: Vec<String>,
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
    "purgeMinChars", "purgeAfterTurns", "dedup", "thinkingStrip", "condenseArgsChars", "minPruneTokens", "cachedPrice", "uncachedPrice", "summarizer", "recoverLargeContext",
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
            "cachedPrice" => prices.cached = num()?,
            "uncachedPrice" => prices.uncached = num()?,
            "summarizer" => summarizer = summarizer_choice(value)?,
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
    Ok(FileConfig { raw, prices, summarizer, warnings })
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
        assert_eq!((c.recovery_grace_turns, c.min_batch_chars, c.rolling_window), (2, 0, 1));
        assert_eq!(prices.cached, 0.2);
        let back = to_json(&c, prices);
        assert_eq!(back["recoveryGraceTurns"], 2);
        let f = parse_file(r#"{"summarizer":{"kind":"http","baseUrl":"http://127.0.0.1:9/v1","model":"m","apiKeyEnv":"KEY"}}"#).unwrap();
        assert!(matches!(f.summarizer, SummarizerChoice::Http { idle_secs: 20, total_secs: 180, .. }));
        assert_eq!(parse_file(r#"{"summarizer":{"kind":"http","model":"m"}}"#).unwrap_err().key, "summarizer.baseUrl");
        assert_eq!(parse_file(r#"{"summarizer":{"kind":"gpt"}}"#).unwrap_err().key, "summarizer.kind");
        // recoverLargeContext: on when omitted, false turns it off, an invalid value turns it off and says so.
        assert!(parse_file("{}").unwrap().raw.normalize().recover_large_context);
        assert!(!parse_file(r#"{"recoverLargeContext":false}"#).unwrap().raw.normalize().recover_large_context);
        let bad = parse_file(r#"{"recoverLargeContext":"yes"}"#).unwrap();
        assert!(!bad.raw.normalize().recover_large_context);
        assert_eq!(bad.warnings, vec!["config key `recoverLargeContext`: \"yes\" is not true or false; recovery is off".to_string()]);
    }
}
