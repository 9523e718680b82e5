//! The embedding facade. A host opens a [`Store`], gets a [`Session`], appends the events it sees and
//! calls [`Session::render`] before each model request.
//!
//! Each session keeps a warm [`Projection`] in memory: appends update it with the events they wrote, and a
//! render that finds the log ahead (another handle appended) folds the missing events first. Rendering at
//! an earlier point (`render_at`) folds a fresh projection from the log.

pub mod config;
pub mod controller;
pub mod demo;
pub mod pipeline;
pub mod query;
pub mod recover;
pub mod retention;
pub mod simulate;
mod stats;
pub mod tools;

use condense_events::{DecisionEvent, Event, PruneConfig, Seq, SessionId, SourceEvent};
use condense_summarize::{Extractive, Summarizer};
use condense_log::{Log, LogError, SessionInfo};
use condense_render::{Projection, Rendered};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use condense_formats::{Diagnostic, Format};
pub use stats::Stats;

/// Events are written in chunks of this many, one durable group each.
const APPEND_CHUNK: usize = 4096;
/// The streaming importer hands over what it parsed once it holds this many events or has read this many
/// bytes of the file since the last hand-over, so the log writer works while the parser reads on, even on
/// a file of a megabyte. Each hand-over is one append, one sled batch, and sled writes its buffer out
/// (with a wait for the disk on one of its threads) at every batch: with packed values, 512 KiB chunks
/// instead of 64 KiB made the corpus pi import about a third faster.
const IMPORT_CHUNK: usize = 2048;
const IMPORT_CHUNK_BYTES: u64 = 512 * 1024;
/// The most chunks a streaming import has handed to the log writer and not yet seen written: it encodes
/// the next while the writer writes these.
const IMPORT_IN_FLIGHT: usize = 4;
/// The most events a streaming import holds while the file's hash is still being computed.
const IMPORT_HELD: usize = 16 * 1024;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// An import failed as a whole.
    #[error(transparent)]
    Format(#[from] condense_formats::FormatError),
    /// No session has this name.
    #[error("no session named `{0}`")]
    UnknownSession(String),
    /// The session has no entry with this id.
    #[error("session `{name}` has no entry `{entry}` (`condense render SESSION --entry-ids` lists them)")]
    UnknownEntry {
        /// The session.
        name: String,
        /// The id asked for.
        entry: String,
    },
    /// The session has no such checkpoint.
    #[error("session `{name}` has {what}")]
    UnknownCheckpoint {
        /// The session.
        name: String,
        /// What it lacks (`no checkpoint c5`, `no checkpoints yet`).
        what: String,
    },
    /// A pipeline stage failed (a summarizer, a blob write); nothing of that run was stored.
    #[error("session `{name}`: pruning pipeline: {reason}")]
    Pipeline {
        /// The session.
        name: String,
        /// What failed.
        reason: String,
    },
    /// No checkpoint could bring the context under the model's budget; the run must stop before the
    /// next request.
    #[error("session `{name}`: {code}: {reason}")]
    CompactionFailed {
        /// The session.
        name: String,
        /// The stable error code (`CONTEXT_COMPACTION_FAILED`).
        code: String,
        /// What failed.
        reason: String,
    },
    /// The payload guard rejected an oversized request after a model change; the overflow is recorded
    /// and the next `prepare` recovers.
    #[error("session `{name}`: context overflow: the request is {bytes} bytes, over {limit} for the new model")]
    ContextOverflow {
        /// The session.
        name: String,
        /// The payload's size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A recovery tool was called with arguments it cannot take, or an archive cannot be built.
    #[error(transparent)]
    Recovery(condense_recovery::RecoveryError),
    /// A session name belongs to something else than the file being imported.
    #[error("session `{name}` exists already and {reason}; import the file under another name")]
    NameTaken {
        /// The session.
        name: String,
        /// What the session holds instead.
        reason: String,
    },
    /// A render was asked for at a sequence number past the session's head.
    #[error("session `{name}` has {head} events; cannot render at {at}")]
    PastHead {
        /// The session.
        name: String,
        /// Its head.
        head: Seq,
        /// The requested point.
        at: Seq,
    },
}

/// Result type of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

struct Inner {
    /// Archive views built lately, by (session, archive id); at most three are kept (two committed views
    /// plus the one in flight), older ones are rebuilt from the log.
    archives: Mutex<Vec<((SessionId, String), Arc<condense_recovery::Archive>)>>,
    log: Log,
    warm: Mutex<Warm>,
    summarizer: Mutex<Arc<dyn Summarizer>>,
    defer_durability: bool,
}

/// A warm session: its render projection and its pipeline stages, folded from the same events. Every
/// event goes into both through [`Live::apply`]; readers see the projection.
#[derive(Default)]
struct Live {
    proj: Projection,
    stages: pipeline::Stages,
}

impl std::ops::Deref for Live {
    type Target = Projection;
    fn deref(&self) -> &Projection {
        &self.proj
    }
}

impl Live {
    fn apply(&mut self, seq: Seq, event: &Event) {
        self.stages.fold(event);
        self.proj.apply(seq, event);
    }

    fn apply_owned(&mut self, seq: Seq, event: Event) {
        self.stages.fold(&event);
        self.proj.apply_owned(seq, event);
    }
}

/// The warm projections, bounded: the least recently used one that nobody holds is dropped when there are
/// more than `limit` (it is folded again from the log when next needed).
struct Warm {
    /// Each warm session: its projection and pipeline stages, and when it was last used.
    map: BTreeMap<SessionId, (Arc<Mutex<Live>>, u64)>,
    tick: u64,
    limit: usize,
}

/// How a store is opened.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// Warm projections kept in memory at most (the least recently used beyond it are dropped).
    pub warm_limit: usize,
    /// Appends return once written, before they are durable; [`Store::sync`] (or any durable write after
    /// them) makes them durable. For a host whose source resends what a crash would lose (`condense
    /// serve`: the client sends its whole history with every request). Off by default.
    pub defer_durability: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_bytes: condense_log::DEFAULT_CACHE_BYTES, warm_limit: 64, defer_durability: false }
    }
}

/// An open store: the event log plus the warm projections of the sessions used lately.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// A handle to one session of a store.
#[derive(Clone)]
pub struct Session {
    store: Store,
    id: SessionId,
    name: String,
}

/// What importing a file did to its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportAction {
    /// A new session.
    Imported,
    /// The session holds this file already, complete.
    Unchanged,
    /// An import of this file had stopped part-way: the missing events were appended.
    Resumed,
    /// The file grew since it was imported: what it grew by was appended.
    Grown,
}

/// The outcome of importing one session file.
#[derive(Debug, Clone)]
pub struct ImportOutcome {
    /// What happened.
    pub action: ImportAction,
    /// The session's name in the store.
    pub name: String,
    /// The detected format.
    pub format: Format,
    /// Events written by this import.
    pub events: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Problems met (also stored as events).
    pub diagnostics: Vec<Diagnostic>,
}

impl Store {
    /// Opens (or creates) a store in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(dir, StoreOptions::default())
    }

    /// Opens (or creates) a store in `dir` with explicit memory bounds.
    pub fn open_with(dir: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        Ok(Store::on_log(Log::open_with(dir, options.cache_bytes)?, options))
    }

    /// A store held in memory only (see [`Log::in_memory`]): a scratch store nothing needs to survive.
    pub fn in_memory(options: StoreOptions) -> Store {
        Store::on_log(Log::in_memory(), options)
    }

    fn on_log(log: Log, options: StoreOptions) -> Store {
        Store {
            inner: Arc::new(Inner {
                archives: Mutex::new(Vec::new()),
                log,
                warm: Mutex::new(Warm { map: BTreeMap::new(), tick: 0, limit: options.warm_limit.max(1) }),
                summarizer: Mutex::new(Arc::new(Extractive::default())),
                defer_durability: options.defer_durability,
            }),
        }
    }

    /// Tells stores apart (for the one thread-local of `prepare`): the address of the shared state.
    fn key(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Replaces the summarizer the pruning pipeline uses (the embedded default is [`Extractive`]).
    pub fn set_summarizer(&self, summarizer: Arc<dyn Summarizer>) {
        *self.inner.summarizer.lock().expect("summarizer lock") = summarizer;
    }

    /// Makes every append so far durable (a no-op cost when nothing is pending).
    pub fn sync(&self) -> Result<()> {
        Ok(self.inner.log.sync()?)
    }

    /// The underlying log.
    pub fn log(&self) -> &Log {
        &self.inner.log
    }

    /// Every session, in id order.
    pub fn sessions(&self) -> Result<Vec<SessionInfo>> {
        Ok(self.inner.log.sessions()?)
    }

    /// Creates a new, empty session.
    pub fn create_session(&self, name: &str) -> Result<Session> {
        let id = self.inner.log.create_session(name)?;
        Ok(Session { store: self.clone(), id, name: name.to_string() })
    }

    /// Deletes the session `name` and its events (spilled outputs stay as blobs; they are content-addressed
    /// and may be shared).
    pub fn remove_session(&self, name: &str) -> Result<()> {
        let id = self.inner.log.session_id(name)?.ok_or_else(|| EngineError::UnknownSession(name.to_string()))?;
        self.inner.log.remove_session(id)?;
        self.inner.warm.lock().expect("warm lock").map.remove(&id);
        self.inner.archives.lock().expect("archive cache lock").retain(|((s, _), _)| *s != id);
        Ok(())
    }

    /// Opens an existing session by name.
    pub fn session(&self, name: &str) -> Result<Session> {
        let id = self.inner.log.session_id(name)?.ok_or_else(|| EngineError::UnknownSession(name.to_string()))?;
        Ok(Session { store: self.clone(), id, name: name.to_string() })
    }

    /// Imports a session file (pi, Claude Code or Codex, detected) as session `name`. The file's canonical
    /// path, size and hash are recorded before its events (`ImportStarted`) and again after the last one
    /// (`ImportCompleted`), so importing the same file again finishes an import that stopped part-way,
    /// appends what a file grew by (pi, Claude Code and Codex files only grow), and leaves a complete one
    /// as it is. A different file under the same name is an error.
    pub fn import_file(&self, path: &Path, name: &str) -> Result<ImportOutcome> {
        let mut all = self.import_file_all(path, name)?;
        Ok(all.remove(0))
    }

    /// As [`Store::import_file`], for every session the file holds: one for most formats; one per line of
    /// an OpenHands evaluation output, each named `NAME#INSTANCE_ID`.
    pub fn import_file_all(&self, path: &Path, name: &str) -> Result<Vec<ImportOutcome>> {
        self.import_file_all_with(path, name, true)
    }

    /// [`Store::import_file_all`] for one file of many: a new session of a line format is written without
    /// waiting for the disk, and [`Store::sync`] after the last file makes every one durable at once (one
    /// flush for a folder instead of one per file). A crash before that sync loses such sessions, or the
    /// end of them; importing the files again finishes them, as after any interrupted import.
    pub fn import_file_all_deferred(&self, path: &Path, name: &str) -> Result<Vec<ImportOutcome>> {
        self.import_file_all_with(path, name, false)
    }

    fn import_file_all_with(&self, path: &Path, name: &str, durable: bool) -> Result<Vec<ImportOutcome>> {
        let mut out = None;
        self.import_files_with(&[(path, name)], durable, &mut |_, r| out = Some(r));
        out.expect("one result per file")
    }

    /// [`Store::import_file_all_deferred`] for several files at once, each with the name of its session:
    /// `done` is given each file's index and result as it is imported, in order. New sessions of a line
    /// format are read ahead: a file is hashed and parsed while the one before it is written, so a folder
    /// of small files keeps both cores busy (one file at a time, a file of a megabyte is read before its
    /// first write and written after its last read). Files are imported in the order given, and a file
    /// whose session exists, or whose name an earlier file took, waits for the files before it.
    pub fn import_files_deferred(&self, files: &[(PathBuf, String)], done: &mut dyn FnMut(usize, Result<Vec<ImportOutcome>>)) {
        let files: Vec<(&Path, &str)> = files.iter().map(|(p, n)| (p.as_path(), n.as_str())).collect();
        self.import_files_with(&files, false, done)
    }

    fn import_files_with(&self, files: &[(&Path, &str)], durable: bool, done: &mut dyn FnMut(usize, Result<Vec<ImportOutcome>>)) {
        // A store whose appends return before they are durable writes imports so too.
        let durable = durable && !self.inner.defer_durability;
        // Which files stream: a file of a session that does not exist yet, named by no earlier file.
        let mut named = std::collections::BTreeSet::new();
        let plans: Vec<Result<Option<Ahead>>> = files
            .iter()
            .map(|&(path, name)| {
                let first = named.insert(name);
                if !first || self.inner.log.session_id(name)?.is_some() {
                    return Ok(None);
                }
                let io = |source| EngineError::Format(condense_formats::FormatError::Io { path: path.to_path_buf(), source });
                let len = std::fs::metadata(path).map_err(io)?.len();
                let canonical = path.canonicalize().map_err(io)?.to_string_lossy().into_owned();
                Ok(Some(Ahead { path: path.to_path_buf(), len, canonical }))
            })
            .collect();
        let ahead: Vec<(PathBuf, u64)> = plans.iter().filter_map(|p| p.as_ref().ok()?.as_ref()).map(|a| (a.path.clone(), a.len)).collect();
        let (hash_tx, hash_rx) = crossbeam_channel::unbounded::<std::io::Result<String>>();
        let (tx, rx) = crossbeam_channel::bounded::<Parsed>(4);
        std::thread::scope(|scope| {
            // The import markers name a file's content before its first event, so each file is hashed
            // whole before its events are written: a thread of its own does it, ahead of the parser.
            let hashing = ahead.clone();
            let hasher = std::thread::Builder::new().name("condense-import-hash".into()).spawn_scoped(scope, move || {
                for (path, len) in hashing {
                    let hashed = std::fs::File::open(&path).and_then(|f| {
                        let mut hasher = blake3::Hasher::new();
                        // Exactly the bytes the markers name, should the file grow meanwhile.
                        hasher.update_reader(std::io::Read::take(f, len))?;
                        Ok(hasher.finalize().to_hex().to_string())
                    });
                    if hash_tx.send(hashed).is_err() {
                        return;
                    }
                }
            });
            let parsing: Vec<PathBuf> = ahead.into_iter().map(|(p, _)| p).collect();
            let parser = std::thread::Builder::new().name("condense-import".into()).spawn_scoped(scope, move || {
                for path in parsing {
                    let read = std::fs::File::open(&path).and_then(|file| {
                        let read_bytes = std::rc::Rc::new(std::cell::Cell::new(0u64));
                        let reader = Consumed { inner: std::io::BufReader::with_capacity(1 << 20, file), consumed: read_bytes.clone() };
                        let mut chunk = Vec::with_capacity(IMPORT_CHUNK);
                        let mut handed = 0;
                        let read = condense_formats::import_stream(&path.display().to_string(), reader, &mut |e| {
                            chunk.push(e);
                            if chunk.len() == IMPORT_CHUNK || read_bytes.get() - handed >= IMPORT_CHUNK_BYTES {
                                handed = read_bytes.get();
                                // A writer that stopped has its error already; what is parsed after is dropped.
                                drop(tx.send(Parsed::Chunk(std::mem::replace(&mut chunk, Vec::with_capacity(IMPORT_CHUNK)))));
                            }
                        });
                        if !chunk.is_empty() {
                            drop(tx.send(Parsed::Chunk(chunk)));
                        }
                        read
                    });
                    if tx.send(Parsed::End(read)).is_err() {
                        return;
                    }
                }
            });
            let (hasher, parser) = match (hasher, parser) {
                (Ok(h), Ok(p)) => (h, p),
                (h, p) => {
                    // Without a thread the files are not read ahead: each is imported on its own below.
                    drop((hash_rx, rx));
                    let _ = h.map(|h| h.join());
                    let _ = p.map(|p| p.join());
                    for (i, &(path, name)) in files.iter().enumerate() {
                        done(i, self.import_whole(path, name, durable));
                    }
                    return;
                }
            };
            // A streamed file's last appends are still being written while the next file starts: its
            // result is given once they are acknowledged, after the next file is handed over and before
            // that file's result, or any file read whole (it may read the session the file before it wrote).
            let mut behind: Option<(usize, Sent)> = None;
            let settle = |behind: &mut Option<(usize, Sent)>, done: &mut dyn FnMut(usize, Result<Vec<ImportOutcome>>)| {
                if let Some((j, sent)) = behind.take() {
                    done(j, sent.settle().map(|o| vec![o]));
                }
            };
            for (i, (&(path, name), plan)) in files.iter().zip(plans).enumerate() {
                let streamed = match &plan {
                    Ok(Some(a)) => Some(self.write_streamed(a, name, &hash_rx, &rx, durable)),
                    _ => None,
                };
                settle(&mut behind, done);
                let result = match (plan, streamed) {
                    (_, Some(Ok(Some(sent)))) => {
                        behind = Some((i, sent));
                        continue;
                    }
                    (Err(e), _) | (_, Some(Err(e))) => Err(e),
                    // Not read ahead, or not a line format (nothing was written).
                    (Ok(_), _) => self.import_whole(path, name, durable),
                };
                done(i, result);
            }
            settle(&mut behind, done);
            drop((hash_rx, rx));
            // A thread that panicked closed its channel early: the file it was on, and those after, say so.
            let _ = (hasher.join(), parser.join());
        })
    }

    /// Writes one file read ahead by [`Store::import_files_with`]'s threads as a new session: its hash,
    /// then what the parser hands over up to the file's end, every part of it taken even after a failed
    /// write, so the next file starts where its own stream does. Returns once every append, the
    /// completion marker last, is handed to the log, without waiting for the last ones ([`Sent`]).
    /// `None` when the file is not a line format (nothing is written).
    fn write_streamed(&self, a: &Ahead, name: &str, hashes: &crossbeam_channel::Receiver<std::io::Result<String>>, parsed: &crossbeam_channel::Receiver<Parsed>, durable: bool) -> Result<Option<Sent>> {
        let io = |source| EngineError::Format(condense_formats::FormatError::Io { path: a.path.clone(), source });
        let panicked = || EngineError::Format(condense_formats::FormatError::Unrecognized { path: a.path.clone(), reason: "the importer panicked".into() });
        let log = &self.inner.log;
        // Until the hash is known, what is parsed waits here (at most `IMPORT_HELD` events).
        let mut held = Vec::new();
        let mut held_events = 0;
        let mut end = None;
        let hash = loop {
            match hashes.try_recv() {
                Ok(h) => break h,
                Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(panicked()),
                Err(crossbeam_channel::TryRecvError::Empty) if end.is_none() && held_events < IMPORT_HELD => match parsed.recv() {
                    Ok(Parsed::Chunk(c)) => {
                        held_events += c.len();
                        held.push(c);
                    }
                    Ok(Parsed::End(r)) => end = Some(r),
                    Err(_) => return Err(panicked()),
                },
                Err(crossbeam_channel::TryRecvError::Empty) => break hashes.recv().map_err(|_| panicked())?,
            }
        };
        let mut session: Option<(SessionId, Seq)> = None;
        let mut written = 0u64;
        let mut failed: Option<EngineError> = None;
        let mut in_flight: std::collections::VecDeque<crossbeam_channel::Receiver<condense_log::Result<Seq>>> = std::collections::VecDeque::new();
        let mut held = held.into_iter();
        let end = loop {
            let chunk = match held.next() {
                Some(c) => c,
                None => match end.take() {
                    Some(r) => break r,
                    None => match parsed.recv() {
                        Ok(Parsed::Chunk(c)) => c,
                        Ok(Parsed::End(r)) => break r,
                        Err(_) => return Err(panicked()),
                    },
                },
            };
            if failed.is_some() {
                continue;
            }
            let hash = match &hash {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(io(std::io::Error::new(e.kind(), e.to_string())));
                    continue;
                }
            };
            let mut write = |mut chunk: Vec<SourceEvent>| -> Result<()> {
                let (id, head) = match &mut session {
                    Some(x) => x,
                    None => {
                        chunk.insert(1.min(chunk.len()), SourceEvent::ImportStarted { path: a.canonical.clone(), bytes: a.len, hash: hash.clone() });
                        session.insert((log.create_session_deferred(name)?, 0))
                    }
                };
                let events: Vec<Event> = chunk.into_iter().map(Event::Source).collect();
                let n = events.len() as u64;
                // Packed into few values where the log packs: one key per event is most of sled's cost.
                let values = log.encode_packed(*id, *head + 1, &events);
                // This chunk is encoded while the writer writes the ones before it.
                let sent = log.append_encoded(*id, *head, values, false)?;
                *head += n;
                written += n;
                in_flight.push_back(sent);
                if in_flight.len() > IMPORT_IN_FLIGHT {
                    let before = in_flight.pop_front().expect("more than one in flight");
                    acked(&before)?;
                }
                Ok(())
            };
            if let Err(e) = write(chunk) {
                failed = Some(e);
            }
        };
        let (hash, streamed) = match (failed, hash, end) {
            (None, Ok(hash), Ok(end)) => (hash, end),
            (failed, hash, end) => {
                // Every chunk handed over is waited for, and the first failure is the one reported: a
                // failed write before those of the appends after it (which fail too, at a head they no
                // longer find), and those before a read's.
                let drained = first_failure(in_flight);
                let read = hash.err().or(end.err()).map(io);
                return Err(failed.or(drained).or(read).expect("the arm above takes the case without a failure"));
            }
        };
        let Some(streamed) = streamed else { return Ok(None) };
        let (id, head) = match session {
            Some(x) => x,
            None => (log.create_session_deferred(name)?, 0),
        };
        let completed = Event::Source(SourceEvent::ImportCompleted { path: a.canonical.clone(), bytes: a.len, hash });
        // Written, as the session's other events are, without being folded into its warm projection.
        in_flight.push_back(log.append_encoded(id, head, vec![log.encode(id, head + 1, &completed)], durable)?);
        Ok(Some(Sent {
            outcome: ImportOutcome {
                action: ImportAction::Imported,
                name: name.to_string(),
                format: streamed.format,
                events: written + 1,
                bytes: a.len,
                diagnostics: streamed.diagnostics,
            },
            acks: in_flight.into(),
        }))
    }

    /// A file read whole: the formats that are not JSON lines, and a session that exists already (an
    /// import to finish, a file that grew, or one imported as it is).
    fn import_whole(&self, path: &Path, name: &str, durable: bool) -> Result<Vec<ImportOutcome>> {
        let io = |source| EngineError::Format(condense_formats::FormatError::Io { path: path.to_path_buf(), source });
        let bytes = std::fs::read(path).map_err(io)?;
        let canonical = path.canonicalize().map_err(io)?.to_string_lossy().into_owned();
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let sessions = condense_formats::import_sessions(&path.display().to_string(), &bytes)
            .map_err(|reason| EngineError::Format(condense_formats::FormatError::Unrecognized { path: path.to_path_buf(), reason }))?;
        let mut out = Vec::with_capacity(sessions.len());
        for (key, imported) in sessions {
            let name = match key {
                None => name.to_string(),
                Some(k) => format!("{name}#{k}"),
            };
            out.push(self.import_one(&canonical, &hash, &bytes, imported, &name, durable)?);
        }
        Ok(out)
    }

    /// Imports one session read from a file (see [`Store::import_file`]). Without `durable` (a folder's
    /// files, made durable together after the last), a new session and its events are written without a
    /// flush, as a streamed file's are.
    fn import_one(&self, canonical: &str, hash: &str, bytes: &[u8], imported: condense_formats::Imported, name: &str, durable: bool) -> Result<ImportOutcome> {
        let len = bytes.len() as u64;
        let started = SourceEvent::ImportStarted { path: canonical.to_string(), bytes: len, hash: hash.to_string() };
        let completed = SourceEvent::ImportCompleted { path: canonical.to_string(), bytes: len, hash: hash.to_string() };
        let condense_formats::Imported { format, events: file_events, diagnostics } = imported;
        let outcome = |action, events| ImportOutcome { action, name: name.to_string(), format, events, bytes: len, diagnostics: diagnostics.clone() };
        let write = |session: &Session, events: Vec<SourceEvent>| -> Result<()> {
            if durable {
                session.append(events)?;
            } else {
                // Folded into the warm projection when next read, as a streamed file's events are.
                session.write_unfolded(session.head()?, events.into_iter().map(Event::Source).collect(), false)?;
            }
            Ok(())
        };
        // The whole file into a session that holds nothing yet, between its import markers.
        let whole = |session: Session, mut events: Vec<SourceEvent>, action| -> Result<ImportOutcome> {
            events.insert(1.min(events.len()), started.clone());
            events.push(completed.clone());
            let n = events.len() as u64;
            write(&session, events)?;
            Ok(outcome(action, n))
        };
        let Some(id) = self.inner.log.session_id(name)? else {
            let id = if durable { self.inner.log.create_session(name)? } else { self.inner.log.create_session_deferred(name)? };
            return whole(Session { store: self.clone(), id, name: name.to_string() }, file_events, ImportAction::Imported);
        };
        let session = Session { store: self.clone(), id, name: name.to_string() };
        let held: Vec<SourceEvent> = self
            .inner
            .log
            .read(id, 1, session.head()?)?
            .into_iter()
            .filter_map(|e| match e.body {
                Event::Source(s) => Some(s),
                Event::Decision(_) => None,
            })
            .collect();
        // What the session says of its source: the last import that began, and whether it finished.
        let last_start = held.iter().rposition(|e| matches!(e, SourceEvent::ImportStarted { .. }));
        let Some(ls) = last_start else {
            if held.is_empty() {
                // Created, then stopped before its first events were written: import into it.
                return whole(session, file_events, ImportAction::Resumed);
            }
            return Err(EngineError::NameTaken { name: name.to_string(), reason: "it was not imported from a file (or by a condense that did not record its source)".into() });
        };
        let SourceEvent::ImportStarted { path: p0, bytes: b0, hash: h0 } = &held[ls] else { unreachable!("found above") };
        if *p0 != canonical {
            return Err(EngineError::NameTaken { name: name.to_string(), reason: format!("it holds {p0}") });
        }
        let finished = held[ls..].iter().any(|e| matches!(e, SourceEvent::ImportCompleted { .. }));
        if finished && *h0 == hash {
            return Ok(outcome(ImportAction::Unchanged, 0));
        }
        // The events of this import are the file's events; the session holds a prefix of them (an import
        // that stopped, or the file before it grew). Diagnostics and import markers are set aside.
        let core = |e: &&SourceEvent| !matches!(e, SourceEvent::ImportDiagnostic { .. } | SourceEvent::ImportStarted { .. } | SourceEvent::ImportCompleted { .. });
        let old: Vec<&SourceEvent> = held.iter().filter(core).collect();
        let new: Vec<&SourceEvent> = file_events.iter().filter(core).collect();
        let prefix = old.len() <= new.len() && old.iter().zip(&new).all(|(a, b)| a == b);
        // Grown: the file's old bytes are a prefix of its new ones (JSON lines only ever append), or a file
        // rewritten whole (a JSON document such as a Gemini CLI chat) holds what it held plus more.
        let grown = (len > *b0 && blake3::hash(&bytes[..*b0 as usize]).to_hex().as_str() == h0)
            || (finished && prefix && new.len() > old.len());
        if finished && !grown {
            return Err(EngineError::NameTaken { name: name.to_string(), reason: format!("{canonical} changed since it was imported, and not by growing") });
        }
        if !prefix {
            return Err(EngineError::NameTaken { name: name.to_string(), reason: format!("what it holds is not a prefix of what {canonical} holds now") });
        }
        let mut events: Vec<SourceEvent> = Vec::new();
        if grown {
            events.push(started);
        }
        events.extend(new[old.len()..].iter().map(|e| (*e).clone()));
        for d in file_events.iter().filter(|e| matches!(e, SourceEvent::ImportDiagnostic { .. })) {
            if !held.contains(d) {
                events.push(d.clone());
            }
        }
        events.push(completed);
        let n = events.len() as u64;
        write(&session, events)?;
        Ok(outcome(if grown { ImportAction::Grown } else { ImportAction::Resumed }, n))
    }

    /// Sessions whose last import began and never finished (a killed import): their names.
    pub fn incomplete_imports(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for info in self.sessions()? {
            let mut open = false;
            self.inner.log.for_each(info.id, 1, info.head, |env| {
                match env.body {
                    Event::Source(SourceEvent::ImportStarted { .. }) => open = true,
                    Event::Source(SourceEvent::ImportCompleted { .. }) => open = false,
                    _ => {}
                }
                Ok(())
            })?;
            if open {
                out.push(info.name);
            }
        }
        Ok(out)
    }

    /// Forks `source` into a new session `name` that ends at entry `at` (the source's active leaf when
    /// `None`): the entries on the path to it, the configuration and model in force, and every decision
    /// about those entries. A checkpoint is copied only when the fork includes its boundary (and every
    /// prompt it retains); refs keep their numbers, so `tN`, `bN` and `cN` mean the same in both sessions.
    pub fn fork(&self, source: &str, name: &str, at: Option<&str>) -> Result<Session> {
        let src = self.session(source)?;
        let head = src.head()?;
        let events = self.inner.log.read(src.id, 1, head)?;
        let mut proj = Projection::new();
        for env in &events {
            proj.apply(env.seq, &env.body);
        }
        if let Some(at) = at {
            proj.apply(head + 1, &Event::Source(SourceEvent::LeafMoved { leaf: Some(at.to_string()) }));
            if proj.path_ids().last().map(String::as_str) != Some(at) {
                return Err(EngineError::UnknownEntry { name: source.to_string(), entry: at.to_string() });
            }
        }
        let on_path: std::collections::BTreeSet<String> = proj.path_ids().into_iter().collect();
        let idx = proj.index();
        let copied_refs: std::collections::BTreeSet<u32> = idx
            .records
            .values()
            .filter(|r| on_path.contains(&r.entry) && on_path.contains(&r.call_entry))
            .map(|r| r.ref_n)
            .collect();
        let mut out: Vec<Event> = Vec::new();
        for env in events {
            let keep = match &env.body {
                Event::Source(SourceEvent::EntryAppended { id, .. }) => on_path.contains(id),
                Event::Source(SourceEvent::LeafMoved { .. }) => false,
                Event::Source(_) => true,
                Event::Decision(d) => match d {
                    DecisionEvent::Note { .. } => false,
                    DecisionEvent::OutputCaptured(r) => copied_refs.contains(&r.ref_n),
                    DecisionEvent::OutputSpilled { ref_n, .. } | DecisionEvent::OutputAliased { ref_n, .. } => copied_refs.contains(ref_n),
                    DecisionEvent::BatchClosed { refs, .. } => refs.iter().all(|r| copied_refs.contains(r)),
                    DecisionEvent::FrontierAdvanced { entry } | DecisionEvent::ErrorArgsPurged { entry, .. } => on_path.contains(entry),
                    DecisionEvent::ChainCompressed { first, last, .. } => on_path.contains(first) && on_path.contains(last),
                    DecisionEvent::CheckpointCommitted { boundary, kept, .. } => {
                        on_path.contains(boundary) && kept.iter().all(|k| on_path.contains(k))
                    }
                    DecisionEvent::CheckpointStarted { .. } | DecisionEvent::CheckpointFailed { .. } => false,
                    DecisionEvent::ArchiveCommitted { .. } => false,
                    DecisionEvent::ChainReplyCut { block, .. } => {
                        idx.chains.get(block).is_some_and(|c| on_path.contains(&c.first) && on_path.contains(&c.last))
                    }
                },
            };
            if keep {
                out.push(env.body);
            }
        }
        let session = self.create_session(name)?;
        let warm = self.warm(session.id);
        let mut p = warm.lock().expect("projection lock");
        session.append_locked(&mut p, out)?;
        drop(p);
        Ok(session)
    }

    fn warm(&self, id: SessionId) -> Arc<Mutex<Live>> {
        let mut w = self.inner.warm.lock().expect("warm lock");
        w.tick += 1;
        let tick = w.tick;
        let p = {
            let slot = w.map.entry(id).or_insert_with(|| (Arc::default(), 0));
            slot.1 = tick;
            slot.0.clone()
        };
        if w.map.len() > w.limit {
            // Drop the least recently used projections nobody else holds (the one handed out now is held).
            let mut idle: Vec<(u64, SessionId)> =
                w.map.iter().filter(|(_, (p, _))| Arc::strong_count(p) == 1).map(|(id, (_, t))| (*t, *id)).collect();
            idle.sort_unstable();
            let excess = w.map.len() - w.limit;
            for (_, id) in idle.into_iter().take(excess) {
                w.map.remove(&id);
            }
        }
        p
    }

    /// How many projections are warm in memory now.
    pub fn warm_count(&self) -> usize {
        self.inner.warm.lock().expect("warm lock").map.len()
    }
}

thread_local! {
    /// The store, session and seq this thread's `prepare` knows its warm projection to be current at.
    static CURRENT: std::cell::Cell<Option<(usize, SessionId, Seq)>> = const { std::cell::Cell::new(None) };
}

/// Ends a `prepare`'s trust in its projection (on every way out).
struct ClearCurrent;

impl Drop for ClearCurrent {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(None));
    }
}

/// Whether a decision prunes (changes what the model reads of an output it has seen) rather than captures.
fn is_prune(d: &DecisionEvent) -> bool {
    matches!(
        d,
        DecisionEvent::BatchClosed { .. } | DecisionEvent::ErrorArgsPurged { .. } | DecisionEvent::ChainCompressed { .. } | DecisionEvent::ChainReplyCut { .. }
    )
}

/// Whether `prunes` shrink the context of `proj` (which holds this request's captures already) by at least
/// `minPruneTokens`, and by more than re-sending the rewritten suffix costs over the requests expected
/// (`requests`: those answered so far). Captures always stay.
/// The candidate projection (`proj` with the prunes applied, at the seqs they will have, its render
/// kept) comes back when the prunes go ahead, so the session takes it instead of rendering again.
fn worth_it(proj: &Projection, prunes: &[DecisionEvent], requests: u64) -> Option<Projection> {
    let min = proj.config().min_prune_tokens;
    // The context now, rendered before the copy is made, so the copy knows it as its last render.
    let b = (min > 0).then(|| proj.render().messages);
    // Only the prunes' maps are copied for the candidate: the captures are in `proj` already.
    let mut after = proj.clone();
    let base = proj.seq();
    for (i, d) in prunes.iter().enumerate() {
        after.apply(base + 1 + i as u64, &Event::Decision(d.clone()));
    }
    let Some(b) = b else { return Some(after) };
    // Folding the prunes patched the candidate's kept render where it could (see `Projection::apply`),
    // and it says how far the render it started from is unchanged.
    let (a, known) = after.render_since();
    let a = a.messages;
    debug_assert!(a[..known].iter().zip(b.iter()).all(|(x, y)| Arc::ptr_eq(x, y)), "the kept prefix is the current context's");
    let count = |ms: &[Arc<condense_events::Message>]| ms.iter().map(|m| proj.estimate(m)).sum::<u64>();
    // The candidate's messages are remembered: it is usually taken.
    let count_candidate = |ms: &[Arc<condense_events::Message>]| ms.iter().map(|m| after.estimate(m)).sum::<u64>();
    // What the prunes save is what differs: the prefix and the suffix both contexts share count the same.
    let same_as = |x: &Arc<condense_events::Message>, y: &Arc<condense_events::Message>| Arc::ptr_eq(x, y) || x == y;
    let same = known + b[known..].iter().zip(&a[known..]).take_while(|(x, y)| same_as(x, y)).count();
    let tail = b[same..].iter().rev().zip(a[same..].iter().rev()).take_while(|(x, y)| same_as(x, y)).count();
    let saved = count(&b[same..b.len() - tail]).saturating_sub(count_candidate(&a[same..a.len() - tail]));
    // Everything after the first changed message is sent uncached once more: the prune must save more
    // than that, or it costs more than it brings back.
    // What came after the last assistant message is new to the model and goes uncached either way.
    let fresh_from = a.iter().rposition(|m| matches!(**m, condense_events::Message::Assistant { .. })).map_or(0, |i| i + 1);
    let resent = count_candidate(&a[same.min(fresh_from)..fresh_from]);
    // Expected requests still to come: as many as there were so far (a session that has run long tends
    // to run on). The prune pays when the cached-price savings over them beat re-sending at full price.
    let horizon = (requests / 2).max(1);
    (saved >= min && saved * horizon * 10 >= resent * 115).then_some(after)
}

/// The tool ref of archive record `id`, when it stands for a captured output: the original is one
/// `context_tree_query` away even where the archive only held a stub.
fn record_ref(arch: &condense_recovery::Archive, id: &str) -> Option<String> {
    arch.records().iter().find(|r| r.id == id).and_then(|r| r.tool_ref).map(|r| format!("t{r}"))
}

/// `history_search`'s reply: the lowest-ranked hits give way until the reply, as the model reads it, fits
/// the 4,096-byte tool-text ceiling, and it says how many were left out.
fn search_reply(arch: &condense_recovery::Archive, hits: &[condense_recovery::Hit]) -> String {
    let all: Vec<serde_json::Value> = hits
        .iter()
        .map(|h| serde_json::json!({"id": h.id, "matched": h.matched, "snippet": h.snippet, "ref": record_ref(arch, &h.id)}))
        .collect();
    let mut shown = all.len();
    loop {
        let mut v = serde_json::json!({
            "archive": arch.id,
            "hits": all[..shown],
            "note": "snippets can be partial; ranking is not approval or a completeness guarantee",
        });
        if shown < all.len() {
            v["omitted"] = serde_json::json!(format!("{} lower-ranked hit(s) left out to keep the reply short; add keywords to narrow the search", all.len() - shown));
        }
        let text = v.to_string();
        if text.len() <= condense_recovery::REPLY_CEILING || shown == 0 {
            return text;
        }
        shown -= 1;
    }
}

/// `history_read`'s reply for `page` of record `id` read from `offset`: text that escapes to more
/// (quotes, control characters) gets a shorter page, so the reply as the model reads it stays within the
/// 4,096-byte tool-text ceiling.
fn read_reply(arch: &condense_recovery::Archive, id: &str, offset: usize, mut page: condense_recovery::Page) -> std::result::Result<String, condense_recovery::RecoveryError> {
    let tool_ref = record_ref(arch, id);
    loop {
        let text = serde_json::json!({"archive": arch.id, "id": id, "text": page.text, "nextOffset": page.next_offset, "length": page.len, "ref": tool_ref}).to_string();
        if text.len() <= condense_recovery::REPLY_CEILING || page.text.chars().count() <= 1 {
            return Ok(text);
        }
        let over = text.len() - condense_recovery::REPLY_CEILING;
        page = arch.read_within(id, offset, page.text.len().saturating_sub(over.max(page.text.len() / 8)).max(1))?;
    }
}

impl Session {
    /// The session's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session's numeric id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The newest sequence number.
    pub fn head(&self) -> Result<Seq> {
        Ok(self.store.inner.log.head(self.id)?)
    }

    /// Makes every append so far durable (see [`StoreOptions::defer_durability`]).
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    /// Appends source events at the current head and returns the new head once they are durable (once
    /// written, with [`StoreOptions::defer_durability`]).
    ///
    /// Large batches go in chunks, pipelined: while the log writer makes one chunk durable, this thread
    /// encodes the next. The warm projection takes each chunk's events (moving their bodies, not copying
    /// them) only after the chunk is acknowledged.
    pub fn append(&self, events: Vec<SourceEvent>) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let before = proj.model().and_then(|m| m.context_window);
        let switched = events.iter().any(|e| matches!(e, SourceEvent::ModelChanged { .. }));
        let head = self.append_locked(&mut proj, events.into_iter().map(Event::Source).collect())?;
        // Only a model change can make a route unsupported: other appends (every request) skip the check.
        match recover::route_unsupported(&proj, before.filter(|_| switched)) {
            Some(text) => self.append_locked(&mut proj, vec![Event::Decision(DecisionEvent::Note { stage: "recovery".into(), text })]),
            None => Ok(head),
        }
    }

    fn append_locked(&self, proj: &mut Live, events: Vec<Event>) -> Result<Seq> {
        self.append_applied(proj, events, 0)
    }

    /// Appends `events`, of which the first `applied` are in `proj` already (at the seqs they are written
    /// under); the rest go into it once acknowledged. Should the log refuse them, a projection ahead of the
    /// log is cleared, to be folded again from the log when next read.
    fn append_applied(&self, proj: &mut Live, events: Vec<Event>, applied: usize) -> Result<Seq> {
        let written_from = proj.seq() - applied as u64;
        let result = self.write_chunks(proj, written_from, events, written_from + applied as u64, !self.store.inner.defer_durability);
        if result.is_err() && applied > 0 {
            *proj = Live::default();
        }
        result
    }

    /// Writes `events` after `head`, pipelined in chunks, and applies to `proj` those acknowledged past
    /// `known` (the projection's seq).
    fn write_chunks(&self, proj: &mut Live, mut head: Seq, events: Vec<Event>, known: Seq, durable: bool) -> Result<Seq> {
        let log = &self.store.inner.log;
        let mut in_flight: Option<(Vec<Event>, crossbeam_channel::Receiver<condense_log::Result<Seq>>)> = None;
        let mut events = events.into_iter().peekable();
        loop {
            let chunk: Vec<Event> = events.by_ref().take(APPEND_CHUNK).collect();
            let sent = if chunk.is_empty() {
                None
            } else {
                let values = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, body)| log.encode(self.id, head + 1 + i as u64, body))
                    .collect();
                // One flush at the end covers every chunk before it: only the last waits for the disk.
                let last = events.peek().is_none();
                let rx = log.append_encoded(self.id, head, values, last && durable)?;
                head += chunk.len() as u64;
                Some((chunk, rx))
            };
            if let Some((done, rx)) = in_flight.take() {
                let acked = acked(&rx)?;
                let first = acked + 1 - done.len() as u64;
                for (i, e) in done.into_iter().enumerate() {
                    let seq = first + i as u64;
                    if seq > known {
                        proj.apply_owned(seq, e);
                    }
                }
            }
            match sent {
                Some(x) => in_flight = Some(x),
                None => break,
            }
        }
        CURRENT.with(|c| {
            if c.get().is_some_and(|(k, id, _)| k == self.store.key() && id == self.id) {
                c.set(Some((self.store.key(), self.id, head)));
            }
        });
        Ok(head)
    }

    /// Writes `events` after `head` without folding them into the warm projection (which folds them from
    /// the log when next read); `durable`: the last chunk waits for the disk.
    fn write_unfolded(&self, head: Seq, events: Vec<Event>, durable: bool) -> Result<Seq> {
        self.write_chunks(&mut Live::default(), head, events, Seq::MAX, durable)
    }

    fn catch_up(&self, proj: &mut Live) -> Result<()> {
        // Inside one `prepare`, a projection this thread caught up (or appended to) itself is current:
        // the log is asked for the head once per request, not at every step (a round trip on PostgreSQL).
        if CURRENT.with(|c| c.get()) == Some((self.store.key(), self.id, proj.seq())) {
            return Ok(());
        }
        let head = self.store.inner.log.head(self.id)?;
        if proj.seq() < head {
            self.store.inner.log.for_each(self.id, proj.seq() + 1, head, |env| {
                proj.apply(env.seq, &env.body);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Renders the context to send next, from the warm projection.
    pub fn render(&self) -> Result<Rendered> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        Ok(proj.render())
    }

    /// Runs `f` on the warm projection, caught up with the log, without copying it.
    pub fn with_projection<R>(&self, f: impl FnOnce(&Projection) -> R) -> Result<R> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        Ok(f(&proj))
    }

    /// A copy of the warm projection, caught up with the log.
    pub fn projection(&self) -> Result<Projection> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        Ok(proj.clone())
    }

    /// Folds a fresh projection from the log up to `at` (inclusive).
    pub fn projection_at(&self, at: Seq) -> Result<Projection> {
        let head = self.head()?;
        if at > head {
            return Err(EngineError::PastHead { name: self.name.clone(), head, at });
        }
        let mut proj = Projection::new();
        self.store.inner.log.for_each(self.id, 1, at, |env| {
            proj.apply(env.seq, &env.body);
            Ok(())
        })?;
        Ok(proj)
    }

    /// Renders the context as it was after event `at`.
    pub fn render_at(&self, at: Seq) -> Result<Rendered> {
        Ok(self.projection_at(at)?.render())
    }

    /// Sets the pruning configuration from here on (written as an event, so a replay uses it too).
    pub fn configure(&self, config: PruneConfig) -> Result<Seq> {
        self.append(vec![SourceEvent::PruneConfigured(config)])
    }

    /// Runs the pruning pipeline as before a model request, stores its decisions, and renders the
    /// context to send. This is what a host calls before each request.
    pub fn prepare(&self) -> Result<Rendered> {
        self.prepare_then(|_, r| r.clone())
    }

    /// [`Session::prepare`], then `f` on the projection and the prepared context under the same lock (so a
    /// host can map the rendered messages back to the entries they came from without another fold).
    pub fn prepare_then<R>(&self, f: impl FnOnce(&Projection, &Rendered) -> R) -> Result<R> {
        {
            let warm = self.store.warm(self.id);
            let mut proj = warm.lock().expect("projection lock");
            self.catch_up(&mut proj)?;
            CURRENT.with(|c| c.set(Some((self.store.key(), self.id, proj.seq()))));
        }
        let _current = ClearCurrent;
        self.prune_before_request()?;
        self.guard_rendered()?;
        let measured = self.checkpoint(controller::Reason::Threshold)?;
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let rendered = proj.render();
        // The controller counted the context when it fitted; after a checkpoint it is counted afresh.
        let notice = match (measured, controller::budget_of(&proj)) {
            (_, None) => None,
            (Some(tokens), Some(_)) => controller::notice(&proj, tokens),
            (None, Some(_)) => controller::notice(&proj, controller::context_tokens(&proj)),
        };
        let rendered = match notice {
            None => rendered,
            Some(n) => {
                let mut messages = rendered.messages.to_vec();
                messages.push(Arc::new(n));
                Rendered { messages: Arc::new(messages), report: rendered.report }
            }
        };
        Ok(f(&proj, &rendered))
    }

    /// Reports what each request carries besides the messages (system prompt, tool declarations), in
    /// estimated tokens: budgets, the checkpoint controller and recovery keep room for it. Recorded only
    /// when it changes.
    pub fn set_request_overhead(&self, tokens: u64) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        if proj.request_overhead() == tokens {
            return Ok(proj.seq());
        }
        self.append_locked(&mut proj, vec![Event::Source(SourceEvent::RequestOverhead { tokens })])
    }

    /// Writes a note into the log for audit (a `Note` decision; never rendered).
    pub fn note(&self, stage: &str, text: &str) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        self.append_locked(&mut proj, vec![Event::Decision(DecisionEvent::Note { stage: stage.to_string(), text: text.to_string() })])
    }

    /// The payload guard as `prepare` applies it itself (seed 004): after a model change, a context whose
    /// serialized size (condense's neutral JSON of the rendered messages) is over the new model's limit is
    /// recorded as a provider overflow before the checkpoint controller runs, so the controller prepares
    /// the recovery handoff whatever the host does. The host's own [`Session::guard_payload`] on the bytes
    /// it sends stays as a second check.
    fn guard_rendered(&self) -> Result<()> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        if !recover::guard_active(&proj) || proj.overflow_pending() {
            return Ok(());
        }
        let Some(limit) = recover::payload_limit(&proj) else { return Ok(()) };
        let rendered = proj.render();
        // Text bytes first: a context far below the limit is not serialized at all.
        let text: u64 = rendered.messages.iter().map(|m| m.content().iter().map(|b| match b {
            condense_events::Block::Text { text } => text.len(),
            condense_events::Block::Thinking { thinking, .. } => thinking.len(),
            condense_events::Block::ToolCall { arguments, .. } => arguments.len(),
            condense_events::Block::Image { data, .. } => data.len(),
        }).sum::<usize>() as u64).sum();
        if text * 2 < limit {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&condense_formats::export::neutral(&rendered.messages[..])).map_or(0, |v| v.len() as u64);
        drop(rendered);
        if bytes <= limit {
            return Ok(());
        }
        let message = format!("payload guard: the context is {bytes} bytes, over {limit} for the new model");
        self.append_locked(&mut proj, vec![Event::Source(SourceEvent::ProviderOverflow { message })])?;
        Ok(())
    }

    /// The payload guard (seed 004): after a model change and until the first assistant message on the
    /// new model, a serialized request of `bytes` over the new model's limit is rejected with
    /// [`EngineError::ContextOverflow`] and recorded as a provider overflow, which the next `prepare`
    /// recovers from.
    pub fn guard_payload(&self, bytes: u64) -> Result<()> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        if !recover::guard_active(&proj) {
            return Ok(());
        }
        let Some(limit) = recover::payload_limit(&proj) else { return Ok(()) };
        if bytes <= limit {
            return Ok(());
        }
        let message = format!("payload guard: {bytes} bytes over {limit} for the new model");
        self.append_locked(&mut proj, vec![Event::Source(SourceEvent::ProviderOverflow { message })])?;
        Err(EngineError::ContextOverflow { name: self.name.clone(), bytes, limit })
    }

    /// The checkpoint controller: commits a checkpoint when the context is over the model's hard budget,
    /// or records the failure and returns [`EngineError::CompactionFailed`].
    pub fn checkpoint_if_due(&self) -> Result<()> {
        self.checkpoint(controller::Reason::Threshold).map(drop)
    }

    /// Manual compaction of an idle session (`condense compact`): a checkpoint over everything so far,
    /// failing fast (no retained-tail recovery) when it cannot be made.
    pub fn compact_now(&self) -> Result<()> {
        self.checkpoint(controller::Reason::Manual).map(drop)
    }

    /// Runs the controller; returns the tokens it measured when the context fitted as it was.
    fn checkpoint(&self, reason: controller::Reason) -> Result<Option<u64>> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let summarizer = self.store.inner.summarizer.lock().expect("summarizer lock").clone();
        if reason == controller::Reason::Threshold && proj.overflow_pending() && recover::guard_active(&proj) {
            let started = DecisionEvent::CheckpointStarted { reason: "recovery".into(), tokens: controller::context_tokens(&proj) };
            return match recover::prepare(&proj, summarizer.as_ref()) {
                Ok(decisions) => {
                    let mut events = vec![Event::Decision(started)];
                    events.extend(decisions.into_iter().map(Event::Decision));
                    self.append_locked(&mut proj, events).map_err(|e| self.not_stored(e))?;
                    Ok(None)
                }
                Err(why) => {
                    let failed = DecisionEvent::CheckpointFailed { code: recover::RECOVERY_BLOCKED.into(), reason: why.to_string() };
                    let note = DecisionEvent::Note { stage: "recovery".into(), text: format!("{}: {why}", recover::DIAG_BLOCKED) };
                    self.append_locked(&mut proj, vec![Event::Decision(started), Event::Decision(note), Event::Decision(failed)])?;
                    Err(EngineError::CompactionFailed { name: self.name.clone(), code: recover::RECOVERY_BLOCKED.into(), reason: why.to_string() })
                }
            };
        }
        match controller::decide_for(&proj, reason, summarizer.as_ref()) {
            controller::Outcome::Fits(tokens) => Ok(tokens),
            controller::Outcome::Commit(started, d) => {
                self.append_locked(&mut proj, vec![Event::Decision(started), Event::Decision(d)]).map_err(|e| self.not_stored(e))?;
                Ok(None)
            }
            controller::Outcome::Failed(started, d) => {
                let DecisionEvent::CheckpointFailed { code, reason } = d.clone() else { unreachable!("failure outcome") };
                self.append_locked(&mut proj, vec![Event::Decision(started), Event::Decision(d)])?;
                Err(EngineError::CompactionFailed { name: self.name.clone(), code, reason })
            }
        }
    }

    /// A checkpoint the log could not store: the loop stops with `CONTEXT_COMPACTION_FAILED` (seed 001:
    /// a checkpoint that cannot be durably appended), the log's error in the reason; nothing partial is
    /// visible (a group is appended whole or not at all).
    fn not_stored(&self, e: EngineError) -> EngineError {
        EngineError::CompactionFailed {
            name: self.name.clone(),
            code: condense_checkpoint::CONTEXT_COMPACTION_FAILED.into(),
            reason: format!("the checkpoint could not be stored: {e}"),
        }
    }

    /// The pipeline half of [`Session::prepare`]: captures, and prunes if `pruneOn`, the budget and the
    /// cost guard say so. Returns the head after its decisions.
    pub fn prune_before_request(&self) -> Result<Seq> {
        self.run_pipeline(pipeline::Trigger::Request)
    }

    /// Prunes everything the model has read, now (`pruneOn: on-demand`).
    pub fn prune_now(&self) -> Result<Seq> {
        self.run_pipeline(pipeline::Trigger::Now)
    }

    fn run_pipeline(&self, trigger: pipeline::Trigger) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let summarizer = self.store.inner.summarizer.lock().expect("summarizer lock").clone();
        let log = &self.store.inner.log;
        let Live { proj: p, stages } = &mut *proj;
        // A spilled output is durable before the decision naming it is: with the flush that makes that
        // decision durable (the log syncs a blob file first; a small blob is in the database itself, written
        // before the decision, so that one flush covers both), never with a wait of its own.
        let planned = stages.plan(p, summarizer.as_ref(), trigger, &mut |bytes| log.put_blob_deferred(bytes).map(|h| h.0).map_err(|e| e.to_string()));
        // Requests answered so far: the assistant messages on the branch, as the stages counted them.
        let requests = u64::from(stages.turns());
        let decisions = planned.map_err(|e| EngineError::Pipeline { name: self.name.clone(), reason: e.to_string() })?;
        if decisions.is_empty() {
            return Ok(proj.seq());
        }
        // Before a request a prune must pay for itself (`worth_it`). The pipeline puts its captures first;
        // they stay whatever the prunes turn out, so they go into the projection now, at the seqs they
        // will have, and the candidate copies only what the prunes change.
        let split = decisions.iter().position(is_prune).unwrap_or(decisions.len());
        if trigger != pipeline::Trigger::Request || split == decisions.len() || decisions[split..].iter().any(|d| !is_prune(d)) {
            return self.append_locked(&mut proj, decisions.into_iter().map(Event::Decision).collect());
        }
        let mut decisions = decisions;
        let prunes = decisions.split_off(split);
        let base = proj.seq();
        for (i, d) in decisions.iter().enumerate() {
            proj.apply(base + 1 + i as u64, &Event::Decision(d.clone()));
        }
        let mut applied = decisions.len();
        if let Some(after) = worth_it(&proj, &prunes, requests) {
            proj.proj = after;
            for d in &prunes {
                proj.stages.fold(&Event::Decision(d.clone()));
            }
            decisions.extend(prunes);
            applied = decisions.len();
        }
        self.append_applied(&mut proj, decisions.into_iter().map(Event::Decision).collect(), applied)
    }

    /// Answers `context_tree_query` for refs (`t12`, `b3`) or raw tool-call ids: the originals, byte for
    /// byte, from the log or the spill blobs.
    pub fn query(&self, keys: &[String]) -> Result<query::Answer> {
        let log = &self.store.inner.log;
        self.with_projection(|proj| {
            query::answer(proj, keys, &|hash| {
                condense_log::BlobHash::parse(hash)
                    .ok_or_else(|| format!("bad blob hash {hash}"))
                    .and_then(|h| log.get_blob(&h).map_err(|e| e.to_string()))
            })
        })
    }

    /// Runs the model-facing `context_tree_query` tool on its JSON arguments (`{"refs": [...]}`, with
    /// `ids` or `toolCallIds` accepted as synonyms).
    pub fn query_tool(&self, arguments: &str) -> Result<query::Answer> {
        match query::keys_from_arguments(arguments) {
            Ok(keys) => self.query(&keys),
            Err(answer) => Ok(answer),
        }
    }

    /// Checkpoint `n` (the newest when `None`) as a pi `compaction` entry line. `timestamp` is the host's
    /// (the engine reads no clock).
    pub fn checkpoint_as_pi_line(&self, n: Option<u32>, timestamp: &str) -> Result<String> {
        let p = self.projection()?;
        let idx = p.index();
        let cp = match n {
            Some(n) => idx.checkpoints.get(&n),
            None => idx.checkpoints.values().next_back(),
        }
        .ok_or_else(|| EngineError::UnknownCheckpoint {
            name: self.name.clone(),
            what: match n {
                Some(n) => format!("no checkpoint c{n} (it has {})", idx.checkpoints.len()),
                None => "no checkpoints yet (`condense compact` makes one)".into(),
            },
        })?;
        let branch = p.branch_entries();
        let leaf = branch.last().map_or("", |(id, _)| id);
        let first_kept = branch.iter().position(|(id, _)| *id == cp.boundary).and_then(|b| branch.get(b + 1)).map(|(id, _)| *id);
        let kept: Vec<String> = cp.kept.iter().filter_map(|k| p.entry_message(k)).map(|m| m.text()).collect();
        Ok(condense_formats::export::pi_compaction(&self.name, cp.n, leaf, first_kept, &cp.summary, &kept, cp.tokens_before, timestamp))
    }

    /// Commits an archive view of the context as it stands now and returns its id (`a<n>`).
    pub fn archive_now(&self) -> Result<String> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let id = format!("a{}", proj.index().archives.len() + 1);
        let leaf = proj.path_ids().last().cloned();
        let seq = proj.seq();
        self.append_locked(&mut proj, vec![Event::Decision(DecisionEvent::ArchiveCommitted { id: id.clone(), seq, leaf })])?;
        Ok(id)
    }

    /// The archive `id` (the newest when `None`), from the cache or rebuilt from the log.
    pub fn archive(&self, id: Option<&str>) -> Result<Arc<condense_recovery::Archive>> {
        let proj = self.projection()?;
        let all = recover::archives_on_branch(&proj);
        let (aid, seq, leaf) = match id {
            Some(id) => all.iter().find(|(a, _, _)| a == id).copied(),
            None => all.last().copied(),
        }
        .cloned()
        .ok_or_else(|| {
            let e = match id {
                Some(id) if proj.index().archives.iter().any(|(a, _, _)| a == id) => condense_recovery::RecoveryError::LeftBranch(id.to_string()),
                _ => condense_recovery::RecoveryError::UnknownArchive(id.unwrap_or("(none on this branch)").to_string()),
            };
            EngineError::Recovery(e)
        })?;
        let key = (self.id, aid.clone());
        if let Some((_, a)) = self.store.inner.archives.lock().expect("archive cache lock").iter().find(|(k, _)| *k == key) {
            return Ok(a.clone());
        }
        let mut view = self.projection_at(seq)?;
        view.apply(seq + 1, &Event::Source(SourceEvent::LeafMoved { leaf }));
        let idx = view.index();
        // The canonical context as it was (summaries as summaries, pruned outputs as their stubs); a
        // message that stands for several entries is cited by its place (`s<k>`).
        let entries: Vec<(String, Arc<condense_events::Message>)> = view
            .context_entries()
            .into_iter()
            .enumerate()
            .map(|(k, (id, m))| (id.map_or_else(|| format!("s{k}"), str::to_string), m))
            .collect();
        let archive = Arc::new(
            condense_recovery::Archive::build(&aid, entries.iter().map(|(id, m)| (id.as_str(), &**m, idx.by_entry.get(id).copied())))
                .map_err(EngineError::Recovery)?,
        );
        let mut cache = self.store.inner.archives.lock().expect("archive cache lock");
        cache.push((key, archive.clone()));
        if cache.len() > 3 {
            cache.remove(0);
        }
        Ok(archive)
    }

    /// `history_read` of entry `id`: in archive `archive`, or, without one, in the newest archive that
    /// holds the entry (citations from earlier recovery checkpoints resolve this way).
    pub fn history_read(&self, archive: Option<&str>, id: &str, offset: usize) -> Result<(Arc<condense_recovery::Archive>, condense_recovery::Page)> {
        if let Some(a) = archive {
            let arch = self.archive(Some(a))?;
            return arch.read(id, offset).map(|p| (arch, p)).map_err(EngineError::Recovery);
        }
        let ids: Vec<String> = recover::archives_on_branch(&self.projection()?).iter().rev().map(|(a, _, _)| a.clone()).collect();
        let mut last_err = condense_recovery::RecoveryError::UnknownArchive("(none yet)".into());
        for a in ids {
            let arch = self.archive(Some(&a))?;
            match arch.read(id, offset) {
                Ok(p) => return Ok((arch, p)),
                Err(e) => last_err = e,
            }
        }
        Err(EngineError::Recovery(last_err))
    }

    /// Runs a model-facing recovery tool (`history_archives`, `history_search`, `history_read`) on its
    /// JSON arguments; bad arguments give an error result that says what to pass.
    pub fn history_tool(&self, name: &str, arguments: &str) -> Result<query::Answer> {
        let v: serde_json::Value = serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null);
        let err = |text: String| Ok(query::Answer { text, is_error: true, originals: Vec::new() });
        let ok = |v: serde_json::Value| Ok(query::Answer { text: v.to_string(), is_error: false, originals: Vec::new() });
        let archive = v.get("archive").and_then(|a| a.as_str());
        match name {
            "history_archives" => {
                let page = v.get("page").and_then(|p| p.as_u64()).unwrap_or(0) as usize;
                let (ids, next) = self.history_archives(page, 20)?;
                ok(serde_json::json!({"archives": ids, "nextPage": next}))
            }
            "history_search" => {
                let words: Vec<String> = match v.get("keywords") {
                    Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
                    Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
                    _ => Vec::new(),
                };
                let arch = match self.archive(archive) {
                    Ok(a) => a,
                    Err(EngineError::Recovery(e)) => return err(e.to_string()),
                    Err(e) => return Err(e),
                };
                let refs: Vec<&str> = words.iter().map(String::as_str).collect();
                match arch.search(&refs, 20) {
                    Ok(hits) => Ok(query::Answer { text: search_reply(&arch, &hits), is_error: false, originals: Vec::new() }),
                    Err(e) => err(e.to_string()),
                }
            }
            "history_read" => {
                let Some(id) = v.get("id").and_then(|i| i.as_str()) else {
                    return err("history_read needs {\"id\": \"<entry id cited by history_search or a checkpoint>\"}".into());
                };
                let offset = v.get("offset").and_then(|o| o.as_u64()).unwrap_or(0) as usize;
                match self.history_read(archive, id, offset) {
                    Ok((arch, page)) => {
                        let text = read_reply(&arch, id, offset, page).map_err(EngineError::Recovery)?;
                        Ok(query::Answer { text, is_error: false, originals: Vec::new() })
                    }
                    Err(EngineError::Recovery(e)) => err(e.to_string()),
                    Err(e) => Err(e),
                }
            }
            other => err(format!("unknown recovery tool `{other}`; use history_archives, history_search or history_read")),
        }
    }

    /// Archive ids of this session, newest first, `size` per page.
    pub fn history_archives(&self, page: usize, size: usize) -> Result<(Vec<String>, Option<usize>)> {
        let ids: Vec<String> = recover::archives_on_branch(&self.projection()?).iter().map(|(a, _, _)| a.clone()).collect();
        Ok(condense_recovery::archives_page(&ids, page, size))
    }

    /// Counts of the session (see [`Stats`]).
    pub fn stats(&self) -> Result<Stats> {
        Ok(Stats::of(&self.projection()?))
    }
}

/// A new session's file that an import reads ahead.
struct Ahead {
    path: PathBuf,
    len: u64,
    canonical: String,
}

/// A streamed file whose appends are all handed to the log: its outcome once every one is acknowledged.
struct Sent {
    outcome: ImportOutcome,
    acks: Vec<crossbeam_channel::Receiver<condense_log::Result<Seq>>>,
}

impl Sent {
    fn settle(self) -> Result<ImportOutcome> {
        match first_failure(self.acks) {
            Some(e) => Err(e),
            None => Ok(self.outcome),
        }
    }
}

/// Waits for an append handed to the log ([`condense_log::Log::append_encoded`]): its new head, or its error.
fn acked(rx: &crossbeam_channel::Receiver<condense_log::Result<Seq>>) -> condense_log::Result<Seq> {
    rx.recv().map_err(|_| LogError::Closed)?
}

/// Waits for every append of `acks`; the first failure, in the order they were sent.
fn first_failure(acks: impl IntoIterator<Item = crossbeam_channel::Receiver<condense_log::Result<Seq>>>) -> Option<EngineError> {
    let mut failed = None;
    for ack in acks {
        if let Err(e) = acked(&ack) {
            failed.get_or_insert(e.into());
        }
    }
    failed
}

/// What the import's parser hands over for a file read ahead: its events in chunks, then how the read ended.
enum Parsed {
    Chunk(Vec<SourceEvent>),
    End(std::io::Result<Option<condense_formats::Streamed>>),
}

/// A reader that counts the bytes its user consumed (not those it buffered ahead).
struct Consumed<R> {
    inner: R,
    consumed: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: std::io::BufRead> std::io::Read for Consumed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.set(self.consumed.get() + n as u64);
        Ok(n)
    }
}

impl<R: std::io::BufRead> std::io::BufRead for Consumed<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.consumed.set(self.consumed.get() + amount as u64);
        self.inner.consume(amount);
    }
}
