//! The data files a checkpoint's data position counts in.
//!
//! A file run's data position is "epoch `e`, `s` global steps into it": it means
//! something only for the files it was taken on. A manifest therefore lists the
//! `--data` files of the run that wrote it ([`InputFile`]: path, size and a
//! fingerprint), and a resume compares them with the files it is given
//! ([`input_differences`]).
//!
//! Invariants:
//! * The fingerprint is xxh3-128 of the file's first and last [`FINGERPRINT_SPAN`]
//!   bytes and its length: it reads at most 2 MiB whatever the file's size, sees
//!   any change of length and any change near either end (where appended or
//!   replaced data shows first), and ignores the path and modification time, so a
//!   copied or moved data set still resumes.
//! * Files compare in order: the same files in another order are another stream.

use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes read at each end of a file for its fingerprint.
pub const FINGERPRINT_SPAN: u64 = 1 << 20;

/// One data file of the run that wrote a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The path as the run was given it (shown in differences, not compared).
    pub path: String,
    /// Length in bytes.
    pub bytes: u64,
    /// xxh3-128 of the first and last [`FINGERPRINT_SPAN`] bytes and the length, 32 hex digits.
    pub fingerprint: String,
}

impl InputFile {
    /// Reads `path`'s length and fingerprint.
    pub fn of(path: &Path) -> std::io::Result<InputFile> {
        let mut file = std::fs::File::open(path)?;
        let bytes = file.metadata()?.len();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = Vec::with_capacity(FINGERPRINT_SPAN.min(bytes) as usize);
        (&mut file).take(FINGERPRINT_SPAN).read_to_end(&mut buf)?;
        hasher.update(&buf);
        if bytes > FINGERPRINT_SPAN {
            buf.clear();
            file.seek(SeekFrom::Start(bytes - FINGERPRINT_SPAN.min(bytes - FINGERPRINT_SPAN)))?;
            file.take(FINGERPRINT_SPAN).read_to_end(&mut buf)?;
            hasher.update(&buf);
        }
        hasher.update(&bytes.to_le_bytes());
        Ok(InputFile { path: path.display().to_string(), bytes, fingerprint: format!("{:032x}", hasher.digest128()) })
    }

    fn same_contents(&self, other: &InputFile) -> bool {
        self.bytes == other.bytes && self.fingerprint == other.fingerprint
    }
}

/// How the files a checkpoint was trained on (`recorded`) differ from the files a run
/// reads (`current`), one line each; empty when they are the same files in the same order.
pub fn input_differences(recorded: &[InputFile], current: &[InputFile]) -> Vec<String> {
    let mut out = Vec::new();
    if recorded.len() != current.len() {
        out.push(format!(
            "the checkpoint was trained on {} data file(s), the run reads {}",
            recorded.len(),
            current.len()
        ));
    }
    for (k, (r, c)) in recorded.iter().zip(current).enumerate() {
        if !r.same_contents(c) {
            let what = if r.bytes != c.bytes {
                format!("{} bytes, now {} bytes", r.bytes, c.bytes)
            } else {
                "the same size, other contents".to_string()
            };
            out.push(format!(
                "data file {}: the checkpoint was trained on {}, the run reads {} ({what})",
                k + 1,
                r.path,
                c.path
            ));
        }
    }
    for r in recorded.iter().skip(current.len()) {
        out.push(format!("the checkpoint was also trained on {}", r.path));
    }
    for c in current.iter().skip(recorded.len()) {
        out.push(format!("the run also reads {}", c.path));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, contents: &[u8]) -> InputFile {
        let p = dir.join(name);
        std::fs::write(&p, contents).unwrap();
        InputFile::of(&p).unwrap()
    }

    #[test]
    fn moved_copies_are_the_same_input_and_changes_anywhere_near_the_ends_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..3 * FINGERPRINT_SPAN as usize + 17).map(|i| (i * 31 % 251) as u8).collect();
        let a = file(dir.path(), "a", &big);
        let b = file(dir.path(), "b", &big);
        assert_eq!(
            input_differences(std::slice::from_ref(&a), std::slice::from_ref(&b)),
            Vec::<String>::new(),
            "a copy elsewhere"
        );
        for at in [0, 5, big.len() - 1, big.len() - FINGERPRINT_SPAN as usize] {
            let mut changed = big.clone();
            changed[at] ^= 1;
            let c = file(dir.path(), "c", &changed);
            let d = input_differences(std::slice::from_ref(&a), &[c]);
            assert_eq!(d.len(), 1, "byte {at}: {d:?}");
            assert!(d[0].contains("the same size, other contents"), "{d:?}");
        }
        let mut longer = big.clone();
        longer.push(b'\n');
        let d = input_differences(std::slice::from_ref(&a), &[file(dir.path(), "e", &longer)]);
        assert!(d[0].contains(&format!("{} bytes, now {} bytes", big.len(), big.len() + 1)), "{d:?}");
    }

    #[test]
    fn small_files_order_and_count_matter() {
        let dir = tempfile::tempdir().unwrap();
        let (x, y) = (file(dir.path(), "x", b"1\t2\n"), file(dir.path(), "y", b"0\t3\n"));
        assert!(input_differences(&[x.clone(), y.clone()], &[x.clone(), y.clone()]).is_empty());
        assert_eq!(input_differences(&[x.clone(), y.clone()], &[y.clone(), x.clone()]).len(), 2);
        let d = input_differences(std::slice::from_ref(&x), &[x.clone(), y.clone()]);
        assert!(d[0].contains("trained on 1 data file(s), the run reads 2") && d[1].contains("also reads"), "{d:?}");
        let empty = file(dir.path(), "z", b"");
        assert_eq!(empty.bytes, 0);
        assert!(!input_differences(&[empty], &[x]).is_empty());
    }
}
