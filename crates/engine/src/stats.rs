//! Counts that describe a session: what `condense stats` prints.

use crate::simulate::Prices;
use condense_events::{Message, Usage, UserOrigin};
use condense_render::Projection;
use condense_tokens::estimate;
use std::collections::BTreeMap;

/// Counts over the active branch (the visible transcript) and over the rendered context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Entries in the session tree, all branches.
    pub entries: u64,
    /// Messages on the active branch.
    pub messages: u64,
    /// Assistant messages on the active branch (one per model request).
    pub turns: u64,
    /// User prompts on the active branch (each starts a user-turn-group).
    pub user_turn_groups: u64,
    /// Tool calls on the active branch.
    pub tool_calls: u64,
    /// Tool results on the active branch.
    pub tool_results: u64,
    /// Tool results flagged as errors.
    pub tool_errors: u64,
    /// Estimated tokens (pi's chars/4) of the active branch by role (`user`, `assistant`, `tool`).
    pub tokens_by_role: BTreeMap<String, u64>,
    /// Estimated tokens of tool results by tool name.
    pub tokens_by_tool: BTreeMap<String, u64>,
    /// Estimated tokens of the whole active branch.
    pub branch_tokens: u64,
    /// Messages in the rendered context.
    pub context_messages: u64,
    /// Estimated tokens of the rendered context.
    pub context_tokens: u64,
    /// Smaller-model recovery diagnostics (`source_recovery_*`), in order.
    pub recovery: Vec<String>,
    /// What the provider reported of the session's requests, priced as it bills prompt caching.
    pub provider: Option<ProviderCost>,
}

/// The provider's reported usage of a session's requests, summed, priced in the units of issue 34: 0.1 per
/// input token read from the prompt cache, 1.25 per input token not read from it (a cache write costs 1.25
/// times an input token at Anthropic).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProviderCost {
    /// Whether the requests went through `condense serve` (else: the host's own, as imported).
    pub served: bool,
    /// Requests with a reported usage.
    pub requests: u64,
    /// The usage, summed.
    pub usage: Usage,
    /// `usage` at cache prices.
    pub cost: f64,
    /// For a served session: the same requests as the client sent them (its whole history each time,
    /// read from the cache up to the previous request), estimated at chars / 4 with the request overhead,
    /// at the same prices.
    pub direct: Option<f64>,
}

/// The cache-priced cost of a usage (see [`ProviderCost`]).
pub fn cache_priced(u: &Usage) -> f64 {
    Prices::default().units(u.input + u.cache_read + u.cache_write, u.cache_read, 0)
}

/// What sending `p`'s active branch as an append-only history costs at cache prices: one request per
/// assistant message, carrying everything before it and the request overhead, read from the cache up to
/// what the request before it carried.
pub fn direct_cost(p: &Projection) -> f64 {
    let overhead = p.request_overhead();
    let prices = Prices::default();
    let (mut total, mut before, mut cost) = (overhead, 0u64, 0.0);
    for m in p.branch_messages() {
        if matches!(*m, Message::Assistant { .. }) {
            cost += prices.units(total, before, 0);
            before = total;
        }
        total += estimate(&m);
    }
    cost
}

impl Stats {
    /// Computes the counts of a projection.
    pub fn of(p: &Projection) -> Stats {
        let mut s = Stats { entries: p.entries() as u64, ..Stats::default() };
        for m in p.branch_messages() {
            let t = estimate(&m);
            s.messages += 1;
            s.branch_tokens += t;
            *s.tokens_by_role.entry(m.role().to_string()).or_default() += t;
            match &*m {
                Message::User { origin: UserOrigin::Prompt, .. } => s.user_turn_groups += 1,
                Message::User { .. } => {}
                Message::Assistant { .. } => {
                    s.turns += 1;
                    s.tool_calls += m.tool_calls().count() as u64;
                }
                Message::ToolResult { tool_name, is_error, .. } => {
                    s.tool_results += 1;
                    s.tool_errors += u64::from(*is_error);
                    let name = if tool_name.is_empty() { "(unknown)" } else { tool_name.as_str() };
                    *s.tokens_by_tool.entry(name.to_string()).or_default() += t;
                }
            }
        }
        let r = p.render();
        s.context_messages = r.messages.len() as u64;
        s.context_tokens = r.messages.iter().map(|m| estimate(m)).sum();
        s.recovery = p.index().recovery_notes.clone();
        s
    }
}
