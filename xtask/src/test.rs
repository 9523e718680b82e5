//! `cargo xtask test`: the whole test suite on a fresh machine. It installs what the suite needs and the
//! machine lacks, then runs `cargo test --workspace` (extra arguments go to it):
//!
//! - PostgreSQL's server binaries (Debian's `postgresql`), for the tests of the PostgreSQL backend, which
//!   start throwaway clusters of their own;
//! - Debian's Chromium and ChromeDriver (`chromium`, `chromium-driver`), for the dashboard's browser tests;
//! - the real Claude Code, pi and Codex CLIs at the versions pinned in `crates/cli/tests/e2e-clients.txt`,
//!   installed with npm under `target/e2e-clients` (once: a rerun with the same pins installs nothing).
//!
//! `cargo xtask clients` installs the agent CLIs alone and checks that each one runs.
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

/// Installs what is missing, then runs `cargo test --workspace ARGS`; its exit code is this command's.
pub fn run(args: &[String]) -> Result<()> {
    let root = crate::root();
    let missing = missing_packages();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    let clients = install_clients()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(&cargo).current_dir(&root).args(["test", "--workspace"]).args(args).env("CONDENSE_E2E_CLIENTS", &clients).status()?;
    if st.success() && args.is_empty() {
        install_check(&root, &cargo)?;
    }
    std::process::exit(st.code().unwrap_or(1));
}

/// `cargo xtask install-check`: [`install_check`] alone.
pub fn install_check_only() -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    install_check(&crate::root(), &cargo)
}

/// `cargo install` gives a `condense` that runs (issue 61, item 4), from this checkout (`--path`) and
/// from its git repository (`--git`, the committed state, through a `file://` URL: no network). Both with
/// the lock file (`--locked`, as the README says) and the test profile's artifacts (`--debug` into
/// `target/`: the dependencies are built once), each into a folder of its own under `target/install-check`.
fn install_check(root: &Path, cargo: &std::ffi::OsStr) -> Result<()> {
    let base = root.join("target/install-check");
    let _ = std::fs::remove_dir_all(&base);
    let git = format!("file://{}", root.display());
    let ways: [(&str, Vec<&str>); 2] = [("path", vec!["--path", "crates/cli"]), ("git", vec!["--git", &git, "condense-cli"])];
    let version = format!("condense {}", env!("CARGO_PKG_VERSION"));
    for (how, source) in ways {
        let into = base.join(how);
        let st = Command::new(cargo)
            .current_dir(root)
            .args(["install", "--locked", "--debug", "--quiet", "--target-dir", "target", "--root"])
            .arg(&into)
            .args(&source)
            .status()
            .with_context(|| format!("running cargo install --{how}"))?;
        if !st.success() {
            bail!("cargo install --{how} failed ({st})");
        }
        let out = Command::new(into.join("bin/condense")).arg("--version").output().with_context(|| format!("running the condense cargo install --{how} installed"))?;
        let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || printed != version {
            bail!("the condense cargo install --{how} installed printed `{printed}` for --version, not `{version}`");
        }
        println!("xtask test: cargo install --{how} gives a condense that runs ({printed})");
    }
    Ok(())
}

/// Installs the pinned agent CLIs from npm under `target/e2e-clients` (nothing when the same pins are
/// there already) and returns the folder.
fn install_clients() -> Result<std::path::PathBuf> {
    let clients = crate::root().join("target/e2e-clients");
    println!("xtask: the pinned agent CLIs in {}", clients.display());
    crate::e2e_clients::install(&clients).map_err(|e| anyhow::anyhow!(e))?;
    Ok(clients)
}

/// Each client's command in `node_modules/.bin`, by package.
const BINARIES: [(&str, &str); 5] =
    [("@anthropic-ai/claude-code", "claude"), ("@mariozechner/pi-coding-agent", "pi"), ("@openai/codex", "codex"), ("opencode-ai", "opencode"), ("@google/gemini-cli", "gemini")];

/// `cargo xtask clients`: installs the real Claude Code, pi, Codex, opencode and Gemini CLIs the end-to-end tests drive
/// and checks that each one runs (`--version`), printing the versions; fails when one does not.
pub fn clients() -> Result<()> {
    let dir = install_clients()?;
    for (package, bin) in BINARIES {
        let path = dir.join("node_modules/.bin").join(bin);
        let out = Command::new(&path).arg("--version").output().with_context(|| format!("running {}", path.display()))?;
        // pi prints its version on standard error.
        let version = [&out.stdout, &out.stderr].iter().map(|b| String::from_utf8_lossy(b).trim().to_string()).find(|v| !v.is_empty()).unwrap_or_default();
        let pinned = crate::e2e_clients::PINS.lines().find_map(|l| l.trim().strip_prefix(package)?.strip_prefix('@')).unwrap_or("");
        if !out.status.success() || pinned.is_empty() || !version.contains(pinned) {
            bail!("{package}: `{bin} --version` gave `{version}` ({}), pinned {pinned}", out.status);
        }
        println!("xtask clients: {package} ({bin}) {version}");
    }
    Ok(())
}
