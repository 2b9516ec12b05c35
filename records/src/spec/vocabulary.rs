//! Vocabularies of `encoding = "vocabulary"` columns: the tokens inline or in a file
//! with one token per line, loaded into a token → id map.
//!
//! Invariants: token `k`, in list or file order, has id `k`; tokens are non-empty and
//! distinct; a file is a regular file of at most [`MAX_VOCABULARY_BYTES`] bytes, each token at
//! most [`MAX_TOKEN_BYTES`]; every error names the spec key, and for a file its path and line.

use crate::OperatorError;
use serde::{Deserialize, Serialize};

/// A vocabulary: a file with one token per line, or the tokens inline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Vocabulary {
    /// Path of a file with one token per line (a trailing `\r` is dropped).
    File(String),
    /// The tokens, in id order.
    Inline(Vec<String>),
}

/// Token → id map of a loaded vocabulary.
pub type VocabularyMap = rustc_hash::FxHashMap<Vec<u8>, u64>;

/// The largest vocabulary file read (256 MiB: tens of millions of tokens).
pub const MAX_VOCABULARY_BYTES: u64 = 256 << 20;

/// The longest token of a vocabulary file, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

/// The bytes of vocabulary file `path`: a regular file of at most [`MAX_VOCABULARY_BYTES`]
/// (a device, a FIFO or a file growing past the bound is refused, not read forever).
fn read_vocabulary_file(key: &str, path: &str) -> Result<Vec<u8>, OperatorError> {
    use std::io::Read;
    let error = |why: String| OperatorError::config(key, format!("vocabulary {path}: {why}"));
    let meta = std::fs::metadata(path)
        .map_err(|e| OperatorError::config(key, format!("cannot read vocabulary {path}: {e}")))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    let too_large = || error(format!("larger than {MAX_VOCABULARY_BYTES} bytes"));
    if meta.len() > MAX_VOCABULARY_BYTES {
        return Err(too_large());
    }
    let file = std::fs::File::open(path)
        .map_err(|e| OperatorError::config(key, format!("cannot read vocabulary {path}: {e}")))?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_VOCABULARY_BYTES + 1).read_to_end(&mut bytes).map_err(|e| error(e.to_string()))?;
    if bytes.len() as u64 > MAX_VOCABULARY_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

impl Vocabulary {
    /// Loads the tokens (id = position); errors name `key`, and for a file its path and line.
    pub fn load(&self, key: &str) -> Result<VocabularyMap, OperatorError> {
        let mut map = VocabularyMap::default();
        let mut add = |token: &[u8], place: &dyn Fn() -> String| -> Result<(), OperatorError> {
            if token.is_empty() {
                return Err(OperatorError::config(key, format!("{}: empty token", place())));
            }
            let next = map.len() as u64;
            if let Some(first) = map.insert(token.to_vec(), next) {
                return Err(OperatorError::config(
                    key,
                    format!("{}: token `{}` already has id {first}", place(), String::from_utf8_lossy(token)),
                ));
            }
            Ok(())
        };
        match self {
            Vocabulary::Inline(tokens) => {
                for (i, t) in tokens.iter().enumerate() {
                    add(t.as_bytes(), &|| format!("item {i}"))?;
                }
            }
            Vocabulary::File(path) => {
                let bytes = read_vocabulary_file(key, path)?;
                for (i, line) in file_tokens(key, path, &bytes)?.into_iter().enumerate() {
                    add(line, &|| format!("{path}:{}", i + 1))?;
                }
            }
        }
        if map.is_empty() {
            return Err(OperatorError::config(key, "the vocabulary is empty"));
        }
        Ok(map)
    }

    /// The same vocabulary with a file's tokens read into the spec ([`Vocabulary::Inline`]),
    /// so that a spec recorded with a model does not depend on the file, its later
    /// edits or the working directory. The tokens must be UTF-8 text; errors name
    /// `key`, the file and the line.
    pub fn inlined(&self, key: &str) -> Result<Vocabulary, OperatorError> {
        let Vocabulary::File(path) = self else { return Ok(self.clone()) };
        let bytes = read_vocabulary_file(key, path)?;
        let mut tokens = Vec::new();
        for (i, line) in file_tokens(key, path, &bytes)?.into_iter().enumerate() {
            let token = std::str::from_utf8(line).map_err(|_| {
                OperatorError::config(
                    key,
                    format!("{path}:{}: the token is not UTF-8 text (a model keeps its vocabulary as text)", i + 1),
                )
            })?;
            tokens.push(token.to_string());
        }
        Ok(Vocabulary::Inline(tokens))
    }
}

/// The tokens of a vocabulary file's `bytes`, one per line in id order (a trailing `\r`
/// dropped), each at most [`MAX_TOKEN_BYTES`]; errors name `key`, `path` and the line.
fn file_tokens<'a>(key: &str, path: &str, bytes: &'a [u8]) -> Result<Vec<&'a [u8]>, OperatorError> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return Err(OperatorError::config(key, format!("{path}: the vocabulary is empty")));
    }
    let mut tokens = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > MAX_TOKEN_BYTES {
            return Err(OperatorError::config(
                key,
                format!("{path}:{}: a token of {} bytes is longer than {MAX_TOKEN_BYTES}", i + 1, line.len()),
            ));
        }
        tokens.push(line);
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::fixtures::TOML;
    use crate::spec::FeatureSpec;

    #[test]
    fn vocabulary_files_name_path_and_line() {
        let dir = std::env::temp_dir().join(format!("tiderec-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::write(&good, "paris\r\nlyon\nnice\n").unwrap();
        let map = Vocabulary::File(good.display().to_string()).load("k").unwrap();
        assert_eq!((map[&b"paris"[..]], map[&b"lyon"[..]], map[&b"nice"[..]]), (0, 1, 2));
        let bad = dir.join("bad.txt");
        std::fs::write(&bad, "a\nb\n\nc\n").unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:3", bad.display())) && e.contains("empty"), "{e}");
        std::fs::write(&bad, "a\nb\na\n").unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:3", bad.display())) && e.contains("already has id 0"), "{e}");
        let missing = dir.join("missing.txt").display().to_string();
        let e = Vocabulary::File(missing.clone()).load("categorical[0].vocabulary").unwrap_err().to_string();
        assert!(e.contains(&missing) && e.contains("categorical[0].vocabulary"), "{e}");
        // A device, a file past the size bound and a token past the length bound are refused.
        let e = Vocabulary::File("/dev/zero".into()).load("k").unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
        let huge = dir.join("huge.txt");
        std::fs::File::create(&huge).unwrap().set_len(MAX_VOCABULARY_BYTES + 1).unwrap();
        let e = Vocabulary::File(huge.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains("huge.txt") && e.contains("larger than"), "{e}");
        std::fs::write(&bad, format!("a\n{}\n", "x".repeat(MAX_TOKEN_BYTES + 1))).unwrap();
        let e = Vocabulary::File(bad.display().to_string()).load("k").unwrap_err().to_string();
        assert!(e.contains(&format!("{}:2", bad.display())) && e.contains("longer than"), "{e}");
        // A spec whose vocabulary file is missing fails validation before any work.
        let text = TOML.replace("[\"paris\", \"lyon\", \"nice\"]", &format!("{:?}", good.display().to_string()));
        FeatureSpec::from_toml(&text).unwrap();
        let text = TOML.replace("[\"paris\", \"lyon\", \"nice\"]", &format!("{missing:?}"));
        assert!(FeatureSpec::from_toml(&text).unwrap_err().to_string().contains("missing.txt"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
