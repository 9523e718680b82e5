//! The real agent CLIs the end-to-end tests drive, at the versions pinned in
//! `crates/cli/tests/e2e-clients.txt` (one `package@version` a line), installed from npm into a folder
//! once: a stamp file holds the pins installed, so the same pins install nothing again. CI installs them
//! with `cargo xtask clients` (then `cargo xtask test`); the end-to-end tests (`serve_e2e.rs`) include this
//! file too, so a plain `cargo test` installs them on first use.

use std::path::Path;
use std::process::Command;

/// The pinned client versions.
pub const PINS: &str = include_str!("../../crates/cli/tests/e2e-clients.txt");

/// Installs the pinned clients into `dir` (its `node_modules`) unless they are there already.
pub fn install(dir: &Path) -> Result<(), String> {
    let pinned: Vec<&str> = PINS.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let stamp = dir.join("installed.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(pinned.join("\n").as_str()) {
        return Ok(());
    }
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join("package.json"), r#"{"name":"condense-e2e-clients","private":true,"version":"0.0.0"}"#).map_err(io)?;
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
        .args(&pinned)
        .current_dir(dir)
        .status()
        .map_err(|e| format!("npm must be installed to run the end-to-end tests ({e})"))?;
    if !status.success() {
        return Err(format!("npm install of {} failed ({status})", pinned.join(" ")));
    }
    std::fs::write(&stamp, pinned.join("\n")).map_err(io)
}
