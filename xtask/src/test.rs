//! `cargo xtask test`: the whole test suite on a fresh machine. It installs what the suite needs and the
//! machine lacks, then runs `cargo test --workspace` (extra arguments go to it):
//!
//! - PostgreSQL's server binaries (Debian's `postgresql`), for the tests of the PostgreSQL backend, which
//!   start throwaway clusters of their own;
//! - Debian's Chromium and ChromeDriver (`chromium`, `chromium-driver`), for the dashboard's browser tests;
//! - the real Claude Code, pi and Codex CLIs at the versions pinned in `crates/cli/tests/e2e-clients.txt`,
//!   installed with npm under `target/e2e-clients` (once: a rerun with the same pins installs nothing).
//!
//! Debian packages are installed with `apt-get` as root, or through `sudo` when that works without a
//! password; otherwise the command says what to install and stops.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// The Debian packages the suite needs, each with a file that tells it is installed.
fn missing_packages() -> Vec<&'static str> {
    let mut out = Vec::new();
    let initdb = std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten().any(|v| v.path().join("bin/initdb").exists()) || on_path("initdb");
    if !initdb {
        out.push("postgresql");
    }
    if !Path::new("/usr/bin/chromium").exists() && !on_path("chromium") {
        out.push("chromium");
    }
    if !Path::new("/usr/bin/chromedriver").exists() && !on_path("chromedriver") {
        out.push("chromium-driver");
    }
    out
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

fn apt_install(packages: &[&str]) -> Result<()> {
    let root = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false);
    let sudo: &[&str] = if root {
        &[]
    } else if Command::new("sudo").args(["-n", "true"]).status().is_ok_and(|s| s.success()) {
        &["sudo", "-n"]
    } else {
        bail!("the test suite needs Debian's {} (apt-get install {}); run this as root or with password-less sudo, or install them first", packages.join(", "), packages.join(" "));
    };
    println!("xtask test: installing {} (Debian's packages)", packages.join(", "));
    let run = |args: &[&str]| -> Result<()> {
        let (cmd, rest) = match sudo.split_first() {
            Some((s, more)) => (*s, more.iter().copied().chain(args.iter().copied()).collect::<Vec<_>>()),
            None => (args[0], args[1..].to_vec()),
        };
        let st = Command::new(cmd).args(&rest).env("DEBIAN_FRONTEND", "noninteractive").status().with_context(|| format!("running {cmd}"))?;
        if !st.success() {
            bail!("`{}` failed ({st})", args.join(" "));
        }
        Ok(())
    };
    run(&["apt-get", "update", "-qq"])?;
    let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages);
    run(&install)
}

/// Installs the pinned agent CLIs under `target/e2e-clients` unless the same pins are installed there.
fn npm_clients(root: &Path) -> Result<std::path::PathBuf> {
    let dir = root.join("target/e2e-clients");
    let pins: Vec<String> = std::fs::read_to_string(root.join("crates/cli/tests/e2e-clients.txt"))?.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
    let stamp = dir.join("installed.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(pins.join("\n").as_str()) {
        return Ok(dir);
    }
    if !on_path("npm") {
        bail!("the end-to-end tests need node and npm (to install {})", pins.join(" "));
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("package.json"), r#"{"name":"condense-e2e-clients","private":true,"version":"0.0.0"}"#)?;
    println!("xtask test: installing {} with npm", pins.join(" "));
    let st = Command::new("npm").current_dir(&dir).args(["install", "--no-audit", "--no-fund", "--loglevel=error"]).args(&pins).status()?;
    if !st.success() {
        bail!("npm install failed ({st})");
    }
    std::fs::write(&stamp, pins.join("\n"))?;
    Ok(dir)
}

/// Installs what is missing, then runs `cargo test --workspace ARGS`; its exit code is this command's.
pub fn run(args: &[String]) -> Result<()> {
    let root = crate::root();
    let missing = missing_packages();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    let clients = npm_clients(&root)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo).current_dir(&root).args(["test", "--workspace"]).args(args).env("CONDENSE_E2E_CLIENTS", &clients).status()?;
    std::process::exit(st.code().unwrap_or(1));
}
