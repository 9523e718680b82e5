//! The heads manifest: a small append-only file beside sled's pages (`heads`) that records, after every
//! durable group commit, each touched session's new head as a 16-byte record (session, head; little
//! endian). On open the log compares it with what sled holds: a session that holds fewer events than the
//! manifest says were acknowledged means the database file lost data (cut short, overwritten), and the
//! open fails with [`LogError::Damaged`] instead of serving a shortened store as if it were whole.
//!
//! The manifest is written after sled's flush returns, so it never claims more than sled made durable; it
//! is not synced itself, so after a power cut it may lag (a loss goes unnoticed), never lead (no false
//! alarm). A record cut short by a crash is ignored. Once it holds well over one record per session it is
//! written anew, one record per session (a temporary file renamed over it), at open and while serving.

use crate::{LogError, Result};
use condense_events::{Seq, SessionId};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// File name of the manifest inside the log folder.
pub const FILE: &str = "heads";
const RECORD: usize = 16;
/// The head recorded for a removed session: its earlier records no longer count.
const REMOVED: u64 = u64::MAX;

pub(crate) struct Manifest {
    file: Option<std::fs::File>,
    dir: std::path::PathBuf,
    /// Every session's highest recorded head: what a compaction writes.
    heads: BTreeMap<SessionId, Seq>,
    /// The file's size.
    size: u64,
}

/// Reads the manifest at `dir/heads`: the highest acknowledged head of each session it names.
pub(crate) fn read(dir: &Path) -> Result<(BTreeMap<SessionId, Seq>, u64)> {
    let path = dir.join(FILE);
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(LogError::Io { path, source }),
    };
    let mut heads = BTreeMap::new();
    for rec in data.chunks_exact(RECORD) {
        let session = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
        let head = u64::from_le_bytes(rec[8..].try_into().expect("8 bytes"));
        if head == REMOVED {
            heads.remove(&session);
            continue;
        }
        let e = heads.entry(session).or_insert(0);
        *e = head.max(*e);
    }
    Ok((heads, data.len() as u64))
}

fn encode(heads: &BTreeMap<SessionId, Seq>) -> Vec<u8> {
    let mut out = Vec::with_capacity(heads.len() * RECORD);
    for (s, h) in heads {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&h.to_le_bytes());
    }
    out
}

impl Manifest {
    /// Opens the manifest for appending; when it has grown well past one record per session, first
    /// rewrites it (temp file and rename) to hold only `heads`.
    pub(crate) fn open(dir: &Path, heads: &BTreeMap<SessionId, Seq>, size: u64) -> Result<Manifest> {
        let mut m = Manifest { file: None, dir: dir.to_path_buf(), heads: heads.clone(), size };
        let needed = (heads.len() * RECORD) as u64;
        if size != needed && (m.oversized() || !size.is_multiple_of(RECORD as u64) || size == 0) {
            m.rewrite().map_err(|(path, source)| LogError::Io { path, source })?;
        } else {
            let path = dir.join(FILE);
            m.file = Some(std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|source| LogError::Io { path, source })?);
        }
        Ok(m)
    }

    /// Whether the file holds well over one record per session.
    fn oversized(&self) -> bool {
        self.size > 4 * (self.heads.len() * RECORD) as u64 + 4096
    }

    /// Writes the file anew with one record per session (a temporary file renamed over it) and opens it
    /// for appending.
    fn rewrite(&mut self) -> std::result::Result<(), (std::path::PathBuf, std::io::Error)> {
        let (path, tmp) = (self.dir.join(FILE), self.dir.join(format!("{FILE}.tmp")));
        let bytes = encode(&self.heads);
        std::fs::write(&tmp, &bytes).map_err(|e| (tmp.clone(), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| (path.clone(), e))?;
        self.file = Some(std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| (path.clone(), e))?);
        self.size = bytes.len() as u64;
        Ok(())
    }

    /// Records new heads, and compacts the file once it holds well over a record per session (a served
    /// store commits thousands of times between opens). A failed write stops the manifest (it then lags,
    /// which hides a later loss but never reports a false one); the events themselves are already durable.
    pub(crate) fn record(&mut self, heads: impl Iterator<Item = (SessionId, Seq)>) {
        let mut buf = Vec::new();
        for (s, h) in heads {
            buf.extend_from_slice(&s.to_le_bytes());
            buf.extend_from_slice(&h.to_le_bytes());
            let e = self.heads.entry(s).or_insert(0);
            *e = h.max(*e);
        }
        let Some(f) = &mut self.file else { return };
        if f.write_all(&buf).is_err() {
            self.file = None;
            return;
        }
        self.size += buf.len() as u64;
        if self.oversized() && self.rewrite().is_err() {
            self.file = None;
        }
    }
}

impl Manifest {
    /// Records that `session` is being removed, synced before the removal starts.
    pub(crate) fn forget(&mut self, session: SessionId) -> std::io::Result<()> {
        let f = self.file.as_mut().ok_or_else(|| std::io::Error::other("the heads manifest could not be written earlier"))?;
        let mut rec = session.to_le_bytes().to_vec();
        rec.extend_from_slice(&REMOVED.to_le_bytes());
        f.write_all(&rec)?;
        self.size += rec.len() as u64;
        self.heads.remove(&session);
        f.sync_data()
    }
}

/// The first session whose stored head is below what the manifest says was acknowledged.
pub(crate) fn check(
    acknowledged: &BTreeMap<SessionId, Seq>,
    stored: &BTreeMap<SessionId, Seq>,
) -> Option<(SessionId, Seq, Seq)> {
    acknowledged.iter().find_map(|(s, &ack)| {
        let have = stored.get(s).copied().unwrap_or(0);
        (have < ack).then_some((*s, have, ack))
    })
}
