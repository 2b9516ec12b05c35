//! The memory of request bodies, bounded across all connections.
//!
//! Invariants:
//! * The bytes reserved never exceed the budget's limit: a reservation is
//!   taken whole or not at all ([`Reservation::grow`]), by one atomic
//!   compare-and-swap, so concurrent requests cannot overshoot it together.
//! * A body's bytes are reserved before they are read: a `Content-Length`
//!   body's whole length before its first byte, a chunked body's buffer
//!   before each time it grows.
//! * A reservation is released when it is dropped, however its request
//!   ends: with the [`Body`] that holds it once the body is read (after the
//!   last job scoring it lets go of it), or on the error path that gave up
//!   reading.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of request bodies held at once, in all connections.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget { limit, used: AtomicUsize::new(0) })
    }

    /// The bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Takes `n` more bytes if they fit under the limit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Bytes of a [`BodyBudget`] held by one request, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Reservation {
    /// A reservation of no bytes yet.
    pub fn empty(budget: &Arc<BodyBudget>) -> Reservation {
        Reservation { budget: budget.clone(), bytes: 0 }
    }

    /// Reserves `n` more bytes; `false` (and nothing more reserved) when they do not fit.
    pub fn grow(&mut self, n: usize) -> bool {
        let taken = self.budget.take(n);
        if taken {
            self.bytes += n;
        }
        taken
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// A request body and the budget it holds: the reservation goes when the body does.
#[derive(Debug)]
pub struct Body {
    bytes: Vec<u8>,
    _held: Reservation,
}

impl Body {
    /// `bytes`, holding `held` until dropped.
    pub fn new(bytes: Vec<u8>, held: Reservation) -> Body {
        Body { bytes, _held: held }
    }
}

impl Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_under_the_limit_and_are_given_back_on_drop() {
        let budget = BodyBudget::new(100);
        let mut a = Reservation::empty(&budget);
        assert!(a.grow(60) && a.grow(40));
        assert_eq!(budget.in_use(), 100);
        let mut b = Reservation::empty(&budget);
        assert!(!b.grow(1), "nothing is left");
        assert!(!b.grow(usize::MAX), "an overflowing request is refused, not wrapped");
        let body = Body::new(b"abc".to_vec(), a);
        assert_eq!(&*body, b"abc");
        drop(body);
        assert_eq!(budget.in_use(), 0, "the body's reservation went with it");
        assert!(b.grow(100));
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let budget = BodyBudget::new(1000);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut r = Reservation::empty(&budget);
                        if r.grow(300) {
                            assert!(budget.in_use() <= 1000);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(budget.in_use(), 0);
    }
}
