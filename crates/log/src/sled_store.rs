//! The embedded backend: sled, keyed by big-endian `(session, seq)` (a packed run of events under its
//! last seq), one writer thread that group-commits,
//! a heads manifest that detects a database which lost acknowledged events, and blob files and value
//! files (`values`) beside it.

use crate::sled_shared::Shared;
use crate::{blob, codec, manifest, sled_err, values, writer, quietly, Appended, Backend, BlobHash, LogError, Result, SessionInfo};
use condense_events::{Seq, SessionId};
use crossbeam_channel::Receiver;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The sled backend of [`crate::Log`].
pub(crate) struct SledStore {
    shared: Arc<Shared>,
    writer: writer::WriterHandle,
    blobs: blob::BlobStore,
}

impl SledStore {
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<SledStore> {
        std::fs::create_dir_all(dir).map_err(|source| LogError::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join("db");
        // Every group commit flushes explicitly, so sled's background flusher is off. The file lock can be
        // held for a moment by a handle being dropped, or by a child process forked meanwhile (the lock
        // travels with inherited descriptors until exec): retry for up to five seconds.
        let config = sled::Config::new()
            .path(&path)
            .cache_capacity(cache_bytes)
            .segment_size(segment_size(&path))
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
        let blob_tree = db.open_tree("blobs").map_err(sled_err(&path))?;
        // Events at the end of a session whose values are past the end of its value file (sled kept their
        // pointers through a power cut that the file's last writes did not survive) are not counted in its
        // head: they are dropped below unless they were acknowledged.
        let values_dir = dir.join(values::DIR);
        let (heads, cuts) = quietly(|| heads(&sessions, &events, &path, &values_dir))
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
            let cut = match cuts.iter().find(|(s, _)| *s == session) {
                Some(_) => format!(" (the values of the rest are past the end of {})", values::path(&values_dir, session).display()),
                None => String::new(),
            };
            return Err(damaged(format!(
                "session {session}{name} holds {have} of its {ack} acknowledged events{cut} (to open what is left anyway, move {} aside)",
                dir.join(manifest::FILE).display()
            )));
        }
        if !cuts.is_empty() {
            let mut batch = sled::Batch::default();
            for (_, keys) in &cuts {
                for k in keys {
                    batch.remove(k.clone());
                }
            }
            events.apply_batch(batch).map_err(sled_err(&path))?;
            db.flush().map_err(sled_err(&path))?;
        }
        values::remove_orphans(&values_dir, &heads.keys().copied().collect())?;
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
            pending_blobs: blob::Pending::default(),
            values_dir,
        });
        let writer = writer::WriterHandle::spawn(shared.clone());
        let blobs = blob::BlobStore::new(dir.join("blobs"), blob_tree, shared.path.clone(), shared.pending_blobs.clone());
        Ok(SledStore { shared, writer, blobs })
    }
}

impl Backend for SledStore {
    fn describe(&self) -> String {
        format!("sled store at {}", self.shared.path.parent().unwrap_or(&self.shared.path).display())
    }

    fn packs(&self) -> bool {
        true
    }

    fn create_session(&self, name: &str, wanted: Option<SessionId>) -> Result<SessionId> {
        self.writer.create_session(name, wanted, true)
    }

    fn create_session_deferred(&self, name: &str) -> Result<SessionId> {
        self.writer.create_session(name, None, false)
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let heads = self.shared.heads.lock().expect("heads lock").clone();
        let mut out = Vec::new();
        for item in self.shared.sessions.iter() {
            let (k, v) = item.map_err(sled_err(&self.shared.path))?;
            let id = codec::session_from_key(&k);
            // A session the writer is creating right now is named before its group commits: it is listed
            // once it has a head (as `head` and every read of it would otherwise refuse it).
            let Some(&head) = heads.get(&id) else { continue };
            let name = String::from_utf8_lossy(&v).into_owned();
            out.push(SessionInfo { id, name, head });
        }
        Ok(out)
    }

    fn head(&self, session: SessionId) -> Result<Seq> {
        self.shared
            .heads
            .lock()
            .expect("heads lock")
            .get(&session)
            .copied()
            .ok_or_else(|| LogError::UnknownSession(session.to_string()))
    }

    fn remove_session(&self, session: SessionId) -> Result<()> {
        self.writer.remove(session)
    }

    fn append_encoded(&self, session: SessionId, expected: Seq, values: Vec<Vec<u8>>, durable: bool) -> Result<Receiver<Result<Seq>>> {
        self.writer.append_prepared(session, expected, values, durable)
    }

    fn sync(&self) -> Result<()> {
        self.writer.sync()
    }

    fn for_each_value(&self, session: SessionId, from: Seq, to: Seq, f: &mut dyn FnMut(Seq, &[u8]) -> Result<()>) -> Result<()> {
        // A value is stored under the seq of its last event, so the first key at or after `from` holds it,
        // and the first at or after `to` is the last to read.
        let lo = codec::key(session, from);
        let hi = codec::key(session, Seq::MAX);
        let mut range = self.shared.events.range(lo..=hi);
        let mut external = values::Reader::new(&self.shared.values_dir, session);
        loop {
            let next = quietly(|| range.next()).map_err(|p| LogError::Damaged {
                path: self.shared.path.clone(),
                detail: format!("sled failed reading session {session} ({p})"),
            })?;
            let Some(item) = next else { return Ok(()) };
            let (k, v) = item.map_err(sled_err(&self.shared.path))?;
            let (s, seq) = codec::split_key(&k);
            if s != session {
                return Err(LogError::Corrupt { session, seq, reason: format!("stored under session {s}") });
            }
            let resolved = external.resolve(seq, &v)?;
            codec::unpack(session, seq, resolved.as_deref().unwrap_or(&v), from, to, f)?;
            if seq >= to {
                return Ok(());
            }
        }
    }

    fn subscribe(&self) -> Receiver<Appended> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.shared.subscribers.lock().expect("subscribers lock").push(tx);
        rx
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.blobs.put(bytes, true)
    }

    fn put_blob_deferred(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.blobs.put(bytes, false)
    }

    fn get_blob(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        self.blobs.get(hash)
    }

    fn blob_hashes(&self) -> Result<Vec<BlobHash>> {
        self.blobs.list()
    }

    fn close(&self) {
        self.writer.stop();
    }
}

/// Per session, the keys to drop from its end (see [`heads`]).
type Cuts = Vec<(SessionId, Vec<sled::IVec>)>;

/// Each session's head: the seq of its last event whose value is whole. With them, the keys after it, at
/// the session's end, whose values are value-file pointers past the end of its file (read only for a
/// session whose last value is such a pointer).
fn heads(sessions: &sled::Tree, events: &sled::Tree, db: &Path, values_dir: &Path) -> Result<(BTreeMap<SessionId, Seq>, Cuts)> {
    let mut heads = BTreeMap::new();
    let mut cuts = Vec::new();
    for item in sessions.iter() {
        let session = codec::session_from_key(&item.map_err(sled_err(db))?.0);
        let mut file_len = None;
        let mut lost = Vec::new();
        let mut head = 0;
        for item in events.scan_prefix(session.to_be_bytes()).rev() {
            let (k, v) = item.map_err(sled_err(db))?;
            let cut = match codec::External::decode(&v) {
                Some(at) => at.end() > *file_len.get_or_insert(values::file_len(values_dir, session)?),
                None => false,
            };
            if !cut {
                head = codec::split_key(&k).1;
                break;
            }
            lost.push(k);
        }
        heads.insert(session, head);
        if !lost.is_empty() {
            cuts.push((session, lost));
        }
    }
    Ok((heads, cuts))
}

/// sled's segment size for a new store (1 MiB instead of sled's 512 KiB). sled writes any item larger
/// than a quarter of a segment to a file of its own, and that includes a tree node it rewrites: a leaf
/// of 17 packed values ([`codec::PACK_BYTES`]) fits a quarter of 1 MiB, and at 512 KiB most rewrites of
/// such leaves created and deleted a file (the 100k session's import spent about 1 s of CPU in ext4's
/// inode code). docs/storage.md has the measurements.
const SEGMENT_BYTES: usize = 1 << 20;

/// The segment size to open the sled database at `db` with: the one it was created with (sled refuses
/// to open with another; stores made before [`SEGMENT_BYTES`] have 512 KiB), else [`SEGMENT_BYTES`].
fn segment_size(db: &Path) -> usize {
    // sled's `conf` file: `key: value` lines, then a checksum (which sled itself checks).
    let Ok(conf) = std::fs::read(db.join("conf")) else { return SEGMENT_BYTES };
    String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|l| l.strip_prefix("segment_size: ")?.trim().parse::<usize>().ok())
        .filter(|n| n.is_power_of_two())
        .unwrap_or(SEGMENT_BYTES)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// For a blob kept in the database and for one kept as a file alike.
    #[test]
    fn a_deferred_blob_reads_at_once_and_is_synced_by_the_next_sync() {
        for large in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = SledStore::open(dir.path(), 1 << 20).unwrap();
            let pending = || store.shared.pending_blobs.lock().unwrap().len();
            let bytes = |text: &[u8]| if large { text.repeat(blob::INLINE_BLOB_BYTES / text.len() + 1) } else { text.to_vec() };
            let as_file = |h: &BlobHash| dir.path().join("blobs").join(&h.0[..2]).join(&h.0).exists();
            let h = store.put_blob_deferred(&bytes(b"a spilled output")).unwrap();
            assert_eq!(store.get_blob(&h).unwrap(), bytes(b"a spilled output"));
            assert_eq!(as_file(&h), large, "only a blob over {} bytes is a file", blob::INLINE_BLOB_BYTES);
            assert_eq!(pending(), 1);
            // A sync with nothing else to write still syncs it.
            store.sync().unwrap();
            assert_eq!(pending(), 0);
            // As does a durable append; a durable put syncs itself.
            store.put_blob_deferred(&bytes(b"another")).unwrap();
            let id = store.create_session("s", None).unwrap();
            assert_eq!(pending(), 0);
            store.put_blob(&bytes(b"synced now")).unwrap();
            assert_eq!(pending(), 0);
            // The same bytes put again durably: found in place (and synced, had they been pending).
            store.put_blob_deferred(&bytes(b"twice")).unwrap();
            assert_eq!(store.put_blob(&bytes(b"twice")).unwrap(), BlobHash::of(&bytes(b"twice")));
            assert_eq!(pending(), 1, "a durable put of a pending blob syncs it and leaves the list to the flush");
            assert_eq!(id, 1);
            assert_eq!(store.blob_hashes().unwrap().len(), 4);
        }
    }

    #[test]
    fn a_store_keeps_the_segment_size_it_was_made_with() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        // A store made with sled's default segments, as stores were before packed values.
        drop(sled::Config::new().path(&db).segment_size(512 * 1024).open().unwrap());
        assert_eq!(segment_size(&db), 512 * 1024);
        let store = SledStore::open(dir.path(), 1 << 20).expect("opens at the size it was made with");
        store.create_session("s", None).unwrap();
        drop(store);
        assert_eq!(segment_size(&db), 512 * 1024);
        // A new store gets the larger segments.
        let fresh = tempfile::tempdir().unwrap();
        drop(SledStore::open(fresh.path(), 1 << 20).unwrap());
        assert_eq!(segment_size(&fresh.path().join("db")), SEGMENT_BYTES);
        assert_eq!(segment_size(&fresh.path().join("nothing")), SEGMENT_BYTES);
    }

    /// A small event to append.
    fn event(text: &str) -> condense_events::Event {
        condense_events::Event::Source(condense_events::SourceEvent::ConfigChanged { json: text.into() })
    }

    #[test]
    fn a_clean_close_tells_the_manifest_of_appends_made_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = crate::Log::open(dir.path()).unwrap();
            let s = log.create_session("s").unwrap();
            let values = vec![log.encode(s, 1, &event("one")), log.encode(s, 2, &event("two"))];
            log.append_encoded(s, 0, values, false).unwrap().recv().unwrap().unwrap();
        }
        // Otherwise the manifest would lag behind what the close made durable (a later loss of those events
        // would go unnoticed).
        let (acknowledged, _) = manifest::read(dir.path()).unwrap();
        assert_eq!(acknowledged.get(&1), Some(&2));
        assert_eq!(crate::Log::open(dir.path()).unwrap().head(1).unwrap(), 2);
    }

    /// `n` events of about 300 bytes each, which pack into values well over [`values::EXTERNAL_FROM`].
    fn events(n: usize, tag: &str) -> Vec<condense_events::Event> {
        (0..n).map(|i| event(&format!("{tag} {i} {}", "lorem ipsum dolor ".repeat(12 + i % 7)))).collect()
    }

    /// Imports `events` into a new session `name` as an import does: packed, in deferred appends of 500.
    fn import(log: &crate::Log, name: &str, events: &[condense_events::Event]) -> SessionId {
        let s = log.create_session(name).unwrap();
        let mut head = 0;
        for chunk in events.chunks(500) {
            let values = log.encode_packed(s, head + 1, chunk);
            head = log.append_encoded(s, head, values, false).unwrap().recv().unwrap().unwrap();
        }
        s
    }

    fn bodies(log: &crate::Log, s: SessionId) -> Vec<condense_events::Event> {
        log.read(s, 1, Seq::MAX).unwrap().into_iter().map(|e| e.body).collect()
    }

    #[test]
    fn an_imports_values_live_in_its_value_file_and_read_back_through_sled() {
        let dir = tempfile::tempdir().unwrap();
        let all = events(3000, "imported");
        let file = dir.path().join(values::DIR).join("1");
        {
            let log = crate::Log::open(dir.path()).unwrap();
            let s = import(&log, "big", &all);
            assert_eq!(s, 1);
            // Readable at once, before any flush.
            assert_eq!(bodies(&log, s), all);
            // Appends other than an import's (a request's events, with a flush or without) stay in sled,
            // whatever their size.
            let before = std::fs::metadata(&file).unwrap().len();
            let large = event(&"a large request event ".repeat(100));
            log.append(s, 3000, vec![large.clone()]).unwrap();
            // Numbers that compress little: values well over `EXTERNAL_FROM` once compressed.
            let deferred: Vec<_> = (0..3u64).map(|i| event(&(0..300u64).map(|k| ((k * 7919 + i) % 100_003).to_string()).collect::<Vec<_>>().join(" "))).collect();
            let values: Vec<Vec<u8>> = deferred.iter().enumerate().map(|(i, e)| log.encode(s, 3002 + i as u64, e)).collect();
            assert!(values.iter().all(|v| v.len() > values::EXTERNAL_FROM));
            log.append_encoded(s, 3001, values, false).unwrap().recv().unwrap().unwrap();
            assert_eq!(std::fs::metadata(&file).unwrap().len(), before);
            assert_eq!(log.read(s, 3001, 3001).unwrap()[0].body, large);
            assert_eq!(bodies(&log, s)[3001..], deferred[..]);
        }
        // sled holds only pointers for the imported events: its values are small, the file holds the rest.
        let bytes: usize = all.iter().map(|e| crate::encode_event(1, 1, e).len()).sum();
        let file_len = std::fs::metadata(&file).unwrap().len() as usize;
        assert!(file_len > bytes / 20 && file_len < bytes, "value file of {file_len} bytes for {bytes} bytes of events");
        let raw = raw_values(dir.path(), 1);
        let (imported, rest) = raw.split_at(raw.len() - 4);
        assert!(imported.len() > 10 && imported.iter().all(|v| v.len() == codec::EXTERNAL_LEN && v[0] == codec::FORMAT_EXTERNAL));
        assert!(rest.iter().all(|v| v[0] != codec::FORMAT_EXTERNAL), "the other appends' values are in sled");
        let log = crate::Log::open(dir.path()).unwrap();
        assert_eq!(bodies(&log, 1)[..3000], all[..]);
        // Reads of a range that starts and ends inside packs.
        let some: Vec<Seq> = log.read(1, 777, 1234).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(some, (777..=1234).collect::<Vec<_>>());
        assert_eq!(log.verify().unwrap().events, 3004);
        // Appending goes on after what the file holds.
        let more = events(600, "more");
        let values = log.encode_packed(1, 3005, &more);
        log.append_encoded(1, 3004, values, false).unwrap().recv().unwrap().unwrap();
        assert_eq!(bodies(&log, 1)[3004..], more[..]);
        assert!(std::fs::metadata(&file).unwrap().len() as usize > file_len);
        // A value a caller made to look like a pointer is refused before anything is written.
        let forged = codec::External { count: 1, offset: 0, len: 600, crc: 0 }.encode();
        let err = log.append_encoded(1, 3604, vec![forged], false).unwrap_err().to_string();
        assert!(err.contains("event 1:3605") && err.contains("value file"), "{err}");
        assert_eq!(log.head(1).unwrap(), 3604);
    }

    /// The raw values sled holds for session `s` of the closed store in `dir`.
    fn raw_values(dir: &Path, s: SessionId) -> Vec<sled::IVec> {
        let db = sled::Config::new().path(dir.join("db")).segment_size(SEGMENT_BYTES).open().unwrap();
        db.open_tree("events").unwrap().scan_prefix(s.to_be_bytes()).values().map(|v| v.unwrap()).collect()
    }

    #[test]
    fn a_damaged_value_file_is_a_corrupt_event_naming_the_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(values::DIR).join("1");
        {
            let log = crate::Log::open(dir.path()).unwrap();
            import(&log, "big", &events(2000, "e"));
        }
        // One byte changed in the middle of the file.
        let mut data = std::fs::read(&file).unwrap();
        let mid = data.len() / 2;
        data[mid] ^= 0x55;
        std::fs::write(&file, &data).unwrap();
        let log = crate::Log::open(dir.path()).unwrap();
        let err = log.verify().unwrap_err().to_string();
        assert!(err.starts_with("event 1:") && err.contains(&file.display().to_string()) && err.contains("CRC-32"), "{err}");
        assert!(err.contains("at offset "), "{err}");
        // The events before the damaged value still read.
        let seq: Seq = err["event 1:".len()..].split(' ').next().unwrap().trim_end_matches(':').parse().unwrap();
        assert!(seq > 1 && log.read(1, 1, 1).is_ok(), "{err}");
        drop(log);
        // The file gone altogether.
        std::fs::remove_file(&file).unwrap();
        std::fs::write(dir.path().join(manifest::FILE), b"").unwrap();
        let log = crate::Log::open(dir.path()).unwrap();
        // (With the manifest emptied the open drops what it cannot read: here, everything.)
        assert_eq!(log.head(1).unwrap(), 0);
    }

    #[test]
    fn a_value_file_cut_short_drops_unacknowledged_events_and_refuses_to_lose_acknowledged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(values::DIR).join("1");
        let all = events(2000, "e");
        {
            let log = crate::Log::open(dir.path()).unwrap();
            import(&log, "big", &all);
        }
        let full = std::fs::read(&file).unwrap();
        // As a power cut can leave it: sled kept the pointers, the file lost its last writes.
        std::fs::write(&file, &full[..full.len() - 100]).unwrap();
        let err = crate::Log::open(dir.path()).err().expect("acknowledged events lost").to_string();
        assert!(err.contains("is damaged") && err.contains("acknowledged events") && err.contains(&file.display().to_string()), "{err}");
        // Not acknowledged (the manifest, which is written after each flush, never learned them): the events
        // whose values are gone are dropped and the session ends at the last whole one.
        std::fs::write(dir.path().join(manifest::FILE), b"").unwrap();
        let log = crate::Log::open(dir.path()).unwrap();
        let head = log.head(1).unwrap();
        assert!(head > 1500 && head < 2000, "head {head}");
        assert_eq!(bodies(&log, 1), all[..head as usize]);
        assert_eq!(log.verify().unwrap().events, head);
        // The session goes on from there.
        let values = log.encode_packed(1, head + 1, &all[head as usize..]);
        log.append_encoded(1, head, values, false).unwrap().recv().unwrap().unwrap();
        // A durable append after them: the flush that made it durable synced the value file first, so the
        // file losing values before it is damage, not a power cut, and the read that meets it says where.
        log.append(1, 2000, vec![event("a request's event")]).unwrap();
        drop(log);
        let log = crate::Log::open(dir.path()).unwrap();
        assert_eq!(bodies(&log, 1)[..2000], all[..]);
        drop(log);
        let full = std::fs::read(&file).unwrap();
        std::fs::write(&file, &full[..full.len() - 100]).unwrap();
        let log = crate::Log::open(dir.path()).unwrap();
        assert_eq!(log.head(1).unwrap(), 2001);
        let err = log.verify().unwrap_err().to_string();
        assert!(err.contains("is cut short: the file holds") && err.contains(&file.display().to_string()), "{err}");
    }

    #[test]
    fn a_removed_sessions_value_file_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let values_dir = dir.path().join(values::DIR);
        {
            let log = crate::Log::open(dir.path()).unwrap();
            let gone = import(&log, "gone", &events(800, "g"));
            let kept = import(&log, "kept", &events(800, "k"));
            assert!(values_dir.join(gone.to_string()).exists());
            log.remove_session(gone).unwrap();
            assert!(!values_dir.join(gone.to_string()).exists());
            assert!(values_dir.join(kept.to_string()).exists());
        }
        // What a removal cut short leaves behind is deleted by the next open; files of other names stay.
        std::fs::write(values_dir.join("77"), b"left by a removal").unwrap();
        std::fs::write(values_dir.join("notes"), b"not ours").unwrap();
        let log = crate::Log::open(dir.path()).unwrap();
        assert!(!values_dir.join("77").exists());
        assert!(values_dir.join("notes").exists());
        assert_eq!(bodies(&log, 2), events(800, "k"));
    }

    #[test]
    fn a_session_removed_after_appends_made_without_a_flush_stays_removed_in_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = crate::Log::open(dir.path()).unwrap();
            let gone = log.create_session("gone").unwrap();
            let kept = log.create_session("kept").unwrap();
            for s in [gone, kept] {
                log.append_encoded(s, 0, vec![log.encode(s, 1, &event("one"))], false).unwrap().recv().unwrap().unwrap();
            }
            log.remove_session(gone).unwrap();
            // A later flush (here a sync) must not tell the manifest of the removed session again.
            log.append_encoded(kept, 1, vec![log.encode(kept, 2, &event("two"))], false).unwrap().recv().unwrap().unwrap();
            log.sync().unwrap();
        }
        let log = crate::Log::open(dir.path()).expect("reopens: the removed session is not taken for a lost one");
        assert_eq!(log.sessions().unwrap().iter().map(|s| (s.name.as_str(), s.head)).collect::<Vec<_>>(), [("kept", 2)]);
    }
}
