//! Summarizing tool outputs. [`Summarizer`] is what the pruning pipeline calls, once per batch; the
//! embedded default, [`Extractive`], needs no network and no model: it keeps a header naming the ref,
//! tool and size, the lines that report errors, the paths mentioned and, of a document the agent read
//! (or a command's output that repeats itself), its names (more the longer it is).
//! Its output depends only on its input, so a replay writes the same summaries.
//!
//! # Example
//!
//! ```
//! use condense_summarize::{Extractive, Item, Summarizer};
//!
//! let batch = [Item { ref_n: 3, tool: "bash", arguments: r#"{"command":"cargo test"}"#, text: "running 2 tests\nerror: test failed, src/lib.rs:12\n", is_error: true }];
//! let summaries = Extractive::default().summarize(&batch)?;
//! // One summary per output, naming its ref, keeping the error line and the path.
//! assert!(summaries[0].starts_with("t3 bash"));
//! assert!(summaries[0].contains("error: test failed") && summaries[0].contains("src/lib.rs"));
//! # Ok::<(), condense_summarize::SummarizeError>(())
//! ```

pub mod close;
pub mod http;

pub use close::Close;

pub use http::{HttpConfig, HttpSummarizer};

/// One output of a batch, as the summarizer sees it.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// The ref number (`t<ref_n>`).
    pub ref_n: u32,
    /// Tool name.
    pub tool: &'a str,
    /// Arguments of the call (JSON text).
    pub arguments: &'a str,
    /// The output text.
    pub text: &'a str,
    /// Whether the tool reported an error.
    pub is_error: bool,
}

/// Why a summarizer failed.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SummarizeError {
    /// The summarizer answered with a different number of summaries than items.
    #[error("{name}: {got} summaries for {want} outputs")]
    Count {
        /// Summarizer.
        name: String,
        /// Summaries received.
        got: usize,
        /// Outputs sent.
        want: usize,
    },
    /// The summarizer could not be reached or answered with an error.
    #[error("{name}: {reason}")]
    Failed {
        /// Summarizer.
        name: String,
        /// What went wrong.
        reason: String,
    },
}

/// Turns a batch of tool outputs into one summary per output, each naming its ref.
pub trait Summarizer: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;
    /// Summarizes a batch in one request; the result has one summary per item, in order.
    fn summarize(&self, batch: &[Item<'_>]) -> Result<Vec<String>, SummarizeError>;

    /// A checkpoint handoff of `transcript` in at most `max_chars`, with the sections a handoff needs
    /// (goal, constraints, progress, decisions, files read and modified, next steps). `Ok(None)` means
    /// "use the engine's deterministic handoff"; an error starts the retained-tail recovery.
    fn handoff(&self, transcript: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        let _ = (transcript, max_chars);
        Ok(None)
    }

    /// The handoff of one piece of a recovery onto a smaller model (seed 004): as [`Summarizer::handoff`]
    /// unless a summarizer treats the two apart (`condense serve` asks the upstream for these by default,
    /// and for checkpoint handoffs only with `--summaries upstream`).
    fn recovery_handoff(&self, piece: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.handoff(piece, max_chars)
    }

    /// How often a stand-in answered instead of this summarizer (only [`WithFallback`] has one).
    fn fallbacks(&self) -> Fallbacks {
        Fallbacks::default()
    }

    /// Why the preparation this summarizer serves must stop now, if it must (seeds 001 and 004: the request
    /// it prepares was abandoned, or new owner input arrived): a checkpoint or recovery then commits
    /// nothing. Asked before each call and before a commit.
    fn stopped(&self) -> Option<String> {
        None
    }
}

/// The deterministic extractive summarizer.
#[derive(Debug, Clone, Copy)]
pub struct Extractive {
    /// Longest line kept, in characters.
    pub line_chars: usize,
    /// Lines kept from the head.
    pub head: usize,
    /// Lines kept from the tail (the last line of a command is usually its verdict).
    pub tail: usize,
    /// Error lines kept.
    pub error_lines: usize,
    /// Paths kept of a command's (or any other tool's) output.
    pub paths: usize,
    /// Code names kept of a command's (or any other tool's) output (its most frequent distinctive
    /// identifiers).
    pub names: usize,
    /// Paths kept of a document (a file read, a fetched page, a subagent's report, a shell command that
    /// prints files: [`condense_index::is_document_output`]), by its size.
    pub document_paths: Scaled,
    /// Code names kept of a document, by its size, constants in capitals among them.
    pub document_names: Scaled,
    /// Code names kept, rarest first, of a command's output that repeats itself (at least half of its
    /// non-empty lines copies of another), by its size.
    pub repeated_names: Scaled,
}

/// A count that grows with a text's size: one per `bytes_per` bytes, within `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaled {
    /// The count for a short text.
    pub min: usize,
    /// Bytes of text per one more.
    pub bytes_per: usize,
    /// The count for a long text.
    pub max: usize,
}

impl Scaled {
    /// The count for a text of `len` bytes.
    pub fn of(&self, len: usize) -> usize {
        (len / self.bytes_per.max(1)).clamp(self.min, self.max.max(self.min))
    }
}

impl Default for Extractive {
    /// Measured on the corpus (docs/pruning.md, "Documents keep their names"): what the agent later
    /// writes comes from the many names of the files and reports it read, and rarely from a command's: a
    /// document's stub keeps a name per 350 bytes (8 to 128) and a path per 2,000 (3 to 32), a command's
    /// stub its three first paths and no names, unless its output repeats itself: then a name per 1,000
    /// bytes (up to 64), rarest first, what tells the copies apart.
    fn default() -> Self {
        Extractive {
            line_chars: 80,
            head: 0,
            tail: 0,
            error_lines: 2,
            paths: 3,
            names: 0,
            document_paths: Scaled { min: 3, bytes_per: 2_000, max: 32 },
            document_names: Scaled { min: 8, bytes_per: 350, max: 128 },
            repeated_names: Scaled { min: 0, bytes_per: 1_000, max: 64 },
        }
    }
}

pub use condense_index::facts::is_code_identifier;

/// Whether at least half of `lines` are copies of another: the output repeats a template (a block per
/// item of a loop, a retried error), and what varies from copy to copy is what tells the items apart.
fn repeats_itself(lines: &[&str]) -> bool {
    let distinct: std::collections::BTreeSet<&str> = lines.iter().copied().collect();
    !lines.is_empty() && (lines.len() - distinct.len()) * 2 >= lines.len()
}

/// How [`code_names`] ranks the names it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rank {
    /// The most frequent first.
    Frequent,
    /// The rarest first.
    Rare,
}

/// The code identifiers of `text` ([`is_code_identifier`]), constants in capitals only with
/// `constants`, ranked by `rank` (ties in order of first appearance), at most `max`.
fn code_names(text: &str, max: usize, constants: bool, rank: Rank) -> Vec<&str> {
    if max == 0 {
        return Vec::new();
    }
    let mut seen: std::collections::BTreeMap<&str, (usize, usize)> = std::collections::BTreeMap::new();
    for (k, w) in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).enumerate() {
        let b = w.as_bytes();
        if !is_code_identifier(b) || (!constants && b.iter().all(|c| c.is_ascii_uppercase() || *c == b'_' || c.is_ascii_digit())) {
            continue;
        }
        seen.entry(w).or_insert((0, k)).0 += 1;
    }
    let mut ranked: Vec<(&str, (usize, usize))> = seen.into_iter().collect();
    match rank {
        Rank::Frequent => ranked.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1))),
        Rank::Rare => ranked.sort_by(|a, b| a.1 .0.cmp(&b.1 .0).then(a.1 .1.cmp(&b.1 .1))),
    }
    ranked.into_iter().take(max).map(|(w, _)| w).collect()
}

fn clip(s: &str, max: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

fn is_error_line(l: &str) -> bool {
    let lower = l.to_ascii_lowercase();
    ["error", "failed", "panic", "exception", "traceback", "fatal", "denied", "not found"].iter().any(|w| lower.contains(w))
}

/// A token with surrounding punctuation and a `:line:col` suffix removed.
fn path_part(tok: &str) -> &str {
    let t = tok.trim_matches(|c: char| !(c.is_alphanumeric() || "/._-".contains(c)));
    t.split(':').next().unwrap_or(t)
}

fn looks_like_path(tok: &str) -> bool {
    // The path part is a piece of the token: without a `/` in the token there is none.
    if !tok.contains('/') {
        return false;
    }
    let t = path_part(tok);
    t.len() > 3
        && t.len() < 120
        && t.contains('/')
        && t.rsplit('/').next().is_some_and(|f| f.contains('.') && !f.ends_with('.'))
        && !t.starts_with("http")
        && !t.contains("//")
}

impl Extractive {
    /// The summary of one output.
    pub fn one(&self, item: &Item<'_>) -> String {
        let lines: Vec<&str> = item.text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut out = format!(
            "t{} {}{}: {}{}",
            item.ref_n,
            item.tool,
            args_hint(item.arguments),
            condense_index::summary_size(item.text.chars().count(), item.text.lines().count()),
            if item.is_error { ", error" } else { "" }
        );
        let errors: Vec<&str> = lines.iter().copied().filter(|l| is_error_line(l)).take(self.error_lines).collect();
        for e in &errors {
            out.push_str("\n  ! ");
            out.push_str(&clip(e, self.line_chars));
        }
        let document = condense_index::is_document_output(item.tool, item.arguments);
        let len = item.text.len();
        let (max_paths, max_names, rank) = if document {
            (self.document_paths.of(len), self.document_names.of(len), Rank::Frequent)
        } else if repeats_itself(&lines) {
            (self.paths, self.names.max(self.repeated_names.of(len)), Rank::Rare)
        } else {
            (self.paths, self.names, Rank::Frequent)
        };
        let mut paths: Vec<String> = Vec::new();
        'scan: for l in &lines {
            for tok in l.split_whitespace().filter(|t| looks_like_path(t)) {
                if paths.len() == max_paths {
                    break 'scan;
                }
                let p = path_part(tok).to_string();
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
        if !paths.is_empty() {
            out.push_str("\n  paths: ");
            out.push_str(&paths.join(", "));
        }
        let names = code_names(item.text, max_names, document, rank);
        if !names.is_empty() {
            out.push('\n');
            out.push_str(condense_index::SUMMARY_NAMES);
            out.push_str(&names.join(" "));
        }
        let (h, t) = (self.head, self.tail);
        // A one-line output is its line; a longer one its kept head and tail around a count.
        if lines.len() <= (h + t).max(1) {
            for l in &lines {
                out.push_str("\n  | ");
                out.push_str(&clip(l, self.line_chars));
            }
        } else {
            for l in &lines[..h] {
                out.push_str("\n  | ");
                out.push_str(&clip(l, self.line_chars));
            }
            out.push_str(&format!("\n  | … {} lines …", lines.len() - h - t));
            for l in &lines[lines.len() - t..] {
                out.push_str("\n  | ");
                out.push_str(&clip(l, self.line_chars));
            }
        }
        out
    }
}

/// A short hint of the call's arguments: the first string value, clipped.
fn args_hint(arguments: &str) -> String {
    // Arguments are JSON text; a string value is the part between the first `":"` and the next quote.
    let Some(start) = arguments.find(":\"") else { return String::new() };
    let rest = &arguments[start + 2..];
    let mut value = String::new();
    let mut escaped = false;
    for c in rest.chars() {
        match (escaped, c) {
            (true, 'n') => {
                value.push(' ');
                escaped = false;
            }
            (true, c) => {
                value.push(c);
                escaped = false;
            }
            (false, '\\') => escaped = true,
            (false, '"') => break,
            (false, c) => value.push(c),
        }
        if value.chars().count() > 40 {
            break;
        }
    }
    if value.is_empty() { String::new() } else { format!(" ({})", clip(&value, 40)) }
}

impl Summarizer for Extractive {
    fn name(&self) -> &str {
        "extractive"
    }

    fn summarize(&self, batch: &[Item<'_>]) -> Result<Vec<String>, SummarizeError> {
        Ok(batch.iter().map(|i| self.one(i)).collect())
    }
}

/// A summarizer that falls back to another when the first fails or miscounts. Every fallback is counted
/// and its reason kept, so a host can say that the configured summarizer was not the one that ran
/// ([`Summarizer::fallbacks`]).
pub struct WithFallback<P, F> {
    primary: P,
    fallback: F,
    count: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<Option<String>>,
    notice: Option<Notice>,
}

/// What a [`WithFallback`] calls at every fallback: the count so far and the reason.
type Notice = Box<dyn Fn(u64, &str) + Send + Sync>;

impl<P: Summarizer, F: Summarizer> WithFallback<P, F> {
    /// `primary`, with `fallback` standing in whenever it fails.
    pub fn new(primary: P, fallback: F) -> Self {
        WithFallback { primary, fallback, count: Default::default(), last: Default::default(), notice: None }
    }

    /// Calls `notice(count so far, reason)` at every fallback (a server prints a warning with it).
    pub fn with_notice(mut self, notice: impl Fn(u64, &str) + Send + Sync + 'static) -> Self {
        self.notice = Some(Box::new(notice));
        self
    }

    /// A handoff from the primary, else (declined or failed: the failure counted) from the fallback.
    fn either(&self, call: impl Fn(&dyn Summarizer) -> Result<Option<String>, SummarizeError>) -> Result<Option<String>, SummarizeError> {
        match call(&self.primary) {
            Ok(Some(s)) => Ok(Some(s)),
            Ok(None) => call(&self.fallback),
            Err(e) => {
                self.fell_back(e.to_string());
                call(&self.fallback)
            }
        }
    }

    fn fell_back(&self, reason: String) {
        let n = self.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(notice) = &self.notice {
            notice(n, &reason);
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }
}

impl<P: Summarizer, F: Summarizer> Summarizer for WithFallback<P, F> {
    fn name(&self) -> &str {
        self.primary.name()
    }

    fn handoff(&self, transcript: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.either(|s| s.handoff(transcript, max_chars))
    }

    fn recovery_handoff(&self, piece: &str, max_chars: usize) -> Result<Option<String>, SummarizeError> {
        self.either(|s| s.recovery_handoff(piece, max_chars))
    }

    fn summarize(&self, batch: &[Item<'_>]) -> Result<Vec<String>, SummarizeError> {
        match self.primary.summarize(batch) {
            Ok(s) if s.len() == batch.len() => Ok(s),
            other => {
                self.fell_back(match other {
                    Err(e) => e.to_string(),
                    Ok(s) => format!("{} summaries for {} items", s.len(), batch.len()),
                });
                self.fallback.summarize(batch)
            }
        }
    }

    fn stopped(&self) -> Option<String> {
        self.primary.stopped()
    }

    fn fallbacks(&self) -> Fallbacks {
        Fallbacks {
            count: self.count.load(std::sync::atomic::Ordering::Relaxed),
            last: self.last.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// How often a summarizer's stand-in ran instead of it, and why the last time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fallbacks {
    /// Calls answered by the stand-in.
    pub count: u64,
    /// The last failure's reason.
    pub last: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extractive_keeps_errors_and_paths_of_a_command() {
        let text = "Compiling app v0.1.0 (/work/app)\nwarning: unused parse_config\nerror[E0425]: cannot find value `x` in src/main.rs\n --> src/main.rs:3:5\nfn parse_config() -> ConfigError\nline b\nConfigError::Missing in parse_config\nerror: could not compile `app`\n";
        let s = Extractive::default().one(&Item { ref_n: 7, tool: "bash", arguments: r#"{"command":"cargo build"}"#, text, is_error: true });
        assert_eq!(
            s,
            "t7 bash (cargo build): 242 chars, 8 lines, error\n  ! error[E0425]: cannot find value `x` in src/main.rs\n  ! fn parse_config() -> ConfigError\n  paths: src/main.rs\n  | … 8 lines …"
        );
        // The most frequent names first, ties in order of first appearance; words are not names, nor
        // constants unless asked for.
        assert_eq!(code_names("Result Result x_y1 HTTP_OK alpha_beta foo2bar alpha_beta", 3, false, Rank::Frequent), vec!["alpha_beta", "foo2bar"]);
        assert_eq!(code_names("Result Result x_y1 HTTP_OK alpha_beta foo2bar alpha_beta", 3, true, Rank::Frequent), vec!["alpha_beta", "HTTP_OK", "foo2bar"]);
        assert_eq!(code_names("alpha_beta", 0, true, Rank::Frequent), Vec::<&str>::new());
    }

    #[test]
    fn a_document_s_stub_keeps_names_and_paths_by_its_size() {
        // A file of 200 distinct names and 40 paths: the stub of a read keeps a name per 350 bytes and a
        // path per 2,000, a command's stub three paths and no names.
        let text: String = (0..200).map(|i| format!("fn handle_event_{i:03}(ctx: &Ctx) -> Result<()> {{ load(\"src/mod_{i:03}/lib.rs\") }}\n")).collect();
        let names = |s: &str| s.lines().find_map(|l| l.strip_prefix("  names: ")).map_or(0, |n| n.split(' ').count());
        let paths = |s: &str| s.lines().find_map(|l| l.strip_prefix("  paths: ")).map_or(0, |p| p.split(", ").count());
        let read = Extractive::default().one(&Item { ref_n: 2, tool: "Read", arguments: r#"{"file_path":"src/events.rs"}"#, text: &text, is_error: false });
        let d = Extractive::default();
        assert_eq!((names(&read), paths(&read)), (d.document_names.of(text.len()), d.document_paths.of(text.len())));
        assert_eq!((names(&read), paths(&read)), (text.len() / 350, text.len() / 2_000), "{} bytes", text.len());
        let report = Extractive::default().one(&Item { ref_n: 3, tool: "Agent", arguments: "{}", text: &text, is_error: false });
        assert_eq!(names(&report), names(&read), "a subagent's report is a document");
        let bash = Extractive::default().one(&Item { ref_n: 4, tool: "bash", arguments: r#"{"command":"cargo run --example dump"}"#, text: &text, is_error: false });
        assert_eq!((names(&bash), paths(&bash)), (0, 3));
        // A shell command that prints the file reads it as much as `Read` does.
        let cat = Extractive::default().one(&Item { ref_n: 6, tool: "bash", arguments: r#"{"command":"cat src/events.rs"}"#, text: &text, is_error: false });
        assert_eq!((names(&cat), paths(&cat)), (names(&read), paths(&read)));
        // A short document keeps the minimum; a huge one the maximum; constants count.
        let short = Extractive::default().one(&Item { ref_n: 5, tool: "read", arguments: "{}", text: "MAX_RETRIES = 3\nretry_count x\n", is_error: false });
        assert!(short.contains("names: MAX_RETRIES retry_count"), "{short}");
        assert_eq!(Scaled { min: 8, bytes_per: 350, max: 128 }.of(10_000_000), 128);
    }

    #[test]
    fn a_command_that_repeats_itself_keeps_what_varies() {
        // A loop over 40 items printing the same error for each: the items' ids are what the agent goes
        // on with; the names of the error text, repeated 40 times, tell nothing apart.
        let text: String = (0..40)
            .map(|i| format!("[{i}/40] vid{i:02}XaQ9...\n  ERROR: RequestBlocked in youtube_transcript_api\n  see TranscriptsDisabled docs\n"))
            .collect();
        let s = Extractive::default().one(&Item { ref_n: 9, tool: "bash", arguments: r#"{"command":"python3 fetch_all.py"}"#, text: &text, is_error: false });
        let names: Vec<&str> = s.lines().find_map(|l| l.strip_prefix(condense_index::SUMMARY_NAMES)).unwrap_or_default().split(' ').collect();
        assert_eq!(names.len(), text.len() / 1_000, "{s}");
        assert!(names.iter().all(|n| n.starts_with("vid")), "the ids, rarest first: {s}");
        assert_eq!(names[0], "vid00XaQ9");
        // The same ids in lines that do not repeat: a command's stub keeps no names.
        let plain: String = (0..40).map(|i| format!("[{i}/40] vid{i:02}XaQ9 fetched {i} lines\n")).collect();
        let s = Extractive::default().one(&Item { ref_n: 10, tool: "bash", arguments: "{}", text: &plain, is_error: false });
        assert!(!s.contains("names:"), "{s}");
        assert!(repeats_itself(&["a", "b", "a", "a"]) && !repeats_itself(&["a", "b", "c", "a"]) && !repeats_itself(&[]));
    }

    struct Broken;
    impl Summarizer for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn summarize(&self, _: &[Item<'_>]) -> Result<Vec<String>, SummarizeError> {
            Err(SummarizeError::Failed { name: "broken".into(), reason: "timeout".into() })
        }
    }

    #[test]
    fn fallback_takes_over() {
        let s = WithFallback::new(Broken, Extractive::default());
        assert_eq!(s.fallbacks(), Fallbacks::default());
        let out = s.summarize(&[Item { ref_n: 1, tool: "read", arguments: "{}", text: "a\nb", is_error: false }]).unwrap();
        assert_eq!(out, vec!["t1 read: 3 chars, 2 lines\n  | … 2 lines …".to_string()]);
        let one = s.summarize(&[Item { ref_n: 2, tool: "read", arguments: "{}", text: "only line", is_error: false }]).unwrap();
        assert_eq!(one, vec!["t2 read: 9 chars, 1 lines\n  | only line".to_string()]);
        assert_eq!(s.fallbacks(), Fallbacks { count: 2, last: Some("broken: timeout".into()) });
    }
}
