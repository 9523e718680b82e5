//! The projection: a pure fold from a session's events to the context the model is sent next.
//!
//! [`Projection`] absorbs events one at a time (so the engine keeps it warm and updates it on every
//! append) and [`Projection::render`] walks the active branch, applies the newest host compaction on it,
//! and repairs tool-call pairing the way providers require. Nothing here reads a clock, the environment or
//! a `HashMap`'s iteration order: the same events always give the same bytes.

mod args;
mod project;
mod validity;

pub use project::{BranchView, Messages, ModelInfo, Projection, RenderReport, Rendered, TranscriptRow, SYNTHETIC_RESULT_TEXT};
pub use validity::{check, check_from, recheck, Rule, Violation, RULES};
