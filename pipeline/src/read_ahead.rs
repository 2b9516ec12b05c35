//! Reading a worker's next micro-batch while its current step trains.
//!
//! [`MicroBatches`] is what a run's training and evaluation steps read their micro-batches
//! from. Read in place, it is the worker's [`WorkerData`]. Read ahead (`--read-ahead`), that
//! reader moves to a thread of its own, which reads one micro-batch beyond the one the
//! worker has taken: parsing, decoding or generating the next batch then overlaps the step,
//! instead of leaving the step's cores (or a GPU) idle while the worker reads.
//!
//! ## Invariants
//!
//! * **The same batches.** The thread reads exactly as [`WorkerData::next_micro_batch`]
//!   reads in place, one request at a time and in the worker's order (a rewind and the
//!   skip to a resumed run's position are requests too), so the batches, their order and
//!   the data position of every step are those of a run that reads in place.
//! * **A batch's side effects travel with it.** A batch comes with its read error, the
//!   bad-record counts as of the end of its reading and the dead letters its reading
//!   wrote. The dead letters are held back and written to the run's sink only when the
//!   worker takes the batch. So a run that stops with a batch read ahead (`--steps`, an
//!   early stop, an interrupt, a failure) counts and writes what a run that reads in
//!   place would: nothing of that batch.
//! * **Nothing past a split's end.** After an empty micro-batch (the end of the worker's
//!   share of the split) nothing is read ahead until the worker asks for the next one
//!   (after a rewind, or in another step of the same epoch).
//! * **One batch ahead at most**: one micro-batch of extra memory per worker.

use crate::data::WorkerData;
use crate::device::{Devices, WorkerDevice};
use crate::error::{DataflowFailure, PipelineError};
use crate::settings::ReadAheadMode;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use tiderec_operators::bad_record::{BadRecord, BadRecordCounts, DeadLetterSink, MemoryDeadLetters};
use tiderec_operators::Batch;
use tiderec_sinks::dead_letters::SharedDeadLetters;

/// The dead letters of a read-ahead reader, held until their batch is taken.
pub type HeldLetters = SharedDeadLetters<MemoryDeadLetters>;

/// Whether worker `me` of a process of `workers` workers on `devices` and `cores` cores reads
/// ahead under `mode`. With `auto`, a GPU worker does (its thread waits for the device while
/// a step runs), and a CPU worker when the process has more cores than CPU workers.
pub fn reads_ahead(mode: ReadAheadMode, devices: &Devices, workers: usize, me: usize, cores: usize) -> bool {
    match mode {
        ReadAheadMode::On => true,
        ReadAheadMode::Off => false,
        ReadAheadMode::Auto => {
            let cpu_workers = (0..workers).filter(|&i| devices.worker(i) == WorkerDevice::Cpu).count();
            devices.worker(me % workers.max(1)) != WorkerDevice::Cpu || cores > cpu_workers
        }
    }
}

/// What the worker asks of its reading thread.
enum Request {
    /// Read the next micro-batch into this buffer.
    Next(Batch),
    /// Start the split over.
    Rewind,
    /// Pass over this many steps' micro-batches (this buffer their scratch).
    Skip(u64, Batch),
}

/// One micro-batch as its reading left it.
struct Read {
    batch: Batch,
    result: Result<usize, PipelineError>,
    /// The reader's bad-record counts at the end of this read.
    bad: BadRecordCounts,
    /// The dead letters this read wrote.
    letters: Vec<BadRecord>,
}

/// A worker's micro-batches, read in place or one micro-batch ahead (see the module docs).
pub enum MicroBatches {
    /// Read on the worker's thread when its step asks.
    InPlace(WorkerData),
    /// Read one micro-batch ahead on a thread of its own.
    Ahead(Box<ReadAhead>),
}

impl MicroBatches {
    /// Worker `worker`'s micro-batches from the reader `open` makes, given the dead-letter
    /// sink it is to write to: read ahead when `ahead`, else in place. `sink` is the run's
    /// (`None`: no dead letters); `empty` a batch of the run's shape.
    pub fn open(
        ahead: bool,
        sink: Option<Box<dyn DeadLetterSink>>,
        empty: Batch,
        worker: usize,
        open: impl FnOnce(Option<Box<dyn DeadLetterSink>>) -> Result<WorkerData, PipelineError>,
    ) -> Result<Self, PipelineError> {
        if !ahead {
            return open(sink).map(MicroBatches::InPlace);
        }
        let held = sink.as_ref().map(|_| HeldLetters::new(MemoryDeadLetters::default()));
        let data = open(held.clone().map(|h| Box::new(h) as Box<dyn DeadLetterSink>))?;
        ReadAhead::start(data, held, sink, empty, worker).map(|ahead| MicroBatches::Ahead(Box::new(ahead)))
    }

    /// Appends this worker's next micro-batch to `out` (cleared first); 0 samples means the
    /// split is exhausted.
    pub fn next_micro_batch(&mut self, out: &mut Batch) -> Result<usize, PipelineError> {
        match self {
            MicroBatches::InPlace(data) => data.next_micro_batch(out),
            MicroBatches::Ahead(ahead) => ahead.next_micro_batch(out),
        }
    }

    /// Starts the split over (next epoch).
    pub fn rewind(&mut self) -> Result<(), PipelineError> {
        match self {
            MicroBatches::InPlace(data) => {
                data.rewind();
                Ok(())
            }
            MicroBatches::Ahead(ahead) => ahead.rewind(),
        }
    }

    /// The next micro-batch without taking it, when one is read ahead (see
    /// [`ReadAhead::peek`]); `None` when reading in place.
    pub fn peek(&mut self) -> Option<&Batch> {
        match self {
            MicroBatches::InPlace(_) => None,
            MicroBatches::Ahead(ahead) => ahead.peek(),
        }
    }

    /// Passes over this worker's share of the next `steps` global steps, as if they had
    /// been read (see [`WorkerData::skip_steps`]; `scratch` is a buffer).
    pub fn skip_steps(&mut self, steps: u64, scratch: &mut Batch) -> Result<(), PipelineError> {
        match self {
            MicroBatches::InPlace(data) => data.skip_steps(steps, scratch),
            MicroBatches::Ahead(ahead) => ahead.skip_steps(steps),
        }
    }

    /// The bad records skipped in the micro-batches taken so far.
    pub fn bad_counts(&self) -> BadRecordCounts {
        match self {
            MicroBatches::InPlace(data) => data.bad_counts(),
            MicroBatches::Ahead(ahead) => ahead.bad.clone(),
        }
    }

    /// Makes the dead letters of the micro-batches taken so far durable.
    pub fn flush(&mut self) -> Result<(), PipelineError> {
        match self {
            MicroBatches::InPlace(data) => data.flush(),
            MicroBatches::Ahead(ahead) => ahead.flush(),
        }
    }
}

/// A [`WorkerData`] on a thread of its own, one micro-batch ahead of its worker.
pub struct ReadAhead {
    requests: Option<Sender<Request>>,
    reads: Receiver<Read>,
    thread: Option<JoinHandle<()>>,
    /// A `Next` request is out (or its read is `ready`): the worker's next micro-batch.
    pending: bool,
    /// The read that is out, received by [`peek`](Self::peek) and not yet taken.
    ready: Option<Read>,
    /// The bad-record counts as of the last micro-batch taken.
    bad: BadRecordCounts,
    /// The run's dead-letter sink, if it writes dead letters.
    sink: Option<Box<dyn DeadLetterSink>>,
    /// A buffer for the read after the next, if one is free.
    spare: Option<Batch>,
    /// An empty batch of the run's shape (the first buffers).
    empty: Batch,
    worker: usize,
}

impl ReadAhead {
    /// Moves worker `worker`'s `data` to a reading thread. `held` must be the dead-letter
    /// sink `data` was opened with (if any); what it holds now is written to `sink` at once,
    /// and everything `data` writes later when its micro-batch is taken. `empty` is a batch
    /// of the run's shape.
    pub fn start(
        data: WorkerData,
        held: Option<HeldLetters>,
        mut sink: Option<Box<dyn DeadLetterSink>>,
        empty: Batch,
        worker: usize,
    ) -> Result<Self, PipelineError> {
        let bad = data.bad_counts();
        write_letters(&mut sink, take_held(held.as_ref()))?;
        let (requests, asked) = channel::<Request>();
        let (done, reads) = channel::<Read>();
        let thread = std::thread::Builder::new()
            .name(format!("tiderec-read-{worker}"))
            .spawn(move || serve(data, held, asked, done))
            .map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Thread, format!("worker {worker}: cannot start its reader"))
                    .with_source(e)
            })?;
        Ok(ReadAhead {
            requests: Some(requests),
            reads,
            thread: Some(thread),
            pending: false,
            ready: None,
            bad,
            sink,
            spare: None,
            empty,
            worker,
        })
    }

    /// The next micro-batch into `out` (its buffer goes to the thread for a later read),
    /// then, unless it was empty, asks for the one after it.
    pub fn next_micro_batch(&mut self, out: &mut Batch) -> Result<usize, PipelineError> {
        if !self.pending {
            self.ask_next()?;
        }
        let read = self.receive()?;
        self.pending = false;
        self.bad = read.bad;
        let samples = match write_letters(&mut self.sink, read.letters).and(read.result) {
            Ok(samples) => samples,
            Err(e) => {
                self.spare = Some(read.batch);
                return Err(e);
            }
        };
        self.spare = Some(std::mem::replace(out, read.batch));
        if samples > 0 {
            self.ask_next()?;
        }
        Ok(samples)
    }

    /// The next micro-batch, read ahead, without taking it: its samples, bad records and
    /// dead letters count only once [`next_micro_batch`](Self::next_micro_batch) takes it.
    /// Waits for its reading. `None` when none is read ahead (before the first micro-batch,
    /// after an empty one) or when its reading failed (the error comes when it is taken).
    pub fn peek(&mut self) -> Option<&Batch> {
        if !self.pending {
            return None;
        }
        if self.ready.is_none() {
            // A reading thread that is gone leaves nothing ready: taking the batch says why.
            self.ready = Some(self.reads.recv().ok()?);
        }
        let read = self.ready.as_ref()?;
        matches!(read.result, Ok(n) if n > 0).then_some(&read.batch)
    }

    /// Starts the split over. A micro-batch read ahead is dropped first, though the bad
    /// records of its reading stay in the counts that follow: the runs rewind only after an
    /// empty micro-batch, when none is read ahead.
    pub fn rewind(&mut self) -> Result<(), PipelineError> {
        if self.pending {
            self.spare = Some(self.receive()?.batch);
            self.pending = false;
        }
        self.ask(Request::Rewind)
    }

    /// Passes over this worker's share of the next `steps` global steps (a micro-batch
    /// already read ahead is the first of them).
    pub fn skip_steps(&mut self, mut steps: u64) -> Result<(), PipelineError> {
        if steps == 0 {
            return Ok(());
        }
        if self.pending {
            self.take_passed()?;
            steps -= 1;
        }
        let scratch = self.spare.take().unwrap_or_else(|| self.empty.clone());
        self.ask(Request::Skip(steps, scratch))?;
        self.pending = true;
        self.take_passed()
    }

    /// Takes the read that is out as passed over: its counts and dead letters count, its
    /// samples do not.
    fn take_passed(&mut self) -> Result<(), PipelineError> {
        let read = self.receive()?;
        self.pending = false;
        self.bad = read.bad;
        self.spare = Some(read.batch);
        write_letters(&mut self.sink, read.letters).and(read.result).map(|_| ())
    }

    /// Flushes the run's dead-letter sink.
    pub fn flush(&mut self) -> Result<(), PipelineError> {
        let Some(sink) = &mut self.sink else { return Ok(()) };
        sink.flush()
            .map_err(|e| PipelineError::dataflow(DataflowFailure::Output, "cannot flush dead letters").with_source(e))
    }

    /// Asks for the next micro-batch, in the spare buffer.
    fn ask_next(&mut self) -> Result<(), PipelineError> {
        let buffer = self.spare.take().unwrap_or_else(|| self.empty.clone());
        self.ask(Request::Next(buffer))?;
        self.pending = true;
        Ok(())
    }

    fn ask(&mut self, request: Request) -> Result<(), PipelineError> {
        let sent = self.requests.as_ref().is_some_and(|r| r.send(request).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.stopped())
        }
    }

    /// The read that is out: the one [`peek`](Self::peek) received, else the next to arrive.
    fn receive(&mut self) -> Result<Read, PipelineError> {
        match self.ready.take() {
            Some(read) => Ok(read),
            None => self.reads.recv().map_err(|_| self.stopped()),
        }
    }

    /// The error of a reading thread that is gone (it panicked).
    fn stopped(&self) -> PipelineError {
        PipelineError::dataflow(
            DataflowFailure::Panicked,
            format!("worker {}: its reading thread stopped", self.worker),
        )
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the requests ends the thread after the read in progress, if any.
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The reading thread: answers each request in order until the worker hangs up.
fn serve(mut data: WorkerData, held: Option<HeldLetters>, asked: Receiver<Request>, done: Sender<Read>) {
    while let Ok(request) = asked.recv() {
        let (batch, result) = match request {
            Request::Next(mut batch) => {
                let result = data.next_micro_batch(&mut batch);
                (batch, result)
            }
            Request::Skip(steps, mut scratch) => {
                let result = data.skip_steps(steps, &mut scratch).map(|()| 0);
                (scratch, result)
            }
            Request::Rewind => {
                data.rewind();
                continue;
            }
        };
        let read = Read { batch, result, bad: data.bad_counts(), letters: take_held(held.as_ref()) };
        if done.send(read).is_err() {
            return;
        }
    }
}

/// The dead letters `held` holds, taken out of it.
fn take_held(held: Option<&HeldLetters>) -> Vec<BadRecord> {
    held.map(|h| std::mem::take(&mut h.lock().records)).unwrap_or_default()
}

/// Writes `letters` to `sink`, if the run writes dead letters.
fn write_letters(sink: &mut Option<Box<dyn DeadLetterSink>>, letters: Vec<BadRecord>) -> Result<(), PipelineError> {
    let Some(sink) = sink else { return Ok(()) };
    for record in &letters {
        sink.write(record).map_err(|e| {
            PipelineError::dataflow(DataflowFailure::Output, "cannot write dead letters").with_source(e)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{CriteoOptions, IndexedSamples};
    use tiderec_operators::bad_record::BadRecordPolicy;
    use tiderec_sources::criteo::{CriteoFeatures, DEFAULT_MAX_LINE_BYTES};
    use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

    type Letters = SharedDeadLetters<MemoryDeadLetters>;

    fn empty() -> Batch {
        Batch::new(NUM_DENSE, NUM_SPARSE)
    }

    /// Worker 1 of 2 over 1,000 synthetic samples in global batches of 96: ten micro-batches
    /// of 48 and a last one of 20.
    fn synthetic() -> WorkerData {
        let generator = SyntheticCriteo::new(SyntheticConfig::kaggle_like(9, 1000)).unwrap();
        WorkerData::synthetic(IndexedSamples::Criteo(generator), 0..1000, 96, 1, 2)
    }

    /// 60 Criteo lines, the 8th, 25th and 26th malformed, read by one worker in micro-batches of 10.
    fn criteo(dir: &std::path::Path, sink: Option<Box<dyn DeadLetterSink>>) -> WorkerData {
        let path = dir.join("train.txt");
        let lines: Vec<String> = (0..60u32)
            .map(|i| {
                let ints: Vec<String> = (0..13).map(|j| ((i * 7 + j) % 50).to_string()).collect();
                let cats: Vec<String> = (0..26).map(|j| format!("{:08x}", (i * 31 + j) % 97)).collect();
                let mut line = format!("{}\t{}\t{}", i % 2, ints.join("\t"), cats.join("\t"));
                match i {
                    7 => line = line.replacen("\t", "\tabc", 1),
                    24 | 25 => line.push_str("\textra"),
                    _ => {}
                }
                line
            })
            .collect();
        if !path.exists() {
            // Written once: a reader open on it would see it change.
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        }
        let options = CriteoOptions {
            seed: 1,
            shuffle_seed: 1,
            shuffle: None,
            spec: None,
            features: CriteoFeatures { table_sizes: vec![1000; 26], seed: 1 },
            max_len: 20,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            policy: BadRecordPolicy::Skip,
        };
        WorkerData::criteo(&[path], (0.0, 1.0), &options, 10, 0, 1, sink).unwrap()
    }

    /// Worker 0's micro-batches of [`criteo`] in `dir`, read ahead or in place, and the
    /// dead letters they write.
    fn open_criteo(dir: &std::path::Path, ahead: bool) -> (MicroBatches, Letters) {
        let letters = Letters::new(MemoryDeadLetters::default());
        let sink: Box<dyn DeadLetterSink> = Box::new(letters.clone());
        let data = MicroBatches::open(ahead, Some(sink), empty(), 0, |sink| Ok(criteo(dir, sink))).unwrap();
        (data, letters)
    }

    /// Every micro-batch `data` gives over `script` (`n`: read n; `r`: rewind; `s<n>`: skip
    /// n steps) with the bad-record counts after it.
    fn run(mut data: MicroBatches, script: &[&str]) -> Vec<(Batch, BadRecordCounts)> {
        let (mut out, mut got) = (empty(), Vec::new());
        for step in script {
            match (step.as_bytes()[0], step[1..].parse::<u64>()) {
                (b'r', _) => data.rewind().unwrap(),
                (b's', Ok(n)) => data.skip_steps(n, &mut out).unwrap(),
                (b'n', Ok(n)) => {
                    for _ in 0..n {
                        data.next_micro_batch(&mut out).unwrap();
                        got.push((out.clone(), data.bad_counts()));
                    }
                }
                _ => unreachable!("{step}"),
            }
        }
        got
    }

    #[test]
    fn auto_reads_ahead_on_gpu_workers_and_on_cpu_workers_with_cores_to_spare() {
        let auto = |devices: &str, workers: usize, me: usize, cores: usize| {
            let d = Devices::for_workers(devices, workers).unwrap();
            reads_ahead(ReadAheadMode::Auto, &d, workers, me, cores)
        };
        assert!(auto("cpu", 1, 0, 2) && !auto("cpu", 2, 1, 2) && auto("cpu", 2, 1, 3));
        assert!(auto("cuda:0", 2, 1, 2), "a GPU worker waits for its device");
        // Worker 0 on the GPU leaves one CPU worker on two cores.
        assert!(auto("cuda:0,cpu", 2, 0, 2) && auto("cuda:0,cpu", 2, 1, 2));
        assert!(!auto("cuda:0,cpu,cpu", 3, 2, 2) && auto("cuda:0,cpu,cpu", 3, 0, 2));
        let d = Devices::for_workers("cpu", 4).unwrap();
        assert!(reads_ahead(ReadAheadMode::On, &d, 4, 3, 1) && !reads_ahead(ReadAheadMode::Off, &d, 4, 0, 64));
    }

    #[test]
    fn read_ahead_gives_the_batches_of_reading_in_place() {
        // Past the end (empty batches, more than once), rewinds in a row, skips at the
        // start, after a batch read ahead and past the end.
        let script = ["s2", "n3", "n12", "r", "n4", "r", "r", "s3", "n1", "s20", "n2", "r", "n1"];
        let ahead = MicroBatches::open(true, None, empty(), 1, |_| Ok(synthetic())).unwrap();
        let in_place = MicroBatches::open(false, None, empty(), 1, |_| Ok(synthetic())).unwrap();
        let (a, b) = (run(ahead, &script), run(in_place, &script));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x, y, "micro-batch {i}");
        }
        let lens: Vec<usize> = a.iter().map(|(b, _)| b.len()).collect();
        assert_eq!(&lens[..4], &[48, 48, 48, 48], "{lens:?}");
        assert!(lens.contains(&20) && lens.contains(&0), "{lens:?}");
    }

    #[test]
    fn a_batch_read_ahead_counts_and_writes_its_dead_letters_only_once_taken() {
        let dir = tempfile::tempdir().unwrap();
        let lines = |letters: &Letters| -> Vec<u64> { letters.lock().records.iter().map(|r| r.line).collect() };
        let mut runs = Vec::new();
        for ahead in [true, false] {
            let (mut data, letters) = open_criteo(dir.path(), ahead);
            let mut out = empty();
            let mut seen = Vec::new();
            // The first batch (lines 1–10, line 8 malformed) reads up to line 11; the one
            // read ahead behind it holds lines 25 and 26.
            for _ in 0..2 {
                data.next_micro_batch(&mut out).unwrap();
                // Time for the thread to read the next batch, which must not show yet.
                std::thread::sleep(std::time::Duration::from_millis(50));
                seen.push((out.len(), data.bad_counts().total(), lines(&letters)));
            }
            data.flush().unwrap();
            drop(data);
            seen.push((0, 0, lines(&letters)));
            runs.push(seen);
        }
        assert_eq!(runs[0], runs[1]);
        assert_eq!(runs[0][0], (10, 1, vec![8]));
        assert_eq!(runs[0][1], (10, 1, vec![8]), "the second batch has lines 12–21");
        assert_eq!(runs[0][2].2, vec![8], "the batch read ahead and dropped writes nothing");
    }

    #[test]
    fn a_peeked_batch_is_the_next_one_and_counts_only_once_taken() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ahead, letters) = open_criteo(dir.path(), true);
        let (mut in_place, _) = open_criteo(dir.path(), false);
        let (mut out, mut expected) = (empty(), empty());
        assert!(ahead.peek().is_none(), "nothing is read ahead before the first micro-batch");
        assert!(in_place.peek().is_none(), "reading in place peeks at nothing");
        for step in 0..7 {
            in_place.next_micro_batch(&mut expected).unwrap();
            if step > 0 {
                let peeked = ahead.peek().cloned();
                // The third micro-batch (lines 23–34) holds lines 25 and 26: peeked, not counted.
                assert_eq!(ahead.bad_counts().total(), if step <= 2 { 1 } else { 3 }, "step {step}");
                assert_eq!(letters.lock().records.len() as u64, ahead.bad_counts().total(), "step {step}");
                assert_eq!(peeked.as_ref(), (!expected.is_empty()).then_some(&expected), "step {step}");
                // Peeking twice waits for nothing and gives the same batch.
                assert_eq!(ahead.peek().cloned(), peeked, "step {step}");
            }
            ahead.next_micro_batch(&mut out).unwrap();
            assert_eq!(out, expected, "step {step}");
            assert_eq!(ahead.bad_counts(), in_place.bad_counts(), "step {step}");
        }
        assert!(out.is_empty() && ahead.peek().is_none(), "nothing is read past the end");
        ahead.rewind().unwrap();
        ahead.next_micro_batch(&mut out).unwrap();
        in_place.rewind().unwrap();
        in_place.next_micro_batch(&mut expected).unwrap();
        assert_eq!(ahead.peek().cloned().map(|b| b.len()), Some(10));
        assert_eq!(out, expected);
    }

    #[test]
    fn resuming_writes_the_dead_letters_of_the_batches_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut runs = Vec::new();
        for ahead in [true, false] {
            let (mut data, letters) = open_criteo(dir.path(), ahead);
            let mut out = empty();
            data.skip_steps(3, &mut out).unwrap();
            let after_skip = (data.bad_counts().total(), letters.lock().records.len());
            data.next_micro_batch(&mut out).unwrap();
            let first = out.clone();
            let records: Vec<u64> = letters.lock().records.iter().map(|r| r.line).collect();
            runs.push((after_skip, first, records, data.bad_counts()));
        }
        assert_eq!(runs[0], runs[1]);
        assert_eq!(runs[0].0, (3, 3), "three steps of 10 good lines pass lines 8, 25 and 26");
        assert_eq!(runs[0].2, vec![8, 25, 26]);
    }
}
