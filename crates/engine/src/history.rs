//! The model-facing recovery tools over archives (`history_archives`, `history_search`, `history_read`):
//! archive views of the canonical context and the replies the model reads, within the tool-text ceiling.

use crate::store::Session;
use crate::{query, recover, EngineError, Result};
use condense_events::{Event, SourceEvent};
use std::sync::Arc;

/// The tool ref of archive record `id`, when it stands for a captured output: the original is one
/// `context_tree_query` away even where the archive only held a stub.
fn record_ref(arch: &condense_recovery::Archive, id: &str) -> Option<String> {
    arch.records().iter().find(|r| r.id == id).and_then(|r| r.tool_ref).map(|r| format!("t{r}"))
}

/// `history_search`'s reply: the lowest-ranked hits give way until the reply, as the model reads it, fits
/// the 4,096-byte tool-text ceiling, and it says how many were left out.
fn search_reply(arch: &condense_recovery::Archive, hits: &[condense_recovery::Hit]) -> String {
    let all: Vec<serde_json::Value> = hits
        .iter()
        .map(|h| serde_json::json!({"id": h.id, "matched": h.matched, "snippet": h.snippet, "ref": record_ref(arch, &h.id)}))
        .collect();
    let mut shown = all.len();
    loop {
        let mut v = serde_json::json!({
            "archive": arch.id,
            "hits": all[..shown],
            "note": "snippets can be partial; ranking is not approval or a completeness guarantee",
        });
        if shown < all.len() {
            v["omitted"] = serde_json::json!(format!("{} lower-ranked hit(s) left out to keep the reply short; add keywords to narrow the search", all.len() - shown));
        }
        let text = v.to_string();
        if text.len() <= condense_recovery::REPLY_CEILING || shown == 0 {
            return text;
        }
        shown -= 1;
    }
}

/// `history_read`'s reply for `page` of record `id` read from `offset`: text that escapes to more
/// (quotes, control characters) gets a shorter page, so the reply as the model reads it stays within the
/// 4,096-byte tool-text ceiling.
fn read_reply(arch: &condense_recovery::Archive, id: &str, offset: usize, mut page: condense_recovery::Page) -> std::result::Result<String, condense_recovery::RecoveryError> {
    let tool_ref = record_ref(arch, id);
    loop {
        let text = serde_json::json!({"archive": arch.id, "id": id, "text": page.text, "nextOffset": page.next_offset, "length": page.len, "ref": tool_ref}).to_string();
        if text.len() <= condense_recovery::REPLY_CEILING || page.text.chars().count() <= 1 {
            return Ok(text);
        }
        let over = text.len() - condense_recovery::REPLY_CEILING;
        page = arch.read_within(id, offset, page.text.len().saturating_sub(over.max(page.text.len() / 8)).max(1))?;
    }
}

impl Session {
    /// The archive `id` (the newest when `None`), from the cache or rebuilt from the log.
    pub fn archive(&self, id: Option<&str>) -> Result<Arc<condense_recovery::Archive>> {
        let proj = self.projection()?;
        let all = recover::archives_on_branch(&proj);
        let (aid, seq, leaf) = match id {
            Some(id) => all.iter().find(|(a, _, _)| a == id).copied(),
            None => all.last().copied(),
        }
        .cloned()
        .ok_or_else(|| {
            let e = match id {
                Some(id) if proj.index().archives.iter().any(|(a, _, _)| a == id) => condense_recovery::RecoveryError::LeftBranch(id.to_string()),
                _ => condense_recovery::RecoveryError::UnknownArchive(id.unwrap_or("(none on this branch)").to_string()),
            };
            EngineError::Recovery(e)
        })?;
        let key = (self.id, aid.clone());
        if let Some((_, a)) = self.store.inner.archives.lock().expect("archive cache lock").iter().find(|(k, _)| *k == key) {
            return Ok(a.clone());
        }
        let mut view = self.projection_at(seq)?;
        view.apply(seq + 1, &Event::Source(SourceEvent::LeafMoved { leaf }));
        let idx = view.index();
        // The canonical context as it was (summaries as summaries, pruned outputs as their stubs); a
        // message that stands for several entries is cited by its place (`s<k>`).
        let entries: Vec<(String, Arc<condense_events::Message>)> = view
            .context_entries()
            .into_iter()
            .enumerate()
            .map(|(k, (id, m))| (id.map_or_else(|| format!("s{k}"), str::to_string), m))
            .collect();
        let archive = Arc::new(
            condense_recovery::Archive::build(&aid, entries.iter().map(|(id, m)| (id.as_str(), &**m, idx.by_entry.get(id).copied())))
                .map_err(EngineError::Recovery)?,
        );
        let mut cache = self.store.inner.archives.lock().expect("archive cache lock");
        cache.push((key, archive.clone()));
        if cache.len() > 3 {
            cache.remove(0);
        }
        Ok(archive)
    }

    /// `history_read` of entry `id`: in archive `archive`, or, without one, in the newest archive that
    /// holds the entry (citations from earlier recovery checkpoints resolve this way).
    pub fn history_read(&self, archive: Option<&str>, id: &str, offset: usize) -> Result<(Arc<condense_recovery::Archive>, condense_recovery::Page)> {
        if let Some(a) = archive {
            let arch = self.archive(Some(a))?;
            return arch.read(id, offset).map(|p| (arch, p)).map_err(EngineError::Recovery);
        }
        let ids: Vec<String> = recover::archives_on_branch(&self.projection()?).iter().rev().map(|(a, _, _)| a.clone()).collect();
        let mut last_err = condense_recovery::RecoveryError::UnknownArchive("(none yet)".into());
        for a in ids {
            let arch = self.archive(Some(&a))?;
            match arch.read(id, offset) {
                Ok(p) => return Ok((arch, p)),
                Err(e) => last_err = e,
            }
        }
        Err(EngineError::Recovery(last_err))
    }

    /// Runs a model-facing recovery tool (`history_archives`, `history_search`, `history_read`) on its
    /// JSON arguments; bad arguments give an error result that says what to pass.
    pub fn history_tool(&self, name: &str, arguments: &str) -> Result<query::Answer> {
        let v: serde_json::Value = serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null);
        let err = |text: String| Ok(query::Answer { text, is_error: true, originals: Vec::new() });
        let ok = |v: serde_json::Value| Ok(query::Answer { text: v.to_string(), is_error: false, originals: Vec::new() });
        let archive = v.get("archive").and_then(|a| a.as_str());
        match name {
            "history_archives" => {
                let page = v.get("page").and_then(|p| p.as_u64()).unwrap_or(0) as usize;
                let (ids, next) = self.history_archives(page, 20)?;
                ok(serde_json::json!({"archives": ids, "nextPage": next}))
            }
            "history_search" => {
                let words: Vec<String> = match v.get("keywords") {
                    Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
                    Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
                    _ => Vec::new(),
                };
                let arch = match self.archive(archive) {
                    Ok(a) => a,
                    Err(EngineError::Recovery(e)) => return err(e.to_string()),
                    Err(e) => return Err(e),
                };
                let refs: Vec<&str> = words.iter().map(String::as_str).collect();
                match arch.search(&refs, 20) {
                    Ok(hits) => Ok(query::Answer { text: search_reply(&arch, &hits), is_error: false, originals: Vec::new() }),
                    Err(e) => err(e.to_string()),
                }
            }
            "history_read" => {
                let Some(id) = v.get("id").and_then(|i| i.as_str()) else {
                    return err("history_read needs {\"id\": \"<entry id cited by history_search or a checkpoint>\"}".into());
                };
                let offset = v.get("offset").and_then(|o| o.as_u64()).unwrap_or(0) as usize;
                match self.history_read(archive, id, offset) {
                    Ok((arch, page)) => {
                        let text = read_reply(&arch, id, offset, page).map_err(EngineError::Recovery)?;
                        Ok(query::Answer { text, is_error: false, originals: Vec::new() })
                    }
                    Err(EngineError::Recovery(e)) => err(e.to_string()),
                    Err(e) => Err(e),
                }
            }
            other => err(format!("unknown recovery tool `{other}`; use history_archives, history_search or history_read")),
        }
    }

    /// Archive ids of this session, newest first, `size` per page.
    pub fn history_archives(&self, page: usize, size: usize) -> Result<(Vec<String>, Option<usize>)> {
        let ids: Vec<String> = recover::archives_on_branch(&self.projection()?).iter().map(|(a, _, _)| a.clone()).collect();
        Ok(condense_recovery::archives_page(&ids, page, size))
    }

}
