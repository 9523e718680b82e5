//! The index: every captured output's record behind its `tN` ref, the batches and their outcomes, the
//! frontier, spills, aliases, purges and compressed chains, folded from decision events. Lookups take a
//! ref (`t12`, `b3`) or a raw tool-call id. Ref numbers are given in capture order, so they depend only
//! on the events.
//!
//! # Example
//!
//! ```
//! use condense_events::{DecisionEvent, Record};
//! use condense_index::{Index, Target};
//!
//! let mut index = Index::default();
//! let record = Record {
//!     ref_n: index.next_ref(),
//!     batch: 1,
//!     entry: "r1".into(),
//!     call_entry: "a1".into(),
//!     call_id: "call_7".into(),
//!     occurrence: "call_7@r1".into(),
//!     tool: "bash".into(),
//!     arguments: r#"{"command":"ls"}"#.into(),
//!     is_error: false,
//!     chars: 12,
//!     hash: "k".into(),
//!     turn: 1,
//!     utg: 1,
//!     protected: false,
//! };
//! index.apply(&DecisionEvent::OutputCaptured(Box::new(record)));
//! // A ref, or the provider's own call id, finds the output.
//! assert_eq!(index.lookup("t1"), Some(Target::Output(1)));
//! assert_eq!(index.lookup("call_7"), Some(Target::Output(1)));
//! assert_eq!(index.next_ref(), 2);
//! ```

use condense_events::{BatchOutcome, DecisionEvent, Record};
use std::collections::BTreeMap;
use std::sync::Arc;

pub mod facts;
mod paths;
pub use paths::{file_of, json_strings, path_arguments};

/// Tools that read a file whole (pi, Claude Code and others): the reads `liveReadsTokens` may keep.
pub const READ_TOOLS: [&str; 4] = ["read", "Read", "view", "read_file"];

/// Tools that fetch a page: with the file reads ([`READ_TOOLS`]), what the agent asked to read.
pub const FETCH_TOOLS: [&str; 2] = ["WebFetch", "web_fetch"];

/// Tools that hand a task to a subagent and answer with its report (Claude Code's `Task`, named `Agent`
/// since its 2.1.63).
pub const SUBAGENT_TOOLS: [&str; 2] = ["Task", "Agent"];

/// Programs whose output is a file's text or excerpts of files (`grep`, `rg` and `ag` print matching
/// lines): a shell call that runs one of them first reads files, and its output is a document
/// ([`is_document_output`]). `sed` counts with `-n` (printing lines), not as an editor.
const PRINT_PROGRAMS: [&str; 10] = ["cat", "head", "tail", "nl", "less", "more", "bat", "grep", "rg", "ag"];

/// The shell command a call runs: its `command` or `cmd` argument, a string or an argument vector
/// (`["bash", "-lc", "cat a.rs"]`) joined by spaces; `None` for a call without one.
fn shell_command(arguments: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(arguments).ok()?;
    match v.get("command").or_else(|| v.get("cmd"))? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(parts) => Some(parts.iter().filter_map(serde_json::Value::as_str).collect::<Vec<_>>().join(" ")),
        _ => None,
    }
}

/// Whether shell command `command` prints files: its first program, after any `cd DIR &&` and a
/// `bash -lc` wrapper, is one of [`PRINT_PROGRAMS`] or `sed -n`.
fn prints_files(command: &str) -> bool {
    let mut rest = command.trim();
    while let Some(after_cd) = rest.strip_prefix("cd ") {
        rest = after_cd.split_once("&&").map_or("", |(_, then)| then.trim());
    }
    for shell in ["bash -lc ", "bash -c ", "sh -c ", "zsh -lc "] {
        rest = rest.strip_prefix(shell).unwrap_or(rest);
    }
    let mut words = rest.trim_matches(|c| c == '\'' || c == '"' || c == ' ').split_whitespace();
    match words.next() {
        Some("sed") => words.next() == Some("-n"),
        Some(program) => PRINT_PROGRAMS.contains(&program),
        None => false,
    }
}

/// Whether the output of a call to `tool` with `arguments` is a document the agent asked for and works
/// from, rather than a command's output: a file read ([`READ_TOOLS`]), a fetched page ([`FETCH_TOOLS`]), a
/// subagent's report ([`SUBAGENT_TOOLS`]), or the output of a shell command (its `command` or `cmd`
/// argument) whose first program, after any `cd DIR &&` and a `bash -lc` wrapper, prints files (`cat`,
/// `head`, `tail`, `nl`, `sed -n`, `grep`, `rg`, …: how Codex and bash-only agents read). Its stub keeps
/// more of its names.
pub fn is_document_output(tool: &str, arguments: &str) -> bool {
    [&READ_TOOLS[..], &FETCH_TOOLS, &SUBAGENT_TOOLS].iter().any(|tools| tools.contains(&tool)) || shell_command(arguments).is_some_and(|c| prints_files(&c))
}

/// How the line of a summary that lists its output's names starts (the extractive summarizer writes
/// it, a compressed chain's block keeps part of it for a long document).
pub const SUMMARY_NAMES: &str = "  names: ";

/// What separates the characters from the line count in the size a summary's first line gives.
const SUMMARY_SIZE_SEP: &str = " chars, ";

/// The size a summary's first line gives its output: `900 chars, 30 lines` (the extractive summarizer
/// writes it; a compressed chain's block keeps the characters alone, [`without_line_count`]).
pub fn summary_size(chars: usize, lines: usize) -> String {
    format!("{chars}{SUMMARY_SIZE_SEP}{lines} lines")
}

/// A summary's first line without the line count of its [`summary_size`] (`t3 bash (cargo test): 900
/// chars, 30 lines` becomes `t3 bash (cargo test): 900 chars`): in a block the size in characters is
/// enough to weigh a recovery by, and the count was most of a line's length after the ref and the call
/// (docs/pruning.md, "Shorter chain blocks"). A line without one (a model's summary) stays as it is.
pub fn without_line_count(first: &str) -> std::borrow::Cow<'_, str> {
    let Some(at) = first.rfind(SUMMARY_SIZE_SEP) else { return first.into() };
    let rest = &first[at + SUMMARY_SIZE_SEP.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let tail = rest[digits..].strip_prefix(" lines").or_else(|| rest[digits..].strip_prefix(" line"));
    match tail {
        Some(tail) if digits > 0 => format!("{} chars{tail}", &first[..at]).into(),
        _ => first.into(),
    }
}

/// Tools that read or change a file whole or in part: a later one supersedes a read of the same file
/// (`liveReadsTokens`), and [`Index::newest_file_call`] follows them.
pub const FILE_TOOLS: [&str; 12] = ["read", "Read", "view", "read_file", "edit", "Edit", "write", "Write", "MultiEdit", "write_file", "replace", "str_replace_editor"];

/// Notes file call `r` (one of [`FILE_TOOLS`]) in `newest`: for each file its path arguments name (a read
/// selector left out: [`file_of`]), the newest such call's ref.
pub fn note_file_call(newest: &mut BTreeMap<String, u32>, r: &Record) {
    note_files(newest, r, u32::max);
}

/// For each file `r`'s path arguments name (a read selector left out), `keep` of the ref noted and `r`'s.
fn note_files(by_file: &mut BTreeMap<String, u32>, r: &Record, keep: fn(u32, u32) -> u32) {
    for p in path_arguments(&r.arguments) {
        let e = by_file.entry(file_of(&p).to_string()).or_insert(r.ref_n);
        *e = keep(*e, r.ref_n);
    }
}

/// Whether `r` writes or edits a file: one of [`FILE_TOOLS`] other than the reads, and not SWE-agent's
/// `str_replace_editor` asked to `view`.
pub fn is_file_write(r: &Record) -> bool {
    let tool = r.tool.as_str();
    FILE_TOOLS.contains(&tool)
        && !READ_TOOLS.contains(&tool)
        && !(tool == "str_replace_editor" && json_strings(&r.arguments).windows(2).any(|kv| kv[0] == "command" && kv[1] == "view"))
}

/// Notes `r` in `written` when it writes or edits files ([`is_file_write`]): for each file, the first such
/// call's ref (the agent's own files, whose reads `liveReadsTokens` keeps).
pub fn note_file_write(written: &mut BTreeMap<String, u32>, r: &Record) {
    if is_file_write(r) {
        note_files(written, r, u32::min);
    }
}

/// Whether `r` reads a file whole ([`READ_TOOLS`]) and is not protected: a read `liveReadsTokens` may
/// keep verbatim, unless a duplicate or spilled (those render as they do anyway).
pub fn is_file_read(r: &Record) -> bool {
    READ_TOOLS.contains(&r.tool.as_str()) && !r.protected
}

/// A spilled output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    /// blake3 of the blob (hex).
    pub blob: String,
    /// Bytes of the output.
    pub bytes: u64,
    /// Head preview.
    pub preview: String,
}

/// A compressed chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The chain as its decision holds it: block number, first and last entry, refs, block text.
    pub compressed: condense_events::ChainCompressed,
    /// What its final reply's text renders as, when it was cut (`ChainReplyCut`).
    pub reply: Option<String>,
}

/// A committed checkpoint: what its decision holds.
pub use condense_events::CheckpointCommitted as Checkpoint;

/// Keys per chunk of a [`ChunkMap`].
const CHUNK_KEYS: u32 = 1024;

/// A map by ref or batch number in chunks of 1,024 consecutive keys, each shared copy-on-write: a copy of
/// the index (the cost guard's candidate) that then inserts a key copies that key's chunk, not the map.
/// A chunk is a list of its keys' values in key order: the numbers are given in order, so each value is
/// pushed at the end and the lists are full, where a tree of 200-byte records filled in order stayed half
/// empty (a record took ~380 bytes). A number never given costs nothing, however far the keys spread.
#[derive(Debug, Clone)]
pub struct ChunkMap<V> {
    chunks: BTreeMap<u32, Arc<Vec<(u16, V)>>>,
    len: usize,
}

impl<V> Default for ChunkMap<V> {
    fn default() -> Self {
        ChunkMap { chunks: BTreeMap::new(), len: 0 }
    }
}

/// The chunk of `key` and its slot there.
fn chunk_of(key: u32) -> (u32, u16) {
    (key / CHUNK_KEYS, (key % CHUNK_KEYS) as u16)
}

/// Where a chunk holds the value of `slot` (`Ok`), or where it would go (`Err`).
fn place<V>(chunk: &[(u16, V)], slot: u16) -> Result<usize, usize> {
    chunk.binary_search_by_key(&slot, |&(s, _)| s)
}

impl<V: Clone> ChunkMap<V> {
    /// The value of `key`.
    pub fn get(&self, key: &u32) -> Option<&V> {
        let (chunk, slot) = chunk_of(*key);
        let c = self.chunks.get(&chunk)?;
        c.get(place(c, slot).ok()?).map(|(_, v)| v)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &u32) -> bool {
        self.get(key).is_some()
    }

    /// Sets the value of `key`.
    pub fn insert(&mut self, key: u32, value: V) {
        let (chunk, slot) = chunk_of(key);
        let chunk = Arc::make_mut(self.chunks.entry(chunk).or_default());
        match place(chunk, slot) {
            Ok(at) => chunk[at].1 = value,
            Err(at) => {
                chunk.insert(at, (slot, value));
                self.len += 1;
            }
        }
    }

    /// The value of `key`, to change in place: its chunk is copied first when a copy of the map shares it.
    pub fn get_mut(&mut self, key: &u32) -> Option<&mut V> {
        let (chunk, slot) = chunk_of(*key);
        let c = self.chunks.get_mut(&chunk)?;
        let at = place(c, slot).ok()?;
        Some(&mut Arc::make_mut(c)[at].1)
    }

    /// The keys with a value and their values, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u32, &V)> + '_ {
        self.chunks.iter().flat_map(|(&n, c)| c.iter().map(move |(s, v)| (n * CHUNK_KEYS + u32::from(*s), v)))
    }

    /// The keys with a value, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The smallest key with a value.
    pub fn first_key(&self) -> Option<u32> {
        self.iter().next().map(|(k, _)| k)
    }

    /// The largest key with a value.
    pub fn last_key(&self) -> Option<u32> {
        self.iter().next_back().map(|(k, _)| k)
    }

    /// How many keys have a value.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }
}

/// `map[&key]`, as on a `BTreeMap`: panics when `key` has no value.
impl<V: Clone> std::ops::Index<&u32> for ChunkMap<V> {
    type Output = V;
    fn index(&self, key: &u32) -> &V {
        self.get(key).expect("no value for the key")
    }
}

/// Everything the pipeline decided so far for one session. Each map is shared copy-on-write, so a copy
/// of the index (the cost guard renders a candidate on one) costs only the maps a decision then changes.
#[derive(Debug, Clone, Default)]
pub struct Index {
    /// Records by ref number (shared: a copy of a chunk copies pointers, and a record given up with its
    /// event is taken as it is, [`Index::apply_owned`]).
    pub records: ChunkMap<Arc<Record>>,
    /// Ref by tool-result entry id.
    pub by_entry: Arc<BTreeMap<String, u32>>,
    /// Refs of the calls each assistant entry made.
    pub by_call_entry: Arc<BTreeMap<String, Vec<u32>>>,
    /// Refs by raw call id (a provider may reuse an id: every occurrence, in order).
    pub by_call: Arc<BTreeMap<String, Vec<u32>>>,
    /// Spilled refs.
    pub spills: Arc<BTreeMap<u32, Spill>>,
    /// Duplicate ref → original ref.
    pub aliases: Arc<BTreeMap<u32, u32>>,
    /// Summaries of summarized refs.
    pub summaries: ChunkMap<Arc<str>>,
    /// Outcome of each closed batch.
    pub outcomes: ChunkMap<BatchOutcome>,
    /// Refs of each batch.
    pub batches: Arc<BTreeMap<u32, Vec<u32>>>,
    /// Batches captured and not closed yet (what `pending_batches` lists, kept as decisions fold).
    pub open_batches: Arc<std::collections::BTreeSet<u32>>,
    /// Purged calls: (assistant entry id, call id) → chars purged.
    pub purged: Arc<BTreeMap<(String, String), u64>>,
    /// Compressed chains by block number.
    pub chains: ChunkMap<Arc<Chain>>,
    /// The last entry captured.
    pub frontier: Option<String>,
    /// Committed archive views in order: (id, last event, leaf).
    pub archives: Vec<(String, u64, Option<String>)>,
    /// Committed checkpoints by number.
    pub checkpoints: Arc<BTreeMap<u32, Checkpoint>>,
    /// Checkpoint failures, in order (code, reason).
    pub checkpoint_failures: Vec<(String, String)>,
    /// How many captured outputs are `context_tree_query` recoveries.
    pub recoveries: usize,
    /// The diagnostics of smaller-model recovery (`Note`s of stage `recovery`), in order.
    pub recovery_notes: Vec<String>,
    /// For each file a call of [`FILE_TOOLS`] named (its path arguments), the newest such call's ref.
    pub newest_file_call: Arc<BTreeMap<String, u32>>,
    /// For each file the agent wrote or edited ([`is_file_write`]), the first such call's ref.
    pub written_files: Arc<BTreeMap<String, u32>>,
    /// Decisions folded so far that change what renders (batches closed, outputs stubbed, spilled or
    /// aliased, calls purged, chains compressed or their replies cut, checkpoints): a host comparing it
    /// between two requests knows whether any was made without reading the log.
    pub changes: u64,
    /// File reads ([`READ_TOOLS`]) of summarized batches that got no summary of their own and are not
    /// aliased, spilled or protected (so: kept verbatim by `liveReadsTokens`), and no `OutputStubbed` since.
    pub unsummarized_reads: Arc<std::collections::BTreeSet<u32>>,
}

/// What a ref names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A tool output.
    Output(u32),
    /// A compressed chain.
    Chain(u32),
    /// A checkpoint.
    Checkpoint(u32),
}

impl Index {
    /// Folds one decision given up: a captured output's record is kept as the event held it, not copied
    /// (a pass that captures thousands held each twice until its list was written).
    pub fn apply_owned(&mut self, d: DecisionEvent) {
        match d {
            DecisionEvent::OutputCaptured(r) => {
                self.note_capture(&r);
                self.records.insert(r.ref_n, Arc::from(r));
            }
            other => self.apply(&other),
        }
    }

    /// What a capture adds besides its record: the maps by entry, call and batch, and the counts.
    fn note_capture(&mut self, r: &Record) {
        if FILE_TOOLS.contains(&r.tool.as_str()) {
            note_file_call(Arc::make_mut(&mut self.newest_file_call), r);
            // Asked first, so a read leaves the shared map uncopied.
            if is_file_write(r) {
                note_files(Arc::make_mut(&mut self.written_files), r, u32::min);
            }
        }
        Arc::make_mut(&mut self.by_entry).insert(r.entry.clone(), r.ref_n);
        Arc::make_mut(&mut self.by_call_entry).entry(r.call_entry.clone()).or_default().push(r.ref_n);
        Arc::make_mut(&mut self.by_call).entry(r.call_id.clone()).or_default().push(r.ref_n);
        Arc::make_mut(&mut self.batches).entry(r.batch).or_default().push(r.ref_n);
        if !self.outcomes.contains_key(&r.batch) && !self.open_batches.contains(&r.batch) {
            Arc::make_mut(&mut self.open_batches).insert(r.batch);
        }
        if r.tool == condense_events::QUERY_TOOL_NAME {
            self.recoveries += 1;
        }
    }

    /// Folds one decision.
    pub fn apply(&mut self, d: &DecisionEvent) {
        self.changes += u64::from(matches!(
            d,
            DecisionEvent::OutputSpilled { .. }
                | DecisionEvent::OutputAliased { .. }
                | DecisionEvent::BatchClosed { .. }
                | DecisionEvent::OutputStubbed { .. }
                | DecisionEvent::ErrorArgsPurged { .. }
                | DecisionEvent::ChainCompressed(_)
                | DecisionEvent::ChainReplyCut { .. }
                | DecisionEvent::CheckpointCommitted(_)
        ));
        match d {
            DecisionEvent::Note { stage, text } => {
                if stage == "recovery" {
                    self.recovery_notes.push(text.clone());
                }
            }
            DecisionEvent::OutputCaptured(r) => {
                self.note_capture(r);
                self.records.insert(r.ref_n, Arc::new(Record::clone(r)));
            }
            DecisionEvent::OutputSpilled { ref_n, blob, bytes, preview } => {
                Arc::make_mut(&mut self.spills).insert(*ref_n, Spill { blob: blob.clone(), bytes: *bytes, preview: preview.clone() });
            }
            DecisionEvent::OutputAliased { ref_n, original } => {
                Arc::make_mut(&mut self.aliases).insert(*ref_n, *original);
            }
            DecisionEvent::BatchClosed { batch, refs, outcome, summaries } => {
                self.outcomes.insert(*batch, *outcome);
                if self.open_batches.contains(batch) {
                    Arc::make_mut(&mut self.open_batches).remove(batch);
                }
                for (r, s) in summaries {
                    self.summaries.insert(*r, Arc::from(s.as_str()));
                }
                if *outcome == BatchOutcome::Summarized {
                    // Aliased, spilled and protected reads render as they do anyway: only the kept ones.
                    let reads = refs.iter().filter(|r| {
                        !summaries.iter().any(|(s, _)| s == *r)
                            && !self.aliases.contains_key(r)
                            && !self.spills.contains_key(r)
                            && self.records.get(r).is_some_and(|rec| is_file_read(rec))
                    });
                    let reads: Vec<u32> = reads.copied().collect();
                    if !reads.is_empty() {
                        Arc::make_mut(&mut self.unsummarized_reads).extend(reads);
                    }
                }
            }
            DecisionEvent::OutputStubbed { ref_n, summary } => {
                self.summaries.insert(*ref_n, Arc::from(summary.as_str()));
                if self.unsummarized_reads.contains(ref_n) {
                    Arc::make_mut(&mut self.unsummarized_reads).remove(ref_n);
                }
            }
            DecisionEvent::FrontierAdvanced { entry } => self.frontier = Some(entry.clone()),
            DecisionEvent::ErrorArgsPurged { entry, call_id, chars } => {
                Arc::make_mut(&mut self.purged).insert((entry.clone(), call_id.clone()), *chars);
            }
            DecisionEvent::CheckpointCommitted(c) => drop(Arc::make_mut(&mut self.checkpoints).insert(c.n, Checkpoint::clone(c))),
            DecisionEvent::CheckpointFailed { code, reason } => self.checkpoint_failures.push((code.clone(), reason.clone())),
            DecisionEvent::CheckpointStarted { .. } => {}
            DecisionEvent::ArchiveCommitted { id, seq, leaf } => self.archives.push((id.clone(), *seq, leaf.clone())),
            DecisionEvent::ChainCompressed(ch) => self.chains.insert(ch.block, Arc::new(Chain { compressed: (**ch).clone(), reply: None })),
            DecisionEvent::ChainReplyCut { block, text } => {
                if let Some(chain) = self.chains.get_mut(block) {
                    Arc::make_mut(chain).reply = Some(text.clone());
                }
            }
        }
    }

    /// The next ref number to give.
    pub fn next_ref(&self) -> u32 {
        self.records.last_key().map_or(1, |r| r + 1)
    }

    /// The next batch number to give.
    pub fn next_batch(&self) -> u32 {
        self.batches.keys().next_back().map_or(1, |b| b + 1)
    }

    /// The next chain block number to give.
    pub fn next_block(&self) -> u32 {
        self.chains.last_key().map_or(1, |b| b + 1)
    }

    /// Batches captured but not closed yet, in order.
    pub fn pending_batches(&self) -> Vec<u32> {
        self.open_batches.iter().copied().collect()
    }

    /// Whether the output behind `ref_n` is rendered as a stub (summarized, spilled or aliased), before
    /// protection and the recovery grace window are considered.
    pub fn is_pruned(&self, ref_n: u32) -> bool {
        self.spills.contains_key(&ref_n)
            || self.summaries.contains_key(&ref_n)
            || (self.aliases.contains_key(&ref_n)
                && self.records.get(&ref_n).is_some_and(|r| self.outcomes.contains_key(&r.batch)))
    }

    /// Resolves `t12`, `b3` or a raw call id (its newest occurrence).
    pub fn lookup(&self, key: &str) -> Option<Target> {
        let key = key.trim();
        let number = |prefix: char| key.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
        if let Some(n) = number('t').filter(|n| self.records.contains_key(n)) {
            return Some(Target::Output(n));
        }
        if let Some(n) = number('b').filter(|n| self.chains.contains_key(n)) {
            return Some(Target::Chain(n));
        }
        if let Some(n) = number('c').filter(|n| self.checkpoints.contains_key(n)) {
            return Some(Target::Checkpoint(n));
        }
        self.by_call.get(key).and_then(|v| v.last()).map(|&r| Target::Output(r))
    }
}

#[cfg(test)]
mod chunk_map_tests {
    use super::ChunkMap;

    /// A chunked map reads as one map in key order, counts each key once, and a copy that inserts leaves
    /// the original as it was.
    #[test]
    fn a_chunk_map_is_one_map_and_its_copies_are_independent() {
        let mut m = ChunkMap::default();
        for k in [5000u32, 3, 1024, 1023, 3] {
            m.insert(k, k * 2);
        }
        assert_eq!(m.len(), 4);
        assert_eq!(m.values().copied().collect::<Vec<_>>(), vec![6, 2046, 2048, 10000]);
        assert_eq!((m.get(&1024), m.contains_key(&7)), (Some(&2048), false));
        let mut copy = m.clone();
        copy.insert(1025, 1);
        copy.insert(3, 0);
        assert_eq!((m.len(), m.get(&3), m.get(&1025)), (4, Some(&6), None));
        assert_eq!((copy.len(), copy.get(&3), copy.get(&1025)), (5, Some(&0), Some(&1)));
        assert!(ChunkMap::<u32>::default().is_empty());
        assert_eq!((m.last_key(), copy.last_key(), ChunkMap::<u32>::default().last_key()), (Some(5000), Some(5000), None));
        *copy.get_mut(&5000).expect("present") = 7;
        assert_eq!((m.get(&5000), copy.get(&5000)), (Some(&10000), Some(&7)), "the original's chunk was not changed");
        assert_eq!(copy.get_mut(&4), None);
        assert_eq!(m.iter().map(|(k, v)| (k, *v)).collect::<Vec<_>>(), vec![(3, 6), (1023, 2046), (1024, 2048), (5000, 10000)]);
        assert_eq!((m.first_key(), m.keys().collect::<Vec<_>>()), (Some(3), vec![3, 1023, 1024, 5000]));
        // Keys without a value around one with, and the last key there is.
        assert_eq!((m.get(&4999), m.get(&5001), m.get(&9999)), (None, None, None));
        m.insert(u32::MAX, 1);
        assert_eq!((m.last_key(), m.get(&u32::MAX), m.len()), (Some(u32::MAX), Some(&1), 5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's line drops the line count the size gives, wherever the size stands; a first line
    /// without one stays whole.
    #[test]
    fn a_summary_size_loses_its_line_count_alone() {
        assert_eq!(without_line_count(&format!("t3 bash (ls): {}", summary_size(900, 30))), "t3 bash (ls): 900 chars");
        assert_eq!(without_line_count("t3 bash (ls): 900 chars, 1 line, error"), "t3 bash (ls): 900 chars, error");
        assert_eq!(without_line_count("t3 bash (x: 9 chars, 2 lines): 900 chars, 30 lines"), "t3 bash (x: 9 chars, 2 lines): 900 chars");
        for whole in ["t3 bash: the tests pass", "t3 bash (ls): 900 chars, many lines", "t3 bash: 900 chars, lines"] {
            assert_eq!(without_line_count(whole), whole);
        }
    }

    fn call(ref_n: u32, tool: &str, arguments: &str) -> Record {
        Record {
            ref_n,
            batch: 1,
            entry: format!("r{ref_n}"),
            call_entry: format!("a{ref_n}"),
            call_id: format!("c{ref_n}"),
            occurrence: format!("c{ref_n}@r{ref_n}"),
            tool: tool.into(),
            arguments: arguments.into(),
            is_error: false,
            chars: 10,
            hash: String::new(),
            turn: ref_n,
            utg: 1,
            protected: false,
        }
    }

    /// A decision given up folds as one lent does: the same record under its ref and the same maps, the
    /// record taken as the event held it.
    #[test]
    fn a_capture_given_up_folds_as_one_lent() {
        let decisions = vec![
            DecisionEvent::OutputCaptured(Box::new(call(1, "write", r#"{"path":"src/a.rs"}"#))),
            DecisionEvent::OutputCaptured(Box::new(call(2, "bash", r#"{"command":"ls"}"#))),
            DecisionEvent::OutputAliased { ref_n: 2, original: 1 },
        ];
        let (mut lent, mut given) = (Index::default(), Index::default());
        for d in decisions {
            lent.apply(&d);
            // Where the record's texts are: the index keeps them there, not a copy.
            let texts = match &d {
                DecisionEvent::OutputCaptured(r) => Some((r.ref_n, r.entry.as_ptr(), r.arguments.as_ptr())),
                _ => None,
            };
            given.apply_owned(d);
            if let Some((n, entry, arguments)) = texts {
                let kept = &given.records[&n];
                assert_eq!((kept.entry.as_ptr(), kept.arguments.as_ptr()), (entry, arguments), "ref {n} was copied");
            }
        }
        assert_eq!(format!("{given:?}"), format!("{lent:?}"));
        assert_eq!(given.records.get(&2).map(|r| r.tool.as_str()), Some("bash"));
        assert_eq!(given.aliases.get(&2), Some(&1));
        assert_eq!(given.written_files.get("src/a.rs"), Some(&1));
    }

    /// The agent's own files are those it wrote or edited, by file (a read selector left out), from its
    /// first write; reads, and SWE-agent's editor asked to `view`, write nothing.
    #[test]
    fn a_shell_call_that_prints_files_reads_a_document() {
        for (arguments, reads) in [
            (r#"{"command":"sed -n '302,400p' /testbed/pvlib/tools.py"}"#, true),
            (r#"{"command":"cd /repo && cat src/a.rs"}"#, true),
            (r#"{"cmd":"nl -ba src/x.ts | sed -n '90,108p'","workdir":"/w"}"#, true),
            (r#"{"command":["bash","-lc","rg -n parse_config src"]}"#, true),
            (r#"{"command":"grep -rn TODO ."}"#, true),
            (r#"{"command":"sed -i 's/a/b/' f.rs"}"#, false),
            (r#"{"command":"cargo test"}"#, false),
            (r#"{"command":"cd /repo"}"#, false),
            (r#"{"command":"view","path":"a.rs"}"#, false),
            ("not json", false),
        ] {
            assert_eq!(is_document_output("bash", arguments), reads, "{arguments}");
        }
        assert!(is_document_output("Read", "{}") && is_document_output("Agent", "") && is_document_output("web_fetch", "{}"));
        assert_eq!(shell_command(r#"{"command":["bash","-lc","ls"]}"#).as_deref(), Some("bash -lc ls"));
        assert_eq!(shell_command(r#"{"path":"a"}"#), None);
    }

    #[test]
    fn the_agent_s_own_files_are_those_it_wrote_or_edited() {
        let mut written = BTreeMap::new();
        for r in [
            call(1, "read", r#"{"path":"a.rs"}"#),
            call(2, "str_replace_editor", r#"{"command":"view","path":"b.rs"}"#),
            call(3, "write", r#"{"path":"/tmp/page.html"}"#),
            call(4, "str_replace_editor", r#"{"command":"str_replace","path":"b.rs:10-20"}"#),
            call(5, "Edit", r#"{"file_path":"/tmp/page.html","old_string":"x","new_string":"y"}"#),
        ] {
            note_file_write(&mut written, &r);
        }
        assert_eq!(written.into_iter().collect::<Vec<_>>(), vec![("/tmp/page.html".to_string(), 3), ("b.rs".to_string(), 4)]);
    }
}
