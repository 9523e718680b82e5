//! The pruning pipeline: capture → dedup → spill → summarize → purge → chain, run before a model request.
//! Each stage is its own crate and a consumer of the log (see `condense_stage`): it folds the events it
//! cares about into its own state, and before a request decides from that state and what is new on the
//! branch. [`Stages`] composes them in that order; the session appends their decisions and folds every
//! event it appends (theirs included) back into them, as into the render projection. Every choice depends
//! only on the events and the configuration, so a replay decides the same.

use condense_capture::Capture;
use condense_chain::Chains;
use condense_dedup::Dedup;
use condense_events::{DecisionEvent, Event, Message};
use condense_purge::Purge;
use condense_render::{BranchView, Projection};
use condense_spill::Spill;
use condense_stage::{Entries, Pass, Shape, Stage, StageError};
use condense_summarize::{Close, Summarizer};
use std::sync::Arc;

pub use condense_stage::Trigger;

/// The projection's kept branch view, as the stages read a branch.
struct View<'a>(BranchView<'a>);

impl<'a> Entries<'a> for View<'a> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn entry(&self, i: usize) -> (&'a str, &'a Arc<Message>) {
        self.0.at(i)
    }
    fn position(&self, id: &str) -> Option<usize> {
        self.0.position(id)
    }
}

/// The stages of one session, in order, with the branch shape they share. The summarize stage keeps no
/// state: it is made for each pass with the summarizer of the moment.
#[derive(Debug, Clone, Default)]
pub struct Stages {
    shape: Shape,
    capture: Capture,
    dedup: Dedup,
    spill: Spill,
    purge: Purge,
    chains: Chains,
}

impl Stages {
    /// Takes in one event appended to the session's log (every stage sees every event).
    pub fn fold(&mut self, event: &Event) {
        for s in self.all() {
            s.fold(event);
        }
    }

    fn all(&mut self) -> [&mut dyn Stage; 5] {
        [&mut self.capture, &mut self.dedup, &mut self.spill, &mut self.purge, &mut self.chains]
    }

    /// Assistant messages on the branch the stages last read (the requests answered so far).
    pub fn turns(&self) -> u32 {
        self.shape.turns()
    }

    /// Runs every stage in order on the warm projection `p` (which has folded the same events as the
    /// stages) and returns the decisions. `put_blob` stores a spilled output and returns its hash.
    pub fn plan(
        &mut self,
        p: &Projection,
        summarizer: &dyn Summarizer,
        trigger: Trigger,
        put_blob: &mut dyn FnMut(&[u8]) -> Result<String, String>,
    ) -> Result<Vec<DecisionEvent>, StageError> {
        let cfg = p.config();
        if !cfg.enabled {
            return Ok(Vec::new());
        }
        let view = View(p.branch_view());
        self.shape.follow(&view);
        let Stages { shape, capture, dedup, spill, purge, chains } = self;
        let mut pass = Pass::new(cfg, p.index(), &view, shape, trigger, put_blob);
        for s in [capture as &mut dyn Stage, dedup, spill, &mut Close::new(summarizer), purge, chains] {
            s.decide(&mut pass)?;
        }
        Ok(pass.into_decisions())
    }
}
