//! Importers that turn real agent session files into condense source events, and exporters that write a
//! rendered context as provider requests.
//!
//! Every importer is tolerant of the defects real files have (two JSON objects on one line, a broken
//! escape, a dangling parent id, a missing header, calls whose results never came): each is reported as a
//! [`Diagnostic`] naming file and line, every good line is kept, and nothing panics. The diagnostics are
//! also returned as `ImportDiagnostic` events so they stay in the log beside the session.
//!
//! # Example
//!
//! Importing a pi session (the format is detected) and writing its messages as an OpenAI request's:
//!
//! ```
//! use condense_events::{Entry, SourceEvent};
//! use condense_formats::Format;
//!
//! let file = br#"{"type":"session","version":3,"id":"s1","timestamp":"2026-01-01T00:00:00Z","cwd":"/w"}
//! {"type":"message","id":"m1","parentId":null,"message":{"role":"user","content":"hello"}}
//! {"type":"message","id":"m2","parentId":"m1","message":{"role":"assistant","content":[{"type":"text","text":"hi"}]}}
//! "#;
//! let imported = condense_formats::import_bytes("session.jsonl", file)?;
//! assert_eq!(imported.format, Format::Pi);
//! assert!(imported.diagnostics.is_empty());
//! let messages: Vec<_> = imported
//!     .events
//!     .iter()
//!     .filter_map(|e| match e {
//!         SourceEvent::EntryAppended { entry: Entry::Message(m), .. } => Some(m),
//!         _ => None,
//!     })
//!     .collect();
//! let request = condense_formats::export::openai(&messages);
//! assert_eq!(request[1]["role"], "assistant");
//! # Ok::<(), String>(())
//! ```

mod claude;
mod codex;
mod codex_item;
mod documents;
pub mod export;
mod json;
mod jsonl;
mod pi;
pub mod scan;
pub mod wire;

use condense_events::SourceEvent;
use std::path::{Path, PathBuf};

pub use jsonl::Diagnostic;

/// The session file formats condense reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// pi session JSONL, versions 1 to 3 (and the GJC fork).
    Pi,
    /// Claude Code session JSONL.
    ClaudeCode,
    /// OpenAI Codex CLI rollout JSONL.
    Codex,
    /// opencode session export (one JSON document).
    OpenCode,
    /// Gemini CLI chat (one JSON document).
    GeminiCli,
    /// OpenHands event stream (a JSON array of events).
    OpenHands,
    /// SWE-agent trajectory (`*.traj`).
    SweAgent,
    /// mini-swe-agent trajectory (`*.traj.json`).
    MiniSweAgent,
}

impl Format {
    /// The format's short name, as stored in `SessionStarted::source`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Pi => "pi",
            Format::ClaudeCode => "claude-code",
            Format::Codex => "codex",
            Format::OpenCode => "opencode",
            Format::GeminiCli => "gemini-cli",
            Format::OpenHands => "openhands",
            Format::SweAgent => "swe-agent",
            Format::MiniSweAgent => "mini-swe-agent",
        }
    }
}

/// Errors that stop an import as a whole. Problems with single lines are [`Diagnostic`]s instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a session in any format condense reads.
    #[error("{path}: not a session condense reads (pi, Claude Code, Codex, opencode, Gemini CLI, OpenHands, SWE-agent, mini-swe-agent): {reason}")]
    Unrecognized {
        /// The file.
        path: PathBuf,
        /// Why detection failed.
        reason: String,
    },
}

/// A session read from a file.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The detected format.
    pub format: Format,
    /// Source events in order; the first is `SessionStarted`, diagnostics come last.
    pub events: Vec<SourceEvent>,
    /// What could not be taken as it stood.
    pub diagnostics: Vec<Diagnostic>,
}

/// Guesses the format from the first objects of a file.
pub fn detect(objects: &[jsonl::Line]) -> Option<Format> {
    for line in objects.iter().take(50) {
        let v = &line.value;
        let Some(t) = v.get("type").and_then(|t| t.as_str()) else { continue };
        match t {
            "session" => return Some(Format::Pi),
            "session_meta" | "response_item" | "event_msg" | "turn_context" | "compacted" if v.get("payload").is_some() => {
                return Some(Format::Codex);
            }
            "user" | "assistant" | "system" | "progress" | "file-history-snapshot" | "queue-operation" | "summary"
                if v.get("uuid").is_some() || v.get("sessionId").is_some() || v.get("leafUuid").is_some()
                    || v.get("messageId").is_some() =>
            {
                return Some(Format::ClaudeCode);
            }
            "message" if v.get("message").and_then(|m| m.get("role")).is_some() => return Some(Format::Pi),
            "compaction" | "model_change" | "thinking_level_change" | "custom" | "custom_message" => {
                return Some(Format::Pi);
            }
            _ => {}
        }
    }
    None
}

/// Reads and imports one session file, detecting its format.
pub fn import_file(path: &Path) -> Result<Imported, FormatError> {
    let bytes = std::fs::read(path).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })?;
    import_bytes(&path.display().to_string(), &bytes)
        .map_err(|reason| FormatError::Unrecognized { path: path.to_path_buf(), reason })
}

/// The sessions a file holds, each with its key within the file: one session (key `None`) for every
/// format, except an OpenHands evaluation output, which holds one trajectory per line (keyed by instance
/// id).
pub fn import_sessions(file: &str, bytes: &[u8]) -> Result<Vec<(Option<String>, Imported)>, String> {
    let bytes = json::without_bom(bytes);
    if let Some(many) = documents::evaluation_output(file, bytes) {
        return many.map(|v| v.into_iter().map(|(k, i)| (Some(k), i)).collect());
    }
    import_bytes(file, bytes).map(|i| vec![(None, i)])
}

/// A line-format session (pi, Claude Code, Codex) read from a stream: its events go to `emit` as they
/// are read (each once no later line can change it), so a file of any size is never held whole. The
/// events are those [`import_bytes`] gives for the same bytes, diagnostics last.
/// `Ok(None)`: the stream is not one of these (a JSON document, pretty-printed objects, an OpenHands
/// evaluation output, or nothing known) and nothing was emitted: read it whole with [`import_sessions`].
pub fn import_stream(file: &str, reader: impl std::io::BufRead, emit: &mut dyn FnMut(SourceEvent)) -> std::io::Result<Option<Streamed>> {
    let mut lines = jsonl::ReadLines::new(file, reader);
    let head: Vec<jsonl::Line> = lines.by_ref().take(DETECT_LINES).collect();
    if let Some(e) = lines.error.take() {
        return Err(e);
    }
    let Some(format) = detect(&head) else { return Ok(None) };
    if head.first().is_some_and(|l| documents::detect(&l.value).is_some()) {
        return Ok(None);
    }
    lines.fast = fast_reader(format);
    let all_lines = head.into_iter().chain(lines.by_ref());
    let mut diagnostics = match format {
        Format::Pi => pi::import_to(file, all_lines, emit),
        Format::ClaudeCode => claude::import_to(file, all_lines, emit),
        Format::Codex => codex::import_to(file, all_lines, emit),
        Format::OpenCode | Format::GeminiCli | Format::OpenHands | Format::SweAgent | Format::MiniSweAgent => {
            unreachable!("document formats are detected on the whole document, never from lines")
        }
    };
    if let Some(e) = lines.error.take() {
        return Err(e);
    }
    let mut all = std::mem::take(&mut lines.diagnostics);
    all.append(&mut diagnostics);
    Ok(Some(Streamed { format, diagnostics: diagnostics_last(all, emit) }))
}

/// `diagnostics` in line order, each also handed to `emit` as its event (after the session's own).
fn diagnostics_last(mut diagnostics: Vec<Diagnostic>, emit: &mut dyn FnMut(SourceEvent)) -> Vec<Diagnostic> {
    diagnostics.sort_by_key(|d| d.line);
    diagnostics.iter().for_each(|d| emit(d.event()));
    diagnostics
}

/// What [`import_stream`] read besides the events it emitted.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// The session's format.
    pub format: Format,
    /// What could not be taken as it stood (also emitted, last, as `ImportDiagnostic` events).
    pub diagnostics: Vec<Diagnostic>,
}

/// Lines read before the format is decided.
const DETECT_LINES: usize = 50;

/// Imports a session held in memory; `file` names it in diagnostics.
pub fn import_bytes(file: &str, bytes: &[u8]) -> Result<Imported, String> {
    import_bytes_with(file, bytes, true)
}

/// [`import_bytes`], with the formats' fast line readers or (`fast: false`, the tests' reference) every
/// line parsed into a `Value`.
fn import_bytes_with(file: &str, bytes: &[u8], fast: bool) -> Result<Imported, String> {
    let bytes = json::without_bom(bytes);
    // A session saved as one JSON document (opencode, Gemini CLI, OpenHands, SWE-agent, mini-swe-agent).
    let mut document = None;
    // Where a document that opens like one ends before it is complete.
    let mut cut_short = None;
    if matches!(bytes.trim_ascii_start().first(), Some(b'{' | b'[')) {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(v) => {
                if let Some(format) = documents::detect(&v) {
                    let out = documents::import(format, file, v);
                    let mut events = out.events;
                    events.extend(out.diagnostics.iter().map(Diagnostic::event));
                    return Ok(Imported { format, events, diagnostics: out.diagnostics });
                }
                document = Some(v);
            }
            Err(e) if e.is_eof() => cut_short = Some((e.line(), e.column())),
            Err(_) => {}
        }
    }
    let mut lines = jsonl::Lines::new(file, bytes);
    let head: Vec<jsonl::Line> = lines.by_ref().take(DETECT_LINES).collect();
    let (format, mut out, diagnostics) = match detect(&head) {
        Some(format) => {
            lines.fast = fast_reader(format).filter(|_| fast);
            let mut out = run(format, file, head.into_iter().chain(lines.by_ref()));
            let mut diagnostics = std::mem::take(&mut lines.diagnostics);
            diagnostics.append(&mut out.diagnostics);
            (format, out, diagnostics)
        }
        None => {
            // Some tools save pretty-printed objects, one per several lines: read the file as a stream.
            let stream = jsonl::read_stream(bytes).filter(|s| !s.is_empty());
            let format = stream.as_deref().and_then(detect);
            match (stream, format) {
                (Some(stream), Some(format)) => {
                    let mut out = run(format, file, stream.into_iter());
                    let mut diagnostics = vec![Diagnostic {
                        file: file.to_string(),
                        line: 1,
                        message: "objects span several lines; read as a JSON stream".into(),
                    }];
                    diagnostics.append(&mut out.diagnostics);
                    (format, out, diagnostics)
                }
                _ => {
                    let rest: Vec<_> = lines.by_ref().collect();
                    return Err(if let Some((line, column)) = cut_short {
                        format!(
                            "the JSON document is cut short: it ends at line {line}, column {column} (byte {}) before its closing brackets; the file was truncated or is still being written, and nothing of it was imported",
                            bytes.len()
                        )
                    } else if let Some(v) = document {
                        format!("it looks like {}", documents::looks_like(&v))
                    } else if let Some(first) = head.first() {
                        format!("no line has a known shape; line {} looks like {}", first.line, documents::looks_like(&first.value))
                    } else if !rest.is_empty() {
                        "no line has a known shape".to_string()
                    } else if let Some(d) = lines.diagnostics.first() {
                        d.to_string()
                    } else {
                        "the file holds no JSON lines".into()
                    });
                }
            }
        }
    };
    let diagnostics = diagnostics_last(diagnostics, &mut |e| out.events.push(e));
    Ok(Imported { format, events: out.events, diagnostics })
}

/// The fast reader of a format's lines, where it has one (pi's message lines); lines it does not read
/// are parsed into a `Value` as before, and the events are the same either way.
fn fast_reader(format: Format) -> Option<jsonl::FastRead> {
    match format {
        Format::Pi => Some(|text| pi::fast(text).map(jsonl::Fast::Entry)),
        Format::Codex => Some(codex::fast),
        _ => None,
    }
}

fn run(format: Format, file: &str, lines: impl Iterator<Item = jsonl::Line>) -> Output {
    match format {
        Format::Pi => pi::import(file, lines),
        Format::ClaudeCode => claude::import(file, lines),
        Format::Codex => codex::import(file, lines),
        Format::OpenCode | Format::GeminiCli | Format::OpenHands | Format::SweAgent | Format::MiniSweAgent => {
            unreachable!("document formats are detected on the whole document, never from lines")
        }
    }
}

/// Turns entries into a linear chain of `EntryAppended` events (each entry's parent is the one before),
/// with each side event (model changes, usage) placed before the entry at the index it was recorded at.
pub(crate) fn linear_chain(
    entries: impl IntoIterator<Item = (String, condense_events::Entry)>,
    side: Vec<(usize, SourceEvent)>,
) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    let mut push = |e| out.push(e);
    let mut chain = Chain::new(&mut push);
    side.into_iter().for_each(|(at, e)| chain.side(at, e));
    entries.into_iter().for_each(|(id, entry)| chain.entry(id, entry));
    chain.finish();
    out
}

/// [`linear_chain`] as a stream: an importer hands over each entry once nothing can change it any more,
/// and each side event with the index of the entry it goes before; the events leave in the order
/// [`linear_chain`] gives them.
pub(crate) struct Chain<'a> {
    emit: &'a mut dyn FnMut(SourceEvent),
    /// Whether the session's start went out: nothing else leaves before it.
    started: bool,
    parent: Option<String>,
    /// Entries emitted so far: the index of the next one.
    emitted: usize,
    /// Side events waiting for the entry they go before, in the order they came.
    side: std::collections::VecDeque<(usize, SourceEvent)>,
}

impl<'a> Chain<'a> {
    pub(crate) fn new(emit: &'a mut dyn FnMut(SourceEvent)) -> Chain<'a> {
        Chain { emit, started: false, parent: None, emitted: 0, side: std::collections::VecDeque::new() }
    }

    /// The session's start (`SessionStarted`), which leaves at once, ahead of anything held.
    pub(crate) fn start(&mut self, e: SourceEvent) {
        self.started = true;
        (self.emit)(e);
    }

    /// Entries handed over so far: the session index of the next one.
    pub(crate) fn emitted(&self) -> usize {
        self.emitted
    }

    /// Whether [`Chain::start`] was called: an importer hands entries over only after it.
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// A side event to place before entry `at` (after the last entry if no entry `at` comes).
    pub(crate) fn side(&mut self, at: usize, e: SourceEvent) {
        self.side.push_back((at, e));
    }

    /// The next entry of the chain.
    pub(crate) fn entry(&mut self, id: String, entry: condense_events::Entry) {
        while self.side.front().is_some_and(|(at, _)| *at <= self.emitted) {
            (self.emit)(self.side.pop_front().expect("peeked").1);
        }
        (self.emit)(SourceEvent::EntryAppended { id: id.clone(), parent: self.parent.replace(id), entry });
        self.emitted += 1;
    }

    /// The side events recorded after the last entry.
    pub(crate) fn finish(self) {
        self.side.into_iter().for_each(|(_, e)| (self.emit)(e));
    }
}

/// What a format importer produces before the shared diagnostics are merged in.
pub(crate) struct Output {
    pub(crate) events: Vec<SourceEvent>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// What the fast readers' tests share.
#[cfg(test)]
pub(crate) mod fast_tests {
    use std::path::{Path, PathBuf};

    /// Every `.jsonl` file of the corpus folder of `format` (`../shared/corpus/<format>`), sorted.
    pub(crate) fn corpus_files(format: &str) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|e| e == "jsonl") {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus").join(format), &mut out);
        out
    }

    /// Every corpus file of `format` (at least `min_files` of them) gives the same events and diagnostics
    /// with the fast readers as through values ([`both`]); how many of their lines `fast` reads.
    pub(crate) fn corpus(format: &str, min_files: usize, fast: impl Fn(&str) -> bool) -> usize {
        let files = corpus_files(format);
        assert!(files.len() >= min_files, "the corpus {format} sessions: {files:?}");
        let mut fast_lines = 0;
        for f in &files {
            let bytes = std::fs::read(f).unwrap();
            fast_lines += bytes.split(|&b| b == b'\n').filter(|l| std::str::from_utf8(l).is_ok_and(&fast)).count();
            both(&f.display().to_string(), &bytes);
        }
        fast_lines
    }

    /// `bytes` (named `name`) give the same events and diagnostics with the fast readers as through values.
    pub(crate) fn both(name: &str, bytes: &[u8]) {
        let fast = crate::import_bytes_with(name, bytes, true).unwrap();
        let slow = crate::import_bytes_with(name, bytes, false).unwrap();
        assert_eq!(fast.events, slow.events, "{name}");
        assert_eq!(fast.diagnostics, slow.diagnostics, "{name}");
    }
}

/// Line types a client writes that carry nothing of the model's context, by client, as names or prefixes
/// ending in `*`: skipped without a word (docs/importers.md, "Skipped line types").
pub const SKIPPED_LINE_TYPES: &[(&str, &[&str])] = &[
    (
        "claude-code",
        &[
            "progress", "file-history-*", "queue-operation", "summary", "permission-mode", "mode", "ai-title", "custom-title", "last-prompt",
            "attachment", "tag", "agent-name", "atis-latch", "bridge-session", "pr-link", "cost-state", "frame-link", "history-suppression",
            "artifact-*", "api-request*", "api-response*", "tools-used", "relocated", "started", "result",
        ],
    ),
    ("codex", &["world_state", "token_usage_record"]),
];

/// Whether `client` writes line type `kind` only for itself ([`SKIPPED_LINE_TYPES`]).
pub(crate) fn skipped_line_type(client: &str, kind: &str) -> bool {
    SKIPPED_LINE_TYPES
        .iter()
        .filter(|(c, _)| *c == client)
        .flat_map(|(_, names)| names.iter())
        .any(|n| match n.strip_suffix('*') {
            Some(prefix) => kind.starts_with(prefix),
            None => kind == *n,
        })
}

/// Unknown line types, each reported once (on its first line) rather than on every line.
#[derive(Default)]
pub(crate) struct UnknownTypes(std::collections::BTreeSet<String>);

impl UnknownTypes {
    /// The diagnostic for an unknown line type on line `line`, the first time it is met.
    pub(crate) fn first(&mut self, file: &str, line: u64, kind: &str) -> Option<jsonl::Diagnostic> {
        self.0.insert(kind.to_string()).then(|| jsonl::Diagnostic {
            file: file.to_string(),
            line,
            message: format!("unknown line type `{kind}` skipped (and every later line of this type)"),
        })
    }
}

