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
//! * A checkpoint that cannot be loaded is reported (once per identity and
//!   distinct error) and the next older one is tried; nothing is loaded on
//!   the scoring thread. It is tried again after a pause, the watch interval
//!   doubling up to [`RETRY_MAX`] while it keeps failing (and at the next
//!   look once another checkpoint loads), so a failure that passes (no file
//!   descriptor or memory left, a read error) never keeps the old model in
//!   service.
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
use std::time::{Duration, Instant};
use tiderec_sinks::checkpoint::layout::{self, checkpoint_name};
use tiderec_sinks::checkpoint::load;

/// The step of the checkpoint the delta at `path` follows (`None` for a whole one).
fn parent_of(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path.join(layout::MANIFEST_FILE)).ok()?;
    let manifest: tiderec_sinks::checkpoint::Manifest = serde_json::from_str(&text).ok()?;
    manifest.delta.map(|d| d.parent)
}

/// The longest pause before a checkpoint that could not be loaded is tried again.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

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

/// Loads the checkpoint `path` names (one `ckpt-<step>` directory, or the newest valid one of
/// a checkpoint directory) with `load`, with the identity of the one loaded (at `loaded_path`)
/// as it was before the load began, as the watcher takes it: a checkpoint replaced while it
/// loads is then seen as replaced at the next look, never its new contents taken for the
/// model loaded. `None` when the one loaded was not there before the load began.
pub fn load_identified<T, E>(
    path: &Path,
    load: impl FnOnce(&Path) -> Result<T, E>,
    loaded_path: impl Fn(&T) -> &Path,
) -> Result<(T, Option<Identity>), E> {
    let before: Vec<Identity> = if path.join(layout::MANIFEST_FILE).is_file() {
        Identity::of(path).into_iter().collect()
    } else {
        let list = layout::list_checkpoints(path).unwrap_or_default();
        list.iter().filter_map(|(_, p)| Identity::of(p)).collect()
    };
    let model = load(path)?;
    let identity = before.into_iter().find(|id| id.path == loaded_path(&model));
    Ok((model, identity))
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
    /// Checkpoints that could not be loaded, and when each is tried again.
    loads: HashMap<Identity, Retry>,
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

/// When a checkpoint that could not be loaded is tried again, and why it failed last.
struct Retry {
    /// Not before then.
    at: Instant,
    /// The pause before `at`: the next one is twice as long, up to [`RETRY_MAX`].
    pause: Duration,
    /// The last error, which is not reported again while it stays the same.
    error: String,
}

impl Failed {
    /// Remembers that the checkpoint `identity` of `step` could not be loaded, for `error`,
    /// to be tried again after a pause: `every` after its first failure, twice the last pause
    /// after each further one (at most [`RETRY_MAX`], or `every` when longer). The failure is
    /// reported unless it failed last time for the same error; `true` when it was.
    fn load(&mut self, step: u64, identity: Identity, error: &dyn std::fmt::Display, every: Duration) -> bool {
        let error = error.to_string();
        let warning = format!(
            "cannot load the checkpoint {} (step {step}): {error}; the model served keeps answering",
            identity.path.display()
        );
        let last = self.loads.get(&identity);
        let pause = last.map_or(every, |r| r.pause.saturating_mul(2).min(RETRY_MAX.max(every)));
        let report = last.is_none_or(|r| r.error != error);
        if report {
            eprintln!("warning: serve: {warning}; trying an older one, and this one again later");
        }
        self.failures.insert(identity.clone(), LoadFailure { step, warning });
        self.loads.insert(identity, Retry { at: Instant::now() + pause, pause, error });
        report
    }

    /// Whether the checkpoint `identity` is to be tried now: it never failed, or its pause is
    /// over.
    fn due(&self, identity: &Identity) -> bool {
        self.loads.get(identity).is_none_or(|r| Instant::now() >= r.at)
    }

    /// After a checkpoint loaded: those that failed are tried again at the next look (what
    /// failed them may be what the load changed), their errors still remembered; those gone
    /// (deleted or replaced) are forgotten.
    fn loaded(&mut self) {
        let now = Instant::now();
        self.loads.retain(|id, _| Identity::of(&id.path).as_ref() == Some(id));
        self.loads.values_mut().for_each(|r| r.at = now);
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
        if look(dir, every, &mut served, &mut failed, work, state).is_err() {
            return;
        }
        failed.publish(&served, state);
    }
}

/// One look at `dir` (watched every `every`); `Err` when the scoring thread is gone.
fn look(
    dir: &Path,
    every: Duration,
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
        if !failed.due(&identity) {
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
                failed.loaded();
                return Ok(());
            }
            Err(e) => {
                // A checkpoint pruned while being read is no news; any other failure is
                // reported, and tried again later.
                if Identity::of(&path).as_ref() == Some(&identity) {
                    failed.load(step, identity, &e, every);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(dir: &Path, step: u64, manifest: &str) -> PathBuf {
        let path = dir.join(checkpoint_name(step));
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join(layout::MANIFEST_FILE), manifest).unwrap();
        path
    }

    /// A checkpoint replaced while it loads keeps the identity it had before: the watcher then
    /// sees it replaced, rather than taking the new contents for the model loaded.
    #[test]
    fn the_identity_of_a_checkpoint_is_taken_before_it_loads() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path(), 3, "old 3");
        let five = checkpoint(dir.path(), 5, "old 5");
        let before = Identity::of(&five);
        for named in [dir.path().to_path_buf(), five.clone()] {
            checkpoint(dir.path(), 5, "old 5");
            let replace = |_: &Path| -> Result<PathBuf, ()> {
                checkpoint(dir.path(), 5, "new 5");
                Ok(five.clone())
            };
            let (loaded, identity) = load_identified(&named, replace, |p| p.as_path()).unwrap();
            assert_eq!(loaded, five);
            assert!(identity.is_some() && identity == before, "{named:?}: {identity:?}");
            assert_ne!(identity, Identity::of(&five), "the checkpoint changed during the load");
        }
        // One written during the load has no identity from before it.
        let new = |_: &Path| -> Result<PathBuf, ()> { Ok(checkpoint(dir.path(), 8, "8")) };
        assert_eq!(load_identified(dir.path(), new, |p| p.as_path()).unwrap().1, None);
        assert_eq!(load_identified(dir.path(), |_| Err::<PathBuf, _>("no"), |p| p.as_path()).unwrap_err(), "no");
    }

    /// A checkpoint that fails to load is tried again after a pause doubling from the watch
    /// interval up to a minute, reported once per distinct error, and due at the next look
    /// once another checkpoint loads.
    #[test]
    fn a_failed_load_is_retried_after_a_growing_pause() {
        let dir = tempfile::tempdir().unwrap();
        let identity = Identity::of(&checkpoint(dir.path(), 7, "7")).unwrap();
        let mut failed = Failed::default();
        let every = Duration::from_secs(10);
        assert!(failed.due(&identity));
        let mut pauses = Vec::new();
        let mut reported = Vec::new();
        for error in ["too many open files", "too many open files", "too many open files", "bad", "bad", "bad"] {
            reported.push(failed.load(7, identity.clone(), &error, every));
            pauses.push(failed.loads[&identity].pause.as_secs());
            assert!(!failed.due(&identity), "not tried again at once");
        }
        assert_eq!(pauses, [10, 20, 40, 60, 60, 60]);
        assert_eq!(reported, [true, false, false, true, false, false]);
        failed.loads.get_mut(&identity).unwrap().at = Instant::now();
        assert!(failed.due(&identity), "tried again once its pause is over");
        failed.load(7, identity.clone(), &"bad", every);
        failed.loaded();
        assert!(failed.due(&identity), "tried again at the next look after another loads");
        assert!(!failed.load(7, identity.clone(), &"bad", every), "its error is still known");
        std::fs::remove_dir_all(&identity.path).unwrap();
        failed.loaded();
        assert!(failed.loads.is_empty(), "a checkpoint gone is forgotten");
    }
}
