//! The key path of a TOML error in a spec (`categorical[0].buckets`), so that a value of
//! the wrong type (`buckets = -1`, `buckets = "10"`) is named like any other bad value.
//!
//! Invariants: the path is found from the error's byte span alone, in a second, spanned
//! reading of the text ([`Node`]): the deepest value whose span holds the error's, its
//! tables' keys joined by `.` and its arrays' indices in brackets. An unknown or missing
//! field (which `toml` reports on its table) adds the field's name. Text that does not
//! parse, or an error without a span, gives the field's name alone, or `spec`.

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::ops::Range;
use toml::Spanned;

/// A TOML value, with only what locating an error needs: its tables' keys and its arrays'
/// items, each with its byte span.
enum Node {
    /// A string, number, boolean or date.
    Leaf,
    Table(Vec<(String, Spanned<Node>)>),
    Array(Vec<Spanned<Node>>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            entries.push((key, map.next_value()?));
        }
        Ok(Node::Table(entries))
    }
}

/// Whether `outer` holds `inner`.
fn holds(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// The path below `node` to the deepest value holding `span` (empty: `node` itself).
fn path_to(node: &Node, span: &Range<usize>) -> String {
    let child = match node {
        Node::Leaf => None,
        Node::Table(entries) => entries.iter().find(|(_, v)| holds(&v.span(), span)).map(|(k, v)| (format!(".{k}"), v)),
        Node::Array(items) => {
            items.iter().enumerate().find(|(_, v)| holds(&v.span(), span)).map(|(i, v)| (format!("[{i}]"), v))
        }
    };
    match child {
        Some((step, v)) => step + &path_to(v.get_ref(), span),
        None => String::new(),
    }
}

/// The key path of `error`, an error of reading `text` as a spec: `categorical[0].buckets`,
/// `list[1].max_len` for a missing field, `spec` when nothing locates it.
pub(super) fn error_key(text: &str, error: &toml::de::Error) -> String {
    let msg = error.message();
    let field = msg.split('`').nth(1).filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"));
    let path =
        error.span().and_then(|span| Some(path_to(&toml::from_str::<Node>(text).ok()?, &span))).unwrap_or_default();
    let path = path.strip_prefix('.').unwrap_or(&path);
    match field {
        Some(f) if path.is_empty() => f.to_string(),
        Some(f) if path.rsplit('.').next() != Some(f) => format!("{path}.{f}"),
        _ if path.is_empty() => "spec".to_string(),
        _ => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::fixtures::{NUMERIC, TOML};
    use crate::spec::FeatureSpec;
    use crate::OperatorError;

    /// A value of the wrong type is named by its key path, with the line and column.
    #[test]
    fn type_errors_name_the_key_path() {
        let cases = [
            (TOML.replacen("buckets = 10\n", "buckets = -1\n", 1), "categorical[0].buckets", "line 9"),
            (TOML.replacen("buckets = 20\n", "buckets = \"20\"\n", 1), "categorical[1].buckets", "line 16"),
            (TOML.replace("max_len = 3", "max_len = 3.5"), "list[1].max_len", "line 28"),
            (TOML.replace("pooling = \"mean\"", "pooling = \"max\""), "list[0].pooling", "line 23"),
            (TOML.replace("header = false", "header = 1"), "header", "line 3"),
            (TOML.replace("label = { column = \"y\" }", "label = { column = 1 }"), "label.column", "line 5"),
            (TOML.replace("\"paris\", \"lyon\"", "\"paris\", 2"), "categorical[0].vocabulary", "line 11"),
            (NUMERIC.replace("center = 0.0", "center = \"0\""), "dense[2].center", "line 9"),
            (
                NUMERIC.replace("width = 24.0 }", "width = 24.0, clamp = [0.0, 1.0, 2.0] }"),
                "dense[2].clamp",
                "length 3",
            ),
            (NUMERIC.replace("width = 24.0 }", "width = 24.0, clamp = [0.0] }"), "dense[2].clamp", "length 1"),
            (NUMERIC.replace("[6.0, 12.0, 18.0]", "[6.0, \"12\", 18.0]"), "categorical[1].boundaries[1]", "line 21"),
            (TOML.replace("max_len = 4\n", ""), "list[0].max_len", "missing field"),
            (TOML.replace("oov_buckets = 2", "oov_bucket = 2"), "categorical[0].oov_bucket", "unknown field"),
            (format!("bogus = 1\n{TOML}"), "bogus", "unknown field"),
        ];
        for (text, key, what) in cases {
            match FeatureSpec::from_toml(&text).unwrap_err() {
                OperatorError::Config(e) => {
                    assert!(e.key == key && e.reason.contains(what), "expected `{key}`, {what}: {e}")
                }
                e => panic!("{key}: not a configuration error: {e}"),
            }
        }
        match FeatureSpec::from_toml("delimiter = [").unwrap_err() {
            OperatorError::Config(e) => {
                assert!(e.key == "spec" && e.reason.contains("line 1"), "no key in a syntax error: {e}")
            }
            e => panic!("not a configuration error: {e}"),
        }
    }
}
