//! A session's API: appending what the host saw, rendering, `prepare` (the pipeline, the cost guard and
//! the checkpoint controller before a model request), queries of originals and checkpoints.

use crate::store::{Live, Session};
use crate::{controller, pipeline, query, recover, EngineError, Result, Stats};
use condense_events::{DecisionEvent, Entry, Event, PruneConfig, Seq, SessionId, SourceEvent};
use condense_log::LogError;
use condense_render::{Projection, Rendered};
use std::sync::Arc;

/// Events are written in chunks of this many, one durable group each.
const APPEND_CHUNK: usize = 4096;

thread_local! {
    /// The store, session and seq this thread's `prepare` knows its warm projection to be current at.
    static CURRENT: std::cell::Cell<Option<(usize, SessionId, Seq)>> = const { std::cell::Cell::new(None) };
    /// Inside [`Session::pinned`] whose catch-up found the database unreachable: the store, session, and
    /// the error's store and detail. Every read of the head inside fails at once with it, rather than
    /// waiting for a connection again (serve's answer to a request then comes within the pool's wait).
    static DOWN: std::cell::RefCell<Option<(usize, SessionId, String, String)>> = const { std::cell::RefCell::new(None) };
    /// Inside [`Session::with_summarizer`]: the summarizer this thread's pipeline and checkpoints use
    /// instead of the store's.
    static SUMMARIZER: std::cell::RefCell<Option<Arc<dyn condense_summarize::Summarizer>>> = const { std::cell::RefCell::new(None) };
    /// Inside [`Session::with_cold_cache`]: the provider's cache holds nothing of this session's prefix.
    static COLD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Puts back the cache's state [`Session::with_cold_cache`] replaced.
struct RestoreCold(bool);

impl Drop for RestoreCold {
    fn drop(&mut self) {
        COLD.with(|c| c.set(self.0));
    }
}

/// Puts back the summarizer [`Session::with_summarizer`] replaced, on every way out.
struct RestoreSummarizer(Option<Arc<dyn condense_summarize::Summarizer>>);

impl Drop for RestoreSummarizer {
    fn drop(&mut self) {
        let before = self.0.take();
        SUMMARIZER.with(|s| *s.borrow_mut() = before);
    }
}

/// The elements of a list in order, its room given back as they are taken: a list of events being written
/// stayed whole until the last was written (a pass that captured 60,000 outputs held 13 MB of decisions
/// beside the index taking in their records). The list is turned round once and taken from its end; its
/// room shrinks to what is left whenever that is a quarter of it, so the copies add up to a third of the
/// list at most. A host that hands the engine an iterator over a list of its own (`Session::append_chain`)
/// gives it up the same way.
pub struct Shrinking<T> {
    rev: Vec<T>,
}

impl<T> Shrinking<T> {
    /// The elements of `list`, in order.
    pub fn new(mut list: Vec<T>) -> Shrinking<T> {
        list.reverse();
        Shrinking { rev: list }
    }
}

impl<T> Iterator for Shrinking<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let t = self.rev.pop()?;
        // Small lists are given up whole at the end.
        if self.rev.len() >= 256 && self.rev.len() <= self.rev.capacity() / 4 {
            self.rev.shrink_to_fit();
        }
        Some(t)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.rev.len(), Some(self.rev.len()))
    }
}

impl<T> ExactSizeIterator for Shrinking<T> {}

/// Ends a `prepare`'s trust in its projection (on every way out), unless it ran inside
/// [`Session::pinned`] for the same session, whose trust goes on.
struct ClearCurrent {
    keep: bool,
}

impl Drop for ClearCurrent {
    fn drop(&mut self) {
        if !self.keep {
            CURRENT.with(|c| c.set(None));
        }
    }
}

/// Ends [`Session::pinned`]'s memory of an unreachable database.
struct ClearDown;

impl Drop for ClearDown {
    fn drop(&mut self) {
        DOWN.with(|d| d.borrow_mut().take());
    }
}

/// Whether a decision prunes (changes what the model reads of an output it has seen) rather than captures.
fn is_prune(d: &DecisionEvent) -> bool {
    matches!(
        d,
        DecisionEvent::BatchClosed { .. } | DecisionEvent::OutputStubbed { .. } | DecisionEvent::ErrorArgsPurged { .. } | DecisionEvent::ChainCompressed(_) | DecisionEvent::ChainReplyCut { .. }
    )
}

/// Whether `prunes` shrink the context of `proj` (which holds this request's captures already) by at least
/// `minPruneTokens`, and by more than re-sending the rewritten suffix costs over the requests expected
/// (`requests`: those answered so far). Captures always stay.
/// The candidate projection (`proj` with the prunes applied, at the seqs they will have, its render
/// kept) comes back when the prunes go ahead, so the session takes it instead of rendering again.
/// With the cache `cold` ([`Session::with_cold_cache`]) re-sending costs nothing more, and any saving
/// will do (none is needed when `minPruneTokens` is 0).
fn worth_it(proj: &Projection, prunes: &[DecisionEvent], requests: u64, cold: bool) -> Option<Projection> {
    let min = least_saving(proj, cold);
    // The context now.
    let b = (min > 0).then(|| proj.render().messages);
    // Prunes whose messages render in fewer than `minPruneTokens` cannot save them: turned down without
    // the candidate (copying the projection and rendering it took a 1,000-message conversation about
    // 0.2 ms on every request that brought a short chain to a close; issue 62, item 9).
    if let Some(bound) = b.as_deref().and_then(|b| tokens_touched(proj, b, prunes))
        && bound < min
    {
        debug_assert!(evaluated(proj, b.clone(), prunes, requests, cold).is_none(), "prunes touching {bound} tokens bound what they save");
        return None;
    }
    evaluated(proj, b, prunes, requests, cold)
}

/// The fewest tokens prunes must save before a request: `minPruneTokens`, or with the cache cold one
/// (none when `minPruneTokens` is 0).
fn least_saving(proj: &Projection, cold: bool) -> u64 {
    let min = proj.config().min_prune_tokens;
    if cold { min.min(1) } else { min }
}

/// The tokens of the rendered messages `b` that `prunes` can change, when every one is a batch closing
/// (its outputs) or a chain compression (its messages from the prompt to the final reply, or the older
/// turns of a running chain) and `b` holds each of those as the session's own message or as its
/// condensed turn or stub (found by its call; `None` otherwise). A prune changes only those messages,
/// so what the prunes save is at most this (a message two prunes touch counts twice).
fn tokens_touched(proj: &Projection, b: &[Arc<condense_events::Message>], prunes: &[DecisionEvent]) -> Option<u64> {
    // The rendered position of an entry's message, from the end (what a request prunes is mostly recent).
    let at = |id: &str| proj.rendered_at(id, b);
    let tokens = |from: usize, to: usize| b[from..=to].iter().map(|m| proj.estimate(m)).sum::<u64>();
    let records = &proj.index().records;
    prunes.iter().try_fold(0, |sum, d| match d {
        DecisionEvent::ChainCompressed(c) => {
            let (first, last) = (at(&c.first)?, at(&c.last)?);
            (first <= last).then(|| sum + tokens(first, last))
        }
        DecisionEvent::BatchClosed { refs, .. } => refs.iter().try_fold(sum, |sum, r| {
            let i = at(&records.get(r)?.entry)?;
            Some(sum + tokens(i, i))
        }),
        _ => None,
    })
}

/// [`worth_it`] by building the candidate and comparing it with `b`, the context now (rendered before
/// the copy is made, so the copy knows it as its last render; `None` when `minPruneTokens` is 0).
fn evaluated(proj: &Projection, b: Option<Arc<Vec<Arc<condense_events::Message>>>>, prunes: &[DecisionEvent], requests: u64, cold: bool) -> Option<Projection> {
    let min = least_saving(proj, cold);
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
    (saved >= min && (cold || saved * horizon * 10 >= resent * 115)).then_some(after)
}

impl Session {
    /// Runs `f` (a [`Session::prepare`] or [`Session::prepare_then`]) knowing whether the provider's prompt
    /// cache still holds the session's prefix: `cold` when the host knows it does not (`condense serve`:
    /// the conversation's last request was longer ago than the cache's lifetime; `simulate`: the session's
    /// timestamps say so). The request then pays for its whole context anyway, so the prunes the pipeline
    /// has pending go ahead whenever they save anything: rewriting the prefix costs no cache now, and the
    /// smaller context is what the next requests read from the cache.
    pub fn with_cold_cache<R>(&self, cold: bool, f: impl FnOnce() -> R) -> R {
        let _restore = RestoreCold(COLD.with(|c| c.replace(cold)));
        f()
    }

    /// Runs `f` with `summarizer` (when given) in place of the store's for the pruning pipeline and the
    /// checkpoints and recoveries `f` prepares on this thread: `condense serve` summarizes through the
    /// upstream with the credentials of the request being prepared.
    pub fn with_summarizer<R>(&self, summarizer: Option<Arc<dyn condense_summarize::Summarizer>>, f: impl FnOnce() -> R) -> R {
        let Some(s) = summarizer else { return f() };
        let _restore = RestoreSummarizer(SUMMARIZER.with(|cur| cur.borrow_mut().replace(s)));
        f()
    }

    /// Whether a model writes this thread's summaries (anything but the extractive default).
    pub(crate) fn model_summaries(&self) -> bool {
        self.summarizer().name() != "extractive"
    }

    /// The summarizer in force on this thread ([`Session::with_summarizer`]), else the store's.
    fn summarizer(&self) -> Arc<dyn condense_summarize::Summarizer> {
        SUMMARIZER.with(|s| s.borrow().clone()).unwrap_or_else(|| self.store.inner.summarizer.lock().expect("summarizer lock").clone())
    }

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
        match CURRENT.with(|c| c.get()) {
            Some((k, id, seq)) if k == self.store.key() && id == self.id => Ok(seq),
            _ => self.log_head(),
        }
    }

    /// The head as the log has it (see [`DOWN`]).
    fn log_head(&self) -> Result<Seq> {
        let down = DOWN.with(|d| d.borrow().as_ref().filter(|(k, id, ..)| *k == self.store.key() && *id == self.id).map(|(_, _, store, detail)| (store.clone(), detail.clone())));
        if let Some((store, detail)) = down {
            return Err(LogError::Unavailable { store, detail }.into());
        }
        Ok(self.store.inner.log.head(self.id)?)
    }

    /// Runs `f` with this session caught up with the log once: inside it, reads trust the warm projection
    /// without asking the log for the head again (a round trip each on PostgreSQL; serve asked five times
    /// a request), and appends keep it current. For a host that holds the session for one unit of work;
    /// another process's append meanwhile is refused as stale when this one appends. When the catch-up
    /// fails, `f` runs as it would without and meets the failure itself: at once when the database could
    /// not be reached (its reads of the head fail with the same error without waiting again).
    pub fn pinned<R>(&self, f: impl FnOnce() -> R) -> R {
        let caught_up = {
            let warm = self.store.warm(self.id);
            let mut proj = warm.lock().expect("projection lock");
            self.catch_up(&mut proj).map(|()| proj.seq())
        };
        let seq = match caught_up {
            Ok(seq) => seq,
            Err(EngineError::Log(LogError::Unavailable { store, detail })) => {
                DOWN.with(|d| *d.borrow_mut() = Some((self.store.key(), self.id, store, detail)));
                let _down = ClearDown;
                return f();
            }
            Err(_) => return f(),
        };
        CURRENT.with(|c| c.set(Some((self.store.key(), self.id, seq))));
        let _current = ClearCurrent { keep: false };
        f()
    }

    /// Makes every append so far durable (see [`StoreOptions::defer_durability`](crate::StoreOptions::defer_durability)).
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    /// Appends source events at the current head and returns the new head once they are durable (once
    /// written, with [`StoreOptions::defer_durability`](crate::StoreOptions::defer_durability)).
    ///
    /// Large batches go in chunks, pipelined: while the log writer makes one chunk durable, this thread
    /// encodes the next. The warm projection takes each chunk's events (moving their bodies, not copying
    /// them) only after the chunk is acknowledged.
    pub fn append(&self, events: Vec<SourceEvent>) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        self.append_caught_up(&mut proj, events)
    }

    /// [`Session::append`] on a projection locked and caught up.
    fn append_caught_up(&self, proj: &mut Live, events: Vec<SourceEvent>) -> Result<Seq> {
        let switched = events.iter().any(|e| matches!(e, SourceEvent::ModelChanged { .. }));
        let entries = events.iter().filter(|e| matches!(e, SourceEvent::EntryAppended { .. })).count();
        self.append_sources(proj, Shrinking::new(events), switched, entries)
    }

    /// Appends `events` to a projection locked and caught up: `switched`, whether one of them changes the
    /// model; `entries`, how many add an entry. Mapped to log events as they are written: a request of many
    /// small messages held its events twice.
    fn append_sources(&self, proj: &mut Live, events: impl IntoIterator<Item = SourceEvent>, switched: bool, entries: usize) -> Result<Seq> {
        let before = proj.model().and_then(|m| m.context_window);
        let head = self.append_counted(proj, events.into_iter().map(Event::Source), 0, entries)?;
        // Only a model change can make a route unsupported: other appends (every request) skip the check.
        match recover::route_unsupported(proj, before.filter(|_| switched)) {
            Some(text) => self.append_locked(proj, vec![Event::Decision(DecisionEvent::Note { stage: "recovery".into(), text })]),
            None => Ok(head),
        }
    }

    /// [`Session::append`] for a host that chains new entries onto ones it read earlier (`condense
    /// serve`): an entry whose parent the log no longer holds is refused with [`EngineError::ParentLost`]
    /// and nothing is written, where [`Session::append`] would make it a new root (as an importer wants
    /// for a file's dangling parents).
    pub fn append_continuing(&self, events: Vec<SourceEvent>) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        // The ids the events add, looked up only (a list searched for each parent made a request of
        // 100,000 new messages take 13 s).
        let mut added: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for e in &events {
            if let SourceEvent::EntryAppended { id, parent, .. } = e {
                if let Some(p) = parent.as_deref().filter(|p| !proj.has_entry(p) && !added.contains(p)) {
                    return Err(EngineError::ParentLost { name: self.name.clone(), parent: p.to_string() });
                }
                added.insert(id);
            }
        }
        self.append_caught_up(&mut proj, events)
    }

    /// [`Session::append_continuing`] for a chain of new entries: `events` (a model change, the request's
    /// overhead; no entries) and then an entry for each of `entries`, the first after `parent` and each
    /// after the one before it. The entries become events one by one as they are written, so a request of
    /// many messages is not held a second time as a list of events (152 bytes for each message, whatever
    /// its size). When the log no longer holds `parent`, nothing is written ([`EngineError::ParentLost`]).
    pub fn append_chain(&self, events: Vec<SourceEvent>, parent: Option<String>, entries: impl ExactSizeIterator<Item = (String, Entry)>) -> Result<Seq> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        if let Some(p) = parent.as_deref().filter(|p| !proj.has_entry(p)) {
            return Err(EngineError::ParentLost { name: self.name.clone(), parent: p.to_string() });
        }
        let switched = events.iter().any(|e| matches!(e, SourceEvent::ModelChanged { .. }));
        let count = entries.len() + events.iter().filter(|e| matches!(e, SourceEvent::EntryAppended { .. })).count();
        let mut last = parent;
        let chained = entries.map(move |(id, entry)| SourceEvent::EntryAppended { parent: std::mem::replace(&mut last, Some(id.clone())), id, entry });
        self.append_sources(&mut proj, events.into_iter().chain(chained), switched, count)
    }

    pub(crate) fn append_locked(&self, proj: &mut Live, events: Vec<Event>) -> Result<Seq> {
        self.append_applied(proj, events, 0)
    }

    /// Appends `events`, of which the first `applied` are in `proj` already (at the seqs they are written
    /// under); the rest go into it once acknowledged. Should the log refuse them, a projection ahead of the
    /// log is cleared, to be folded again from the log when next read.
    fn append_applied(&self, proj: &mut Live, events: Vec<Event>, applied: usize) -> Result<Seq> {
        let entries = events.iter().skip(applied).filter(|e| matches!(e, Event::Source(SourceEvent::EntryAppended { .. }))).count();
        self.append_counted(proj, Shrinking::new(events), applied, entries)
    }

    /// [`Session::append_applied`] for a pass's decisions, each made an event as it is written: a list of
    /// events is laid out for an entry's (152 bytes), a decision takes 64, and a pass of thousands of
    /// captures copied into such a list held both.
    fn append_decisions(&self, proj: &mut Live, decisions: Vec<DecisionEvent>, applied: usize) -> Result<Seq> {
        self.append_counted(proj, Shrinking::new(decisions).map(Event::Decision), applied, 0)
    }

    /// [`Session::append_applied`] with the entries among `events` past the first `applied` counted.
    fn append_counted(&self, proj: &mut Live, events: impl IntoIterator<Item = Event>, applied: usize, entries: usize) -> Result<Seq> {
        let written_from = proj.seq() - applied as u64;
        // Room for the entries at once (a request recording many messages would grow the projection by
        // doubling, the old and the new buffer alive together).
        proj.reserve_entries(entries);
        let result = self.write_chunks(proj, written_from, events, written_from + applied as u64, !self.store.inner.defer_durability);
        if result.is_err() && applied > 0 {
            *proj = Live::default();
        }
        result
    }

    /// Writes `events` after `head`, pipelined in chunks, and applies to `proj` those acknowledged past
    /// `known` (the projection's seq).
    fn write_chunks(&self, proj: &mut Live, mut head: Seq, events: impl IntoIterator<Item = Event>, known: Seq, durable: bool) -> Result<Seq> {
        let log = &self.store.inner.log;
        let mut in_flight: Option<(Vec<Event>, crossbeam_channel::Receiver<condense_log::Result<Seq>>)> = None;
        let mut events = events.into_iter().peekable();
        loop {
            let chunk: Vec<Event> = events.by_ref().take(APPEND_CHUNK).collect();
            let sent = if chunk.is_empty() {
                None
            } else {
                // Packed into few values where the log packs (sled: one key per event cost about 3 KB of
                // its memory per event; a request of 100,000 one-letter messages took 320 MB there).
                let values = log.encode_packed(self.id, head + 1, &chunk);
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
    pub(crate) fn write_unfolded(&self, head: Seq, events: Vec<Event>, durable: bool) -> Result<Seq> {
        self.write_chunks(&mut Live::default(), head, events, Seq::MAX, durable)
    }

    fn catch_up(&self, proj: &mut Live) -> Result<()> {
        // Inside one `prepare`, a projection this thread caught up (or appended to) itself is current:
        // the log is asked for the head once per request, not at every step (a round trip on PostgreSQL).
        if CURRENT.with(|c| c.get()) == Some((self.store.key(), self.id, proj.seq())) {
            return Ok(());
        }
        let head = self.log_head()?;
        if proj.seq() > head {
            // The log holds less than this projection folded: a PostgreSQL server lost commits that were
            // not yet durable in a crash (nothing acknowledged to anyone is among them). The projection is
            // folded again from what the log holds, and work carries on from there.
            *proj = Live::default();
        }
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

    /// Takes the request just prepared into `accounts` (see [`crate::accounts`]): the decisions made since
    /// it last took one, read from the log up to `proj`'s seq when the index says some were made (most
    /// requests make none, and need no read), then the prepared context `msgs`, whose
    /// cache was `cold`. Returns the request's tokens, cached-prefix tokens and whether it broke the cache.
    /// `proj` is the session's projection as the preparation left it ([`Session::prepare_then`]).
    pub fn account(&self, accounts: &mut crate::accounts::Accounts, proj: &Projection, msgs: &[Arc<condense_events::Message>], cold: bool) -> Result<(u64, u64, bool)> {
        let (from, to) = (accounts.after() + 1, proj.seq());
        let mut decisions = Vec::new();
        let read = accounts.decided_since(proj);
        if read && from <= to {
            let events = self.store.inner.log.read(self.id, from, to).inspect_err(|_| accounts.forget_counts())?;
            for e in events {
                if let Event::Decision(d) = e.body {
                    decisions.push((e.seq, d));
                }
            }
        }
        Ok(accounts.request(proj, &decisions, read, msgs, cold))
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
        self.append(SourceEvent::configured(config))
    }

    /// Runs the pruning pipeline as before a model request, stores its decisions, and renders the
    /// context to send. This is what a host calls before each request.
    pub fn prepare(&self) -> Result<Rendered> {
        self.prepare_then(|_, r| r.clone())
    }

    /// [`Session::prepare`], then `f` on the projection and the prepared context under the same lock (so a
    /// host can map the rendered messages back to the entries they came from without another fold).
    pub fn prepare_then<R>(&self, f: impl FnOnce(&Projection, &Rendered) -> R) -> Result<R> {
        let keep = CURRENT.with(|c| c.get()).is_some_and(|(k, id, _)| k == self.store.key() && id == self.id);
        {
            let warm = self.store.warm(self.id);
            let mut proj = warm.lock().expect("projection lock");
            self.catch_up(&mut proj)?;
            CURRENT.with(|c| c.set(Some((self.store.key(), self.id, proj.seq()))));
        }
        let _current = ClearCurrent { keep };
        self.prune_before_request()?;
        self.guard_rendered()?;
        let measured = self.checkpoint(controller::Reason::Threshold)?;
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let rendered = proj.render();
        // The controller counted the context against its budget (after a checkpoint, afresh). A notice that
        // would take the request over the hard budget stays out (a recovery may fill the budget to its last
        // token).
        let notice = measured.and_then(|(tokens, budget)| controller::notice(budget, tokens).filter(|n| tokens + condense_tokens::estimate(n) <= budget.hard));
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
        // Serialized every time the guard is active (the requests of a model transition): a quick test on
        // the text passed contexts of many small tool calls whose JSON was many times their text
        // (`prepare_guards_a_context_whose_json_is_over_the_limit_while_its_text_is_small`).
        let bytes = condense_formats::export::neutral_len(&rendered.messages[..]);
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
        // The request that carries a recovery prepared for this overflow is checked too (seed 004: the
        // final payload check is distinct from preparation's bounds), but never recorded as a second
        // overflow the provider did not see (issue 36): over the limit it is refused, failing closed,
        // and the overflow stays answered.
        if proj.overflow_answered() {
            let reason = format!("the request carrying the recovery is {bytes} bytes, over the final payload limit of {limit} for the new model");
            let note = DecisionEvent::Note { stage: "recovery".into(), text: format!("{}: {reason}", recover::DIAG_BLOCKED) };
            self.append_locked(&mut proj, vec![Event::Decision(note)])?;
            return Err(EngineError::CompactionFailed { name: self.name.clone(), code: recover::RECOVERY_BLOCKED.into(), reason });
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

    /// Runs the controller; returns the tokens the request takes and the budget they were measured
    /// against (after a threshold checkpoint, measured again), when the window is known.
    pub(crate) fn checkpoint(&self, reason: controller::Reason) -> Result<Option<(u64, condense_checkpoint::Budget)>> {
        let warm = self.store.warm(self.id);
        let mut proj = warm.lock().expect("projection lock");
        self.catch_up(&mut proj)?;
        let summarizer = self.summarizer();
        if reason == controller::Reason::Threshold && proj.overflow_pending() && recover::guard_active(&proj) {
            let started = DecisionEvent::CheckpointStarted { reason: "recovery".into(), tokens: controller::context_tokens(&proj) };
            match recover::prepare(&proj, summarizer.as_ref()) {
                Ok(decisions) => {
                    let mut events = vec![Event::Decision(started)];
                    events.extend(decisions.into_iter().map(Event::Decision));
                    self.append_locked(&mut proj, events).map_err(|e| self.not_stored(e))?;
                    return self.within_budget_after_commit(&mut proj, summarizer.as_ref());
                }
                // Nothing before the final batch to hand off, or a handoff that leaves too little room:
                // the checkpoint controller's later moves (no retained prompts, the final batch cut to the
                // room left) may still fit the request, so the blocked recovery is noted and they run.
                Err(why @ (recover::Blocked::Blank | recover::Blocked::NoRoom(..))) => {
                    let note = DecisionEvent::Note { stage: "recovery".into(), text: format!("{}: {why}; the checkpoint controller goes on", recover::DIAG_BLOCKED) };
                    self.append_locked(&mut proj, vec![Event::Decision(started), Event::Decision(note)])?;
                }
                Err(why) => {
                    let code = if matches!(why, recover::Blocked::Stopped(_)) { recover::PREPARATION_STOPPED } else { recover::RECOVERY_BLOCKED };
                    let failed = DecisionEvent::CheckpointFailed { code: code.into(), reason: why.to_string() };
                    let note = DecisionEvent::Note { stage: "recovery".into(), text: format!("{}: {why}", recover::DIAG_BLOCKED) };
                    self.append_locked(&mut proj, vec![Event::Decision(started), Event::Decision(note), Event::Decision(failed)])?;
                    return Err(EngineError::CompactionFailed { name: self.name.clone(), code: code.into(), reason: why.to_string() });
                }
            }
        }
        match self.decide_and_store(&mut proj, reason, summarizer.as_ref())? {
            Some(fits) => Ok(Some(fits)),
            None if reason == controller::Reason::Manual => Ok(None),
            None => self.within_budget_after_commit(&mut proj, summarizer.as_ref()),
        }
    }

    /// Runs the controller once and stores what it decided: `Some` with what it measured when the context
    /// fitted as it was, `None` after a commit, the failure as [`EngineError::CompactionFailed`].
    fn decide_and_store(&self, proj: &mut Live, reason: controller::Reason, summarizer: &dyn condense_summarize::Summarizer) -> Result<Option<(u64, condense_checkpoint::Budget)>> {
        match controller::decide_for(proj, reason, summarizer) {
            controller::Outcome::Fits(tokens) => Ok(tokens),
            controller::Outcome::Commit(started, d) => {
                self.append_locked(proj, vec![Event::Decision(started), Event::Decision(d)]).map_err(|e| self.not_stored(e))?;
                Ok(None)
            }
            controller::Outcome::Failed(started, d) => {
                let DecisionEvent::CheckpointFailed { code, reason } = d.clone() else { unreachable!("failure outcome") };
                self.append_locked(proj, vec![Event::Decision(started), Event::Decision(d)])?;
                Err(EngineError::CompactionFailed { name: self.name.clone(), code, reason })
            }
        }
    }

    /// Seed 001: a committed checkpoint is re-estimated before the request continues. The candidates were
    /// measured before they were stored; the request as it now renders (the budget counted afresh, since the
    /// fixed context may differ after a checkpoint) is measured again, and one still over the hard budget
    /// does not go out as it is: the controller runs once more on it (its later moves: no retained prompts,
    /// the final batch cut to the room left), and a request over the budget after that is refused with
    /// `CONTEXT_COMPACTION_FAILED`. Returns what it measured, for the budget notice.
    fn within_budget_after_commit(&self, proj: &mut Live, summarizer: &dyn condense_summarize::Summarizer) -> Result<Option<(u64, condense_checkpoint::Budget)>> {
        let measure = |p: &Projection| controller::budget_of(p).map(|b| (controller::context_tokens(p), b));
        let over = |m: &Option<(u64, condense_checkpoint::Budget)>| m.is_some_and(|(t, b)| t > b.hard);
        let first = measure(proj);
        if !over(&first) {
            return Ok(first);
        }
        if let Some(fits) = self.decide_and_store(proj, controller::Reason::Threshold, summarizer)? {
            return Ok(Some(fits));
        }
        let again = measure(proj);
        let Some((tokens, budget)) = again.filter(|_| over(&again)) else { return Ok(again) };
        let hard = budget.hard;
        let reason = format!("after checkpoint the request still takes {tokens} tokens, over the hard budget of {hard}");
        let started = DecisionEvent::CheckpointStarted { reason: "threshold".into(), tokens };
        let failed = DecisionEvent::CheckpointFailed { code: condense_checkpoint::CONTEXT_COMPACTION_FAILED.into(), reason: reason.clone() };
        self.append_locked(proj, vec![Event::Decision(started), Event::Decision(failed)])?;
        Err(EngineError::CompactionFailed { name: self.name.clone(), code: condense_checkpoint::CONTEXT_COMPACTION_FAILED.into(), reason })
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
        let summarizer = self.summarizer();
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
            return self.append_decisions(&mut proj, decisions, 0);
        }
        // One list: the captures, then the prunes, dropped when they do not pay (a second list of the
        // prunes took 200 bytes for each output a request closed).
        let mut decisions = decisions;
        let base = proj.seq();
        for (i, d) in decisions[..split].iter().enumerate() {
            proj.apply(base + 1 + i as u64, &Event::Decision(d.clone()));
        }
        let mut applied = split;
        match worth_it(&proj, &decisions[split..], requests, COLD.with(std::cell::Cell::get)) {
            Some(after) => {
                proj.proj = after;
                for d in &decisions[split..] {
                    proj.stages.fold(&Event::Decision(d.clone()));
                }
                applied = decisions.len();
            }
            None => decisions.truncate(split),
        }
        self.append_decisions(&mut proj, decisions, applied)
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

    /// Counts of the session (see [`Stats`]).
    pub fn stats(&self) -> Result<Stats> {
        let p = self.projection()?;
        let mut stats = Stats::of(&p);
        // The provider's usage: the `ProviderUsage` events serve records for its requests, or the usage
        // an imported host recorded on its assistant messages.
        let served = p.source().is_some_and(|s| s.starts_with("serve:"));
        let mut cost = crate::stats::ProviderCost { served, ..Default::default() };
        let mut add = |u: &condense_events::Usage| {
            cost.requests += 1;
            cost.usage.input += u.input;
            cost.usage.output += u.output;
            cost.usage.cache_read += u.cache_read;
            cost.usage.cache_write += u.cache_write;
        };
        if served {
            let head = self.head()?;
            self.store.inner.log.for_each(self.id, 1, head, |env| {
                if let Event::Source(SourceEvent::ProviderUsage(u)) = &env.body {
                    add(u);
                }
                Ok(())
            })?;
        } else {
            for m in p.branch_messages() {
                if let condense_events::Message::Assistant { usage: Some(u), .. } = &*m {
                    add(u);
                }
            }
        }
        if cost.requests > 0 {
            cost.cost = crate::stats::cache_priced(&cost.usage);
            cost.direct = served.then(|| crate::stats::direct_cost(&p));
            stats.provider = Some(cost);
        }
        Ok(stats)
    }
}

/// Waits for an append handed to the log ([`condense_log::Log::append_encoded`]): its new head, or its error.
pub(crate) fn acked(rx: &crossbeam_channel::Receiver<condense_log::Result<Seq>>) -> condense_log::Result<Seq> {
    rx.recv().map_err(|_| LogError::Closed)?
}

#[cfg(test)]
mod tests {
    use super::Shrinking;
    use crate::{controller, EngineError, Store};
    use condense_events::{DecisionEvent, Entry, Event, Message, PruneConfig, SourceEvent, UserOrigin};

    /// Seed 001, "re-estimated before continuing": a committed checkpoint that leaves the request over the
    /// hard budget (here one stored with a 10,000-token prompt retained on a 16,000-token window, hard
    /// budget 8,000; the controller's own candidates are measured before they are stored, so it never
    /// makes one) does not let the request go out: the controller runs once more and drops the prompt; and
    /// where even that cannot fit, the request is refused with `CONTEXT_COMPACTION_FAILED`.
    #[test]
    fn a_checkpoint_that_leaves_the_request_over_the_budget_is_not_sent_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        for (name, last) in [("fixed", "go on".to_string()), ("refused", "z".repeat(40_000))] {
            let s = store.create_session(name).unwrap();
            s.configure(PruneConfig { enabled: false, ..PruneConfig::default() }).unwrap();
            let msg = |id: &str, parent: Option<&str>, m: Message| SourceEvent::EntryAppended { id: id.into(), parent: parent.map(str::to_string), entry: Entry::Message(m) };
            let reply = |t: &str| Message::Assistant { content: vec![condense_events::Block::Text { text: t.into() }], model: None, stop: None, usage: None };
            s.append(vec![
                SourceEvent::ModelChanged { provider: None, model: "m".into(), context_window: Some(16_000), max_output: None },
                msg("u0", None, Message::user_text("start", UserOrigin::Prompt)),
                msg("a0", Some("u0"), reply("started")),
                msg("u1", Some("a0"), Message::user_text("x".repeat(40_000), UserOrigin::Prompt)),
                msg("a1", Some("u1"), reply("read it")),
                msg("u2", Some("a1"), Message::user_text(last, UserOrigin::Prompt)),
            ])
            .unwrap();
            let warm = store.warm(s.id());
            let mut proj = warm.lock().unwrap();
            s.catch_up(&mut proj).unwrap();
            let over = DecisionEvent::CheckpointCommitted(Box::new(condense_events::CheckpointCommitted {
                n: 1,
                boundary: "a1".into(),
                summary: "[Checkpoint c1: a summary]".into(),
                kept: vec!["u1".into()],
                covers: vec![],
                recovery: false,
                bounded: vec![],
                tokens_before: 0,
                tokens_after: 0,
            }));
            s.append_locked(&mut proj, vec![Event::Decision(over)]).unwrap();
            let hard = controller::budget_of(&proj).unwrap().hard;
            assert!(controller::context_tokens(&proj) > hard, "{name}: the stored checkpoint leaves the request over {hard}");
            let summarizer = condense_summarize::Extractive::default();
            match (name, s.within_budget_after_commit(&mut proj, &summarizer)) {
                ("fixed", Ok(_)) => {
                    assert_eq!(proj.index().checkpoints.len(), 2, "a second checkpoint");
                    assert!(controller::context_tokens(&proj) <= hard);
                }
                ("refused", Err(EngineError::CompactionFailed { code, .. })) => {
                    assert_eq!(code, condense_checkpoint::CONTEXT_COMPACTION_FAILED);
                    assert_eq!(proj.index().checkpoint_failures.len(), 1);
                }
                (name, other) => panic!("{name}: {other:?}"),
            }
        }
    }

    /// A list being written gives its elements in order and its room back as they go: a quarter of the
    /// list left holds about a quarter of its room, not all of it.
    #[test]
    fn a_list_given_up_shrinks_as_it_goes() {
        let mut s = Shrinking::new((0..10_000u32).collect());
        assert_eq!(s.len(), 10_000);
        let first: Vec<u32> = s.by_ref().take(7_600).collect();
        assert_eq!(first, (0..7_600).collect::<Vec<_>>());
        assert_eq!(s.len(), 2_400);
        assert!(s.rev.capacity() <= 2_500, "room for {} kept for 2,400 left", s.rev.capacity());
        assert_eq!(s.collect::<Vec<_>>(), (7_600..10_000).collect::<Vec<_>>());
        let small: Vec<u32> = Shrinking::new(vec![1, 2, 3]).collect();
        assert_eq!(small, [1, 2, 3]);
    }
}
