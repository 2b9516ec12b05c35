//! Which vector extensions tiderec's kernels may use: the CPU's, detected once,
//! capped by the environment variable `TIDEREC_MAX_ISA`.
//!
//! Every hand-written kernel of tiderec picks its variant at run time (the GEMM
//! panel kernels, the dense optimizers, the bf16 products, the vectorized
//! split). They all ask [`has`], so one setting moves them together, like
//! oneDNN's `ONEDNN_MAX_CPU_ISA` or MKL's `MKL_ENABLE_INSTRUCTIONS`: to
//! reproduce an AVX2-only machine's kernels on an AVX-512 one, or to keep
//! 512-bit instructions (and their clock penalty on some CPUs) out of a run.
//!
//! | `TIDEREC_MAX_ISA` | kernels may use |
//! |---|---|
//! | `native` (default; also unset or empty) | every extension the CPU has |
//! | `amx` | AVX2, FMA, AVX-512 and AMX-BF16 tiles (today the same as `native`) |
//! | `avx512` | AVX2, FMA and AVX-512 (F, BW, DQ, VL, VNNI, BF16): no AMX tile products |
//! | `avx2` | AVX2 and FMA: no AVX-512 kernel, no bf16 products |
//! | `portable` | none: the portable kernels, as on a CPU without AVX2 |
//!
//! The value is matched without regard to case. A cap never turns on an
//! extension the CPU lacks: `avx512` on an AVX2-only CPU is `native`.
//!
//! # AMX
//! [`Feature::AmxBf16`] counts as detected only when the CPU has AMX-TILE and
//! AMX-BF16, the operating system saves the tile state (`XCR0` bits 17 and 18)
//! and, on Linux, the process was granted the tile data state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once at the
//! first question). [`amx_note`] says which of these failed on a CPU that has
//! AMX but may not use it.
//!
//! # Emulated tiles
//! `TIDEREC_AMX_EMULATE=1` runs the AMX products on a CPU without usable AMX
//! ([`tile_unit`] is then [`TileUnit::Emulated`]): the same packing, blocking,
//! epilogues and packings of the finished blocks, with each 32 × 32 tile block
//! computed in software as `TDPBF16PS` computes it (see `tiderec_nn`'s
//! `gemm_amx`). It is for checking the AMX path where no AMX CPU is at hand,
//! like Intel's Software Development Emulator, and it is slow: a product runs
//! several times slower than on the AVX-512 BF16 kernel. It needs AVX-512 F,
//! BW and BF16 (the packing and the epilogues use them) and a cap that allows `amx`; a CPU
//! with usable AMX runs its tiles whatever the variable says. Unset, empty and
//! `0` leave it off; any other value but `1` is refused as the cap's invalid
//! values are ([`check_amx_emulation`]).
//!
//! # What the cap does not reach
//! * Code the compiler generates: the build targets x86-64-v3, so AVX2 and FMA
//!   run everywhere outside the hand-written kernels, whatever the cap.
//!   `portable` chooses the portable kernels (and with them the summation
//!   classes of a CPU without AVX2); it does not make the binary run on one.
//! * The `gemm` crate (the wide forward products) chooses its own kernels. Built
//!   without its `nightly` feature, as tiderec builds it, it has none above
//!   AVX2 + FMA, so under `avx2` it runs what it runs uncapped (`portable`
//!   does not reach it).
//! * matrixmultiply (the general products) chooses its own kernels too, and its
//!   default `avx512` feature gives it an AVX-512F kernel that it runs on
//!   AVX-512 CPUs whatever the cap. Its kernels compute every entry as the same
//!   chain of fused multiply-adds, so this changes no number, only which
//!   instructions matrixmultiply's share of a step runs.
//!
//! # Invariants
//! * Nothing else in tiderec calls `is_x86_feature_detected!`: [`has`] is the
//!   one answer, fixed for the process (the CPU is probed and the variable read
//!   once, at the first question).
//! * [`has`] answers yes only for an extension the CPU has and the cap allows.
//! * An invalid value is never ignored. [`check`] returns it as a
//!   [`MaxIsaError`]: the `tiderec` binary refuses to start and `Trainer`
//!   refuses to build. Kernels asked without a check run as under `portable`,
//!   the lowest cap, so no extension the variable may have meant to turn off is
//!   used.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use thiserror::Error;

/// The environment variable that caps the extensions (see the module docs).
pub const MAX_ISA_VAR: &str = "TIDEREC_MAX_ISA";

/// The environment variable that runs the AMX products on emulated tiles
/// (see the module docs).
pub const AMX_EMULATE_VAR: &str = "TIDEREC_AMX_EMULATE";

/// A vector extension a tiderec kernel may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    /// 256-bit integer and float vectors.
    Avx2,
    /// Fused multiply-add.
    Fma,
    /// AVX-512 Foundation: 512-bit vectors, 32 registers.
    Avx512F,
    /// AVX-512 byte and word operations.
    Avx512Bw,
    /// AVX-512 doubleword and quadword operations.
    Avx512Dq,
    /// AVX-512 on 128- and 256-bit vectors (32 registers for them).
    Avx512Vl,
    /// AVX-512 vector neural-network instructions.
    Avx512Vnni,
    /// AVX-512 bf16 conversions and dot products.
    Avx512Bf16,
    /// AMX tiles with bf16 dot products (AMX-TILE and AMX-BF16, enabled by the
    /// operating system for this process: see the module docs).
    AmxBf16,
}

impl Feature {
    /// Every feature, in the order reports list them.
    pub const ALL: [Feature; 9] = [
        Feature::Avx2,
        Feature::Fma,
        Feature::Avx512F,
        Feature::Avx512Bw,
        Feature::Avx512Dq,
        Feature::Avx512Vl,
        Feature::Avx512Vnni,
        Feature::Avx512Bf16,
        Feature::AmxBf16,
    ];

    /// The name `is_x86_feature_detected!` and reports use (`avx2`, `avx512f`, …).
    pub fn name(self) -> &'static str {
        match self {
            Feature::Avx2 => "avx2",
            Feature::Fma => "fma",
            Feature::Avx512F => "avx512f",
            Feature::Avx512Bw => "avx512bw",
            Feature::Avx512Dq => "avx512dq",
            Feature::Avx512Vl => "avx512vl",
            Feature::Avx512Vnni => "avx512vnni",
            Feature::Avx512Bf16 => "avx512bf16",
            Feature::AmxBf16 => "amx-bf16",
        }
    }

    /// The lowest cap that allows the feature.
    pub fn level(self) -> MaxIsa {
        match self {
            Feature::Avx2 | Feature::Fma => MaxIsa::Avx2,
            Feature::AmxBf16 => MaxIsa::Amx,
            _ => MaxIsa::Avx512,
        }
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Whether the CPU has the feature (asks the CPU; [`detected`] keeps the answer).
    fn probe(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Feature::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
                Feature::Fma => std::arch::is_x86_feature_detected!("fma"),
                Feature::Avx512F => std::arch::is_x86_feature_detected!("avx512f"),
                Feature::Avx512Bw => std::arch::is_x86_feature_detected!("avx512bw"),
                Feature::Avx512Dq => std::arch::is_x86_feature_detected!("avx512dq"),
                Feature::Avx512Vl => std::arch::is_x86_feature_detected!("avx512vl"),
                Feature::Avx512Vnni => std::arch::is_x86_feature_detected!("avx512vnni"),
                Feature::Avx512Bf16 => std::arch::is_x86_feature_detected!("avx512bf16"),
                Feature::AmxBf16 => amx::probe().is_ok(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The highest extensions the kernels may use, lowest first: a cap allows
/// every feature whose [`Feature::level`] is at most the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MaxIsa {
    /// No vector extension: the portable kernels.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX2, FMA and AVX-512.
    Avx512,
    /// AVX2, FMA, AVX-512 and AMX.
    Amx,
    /// Everything the CPU has (no cap).
    Native,
}

impl MaxIsa {
    /// Every value, lowest first.
    pub const ALL: [MaxIsa; 5] = [MaxIsa::Portable, MaxIsa::Avx2, MaxIsa::Avx512, MaxIsa::Amx, MaxIsa::Native];

    /// The value's spelling in `TIDEREC_MAX_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            MaxIsa::Portable => "portable",
            MaxIsa::Avx2 => "avx2",
            MaxIsa::Avx512 => "avx512",
            MaxIsa::Amx => "amx",
            MaxIsa::Native => "native",
        }
    }

    /// Whether the cap allows `feature` (whether the CPU has it is [`detected`]'s question).
    pub fn allows(self, feature: Feature) -> bool {
        feature.level() <= self
    }

    /// The cap a value of `TIDEREC_MAX_ISA` asks for: `None` (unset) and the
    /// empty value are [`MaxIsa::Native`]; a value is matched without regard to case.
    pub fn from_var(value: Option<&str>) -> Result<MaxIsa, MaxIsaError> {
        match value {
            None | Some("") => Ok(MaxIsa::Native),
            Some(v) => v.parse(),
        }
    }
}

impl fmt::Display for MaxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MaxIsa {
    type Err = MaxIsaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MaxIsa::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| MaxIsaError { value: s.to_string() })
    }
}

/// A value of `TIDEREC_MAX_ISA` that names no cap.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("invalid {MAX_ISA_VAR}={value:?}: accepted values are native, amx, avx512, avx2, portable")]
pub struct MaxIsaError {
    /// The value as set (bytes that are not UTF-8 replaced).
    pub value: String,
}

impl From<MaxIsaError> for crate::ConfigError {
    fn from(e: MaxIsaError) -> Self {
        crate::ConfigError::new(MAX_ISA_VAR, format!("{:?} is not one of native, amx, avx512, avx2, portable", e.value))
    }
}

/// What the process found: the CPU's features, the cap and whether tiles are
/// emulated, read once.
struct Cpu {
    /// Features the CPU has (bits of [`Feature::bit`]).
    detected: u32,
    /// The cap as set.
    cap: Result<MaxIsa, MaxIsaError>,
    /// `TIDEREC_AMX_EMULATE` as set: on or off, or its invalid value.
    emulate: Result<bool, String>,
}

fn cpu() -> &'static Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    CPU.get_or_init(|| {
        let detected = Feature::ALL.iter().filter(|f| f.probe()).fold(0, |m, f| m | f.bit());
        let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let cap = MaxIsa::from_var(var(MAX_ISA_VAR).as_deref());
        Cpu { detected, cap, emulate: emulation_from_var(var(AMX_EMULATE_VAR).as_deref()) }
    })
}

/// Whether a value of `TIDEREC_AMX_EMULATE` turns emulation on: unset, empty
/// and `0` are off, `1` on, anything else the value as an error.
fn emulation_from_var(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(v.to_string()),
    }
}

/// Where the AMX tile products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileUnit {
    /// The CPU's own tiles.
    Hardware,
    /// Tile blocks computed in software (`TIDEREC_AMX_EMULATE=1`; see the module docs).
    Emulated,
}

/// Where the AMX products run: on the CPU's tiles where [`has`]`(AmxBf16)`;
/// emulated where `TIDEREC_AMX_EMULATE=1`, the cap allows `amx` and the
/// packing's and epilogues' AVX-512 F, BW and BF16 are usable; nowhere
/// (`None`) otherwise.
pub fn tile_unit() -> Option<TileUnit> {
    let vector = [Feature::Avx512F, Feature::Avx512Bw, Feature::Avx512Bf16].into_iter().all(has);
    unit_for(has(Feature::AmxBf16), cpu().emulate == Ok(true), max_isa(), vector)
}

/// [`tile_unit`]'s answer from the usable AMX tiles, the emulation asked for,
/// the cap and whether the AVX-512 instructions emulated tiles need are usable.
fn unit_for(tiles: bool, emulate: bool, cap: MaxIsa, vector: bool) -> Option<TileUnit> {
    if tiles {
        Some(TileUnit::Hardware)
    } else if emulate && cap.allows(Feature::AmxBf16) && vector {
        Some(TileUnit::Emulated)
    } else {
        None
    }
}

/// Whether `TIDEREC_AMX_EMULATE` asks for emulated tiles, or the error naming
/// its invalid value. The binary calls it at start and `Trainer` when it is
/// built, beside [`check`].
pub fn check_amx_emulation() -> Result<bool, crate::ConfigError> {
    cpu().emulate.clone().map_err(|value| {
        crate::ConfigError::new(AMX_EMULATE_VAR, format!("{value:?} is not one of 1 (emulate AMX tiles), 0 or empty"))
    })
}

/// The features that both the CPU has (`detected`) and `cap` allows.
fn usable_mask(detected: u32, cap: MaxIsa) -> u32 {
    Feature::ALL.iter().filter(|f| cap.allows(**f)).fold(0, |m, f| m | f.bit()) & detected
}

/// [`has`]'s answers: the usable features' bits, or [`UNSET`] before the first question.
static USABLE: AtomicU32 = AtomicU32::new(UNSET);
const UNSET: u32 = 1 << 31;

/// Whether the kernels may use `feature`: the CPU has it and the cap allows it.
/// Cheap enough for a kernel's dispatch (one relaxed load after the first call).
#[inline]
pub fn has(feature: Feature) -> bool {
    let mut usable = USABLE.load(Ordering::Relaxed);
    if usable == UNSET {
        usable = usable_mask(cpu().detected, max_isa());
        USABLE.store(usable, Ordering::Relaxed);
    }
    usable & feature.bit() != 0
}

/// Whether the CPU has `feature`, whatever the cap.
pub fn detected(feature: Feature) -> bool {
    cpu().detected & feature.bit() != 0
}

/// The cap `TIDEREC_MAX_ISA` sets, or the error naming its invalid value.
/// The binary calls it at start and `Trainer` when it is built.
pub fn check() -> Result<MaxIsa, MaxIsaError> {
    cpu().cap.clone()
}

/// The cap in force: `TIDEREC_MAX_ISA`'s, or [`MaxIsa::Portable`] when its
/// value is invalid (see the module's invariants).
pub fn max_isa() -> MaxIsa {
    cpu().cap.clone().unwrap_or(MaxIsa::Portable)
}

/// The features the kernels may use, in [`Feature::ALL`]'s order.
pub fn usable() -> Vec<Feature> {
    Feature::ALL.into_iter().filter(|&f| has(f)).collect()
}

/// The features the CPU has that the cap turns off.
pub fn turned_off() -> Vec<Feature> {
    Feature::ALL.into_iter().filter(|&f| detected(f) && !has(f)).collect()
}

/// The cap as reports name it, `None` when none is set:
/// `TIDEREC_MAX_ISA=avx2`, or `TIDEREC_MAX_ISA="x" (invalid: portable)`.
pub fn cap_note() -> Option<String> {
    match &cpu().cap {
        Ok(MaxIsa::Native) => None,
        Ok(cap) => Some(format!("{MAX_ISA_VAR}={cap}")),
        Err(e) => Some(format!("{MAX_ISA_VAR}={:?} (invalid: portable)", e.value)),
    }
}

/// The extensions for a report line: `avx2 fma avx512f …` without a cap;
/// with one, the cap and what it turns off:
/// `avx2 fma (TIDEREC_MAX_ISA=avx2; off: avx512f avx512bw …)`.
/// Emulated tiles add `amx-bf16 (emulated: TIDEREC_AMX_EMULATE=1)`.
pub fn describe() -> String {
    let line = describe_with(&usable(), &turned_off(), cap_note().as_deref());
    match tile_unit() {
        Some(TileUnit::Emulated) => format!("{line}; amx-bf16 (emulated: {AMX_EMULATE_VAR}=1)"),
        _ => line,
    }
}

fn describe_with(usable: &[Feature], off: &[Feature], note: Option<&str>) -> String {
    let names = |fs: &[Feature]| fs.iter().map(|f| f.name()).collect::<Vec<_>>().join(" ");
    let on = if usable.is_empty() { "none".to_string() } else { names(usable) };
    match (note, off.is_empty()) {
        (None, _) => on,
        (Some(note), true) => format!("{on} ({note})"),
        (Some(note), false) => format!("{on} ({note}; off: {})", names(off)),
    }
}

/// Why a CPU with AMX-BF16 may not use it here (the operating system does not
/// save the tile state, or Linux refused the permission); `None` when AMX is
/// usable or the CPU has none. Reports print it beside [`describe`].
pub fn amx_note() -> Option<&'static str> {
    match amx::probe() {
        Err(amx::Missing::Refused(why)) => Some(why),
        _ => None,
    }
}

/// Whether this process may run AMX tile instructions (see the module docs).
mod amx {
    use std::sync::OnceLock;

    /// What stops AMX.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Missing {
        /// The CPU has no AMX-TILE or no AMX-BF16.
        Absent,
        /// The CPU has them, but this process may not use them: why.
        Refused(&'static str),
    }

    /// The answer, found at the first question and kept.
    pub(super) fn probe() -> Result<(), Missing> {
        static ANSWER: OnceLock<Result<(), Missing>> = OnceLock::new();
        *ANSWER.get_or_init(ask)
    }

    #[cfg(target_arch = "x86_64")]
    fn ask() -> Result<(), Missing> {
        use std::arch::x86_64::__cpuid_count;
        // Leaf 7 is asked only where leaf 0 lists it.
        let (max_leaf, leaf1) = (__cpuid_count(0, 0).eax, __cpuid_count(1, 0));
        if max_leaf < 7 {
            return Err(Missing::Absent);
        }
        let leaf7 = __cpuid_count(7, 0);
        const AMX_BF16: u32 = 1 << 22;
        const AMX_TILE: u32 = 1 << 24;
        if leaf7.edx & (AMX_BF16 | AMX_TILE) != AMX_BF16 | AMX_TILE {
            return Err(Missing::Absent);
        }
        const OSXSAVE: u32 = 1 << 27;
        if leaf1.ecx & OSXSAVE == 0 {
            return Err(Missing::Refused("the operating system does not enable XSAVE"));
        }
        const TILE_STATE: u64 = 3 << 17;
        // SAFETY: OSXSAVE is set, so `xgetbv` runs.
        if unsafe { xcr0() } & TILE_STATE != TILE_STATE {
            return Err(Missing::Refused("the operating system does not save the AMX tile state (XCR0)"));
        }
        request_permission()
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn ask() -> Result<(), Missing> {
        Err(Missing::Absent)
    }

    /// The extended control register 0: which state components the OS saves.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "xsave")]
    unsafe fn xcr0() -> u64 {
        std::arch::x86_64::_xgetbv(0)
    }

    /// Linux lets a process use the tile data only once it asks (kernel 5.16 and later).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn request_permission() -> Result<(), Missing> {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: this request only widens the state components the process may use.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Missing::Refused("Linux refused the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM; kernels before 5.16 have none)"))
        }
    }

    #[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
    fn request_permission() -> Result<(), Missing> {
        Err(Missing::Refused("tiderec asks for the AMX tile state only on Linux"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings parse (in any case), unset and empty are native, and
    /// anything else is refused with the value and the accepted values.
    #[test]
    fn values_parse_and_bad_ones_are_refused() {
        for cap in MaxIsa::ALL {
            assert_eq!(cap.name().parse::<MaxIsa>(), Ok(cap));
            assert_eq!(cap.name().to_uppercase().parse::<MaxIsa>(), Ok(cap));
            assert_eq!(cap.to_string(), cap.name());
        }
        assert_eq!(MaxIsa::from_var(None), Ok(MaxIsa::Native));
        assert_eq!(MaxIsa::from_var(Some("")), Ok(MaxIsa::Native));
        assert_eq!(MaxIsa::from_var(Some("AVX2")), Ok(MaxIsa::Avx2));
        for bad in ["avx-2", "avx512f", " avx2", "sse4.2", "0"] {
            let e = MaxIsa::from_var(Some(bad)).unwrap_err();
            assert_eq!(e.value, bad);
            let text = e.to_string();
            assert!(text.contains("TIDEREC_MAX_ISA") && text.contains(bad), "{text}");
            assert!(text.contains("native, amx, avx512, avx2, portable"), "{text}");
            let config: crate::ConfigError = e.into();
            assert_eq!(config.key, "TIDEREC_MAX_ISA");
        }
    }

    /// The caps are ordered, each allows what the one below allows, AVX-512
    /// features need `avx512` and AVX2 and FMA `avx2`.
    #[test]
    fn caps_are_ordered_and_nested() {
        assert!(MaxIsa::ALL.windows(2).all(|w| w[0] < w[1]));
        for f in Feature::ALL {
            assert!(!MaxIsa::Portable.allows(f), "{f}");
            assert!(MaxIsa::Amx.allows(f) && MaxIsa::Native.allows(f), "{f}");
            assert_eq!(MaxIsa::Avx512.allows(f), f != Feature::AmxBf16, "{f}");
            assert_eq!(MaxIsa::Avx2.allows(f), matches!(f, Feature::Avx2 | Feature::Fma), "{f}");
        }
        let all = Feature::ALL.iter().fold(0, |m, f| m | f.bit());
        let masks: Vec<u32> = MaxIsa::ALL.iter().map(|&c| usable_mask(all, c)).collect();
        assert!(masks.windows(2).all(|w| w[0] & !w[1] == 0), "each cap allows what the lower one does");
        assert_eq!(masks, [0, Feature::Avx2.bit() | Feature::Fma.bit(), all & !Feature::AmxBf16.bit(), all, all]);
    }

    /// A cap never turns on a feature the CPU lacks.
    #[test]
    fn a_cap_never_adds_a_feature() {
        let avx2_only = Feature::Avx2.bit() | Feature::Fma.bit();
        for cap in MaxIsa::ALL {
            assert_eq!(usable_mask(avx2_only, cap) & !avx2_only, 0, "{cap}");
            assert_eq!(usable_mask(0, cap), 0, "{cap}");
        }
        assert_eq!(usable_mask(avx2_only, MaxIsa::Avx512), avx2_only);
    }

    /// This process's answers agree with each other: what the kernels may use
    /// is detected and allowed, and the rest of the detected set is turned off.
    #[test]
    fn answers_agree() {
        for f in Feature::ALL {
            assert_eq!(has(f), detected(f) && max_isa().allows(f), "{f}");
            assert_eq!(turned_off().contains(&f), detected(f) && !has(f), "{f}");
            assert_eq!(usable().contains(&f), has(f), "{f}");
        }
        assert_eq!(cap_note().is_none(), check() == Ok(MaxIsa::Native));
    }

    /// `1` turns emulation on; unset, empty and `0` leave it off; anything
    /// else is refused with its value.
    #[test]
    fn emulation_values_parse_and_bad_ones_are_refused() {
        assert_eq!(emulation_from_var(None), Ok(false));
        assert_eq!(emulation_from_var(Some("")), Ok(false));
        assert_eq!(emulation_from_var(Some("0")), Ok(false));
        assert_eq!(emulation_from_var(Some("1")), Ok(true));
        for bad in ["yes", "true", " 1", "2"] {
            assert_eq!(emulation_from_var(Some(bad)), Err(bad.to_string()));
        }
    }

    /// The CPU's tiles run wherever they are usable; tiles are emulated only
    /// where they are not, emulation was asked for, the cap allows `amx` and
    /// the vector instructions the packing needs are usable.
    #[test]
    fn tiles_are_emulated_only_where_asked_allowed_and_possible() {
        for cap in MaxIsa::ALL {
            for (emulate, vector) in [(false, false), (false, true), (true, false), (true, true)] {
                assert_eq!(unit_for(true, emulate, cap, vector), Some(TileUnit::Hardware), "{cap} {emulate} {vector}");
                let emulated = emulate && vector && cap >= MaxIsa::Amx;
                let want = emulated.then_some(TileUnit::Emulated);
                assert_eq!(unit_for(false, emulate, cap, vector), want, "{cap} {emulate} {vector}");
            }
        }
        assert_eq!(check_amx_emulation().is_ok(), cpu().emulate.is_ok());
    }

    /// The report names the cap and what it turns off, and only then.
    #[test]
    fn description_names_the_cap() {
        use Feature::*;
        assert_eq!(describe_with(&[Avx2, Fma, Avx512F], &[], None), "avx2 fma avx512f");
        assert_eq!(
            describe_with(&[Avx2, Fma], &[Avx512F, Avx512Vl], Some("TIDEREC_MAX_ISA=avx2")),
            "avx2 fma (TIDEREC_MAX_ISA=avx2; off: avx512f avx512vl)"
        );
        assert_eq!(
            describe_with(&[Avx2, Fma], &[], Some("TIDEREC_MAX_ISA=avx512")),
            "avx2 fma (TIDEREC_MAX_ISA=avx512)"
        );
        assert_eq!(
            describe_with(&[], &[Avx2, Fma], Some("TIDEREC_MAX_ISA=portable")),
            "none (TIDEREC_MAX_ISA=portable; off: avx2 fma)"
        );
    }
}
