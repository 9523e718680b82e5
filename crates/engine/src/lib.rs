//! The embedding facade. A host opens a [`Store`], gets a [`Session`], appends the events it sees and
//! calls [`Session::render`] before each model request.
//!
//! Each session keeps a warm [`Projection`](condense_render::Projection) in memory: appends update it with the events they wrote, and a
//! render that finds the log ahead (another handle appended) folds the missing events first. Rendering at
//! an earlier point (`render_at`) folds a fresh projection from the log.
//!
//! # Example
//!
//! The loop a host runs: report what happened, then ask for the context before each model request.
//!
//! ```
//! use condense_engine::{Store, StoreOptions};
//! use condense_events::{Block, Entry, Message, SourceEvent, UserOrigin};
//!
//! let store = Store::in_memory(StoreOptions::default()); // or Store::open(".condense")
//! let session = store.create_session("demo")?;
//! let entry = |id: &str, parent: &str, m: Message| SourceEvent::EntryAppended {
//!     id: id.into(),
//!     parent: (!parent.is_empty()).then(|| parent.to_string()),
//!     entry: Entry::Message(m),
//! };
//! let ls = Message::Assistant {
//!     content: vec![Block::tool_call("c1".into(), "bash".into(), r#"{"command":"ls"}"#.into())],
//!     model: None,
//!     stop: None,
//!     usage: None,
//! };
//! let listing = Message::ToolResult { call_id: "c1".into(), tool_name: "bash".into(), content: vec![Block::Text { text: "Cargo.toml\nsrc\n".into() }], is_error: false };
//! session.append(vec![entry("u1", "", Message::user_text("what is here?", UserOrigin::Prompt))])?;
//! let context = session.prepare()?; // request 1: the prompt
//! assert_eq!(context.messages.len(), 1);
//! session.append(vec![entry("a1", "u1", ls), entry("r1", "a1", listing)])?;
//! let context = session.prepare()?; // request 2: the call and its output, captured as t1
//! assert_eq!(context.messages.len(), 3);
//! // Every original stays one `context_tree_query` away.
//! let answer = session.query_tool(r#"{"refs": ["t1"]}"#)?;
//! assert!(!answer.is_error && answer.text.contains("Cargo.toml"));
//! # Ok::<(), condense_engine::EngineError>(())
//! ```

pub mod accounts;
pub mod config;
pub mod controller;
pub mod demo;
pub mod pipeline;
pub mod prices;
pub mod query;
pub mod recover;
pub mod retention;
pub mod simulate;
mod stats;
pub mod tools;

mod fork;
mod history;
mod import;
mod session;
mod store;

use condense_events::Seq;
use condense_log::LogError;

pub use condense_formats::{Diagnostic, Format};
pub use stats::Stats;

pub use import::{ImportAction, ImportOutcome};
pub use session::Shrinking;
pub use store::{least_recently_used, Session, Store, StoreOptions, DEFAULT_WARM_BYTES};

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// An import failed as a whole.
    #[error(transparent)]
    Format(#[from] condense_formats::FormatError),
    /// No session has this name.
    #[error("no session named `{0}`")]
    UnknownSession(String),
    /// The session has no entry with this id.
    #[error("session `{name}` has no entry `{entry}` (`condense render SESSION --entry-ids` lists them)")]
    UnknownEntry {
        /// The session.
        name: String,
        /// The id asked for.
        entry: String,
    },
    /// The session has no such checkpoint.
    #[error("session `{name}` has {what}")]
    UnknownCheckpoint {
        /// The session.
        name: String,
        /// What it lacks (`no checkpoint c5`, `no checkpoints yet`).
        what: String,
    },
    /// A pipeline stage failed (a summarizer, a blob write); nothing of that run was stored.
    #[error("session `{name}`: pruning pipeline: {reason}")]
    Pipeline {
        /// The session.
        name: String,
        /// What failed.
        reason: String,
    },
    /// No checkpoint could bring the context under the model's budget; the run must stop before the
    /// next request.
    #[error("session `{name}`: {code}: {reason}")]
    CompactionFailed {
        /// The session.
        name: String,
        /// The stable error code (`CONTEXT_COMPACTION_FAILED`).
        code: String,
        /// What failed.
        reason: String,
    },
    /// The payload guard rejected an oversized request after a model change; the overflow is recorded
    /// and the next `prepare` recovers.
    #[error("session `{name}`: context overflow: the request is {bytes} bytes, over {limit} for the new model")]
    ContextOverflow {
        /// The session.
        name: String,
        /// The payload's size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// An entry was to be appended under a parent the log no longer holds: the store lost its newest
    /// events (a PostgreSQL server's commits not yet durable, lost in a crash) after the host read them.
    /// Nothing was written; the host folds its view again and the client's retry records what was lost.
    #[error("session `{name}`: entry `{parent}` is gone from the store (its newest events were lost in a database crash before they were acknowledged); nothing was written: send the request again")]
    ParentLost {
        /// The session.
        name: String,
        /// The parent the entry named.
        parent: String,
    },
    /// A recovery tool was called with arguments it cannot take, or an archive cannot be built.
    #[error(transparent)]
    Recovery(condense_recovery::RecoveryError),
    /// A session name belongs to something else than the file being imported.
    #[error("session `{name}` exists already and {reason}; import the file under another name")]
    NameTaken {
        /// The session.
        name: String,
        /// What the session holds instead.
        reason: String,
    },
    /// A render was asked for at a sequence number past the session's head.
    #[error("session `{name}` has {head} events; cannot render at {at}")]
    PastHead {
        /// The session.
        name: String,
        /// Its head.
        head: Seq,
        /// The requested point.
        at: Seq,
    },
}

/// Result type of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// The README's examples, compiled and run as this crate's doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
