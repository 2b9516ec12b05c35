//! The client a connection is counted for by the per-address bounds
//! (`--max-connections-per-ip` and the body memory share, `budget.rs`).
//!
//! Invariants:
//! * Both bounds count the same [`ClientKey`], made once per connection by
//!   [`ClientKey::of`] from the peer's address.
//! * An IPv4 client is its address, also when it reaches a dual-stack
//!   listener as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
//! * An IPv6 client is its /64 prefix: one host or site is commonly given a
//!   whole /64 and can send from any address in it, so counting each address
//!   would give it the bounds of as many clients as it cares to use.

use std::net::{IpAddr, Ipv6Addr};

/// The bits of an IPv6 address that tell one client from another.
const IPV6_PREFIX_BITS: u32 = 64;

/// What the per-address bounds count a connection as: an IPv4 address, or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    /// The client of a connection from `ip`.
    pub fn of(ip: IpAddr) -> ClientKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ClientKey(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let mask = u128::MAX << (128 - IPV6_PREFIX_BITS);
                ClientKey(IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)))
            }
        }
    }
}

impl std::fmt::Display for ClientKey {
    /// An IPv4 address as itself, an IPv6 client as its prefix (`2001:db8::/64`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/{IPV6_PREFIX_BITS}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ClientKey {
        ClientKey::of(text.parse().unwrap())
    }

    #[test]
    fn ipv6_clients_are_their_64_bit_prefix() {
        let a = key("2001:db8:1:2:aaaa:bbbb:cccc:dddd");
        assert_eq!(a, key("2001:db8:1:2::1"), "one /64 is one client");
        assert_eq!(a, key("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(a, key("2001:db8:1:3::1"), "the next /64 is another");
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(key("::1").to_string(), "::/64");
    }

    #[test]
    fn ipv4_clients_are_their_address_also_when_mapped() {
        assert_eq!(key("::ffff:127.0.0.1"), key("127.0.0.1"));
        assert_eq!(key("::ffff:10.1.2.3").to_string(), "10.1.2.3");
        assert_ne!(key("127.0.0.1"), key("127.0.0.2"), "every IPv4 address is a client of its own");
        assert_ne!(key("127.0.0.1"), key("::1"));
        assert_ne!(key("::ffff:127.0.0.1"), key("::1"));
    }
}
