//! Importing session files into the store: the streaming import of a JSON-lines file read ahead on
//! threads of its own (hashing, parsing, encoding while the log writer writes the chunks before), and the
//! whole-file import for documents and sessions that exist already.

use crate::session::acked;
use crate::store::{Session, Store};
use crate::{EngineError, Result};
use condense_events::{Event, Seq, SessionId, SourceEvent};
use std::path::{Path, PathBuf};
use condense_formats::{Diagnostic, Format};

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
