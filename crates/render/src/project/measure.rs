//! What the projection measures for the checkpoint controller and the cost guard: token estimates of
//! rendered messages, the request overhead, the provider's last usage and overflows, model transitions.

use super::*;

/// Messages of at most this many bytes of text, arguments and data are counted afresh each time.
const UNCACHED_BYTES: usize = 256;

impl Projection {
    /// pi's token estimate of a rendered message, remembered per message (a context counted every request
    /// costs what changed).
    pub fn estimate(&self, m: &Arc<Message>) -> u64 {
        // A short message is counted faster than it is looked up, and remembering it cost more than the
        // message (a request of 100,000 one-line messages kept 3 MB of entries).
        if m.bytes() <= UNCACHED_BYTES {
            return condense_tokens::estimate(m);
        }
        let mut cache = self.tokens.lock().expect("token cache lock");
        if let Some((_, t)) = cache.get(&(Arc::as_ptr(m) as usize)) {
            return *t;
        }
        let t = condense_tokens::estimate(m);
        if cache.len() > 2 * self.items.len() + 1024 {
            // Keep what is still in use (a render holds it): dropping everything would make the next
            // request count the whole context again.
            cache.retain(|_, (m, _)| Arc::strong_count(m) > 1);
            if cache.len() > 2 * self.items.len() + 1024 {
                cache.clear();
            }
        }
        cache.insert(Arc::as_ptr(m) as usize, (m.clone(), t));
        t
    }

    /// Estimated tokens each request carries besides the messages (system prompt, tool declarations), as
    /// last reported (`RequestOverhead`); 0 when never reported.
    pub fn request_overhead(&self) -> u64 {
        self.overhead
    }

    /// Provider overflows since the last entry that was not a failed assistant message: 1 asks for a
    /// checkpoint and one retry, 2 is terminal.
    pub fn overflow_streak(&self) -> u32 {
        self.overflow_streak
    }

    /// The context size the provider's last reported usage implies: its input and output tokens plus the
    /// estimate of every message of `rendered` after the entry that was the leaf when it was reported. `None`
    /// without a usage report, or once a decision has changed the context since.
    pub fn anchored_tokens(&self, rendered: &[Arc<Message>]) -> Option<u64> {
        let (usage, leaf) = self.usage_anchor?;
        let base = usage.context_tokens() + usage.output;
        let path = self.path();
        // Messages on the path after the anchor leaf that are in the rendered context.
        let from = match leaf {
            Some(l) => path.iter().position(|&i| i == l).map_or(path.len(), |p| p + 1),
            None => 0,
        };
        let mut later = 0;
        for &i in &path[from..] {
            if let Node::Message(m, _) = &self.items[i].node {
                if rendered.iter().rev().any(|x| Arc::ptr_eq(x, m)) {
                    later += self.estimate(m);
                }
            }
        }
        Some(base + later)
    }

    /// Whether the session is in a model transition: the model changed and no successful reply on the new
    /// model has been added since (an overflowed reply, a reply that ended in a provider error, or one
    /// another model wrote does not end it).
    pub fn in_model_transition(&self) -> bool {
        let Some(at) = self.model_change_leaf else { return false };
        let path = self.path();
        let from = match at {
            Some(l) => match path.iter().position(|&i| i == l) {
                Some(p) => p + 1,
                None => return false,
            },
            None => 0,
        };
        // Only a successful reply on the new model ends the transition: not an overflowed one, not one that
        // ended in a provider error, not one another model wrote.
        let current = self.model.as_ref().map(|m| m.model.as_str());
        !path[from..].iter().any(|&i| {
            !self.overflowed.contains(&i)
                && matches!(&self.items[i].node, Node::Message(m, _) if matches!(&**m, Message::Assistant { stop, model, .. }
                    if *stop != Some(condense_events::StopReason::Error) && (model.is_none() || model.as_deref() == current)))
        })
    }

    /// Whether the last request ended in CONTEXT_COMPACTION_FAILED because of provider overflows: refused
    /// twice in a row, or once with no checkpoint possible. The host's next request is then a new attempt
    /// (`SourceEvent::RequestRetried`); without it, an identical retry would fail again unsent.
    pub fn overflow_unresolved(&self) -> bool {
        self.overflow_streak >= 2 || (self.overflow_streak >= 1 && self.overflow_failed)
    }

    /// Whether the last overflow was answered by a checkpoint (a recovery, after a model change) that no
    /// request has been sent with yet.
    pub fn overflow_answered(&self) -> bool {
        self.overflow_streak >= 1 && self.overflow_checkpointed
    }

    /// Whether an overflow still waits for its checkpoint.
    pub fn overflow_pending(&self) -> bool {
        self.overflow_streak == 1 && !self.overflow_checkpointed
    }
}
