//! Staging a batch for the device-resident worker: the host writes its row
//! numbers, bag offsets, entry weights, dense values and labels straight into
//! pinned memory, and a copy stream uploads them while the compute stream may
//! still be running the step before.
//!
//! ## Invariants
//!
//! * Two slots take turns. The copy stream writes a slot's device buffers
//!   only after the compute stream has finished the last step that read them
//!   (the slot's `consumed` event), and the compute stream reads them only
//!   after those copies (`uploaded`).
//! * The host rewrites a slot's pinned memory only after the copies out of it
//!   are done (it waits for `uploaded`).
//! * Memory grows only for a batch larger than any before it in its slot: a
//!   stream of equal batches allocates in its first two steps only.

use super::host;
use crate::model::Buffer;
use crate::{Device, GpuError};
use cudarc::driver::{result, sys, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use std::sync::Arc;
use tiderec_operators::Batch;

/// The shape of a staged batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    /// Samples.
    pub(super) batch: usize,
    /// Sparse fields.
    pub(super) fields: usize,
    /// Entries (ids) over every field.
    pub(super) entries: usize,
    /// Some field has entry weights (the weights buffer holds one per entry).
    pub(super) weighted: bool,
    /// Behaviour sequences (0 for a model without them).
    pub(super) sequences: usize,
    /// Steps of the longest sequence.
    pub(super) steps: usize,
    /// Ids over every sequence (their rows follow the fields' `entries`).
    pub(super) seq_entries: usize,
}

/// One staged batch on the device.
pub(super) struct Slot {
    pinned: PinnedBatch,
    /// Global row numbers, field-major, then the sequences' in bag order.
    pub(super) rows: Buffer<u32>,
    /// `fields · batch + 1` bag offsets into `rows`.
    pub(super) offsets: Buffer<u32>,
    /// One weight per entry when `shape.weighted`.
    pub(super) weights: Buffer,
    pub(super) dense: Buffer,
    pub(super) labels: Buffer,
    /// `steps · sequences · batch + 1` offsets of the sequences' one-step bags into `rows`.
    pub(super) seq_offsets: Buffer<u32>,
    /// Each sample's sequence length.
    pub(super) lengths: Buffer<u32>,
    pub(super) shape: Shape,
    uploaded: CudaEvent,
    consumed: CudaEvent,
}

/// A batch's upload in page-locked host memory.
#[derive(Default)]
struct PinnedBatch {
    rows: Pinned<u32>,
    offsets: Pinned<u32>,
    weights: Pinned<f32>,
    dense: Pinned<f32>,
    labels: Pinned<f32>,
    seq_offsets: Pinned<u32>,
    lengths: Pinned<u32>,
}

/// Two slots and the copy stream that fills them (see the module docs).
pub(super) struct Staging {
    copy: Arc<CudaStream>,
    slots: [Slot; 2],
    /// The slot the next [`stage`](Self::stage) fills.
    next: usize,
    /// The slot staged and not yet taken.
    staged: Option<usize>,
    /// The slot taken last (read by the compute stream).
    current: usize,
    /// Recorded on the compute stream after device buffers grew there.
    grown: CudaEvent,
}

impl Staging {
    pub(super) fn new(dev: &Device) -> Result<Self, GpuError> {
        let ctx = dev.stream.context();
        let copy = ctx.new_stream().map_err(GpuError::driver("creating the copy stream"))?;
        let event = || ctx.new_event(None).map_err(GpuError::driver("creating a staging event"));
        let slot = || -> Result<Slot, GpuError> {
            Ok(Slot {
                pinned: PinnedBatch::default(),
                rows: Buffer::new(dev)?,
                offsets: Buffer::new(dev)?,
                weights: Buffer::new(dev)?,
                dense: Buffer::new(dev)?,
                labels: Buffer::new(dev)?,
                seq_offsets: Buffer::new(dev)?,
                lengths: Buffer::new(dev)?,
                shape: Shape::default(),
                uploaded: event()?,
                consumed: event()?,
            })
        };
        Ok(Staging { slots: [slot()?, slot()?], next: 0, staged: None, current: 0, grown: event()?, copy })
    }

    /// Builds `batch`'s upload in the next slot's pinned memory (global rows
    /// from `bases`, each id checked below its table's size; sequence `j` over
    /// table `seq_tables[j]`) and starts copying it on the copy stream. A batch
    /// staged before and not taken is dropped.
    pub(super) fn stage(
        &mut self,
        dev: &Device,
        batch: &Batch,
        (sizes, bases, seq_tables): (&[u64], &[u64], &[usize]),
    ) -> Result<Shape, GpuError> {
        self.unstage();
        let layout = host::layout(batch)?;
        let (b, f, nd) = (batch.len(), batch.sparse.len(), batch.num_dense);
        let shape = Shape {
            batch: b,
            fields: f,
            entries: layout.entries,
            weighted: layout.weighted,
            sequences: batch.sequences.len(),
            steps: layout.steps,
            seq_entries: layout.seq_entries,
        };
        let all = shape.entries + shape.seq_entries;
        let (seq_offsets_len, lengths_len) =
            if shape.sequences > 0 { (shape.steps * shape.sequences * b + 1, b) } else { (0, 0) };
        let k = self.next;
        let slot = &mut self.slots[k];
        slot.uploaded.synchronize().map_err(GpuError::driver("waiting for a slot's last upload"))?;
        let p = &mut slot.pinned;
        let n_weights = if shape.weighted { shape.entries } else { 0 };
        let offsets_len = f * b + 1;
        let (field_rows, seq_rows) = p.rows.front(dev, all)?.split_at_mut(shape.entries);
        host::fill(
            batch,
            sizes,
            bases,
            host::Out {
                rows: field_rows,
                offsets: p.offsets.front(dev, offsets_len)?,
                weights: p.weights.front(dev, n_weights)?,
            },
        )?;
        host::fill_sequences(
            batch,
            (seq_tables, sizes, bases),
            (shape.entries, shape.steps),
            host::SeqOut {
                rows: seq_rows,
                offsets: p.seq_offsets.front(dev, seq_offsets_len)?,
                lengths: p.lengths.front(dev, lengths_len)?,
            },
        )?;
        p.dense.front(dev, b * nd)?.copy_from_slice(&batch.dense[..b * nd]);
        p.labels.front(dev, b)?.copy_from_slice(&batch.labels[..b]);
        let mut grew = false;
        for (buf, len) in [
            (&mut slot.rows, all.max(1)),
            (&mut slot.offsets, offsets_len),
            (&mut slot.seq_offsets, seq_offsets_len.max(1)),
            (&mut slot.lengths, lengths_len.max(1)),
        ] {
            grew |= grow(buf, dev, len)?;
        }
        for (buf, len) in
            [(&mut slot.weights, n_weights.max(1)), (&mut slot.dense, (b * nd).max(1)), (&mut slot.labels, b.max(1))]
        {
            grew |= grow(buf, dev, len)?;
        }
        if grew {
            // The new buffers were allocated on the compute stream: the copies wait for them.
            self.grown.record(&dev.stream).map_err(GpuError::driver("recording the staging growth"))?;
            self.copy.wait(&self.grown).map_err(GpuError::driver("ordering the copy stream"))?;
        }
        let copy = &self.copy;
        copy.wait(&slot.consumed).map_err(GpuError::driver("ordering the copy stream"))?;
        let p = &slot.pinned;
        let queued = up(copy, p.rows.first(all), &mut slot.rows.0)
            .and_then(|()| up(copy, p.offsets.first(offsets_len), &mut slot.offsets.0))
            .and_then(|()| up(copy, p.seq_offsets.first(seq_offsets_len), &mut slot.seq_offsets.0))
            .and_then(|()| up(copy, p.lengths.first(lengths_len), &mut slot.lengths.0))
            .and_then(|()| up(copy, p.weights.first(n_weights), &mut slot.weights.0))
            .and_then(|()| up(copy, p.dense.first(b * nd), &mut slot.dense.0))
            .and_then(|()| up(copy, p.labels.first(b), &mut slot.labels.0));
        // Recorded even after a failed copy: the host rewrites this slot's pinned
        // memory only once the copies queued before the failure are done (where
        // the event cannot be recorded, it waits for them here).
        let recorded = slot.uploaded.record(copy).map_err(GpuError::driver("recording a slot's upload"));
        if recorded.is_err() {
            let _ = copy.synchronize();
        }
        queued.and(recorded)?;
        slot.shape = shape;
        self.staged = Some(k);
        self.next = 1 - k;
        Ok(shape)
    }

    /// Drops the batch staged and not taken, if any (its slot is staged again later).
    pub(super) fn unstage(&mut self) {
        self.staged = None;
    }

    /// Waits for the copy stream (for timing the upload).
    pub(super) fn synchronize(&self) -> Result<(), GpuError> {
        self.copy.synchronize().map_err(GpuError::driver("waiting for the copy stream"))
    }

    /// The staged slot, from now on the current one: the compute stream waits
    /// for its copies. Fails when nothing is staged.
    pub(super) fn take(&mut self, dev: &Device) -> Result<&Slot, GpuError> {
        let k = self.staged.take().ok_or_else(|| GpuError::shape("resident step", "no batch is staged"))?;
        dev.stream.wait(&self.slots[k].uploaded).map_err(GpuError::driver("ordering the compute stream"))?;
        self.current = k;
        Ok(&self.slots[k])
    }

    /// The current slot (the last one taken).
    pub(super) fn current(&self) -> &Slot {
        &self.slots[self.current]
    }

    /// Which of the two slots is the current one.
    pub(super) fn current_slot(&self) -> usize {
        self.current
    }

    /// Marks the current slot free once the work queued so far on the compute stream is done.
    pub(super) fn release(&mut self, dev: &Device) -> Result<(), GpuError> {
        self.slots[self.current].consumed.record(&dev.stream).map_err(GpuError::driver("recording a slot's use"))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The pinned memory is freed with the slots: no copy may still read it.
        let _ = self.copy.synchronize();
    }
}

/// Makes `buf` hold at least `len` values (on the compute stream); whether it grew.
fn grow<T: DeviceRepr + ValidAsZeroBits>(buf: &mut Buffer<T>, dev: &Device, len: usize) -> Result<bool, GpuError> {
    let grew = buf.0.len() < len;
    buf.reserve(dev, len)?;
    Ok(grew)
}

/// Queues a copy of `src` to the front of `dst` on `stream`.
fn up<T: DeviceRepr>(stream: &CudaStream, src: &[T], dst: &mut CudaSlice<T>) -> Result<(), GpuError> {
    if src.is_empty() {
        return Ok(());
    }
    if dst.len() < src.len() {
        return Err(GpuError::shape("resident batch", format!("{} values for a buffer of {}", src.len(), dst.len())));
    }
    let (ptr, _record) = dst.device_ptr_mut(stream);
    // SAFETY: `dst` holds at least src.len() values; `src` is pinned memory the
    // host leaves alone until the slot's `uploaded` event, recorded after this copy.
    unsafe { result::memcpy_htod_async(ptr, src, stream.cu_stream()) }
        .map_err(GpuError::driver("copying a batch to the device"))
}

/// Page-locked host memory for `T` values, grown on demand (without keeping
/// its contents) and freed on drop.
struct Pinned<T> {
    ptr: *mut T,
    cap: usize,
}

impl<T> Default for Pinned<T> {
    fn default() -> Self {
        Pinned { ptr: std::ptr::null_mut(), cap: 0 }
    }
}

// SAFETY: the memory is owned by this value alone; the host touches it only through `&mut self`.
unsafe impl<T: Send> Send for Pinned<T> {}

impl<T: DeviceRepr + ValidAsZeroBits> Pinned<T> {
    /// The first `len` values, for writing (grows to hold them).
    fn front(&mut self, dev: &Device, len: usize) -> Result<&mut [T], GpuError> {
        if len > self.cap {
            self.free();
            dev.stream.context().bind_to_thread().map_err(GpuError::driver("binding the device context"))?;
            let bytes = len
                .checked_mul(std::mem::size_of::<T>())
                .ok_or_else(|| GpuError::shape("resident batch", format!("{len} values overflow the address space")))?;
            // SAFETY: a plain allocation; write-combined suits memory the host only writes.
            let ptr = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_WRITECOMBINED) }
                .map_err(GpuError::driver("allocating pinned host memory"))? as *mut T;
            // SAFETY: `ptr` holds `bytes` bytes; all-zero bytes are a valid `T`.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
            (self.ptr, self.cap) = (ptr, len);
        }
        Ok(self.first_mut(len))
    }

    fn first_mut(&mut self, len: usize) -> &mut [T] {
        if len == 0 {
            return &mut [];
        }
        // SAFETY: `len <= cap` (callers grow first), the memory is initialised and owned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    /// The first `len` values (`len` no more than the last [`front`](Self::front)).
    fn first(&self, len: usize) -> &[T] {
        if len == 0 {
            return &[];
        }
        assert!(len <= self.cap, "pinned read past its capacity");
        // SAFETY: `len <= cap`, the memory is initialised and owned.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

impl<T> Pinned<T> {
    fn free(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by malloc_host, freed once; no copy reads it (see the callers).
            let _ = unsafe { result::free_host(self.ptr.cast()) };
            (self.ptr, self.cap) = (std::ptr::null_mut(), 0);
        }
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        self.free();
    }
}
