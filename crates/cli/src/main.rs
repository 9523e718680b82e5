//! `condense`: import agent sessions into a store, serve them live, inspect them, render their context,
//! verify the store. See `condense --help`; the commands live in the `condense_cli` library.

use std::process::ExitCode;

// glibc's allocator spends much of a long-running server's time consolidating a heap that many threads
// allocate from and free into (measured on `condense serve`: docs/benchmarks.md); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Arguments are taken as the OS gives them: paths need not be UTF-8.
    condense_cli::run::main(std::env::args_os().skip(1).collect())
}
