//! Keys and values: big-endian `(session, seq)` keys and `[format byte] + bincode(legacy)` values, the
//! bincode LZ4-compressed when that makes a value of some size smaller; and packed values, a run of
//! consecutive events stored under the key of its last one (what an import writes).

use crate::{LogError, Result};
use condense_events::{Envelope, Seq, SessionId, SCHEMA_VERSION};

/// The format byte that starts a stored value whose bincode follows as it is.
pub const FORMAT_VERSION: u8 = 1;
/// The format byte that starts a stored value whose bincode follows LZ4-compressed (a block, after its
/// length as a little-endian `u32`).
pub const FORMAT_LZ4: u8 = 2;

/// The format byte that starts a packed value: a run of consecutive events of one session, stored under
/// the key of the last. After the byte: the number of events and the length of the run's bytes (both
/// little-endian `u32`), then those bytes LZ4-compressed as one block. The run's bytes are, for each event
/// in order, its length (little-endian `u32`) and its value as [`encode_event`] writes it.
pub const FORMAT_PACKED: u8 = 3;

/// The format byte that starts a value kept in its session's value file (`values/<session>` beside the
/// database) instead of in sled: what sled stores is only where to find it. After the byte: the number of
/// events the value holds (`u32`), its offset in the file (`u64`), its length (`u32`) and the CRC-32 of
/// its bytes (`u32`), all little-endian. The bytes there are a value of any other format. Only the sled
/// store writes such a value (for an import's append, see `values`); [`crate::Log::append_encoded`]
/// refuses one from a caller.
pub const FORMAT_EXTERNAL: u8 = 4;

/// The length of a [`FORMAT_EXTERNAL`] value.
pub(crate) const EXTERNAL_LEN: usize = 21;

/// Where a value kept in a value file is: what a [`FORMAT_EXTERNAL`] value says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct External {
    /// How many events the value holds.
    pub(crate) count: u32,
    /// Where the value starts in the session's value file.
    pub(crate) offset: u64,
    /// Its length in bytes.
    pub(crate) len: u32,
    /// The CRC-32 of those bytes.
    pub(crate) crc: u32,
}

impl External {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(EXTERNAL_LEN);
        out.push(FORMAT_EXTERNAL);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// The value's pointer, if it is a [`FORMAT_EXTERNAL`] value of the right length.
    pub(crate) fn decode(value: &[u8]) -> Option<External> {
        let [FORMAT_EXTERNAL, rest @ ..] = value else { return None };
        let rest: &[u8; EXTERNAL_LEN - 1] = rest.try_into().ok()?;
        let (count, rest) = rest.split_first_chunk::<4>()?;
        let (offset, rest) = rest.split_first_chunk::<8>()?;
        let (len, crc) = rest.split_first_chunk::<4>()?;
        Some(External {
            count: u32::from_le_bytes(*count),
            offset: u64::from_le_bytes(*offset),
            len: u32::from_le_bytes(*len),
            crc: u32::from_le_bytes(crc.try_into().ok()?),
        })
    }

    /// Where the value ends in its file.
    pub(crate) fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// A packed value's run of bytes (its events' lengths and plain values) holds no more than this
/// (32 KiB; a session's text compresses to 10–15 KB of it). sled splits a leaf of its tree at 17 values
/// and writes any item over a quarter of its log segment (1 MiB for a new store) to a file of its own,
/// node rewrites included: a leaf of packed values stays under that quarter, and reading one event of a
/// pack decompresses little. An event whose plain value is this large or larger is stored on its own.
pub const PACK_BYTES: usize = 32 * 1024;

/// Values whose bincode is shorter than this are stored as they are: compressing them saves little.
const COMPRESS_FROM: usize = 256;

/// The largest stored value decoded (1 GiB): no event comes near it, and no length field can make the
/// decoder allocate more.
pub const MAX_VALUE_BYTES: usize = 1 << 30;

pub(crate) fn key(session: SessionId, seq: Seq) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&session.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn split_key(k: &[u8]) -> (SessionId, Seq) {
    let mut s = [0u8; 8];
    let mut q = [0u8; 8];
    if k.len() == 16 {
        s.copy_from_slice(&k[..8]);
        q.copy_from_slice(&k[8..]);
    }
    (u64::from_be_bytes(s), u64::from_be_bytes(q))
}

pub(crate) fn session_from_key(k: &[u8]) -> SessionId {
    let mut s = [0u8; 8];
    if k.len() == 8 {
        s.copy_from_slice(k);
    }
    u64::from_be_bytes(s)
}

/// Encodes an envelope as stored: the format byte, then bincode with the legacy configuration.
pub fn encode_envelope(env: &Envelope) -> Vec<u8> {
    encode_event(env.session, env.seq, &env.body)
}

/// Encodes the envelope `{SCHEMA_VERSION, session, seq, body}` without building it, so the caller keeps
/// its event. The bytes are those of [`encode_envelope`]: bincode writes a struct as its fields in order.
pub fn encode_event(session: SessionId, seq: Seq, body: &condense_events::Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    encode_event_into(session, seq, body, &mut out);
    out
}

/// [`encode_event`], appended to `out`.
fn encode_event_into(session: SessionId, seq: Seq, body: &condense_events::Event, out: &mut Vec<u8>) {
    out.push(FORMAT_VERSION);
    let cfg = bincode::config::legacy();
    bincode::serde::encode_into_std_write((SCHEMA_VERSION, session, seq), &mut *out, cfg)
        .expect("encoding into a Vec cannot fail");
    bincode::serde::encode_into_std_write(body, out, cfg).expect("encoding into a Vec cannot fail");
}

/// [`encode_event`], the bincode LZ4-compressed ([`FORMAT_LZ4`]) when it is at least `COMPRESS_FROM` (256)
/// bytes and compression makes the value smaller. A session's text compresses to between a half and a
/// sixth, and writing to the store costs by the byte; [`decode_envelope`] reads both forms.
pub fn encode_event_compressed(session: SessionId, seq: Seq, body: &condense_events::Event) -> Vec<u8> {
    compress_plain(encode_event(session, seq, body))
}

/// [`encode_event_compressed`] of a value [`encode_event`] made.
fn compress_plain(plain: Vec<u8>) -> Vec<u8> {
    let raw = &plain[1..];
    // An oversized value stays as it is, so the bound refuses it by its real size.
    if raw.len() < COMPRESS_FROM || raw.len() > MAX_VALUE_BYTES {
        return plain;
    }
    let body = lz4_flex::block::compress(raw);
    if 5 + body.len() >= plain.len() {
        return plain;
    }
    with_header(&[&[FORMAT_LZ4], &(raw.len() as u32).to_le_bytes()], &body)
}

/// `header`'s parts, then `body`, in one value of its size. LZ4 writes into a buffer of the largest
/// size it may need without setting it first (`compress`), and only what it wrote is copied here.
fn with_header(header: &[&[u8]], body: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(header.iter().map(|h| h.len()).sum::<usize>() + body.len());
    header.iter().for_each(|h| value.extend_from_slice(h));
    value.extend_from_slice(body);
    value
}

/// The values that store `bodies`, the events of `session` from seq `first` on: runs of consecutive
/// events packed ([`FORMAT_PACKED`]) up to [`PACK_BYTES`] each; an event of that size or larger, or
/// alone in its run, as [`encode_event_compressed`] stores it. Each value is stored under the
/// seq of its last event ([`events_in`] tells how many it holds).
pub fn encode_packed<'a>(session: SessionId, first: Seq, bodies: impl IntoIterator<Item = &'a condense_events::Event>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // The run being gathered: its events' plain values, each after its length; how many.
    let mut run: Vec<u8> = Vec::with_capacity(PACK_BYTES + 4096);
    let mut count: u32 = 0;
    let close = |run: &mut Vec<u8>, count: &mut u32, out: &mut Vec<Vec<u8>>| {
        match *count {
            0 => {}
            1 => out.push(compress_plain(run[4..].to_vec())),
            n => out.push(pack(n, run)),
        }
        run.clear();
        *count = 0;
    };
    for (i, body) in bodies.into_iter().enumerate() {
        // Encoded in place after a length to fill in; moved out if it does not fit the run.
        let at = run.len();
        run.extend_from_slice(&[0; 4]);
        encode_event_into(session, first + i as u64, body, &mut run);
        let len = run.len() - at - 4;
        run[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        if len >= PACK_BYTES {
            // The large event keeps the buffer it was encoded in and the events before it (less than a
            // run) move out instead: copying the event out held a large value twice.
            let before = run[..at].to_vec();
            run.drain(..at + 4);
            let plain = std::mem::replace(&mut run, before);
            close(&mut run, &mut count, &mut out);
            out.push(compress_plain(plain));
            continue;
        }
        if run.len() > PACK_BYTES && count > 0 {
            let this = run.split_off(at);
            close(&mut run, &mut count, &mut out);
            run.extend_from_slice(&this);
        }
        count += 1;
    }
    close(&mut run, &mut count, &mut out);
    out
}

/// A packed value of the `count` events whose lengths and plain values `run` holds.
fn pack(count: u32, run: &[u8]) -> Vec<u8> {
    with_header(&[&[FORMAT_PACKED], &count.to_le_bytes(), &(run.len() as u32).to_le_bytes()], &lz4_flex::block::compress(run))
}

/// How many events a stored value holds: the count of a packed value or of one kept in a value file, 1
/// for any other.
pub fn events_in(value: &[u8]) -> u64 {
    match value {
        [FORMAT_PACKED | FORMAT_EXTERNAL, a, b, c, d, ..] => u64::from(u32::from_le_bytes([*a, *b, *c, *d])).max(1),
        _ => 1,
    }
}

/// Calls `f` with the seq and plain value of each event of the value stored under seq `last` of
/// `session` that falls in `from..=to`: the value itself when it holds one event, each of its events when
/// it is packed. A packed value that does not hold what its header says is [`LogError::Corrupt`].
pub fn unpack(session: SessionId, last: Seq, value: &[u8], from: Seq, to: Seq, f: &mut dyn FnMut(Seq, &[u8]) -> Result<()>) -> Result<()> {
    if value.first() != Some(&FORMAT_PACKED) {
        return if (from..=to).contains(&last) { f(last, value) } else { Ok(()) };
    }
    let corrupt = |reason: String| LogError::Corrupt { session, seq: last, reason };
    let header = value.get(1..9).ok_or_else(|| corrupt("packed value without its header".into()))?;
    let count = u64::from(u32::from_le_bytes(header[..4].try_into().expect("4 bytes")));
    let len = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
    if count == 0 || count > last {
        return Err(corrupt(format!("packed value of {count} events stored at seq {last}")));
    }
    // The length comes from the store: it is checked before anything is allocated for it.
    if len > MAX_VALUE_BYTES {
        return Err(corrupt(format!("packed value of {len} bytes, over the {MAX_VALUE_BYTES}-byte bound")));
    }
    let run = lz4_flex::block::decompress(&value[9..], len).map_err(|e| corrupt(format!("packed value: {e}")))?;
    if run.len() != len {
        return Err(corrupt(format!("packed value of {} bytes, {len} announced", run.len())));
    }
    let mut rest = &run[..];
    for seq in last + 1 - count..=last {
        let (n, tail) = rest.split_first_chunk::<4>().ok_or_else(|| corrupt(format!("packed value ends before seq {seq}")))?;
        let n = u32::from_le_bytes(*n) as usize;
        let plain = tail.get(..n).ok_or_else(|| corrupt(format!("packed value ends inside seq {seq}")))?;
        rest = &tail[n..];
        if (from..=to).contains(&seq) {
            f(seq, plain)?;
        }
    }
    if !rest.is_empty() {
        return Err(corrupt(format!("{} bytes after the packed value's {count} events", rest.len())));
    }
    Ok(())
}

/// Decodes a stored value, checking the format byte, the schema version and that it is stored under the
/// key it names.
pub fn decode_envelope(session: SessionId, seq: Seq, bytes: &[u8]) -> Result<Envelope> {
    let corrupt = |reason: String| LogError::Corrupt { session, seq, reason };
    let (&format, body) = bytes.split_first().ok_or_else(|| corrupt("empty value".into()))?;
    let unpacked;
    let body = match format {
        FORMAT_VERSION => body,
        FORMAT_LZ4 => {
            let (len, packed) = body.split_first_chunk::<4>().ok_or_else(|| corrupt("compressed value without its length".into()))?;
            let len = u32::from_le_bytes(*len) as usize;
            // The length comes from the store: it is checked before anything is allocated for it.
            if len > MAX_VALUE_BYTES {
                return Err(corrupt(format!("compressed value of {len} bytes, over the {MAX_VALUE_BYTES}-byte bound")));
            }
            unpacked = lz4_flex::block::decompress(packed, len).map_err(|e| corrupt(format!("compressed value: {e}")))?;
            if unpacked.len() != len {
                return Err(corrupt(format!("compressed value of {} bytes, {len} announced", unpacked.len())));
            }
            &unpacked[..]
        }
        _ => return Err(corrupt(format!("format byte {format}, expected {FORMAT_VERSION} or {FORMAT_LZ4}"))),
    };
    // A length field can claim more than a value holds (a damaged store, a crafted export): the decoder
    // refuses to claim more than the bound instead of allocating it.
    if body.len() > MAX_VALUE_BYTES {
        return Err(corrupt(format!("value of {} bytes, over the {MAX_VALUE_BYTES}-byte bound", body.len())));
    }
    let cfg = bincode::config::legacy().with_limit::<MAX_VALUE_BYTES>();
    let (env, used): (Envelope, usize) = bincode::serde::decode_from_slice(body, cfg).map_err(|e| corrupt(e.to_string()))?;
    if used != body.len() {
        return Err(corrupt(format!("{} trailing bytes", body.len() - used)));
    }
    if env.schema > SCHEMA_VERSION {
        return Err(corrupt(format!("schema version {} is newer than {SCHEMA_VERSION}", env.schema)));
    }
    if env.session != session || env.seq != seq {
        return Err(corrupt(format!("value names {}:{}", env.session, env.seq)));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use condense_events::{Event, SourceEvent};

    fn config(json: String) -> Event {
        Event::Source(SourceEvent::ConfigChanged { json })
    }

    /// Every event a value holds, read through [`unpack`] in `from..=to`.
    fn read(values: &[Vec<u8>], first: Seq, from: Seq, to: Seq) -> Vec<(Seq, Event)> {
        let mut out = Vec::new();
        let mut last = first - 1;
        for v in values {
            last += events_in(v);
            unpack(7, last, v, from, to, &mut |seq, plain| {
                out.push((seq, decode_envelope(7, seq, plain)?.body));
                Ok(())
            })
            .unwrap();
        }
        out
    }

    #[test]
    fn packed_runs_give_back_every_event_and_keep_large_ones_alone() {
        // Small events, then one over the run size, then small ones again.
        let mut events: Vec<Event> = (0..600).map(|i| config(format!("{i} {}", "x".repeat(i % 700)))).collect();
        events.insert(300, config("y".repeat(PACK_BYTES + 10)));
        let values = encode_packed(7, 5, &events);
        let counts: Vec<u64> = values.iter().map(|v| events_in(v)).collect();
        assert_eq!(counts.iter().sum::<u64>(), events.len() as u64);
        assert!(values.len() > 3 && values.len() < 20, "{counts:?}");
        assert!(counts.contains(&1), "the large event is alone: {counts:?}");
        assert!(values.iter().all(|v| v[0] != FORMAT_PACKED || v.len() < PACK_BYTES), "a run is at most PACK_BYTES before compression");
        let all = read(&values, 5, 0, Seq::MAX);
        assert_eq!(all.len(), events.len());
        for (i, (seq, e)) in all.iter().enumerate() {
            assert_eq!((*seq, e), (5 + i as u64, &events[i]));
        }
        // A range inside runs and across their edges.
        let some = read(&values, 5, 100, 400);
        assert_eq!(some.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (100..=400).collect::<Vec<_>>());
        // One event alone is stored as any single value.
        let one = encode_packed(7, 1, &events[..1]);
        assert_eq!(one, vec![encode_event_compressed(7, 1, &events[0])]);
        assert!(encode_packed(7, 1, &[]).is_empty());
        // A large event with nothing before it in its run, and one after a small event: each is stored
        // alone, as any single value.
        let edges = [config("z".repeat(PACK_BYTES + 1)), config("small".into()), config("w".repeat(2 * PACK_BYTES))];
        let alone: Vec<Vec<u8>> = edges.iter().enumerate().map(|(i, e)| encode_event_compressed(7, 1 + i as u64, e)).collect();
        assert_eq!(encode_packed(7, 1, &edges), alone);
    }

    #[test]
    fn a_damaged_packed_value_is_corrupt_naming_its_key() {
        let events: Vec<Event> = (0..20).map(|i| config(format!("event {i}"))).collect();
        let values = encode_packed(3, 1, &events);
        assert_eq!(values.len(), 1);
        let good = &values[0];
        let err = |v: &[u8]| {
            let mut n = 0;
            let r = unpack(3, 20, v, 1, 20, &mut |_, _| {
                n += 1;
                Ok(())
            });
            (r.err().map(|e| e.to_string()), n)
        };
        assert_eq!(err(good), (None, 20));
        // Cut short, a count that does not match, a length field beyond the bound, a count beyond its seq.
        for (bad, what) in [
            (good[..good.len() - 3].to_vec(), "packed value"),
            ([&good[..1], &21u32.to_le_bytes()[..], &good[5..]].concat(), "packed value of 21 events"),
            ([&good[..1], &19u32.to_le_bytes()[..], &good[5..]].concat(), "after the packed value's 19 events"),
            ([&good[..5], &u32::MAX.to_le_bytes()[..], &good[9..]].concat(), "over the"),
            (good[..6].to_vec(), "without its header"),
        ] {
            let (e, _) = err(&bad);
            let e = e.unwrap_or_else(|| panic!("{what}: no error"));
            assert!(e.contains(what) && e.contains("event 3:20"), "{what}: {e}");
        }
    }

    #[test]
    fn a_huge_length_field_is_an_error_not_an_abort() {
        let good = encode_event(1, 1, &Event::Source(SourceEvent::ConfigChanged { json: "x".repeat(40) }));
        // Every 8-byte window of the value set to a huge length, one at a time: each decode is an error or a
        // value, never a panic or an allocation abort.
        for at in 1..good.len().saturating_sub(8) {
            let mut bad = good.clone();
            bad[at..at + 8].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
            let _ = decode_envelope(1, 1, &bad);
        }
    }

    /// Logs written while a tool call, reasoning and an image were struct variants of `Block`, an
    /// assistant's usage was inline and decisions held their fields inline, read back the same now that
    /// they are boxed (a text block is 24 bytes, not 72; a decision 64, not 200): where a value keeps its
    /// fields does not change its bytes.
    #[test]
    fn blocks_keep_their_bytes_now_that_the_rare_kinds_are_boxed() {
        use condense_events::Block;
        #[derive(serde::Serialize)]
        enum Before {
            Text { text: String },
            Thinking { thinking: String, signature: Option<String> },
            ToolCall { id: String, name: String, arguments: String },
            Image { mime: String, data: String },
        }
        let before = vec![
            Before::Text { text: "a".into() },
            Before::Thinking { thinking: "b".into(), signature: Some("s".into()) },
            Before::ToolCall { id: "c1".into(), name: "bash".into(), arguments: "{}".into() },
            Before::Image { mime: "image/png".into(), data: "AA".into() },
        ];
        let now = vec![
            Block::Text { text: "a".into() },
            Block::thinking("b".into(), Some("s".into())),
            Block::tool_call("c1".into(), "bash".into(), "{}".into()),
            Block::image("image/png".into(), "AA".into()),
        ];
        let cfg = bincode::config::legacy();
        let written = bincode::serde::encode_to_vec(&before, cfg).expect("encodes");
        assert_eq!(bincode::serde::encode_to_vec(&now, cfg).expect("encodes"), written);
        let (read, _): (Vec<Block>, usize) = bincode::serde::decode_from_slice(&written, cfg).expect("decodes");
        assert_eq!(read, now);
        assert_eq!(std::mem::size_of::<Block>(), 24);
        // An assistant's usage is boxed as well: a message of any kind is 80 bytes, not 96.
        let usage = condense_events::Usage { input: 1, output: 2, cache_read: 3, cache_write: 4 };
        assert_eq!(bincode::serde::encode_to_vec(Some(Box::new(usage)), cfg).expect("encodes"), bincode::serde::encode_to_vec(Some(usage), cfg).expect("encodes"));
        assert_eq!(std::mem::size_of::<condense_events::Message>(), 80);
        // A compressed chain and a committed checkpoint were struct variants too: their bytes are still
        // the variant's number (7 and 8) and then the fields in order, as a tuple of them encodes.
        use condense_events::{ChainCompressed, CheckpointCommitted, DecisionEvent};
        let chain = ChainCompressed { block: 2, first: "u1".into(), last: "f1".into(), refs: vec![1, 2], body: "[b2]".into() };
        assert_eq!(
            bincode::serde::encode_to_vec(DecisionEvent::ChainCompressed(Box::new(chain.clone())), cfg).expect("encodes"),
            bincode::serde::encode_to_vec((7u32, chain.block, &chain.first, &chain.last, &chain.refs, &chain.body), cfg).expect("encodes")
        );
        let c = CheckpointCommitted {
            n: 1,
            boundary: "e9".into(),
            summary: "s".into(),
            kept: vec!["e7".into()],
            covers: vec![3],
            recovery: true,
            bounded: vec![("e8".into(), "t".into())],
            tokens_before: 900,
            tokens_after: 90,
        };
        let fields = (8u32, c.n, &c.boundary, &c.summary, &c.kept, &c.covers, c.recovery, &c.bounded, c.tokens_before, c.tokens_after);
        let written = bincode::serde::encode_to_vec(fields, cfg).expect("encodes");
        assert_eq!(bincode::serde::encode_to_vec(DecisionEvent::CheckpointCommitted(Box::new(c.clone())), cfg).expect("encodes"), written);
        let (read, _): (DecisionEvent, usize) = bincode::serde::decode_from_slice(&written, cfg).expect("decodes");
        assert_eq!(read, DecisionEvent::CheckpointCommitted(Box::new(c)));
        // So a list of decisions is laid out for the small ones: a pass lists one per captured output.
        assert_eq!(std::mem::size_of::<DecisionEvent>(), 64);
    }
}
