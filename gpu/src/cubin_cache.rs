//! Compiled kernels kept on disk between processes: NVRTC takes about two
//! seconds of CPU time to compile every kernel file for a device, which each
//! `tiderec` process opening a GPU would otherwise pay again.
//!
//! ## Invariants
//!
//! * **A cubin is found only by everything that made it.** Its file name holds
//!   a 128-bit hash of the source, the file's name, the target `sm_XY`, the
//!   NVRTC options and NVRTC's version, so a changed kernel, option or NVRTC
//!   never finds an old cubin.
//! * **A damaged file is never loaded.** Each file starts with a magic word,
//!   the payload's length and its hash; a file that does not check out is
//!   compiled again and replaced, and so is a cached one whose module the
//!   driver refuses to load ([`recompile`]; a cubin just compiled that the
//!   driver refuses is an error at once).
//! * **The cache never fails a run.** A cache that cannot be read or written
//!   (no home folder, a read-only disk) only means compiling; files appear
//!   whole or not at all (written under a temporary name, then renamed), so
//!   processes sharing the cache never read half a file.
//! * **Where.** `TIDEREC_KERNEL_CACHE` names the folder (`off` turns the cache
//!   off); else `$XDG_CACHE_HOME/tiderec/kernels`, else
//!   `$HOME/.cache/tiderec/kernels`. Nothing outside that folder is written.
//! * **Only a private folder.** A cubin runs as this user's code on the GPU,
//!   and its hash proves it whole, not who wrote it; so on Unix the cache is
//!   used only in a folder owned by this process's user that no one else may
//!   write to, itself no symbolic link, inside folders no one else may
//!   rename it out of (each owned by root or this user, and not writable by
//!   others unless sticky) ([`private`]), used by its resolved path.
//!   A missing folder is created so (mode 0700); any other folder means
//!   compiling, as with no cache. Files are written mode 0600, and a file is
//!   read only when it is this user's, no one else may write to it and it is
//!   no symbolic link; a folder gone since the check is not made again.

use crate::kernels::{compile_options, compile_to, nvrtc_version, KernelSource, Output, SOURCES};
use crate::GpuError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_128;

/// The environment variable naming the cache's folder, or `off`.
pub const CACHE_ENV: &str = "TIDEREC_KERNEL_CACHE";

/// The first bytes of every cache file.
const MAGIC: &[u8; 8] = b"TDRCUBN1";

/// Bytes before the payload: the magic word, its length (u64) and its hash (u128), little-endian.
const HEADER: usize = 8 + 8 + 16;

/// The cache folder, if there is one this process may trust (see the module docs).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    // The path checked, as the files are then opened: no link along it can be swapped since.
    dir_from(var(CACHE_ENV), var("XDG_CACHE_HOME"), var("HOME"))
        .filter(|dir| private(dir))
        .and_then(|dir| std::fs::canonicalize(dir).ok())
}

/// Whether `dir` is a folder only this process's user may write to: owned by
/// the effective user, without write permission for its group or others, no
/// symbolic link, and inside folders where no one else may replace it (each
/// owned by root or this user, and not writable by its group or others
/// unless sticky, as `/tmp`).
/// A missing `dir` is created first, with its missing parents, mode 0700.
#[cfg(unix)]
pub fn private(dir: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.exists() {
        // A failure (a read-only disk) shows in the check below.
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    }
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return false };
    if !(meta.is_dir() && meta.uid() == effective_user() && meta.mode() & 0o022 == 0) {
        return false;
    }
    let Ok(full) = std::fs::canonicalize(dir) else { return false };
    let me = effective_user();
    full.ancestors().skip(1).all(|parent| {
        std::fs::metadata(parent)
            .is_ok_and(|m| (m.uid() == 0 || m.uid() == me) && (m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0))
    })
}

/// This process's effective user.
#[cfg(unix)]
fn effective_user() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Elsewhere a folder's permissions are not checked.
#[cfg(not(unix))]
pub fn private(dir: &Path) -> bool {
    if !dir.exists() {
        let _ = std::fs::create_dir_all(dir);
    }
    dir.is_dir()
}

/// The cache folder for the values of `TIDEREC_KERNEL_CACHE`, `XDG_CACHE_HOME`
/// and `HOME` (unset or empty: `None`).
fn dir_from(named: Option<OsString>, xdg: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    if let Some(v) = named {
        return (v != "off").then(|| PathBuf::from(v));
    }
    let base = xdg.map(PathBuf::from).or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tiderec").join("kernels"))
}

/// `source` compiled to a cubin for `arch` (`sm_XY`): from the cache in `dir`
/// when it holds it, else compiled by NVRTC and stored there.
pub fn cubin(source: &KernelSource, arch: &str, dir: Option<&Path>) -> Result<Vec<u8>, GpuError> {
    cubin_and_origin(source, arch, dir).map(|(cubin, _)| cubin)
}

/// [`cubin`], and whether it was read from the cache (`true`) rather than
/// compiled now.
fn cubin_and_origin(source: &KernelSource, arch: &str, dir: Option<&Path>) -> Result<(Vec<u8>, bool), GpuError> {
    let Some(dir) = dir else { return Ok((compile_to(source, arch, Output::Cubin)?, false)) };
    let path = dir.join(file_name(source, arch)?);
    if let Some(payload) = read_trusted(&path).and_then(|bytes| unpack(&bytes)) {
        return Ok((payload, true));
    }
    let compiled = compile_to(source, arch, Output::Cubin)?;
    store(dir, &path, &compiled);
    Ok((compiled, false))
}

/// `source` compiled again by NVRTC for `arch`, replacing its file in the
/// cache in `dir` (a cached cubin the driver refused to load).
pub fn recompile(source: &KernelSource, arch: &str, dir: Option<&Path>) -> Result<Vec<u8>, GpuError> {
    let compiled = compile_to(source, arch, Output::Cubin)?;
    if let Some(dir) = dir {
        store(dir, &dir.join(file_name(source, arch)?), &compiled);
    }
    Ok(compiled)
}

/// Every kernel file's cubin for `arch`, in [`SOURCES`]' order, each compiled
/// (or read from the cache in `dir`) on a thread of its own: NVRTC compiles
/// independent programs at once. Each comes with whether it was read from the
/// cache (only such a cubin is worth compiling again when the driver refuses it).
pub fn cubins(arch: &str, dir: Option<&Path>) -> Result<Vec<(Vec<u8>, bool)>, GpuError> {
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            SOURCES.iter().map(|source| scope.spawn(move || cubin_and_origin(source, arch, dir))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// `<file stem>-<arch>-<hash>.cubin` for what makes `source`'s cubin.
fn file_name(source: &KernelSource, arch: &str) -> Result<String, GpuError> {
    let (major, minor) = nvrtc_version()?;
    let mut key = format!("{}\0{arch}\0nvrtc {major}.{minor}\0", source.file);
    for option in compile_options(arch) {
        key.push_str(&option);
        key.push('\0');
    }
    key.push_str(source.source);
    let stem = source.file.strip_suffix(".cu").unwrap_or(source.file);
    Ok(format!("{stem}-{arch}-{:032x}.cubin", xxh3_128(key.as_bytes())))
}

/// A cache file's bytes for `payload`.
fn pack(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_128(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a cache file's `bytes`, if they check out.
fn unpack(bytes: &[u8]) -> Option<Vec<u8>> {
    let (header, payload) = bytes.split_at_checked(HEADER)?;
    let len = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let hash = u128::from_le_bytes(header[16..32].try_into().ok()?);
    (&header[..8] == MAGIC && len == payload.len() as u64 && hash == xxh3_128(payload)).then(|| payload.to_vec())
}

/// The bytes of the cache file at `path`, if it is one to trust: on Unix a
/// regular file (no symbolic link) of this user that no one else may write to.
#[cfg(unix)]
fn read_trusted(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !(meta.is_file() && meta.uid() == effective_user() && meta.mode() & 0o022 == 0) {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Elsewhere a file's owner is not checked.
#[cfg(not(unix))]
fn read_trusted(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

/// Writes `bytes` to the new file `path` (on Unix mode 0600, never through a
/// file or link already there).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

/// Writes `payload` to `path` in `dir` whole or not at all; a failure (or a
/// folder gone since it was checked, which is not made again) only leaves
/// the cache without it.
fn store(dir: &Path, path: &Path, payload: &[u8]) {
    if !dir.is_dir() {
        return;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
    if write_new(&tmp, &pack(payload)).is_ok() && std::fs::rename(&tmp, path).is_ok() {
        return;
    }
    let _ = std::fs::remove_file(&tmp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_payload_unpacks_and_any_damage_is_refused() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let bytes = pack(&payload);
        assert_eq!(unpack(&bytes).as_deref(), Some(&payload[..]));
        assert_eq!(unpack(&bytes[..bytes.len() - 1]), None, "a truncated file");
        assert_eq!(unpack(&bytes[..HEADER - 1]), None, "a header cut short");
        for at in [0, 9, 20, HEADER, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert_eq!(unpack(&bad), None, "byte {at} flipped");
        }
        assert_eq!(unpack(&pack(&[])).as_deref(), Some(&[][..]), "an empty payload");
    }

    #[cfg(unix)]
    #[test]
    fn only_a_folder_no_one_else_may_write_to_holds_the_cache() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let set = |p: &Path, mode: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // A missing folder is created private, with its missing parents.
        let fresh = tmp.path().join("a").join("kernels");
        assert!(private(&fresh));
        assert_eq!((mode(&fresh), mode(fresh.parent().unwrap())), (0o700, 0o700));
        // Readable by others is fine; writable by the group or by others is not.
        for (m, ok) in [(0o700, true), (0o755, true), (0o770, false), (0o702, false), (0o777, false)] {
            set(&fresh, m);
            assert_eq!(private(&fresh), ok, "mode {m:o}");
        }
        set(&fresh, 0o700);
        // A file is no folder.
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(!private(&file));
        // A folder that cannot be made (its parent is a file).
        assert!(!private(&file.join("kernels")));
        // Another user's folder: the root folder, unless this runs as root.
        if unsafe { libc::geteuid() } != 0 {
            assert!(!private(Path::new("/")));
        }
        // A symbolic link to a private folder, and a private folder inside one others may write to.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(!private(&link), "a symbolic link");
        let open = tmp.path().join("open");
        let inner = open.join("kernels");
        assert!(private(&inner));
        set(&open, 0o777);
        assert!(!private(&inner), "inside a folder others may write to");
        set(&open, 0o1777);
        assert!(private(&inner), "inside a sticky one");
        // Inside a folder of another user (not root), who may rename it: only root can make one.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = tmp.path().join("theirs");
            let inside = theirs.join("kernels");
            assert!(private(&inside));
            std::os::unix::fs::chown(&theirs, Some(65_534), None).unwrap();
            set(&theirs, 0o755);
            assert!(!private(&inside), "inside another user's folder");
        }
    }

    #[cfg(unix)]
    #[test]
    fn only_a_private_regular_file_is_read_and_files_are_written_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("k.cubin");
        store(tmp.path(), &file, b"payload");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read_trusted(&file).and_then(|b| unpack(&b)).as_deref(), Some(&b"payload"[..]));
        let link = tmp.path().join("link.cubin");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_trusted(&link), None, "a symbolic link");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert_eq!(read_trusted(&file), None, "writable by the group");
        // A folder removed since its check is not made again.
        let gone = tmp.path().join("gone");
        store(&gone, &gone.join("k.cubin"), b"payload");
        assert!(!gone.exists());
    }

    #[test]
    fn the_folder_comes_from_the_variable_then_xdg_then_home() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(dir_from(s("/tmp/k"), s("/x"), s("/h")), Some(PathBuf::from("/tmp/k")));
        assert_eq!(dir_from(s("off"), s("/x"), s("/h")), None);
        assert_eq!(dir_from(None, s("/x"), s("/h")), Some(PathBuf::from("/x/tiderec/kernels")));
        assert_eq!(dir_from(None, None, s("/h")), Some(PathBuf::from("/h/.cache/tiderec/kernels")));
        assert_eq!(dir_from(None, None, None), None);
    }
}
