//! The memory requests may hold at once. Each request reserves, before its body is read, what recording
//! it will take at most — a multiple of its declared length, then, once its message list is read, a share
//! per JSON value in it as well — and gives it back when its response has ended (a stream included). A request
//! that would take the server past its budget is refused at once: with a 503 and `retry-after` when
//! others hold the memory, with a 413 when it could never fit alone (issue 35: one body of 500,000 tiny
//! messages took 3.6 GB).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Peak memory of recording a request, per byte of its body (measured: docs/serve.md, "Limits").
pub const PER_BODY_BYTE: u64 = 12;
/// Peak memory of recording a request, per value its message list opens or separates beyond its bytes
/// (`condense_formats::wire::count_elements`: each `{`, `[` and `,` outside strings; a message of one
/// short text is three, a content block three, an element of a call's input one; measured as above).
pub const PER_ELEMENT: u64 = 640;

/// What recording a message list of `body` bytes and `elements` values reserves.
pub fn reservation(body: u64, elements: u64) -> u64 {
    body * PER_BODY_BYTE + elements * PER_ELEMENT
}

/// The server's budget.
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
}

/// Why a reservation was refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// More than the whole budget.
    TooLarge { need: u64, limit: u64 },
    /// More than what is free now.
    Busy { need: u64, free: u64 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooLarge { need, limit } => write!(f, "recording this request would take about {} MB, more than the server's memory budget of {} MB (--memory-budget)", need >> 20, limit >> 20),
            Refusal::Busy { need, free } => write!(f, "the server is busy: this request needs about {} MB to record and {} MB of the memory budget are free; retry shortly", need >> 20, free >> 20),
        }
    }
}

/// Memory held for one request until it is dropped.
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget { limit, used: AtomicU64::new(0) })
    }

    /// Takes `bytes` of the budget, or says why not.
    fn take(&self, bytes: u64) -> Result<(), Refusal> {
        if bytes > self.limit {
            return Err(Refusal::TooLarge { need: bytes, limit: self.limit });
        }
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| (used + bytes <= self.limit).then_some(used + bytes))
            .map(|_| ())
            .map_err(|used| Refusal::Busy { need: bytes, free: self.limit.saturating_sub(used) })
    }

    /// Reserves `bytes`.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, Refusal> {
        self.take(bytes)?;
        Ok(Reservation { budget: self.clone(), bytes })
    }

    /// What requests hold now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

impl Reservation {
    /// Changes the reservation to `bytes` (a larger one may be refused; the old one then stays).
    pub(crate) fn resize(&mut self, bytes: u64) -> Result<(), Refusal> {
        // A request that could never fit is too large, whatever it holds already (the growth alone
        // may fit where the whole does not).
        if bytes > self.budget.limit {
            return Err(Refusal::TooLarge { need: bytes, limit: self.budget.limit });
        }
        if bytes > self.bytes {
            self.budget.take(bytes - self.bytes)?;
        } else {
            self.budget.used.fetch_sub(self.bytes - bytes, Ordering::SeqCst);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_grown_past_the_whole_budget_is_too_large() {
        let b = Budget::new(100);
        let mut a = b.reserve(40).unwrap();
        // The growth (70) fits the budget; the whole (110) never can: too large, not busy.
        assert!(matches!(a.resize(110), Err(Refusal::TooLarge { need: 110, limit: 100 })));
        assert!(matches!(a.resize(90), Ok(())));
        drop(a);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn reservations_add_up_and_come_back() {
        let b = Budget::new(100);
        let mut a = b.reserve(60).unwrap();
        assert!(matches!(b.reserve(50), Err(Refusal::Busy { free: 40, .. })));
        assert!(matches!(b.reserve(101), Err(Refusal::TooLarge { .. })));
        a.resize(30).unwrap();
        let c = b.reserve(70).unwrap();
        assert!(a.resize(31).is_err(), "a larger reservation can be refused");
        assert_eq!(b.used(), 100);
        drop(c);
        drop(a);
        assert_eq!(b.used(), 0);
    }
}
