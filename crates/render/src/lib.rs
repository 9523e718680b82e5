//! The projection: a pure fold from a session's events to the context the model is sent next.
//!
//! [`Projection`] absorbs events one at a time (so the engine keeps it warm and updates it on every
//! append) and [`Projection::render`] walks the active branch, applies the newest host compaction on it,
//! and repairs tool-call pairing the way providers require. Nothing here reads a clock, the environment or
//! a `HashMap`'s iteration order: the same events always give the same bytes.
//!
//! # Example
//!
//! Rendering a small session: a call whose result never came gets a synthetic one, so the context stays
//! valid for every provider.
//!
//! ```
//! use condense_events::{Block, Entry, Event, Message, SourceEvent, UserOrigin};
//! use condense_render::{Projection, SYNTHETIC_RESULT_TEXT};
//!
//! let entry = |id: &str, parent: Option<&str>, m: Message| {
//!     Event::Source(SourceEvent::EntryAppended { id: id.into(), parent: parent.map(Into::into), entry: Entry::Message(m) })
//! };
//! let call = Message::Assistant {
//!     content: vec![Block::tool_call("c1".into(), "bash".into(), "{}".into())],
//!     model: None,
//!     stop: None,
//!     usage: None,
//! };
//! let mut p = Projection::new();
//! p.apply(1, &entry("u1", None, Message::user_text("run it", UserOrigin::Prompt)));
//! p.apply(2, &entry("a1", Some("u1"), call));
//! let rendered = p.render();
//! assert_eq!(rendered.messages.len(), 3);
//! assert_eq!(rendered.report.synthetic_results, vec!["c1".to_string()]);
//! assert_eq!(rendered.messages[2].text(), SYNTHETIC_RESULT_TEXT);
//! // The render is a pure function of the events: the same events, the same context.
//! assert!(condense_render::check(&rendered.messages).is_empty());
//! ```

mod args;
mod project;
mod validity;

pub use project::{room_to_reserve, BranchView, Messages, ModelInfo, Projection, RenderReport, Rendered, TranscriptRow, ENTRY_WEIGHT, SYNTHETIC_RESULT_TEXT};
pub use validity::{check, check_from, recheck, Rule, Violation, RULES};
