//! Keys and values: big-endian `(session, seq)` keys and `[format byte] + bincode(legacy)` values, the
//! bincode LZ4-compressed when that makes a value of some size smaller.

use crate::{LogError, Result};
use condense_events::{Envelope, Seq, SessionId, SCHEMA_VERSION};

/// The format byte that starts a stored value whose bincode follows as it is.
pub const FORMAT_VERSION: u8 = 1;
/// The format byte that starts a stored value whose bincode follows LZ4-compressed (a block, after its
/// length as a little-endian `u32`).
pub const FORMAT_LZ4: u8 = 2;

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
    out.push(FORMAT_VERSION);
    let cfg = bincode::config::legacy();
    bincode::serde::encode_into_std_write((SCHEMA_VERSION, session, seq), &mut out, cfg)
        .expect("encoding into a Vec cannot fail");
    bincode::serde::encode_into_std_write(body, &mut out, cfg).expect("encoding into a Vec cannot fail");
    out
}

/// [`encode_event`], the bincode LZ4-compressed ([`FORMAT_LZ4`]) when it is at least `COMPRESS_FROM` (256)
/// bytes and compression makes the value smaller. A session's text compresses to between a half and a
/// sixth, and writing to the store costs by the byte; [`decode_envelope`] reads both forms.
pub fn encode_event_compressed(session: SessionId, seq: Seq, body: &condense_events::Event) -> Vec<u8> {
    let plain = encode_event(session, seq, body);
    let raw = &plain[1..];
    // An oversized value stays as it is, so the bound refuses it by its real size.
    if raw.len() < COMPRESS_FROM || raw.len() > MAX_VALUE_BYTES {
        return plain;
    }
    let mut packed = vec![0u8; 5 + lz4_flex::block::get_maximum_output_size(raw.len())];
    packed[0] = FORMAT_LZ4;
    packed[1..5].copy_from_slice(&(raw.len() as u32).to_le_bytes());
    match lz4_flex::block::compress_into(raw, &mut packed[5..]) {
        Ok(n) if 5 + n < plain.len() => {
            packed.truncate(5 + n);
            packed
        }
        _ => plain,
    }
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
}
