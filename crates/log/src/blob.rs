//! Content-addressed blob files beside the database: `blobs/<2 hex>/<64 hex>`, written to a temp file,
//! synced, then renamed into place so a reader never sees half a blob. A blob put for a host that defers
//! durability is synced later instead, by the log writer before its next flush: it is durable before any
//! event naming it is.

use crate::{LogError, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The blake3 hash of a blob, as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlobHash(pub String);

impl BlobHash {
    /// Hash of `bytes`.
    pub fn of(bytes: &[u8]) -> BlobHash {
        BlobHash(blake3::hash(bytes).to_hex().to_string())
    }

    /// Parses a hash given as text, refusing anything but 64 hex digits (so it can never name a path
    /// outside the blob folder).
    pub fn parse(text: &str) -> Option<BlobHash> {
        (text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then(|| BlobHash(text.to_string()))
    }
}

impl std::fmt::Display for BlobHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone)]
pub(crate) struct BlobStore {
    dir: PathBuf,
    /// Blobs written without a sync, for [`sync_pending`] before the next flush of the log.
    pending: Pending,
}

/// Blob files in place but not synced yet.
pub(crate) type Pending = std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>;

/// Syncs the blobs written without a sync so far; the log writer calls it before every flush.
pub(crate) fn sync_pending(pending: &Pending) -> std::io::Result<()> {
    let paths = std::mem::take(&mut *pending.lock().expect("pending blobs lock"));
    for p in &paths {
        std::fs::File::open(p)?.sync_all()?;
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io { path: path.to_path_buf(), source }
}

impl BlobStore {
    pub(crate) fn new(dir: PathBuf, pending: Pending) -> BlobStore {
        BlobStore { dir, pending }
    }

    fn path_of(&self, hash: &BlobHash) -> PathBuf {
        self.dir.join(&hash.0[..2]).join(&hash.0)
    }

    /// Stores `bytes`, synced before this returns (`sync`), or before the log's next flush.
    pub(crate) fn put(&self, bytes: &[u8], sync: bool) -> Result<BlobHash> {
        let hash = BlobHash::of(bytes);
        let path = self.path_of(&hash);
        if path.exists() {
            // Put earlier without a sync: a caller that needs it durable now syncs it now.
            if sync && self.pending.lock().expect("pending blobs lock").contains(&path) {
                std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(io(&path))?;
            }
            return Ok(hash);
        }
        let parent = path.parent().expect("blob path has a parent");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        let tmp = parent.join(format!("{}.tmp", hash.0));
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        if sync {
            f.sync_all().map_err(io(&tmp))?;
        }
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        if !sync {
            self.pending.lock().expect("pending blobs lock").push(path);
        }
        Ok(hash)
    }

    pub(crate) fn get(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        let path = self.path_of(hash);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LogError::BlobMissing(hash.0.clone())),
            Err(source) => return Err(LogError::Io { path, source }),
        };
        let actual = BlobHash::of(&bytes);
        if &actual != hash {
            return Err(LogError::BlobCorrupt { hash: hash.0.clone(), actual: actual.0 });
        }
        Ok(bytes)
    }

    pub(crate) fn list(&self) -> Result<Vec<BlobHash>> {
        let mut out = Vec::new();
        let Ok(dirs) = std::fs::read_dir(&self.dir) else { return Ok(out) };
        for d in dirs {
            let d = d.map_err(io(&self.dir))?;
            let sub = d.path();
            if !sub.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&sub).map_err(io(&sub))? {
                let f = f.map_err(io(&sub))?;
                if let Some(h) = f.file_name().to_str().and_then(BlobHash::parse) {
                    out.push(h);
                }
            }
        }
        out.sort();
        Ok(out)
    }
}
