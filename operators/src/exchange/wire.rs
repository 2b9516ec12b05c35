//! Row ids as they travel in lookup requests.

use serde::{Deserialize, Serialize};

/// Row ids on the wire: four bytes each when every table has at most 2³² rows, else eight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireIds {
    /// Every id below 2³².
    Narrow(Vec<u32>),
    /// Any ids.
    Wide(Vec<u64>),
}

impl Default for WireIds {
    fn default() -> Self {
        WireIds::Wide(Vec::new())
    }
}

impl WireIds {
    /// Encodes `ids`, narrow when `narrow` (every id must then be below 2³²).
    pub fn encode(ids: &[u64], narrow: bool) -> Self {
        if narrow {
            debug_assert!(ids.iter().all(|&id| id <= u32::MAX as u64));
            WireIds::Narrow(ids.iter().map(|&id| id as u32).collect())
        } else {
            WireIds::Wide(ids.to_vec())
        }
    }

    /// Replaces `out` with the ids.
    pub fn decode_into(&self, out: &mut Vec<u64>) {
        out.clear();
        match self {
            WireIds::Narrow(v) => out.extend(v.iter().map(|&id| id as u64)),
            WireIds::Wide(v) => out.extend_from_slice(v),
        }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            WireIds::Narrow(v) => v.len(),
            WireIds::Wide(v) => v.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        match self {
            WireIds::Narrow(v) => 4 * v.len() as u64,
            WireIds::Wide(v) => 8 * v.len() as u64,
        }
    }
}

/// Whether every table's ids fit in four bytes.
pub fn narrow_ids(table_sizes: &[u64]) -> bool {
    table_sizes.iter().all(|&n| n <= 1 << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_narrow_and_wide() {
        let ids = [0u64, 7, u32::MAX as u64];
        let mut out = Vec::new();
        for narrow in [true, false] {
            let w = WireIds::encode(&ids, narrow);
            w.decode_into(&mut out);
            assert_eq!(out, ids);
            assert_eq!(w.wire_bytes(), if narrow { 12 } else { 24 });
        }
        assert!(narrow_ids(&[1 << 32, 10]) && !narrow_ids(&[(1 << 32) + 1]));
        WireIds::encode(&[1 << 40], false).decode_into(&mut out);
        assert_eq!(out, [1 << 40]);
    }
}
