//! DIEN-style samples from a behaviour log, kept up to date incrementally by
//! a differential-dataflow operator.
//!
//! Input: a collection of [`BehaviorEvent`]s (a user touched an item of a
//! category at a time; Taobao UserBehavior rows). Output: a collection of
//! [`BehaviorSample`]s, two per event:
//!
//! * a **positive**: the event's item and category as the target, label 1;
//! * a **negative**: the item and category of an event of *another* user,
//!   label 0 (when there is one, see below).
//!
//! Both carry the user's *history*: the `max_len` most recent events of the
//! same user strictly before the event, oldest first. Events are ordered by
//! `(time, seq)`, where `seq` is the event's position in the log, so ties in
//! time keep log order.
//!
//! **Negatives.** Users are spread over `groups` groups by a hash of the user
//! id. For an event `e`, let `P` be the events of `e`'s group that come
//! before `e`. The negative is drawn at `k = hash(seed, e.seq) mod |P|`: the
//! nearest event at or before `P[k]` whose user is not `e`'s user, else the
//! nearest one after `P[k]`; without such an event, `e` has no negative.
//! Negatives are thus drawn from the items other users actually touched
//! (popular items more often), and a sample depends only on the events
//! before it, so appending to the log never changes an existing sample.
//!
//! **Incrementality.** The operator keys events by group and recomputes the
//! samples of a group only when that group's events change; differential
//! dataflow turns the recomputed output into additions and retractions.
//! Events may arrive out of order: a late event retracts and replaces the
//! samples it affects. [`samples_from_scratch`] is an independent,
//! quadratic-time oracle of the same definition; the tests check that the
//! operator's accumulated output equals it at every timestamp.

use crate::features::mix64;
use differential_dataflow::lattice::Lattice;
use differential_dataflow::VecCollection;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use timely::progress::Timestamp;

/// One row of a behaviour log. Field order gives the `(time, seq)` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BehaviorEvent {
    /// When it happened (Unix seconds).
    pub time: u64,
    /// Position in the log (breaks ties in time; unique per event).
    pub seq: u64,
    /// The user.
    pub user: u64,
    /// The item.
    pub item: u64,
    /// The item's category.
    pub category: u64,
}

/// One training sample derived from a behaviour log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BehaviorSample {
    /// Time of the event the sample stands for.
    pub time: u64,
    /// Position of that event in the log.
    pub seq: u64,
    /// 1 for the event itself, 0 for its sampled negative.
    pub label: u8,
    /// The user.
    pub user: u64,
    /// Target item.
    pub item: u64,
    /// Target category.
    pub category: u64,
    /// The user's previous `(item, category)` events, oldest first, at most `max_len`.
    pub history: Vec<(u64, u64)>,
}

impl BehaviorSample {
    /// The sample of event `e` with target `(item, category)`, `label` and `history`.
    fn of(e: &BehaviorEvent, label: u8, (item, category): (u64, u64), history: Vec<(u64, u64)>) -> Self {
        BehaviorSample { time: e.time, seq: e.seq, label, user: e.user, item, category, history }
    }
}

/// How samples are derived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleConfig {
    /// Longest history kept.
    pub max_len: usize,
    /// Groups of users among which negatives are drawn (and the unit of recomputation).
    pub groups: u64,
    /// Seed of the negative draws.
    pub seed: u64,
}

impl SampleConfig {
    fn group_of(&self, user: u64) -> u64 {
        mix64(user ^ 0x9e37_79b9_7f4a_7c15) % self.groups.max(1)
    }

    fn draw(&self, seq: u64, n: usize) -> usize {
        (mix64(self.seed ^ mix64(seq)) % n as u64) as usize
    }
}

/// The negative of the event at position `at` of `events` (sorted by `(time, seq)`, one group).
fn negative_at(config: &SampleConfig, events: &[BehaviorEvent], at: usize) -> Option<BehaviorEvent> {
    if at == 0 {
        return None;
    }
    let e = &events[at];
    let k = config.draw(e.seq, at);
    let before = events[..=k].iter().rev().find(|o| o.user != e.user);
    before.or_else(|| events[k + 1..at].iter().find(|o| o.user != e.user)).copied()
}

/// The samples of one group's events, in any order (`events` sorted by `(time, seq)`).
fn group_samples(config: &SampleConfig, events: &[BehaviorEvent], out: &mut Vec<BehaviorSample>) {
    let mut histories: HashMap<u64, VecDeque<(u64, u64)>> = HashMap::new();
    for (at, e) in events.iter().enumerate() {
        let history = histories.entry(e.user).or_default();
        let past: Vec<(u64, u64)> = history.iter().copied().collect();
        if let Some(n) = negative_at(config, events, at) {
            out.push(BehaviorSample::of(e, 0, (n.item, n.category), past.clone()));
        }
        out.push(BehaviorSample::of(e, 1, (e.item, e.category), past));
        if config.max_len > 0 {
            if history.len() == config.max_len {
                history.pop_front();
            }
            history.push_back((e.item, e.category));
        }
    }
}

/// Derives DIEN samples from a behaviour log, incrementally.
///
/// ```
/// use differential_dataflow::input::Input;
/// use tiderec_records::behavior::{BehaviorEvent, BehaviorSamples, SampleConfig};
///
/// timely::example(|scope| {
///     let events = (0..6u64).map(|i| BehaviorEvent { time: i, seq: i, user: i % 2, item: 10 + i, category: 1 });
///     let (_input, log) = scope.new_collection_from(events);
///     log.behavior_samples(SampleConfig { max_len: 3, groups: 1, seed: 7 })
///         .inspect(|(s, _t, diff)| assert!(*diff == 1 && s.history.len() <= 3));
/// });
/// ```
pub trait BehaviorSamples<'scope, T: Timestamp + Lattice> {
    /// The samples of this log (see the module docs for their definition).
    fn behavior_samples(self, config: SampleConfig) -> VecCollection<'scope, T, BehaviorSample>;
}

impl<'scope, T: Timestamp + Lattice> BehaviorSamples<'scope, T> for VecCollection<'scope, T, BehaviorEvent> {
    fn behavior_samples(self, config: SampleConfig) -> VecCollection<'scope, T, BehaviorSample> {
        self.map(move |e| (config.group_of(e.user), e))
            .reduce_named("BehaviorSamples", move |_group, input: &[(&BehaviorEvent, isize)], output| {
                // `input` is sorted by value, i.e. by (time, seq); multiplicities other than 1
                // (a duplicated log row) count as that many events.
                let mut events = Vec::with_capacity(input.len());
                for &(e, n) in input {
                    for _ in 0..n.max(0) {
                        events.push(*e);
                    }
                }
                let mut samples = Vec::new();
                group_samples(&config, &events, &mut samples);
                output.extend(samples.into_iter().map(|s| (s, 1isize)));
            })
            .map(|(_group, sample)| sample)
    }
}

/// The samples of `events` computed from scratch, without differential
/// dataflow, sorted. A direct transcription of the definition in the module
/// docs (quadratic time): the oracle of [`BehaviorSamples`].
pub fn samples_from_scratch(config: &SampleConfig, events: &[BehaviorEvent]) -> Vec<BehaviorSample> {
    let mut out = Vec::new();
    for e in events {
        let before = |o: &&BehaviorEvent| (o.time, o.seq) < (e.time, e.seq);
        let mut mine: Vec<&BehaviorEvent> = events.iter().filter(|o| o.user == e.user).filter(before).collect();
        mine.sort();
        let history: Vec<(u64, u64)> =
            mine[mine.len().saturating_sub(config.max_len)..].iter().map(|o| (o.item, o.category)).collect();
        let group = config.group_of(e.user);
        let mut pool: Vec<&BehaviorEvent> =
            events.iter().filter(|o| config.group_of(o.user) == group).filter(before).collect();
        pool.sort();
        if !pool.is_empty() {
            let k = config.draw(e.seq, pool.len());
            let mut negative = None;
            for i in (0..=k).rev() {
                if pool[i].user != e.user {
                    negative = Some(pool[i]);
                    break;
                }
            }
            if negative.is_none() {
                negative = pool[k + 1..].iter().copied().find(|o| o.user != e.user);
            }
            if let Some(n) = negative {
                out.push(BehaviorSample::of(e, 0, (n.item, n.category), history.clone()));
            }
        }
        out.push(BehaviorSample::of(e, 1, (e.item, e.category), history));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use differential_dataflow::input::InputSession;
    use std::sync::{Arc, Mutex};

    /// A random log with out-of-order times and repeated timestamps.
    fn random_log(seed: u64, n: u64) -> Vec<BehaviorEvent> {
        (0..n)
            .map(|i| {
                let h = mix64(seed ^ mix64(i));
                BehaviorEvent {
                    time: 1000 + i * 3 + h % 40,
                    seq: i,
                    user: h % 7,
                    item: (h >> 8) % 50,
                    category: (h >> 20) % 5,
                }
            })
            .collect()
    }

    #[test]
    fn differential_output_equals_recomputation_at_every_timestamp() {
        for (seed, groups, max_len) in [(1u64, 1u64, 3usize), (2, 3, 2), (3, 2, 0), (4, 4, 8)] {
            let log = random_log(seed, 120);
            let config = SampleConfig { max_len, groups, seed };
            let chunks: Vec<Vec<BehaviorEvent>> = log.chunks(17).map(|c| c.to_vec()).collect();
            let updates: Arc<Mutex<Vec<(BehaviorSample, u64, isize)>>> = Arc::default();
            let sink = updates.clone();
            timely::execute_directly(move |worker| {
                let mut input = InputSession::<u64, BehaviorEvent, isize>::new();
                let probe = worker.dataflow(|scope| {
                    let sink = sink.clone();
                    input
                        .to_collection(scope)
                        .behavior_samples(config)
                        .inspect(move |(s, t, d)| sink.lock().unwrap().push((s.clone(), *t, *d)))
                        .probe()
                        .0
                });
                for (t, chunk) in chunks.iter().enumerate() {
                    for e in chunk {
                        input.insert(*e);
                    }
                    input.advance_to(t as u64 + 1);
                    input.flush();
                    worker.step_while(|| probe.less_than(input.time()));
                    // The accumulated output at time t equals the samples of the log so far.
                    let mut acc: HashMap<BehaviorSample, isize> = HashMap::new();
                    for (s, time, d) in sink.lock().unwrap().iter() {
                        if *time <= t as u64 {
                            *acc.entry(s.clone()).or_default() += d;
                        }
                    }
                    let mut got: Vec<BehaviorSample> = Vec::new();
                    for (s, n) in acc {
                        assert!(n >= 0, "negative multiplicity for {s:?}");
                        got.extend(std::iter::repeat_n(s, n as usize));
                    }
                    got.sort();
                    let seen: Vec<BehaviorEvent> = chunks[..=t].iter().flatten().copied().collect();
                    let want = samples_from_scratch(&config, &seen);
                    assert_eq!(got.len(), want.len(), "seed {seed}, t {t}");
                    assert_eq!(got, want, "seed {seed}, t {t}");
                }
            });
            let all = updates.lock().unwrap();
            assert!(all.iter().any(|(_, _, d)| *d < 0), "out-of-order events retract samples (seed {seed})");
        }
    }

    #[test]
    fn histories_and_negatives_follow_the_definition() {
        let ev = |time, seq, user, item| BehaviorEvent { time, seq, user, item, category: item / 10 };
        let log = [ev(1, 0, 1, 11), ev(2, 1, 2, 21), ev(3, 2, 1, 12), ev(3, 3, 1, 13)];
        let config = SampleConfig { max_len: 1, groups: 1, seed: 0 };
        let s = samples_from_scratch(&config, &log);
        // Event 0 has no earlier event: only its positive, with an empty history.
        let of = |seq| s.iter().filter(|x| x.seq == seq).cloned().collect::<Vec<_>>();
        assert_eq!(of(0).len(), 1);
        assert!(of(0)[0].history.is_empty());
        // Event 3 (user 1): history is its last event (12, max_len 1); the only foreign item is 21.
        let e3 = of(3);
        assert_eq!(e3.len(), 2);
        assert!(e3.iter().all(|x| x.history == vec![(12, 1)]));
        let neg = e3.iter().find(|x| x.label == 0).unwrap();
        assert_eq!((neg.item, neg.category), (21, 2));
        let mut fast = Vec::new();
        let mut sorted = log.to_vec();
        sorted.sort();
        group_samples(&config, &sorted, &mut fast);
        fast.sort();
        assert_eq!(fast, s);
    }
}
