// The build id of tiderec (`TIDEREC_BUILD_ID`), which `cluster::build::identity` names in the
// handshake of a multi-process run: a 128-bit FNV-1a hash of the workspace's sources and of
// the settings they are built with, so that the same commit built with the same features for
// the same target and profile gives the same id on every host (whatever the build's paths,
// which the executable's line tables hold), and other code gives another.
//
// What is hashed, in this order:
// * every `*.rs`, `*.cu` and `*.toml` file and `Cargo.lock` under the workspace root (this
//   crate's parent directory; the crate's own directory when it is built from a package, whose
//   parent is no workspace), leaving out directories named `target` (at any depth) or
//   `target-*` (at the root), hidden directories (`.git`, `.cargo`, ...), symbolic links to
//   directories, and what cannot be read: each as its path relative to the root (components
//   joined by `/`) and its bytes, in sorted path order;
// * the enabled features of this crate (`CARGO_FEATURE_*`, sorted), the target triple
//   (`TARGET`) and the profile (`PROFILE`).
// Every field is preceded by its length, so moving bytes between fields changes the hash.
//
// Cargo runs this script again when a hashed file changes: it watches each hashed file at the
// root (`Cargo.lock` among them) or at the top of a crate's directory, and each top-level directory of a
// crate (`src`, `tests`, `benches`, ...) that holds a hashed file (cargo scans a directory
// recursively); a directory outside every crate that holds one is watched whole.
//
// Plain comments, not `//!`: `src/cluster/build.rs` includes this file in a unit test (hence
// the `pub(crate)` functions it calls).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = workspace_root(&manifest_dir);
    let sources = workspace_sources(&root);
    let mut features: Vec<String> = std::env::vars_os()
        .filter_map(|(key, _)| key.to_str()?.strip_prefix("CARGO_FEATURE_").map(str::to_string))
        .collect();
    features.sort();
    let setting = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name}"));
    let id = build_id(&sources, &features, &setting("TARGET"), &setting("PROFILE"));
    println!("cargo:rustc-env=TIDEREC_BUILD_ID={id:032x}");
    for path in watched(&root, &sources) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The workspace root: the crate's parent directory when its `Cargo.toml` declares the
/// workspace, else (the crate built from a package, e.g. in cargo's registry, where the parent
/// holds other crates) the crate's own directory.
fn workspace_root(manifest_dir: &Path) -> PathBuf {
    match manifest_dir.parent() {
        Some(parent) if std::fs::read_to_string(parent.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")) => {
            parent.to_path_buf()
        }
        _ => manifest_dir.to_path_buf(),
    }
}

/// One hashed file: its path relative to the workspace root, as components, and its bytes.
pub(crate) struct Source {
    components: Vec<String>,
    bytes: Vec<u8>,
}

impl Source {
    /// The relative path, components joined by `/` (what the hash and the order use).
    pub(crate) fn relative(&self) -> String {
        self.components.join("/")
    }
}

/// The files under `root` that the build id covers, in sorted relative-path order.
pub(crate) fn workspace_sources(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    collect(root, &mut Vec::new(), &mut out);
    out.sort_by_cached_key(Source::relative);
    out
}

/// Adds the hashed files under `dir` (at `prefix` below the root) to `out`.
fn collect(dir: &Path, prefix: &mut Vec<String>, out: &mut Vec<Source>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        // Lossy, for a name that is not UTF-8: a deterministic rendering of the same name.
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // A symbolic link counts as what it points to, except a directory (no cycles).
        let Ok(is_dir) = entry.file_type().map(|t| t.is_dir()) else { continue };
        if is_dir {
            let skipped =
                name.starts_with('.') || name == "target" || (prefix.is_empty() && name.starts_with("target-"));
            if !skipped {
                prefix.push(name);
                collect(&path, prefix, out);
                prefix.pop();
            }
            continue;
        }
        let hashed = name.ends_with(".rs") || name.ends_with(".cu") || name.ends_with(".toml") || name == "Cargo.lock";
        if !hashed || !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(&path) {
            let mut components = prefix.clone();
            components.push(name);
            out.push(Source { components, bytes });
        }
    }
}

/// The 128-bit FNV-1a hash of `sources` (in their order), `features`, `target` and `profile`.
pub(crate) fn build_id(sources: &[Source], features: &[String], target: &str, profile: &str) -> u128 {
    let mut hash = Fnv1a128::new();
    hash.field(b"tiderec build id 1");
    hash.count(sources.len());
    for source in sources {
        hash.field(source.relative().as_bytes());
        hash.field(&source.bytes);
    }
    hash.count(features.len());
    for feature in features {
        hash.field(feature.as_bytes());
    }
    hash.field(target.as_bytes());
    hash.field(profile.as_bytes());
    hash.0
}

/// The 128-bit FNV-1a hash (offset basis and prime of the FNV specification).
struct Fnv1a128(u128);

impl Fnv1a128 {
    fn new() -> Self {
        Fnv1a128(0x6c62_272e_07bb_0142_62b8_2175_6295_c58d)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        const PRIME: u128 = (1 << 88) + 0x13b;
        for &b in bytes {
            self.0 = (self.0 ^ u128::from(b)).wrapping_mul(PRIME);
        }
    }

    fn count(&mut self, n: usize) {
        self.bytes(&(n as u64).to_le_bytes());
    }

    /// `bytes` preceded by their length.
    fn field(&mut self, bytes: &[u8]) {
        self.count(bytes.len());
        self.bytes(bytes);
    }
}

/// What cargo watches for `sources` under `root`: each hashed file at the root (`Cargo.lock`
/// among them) or at the top of a crate's directory, each top-level directory of a crate that
/// holds a hashed file, and each directory at the root that is no crate's and holds a hashed
/// file. Only paths that exist: cargo would run the script at every build for a missing one.
pub(crate) fn watched(root: &Path, sources: &[Source]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for source in sources {
        let c = &source.components;
        let crate_dir = c.len() > 1 && root.join(&c[0]).join("Cargo.toml").is_file();
        let depth = match (c.len(), crate_dir) {
            (1, _) => 1,
            (_, true) => 2,
            (_, false) => 1,
        };
        out.insert(c[..depth].iter().fold(root.to_path_buf(), |p, part| p.join(part)));
    }
    out
}
