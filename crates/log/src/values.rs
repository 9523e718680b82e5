//! Event values kept beside sled instead of inside it: one append-only file per session,
//! `values/<session id>`, and in sled a 17-byte pointer to the value ([`FORMAT_EXTERNAL`], then the
//! offset as a little-endian `u64`, the length as a `u32` and the CRC-32 of the bytes as a `u32`).
//!
//! sled rewrites a leaf page, values and all, every few appends to it, so each byte stored inside it is
//! written to disk two to three times and copied more often still. A value of [`EXTERNAL_FROM`] bytes or
//! more is written once, at the end of its session's file, and only its pointer goes through sled.
//!
//! Durability follows the blobs: the log writer appends a group's values to their files before it applies
//! the group's pointers, and syncs every file written since the last flush before it flushes sled, so a
//! pointer sled made durable names bytes that are durable too. What a crash leaves at the end of a file,
//! written but never pointed to, is skipped: the next append starts after it. A pointer that does not
//! resolve (a file cut short or changed) is a [`LogError::Corrupt`] of that event; on open, events after
//! the last acknowledged head whose values did not survive are dropped, as sled drops what it did not
//! flush.

use crate::{LogError, Result};
use condense_events::{Seq, SessionId};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::path::{Path, PathBuf};

/// The format byte of a stored value that is a pointer into its session's value file.
pub const FORMAT_EXTERNAL: u8 = 3;
/// Values of this many bytes or more are stored in the session's value file (see [`SESSION_EXTERNAL_FROM`]).
pub const EXTERNAL_FROM: usize = 128;
/// A session's large values stay in sled until it has been given this many bytes of them: a small
/// session is cheaper there (a file of its own would cost one more sync at the flush, which for a folder
/// of small sessions imported together outweighs what it saves).
pub const SESSION_EXTERNAL_FROM: u64 = 4 << 20;
const POINTER: usize = 17;
/// Open files the writer keeps at most; others are opened again when written to.
const OPEN_FILES: usize = 64;

pub(crate) fn path_of(dir: &Path, session: SessionId) -> PathBuf {
    dir.join(session.to_string())
}

fn pointer(offset: u64, bytes: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(POINTER);
    p.push(FORMAT_EXTERNAL);
    p.extend_from_slice(&offset.to_le_bytes());
    p.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    p.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    p
}

/// Whether a stored value is a pointer into a value file.
pub(crate) fn is_pointer(v: &[u8]) -> bool {
    v.first() == Some(&FORMAT_EXTERNAL)
}

/// The writer's side: where each session's file ends, and which files need a sync before the next flush.
pub(crate) struct Appender {
    dir: PathBuf,
    open: BTreeMap<SessionId, (File, u64)>,
    unsynced: BTreeSet<SessionId>,
    /// Files created since the folder was last synced.
    created: bool,
    /// Each session's values of the group being staged.
    staged: BTreeMap<SessionId, Vec<u8>>,
    /// Bytes of large values each session was given since the store opened, and whether it has a file.
    seen: BTreeMap<SessionId, (u64, bool)>,
}

impl Appender {
    pub(crate) fn new(dir: PathBuf) -> Appender {
        Appender { dir, open: BTreeMap::new(), unsynced: BTreeSet::new(), created: false, staged: BTreeMap::new(), seen: BTreeMap::new() }
    }

    fn file(&mut self, session: SessionId) -> std::io::Result<&mut (File, u64)> {
        if !self.open.contains_key(&session) {
            if self.open.len() >= OPEN_FILES {
                // Unsynced files are synced through their path; which one closes does not matter.
                let first = *self.open.keys().next().expect("more than none open");
                self.open.remove(&first);
            }
            std::fs::create_dir_all(&self.dir)?;
            let path = path_of(&self.dir, session);
            let existed = path.exists();
            let f = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
            self.created |= !existed;
            let len = f.metadata()?.len();
            self.open.insert(session, (f, len));
        }
        Ok(self.open.get_mut(&session).expect("inserted above"))
    }

    /// The value sled stores for `value`: a pointer to where [`Appender::write_staged`] will write it at
    /// the end of the session's file when it is large, the group may use files (`external`) and the
    /// session has a file already or has been given [`SESSION_EXTERNAL_FROM`] bytes of large values;
    /// else the value itself.
    pub(crate) fn stage(&mut self, session: SessionId, value: Vec<u8>, external: bool) -> std::io::Result<Vec<u8>> {
        if value.len() < EXTERNAL_FROM || value.len() > u32::MAX as usize {
            return Ok(value);
        }
        let dir = &self.dir;
        let seen = self.seen.entry(session).or_insert_with(|| (0, path_of(dir, session).exists()));
        seen.0 += value.len() as u64;
        if !external || !(seen.1 || seen.0 >= SESSION_EXTERNAL_FROM) {
            return Ok(value);
        }
        seen.1 = true;
        let base = self.file(session)?.1;
        let buf = self.staged.entry(session).or_default();
        let p = pointer(base + buf.len() as u64, &value);
        buf.extend_from_slice(&value);
        Ok(p)
    }

    /// Appends the staged values to their files (before sled learns of their pointers).
    pub(crate) fn write_staged(&mut self) -> std::io::Result<()> {
        let staged = std::mem::take(&mut self.staged);
        for (session, bytes) in staged {
            let written = self.file(session).and_then(|(f, len)| {
                f.write_all(&bytes)?;
                *len += bytes.len() as u64;
                Ok(())
            });
            if let Err(e) = written {
                // Where the file ends is no longer known: it is read again at the next append.
                self.open.remove(&session);
                return Err(e);
            }
            self.unsynced.insert(session);
        }
        Ok(())
    }

    /// Drops what was staged for a group that is not written.
    pub(crate) fn discard_staged(&mut self) {
        self.staged.clear();
    }

    /// Syncs every file written since the last sync (and the folder, when files were created).
    pub(crate) fn sync(&mut self) -> std::io::Result<()> {
        for s in std::mem::take(&mut self.unsynced) {
            match self.open.get(&s) {
                Some((f, _)) => f.sync_data()?,
                None => File::open(path_of(&self.dir, s))?.sync_data()?,
            }
        }
        if std::mem::take(&mut self.created) {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Whether a sync has anything to do.
    pub(crate) fn pending(&self) -> bool {
        !self.unsynced.is_empty() || self.created
    }

    /// Deletes a removed session's file.
    pub(crate) fn remove(&mut self, session: SessionId) -> std::io::Result<()> {
        self.open.remove(&session);
        self.seen.remove(&session);
        self.unsynced.remove(&session);
        match std::fs::remove_file(path_of(&self.dir, session)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Open value files for reading, shared by every read of the store (at most [`OPEN_FILES`]).
#[derive(Default)]
pub(crate) struct Handles(Mutex<BTreeMap<SessionId, Arc<File>>>);

impl Handles {
    fn get(&self, dir: &Path, session: SessionId) -> std::io::Result<Arc<File>> {
        let mut open = self.0.lock().expect("value file handles lock");
        if let Some(f) = open.get(&session) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(path_of(dir, session))?);
        if open.len() >= OPEN_FILES {
            let first = *open.keys().next().expect("more than none open");
            open.remove(&first);
        }
        open.insert(session, f.clone());
        Ok(f)
    }
}

/// Reads values of one session through their pointers. Values read in the order they were written are
/// read ahead, in windows that grow to 256 KiB; a single value costs one read of its own bytes.
pub(crate) struct Reader<'a> {
    handles: &'a Handles,
    dir: &'a Path,
    session: SessionId,
    /// The file and its size when it was opened for this reader.
    file: Option<(Arc<File>, u64)>,
    /// Bytes of the file from `at` on.
    buf: Vec<u8>,
    at: u64,
    window: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(handles: &'a Handles, dir: &'a Path, session: SessionId) -> Reader<'a> {
        Reader { handles, dir, session, file: None, buf: Vec::new(), at: 0, window: 0 }
    }

    /// The value `pointer` (a stored value starting with [`FORMAT_EXTERNAL`]) names.
    pub(crate) fn read(&mut self, seq: Seq, pointer: &[u8]) -> Result<&[u8]> {
        let session = self.session;
        let path = path_of(self.dir, session);
        let corrupt = |reason: String| LogError::Corrupt { session, seq, reason };
        if pointer.len() != POINTER {
            return Err(corrupt(format!("a pointer into {} of {} bytes, expected {POINTER}", path.display(), pointer.len())));
        }
        let offset = u64::from_le_bytes(pointer[1..9].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(pointer[9..13].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(pointer[13..17].try_into().expect("4 bytes"));
        if self.file.is_none() {
            let opened = self.handles.get(self.dir, session).and_then(|f| Ok((f.metadata()?.len(), f)));
            let (size, f) = opened.map_err(|e| corrupt(format!("its value file {}: {e}", path.display())))?;
            self.file = Some((f, size));
        }
        let (file, size) = self.file.as_mut().expect("opened above");
        // The pointer comes from the store: checked against the file before anything is allocated for it.
        // A value appended since the file was measured (a read beside the writer) measures it again.
        let wanted = offset.checked_add(len as u64);
        if wanted.is_some_and(|end| end > *size) {
            *size = file.metadata().map_err(|e| corrupt(format!("its value file {}: {e}", path.display())))?.len();
        }
        let Some(end) = wanted.filter(|&end| end <= *size) else {
            return Err(corrupt(format!("bytes {offset}..+{len} of {}, which holds {size}", path.display())));
        };
        if offset < self.at || end > self.at + self.buf.len() as u64 {
            let want = (len.max(self.window) as u64).min(*size - offset) as usize;
            self.buf.resize(want, 0);
            if let Err(e) = read_at(file, &mut self.buf, offset) {
                self.buf.clear();
                return Err(corrupt(format!("bytes {offset}..+{len} of {}: {e}", path.display())));
            }
            self.at = offset;
            self.window = (self.window * 2).clamp(16 << 10, 256 << 10);
        }
        let start = (offset - self.at) as usize;
        let value = &self.buf[start..start + len];
        if crc32fast::hash(value) != crc {
            return Err(corrupt(format!("bytes {offset}..+{len} of {} do not match their checksum", path.display())));
        }
        Ok(value)
    }
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(windows)]
fn read_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(f, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// Session ids that have a value file in `dir` (names that are not ids are left alone).
pub(crate) fn sessions_with_files(dir: &Path) -> std::io::Result<Vec<SessionId>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        if let Some(id) = e?.file_name().to_str().and_then(|n| n.parse::<SessionId>().ok()) {
            out.push(id);
        }
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::{Log, LogError};
    use condense_events::{Event, SourceEvent};

    fn event(text: &str) -> Event {
        Event::Source(SourceEvent::ConfigChanged { json: text.to_string() })
    }

    /// Text that does not compress: a stored value keeps about its size.
    fn noise(seed: usize, len: usize) -> String {
        let mut x = seed as u64 * 2_654_435_761 + 1;
        (0..len)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                char::from(b'a' + (x >> 59) as u8 % 26)
            })
            .collect()
    }

    /// Appends without a flush, as an import or `condense serve` does, then syncs.
    fn put(log: &Log, session: u64, head: u64, events: Vec<Event>) {
        let values = events.iter().enumerate().map(|(i, e)| log.encode(session, head + 1 + i as u64, e)).collect();
        log.append_encoded(session, head, values, false).unwrap().recv().unwrap().unwrap();
        log.sync().unwrap();
    }

    fn texts(log: &Log, session: u64) -> Vec<String> {
        let head = log.head(session).unwrap();
        log.read(session, 1, head)
            .unwrap()
            .into_iter()
            .map(|e| match e.body {
                Event::Source(SourceEvent::ConfigChanged { json }) => json,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    fn corrupt_reason(log: &Log, session: u64) -> String {
        match log.read(session, 1, log.head(session).unwrap()) {
            Err(LogError::Corrupt { reason, .. }) => reason,
            other => panic!("expected a corrupt event, got {other:?}"),
        }
    }

    /// A first value large enough that the session's large values go to its file from it on.
    fn bulk() -> String {
        noise(99, super::SESSION_EXTERNAL_FROM as usize)
    }

    #[test]
    fn large_values_are_written_once_to_their_session_file_and_damage_there_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("values").join("1");
        let big: Vec<String> = (0..3).map(|i| noise(i, 400 + i)).collect();
        let bulk = bulk();
        let all = [bulk.as_str(), &big[0], "small", &big[1], &big[2], &big[0]];
        {
            let log = Log::open(dir.path()).unwrap();
            let s = log.create_session("s").unwrap();
            put(&log, s, 0, vec![event(&bulk), event(&big[0]), event("small"), event(&big[1]), event(&big[2])]);
            assert_eq!(texts(&log, s), all[..5]);
            // A durable append of a few values keeps them in sled: its flush needs no second sync.
            let before = std::fs::metadata(&file).unwrap().len();
            log.append(s, 5, vec![event(&big[0])]).unwrap();
            assert_eq!(std::fs::metadata(&file).unwrap().len(), before);
            // sled holds a pointer for each large value written without a flush, and the small one as it
            // is; the file holds the large ones' stored bytes, one after the other.
            let mut stored = Vec::new();
            log.for_each_value(s, 1, 6, |_, v| {
                stored.push(v.to_vec());
                Ok(())
            })
            .unwrap();
            let on_disk = std::fs::read(&file).unwrap();
            assert_eq!(on_disk, [&stored[0][..], &stored[1], &stored[3], &stored[4]].concat());
            assert!(stored[2].len() < super::EXTERNAL_FROM);
            // A session given fewer large values keeps them in sled.
            let few = log.create_session("few").unwrap();
            put(&log, few, 0, vec![event(&big[0]), event(&big[1])]);
            assert!(!dir.path().join("values").join(few.to_string()).exists());
            assert_eq!(texts(&log, few), big[..2]);
        }
        // Reopened: read through the file again.
        assert_eq!(texts(&Log::open(dir.path()).unwrap(), 1), all);
        let good = std::fs::read(&file).unwrap();
        // A byte changed in the file: the checksum tells.
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 0x20;
        std::fs::write(&file, &flipped).unwrap();
        assert!(corrupt_reason(&Log::open(dir.path()).unwrap(), 1).contains("checksum"), "a changed byte");
        // The file cut short: the pointer reaches past its end.
        std::fs::write(&file, &good[..good.len() - 10]).unwrap();
        let reason = corrupt_reason(&Log::open(dir.path()).unwrap(), 1);
        assert!(reason.contains(&file.display().to_string()) && reason.contains("which holds"), "{reason}");
        // The file gone.
        std::fs::remove_file(&file).unwrap();
        let reason = corrupt_reason(&Log::open(dir.path()).unwrap(), 1);
        assert!(reason.contains("value file"), "{reason}");
        // Put back, everything reads again.
        std::fs::write(&file, &good).unwrap();
        assert_eq!(texts(&Log::open(dir.path()).unwrap(), 1), all);
    }

    #[test]
    fn events_past_the_acknowledged_head_whose_values_were_lost_are_dropped_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("values").join("1");
        let big = |i: usize| noise(i, 300);
        let bulk = bulk();
        let after_three;
        {
            let log = Log::open(dir.path()).unwrap();
            let s = log.create_session("s").unwrap();
            put(&log, s, 0, vec![event(&bulk), event(&big(1)), event(&big(2))]);
            after_three = std::fs::metadata(&file).unwrap().len();
            put(&log, s, 3, vec![event(&big(3)), event("small"), event(&big(5))]);
        }
        // A power cut as it can happen: sled kept events 4 to 6, the value file lost what followed event
        // 3, and the manifest had learnt of the first append only.
        let mut heads = 1u64.to_le_bytes().to_vec();
        heads.extend_from_slice(&3u64.to_le_bytes());
        std::fs::write(dir.path().join(crate::manifest::FILE), heads).unwrap();
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(after_three).unwrap();
        let log = Log::open(dir.path()).unwrap();
        assert_eq!(log.head(1).unwrap(), 3, "events 4.. go, from the first whose value is lost");
        assert_eq!(texts(&log, 1), [bulk.clone(), big(1), big(2)]);
        // Appends go on after what the file holds.
        put(&log, 1, 3, vec![event(&big(6))]);
        let mut appended = 0;
        log.for_each_value(1, 4, 4, |_, v| {
            appended = v.len() as u64;
            Ok(())
        })
        .unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().len(), after_three + appended, "written right after event 3's value");
        drop(log);
        assert_eq!(texts(&Log::open(dir.path()).unwrap(), 1), [bulk, big(1), big(2), big(6)]);
    }

    #[test]
    fn a_value_file_no_session_owns_is_deleted_and_a_removed_session_takes_its_file_along() {
        let dir = tempfile::tempdir().unwrap();
        let values = dir.path().join("values");
        let bulk = bulk();
        {
            let log = Log::open(dir.path()).unwrap();
            let a = log.create_session("a").unwrap();
            let b = log.create_session("b").unwrap();
            for s in [a, b] {
                put(&log, s, 0, vec![event(&bulk)]);
            }
            log.remove_session(a).unwrap();
            assert!(!values.join(a.to_string()).exists());
            assert!(values.join(b.to_string()).exists());
        }
        // Left by a session created without a flush and lost in a crash; a file not named by an id stays.
        std::fs::write(values.join("7"), b"lost").unwrap();
        std::fs::write(values.join("notes"), b"mine").unwrap();
        let log = Log::open(dir.path()).unwrap();
        assert!(!values.join("7").exists());
        assert!(values.join("notes").exists());
        assert_eq!(texts(&log, 2), [bulk]);
    }

    #[test]
    fn a_reader_finds_values_appended_after_it_measured_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = super::Appender::new(dir.path().to_path_buf());
        let first = out.stage(1, bulk().into_bytes(), true).unwrap();
        out.write_staged().unwrap();
        let handles = super::Handles::default();
        let mut reader = super::Reader::new(&handles, dir.path(), 1);
        assert_eq!(reader.read(1, &first).unwrap(), bulk().as_bytes());
        let later = noise(5, 1000);
        let second = out.stage(1, later.clone().into_bytes(), true).unwrap();
        assert!(super::is_pointer(&second));
        out.write_staged().unwrap();
        assert_eq!(reader.read(2, &second).unwrap(), later.as_bytes());
        // A pointer past what the file holds even now is an error naming the file.
        let mut beyond = second.clone();
        beyond[1..9].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(reader.read(3, &beyond), Err(LogError::Corrupt { seq: 3, reason, .. }) if reason.contains("which holds")));
    }

    #[test]
    fn a_clean_close_tells_the_manifest_of_appends_made_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = Log::open(dir.path()).unwrap();
            let s = log.create_session("s").unwrap();
            let values = vec![log.encode(s, 1, &event(&bulk())), log.encode(s, 2, &event("small"))];
            log.append_encoded(s, 0, values, false).unwrap().recv().unwrap().unwrap();
        }
        let (acknowledged, _) = crate::manifest::read(dir.path()).unwrap();
        assert_eq!(acknowledged.get(&1), Some(&2), "nothing is left for the next open to check");
        assert_eq!(texts(&Log::open(dir.path()).unwrap(), 1), [bulk(), "small".to_string()]);
    }
}
