//! Taobao UserBehavior logs (`user,item,category,behavior,timestamp`) turned
//! into DIEN samples.
//!
//! [`read_user_behavior`] streams the CSV files into [`BehaviorEvent`]s
//! (`seq` = position among the good rows, across files in order). A row
//! with the wrong number of fields (such as the truncated last line of the
//! sample in `../shared/data`) is a [`BadReason::FieldCount`], a non-numeric
//! id or timestamp a [`BadReason::BadInteger`], and a behaviour other than
//! `pv`, `buy`, `cart` or `fav` a [`BadReason::BadLabel`], and a line longer
//! than the limit a [`BadReason::TooLong`] (kept no further than the limit or
//! [`MAX_RAW_BYTES`], whichever is more, so a file without line breaks cannot
//! fill the memory); each is counted and goes to the dead-letter sink (or
//! stops the read under `fail`). Empty lines, `\r\n` ones too, are skipped,
//! and a UTF-8 byte order mark at the start of a file is stripped.
//!
//! Lines are measured and kept as the line readers ([`crate::lines`]) do: the
//! limit is on a line without its `\r\n` or `\n` (a CRLF line of exactly the
//! limit is read), a bad line's raw bytes are the whole line without its
//! terminator, and an over-long line's the first [`MAX_RAW_BYTES`] of it.
//!
//! [`derive_samples`] feeds the events, in chunks, through the
//! differential [`BehaviorSamples`] operator and lays the resulting samples
//! out as one [`Batch`] ordered by `(time, seq, label)`: sparse fields
//! `[user, target item, target category]` and sequences `[history items,
//! history categories]`, ids hashed into the user, item and category tables
//! (history items share the item table, so they share rows with targets).

use crate::lines::{strip_bom, MAX_RAW_BYTES};
use crate::SourceError;
use differential_dataflow::input::InputSession;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tiderec_records::bad_record::{BadReason, BadRecord, BadRecordCounts, BadRecordPolicy, DeadLetterSink};
use tiderec_records::behavior::{BehaviorEvent, BehaviorSample, BehaviorSamples, SampleConfig};
use tiderec_records::features::split::split_exact;
use tiderec_records::features::{field_seed, hash_bucket, parse_i64};
use tiderec_records::Batch;

/// Events fed to the dataflow per timestamp.
const CHUNK: usize = 8192;

/// Parses one row; `seq` is its position among good rows.
pub fn parse_behavior_row(line: &[u8], seq: u64) -> Result<BehaviorEvent, (BadReason, Option<usize>)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let fields = split_exact::<5>(line, b',').ok_or((BadReason::FieldCount, None))?;
    let number = |i: usize| match parse_i64(fields[i]) {
        Some(v) if v >= 0 => Ok(v as u64),
        _ => Err((BadReason::BadInteger, Some(i))),
    };
    let (user, item, category, time) = (number(0)?, number(1)?, number(2)?, number(4)?);
    if !matches!(fields[3], b"pv" | b"buy" | b"cart" | b"fav") {
        return Err((BadReason::BadLabel, Some(3)));
    }
    Ok(BehaviorEvent { time, seq, user, item, category })
}

/// Reads the next line of `reader` into `line` (without its `\n`), keeping its first
/// `keep` bytes (the rest read and dropped): returns the bytes the line took in the file
/// (0: the end of the file) and its length without the `\n`.
fn read_line_bounded(reader: &mut impl BufRead, line: &mut Vec<u8>, keep: usize) -> std::io::Result<(u64, u64)> {
    line.clear();
    let (mut taken, mut len) = (0u64, 0u64);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok((taken, len));
        }
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        let room = keep.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        len += chunk.len() as u64;
        let used = chunk.len() + usize::from(newline);
        reader.consume(used);
        taken += used as u64;
        if newline {
            return Ok((taken, len));
        }
    }
}

/// The line of `len` bytes (without its `\n`) whose first bytes are `head`, without a final
/// `\r` when `head` is all of it: what the limit applies to, as in [`crate::lines`]. A line
/// cut short is over the limit when `head` holds more than the limit plus a `\r`.
fn line_body(head: &[u8], len: u64) -> (&[u8], u64) {
    match head.strip_suffix(b"\r") {
        Some(body) if head.len() as u64 == len => (body, len - 1),
        _ => (head, len),
    }
}

/// A bad line's raw bytes in its record: all of `body`, or the head of an over-long one.
fn raw_bytes(body: &[u8], too_long: bool) -> &[u8] {
    if too_long {
        &body[..body.len().min(MAX_RAW_BYTES)]
    } else {
        body
    }
}

/// Reads UserBehavior CSV files into events, skipping (or failing on) malformed rows;
/// a line longer than `max_line_bytes` is a [`BadReason::TooLong`].
pub fn read_user_behavior(
    paths: &[PathBuf],
    policy: BadRecordPolicy,
    max_line_bytes: usize,
    mut dead_letters: Option<&mut dyn DeadLetterSink>,
) -> Result<(Vec<BehaviorEvent>, BadRecordCounts), SourceError> {
    let mut events = Vec::new();
    let mut counts = BadRecordCounts::default();
    // Enough to see whether a line is over the limit (its `\r` included), and a bad one's raw head.
    let keep = max_line_bytes.saturating_add(1).max(MAX_RAW_BYTES);
    for path in paths {
        let io_err = |source| SourceError::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        let (mut line, mut number, mut offset) = (Vec::new(), 0u64, 0u64);
        loop {
            let (n, len) = read_line_bounded(&mut reader, &mut line, keep).map_err(io_err)?;
            if n == 0 {
                break;
            }
            number += 1;
            let (body, body_len) = line_body(&line, len);
            let body = if offset == 0 { strip_bom(body) } else { body };
            let too_long = body_len > max_line_bytes as u64;
            if !body.is_empty() || too_long {
                let parsed = if too_long {
                    Err((BadReason::TooLong, None))
                } else {
                    parse_behavior_row(body, events.len() as u64)
                };
                match parsed {
                    Ok(e) => events.push(e),
                    Err((reason, field)) => {
                        let record = BadRecord {
                            source: path.display().to_string(),
                            line: number,
                            byte_offset: offset,
                            reason,
                            field,
                            raw: raw_bytes(body, too_long).to_vec(),
                        };
                        if policy == BadRecordPolicy::Fail {
                            return Err(SourceError::BadRecord(record));
                        }
                        counts.add(reason);
                        if let Some(sink) = dead_letters.as_deref_mut() {
                            sink.write(&record).map_err(|source| SourceError::DeadLetter { source })?;
                        }
                    }
                }
            }
            offset += n;
        }
    }
    Ok((events, counts))
}

/// The samples of `events` (see [`tiderec_records::behavior`]), computed
/// by the differential operator in chunks and sorted by `(time, seq, label)`.
pub fn derive_samples(events: &[BehaviorEvent], config: SampleConfig) -> Vec<BehaviorSample> {
    let chunks: Vec<Vec<BehaviorEvent>> = events.chunks(CHUNK).map(<[BehaviorEvent]>::to_vec).collect();
    let updates: Arc<Mutex<Vec<(BehaviorSample, isize)>>> = Arc::default();
    let sink = updates.clone();
    timely::execute_directly(move |worker| {
        let mut input = InputSession::<u64, BehaviorEvent, isize>::new();
        let probe = worker.dataflow(|scope| {
            input
                .to_collection(scope)
                .behavior_samples(config)
                .consolidate()
                .inspect(move |(s, _t, d)| sink.lock().expect("not poisoned").push((s.clone(), *d)))
                .probe()
                .0
        });
        for (t, chunk) in chunks.into_iter().enumerate() {
            for e in chunk {
                input.insert(e);
            }
            input.advance_to(t as u64 + 1);
            input.flush();
            worker.step_while(|| probe.less_than(input.time()));
        }
    });
    let mut updates = std::mem::take(&mut *updates.lock().expect("not poisoned"));
    updates.sort();
    let mut samples = Vec::with_capacity(updates.len());
    let mut i = 0;
    while i < updates.len() {
        let mut j = i;
        let mut count = 0isize;
        while j < updates.len() && updates[j].0 == updates[i].0 {
            count += updates[j].1;
            j += 1;
        }
        samples.extend(std::iter::repeat_n(updates[i].0.clone(), count.max(0) as usize));
        i = j;
    }
    samples
}

/// Lays `samples` out as one batch with ids hashed into `table_sizes` (user, item, category);
/// each sample's user id is its group (`Batch::groups`), for per-user metrics.
pub fn samples_to_batch(samples: &[BehaviorSample], table_sizes: &[u64], seed: u64) -> Batch {
    let seeds = [0, 1, 2].map(|t| field_seed(seed, t));
    let bucket = |t: usize, v: u64| hash_bucket(seeds[t], v, table_sizes[t]);
    let mut out = Batch::with_sequences(0, 3, 2);
    for s in samples {
        out.labels.push(f32::from(s.label));
        out.groups.push(s.user);
        for (t, v) in [s.user, s.item, s.category].into_iter().enumerate() {
            out.sparse[t].ids.push(bucket(t, v));
            out.sparse[t].close_bag();
        }
        for &(item, category) in &s.history {
            out.sequences[0].ids.push(bucket(1, item));
            out.sequences[1].ids.push(bucket(2, category));
        }
        out.sequences[0].close_bag();
        out.sequences[1].close_bag();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiderec_records::behavior::samples_from_scratch;

    /// A line over the limit is one `too_long` record, read no further than the limit,
    /// and the lines after it are read as usual; an empty `\r\n` line is skipped.
    #[test]
    fn an_over_long_line_is_one_bad_record_and_blank_crlf_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("behavior.csv");
        let long = "9".repeat(5000);
        let text = format!("1,2,3,pv,5\r\n\r\n{long},2,3,pv,5\n\n7,8,9,buy,10\n{long}");
        std::fs::write(&path, &text).unwrap();
        let mut dead = tiderec_records::bad_record::MemoryDeadLetters::default();
        let (events, counts) =
            read_user_behavior(std::slice::from_ref(&path), BadRecordPolicy::Skip, 100, Some(&mut dead)).unwrap();
        assert_eq!(events.iter().map(|e| e.user).collect::<Vec<_>>(), [1, 7]);
        assert_eq!(counts.total(), 2);
        let got: Vec<(u64, u64, BadReason, usize)> =
            dead.records.iter().map(|r| (r.line, r.byte_offset, r.reason, r.raw.len())).collect();
        let second = (text.find(&long).unwrap()) as u64;
        let last = text.rfind(&long).unwrap() as u64;
        let raw = MAX_RAW_BYTES;
        assert_eq!(got, [(3, second, BadReason::TooLong, raw), (6, last, BadReason::TooLong, raw)]);
    }

    /// A UTF-8 byte order mark at the start of the file is stripped; one later is data.
    #[test]
    fn a_byte_order_mark_at_the_start_of_the_file_is_stripped() {
        let (users, bad) = read_text(b"\xEF\xBB\xBF1,2,3,pv,5\n7,8,9,buy,10\n", 100);
        assert_eq!((users, bad), (vec![1, 7], vec![]));
        let (users, bad) = read_text(b"1,2,3,pv,5\n\xEF\xBB\xBF7,8,9,buy,10\n", 100);
        assert_eq!((users, bad), (vec![1], vec![(2, BadReason::BadInteger, 15)]));
    }

    /// Reads `text` as one file with limit `max`: the good rows' users and the bad ones'
    /// `(line, reason, raw length)`.
    fn read_text(text: &[u8], max: usize) -> (Vec<u64>, Vec<(u64, BadReason, usize)>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("behavior.csv");
        std::fs::write(&path, text).unwrap();
        let mut dead = tiderec_records::bad_record::MemoryDeadLetters::default();
        let (events, _) =
            read_user_behavior(std::slice::from_ref(&path), BadRecordPolicy::Skip, max, Some(&mut dead)).unwrap();
        let bad = dead.records.iter().map(|r| (r.line, r.reason, r.raw.len())).collect();
        (events.iter().map(|e| e.user).collect(), bad)
    }

    /// As for the line readers: the limit is on a line without its `\r\n` (a CRLF row of
    /// exactly the limit is read, also at the end of the file), a bad line keeps all its
    /// bytes and an over-long one its first `MAX_RAW_BYTES`.
    #[test]
    fn the_limit_excludes_the_crlf_and_raw_bytes_are_kept_as_the_line_readers_keep_them() {
        // Rows of exactly 10 bytes, one of 11, then one of 10 with a CR and no final newline.
        let (users, bad) = read_text(b"1,2,3,pv,5\r\n2,2,3,pv,5\n3,2,3,pv,55\r\n4,2,3,pv,55\n5,2,3,pv,5\r", 10);
        assert_eq!(users, [1, 2, 5]);
        assert_eq!(bad, [(3, BadReason::TooLong, 11), (4, BadReason::TooLong, 11)]);
        // A bad row longer than MAX_RAW_BYTES but within the limit keeps all of it; an
        // over-long row its head.
        let long_bad = format!("1,2,3,{},5\r\n", "x".repeat(6000));
        let too_long = format!("1,2,3,pv,{}\r\n", "9".repeat(20_000));
        let (users, bad) = read_text(format!("{long_bad}{too_long}").as_bytes(), 10_000);
        assert!(users.is_empty());
        assert_eq!(bad, [(1, BadReason::BadLabel, long_bad.len() - 2), (2, BadReason::TooLong, MAX_RAW_BYTES)]);
    }

    #[test]
    fn rows_parse_and_bad_rows_name_their_reason() {
        let e = parse_behavior_row(b"1,2268318,2520377,pv,1511544070", 4).unwrap();
        assert_eq!(e, BehaviorEvent { time: 1511544070, seq: 4, user: 1, item: 2268318, category: 2520377 });
        assert_eq!(parse_behavior_row(b"100370,1968385,1875258,pv", 0), Err((BadReason::FieldCount, None)));
        assert_eq!(parse_behavior_row(b"1,x,3,pv,5", 0), Err((BadReason::BadInteger, Some(1))));
        assert_eq!(parse_behavior_row(b"1,2,3,like,5", 0), Err((BadReason::BadLabel, Some(3))));
        assert_eq!(parse_behavior_row(b"1,2,3,pv,-5", 0), Err((BadReason::BadInteger, Some(4))));
    }

    #[test]
    fn chunked_differential_samples_equal_the_oracle() {
        let events: Vec<BehaviorEvent> = (0..20_000u64)
            .map(|i| BehaviorEvent {
                time: 1_000_000 + (i * 7919) % 5000,
                seq: i,
                user: i / 40,
                item: (i * 31) % 997,
                category: (i * 31) % 997 % 13,
            })
            .collect();
        let config = SampleConfig { max_len: 5, groups: 16, seed: 3 };
        let fast = derive_samples(&events, config);
        // The oracle is quadratic: compare on a subset of users (their groups' samples are self-contained).
        let small: Vec<BehaviorEvent> = events.iter().filter(|e| e.user < 60).copied().collect();
        let mut want = samples_from_scratch(&config, &small);
        let mut got = derive_samples(&small, config);
        want.sort();
        got.sort();
        assert_eq!(got, want);
        assert!(fast.len() > events.len(), "positives plus negatives");
        assert!(fast.windows(2).all(|w| w[0] <= w[1]), "sorted by (time, seq, label)");
        let batch = samples_to_batch(&fast, &[100, 1000, 20], 1);
        batch.check().unwrap();
        assert_eq!(batch.len(), fast.len());
        assert!(batch.groups.iter().zip(&fast).all(|(&g, s)| g == s.user), "each sample's user is its group");
    }
}
