//! The PostgreSQL backend: several processes (several `condense serve` instances, a CLI beside them) share
//! one database.
//!
//! Tables (created and migrated by [`migrate`], versioned in `condense_schema`): `condense_sessions` (id,
//! unique name, head), `condense_events` (primary key `(session, seq)`, the same encoded bytes the sled
//! backend stores), `condense_blobs` (blake3 hex → bytes) and `condense_meta` (the id floor above every
//! removed session). One writer thread per process group-commits: the appends waiting in its channel go in
//! one statement ([`APPEND`], one round trip; a session appended to out of turn takes another). Each
//! moves its session's head
//! only from the expected one (the row lock makes another process's writer wait and then see the new
//! head), refusing a stale append with [`LogError::HeadMismatch`], inserts the values and notifies
//! `condense_appended`; acknowledgements go out after the commit returns, so a group is visible whole or
//! not at all. A durable append or a sync commits synchronously, which also makes every earlier commit
//! durable. Subscribers hear every process's appends through
//! `LISTEN`. Reads go through a small connection pool (r2d2).

use crate::{Appended, Backend, BlobHash, LogError, Result, SessionInfo};
use condense_events::{Seq, SessionId};
use crossbeam_channel::{bounded, Receiver, Sender};
use postgres::types::Type;
use postgres::{Client, NoTls};
use r2d2_postgres::PostgresConnectionManager;
use std::str::FromStr;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

type Pool = r2d2::Pool<PostgresConnectionManager<NoTls>>;

/// The channel appends are announced on.
const CHANNEL: &str = "condense_appended";
/// Key of the advisory lock that serializes migrations between processes.
const MIGRATION_LOCK: i64 = 0x636f_6e64_656e_7365;

/// The schema, one step per version; a database records the versions it has applied.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE condense_sessions (
            id bigint PRIMARY KEY,
            name text NOT NULL UNIQUE,
            head bigint NOT NULL DEFAULT 0
        );
        CREATE TABLE condense_events (
            session bigint NOT NULL,
            seq bigint NOT NULL,
            body bytea NOT NULL,
            PRIMARY KEY (session, seq)
        );
        CREATE TABLE condense_blobs (
            hash text PRIMARY KEY,
            bytes bytea NOT NULL
        );",
    ),
    (
        2,
        "CREATE TABLE condense_meta (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            id_floor bigint NOT NULL
        );
        INSERT INTO condense_meta (id_floor) VALUES (1);",
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// `url` with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => format!("{user}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail: String = match tail.split_once('?') {
        Some((path, query)) => {
            let q: Vec<String> = query
                .split('&')
                .map(|kv| if kv.to_ascii_lowercase().starts_with("password=") { "password=***".to_string() } else { kv.to_string() })
                .collect();
            format!("{path}?{}", q.join("&"))
        }
        None => tail.to_string(),
    };
    if scheme.is_empty() { format!("{authority}{tail}") } else { format!("{scheme}://{authority}{tail}") }
}

enum Request {
    Append { session: SessionId, expected: Seq, values: Vec<Vec<u8>>, durable: bool, reply: Sender<Result<Seq>> },
    Sync { reply: Sender<Result<()>> },
}

struct Shared {
    store: String,
    config: postgres::Config,
    /// Always `Some` until the drop (see `Drop for Shared`).
    pool: Option<Pool>,
    subscribers: Mutex<Vec<Sender<Appended>>>,
    listening: AtomicBool,
    stopped: AtomicBool,
    /// Commits made without waiting for the disk, counted by the writer.
    deferred: AtomicU64,
    /// How many of those a flush has since made durable.
    flushed: AtomicU64,
    /// The operations in flight, each with when it began: a server that stopped answering hangs them, and
    /// serve answers 503 rather than wait (read only to tell a hang, never written to an event).
    inflight: Mutex<BTreeMap<u64, std::time::Instant>>,
    next_op: AtomicU64,
}

/// An operation in [`Shared::inflight`], for as long as it lives.
struct InFlight<'a>(&'a Shared, u64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.inflight.lock().expect("in-flight lock").remove(&self.1);
    }
}

/// The driver's blocking client cannot be dropped on a thread that drives async tasks (a server dropping
/// its store on its runtime): the pool and its connections are dropped on a thread of their own.
impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let _ = std::thread::Builder::new().name("condense-pg-close".into()).spawn(move || drop(pool));
        }
    }
}

impl Shared {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("the pool lives until the drop")
    }

    fn err(&self, detail: impl std::fmt::Display) -> LogError {
        LogError::Postgres { store: self.store.clone(), detail: detail.to_string() }
    }

    /// Runs `f` on a pooled connection; once more on a fresh one when the first had been closed (the
    /// server restarted since it was opened).
    fn with<T>(&self, mut f: impl FnMut(&mut Client) -> std::result::Result<T, postgres::Error>) -> Result<T> {
        self.with_unsent(|c, _| f(c))
    }

    /// [`Shared::with`] for work that may not be repeated once part of it reached the server: `f` sets its
    /// flag then (before sending COMMIT, say), and a failure after that is reported, not retried.
    ///
    /// After the server restarted, every pooled connection is closed, and each is found closed only when
    /// used: an attempt that failed on a closed connection before anything was sent is repeated on the next
    /// one (the pool drops the closed one), as many times as the pool holds connections, and once more on
    /// a new one.
    fn with_unsent<T>(&self, mut f: impl FnMut(&mut Client, &mut bool) -> std::result::Result<T, postgres::Error>) -> Result<T> {
        let _op = self.begin();
        let attempts = self.pool().max_size() + 1;
        for attempt in 0..attempts {
            let mut conn = self.pool().get().map_err(|e| self.unavailable(format!("no connection within {POOL_WAIT:?}: {e}")))?;
            let mut sent = false;
            match f(&mut conn, &mut sent) {
                Ok(v) => return Ok(v),
                Err(e) if attempt + 1 < attempts && !sent && (e.is_closed() || conn.is_closed()) => continue,
                Err(e) if !sent && (e.is_closed() || conn.is_closed()) => return Err(self.unavailable(describe_error(&e))),
                Err(e) => return Err(self.err(describe_error(&e))),
            }
        }
        unreachable!("the last attempt returns")
    }

    fn begin(&self) -> InFlight<'_> {
        let n = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.inflight.lock().expect("in-flight lock").insert(n, std::time::Instant::now());
        InFlight(self, n)
    }

    /// How long the oldest operation in flight has waited.
    fn stalled_for(&self) -> Option<Duration> {
        // Tickets are handed out in the order operations begin: the first is the oldest.
        self.inflight.lock().expect("in-flight lock").first_key_value().map(|(_, t)| t.elapsed())
    }

    fn unavailable(&self, detail: String) -> LogError {
        LogError::Unavailable { store: self.store.clone(), detail }
    }
}

/// How long a request waits for a pooled connection (a new one is made when the pool has none free):
/// with the database down, a request fails within it, rather than waiting for the client to give up.
const POOL_WAIT: Duration = Duration::from_secs(4);

/// A PostgreSQL error with its server message, code and detail (the driver's own text says only "db error").
fn describe_error(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(&format!(": {d}"));
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        },
    }
}

/// The PostgreSQL backend of [`crate::Log`].
pub(crate) struct PgStore {
    shared: Arc<Shared>,
    tx: Mutex<Option<Sender<Request>>>,
    join: Mutex<Option<JoinHandle<()>>>,
}

impl PgStore {
    pub(crate) fn open(url: &str) -> Result<PgStore> {
        let store = redact(url);
        let err = |detail: String| LogError::Postgres { store: store.clone(), detail };
        let mut config = postgres::Config::from_str(url).map_err(|e| err(format!("not a connection string: {}", describe_error(&e))))?;
        if config.get_application_name().is_none() {
            config.application_name("condense");
        }
        config.connect_timeout(Duration::from_secs(10));
        // One connection first, directly: a refused or failed connection is reported at once with its
        // cause (the pool would retry until its timeout), and it applies the migrations.
        let mut first = config.connect(NoTls).map_err(|e| err(format!("cannot connect: {}", describe_error(&e))))?;
        migrate(&mut first, &store)?;
        drop(first);
        let manager = PostgresConnectionManager::new(config.clone(), NoTls);
        let pool = r2d2::Pool::builder()
            .max_size(8)
            .min_idle(Some(1))
            .test_on_check_out(false)
            .connection_timeout(POOL_WAIT)
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build_unchecked(manager);
        let shared = Arc::new(Shared {
            store: store.clone(),
            config,
            pool: Some(pool),
            subscribers: Mutex::new(Vec::new()),
            listening: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            deferred: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            inflight: Mutex::new(BTreeMap::new()),
            next_op: AtomicU64::new(0),
        });
        let (tx, rx) = bounded::<Request>(1024);
        let writer = shared.clone();
        let join = std::thread::Builder::new()
            .name("condense-pg-writer".into())
            .spawn(move || run(&writer, &rx))
            .map_err(|e| err(format!("cannot start the writer thread: {e}")))?;
        Ok(PgStore { shared, tx: Mutex::new(Some(tx)), join: Mutex::new(Some(join)) })
    }

    fn send(&self, req: Request) -> Result<()> {
        let guard = self.tx.lock().expect("writer sender lock");
        guard.as_ref().ok_or(LogError::Closed)?.send(req).map_err(|_| LogError::Closed)
    }

    fn listen(&self) {
        if self.shared.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = self.shared.clone();
        let _ = std::thread::Builder::new().name("condense-pg-listen".into()).spawn(move || listener(&shared));
    }
}

/// Applies the migrations the database lacks, under an advisory lock so two processes starting at once
/// do not both apply them. A database newer than this build is refused.
fn migrate(conn: &mut Client, store: &str) -> Result<()> {
    let err = |e: postgres::Error| LogError::Postgres { store: store.to_string(), detail: format!("migrating the schema: {}", describe_error(&e)) };
    let mut tx = conn.transaction().map_err(err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(err)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS condense_schema (version integer PRIMARY KEY, applied_by text NOT NULL)").map_err(err)?;
    let found: i32 = tx.query_one("SELECT coalesce(max(version), 0) FROM condense_schema", &[]).map_err(err)?.get(0);
    if found > SCHEMA_VERSION {
        return Err(LogError::SchemaTooNew { store: store.to_string(), found, known: SCHEMA_VERSION });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql).map_err(err)?;
        let by = concat!("condense ", env!("CARGO_PKG_VERSION"));
        tx.execute("INSERT INTO condense_schema (version, applied_by) VALUES ($1, $2)", &[version, &by]).map_err(err)?;
    }
    tx.commit().map_err(err)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Backend for PgStore {
    fn describe(&self) -> String {
        format!("PostgreSQL store {}", self.shared.store)
    }

    fn stalled_for(&self) -> Option<Duration> {
        self.shared.stalled_for()
    }

    fn create_session(&self, name: &str, wanted: Option<SessionId>) -> Result<SessionId> {
        if self.shared.stopped.load(Ordering::SeqCst) {
            return Err(LogError::Closed);
        }
        let r = self.shared.with(|c| {
            let mut tx = c.transaction()?;
            // The meta row serializes creators: ids come from the largest one plus one, above the floor.
            let floor: i64 = tx.query_one("SELECT id_floor FROM condense_meta FOR UPDATE", &[])?.get(0);
            if tx.query_opt("SELECT 1 FROM condense_sessions WHERE name = $1", &[&name])?.is_some() {
                return Ok(None);
            }
            let next: i64 = tx.query_one("SELECT coalesce(max(id), 0) + 1 FROM condense_sessions", &[])?.get(0);
            let id = match wanted.map(to_i64) {
                Some(w) if w >= floor && w > 0 && tx.query_opt("SELECT 1 FROM condense_sessions WHERE id = $1", &[&w])?.is_none() => w,
                _ => next.max(floor),
            };
            tx.execute("INSERT INTO condense_sessions (id, name, head) VALUES ($1, $2, 0)", &[&id, &name])?;
            tx.commit()?;
            Ok(Some(id as u64))
        })?;
        r.ok_or_else(|| LogError::SessionExists(name.to_string()))
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let rows = self.shared.with(|c| c.query("SELECT id, name, head FROM condense_sessions ORDER BY id", &[]))?;
        Ok(rows
            .iter()
            .map(|r| SessionInfo { id: r.get::<_, i64>(0) as u64, name: r.get(1), head: r.get::<_, i64>(2) as u64 })
            .collect())
    }

    fn head(&self, session: SessionId) -> Result<Seq> {
        // Typed statements go in one round trip (an untyped one is prepared first: two).
        let id = to_i64(session);
        let row = self.shared.with(|c| c.query_typed_opt("SELECT head FROM condense_sessions WHERE id = $1", &[(&id, Type::INT8)]))?;
        row.map(|r| r.get::<_, i64>(0) as u64).ok_or_else(|| LogError::UnknownSession(session.to_string()))
    }

    fn session_id(&self, name: &str) -> Result<Option<SessionId>> {
        let row = self.shared.with(|c| c.query_typed_opt("SELECT id FROM condense_sessions WHERE name = $1", &[(&name, Type::TEXT)]))?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    fn remove_session(&self, session: SessionId) -> Result<()> {
        let id = to_i64(session);
        let found = self.shared.with(|c| {
            let mut tx = c.transaction()?;
            tx.query_one("SELECT id_floor FROM condense_meta FOR UPDATE", &[])?;
            let n = tx.execute("DELETE FROM condense_sessions WHERE id = $1", &[&id])?;
            tx.execute("DELETE FROM condense_events WHERE session = $1", &[&id])?;
            tx.execute("UPDATE condense_meta SET id_floor = greatest(id_floor, $1::bigint + 1)", &[&id])?;
            tx.commit()?;
            Ok(n > 0)
        })?;
        if found { Ok(()) } else { Err(LogError::UnknownSession(session.to_string())) }
    }

    fn append_encoded(&self, session: SessionId, expected: Seq, values: Vec<Vec<u8>>, durable: bool) -> Result<Receiver<Result<Seq>>> {
        let (reply, rx) = bounded(1);
        self.send(Request::Append { session, expected, values, durable, reply })?;
        Ok(rx)
    }

    fn sync(&self) -> Result<()> {
        let (reply, rx) = bounded(1);
        self.send(Request::Sync { reply })?;
        rx.recv().map_err(|_| LogError::Closed)?
    }

    fn for_each_value(&self, session: SessionId, from: Seq, to: Seq, f: &mut dyn FnMut(Seq, &[u8]) -> Result<()>) -> Result<()> {
        let (s, lo, hi) = (to_i64(session), to_i64(from), to_i64(to));
        // The rows are handed on as they arrive: once one was, a failure is not retried (`f` would see
        // it twice). An error of `f` ends the read and is returned as it is.
        let mut failed: Option<LogError> = None;
        self.shared.with_unsent(|conn, delivered| {
            let params: [&(dyn postgres::types::ToSql + Sync); 3] = [&s, &lo, &hi];
            let mut rows = conn.query_raw("SELECT seq, body FROM condense_events WHERE session = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq", params)?;
            use postgres::fallible_iterator::FallibleIterator;
            while let Some(row) = rows.next()? {
                *delivered = true;
                let seq = row.get::<_, i64>(0) as u64;
                if let Err(e) = f(seq, row.get::<_, &[u8]>(1)) {
                    failed = Some(e);
                    return Ok(());
                }
            }
            Ok(())
        })?;
        failed.map_or(Ok(()), Err)
    }

    fn subscribe(&self) -> Receiver<Appended> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.shared.subscribers.lock().expect("subscribers lock").push(tx);
        self.listen();
        rx
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash> {
        let hash = BlobHash::of(bytes);
        self.shared.with(|c| c.execute("INSERT INTO condense_blobs (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING", &[&hash.0, &bytes]))?;
        Ok(hash)
    }

    fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        let row = self.shared.with(|c| c.query_opt("SELECT bytes FROM condense_blobs WHERE hash = $1", &[&hash.0]))?;
        let bytes: Vec<u8> = row.ok_or_else(|| LogError::BlobMissing(hash.0.clone()))?.get(0);
        let actual = BlobHash::of(&bytes);
        if &actual != hash {
            return Err(LogError::BlobCorrupt { hash: hash.0.clone(), actual: actual.0 });
        }
        Ok(bytes)
    }

    fn blob_hashes(&self) -> Result<Vec<BlobHash>> {
        let rows = self.shared.with(|c| c.query("SELECT hash FROM condense_blobs ORDER BY hash", &[]))?;
        Ok(rows.iter().filter_map(|r| BlobHash::parse(r.get(0))).collect())
    }

    fn close(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.tx.lock().expect("writer sender lock").take();
        if let Some(join) = self.join.lock().expect("writer join lock").take() {
            let _ = join.join();
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.close();
    }
}

fn run(shared: &Shared, rx: &Receiver<Request>) {
    let (to_flusher, flushes) = crossbeam_channel::unbounded();
    std::thread::scope(|scope| {
        scope.spawn(|| flusher(shared, &flushes));
        while let Some(group) = crate::next_group(rx) {
            commit(shared, group, &to_flusher);
        }
        drop(to_flusher);
    });
    if shared.flushed.load(Ordering::Acquire) < shared.deferred.load(Ordering::Acquire) {
        let _ = shared.with(flush_wal);
    }
}

/// Answers syncs beside the writer: a sync waits for the disk without holding up the appends queued behind
/// it (a flush takes milliseconds, an append's commit without one a fraction of that; issue 35). A sync
/// reaches it only after the writer committed everything queued before it, and a synchronous commit
/// waits for the WAL up to its own record, so one flush covers every commit that returned before it began.
fn flusher(shared: &Shared, rx: &Receiver<Sender<Result<()>>>) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let covered = shared.deferred.load(Ordering::Acquire);
        let outcome = shared.with(flush_wal);
        if outcome.is_ok() {
            shared.flushed.fetch_max(covered, Ordering::AcqRel);
        }
        for reply in waiting {
            drop(reply.send(match &outcome {
                Ok(()) => Ok(()),
                Err(LogError::Unavailable { store, detail }) => Err(LogError::Unavailable { store: store.clone(), detail: detail.clone() }),
                Err(e) => Err(shared.err(format!("sync failed: {e}"))),
            }));
        }
    }
}

/// Makes every earlier commit durable: a commit that is itself synchronous waits for the WAL up to its own
/// record, which lies after theirs.
fn flush_wal(c: &mut impl postgres::GenericClient) -> std::result::Result<(), postgres::Error> {
    c.batch_execute(WAL_WRITE)
}

/// A write that makes a transaction's commit wait for the WAL to reach the disk. PostgreSQL flushes the
/// WAL at a synchronous commit only when the transaction itself wrote to it: one that merely took a
/// transaction id (`pg_current_xact_id()`) commits without waiting, so the commits acknowledged before it
/// without a flush could still be lost in a crash (issue 35). A transactional logical message is such a
/// write, and touches no table (rewriting a row at every sync, as before, left thousands of dead versions
/// of it under a busy server).
/// It sets its own transaction's commit to synchronous (the server's default may say otherwise).
const WAL_WRITE: &str = "SELECT set_config('synchronous_commit', 'on', true), pg_logical_emit_message(true, 'condense', 'sync')";

/// A group's appends in one statement, each to a session of its own: a head moves from `expected` to
/// `last` only if it is `expected` (the row lock makes a second writer wait and then see the new head),
/// the values go in only where it moved, each move is announced, and the commit's durability is set for
/// the statement's own transaction. One round trip for the whole group, where a transaction of separate
/// statements took two and three for each append (issue 35: serve's own p99 on PostgreSQL). Returns the
/// sessions whose head moved.
const APPEND: &str = "WITH sc AS (SELECT set_config('synchronous_commit', $1, true)), \
     want AS (SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::bigint[]) AS w(id, expected, last)), \
     moved AS (UPDATE condense_sessions s SET head = w.last FROM want w WHERE s.id = w.id AND s.head = w.expected \
               RETURNING s.id, w.expected, w.last), \
     ins AS (INSERT INTO condense_events (session, seq, body) \
             SELECT e.s, e.q, e.b FROM unnest($5::bigint[], $6::bigint[], $7::bytea[]) AS e(s, q, b) JOIN moved m ON m.id = e.s), \
     told AS (SELECT pg_notify($8, m.id || ' ' || (m.expected + 1) || ' ' || m.last) FROM moved m WHERE m.last > m.expected) \
     SELECT (SELECT count(*) FROM sc), (SELECT count(*) FROM told), array(SELECT id FROM moved)";

/// Appends of one group that go in one statement: a session's appends that follow one another merged
/// into one move of its head.
#[derive(Default)]
struct Round {
    moves: Vec<Move>,
    /// The values, as (session, seq, bytes).
    values: Vec<(SessionId, Seq, Vec<u8>)>,
}

/// A move of a session's head: (session, expected, last, the appends merged into it, as (index in the
/// group, expected, last)).
type Move = (SessionId, Seq, Seq, Vec<(usize, Seq, Seq)>);

/// An append waiting in a group: session, expected head, values, where its answer goes.
type Waiting = (SessionId, Seq, Vec<Vec<u8>>, Sender<Result<Seq>>);

/// Splits a group's appends into rounds of one move per session: an append that continues a session's
/// move joins it, one that does not (it will be refused as stale, unless an earlier one was) waits for
/// a later round.
fn rounds(appends: &mut [Waiting]) -> Vec<Round> {
    let mut rounds: Vec<Round> = Vec::new();
    for (i, (session, expected, values, _)) in appends.iter_mut().enumerate() {
        let last = *expected + values.len() as u64;
        let mut placed = false;
        for r in rounds.iter_mut() {
            match r.moves.iter_mut().find(|m| m.0 == *session) {
                Some(m) if m.2 == *expected => {
                    m.2 = last;
                    m.3.push((i, *expected, last));
                }
                Some(_) => continue,
                None => r.moves.push((*session, *expected, last, vec![(i, *expected, last)])),
            }
            r.values.extend(std::mem::take(values).into_iter().zip(*expected + 1..).map(|(v, q)| (*session, q, v)));
            placed = true;
            break;
        }
        if !placed {
            let mut r = Round::default();
            r.moves.push((*session, *expected, last, vec![(i, *expected, last)]));
            r.values.extend(std::mem::take(values).into_iter().zip(*expected + 1..).map(|(v, q)| (*session, q, v)));
            rounds.push(r);
        }
    }
    rounds
}

/// One group: its appends in as few statements as there are rounds (one, but for a session appended to
/// out of turn), each committed on its own. Replies after the commit, or an error for every append the
/// failed statement held; hands the group's syncs to the flusher once the commits returned (at once when
/// nothing is waiting for the disk).
fn commit(shared: &Shared, group: Vec<Request>, flusher: &Sender<Sender<Result<()>>>) {
    let mut appends: Vec<Waiting> = Vec::new();
    let mut syncs = Vec::new();
    let mut durable = false;
    for r in group {
        match r {
            Request::Append { session, expected, values, durable: d, reply } => {
                durable |= d;
                appends.push((session, expected, values, reply));
            }
            Request::Sync { reply } => syncs.push(reply),
        }
    }
    let sc = if durable { "on" } else { "off" };
    let mut outcomes: Vec<Option<Result<Seq>>> = appends.iter().map(|_| None).collect();
    let mut notices: Vec<Appended> = Vec::new();
    let mut failed = false;
    for round in rounds(&mut appends) {
        // A connection the server closed since it was last used fails before the statement reaches it:
        // the attempt is repeated on a fresh connection. Repeating a statement that did reach the server
        // is safe too: it moves a head only from the expected one.
        let result = shared.with(|c| {
            let ids: Vec<i64> = round.moves.iter().map(|m| to_i64(m.0)).collect();
            let expected: Vec<i64> = round.moves.iter().map(|m| to_i64(m.1)).collect();
            let last: Vec<i64> = round.moves.iter().map(|m| to_i64(m.2)).collect();
            let sessions: Vec<i64> = round.values.iter().map(|v| to_i64(v.0)).collect();
            let seqs: Vec<i64> = round.values.iter().map(|v| to_i64(v.1)).collect();
            let bodies: Vec<&[u8]> = round.values.iter().map(|v| v.2.as_slice()).collect();
            let row = c.query_typed_one(
                APPEND,
                &[
                    (&sc, Type::TEXT),
                    (&ids, Type::INT8_ARRAY),
                    (&expected, Type::INT8_ARRAY),
                    (&last, Type::INT8_ARRAY),
                    (&sessions, Type::INT8_ARRAY),
                    (&seqs, Type::INT8_ARRAY),
                    (&bodies, Type::BYTEA_ARRAY),
                    (&CHANNEL, Type::TEXT),
                ],
            )?;
            let moved: Vec<i64> = row.get(2);
            // Where a head did not move: the head as it is, to say why.
            let mut heads = BTreeMap::new();
            for m in round.moves.iter().filter(|m| !moved.contains(&to_i64(m.0))) {
                let h = c.query_typed_opt("SELECT head FROM condense_sessions WHERE id = $1", &[(&to_i64(m.0), Type::INT8)])?;
                heads.insert(m.0, h.map(|r| r.get::<_, i64>(0) as u64));
            }
            Ok((moved, heads))
        });
        match result {
            Ok((moved, heads)) => {
                for (session, first, last, members) in &round.moves {
                    if moved.contains(&to_i64(*session)) {
                        if last > first {
                            notices.push(Appended { session: *session, first: first + 1, last: *last });
                        }
                        for (i, _, l) in members {
                            outcomes[*i] = Some(Ok(*l));
                        }
                        continue;
                    }
                    for (i, e, _) in members {
                        outcomes[*i] = Some(match heads.get(session).copied().flatten() {
                            None => Err(LogError::UnknownSession(session.to_string())),
                            Some(h) if h != *e => Err(LogError::HeadMismatch { session: *session, expected: *e, actual: h }),
                            Some(_) => Err(shared.err("not appended: an earlier append of the session in its group was refused")),
                        });
                    }
                }
            }
            Err(e) => {
                // Nothing of the round is acknowledged (it did not commit, or its outcome is unknown: a
                // caller that retries with the same expected head then learns the head moved).
                failed = true;
                let msg = format!("group commit failed: {e}");
                for (_, _, _, members) in &round.moves {
                    for (i, _, _) in members {
                        outcomes[*i] = Some(Err(match &e {
                            LogError::Unavailable { store, detail } => LogError::Unavailable { store: store.clone(), detail: detail.clone() },
                            _ => shared.err(&msg),
                        }));
                    }
                }
            }
        }
    }
    if !notices.is_empty() {
        if durable {
            // A synchronous commit made every earlier one durable too.
            shared.flushed.fetch_max(shared.deferred.load(Ordering::Acquire), Ordering::AcqRel);
        } else {
            shared.deferred.fetch_add(1, Ordering::AcqRel);
        }
    }
    let pending = shared.flushed.load(Ordering::Acquire) < shared.deferred.load(Ordering::Acquire);
    for reply in syncs {
        if failed {
            drop(reply.send(Err(shared.err("sync refused: a commit before it failed"))));
        } else if pending {
            drop(flusher.send(reply));
        } else {
            drop(reply.send(Ok(())));
        }
    }
    for ((_, _, _, reply), outcome) in appends.into_iter().zip(outcomes) {
        drop(reply.send(outcome.unwrap_or_else(|| Err(shared.err("not appended")))));
    }
    if !notices.is_empty() {
        // This process's subscribers are also told through LISTEN; the local send covers a subscriber
        // whose listener is not connected yet, and duplicates are harmless (a notice says "caught up to
        // here").
        let mut subs = shared.subscribers.lock().expect("subscribers lock");
        subs.retain(|s| notices.iter().all(|n| s.send(*n).is_ok()));
    }
}

/// Hears `condense_appended` on a connection of its own and passes the notices on; reconnects after the
/// server goes away, until the log closes.
fn listener(shared: &Arc<Shared>) {
    let mut backoff = Duration::from_millis(50);
    while !shared.stopped.load(Ordering::SeqCst) {
        let Ok(mut client) = shared.config.connect(NoTls) else {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        };
        if client.batch_execute(&format!("LISTEN {CHANNEL}")).is_err() {
            continue;
        }
        backoff = Duration::from_millis(50);
        loop {
            if shared.stopped.load(Ordering::SeqCst) {
                return;
            }
            use postgres::fallible_iterator::FallibleIterator;
            let next = client.notifications().timeout_iter(Duration::from_millis(250)).next();
            match next {
                Ok(Some(n)) => {
                    if let Some(a) = parse_notice(n.payload()) {
                        let mut subs = shared.subscribers.lock().expect("subscribers lock");
                        subs.retain(|s| s.send(a).is_ok());
                    }
                }
                Ok(None) => {
                    if client.is_closed() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    }
}

fn parse_notice(payload: &str) -> Option<Appended> {
    let mut it = payload.split(' ').map(|p| p.parse::<u64>());
    let (Some(Ok(session)), Some(Ok(first)), Some(Ok(last))) = (it.next(), it.next(), it.next()) else { return None };
    Some(Appended { session, first, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://ann:s3cret@db.example:5432/condense"), "postgres://ann:***@db.example:5432/condense");
        assert_eq!(redact("postgresql://ann@db/condense?sslmode=disable&password=s3cret"), "postgresql://ann@db/condense?sslmode=disable&password=***");
        assert_eq!(redact("postgres://db/condense"), "postgres://db/condense");
        assert_eq!(redact("postgres://ann:p%40ss@db"), "postgres://ann:***@db");
    }

    #[test]
    fn notices_parse() {
        assert_eq!(parse_notice("3 10 12"), Some(Appended { session: 3, first: 10, last: 12 }));
        assert_eq!(parse_notice("3 x 12"), None);
    }
}
