//! Helpers shared by the cross-crate tests: where the corpus is, and the rendered *shape* of a context.
//!
//! # Example
//!
//! ```
//! use condense_events::{Message, UserOrigin};
//!
//! let context = vec![Message::user_text("hello", UserOrigin::Prompt), Message::user_text("again", UserOrigin::Prompt)];
//! // One line per message: what a snapshot of a rendered context records.
//! let shape = condense_tests::shape(&context.iter().collect::<Vec<_>>());
//! assert_eq!(shape.lines().count(), 2);
//! ```

use condense_events::{Block, Message};
use std::path::{Path, PathBuf};

/// The shared corpus: `../shared/corpus` beside the repository (or `CONDENSE_CORPUS`). Tests that need it
/// fail loudly when it is missing rather than pass on nothing.
pub fn corpus_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CONDENSE_CORPUS") {
        return PathBuf::from(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
    assert!(dir.is_dir(), "the corpus is not at {} (set CONDENSE_CORPUS)", dir.display());
    dir
}

/// The source events of corpus session `relative` (a path under the corpus folder).
pub fn corpus_events(relative: &str) -> Vec<condense_events::SourceEvent> {
    condense_formats::import_file(&corpus_dir().join(relative)).expect("a corpus session imports").events
}

/// Every `.jsonl` file under the corpus folders of the formats condense imports, sorted.
pub fn corpus_sessions() -> Vec<PathBuf> {
    let root = corpus_dir();
    let mut out = Vec::new();
    for sub in ["pi", "claude-code", "codex"] {
        walk_files(&root.join(sub), &["jsonl"], &mut out);
    }
    out.sort();
    out
}

/// Every file of the corpus that could hold a session (`.jsonl`, `.json`, `.traj`), any folder, sorted.
pub fn corpus_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk_files(&corpus_dir(), &["jsonl", "json", "traj"], &mut out);
    out.sort();
    out
}

/// Every file under `dir` whose extension is one of `extensions`.
pub fn walk_files(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk_files(&p, extensions, out);
        } else if p.extension().and_then(|x| x.to_str()).is_some_and(|x| extensions.contains(&x)) {
            out.push(p);
        }
    }
}

/// The session's path relative to the corpus, with `/`.
pub fn corpus_name(path: &Path) -> String {
    path.strip_prefix(corpus_dir()).unwrap_or(path).to_string_lossy().replace('\\', "/")
}

/// One line per message: index, role, block kinds, ids, byte length and a short hash of its neutral JSON.
pub fn shape<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> String {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        let json = serde_json::to_vec(&condense_formats::export::neutral(std::slice::from_ref(m))).expect("json");
        let hash = blake3::hash(&json).to_hex();
        let kinds: Vec<&str> = m.content().iter().map(Block::kind).collect();
        let ids: Vec<String> = match &**m {
            Message::Assistant { .. } => m.tool_calls().map(|(id, name, _)| format!("{name}:{id}")).collect(),
            Message::ToolResult { call_id, tool_name, is_error, .. } => {
                vec![format!("{tool_name}:{call_id}{}", if *is_error { " ERR" } else { "" })]
            }
            Message::User { origin, .. } => vec![format!("{origin:?}")],
        };
        out.push_str(&format!("{i:>4} {:<9} [{}] {} {}B {}\n", m.role(), kinds.join(","), ids.join(" "), json.len(), &hash.as_str()[..10]));
    }
    out
}

/// One readable line per message: role (origin, tool and call id, error flag) and each block, texts cut
/// to 70 characters.
pub fn readable<M: std::ops::Deref<Target = Message>>(messages: &[M]) -> String {
    let mut out = String::new();
    for m in messages {
        let body: Vec<String> = m
            .content()
            .iter()
            .map(|b| match b {
                Block::Text { text } => format!("text {:?}", text.chars().take(70).collect::<String>()),
                Block::Thinking { thinking, .. } => format!("thinking {:?}", thinking.chars().take(30).collect::<String>()),
                Block::ToolCall { id, name, arguments } => format!("call {name}#{id} {arguments}"),
                Block::Image { mime, .. } => format!("image {mime}"),
            })
            .collect();
        let head = match &**m {
            Message::User { origin, .. } => format!("user({origin:?})"),
            Message::Assistant { .. } => "assistant".to_string(),
            Message::ToolResult { call_id, tool_name, is_error, .. } => format!("tool {tool_name}#{call_id} error={is_error}"),
        };
        out.push_str(&format!("{head}: {}\n", body.join(" | ")));
    }
    out
}

/// Appends `m` to a linear test session as entry `e<n+1>`, child of `e<n>`, and counts it.
pub fn append_entry(session: &condense_engine::Session, n: &mut usize, m: Message) {
    let parent = (*n > 0).then(|| format!("e{n}"));
    *n += 1;
    let id = format!("e{n}");
    session
        .append(vec![condense_events::SourceEvent::EntryAppended { id, parent, entry: condense_events::Entry::Message(m) }])
        .expect("append to a test session");
}

/// The result of a handoff in the test summarizers.
pub type HandoffResult = Result<Option<String>, condense_summarize::SummarizeError>;

/// A test summarizer whose checkpoint handoff is `f(piece, max)`; batches get the extractive default.
pub struct HandoffWith<F>(pub F);

impl<F: Fn(&str, usize) -> HandoffResult + Send + Sync> condense_summarize::Summarizer for HandoffWith<F> {
    fn name(&self) -> &str {
        "test"
    }
    fn summarize(&self, batch: &[condense_summarize::Item<'_>]) -> Result<Vec<String>, condense_summarize::SummarizeError> {
        condense_summarize::Extractive::default().summarize(batch)
    }
    fn handoff(&self, piece: &str, max: usize) -> HandoffResult {
        (self.0)(piece, max)
    }
}

/// A summarizer failure, as a test summarizer returns it.
pub fn handoff_failed(reason: &str) -> condense_summarize::SummarizeError {
    condense_summarize::SummarizeError::Failed { name: "test".into(), reason: reason.into() }
}

/// Whether this test binary runs the suites on PostgreSQL: `on_postgres` includes the determinism and
/// replay suites (corpus, checkpoints, recovery) a second time, with every store in a database of a
/// throwaway cluster instead of a folder.
pub fn on_postgres() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().starts_with("on_postgres")))
        .unwrap_or(false)
}

/// Opens the store a suite keeps in folder `dir`: that folder (sled), or, in the `on_postgres` binary, a
/// PostgreSQL database of its own for that folder (the same one each time the folder is opened again).
pub fn open_store(dir: impl AsRef<Path>) -> Result<condense_engine::Store, condense_engine::EngineError> {
    if !on_postgres() {
        return condense_engine::Store::open(dir);
    }
    static DATABASES: std::sync::Mutex<std::collections::BTreeMap<PathBuf, String>> = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let url = DATABASES
        .lock()
        .expect("databases lock")
        .entry(dir.as_ref().to_path_buf())
        .or_insert_with(|| condense_log::testing::Cluster::shared().database())
        .clone();
    condense_engine::Store::open(url)
}

/// `insta::assert_snapshot!` under the name `<suite>__<name>` whichever binary runs the suite, so the
/// PostgreSQL run of a suite checks the very snapshots of the sled run.
#[macro_export]
macro_rules! snapshot {
    ($name:expr, $value:expr) => {{
        let suite = module_path!().rsplit("::").next().expect("a module path");
        let mut settings = insta::Settings::clone_current();
        settings.set_prepend_module_to_snapshot(false);
        settings.bind(|| insta::assert_snapshot!(format!("{suite}__{}", $name), $value));
    }};
}
