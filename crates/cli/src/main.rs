//! `condense`: import agent sessions into a store, inspect them, render their context, verify the store.
//!
//! Every command takes `--store DIR` (default `./.condense`) and the reporting ones `--json`. Errors are
//! one line on stderr and a non-zero exit.

mod args;
mod commands;
mod serve;

use std::process::ExitCode;

// glibc's allocator spends much of a long-running server's time consolidating a heap that many threads
// allocate from and free into (measured on `condense serve`: docs/benchmarks.md); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Arguments are read as the OS gives them: one that is not UTF-8 is named in an error, never a panic.
    let mut argv = Vec::new();
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(raw) => {
                eprintln!("condense: argument {} ({}) is not valid UTF-8; condense takes UTF-8 paths and names", i + 1, raw.to_string_lossy());
                return ExitCode::from(2);
            }
        }
    }
    match commands::run(argv) {
        Ok(code) => code,
        Err(e) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)) => {
            // The reader went away (`condense … | head`): not an error of ours.
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("condense: {}", commands::error_text(&e));
            ExitCode::from(2)
        }
    }
}
