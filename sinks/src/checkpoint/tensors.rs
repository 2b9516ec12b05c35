//! Safetensors files written in one streaming pass, and typed reads.
//!
//! The header is built with the `safetensors` crate's own [`Metadata`] (so
//! offsets, alignment and JSON are the crate's), then the tensors are
//! streamed through a small conversion buffer, never materialised as one
//! byte array: peak memory is the buffer, whatever the table sizes. The
//! writer hashes what it writes (xxh3-128) and fsyncs the file before it
//! returns, so the returned [`FileEntry`] describes bytes that are on disk.
//! Values are little-endian, as safetensors requires.

use super::manifest::FileEntry;
use crate::SinkError;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use xxhash_rust::xxh3::Xxh3Default;

/// The values of one tensor, borrowed from the snapshot or model.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// Parameters.
    F32(&'a [f32]),
    /// Row ids and counts.
    U64(&'a [u64]),
    /// Sketch counters.
    U32(&'a [u32]),
}

impl Values<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Values::F32(_) => Dtype::F32,
            Values::U64(_) => Dtype::U64,
            Values::U32(_) => Dtype::U32,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::U32(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn byte_len(&self) -> usize {
        match self {
            Values::F32(v) => v.len() * 4,
            Values::U64(v) => v.len() * 8,
            Values::U32(v) => v.len() * 4,
        }
    }
}

/// One named tensor to write, row-major.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    /// Its name in the file.
    pub name: String,
    /// Its shape (the product is the number of values).
    pub shape: Vec<usize>,
    /// The values.
    pub values: Values<'a>,
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: Xxh3Default,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Elements converted to bytes per write.
const CHUNK: usize = 1 << 14;

/// Writes `tensors` (in this order) with string `metadata` to a new file at
/// `path`, fsyncs it and returns its size and checksum. Names must be unique: a name given
/// twice is a [`SinkError::Checkpoint`] naming it, before anything is written.
pub(crate) fn write(
    path: &Path,
    tensors: &[Tensor<'_>],
    metadata: HashMap<String, String>,
) -> Result<FileEntry, SinkError> {
    let io = |source| SinkError::Io { path: path.display().to_string(), source };
    let format = |reason: String| SinkError::Checkpoint { path: path.display().to_string(), reason };
    let repeated = repeated_names(tensors);
    if !repeated.is_empty() {
        let names = repeated.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        return Err(format(format!("tensor names given more than once: {names}")));
    }
    let mut infos = Vec::with_capacity(tensors.len());
    let mut offset = 0usize;
    for t in tensors {
        let n = t.values.byte_len();
        infos.push((
            t.name.clone(),
            TensorInfo { dtype: t.values.dtype(), shape: t.shape.clone(), data_offsets: (offset, offset + n) },
        ));
        offset += n;
    }
    let header = Metadata::new(Some(metadata), infos).map_err(|e| format(format!("bad tensor layout: {e}")))?;
    // Through a JSON value, whose objects keep their keys sorted: the crate writes the
    // metadata in the order of its `HashMap`, which differs from process to process, and
    // the same state must give the same bytes (and checksum) in every run.
    let header = serde_json::to_value(&header).map_err(|e| format(format!("cannot encode the header: {e}")))?;
    let mut header = serde_json::to_vec(&header).map_err(|e| format(format!("cannot encode the header: {e}")))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let file = File::options().write(true).create_new(true).open(path).map_err(io)?;
    let mut out = Hashing { inner: BufWriter::with_capacity(1 << 20, file), hasher: Xxh3Default::new(), bytes: 0 };
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let mut buf = Vec::with_capacity(CHUNK * 8);
    for t in tensors {
        match t.values {
            Values::F32(v) => {
                for chunk in v.chunks(CHUNK) {
                    buf.clear();
                    buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    out.write_all(&buf).map_err(io)?;
                }
            }
            Values::U64(v) => {
                for chunk in v.chunks(CHUNK) {
                    buf.clear();
                    buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    out.write_all(&buf).map_err(io)?;
                }
            }
            Values::U32(v) => {
                for chunk in v.chunks(CHUNK) {
                    buf.clear();
                    buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    out.write_all(&buf).map_err(io)?;
                }
            }
        }
    }
    let Hashing { inner, hasher, bytes } = out;
    let file = inner.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(FileEntry { bytes, xxh3_128: format!("{:032x}", hasher.digest128()) })
}

/// The names that more than one of `tensors` has, each once, in the order of their first
/// repetition.
fn repeated_names<'a>(tensors: &'a [Tensor<'_>]) -> Vec<&'a str> {
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    let mut repeated: Vec<&str> = Vec::new();
    for t in tensors {
        if !seen.insert(t.name.as_str()) && !repeated.contains(&t.name.as_str()) {
            repeated.push(&t.name);
        }
    }
    repeated
}

/// xxh3-128 of `bytes`, as written in manifests.
pub(crate) fn checksum(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// Why a checkpoint's safetensors file does not hold what a checkpoint needs; each names
/// the tensor or metadata key at fault.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// The bytes are not a safetensors file (bad header, offsets out of range, truncated).
    #[error("not a safetensors file: {0}")]
    Format(#[source] safetensors::SafeTensorError),
    /// A metadata key the checkpoint writes is absent.
    #[error("metadata `{key}` is missing")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A metadata value that must be a number is not one.
    #[error("metadata `{key}` is `{value}`, not a number")]
    NotANumber {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A tensor the checkpoint writes is absent.
    #[error("tensor `{name}` is missing")]
    MissingTensor {
        /// The tensor.
        name: String,
    },
    /// A tensor has another element type or shape than expected.
    #[error("tensor `{name}` is {dtype:?} {shape:?}, expected {expected_dtype:?} {expected_shape:?}")]
    WrongTensor {
        /// The tensor.
        name: String,
        /// Its element type.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// The element type expected.
        expected_dtype: Dtype,
        /// The shape expected.
        expected_shape: Vec<usize>,
    },
    /// A tensor that must be one-dimensional is not.
    #[error("tensor `{name}` has shape {shape:?}, expected one dimension")]
    NotOneDimensional {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A `u64` tensor holding 32-bit counters has a value above `u32::MAX`.
    #[error("tensor `{name}` holds {value}, above u32")]
    AboveU32 {
        /// The tensor.
        name: String,
        /// The value.
        value: u64,
    },
    /// The dense optimizer named in the metadata is not one this build knows.
    #[error("unknown dense optimizer `{name}`")]
    UnknownOptimizer {
        /// The name in the metadata.
        name: String,
    },
    /// The dense optimizer's state does not fit its parameters.
    #[error("{0}")]
    OptimizerState(#[source] tiderec_operators::OperatorError),
    /// A shard file was written by another worker, worker count or step than the manifest's.
    #[error(
        "written by worker {worker} of {workers} at step {step}, expected worker {expected_worker} of \
         {expected_workers} at step {expected_step}"
    )]
    WrongWriter {
        /// The worker in the file's metadata.
        worker: u64,
        /// The worker count in the file's metadata.
        workers: u64,
        /// The step in the file's metadata.
        step: u64,
        /// The worker of this shard file's name.
        expected_worker: u64,
        /// The manifest's worker count.
        expected_workers: u64,
        /// The manifest's step.
        expected_step: u64,
    },
}

/// A parsed safetensors file with typed, checked accessors; errors name the tensor.
pub(crate) struct Reader<'a> {
    tensors: SafeTensors<'a>,
    metadata: HashMap<String, String>,
}

impl<'a> Reader<'a> {
    /// Parses `bytes` (the header and the offsets are validated by the crate).
    pub fn new(bytes: &'a [u8]) -> Result<Self, TensorError> {
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(TensorError::Format)?;
        let metadata = meta.metadata().clone().unwrap_or_default();
        let tensors = SafeTensors::deserialize(bytes).map_err(TensorError::Format)?;
        Ok(Reader { tensors, metadata })
    }

    /// A metadata value parsed as a number.
    pub fn number(&self, key: &str) -> Result<u64, TensorError> {
        let v = self.text(key)?;
        v.parse().map_err(|_| TensorError::NotANumber { key: key.into(), value: v.into() })
    }

    /// A metadata value.
    pub fn text(&self, key: &str) -> Result<&str, TensorError> {
        self.metadata.get(key).map(String::as_str).ok_or_else(|| TensorError::MissingMetadata { key: key.into() })
    }

    fn raw(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&'a [u8], TensorError> {
        let t = self.tensors.tensor(name).map_err(|_| TensorError::MissingTensor { name: name.into() })?;
        if t.dtype() != dtype || t.shape() != shape {
            return Err(TensorError::WrongTensor {
                name: name.into(),
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                expected_dtype: dtype,
                expected_shape: shape.to_vec(),
            });
        }
        Ok(t.data())
    }

    /// Tensor `name`, which must be F32 of `shape`.
    pub fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, TensorError> {
        let raw = self.raw(name, Dtype::F32, shape)?;
        Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// Tensor `name`, which must be U64 of `shape`.
    pub fn u64s(&self, name: &str, shape: &[usize]) -> Result<Vec<u64>, TensorError> {
        let raw = self.raw(name, Dtype::U64, shape)?;
        Ok(raw.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
    }

    /// Tensor `name`, which must be U32 of `shape`.
    pub fn u32s(&self, name: &str, shape: &[usize]) -> Result<Vec<u32>, TensorError> {
        let raw = self.raw(name, Dtype::U32, shape)?;
        Ok(raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>, TensorError> {
        Ok(self.tensors.tensor(name).map_err(|_| TensorError::MissingTensor { name: name.into() })?.shape().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_file_is_read_by_the_crate_and_checksummed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let big: Vec<f32> = (0..40_000).map(|i| i as f32 * 0.5 - 3.0).collect(); // several chunks
        let ids: Vec<u64> = vec![1, u64::MAX, 7];
        let empty: Vec<f32> = Vec::new();
        let tensors = [
            Tensor { name: "big".into(), shape: vec![10_000, 4], values: Values::F32(&big) },
            Tensor { name: "ids".into(), shape: vec![3], values: Values::U64(&ids) },
            Tensor { name: "none".into(), shape: vec![0, 4], values: Values::F32(&empty) },
        ];
        let meta = HashMap::from([("step".to_string(), "12".to_string())]);
        let entry = write(&path, &tensors, meta).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(entry.bytes, bytes.len() as u64);
        assert_eq!(entry.xxh3_128, checksum(&bytes));
        let r = Reader::new(&bytes).unwrap();
        assert_eq!(r.number("step").unwrap(), 12);
        assert_eq!(r.f32s("big", &[10_000, 4]).unwrap(), big);
        assert_eq!(r.u64s("ids", &[3]).unwrap(), ids);
        assert_eq!(r.f32s("none", &[0, 4]).unwrap(), empty);
        assert!(r.f32s("ids", &[3]).unwrap_err().to_string().contains("expected F32"));
        assert!(r.f32s("big", &[4, 10_000]).unwrap_err().to_string().contains("[10000, 4]"));
        assert!(r.u64s("gone", &[1]).unwrap_err().to_string().contains("`gone` is missing"));
        assert!(r.number("nope").is_err());
        // The crate reads it too, and refuses a truncated copy.
        assert_eq!(SafeTensors::deserialize(&bytes).unwrap().len(), 3);
        assert!(Reader::new(&bytes[..bytes.len() - 1]).is_err());
        // Files are never overwritten.
        assert!(write(&path, &tensors, HashMap::new()).unwrap_err().to_string().contains("t.safetensors"));
    }

    /// Two tensors of one name are refused by name, without creating the file (the
    /// `safetensors` crate takes them and then fails while serializing).
    #[test]
    fn a_repeated_tensor_name_is_refused_before_the_file_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let (a, b) = ([1.0f32, 2.0], [3.0f32]);
        let tensors = [
            Tensor { name: "first_order.cross_0".into(), shape: vec![2, 1], values: Values::F32(&a) },
            Tensor { name: "first_order.b".into(), shape: vec![1, 1], values: Values::F32(&b) },
            Tensor { name: "first_order.cross_0".into(), shape: vec![1, 1], values: Values::F32(&b) },
        ];
        let e = write(&path, &tensors, HashMap::new()).unwrap_err();
        assert!(matches!(e, SinkError::Checkpoint { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("`first_order.cross_0`") && !text.contains("`first_order.b`"), "{text}");
        assert!(!path.exists());
    }

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<f32> = vec![1.0, 2.0];
        let tensors = [Tensor { name: "v".into(), shape: vec![2], values: Values::F32(&values) }];
        let mut files = Vec::new();
        // Every `HashMap` gets its own hash keys, so its order differs between maps.
        for k in 0..8 {
            let meta: HashMap<String, String> = (0..16).map(|i| (format!("key{i}"), i.to_string())).collect();
            let path = dir.path().join(format!("{k}.safetensors"));
            write(&path, &tensors, meta).unwrap();
            files.push(std::fs::read(&path).unwrap());
        }
        assert!(files.iter().all(|f| f == &files[0]));
    }
}
