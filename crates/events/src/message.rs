//! The neutral message model: what a provider-agnostic model context is made of.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One content block of a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Model reasoning, with the provider's signature when it gave one.
    Thinking {
        /// The reasoning text (or the provider's summary of it).
        thinking: String,
        /// Opaque signature needed to send the block back to its provider.
        signature: Option<String>,
    },
    /// A tool call made by the assistant.
    ToolCall {
        /// The provider's call id (pairs with [`Message::ToolResult::call_id`]).
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as the source gave them: compact JSON text, or the raw string when the source held one.
        arguments: String,
    },
    /// An image, base64-encoded (or a reference the host understands).
    Image {
        /// MIME type such as `image/png`.
        mime: String,
        /// Base64 data or reference.
        data: String,
    },
}

impl Block {
    /// Short name of the block kind, as used in reports and snapshots.
    pub fn kind(&self) -> &'static str {
        match self {
            Block::Text { .. } => "text",
            Block::Thinking { .. } => "thinking",
            Block::ToolCall { .. } => "tool_call",
            Block::Image { .. } => "image",
        }
    }
}

/// Why a user-role message is in the context: a typed prompt, or something the host injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum UserOrigin {
    /// Typed by the user: starts a user-turn-group.
    Prompt,
    /// Injected by the host or an extension (pi `custom_message`, Claude Code meta lines, Codex developer and
    /// environment messages). Sent to the model, but does not start a user-turn-group.
    Injected,
    /// A shell command the user ran himself (pi `bashExecution`).
    Shell,
    /// A summary standing in for earlier history (host compaction, branch summary, Claude Code's
    /// continuation summary).
    Summary,
}

/// Why an assistant message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    /// Finished normally.
    Stop,
    /// Stopped to run tools.
    ToolUse,
    /// Hit the output limit.
    Length,
    /// Ended by a provider error.
    Error,
    /// Aborted by the user or host.
    Aborted,
}

/// Token usage reported by a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens not read from cache.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
}

impl Usage {
    /// Every input token of the request, cached or not.
    pub fn context_tokens(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }
}

/// One message of a model context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// A user-role message.
    User {
        /// Content blocks (text and images).
        content: Vec<Block>,
        /// Why the message is there.
        origin: UserOrigin,
    },
    /// An assistant message.
    Assistant {
        /// Content blocks (text, thinking, tool calls).
        content: Vec<Block>,
        /// Model that wrote it, when known.
        model: Option<String>,
        /// Why it ended, when known.
        stop: Option<StopReason>,
        /// Usage the provider reported for the request that produced it.
        usage: Option<Usage>,
    },
    /// The result of one tool call.
    ToolResult {
        /// Id of the call this answers.
        call_id: String,
        /// Tool name, when the source names it.
        tool_name: String,
        /// Content blocks (text and images).
        content: Vec<Block>,
        /// Whether the tool reported an error.
        is_error: bool,
    },
}

impl Message {
    /// Short role name: `user`, `assistant` or `tool`.
    pub fn role(&self) -> &'static str {
        match self {
            Message::User { .. } => "user",
            Message::Assistant { .. } => "assistant",
            Message::ToolResult { .. } => "tool",
        }
    }

    /// The message's content blocks.
    pub fn content(&self) -> &[Block] {
        match self {
            Message::User { content, .. }
            | Message::Assistant { content, .. }
            | Message::ToolResult { content, .. } => content,
        }
    }

    /// A user message made of one text block.
    pub fn user_text(text: impl Into<String>, origin: UserOrigin) -> Message {
        Message::User { content: vec![Block::Text { text: text.into() }], origin }
    }

    /// Tool calls of an assistant message, in order (empty for other roles).
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        let blocks: &[Block] = match self {
            Message::Assistant { content, .. } => content,
            _ => &[],
        };
        blocks.iter().filter_map(|b| match b {
            Block::ToolCall { id, name, arguments } => Some((id.as_str(), name.as_str(), arguments.as_str())),
            _ => None,
        })
    }

    /// Concatenated text of every text block.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for b in self.content() {
            if let Block::Text { text } = b {
                out.push_str(text);
            }
        }
        out
    }
}

/// How a host compaction's summary reads in the model context (condense's wording, shared by the
/// render and the importers).
pub fn host_summary_text(summary: &str) -> String {
    format!("[Earlier conversation, compacted by the host]\n\n{summary}")
}

/// A rendered model context: messages shared with the projection that produced them.
pub type Context = Vec<Arc<Message>>;
