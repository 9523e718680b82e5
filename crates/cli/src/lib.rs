//! `condense`'s command line as a library: the clap declaration ([`cli`]), the commands ([`commands`]),
//! and `condense serve` with the route other commands take while a server holds the store. The binary is
//! a thin `main` over [`commands::main`]; `cargo xtask man` reads [`cli::command`] for the man page.

pub mod cli;
#[macro_use]
pub mod commands;
mod plot;
mod serve;
mod watch;
