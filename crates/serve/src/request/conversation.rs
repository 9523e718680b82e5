//! The conversation a request belongs to (by the client's id, else by its first prompt), opened or
//! created, and the engine's work on it: record what is new, prepare the context, write the upstream body.

use crate::state::{identities, ConvRef, State};
use crate::request::read::Req;
use crate::request::upstream::upstream_body;
use crate::api;
use crate::conv::{Built, Conv, ConvError, Recorded};
use crate::summary::Stop;
use condense_engine::{EngineError, Store};
use condense_events::Message;
use condense_formats::wire;
use serde_json::json;
use crate::state::Waiting;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Runs engine work for a conversation on a blocking thread, with the conversation locked.
pub(crate) async fn with_conv<R: Send + 'static>(conv: &ConvRef, f: impl FnOnce(&mut Conv) -> R + Send + 'static) -> R {
    let mut guard = conv.cell.clone().lock_owned().await;
    tokio::task::spawn_blocking(move || {
        let session = guard.session.clone();
        session.pinned(|| {
            let r = f(&mut guard);
            guard.mark_synced();
            r
        })
    })
    .await
    .expect("engine task")
}

/// The conversation a request belongs to: by the client's own id, else by its first user message.
pub(crate) async fn conv_for(st: &Arc<State>, req: &Req) -> Result<ConvRef, ConvError> {
    conv_lookup(st, req, true).await.map(|c| c.expect("created when missing"))
}

/// The conversation a request belongs to; `create` makes one when there is none.
pub(crate) async fn conv_lookup(st: &Arc<State>, req: &Req, create: bool) -> Result<Option<ConvRef>, ConvError> {
    let identity = identity(req)?;
    let mut convs = st.convs.lock().await;
    convs.tick += 1;
    let tick = convs.tick;
    if let Some((c, used)) = convs.open.get_mut(&identity) {
        *used = tick;
        return Ok(Some(c.clone()));
    }
    let mut known = st.names.lock().expect("names lock").get(&identity).cloned();
    if known.is_none() {
        // Another server on a shared store may have started this conversation since the names were read.
        let s2 = st.store.clone();
        let after = *st.scanned.lock().expect("scanned lock");
        let (found, upto) = tokio::task::spawn_blocking(move || identities(&s2, after)).await.expect("identity scan task")?;
        let mut names = st.names.lock().expect("names lock");
        names.extend(found);
        let mut scanned = st.scanned.lock().expect("scanned lock");
        *scanned = (*scanned).max(upto);
        known = names.get(&identity).cloned();
    }
    if known.is_none() && !create {
        return Ok(None);
    }
    if known.is_none() {
        if let Some(c) = continued(&mut convs, req, &identity, tick) {
            return Ok(Some(c));
        }
    }
    // The name comes from the first words the user typed, not from the host context ahead of them.
    let typed = if known.is_none() { first_typed(req)? } else { String::new() };
    let store = st.store.clone();
    let internal = req.internal.clone();
    let client = api::client_kind(req.api, &req.headers).to_string();
    let prune = st.cfg.file.raw.normalize();
    let id2 = identity.clone();
    let conv = tokio::task::spawn_blocking(move || -> Result<(Conv, String), EngineError> {
        match known {
            Some(name) => Ok((Conv::open(store.session(&name)?, &internal)?, name)),
            None => match session_name(&store, &client, &typed, &id2)? {
                (name, true) => Ok((Conv::open(store.session(&name)?, &internal)?, name)),
                (name, false) => {
                    let session = store.create_session(&name)?;
                    Ok((Conv::create(session, &id2, &client, prune)?, name))
                }
            },
        }
    })
    .await
    .expect("session task")?;
    st.names.lock().expect("names lock").insert(identity.clone(), conv.1);
    let mut opened = conv.0;
    if let Some(p) = convs.parked.remove(&identity) {
        opened.restore(p);
    }
    let c = Arc::new(crate::state::ConvCell::new(opened, key_fingerprint(&req.headers)));
    convs.open.insert(identity, (c.clone(), tick));
    close_idle(&mut convs, st.cfg.warm_bytes);
    Ok(Some(c))
}

/// An open conversation of the same credentials that a request of a new identity continues: one whose
/// earlier requests held at least three quarters of the request's units (three at least; conversations
/// that only share their replies' wording, "noted", "done", share far fewer), as when a client's own
/// context management rewrote the start of its history — its first prompt, which the identity is made
/// of (Gemini CLI 0.61 drops it from a resumed session's history once it masks old outputs). The
/// conversation is then open under the new identity only (in this process: a restart starts a new
/// session for it). Among several, the one that saw the most units, then the first identity, is taken.
fn continued(convs: &mut crate::state::Convs, req: &Req, identity: &str, tick: u64) -> Option<ConvRef> {
    let keys: Vec<u64> = req.raw.units.iter().map(|u| u.key).collect();
    if keys.len() < 4 {
        return None;
    }
    let fingerprint = key_fingerprint(&req.headers);
    let mut best: Option<(usize, String)> = None;
    for (id, (c, _)) in convs.open.iter() {
        if c.key != fingerprint {
            continue;
        }
        // A conversation a request is working on is not looked into (its units are changing).
        let Ok(conv) = c.cell.try_lock() else { continue };
        let seen = keys.iter().filter(|k| conv.knows_unit(**k)).count();
        if seen >= 3 && 4 * seen >= 3 * keys.len() && best.as_ref().is_none_or(|(n, _)| seen > *n) {
            best = Some((seen, id.clone()));
        }
    }
    let (_, old) = best?;
    let (c, _) = convs.open.remove(&old)?;
    convs.open.insert(identity.to_string(), (c.clone(), tick));
    Some(c)
}

/// Closes the least recently used conversations no request holds while the open ones weigh more than
/// `bound` together ([`Conv::weight`]), keeping what their status shows ([`crate::conv::Parked`]); one
/// that comes back is opened again from the log. Checked when a conversation is opened, with what each
/// weighs then; the one just opened is held, so it stays.
fn close_idle(convs: &mut crate::state::Convs, bound: u64) {
    // A conversation a request holds is locked, or about to be: it weighs when it is idle again.
    let entries = convs.open.iter().map(|(id, (c, used))| (*used, id.clone(), c.try_lock().ok().map(|g| g.weight()), Arc::strong_count(c) == 1));
    for id in condense_engine::least_recently_used(entries, usize::MAX, bound) {
        let Some((c, _)) = convs.open.remove(&id) else { continue };
        // Nothing else holds it (clones are taken under the lock this holds), so it unwraps.
        if let Some(m) = Arc::try_unwrap(c).ok().and_then(|c| Arc::try_unwrap(c.cell).ok()) {
            convs.parked.insert(id, m.into_inner().park());
        }
    }
}

/// A conversation's identity. Two conversations are one only when they share what another user cannot
/// send: the fingerprint of the API key (see [`key_fingerprint`]) with the client's own conversation id,
/// or, when the client sends none, with the system prompt (its digits masked: hosts put the date there),
/// the names of the tools and the first prompt (issue 35).
fn identity(req: &Req) -> Result<String, wire::WireError> {
    let key = key_fingerprint(&req.headers);
    if let Some(id) = api::client_conversation_id(&req.headers, &json!({"metadata": req.metadata})) {
        return Ok(format!("{id}#{key}"));
    }
    let first_prompt = match req.raw.units.iter().position(|u| u.role() == "user") {
        Some(u) => wire::unit_messages(req.api, &req.raw, u)?.iter().find(|m| matches!(m, Message::User { .. })).map(Message::text).unwrap_or_default(),
        None => String::new(),
    };
    let mut system = String::new();
    let declared = req.fields.iter().filter(|(k, _)| k == "system" || k == "instructions" || k == "systemInstruction").map(|(_, r)| &req.raw.buf[r.clone()]);
    for bytes in declared.chain(req.raw.items[..req.raw.system].iter().map(|r| &req.raw.buf[r.clone()])) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            texts_of(&v, &mut system);
        }
    }
    let mut tools = req.internal.client_tools.clone();
    tools.sort();
    let mut h = blake3::Hasher::new();
    for part in [key.as_str(), &mask_digits(&system), &tools.join("\n"), &first_prompt] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    Ok(format!("{}:first:{}", req.api.name(), &h.finalize().to_hex()[..24]))
}


/// A keyed BLAKE3 hash (64 bits, hex) of the request's credential headers: it tells users apart and is
/// never the key (an API key's entropy makes it irreversible; the key of the hash keeps it from matching
/// a plain hash of the key elsewhere). Empty credentials have a fingerprint too.
fn key_fingerprint(headers: &axum::http::HeaderMap) -> String {
    let key = blake3::derive_key("condense serve 2026-12 conversation identity: API key fingerprint", b"condense");
    let mut h = blake3::Hasher::new_keyed(&key);
    crate::api::credential_bytes(headers, |b| {
        h.update(b);
    });
    h.finalize().to_hex()[..16].to_string()
}

/// Every text of a system prompt in its JSON form: strings, and the `text`/`content` strings of its
/// blocks (cache marks and other fields left out, so a moved mark does not change it).
fn texts_of(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| texts_of(i, out)),
        serde_json::Value::Object(o) => ["text", "content"].iter().filter_map(|k| o.get(*k)).for_each(|i| texts_of(i, out)),
        _ => {}
    }
}

/// `s` with each run of ASCII digits replaced by `#`.
fn mask_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What the user typed in the request's first prompt (see [`Message::typed_text`]); empty when no user
/// message of the request holds typed words.
fn first_typed(req: &Req) -> Result<String, wire::WireError> {
    for (u, unit) in req.raw.units.iter().enumerate() {
        if unit.role() != "user" {
            continue;
        }
        let messages = wire::unit_messages(req.api, &req.raw, u)?;
        if let Some(t) = messages.iter().map(Message::typed_text).find(|t| !t.trim().is_empty()) {
            return Ok(t);
        }
    }
    Ok(String::new())
}

/// A name a person recognises: the client, the first words the user typed, and a short id.
fn session_name(store: &Store, client: &str, typed: &str, identity: &str) -> Result<(String, bool), EngineError> {
    let mut slug = String::new();
    for word in typed.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).take(6) {
        if slug.len() + word.len() > 40 {
            break;
        }
        if !slug.is_empty() {
            slug.push('-');
        }
        slug.push_str(&word.to_lowercase());
    }
    if slug.is_empty() {
        slug.push_str("session");
    }
    let id = &blake3::hash(identity.as_bytes()).to_hex()[..8];
    let base = format!("{client}/{slug}/{id}");
    let mut name = base.clone();
    let mut n = 2;
    while let Some(id) = store.log().session_id(&name)? {
        // A session of this name with nothing written yet is being started by another server on the same
        // database, for this very conversation (the name holds its identity's hash): this request is
        // answered 503 with `retry-after`, and the retry finds that session (issue 62: a retry that came
        // first started a second session for the one conversation).
        if store.log().head(id)? == 0 {
            return Err(EngineError::Log(condense_log::LogError::SessionExists(name)));
        }
        // Started since this server read the names, for this conversation: it is taken up, not doubled.
        if crate::state::identity_of(store, id)?.as_deref() == Some(identity) {
            return Ok((name, true));
        }
        name = format!("{base}-{n}");
        n += 1;
    }
    Ok((name, false))
}

/// What preparing a request gave: the request recorded, the context built, the upstream body, the
/// time spent waiting for the conversation, recording, building and writing the body, and the
/// conversation's ledger.
type Prepared = (Recorded, Built, Vec<u8>, [std::time::Duration; 4], Arc<crate::billing::Ledger>, condense_events::SessionId, crate::conv::Sent);

/// Records the request in its conversation, prepares the context and writes the upstream body, on a
/// blocking thread with the conversation locked.
///
/// When the session's head moved in the store while the request was recorded (a restart of PostgreSQL
/// lost an event not yet durable, or another server appended), the append is refused as stale and
/// nothing of it is written: the request is then prepared once more, on the session folded again from
/// the store, instead of failing (it was a 500 `append expected head …`).
pub(crate) async fn prepare(st: &State, conv: &ConvRef, req: &Req) -> Result<Prepared, ConvError> {
    match prepare_once(st, conv, req).await {
        Err(ConvError::Engine(EngineError::Log(condense_log::LogError::HeadMismatch { .. }))) => prepare_once(st, conv, req).await,
        other => other,
    }
}

/// [`prepare`] once.
async fn prepare_once(st: &State, conv: &ConvRef, req: &Req) -> Result<Prepared, ConvError> {
    let api = req.api;
    let queued = std::time::Instant::now();
    let model = req.model.clone();
    let limits = st.model_limits(&model);
    let (raw, internal, overhead) = (req.raw.clone(), req.internal.clone(), req.overhead);
    let fields = req.fields.clone();
    let cache_ttl = st.cfg.cache_ttl;
    // Abortable (seeds 001 and 004): a summary or handoff this preparation writes through the upstream
    // stops, committing nothing, when the client gives the request up or a newer request of the
    // conversation (new owner input) waits behind it.
    let items = raw.items.len();
    let (stop, _abandoned) = stop_for(&conv.waiting, items);
    let queued_here = Queued::new(&conv.waiting, items);
    with_conv(conv, move |c| -> Result<Prepared, ConvError> {
        drop(queued_here);
        let t0 = std::time::Instant::now();
        let wait = t0 - queued;
        let rec = c.record_request(api, &raw, &model, limits, overhead, &internal)?;
        let t1 = std::time::Instant::now();
        let cold = c.cache_cold(cache_ttl);
        let mut built = c.build(api, &raw, &rec, &internal, stop.clone(), cold)?;
        let t2 = std::time::Instant::now();
        let (mut body, mut list_at) = upstream_body(api, &raw.buf, &fields, &mut built);
        let t3 = std::time::Instant::now();
        // The payload guard after a model change, on the bytes about to be sent: an oversized request is
        // recorded as an overflow and prepared once more (recovery).
        match c.session.guard_payload(body.len() as u64) {
            Ok(()) => {}
            Err(EngineError::ContextOverflow { .. }) => {
                built = c.build(api, &raw, &rec, &internal, stop, cold)?;
                (body, list_at) = upstream_body(api, &raw.buf, &fields, &mut built);
            }
            Err(e) => return Err(e.into()),
        }
        // Counted once prepared: a request prepared a second time (above) is one request.
        c.figures.requests += 1;
        // What the dashboard shows of this request: the conversation's figures, and how much of the
        // previous request's message list this one kept (a cache break when not all of it).
        let sent = c.note_sent(api, &body[list_at], limits.map(|l| l.context_window));
        Ok((rec, built, body, [wait, t1 - t0, t2 - t1, t3 - t2], c.ledger.clone(), c.session.id(), sent))
    })
    .await
}

/// A request waiting for its conversation, with the messages its list holds (in [`Waiting`] from before
/// it waits until it holds the conversation, or until it is given up).
struct Queued(Arc<Mutex<Waiting>>, u64);

impl Queued {
    fn new(waiting: &Arc<Mutex<Waiting>>, items: usize) -> Queued {
        let mut w = waiting.lock().expect("waiting lock");
        let ticket = w.next;
        w.next += 1;
        w.items.insert(ticket, items);
        Queued(waiting.clone(), ticket)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.lock().expect("waiting lock").items.remove(&self.1);
    }
}

/// Sets its stop's flag when dropped: held by the request's future across the preparation, it is dropped
/// early only when the client gives the request up (once the preparation ended, the flag reaches nobody).
pub(crate) struct Abandoned(Arc<AtomicBool>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A stop for one preparation, of a request whose list holds `items` messages, of a conversation whose
/// waiting requests `waiting` holds; and what sets it when the request is given up. New owner input is a
/// waiting request with more messages: a client's retry of the same request, or a side request of the
/// same conversation (a title, a count), holds no more, and stopping for those would let two requests stop
/// each other in turn.
pub(crate) fn stop_for(waiting: &Arc<Mutex<Waiting>>, items: usize) -> (Stop, Abandoned) {
    let flag = Arc::new(AtomicBool::new(false));
    let (gone, waiting) = (flag.clone(), waiting.clone());
    let stop: Stop = Arc::new(move || {
        if gone.load(Ordering::SeqCst) {
            Some("the client gave the request up".to_string())
        } else if waiting.lock().expect("waiting lock").items.values().any(|n| *n > items) {
            Some("a newer request of this conversation arrived (new owner input)".to_string())
        } else {
            None
        }
    });
    (stop, Abandoned(flag))
}
