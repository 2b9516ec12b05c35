//! Finding a device, probing the CUDA libraries first, and the per-process
//! cache of compiled kernels.

use crate::kernels::{nvrtc_version, real_arch, MIN_CAPABILITY, SOURCES};
use crate::GpuError;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tiderec_operators::nn::Precision;

/// The file names cudarc tries for library `name` (`cuda`, `nvrtc`, `cublas`).
/// Each name once, in the order cudarc tries them.
fn candidates(names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in names.iter().flat_map(|n| cudarc::get_lib_name_candidates(n)) {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// True when the CUDA driver library can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: loads (and drops) a shared library by name; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when NVRTC can be loaded (kernels can then be compiled, with or without a driver).
pub fn nvrtc_available() -> bool {
    // SAFETY: as in `driver_available`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// True when cuBLAS can be loaded.
pub fn cublas_available() -> bool {
    // SAFETY: as in `driver_available`.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// The error for a missing NVRTC, naming the files tried.
pub fn nvrtc_missing() -> GpuError {
    GpuError::LibraryMissing { library: "nvrtc", searched: candidates(&["nvrtc"]) }
}

/// The kernels of every source file, loaded into one device's primary context.
#[derive(Debug)]
pub(crate) struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Compiles every source to a cubin for the device's own `sm_XY` (all at
    /// once, each on a thread of its own, or from the cache of compiled
    /// kernels, [`crate::cubin_cache`]) and loads it. A module the driver
    /// refuses is reported with NVRTC's and the driver's CUDA versions, the
    /// usual cause.
    fn build(ctx: &Arc<CudaContext>, major: i32, minor: i32) -> Result<Kernels, GpuError> {
        let arch = real_arch(major, minor);
        let dir = crate::cubin_cache::cache_dir();
        let cubins = crate::cubin_cache::cubins(&arch, dir.as_deref())?;
        let mut functions = HashMap::new();
        for (source, (cubin, cached)) in SOURCES.iter().zip(cubins) {
            let refused = |e: cudarc::driver::DriverError| GpuError::Driver {
                during: "loading a compiled kernel module",
                message: format!("{}: {e:?} ({})", source.file, versions()),
            };
            let module = match ctx.load_module(Ptx::from_binary(cubin)) {
                Ok(module) => module,
                // A cubin from the cache the driver refuses is compiled again once and
                // replaced there; one compiled just now would only be refused again.
                Err(_) if cached => {
                    let fresh = crate::cubin_cache::recompile(source, &arch, dir.as_deref())?;
                    ctx.load_module(Ptx::from_binary(fresh)).map_err(refused)?
                }
                Err(e) => return Err(refused(e)),
            };
            for &name in source.functions {
                let f = module.load_function(name).map_err(GpuError::driver("finding a kernel in its module"))?;
                functions.insert(name, f);
            }
        }
        Ok(Kernels { functions })
    }
}

/// "NVRTC X.Y, driver for CUDA A.B": what decides whether a module loads.
fn versions() -> String {
    let nvrtc = nvrtc_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|_| "unknown".into());
    let mut driver = 0;
    // SAFETY: one out-pointer to a live integer; the driver library is loaded.
    let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    format!("kernels compiled by NVRTC {nvrtc}, driver for CUDA {}.{}", driver / 1000, (driver % 1000) / 10)
}

/// Compiled kernels per device ordinal: each device's sources are compiled
/// and loaded once per process, on the first [`Device::open`] of it.
fn kernel_cache() -> &'static Mutex<HashMap<usize, Arc<Kernels>>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// An open CUDA device: its context, a stream of its own, a cuBLAS handle on
/// that stream (exact fp32 unless [`with_precision`](Device::with_precision)
/// says otherwise), and the compiled kernels. Every operation of this crate
/// runs on the device's stream in the order it is called.
#[derive(Clone, Debug)]
pub struct Device {
    ordinal: usize,
    capability: (i32, i32),
    pub(crate) precision: Precision,
    pub(crate) staging: Arc<Mutex<crate::tensor_core::Staging>>,
    /// The column reductions' partial sums (`nn::linear::column_reduce`),
    /// kept between calls: every use is queued on `stream`, in order.
    pub(crate) reduce_scratch: Arc<Mutex<Option<CudaSlice<f32>>>>,
    /// A word that stays zero: the skip flag of updates nothing may skip
    /// (`sparse_update_rows` and the dense optimizers take one).
    pub(crate) never: Arc<CudaSlice<u32>>,
    /// Device buffers allocated so far through this device and its clones: a
    /// CUDA graph captured before the count last changed may name a buffer
    /// since freed (see [`allocations`](Device::allocations)).
    allocations: Arc<AtomicU64>,
    /// The cuBLAS handle's own workspace, set before a CUDA graph is captured
    /// ([`fix_blas_workspace`](Device::fix_blas_workspace)).
    blas_workspace: Arc<Mutex<Option<CudaSlice<u8>>>>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: Arc<CudaBlas>,
    pub(crate) kernels: Arc<Kernels>,
}

impl Device {
    /// Opens device `ordinal`. Probes the driver, the device count, NVRTC and
    /// cuBLAS before any CUDA call, so a machine without them gets an error,
    /// never a panic.
    pub fn open(ordinal: usize) -> Result<Device, GpuError> {
        if !driver_available() {
            return Err(GpuError::NoDriver { searched: candidates(&["cuda", "nvcuda"]) });
        }
        let count = match CudaContext::device_count() {
            Ok(n) => n.max(0) as usize,
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
            Err(e) => return Err(GpuError::driver("initialising the driver and counting its devices")(e)),
        };
        if ordinal >= count {
            return Err(GpuError::NoDevice { ordinal, count });
        }
        if !nvrtc_available() {
            return Err(nvrtc_missing());
        }
        if !cublas_available() {
            return Err(GpuError::LibraryMissing { library: "cublas", searched: candidates(&["cublas"]) });
        }
        let ctx = CudaContext::new(ordinal).map_err(GpuError::driver("creating the device context"))?;
        let (major, minor) = ctx.compute_capability().map_err(GpuError::driver("reading the compute capability"))?;
        if (major, minor) < MIN_CAPABILITY {
            return Err(GpuError::UnsupportedDevice { ordinal, major, minor });
        }
        let kernels = {
            let mut cache = kernel_cache().lock().unwrap_or_else(|p| p.into_inner());
            match cache.get(&ordinal) {
                Some(k) => k.clone(),
                None => {
                    let k = Arc::new(Kernels::build(&ctx, major, minor)?);
                    cache.insert(ordinal, k.clone());
                    k
                }
            }
        };
        // Each device buffer lives and is used on the stream of the `Device`
        // that allocated it, so cudarc's cross-stream event tracking (two
        // events per allocation, a wait and a record per kernel argument) is
        // pure cost. Off before any buffer of this context exists.
        // SAFETY: no buffer crosses streams (see above).
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx)?;
        let stream = ctx.new_stream().map_err(GpuError::driver("creating a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(GpuError::blas("creating the cuBLAS handle"))?;
        // Pedantic math: plain fp32 products, no TF32 or other reduced precision.
        // SAFETY: the handle is valid (just created) and used by this device only.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *blas.handle(),
                cudarc::cublas::sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
            )
        }
        .result()
        .map_err(GpuError::blas("setting the fp32 math mode"))?;
        let never = stream.alloc_zeros::<u32>(1).map_err(GpuError::driver("allocating device memory"))?;
        Ok(Device {
            ordinal,
            capability: (major, minor),
            precision: Precision::Fp32,
            staging: Arc::default(),
            reduce_scratch: Arc::default(),
            never: Arc::new(never),
            allocations: Arc::default(),
            blas_workspace: Arc::default(),
            stream,
            blas: Arc::new(blas),
            kernels,
        })
    }

    /// This device with its GEMMs in `precision`: `fp32` (the default) is
    /// exact fp32 in pedantic math; `tf32` and `bf16` run every GEMM on the
    /// tensor cores with both operands rounded to TF32 or bf16, fp32
    /// accumulation and fp32 results: bf16 operands are rounded to nearest
    /// (ties to even) into staging buffers, tf32 ones by cuBLAS, and operands
    /// or results whose rows are not 16-byte aligned are staged in aligned
    /// rows, so odd widths stay on the tensor cores. Every other
    /// kernel, the loss, the optimizers and the rows stay fp32. A reduced
    /// precision gets a cuBLAS handle and staging buffers of its own on the
    /// same stream, so the devices it was cloned from keep exact fp32.
    pub fn with_precision(self, precision: Precision) -> Result<Device, GpuError> {
        if precision == self.precision {
            return Ok(self);
        }
        let blas = CudaBlas::new(self.stream.clone()).map_err(GpuError::blas("creating the cuBLAS handle"))?;
        let mode = match precision {
            Precision::Fp32 => cudarc::cublas::sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
            Precision::Tf32 | Precision::Bf16 => cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: the handle is valid (just created) and used by this device only.
        unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }
            .result()
            .map_err(GpuError::blas("setting the math mode"))?;
        Ok(Device { precision, blas: Arc::new(blas), staging: Arc::default(), blas_workspace: Arc::default(), ..self })
    }

    /// The precision of the device's GEMMs (see [`with_precision`](Self::with_precision)).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Number of visible devices: 0 without a driver (or when the driver
    /// reports an error, e.g. no device at all).
    pub fn count() -> usize {
        if !driver_available() {
            return 0;
        }
        CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The stream every operation runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn function(&self, name: &'static str) -> &CudaFunction {
        // Every name asked for is listed in `SOURCES` and loaded in `Kernels::build`
        // (the compile test checks the lists against the PTX).
        &self.kernels.functions[name]
    }

    /// Copies `host` to a new device buffer (an empty slice gets a one-element
    /// buffer, since CUDA cannot allocate zero bytes; shapes are passed apart).
    pub fn upload<T: DeviceRepr + ValidAsZeroBits + Copy>(&self, host: &[T]) -> Result<CudaSlice<T>, GpuError> {
        let mut dev = self.zeros::<T>(host.len())?;
        if !host.is_empty() {
            self.stream.memcpy_htod(host, &mut dev).map_err(GpuError::driver("copying to the device"))?;
        }
        Ok(dev)
    }

    /// A zeroed device buffer of `len` values (at least one, as in [`upload`](Self::upload)).
    /// Refused while the stream captures a CUDA graph: a buffer allocated in a
    /// capture exists only in that graph, and one kept after a capture that is
    /// thrown away would point at nothing.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>, GpuError> {
        self.refuse_while_capturing()?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.stream.alloc_zeros::<T>(len.max(1)).map_err(GpuError::driver("allocating device memory"))
    }

    /// An error while the stream captures a CUDA graph: no buffer may be
    /// allocated or freed then (see [`zeros`](Self::zeros)). Asks the stream
    /// directly, so an error the context recorded earlier is left for the next
    /// call that checks it.
    fn refuse_while_capturing(&self) -> Result<(), GpuError> {
        use cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is this device's own and lives as long as `self`.
        let status = unsafe { cudarc::driver::result::stream::is_capturing(self.stream.cu_stream()) };
        // An active capture, or one a failed call invalidated and not yet ended: a free
        // then would fail and leave its error in the context for an unrelated call.
        if matches!(status, Ok(s) if s != CU_STREAM_CAPTURE_STATUS_NONE) {
            return Err(GpuError::shape("device memory", "a buffer was asked for while a CUDA graph was captured"));
        }
        Ok(())
    }

    /// How many device buffers this device and its clones have allocated.
    /// Every buffer of this crate is allocated through [`zeros`](Self::zeros),
    /// so while the count stays the same no buffer was replaced, and a CUDA
    /// graph captured since still names live buffers.
    pub(crate) fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Gives the cuBLAS handle a workspace of its own (once), so a GEMM
    /// captured in a CUDA graph uses memory this device owns and allocates
    /// nothing while the stream captures.
    pub(crate) fn fix_blas_workspace(&self) -> Result<(), GpuError> {
        /// cuBLAS's recommended workspace on Hopper, more than enough elsewhere.
        const BYTES: usize = 32 << 20;
        let mut slot = self.blas_workspace.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let buf = self.zeros::<u8>(BYTES)?;
        let ptr = cudarc::driver::DevicePtr::device_ptr(&buf, &self.stream).0;
        // SAFETY: the handle is valid and used on this device's stream only; the
        // buffer holds BYTES bytes and lives as long as the handle (kept beside it).
        unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*self.blas.handle(), ptr as *mut std::ffi::c_void, BYTES) }
            .result()
            .map_err(GpuError::blas("setting the cuBLAS workspace"))?;
        *slot = Some(buf);
        Ok(())
    }

    /// `slot` holding at least `len` values: a zeroed buffer when it is empty or
    /// too short, else the buffer it holds, contents kept. Step workspaces live
    /// in such slots, so a step allocates only when a batch is larger than any before.
    pub(crate) fn grown<'a, T: DeviceRepr + ValidAsZeroBits>(
        &self,
        slot: &'a mut Option<CudaSlice<T>>,
        len: usize,
    ) -> Result<&'a mut CudaSlice<T>, GpuError> {
        if slot.as_ref().is_none_or(|s| s.len() < len) {
            // Refused before the old buffer is freed: a free is no more allowed in a capture.
            self.refuse_while_capturing()?;
            *slot = None;
            *slot = Some(self.zeros::<T>(len)?);
        }
        Ok(slot.as_mut().expect("filled above"))
    }

    /// `slot` grown to hold `host` (see [`grown`](Self::grown)), with `host` copied
    /// to its front on the stream: a reused buffer, so a call allocates only when
    /// it is larger than any before.
    pub(crate) fn upload_into<'a, T: DeviceRepr + ValidAsZeroBits>(
        &self,
        slot: &'a mut Option<CudaSlice<T>>,
        host: &[T],
    ) -> Result<&'a mut CudaSlice<T>, GpuError> {
        let buf = self.grown(slot, host.len())?;
        if !host.is_empty() {
            self.stream
                .memcpy_htod(host, &mut buf.slice_mut(..host.len()))
                .map_err(GpuError::driver("copying to the device"))?;
        }
        Ok(buf)
    }

    /// Copies the first `len` values of `dev` to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        if len > dev.len() {
            return Err(GpuError::shape("download", format!("{len} values asked from a buffer of {}", dev.len())));
        }
        let mut host = vec![T::default(); len];
        if len > 0 {
            self.stream
                .memcpy_dtoh(&dev.slice(..len), &mut host)
                .map_err(GpuError::driver("copying from the device"))?;
        }
        self.synchronize()?;
        Ok(host)
    }

    /// Waits until every operation queued on the device's stream has finished.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(GpuError::driver("waiting for the stream"))
    }
}

/// Lets the device's default memory pool keep what a stream frees instead of
/// handing it back at every synchronisation (its release threshold is 0 by
/// default), so buffers freed and allocated again step after step cost no
/// mapping.
fn keep_freed_memory(ctx: &std::sync::Arc<CudaContext>) -> Result<(), GpuError> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the context is current (bound when created); `pool` and `threshold`
    // outlive the calls; the attribute takes a u64.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .map_err(GpuError::driver("finding the device's memory pool"))?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .map_err(GpuError::driver("setting the memory pool's release threshold"))
    }
}
