//! A seeded, Criteo-shaped synthetic stream with a known achievable AUC.
//!
//! Sample `i` depends only on `(seed, i)`, so any worker can produce any
//! range of the stream and the union of the workers' ranges is the same
//! stream for every worker count.
//!
//! * 13 dense counts: log-normal with a per-feature scale, 10% missing
//!   (missing counts are 0 before the `ln(1 + x)` transform).
//! * 26 categorical fields: Zipf-skewed ranks over the Kaggle per-field
//!   cardinalities, some fields often absent (an empty bag). A rank becomes a
//!   row id by identity when the field's table holds every rank, otherwise by
//!   the seeded per-field hash bucket of the Criteo reader.
//! * Labels: Bernoulli of a hidden teacher, `σ(b + Σ wⱼ·dⱼ + Σ a_f(rank) +
//!   Σ ⟨u_f(rank), u_g(rank)⟩)`, whose per-id effects live on each field's
//!   most frequent ranks. The teacher's AUC on held-out samples is the
//!   achievable AUC the model is compared with.

use crate::SourceError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tiderec_records::features::{field_seed, hash_bucket, log1p_clamped, mix64};
use tiderec_records::rng::normal_f64;
use tiderec_records::Batch;

/// Per-field cardinalities of the Criteo Kaggle (DAC) training set.
pub const KAGGLE_CARDINALITIES: [u64; 26] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652,
    2173, 4, 7046547, 18, 15, 286181, 105, 142572,
];

/// Number of dense features.
pub const NUM_DENSE: usize = 13;
/// Number of categorical fields.
pub const NUM_SPARSE: usize = 26;

/// Fraction of samples in which each categorical field is absent.
const MISSING: [f64; 26] = [
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.03, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.03,
    0.0, 0.76, 0.03, 0.44, 0.03,
];

/// Number of leading ranks per field that carry a teacher effect.
const EFFECT_RANKS: u64 = 100;
/// Field pairs with a teacher interaction.
const PAIRS: [(usize, usize); 4] = [(0, 1), (2, 5), (6, 13), (3, 9)];
/// Width of the teacher's interaction vectors.
const TEACHER_DIM: usize = 4;

/// Settings of the synthetic stream.
#[derive(Clone, Debug)]
pub struct SyntheticConfig {
    /// Seed of the data and the teacher.
    pub seed: u64,
    /// Rows of each field's embedding table.
    pub table_sizes: Vec<u64>,
    /// Zipf exponent of the categorical ranks.
    pub zipf_exponent: f64,
}

impl SyntheticConfig {
    /// Kaggle cardinalities capped at `max_rows` rows per table.
    pub fn kaggle_like(seed: u64, max_rows: u64) -> Self {
        SyntheticConfig {
            seed,
            table_sizes: KAGGLE_CARDINALITIES.iter().map(|&c| c.min(max_rows)).collect(),
            zipf_exponent: 1.1,
        }
    }
}

/// The generator; cheap to clone and share.
#[derive(Clone, Debug)]
pub struct SyntheticCriteo {
    config: SyntheticConfig,
    zipfs: Vec<Zipf<f64>>,
    seeds: Vec<u64>,
    dense_weights: [f64; NUM_DENSE],
    dense_mu: [f64; NUM_DENSE],
    bias: f64,
    /// `effect(f, r)` at `f · (EFFECT_RANKS + 1) + r`, for ranks up to `EFFECT_RANKS`.
    effects: Vec<f64>,
    /// `teacher_vector(f, r, k)` at `(f · (EFFECT_RANKS + 1) + r) · TEACHER_DIM + k`.
    teacher: Vec<f64>,
}

impl SyntheticCriteo {
    /// Builds the generator; errors name the bad setting.
    pub fn new(config: SyntheticConfig) -> Result<Self, SourceError> {
        if config.table_sizes.len() != NUM_SPARSE || config.table_sizes.contains(&0) {
            return Err(SourceError::config(
                "table_sizes",
                format!("need {NUM_SPARSE} positive table sizes, got {:?}", config.table_sizes),
            ));
        }
        if !(config.zipf_exponent.is_finite() && config.zipf_exponent > 0.0) {
            return Err(SourceError::config(
                "zipf_exponent",
                format!("must be positive, got {}", config.zipf_exponent),
            ));
        }
        let zipfs = KAGGLE_CARDINALITIES
            .iter()
            .map(|&n| Zipf::new(n as f64, config.zipf_exponent).expect("validated above"))
            .collect();
        let seeds = (0..NUM_SPARSE).map(|f| field_seed(config.seed, f)).collect();
        let s = config.seed ^ 0x7e5c_4e12;
        let mut dense_weights = [0.0; NUM_DENSE];
        let mut dense_mu = [0.0; NUM_DENSE];
        for j in 0..NUM_DENSE {
            dense_weights[j] = normal_f64(s, 1, j as u64, 0) * 0.35;
            dense_mu[j] = 0.5 + 2.5 * tiderec_records::rng::unit_f64(s, 2, j as u64, 0);
        }
        let mut g = SyntheticCriteo {
            config,
            zipfs,
            seeds,
            dense_weights,
            dense_mu,
            bias: -1.6,
            effects: Vec::new(),
            teacher: Vec::new(),
        };
        // The teacher's per-rank terms, computed once: a sample reads them instead of
        // drawing the same normals again (the stream is unchanged).
        let ranks = (0..NUM_SPARSE as u64).flat_map(|f| (0..=EFFECT_RANKS).map(move |r| (f as usize, r)));
        g.effects = ranks.clone().map(|(f, r)| g.effect(f, r)).collect();
        g.teacher = ranks
            .flat_map(|(f, r)| (0..TEACHER_DIM).map(move |k| (f, r, k)))
            .map(|(f, r, k)| g.teacher_vector(f, r, k))
            .collect();
        Ok(g)
    }

    /// `effect(field, rank)` from the table.
    fn effect_of(&self, field: usize, rank: u64) -> f64 {
        if rank > EFFECT_RANKS {
            return 0.0;
        }
        self.effects[field * (EFFECT_RANKS as usize + 1) + rank as usize]
    }

    /// `teacher_vector(field, rank, 0..TEACHER_DIM)` from the table (zeros past `EFFECT_RANKS`).
    fn teacher_of(&self, field: usize, rank: u64) -> [f64; TEACHER_DIM] {
        if rank > EFFECT_RANKS {
            return [0.0; TEACHER_DIM];
        }
        let at = (field * (EFFECT_RANKS as usize + 1) + rank as usize) * TEACHER_DIM;
        self.teacher[at..at + TEACHER_DIM].try_into().expect("TEACHER_DIM values")
    }

    /// The configuration.
    pub fn config(&self) -> &SyntheticConfig {
        &self.config
    }

    fn effect(&self, field: usize, rank: u64) -> f64 {
        if rank > EFFECT_RANKS {
            return 0.0;
        }
        let scale = if field.is_multiple_of(3) { 0.8 } else { 0.35 };
        normal_f64(self.config.seed ^ 0x00ef_fec7, field as u64, rank, 0) * scale
    }

    fn teacher_vector(&self, field: usize, rank: u64, k: usize) -> f64 {
        if rank > EFFECT_RANKS {
            return 0.0;
        }
        normal_f64(self.config.seed ^ 0x1a7e_4ac7, field as u64, rank, k as u64) * 0.5
    }

    /// Appends sample `index` to `out` and returns the teacher's probability.
    ///
    /// # Errors
    /// [`SourceError::Config`] on the key `batch` when `out` is not of the stream's
    /// shape ([`NUM_DENSE`] dense features, [`NUM_SPARSE`] sparse fields, no
    /// sequences); `out` is then unchanged.
    pub fn push_sample(&self, index: u64, out: &mut Batch) -> Result<f64, SourceError> {
        check_shape(out)?;
        Ok(self.append(index, out))
    }

    /// Appends samples `range` to `out` and returns their teacher probabilities.
    ///
    /// # Errors
    /// [`SourceError::Config`] on the key `batch` when `out` is not of the stream's
    /// shape (see [`push_sample`](Self::push_sample)); `out` is then unchanged.
    pub fn try_fill(&self, range: std::ops::Range<u64>, out: &mut Batch) -> Result<Vec<f64>, SourceError> {
        check_shape(out)?;
        Ok(range.map(|i| self.append(i, out)).collect())
    }

    /// Appends samples `range` to `out` and returns their teacher probabilities:
    /// [`try_fill`](Self::try_fill) for a batch the caller made of the stream's shape.
    ///
    /// # Panics
    /// When `out` is not of the stream's shape, before anything is appended (the error
    /// [`try_fill`](Self::try_fill) returns).
    pub fn fill(&self, range: std::ops::Range<u64>, out: &mut Batch) -> Vec<f64> {
        self.try_fill(range, out).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Appends sample `index` to `out`, a batch of the stream's shape; the teacher's probability.
    fn append(&self, index: u64, out: &mut Batch) -> f64 {
        let mut rng = SmallRng::seed_from_u64(mix64(self.config.seed ^ mix64(index)));
        let mut logit = self.bias;
        for j in 0..NUM_DENSE {
            let raw = if rng.random::<f64>() < 0.1 {
                0.0
            } else {
                let z: f64 = rng.sample(rand_distr::StandardNormal);
                (self.dense_mu[j] + 1.2 * z).exp().floor()
            };
            let x = log1p_clamped(raw as f32);
            out.dense.push(x);
            logit += self.dense_weights[j] * (x as f64 - self.dense_mu[j]);
        }
        let mut ranks = [0u64; NUM_SPARSE];
        for f in 0..NUM_SPARSE {
            let absent = rng.random::<f64>() < MISSING[f];
            let rank = self.zipfs[f].sample(&mut rng) as u64;
            let field = &mut out.sparse[f];
            if !absent {
                ranks[f] = rank;
                let size = self.config.table_sizes[f];
                let id =
                    if KAGGLE_CARDINALITIES[f] <= size { rank - 1 } else { hash_bucket(self.seeds[f], rank, size) };
                field.ids.push(id);
                logit += self.effect_of(f, rank);
            }
            field.close_bag();
        }
        for &(f, g) in &PAIRS {
            if ranks[f] > 0 && ranks[g] > 0 {
                let (u, v) = (self.teacher_of(f, ranks[f]), self.teacher_of(g, ranks[g]));
                logit += u.iter().zip(&v).map(|(a, b)| a * b).sum::<f64>();
            }
        }
        let p = 1.0 / (1.0 + (-logit).exp());
        out.labels.push(if rng.random::<f64>() < p { 1.0 } else { 0.0 });
        p
    }
}

/// Refuses a batch that is not of the stream's shape: 13 dense, 26 sparse, no sequences.
fn check_shape(out: &Batch) -> Result<(), SourceError> {
    crate::error::check_batch_shape(out, NUM_DENSE, NUM_SPARSE, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_deterministic_and_well_formed() {
        let g = SyntheticCriteo::new(SyntheticConfig::kaggle_like(3, 100_000)).unwrap();
        let mut a = Batch::new(NUM_DENSE, NUM_SPARSE);
        let mut b = Batch::new(NUM_DENSE, NUM_SPARSE);
        g.fill(0..500, &mut a);
        g.fill(0..200, &mut b);
        g.fill(200..500, &mut b);
        assert_eq!(a, b, "a range split in two gives the same samples");
        a.check().unwrap();
        for (f, field) in a.sparse.iter().enumerate() {
            assert!(field.ids.iter().all(|&id| id < g.config().table_sizes[f]));
        }
        let ctr = a.labels.iter().sum::<f32>() / a.len() as f32;
        assert!((0.1..0.45).contains(&ctr), "ctr {ctr}");
        // Field 22 is absent in about 76% of samples: an empty bag, not a fake id.
        let empty = (0..a.len()).filter(|&i| a.sparse[22].bag(i).is_empty()).count();
        assert!(empty > 300, "{empty}");
    }

    #[test]
    fn the_teacher_tables_hold_the_terms_bit_for_bit() {
        let g = SyntheticCriteo::new(SyntheticConfig::kaggle_like(5, 1000)).unwrap();
        for f in 0..NUM_SPARSE {
            for rank in 0..EFFECT_RANKS + 3 {
                assert_eq!(g.effect_of(f, rank).to_bits(), g.effect(f, rank).to_bits(), "field {f} rank {rank}");
                let want: Vec<u64> = (0..TEACHER_DIM).map(|k| g.teacher_vector(f, rank, k).to_bits()).collect();
                let got: Vec<u64> = g.teacher_of(f, rank).iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "field {f} rank {rank}");
            }
        }
        assert!(g.effect_of(0, 1) != 0.0 && g.effect_of(0, EFFECT_RANKS + 1) == 0.0, "effects end at EFFECT_RANKS");
    }

    #[test]
    fn a_batch_of_another_shape_is_refused_and_left_unchanged() {
        let g = SyntheticCriteo::new(SyntheticConfig::kaggle_like(3, 1000)).unwrap();
        let shapes =
            [Batch::new(NUM_DENSE, 3), Batch::new(2, NUM_SPARSE), Batch::with_sequences(NUM_DENSE, NUM_SPARSE, 1)];
        for shape in shapes {
            let mut out = shape.clone();
            let e = g.push_sample(0, &mut out).unwrap_err();
            assert!(matches!(&e, SourceError::Config(c) if c.key == "batch"), "{e}");
            let e = g.try_fill(0..10, &mut out).unwrap_err();
            assert!(e.to_string().contains("expected 13 / 26 / 0"), "{e}");
            assert_eq!(out, shape, "nothing appended");
            let fill = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.fill(0..10, &mut out)));
            let message = fill.expect_err("fill panics on another shape");
            assert!(message.downcast_ref::<String>().is_some_and(|m| m.contains("expected 13 / 26 / 0")));
            assert_eq!(out, shape, "nothing appended");
        }
        let mut out = Batch::new(NUM_DENSE, NUM_SPARSE);
        let p = g.push_sample(4, &mut out).unwrap();
        let mut filled = Batch::new(NUM_DENSE, NUM_SPARSE);
        assert_eq!(g.try_fill(4..5, &mut filled).unwrap(), [p]);
        assert_eq!(out, filled);
        out.check().unwrap();
    }

    #[test]
    fn bad_config_names_key() {
        let mut c = SyntheticConfig::kaggle_like(1, 10);
        c.table_sizes.pop();
        assert!(SyntheticCriteo::new(c).unwrap_err().to_string().contains("table_sizes"));
    }
}
