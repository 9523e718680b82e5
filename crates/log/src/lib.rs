//! The event log: an append-only store of [`Envelope`]s in sled, keyed by big-endian `(session, seq)`.
//!
//! One writer thread owns every session's sequence. Callers send it append requests that name the head
//! they expect; it gathers whatever requests are waiting into one group, writes them as one sled batch,
//! flushes, and only then acknowledges them. A process killed at any point therefore reopens with a
//! gap-free prefix of each session that holds every acknowledged event. Large bodies live beside the
//! database as content-addressed blob files (blake3, written to a temp file and renamed into place).

mod blob;
mod codec;
mod export;
mod manifest;
mod writer;

use condense_events::{Envelope, Event, Seq, SessionId};
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use blob::BlobHash;
pub use codec::{decode_envelope, encode_envelope, encode_event, FORMAT_VERSION, MAX_VALUE_BYTES};
pub use export::ExportSummary;

/// Errors of the log. Every message names the session, sequence number, file or offset involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// sled reported an error.
    #[error("sled store at {path}: {source}")]
    Sled {
        /// Database folder.
        path: PathBuf,
        /// sled's error.
        source: sled::Error,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A stored value could not be decoded.
    #[error("event {session}:{seq} is corrupt: {reason}")]
    Corrupt {
        /// Session of the value.
        session: SessionId,
        /// Sequence number of the value.
        seq: Seq,
        /// What is wrong with it.
        reason: String,
    },
    /// An append named a head that is not the session's current head.
    #[error("session {session}: append expected head {expected}, but the head is {actual}")]
    HeadMismatch {
        /// The session.
        session: SessionId,
        /// The head the caller expected.
        expected: Seq,
        /// The actual head.
        actual: Seq,
    },
    /// No session has this id or name.
    #[error("no session `{0}`")]
    UnknownSession(String),
    /// A session with this name exists already.
    #[error("session `{0}` exists already")]
    SessionExists(String),
    /// A restore found a session of the same name whose events are not a prefix of the export's.
    #[error("session `{0}` exists already with other events than the export holds; restore into another store")]
    RestoreConflict(String),
    /// An export file ends before its trailer.
    #[error("{path}: export is truncated at byte {offset}")]
    Truncated {
        /// The export file.
        path: PathBuf,
        /// Where it ends.
        offset: u64,
    },
    /// An export file is not well formed.
    #[error("{path}: bad export at byte {offset}: {reason}")]
    BadExport {
        /// The export file.
        path: PathBuf,
        /// Where the problem is.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A blob file is missing.
    #[error("blob {0} is missing")]
    BlobMissing(String),
    /// A blob file's content does not match its name.
    #[error("blob {hash} is corrupt: its content hashes to {actual}")]
    BlobCorrupt {
        /// The blob's name (its expected hash).
        hash: String,
        /// The hash of what the file holds.
        actual: String,
    },
    /// The writer thread is gone (the log was closed or the writer panicked).
    #[error("the log writer has stopped")]
    Closed,
    /// An event is larger than a stored value may be ([`codec::MAX_VALUE_BYTES`]); nothing was written.
    #[error("event {session}:{seq} is {bytes} bytes, over the {max}-byte bound of a stored value")]
    Oversized {
        /// The session.
        session: SessionId,
        /// The sequence number it would have had.
        seq: Seq,
        /// Its encoded size.
        bytes: u64,
        /// The bound.
        max: u64,
    },
    /// The store holds less than it acknowledged, or sled cannot read its own files.
    #[error("the store at {path} is damaged: {detail}; restore it from an export into a new store (`condense import BACKUP --store NEW`)")]
    Damaged {
        /// The log folder.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// Another process has the store open (sled allows one process at a time).
    #[error("the store at {0} is in use by another condense process (while `condense serve` runs, commands go through it; otherwise wait for the other command or stop it)")]
    Locked(PathBuf),
}

/// sled's page cache when nothing else is asked for.
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, LogError>;

/// A session as listed by the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Numeric id.
    pub id: SessionId,
    /// Unique name (for imported sessions, derived from the source file).
    pub name: String,
    /// Sequence number of the newest event (0 when empty).
    pub head: Seq,
}

/// Notice sent to subscribers after a group of events is written (durable, unless it was deferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The session.
    pub session: SessionId,
    /// First new sequence number.
    pub first: Seq,
    /// Last new sequence number (the new head).
    pub last: Seq,
}

pub(crate) struct Shared {
    pub(crate) path: PathBuf,
    pub(crate) db: sled::Db,
    pub(crate) events: sled::Tree,
    pub(crate) sessions: sled::Tree,
    pub(crate) subscribers: Mutex<Vec<Sender<Appended>>>,
    pub(crate) heads: Mutex<BTreeMap<SessionId, Seq>>,
    pub(crate) manifest: Mutex<manifest::Manifest>,
}

/// A handle to an open log. Cheap to clone; the writer stops when the last handle is dropped.
#[derive(Clone)]
pub struct Log {
    shared: Arc<Shared>,
    writer: Arc<writer::WriterHandle>,
    blobs: blob::BlobStore,
}

pub(crate) fn sled_err(path: &Path) -> impl FnOnce(sled::Error) -> LogError + '_ {
    move |source| match source {
        sled::Error::Corruption { .. } => LogError::Damaged {
            path: path.to_path_buf(),
            detail: format!("sled finds its files corrupted ({source})"),
        },
        source => LogError::Sled { path: path.to_path_buf(), source },
    }
}

impl Log {
    /// Opens (or creates) the log in `dir`: the sled database in `dir/db`, blobs in `dir/blobs`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Log> {
        Log::open_with(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`Log::open`] with sled's page cache bounded to `cache_bytes` (a long-running server holding many
    /// sessions keeps its memory down with a smaller cache; evicted pages are read back from disk).
    pub fn open_with(dir: impl AsRef<Path>, cache_bytes: u64) -> Result<Log> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| LogError::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join("db");
        // Every group commit flushes explicitly, so sled's background flusher is off. The file lock can be
        // held for a moment by a handle being dropped, or by a child process forked meanwhile (the lock
        // travels with inherited descriptors until exec): retry for up to five seconds.
        let config = sled::Config::new()
            .path(&path)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::HighThroughput)
            .flush_every_ms(None);
        let mut tries = 0;
        let mut cleared_partial = false;
        let damaged = |detail: String| LogError::Damaged { path: dir.to_path_buf(), detail };
        let db = loop {
            // sled panics on some damaged files (a page table cut short): that is an error of the store.
            let opened = quietly(|| config.open()).map_err(|p| damaged(format!("sled cannot read its files ({p})")))?;
            match opened {
                Ok(db) => break db,
                Err(sled::Error::Io(e))
                    if (e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("acquire lock"))
                        && tries < 250 =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("acquire lock") => {
                    return Err(LogError::Locked(dir.to_path_buf()));
                }
                // sled writes a snapshot to `snap.N.generating` and renames it when complete; a crash or a
                // full disk in between leaves that file behind, and sled then takes it for the newest
                // snapshot and reports corruption. Such a file is never a finished snapshot: remove it and
                // open again.
                Err(sled::Error::Corruption { .. }) if !cleared_partial && remove_partial_snapshots(&path) => {
                    cleared_partial = true;
                }
                Err(sled::Error::Corruption { .. }) => {
                    return Err(damaged("sled finds its files corrupted (cut short or overwritten)".into()))
                }
                Err(e) => return Err(LogError::Sled { path, source: e }),
            }
        };
        let events = db.open_tree("events").map_err(sled_err(&path))?;
        let sessions = db.open_tree("sessions").map_err(sled_err(&path))?;
        let heads = quietly(|| -> Result<BTreeMap<SessionId, Seq>> {
            let mut heads = BTreeMap::new();
            for item in sessions.iter() {
                let (k, _) = item.map_err(sled_err(&path))?;
                let id = codec::session_from_key(&k);
                let head = match events.scan_prefix(id.to_be_bytes()).next_back() {
                    Some(last) => codec::split_key(&last.map_err(sled_err(&path))?.0).1,
                    None => 0,
                };
                heads.insert(id, head);
            }
            Ok(heads)
        })
        .map_err(|p| damaged(format!("sled cannot read its files ({p})")))??;
        // A session holding fewer events than were acknowledged means the database lost data.
        let (acknowledged, manifest_size) = manifest::read(dir)?;
        if let Some((session, have, ack)) = manifest::check(&acknowledged, &heads) {
            let name = sessions
                .get(session.to_be_bytes())
                .ok()
                .flatten()
                .map(|v| format!(" (`{}`)", String::from_utf8_lossy(&v)))
                .unwrap_or_default();
            return Err(damaged(format!(
                "session {session}{name} holds {have} of its {ack} acknowledged events (to open what is left anyway, move {} aside)",
                dir.join(manifest::FILE).display()
            )));
        }
        let mut merged = acknowledged;
        for (s, h) in &heads {
            let e = merged.entry(*s).or_insert(0);
            *e = (*h).max(*e);
        }
        let manifest = manifest::Manifest::open(dir, &merged, manifest_size)?;
        let shared = Arc::new(Shared {
            path,
            db,
            events,
            sessions,
            subscribers: Mutex::new(Vec::new()),
            heads: Mutex::new(heads),
            manifest: Mutex::new(manifest),
        });
        let writer = Arc::new(writer::WriterHandle::spawn(shared.clone()));
        let blobs = blob::BlobStore::new(dir.join("blobs"));
        Ok(Log { shared, writer, blobs })
    }

    /// Creates a session named `name` and returns its id.
    pub fn create_session(&self, name: &str) -> Result<SessionId> {
        self.writer.create_session(name)
    }

    /// Looks a session up by name.
    pub fn session_id(&self, name: &str) -> Result<Option<SessionId>> {
        for info in self.sessions()? {
            if info.name == name {
                return Ok(Some(info.id));
            }
        }
        Ok(None)
    }

    /// Every session, in id order.
    pub fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let heads = self.shared.heads.lock().expect("heads lock").clone();
        let mut out = Vec::new();
        for item in self.shared.sessions.iter() {
            let (k, v) = item.map_err(sled_err(&self.shared.path))?;
            let id = codec::session_from_key(&k);
            let name = String::from_utf8_lossy(&v).into_owned();
            out.push(SessionInfo { id, name, head: heads.get(&id).copied().unwrap_or(0) });
        }
        Ok(out)
    }

    /// The newest sequence number of `session` (0 when it has no events).
    pub fn head(&self, session: SessionId) -> Result<Seq> {
        self.shared
            .heads
            .lock()
            .expect("heads lock")
            .get(&session)
            .copied()
            .ok_or_else(|| LogError::UnknownSession(session.to_string()))
    }

    /// Deletes `session`: its name and every event. Its id is never given to another session.
    pub fn remove_session(&self, session: SessionId) -> Result<()> {
        self.writer.remove(session)
    }

    /// Appends `events` to `session` if its head is still `expected_head`; returns the new head once the
    /// events are durable.
    pub fn append(&self, session: SessionId, expected_head: Seq, events: Vec<Event>) -> Result<Seq> {
        self.writer.append(session, expected_head, events)
    }

    /// Starts an append of envelopes the caller encoded itself (with [`encode_envelope`], for the seqs
    /// `expected_head + 1 ..`) and returns at once; the receiver yields the new head, or the error. A
    /// caller can encode its next chunk while this one is written.
    ///
    /// With `durable`, the head comes once the values are durable. Without, it comes once they are
    /// written: the next durable append, [`Log::sync`], or closing the log makes them durable, and a crash
    /// before then loses a suffix of such appends (never a middle: what survives is still a gap-free prefix
    /// of each session). That is for a host that can afford to lose its latest events because their source
    /// resends them (a client resending its whole history), in exchange for not waiting for the disk.
    pub fn append_encoded(
        &self,
        session: SessionId,
        expected_head: Seq,
        values: Vec<Vec<u8>>,
        durable: bool,
    ) -> Result<Receiver<Result<Seq>>> {
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| v.len() > codec::MAX_VALUE_BYTES + 1) {
            return Err(LogError::Oversized { session, seq: expected_head + 1 + i as u64, bytes: v.len() as u64, max: codec::MAX_VALUE_BYTES as u64 });
        }
        self.writer.append_prepared(session, expected_head, values, durable)
    }

    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<()> {
        self.writer.sync()
    }

    /// Reads the events of `session` with `from <= seq <= to`, in order.
    pub fn read(&self, session: SessionId, from: Seq, to: Seq) -> Result<Vec<Envelope>> {
        let mut out = Vec::new();
        self.for_each(session, from, to, |e| {
            out.push(e);
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f` with each event of `session` in `from..=to`, decoding one at a time.
    pub fn for_each(
        &self,
        session: SessionId,
        from: Seq,
        to: Seq,
        mut f: impl FnMut(Envelope) -> Result<()>,
    ) -> Result<()> {
        if from > to {
            return Ok(());
        }
        let lo = codec::key(session, from);
        let hi = codec::key(session, to);
        let mut range = self.shared.events.range(lo..=hi);
        loop {
            let next = quietly(|| range.next()).map_err(|p| LogError::Damaged {
                path: self.shared.path.clone(),
                detail: format!("sled failed reading session {session} ({p})"),
            })?;
            let Some(item) = next else { return Ok(()) };
            let (k, v) = item.map_err(sled_err(&self.shared.path))?;
            let (s, seq) = codec::split_key(&k);
            f(decode_envelope(s, seq, &v)?)?;
        }
    }

    /// A channel that receives a notice after every durable group of appends.
    pub fn subscribe(&self) -> Receiver<Appended> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.shared.subscribers.lock().expect("subscribers lock").push(tx);
        rx
    }

    /// Stores `bytes` as a content-addressed blob and returns its hash.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.blobs.put(bytes)
    }

    /// Reads the blob `hash`, checking that its content still matches.
    pub fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        self.blobs.get(hash)
    }

    /// Every blob hash present, sorted.
    pub fn blob_hashes(&self) -> Result<Vec<BlobHash>> {
        self.blobs.list()
    }

    /// Checks every stored value: it decodes, carries the key it is stored under, and each session's
    /// sequence runs from 1 to its head without a gap; every blob matches its hash.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        for info in self.sessions()? {
            let mut expected = 1;
            let mut referenced: Vec<(Seq, String)> = Vec::new();
            self.for_each(info.id, 1, Seq::MAX, |env| {
                if let Some(b) = blob_of(&env.body) {
                    referenced.push((env.seq, b.to_string()));
                }
                if env.seq != expected {
                    return Err(LogError::Corrupt {
                        session: info.id,
                        seq: env.seq,
                        reason: format!("gap: expected seq {expected}"),
                    });
                }
                expected += 1;
                report.events += 1;
                Ok(())
            })?;
            if expected - 1 != info.head {
                return Err(LogError::Corrupt {
                    session: info.id,
                    seq: expected,
                    reason: format!("head is {} but events end at {}", info.head, expected - 1),
                });
            }
            // Every blob an event names is there and holds what its name says.
            for (seq, b) in referenced {
                let hash = BlobHash::parse(&b).ok_or_else(|| LogError::Corrupt { session: info.id, seq, reason: format!("blob name `{b}` is not a hash") })?;
                self.blobs.get(&hash).map_err(|e| LogError::Corrupt { session: info.id, seq, reason: format!("the output it spilled: {e}") })?;
            }
            report.sessions += 1;
        }
        for hash in self.blobs.list()? {
            self.blobs.get(&hash)?;
            report.blobs += 1;
        }
        Ok(report)
    }

    /// Writes every session, event and blob to one portable file.
    pub fn export(&self, path: impl AsRef<Path>) -> Result<ExportSummary> {
        export::export(self, path.as_ref())
    }

    /// Reads a file written by [`Log::export`] into this log, resumably: a session the log holds in full
    /// already is skipped, one holding a prefix of the export's events is completed, and one of the same
    /// name with other events is [`LogError::RestoreConflict`]. The file is checked in full, and every
    /// conflict found, before anything is written.
    pub fn import(&self, path: impl AsRef<Path>) -> Result<ExportSummary> {
        export::import(self, path.as_ref())
    }

    /// Flushes and stops the writer. Later calls on any clone return [`LogError::Closed`].
    pub fn close(&self) {
        self.writer.stop();
    }
}

/// Key (in sled's default tree) of the lowest id a new session may take: one above every removed one.
pub(crate) const ID_FLOOR_KEY: &[u8] = b"condense/session-id-floor";

pub(crate) fn id_floor(shared: &Shared) -> SessionId {
    match shared.db.get(ID_FLOOR_KEY) {
        Ok(Some(v)) if v.len() == 8 => u64::from_be_bytes(v.as_ref().try_into().expect("8 bytes")),
        _ => 1,
    }
}

/// Removes sled's unfinished snapshot files (`snap.*.generating`) from `db`; whether there were any.
fn remove_partial_snapshots(db: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(db) else { return false };
    let mut removed = false;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") && std::fs::remove_file(e.path()).is_ok() {
            removed = true;
        }
    }
    removed
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic inside it (sled's, on damaged files) into `Err` with the panic's message.
/// The process's panic hook stays silent for panics caught here and reports every other panic as before.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// The blob an event refers to (a spilled output), if any.
pub(crate) fn blob_of(e: &Event) -> Option<&str> {
    match e {
        Event::Decision(condense_events::DecisionEvent::OutputSpilled { blob, .. }) => Some(blob),
        _ => None,
    }
}

/// What [`Log::verify`] checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Sessions checked.
    pub sessions: u64,
    /// Events decoded.
    pub events: u64,
    /// Blobs re-hashed.
    pub blobs: u64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_inside_quietly_is_an_error_with_its_message() {
        assert_eq!(super::quietly(|| 7), Ok(7));
        let r: Result<(), String> = super::quietly(|| panic!("index out of bounds: the len is 10 but the index is 13"));
        assert_eq!(r, Err("index out of bounds: the len is 10 but the index is 13".to_string()));
        let r: Result<(), String> = super::quietly(|| std::panic::panic_any(5u8));
        assert_eq!(r, Err("a panic without a message".to_string()));
    }
}
