//! Model generations, and the requests pinned to them.
//!
//! Every model the scoring thread takes (a checkpoint loaded whole, or the
//! served model with a delta applied) is a new generation, numbered from 0.
//! A request takes a [`Pin`] on the generation current when it starts and
//! holds it until its records are scored; each of its jobs names that
//! generation, and is scored by its model.
//!
//! Invariants:
//! * A pin is taken only on the current generation, and the current one
//!   changes ([`Generations::advance`]) under the lock that counts the pins:
//!   once another generation is current, no new pin goes to the old one. The
//!   last pin of a generation that is no longer current tells the scoring
//!   thread so ([`Work::Released`]), so no release is missed.
//! * [`Models`] keeps the model of every generation that is current, pinned,
//!   or the base of a delta waiting to be applied, and no other: every record
//!   of one request is scored by one model, whatever reloads happen
//!   meanwhile, and no request fails because the model changed.
//! * A model is never changed under a request: a delta makes a new
//!   generation out of the model of the previous one, applied in place once
//!   no request holds that one. Until then the delta waits (in order, behind
//!   the deltas taken before it), and the requests starting meanwhile, pinned
//!   to the generation it makes, wait for it; the requests they wait for are
//!   all scoring already, so the wait ends.

use super::score::Delta;
use super::work::Work;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

/// The current generation and the pins on each generation, shared by the
/// connection threads (which pin) and the scoring thread (which advances).
#[derive(Debug, Default)]
pub struct Generations {
    pins: Mutex<Pins>,
}

#[derive(Debug, Default)]
struct Pins {
    current: u64,
    /// Pins held, per generation (generations without pins left out).
    held: HashMap<u64, usize>,
}

impl Generations {
    /// Generation 0 current, no pins.
    pub fn new() -> Arc<Generations> {
        Arc::default()
    }

    fn pins(&self) -> MutexGuard<'_, Pins> {
        self.pins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins the current generation for one request; `work` is told when the last pin of a
    /// generation no longer current goes.
    pub fn pin(self: &Arc<Self>, work: &Sender<Work>) -> Pin {
        let mut pins = self.pins();
        let generation = pins.current;
        *pins.held.entry(generation).or_insert(0) += 1;
        Pin { generations: self.clone(), generation, work: work.clone() }
    }

    /// The current generation.
    pub fn current(&self) -> u64 {
        self.pins().current
    }

    /// Makes the next generation current (no pin goes to the previous one from now on), and
    /// returns it.
    pub fn advance(&self) -> u64 {
        let mut pins = self.pins();
        pins.current += 1;
        pins.current
    }

    /// Whether a request holds `generation`.
    pub fn pinned(&self, generation: u64) -> bool {
        self.pins().held.contains_key(&generation)
    }
}

/// One request's hold on a generation: its model is kept until the pin goes.
#[derive(Debug)]
pub struct Pin {
    generations: Arc<Generations>,
    generation: u64,
    work: Sender<Work>,
}

impl Pin {
    /// The generation held.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let last_of_old = {
            let mut pins = self.generations.pins();
            let count = pins.held.entry(self.generation).or_insert(1);
            *count -= 1;
            let last = *count == 0;
            if last {
                pins.held.remove(&self.generation);
            }
            last && self.generation != pins.current
        };
        if last_of_old {
            // Sent outside the lock; a scoring thread already gone has nothing to let go of.
            let _ = self.work.send(Work::Released);
        }
    }
}

/// The models of the scoring thread, by generation: the current one, those still pinned, and
/// the bases of the deltas waiting for theirs to be let go of.
pub struct Models<M> {
    generations: Arc<Generations>,
    live: BTreeMap<u64, M>,
    /// Deltas taken while the model they apply onto was held, in the order taken, each with
    /// the generation it makes (its base is the one before).
    deferred: VecDeque<(u64, Box<Delta>)>,
}

impl<M> Models<M> {
    /// `first` as the current generation of `generations`.
    pub fn new(first: M, generations: Arc<Generations>) -> Models<M> {
        let live = BTreeMap::from([(generations.current(), first)]);
        Models { generations, live, deferred: VecDeque::new() }
    }

    /// The model of `generation`; `None` while a delta that makes it waits.
    pub fn get(&mut self, generation: u64) -> Option<&mut M> {
        self.live.get_mut(&generation)
    }

    /// Whether `generation` is current.
    pub fn is_current(&self, generation: u64) -> bool {
        self.generations.current() == generation
    }

    /// Takes `model` (a checkpoint loaded whole) as the new current generation; the previous
    /// one is let go of once no request holds it.
    pub fn swap(&mut self, model: M) {
        let generation = self.generations.advance();
        self.live.insert(generation, model);
        self.forget_unused();
    }

    /// Takes `delta` as the new current generation: `apply(model, delta, current)` makes it
    /// out of the model of the previous generation, at once if no request holds that, else
    /// once the last one lets it go ([`Models::released`]).
    pub fn delta(&mut self, delta: Box<Delta>, apply: impl FnMut(&mut M, &Delta, bool)) {
        let generation = self.generations.advance();
        self.deferred.push_back((generation, delta));
        self.settle(apply);
    }

    /// A generation's last pin went: the deltas that waited for it are applied (see
    /// [`Models::delta`]), and models no longer needed are let go of.
    pub fn released(&mut self, apply: impl FnMut(&mut M, &Delta, bool)) {
        self.settle(apply);
    }

    /// Applies the deferred deltas, in order, while the base of the first one is held by no
    /// request, then lets go of the models no longer needed. `apply`'s `current` says whether
    /// the generation made is current (else a later one superseded it).
    fn settle(&mut self, mut apply: impl FnMut(&mut M, &Delta, bool)) {
        while let Some(&(generation, _)) = self.deferred.front() {
            let base = generation - 1;
            if self.generations.pinned(base) {
                break;
            }
            // The base of the first deferred delta is kept (`forget_unused`) or is the model
            // the one before it made: it is there.
            let Some(mut model) = self.live.remove(&base) else { break };
            let Some((_, delta)) = self.deferred.pop_front() else { break };
            apply(&mut model, &delta, self.is_current(generation));
            self.live.insert(generation, model);
        }
        self.forget_unused();
    }

    /// Lets go of every model that is not current, not pinned and not the base of a deferred
    /// delta.
    fn forget_unused(&mut self) {
        let current = self.generations.current();
        let (generations, deferred) = (&self.generations, &self.deferred);
        let base = |g: u64| deferred.iter().any(|&(made, _)| made == g + 1);
        self.live.retain(|&g, _| g == current || base(g) || generations.pinned(g));
    }

    /// The generations whose model is kept, oldest first.
    #[cfg(test)]
    fn kept(&self) -> Vec<u64> {
        self.live.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver};

    /// A model: the steps of the deltas applied onto the checkpoint step it started as.
    type Fake = Vec<u64>;

    fn delta(step: u64) -> Box<Delta> {
        Box::new(Delta { path: Default::default(), step, parent: step - 1, parts: Vec::new() })
    }

    /// Applies a delta to a fake model, noting the step and whether it was current.
    fn applying(seen: &mut Vec<(u64, bool)>) -> impl FnMut(&mut Fake, &Delta, bool) + '_ {
        |model, delta, current| {
            model.push(delta.step);
            seen.push((delta.step, current));
        }
    }

    /// How many releases the scoring thread was told of.
    fn released(rx: &Receiver<Work>) -> usize {
        rx.try_iter().map(|w| assert!(matches!(w, Work::Released), "only releases are sent")).count()
    }

    #[test]
    fn a_swapped_model_is_kept_until_its_last_pin_goes() {
        let (tx, rx) = channel();
        let generations = Generations::new();
        let mut models = Models::new(vec![10], generations.clone());
        let (a, b) = (generations.pin(&tx), generations.pin(&tx));
        models.swap(vec![20]);
        let c = generations.pin(&tx);
        assert_eq!((a.generation(), b.generation(), c.generation()), (0, 0, 1), "new pins go to the new model");
        models.swap(vec![30]);
        assert_eq!(models.kept(), [0, 1, 2], "every pinned model is kept");
        assert_eq!(models.get(0), Some(&mut vec![10]));
        drop(a);
        assert_eq!(released(&rx), 0, "one request still holds generation 0");
        drop((b, c));
        assert_eq!(released(&rx), 2, "the last pins of generations 0 and 1");
        models.released(|_, _, _| panic!("no delta waits"));
        assert_eq!(models.kept(), [2], "only the current model is left");
        // The last pin of the current generation tells nobody: it stays.
        drop(generations.pin(&tx));
        assert_eq!(released(&rx), 0);
    }

    #[test]
    fn a_delta_waits_for_the_requests_of_the_model_it_changes() {
        let (tx, rx) = channel();
        let generations = Generations::new();
        let mut models = Models::new(vec![10], generations.clone());
        let mut seen = Vec::new();
        // Nobody holds the model: applied at once.
        models.delta(delta(11), applying(&mut seen));
        assert_eq!((models.kept(), &seen), (vec![1], &vec![(11, true)]));
        // Held: the delta waits, and a request starting meanwhile waits for its model.
        let old = generations.pin(&tx);
        models.delta(delta(12), applying(&mut seen));
        let new = generations.pin(&tx);
        assert_eq!((old.generation(), new.generation()), (1, 2));
        assert!(models.get(2).is_none(), "not made while generation 1 is held");
        assert_eq!(models.get(1), Some(&mut vec![10, 11]), "the held model is unchanged");
        // A second delta waits behind the first.
        models.delta(delta(13), applying(&mut seen));
        assert_eq!(seen.len(), 1);
        drop(old);
        assert_eq!(released(&rx), 1);
        models.released(applying(&mut seen));
        assert_eq!(models.get(2), Some(&mut vec![10, 11, 12]), "made once generation 1 is let go of");
        assert_eq!(seen[1], (12, false), "superseded by the waiting delta of step 13");
        assert!(models.get(3).is_none(), "step 13 waits for the request pinned to step 12");
        drop(new);
        models.released(applying(&mut seen));
        assert_eq!((models.kept(), models.get(3).cloned()), (vec![3], Some(vec![10, 11, 12, 13])));
        assert_eq!(seen[2], (13, true));
    }

    #[test]
    fn the_base_of_a_waiting_delta_is_kept_across_a_swap() {
        let (tx, _rx) = channel();
        let generations = Generations::new();
        let mut models = Models::new(vec![10], generations.clone());
        let mut seen = Vec::new();
        let held = generations.pin(&tx);
        models.delta(delta(11), applying(&mut seen)); // makes 1 from 0, waits
        models.swap(vec![20]); // generation 2
        models.delta(delta(21), applying(&mut seen)); // makes 3 from 2, waits behind the first
        assert_eq!(models.kept(), [0, 2], "held, and the base of the delta of step 21");
        drop(held);
        models.released(applying(&mut seen));
        assert_eq!(seen, [(11, false), (21, true)]);
        assert_eq!((models.kept(), models.get(3).cloned()), (vec![3], Some(vec![20, 21])));
    }
}
