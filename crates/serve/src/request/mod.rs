//! A request's way through serve, one module per step, each step calling only the ones after it:
//!
//! ```text
//! client ─▶ routes ─▶ read ─▶ conversation ─▶ rounds ─▶ upstream ─▶ provider
//!                                                │
//! client ◀──────────────── response ◀────────────┘
//! ```
//!
//! - [`routes`]: where a request enters (its token checked first when serve asks for one), and the
//!   handlers that walk it down the path;
//! - [`read`]: the body read into a [`read::Req`] (fields as written, message units, tools, overhead);
//! - [`conversation`]: the conversation found or created, the request recorded, the context prepared
//!   and the upstream body written, on a blocking thread with the conversation locked;
//! - [`rounds`]: the request sent, overflows retried once after a checkpoint, condense's own tool calls
//!   answered and the request continued, as JSON or as one stream;
//! - [`upstream`]: the upstream body and headers, and the send;
//! - [`response`]: what the client gets back, errors in the API's own shape.
//!
//! The shared state (`crate::state`), the wire formats (`crate::api`, `crate::stream`) and the
//! conversation's bookkeeping (`crate::conv`, `crate::track`) lie below all of them.

pub(crate) mod conversation;
pub(crate) mod read;
pub(crate) mod response;
pub(crate) mod rounds;
pub(crate) mod routes;
pub(crate) mod upstream;
