//! Which tiderec build this process runs, for the handshake of a cluster run.
//!
//! Processes of different builds must not join one run: their dataflows, wire
//! formats, checkpoint layouts and kernels may differ although every setting
//! agrees. The crate version alone does not tell two builds of one version
//! apart, and nothing records a commit at build time, so a build's identity
//! ([`identity`]) is the crate version and the build id the build script
//! (`pipeline/build.rs`) computes: `0.1.0 (build 3f9c0e5a12d4b7e83f9c0e5a12d4b7e8)`.
//!
//! Invariants:
//! * **Fixed at compile time.** The id is a hash computed while the crate is
//!   built and compiled in (`TIDEREC_BUILD_ID`); nothing is read or computed
//!   at run time, and the identity cannot fail.
//! * **Same sources, same identity.** The id hashes the workspace's sources
//!   (every `*.rs`, `*.cu`, `*.toml` and `Cargo.lock` under the workspace
//!   root, without `target/` and hidden directories, by path relative to the
//!   root and contents, in sorted order), this crate's enabled features, the
//!   target triple and the profile. It does not hash the executable, whose
//!   bytes hold the build's paths (line tables), so one commit built on two
//!   hosts, or stripped, or copied elsewhere, agrees.
//! * **Other code, other identity.** Any change to a hashed file (another
//!   commit, a local edit, other locked dependency versions), other features,
//!   another target or profile gives another id: a 128-bit FNV-1a, so a chance
//!   collision is about 2⁻¹²⁸ for unrelated inputs. What the hash does not see
//!   (another compiler, `RUSTFLAGS`, the dependencies' sources behind one
//!   `Cargo.lock`) does not tell builds apart.

/// The fingerprint's key for the build (shown first in a handshake's differences).
pub const KEY: &str = "tiderec build";

/// This process's build: `VERSION (build ID)`, ID the build script's 32 hex digits.
pub fn identity() -> &'static str {
    concat!(env!("CARGO_PKG_VERSION"), " (build ", env!("TIDEREC_BUILD_ID"), ")")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{fingerprint, handshake};
    use std::path::Path;
    use std::time::Duration;

    /// The build script's functions, on other trees than the workspace.
    #[allow(dead_code)]
    mod build_script {
        include!("../../build.rs");
    }
    use build_script::{build_id, watched, workspace_sources};

    #[test]
    fn the_identity_is_the_version_and_the_build_scripts_id() {
        let id = env!("TIDEREC_BUILD_ID");
        assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_eq!(identity(), format!("{} (build {id})", env!("CARGO_PKG_VERSION")));
    }

    /// Writes `files` (relative path, contents) under `root`.
    fn tree(root: &Path, files: &[(&str, &str)]) {
        for (path, contents) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
    }

    /// A small workspace: a root manifest and lock, a crate with sources, tests and a kernel.
    const WORKSPACE: &[(&str, &str)] = &[
        ("Cargo.toml", "[workspace]\nmembers = [\"a\"]\n"),
        ("Cargo.lock", "version = 4\n"),
        ("rustfmt.toml", "max_width = 120\n"),
        ("a/Cargo.toml", "[package]\nname = \"a\"\n"),
        ("a/build.rs", "fn main() {}\n"),
        ("a/src/lib.rs", "pub mod m;\n"),
        ("a/src/m.rs", "pub fn f() -> u32 { 1 }\n"),
        ("a/tests/t.rs", "#[test]\nfn t() {}\n"),
        ("a/kernels/k.cu", "__global__ void k() {}\n"),
        ("scripts/golden/x.toml", "x = 1\n"),
    ];

    /// The id of the tree at `root` with the default features, target and profile.
    fn id_of(root: &Path) -> u128 {
        build_id(&workspace_sources(root), &["CLI".into(), "KAFKA".into()], "x86_64-unknown-linux-gnu", "release")
    }

    #[test]
    fn the_same_sources_anywhere_give_the_same_id_whatever_else_lies_there() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        tree(a.path(), WORKSPACE);
        tree(b.path(), WORKSPACE);
        // What the id leaves out: build outputs, hidden directories, other files.
        tree(
            b.path(),
            &[
                ("target/release/build/out/gen.rs", "pub const X: u8 = 1;\n"),
                ("target-gpu/x.rs", "1\n"),
                ("a/target/debug/y.rs", "2\n"),
                (".git/HEAD", "ref: refs/heads/main\n"),
                (".git/z.rs", "3\n"),
                (".cargo/config.toml", "[build]\n"),
                ("a/.cache/w.rs", "4\n"),
                ("README.md", "# other\n"),
                ("a/src/notes.txt", "a note\n"),
                ("a/metrics.json", "{}\n"),
            ],
        );
        let sources: Vec<String> = workspace_sources(a.path()).iter().map(|s| s.relative()).collect();
        let mut sorted = sources.clone();
        sorted.sort();
        assert_eq!(sources, sorted);
        assert_eq!(sources.len(), WORKSPACE.len(), "{sources:?}");
        assert_eq!(id_of(a.path()), id_of(b.path()), "other directories, the same sources");
        assert_eq!(id_of(a.path()), id_of(a.path()));
    }

    #[test]
    fn any_change_to_the_sources_or_the_settings_changes_the_id() {
        let base = tempfile::tempdir().unwrap();
        tree(base.path(), WORKSPACE);
        let original = id_of(base.path());
        let mut seen = vec![original];
        let changed = |edit: &dyn Fn(&Path)| {
            let dir = tempfile::tempdir().unwrap();
            tree(dir.path(), WORKSPACE);
            edit(dir.path());
            id_of(dir.path())
        };
        let ids = [
            changed(&|d| std::fs::write(d.join("a/src/m.rs"), "pub fn f() -> u32 { 2 }\n").unwrap()),
            changed(&|d| std::fs::write(d.join("a/kernels/k.cu"), "__global__ void k() { }\n").unwrap()),
            changed(&|d| std::fs::write(d.join("Cargo.lock"), "version = 3\n").unwrap()),
            changed(&|d| std::fs::write(d.join("a/Cargo.toml"), "[package]\nname = \"b\"\n").unwrap()),
            changed(&|d| std::fs::write(d.join("a/src/new.rs"), "").unwrap()),
            changed(&|d| std::fs::remove_file(d.join("a/tests/t.rs")).unwrap()),
            changed(&|d| std::fs::rename(d.join("a/src/m.rs"), d.join("a/src/n.rs")).unwrap()),
            // The same bytes, split differently between two files.
            changed(&|d| {
                std::fs::write(d.join("a/src/lib.rs"), "pub mod m;\npub fn f").unwrap();
                std::fs::write(d.join("a/src/m.rs"), "() -> u32 { 1 }\n").unwrap();
            }),
        ];
        for id in ids {
            assert!(!seen.contains(&id), "{id:032x} repeats an id of {seen:x?}");
            seen.push(id);
        }
        let sources = workspace_sources(base.path());
        let settings = [
            build_id(&sources, &["CLI".into()], "x86_64-unknown-linux-gnu", "release"),
            build_id(&sources, &["CLI".into(), "KAFKA".into(), "SERVE".into()], "x86_64-unknown-linux-gnu", "release"),
            build_id(&sources, &["CLI".into(), "KAFKA".into()], "aarch64-unknown-linux-gnu", "release"),
            build_id(&sources, &["CLI".into(), "KAFKA".into()], "x86_64-unknown-linux-gnu", "debug"),
        ];
        for id in settings {
            assert!(!seen.contains(&id), "{id:032x} repeats an id of {seen:x?}");
            seen.push(id);
        }
    }

    #[test]
    fn cargo_watches_each_crates_top_level_and_the_root_files() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), WORKSPACE);
        tree(dir.path(), &[("a/metrics.json", "{}\n"), ("docs/x.md", "# x\n")]);
        let root = dir.path();
        let got: Vec<_> = watched(root, &workspace_sources(root)).into_iter().collect();
        let want: Vec<_> = [
            "Cargo.lock",
            "Cargo.toml",
            "a/Cargo.toml",
            "a/build.rs",
            "a/kernels",
            "a/src",
            "a/tests",
            "rustfmt.toml",
            "scripts",
        ]
        .iter()
        .map(|p| root.join(p))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_workspace_hashes_its_sources_and_no_build_output() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let sources: Vec<String> = workspace_sources(root).iter().map(|s| s.relative()).collect();
        for expected in ["Cargo.lock", "Cargo.toml", "pipeline/build.rs", "pipeline/src/cluster/build.rs"] {
            assert!(sources.iter().any(|s| s == expected), "{expected} is hashed");
        }
        assert!(sources.iter().any(|s| s.ends_with(".cu")), "the GPU kernels are hashed");
        assert!(sources.iter().all(|s| !s.starts_with("target") && !s.starts_with('.')), "{sources:?}");
    }

    /// Two processes on 127.0.0.1 that handshake with the fingerprints `prints`: their results.
    fn handshake(prints: [fingerprint::Fingerprint; 2]) -> Vec<Result<(), String>> {
        let held: Vec<_> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addresses: Vec<String> = held.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
        drop(held);
        let threads: Vec<_> = prints
            .into_iter()
            .enumerate()
            .map(|(me, print)| {
                let addresses = addresses.clone();
                std::thread::spawn(move || {
                    let stop = std::sync::atomic::AtomicBool::new(false);
                    handshake::connect_and_agree(handshake::Start {
                        me,
                        addresses: &addresses,
                        mine: &print,
                        checkpoint_dir: None,
                        timeout: Duration::from_secs(20),
                        stop: &stop,
                    })
                    .map(|_| ())
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn processes_of_the_same_build_agree_and_of_different_builds_are_refused_naming_both() {
        let settings = || vec![("lr".to_string(), "0.01".to_string())];
        let other = "0.1.0 (build 000000000000000000000000000000bb)";
        assert_ne!(identity(), other);
        let same = handshake([
            fingerprint::with_build(settings(), identity()),
            fingerprint::with_build(settings(), identity()),
        ]);
        assert_eq!(same, [Ok(()), Ok(())]);
        let different =
            handshake([fingerprint::with_build(settings(), identity()), fingerprint::with_build(settings(), other)]);
        let line = format!("tiderec build: process 0 runs {}; process 1 runs {other}", identity());
        for (i, result) in different.iter().enumerate() {
            let err = result.as_ref().expect_err("refused");
            assert!(err.contains("the processes disagree on 1 setting") && err.contains(&line), "process {i}: {err}");
        }
    }
}
