//! Where `tiderec export --out` may write, through the release binary: never within a
//! checkpoint directory (the one exported, through a link or `..`, or another run's), refused
//! before anything is written and naming both paths; and the staging directory a killed export
//! left in `--out` is removed by the next export there, while every other entry, a running
//! export's staging directory included, is kept.

mod common;

use common::{run_err, run_ok, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Trains a few small steps on generated Criteo records, checkpointing into `dir/ck`;
/// returns the checkpoint directory.
fn checkpoint(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for i in 0..64 {
        let ints: Vec<String> = (0..13).map(|k| ((i * 7 + k * 3) % 11).to_string()).collect();
        let cats: Vec<String> = (0..26).map(|k| format!("{:08x}", (i * 31 + k * 17) % 97)).collect();
        text.push_str(&format!("{}\t{}\t{}\n", i % 2, ints.join("\t"), cats.join("\t")));
    }
    let data = dir.join("train.txt");
    std::fs::write(&data, text).unwrap();
    let ck = dir.join("ck");
    run_ok(
        tiderec()
            .args(["train", "--batch-size", "16", "--buckets", "1000", "--progress", "none", "--steps", "3"])
            .arg("--data")
            .arg(format!("criteo:{}", data.display()))
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(dir.join("dead.tsv")),
    );
    ck
}

/// `tiderec export --checkpoint CKPT --out OUT`.
fn export(checkpoint: &Path, out: &Path) -> Command {
    let mut cmd = tiderec();
    cmd.arg("export").arg("--checkpoint").arg(checkpoint).arg("--out").arg(out);
    cmd
}

/// Every path under `dir` (links not followed) with its size, sorted: what must not change.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut all = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path.clone());
            }
            all.push((path, meta.len()));
        }
    }
    all.sort();
    all
}

/// Asserts that `err` refuses `--out out` as within the checkpoint directory `dir`.
fn refused_within(err: &str, out: &Path, dir: &Path) {
    assert!(err.contains(&format!("--out {} is within", out.display())), "{err}");
    let dir = std::fs::canonicalize(dir).unwrap();
    assert!(err.contains(&dir.display().to_string()), "names {}: {err}", dir.display());
    assert!(err.contains("nothing was written"), "{err}");
}

/// `--out` the checkpoint directory exported (given as it or as its checkpoint), a directory in
/// it spelled through `..`, or another run's checkpoint directory: refused, nothing written.
#[test]
fn export_into_a_checkpoint_directory_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path());
    let step = ck.join("ckpt-3");
    assert!(step.join("manifest.json").is_file(), "{:?}", tree(&ck));
    let before = tree(&ck);
    let err = run_err(&mut export(&ck, &ck));
    refused_within(&err, &ck, &ck);
    assert!(err.contains(&format!("--checkpoint {}", ck.display())), "names the flag that reads it: {err}");
    let err = run_err(&mut export(&step, &ck));
    refused_within(&err, &ck, &ck);
    let spelled = step.join("..").join("serve");
    refused_within(&run_err(&mut export(&step, &spelled)), &spelled, &ck);
    let inside = step.join("serve");
    refused_within(&run_err(&mut export(&ck, &inside)), &inside, &ck);
    assert_eq!(tree(&ck), before, "nothing was written into the checkpoint directory");
    // Another run's checkpoint directory (a copy of this one) is refused too.
    let other = dir.path().join("other");
    std::fs::create_dir_all(other.join("ckpt-3")).unwrap();
    for e in std::fs::read_dir(&step).unwrap() {
        let path = e.unwrap().path();
        std::fs::copy(&path, other.join("ckpt-3").join(path.file_name().unwrap())).unwrap();
    }
    let serve = other.join("serve");
    let err = run_err(&mut export(&ck, &serve));
    refused_within(&err, &serve, &other);
    assert!(err.contains("a tiderec checkpoint directory"), "{err}");
    assert!(!serve.exists(), "nothing was written");
}

/// A directory inside the checkpoint directory, reached through a symbolic link to it, is
/// refused naming both paths; the same export elsewhere succeeds.
#[cfg(unix)]
#[test]
fn export_into_the_checkpoint_directory_through_a_link_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path());
    let before = tree(&ck);
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(&ck, &alias).unwrap();
    let out = alias.join("serve");
    let err = run_err(&mut export(&ck, &out));
    refused_within(&err, &out, &ck);
    // Through the `best` link as --checkpoint, and a link to a directory not made yet.
    let err = run_err(&mut export(&ck.join("best"), &out));
    refused_within(&err, &out, &ck);
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(ck.join("serve"), &dangling).unwrap();
    refused_within(&run_err(&mut export(&ck, &dangling)), &dangling, &ck);
    assert_eq!(tree(&ck), before, "nothing was written into the checkpoint directory");
    let serve = dir.path().join("serve");
    run_ok(&mut export(&ck, &serve));
    assert!(serve.join("model.json").is_file() && serve.join("model.safetensors").is_file());
}

/// The id of a process that has ended and been reaped, and that no process has now.
#[cfg(target_os = "linux")]
fn dead_pid() -> u32 {
    loop {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return pid;
        }
    }
}

/// The next export into `--out` removes the `.export.tmp-<pid>` directory a killed export
/// left (its process gone), saying so in one line on stderr; a running export's (this test
/// process's pid), a file of that name pattern, other names and a link are kept.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_exports_staging_directory_is_removed_by_the_next_export() {
    let dir = tempfile::tempdir().unwrap();
    let ck = checkpoint(dir.path());
    let serve = dir.path().join("serve");
    let stale = serve.join(format!(".export.tmp-{}", dead_pid()));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.safetensors"), "half written").unwrap();
    let live = serve.join(format!(".export.tmp-{}", std::process::id()));
    let unrelated = serve.join("unrelated");
    let padded = serve.join(format!(".export.tmp-0{}", dead_pid()));
    for kept in [&live, &unrelated, &padded] {
        std::fs::create_dir_all(kept).unwrap();
        std::fs::write(kept.join("model.json"), "keep me").unwrap();
    }
    let file = serve.join(format!(".export.tmp-{}", dead_pid()));
    std::fs::write(&file, "a file, not a staging directory").unwrap();
    let link = serve.join(format!(".export.tmp-{}", dead_pid()));
    std::os::unix::fs::symlink(&unrelated, &link).unwrap();
    let out = run_ok(&mut export(&ck, &serve));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains(".export.tmp-")).collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("removed") && said[0].contains(&stale.display().to_string()), "{stderr}");
    assert!(!stale.exists(), "the killed export's staging directory is gone");
    for kept in [&live, &unrelated, &padded] {
        assert_eq!(std::fs::read_to_string(kept.join("model.json")).unwrap(), "keep me", "{}", kept.display());
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a file, not a staging directory");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is kept");
    assert!(serve.join("model.json").is_file() && serve.join("model.safetensors").is_file());
    // Nothing is left to say the next time.
    let out = run_ok(export(&ck, &serve).arg("--overwrite"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("removed"), "{}", String::from_utf8_lossy(&out.stderr));
}
