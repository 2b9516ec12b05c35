//! The training dataflow of one worker: the stages of a step, each a timely
//! operator that borrows the worker's [`Home`], [`Owner`] and [`Dense`] only
//! while it runs (they meet in the stages, never in each other's fields).
//!
//! Every stage after the lookups is a rendezvous ([`rendezvous_stage`]): it
//! routes each message to its receiver, waits until all `W` messages of a
//! step are in, combines them in sender order and counts the bytes of what it
//! sends to other workers. Every stage's work is timed on the worker's
//! [`StepTimes`] clock.
//!
//! A worker's failure travels inside the step it happened in, so no worker
//! needs another step to learn of it: a home whose model failed in its passes
//! (or whose store failed reading its rows for a report) marks its gradient
//! messages failed; an owner whose store failed serving rows marks the reply,
//! and the requester's gradient messages carry the count; either way every
//! owner learns of it before updating and updates nothing. An owner whose store
//! fails while updating reports it in its parameter updates. Each owner counts
//! its own worker at most once, and the gather sums the owners' counts into
//! [`StepStats::failed_workers`], the same on every worker.

use super::clock::{timed, Stage, StepTimes};
use super::home::Home;
use super::messages::Routed;
use super::owner::Owner;
use super::shared::Dense;
use super::sync::{ByteLedger, Outcome, Rendezvous};
use super::{Command, LookupReply, LookupRequest, ParamUpdate, StepStats};
use crate::metrics::EvalSet;
use std::cell::RefCell;
use std::rc::Rc;
use timely::communication::Pull;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::channels::Message;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::generic::InputHandleCore;
use timely::dataflow::operators::{Capability, InputCapability};
use timely::dataflow::{InputHandle, Stream};
use timely::scheduling::Activator;
use timely::worker::Worker;

/// The handle a worker feeds its step commands into.
pub(super) type CommandInput = InputHandle<u64, CapacityContainerBuilder<Vec<Command>>>;

/// One worker's state, shared by the trainer and its stages.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) home: Rc<RefCell<Home>>,
    pub(super) owner: Rc<RefCell<Owner>>,
    pub(super) dense: Rc<RefCell<Dense>>,
    pub(super) outcome: Rc<RefCell<Outcome>>,
    pub(super) eval: Rc<RefCell<EvalSet>>,
    pub(super) bytes: Rc<RefCell<ByteLedger>>,
    pub(super) clock: Rc<RefCell<StepTimes>>,
    /// The operator that feeds the next step (the [`Train`](super::Train) operator's),
    /// woken when a step completes.
    pub(super) next_step: Rc<RefCell<Option<Activator>>>,
}

type Messages<'scope, M> = Stream<'scope, u64, Vec<M>>;

/// Builds this worker's part of the training dataflow in a dataflow of its own, fed
/// through the returned handle; `deep_partial` when a deep model's fields travel as
/// partial results (one more stage).
pub(super) fn build(worker: &mut Worker, shared: &Shared, deep_partial: bool) -> CommandInput {
    let workers = worker.peers();
    let mut input = InputHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        stages(input.to_stream(scope), shared, deep_partial, workers);
    });
    input
}

/// The stages of training over `commands` (one per step and worker, the step's time its
/// timestamp), in whatever scope they come from: the statistics of each completed step,
/// summed over all workers, at the step's time.
pub(super) fn stages<'scope>(
    commands: Messages<'scope, Command>,
    shared: &Shared,
    deep_partial: bool,
    workers: usize,
) -> Messages<'scope, StepStats> {
    let serve_waker: Rc<RefCell<Option<Activator>>> = Rc::default();
    let requests = plan_lookups(commands, shared, serve_waker.clone());
    let replies = serve_lookups(requests, shared, deep_partial, serve_waker.clone());

    let s = shared.clone();
    let mut gradients = rendezvous_stage(replies, Stage::ForwardBackward, workers, shared, move |t, replies| {
        let before = s.bytes.borrow().before(t);
        let mut messages = {
            let owner = s.owner.borrow();
            s.home.borrow_mut().compute(&mut s.dense.borrow_mut(), replies, owner.rows(), before)
        };
        // A store in another memory that failed reading its rows for a report fails the
        // step on this worker, as a failed pass does (`Home::compute`).
        if s.owner.borrow_mut().check_store() {
            messages.iter_mut().for_each(|m| m.stats.failed_workers = 1);
        }
        messages
    });

    // A deep model's partial exchange: owners turn the partial results' gradients into
    // row gradients and their share of the first layer's weight gradient before any
    // worker sends its dense gradient, which therefore travels one stage later.
    if deep_partial {
        let s = shared.clone();
        gradients = rendezvous_stage(gradients, Stage::PartialBackward, workers, shared, move |_, messages| {
            s.owner.borrow_mut().partial_backward(&mut s.dense.borrow_mut(), messages)
        });
    }

    let s = shared.clone();
    let updates = rendezvous_stage(gradients, Stage::Apply, workers, shared, move |_, mut messages| {
        let mut owner = s.owner.borrow_mut();
        if deep_partial {
            messages = owner.with_held_messages(messages);
        }
        owner.apply(&mut s.dense.borrow_mut(), &messages, &mut s.eval.borrow_mut())
    });

    gather_params(updates, shared, workers, serve_waker)
}

/// Each command becomes one lookup request per owner; the step has begun on
/// this worker, and the serve stage may answer its requests (`serve_waker`).
fn plan_lookups<'scope>(
    commands: Messages<'scope, Command>,
    s: &Shared,
    serve_waker: Rc<RefCell<Option<Activator>>>,
) -> Messages<'scope, LookupRequest> {
    let s = s.clone();
    commands.unary::<CapacityContainerBuilder<Vec<LookupRequest>>, _, _, _>(
        Pipeline,
        Stage::Plan.name(),
        move |_, _| {
            move |input, output| {
                input.for_each(|cap, data: &mut Vec<Command>| {
                    let t = *cap.least().expect("a message has a time");
                    let mut session = output.session(&cap);
                    for command in data.drain(..) {
                        let requests = timed(&s.clock, Stage::Plan, || {
                            let owner = s.owner.borrow();
                            s.home.borrow_mut().plan(&s.dense.borrow(), command, owner.rows().replicas())
                        });
                        s.bytes.borrow_mut().count(t, &requests);
                        session.give_iterator(requests.into_iter());
                    }
                    s.outcome.borrow_mut().start(t);
                    if let Some(waker) = serve_waker.borrow().as_ref() {
                        waker.activate();
                    }
                });
            }
        },
    )
}

/// Owners answer each request as it arrives.
///
/// With a deep model's partial exchange an owner computes first-layer products with
/// the dense parameters, so it serves step `t` only once it has gathered step `t − 1`
/// (a faster peer's request may arrive earlier); `GatherParams` wakes it up through `waker`.
fn serve_lookups<'scope>(
    requests: Messages<'scope, LookupRequest>,
    s: &Shared,
    deep_partial: bool,
    waker: Rc<RefCell<Option<Activator>>>,
) -> Messages<'scope, LookupReply> {
    let (s, scope) = (s.clone(), requests.scope());
    requests.unary::<CapacityContainerBuilder<Vec<LookupReply>>, _, _, _>(
        Exchange::new(|r: &LookupRequest| r.to as u64),
        Stage::Serve.name(),
        move |_, info| {
            *waker.borrow_mut() = Some(scope.activator_for(info.address.clone()));
            let mut deferred: Vec<(Capability<u64>, LookupRequest)> = Vec::new();
            move |input, output| {
                let serve = |t: u64, requests: Vec<LookupRequest>| {
                    let replies: Vec<LookupReply> = timed(&s.clock, Stage::Serve, || {
                        let mut owner = s.owner.borrow_mut();
                        let dense = s.dense.borrow();
                        requests.into_iter().map(|r| owner.serve(r, t, &dense)).collect()
                    });
                    s.bytes.borrow_mut().count(t, &replies);
                    replies
                };
                // A request is answered once this worker has begun its step (a restore
                // between steps has then happened), and for a deep model's partial
                // exchange once its step before is complete (its dense replica then
                // holds the weights of the step).
                let ready = |t: u64| {
                    let outcome = s.outcome.borrow();
                    outcome.started() > t && (!deep_partial || outcome.completed() >= t)
                };
                input.for_each(|cap, data| {
                    let t = *cap.least().expect("a message has a time");
                    if !ready(t) {
                        let cap = cap.retain_least(0).expect("a message has a time");
                        deferred.extend(data.drain(..).map(|r| (cap.clone(), r)));
                        return;
                    }
                    output.session(&cap).give_iterator(serve(t, std::mem::take(data)).into_iter());
                });
                if !deferred.is_empty() {
                    let (ready, waiting) =
                        std::mem::take(&mut deferred).into_iter().partition::<Vec<_>, _>(|(cap, _)| ready(*cap.time()));
                    deferred = waiting;
                    for (cap, request) in ready {
                        output.session(&cap).give_iterator(serve(*cap.time(), vec![request]).into_iter());
                    }
                }
            }
        },
    )
}

/// Every slice owner's updated slice goes into this worker's replica; the step is complete.
fn gather_params<'scope>(
    updates: Messages<'scope, ParamUpdate>,
    s: &Shared,
    workers: usize,
    serve_waker: Rc<RefCell<Option<Activator>>>,
) -> Messages<'scope, StepStats> {
    let s = s.clone();
    let mut stash = Rendezvous::<ParamUpdate>::new(workers);
    let exchange = Exchange::new(|u: &ParamUpdate| u.to as u64);
    updates.unary::<CapacityContainerBuilder<Vec<StepStats>>, _, _, _>(exchange, Stage::Gather.name(), move |_, _| {
        move |input, output| {
            on_complete(input, &mut stash, |cap, t, updates| {
                let stats = gather(&s, &serve_waker, t, updates);
                output.session(cap).give(stats);
            })
        }
    })
}

/// Writes a step's parameter updates into this worker's dense copy and completes the step.
fn gather(s: &Shared, serve_waker: &Rc<RefCell<Option<Activator>>>, t: u64, updates: Vec<ParamUpdate>) -> StepStats {
    timed(&s.clock, Stage::Gather, || {
        let mut stats = StepStats::default();
        let (mut non_finite, mut failed_workers) = (0, 0);
        let mut dense = s.dense.borrow_mut();
        for u in &updates {
            if !u.values.is_empty() {
                dense.write(u.offset as usize, &u.values);
            }
            if u.from == 0 {
                stats = u.stats;
            }
            non_finite += u.stats.non_finite;
            failed_workers += u.stats.failed_workers;
        }
        // Each owner counts what it found itself (see `ParamUpdate::stats`).
        stats.non_finite = non_finite;
        stats.failed_workers = failed_workers;
        s.bytes.borrow_mut().settle(t + 1);
        s.outcome.borrow_mut().complete(t, stats);
        if let Some(waker) = serve_waker.borrow().as_ref() {
            waker.activate();
        }
        if let Some(waker) = s.next_step.borrow().as_ref() {
            waker.activate();
        }
        stats
    })
}

/// The shell of a rendezvous stage that sends on: `work` turns each step's `W`
/// messages (in sender order) into the messages this worker sends, which the
/// shell counts and sends under the step's capability.
fn rendezvous_stage<'scope, I: Routed, O: Routed>(
    messages: Messages<'scope, I>,
    stage: Stage,
    workers: usize,
    shared: &Shared,
    mut work: impl FnMut(u64, Vec<I>) -> Vec<O> + 'static,
) -> Messages<'scope, O> {
    let (bytes, clock) = (shared.bytes.clone(), shared.clock.clone());
    let mut stash = Rendezvous::<I>::new(workers);
    messages.unary::<CapacityContainerBuilder<Vec<O>>, _, _, _>(
        Exchange::new(|m: &I| m.route().1 as u64),
        stage.name(),
        move |_, _| {
            move |input, output| {
                on_complete(input, &mut stash, |cap, t, messages| {
                    let sent = timed(&clock, stage, || work(t, messages));
                    bytes.borrow_mut().count(t, &sent);
                    output.session(cap).give_iterator(sent.into_iter());
                })
            }
        },
    )
}

/// The input side of every rendezvous stage: collects each step's messages and
/// calls `complete` with the capability, the step and all `W` messages in sender order.
fn on_complete<M: Routed, P: Pull<Message<u64, Vec<M>>>>(
    input: &mut InputHandleCore<u64, Vec<M>, P>,
    stash: &mut Rendezvous<M>,
    mut complete: impl FnMut(&InputCapability<u64>, u64, Vec<M>),
) {
    input.for_each(|cap, data| {
        let t = *cap.least().expect("a message has a time");
        if let Some(messages) = stash.offer(t, data) {
            complete(&cap, t, messages);
        }
    });
}
