//! The vocabulary every other crate speaks: the neutral message model (user, assistant and tool-result
//! messages made of text, thinking, tool-call and image blocks), the source events a host reports, the
//! decision events the engine's own stages write, and the envelope that carries either into the log.
//!
//! Everything here is plain data. Stored types avoid `flatten`, `skip` and `untagged` so that bincode's
//! positional encoding stays valid; new variants are only ever appended at the end of an enum, so older
//! logs keep decoding.
//!
//! # Example
//!
//! ```
//! use condense_events::{Block, Entry, Event, Message, SourceEvent, UserOrigin};
//!
//! let call = Message::Assistant {
//!     content: vec![Block::tool_call("c1".into(), "bash".into(), r#"{"command":"ls"}"#.into())],
//!     model: None,
//!     stop: None,
//!     usage: None,
//! };
//! assert_eq!(call.tool_calls().collect::<Vec<_>>(), vec![("c1", "bash", r#"{"command":"ls"}"#)]);
//! // What a host reports is a source event; the log stores it as an `Event`.
//! let appended = Event::Source(SourceEvent::EntryAppended {
//!     id: "u1".into(),
//!     parent: None,
//!     entry: Entry::Message(Message::user_text("list the files", UserOrigin::Prompt)),
//! });
//! assert!(matches!(appended, Event::Source(SourceEvent::EntryAppended { .. })));
//! ```

mod config;
mod message;

pub use config::{
    normalize_count, BatchingMode, PruneConfig, PruneOn, RawConfig, AUTO_BUDGET_CAP, AUTO_BUDGET_PRESETS, LIVE_READS_CAP,
    AUTONOMOUS_AFTER_TURNS, AWAITING_REPLY_BUDGET, DEFAULT_AUTO_BUDGET, DEFAULT_LIVE_READS_TOKENS, DEFAULT_LIVE_READS_TURNS, FIRST_TURNS_BUDGET, IN_THE_LOOP_PROMPTS, MIN_BATCH_CHARS_PRESETS, RECOVERY_GRACE_PRESETS, ROLLING_WINDOW_PRESETS,
};
pub use message::{host_context_kind, host_summary_text, Block, Context, Image, Message, Opaque, StopReason, Thinking, ToolCall, Usage, UserOrigin};

use serde::{Deserialize, Serialize};

/// The schema version written into every envelope. Bump it when a stored type changes shape.
pub const SCHEMA_VERSION: u16 = 1;

/// Numeric id the store gives a session; keys are big-endian `(session, seq)`.
pub type SessionId = u64;

/// Position of an event inside its session, starting at 1 and without gaps.
pub type Seq = u64;

/// One stored event: who it belongs to, where it sits, and what it says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Schema version of `body` (see [`SCHEMA_VERSION`]).
    pub schema: u16,
    /// The session the event belongs to.
    pub session: SessionId,
    /// The event's position in its session.
    pub seq: Seq,
    /// The event itself.
    pub body: Event,
}

/// Either a fact reported by the host or a decision taken by one of the engine's stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A fact from the host.
    Source(SourceEvent),
    /// A decision of the engine, resolved once and replayed forever after.
    Decision(DecisionEvent),
}

impl Event {
    /// A short, stable name for the event kind (used in reports and `condense stats`).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Source(s) => s.kind(),
            Event::Decision(d) => d.kind(),
        }
    }
}

/// Facts the host reports. Time, when known, arrives inside the event as text from the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SourceEvent {
    /// The session began. Written once, as the first event of a session.
    SessionStarted {
        /// Which host or file format the session came from (`pi`, `claude-code`, `codex`, `host`).
        source: String,
        /// The host's own id for the session, when it has one.
        source_id: Option<String>,
        /// Working directory of the agent, when known.
        cwd: Option<String>,
        /// The host's timestamp of the start, verbatim.
        timestamp: Option<String>,
    },
    /// An entry was added to the session tree. Entries with no parent start a new root.
    EntryAppended {
        /// The host's id for the entry (unique within the session).
        id: String,
        /// The entry this one follows; `None` for a root.
        parent: Option<String>,
        /// What the entry holds.
        entry: Entry,
    },
    /// The host moved its current position in the tree (branch navigation); `None` is before any entry.
    LeafMoved {
        /// The new leaf entry id.
        leaf: Option<String>,
    },
    /// A turn (one model request and the tool results it caused) ended.
    TurnEnded,
    /// The agent finished its run and waits for the user.
    AgentEnded,
    /// The model changed; the window and output limit drive the checkpoint budget.
    ModelChanged {
        /// Provider name, when known.
        provider: Option<String>,
        /// Model id.
        model: String,
        /// Context window in tokens, when known.
        context_window: Option<u64>,
        /// Output limit in tokens, when known.
        max_output: Option<u64>,
    },
    /// Token usage the provider reported for the last request.
    ProviderUsage(Usage),
    /// The provider rejected a request because the context was too long.
    ProviderOverflow {
        /// The provider's error text, verbatim.
        message: String,
    },
    /// The engine configuration changed; the value is the full configuration as JSON text.
    ConfigChanged {
        /// Full configuration as JSON text.
        json: String,
    },
    /// The importer met something in the source it could not take as it stood.
    ImportDiagnostic {
        /// Source file path as given to the importer.
        file: String,
        /// 1-based line number in that file (0 when the problem is not tied to a line).
        line: u64,
        /// What was wrong and what was done about it.
        message: String,
    },
    /// The pruning configuration in force from here on (normalized).
    PruneConfigured(PruneConfig),
    /// An import of a session file began: the file as it was read. Written before its entries, so a store
    /// can tell an import that never finished from one that did.
    ImportStarted {
        /// The file's canonical path.
        path: String,
        /// Bytes read.
        bytes: u64,
        /// blake3 of the bytes read (hex).
        hash: String,
    },
    /// The import that began with the matching `ImportStarted` wrote every event.
    ImportCompleted {
        /// The file's canonical path.
        path: String,
        /// Bytes read.
        bytes: u64,
        /// blake3 of the bytes read (hex).
        hash: String,
    },
    /// What each request carries besides the messages (system prompt, tool declarations), in estimated
    /// tokens, as the host reports it or `condense serve` counts it from the request. Budgets keep room
    /// for it. Written when it changes.
    RequestOverhead {
        /// Estimated tokens (bytes / 4, rounded up).
        tokens: u64,
    },
    /// The host sends again a request that failed because the provider refused it as too long twice in
    /// a row (`CONTEXT_COMPACTION_FAILED: PROVIDER_OVERFLOW_AFTER_RETRY`): a new attempt, which gets its
    /// own checkpoint and retry. (Appended last: stored logs read as before.)
    RequestRetried,
    /// `liveReadsTokens` of the configuration the `PruneConfigured` just before it set (a key newer than
    /// the layout of `PruneConfigured` stores already hold; written only when not 0, so a store that
    /// leaves it off reads as before). Last in this enum so that older logs decode as before.
    LiveReadsConfigured {
        /// See `PruneConfig::live_reads_tokens`.
        tokens: u64,
        /// See `PruneConfig::live_reads_turns`.
        turns: u64,
    },
    /// The host's clock at the model request the next entry answers, verbatim from the session file (an
    /// RFC 3339 timestamp such as `2026-03-01T10:00:00.123Z`): importers write one before each assistant
    /// message whose line carries a time. `simulate --cache-ttl` reads the gaps between requests from it
    /// (a request after a longer gap finds the provider's cache cold). Last in this enum so that older
    /// logs decode as before.
    HostTime {
        /// The timestamp, as the host wrote it.
        timestamp: String,
    },
}

impl PruneConfig {
    /// Takes in `e` when it sets the configuration in force: a `PruneConfigured` as stored (the keys its
    /// layout skips at their defaults, whether it was read from the log or appended in this process), the
    /// `LiveReadsConfigured` after it for those keys; any other event changes nothing.
    pub fn take_in(&mut self, e: &SourceEvent) {
        match e {
            SourceEvent::PruneConfigured(c) => *self = c.as_stored(),
            SourceEvent::LiveReadsConfigured { tokens, turns } => (self.live_reads_tokens, self.live_reads_turns) = (*tokens, *turns),
            _ => {}
        }
    }
}

impl SourceEvent {
    /// The events that make `config` the pruning configuration in force: `PruneConfigured`, and
    /// `LiveReadsConfigured` after it when `liveReadsTokens` is not 0.
    pub fn configured(config: PruneConfig) -> Vec<SourceEvent> {
        let (tokens, turns) = (config.live_reads_tokens, config.live_reads_turns);
        let mut events = vec![SourceEvent::PruneConfigured(config)];
        if tokens > 0 {
            events.push(SourceEvent::LiveReadsConfigured { tokens, turns });
        }
        events
    }

    fn kind(&self) -> &'static str {
        match self {
            SourceEvent::SessionStarted { .. } => "session_started",
            SourceEvent::EntryAppended { .. } => "entry_appended",
            SourceEvent::LeafMoved { .. } => "leaf_moved",
            SourceEvent::TurnEnded => "turn_ended",
            SourceEvent::AgentEnded => "agent_ended",
            SourceEvent::ModelChanged { .. } => "model_changed",
            SourceEvent::ProviderUsage(_) => "provider_usage",
            SourceEvent::ProviderOverflow { .. } => "provider_overflow",
            SourceEvent::ConfigChanged { .. } => "config_changed",
            SourceEvent::ImportDiagnostic { .. } => "import_diagnostic",
            SourceEvent::PruneConfigured(_) => "prune_configured",
            SourceEvent::LiveReadsConfigured { .. } => "live_reads_configured",
            SourceEvent::ImportStarted { .. } => "import_started",
            SourceEvent::ImportCompleted { .. } => "import_completed",
            SourceEvent::RequestOverhead { .. } => "request_overhead",
            SourceEvent::RequestRetried => "request_retried",
            SourceEvent::HostTime { .. } => "host_time",
        }
    }
}

/// What a session-tree entry holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// A message of the conversation.
    Message(Message),
    /// The host compacted its own context. The rendered context after it is: the summary (if any), the
    /// replacement history (if any), the path entries from `first_kept` up to this entry (if set), then
    /// everything after this entry.
    HostCompaction {
        /// The host's summary of what was dropped.
        summary: Option<String>,
        /// First entry before the compaction that stays in context (pi's `firstKeptEntryId`).
        first_kept: Option<String>,
        /// Messages that replace the history before the compaction (Codex `replacement_history`).
        replacement: Vec<Message>,
        /// Tokens before the compaction, as the host reported them.
        tokens_before: Option<u64>,
    },
    /// A summary of a branch the conversation came back from (pi `branch_summary`).
    BranchSummary {
        /// Entry the abandoned branch started from.
        from: Option<String>,
        /// The summary text.
        summary: String,
    },
    /// Host state that is not part of the model context (pi `custom`, labels, thinking-level changes).
    Marker {
        /// The host's name for the marker (`custom:<type>`, `label`, `thinking_level_change`, …).
        kind: String,
    },
}

/// Whether `s` has the form both providers accept for a tool name and a tool-call id:
/// `^[a-zA-Z0-9_-]{1,64}$` (64 is OpenAI's limit, the tighter of the two).
pub fn is_provider_identifier(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The one name of the recovery tool, shared by the tool, the grace window and chain deferral.
pub const QUERY_TOOL_NAME: &str = "context_tree_query";

/// How the block of a compressed chain begins, its number after it (`[Compressed chain b4]`, with the
/// call count when a call has no line of its own): the block's refs are the `bN` of its header and the
/// `tN` of its lines.
pub const BLOCK_HEADER: &str = "[Compressed chain b";

/// A captured tool output: the index record behind a `tN` ref.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The ref number (`t<ref_n>`).
    pub ref_n: u32,
    /// The batch it was captured in.
    pub batch: u32,
    /// Entry id of the tool-result message.
    pub entry: String,
    /// Entry id of the assistant message holding the call.
    pub call_entry: String,
    /// The provider's call id.
    pub call_id: String,
    /// Occurrence key `toolCallId@resultTimestamp` (the result's entry id stands in for the timestamp,
    /// which the neutral model does not keep: it is unique per occurrence all the same).
    pub occurrence: String,
    /// Tool name.
    pub tool: String,
    /// Arguments of the call (JSON text).
    pub arguments: String,
    /// Whether the tool reported an error.
    pub is_error: bool,
    /// Characters (UTF-16 units) of the output text.
    pub chars: u64,
    /// blake3 of tool name + normalized text (the dedup key), hex.
    pub hash: String,
    /// Turn index (assistant messages before the call on the branch).
    pub turn: u32,
    /// User-turn-group (prompts at or before the result on the branch).
    pub utg: u32,
    /// Never stubbed (protected tool or path).
    pub protected: bool,
}

/// How a batch ended at prune time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOutcome {
    /// Its outputs were summarized and are rendered as stubs.
    Summarized,
    /// Every output in it duplicates an earlier one.
    SkippedDeduped,
    /// It is smaller than `minBatchChars`.
    SkippedTrivial,
    /// Its summary was not smaller than its raw text.
    SkippedOversized,
}

impl BatchOutcome {
    /// The outcome's name as the seed writes it.
    pub fn name(self) -> &'static str {
        match self {
            BatchOutcome::Summarized => "summarized",
            BatchOutcome::SkippedDeduped => "skipped-deduped",
            BatchOutcome::SkippedTrivial => "skipped-trivial",
            BatchOutcome::SkippedOversized => "skipped-oversized",
        }
    }
}

/// Decisions of the engine's stages. Later stages add variants at the end of this enum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DecisionEvent {
    /// A free-form note from a stage, kept for audit (never rendered).
    Note {
        /// The stage that wrote it.
        stage: String,
        /// What it decided.
        text: String,
    },
    /// A tool output was captured and indexed.
    /// (Boxed: a record is 200 bytes, most decisions a few dozen, and a pass lists thousands of them.)
    OutputCaptured(Box<Record>),
    /// An output was written to a blob file; its stub shows the preview.
    OutputSpilled {
        /// The ref.
        ref_n: u32,
        /// blake3 of the blob (hex).
        blob: String,
        /// Bytes of the output.
        bytes: u64,
        /// The head preview shown in the stub.
        preview: String,
    },
    /// An output duplicates an earlier one and stands for it.
    OutputAliased {
        /// The duplicate's ref.
        ref_n: u32,
        /// The original's ref.
        original: u32,
    },
    /// A batch was closed at prune time.
    BatchClosed {
        /// The batch.
        batch: u32,
        /// Its refs.
        refs: Vec<u32>,
        /// What happened to it.
        outcome: BatchOutcome,
        /// The summary of each summarized ref, in ref order.
        summaries: Vec<(u32, String)>,
    },
    /// The frontier moved: every tool result up to this entry is captured.
    FrontierAdvanced {
        /// The last entry captured.
        entry: String,
    },
    /// The arguments of a failed call are replaced by a marker from now on.
    ErrorArgsPurged {
        /// Entry id of the assistant message.
        entry: String,
        /// The call id.
        call_id: String,
        /// Characters of the arguments purged.
        chars: u64,
    },
    /// A closed chain was compressed into one block (boxed, as the checkpoint below: a pass lists
    /// thousands of decisions, and a list is laid out for its largest kind).
    ChainCompressed(Box<ChainCompressed>),
    /// A checkpoint now stands in for the history up to `boundary` (seed 001).
    CheckpointCommitted(Box<CheckpointCommitted>),
    /// A checkpoint could not bring the context under budget; the run stops before the next request.
    CheckpointFailed {
        /// Stable error code (`CONTEXT_COMPACTION_FAILED`).
        code: String,
        /// What failed.
        reason: String,
    },
    /// An archive view was committed: the public context as it stood after event `seq` on branch `leaf`
    /// (seed 004). The archive is rebuilt from the log, never copied.
    ArchiveCommitted {
        /// The archive id (`a<n>`).
        id: String,
        /// The last event the view includes.
        seq: u64,
        /// The leaf of the branch it views.
        leaf: Option<String>,
    },
    /// The controller started a checkpoint (written with its outcome, in the same durable group).
    CheckpointStarted {
        /// Why: `threshold`, `new_context`, `overflow` or `manual`.
        reason: String,
        /// Estimated tokens of the context when it started.
        tokens: u64,
    },
    /// The final reply of compressed chain `block` renders as `text` from now on: its head and a marker
    /// naming the block, whose query gives the whole reply back. Decided at the prune that compresses the
    /// chain (the same cache break). Last in this enum so that logs written before it decode as before.
    ChainReplyCut {
        /// The block number (`b<block>`).
        block: u32,
        /// What the reply's text renders as.
        text: String,
    },
    /// An output its batch left verbatim (a file read still live: no later read or edit of the file)
    /// renders as its stub from now on: a later call superseded it, or newer live reads took its room.
    /// Decided at a prune that happens anyway. Last in this enum so that older logs decode as before.
    OutputStubbed {
        /// The output's ref.
        ref_n: u32,
        /// Its summary (the stub).
        summary: String,
    },
}

/// What [`DecisionEvent::ChainCompressed`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainCompressed {
    /// The block number (`b<block>`).
    pub block: u32,
    /// Entry id of the chain's user prompt.
    pub first: String,
    /// Entry id of the chain's final text-only reply.
    pub last: String,
    /// The tool refs inside the chain.
    pub refs: Vec<u32>,
    /// The block's text.
    pub body: String,
}

/// What [`DecisionEvent::CheckpointCommitted`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCommitted {
    /// The checkpoint number (`c<n>`).
    pub n: u32,
    /// Entry id of the last entry the checkpoint covers.
    pub boundary: String,
    /// The summary that replaces the covered history.
    pub summary: String,
    /// Entry ids of the recent user prompts retained after the summary.
    pub kept: Vec<String>,
    /// Tool refs inside the covered span (they stay recoverable).
    pub covers: Vec<u32>,
    /// Whether this is the retained-tail recovery without a model summary (ADR 0049).
    pub recovery: bool,
    /// Bounded copies of the final tool batch, used in the model context in place of the results
    /// with these entry ids (the originals stay complete in the log).
    pub bounded: Vec<(String, String)>,
    /// Tokens of the context before and after, as estimated when it was made.
    pub tokens_before: u64,
    /// See `tokens_before`.
    pub tokens_after: u64,
}

impl DecisionEvent {
    fn kind(&self) -> &'static str {
        match self {
            DecisionEvent::Note { .. } => "note",
            DecisionEvent::OutputCaptured(_) => "output_captured",
            DecisionEvent::OutputSpilled { .. } => "output_spilled",
            DecisionEvent::OutputAliased { .. } => "output_aliased",
            DecisionEvent::BatchClosed { .. } => "batch_closed",
            DecisionEvent::OutputStubbed { .. } => "output_stubbed",
            DecisionEvent::FrontierAdvanced { .. } => "frontier_advanced",
            DecisionEvent::ErrorArgsPurged { .. } => "error_args_purged",
            DecisionEvent::ChainCompressed(_) => "chain_compressed",
            DecisionEvent::CheckpointCommitted(_) => "checkpoint_committed",
            DecisionEvent::CheckpointFailed { .. } => "checkpoint_failed",
            DecisionEvent::CheckpointStarted { .. } => "checkpoint_started",
            DecisionEvent::ArchiveCommitted { .. } => "archive_committed",
            DecisionEvent::ChainReplyCut { .. } => "chain_reply_cut",
        }
    }
}

/// Errors shared by every crate that speaks this vocabulary.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum EventError {
    /// A stored envelope carries a schema version this build does not know.
    #[error("event {session}:{seq} has schema version {found}, this build reads up to {supported}")]
    UnknownSchema {
        /// Session of the event.
        session: SessionId,
        /// Sequence number of the event.
        seq: Seq,
        /// Version found.
        found: u16,
        /// Highest version this build reads.
        supported: u16,
    },
}
