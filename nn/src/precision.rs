//! The precision of a model's fully connected products.
//!
//! `fp32` (the default) computes every product in `f32`. `bf16` rounds both
//! operands of the MLPs' products — the forward `x·Wᵀ` and the backward
//! `dyᵀ·x` and `dy·W` of every [`Linear`](super::linear::Linear) layer — to
//! bf16 and accumulates in `f32` ([`gemm_bf16`](super::gemm_bf16)). Everything
//! else stays `f32`: the master weights the optimizer updates (rounded again
//! for each product from their current values), the biases and their
//! gradients, activations, the interaction, the loss, embeddings and their
//! optimizer, the exchange and checkpoints.
//!
//! bf16 runs on CPUs with AVX-512 BF16 (every CPU with AMX-BF16 has it too),
//! on AMX tiles where the CPU has them ([`Bf16Kernel::best`](super::gemm_bf16::Bf16Kernel::best));
//! [`Precision::check_cpu`] refuses it elsewhere, so no run falls back to a
//! slow path silently.
//!
//! `tf32` exists for GPU workers only: their GEMMs run on TF32 tensor cores
//! (operands rounded to 10-bit mantissas, `f32` accumulation). On a GPU worker
//! `bf16` rounds every GEMM's operands to bf16 as the CPU's bf16 operands are
//! (to nearest, ties to even), then the tensor cores multiply them into `f32`; storage stays `f32`
//! (`tiderec_gpu::Device::with_precision`). A CPU worker refuses `tf32`
//! ([`Precision::check_cpu`]).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use tiderec_records::cpu::Feature;
use tiderec_records::OperatorError;

/// `fp32`, `bf16` or `tf32` (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Every product in `f32`.
    #[default]
    Fp32,
    /// The MLPs' products on bf16 operands, `f32` accumulation and master weights.
    Bf16,
    /// A GPU worker's GEMMs on TF32 tensor cores; refused on the CPU.
    Tf32,
}

impl Precision {
    /// The setting's name (`fp32`, `bf16`, `tf32`).
    pub fn name(&self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Tf32 => "tf32",
        }
    }

    /// Whether this CPU runs the precision's products; the error names the
    /// key `precision`, what bf16 needs and what this CPU is.
    pub fn check_cpu(&self) -> Result<(), OperatorError> {
        if *self == Precision::Tf32 {
            return Err(OperatorError::config(
                "precision",
                "tf32 runs on GPU workers only (--device cuda:N); on the CPU use fp32 or bf16",
            ));
        }
        if *self == Precision::Fp32 || super::bf16_pack::bf16_vector_available() {
            return Ok(());
        }
        if let (true, Some(cap)) =
            (tiderec_records::cpu::detected(Feature::Avx512Bf16), tiderec_records::cpu::cap_note())
        {
            return Err(OperatorError::config(
                "precision",
                format!("bf16 needs AVX-512 BF16, which {cap} turns off: use --precision fp32 or raise the cap"),
            ));
        }
        Err(OperatorError::config(
            "precision",
            format!(
                "bf16 needs a CPU with AVX-512 BF16 (avx512_bf16; AMX-BF16 CPUs have it too); \
                 this CPU ({}) has neither: use --precision fp32",
                super::kernel_choice::cpu_model()
            ),
        ))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = OperatorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "tf32" => Ok(Precision::Tf32),
            other => Err(OperatorError::config("precision", format!("`{other}` is not fp32, bf16 or tf32"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for p in [Precision::Fp32, Precision::Bf16, Precision::Tf32] {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        let e = "fp16".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("`precision`") && e.contains("fp16"), "{e}");
        assert!(Precision::Fp32.check_cpu().is_ok());
        match Precision::Bf16.check_cpu() {
            Ok(()) => assert!(crate::bf16_pack::bf16_vector_available()),
            Err(e) => assert!(e.to_string().contains("AVX-512 BF16"), "{e}"),
        }
        let e = Precision::Tf32.check_cpu().unwrap_err().to_string();
        assert!(e.contains("`precision`") && e.contains("GPU workers"), "{e}");
    }
}
