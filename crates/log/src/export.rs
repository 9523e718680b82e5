//! The portable export file: a magic line, then tagged, length-prefixed records (sessions, events, blobs),
//! then a trailer with the record count and a blake3 checksum of everything before it. A file cut short
//! anywhere is reported as truncated; a flipped byte as a checksum or decoding error.

use crate::codec::{decode_envelope, encode_envelope};
use crate::{Log, LogError, Result};
use condense_events::{Event, SessionId};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 16] = b"CONDENSE-EXPORT\x01";
const TAG_SESSION: u8 = 1;
const TAG_EVENT: u8 = 2;
const TAG_BLOB: u8 = 3;
const TAG_END: u8 = 0;

/// What an export or import moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportSummary {
    /// Sessions.
    pub sessions: u64,
    /// Events.
    pub events: u64,
    /// Blobs.
    pub blobs: u64,
    /// Bytes of the export file.
    pub bytes: u64,
    /// Sessions (of an import) that the store already held in full: nothing was written for them.
    pub present: u64,
}

struct Writer<W: Write> {
    out: W,
    hasher: blake3::Hasher,
    records: u64,
    bytes: u64,
}

impl<W: Write> Writer<W> {
    fn raw(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hasher.update(b);
        self.bytes += b.len() as u64;
        self.out.write_all(b)
    }
    fn record(&mut self, tag: u8, payload: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(payload.len())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "record over 4 GiB"))?;
        self.raw(&[tag])?;
        self.raw(&len.to_le_bytes())?;
        self.raw(payload)?;
        self.records += 1;
        Ok(())
    }
}

pub(crate) fn export(log: &Log, path: &Path) -> Result<ExportSummary> {
    // Written beside the target under a temporary name and renamed on success: a failed export leaves
    // whatever was at the target untouched.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "export".into());
    let tmp = path.with_file_name(format!(".{name}.condense-tmp"));
    let result = export_to(log, &tmp);
    match result {
        Ok(s) => {
            std::fs::rename(&tmp, path).map_err(|source| LogError::Io { path: path.to_path_buf(), source })?;
            Ok(s)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn export_to(log: &Log, path: &Path) -> Result<ExportSummary> {
    let io = |source| LogError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = Writer { out: std::io::BufWriter::new(file), hasher: blake3::Hasher::new(), records: 0, bytes: 0 };
    let mut summary = ExportSummary::default();
    w.raw(MAGIC).map_err(io)?;
    for info in log.sessions()? {
        let mut payload = info.id.to_be_bytes().to_vec();
        payload.extend_from_slice(info.name.as_bytes());
        w.record(TAG_SESSION, &payload).map_err(io)?;
        summary.sessions += 1;
        let mut err = None;
        let mut referenced = Vec::new();
        log.for_each(info.id, 1, info.head, |env| {
            if let Some(b) = crate::blob_of(&env.body) {
                referenced.push(b.to_string());
            }
            if let Err(e) = w.record(TAG_EVENT, &encode_envelope(&env)) {
                err = Some(e);
            }
            summary.events += 1;
            Ok(())
        })?;
        // A backup without a blob its events name would restore a store that cannot answer a query.
        for b in referenced {
            let present = crate::BlobHash::parse(&b).is_some_and(|h| log.get_blob(&h).is_ok());
            if !present {
                return Err(LogError::BlobMissing(format!("{b} (named by session `{}`)", info.name)));
            }
        }
        if let Some(e) = err {
            return Err(io(e));
        }
    }
    for hash in log.blob_hashes()? {
        let bytes = log.get_blob(&hash)?;
        w.record(TAG_BLOB, &bytes).map_err(io)?;
        summary.blobs += 1;
    }
    let digest = *w.hasher.finalize().as_bytes();
    let mut trailer = w.records.to_le_bytes().to_vec();
    trailer.extend_from_slice(&digest);
    w.raw(&[TAG_END]).map_err(io)?;
    w.raw(&(trailer.len() as u32).to_le_bytes()).map_err(io)?;
    w.raw(&trailer).map_err(io)?;
    w.out.flush().map_err(io)?;
    w.out.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    summary.bytes = w.bytes;
    Ok(summary)
}

struct Parsed {
    sessions: Vec<(SessionId, String, Vec<Event>)>,
    blobs: Vec<Vec<u8>>,
}

fn parse(path: &Path, data: &[u8]) -> Result<Parsed> {
    let truncated = |offset: usize| LogError::Truncated { path: path.to_path_buf(), offset: offset as u64 };
    let bad = |offset: usize, reason: String| LogError::BadExport { path: path.to_path_buf(), offset: offset as u64, reason };
    if data.len() < MAGIC.len() {
        return Err(if MAGIC.starts_with(data) { truncated(data.len()) } else { bad(0, "not a condense export".into()) });
    }
    if &data[..MAGIC.len()] != MAGIC {
        return Err(bad(0, "not a condense export (or a newer export version)".into()));
    }
    let mut pos = MAGIC.len();
    let mut records = 0u64;
    let mut sessions: Vec<(SessionId, String, Vec<Event>)> = Vec::new();
    let mut index: BTreeMap<SessionId, usize> = BTreeMap::new();
    let mut blobs = Vec::new();
    loop {
        let start = pos;
        if data.len() < pos + 5 {
            return Err(truncated(data.len()));
        }
        let tag = data[pos];
        let len = u32::from_le_bytes(data[pos + 1..pos + 5].try_into().expect("4 bytes")) as usize;
        pos += 5;
        if data.len() < pos + len {
            return Err(truncated(data.len()));
        }
        let payload = &data[pos..pos + len];
        pos += len;
        match tag {
            TAG_END => {
                if len != 40 {
                    return Err(bad(start, format!("trailer of {len} bytes, expected 40")));
                }
                let count = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                let digest = blake3::hash(&data[..start]);
                if count != records || digest.as_bytes() != &payload[8..] {
                    return Err(bad(start, "checksum or record count does not match the content".into()));
                }
                if pos != data.len() {
                    return Err(bad(pos, "bytes after the trailer".into()));
                }
                return Ok(Parsed { sessions, blobs });
            }
            TAG_SESSION => {
                if len < 8 {
                    return Err(bad(start, "session record too short".into()));
                }
                let id = u64::from_be_bytes(payload[..8].try_into().expect("8 bytes"));
                let name = std::str::from_utf8(&payload[8..])
                    .map_err(|_| bad(start, "session name is not UTF-8".into()))?
                    .to_string();
                if index.insert(id, sessions.len()).is_some() {
                    return Err(bad(start, format!("session {id} appears twice")));
                }
                sessions.push((id, name, Vec::new()));
            }
            TAG_EVENT => {
                if payload.len() < 2 {
                    return Err(bad(start, "event record too short".into()));
                }
                // The envelope names its own key; decode it leniently first to learn which key that is.
                let env = peek(payload).ok_or_else(|| bad(start, "event does not decode".into()))?;
                let env = decode_envelope(env.0, env.1, payload).map_err(|e| bad(start, e.to_string()))?;
                let Some(&i) = index.get(&env.session) else {
                    return Err(bad(start, format!("event of unknown session {}", env.session)));
                };
                let list = &mut sessions[i].2;
                if env.seq != list.len() as u64 + 1 {
                    return Err(bad(start, format!("event {}:{} out of order", env.session, env.seq)));
                }
                list.push(env.body);
            }
            TAG_BLOB => blobs.push(payload.to_vec()),
            other => return Err(bad(start, format!("unknown record tag {other}"))),
        }
        records += 1;
    }
}

fn peek(payload: &[u8]) -> Option<(SessionId, u64)> {
    // Envelope layout under bincode legacy: schema u16, session u64, seq u64 (little endian).
    let b = payload.get(1..19)?;
    let session = u64::from_le_bytes(b[2..10].try_into().ok()?);
    let seq = u64::from_le_bytes(b[10..18].try_into().ok()?);
    Some((session, seq))
}

pub(crate) fn import(log: &Log, path: &Path) -> Result<ExportSummary> {
    let data = std::fs::read(path).map_err(|source| LogError::Io { path: path.to_path_buf(), source })?;
    let parsed = parse(path, &data)?;
    // A restore is resumable: a session the store holds already is skipped when its events are exactly the
    // export's, and completed when they are a prefix of them (what a restore stopped part-way leaves). A
    // session of the same name with other content is refused, before anything is written.
    let mut plan = Vec::with_capacity(parsed.sessions.len());
    for (_, name, events) in &parsed.sessions {
        let Some(id) = log.session_id(name)? else {
            plan.push((None, 0u64));
            continue;
        };
        let head = log.head(id)?;
        let mut same = head as usize <= events.len();
        if same {
            let mut i = 0usize;
            log.for_each(id, 1, head, |env| {
                same &= env.body == events[i];
                i += 1;
                Ok(())
            })?;
        }
        if !same {
            return Err(LogError::RestoreConflict(name.clone()));
        }
        plan.push((Some(id), head));
    }
    let mut summary = ExportSummary { bytes: data.len() as u64, ..Default::default() };
    for blob in &parsed.blobs {
        log.put_blob(blob)?;
        summary.blobs += 1;
    }
    for ((exported_id, name, events), (existing, mut head)) in parsed.sessions.into_iter().zip(plan) {
        if existing.is_some() && head as usize == events.len() {
            summary.present += 1;
            continue;
        }
        let id = match existing {
            Some(id) => id,
            None => log.create_session_as(&name, exported_id)?,
        };
        let mut rest: Vec<Event> = events.into_iter().skip(head as usize).collect();
        summary.events += rest.len() as u64;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(4096));
            head = log.append(id, head, rest)?;
            rest = tail;
        }
        summary.sessions += 1;
    }
    Ok(summary)
}
