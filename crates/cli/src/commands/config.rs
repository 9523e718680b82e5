//! `condense config`: the configuration in force, and `config set` with its checks.

use crate::cli::ConfigAction;
use crate::shared::{load_config, store_folder};
use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;

pub(crate) fn config(store_dir: &Path, action: Option<ConfigAction>, file: Option<&Path>, json_out: bool) -> Result<ExitCode> {
    match action {
        None => {
            let f = load_config(file, store_dir)?;
            let mut v = condense_engine::config::to_json(&f.raw.normalize(), f.prices);
            v["summarizer"] = match &f.summarizer {
                condense_engine::config::SummarizerChoice::Extractive => json!("extractive"),
                condense_engine::config::SummarizerChoice::Http { base_url, model, api_key_env, idle_secs, total_secs } => json!({
                    "kind": "http", "baseUrl": base_url, "model": model, "apiKeyEnv": api_key_env,
                    "idleTimeoutSecs": idle_secs, "totalTimeoutSecs": total_secs,
                }),
            };
            // The windows serve and simulate assume, and where each comes from: the file's table first, then
            // the built-in one (a model id, or the longest prefix ending in `*`).
            let mut models = serde_json::Map::new();
            let limits = |l: &condense_engine::config::ModelLimits, from: &str| json!({"contextWindow": l.context_window, "maxOutput": l.max_output, "from": from});
            for (k, l) in &f.models {
                models.insert(k.clone(), limits(l, "config"));
            }
            for (k, w, o) in condense_engine::config::DEFAULT_MODELS {
                if !models.contains_key(*k) {
                    models.insert(k.to_string(), limits(&condense_engine::config::ModelLimits { context_window: *w, max_output: Some(*o) }, "built-in"));
                }
            }
            v["models"] = Value::Object(models);
            outln!("{}", serde_json::to_string_pretty(&v)?);
            if !json_out {
                outln!("models: a request's model is looked up by its id, else by the longest prefix ending in `*`, in the config's table first; change one with `condense config set models '{{\"MODEL\": {{\"contextWindow\": N, \"maxOutput\": N}}}}'`");
                outln!(
                    "presets: recoveryGraceTurns {:?}, minBatchChars {:?}, rollingWindow {:?}, autoBudgetThreshold {:?}",
                    condense_events::RECOVERY_GRACE_PRESETS,
                    condense_events::MIN_BATCH_CHARS_PRESETS,
                    condense_events::ROLLING_WINDOW_PRESETS,
                    condense_events::AUTO_BUDGET_PRESETS
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(ConfigAction::Set { key, value }) => {
            let Some(store_dir) = store_folder(store_dir) else {
                bail!("a PostgreSQL store has no folder to keep a config.json in: keep the file yourself and pass --config FILE to the commands that read it");
            };
            let path = store_dir.join("config.json");
            let mut current: serde_json::Map<String, Value> = if path.exists() {
                let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                serde_json::from_str(&text).with_context(|| format!("{} is not a JSON object", path.display()))?
            } else {
                serde_json::Map::new()
            };
            let v: Value = serde_json::from_str(&value).unwrap_or_else(|_| Value::String(value.clone()));
            check_range(&key, &v)?;
            current.insert(key.clone(), v);
            let text = serde_json::to_string_pretty(&Value::Object(current))?;
            condense_engine::config::parse_file(&text).map_err(|e| anyhow!("{e}"))?;
            std::fs::create_dir_all(store_dir).with_context(|| format!("creating {}", store_dir.display()))?;
            std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
            outln!("set {key} = {value} in {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The values `config set` takes for the numeric keys: a file written by hand is normalized as the seed
/// says, but a value set here that normalization would change is refused, naming the allowed range.
pub(crate) fn check_range(key: &str, v: &Value) -> Result<()> {
    // (minimum, whole numbers only)
    let range: Option<(f64, bool)> = match key {
        "minBatchChars" | "rollingWindow" | "spillPreviewBytes" | "purgeMinChars" | "purgeAfterTurns" | "recoveryGraceTurns" | "condenseArgsChars" | "minPruneTokens" | "autoBudgetThreshold" => Some((0.0, true)),
        "spillThreshold" => Some((1.0, true)),
        "cachedPrice" | "uncachedPrice" => Some((0.0, false)),
        _ => None,
    };
    let Some((min, whole)) = range else { return Ok(()) };
    let n = v.as_f64().filter(|n| n.is_finite()).ok_or_else(|| anyhow!("config key `{key}`: expected a number, found {v}"))?;
    if n < min || (whole && n.fract() != 0.0) {
        let kind = if whole { "a whole number" } else { "a number" };
        bail!("config key `{key}`: {v} is out of range; expected {kind} of at least {min}");
    }
    Ok(())
}
