//! What the commands share: a session found by name or id, the store argument as shown, the
//! configuration in force and the summarizer it names, the time for a line written now.

use anyhow::{anyhow, Context as _, Result};
use condense_engine::{Session, Store};
use std::path::Path;
use std::sync::Arc;

/// A session by name, or by the numeric id `condense sessions` prints (a name wins over an id).
pub(crate) fn session_of(store: &Store, key: &str) -> Result<Session> {
    match store.session(key) {
        Ok(s) => Ok(s),
        Err(e) => match key.parse::<u64>().map(|id| store.session_by_id(id)) {
            Ok(Ok(s)) => Ok(s),
            _ => Err(e.into()),
        },
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), for a pi entry written now.
pub(crate) fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, ms) = (d.as_secs() as i64, d.subsec_millis());
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The active branch's entries: id, role, and the start of the text.

/// The store argument as shown in messages: a folder, or a PostgreSQL URL without its password.
pub(crate) fn shown(store: &Path) -> String {
    condense_log::Location::parse(store).to_string()
}

/// The store's folder; `None` for a PostgreSQL store (which has no folder, and no lock: any number of
/// processes open it at once).
pub(crate) fn store_folder(store: &Path) -> Option<&Path> {
    condense_log::Location::parse(store).dir().is_some().then_some(store)
}

/// The configuration in force: `--config FILE`, else the store's `config.json`, else the defaults (a
/// PostgreSQL store has no folder for a `config.json`: `--config` or the defaults).
pub(crate) fn load_config(file: Option<&Path>, store_dir: &Path) -> Result<condense_engine::config::FileConfig> {
    let path = match (file, store_folder(store_dir)) {
        (Some(p), _) => p.to_path_buf(),
        (None, None) => return Ok(Default::default()),
        (None, Some(store_dir)) => {
            let p = store_dir.join("config.json");
            if !p.exists() {
                return Ok(Default::default());
            }
            p
        }
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let f = condense_engine::config::parse_file(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    for w in &f.warnings {
        errln!("condense: {}: {w}", path.display());
    }
    Ok(f)
}

/// The summarizer a configuration names (`None`: the embedded extractive one).
/// With `warn_each`, a fallback to the extractive summarizer prints a warning on stderr as it happens (the
/// 1st, 10th, 100th, … time); without, the caller reports the count when it is done.
pub(crate) fn summarizer_of(file_config: &condense_engine::config::FileConfig, warn_each: bool) -> Option<Arc<dyn condense_summarize::Summarizer>> {
    match &file_config.summarizer {
        condense_engine::config::SummarizerChoice::Extractive => None,
        condense_engine::config::SummarizerChoice::Http { base_url, model, api_key_env, idle_secs, total_secs } => {
            // The key is read here, in the binary; it never reaches an event.
            let key = api_key_env.as_ref().and_then(|v| std::env::var(v).ok());
            let mut c = condense_summarize::HttpConfig::new(base_url, model, key);
            c.idle = std::time::Duration::from_secs(*idle_secs);
            c.total = std::time::Duration::from_secs(*total_secs);
            let s = condense_summarize::WithFallback::new(condense_summarize::HttpSummarizer::new(c), condense_summarize::Extractive::default());
            Some(if warn_each {
                Arc::new(s.with_notice(|n, reason| {
                    let digits = n.to_string();
                    if digits.starts_with('1') && digits[1..].bytes().all(|b| b == b'0') {
                        eprintln!("condense: warning: the configured summarizer failed ({n} times so far); the extractive summarizer stood in: {reason}");
                    }
                }))
            } else {
                Arc::new(s)
            })
        }
    }
}
