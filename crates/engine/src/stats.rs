//! Counts that describe a session: what `condense stats` prints.

use condense_events::{Message, UserOrigin};
use condense_render::Projection;
use condense_tokens::estimate;
use std::collections::BTreeMap;

/// Counts over the active branch (the visible transcript) and over the rendered context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
