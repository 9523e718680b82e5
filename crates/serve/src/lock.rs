//! `serve.json` in the store folder: where a running server listens, its process id, and a token that
//! another `condense` process on the same machine presents to run a command through the server while it
//! holds the store, and the file holding the token requests must carry when the server asks for one (the
//! path, not the token). The file is readable by its owner only; the token never appears in a log or an error.

use serde_json::{json, Value};
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file's path in a store folder.
pub fn path(store: &Path) -> PathBuf {
    store.join("serve.json")
}

/// A running server as its `serve.json` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its process id.
    pub pid: u32,
    /// The token a CLI command presents.
    pub token: String,
    /// The file holding the token every request must carry, when the server asks for one.
    pub auth_file: Option<PathBuf>,
}

fn fresh_token() -> String {
    let mut bytes = [0u8; 32];
    // The token only guards a loopback port against other local users: the kernel's randomness.
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    let mut h = blake3::Hasher::new();
    h.update(&bytes);
    h.update(&std::process::id().to_le_bytes());
    h.update(format!("{:?}", std::time::SystemTime::now()).as_bytes());
    h.finalize().to_hex().to_string()
}

/// Writes `serve.json` for a server listening on `addr` (owner-only, written to a temp file and renamed).
pub fn announce(store: &Path, addr: SocketAddr, auth_file: Option<&Path>) -> std::io::Result<Announced> {
    let a = Announced { addr, pid: std::process::id(), token: fresh_token(), auth_file: auth_file.map(Path::to_path_buf) };
    let tmp = store.join("serve.json.tmp");
    let text = json!({"addr": addr.to_string(), "pid": a.pid, "token": a.token, "auth_file": a.auth_file}).to_string();
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path(store))?;
    Ok(a)
}

/// Reads `serve.json`, if a server announced itself in this store.
pub fn read(store: &Path) -> Option<Announced> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path(store)).ok()?).ok()?;
    Some(Announced {
        addr: v.get("addr")?.as_str()?.parse().ok()?,
        pid: u32::try_from(v.get("pid")?.as_u64()?).ok()?,
        token: v.get("token")?.as_str()?.to_string(),
        auth_file: v.get("auth_file").and_then(|f| f.as_str()).map(PathBuf::from),
    })
}

/// Removes `serve.json` (when the server stops).
pub fn withdraw(store: &Path) {
    let _ = std::fs::remove_file(path(store));
}

/// Whether `token` is the one in the store's `serve.json` (compared in constant time).
pub fn token_matches(store: &Path, token: &str) -> bool {
    let Some(a) = read(store) else { return false };
    let (x, y) = (a.token.as_bytes(), token.as_bytes());
    x.len() == y.len() && !x.is_empty() && x.iter().zip(y).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}
