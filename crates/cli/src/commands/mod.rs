//! The commands' bodies, one module per command or group of commands. Each returns its exit code; errors
//! bubble up to the dispatcher (`run`), which prints them as one line on stderr.

pub(crate) mod config;
pub(crate) mod demo;
pub(crate) mod history;
pub(crate) mod import;
pub(crate) mod inspect;
pub(crate) mod simulate;
pub(crate) mod verify;
