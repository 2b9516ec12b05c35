//! The watcher: follows the newest valid checkpoint of a checkpoint directory
//! by identity, and hands each one it loads to the scoring thread.
//!
//! Invariants:
//! * A checkpoint is known by its [`Identity`]: its directory's path, device
//!   and inode, and a hash of its manifest. A checkpoint deleted and written
//!   again (by another run, at any step, even the same one) is another
//!   checkpoint, so the server never keeps serving a replaced model.
//! * The target is the newest (highest step) checkpoint that loads. While the
//!   served one exists, only a newer one replaces it; once it is deleted or
//!   replaced, the newest valid one does, whatever its step.
//! * A deleted served checkpoint is reported once (a warning, and the
//!   `warning` of `/health` at once), and its model keeps answering from
//!   memory until another checkpoint loads.
//! * A checkpoint that cannot be loaded is reported once per identity and
//!   the next older one is tried; nothing is loaded on the scoring thread.
//!   While such a checkpoint is there (same identity) and would be served if
//!   it loaded (newer than the one served, or the one served is gone),
//!   `/health`'s `warning` names the newest of them
//!   ([`ServingState::load_failure`], which only the watcher sets); the
//!   warning goes once a checkpoint of its step or newer is served, and
//!   while it is deleted or replaced.
//! * A delta whose parent is the checkpoint served (same path and identity)
//!   is read alone and applied onto the served model ([`Work::Delta`]); any
//!   other checkpoint, a delta included, is loaded whole with its chain. A
//!   delta the scoring thread could not apply marks the state stale: from the
//!   next look on, the newest checkpoint that loads is loaded whole (the one
//!   that failed to apply included, with its chain), whatever the watcher
//!   last sent, until one is taken; no delta is sent meanwhile, and the one
//!   that failed is never sent as a delta again.

use super::batcher::{ServingState, Work};
use super::score::Delta;
use super::score::Loaded;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use std::time::Duration;
use tiderec_sinks::checkpoint::layout::{self, checkpoint_name};
use tiderec_sinks::checkpoint::load;

/// The step of the checkpoint the delta at `path` follows (`None` for a whole one).
fn parent_of(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path.join(layout::MANIFEST_FILE)).ok()?;
    let manifest: tiderec_sinks::checkpoint::Manifest = serde_json::from_str(&text).ok()?;
    manifest.delta.map(|d| d.parent)
}

/// What tells one checkpoint from another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    path: PathBuf,
    device: u64,
    inode: u64,
    manifest: u64,
}

impl Identity {
    /// The identity of the checkpoint at `path`; `None` when it (or its manifest) is gone.
    pub fn of(path: &Path) -> Option<Identity> {
        let meta = std::fs::metadata(path).ok()?;
        let manifest = std::fs::read(path.join(layout::MANIFEST_FILE)).ok()?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        manifest.hash(&mut hasher);
        Some(Identity { path: path.to_path_buf(), device: meta.dev(), inode: meta.ino(), manifest: hasher.finish() })
    }
}

/// What the watcher knows of the checkpoint served.
struct Served {
    identity: Option<Identity>,
    step: u64,
    path: PathBuf,
    /// Its deletion was reported.
    reported: bool,
    /// A delta sent could not be applied: the model is not this checkpoint's, and the next
    /// checkpoint taken must be loaded whole.
    stale: bool,
}

/// What the watcher remembers of checkpoints that failed.
#[derive(Default)]
struct Failed {
    /// Checkpoints that could not be loaded (tried again after the next load).
    loads: HashSet<Identity>,
    /// Deltas the scoring thread could not apply: only ever loaded whole.
    deltas: HashSet<Identity>,
    /// Checkpoints that could not be loaded, while one of them may be wanted (see
    /// [`Failed::publish`]), with the warning that says so.
    failures: HashMap<Identity, LoadFailure>,
}

/// A checkpoint that could not be loaded: its step and the warning that says so.
struct LoadFailure {
    step: u64,
    warning: String,
}

impl Failed {
    /// Remembers that the checkpoint `identity` of `step` could not be loaded, for `error`.
    fn load(&mut self, step: u64, identity: Identity, error: &dyn std::fmt::Display) {
        let warning = format!(
            "cannot load the checkpoint {} (step {step}): {error}; the model served keeps answering",
            identity.path.display()
        );
        eprintln!("warning: serve: {warning}; trying an older one");
        self.failures.insert(identity.clone(), LoadFailure { step, warning });
        self.loads.insert(identity);
    }

    /// Publishes in `state` the warning of the newest checkpoint that could not be loaded and
    /// would be served if it loaded (it is newer than the one served, or the one served is
    /// gone) and is there now (same identity: one deleted may come back); none when there is
    /// no such checkpoint. Failures at or below the step of a served checkpoint that is there
    /// are forgotten (they are tried again, and reported, if it goes).
    fn publish(&mut self, served: &Served, state: &Mutex<ServingState>) {
        let gone = served.identity.is_none() || Identity::of(&served.path) != served.identity;
        if !gone {
            self.failures.retain(|_, f| f.step > served.step);
        }
        let there = self.failures.iter().filter(|(id, _)| Identity::of(&id.path).as_ref() == Some(*id));
        let warning = there.max_by_key(|(_, f)| f.step).map(|(_, f)| f.warning.clone());
        state.lock().unwrap_or_else(|e| e.into_inner()).load_failure = warning;
    }
}

/// Follows `dir` every `every` until `stop`, sending each checkpoint loaded to `work`.
pub fn run(
    dir: &Path,
    every: Duration,
    first: Option<Identity>,
    work: &Sender<Work>,
    state: &Mutex<ServingState>,
    stop: &AtomicBool,
) {
    let (step, path) = {
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        (s.step, PathBuf::from(&s.checkpoint))
    };
    let mut served = Served { identity: first, step, path, reported: false, stale: false };
    let mut failed = Failed::default();
    while !stop.load(Ordering::SeqCst) {
        let mut slept = Duration::ZERO;
        while slept < every && !stop.load(Ordering::SeqCst) {
            let d = Duration::from_millis(20).min(every - slept);
            std::thread::sleep(d);
            slept += d;
        }
        if look(dir, &mut served, &mut failed, work, state).is_err() {
            return;
        }
        failed.publish(&served, state);
    }
}

/// One look at `dir`; `Err` when the scoring thread is gone.
fn look(
    dir: &Path,
    served: &mut Served,
    failed: &mut Failed,
    work: &Sender<Work>,
    state: &Mutex<ServingState>,
) -> Result<(), ()> {
    if std::mem::take(&mut state.lock().unwrap_or_else(|e| e.into_inner()).stale) {
        // The last delta sent (or one before it) was not applied.
        failed.deltas.extend(served.identity.clone());
        served.stale = true;
    }
    let stale = served.stale;
    let gone = served.identity.is_none() || Identity::of(&served.path) != served.identity;
    if gone && !served.reported {
        let warning = format!(
            "the served checkpoint {} (step {}) was deleted or replaced; its model answers until another \
             checkpoint of {} loads",
            served.path.display(),
            served.step,
            dir.display()
        );
        eprintln!("warning: serve: {warning}");
        state.lock().unwrap_or_else(|e| e.into_inner()).warning = Some(warning);
        served.reported = true;
    }
    let Ok(list) = layout::list_checkpoints(dir) else { return Ok(()) };
    for (step, path) in list.into_iter().rev() {
        if !gone && !stale && step <= served.step {
            break;
        }
        let Some(identity) = Identity::of(&path) else { continue };
        if !stale && Some(&identity) == served.identity.as_ref() {
            break;
        }
        if failed.loads.contains(&identity) {
            continue;
        }
        if !gone
            && !stale
            && !failed.deltas.contains(&identity)
            && parent_of(&path) == Some(served.step)
            && served.path == path.with_file_name(checkpoint_name(served.step))
        {
            if let Ok(link) = load::load_link(&path, step) {
                eprintln!("serve: applying the delta of step {step} from {}", path.display());
                let delta = Delta { path: path.clone(), step, parent: served.step, parts: link.parts };
                work.send(Work::Delta(Box::new(delta))).map_err(|_| ())?;
                *served = Served { identity: Some(identity), step, path, reported: false, stale: false };
                return Ok(());
            }
        }
        match Loaded::load(&path) {
            Ok(model) => {
                eprintln!("serve: loaded step {step} from {}", path.display());
                work.send(Work::Swap(Box::new(model))).map_err(|_| ())?;
                *served = Served { identity: Some(identity), step, path, reported: false, stale: false };
                failed.loads.clear();
                return Ok(());
            }
            Err(e) => {
                // A checkpoint pruned while being read is no news; any other failure is reported once.
                if Identity::of(&path).as_ref() == Some(&identity) {
                    failed.load(step, identity, &e);
                }
            }
        }
    }
    Ok(())
}
