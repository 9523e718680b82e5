//! A summarizer that asks a model over HTTP: an OpenAI-compatible chat-completions endpoint by default,
//! or, for `condense serve`'s summaries through the upstream, the Anthropic Messages or OpenAI Responses
//! API with the client's own headers. One request per batch; each
//! output is labelled with its ref and tool, and the model is asked for one block per ref starting with
//! `tN:`, so every bullet carries its ref. Timeouts: `idle` bounds connecting and every wait for the
//! server (for its response, and between reads of the body), `total` the whole call. The request goes
//! through the workspace's one HTTP client (reqwest), on a runtime of the call's own: the summarizer is
//! called from synchronous code (the pipeline, on a blocking thread in `condense serve`). Any failure or a reply
//! that misses a ref is an error; wrap it in [`crate::WithFallback`] to fall back to the extractive
//! summarizer.

use crate::{Item, SummarizeError, Summarizer};
use condense_events::Block;
use condense_formats::wire::{reply_of, Api};
use std::time::Duration;

/// Settings of the HTTP summarizer.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Base URL, such as `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// The API key (read by the caller from the environment variable the configuration names).
    pub api_key: Option<String>,
    /// Idle timeout (default 20 s).
    pub idle: Duration,
    /// Total timeout (default 180 s).
    pub total: Duration,
    /// Characters of each output sent (the head and tail are kept when longer).
    pub max_chars_per_output: usize,
    /// The API the endpoint speaks (default: Chat Completions).
    pub api: Api,
    /// Headers sent with every call besides the content type (a client's own credentials, when serve
    /// summarizes through the upstream): never logged, never written anywhere.
    pub headers: Vec<(String, String)>,
    /// Fields of the client's own request that summary requests carry as they are: its reasoning setting
    /// (`reasoning_effort`, `reasoning`, `thinking`), so a handoff is prepared at the session's effort
    /// (seed 004). A `thinking` budget is added to `max_tokens`, which Anthropic wants larger.
    pub extra: Vec<(String, serde_json::Value)>,
}


impl HttpConfig {
    /// Settings with the default timeouts.
    pub fn new(base_url: &str, model: &str, api_key: Option<String>) -> HttpConfig {
        HttpConfig {
            base_url: base_url.trim_end_matches('/').to_string(),
            model: model.to_string(),
            api_key,
            idle: Duration::from_secs(20),
            total: Duration::from_secs(180),
            max_chars_per_output: 12_000,
            api: Api::Chat,
            headers: Vec::new(),
            extra: Vec::new(),
        }
    }
}

/// The HTTP summarizer.
pub struct HttpSummarizer {
    cfg: HttpConfig,
}

/// The instructions of a batch summary request (serve's fake provider recognises a summary request by
/// them).
pub const SYSTEM: &str = "You summarize tool outputs for a coding agent whose context is being pruned. For each \
output, write one block that starts with its ref followed by a colon (for example `t12: ...`), in at most \
three short lines: what the tool returned, errors verbatim, file paths and counts that matter. Write nothing \
else.";

/// The largest handoff piece sent: the seed's input budget ceiling (`min(262144, 0.7 × window)`).
pub const HANDOFF_MAX_INPUT: usize = 262_144;

fn clip_middle(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max / 2).collect();
    let tail: String = text.chars().skip(n - max / 2).collect();
    format!("{head}\n[… {} characters omitted …]\n{tail}", n - max)
}

impl HttpSummarizer {
    /// A summarizer with these settings.
    pub fn new(cfg: HttpConfig) -> HttpSummarizer {
        HttpSummarizer { cfg }
    }

    fn batch_text(&self, batch: &[Item<'_>]) -> String {
        let mut user = String::new();
        for i in batch {
            user.push_str(&format!(
                "### t{} ({}{}) arguments: {}\n{}\n\n",
                i.ref_n,
                i.tool,
                if i.is_error { ", error" } else { "" },
                clip_middle(i.arguments, 300),
                clip_middle(i.text, self.cfg.max_chars_per_output)
            ));
        }
        user
    }
}

/// Splits a reply into one block per ref; `None` if a ref has no block.
pub fn split_reply(reply: &str, refs: &[u32]) -> Option<Vec<String>> {
    let mut starts: Vec<(usize, u32)> = Vec::new();
    for &r in refs {
        let label = format!("t{r}:");
        let at = reply
            .match_indices(&label)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || !reply.as_bytes()[i - 1].is_ascii_alphanumeric())?;
        starts.push((at, r));
    }
    let mut sorted = starts.clone();
    sorted.sort();
    let mut out = Vec::with_capacity(refs.len());
    for &(at, _) in &starts {
        let end = sorted.iter().map(|(s, _)| *s).find(|&s| s > at).unwrap_or(reply.len());
        let block = reply[at..end].trim();
        if block.len() <= "t0:".len() {
            return None;
        }
        out.push(block.trim_start_matches(['-', '*', ' ']).to_string());
    }
    Some(out)
}

/// The instructions of a handoff request.
pub const HANDOFF: &str = "You write the checkpoint handoff for a coding agent whose earlier conversation is being \
replaced by your summary. Use these sections, in this order, as Markdown headings: Goal, Constraints, Progress, \
Decisions, Files read, Files modified, Next steps. Keep exact paths, commands, error messages and refs such as t12. \
Be brief.";

/// The instructions of a recovery handoff request (seed 004): the sections the seed names, each item citing
/// the entry ids the transcript's lines start with.
pub const RECOVERY_HANDOFF: &str = "You write the handoff that lets a coding agent continue on a model with a smaller \
context window; its earlier conversation is archived and replaced by your handoff. The transcript's lines start with \
entry ids in brackets such as [e12]. Use these sections, in this order, as Markdown headings: Task (the current \
task: the latest request and what it is part of), Constraints, Decisions, Completed actions, Uncertain actions, Dependencies, References, Next step. End every item \
with the ids of the entries it comes from, in brackets. Under Uncertain actions list calls that failed or whose \
result is not in the transcript. Keep exact paths, commands, error messages and refs such as t12. Be brief.";

impl HttpSummarizer {
    fn chat(&self, system: &str, user: &str, max_tokens: u64) -> Result<String, SummarizeError> {
        let fail = |reason: String| SummarizeError::Failed { name: format!("http {}", self.cfg.base_url), reason };
        let (url, body) = match self.cfg.api {
            Api::Chat => (
                format!("{}/chat/completions", self.cfg.base_url),
                serde_json::json!({
                    "model": self.cfg.model,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                }),
            ),
            Api::Anthropic => (
                format!("{}/messages", self.cfg.base_url),
                serde_json::json!({
                    "model": self.cfg.model,
                    "max_tokens": max_tokens,
                    "system": system,
                    "messages": [{"role": "user", "content": user}],
                }),
            ),
            Api::Responses => (
                format!("{}/responses", self.cfg.base_url),
                serde_json::json!({"model": self.cfg.model, "instructions": system, "input": user, "store": false}),
            ),
            // The model is in the path (`base_url` ends with the API version, `/v1beta`).
            Api::Gemini => (
                format!("{}/models/{}:generateContent", self.cfg.base_url, self.cfg.model),
                serde_json::json!({
                    "systemInstruction": {"parts": [{"text": system}]},
                    "contents": [{"role": "user", "parts": [{"text": user}]}],
                    "generationConfig": {"maxOutputTokens": max_tokens},
                }),
            ),
        };
        let mut body = body;
        for (k, v) in &self.cfg.extra {
            if let (Some(budget), Some(max)) = (v.get("budget_tokens").and_then(serde_json::Value::as_u64), body.get("max_tokens").and_then(serde_json::Value::as_u64)) {
                body["max_tokens"] = serde_json::json!(max + budget);
            }
            body[k.as_str()] = v.clone();
        }
        let body = serde_json::to_vec(&body).map_err(|e| fail(e.to_string()))?;
        // A runtime and a client per call: both live and end inside this synchronous call, so neither is
        // ever dropped inside another runtime (serve's), and no connection outlives the runtime it runs on.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(format!("starting the HTTP client: {e}")))?;
        let (status, text) = rt
            .block_on(async {
                let client = reqwest::Client::builder()
                    .connect_timeout(self.cfg.idle)
                    .read_timeout(self.cfg.idle)
                    .timeout(self.cfg.total)
                    .build()?;
                let mut req = client.post(&url).header("content-type", "application/json").body(body);
                if let Some(key) = &self.cfg.api_key {
                    req = req.header("authorization", format!("Bearer {key}"));
                }
                for (k, v) in &self.cfg.headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let resp = req.send().await?;
                let status = resp.status().as_u16();
                Ok::<_, reqwest::Error>((status, resp.text().await?))
            })
            .map_err(|e| fail(describe_error(e)))?;
        if status != 200 {
            return Err(fail(format!("status {status}: {}", clip_middle(&text, 200))));
        }
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(format!("reply is not JSON: {e}")))?;
        // The reply read as serve reads the upstream's: its text blocks, joined.
        let content = reply_of(self.cfg.api, &v).map(|(m, _)| m).filter(|m| m.content().iter().any(|b| matches!(b, Block::Text { .. }))).map(|m| m.text());
        content.ok_or_else(|| fail("reply has no message content".into()))
    }

    /// A handoff of `transcript` asked for with `instructions`, at most `max` bytes. The caller sends pieces
    /// within the preparation's input budget (seed 004); a larger one is refused whole, never cut in the
    /// middle without saying so.
    fn handoff_with(&self, instructions: &str, transcript: &str, max: usize) -> Result<String, SummarizeError> {
        if transcript.len() > HANDOFF_MAX_INPUT {
            return Err(SummarizeError::Failed {
                name: format!("http {}", self.cfg.base_url),
                reason: format!("a handoff piece of {} bytes, over the {HANDOFF_MAX_INPUT}-byte input budget", transcript.len()),
            });
        }
        self.bounded(self.chat(instructions, transcript, (max as u64 / 3).clamp(256, 16_384))?, max)
    }

    /// `text` when it is not blank and within `max` bytes (the bound recovery checks is in bytes: an answer
    /// checked in characters passed here and failed there when it was not ASCII).
    fn bounded(&self, text: String, max: usize) -> Result<String, SummarizeError> {
        if text.trim().is_empty() || text.len() > max {
            return Err(SummarizeError::Failed { name: format!("http {}", self.cfg.base_url), reason: format!("handoff of {} bytes (blank or over {max})", text.len()) });
        }
        Ok(text)
    }
}

/// An HTTP error with its causes on one line (reqwest's own text leaves out why: a timeout, a refused
/// connection), the URL left out. Serve names an unreachable upstream's cause with it too.
pub fn describe_error(e: reqwest::Error) -> String {
    let timed_out = e.is_timeout();
    let e = e.without_url();
    let mut text = if timed_out { "timed out".to_string() } else { e.to_string() };
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

impl Summarizer for HttpSummarizer {
    fn name(&self) -> &str {
        "http"
    }

    fn handoff(&self, transcript: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.handoff_with(HANDOFF, transcript, max_chars).map(Some)
    }

    /// A recovery piece's handoff, asked for with the seed's sections ([`RECOVERY_HANDOFF`]); the engine
    /// checks the joined handoff has them (`condense_checkpoint::repair_recovery_handoff`).
    fn recovery_handoff(&self, piece: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.handoff_with(RECOVERY_HANDOFF, piece, max_chars).map(Some)
    }

    fn summarize(&self, batch: &[Item<'_>]) -> Result<Vec<String>, SummarizeError> {
        let content = self.chat(SYSTEM, &self.batch_text(batch), 4096)?;
        let refs: Vec<u32> = batch.iter().map(|i| i.ref_n).collect();
        split_reply(&content, &refs).ok_or_else(|| SummarizeError::Count {
            name: format!("http {}", self.cfg.base_url),
            got: refs.iter().filter(|r| content.contains(&format!("t{r}:"))).count(),
            want: refs.len(),
        })
    }
}

