//! Where a command's output goes: the terminal, or the capture buffers of a command run inside
//! `condense serve` for another process; the `outln!`/`out!`/`errln!` macros every command prints with,
//! and an error as one line.

use std::io::Write;

thread_local! {
    /// Where output goes when a command runs inside `condense serve` for another process: captured
    /// stdout and stderr instead of the terminal.
    static CAPTURE: std::cell::RefCell<Option<(Vec<u8>, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
}

/// Sends this thread's output to fresh capture buffers from now on.
pub(crate) fn start_capture() {
    CAPTURE.with(|c| *c.borrow_mut() = Some((Vec::new(), Vec::new())));
}

/// Ends the capture: what was written to stdout and to stderr since [`start_capture`].
pub(crate) fn take_capture() -> (Vec<u8>, Vec<u8>) {
    CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default()
}

/// Writes to stdout, or to the capture buffer when one is set.
pub fn out_write(args: std::fmt::Arguments) -> std::io::Result<()> {
    CAPTURE.with(|c| match &mut *c.borrow_mut() {
        Some((out, _)) => out.write_fmt(args),
        None => std::io::stdout().write_fmt(args),
    })
}

/// Writes to stderr, or to the capture buffer when one is set.
pub fn err_write(args: std::fmt::Arguments) {
    CAPTURE.with(|c| match &mut *c.borrow_mut() {
        Some((_, err)) => {
            let _ = err.write_fmt(args);
        }
        None => {
            let _ = std::io::stderr().write_fmt(args);
        }
    })
}

/// An error and its causes on one line; a cause whose text the message already carries is not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.ends_with(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

/// `println!` that returns the write error instead of panicking (a closed pipe ends the command quietly).
macro_rules! outln {
    ($($t:tt)*) => { crate::output::out_write(format_args!("{}\n", format_args!($($t)*)))? };
}
macro_rules! out {
    ($($t:tt)*) => { crate::output::out_write(format_args!($($t)*))? };
}
macro_rules! errln {
    ($($t:tt)*) => { crate::output::err_write(format_args!("{}\n", format_args!($($t)*))) };
}
