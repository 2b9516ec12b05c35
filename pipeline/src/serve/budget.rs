//! The memory of request bodies, bounded across all connections and per
//! client address.
//!
//! Invariants:
//! * The bytes reserved never exceed the budget's limit, and the bytes
//!   reserved by the requests of one client address (an IPv6 client's /64
//!   prefix, [`ClientKey`]) never exceed its share
//!   ([`BodyBudget::new`]): a reservation is taken whole or not at all
//!   ([`Reservation::grow`]), both counts checked and updated under one lock,
//!   so concurrent requests cannot overshoot either together. With a share
//!   below the limit, one address (however many connections it opens and
//!   bodies it sends) cannot hold the whole budget.
//! * A body's bytes are reserved as they arrive, never for a length only
//!   announced: its buffer grows (by doubling) once bytes are there to fill
//!   it, each growth reserved first (`http.rs`), so heads announcing large
//!   bodies, and bodies that stall, hold only what they sent (at most about
//!   twice). A length announced may be checked against what is left
//!   ([`Reservation::fits`]), which reserves nothing.
//! * A reservation is released when it is dropped, however its request
//!   ends: with the [`Body`] that holds it once the body is read (after the
//!   last job scoring it lets go of it), or on the error path that gave up
//!   reading. An address holding nothing is forgotten.

use super::address::ClientKey;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// Bytes of request bodies held at once, in all connections and per client address.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    share: usize,
    used: Mutex<Used>,
}

/// The bytes reserved, in all and per client address.
#[derive(Debug, Default)]
struct Used {
    total: usize,
    by_address: HashMap<ClientKey, usize>,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Full {
    /// The budget is spent.
    #[error("request bodies hold {held} of the {limit} bytes of --max-body-memory")]
    Total {
        /// The bytes reserved when refused.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// The address's share is spent.
    #[error(
        "request bodies from {ip} hold {held} of the {share} bytes of --max-body-memory one client address may hold \
         (its share is that of --max-connections-per-ip in --threads)"
    )]
    Address {
        /// The client address.
        ip: ClientKey,
        /// The bytes it held when refused.
        held: usize,
        /// Its share.
        share: usize,
    },
}

impl BodyBudget {
    /// A budget of `limit` bytes, of which one client address may hold at most `share`.
    pub fn new(limit: usize, share: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget { limit, share: share.min(limit), used: Mutex::default() })
    }

    fn used(&self) -> std::sync::MutexGuard<'_, Used> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.used().total
    }

    /// Takes `n` more bytes for `ip` if they fit under the limit and its share.
    fn take(&self, ip: ClientKey, n: usize) -> Result<(), Full> {
        let mut used = self.used();
        let total = self.room(&used, ip, n)?;
        used.total = total;
        *used.by_address.entry(ip).or_insert(0) += n;
        Ok(())
    }

    /// The total reserved once `n` more bytes are for `ip`, if they fit under the limit and its
    /// share in `used`.
    fn room(&self, used: &Used, ip: ClientKey, n: usize) -> Result<usize, Full> {
        let held = used.by_address.get(&ip).copied().unwrap_or(0);
        if held.checked_add(n).is_none_or(|h| h > self.share) {
            return Err(Full::Address { ip, held, share: self.share });
        }
        let total = used.total.checked_add(n).filter(|&t| t <= self.limit);
        total.ok_or(Full::Total { held: used.total, limit: self.limit })
    }

    fn give_back(&self, ip: ClientKey, n: usize) {
        let mut used = self.used();
        used.total = used.total.saturating_sub(n);
        if let Some(held) = used.by_address.get_mut(&ip) {
            *held = held.saturating_sub(n);
            if *held == 0 {
                used.by_address.remove(&ip);
            }
        }
    }
}

/// Bytes of a [`BodyBudget`] held by one request of a client address, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    ip: ClientKey,
    bytes: usize,
}

impl Reservation {
    /// A reservation of no bytes yet, for a request from `ip`.
    pub fn empty(budget: &Arc<BodyBudget>, ip: ClientKey) -> Reservation {
        Reservation { budget: budget.clone(), ip, bytes: 0 }
    }

    /// Whether `n` more bytes would fit now; nothing is reserved (another request may take
    /// them first).
    pub fn fits(&self, n: usize) -> Result<(), Full> {
        self.budget.room(&self.budget.used(), self.ip, n).map(|_| ())
    }

    /// Reserves `n` more bytes; refused (and nothing more reserved) when they do not fit.
    pub fn grow(&mut self, n: usize) -> Result<(), Full> {
        self.budget.take(self.ip, n)?;
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.ip, self.bytes);
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

    fn key(text: &str) -> ClientKey {
        ClientKey::of(text.parse().unwrap())
    }

    #[test]
    fn reservations_stay_under_the_limit_and_are_given_back_on_drop() {
        let budget = BodyBudget::new(100, 100);
        let mut a = Reservation::empty(&budget, key("127.0.0.1"));
        assert!(a.grow(60).is_ok() && a.grow(40).is_ok());
        assert_eq!(budget.in_use(), 100);
        let mut b = Reservation::empty(&budget, key("127.0.0.2"));
        assert_eq!(b.fits(1), Err(Full::Total { held: 100, limit: 100 }));
        assert_eq!(b.grow(1), Err(Full::Total { held: 100, limit: 100 }), "nothing is left");
        assert!(b.grow(usize::MAX).is_err(), "an overflowing request is refused, not wrapped");
        let body = Body::new(b"abc".to_vec(), a);
        assert_eq!(&*body, b"abc");
        drop(body);
        assert_eq!(budget.in_use(), 0, "the body's reservation went with it");
        assert!(b.fits(100).is_ok() && b.fits(101).is_err());
        assert_eq!(budget.in_use(), 0, "a check reserves nothing");
        assert!(b.grow(100).is_ok());
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn one_address_holds_at_most_its_share() {
        let (a, b) = (key("127.0.0.1"), key("127.0.0.2"));
        let budget = BodyBudget::new(100, 40);
        let held: Vec<Reservation> = (0..4)
            .map(|_| {
                let mut r = Reservation::empty(&budget, a);
                assert!(r.grow(10).is_ok());
                r
            })
            .collect();
        let mut more = Reservation::empty(&budget, a);
        let refused = more.grow(1).unwrap_err();
        assert_eq!(refused, Full::Address { ip: a, held: 40, share: 40 });
        assert!(refused.to_string().contains("from 127.0.0.1 hold 40 of the 40 bytes"), "{refused}");
        // Another address still has the rest of the budget.
        let mut other = Reservation::empty(&budget, b);
        assert!(other.grow(40).is_ok());
        drop(held);
        assert!(more.grow(40).is_ok(), "the address's share is given back with its reservations");
        assert_eq!(budget.in_use(), 80);
        drop((more, other));
        assert_eq!(budget.in_use(), 0);
        assert!(budget.used().by_address.is_empty(), "addresses holding nothing are forgotten");
    }

    /// The addresses of one IPv6 /64 share one share; the next /64 has its own.
    #[test]
    fn the_addresses_of_one_ipv6_prefix_share_one_share() {
        let budget = BodyBudget::new(100, 40);
        let held: Vec<Reservation> = (1..=4)
            .map(|k| {
                let mut r = Reservation::empty(&budget, key(&format!("2001:db8:0:7::{k:x}")));
                assert!(r.grow(10).is_ok());
                r
            })
            .collect();
        let mut more = Reservation::empty(&budget, key("2001:db8:0:7:ffff::1"));
        let refused = more.grow(1).unwrap_err();
        assert!(refused.to_string().contains("from 2001:db8:0:7::/64 hold 40 of the 40 bytes"), "{refused}");
        let mut next = Reservation::empty(&budget, key("2001:db8:0:8::1"));
        assert!(next.grow(40).is_ok(), "another /64 is another client");
        drop((held, next));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let budget = BodyBudget::new(1000, 600);
        let threads: Vec<_> = (0..8u8)
            .map(|k| {
                let budget = budget.clone();
                let ip = key(&format!("127.0.0.{}", k % 2));
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut r = Reservation::empty(&budget, ip);
                        if r.grow(300).is_ok() {
                            let used = budget.used();
                            assert!(used.total <= 1000 && used.by_address[&ip] <= 600);
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
