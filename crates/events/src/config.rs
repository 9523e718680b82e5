//! The pruning configuration (seed 000 and its pipeline): every knob with its default, and `normalize`,
//! which turns what a user wrote into values the pipeline can trust.

use serde::{Deserialize, Serialize};

/// How tool results are grouped into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchingMode {
    /// One batch per turn (the results of one assistant message).
    Turn,
    /// One batch per agent message (every result between two final replies).
    AgentMessage,
}

/// When pending batches are summarized and replaced by stubs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PruneOn {
    /// When a final text-only assistant reply has arrived (the model has read everything before it).
    AgentMessage,
    /// Only when asked (`Session::prune_now`), or by the budget trigger.
    OnDemand,
}

/// Every knob of the pruning pipeline, normalized. Build it with [`RawConfig::normalize`] or `default()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PruneConfig {
    /// Pruning on or off (off renders the host's own context).
    pub enabled: bool,
    /// Batch per turn or per agent message.
    pub batching_mode: BatchingMode,
    /// A batch whose outputs total fewer characters is left as it is (`skipped-trivial`).
    pub min_batch_chars: u64,
    /// Tools whose outputs are never stubbed.
    pub protected_tools: Vec<String>,
    /// Globs matched against path arguments; a matching call's output is never stubbed.
    pub protected_paths: Vec<String>,
    /// Outputs of at least this many characters are spilled to a blob file before summarization (file reads
    /// and fetched pages from four times as many: `condense_spill::READ_SPILL_FACTOR`).
    pub spill_threshold: u64,
    /// Bytes of a spilled output shown as a preview in its stub.
    pub spill_preview_bytes: u64,
    /// When batches are pruned.
    pub prune_on: PruneOn,
    /// Budget trigger for long autonomous runs: prune when the outputs the model has already read and
    /// that are still verbatim reach this many tokens (chars/4). 0 turns it off; capped at 300,000. Under
    /// `pruneOn: agent-message` the trigger waits for more while a final reply is to be expected: see
    /// [`AWAITING_REPLY_BUDGET`], [`FIRST_TURNS_BUDGET`] and `docs/pruning.md`.
    pub auto_budget_threshold: u64,
    /// The newest closed chains kept uncompressed (0: every closed chain is compressed at the next
    /// prune).
    pub rolling_window: u64,
    /// User-turn-groups a `context_tree_query` output stays verbatim after it was made; 0 disables.
    pub recovery_grace_turns: u64,
    /// Purge the arguments of failed calls.
    pub purge_errors: bool,
    /// Only arguments at least this long are purged.
    pub purge_min_chars: u64,
    /// Turns after the failure before the purge.
    pub purge_after_turns: u64,
    /// Alias identical outputs to the first one.
    pub dedup: bool,
    /// Strip thinking from the final reply of a compressed chain and from turns whose outputs are pruned.
    pub thinking_strip: bool,
    /// In a turn whose outputs are pruned, argument string values longer than this are shortened to a
    /// marker naming the ref (0 keeps arguments whole).
    pub condense_args_chars: u64,
    /// A prune before a request goes ahead only if it shrinks the context by at least this many tokens:
    /// a smaller one would cost more in re-sent (uncached) tokens than it saves. 0 prunes whatever the gain.
    pub min_prune_tokens: u64,
    /// Recover a large context when the session moves to a model with a smaller window (seed 004).
    pub recover_large_context: bool,
    /// Live file reads kept verbatim, tokens (0: off; [`DEFAULT_LIVE_READS_TOKENS`] by default). A *live*
    /// read reads back a file the agent wrote or edited before it, and no later read or edit of the same
    /// file has followed it; when a batch closes, the newest live reads that fit in this many tokens stay
    /// verbatim instead of becoming stubs, and each is stubbed at a later prune once it is superseded, older
    /// than `liveReadsTurns`, or newer ones take its room (`OutputStubbed`). None is kept in an autonomous
    /// run. `docs/pruning.md`, "Reading back its own files". Not in the log's `PruneConfigured` (whose
    /// layout stores already hold): written as `LiveReadsConfigured` after it when not 0, so a log without
    /// one has it off.
    #[serde(skip)]
    pub live_reads_tokens: u64,
    /// Under `liveReadsTokens`, a read stays verbatim at most this many assistant turns after its call,
    /// live or not (0: no limit; [`DEFAULT_LIVE_READS_TURNS`] by default). Written with `liveReadsTokens`
    /// in `LiveReadsConfigured`.
    #[serde(skip)]
    pub live_reads_turns: u64,
}

impl PruneConfig {
    /// What a `PruneConfigured` record of this configuration holds once stored: the keys its layout
    /// skips (`liveReadsTokens`, `liveReadsTurns`) at 0, off, as stores written before them hold them
    /// (a `LiveReadsConfigured` after it sets them; see [`PruneConfig::take_in`]).
    pub(crate) fn as_stored(&self) -> PruneConfig {
        PruneConfig { live_reads_tokens: 0, live_reads_turns: 0, ..self.clone() }
    }
}

/// The largest `liveReadsTokens` accepted.
pub const LIVE_READS_CAP: u64 = 200_000;

/// The largest budget trigger accepted.
pub const AUTO_BUDGET_CAP: u64 = 300_000;

impl Default for PruneConfig {
    fn default() -> Self {
        PruneConfig {
            enabled: true,
            batching_mode: BatchingMode::Turn,
            min_batch_chars: 500,
            protected_tools: Vec::new(),
            protected_paths: vec!["**/skills/**/*.md".to_string()],
            spill_threshold: 65_536,
            spill_preview_bytes: 2048,
            prune_on: PruneOn::AgentMessage,
            auto_budget_threshold: DEFAULT_AUTO_BUDGET,
            rolling_window: 0,
            recovery_grace_turns: 3,
            purge_errors: true,
            purge_min_chars: 500,
            purge_after_turns: 2,
            dedup: true,
            thinking_strip: true,
            condense_args_chars: 40,
            min_prune_tokens: 1000,
            recover_large_context: true,
            live_reads_tokens: DEFAULT_LIVE_READS_TOKENS,
            live_reads_turns: DEFAULT_LIVE_READS_TURNS,
        }
    }
}

/// `liveReadsTokens`' default: the agent's own files it reads back stay verbatim up to this many tokens
/// (chosen from the corpus figures, `docs/pruning.md`, "Reading back its own files").
pub const DEFAULT_LIVE_READS_TOKENS: u64 = 12_000;

/// `liveReadsTurns`' default: a read is kept at most this many assistant turns.
pub const DEFAULT_LIVE_READS_TURNS: u64 = 8;

/// The budget trigger's default, chosen from the corpus figures (see `docs/pruning.md`).
pub const DEFAULT_AUTO_BUDGET: u64 = 1_200;

/// The budget trigger's threshold once the user is in the loop (see [`IN_THE_LOOP_PROMPTS`]), under
/// `pruneOn: agent-message`: the next final reply will prune everything read at once, so a prune before it
/// breaks the cache for little. Used when larger than `autoBudgetThreshold` (see `docs/pruning.md`).
pub const AWAITING_REPLY_BUDGET: u64 = 14_000;

/// User prompts answering a final reply after which the user counts as in the loop.
pub const IN_THE_LOOP_PROMPTS: u32 = 2;

/// The budget trigger's threshold in the first turns of a session whose user is not in the loop yet
/// (fewer than [`AUTONOMOUS_AFTER_TURNS`]), when larger than `autoBudgetThreshold`.
pub const FIRST_TURNS_BUDGET: u64 = 3_000;

/// Assistant turns after which a session whose user is not in the loop counts as an autonomous run (one
/// prompt running into many calls): the budget trigger then prunes at `autoBudgetThreshold`.
pub const AUTONOMOUS_AFTER_TURNS: u32 = 40;

/// A configuration as a user wrote it: every field optional, numbers as given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RawConfig {
    /// See [`PruneConfig::enabled`].
    pub enabled: Option<bool>,
    /// See [`PruneConfig::batching_mode`].
    pub batching_mode: Option<BatchingMode>,
    /// See [`PruneConfig::min_batch_chars`].
    pub min_batch_chars: Option<f64>,
    /// See [`PruneConfig::protected_tools`].
    pub protected_tools: Option<Vec<String>>,
    /// See [`PruneConfig::protected_paths`].
    pub protected_paths: Option<Vec<String>>,
    /// See [`PruneConfig::spill_threshold`].
    pub spill_threshold: Option<f64>,
    /// See [`PruneConfig::spill_preview_bytes`].
    pub spill_preview_bytes: Option<f64>,
    /// See [`PruneConfig::prune_on`].
    pub prune_on: Option<PruneOn>,
    /// See [`PruneConfig::auto_budget_threshold`].
    pub auto_budget_threshold: Option<f64>,
    /// See [`PruneConfig::rolling_window`].
    pub rolling_window: Option<f64>,
    /// See [`PruneConfig::recovery_grace_turns`].
    pub recovery_grace_turns: Option<f64>,
    /// See [`PruneConfig::purge_errors`].
    pub purge_errors: Option<bool>,
    /// See [`PruneConfig::purge_min_chars`].
    pub purge_min_chars: Option<f64>,
    /// See [`PruneConfig::purge_after_turns`].
    pub purge_after_turns: Option<f64>,
    /// See [`PruneConfig::dedup`].
    pub dedup: Option<bool>,
    /// See [`PruneConfig::thinking_strip`].
    pub thinking_strip: Option<bool>,
    /// See [`PruneConfig::condense_args_chars`].
    pub condense_args_chars: Option<f64>,
    /// See [`PruneConfig::min_prune_tokens`].
    pub min_prune_tokens: Option<f64>,
    /// See [`PruneConfig::recover_large_context`].
    pub recover_large_context: Option<bool>,
    /// See [`PruneConfig::live_reads_tokens`].
    pub live_reads_tokens: Option<f64>,
    /// See [`PruneConfig::live_reads_turns`].
    pub live_reads_turns: Option<f64>,
}

/// The scalar convention of seed 000: unset, negative, NaN or non-finite → the default; an explicit 0 is
/// kept (a kill switch); a positive fraction is floored.
pub fn normalize_count(value: Option<f64>, default: u64) -> u64 {
    match value {
        Some(v) if v.is_finite() && v >= 0.0 => v.floor() as u64,
        _ => default,
    }
}

impl RawConfig {
    /// The normalized configuration.
    pub fn normalize(&self) -> PruneConfig {
        let d = PruneConfig::default();
        PruneConfig {
            enabled: self.enabled.unwrap_or(d.enabled),
            batching_mode: self.batching_mode.unwrap_or(d.batching_mode),
            min_batch_chars: normalize_count(self.min_batch_chars, d.min_batch_chars),
            protected_tools: self.protected_tools.clone().unwrap_or(d.protected_tools),
            protected_paths: self.protected_paths.clone().unwrap_or(d.protected_paths),
            spill_threshold: normalize_count(self.spill_threshold, d.spill_threshold),
            spill_preview_bytes: normalize_count(self.spill_preview_bytes, d.spill_preview_bytes),
            prune_on: self.prune_on.unwrap_or(d.prune_on),
            auto_budget_threshold: normalize_count(self.auto_budget_threshold, d.auto_budget_threshold).min(AUTO_BUDGET_CAP),
            rolling_window: normalize_count(self.rolling_window, d.rolling_window),
            recovery_grace_turns: normalize_count(self.recovery_grace_turns, d.recovery_grace_turns),
            purge_errors: self.purge_errors.unwrap_or(d.purge_errors),
            purge_min_chars: normalize_count(self.purge_min_chars, d.purge_min_chars),
            purge_after_turns: normalize_count(self.purge_after_turns, d.purge_after_turns),
            dedup: self.dedup.unwrap_or(d.dedup),
            thinking_strip: self.thinking_strip.unwrap_or(d.thinking_strip),
            condense_args_chars: normalize_count(self.condense_args_chars, d.condense_args_chars),
            min_prune_tokens: normalize_count(self.min_prune_tokens, d.min_prune_tokens),
            recover_large_context: self.recover_large_context.unwrap_or(d.recover_large_context),
            live_reads_tokens: normalize_count(self.live_reads_tokens, d.live_reads_tokens).min(LIVE_READS_CAP),
            live_reads_turns: normalize_count(self.live_reads_turns, d.live_reads_turns),
        }
    }
}

/// Preset values offered for `recoveryGraceTurns` (settings parity with `minBatchChars` and
/// `rollingWindow`).
pub const RECOVERY_GRACE_PRESETS: &[u64] = &[0, 1, 2, 3, 5, 8];
/// Preset values offered for `minBatchChars`.
pub const MIN_BATCH_CHARS_PRESETS: &[u64] = &[0, 500, 1000, 2000, 5000];
/// Preset values offered for `rollingWindow`.
pub const ROLLING_WINDOW_PRESETS: &[u64] = &[0, 1, 2, 3, 5, 10];
/// Preset values offered for `autoBudgetThreshold`.
pub const AUTO_BUDGET_PRESETS: &[u64] = &[0, 1_200, 2_000, 4_000, 8_000, 20_000, 50_000, 300_000];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_follows_the_seed() {
        let grace = |v: Option<f64>| RawConfig { recovery_grace_turns: v, ..RawConfig::default() }.normalize().recovery_grace_turns;
        assert_eq!(grace(Some(0.0)), 0, "explicit 0 is a kill switch");
        assert_eq!(grace(Some(-1.0)), 3);
        assert_eq!(grace(Some(f64::NAN)), 3);
        assert_eq!(grace(Some(f64::INFINITY)), 3);
        assert_eq!(grace(Some(2.7)), 2);
        assert_eq!(grace(None), 3);
        let budget = RawConfig { auto_budget_threshold: Some(1e9), ..RawConfig::default() }.normalize();
        assert_eq!(budget.auto_budget_threshold, AUTO_BUDGET_CAP);
        assert_eq!(RawConfig::default().normalize(), PruneConfig::default());
    }
}
