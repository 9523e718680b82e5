//! A log held in memory only: what `condense simulate` replays into when nothing is kept. The same encoded
//! values and the same checks as the stored backends (stale heads refused, ids never reused), with no
//! writer thread to hand each append to and nothing written to disk; gone when dropped.

use crate::{Appended, Backend, BlobHash, LogError, Result, SessionId, SessionInfo, Seq};
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
struct State {
    /// Sessions by id: name and values (`values[i]` is seq `i + 1`).
    sessions: BTreeMap<SessionId, (String, Vec<Vec<u8>>)>,
    /// The lowest id a new session may take (ids are never reused).
    next_id: SessionId,
    blobs: BTreeMap<String, Vec<u8>>,
    subscribers: Vec<Sender<Appended>>,
    closed: bool,
}

/// The in-memory backend (see the module).
#[derive(Default)]
pub(crate) struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        let mut s = self.state.lock().expect("memory log lock");
        if s.closed {
            return Err(LogError::Closed);
        }
        f(&mut s)
    }
}

fn unknown(session: SessionId) -> LogError {
    LogError::UnknownSession(session.to_string())
}

impl Backend for MemoryStore {
    fn describe(&self) -> String {
        "(in memory)".into()
    }

    fn compresses(&self) -> bool {
        false
    }

    fn create_session(&self, name: &str, wanted: Option<SessionId>) -> Result<SessionId> {
        self.with(|s| {
            if s.sessions.values().any(|(n, _)| n == name) {
                return Err(LogError::SessionExists(name.to_string()));
            }
            let floor = s.next_id.max(1);
            let id = match wanted {
                Some(w) if w >= floor => w,
                _ => floor,
            };
            s.next_id = id + 1;
            s.sessions.insert(id, (name.to_string(), Vec::new()));
            Ok(id)
        })
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        self.with(|s| Ok(s.sessions.iter().map(|(id, (name, v))| SessionInfo { id: *id, name: name.clone(), head: v.len() as Seq }).collect()))
    }

    fn head(&self, session: SessionId) -> Result<Seq> {
        self.with(|s| s.sessions.get(&session).map(|(_, v)| v.len() as Seq).ok_or_else(|| unknown(session)))
    }

    fn remove_session(&self, session: SessionId) -> Result<()> {
        self.with(|s| s.sessions.remove(&session).map(drop).ok_or_else(|| unknown(session)))
    }

    fn append_encoded(&self, session: SessionId, expected: Seq, values: Vec<Vec<u8>>, _durable: bool) -> Result<Receiver<Result<Seq>>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let outcome = self.with(|s| {
            let (_, stored) = s.sessions.get_mut(&session).ok_or_else(|| unknown(session))?;
            let actual = stored.len() as Seq;
            if actual != expected {
                return Err(LogError::HeadMismatch { session, expected, actual });
            }
            let n = values.len() as Seq;
            stored.extend(values);
            if n > 0 {
                let notice = Appended { session, first: expected + 1, last: expected + n };
                s.subscribers.retain(|sub| sub.send(notice).is_ok());
            }
            Ok(expected + n)
        });
        drop(tx.send(outcome));
        Ok(rx)
    }

    fn sync(&self) -> Result<()> {
        self.with(|_| Ok(()))
    }

    fn for_each_value(&self, session: SessionId, from: Seq, to: Seq, f: &mut dyn FnMut(Seq, &[u8]) -> Result<()>) -> Result<()> {
        // The values are copied out first: `f` may append to this log.
        // A session that is not there has no values (as in the stored backends).
        let values: Vec<(Seq, Vec<u8>)> = self.with(|s| {
            let Some((_, stored)) = s.sessions.get(&session) else { return Ok(Vec::new()) };
            let from = from.max(1);
            let to = to.min(stored.len() as Seq);
            Ok((from..=to).map(|seq| (seq, stored[seq as usize - 1].clone())).collect())
        })?;
        for (seq, v) in values {
            f(seq, &v)?;
        }
        Ok(())
    }

    fn subscribe(&self) -> Receiver<Appended> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.state.lock().expect("memory log lock").subscribers.push(tx);
        rx
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash> {
        let hash = BlobHash::of(bytes);
        self.with(|s| {
            s.blobs.entry(hash.to_string()).or_insert_with(|| bytes.to_vec());
            Ok(hash)
        })
    }

    fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        self.with(|s| s.blobs.get(&hash.to_string()).cloned().ok_or_else(|| LogError::BlobMissing(hash.to_string())))
    }

    fn blob_hashes(&self) -> Result<Vec<BlobHash>> {
        self.with(|s| Ok(s.blobs.keys().filter_map(|k| BlobHash::parse(k)).collect()))
    }

    fn close(&self) {
        let mut s = self.state.lock().expect("memory log lock");
        s.closed = true;
        s.subscribers.clear();
    }
}
