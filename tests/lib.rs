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
                Block::Thinking(t) => format!("thinking {:?}", t.thinking.chars().take(30).collect::<String>()),
                Block::ToolCall(c) => format!("call {}#{} {}", c.name, c.id, c.arguments),
                Block::Image(i) => format!("image {}", i.mime),
                Block::Opaque(o) => format!("opaque {} {}", o.kind, o.json),
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

/// The workspace's layout: no two modules of a crate import each other, directly or in a circle (a
/// shared helper sits in a module below both; docs/architecture.md). A module is a file under a crate's
/// `src` (`mod.rs` stands for its folder, the crate root is left out: every module names it); a reference
/// is a `crate::a::b` path, a name in a `use crate::{…}` group, or a `super::` path, outside test modules.
#[cfg(test)]
mod layout {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    fn modules(src: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                modules(src, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&p).unwrap();
                // Unit tests may reach anywhere in their crate.
                let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap().to_string();
                out.insert(parts.join("::"), text);
            }
        }
    }

    /// The identifier path that starts `text` (`a::b::c`).
    fn path_at(text: &str) -> String {
        let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(text.len());
        text[..end].trim_end_matches(':').to_string()
    }

    /// The module a path names: its longest prefix that is a module.
    fn resolve(mods: &BTreeMap<String, String>, path: &str) -> Option<String> {
        let segs: Vec<&str> = path.split("::").collect();
        (1..=segs.len()).rev().map(|k| segs[..k].join("::")).find(|m| mods.contains_key(m))
    }

    /// The module dependency graph of the crate at `src`.
    fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let mut mods = BTreeMap::new();
        modules(src, src, &mut mods);
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, text) in &mods {
            let mut targets = Vec::new();
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    targets.extend(group.split(',').map(|n| path_at(n.trim())));
                } else {
                    targets.push(path_at(rest));
                }
            }
            let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
            for (i, _) in text.match_indices("super::") {
                if text[..i].ends_with("::") {
                    continue; // the second `super` of a chain, counted with the first
                }
                let mut rest = &text[i..];
                let mut base: Vec<&str> = m.split("::").filter(|s| !s.is_empty()).collect();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                base.push(rest);
                targets.push(path_at(&base.join("::")));
            }
            let deps = g.entry(m.clone()).or_default();
            for t in targets {
                if let Some(t) = resolve(&mods, &t) {
                    if !t.is_empty() && &t != m && t != parent {
                        deps.insert(t);
                    }
                }
            }
        }
        g
    }

    /// A module that reaches itself through the graph, with the way it went, if any.
    fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn walk(g: &BTreeMap<String, BTreeSet<String>>, at: &str, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
            if let Some(k) = path.iter().position(|p| p == at) {
                return Some(path[k..].iter().cloned().chain([at.to_string()]).collect());
            }
            if !done.insert(at.to_string()) {
                return None;
            }
            path.push(at.to_string());
            for next in g.get(at).into_iter().flatten() {
                if let Some(c) = walk(g, next, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        g.keys().find_map(|m| walk(g, m, &mut Vec::new(), &mut done))
    }

    #[test]
    fn no_module_imports_another_in_a_circle() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
        let mut checked = 0;
        for c in std::fs::read_dir(&crates).unwrap().flatten() {
            let src = c.path().join("src");
            if src.is_dir() {
                let g = graph(&src);
                assert!(cycle(&g).is_none(), "{}: modules import each other in a circle: {:?}", c.path().display(), cycle(&g));
                checked += g.len();
            }
        }
        assert!(checked > 80, "only {checked} modules found");
    }

    /// The check reads a crate's sources as they are written: a circle through a `use crate::{…}` group,
    /// a `crate::` path and a `super::super::` or `crate::` path back is found, and the same modules
    /// without the back edge (or with it only in a test module) pass.
    #[test]
    fn a_circle_between_modules_is_found() {
        let dir = std::env::temp_dir().join(format!("condense-layout-{}", std::process::id()));
        let write = |files: &[(&str, &str)]| {
            let _ = std::fs::remove_dir_all(&dir);
            for (name, text) in files {
                let p = dir.join(name);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, text).unwrap();
            }
        };
        let base = [
            ("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\n"),
            ("a.rs", "use crate::{b, Thing};\npub struct A;\n"),
            ("b.rs", "pub fn f() -> crate::c::d::D { todo!() }\n"),
            ("c/mod.rs", "pub mod d;\n"),
            ("c/d.rs", "pub struct D;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n"),
        ];
        write(&base);
        assert_eq!(cycle(&graph(&dir)), None, "a test module's imports are not the module's");
        let mut back = base.to_vec();
        back[4] = ("c/d.rs", "use super::super::a::A;\npub struct D;\n");
        write(&back);
        assert_eq!(cycle(&graph(&dir)), Some(vec!["a".into(), "b".into(), "c::d".into(), "a".into()]));
        back[4] = ("c/d.rs", "pub struct D(pub crate::a::A);\n");
        write(&back);
        assert_eq!(cycle(&graph(&dir)), Some(vec!["a".into(), "b".into(), "c::d".into(), "a".into()]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
