//! `condense`'s command line as a library: the clap declaration ([`cli`]), the dispatcher ([`run`]), the
//! commands' bodies (`commands`, one module per command), and `condense serve` with the route other
//! commands take while a server holds the store. The binary is a thin `main` over [`run::main`];
//! `cargo xtask man` reads [`cli::command`] for the man page.
//!
//! The modules depend one way: `run` calls `commands`, `serve` and `watch`; they use `shared` and
//! `output`, never `run` (what they need of it, running a command captured, is handed to them).
//!
//! # Example
//!
//! A command run as the binary runs it, with its output captured (what `condense serve` does for the
//! commands other processes route through it):
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let store = condense_engine::Store::open(dir.path().join("store")).unwrap();
//! store.create_session("demo").unwrap();
//! let (stdout, _stderr, code) = condense_cli::run::run_captured(&store, vec!["sessions".into(), "--json".into()]);
//! assert_eq!(code, 0);
//! let sessions: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
//! assert_eq!(sessions[0]["name"], "demo");
//! ```

#[macro_use]
mod output;
pub mod cli;
mod commands;
mod launch;
mod plot;
pub mod run;
mod serve;
mod shared;
mod watch;
