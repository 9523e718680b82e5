//! Writing the message list to send: pieces (the client's own bytes, wire messages, messages held as
//! JSON text) joined into each API's list.

use super::*;

pub(crate) fn put(out: &mut Vec<u8>, v: &impl serde::Serialize) {
    serde_json::to_writer(&mut *out, v).expect("JSON of a value");
}

/// A piece of the message list to send: elements written exactly as the client sent them, or a message.
#[derive(Debug, Clone)]
pub enum Piece<'a> {
    /// List elements as the client wrote them (a whole unit, unchanged): their ranges in the body.
    Raw(&'a [u8], &'a [std::ops::Range<usize>]),
    /// A message in wire form (boxed: a list of many small unchanged units holds a piece each).
    Msg(Box<OutMessage<'a>>),
    /// A message in wire form held as JSON text (written as the same message in values would be); shared,
    /// as serve keeps what it wrote for a rendered message from one request to the next.
    Written(std::sync::Arc<Written>),
}

impl<'a> Piece<'a> {
    /// The wire role of a message piece, when the API has one per message.
    fn role(&self) -> Option<&str> {
        match self {
            Piece::Msg(m) => m.role(),
            Piece::Written(w) => w.role(),
            Piece::Raw(..) => None,
        }
    }

    /// The message of a message piece as values, to change (a written one is read back first).
    pub fn message_mut(&mut self) -> Option<&mut OutMessage<'a>> {
        if let Piece::Written(w) = self {
            *self = Piece::Msg(Box::new(w.expand()));
        }
        match self {
            Piece::Msg(m) => Some(m),
            _ => None,
        }
    }
}

/// A part of a message piece: a value, or the JSON text of one.
pub(crate) enum Part<'v> {
    Value(&'v Value),
    Text(&'v RawValue),
}

impl Part<'_> {
    /// Whether the part is a plain string (a client's `content` string) rather than a block: a JSON
    /// string's text starts with its quote, so the text is not read.
    fn is_string(&self) -> bool {
        match self {
            Part::Value(v) => v.is_string(),
            Part::Text(t) => t.get().starts_with('"'),
        }
    }

    /// The part's string, when it [is one](Part::is_string).
    fn string(&self) -> Option<Cow<'_, str>> {
        match self {
            Part::Value(Value::String(s)) => Some(Cow::Borrowed(s)),
            Part::Value(_) => None,
            Part::Text(t) => t.get().starts_with('"').then(|| serde_json::from_str(t.get()).ok()).flatten().map(Cow::Owned),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Part::Value(v) => put(out, v),
            Part::Text(t) => out.extend_from_slice(t.get().as_bytes()),
        }
    }
}

/// Writes the wire message list of `api` as JSON: the system prefix, then the pieces in order. For
/// Anthropic and Gemini, adjacent messages of one role (user, assistant or model) are merged into one, as
/// Anthropic requires and Gemini expects of a model's calls' responses;
/// raw pieces are written as they are. Chat and Responses take every message as it is.
pub fn write_list(api: Api, system: &[&[u8]], pieces: &[Piece<'_>], headroom: usize) -> Vec<u8> {
    let size: usize = system.iter().map(|s| s.len() + 1).sum::<usize>()
        + pieces
            .iter()
            .map(|p| match p {
                Piece::Raw(_, items) => items.iter().map(|i| i.len() + 1).sum(),
                Piece::Msg(_) => 512,
                Piece::Written(w) => w.envelope.get().len() + w.parts.iter().map(|p| p.get().len() + 1).sum::<usize>() + 16,
            })
            .sum::<usize>();
    let mut out = Vec::with_capacity(size + 16 + headroom);
    out.push(b'[');
    let mut first = true;
    let mut sep = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    for v in system {
        sep(&mut out);
        out.extend_from_slice(v);
    }
    let mut i = 0;
    while i < pieces.len() {
        match &pieces[i] {
            Piece::Raw(buf, items) => {
                for it in *items {
                    sep(&mut out);
                    out.extend_from_slice(&buf[it.clone()]);
                }
                i += 1;
            }
            first @ (Piece::Msg(_) | Piece::Written(_)) if matches!(api, Api::Anthropic | Api::Gemini) => {
                let role = first.role();
                let mut j = i + 1;
                while j < pieces.len()
                    && !matches!(pieces[j], Piece::Raw(..))
                    && pieces[j].role() == role
                    && matches!(role, Some("user" | "assistant" | "model"))
                {
                    j += 1;
                }
                sep(&mut out);
                out.push(b'{');
                match first {
                    Piece::Written(w) => {
                        // `{"k":v,...}`: its fields, each followed by a comma as below.
                        let fields = w.envelope.get();
                        let fields = &fields[1..fields.len() - 1];
                        if !fields.is_empty() {
                            out.extend_from_slice(fields.as_bytes());
                            out.push(b',');
                        }
                    }
                    Piece::Msg(m) => {
                        for (k, v) in m.envelope.iter() {
                            put(&mut out, k);
                            out.push(b':');
                            put(&mut out, v);
                            out.push(b',');
                        }
                    }
                    Piece::Raw(..) => {}
                }
                out.extend_from_slice(if api == Api::Gemini { b"\"parts\":" } else { b"\"content\":" });
                let parts: Vec<Part<'_>> = pieces[i..j]
                    .iter()
                    .flat_map(|p| match p {
                        Piece::Msg(g) => g.parts.iter().map(Part::Value).collect::<Vec<_>>(),
                        Piece::Written(w) => w.parts.iter().map(|t| Part::Text(t)).collect(),
                        Piece::Raw(..) => Vec::new(),
                    })
                    .collect();
                match parts.as_slice() {
                    // One string stays a string; merged, each string is a text block.
                    [p] if p.is_string() => p.write(&mut out),
                    _ => {
                        out.push(b'[');
                        for (k, p) in parts.iter().enumerate() {
                            if k > 0 {
                                out.push(b',');
                            }
                            match p.string() {
                                Some(s) => put(&mut out, &json!({"type": "text", "text": s})),
                                None => p.write(&mut out),
                            }
                        }
                        out.push(b']');
                    }
                }
                out.push(b'}');
                i = j;
            }
            Piece::Msg(m) => {
                for p in m.parts.iter() {
                    sep(&mut out);
                    put(&mut out, p);
                }
                i += 1;
            }
            Piece::Written(w) => {
                for p in &w.parts {
                    sep(&mut out);
                    out.extend_from_slice(p.get().as_bytes());
                }
                i += 1;
            }
        }
    }
    out.push(b']');
    out
}

/// The wire message list of `api` from the messages of a context, as values (see [`write_list`]).
pub fn assemble(api: Api, messages: Vec<OutMessage<'_>>) -> Vec<Value> {
    let pieces: Vec<Piece<'_>> = messages.into_iter().map(|m| Piece::Msg(Box::new(m))).collect();
    serde_json::from_slice(&write_list(api, &[], &pieces, 0)).expect("a list just written")
}

/// Puts a `cache_control` value on the last block of an Anthropic wire message (a string content becomes
/// one text block).
pub fn mark_cache(message: &mut Value, control: &Value) {
    let content = match message.get_mut("content") {
        Some(c) => c,
        None => return,
    };
    if let Value::String(s) = content {
        *content = json!([{"type": "text", "text": s}]);
    }
    if let Some(Value::Object(last)) = content.as_array_mut().and_then(|a| a.last_mut()) {
        last.insert("cache_control".into(), control.clone());
    }
}
