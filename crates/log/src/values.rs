//! Value files: where the sled store keeps the large values of an import's appends (those that hold
//! packs: its packs and the events too large to pack), one append-only file per session,
//! `values/<session>` beside the database. sled then
//! stores only where each value is ([`External`], 21 bytes), so its tree stays small: sled rewrites a
//! leaf whole with every split and consolidation and again when it cleans a segment, and with the values
//! in its leaves an import wrote each of its bytes about four times (docs/storage.md).
//!
//! Order of writes: a value is written to its file before its pointer goes into sled's batch, so a reader
//! that finds the pointer finds the bytes (they are in the operating system's cache even before a sync).
//! Every flush of the log first syncs the value files written since the last one (and the folder, for a
//! file it created): an acknowledged durable head never names a value that is not durable. A file is only
//! ever appended to; bytes no pointer names (a group that failed, a crash) are dead space, and a removed
//! session's file is deleted once its events are.
//!
//! A value's CRC-32 is in its pointer: a read that finds other bytes, or too few, is
//! [`LogError::Corrupt`] naming the session, seq, file and offset, never a wrong event.

use crate::codec::{External, EXTERNAL_LEN};
use crate::{io, LogError, Result};
use condense_events::{Seq, SessionId};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The folder of the value files, inside the log folder.
pub const DIR: &str = "values";

/// A value of an import's append goes to a value file when it is at least this long; a shorter one costs
/// sled little more than its pointer would.
pub const EXTERNAL_FROM: usize = 512;

/// A session's import keeps its first values in sled, up to this many bytes: a small session costs no
/// file, and no sync of its own at the flush (a folder of small sessions: one sync instead of one per
/// session). The log's own tests keep none there, so that the small sessions they import go to value
/// files; the budget itself is tested on [`Files`].
const INLINE_MAX: u64 = if cfg!(test) { 0 } else { 1 << 20 };

/// The most value files the writer keeps open: an import of a folder of thousands of sessions must not
/// run out of file descriptors. One closed before it was synced is synced through a fresh handle.
const MAX_OPEN: usize = 32;

/// The value file of `session` in the folder `dir`.
pub(crate) fn path(dir: &Path, session: SessionId) -> PathBuf {
    dir.join(session.to_string())
}

/// The writer thread's value files: the open ones, with the length each has, and the ones written since
/// the last sync.
pub(crate) struct Files {
    dir: PathBuf,
    open: BTreeMap<SessionId, (File, u64)>,
    dirty: BTreeSet<SessionId>,
    /// A file (or the folder) was created since the last sync: the folder is synced too.
    created: bool,
    /// The bytes of import values each session has kept in sled since the store opened (`u64::MAX` once
    /// it went on to its file), up to `inline_max`.
    inline: BTreeMap<SessionId, u64>,
    inline_max: u64,
}

impl Files {
    pub(crate) fn new(dir: PathBuf) -> Files {
        Files { dir, open: BTreeMap::new(), dirty: BTreeSet::new(), created: false, inline: BTreeMap::new(), inline_max: INLINE_MAX }
    }

    /// Writes each value of `values` (`(seq, value)` of one append to `session`) that is at least
    /// [`EXTERNAL_FROM`] long to the session's file and puts its pointer in its place. On an error nothing
    /// of the append may be stored: what was written is dead space, and the file's length is read again
    /// before its next write.
    ///
    /// A session's first such values stay where they are, in sled, as long as they add up to at most
    /// [`INLINE_MAX`] bytes since the store opened; from the append that would pass it on, every one goes
    /// to the file.
    pub(crate) fn externalize(&mut self, session: SessionId, values: &mut [(Seq, Vec<u8>)]) -> Result<()> {
        if values.iter().all(|(_, v)| v.len() < EXTERNAL_FROM) {
            return Ok(());
        }
        let bytes: u64 = values.iter().map(|(_, v)| v.len() as u64).sum();
        let inline = self.inline.entry(session).or_insert(0);
        if inline.saturating_add(bytes) <= self.inline_max {
            *inline += bytes;
            return Ok(());
        }
        *inline = u64::MAX;
        let path = path(&self.dir, session);
        if !self.open.contains_key(&session) {
            if !self.dir.exists() {
                std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
            }
            let existed = path.exists();
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
            let len = file.metadata().map_err(io(&path))?.len();
            self.created |= !existed;
            if self.open.len() >= MAX_OPEN {
                self.open.pop_first();
            }
            self.open.insert(session, (file, len));
        }
        let (file, len) = self.open.get_mut(&session).expect("opened above");
        let mut end = *len;
        let mut written = Ok(());
        for (_, v) in values.iter_mut() {
            if v.len() < EXTERNAL_FROM {
                continue;
            }
            if let Err(e) = file.write_all(v) {
                written = Err(e);
                break;
            }
            let external = External {
                count: crate::codec::events_in(v) as u32,
                offset: end,
                len: v.len() as u32,
                crc: crc32fast::hash(v),
            };
            end += v.len() as u64;
            *v = external.encode();
        }
        self.dirty.insert(session);
        if let Err(e) = written {
            self.open.remove(&session);
            return Err(io(&path)(e));
        }
        *len = end;
        Ok(())
    }

    /// Syncs the files written since the last sync (and their folder, where one was created); the log's
    /// flush calls it before sled's. A file that fails stays to be synced by the next flush.
    pub(crate) fn sync(&mut self) -> Result<()> {
        while let Some(&session) = self.dirty.first() {
            let p = path(&self.dir, session);
            match self.open.get(&session) {
                Some((file, _)) => file.sync_data().map_err(io(&p))?,
                // Closed (to keep few open, or after a failed write): synced through a fresh handle.
                None => {
                    if let Some(f) = absent_is_none(File::open(&p)).map_err(io(&p))? {
                        f.sync_data().map_err(io(&p))?;
                    }
                }
            }
            self.dirty.remove(&session);
        }
        if self.created {
            sync_dir(&self.dir).map_err(io(&self.dir))?;
            if let Some(parent) = self.dir.parent() {
                sync_dir(parent).map_err(io(parent))?;
            }
            self.created = false;
        }
        Ok(())
    }

    /// Forgets the value file of a session whose events are gone, and deletes it.
    pub(crate) fn remove(&mut self, session: SessionId) -> Result<()> {
        self.inline.remove(&session);
        self.open.remove(&session);
        self.dirty.remove(&session);
        remove_file(&path(&self.dir, session))
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `Ok(None)` for a file that is not there.
fn absent_is_none<T>(r: std::io::Result<T>) -> std::io::Result<Option<T>> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn remove_file(path: &Path) -> Result<()> {
    absent_is_none(std::fs::remove_file(path)).map(drop).map_err(io(path))
}

/// Reads the values of one session kept in its value file, opening the file at the first.
pub(crate) struct Reader<'a> {
    dir: &'a Path,
    session: SessionId,
    file: Option<File>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(dir: &'a Path, session: SessionId) -> Reader<'a> {
        Reader { dir, session, file: None }
    }

    /// The value that `value` (stored under `seq`) points to, or `None` when `value` is not a pointer.
    pub(crate) fn resolve(&mut self, seq: Seq, value: &[u8]) -> Result<Option<Vec<u8>>> {
        if value.first() != Some(&crate::codec::FORMAT_EXTERNAL) {
            return Ok(None);
        }
        let session = self.session;
        // Named in errors only: not built for a value read whole.
        let file_path = || path(self.dir, session);
        let corrupt = |reason: String| LogError::Corrupt { session, seq, reason };
        let at = External::decode(value).ok_or_else(|| corrupt(format!("a value file pointer of {} bytes, not {EXTERNAL_LEN}", value.len())))?;
        if at.len as usize > crate::codec::MAX_VALUE_BYTES {
            return Err(corrupt(format!("a value of {} bytes in {}, over the {}-byte bound", at.len, file_path().display(), crate::codec::MAX_VALUE_BYTES)));
        }
        if self.file.is_none() {
            let p = file_path();
            match absent_is_none(File::open(&p)).map_err(io(&p))? {
                Some(f) => self.file = Some(f),
                None => return Err(corrupt(format!("its value file {} is missing", p.display()))),
            }
        }
        let file = self.file.as_ref().expect("opened above");
        let mut bytes = vec![0u8; at.len as usize];
        if let Err(e) = file.read_exact_at(&mut bytes, at.offset) {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                return Err(io(&file_path())(e));
            }
            let have = file.metadata().map(|m| m.len()).unwrap_or(0);
            return Err(corrupt(format!(
                "its value ({} bytes at offset {} of {}) is cut short: the file holds {have} bytes",
                at.len,
                at.offset,
                file_path().display()
            )));
        }
        let crc = crc32fast::hash(&bytes);
        if crc != at.crc {
            return Err(corrupt(format!(
                "its value ({} bytes at offset {} of {}) has CRC-32 {crc:08x}, not {:08x}",
                at.len,
                at.offset,
                file_path().display(),
                at.crc
            )));
        }
        Ok(Some(bytes))
    }
}

/// The length of `session`'s value file in `dir` (0 when there is none).
pub(crate) fn file_len(dir: &Path, session: SessionId) -> Result<u64> {
    let p = path(dir, session);
    Ok(absent_is_none(std::fs::metadata(&p)).map_err(io(&p))?.map_or(0, |m| m.len()))
}

/// Deletes the value files in `dir` of sessions not in `sessions` (left by a removal cut short).
pub(crate) fn remove_orphans(dir: &Path, sessions: &BTreeSet<SessionId>) -> Result<()> {
    let Some(entries) = absent_is_none(std::fs::read_dir(dir)).map_err(io(dir))? else { return Ok(()) };
    for e in entries {
        let e = e.map_err(io(dir))?;
        let name = e.file_name();
        let Some(id) = name.to_str().and_then(|n| n.parse::<SessionId>().ok()) else { continue };
        // Only names this module writes: a number as `to_string` gives it.
        if name.to_str() == Some(&id.to_string()) && !sessions.contains(&id) {
            remove_file(&e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of 600 bytes of one session's text (over `EXTERNAL_FROM`).
    fn values(session: SessionId, n: u64) -> Vec<(Seq, Vec<u8>)> {
        (1..=n).map(|seq| (seq, format!("{session}:{seq} ").repeat(200).into_bytes()[..600].to_vec())).collect()
    }

    #[test]
    fn a_small_sessions_values_stay_in_sled_and_from_the_append_that_passes_the_budget_on_go_to_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::new(dir.path().join(DIR));
        files.inline_max = 3 * 600;
        let pointed = |v: &[(Seq, Vec<u8>)]| v.iter().filter(|(_, v)| External::decode(v).is_some()).count();
        // Within the budget: left as they are, no file, nothing to sync.
        let mut first = values(1, 2);
        files.externalize(1, &mut first).unwrap();
        assert_eq!(first, values(1, 2));
        assert!(!path(&files.dir, 1).exists() && files.dirty.is_empty());
        // Another session has a budget of its own.
        let mut other = values(2, 3);
        files.externalize(2, &mut other).unwrap();
        assert_eq!(pointed(&other), 0);
        // The append that would pass it goes to the file, whole; so does every one after it, however small.
        let mut second = values(1, 2);
        files.externalize(1, &mut second).unwrap();
        assert_eq!(pointed(&second), 2);
        let mut third = values(1, 1);
        files.externalize(1, &mut third).unwrap();
        assert_eq!(pointed(&third), 1);
        assert_eq!(std::fs::metadata(path(&files.dir, 1)).unwrap().len(), 3 * 600);
        assert!(!path(&files.dir, 2).exists());
        files.sync().unwrap();
        let mut reader = Reader::new(&files.dir, 1);
        assert_eq!(reader.resolve(1, &third[0].1).unwrap(), Some(values(1, 1)[0].1.clone()));
        // A removed session's budget goes with it.
        files.remove(2).unwrap();
        assert!(!files.inline.contains_key(&2));
    }

    #[test]
    fn an_import_of_many_sessions_keeps_few_files_open_and_syncs_and_reads_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::new(dir.path().join(DIR));
        let sessions: Vec<SessionId> = (1..=3 * MAX_OPEN as u64).collect();
        let mut pointers = Vec::new();
        for round in 0..2 {
            for &s in &sessions {
                let mut v = values(s, 3);
                files.externalize(s, &mut v).unwrap();
                assert!(files.open.len() <= MAX_OPEN, "{} files open", files.open.len());
                if round == 1 {
                    pointers.push((s, v));
                }
            }
        }
        assert_eq!(files.dirty.len(), sessions.len());
        files.sync().unwrap();
        assert!(files.dirty.is_empty() && !files.created);
        // Each session's second append went after its first, in a file reopened where it ended.
        for (s, v) in pointers {
            let mut reader = Reader::new(&files.dir, s);
            for ((seq, pointer), (_, plain)) in v.iter().zip(values(s, 3)) {
                let at = External::decode(pointer).unwrap();
                assert_eq!(at.offset, 3 * 600 + (seq - 1) * 600, "session {s} seq {seq}");
                assert_eq!(reader.resolve(*seq, pointer).unwrap(), Some(plain));
            }
        }
    }
}
