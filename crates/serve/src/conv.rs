//! One client conversation and its condense session: recording what a request adds, preparing the
//! context, building the wire messages to send, recording the reply and answering condense's own tools.
//! Everything here is synchronous engine work; the server runs it on blocking threads, one request of a
//! conversation at a time.

use crate::track::Track;
use condense_engine::accounts::{Accounts, Models};
use condense_engine::simulate::Prices;
use condense_engine::config::ModelLimits;
use condense_engine::{tools, EngineError, Session};
use condense_events::{Block, Entry, Message, PruneConfig, SourceEvent, Usage, UserOrigin};
use condense_formats::wire::{self, Api, OutMessage, Piece, RawRequest, WireRequest};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Whether a tool name is one of condense's own (and the client has no tool of that name), and which of
/// them serve declared to the provider for this request.
#[derive(Debug, Clone, Default)]
pub struct Internal {
    /// Tool names the client itself declared: condense never intercepts those.
    pub client_tools: Vec<String>,
    /// The tools serve declared in this request's rounds so far (each build adds its own).
    pub declared: Arc<std::sync::Mutex<BTreeSet<&'static str>>>,
    /// How this request's summaries reach the upstream (`None`: the store's summarizer).
    pub summary: Option<crate::summary::Route>,
}

impl Internal {
    /// Whether a call of `name` in the history is condense's (the client has no tool of that name).
    pub fn is(&self, name: &str) -> bool {
        tools::is_condense_tool(name) && !self.client_tools.iter().any(|t| t == name)
    }

    /// Whether serve answers a call of `name` in a reply: one of condense's tools that serve declared to
    /// the provider in this request. A call of one it did not declare (a history tool before any
    /// archive exists) goes to the client as the model made it, and nothing is read from the log.
    pub fn answers(&self, name: &str) -> bool {
        self.is(name) && self.declared.lock().expect("declared lock").contains(name)
    }

    fn declare(&self, tools: &[&tools::ToolDef]) {
        self.declared.lock().expect("declared lock").extend(tools.iter().map(|t| t.name));
    }
}

/// A conversation: its session and the client's view of it.
pub struct Conv {
    /// The session.
    pub session: Session,
    track: Track,
    next_entry: u64,
    /// Counters shown by `/condense/status`, as of the last request.
    pub figures: ConvFigures,
    /// The cache-priced cost of what was sent upstream and of what the client sent.
    pub ledger: Arc<crate::billing::Ledger>,
    /// Units seen before, by key: the exact keys of the messages each holds (see [`wire::Unit`]). Looked
    /// up only, never iterated.
    units: rustc_hash::FxHashMap<u64, UnitKeys>,
    /// The session's head when this process last finished working on it: a head past it means another
    /// process (a second server on a shared PostgreSQL store) appended since.
    synced: Option<condense_events::Seq>,
    /// A hash of each message of the list last sent upstream (for the dashboard's cache breaks).
    sent: Vec<u64>,
    /// The model the history was written by: the session's model before its last change (or the current
    /// one, before any change). Summaries through the upstream ask it.
    native_model: Option<String>,
    /// The messages of the last request's context written from the neutral model (stubs, chains,
    /// summaries), by the address of the rendered message they were written for.
    written: WrittenCache,
    /// When this process last prepared a client request of the conversation (whether the provider's
    /// cache can still hold its prefix; never written to the log).
    last_request: Option<std::time::Instant>,
    /// What each decision cost and saved since this process took the conversation up (the decisions after
    /// the head it found; those before are not accounted).
    pub accounts: Accounts,
}

/// The prices decisions are accounted at in serve: `simulate`'s units per estimated token (the cache's
/// lifetime is serve's own `--cache-ttl`, applied to each request as it comes).
const ACCOUNT_PRICES: Prices = Prices { cached: 0.1, uncached: 1.25, cache_ttl: None };

/// What [`Conv::weight`] counts for each decision's account.
const ACCOUNT_WEIGHT: u64 = 200;

impl Conv {
    /// Whether a unit of this key was seen in an earlier request.
    pub fn knows_unit(&self, key: u64) -> bool {
        self.units.contains_key(&key)
    }

    /// Whether the provider's cache holds nothing of the conversation any more: its last request in this
    /// process was longer than `ttl` ago (`None`: the cache never expires). Then noted as the last request.
    /// A conversation this process has not served yet (a restart) counts as warm.
    pub fn cache_cold(&mut self, ttl: Option<std::time::Duration>) -> bool {
        let now = std::time::Instant::now();
        let cold = matches!((ttl, self.last_request), (Some(ttl), Some(at)) if now.duration_since(at) > ttl);
        self.last_request = Some(now);
        cold
    }
}

/// The wire JSON of rendered messages written from the neutral model, kept from one request to the next:
/// a pruned message renders as the same `Arc` request after request, and writing it again (a JSON tree,
/// then text) took a third of a 1,000-message request's preparation. Each entry holds the message it was
/// written for, so an address is never taken for another message's; only the entries a request used stay.
/// Looked up only, never iterated: what is written does not depend on the map's order.
#[derive(Default)]
struct WrittenCache {
    api: Option<Api>,
    map: rustc_hash::FxHashMap<usize, (Arc<Message>, Option<Arc<wire::Written>>)>,
    /// The bytes of JSON the entries hold (their weight).
    bytes: u64,
}

impl WrittenCache {
    /// Message `m` written for `api`, from the cache when it holds it; `next` keeps what this request used
    /// (`None` for a request that leaves nothing to the next, a dry run).
    fn get(&self, api: Api, m: &Arc<Message>, next: Option<&mut WrittenCache>) -> Option<Arc<wire::Written>> {
        let at = Arc::as_ptr(m) as usize;
        let hit = (self.api == Some(api)).then(|| self.map.get(&at)).flatten().filter(|(held, _)| Arc::ptr_eq(held, m));
        let w = match hit {
            Some((_, w)) => w.clone(),
            None => wire::from_neutral(api, m).map(|o| Arc::new(o.written())),
        };
        if let Some(next) = next {
            next.api = Some(api);
            next.bytes += w.as_ref().map_or(0, |w| w.len() as u64);
            next.map.insert(at, (m.clone(), w.clone()));
        }
        w
    }
}

/// What serve keeps of a conversation it closed to bound its memory: what its status shows, its bill and
/// the model its history was written by. The rest (the client's view, the units seen) is folded again from
/// the log when the conversation comes back.
pub struct Parked {
    /// Its figures.
    pub figures: ConvFigures,
    /// Its cache-priced cost.
    pub ledger: Arc<crate::billing::Ledger>,
    native_model: Option<String>,
    last_request: Option<std::time::Instant>,
    /// Its decisions' accounts.
    pub accounts: Accounts,
    /// Its session.
    pub session: condense_events::SessionId,
}

/// What [`Conv::weight`] counts for each message of the client's view: its node, entry id and index
/// entry (~130 bytes), the key of the unit it came in and its hash in the list last sent.
pub const VIEW_WEIGHT: u64 = 160;

/// What [`Conv::weight`] counts for each message of [`WrittenCache`] besides its JSON: its map entry and
/// the written message's own allocations.
const WRITTEN_WEIGHT: u64 = 96;

/// What `/condense/status` shows of one conversation.
#[derive(Debug, Clone, Default)]
pub struct ConvFigures {
    /// Requests served.
    pub requests: u64,
    /// Outputs rendered as stubs (summaries and spills).
    pub stubs: u64,
    /// Chains compressed into blocks.
    pub chains: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Recovery handoffs prepared (seed 004).
    pub recoveries: u64,
}

/// What a request's preparation tells the dashboard: the conversation's figures after it, the model's
/// window, and how many leading messages of the previous request's list (`before` of them) it kept.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    /// The conversation's figures.
    pub figures: ConvFigures,
    /// The context window assumed for the request's model.
    pub window: Option<u64>,
    /// Leading messages identical to the previous request's.
    pub kept: usize,
    /// Messages of the previous request.
    pub before: usize,
}

/// What the units of a request (see [`wire::Unit`]) turned out to be: for each of their neutral messages,
/// the entry it stands for when the client's JSON can stand for it (`None` where serve's log holds more
/// than the client saw). One list for all units, unit after unit: a request of many small messages
/// held a list, and a copy of each id, per unit.
#[derive(Debug, Clone, Default)]
pub struct UnitEntries {
    /// Where each unit's entries start in `entries`, once the unit has begun; closed, one more than there
    /// are units (the last is the end).
    starts: Vec<u32>,
    entries: Vec<Option<Arc<str>>>,
}

impl UnitEntries {
    fn with_capacity(units: usize, messages: usize) -> UnitEntries {
        UnitEntries { starts: Vec::with_capacity(units + 1), entries: Vec::with_capacity(messages) }
    }

    /// Adds an entry to unit `u`: the last unit begun, or a later one (the units between begin empty).
    fn push(&mut self, u: usize, entry: Option<Arc<str>>) {
        self.begin(u);
        self.entries.push(entry);
    }

    /// Begins unit `u` and the units before it not begun yet.
    fn begin(&mut self, u: usize) {
        while self.starts.len() <= u {
            self.starts.push(self.entries.len() as u32);
        }
    }

    /// Takes back the entries of unit `u`, the last begun.
    fn clear(&mut self, u: usize) {
        self.entries.truncate(self.starts[u] as usize);
    }

    /// Ends the list after `units` units.
    fn close(&mut self, units: usize) {
        self.begin(units);
    }

    /// The entries of unit `u`, a unit begun.
    pub fn of(&self, u: usize) -> &[Option<Arc<str>>] {
        let end = self.starts.get(u + 1).map_or(self.entries.len(), |&e| e as usize);
        &self.entries[self.starts[u] as usize..end]
    }

    /// The number of units (of a closed list).
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Whether there are no units.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The exact keys of a unit's messages, as a conversation remembers them: most units are one message,
/// held without a list of its own.
#[derive(Debug, Clone)]
enum UnitKeys {
    One(u64),
    Many(Box<[u64]>),
}

impl UnitKeys {
    fn as_slice(&self) -> &[u64] {
        match self {
            UnitKeys::One(k) => std::slice::from_ref(k),
            UnitKeys::Many(keys) => keys,
        }
    }
}

impl From<&[u64]> for UnitKeys {
    fn from(keys: &[u64]) -> UnitKeys {
        match keys {
            [k] => UnitKeys::One(*k),
            _ => UnitKeys::Many(keys.into()),
        }
    }
}

/// The exact keys of the messages of the units a request read in full, in one list (a list of its own
/// for each unit took 48 bytes a unit besides its keys).
#[derive(Default)]
struct ReadKeys {
    /// Each unit read, and where its keys start in `keys`.
    units: Vec<(usize, usize)>,
    keys: Vec<u64>,
}

impl ReadKeys {
    /// Each unit read, with its keys.
    fn iter(&self) -> impl Iterator<Item = (usize, &[u64])> {
        let ends = self.units.iter().skip(1).map(|&(_, at)| at).chain([self.keys.len()]);
        self.units.iter().zip(ends).map(|(&(u, from), to)| (u, &self.keys[from..to]))
    }
}

/// How a request's units match the session, before anything is recorded.
struct Planned {
    /// What each unit stands for so far (the new messages have no entries yet; not closed).
    units: UnitEntries,
    /// The exact keys of the messages of each unit read in full (a unit matched by its key is not read at
    /// all): taken into the client's view once the request is recorded. The parsed unit itself is not
    /// kept; the render reads again the few units it sends message by message.
    keys: ReadKeys,
    /// The visible node the history last matched.
    cur: Option<usize>,
    /// The new messages, with the unit each came from.
    new: Vec<(usize, Message)>,
    tokens_in: u64,
}

/// Where a request's messages went in the log.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Per unit of the request (shared by the request's rounds, read only).
    pub units: Arc<UnitEntries>,
    /// The entry the reply follows.
    pub last: Option<String>,
    /// Tokens of the client's messages (pi's estimate).
    pub tokens_in: u64,
}

/// The messages and tools to send upstream.
#[derive(Debug, Clone)]
pub struct Built {
    /// The message list in the API's wire form, as JSON (the system prefix included).
    pub list: Vec<u8>,
    /// condense's tools the context needs, in the API's wire form, as JSON (written once: the body, its
    /// room and its token count read it).
    pub tools: Vec<String>,
    /// Tokens of the rendered context (pi's estimate).
    pub tokens_sent: u64,
}

impl Built {
    /// Tokens of the whole upstream request: the rendered context, the client's own system prompt and
    /// tool declarations (`overhead`), and condense's tool declarations (chars / 4 of their JSON).
    pub fn request_tokens(&self, overhead: u64) -> u64 {
        self.tokens_sent + overhead + self.tools.iter().map(|t| (t.len() as u64).div_ceil(4)).sum::<u64>()
    }
}

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    /// The engine failed (or refused: no checkpoint fits).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A message of the request cannot be read.
    #[error(transparent)]
    Wire(#[from] wire::WireError),
}

/// An error of the engine while serving a request.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Adds entry `id`, which serve has just appended, to the client's view `track` as the projection `p`
/// holds it (its place, its parent's, and its message); `exact` when it was recorded from the client's
/// message. Returns the projection's copy of the id, which the view shares.
fn add_appended<'p>(track: &mut Track, p: &'p condense_render::Projection, id: &str, internal: &dyn Fn(&str) -> bool, exact: bool) -> Result<&'p Arc<str>> {
    let (at, (shared, m)) = p
        .position(id)
        .and_then(|at| Some((at, p.entry_at(at)?)))
        .ok_or_else(|| EngineError::Pipeline { name: "serve".into(), reason: format!("entry {id} was appended and is not in the session") })?;
    track.add(at, shared.clone(), p.parent_position(at), m, internal, exact.then(|| crate::track::exact(m)));
    Ok(shared)
}

/// The client's view of `session` folded from the log, and how many entries it holds.
fn client_view(session: &Session, internal: &Internal) -> Result<(Track, u64)> {
    session.with_projection(|p| (Track::build(p, &|n| internal.is(n)), p.entries() as u64))
}

impl Conv {
    /// Opens the conversation over `session`, folding the client's view from what it holds.
    pub fn open(session: Session, internal: &Internal) -> Result<Conv> {
        let (track, entries) = client_view(&session, internal)?;
        let head = session.head()?;
        let synced = Some(head);
        Ok(Conv { session, track, next_entry: entries + 1, figures: ConvFigures::default(), ledger: Arc::default(), units: Default::default(), synced, sent: Vec::new(), native_model: None, written: WrittenCache::default(), last_request: None, accounts: Accounts::new(ACCOUNT_PRICES, Models::default(), head) })
    }

    /// Starts a new session for a conversation.
    pub fn create(session: Session, identity: &str, client: &str, prune: PruneConfig) -> Result<Conv> {
        let mut events = vec![SourceEvent::SessionStarted { source: format!("serve:{client}"), source_id: Some(identity.to_string()), cwd: None, timestamp: None }];
        events.extend(SourceEvent::configured(prune));
        session.append(events)?;
        let head = session.head()?;
        let synced = Some(head);
        Ok(Conv { session, track: Track::default(), next_entry: 1, figures: ConvFigures::default(), ledger: Arc::default(), units: Default::default(), synced, sent: Vec::new(), native_model: None, written: WrittenCache::default(), last_request: None, accounts: Accounts::new(ACCOUNT_PRICES, Models::default(), head) })
    }

    /// Takes in what other processes appended since this one last worked on the session: the client's view
    /// is folded again from the log (the projection catches up as it is read).
    fn follow_log(&mut self, internal: &Internal) -> Result<()> {
        let head = self.session.head()?;
        if self.synced.is_some_and(|s| s != head) {
            self.refold(internal)?;
        }
        Ok(())
    }

    /// Folds the client's view again from what the log holds.
    fn refold(&mut self, internal: &Internal) -> Result<()> {
        let (track, entries) = client_view(&self.session, internal)?;
        self.track = track;
        self.next_entry = entries + 1;
        Ok(())
    }

    /// Appends events that chain new entries onto the client's view. When the store lost the entry they
    /// chain onto (a PostgreSQL crash took commits not yet durable), nothing is written, the client's view
    /// is folded again from what the store holds, and the error asks for the request again: the client's
    /// retry then records what was lost. Appending anyway would start a second root under the session.
    fn append_entries(&mut self, events: Vec<SourceEvent>, internal: &Internal) -> Result<condense_events::Seq> {
        let appended = self.session.append_continuing(events);
        self.appended(appended, internal)
    }

    /// What [`Conv::append_entries`] does with the outcome of an append.
    fn appended(&mut self, appended: Result<condense_events::Seq>, internal: &Internal) -> Result<condense_events::Seq> {
        match appended {
            Err(e @ EngineError::ParentLost { .. }) => {
                self.refold(internal)?;
                self.units.clear();
                Err(e)
            }
            other => other,
        }
    }

    /// Notes the session's head as this process leaves it (see [`Conv::record_request`]).
    pub fn mark_synced(&mut self) {
        self.synced = self.session.head().ok();
    }

    fn next_id(&mut self, p: &condense_render::Projection) -> String {
        loop {
            let id = format!("e{}", self.next_entry);
            self.next_entry += 1;
            if !p.has_entry(&id) {
                return id;
            }
        }
    }

    /// Records what the request adds: a model change, the messages after the part of the history the
    /// session holds (a branch move when the history left the recorded branch), or only a move of the leaf
    /// when the request repeats a recorded history (a retry).
    ///
    /// Units the conversation has seen before, byte for byte, are matched by their key without being read;
    /// the first unit that is new or different is read in full, and so is everything after it.
    /// `overhead` is what the request carries besides its conversation (system prompt, instructions, tool
    /// declarations), in estimated tokens; it is recorded when it changes.
    pub fn record_request(
        &mut self,
        api: Api,
        raw: &RawRequest,
        model: &str,
        limits: Option<ModelLimits>,
        overhead: u64,
        internal: &Internal,
    ) -> std::result::Result<Recorded, ConvError> {
        self.follow_log(internal)?;
        let is = |n: &str| internal.is(n);
        let Planned { mut units, keys, cur, new, mut tokens_in } = self.match_units(api, raw, internal)?;
        tokens_in += new.iter().map(|(_, m)| condense_tokens::estimate(m)).sum::<u64>();
        let matched_parent = cur.map(|n| self.track.tail(n).to_string());
        let session = self.session.clone();
        let (leaf, model_changed, ids, overhead_changed, failed_before, before) = session.with_projection(|p| {
            let changed = match p.model() {
                Some(m) => m.model != model || m.context_window != limits.map(|l| l.context_window),
                None => true,
            };
            let ids: Vec<String> = new.iter().map(|_| self.next_id(p)).collect();
            (p.leaf_id().map(str::to_string), changed, ids, p.request_overhead() != overhead, p.overflow_unresolved(), p.model().map(|m| m.model.clone()))
        })?;
        // The native model: the one before a change of model, else the model in use.
        match before {
            Some(b) if b != model => self.native_model = Some(b),
            _ if self.native_model.is_none() => self.native_model = Some(model.to_string()),
            _ => {}
        }
        let mut events = Vec::new();
        if failed_before {
            // The last request ended in CONTEXT_COMPACTION_FAILED after provider overflows: this one is the
            // client's new attempt, with a checkpoint and a retry of its own.
            events.push(SourceEvent::RequestRetried);
        }
        if overhead_changed {
            events.push(SourceEvent::RequestOverhead { tokens: overhead });
        }
        if model_changed {
            events.push(SourceEvent::ModelChanged {
                provider: None,
                model: model.to_string(),
                context_window: limits.map(|l| l.context_window),
                max_output: limits.and_then(|l| l.max_output),
            });
        }
        if new.is_empty() && leaf != matched_parent {
            events.push(SourceEvent::LeafMoved { leaf: matched_parent.clone() });
        }
        // Each new message follows the one before it, the first the matched history (`append_chain`).
        // The messages move into their events as the log writes them (a request of many small messages
        // held each twice, and then its list of events); the client's view takes them from the projection
        // once the log has them.
        let unit_of: Vec<usize> = new.iter().map(|(u, _)| *u).collect();
        if !events.is_empty() || !new.is_empty() {
            // Given up as it is written: a list of 104 bytes a message stayed whole beside the projection
            // taking the messages in (`Shrinking`).
            let chained = condense_engine::Shrinking::new(new).zip(&ids).map(|((_, m), id)| (id.clone(), Entry::Message(m)));
            let appended = self.session.append_chain(events, matched_parent.clone(), chained);
            self.appended(appended, internal)?;
        }
        if !ids.is_empty() {
            let track = &mut self.track;
            track.reserve(ids.len());
            session.with_projection(|p| {
                for (id, &u) in ids.iter().zip(&unit_of) {
                    // The projection's copy of the id, shared by the client's view and the request's units.
                    units.push(u, Some(add_appended(track, p, id, &is, true)?.clone()));
                }
                Ok::<(), EngineError>(())
            })??;
        }
        units.close(raw.units.len());
        // Units read in full are remembered by key, so the next request matches them without reading.
        for (u, keys) in keys.iter() {
            if !raw.units[u].marked && keys.len() == units.of(u).len() {
                self.units.entry(raw.units[u].key).or_insert_with(|| UnitKeys::from(keys));
            }
        }
        let last = ids.last().cloned().or(matched_parent);
        Ok(Recorded { units: Arc::new(units), last, tokens_in })
    }

    /// Matches the request's units against the client's view of the session: what it holds of each unit,
    /// where the history leaves it, and the new messages (tool results named after their calls).
    fn match_units(&mut self, api: Api, raw: &RawRequest, internal: &Internal) -> std::result::Result<Planned, ConvError> {
        let is = |n: &str| internal.is(n);
        let mut cur: Option<usize> = None;
        let mut tokens_in = 0;
        let mut units = UnitEntries::with_capacity(raw.units.len(), raw.items.len());
        let mut read_keys = ReadKeys::default();
        // The first new message, as (unit, message within it).
        let mut diverged: Option<(usize, usize)> = None;
        let mut new: Vec<(usize, Message)> = Vec::new();
        for (u, unit) in raw.units.iter().enumerate() {
            if diverged.is_none() {
                units.begin(u);
            }
            if diverged.is_none() && !unit.marked {
                if let Some(keys) = self.units.get(&unit.key).map(UnitKeys::as_slice) {
                    let mut c = cur;
                    let mut toks = 0;
                    for k in keys {
                        match self.track.step_exact(c, *k) {
                            Some(n) => {
                                units.push(u, self.track.single_entry(n));
                                toks += self.track.tokens(n);
                                c = Some(n);
                            }
                            None => break,
                        }
                    }
                    if units.of(u).len() == keys.len() {
                        cur = c;
                        tokens_in += toks;
                        continue;
                    }
                    units.clear(u);
                }
            }
            let messages = wire::unit_messages(api, raw, u)?;
            let from_key = read_keys.keys.len();
            read_keys.units.push((u, from_key));
            read_keys.keys.extend(messages.iter().map(crate::track::exact));
            let keys = &read_keys.keys[from_key..];
            let mut from = 0;
            if diverged.is_none() {
                from = messages.len();
                for (j, m) in messages.iter().enumerate() {
                    match self.track.step(cur, keys[j], &mut || crate::track::Visible::of(m, &is).fp()) {
                        Some(n) => {
                            units.push(u, self.track.single_entry(n));
                            tokens_in += self.track.tokens(n);
                            cur = Some(n);
                        }
                        None => {
                            diverged = Some((u, j));
                            from = j;
                            // Every later message is new: room for them at once, not by doubling.
                            new.reserve(raw.items.len().saturating_sub(raw.units[u].start() + j));
                            break;
                        }
                    }
                }
            }
            // Everything from the first new message on is recorded, chained from the last matched one;
            // the unit's wire JSON was never kept (the render reads again what it sends message by message).
            new.extend(messages.into_iter().skip(from).map(|m| (u, m)));
        }
        // A tool result names its tool by the call it answers (in this request, or recorded before).
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        for (_, m) in new.iter_mut() {
            match m {
                Message::Assistant { .. } => {
                    for (id, name, _) in m.tool_calls() {
                        names.insert(id.to_string(), name.to_string());
                    }
                }
                Message::ToolResult { call_id, tool_name, .. } if tool_name.is_empty() => {
                    if let Some(n) = names.get(call_id).map(String::as_str).or_else(|| self.track.call_name(call_id)) {
                        *tool_name = n.to_string();
                    }
                }
                _ => {}
            }
        }
        Ok(Planned { units, keys: read_keys, cur, new, tokens_in })
    }

    /// Prepares the context (pruning, checkpoints, recovery, notices) and writes it in `api`'s wire form:
    /// a whole unit of the request that condense left unchanged goes out as the client wrote it, byte for
    /// byte; a client message of a unit that changed goes out as its own wire JSON; the rest is written
    /// from the neutral model. The client's `cache_control` marks go back on the messages they were on, or,
    /// for the last message, on the last message sent before any notice.
    pub fn build(&mut self, api: Api, raw: &RawRequest, rec: &Recorded, internal: &Internal, stop: crate::summary::Stop, cold: bool) -> Result<Built> {
        // Summaries and handoffs this preparation needs go through the upstream, asking the session's
        // native model (the one before the last model change) unless `--summary-model` names one; `stop`
        // says when the preparation must stop, committing nothing.
        let summarizer = internal.summary.as_ref().zip(self.native_model.as_deref()).map(|(route, native)| route.summarizer(native, Some(stop)));
        let session = self.session.clone();
        let mut written = WrittenCache::default();
        let cache = &self.written;
        self.accounts.set_models(Models { stubs: false, handoffs: internal.summary.is_some() });
        let accounts = &mut self.accounts;
        let prepare = || {
            self.session.prepare_then(|p, r| {
                // An account the log could not be read for is left out; the request goes on.
                let _ = session.account(accounts, p, &r.messages, cold);
                segments(api, rec, internal, p, &r.messages, cache, Some(&mut written))
            })
        };
        let seg = session.with_summarizer(summarizer, || session.with_cold_cache(cold, prepare))?;
        self.written = written;
        (self.figures.stubs, self.figures.checkpoints, self.figures.recoveries, self.figures.chains) = seg.figures;
        internal.declare(&seg.tools);
        write(api, raw, rec, seg).map_err(|e| EngineError::Pipeline { name: self.session.name().to_string(), reason: e.to_string() })
    }

    /// What `count_tokens` should count: the session's context as it stands with the request's new
    /// messages after it, in the request's wire form — a dry run that records nothing and makes no
    /// pipeline decision.
    pub fn dry_run(&mut self, api: Api, raw: &RawRequest, internal: &Internal) -> std::result::Result<Built, ConvError> {
        let Planned { mut units, cur, new, .. } = self.match_units(api, raw, internal)?;
        let mut p = self.session.projection()?;
        let mut parent = cur.map(|n| self.track.tail(n).to_string());
        let mut seq = p.seq();
        if new.is_empty() && p.leaf_id().map(str::to_string) != parent {
            seq += 1;
            p.apply(seq, &condense_events::Event::Source(SourceEvent::LeafMoved { leaf: parent.clone() }));
        }
        for (k, (u, m)) in new.into_iter().enumerate() {
            let id = format!("dry-run-{k}");
            seq += 1;
            p.apply(seq, &condense_events::Event::Source(SourceEvent::EntryAppended { id: id.clone(), parent: parent.clone(), entry: Entry::Message(m) }));
            units.push(u, Some(id.as_str().into()));
            parent = Some(id);
        }
        units.close(raw.units.len());
        let rec = Recorded { units: Arc::new(units), last: parent, tokens_in: 0 };
        let rendered = p.render();
        Ok(write(api, raw, &rec, segments(api, &rec, internal, &p, &rendered.messages, &self.written, None))?)
    }
}

/// Where a rendered message comes from.
enum Seg {
    /// Message `.1` of the request's unit `.0` (numbers of 32 bits: a segment per rendered message).
    Client(u32, u32),
    /// Written from the neutral model (`None`: nothing the API can carry), held as JSON text until the
    /// list is written.
    New(Option<Arc<wire::Written>>),
}

/// The rendered context mapped for writing (see [`segments`]).
struct Segments {
    segs: Vec<Seg>,
    /// Whether the context ends with a budget notice.
    notice: bool,
    /// condense's tools the context needs.
    tools: Vec<&'static tools::ToolDef>,
    /// Its tokens.
    tokens: u64,
    /// Stubs, checkpoints, recoveries, chains.
    figures: (u64, u64, u64, u64),
    /// After a checkpoint: the last message of what stays until the next one (see [`stable_end`]).
    stable_end: Option<usize>,
}

/// Maps each rendered message to the client message it is (by identity with the entry's message) or its
/// wire form; also whether the context ends with a budget notice, the tools it needs, its tokens, and the
/// stub and checkpoint counts.
fn segments(api: Api, rec: &Recorded, internal: &Internal, p: &condense_render::Projection, messages: &[Arc<Message>], cache: &WrittenCache, mut next: Option<&mut WrittenCache>) -> Segments {
    // (message address, unit, message within it), sorted by address.
    let mut from: Vec<(usize, u32, u32)> = Vec::with_capacity(rec.units.entries.len());
    for u in 0..rec.units.len() {
        for (j, e) in rec.units.of(u).iter().enumerate() {
            if let Some(m) = e.as_deref().and_then(|e| p.entry_message(e)) {
                from.push((Arc::as_ptr(m) as usize, u as u32, j as u32));
            }
        }
    }
    // Where two unit messages stand for one message, the later stands for it.
    from.sort_unstable_by_key(|&(at, u, j)| (at, std::cmp::Reverse((u, j))));
    from.dedup_by_key(|e| e.0);
    let segs: Vec<Seg> = messages
        .iter()
        .map(|m| match from.binary_search_by_key(&(Arc::as_ptr(m) as usize), |e| e.0) {
            Ok(k) => Seg::Client(from[k].1, from[k].2),
            Err(_) => Seg::New(cache.get(api, m, next.as_deref_mut())),
        })
        .collect();
    let notice = messages.last().is_some_and(|m| m.text().starts_with("[condense notice")) && matches!(segs.last(), Some(Seg::New(_)));
    let tools: Vec<&'static tools::ToolDef> = tools::needed(p).into_iter().filter(|t| internal.is(t.name)).collect();
    let tokens: u64 = messages.iter().map(|m| p.estimate(m)).sum();
    let idx = p.index();
    let recoveries = idx.recovery_notes.iter().filter(|n| n.starts_with(condense_engine::recover::DIAG_PREPARED)).count() as u64;
    let figures = ((idx.summaries.len() + idx.spills.len()) as u64, idx.checkpoints.len() as u64, recoveries, idx.chains.len() as u64);
    Segments { segs, notice, tools, tokens, figures, stable_end: stable_end(messages, |m| p.is_checkpoint_summary(m)) }
}

/// After a checkpoint, the context opens with its summary, the host context it carried and the prompts
/// it kept (and any prompts right after them): nothing changes these until the next checkpoint, while
/// what follows is pruned and chained as the session goes on. The position of the last of them, where
/// condense puts a cache mark of its own (Anthropic): a chain compressed after the checkpoint then
/// re-sends only what follows the mark, not everything after the system prompt. `is_checkpoint` tells a
/// checkpoint's summary message (the render knows its own, `Projection::is_checkpoint_summary`).
fn stable_end(messages: &[Arc<Message>], is_checkpoint: impl Fn(&Arc<Message>) -> bool) -> Option<usize> {
    if !is_checkpoint(messages.first()?) {
        return None;
    }
    let run = messages[1..].iter().take_while(|m| matches!(***m, Message::User { origin: UserOrigin::Prompt | UserOrigin::Host, .. })).count();
    // The mark goes on a prompt (or the summary), not on host context, which a client may send as a
    // `system` message inside the list.
    let last_prompt = messages[1..=run].iter().rposition(|m| matches!(**m, Message::User { origin: UserOrigin::Prompt, .. }));
    Some(last_prompt.map_or(0, |p| p + 1))
}

/// Writes the message list to send from the segments: whole unchanged units as the client wrote them,
/// other client messages as their own wire JSON, the rest from the neutral model, with the client's cache
/// marks put back.
fn write(api: Api, raw: &RawRequest, rec: &Recorded, seg: Segments) -> std::result::Result<Built, wire::WireError> {
    let Segments { segs, notice, tools, tokens: tokens_sent, stable_end, .. } = seg;
    let tools = &tools[..];
    // condense's own mark at the end of what stays until the next checkpoint (Anthropic allows four;
    // one is left when the client's request holds fewer).
    let own_mark = stable_end.filter(|&k| api == Api::Anthropic && k < segs.len() && wire::cache_marks(&raw.buf) < 4);
    // Which units go out whole and untouched, and which are read for their messages' own JSON.
    let count = |u: usize| rec.units.of(u).len();
    // Where a client unit is sent complete, marked or not (a marked one is read for its marks only), and
    // where one ends; and of those, the units that go out as the client wrote them: unmarked, and not the
    // one that takes condense's mark (it is read, so the mark can go on it).
    let mut complete_start = vec![false; segs.len()];
    let mut complete_end = vec![false; segs.len() + 1];
    let mut whole: Vec<Option<u32>> = vec![None; segs.len()];
    let mut i = 0;
    while i < segs.len() {
        if let Seg::Client(u, 0) = segs[i] {
            let k = count(u as usize);
            if k > 0 && (0..k).all(|j| matches!(segs.get(i + j), Some(Seg::Client(x, y)) if *x == u && *y as usize == j)) {
                complete_start[i] = true;
                complete_end[i + k] = true;
                if !raw.units[u as usize].marked && !own_mark.is_some_and(|e| (i..i + k).contains(&e)) {
                    whole[i] = Some(u);
                }
                i += k;
                continue;
            }
        }
        i += 1;
    }
    // An Anthropic unit next to a rewritten message of the same role is merged with it, so it is read.
    let role_of = |i: usize| -> Option<String> {
        match &segs[i] {
            Seg::Client(u, _) => Some(raw.units[*u as usize].role().to_string()),
            Seg::New(Some(o)) => o.role().map(str::to_string),
            Seg::New(None) => None,
        }
    };
    if api == Api::Anthropic {
        let starts: Vec<usize> = (0..segs.len()).filter(|&i| whole[i].is_some()).collect();
        for s0 in starts {
            let u = whole[s0].expect("a whole unit") as usize;
            let end = s0 + count(u);
            let role = raw.units[u].role();
            let prev_new = s0 > 0 && matches!(segs[s0 - 1], Seg::New(Some(_))) && role_of(s0 - 1).as_deref() == Some(role);
            let next_new = end < segs.len() && matches!(segs[end], Seg::New(Some(_))) && role_of(end).as_deref() == Some(role);
            // A neighbour that is a complete client unit stays apart whether or not it carries the
            // client's mark: merged only while marked, the same two messages went out merged in one
            // request and apart in the next, which breaks the prompt cache there.
            let next_part = end < segs.len() && matches!(segs[end], Seg::Client(..)) && !complete_start[end] && role_of(end).as_deref() == Some(role);
            // (Whether a complete unit ends there is marked once: searched for each unit, a request of
            // many units took quadratic time.)
            let prev_part = s0 > 0 && matches!(segs[s0 - 1], Seg::Client(..)) && !complete_end[s0] && role_of(s0 - 1).as_deref() == Some(role);
            if matches!(role, "user" | "assistant") && (prev_new || next_new || next_part || prev_part) {
                whole[s0] = None;
            }
        }
    }
    // Units read now for their messages (those the request did not read already).
    let mut covered = vec![false; segs.len()];
    for i in 0..segs.len() {
        if let Some(u) = whole[i] {
            for k in 0..count(u as usize) {
                covered[i + k] = true;
            }
        }
    }
    let mut wanted: BTreeSet<usize> = segs.iter().zip(&covered).filter_map(|(seg, c)| match seg {
        Seg::Client(u, _) if !c => Some(*u as usize),
        _ => None,
    }).collect();
    // Anthropic: the client's mark on its last message stays at the end of what is sent even when that
    // message is not sent itself (a checkpoint took it in): without it the provider caches nothing of
    // the request. A marked unit never goes out whole, so it is read for its marks.
    if let Some(u) = raw.units.len().checked_sub(1).filter(|u| api == Api::Anthropic && raw.units[*u].marked) {
        wanted.insert(u);
    }
    let mut read: BTreeMap<usize, WireRequest> = BTreeMap::new();
    for u in wanted {
        read.insert(u, wire::parse_unit(api, raw, u)?);
    }
    // (Grown as pieces come: runs of whole units are one piece each, so most requests have few.)
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    let mut src: Vec<Option<(usize, usize)>> = Vec::new();
    // The piece condense's mark goes on.
    let mut own_piece = None;
    // The list elements of the last piece, when it is whole units (`raw_from..raw_to`).
    let (mut raw_from, mut raw_to) = (None, 0);
    for (i, seg) in segs.into_iter().enumerate() {
        if Some(i) == own_mark && whole[i].is_none() && !covered[i] {
            own_piece = Some(pieces.len());
        }
        if let Some(u) = whole[i] {
            let u = u as usize;
            let unit = &raw.units[u];
            // Whole units that follow each other in the request are one piece (a request of a long
            // history held a piece per unit).
            match (pieces.last_mut(), raw_from) {
                (Some(last @ Piece::Raw(..)), Some(from)) if raw_to == unit.start() => *last = raw.piece(from, unit.end()),
                _ => {
                    pieces.push(raw.piece(unit.start(), unit.end()));
                    src.push(Some((u, usize::MAX)));
                    raw_from = Some(unit.start());
                }
            }
            raw_to = unit.end();
            continue;
        }
        if covered[i] {
            continue;
        }
        match seg {
            Seg::Client(u, j) => {
                let (u, j) = (u as usize, j as usize);
                pieces.push(Piece::Msg(Box::new(read[&u].messages[j].out())));
                src.push(Some((u, j)));
            }
            Seg::New(Some(o)) => {
                pieces.push(Piece::Written(o));
                src.push(None);
            }
            Seg::New(None) => {}
        }
    }
    if api == Api::Anthropic {
        let last_unit = raw.units.len().checked_sub(1);
        for (u, w) in &read {
            for (j, control) in &w.cache_marks {
                let last = Some(*u) == last_unit && *j + 1 == w.messages.len();
                // The mark on the client's last message goes on the last message sent (before any
                // notice): after a condense tool round's call and result too, so the next request reads
                // them from the cache instead of paying for them again.
                let end = pieces.len().checked_sub(1 + usize::from(notice)).filter(|e| last && matches!(pieces[*e], Piece::Msg(_) | Piece::Written(_)));
                let at = end.or_else(|| src.iter().rposition(|s| *s == Some((*u, *j))));
                if let Some(o) = at.and_then(|a| pieces.get_mut(a)).and_then(Piece::message_mut) {
                    mark_last_part(o, control);
                }
            }
        }
    }
    if let Some(o) = own_piece.and_then(|a| pieces.get_mut(a)).and_then(Piece::message_mut) {
        if !o.parts.last().is_some_and(|p| p.get("cache_control").is_some()) {
            mark_last_part(o, &json!({"type": "ephemeral"}));
        }
    }
    // Responses: a rewritten output answers a custom tool call with the custom output type.
    if api == Api::Responses {
        let custom: Vec<String> = (0..raw.items.len())
            .map(|i| raw.item(i))
            .filter(|it| it.windows(18).any(|w| w == b"\"custom_tool_call\""))
            .filter_map(|it| serde_json::from_slice::<Value>(it).ok())
            .filter(|v| v["type"] == "custom_tool_call")
            .filter_map(|v| v["call_id"].as_str().map(str::to_string))
            .collect();
        for (piece, s) in pieces.iter_mut().zip(&src) {
            // (A written message is read back only when it holds an output.)
            if s.is_some() || custom.is_empty() || matches!(&*piece, Piece::Written(w) if !w.mentions("\"function_call_output\"")) {
                continue;
            }
            if let Some(o) = piece.message_mut() {
                for part in o.parts.to_mut().iter_mut() {
                    if part["type"] == "function_call_output" && part["call_id"].as_str().is_some_and(|c| custom.iter().any(|x| x == c)) {
                        part["type"] = json!("custom_tool_call_output");
                    }
                }
            }
        }
    }
    let tools: Vec<String> = tools.iter().map(|t| tools::tool_text(api, t).to_string()).collect();
    // Room after the list for the request's other fields and condense's tools: the upstream body is
    // written around the list in its own buffer (`request::upstream::upstream_body`).
    let others = raw.buf.len().saturating_sub(raw.items.iter().map(|r| r.len()).sum());
    let headroom = others + tools.iter().map(|t| t.len() + 1).sum::<usize>() + 64;
    Ok(Built { list: wire::write_list(api, &raw.slice(0, raw.system), &pieces, headroom), tools, tokens_sent })
}

impl Conv {
    /// Records the model's reply after `parent` and the usage the provider reported for it; returns the
    /// reply's entry id.
    pub fn record_reply(&mut self, parent: Option<&str>, reply: Message, usage: Option<Usage>, internal: &Internal) -> Result<String> {
        let session = self.session.clone();
        let id = session.with_projection(|p| self.next_id(p))?;
        let mut events = vec![SourceEvent::EntryAppended { id: id.clone(), parent: parent.map(str::to_string), entry: Entry::Message(reply.clone()) }];
        if let Some(u) = usage {
            events.push(SourceEvent::ProviderUsage(u));
        }
        self.append_entries(events, internal)?;
        // The reply exists nowhere else: it is durable, with everything recorded before it, before the
        // client sees it end.
        self.session.sync()?;
        self.add_to_view(&id, &|n| internal.answers(n))?;
        Ok(id)
    }

    /// Adds entry `id`, which serve has just appended itself, to the client's view.
    fn add_to_view(&mut self, id: &str, internal: &dyn Fn(&str) -> bool) -> Result<()> {
        let track = &mut self.track;
        self.session.with_projection(|p| add_appended(track, p, id, internal, false).map(drop))?
    }

    /// Answers the calls of condense's own tools in `reply` (recorded as entry `parent`) and records each
    /// result; returns the last entry recorded, and the answers in call order.
    pub fn answer_internal(&mut self, parent: &str, reply: &Message, internal: &Internal) -> Result<(String, Vec<(String, String)>)> {
        let mut last = parent.to_string();
        let mut answers = Vec::new();
        let calls: Vec<(String, String, String)> =
            reply.tool_calls().filter(|(_, n, _)| internal.answers(n)).map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
        for (call_id, name, arguments) in calls {
            let answer = self.session.run_tool(&name, &arguments)?.expect("a condense tool");
            let m = Message::ToolResult { call_id: call_id.clone(), tool_name: name.clone(), content: vec![Block::Text { text: answer.text.clone() }], is_error: answer.is_error };
            let session = self.session.clone();
            let id = session.with_projection(|p| self.next_id(p))?;
            self.append_entries(vec![SourceEvent::EntryAppended { id: id.clone(), parent: Some(last.clone()), entry: Entry::Message(m.clone()) }], internal)?;
            self.add_to_view(&id, &|n| internal.answers(n))?;
            answers.push((call_id, answer.text));
            last = id;
        }
        Ok((last, answers))
    }

    /// Records a provider overflow (the provider's error text).
    pub fn record_overflow(&mut self, message: &str) -> Result<()> {
        self.session.append(vec![SourceEvent::ProviderOverflow { message: message.to_string() }]).map(drop)
    }

    /// What the dashboard records of a request whose message list `list` (a JSON array) goes upstream: the
    /// conversation's figures, and how many leading messages of the previous request's list it kept.
    pub fn note_sent(&mut self, api: Api, list: &[u8], window: Option<u64>) -> Sent {
        let mark = memchr::memmem::Finder::new(b"\"cache_control\"");
        let string_content = memchr::memmem::Finder::new(b"\"content\":\"");
        // A message as the provider reads it, when its bytes say otherwise: a cache mark moving to the new
        // last message is not a change of the message (the provider caches the prefix without the marks),
        // nor, to Anthropic, a string content written as the one text block it reads it as (Claude Code
        // turns a message's string into a block to mark it, and back when the mark moves on).
        let as_read = |m: &[u8]| -> Option<String> {
            let anthropic = api == Api::Anthropic;
            if mark.find(m).is_none() && !(anthropic && string_content.find(m).is_some()) {
                return None;
            }
            let mut v: Value = serde_json::from_slice(m).ok()?;
            let marked = crate::billing::strip(&mut v);
            let block = v.get("content").and_then(Value::as_str).filter(|_| anthropic).map(crate::billing::text_block);
            let changed = marked || block.is_some();
            if let Some(b) = block {
                v["content"] = Value::Array(vec![b]);
            }
            changed.then(|| v.to_string())
        };
        // Each hashed as it is scanned (the list is serve's own writing); a list the scan cannot read keeps
        // no hashes, as none of it can be compared.
        let hashes: Vec<u64> = condense_formats::scan::elements(list)
            .map(|ranges| ranges.into_iter().map(|r| &list[r]).map(|m| wire::item_key(as_read(m).as_deref().map_or(m, str::as_bytes))).collect())
            .unwrap_or_default();
        let kept = self.sent.iter().zip(&hashes).take_while(|(a, b)| a == b).count();
        let before = std::mem::replace(&mut self.sent, hashes).len();
        Sent { figures: self.figures.clone(), window, kept, before }
    }

    /// The number of visible messages held.
    pub fn visible_len(&self) -> usize {
        self.track.len()
    }

    /// About how many bytes the conversation holds in memory besides its session's projection: its
    /// client view's messages at [`VIEW_WEIGHT`] each.
    pub fn weight(&self) -> u64 {
        self.track.len() as u64 * VIEW_WEIGHT + self.written.bytes + self.written.map.len() as u64 * WRITTEN_WEIGHT + self.accounts.len() as u64 * ACCOUNT_WEIGHT
    }

    /// What serve keeps of the conversation once it closes it ([`Parked`]).
    pub fn park(self) -> Parked {
        let mut accounts = self.accounts;
        accounts.park();
        Parked { figures: self.figures, ledger: self.ledger, native_model: self.native_model, last_request: self.last_request, accounts, session: self.session.id() }
    }

    /// Takes back what was kept of the conversation when it was closed.
    pub fn restore(&mut self, parked: Parked) {
        self.figures = parked.figures;
        self.ledger = parked.ledger;
        self.native_model = parked.native_model;
        self.last_request = parked.last_request;
        self.accounts = parked.accounts;
    }
}

fn mark_last_part(o: &mut OutMessage<'_>, control: &Value) {
    if let Some(last) = o.parts.to_mut().last_mut() {
        if let Value::String(s) = last {
            *last = json!({"type": "text", "text": s});
        }
        if let Value::Object(b) = last {
            b.insert("cache_control".into(), control.clone());
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str, origin: UserOrigin) -> Arc<Message> {
        Arc::new(Message::user_text(text, origin))
    }

    fn reply(text: &str) -> Arc<Message> {
        Arc::new(Message::Assistant { content: vec![Block::Text { text: text.into() }], model: None, stop: None, usage: None })
    }

    /// condense's own mark goes on the last prompt a checkpoint keeps (host context between them is passed
    /// over), on the summary when it keeps none, and nowhere without a checkpoint.
    #[test]
    fn the_stable_end_is_the_last_kept_prompt_after_a_checkpoint() {
        let cp = user("[Checkpoint c1: the conversation before this point, summarized]\n## Goal\nx", UserOrigin::Summary);
        let summary = || cp.clone();
        let stable_end = |messages: &[Arc<Message>]| stable_end(messages, |m| Arc::ptr_eq(m, &cp));
        let ctx = [summary(), user("# Environment", UserOrigin::Host), user("one", UserOrigin::Prompt), user("two", UserOrigin::Prompt), user("<env/>", UserOrigin::Host), reply("ok")];
        assert_eq!(stable_end(&ctx), Some(3));
        assert_eq!(stable_end(&[summary(), user("# Environment", UserOrigin::Host), reply("ok")]), Some(0));
        assert_eq!(stable_end(&[summary()]), Some(0));
        assert_eq!(stable_end(&[user("one", UserOrigin::Prompt), reply("ok")]), None);
        assert_eq!(stable_end(&[user("[Compressed chain b1: 2 tool calls]", UserOrigin::Summary), user("one", UserOrigin::Prompt)]), None);
        assert_eq!(stable_end(&[]), None);
    }

    #[test]
    fn marks_are_counted_in_the_whole_body() {
        let body = br#"{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]}"#;
        assert_eq!(wire::cache_marks(body), 2);
        assert_eq!(wire::cache_marks(b"{}"), 0);
    }
}
