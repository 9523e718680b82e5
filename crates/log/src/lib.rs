//! The event log: an append-only store of [`Envelope`]s keyed by `(session, seq)`, on one of two
//! backends behind the [`Backend`] trait: sled, embedded (the default), or PostgreSQL, shared by several
//! processes (see `pg`). Both store the same encoded bytes and give the same guarantees; below is the sled
//! backend's design.
//!
//! One writer thread owns every session's sequence. Callers send it append requests that name the head
//! they expect; it gathers whatever requests are waiting into one group, writes them as one sled batch,
//! flushes, and only then acknowledges them. A process killed at any point therefore reopens with a
//! gap-free prefix of each session that holds every acknowledged event. Large bodies live beside the
//! database as content-addressed blob files (blake3, written to a temp file and renamed into place), and
//! an import's values in one value file per session that sled points into (`values`).
//!
//! # Example
//!
//! Appending events to a session and reading them back (in memory here; [`Log::open`] takes a folder,
//! and a `postgres://` URL through [`Log::open_location`]):
//!
//! ```
//! use condense_events::{Entry, Event, Message, SourceEvent, UserOrigin};
//! use condense_log::Log;
//!
//! let log = Log::in_memory();
//! let session = log.create_session("demo")?;
//! let prompt = SourceEvent::EntryAppended {
//!     id: "u1".into(),
//!     parent: None,
//!     entry: Entry::Message(Message::user_text("hello", UserOrigin::Prompt)),
//! };
//! // An append names the head it expects, so two writers never interleave a session.
//! let head = log.append(session, 0, vec![Event::Source(prompt.clone()), Event::Source(SourceEvent::TurnEnded)])?;
//! assert_eq!(head, 2);
//! assert!(log.append(session, 0, vec![Event::Source(SourceEvent::TurnEnded)]).is_err());
//! let back = log.read(session, 1, head)?;
//! assert_eq!(back[0].seq, 1);
//! assert_eq!(back[0].body, Event::Source(prompt));
//! # Ok::<(), condense_log::LogError>(())
//! ```

mod blob;
mod codec;
mod export;
mod manifest;
mod memory;
mod pg;
mod sled_shared;
mod sled_store;
pub mod testing;
mod values;
mod writer;

use condense_events::{Envelope, Event, Seq, SessionId};
use crossbeam_channel::Receiver;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use blob::{BlobHash, BLOB_CHUNK_BYTES, INLINE_BLOB_BYTES};
pub use codec::{decode_envelope, encode_envelope, encode_event, encode_event_compressed, encode_packed, events_in, FORMAT_EXTERNAL, FORMAT_LZ4, FORMAT_PACKED, FORMAT_VERSION, MAX_VALUE_BYTES, PACK_BYTES};
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
    /// PostgreSQL reported an error, or could not be reached.
    #[error("PostgreSQL store {store}: {detail}")]
    Postgres {
        /// The database (its URL without a password).
        store: String,
        /// What went wrong.
        detail: String,
    },
    /// The PostgreSQL server cannot be reached (down, restarting, or no connection free in time):
    /// nothing was written, and the same call can be made again once it is back.
    #[error("PostgreSQL store {store} is unavailable: {detail}")]
    Unavailable {
        /// The database (its URL without a password).
        store: String,
        /// What went wrong.
        detail: String,
    },
    /// The database was set up by a newer condense than this one.
    #[error("PostgreSQL store {store} has schema version {found}; this condense knows versions up to {known} (upgrade condense)")]
    SchemaTooNew {
        /// The database (its URL without a password).
        store: String,
        /// The version the database holds.
        found: i32,
        /// The newest version this build knows.
        known: i32,
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

/// What a log backend does; [`Log`] adds the checks and conveniences common to both. Implemented by the
/// embedded sled store and by PostgreSQL ([`Location`] picks one). Every backend stores the same encoded
/// bytes per `(session, seq)`, acknowledges an append only once it is durable (unless asked otherwise),
/// and refuses an append whose expected head is stale with [`LogError::HeadMismatch`]. Dropping a backend
/// closes it.
pub trait Backend: Send + Sync {
    /// Where the store is, for messages (never with a password).
    fn describe(&self) -> String;
    /// How long the oldest database operation in flight has waited, when one is in flight (a server that
    /// stopped answering without refusing connections hangs them). An embedded store never hangs: `None`.
    fn stalled_for(&self) -> Option<std::time::Duration> {
        None
    }
    /// Creates a session named `name`; under the id `wanted` when that id is free and was never used.
    fn create_session(&self, name: &str, wanted: Option<SessionId>) -> Result<SessionId>;
    /// [`Backend::create_session`] without waiting for the disk: the next durable append or sync makes
    /// the session durable, with what was appended to it. A backend whose creations cost no wait keeps
    /// this default.
    fn create_session_deferred(&self, name: &str) -> Result<SessionId> {
        self.create_session(name, None)
    }
    /// Whether values are stored compressed ([`encode_event_compressed`]); a store held in memory for a
    /// moment is not worth the work.
    fn compresses(&self) -> bool {
        true
    }
    /// Whether the backend stores packed values ([`encode_packed`]): runs of events under one key.
    fn packs(&self) -> bool {
        false
    }
    /// Every session, in id order.
    fn sessions(&self) -> Result<Vec<SessionInfo>>;
    /// The session's newest sequence number as stored now (another process may have appended).
    fn head(&self, session: SessionId) -> Result<Seq>;
    /// Looks a session up by name.
    fn session_id(&self, name: &str) -> Result<Option<SessionId>> {
        Ok(self.sessions()?.into_iter().find(|s| s.name == name).map(|s| s.id))
    }
    /// Deletes a session and its events; its id is never given to another session.
    fn remove_session(&self, session: SessionId) -> Result<()>;
    /// Starts an append of encoded values for `expected + 1 ..` (see [`Log::append_encoded`]).
    fn append_encoded(&self, session: SessionId, expected: Seq, values: Vec<Vec<u8>>, durable: bool) -> Result<Receiver<Result<Seq>>>;
    /// Makes everything appended so far durable.
    fn sync(&self) -> Result<()>;
    /// Calls `f` with the stored bytes of each event of `session` in `from..=to`, in order.
    fn for_each_value(&self, session: SessionId, from: Seq, to: Seq, f: &mut dyn FnMut(Seq, &[u8]) -> Result<()>) -> Result<()>;
    /// A channel that hears every durable group of appends (of every process, where the backend is shared).
    fn subscribe(&self) -> Receiver<Appended>;
    /// Stores a content-addressed blob.
    fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash>;
    /// [`Backend::put_blob`] without waiting for the disk: durable before the next durable append or sync
    /// is, so before any event naming it. A backend whose blobs cost no wait keeps this default.
    fn put_blob_deferred(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.put_blob(bytes)
    }
    /// Reads a blob, checking its content against its hash.
    fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>>;
    /// Every blob hash present, sorted.
    fn blob_hashes(&self) -> Result<Vec<BlobHash>>;
    /// Finishes pending work and stops; later calls return [`LogError::Closed`].
    fn close(&self);
}

/// Where a log lives: a folder for the embedded sled store, or a PostgreSQL database.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A folder: the sled database in `DIR/db`, value files in `DIR/values`, blobs in `DIR/blobs`.
    Dir(PathBuf),
    /// A PostgreSQL connection string (`postgres://user[:password]@host[:port]/database[?options]`).
    Postgres(String),
}

impl Location {
    /// A `postgres://` or `postgresql://` URL names a PostgreSQL database; anything else is a folder.
    pub fn parse(spec: &Path) -> Location {
        match spec.to_str() {
            Some(s) if s.starts_with("postgres://") || s.starts_with("postgresql://") => Location::Postgres(s.to_string()),
            _ => Location::Dir(spec.to_path_buf()),
        }
    }

    /// The folder, when the store is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Location::Dir(d) => Some(d),
            Location::Postgres(_) => None,
        }
    }
}

/// Shown without a password.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Dir(d) => write!(f, "{}", d.display()),
            Location::Postgres(url) => f.write_str(&pg::redact(url)),
        }
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

/// A handle to an open log. Cheap to clone; the backend stops when the last handle is dropped (each
/// backend finishes its pending work and stops when dropped).
#[derive(Clone)]
pub struct Log {
    backend: Arc<dyn Backend>,
}

impl Log {
    /// Opens (or creates) the log at `dir`: a folder (the sled database in `dir/db`, blobs in
    /// `dir/blobs`), or a PostgreSQL database when `dir` is a `postgres://` URL.
    pub fn open(dir: impl AsRef<Path>) -> Result<Log> {
        Log::open_with(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`Log::open`] with sled's page cache bounded to `cache_bytes` (a long-running server holding many
    /// sessions keeps its memory down with a smaller cache; evicted pages are read back from disk).
    pub fn open_with(dir: impl AsRef<Path>, cache_bytes: u64) -> Result<Log> {
        Log::open_location(&Location::parse(dir.as_ref()), cache_bytes)
    }

    /// Opens the log at `location`; `cache_bytes` bounds sled's page cache.
    pub fn open_location(location: &Location, cache_bytes: u64) -> Result<Log> {
        let backend: Arc<dyn Backend> = match location {
            Location::Dir(dir) => Arc::new(sled_store::SledStore::open(dir, cache_bytes)?),
            Location::Postgres(url) => Arc::new(pg::PgStore::open(url)?),
        };
        Ok(Log { backend })
    }

    /// A log held in memory only, gone when dropped (a scratch store: `condense simulate` without
    /// `--keep`). Appends are acknowledged at once; nothing is written to disk.
    pub fn in_memory() -> Log {
        Log { backend: Arc::new(memory::MemoryStore::default()) }
    }

    /// Where the store is (never with a password).
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// How long the oldest database operation in flight has waited ([`Backend::stalled_for`]).
    pub fn stalled_for(&self) -> Option<std::time::Duration> {
        self.backend.stalled_for()
    }

    /// Creates a session named `name` and returns its id.
    pub fn create_session(&self, name: &str) -> Result<SessionId> {
        self.backend.create_session(name, None)
    }

    /// Creates a session named `name` and returns its id at once, durable with the next durable append or
    /// [`Log::sync`] (a crash before then may lose it, with its deferred appends): for a caller that
    /// writes the session's first events straight after and makes them durable itself, as an import does.
    pub fn create_session_deferred(&self, name: &str) -> Result<SessionId> {
        self.backend.create_session_deferred(name)
    }

    /// Creates a session named `name` under the id `wanted` when that id is free and was never used, else
    /// under the next one (an import keeps the ids of an export this way).
    pub fn create_session_as(&self, name: &str, wanted: SessionId) -> Result<SessionId> {
        self.backend.create_session(name, Some(wanted))
    }

    /// Looks a session up by name.
    pub fn session_id(&self, name: &str) -> Result<Option<SessionId>> {
        self.backend.session_id(name)
    }

    /// Every session, in id order.
    pub fn sessions(&self) -> Result<Vec<SessionInfo>> {
        self.backend.sessions()
    }

    /// The newest sequence number of `session` (0 when it has no events).
    pub fn head(&self, session: SessionId) -> Result<Seq> {
        self.backend.head(session)
    }

    /// Deletes `session`: its name and every event. Its id is never given to another session.
    pub fn remove_session(&self, session: SessionId) -> Result<()> {
        self.backend.remove_session(session)
    }

    /// Appends `events` to `session` if its head is still `expected_head`; returns the new head once the
    /// events are durable.
    pub fn append(&self, session: SessionId, expected_head: Seq, events: Vec<Event>) -> Result<Seq> {
        let values = self.encode_each(session, expected_head + 1, &events);
        self.append_encoded(session, expected_head, values, true)?.recv().map_err(|_| LogError::Closed)?
    }

    /// Encodes event `body` as it is stored at `seq` of `session` in this log, for
    /// [`Log::append_encoded`]: compressed where the backend stores values compressed.
    pub fn encode(&self, session: SessionId, seq: Seq, body: &Event) -> Vec<u8> {
        if self.backend.compresses() {
            encode_event_compressed(session, seq, body)
        } else {
            encode_event(session, seq, body)
        }
    }

    /// The values that store `bodies`, the events of `session` from seq `first` on, for
    /// [`Log::append_encoded`]: packed into runs of up to [`PACK_BYTES`] where the backend stores packed
    /// values (sled: one key per run costs less than one per event), one per event otherwise. What an
    /// import writes; reading gives back each event as if stored on its own.
    pub fn encode_packed<'a>(&self, session: SessionId, first: Seq, bodies: impl IntoIterator<Item = &'a Event>) -> Vec<Vec<u8>> {
        if self.backend.packs() {
            encode_packed(session, first, bodies)
        } else {
            self.encode_each(session, first, bodies)
        }
    }

    /// One value per event of `bodies` ([`Log::encode`]), the events of `session` from seq `first` on.
    fn encode_each<'a>(&self, session: SessionId, first: Seq, bodies: impl IntoIterator<Item = &'a Event>) -> Vec<Vec<u8>> {
        bodies.into_iter().enumerate().map(|(i, e)| self.encode(session, first + i as u64, e)).collect()
    }

    /// Starts an append of envelopes the caller encoded itself (with [`Log::encode`] or
    /// [`Log::encode_packed`], for the seqs `expected_head + 1 ..`) and returns at once; the receiver yields the new head, or the error. A
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
        let packs = self.backend.packs();
        let mut last = expected_head;
        for v in &values {
            last += events_in(v);
            if v.len() > codec::MAX_VALUE_BYTES + 1 {
                return Err(LogError::Oversized { session, seq: last, bytes: v.len() as u64, max: codec::MAX_VALUE_BYTES as u64 });
            }
            if v.first() == Some(&FORMAT_EXTERNAL) {
                return Err(LogError::Corrupt { session, seq: last, reason: "a value that points into a value file, which only the store itself writes".into() });
            }
            if !packs && v.first() == Some(&FORMAT_PACKED) {
                return Err(LogError::Corrupt { session, seq: last, reason: format!("a packed value, which {} does not store", self.backend.describe()) });
            }
        }
        self.backend.append_encoded(session, expected_head, values, durable)
    }

    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<()> {
        self.backend.sync()
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
        self.backend.for_each_value(session, from, to, &mut |seq, v| f(decode_envelope(session, seq, v)?))
    }

    /// Calls `f` with the stored bytes of each event of `session` in `from..=to` (what an export writes).
    pub fn for_each_value(&self, session: SessionId, from: Seq, to: Seq, mut f: impl FnMut(Seq, &[u8]) -> Result<()>) -> Result<()> {
        if from > to {
            return Ok(());
        }
        self.backend.for_each_value(session, from, to, &mut f)
    }

    /// A channel that receives a notice after every durable group of appends.
    pub fn subscribe(&self) -> Receiver<Appended> {
        self.backend.subscribe()
    }

    /// Stores `bytes` as a content-addressed blob and returns its hash.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.backend.put_blob(bytes)
    }

    /// Stores a blob as [`Log::put_blob`] does, durable with the next durable append or [`Log::sync`]
    /// instead of before this returns: for a host that defers durability (`condense serve`), whose
    /// events naming the blob are not durable before then either.
    pub fn put_blob_deferred(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.backend.put_blob_deferred(bytes)
    }

    /// Reads the blob `hash`, checking that its content still matches.
    pub fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        self.backend.get_blob(hash)
    }

    /// Every blob hash present, sorted.
    pub fn blob_hashes(&self) -> Result<Vec<BlobHash>> {
        self.backend.blob_hashes()
    }

    /// Checks every stored value: it decodes, carries the key it is stored under, and each session's
    /// sequence runs from 1 to its head without a gap; every blob matches its hash.
    ///
    /// Each session is checked as of the head read first: events appended while it runs (a server with
    /// traffic) lie past that head and are left for the next run, not taken for a tail the head does
    /// not cover.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        for info in self.sessions()? {
            let mut expected = 1;
            let mut referenced: Vec<(Seq, String)> = Vec::new();
            self.for_each(info.id, 1, info.head, |env| {
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
                self.get_blob(&hash).map_err(|e| LogError::Corrupt { session: info.id, seq, reason: format!("the output it spilled: {e}") })?;
            }
            report.sessions += 1;
        }
        for hash in self.blob_hashes()? {
            self.get_blob(&hash)?;
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
    /// conflict found, before anything is written. A new session keeps its exported id where this log
    /// never used it, so an export of a restored store is the same file.
    pub fn import(&self, path: impl AsRef<Path>) -> Result<ExportSummary> {
        export::import(self, path.as_ref())
    }

    /// Finishes pending work and stops the backend. Later calls on any clone return [`LogError::Closed`].
    pub fn close(&self) {
        self.backend.close();
    }
}

/// Requests waiting in a writer's channel are committed together, up to this many at once.
const MAX_GROUP: usize = 512;

/// The next group commit of a writer thread: the first request to arrive and whatever waits behind it;
/// `None` once every sender is gone.
pub(crate) fn next_group<T>(rx: &Receiver<T>) -> Option<Vec<T>> {
    let mut group = vec![rx.recv().ok()?];
    while group.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(r) => group.push(r),
            Err(_) => break,
        }
    }
    Some(group)
}

/// The error of an I/O operation on `path`, for `map_err`.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io { path: path.to_path_buf(), source }
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

/// A sled write run under [`quietly`]: a panic inside sled is its `ReportableBug` error.
pub(crate) fn sled_quietly<T>(f: impl FnOnce() -> sled::Result<T>) -> sled::Result<T> {
    quietly(f).unwrap_or_else(|p| Err(sled::Error::ReportableBug(format!("sled panicked: {p}"))))
}

/// A sled error as the log's: files sled finds corrupted are [`LogError::Damaged`], naming the database.
pub(crate) fn sled_err(path: &Path) -> impl FnOnce(sled::Error) -> LogError + '_ {
    move |source| match source {
        sled::Error::Corruption { .. } => LogError::Damaged {
            path: path.to_path_buf(),
            detail: format!("sled finds its files corrupted ({source})"),
        },
        source => LogError::Sled { path: path.to_path_buf(), source },
    }
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
