//! The store: the event log and the warm sessions beside it, opening, creating, removing and forking
//! sessions. Imports are in `import`, a session's API in `session`.

use crate::pipeline;
use crate::{EngineError, Result};
use condense_events::{Event, Seq, SessionId, SourceEvent};
use condense_summarize::{Extractive, Summarizer};
use condense_log::{Log, SessionInfo};
use condense_render::Projection;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub(crate) struct Inner {
    /// Archive views built lately, by (session, archive id); at most three are kept (two committed views
    /// plus the one in flight), older ones are rebuilt from the log.
    pub(crate) archives: Mutex<Vec<((SessionId, String), Arc<condense_recovery::Archive>)>>,
    pub(crate) log: Log,
    pub(crate) warm: Mutex<Warm>,
    pub(crate) summarizer: Mutex<Arc<dyn Summarizer>>,
    pub(crate) defer_durability: bool,
}

/// A warm session: its render projection and its pipeline stages, folded from the same events. Every
/// event goes into both through [`Live::apply`]; readers see the projection.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) proj: Projection,
    pub(crate) stages: pipeline::Stages,
}

impl std::ops::Deref for Live {
    type Target = Projection;
    fn deref(&self) -> &Projection {
        &self.proj
    }
}

impl Live {
    pub(crate) fn apply(&mut self, seq: Seq, event: &Event) {
        self.stages.fold(event);
        self.proj.apply(seq, event);
    }

    pub(crate) fn reserve_entries(&mut self, n: usize) {
        self.proj.reserve_entries(n);
    }

    pub(crate) fn apply_owned(&mut self, seq: Seq, event: Event) {
        self.stages.fold(&event);
        self.proj.apply_owned(seq, event);
    }
}

/// The warm projections, bounded: the least recently used ones that nobody holds are dropped while there
/// are more than `limit` or they weigh more than `bytes` together ([`Projection::weight`]); a dropped one
/// is folded again from the log when next needed.
pub(crate) struct Warm {
    /// Each warm session: its projection and pipeline stages, and when it was last used.
    pub(crate) map: BTreeMap<SessionId, (Arc<Mutex<Live>>, u64)>,
    pub(crate) tick: u64,
    pub(crate) limit: usize,
    pub(crate) bytes: u64,
}

/// A handle to one session of a store.
#[derive(Clone)]
pub struct Session {
    pub(crate) store: Store,
    pub(crate) id: SessionId,
    pub(crate) name: String,
}

/// How a store is opened.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// sled's page cache, bytes.
    pub cache_bytes: u64,
    /// Warm projections kept in memory at most (the least recently used beyond it are dropped).
    pub warm_limit: usize,
    /// What the warm projections may hold together, about (bytes, by [`Projection::weight`]): beyond it the
    /// least recently used that nobody holds are dropped, down to the one in use. Checked each time a
    /// session is taken, with what each weighs then (a session folded since weighs from the next time). A
    /// session used alone is never dropped, however large; sessions used in turn that weigh more than this
    /// together are folded again from the log each time.
    pub warm_bytes: u64,
    /// Appends return once written, before they are durable; [`Store::sync`] (or any durable write after
    /// them) makes them durable. For a host whose source resends what a crash would lose (`condense
    /// serve`: the client sends its whole history with every request). Off by default.
    pub defer_durability: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_bytes: condense_log::DEFAULT_CACHE_BYTES, warm_limit: 64, warm_bytes: DEFAULT_WARM_BYTES, defer_durability: false }
    }
}

/// Which entries of a bounded cache to drop. `entries` are (when last used, key, its weight when it can be
/// weighed now, whether nobody holds it); an entry that cannot be weighed (in use) counts nothing and
/// stays. The least recently used of those nobody holds go first, until at most `limit` entries remain
/// and they weigh at most `bound` together. The store's warm projections and serve's open conversations
/// are bounded by it.
pub fn least_recently_used<K: Ord>(entries: impl IntoIterator<Item = (u64, K, Option<u64>, bool)>, limit: usize, bound: u64) -> Vec<K> {
    let (mut len, mut total, mut idle) = (0usize, 0u64, Vec::new());
    for (used, key, weight, free) in entries {
        len += 1;
        total += weight.unwrap_or(0);
        if let (Some(weight), true) = (weight, free) {
            idle.push((used, key, weight));
        }
    }
    let mut excess = len.saturating_sub(limit);
    if excess == 0 && total <= bound {
        return Vec::new();
    }
    idle.sort_unstable();
    let mut drop = Vec::new();
    for (_, key, weight) in idle {
        if excess == 0 && total <= bound {
            break;
        }
        excess = excess.saturating_sub(1);
        total -= weight;
        drop.push(key);
    }
    drop
}

/// [`StoreOptions::warm_bytes`] by default: 512 MiB.
pub const DEFAULT_WARM_BYTES: u64 = 512 << 20;

/// An open store: the event log plus the warm projections of the sessions used lately.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
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
                warm: Mutex::new(Warm { map: BTreeMap::new(), tick: 0, limit: options.warm_limit.max(1), bytes: options.warm_bytes }),
                summarizer: Mutex::new(Arc::new(Extractive::default())),
                defer_durability: options.defer_durability,
            }),
        }
    }

    /// Tells stores apart (for the one thread-local of `prepare`): the address of the shared state.
    pub(crate) fn key(&self) -> usize {
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

    /// How many archive views are held in memory (seed 004: at most two committed views plus the one being
    /// read; older ones are built again from the log when read).
    pub fn cached_archives(&self) -> usize {
        self.inner.archives.lock().expect("archive cache lock").len()
    }

    /// Opens an existing session by name.
    pub fn session(&self, name: &str) -> Result<Session> {
        let id = self.inner.log.session_id(name)?.ok_or_else(|| EngineError::UnknownSession(name.to_string()))?;
        Ok(Session { store: self.clone(), id, name: name.to_string() })
    }

    /// Opens an existing session by the numeric id `condense sessions` prints.
    pub fn session_by_id(&self, id: SessionId) -> Result<Session> {
        let info = self.sessions()?.into_iter().find(|s| s.id == id).ok_or_else(|| EngineError::UnknownSession(id.to_string()))?;
        Ok(Session { store: self.clone(), id, name: info.name })
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

    pub(crate) fn warm(&self, id: SessionId) -> Arc<Mutex<Live>> {
        let mut w = self.inner.warm.lock().expect("warm lock");
        w.tick += 1;
        let tick = w.tick;
        let p = {
            let slot = w.map.entry(id).or_insert_with(|| (Arc::default(), 0));
            slot.1 = tick;
            slot.0.clone()
        };
        // Drop the least recently used projections nobody else holds (the one handed out now is held); one
        // in use elsewhere (locked) is weighed when it is idle again.
        let entries = w.map.iter().map(|(id, (p, t))| (*t, *id, p.try_lock().ok().map(|l| l.weight()), Arc::strong_count(p) == 1));
        for id in least_recently_used(entries, w.limit, w.bytes) {
            w.map.remove(&id);
        }
        p
    }

    /// How many projections are warm in memory now.
    pub fn warm_count(&self) -> usize {
        self.inner.warm.lock().expect("warm lock").map.len()
    }
}
