//! Forking a session: the entries on the path to a chosen entry, the configuration and model in force,
//! and every decision about those entries, copied into a new session.

use crate::store::{Session, Store};
use crate::{EngineError, Result};
use condense_events::{DecisionEvent, Event, SourceEvent};
use condense_render::Projection;

impl Store {
    /// Forks `source` into a new session `name` that ends at entry `at` (the source's active leaf when
    /// `None`): the entries on the path to it, the configuration and model in force, and every decision
    /// about those entries. A checkpoint is copied only when the fork includes its boundary (and every
    /// prompt it retains); refs keep their numbers, so `tN`, `bN` and `cN` mean the same in both sessions.
    pub fn fork(&self, source: &str, name: &str, at: Option<&str>) -> Result<Session> {
        let src = self.session(source)?;
        let head = src.head()?;
        let events = self.inner.log.read(src.id, 1, head)?;
        let mut proj = Projection::new();
        for env in &events {
            proj.apply(env.seq, &env.body);
        }
        if let Some(at) = at {
            proj.apply(head + 1, &Event::Source(SourceEvent::LeafMoved { leaf: Some(at.to_string()) }));
            if proj.path_ids().last().map(String::as_str) != Some(at) {
                return Err(EngineError::UnknownEntry { name: source.to_string(), entry: at.to_string() });
            }
        }
        let on_path: std::collections::BTreeSet<String> = proj.path_ids().into_iter().collect();
        let idx = proj.index();
        let copied_refs: std::collections::BTreeSet<u32> = idx
            .records
            .values()
            .filter(|r| on_path.contains(&r.entry) && on_path.contains(&r.call_entry))
            .map(|r| r.ref_n)
            .collect();
        let mut out: Vec<Event> = Vec::new();
        for env in events {
            let keep = match &env.body {
                Event::Source(SourceEvent::EntryAppended { id, .. }) => on_path.contains(id),
                Event::Source(SourceEvent::LeafMoved { .. }) => false,
                Event::Source(_) => true,
                Event::Decision(d) => match d {
                    DecisionEvent::Note { .. } => false,
                    DecisionEvent::OutputCaptured(r) => copied_refs.contains(&r.ref_n),
                    DecisionEvent::OutputSpilled { ref_n, .. } | DecisionEvent::OutputAliased { ref_n, .. } | DecisionEvent::OutputStubbed { ref_n, .. } => {
                        copied_refs.contains(ref_n)
                    }
                    DecisionEvent::BatchClosed { refs, .. } => refs.iter().all(|r| copied_refs.contains(r)),
                    DecisionEvent::FrontierAdvanced { entry } | DecisionEvent::ErrorArgsPurged { entry, .. } => on_path.contains(entry),
                    DecisionEvent::ChainCompressed(ch) => on_path.contains(&ch.first) && on_path.contains(&ch.last),
                    DecisionEvent::CheckpointCommitted(c) => on_path.contains(&c.boundary) && c.kept.iter().all(|k| on_path.contains(k)),
                    DecisionEvent::CheckpointStarted { .. } | DecisionEvent::CheckpointFailed { .. } => false,
                    DecisionEvent::ArchiveCommitted { .. } => false,
                    DecisionEvent::ChainReplyCut { block, .. } => {
                        idx.chains.get(block).is_some_and(|c| on_path.contains(&c.compressed.first) && on_path.contains(&c.compressed.last))
                    }
                },
            };
            if keep {
                out.push(env.body);
            }
        }
        let session = self.create_session(name)?;
        let warm = self.warm(session.id);
        let mut p = warm.lock().expect("projection lock");
        session.append_locked(&mut p, out)?;
        drop(p);
        Ok(session)
    }
}
