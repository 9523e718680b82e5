//! Content-addressed blobs. One of at most [`INLINE_BLOB_BYTES`] is kept in the database's `blobs` tree,
//! in values of at most [`BLOB_CHUNK_BYTES`] keyed by its hash and their index (written in one batch),
//! durable with the database's next flush. A larger one is a file beside the
//! database, `blobs/<2 hex>/<64 hex>`, written to a temp file, synced, then renamed into place so a reader
//! never sees half a blob. A blob put without a sync (a spilled output, whose decision is appended next) is
//! made durable later instead, by the log writer before or with its next flush: it is durable before any
//! event naming it is, since sled makes its log durable in order.

use crate::{io, LogError, Result};
use std::io::Write;
use std::path::PathBuf;

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

/// Blobs of at most this many bytes live in the database (the `blobs` tree) instead of a file of their
/// own: the flush that makes a spill's decision durable makes its blob durable too, where a file needs an
/// fsync of its own first (a second journal commit, 2–5 ms, on the request that spills).
pub const INLINE_BLOB_BYTES: usize = 1 << 20;
/// A blob in the database is stored in values of at most this many bytes: sled keeps a leaf's values in
/// the leaf and rewrites it whole, and writes a leaf over a quarter segment to a file of its own.
pub const BLOB_CHUNK_BYTES: usize = 8 * 1024;

/// The key of chunk `i` of blob `hash` in the `blobs` tree: the hash's 64 hex digits, then `i` big-endian.
fn chunk_key(hash: &BlobHash, i: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(68);
    k.extend_from_slice(hash.0.as_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    k
}

#[derive(Clone)]
pub(crate) struct BlobStore {
    dir: PathBuf,
    /// The database's `blobs` tree, and the database's path for errors.
    tree: sled::Tree,
    db_path: PathBuf,
    /// Blobs written without a sync, for [`sync_pending`] before the next flush of the log.
    pending: Pending,
}

/// Blobs in place but not durable yet: files not synced, and whether the `blobs` tree holds any that
/// the database has not flushed.
#[derive(Default)]
pub(crate) struct PendingBlobs {
    files: Vec<PathBuf>,
    pub(crate) in_db: bool,
}

impl PendingBlobs {
    pub(crate) fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.in_db
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.files.len() + usize::from(self.in_db)
    }
}

pub(crate) type Pending = std::sync::Arc<std::sync::Mutex<PendingBlobs>>;

/// Syncs the blob files written without a sync so far; the log writer calls it before every flush, which
/// makes the blobs in the database durable.
pub(crate) fn sync_pending(pending: &Pending) -> std::io::Result<()> {
    let paths = {
        let mut p = pending.lock().expect("pending blobs lock");
        p.in_db = false;
        std::mem::take(&mut p.files)
    };
    for p in &paths {
        std::fs::File::open(p)?.sync_all()?;
    }
    Ok(())
}

impl BlobStore {
    pub(crate) fn new(dir: PathBuf, tree: sled::Tree, db_path: PathBuf, pending: Pending) -> BlobStore {
        BlobStore { dir, tree, db_path, pending }
    }

    fn sled(&self) -> impl FnOnce(sled::Error) -> LogError + '_ {
        crate::sled_err(&self.db_path)
    }

    fn path_of(&self, hash: &BlobHash) -> PathBuf {
        self.dir.join(&hash.0[..2]).join(&hash.0)
    }

    /// Stores `bytes`, synced before this returns (`sync`), or before the log's next flush.
    pub(crate) fn put(&self, bytes: &[u8], sync: bool) -> Result<BlobHash> {
        let hash = BlobHash::of(bytes);
        let path = self.path_of(&hash);
        if bytes.len() <= INLINE_BLOB_BYTES && !path.exists() {
            let present = self.tree.contains_key(chunk_key(&hash, 0)).map_err(self.sled())?;
            if !present {
                // One batch: after a crash the blob is there whole or not at all.
                let mut batch = sled::Batch::default();
                for (i, chunk) in bytes.chunks(BLOB_CHUNK_BYTES).enumerate() {
                    batch.insert(chunk_key(&hash, i as u32), chunk);
                }
                if bytes.is_empty() {
                    batch.insert(chunk_key(&hash, 0), &[][..]);
                }
                crate::sled_quietly(|| self.tree.apply_batch(batch)).map_err(self.sled())?;
            }
            if sync {
                // Put earlier without a sync (or just now): a caller that needs it durable flushes.
                if !present || self.pending.lock().expect("pending blobs lock").in_db {
                    self.tree.flush().map_err(self.sled())?;
                }
            } else if !present {
                self.pending.lock().expect("pending blobs lock").in_db = true;
            }
            return Ok(hash);
        }
        if path.exists() {
            // Put earlier without a sync: a caller that needs it durable now syncs it now.
            if sync && self.pending.lock().expect("pending blobs lock").files.contains(&path) {
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
            self.pending.lock().expect("pending blobs lock").files.push(path);
        }
        Ok(hash)
    }

    pub(crate) fn get(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        let path = self.path_of(hash);
        let mut inline: Option<Vec<u8>> = None;
        for (i, item) in self.tree.scan_prefix(hash.0.as_bytes()).enumerate() {
            let (key, chunk) = item.map_err(self.sled())?;
            if key[..] != chunk_key(hash, i as u32)[..] {
                // A chunk missing between others: what is there cannot match the hash.
                return Err(LogError::BlobCorrupt { hash: hash.0.clone(), actual: format!("chunk {i} missing") });
            }
            inline.get_or_insert_with(Vec::new).extend_from_slice(&chunk);
        }
        let read = match inline {
            Some(joined) => Ok(joined),
            None => std::fs::read(&path),
        };
        let bytes = match read {
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
        for key in self.tree.iter().keys() {
            let key = key.map_err(self.sled())?;
            // Each blob once, by its first chunk; `get` of what is listed checks the rest.
            if let Some(hex) = key.strip_suffix(&0u32.to_be_bytes()[..]) && let Some(h) = std::str::from_utf8(hex).ok().and_then(BlobHash::parse) {
                out.push(h);
            }
        }
        out.extend(self.files()?);
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn files(&self) -> Result<Vec<BlobHash>> {
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
        Ok(out)
    }
}
