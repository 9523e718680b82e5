//! What each decision cost and what it saved once the prompt cache is counted (issue 60, item 1).
//!
//! Each decision that changes the context has an account, opened at the request where it first took effect:
//!
//! - **tokens**: what it took out of the context then: the messages it rewrote as they rendered in the
//!   request before, less what renders in their place (a checkpoint: its own estimate before and after).
//!   Of a *kept read* (a file read `liveReadsTokens` left verbatim), the tokens it keeps in.
//! - **premium**: what its rewrite cost. A request that changes what the provider cached re-sends everything
//!   after the change that the model had seen (up to its last reply) at the uncached price instead of the
//!   cached one; that difference is the premium, shared among the decisions that took effect there by their
//!   tokens. A request on a cold cache pays none (nothing was cached).
//! - **saved**: what the tokens it took out would have cost in every request since, at the price each would
//!   have paid for them: the cached price, or the uncached price on a cold request and at its first request
//!   when nothing cached changed (what it took out was then new). It stops when a later chain or checkpoint
//!   takes in what the decision rewrote (that one's tokens count from what was left). A kept read's saved is
//!   negative: what its tokens cost.
//! - **summarizer**: with a model summarizer, what it read to write the stubs or the handoff, at the
//!   uncached price (as the host's own compaction is priced in `simulate`); 0 with the extractive default.
//! - **net** = saved − premium − summarizer, to date.
//!
//! Prices are [`Prices`] units per token, as `simulate` reports costs. Nothing here reaches an event or a
//! rendered byte: the accounts are read from the log and the rendered requests, and kept by the host.

use crate::prices::Prices;
use condense_events::{Block, DecisionEvent, Message, Seq};
use condense_render::Projection;
use condense_tokens::estimate;
use std::sync::Arc;

/// What a decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Tool outputs rendered as their summary stubs (a closed batch, or a read stubbed later).
    Stub,
    /// An output written to a blob, its preview in the context.
    Spill,
    /// An output standing for an earlier identical one.
    Dedup,
    /// A failed call's arguments replaced by a marker.
    Purge,
    /// A closed chain compressed into one block, or its final reply cut.
    Chain,
    /// A checkpoint in place of the history before it (seed 001).
    Checkpoint,
    /// A recovery onto a smaller model (seed 004).
    Recovery,
    /// A file read kept verbatim while live.
    KeptRead,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 8] = [Kind::Stub, Kind::Spill, Kind::Dedup, Kind::Purge, Kind::Chain, Kind::Checkpoint, Kind::Recovery, Kind::KeptRead];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Stub => "stub",
            Kind::Spill => "spill",
            Kind::Dedup => "dedup",
            Kind::Purge => "purge",
            Kind::Chain => "chain",
            Kind::Checkpoint => "checkpoint",
            Kind::Recovery => "recovery",
            Kind::KeptRead => "kept_read",
        }
    }
}

/// One decision's account, to date (see the module's text).
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    /// The decision's event.
    pub seq: Seq,
    /// What it did.
    pub kind: Kind,
    /// What it names: `t12`, `b3`, `c2`, or a batch's refs.
    pub label: String,
    /// Tokens it took out of the context (a kept read: the tokens it keeps in).
    pub tokens: u64,
    /// What its rewrite cost above the cached price.
    pub premium: f64,
    /// What the tokens it took out would have cost since (a kept read: minus what they cost).
    pub saved: f64,
    /// What a model summarizer read for it.
    pub summarizer: f64,
    /// Requests it took effect in.
    pub requests: u64,
    /// A later chain or checkpoint took in what it rewrote: it saves nothing more.
    pub ended: bool,
}

impl Account {
    /// Saved less premium and summarizer.
    pub fn net(&self) -> f64 {
        self.saved - self.premium - self.summarizer
    }
}

/// The accounts of a session's decisions taken together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Decisions accounted, kept reads apart.
    pub decisions: u64,
    /// Of those, decisions whose net is below zero.
    pub net_negative: u64,
    /// Their nets summed.
    pub net: f64,
    /// Kept reads, and what keeping them cost (their nets summed, ≤ 0).
    pub kept_reads: u64,
    /// See `kept_reads`.
    pub kept_reads_net: f64,
    /// By kind, in [`Kind::ALL`] order: (kind, decisions, net negative, net).
    pub by_kind: Vec<(Kind, u64, u64, f64)>,
}

impl Totals {
    /// Adds another session's totals.
    pub fn add(&mut self, o: &Totals) {
        self.decisions += o.decisions;
        self.net_negative += o.net_negative;
        self.net += o.net;
        self.kept_reads += o.kept_reads;
        self.kept_reads_net += o.kept_reads_net;
        for &(k, n, neg, net) in &o.by_kind {
            match self.by_kind.iter_mut().find(|e| e.0 == k) {
                Some(e) => (e.1, e.2, e.3) = (e.1 + n, e.2 + neg, e.3 + net),
                None => self.by_kind.push((k, n, neg, net)),
            }
        }
        self.by_kind.sort_by_key(|e| e.0);
    }
}

/// What a model summarizer writes (what it reads is then a decision's cost); the extractive default
/// writes everything by itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Models {
    /// The stubs of closed batches.
    pub stubs: bool,
    /// The handoffs of checkpoints and recoveries.
    pub handoffs: bool,
}

/// An account as kept: what it saves accrues as the price of each request since it opened, summed.
#[derive(Debug, Clone)]
struct Open {
    account: Account,
    /// Refs whose rendering it changed (a later chain or checkpoint covering all of them ends it).
    refs: Vec<u32>,
    /// The entry it rewrote (the first of several): when that leaves the context (a host compaction, a
    /// branch left), it saves nothing more.
    anchor: Option<String>,
    /// The price sum and request count after its first request, and what its tokens saved at that one.
    from: (f64, u64),
    first: f64,
    /// The price sum and request count when it ended.
    until: Option<(f64, u64)>,
}

/// The prices and the rendered requests of a session as they go, and its decisions' accounts. Fed once per
/// request with the prepared context ([`crate::Session::account`]).
#[derive(Debug, Clone)]
pub struct Accounts {
    prices: Prices,
    models: Models,
    /// The last event accounted for.
    after: Seq,
    meter: Meter,
    /// The price per token of each request summed (the cached or, cold, the uncached price), and requests.
    price_sum: f64,
    requests: u64,
    open: Vec<Open>,
    /// Assistant entries whose condensed turn was accounted.
    condensed: std::collections::BTreeSet<String>,
    /// What [`Accounts::decided_since`] found the index's count of changes at last.
    changes: Option<u64>,
    /// Outputs aliased in a batch not closed yet (an alias renders once its batch closes): event, ref.
    aliased: Vec<(Seq, u32)>,
}

impl Accounts {
    /// Accounts priced at `prices`, for decisions after event `after` (those before are not accounted: a
    /// host taking up a session already under way), with `models` saying what a model writes.
    pub fn new(prices: Prices, models: Models, after: Seq) -> Accounts {
        Accounts { prices, models, after, meter: Meter::default(), price_sum: 0.0, requests: 0, open: Vec::new(), condensed: Default::default(), changes: None, aliased: Vec::new() }
    }

    /// Makes the next request read the log (a read that failed).
    pub(crate) fn forget_counts(&mut self) {
        self.changes = None;
    }

    /// Accounts kept, ended or not.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no decision was accounted yet.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Lets go of the last request's messages (a host closing the session to bound its memory): the next
    /// request is measured as if it were the first, the accounts go on.
    pub fn park(&mut self) {
        self.meter = Meter::default();
    }

    /// The last event accounted for.
    pub fn after(&self) -> Seq {
        self.after
    }

    /// Whether decisions that change the context were made since the last request taken in with its
    /// decisions read (the index's count of them moved, [`condense_index::Index::changes`]). When not, the
    /// log need not be read (a round trip to a database for most requests).
    pub(crate) fn decided_since(&mut self, proj: &Projection) -> bool {
        let changes = proj.index().changes;
        let moved = self.changes != Some(changes);
        self.changes = Some(changes);
        moved
    }

    /// The meter of the rendered requests (what the last one shared with the one before).
    pub(crate) fn meter(&self) -> &Meter {
        &self.meter
    }

    /// See [`Accounts::meter`].
    pub(crate) fn meter_mut(&mut self) -> &mut Meter {
        &mut self.meter
    }

    /// Takes in a request: `decisions`, the decisions after [`Accounts::after`] up to `proj`'s seq (none
    /// read: `read` false, and [`Accounts::after`] stays), then the prepared context `msgs` (whose cache
    /// was `cold`). Returns its tokens, cached-prefix tokens and
    /// whether it broke the cache (its message list does not begin with the whole previous one).
    pub fn request(&mut self, proj: &Projection, decisions: &[(Seq, DecisionEvent)], read: bool, msgs: &[Arc<Message>], cold: bool) -> (u64, u64, bool) {
        if read {
            self.after = self.after.max(proj.seq());
        }
        let (c, u) = (self.prices.cached, self.prices.uncached);
        let opened = self.open.len();
        for (seq, d) in decisions {
            self.take(proj, *seq, d, msgs);
        }
        let (total, cached, broke) = self.meter.request_after(msgs, 0, |m| proj.estimate(m));
        // The context changed: what left it (a host compaction, a branch left) saves nothing more.
        if broke {
            let in_context = proj.in_context();
            self.end(|o| o.anchor.as_deref().is_some_and(|id| !in_context(id)));
        }
        let broke = broke && !cold;
        let price = if cold { u } else { c };
        self.price_sum += price;
        self.requests += 1;
        // The rewrite: what the model had seen after the first change, sent again uncached.
        let fresh = msgs.iter().rposition(|m| matches!(**m, Message::Assistant { .. })).map_or(0, |i| i + 1);
        let same = self.meter.same.min(fresh);
        let resent = if broke { self.meter.sums[fresh] - self.meter.sums[same] } else { 0 };
        let first = if cold || !broke { u } else { c };
        let new = &mut self.open[opened..];
        let removing = |o: &Open| o.account.kind != Kind::KeptRead;
        let weight: u64 = new.iter().filter(|o| removing(o)).map(|o| o.account.tokens).sum();
        let count = new.iter().filter(|o| removing(o)).count() as f64;
        for o in new.iter_mut() {
            o.from = (self.price_sum, self.requests);
            o.first = if o.account.kind == Kind::KeptRead { -price } else { first };
            if removing(o) {
                let share = if weight > 0 { o.account.tokens as f64 / weight as f64 } else { 1.0 / count };
                o.account.premium = resent as f64 * (u - c) * share;
            }
        }
        (total, cached, broke)
    }

    /// Opens the account of decision `d` (event `seq`), and ends those it takes in.
    fn take(&mut self, proj: &Projection, seq: Seq, d: &DecisionEvent, msgs: &[Arc<Message>]) {
        let idx = proj.index();
        let original = |r: u32| idx.records.get(&r).and_then(|rec| proj.entry_message(&rec.entry)).map_or(0, |m| proj.estimate(m));
        // What an output takes out once it renders as its stub (as the projection writes it).
        let pruned = |r: u32| original(r).saturating_sub(proj.stub_of(r).map_or(0, |m| estimate(&m)));
        let u = self.prices.uncached;
        let entry_of = |r: u32| idx.records.get(&r).map(|rec| rec.entry.clone());
        match d {
            DecisionEvent::BatchClosed { refs, outcome, summaries, .. } => {
                // Its aliases render from now on.
                let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.aliased).into_iter().partition(|(_, r)| refs.contains(r));
                self.aliased = later;
                for (at, r) in now {
                    self.open_alias(proj, at, r);
                }
                // The turns it closed render condensed (thinking stripped, long arguments marked): what
                // they shed is the close's too.
                let turns = self.condensed_turns(proj, refs, msgs);
                let summarized = *outcome == condense_events::BatchOutcome::Summarized;
                let stubbed: Vec<u32> = if summarized { summaries.iter().map(|(r, _)| *r).collect() } else { Vec::new() };
                if !stubbed.is_empty() || turns > 0 {
                    let tokens = turns + summaries.iter().filter(|_| summarized).map(|(r, _)| pruned(*r)).sum::<u64>();
                    let read = if self.models.stubs { stubbed.iter().map(|&r| original(r)).sum::<u64>() as f64 * u } else { 0.0 };
                    let label = if stubbed.is_empty() { format!("the calls of {}", refs_label(refs)) } else { refs_label(&stubbed) };
                    let anchor = entry_of(stubbed.first().or(refs.first()).copied().unwrap_or(0));
                    self.open_account(seq, Kind::Stub, label, tokens, if stubbed.is_empty() { refs.clone() } else { stubbed }, anchor, read);
                }
                if !summarized {
                    return;
                }
                for &r in refs.iter().filter(|r| idx.unsummarized_reads.contains(r)) {
                    self.open_account(seq, Kind::KeptRead, format!("t{r}"), original(r), vec![r], entry_of(r), 0.0);
                }
            }
            DecisionEvent::OutputStubbed { ref_n, .. } => {
                self.end(|o| o.account.kind == Kind::KeptRead && o.refs == [*ref_n]);
                let read = if self.models.stubs { original(*ref_n) as f64 * u } else { 0.0 };
                self.open_account(seq, Kind::Stub, format!("t{ref_n}"), pruned(*ref_n), vec![*ref_n], entry_of(*ref_n), read);
            }
            DecisionEvent::OutputSpilled { ref_n, .. } => self.open_account(seq, Kind::Spill, format!("t{ref_n}"), pruned(*ref_n), vec![*ref_n], entry_of(*ref_n), 0.0),
            DecisionEvent::OutputAliased { ref_n, .. } => {
                if idx.records.get(ref_n).is_some_and(|rec| idx.outcomes.contains_key(&rec.batch)) {
                    self.open_alias(proj, seq, *ref_n);
                } else {
                    self.aliased.push((seq, *ref_n));
                }
            }
            DecisionEvent::ErrorArgsPurged { chars, call_id, entry } => self.open_account(seq, Kind::Purge, call_id.clone(), chars / 4, Vec::new(), Some(entry.clone()), 0.0),
            DecisionEvent::ChainCompressed(ch) => {
                let tokens = self.span(proj, &ch.first, &ch.last).saturating_sub(estimate(&Message::user_text(ch.body.clone(), condense_events::UserOrigin::Prompt)));
                // What it takes in keeps saving what it took out; only what was decided at this very
                // request is measured by the chain itself (from the request before) and goes.
                let refs: std::collections::BTreeSet<u32> = ch.refs.iter().copied().collect();
                self.aliased.retain(|(_, r)| !refs.contains(r));
                self.open.retain(|o| o.from.1 > 0 || o.refs.is_empty() || !o.refs.iter().all(|r| refs.contains(r)));
                self.open_account(seq, Kind::Chain, format!("b{}", ch.block), tokens, ch.refs.clone(), Some(ch.first.clone()), 0.0);
            }
            DecisionEvent::ChainReplyCut { block, text } => {
                let last = idx.chains.get(block).map(|ch| ch.compressed.last.clone());
                let reply = last.as_deref().and_then(|id| proj.entry_message(id)).map_or(0, |m| proj.estimate(m));
                let cut = estimate(&Message::Assistant { content: vec![Block::Text { text: text.clone() }], model: None, stop: None, usage: None });
                self.open_account(seq, Kind::Chain, format!("b{block}"), reply.saturating_sub(cut), Vec::new(), last, 0.0);
            }
            DecisionEvent::CheckpointCommitted(cp) => {
                // What it covers keeps saving what it took out (its own tokens are counted from the
                // context as it found it).
                self.aliased.retain(|(_, r)| !cp.covers.contains(r));
                let kind = if cp.recovery { Kind::Recovery } else { Kind::Checkpoint };
                let read = if self.models.handoffs { cp.tokens_before as f64 * u } else { 0.0 };
                self.open_account(seq, kind, format!("c{}", cp.n), cp.tokens_before.saturating_sub(cp.tokens_after), cp.covers.clone(), Some(cp.boundary.clone()), read);
            }
            _ => {}
        }
    }

    /// Tokens the assistant messages holding the calls of `refs` shed now that every output of theirs is
    /// in a closed batch (the condensed form `msgs`, the context being prepared, holds), each turn once;
    /// what a purge took from them is the purge's.
    fn condensed_turns(&mut self, proj: &Projection, refs: &[u32], msgs: &[Arc<Message>]) -> u64 {
        let idx = proj.index();
        let mut tokens = 0;
        for rec in refs.iter().filter_map(|r| idx.records.get(r)) {
            let entry = &rec.call_entry;
            let closed = idx.by_call_entry.get(entry).is_some_and(|rs| rs.iter().all(|r| idx.records.get(r).is_some_and(|x| idx.outcomes.contains_key(&x.batch))));
            if !closed || self.condensed.contains(entry) {
                continue;
            }
            let Some(m) = proj.entry_message(entry) else { continue };
            let shown = msgs.iter().rev().find(|x| matches!(***x, Message::Assistant { .. }) && x.tool_calls().any(|(id, _, _)| id == rec.call_id));
            if let Some(shown) = shown.filter(|x| !Arc::ptr_eq(x, m)) {
                let purged: u64 = idx.purged.range((entry.clone(), String::new())..).take_while(|((e, _), _)| e == entry).map(|(_, c)| c / 4).sum();
                tokens += proj.estimate(m).saturating_sub(estimate(shown) + purged);
            }
            self.condensed.insert(entry.clone());
        }
        tokens
    }

    /// Opens the account of output `ref_n` aliased at event `seq`, now that it renders as its alias.
    fn open_alias(&mut self, proj: &Projection, seq: Seq, ref_n: u32) {
        let Some(rec) = proj.index().records.get(&ref_n) else { return };
        let original = proj.entry_message(&rec.entry).map_or(0, |m| proj.estimate(m));
        let tokens = original.saturating_sub(proj.stub_of(ref_n).map_or(0, |m| estimate(&m)));
        self.open_account(seq, Kind::Dedup, format!("t{ref_n}"), tokens, vec![ref_n], Some(rec.entry.clone()), 0.0);
    }

    #[allow(clippy::too_many_arguments)]
    fn open_account(&mut self, seq: Seq, kind: Kind, label: String, tokens: u64, refs: Vec<u32>, anchor: Option<String>, summarizer: f64) {
        let account = Account { seq, kind, label, tokens, premium: 0.0, saved: 0.0, summarizer, requests: 0, ended: false };
        self.open.push(Open { account, refs, anchor, from: (0.0, 0), first: 0.0, until: None });
    }

    /// Ends the accounts `which` picks that are still open. One opened at the request being taken in
    /// never took effect and goes.
    fn end(&mut self, which: impl Fn(&Open) -> bool) {
        let now = (self.price_sum, self.requests);
        self.open.retain(|o| o.from.1 > 0 || !which(o));
        for o in self.open.iter_mut().filter(|o| o.until.is_none()) {
            if which(o) {
                o.until = Some(now);
            }
        }
    }

    /// Tokens of the messages from entry `first` to entry `last` as the last request rendered them, else
    /// as the branch holds them.
    fn span(&self, proj: &Projection, first: &str, last: &str) -> u64 {
        let (Some(a), Some(b)) = (proj.entry_message(first), proj.entry_message(last)) else { return 0 };
        let prev = &self.meter.prev;
        // The older turns of a running chain start with a condensed turn and end with a stub: found by
        // their calls.
        match (proj.rendered_at(first, prev), proj.rendered_at(last, prev)) {
            (Some(i), Some(j)) if i <= j => return self.meter.sums[j + 1] - self.meter.sums[i],
            // The final reply answered the last request: the chain is the rest of that request, then it.
            (Some(i), None) => {
                let end = match prev.last() {
                    Some(m) if m.text().starts_with("[condense notice") => prev.len() - 1,
                    _ => prev.len(),
                };
                return self.meter.sums[end.max(i)] - self.meter.sums[i] + proj.estimate(b);
            }
            _ => {}
        }
        let branch = proj.branch_messages();
        let at = |m: &Arc<Message>| branch.iter().position(|x| Arc::ptr_eq(x, m));
        match (at(a), at(b)) {
            (Some(i), Some(j)) if i <= j => branch[i..=j].iter().map(|m| proj.estimate(m)).sum(),
            _ => 0,
        }
    }

    /// Every account to date, in the order the decisions were made.
    pub fn list(&self) -> Vec<Account> {
        self.open
            .iter()
            .filter(|o| o.from.1 > 0)
            .map(|o| {
                let (p, n) = o.until.unwrap_or((self.price_sum, self.requests));
                let mut a = o.account.clone();
                let per_token = o.first + (p - o.from.0) * if a.kind == Kind::KeptRead { -1.0 } else { 1.0 };
                a.saved = a.tokens as f64 * per_token;
                a.requests = 1 + n - o.from.1;
                a.ended = o.until.is_some();
                a
            })
            .collect()
    }

    /// The accounts taken together.
    pub fn totals(&self) -> Totals {
        Totals::of(&self.list())
    }

    /// What a model writes from now on (a host that learns it with the request).
    pub fn set_models(&mut self, models: Models) {
        self.models = models;
    }
}

impl Totals {
    /// `accounts` taken together.
    pub fn of(accounts: &[Account]) -> Totals {
        let mut t = Totals { by_kind: Kind::ALL.iter().map(|&k| (k, 0, 0, 0.0)).collect(), ..Totals::default() };
        for a in accounts {
            let net = a.net();
            if a.kind == Kind::KeptRead {
                t.kept_reads += 1;
                t.kept_reads_net += net;
                continue;
            }
            t.decisions += 1;
            t.net_negative += u64::from(net < 0.0);
            t.net += net;
            let k = t.by_kind.iter_mut().find(|e| e.0 == a.kind).expect("every kind listed");
            (k.1, k.2, k.3) = (k.1 + 1, k.2 + u64::from(net < 0.0), k.3 + net);
        }
        t.by_kind.retain(|e| e.1 > 0);
        t
    }
}

/// `t3 t4 t9`, or the first and the count of a long list.
fn refs_label(refs: &[u32]) -> String {
    match refs {
        [] => String::new(),
        [r] => format!("t{r}"),
        [a, .., b] if refs.len() > 4 => format!("t{a}…t{b} ({} outputs)", refs.len()),
        _ => refs.iter().map(|r| format!("t{r}")).collect::<Vec<_>>().join(" "),
    }
}

/// Tracks the previous request for prefix comparison, with token estimates cached per message.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meter {
    pub(crate) prev: Vec<Arc<Message>>,
    /// `sums[i]`: tokens of `prev[..i]`.
    pub(crate) sums: Vec<u64>,
    /// Messages the last request shared with the one before it.
    pub(crate) same: usize,
    /// The violations of the last request's context (see [`Meter::violations`]).
    violations: Vec<condense_render::Violation>,
}

impl Meter {
    /// Total tokens, cached-prefix tokens, and whether the cache broke. Only what follows the prefix this
    /// request shares with the last one is counted (and kept) anew.
    #[cfg(test)]
    pub(crate) fn request(&mut self, msgs: &[Arc<Message>]) -> (u64, u64, bool) {
        self.request_after(msgs, 0, |m| estimate(m))
    }

    /// [`Meter::request`] for a context whose first `known` messages are, pointer for pointer, those of the
    /// last request's (as [`Projection::render_since`] reports for the render after the one metered last),
    /// counting a message's tokens with `tokens` (the projection's, which remembers them, where the
    /// context is its render).
    pub(crate) fn request_after(&mut self, msgs: &[Arc<Message>], known: usize, tokens: impl Fn(&Arc<Message>) -> u64) -> (u64, u64, bool) {
        // The same messages, in blocks of 16 compared by address without a branch per message, then one
        // by one (a message rendered anew may still be equal).
        let n = msgs.len().min(self.prev.len());
        let mut same = known.min(n);
        debug_assert!(msgs[..same].iter().zip(&self.prev).all(|(a, b)| Arc::ptr_eq(a, b)), "the known prefix is the last request's");
        while same + 16 <= n && msgs[same..same + 16].iter().zip(&self.prev[same..same + 16]).fold(true, |all, (a, b)| all & Arc::ptr_eq(a, b)) {
            same += 16;
        }
        while same < n && (Arc::ptr_eq(&msgs[same], &self.prev[same]) || msgs[same] == self.prev[same]) {
            same += 1;
        }
        // A budget notice rides at the very end of a request and is never stored: the next request not
        // repeating it is not a break of the cached prefix.
        let prev_len = match self.prev.last() {
            Some(m) if m.text().starts_with("[condense notice") => self.prev.len() - 1,
            _ => self.prev.len(),
        };
        self.same = same;
        let broke = !self.prev.is_empty() && same < prev_len;
        let cached = self.sums.get(same).copied().unwrap_or(0);
        self.prev.truncate(same);
        self.sums.truncate(same + 1);
        if self.sums.is_empty() {
            self.sums.push(0);
        }
        for m in &msgs[same..] {
            let last = *self.sums.last().expect("sums start at 0");
            self.sums.push(last + tokens(m));
            self.prev.push(m.clone());
        }
        (*self.sums.last().expect("sums start at 0"), cached, broke)
    }

    /// The provider-validity violations of `msgs`, the context just passed to [`Meter::request`]: those of
    /// the last context before the last user or assistant message the two share, then the rest checked
    /// anew (see [`condense_render::check_from`]).
    pub(crate) fn violations(&mut self, msgs: &[Arc<Message>]) -> usize {
        condense_render::recheck(&mut self.violations, msgs, self.same);
        self.violations.len()
    }
}
