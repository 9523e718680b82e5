//! The neutral message model: what a provider-agnostic model context is made of.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One content block of a message. A text block is the size of its `String` (24 bytes); the rarer kinds
/// of two or three strings are boxed, so a list of text blocks — most of every session — is not laid out
/// for a tool call's three strings (72 bytes a block). Serialized as if the variants held their fields
/// inline: the events' bytes are the same either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Model reasoning, with the provider's signature when it gave one.
    Thinking(Box<Thinking>),
    /// A tool call made by the assistant.
    ToolCall(Box<ToolCall>),
    /// An image, base64-encoded (or a reference the host understands).
    Image(Box<Image>),
    /// A block of a kind condense does not model (a provider's newer block type): its type and its JSON as
    /// the source wrote it. Kept so nothing is silently lost; recovery reads text only and fails closed on
    /// one (seed 004).
    Opaque(Box<Opaque>),
}

/// A block of an unmodelled kind ([`Block::Opaque`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opaque {
    /// The block's `type` as the source named it.
    pub kind: String,
    /// The whole block as compact JSON text.
    pub json: String,
}

/// Model reasoning ([`Block::Thinking`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thinking {
    /// The reasoning text (or the provider's summary of it).
    pub thinking: String,
    /// Opaque signature needed to send the block back to its provider.
    pub signature: Option<String>,
}

/// A tool call ([`Block::ToolCall`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's call id (pairs with [`Message::ToolResult::call_id`]).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as the source gave them: compact JSON text, or the raw string when the source held one.
    pub arguments: String,
}

/// An image ([`Block::Image`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// MIME type such as `image/png`.
    pub mime: String,
    /// Base64 data or reference.
    pub data: String,
}

impl Block {
    /// A reasoning block.
    pub fn thinking(thinking: String, signature: Option<String>) -> Block {
        Block::Thinking(Box::new(Thinking { thinking, signature }))
    }

    /// A tool call.
    pub fn tool_call(id: String, name: String, arguments: String) -> Block {
        Block::ToolCall(Box::new(ToolCall { id, name, arguments }))
    }

    /// An image.
    pub fn image(mime: String, data: String) -> Block {
        Block::Image(Box::new(Image { mime, data }))
    }

    /// A block of an unmodelled kind.
    pub fn opaque(kind: String, json: String) -> Block {
        Block::Opaque(Box::new(Opaque { kind, json }))
    }

    /// Short name of the block kind, as used in reports and snapshots.
    pub fn kind(&self) -> &'static str {
        match self {
            Block::Text { .. } => "text",
            Block::Thinking(_) => "thinking",
            Block::ToolCall(_) => "tool_call",
            Block::Image(_) => "image",
            Block::Opaque(_) => "opaque",
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
    /// Host context: what the host tells the model about the world it works in — a system or developer
    /// message inside the conversation, Claude Code's environment message and `<system-reminder>`s,
    /// Codex's `<environment_context>`, `<user_instructions>` and AGENTS.md. Never stubbed, chained,
    /// merged or summarized away; after a checkpoint the newest of each kind (see
    /// [`Message::host_kind`]) is sent again verbatim (docs/pruning.md, "Host context").
    Host,
}

/// Tags a host wraps around an event it reports (a command the user ran, a task that ended): what
/// happened, not a description of the world, so not host context.
const EVENT_TAGS: &[&str] = &[
    "command-name",
    "command-message",
    "command-args",
    "local-command-stdout",
    "local-command-stderr",
    "local-command-caveat",
    "task-notification",
    "subagent_notification",
    "turn_aborted",
    "user_shell_command",
    "bash-input",
    "bash-stdout",
    "bash-stderr",
];

/// The name of the tag `text` opens with (`<name>` or `<name attr=…>`), when it opens with one.
fn opening_tag(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('<')?;
    let end = rest.find('>')?;
    let name = rest[..end].split(|c: char| c == '=' || c == '\n').next()?.trim_end();
    // `<permissions instructions>` is one name; `<tag attr="x">` is `tag`.
    let name = if rest[..end].contains('=') { name.rsplit_once(' ').map_or(name, |(n, _)| n) } else { name };
    let wordy = name.starts_with(|c: char| c.is_ascii_alphabetic()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ' ' | ':'));
    (wordy && name.len() <= 60).then_some(name)
}

/// The kind of host context a user-role text is, when it is host context: the tag it is wrapped in
/// (`system-reminder`, `environment_context`, `user_instructions`, …; not a tag a host wraps around an
/// event it reports, such as `command-name`), or `AGENTS.md` for Codex's `# AGENTS.md instructions for …`
/// message.
pub fn host_context_kind(text: &str) -> Option<&str> {
    let t = text.trim();
    if t.starts_with("# AGENTS.md instructions") {
        return Some("AGENTS.md");
    }
    if !t.ends_with('>') {
        return None;
    }
    opening_tag(t).filter(|name| !EVENT_TAGS.contains(name) && t.contains(&format!("</{name}>")))
}

/// `text` without the host-context blocks a host puts ahead of the user's words in one message
/// (Claude Code's leading `<system-reminder>…</system-reminder>`).
fn strip_leading_host_tags(text: &str) -> &str {
    let mut t = text.trim_start();
    while let Some(name) = opening_tag(t).filter(|n| !EVENT_TAGS.contains(n)) {
        let close = format!("</{name}>");
        match t.find(&close) {
            Some(at) => t = t[at + close.len()..].trim_start(),
            None => break,
        }
    }
    t
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
        /// Usage the provider reported for the request that produced it (boxed: most messages are not
        /// an assistant's, and a message is as large as its largest kind).
        usage: Option<Box<Usage>>,
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

    /// The bytes its text, arguments and data take (their lengths, read without scanning them).
    pub fn bytes(&self) -> usize {
        self.content()
            .iter()
            .map(|b| match b {
                Block::Text { text } => text.len(),
                Block::Thinking(t) => t.thinking.len() + t.signature.as_ref().map_or(0, String::len),
                Block::ToolCall(c) => c.id.len() + c.name.len() + c.arguments.len(),
                Block::Image(i) => i.mime.len() + i.data.len(),
                Block::Opaque(o) => o.kind.len() + o.json.len(),
            })
            .sum()
    }

    /// Gives back the room its content list and texts hold beyond what they hold: a list built by pushing
    /// keeps room for four blocks (288 bytes for one tool call), and a message kept for the session's
    /// life should weigh what it holds.
    pub fn shrink_to_fit(&mut self) {
        let content = match self {
            Message::User { content, .. } | Message::Assistant { content, .. } | Message::ToolResult { content, .. } => content,
        };
        content.shrink_to_fit();
        for b in content {
            match b {
                Block::Text { text } => text.shrink_to_fit(),
                Block::Thinking(t) => {
                    t.thinking.shrink_to_fit();
                    t.signature.iter_mut().for_each(String::shrink_to_fit);
                }
                Block::ToolCall(c) => [&mut c.id, &mut c.name, &mut c.arguments].into_iter().for_each(String::shrink_to_fit),
                Block::Image(i) => [&mut i.mime, &mut i.data].into_iter().for_each(String::shrink_to_fit),
                Block::Opaque(o) => [&mut o.kind, &mut o.json].into_iter().for_each(String::shrink_to_fit),
            }
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
            Block::ToolCall(c) => Some((c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
            _ => None,
        })
    }

    /// Whether this is a user prompt ([`UserOrigin::Prompt`]): where a chain starts.
    pub fn is_prompt(&self) -> bool {
        matches!(self, Message::User { origin: UserOrigin::Prompt, .. })
    }

    /// Whether this is host context ([`UserOrigin::Host`]).
    pub fn is_host(&self) -> bool {
        matches!(self, Message::User { origin: UserOrigin::Host, .. })
    }

    /// The kind of a host-context message, which a newer message of the same kind replaces: the tag its
    /// first text opens with (`environment_context`, `system-reminder`), else its first line (`# Environment`),
    /// at most 80 characters. `None` for any other message. Borrowed from the message: the render asks
    /// it of every host message at each full render after a checkpoint.
    pub fn host_kind(&self) -> Option<&str> {
        let Message::User { content, origin: UserOrigin::Host } = self else { return None };
        let t = content
            .iter()
            .find_map(|b| match b {
                Block::Text { text } if !text.trim().is_empty() => Some(text.trim_start()),
                _ => None,
            })
            .unwrap_or("");
        if let Some(name) = host_context_kind(t).or_else(|| opening_tag(t)) {
            return Some(name);
        }
        let line = t.lines().next().unwrap_or("").trim();
        Some(line.char_indices().nth(80).map_or(line, |(i, _)| &line[..i]))
    }

    /// What the user typed in a user message: its text blocks that are not host context, with the
    /// host-context tags a host puts ahead of the words in the same block taken off (what session names,
    /// checkpoint goals and handoff tasks are made from). Empty for host context and other roles.
    pub fn typed_text(&self) -> String {
        let Message::User { content, origin } = self else { return String::new() };
        if *origin == UserOrigin::Host {
            return String::new();
        }
        let mut out = String::new();
        for b in content {
            if let Block::Text { text } = b {
                let t = strip_leading_host_tags(text);
                if t.is_empty() || host_context_kind(t).is_some() {
                    continue;
                }
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(t);
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_context_is_told_by_its_tags() {
        let env = "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>";
        assert_eq!(host_context_kind(env), Some("environment_context"));
        assert_eq!(host_context_kind("<system-reminder>\nAttribution…\n</system-reminder>"), Some("system-reminder"));
        assert_eq!(host_context_kind("<permissions instructions>\nx\n</permissions instructions>"), Some("permissions instructions"));
        assert_eq!(host_context_kind("# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>x</INSTRUCTIONS>"), Some("AGENTS.md"));
        // Events the host reports, unclosed tags and words are not host context.
        assert_eq!(host_context_kind("<command-name>/clear</command-name>"), None);
        assert_eq!(host_context_kind("<environment_context> never closed >"), None);
        assert_eq!(host_context_kind("<3 this is great>"), None);
        assert_eq!(host_context_kind("fix the parser"), None);
    }

    #[test]
    fn typed_text_leaves_out_what_the_host_put_before_the_words() {
        let m = Message::User {
            content: vec![
                Block::Text { text: "<system-reminder>\nAttribution for git commits\n</system-reminder>".into() },
                Block::Text { text: "<system-reminder>a</system-reminder>\n\nCount the numbers with seq".into() },
            ],
            origin: UserOrigin::Prompt,
        };
        assert_eq!(m.typed_text(), "Count the numbers with seq");
        let host = Message::user_text("# Environment\nYou have been invoked…", UserOrigin::Host);
        assert_eq!(host.typed_text(), "");
        assert_eq!(host.host_kind(), Some("# Environment"));
        assert_eq!(Message::user_text("<environment_context><cwd>/w</cwd></environment_context>", UserOrigin::Host).host_kind(), Some("environment_context"));
        assert_eq!(m.host_kind(), None);
    }
}
