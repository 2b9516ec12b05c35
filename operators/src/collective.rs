//! Collective exchanges of small messages between all workers, outside the
//! training steps: a barrier that carries data (checkpoint coordination,
//! agreeing on what was restored).
//!
//! Invariants:
//! * Every worker builds its [`Collective`] at the same point of its program
//!   (timely matches dataflows by construction order) and calls
//!   [`Collective::exchange`] the same number of times; round `r` is timely
//!   timestamp `r`.
//! * A round returns only once this worker holds the message of every worker
//!   for that round, so when `exchange` returns, every worker has at least
//!   started the round: everything a worker did before the call happened
//!   before any worker returns from it.
//! * Results are in worker order, whatever order the messages arrived in.
//!
//! It works the same for threads and processes (messages are serialized
//! across processes like the training messages).

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::InputHandle;
use timely::worker::Worker;
use timely::ExchangeData;

/// One message of a round.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Envelope<T> {
    from: u32,
    to: u32,
    payload: T,
}

type Inbox<T> = Rc<RefCell<HashMap<u64, Vec<(u32, T)>>>>;

/// A worker's end of the collective channel (see the module docs).
///
/// ```
/// use tiderec_operators::collective::Collective;
///
/// timely::execute(timely::Config::process(3), |worker| {
///     let mut c = Collective::<u64>::new(worker);
///     let me = worker.index() as u64;
///     assert_eq!(c.all_gather(worker, me * 10), vec![0, 10, 20]);
///     // Worker k receives `100·from + k` from every worker.
///     let got = c.exchange(worker, |to| 100 * me + to as u64);
///     assert_eq!(got, vec![me, 100 + me, 200 + me]);
/// })
/// .unwrap();
/// ```
pub struct Collective<T: ExchangeData + Clone> {
    input: InputHandle<u64, CapacityContainerBuilder<Vec<Envelope<T>>>>,
    inbox: Inbox<T>,
    round: u64,
    me: usize,
    workers: usize,
}

impl<T: ExchangeData + Clone> Collective<T> {
    /// Builds this worker's part of the channel (a small dataflow of its own).
    pub fn new(worker: &mut Worker) -> Self {
        let inbox: Inbox<T> = Rc::new(RefCell::new(HashMap::new()));
        let mut input = InputHandle::new();
        let sink_inbox = inbox.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            input.to_stream(scope).sink(
                Exchange::new(|e: &Envelope<T>| e.to as u64),
                "Collective",
                move |(input, _frontier)| {
                    input.for_each(|cap, data: &mut Vec<Envelope<T>>| {
                        let t = *cap.least().expect("a message has a time");
                        let mut inbox = sink_inbox.borrow_mut();
                        let round = inbox.entry(t).or_default();
                        round.extend(data.drain(..).map(|e| (e.from, e.payload)));
                    });
                },
            );
        });
        Collective { input, inbox, round: 0, me: worker.index(), workers: worker.peers() }
    }

    /// Sends `message(k)` to every worker `k` and returns what each worker
    /// sent this one, in worker order. Collective: every worker must call it.
    pub fn exchange(&mut self, worker: &mut Worker, mut message: impl FnMut(usize) -> T) -> Vec<T> {
        for to in 0..self.workers {
            self.input.send(Envelope { from: self.me as u32, to: to as u32, payload: message(to) });
        }
        let round = self.round;
        self.round += 1;
        self.input.advance_to(self.round);
        while self.inbox.borrow().get(&round).map_or(0, Vec::len) < self.workers {
            worker.step();
        }
        let mut got = self.inbox.borrow_mut().remove(&round).unwrap_or_default();
        got.sort_by_key(|(from, _)| *from);
        got.into_iter().map(|(_, payload)| payload).collect()
    }

    /// Sends `value` to every worker and returns every worker's value, in worker order.
    pub fn all_gather(&mut self, worker: &mut Worker, value: T) -> Vec<T> {
        self.exchange(worker, |_| value.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_stay_separate_when_workers_run_ahead() {
        timely::execute(timely::Config::process(4), |worker| {
            let mut c = Collective::<(u32, String)>::new(worker);
            let me = worker.index() as u32;
            for round in 0..20u32 {
                let got = c.all_gather(worker, (round, format!("w{me}")));
                let expect: Vec<(u32, String)> = (0..4).map(|k| (round, format!("w{k}"))).collect();
                assert_eq!(got, expect);
            }
        })
        .unwrap();
    }
}
