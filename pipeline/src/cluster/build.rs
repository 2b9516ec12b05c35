//! Which tiderec build this process runs, for the handshake of a cluster run.
//!
//! Processes of different builds must not join one run: their dataflows, wire
//! formats, checkpoint layouts and kernels may differ although every setting
//! agrees. The crate version alone does not tell two builds of one version
//! apart, and nothing records a commit at build time, so a build's identity
//! ([`identity`]) is the crate version and a hash of the running executable's
//! bytes: `0.1.0 (executable 3f9c0e5a12d4b7e8)`.
//!
//! Invariants:
//! * **Once, lazily.** The executable is read and hashed at most once per
//!   process, when the handshake of a multi-process run first asks (about
//!   100 MB at several GB/s); a one-process run never reads it.
//! * **The running file.** On Linux the bytes are read through
//!   `/proc/self/exe`, which still names the file this process was started
//!   from after an upgrade replaced it on disk; elsewhere through
//!   [`std::env::current_exe`].
//! * **Same bytes, same identity.** Byte-identical executables agree; any
//!   differing byte (another commit, other features, another compiler) gives
//!   another hash: a 64-bit xxh3 chained over 1 MiB blocks and the length
//!   ([`hash_file`]), so a chance collision is about 2⁻⁶⁴.
//! * **Never fails.** An executable that cannot be read (execute-only
//!   permissions) gives `0.1.0 (executable unreadable)` and a warning: such a
//!   process is then compared by version only, and differs from every process
//!   whose executable was hashed, so a mixed run is refused, not trusted.

use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;

/// The fingerprint's key for the build (shown first in a handshake's differences).
pub const KEY: &str = "tiderec build";

/// Bytes hashed per block.
const BLOCK: u64 = 1 << 20;

/// This process's build: `VERSION (executable HASH)`, computed on first use.
pub fn identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let version = env!("CARGO_PKG_VERSION");
        match running_executable() {
            Ok(hash) => format!("{version} (executable {hash:016x})"),
            Err(e) => {
                eprintln!(
                    "warning: cannot read this process's executable to identify its build ({e}); the handshake \
                     compares this process's build by its version ({version}) alone"
                );
                format!("{version} (executable unreadable)")
            }
        }
    })
}

/// The hash of the executable this process runs.
fn running_executable() -> std::io::Result<u64> {
    match hash_file(Path::new("/proc/self/exe")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => hash_file(&std::env::current_exe()?),
        hashed => hashed,
    }
}

/// The 64-bit hash of the file at `path`: xxh3 of each 1 MiB block, each seeded with the
/// hash of the blocks before it (0 for the first), then of the length.
pub fn hash_file(path: &Path) -> std::io::Result<u64> {
    use tiderec_operators::features::fused::token_hash;
    let mut file = std::fs::File::open(path)?;
    let mut block = Vec::with_capacity(BLOCK as usize);
    let (mut hash, mut length) = (0u64, 0u64);
    loop {
        block.clear();
        // Whole blocks until the last, whatever the reads return: the same bytes hash the same.
        (&mut file).take(BLOCK).read_to_end(&mut block)?;
        if block.is_empty() {
            break;
        }
        length += block.len() as u64;
        hash = token_hash(hash, &block);
    }
    Ok(token_hash(hash, &length.to_le_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_names_the_version_and_is_computed_once() {
        let first = identity();
        assert!(first.starts_with(&format!("{} (executable ", env!("CARGO_PKG_VERSION"))), "{first}");
        let hex = first.trim_end_matches(')').rsplit(' ').next().unwrap();
        assert!(hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "{first}");
        assert!(std::ptr::eq(first, identity()), "one computation, kept");
    }

    #[test]
    fn one_differing_byte_or_length_changes_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        // Past one block, so the chaining matters.
        let bytes: Vec<u8> = (0..(BLOCK as usize + 4321)).map(|i| (i * 31 % 251) as u8).collect();
        let write = |name: &str, b: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, b).unwrap();
            p
        };
        let a = hash_file(&write("a", &bytes)).unwrap();
        assert_eq!(a, hash_file(&write("copy", &bytes)).unwrap(), "the same bytes, the same hash");
        let mut flipped = bytes.clone();
        flipped[10] ^= 1;
        assert_ne!(a, hash_file(&write("flipped-first-block", &flipped)).unwrap());
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_ne!(a, hash_file(&write("flipped-last-block", &flipped)).unwrap());
        let mut longer = bytes.clone();
        longer.push(0);
        assert_ne!(a, hash_file(&write("longer", &longer)).unwrap());
        assert_ne!(hash_file(&write("empty", b"")).unwrap(), hash_file(&write("zero", &[0])).unwrap());
    }
}
