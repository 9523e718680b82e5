//! The vocabulary every other crate speaks: the neutral message model (user, assistant and tool-result
//! messages made of text, thinking, tool-call and image blocks), the source events a host reports, the
//! decision events the engine's own stages write, and the envelope that carries either into the log.
//!
//! Everything here is plain data. Stored types avoid `flatten`, `skip` and `untagged` so that bincode's
//! positional encoding stays valid; new variants are only ever appended at the end of an enum, so older
//! logs keep decoding.

mod message;

pub use message::{Block, Context, Message, StopReason, Usage, UserOrigin};

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
}

impl SourceEvent {
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
}

impl DecisionEvent {
    fn kind(&self) -> &'static str {
        match self {
            DecisionEvent::Note { .. } => "note",
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
