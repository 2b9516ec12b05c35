//! Timely operators over streams of raw records, as extension traits.

use crate::bad_record::{BadReason, BadRecord};
use crate::batch::Batch;
use crate::format::LineFormat;
use crate::spec::{FeatureSpec, SpecFormat};
use crate::OperatorError;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::dataflow::{Stream, StreamVec};
use timely::progress::Timestamp;

/// Parses a stream of lines into columnar batches and dead letters.
pub trait ParseRecords<'scope, T: Timestamp> {
    /// Parses every line with `format`. Each input message (all lines of one
    /// timestamp that arrive together) becomes one [`Batch`] on the first
    /// output; every malformed line becomes a [`BadRecord`] on the second,
    /// named `source` and numbered by its position in this worker's input
    /// (1-based). No line is dropped silently, except a header: when the
    /// first line this worker sees is one the format calls a header, it is
    /// skipped.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    /// use tiderec_records::bad_record::BadReason;
    /// use tiderec_records::format::LineFormat;
    /// use tiderec_records::stream::ParseRecords;
    /// use tiderec_records::Batch;
    ///
    /// /// `label,value` lines with one dense feature.
    /// struct Pairs;
    /// impl LineFormat for Pairs {
    ///     fn shape(&self) -> (usize, usize) { (1, 0) }
    ///     fn parse(&self, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
    ///         let text = std::str::from_utf8(line).map_err(|_| (BadReason::FieldCount, None))?;
    ///         let (label, value) = text.split_once(',').ok_or((BadReason::FieldCount, None))?;
    ///         let label: f32 = label.parse().map_err(|_| (BadReason::BadLabel, Some(0)))?;
    ///         let value: f32 = value.parse().map_err(|_| (BadReason::BadInteger, Some(1)))?;
    ///         out.labels.push(label);
    ///         out.dense.push(value);
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let (samples, bad) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(Vec::new())));
    /// let (s, b) = (samples.clone(), bad.clone());
    /// timely::example(move |scope| {
    ///     let lines = vec![b"1,0.5".to_vec(), b"oops".to_vec(), b"0,2".to_vec()].to_stream(scope);
    ///     let (batches, dead) = lines.parse_records(Pairs, "example");
    ///     batches.inspect(move |batch: &Batch| *s.lock().unwrap() += batch.len());
    ///     dead.inspect(move |r| b.lock().unwrap().push((r.line, r.reason)));
    /// });
    /// assert_eq!(*samples.lock().unwrap(), 2);
    /// assert_eq!(*bad.lock().unwrap(), vec![(2, BadReason::FieldCount)]);
    /// ```
    fn parse_records<F: LineFormat + 'static>(
        self,
        format: F,
        source: &str,
    ) -> (StreamVec<'scope, T, Batch>, StreamVec<'scope, T, BadRecord>);
}

impl<'scope, T: Timestamp> ParseRecords<'scope, T> for Stream<'scope, T, Vec<Vec<u8>>> {
    fn parse_records<F: LineFormat + 'static>(
        self,
        format: F,
        source: &str,
    ) -> (StreamVec<'scope, T, Batch>, StreamVec<'scope, T, BadRecord>) {
        let mut builder = OperatorBuilder::new("ParseRecords".to_owned(), self.scope());
        let mut input = builder.new_input(self, Pipeline);
        let (batches, batch_stream) = builder.new_output::<Vec<Batch>>();
        let (bad, bad_stream) = builder.new_output::<Vec<BadRecord>>();
        let mut batches: OutputBuilder<T, CapacityContainerBuilder<Vec<Batch>>> = OutputBuilder::from(batches);
        let mut bad: OutputBuilder<T, CapacityContainerBuilder<Vec<BadRecord>>> = OutputBuilder::from(bad);
        let source = source.to_string();
        let (num_dense, num_sparse) = format.shape();
        let num_sequences = format.num_sequences();
        let mut seen = 0u64;
        builder.build(move |_| {
            move |_frontiers| {
                let mut batches = batches.activate();
                let mut bad = bad.activate();
                input.for_each(|cap, data| {
                    let mut batch = Batch::with_sequences(num_dense, num_sparse, num_sequences);
                    let mut bad_session = bad.session(&cap);
                    for line in data.drain(..) {
                        seen += 1;
                        if seen == 1 && format.is_header(line.strip_suffix(b"\n").unwrap_or(&line)) {
                            continue;
                        }
                        if let Err((reason, field)) = parse_one(&format, &line, &mut batch) {
                            bad_session.give(BadRecord {
                                source: source.clone(),
                                line: seen,
                                byte_offset: 0,
                                reason,
                                field,
                                raw: line,
                            });
                        }
                    }
                    if !batch.is_empty() {
                        batches.session(&cap).give(batch);
                    }
                });
            }
        });
        (batch_stream, bad_stream)
    }
}

fn parse_one<F: LineFormat>(format: &F, line: &[u8], out: &mut Batch) -> Result<(), (BadReason, Option<usize>)> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    format.parse(line, out)
}

/// Turns a stream of raw lines into feature batches as a [`FeatureSpec`] describes them.
pub trait Featurize<'scope, T: Timestamp> {
    /// Validates `spec` (errors name the offending key, before any data flows),
    /// then parses every line with it: hashing with `seed`, fused list kernels,
    /// absent values as empty bags. Malformed lines become dead letters on the
    /// second stream, as in [`ParseRecords::parse_records`].
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use timely::dataflow::operators::{Inspect, ToStream};
    /// use tiderec_records::spec::FeatureSpec;
    /// use tiderec_records::stream::Featurize;
    /// use tiderec_records::Batch;
    ///
    /// let spec = FeatureSpec::taobao_ad(1000, 20);
    /// let header = b"clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,occupation,new_user_class_level,click_sequence";
    /// let row = b"0,2017-05-06 00:00:00,874257,172298,430548_1007,5443,160194,864,339907,3.9,0,3,2,3,,3,0,,170301^573514";
    /// let (samples, dead) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
    /// let (s, d) = (samples.clone(), dead.clone());
    /// timely::example(move |scope| {
    ///     let lines = vec![header.to_vec(), row.to_vec(), b"1,bad".to_vec()].to_stream(scope);
    ///     let (batches, bad) = lines.featurize(&spec, 7, "ads").expect("a valid spec");
    ///     batches.inspect(move |b: &Batch| *s.lock().unwrap() += b.len());
    ///     bad.inspect(move |_| *d.lock().unwrap() += 1);
    /// });
    /// assert_eq!((*samples.lock().unwrap(), *dead.lock().unwrap()), (1, 1));
    /// ```
    #[allow(clippy::type_complexity)]
    fn featurize(
        self,
        spec: &FeatureSpec,
        seed: u64,
        source: &str,
    ) -> Result<(StreamVec<'scope, T, Batch>, StreamVec<'scope, T, BadRecord>), OperatorError>;
}

impl<'scope, T: Timestamp> Featurize<'scope, T> for Stream<'scope, T, Vec<Vec<u8>>> {
    fn featurize(
        self,
        spec: &FeatureSpec,
        seed: u64,
        source: &str,
    ) -> Result<(StreamVec<'scope, T, Batch>, StreamVec<'scope, T, BadRecord>), OperatorError> {
        let format = SpecFormat::new(spec.clone(), seed)?;
        Ok(self.parse_records(format, source))
    }
}
