//! The key/value pairs of one JSON object, in order, each value of the caller's type
//! (`serde_json::Value`, or `&RawValue` to keep its text).
//!
//! Invariant: every pair is kept, a key given twice included, so that a reader refusing
//! repeated keys sees them (a `serde_json::Map` keeps only the last).

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use std::marker::PhantomData;

/// The pairs of the JSON object `record`; an error when `record` is not exactly one object.
pub fn object_pairs<'de, V: Deserialize<'de>>(record: &'de [u8]) -> Result<Vec<(String, V)>, serde_json::Error> {
    struct Pairs<V>(PhantomData<V>);
    impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(pair) = map.next_entry::<String, V>()? {
                out.push(pair);
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(record);
    let pairs = (&mut de).deserialize_map(Pairs(PhantomData))?;
    de.end()?;
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_keep_their_order_and_repeated_keys() {
        let pairs: Vec<(String, serde_json::Value)> = object_pairs(br#"{"b": 1, "a": [2], "b": 3}"#).unwrap();
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
        assert_eq!(pairs[2].1, 3);
        assert!(object_pairs::<serde_json::Value>(br#"{"a": 1} {"#).is_err(), "one object, nothing after");
        assert!(object_pairs::<serde_json::Value>(b"[1]").is_err());
    }
}
