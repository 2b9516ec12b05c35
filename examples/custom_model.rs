//! A model of your own, trained by tiderec's synchronous trainer.
//!
//! The model is a field-weighted factorization machine (FwFM), which tiderec
//! does not ship: for dense features `x` and the pooled embedding vectors
//! `v₁ … v_F` of a sample's sparse fields,
//!
//! ```text
//! logit = b + Σₖ wₖ·xₖ + Σ_{i<j} r_ij·⟨vᵢ, vⱼ⟩
//! ```
//!
//! It implements [`Model<f32>`]: its dense parameters `[b, w, r]` live in one
//! flat buffer (so the trainer can all-reduce and checkpoint them without
//! knowing the model), `forward` computes logits from the dense features and
//! the pooled vectors the trainer hands it, and `backward` writes the
//! parameter gradients and the gradients of the pooled vectors, which the
//! trainer scatters to the embedding rows their owners hold.
//! [`Trainer::with_model`] trains it on two workers over a seeded synthetic
//! Criteo-shaped stream; the program then scores held-out samples and checks
//! that the model learned (AUC well above chance).
//!
//! ```text
//! cargo run --release -p tiderec-examples --example custom_model
//! ```

use tiderec_operators::metrics::auc;
use tiderec_operators::nn::{Model, ModelConfig, ModelInputs};
use tiderec_operators::optim::OptimizerParams;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

/// Timely workers (threads).
const WORKERS: usize = 2;
/// Embedding width.
const DIM: usize = 8;
/// Samples per worker and step.
const MICRO: u64 = 256;
/// Training steps.
const STEPS: u64 = 80;
/// Held-out samples scored after training.
const HELD_OUT: u64 = 20_000;

/// A field-weighted factorization machine; parameters `[b, w (num_dense), r (one per field pair)]`.
struct FwFm {
    num_dense: usize,
    num_sparse: usize,
    dim: usize,
    params: Vec<f32>,
    grads: Vec<f32>,
    logits: Vec<f32>,
}

impl FwFm {
    /// Every worker must start from the same parameters: `b = w = 0`, `r = 1` (a plain FM).
    fn new(num_dense: usize, num_sparse: usize, dim: usize) -> Self {
        let pairs = num_sparse * (num_sparse - 1) / 2;
        let mut params = vec![0.0; 1 + num_dense + pairs];
        params[1 + num_dense..].fill(1.0);
        let grads = vec![0.0; params.len()];
        FwFm { num_dense, num_sparse, dim, params, grads, logits: Vec::new() }
    }

    /// The field pairs `(i, j)`, `i < j`, in the order of `r`.
    fn pairs(&self) -> impl Iterator<Item = (usize, usize)> {
        let f = self.num_sparse;
        (0..f).flat_map(move |i| (i + 1..f).map(move |j| (i, j)))
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Model<f32> for FwFm {
    fn params(&self) -> &[f32] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }
    fn grads(&self) -> &[f32] {
        &self.grads
    }
    fn params_and_grads(&mut self) -> (&mut [f32], &[f32]) {
        (&mut self.params, &self.grads)
    }
    fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }
    fn embedding_dim(&self) -> usize {
        self.dim
    }

    fn forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> &[f32] {
        let (nd, d, row) = (self.num_dense, self.dim, self.num_sparse * self.dim);
        let (w, r) = self.params[1..].split_at(nd);
        self.logits.clear();
        for s in 0..batch {
            let v = |i: usize| &pooled[s * row + i * d..s * row + (i + 1) * d];
            let linear = self.params[0] + dot(w, &dense[s * nd..(s + 1) * nd]);
            let pairwise: f32 = self.pairs().zip(r).map(|((i, j), &rij)| rij * dot(v(i), v(j))).sum();
            self.logits.push(linear + pairwise);
        }
        &self.logits
    }

    fn backward(&mut self, dense: &[f32], pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        let (nd, d, row) = (self.num_dense, self.dim, self.num_sparse * self.dim);
        let pairs: Vec<(usize, usize)> = self.pairs().collect();
        // `backward` overwrites: the trainer divides the sums by the global batch size.
        self.grads.fill(0.0);
        dpooled.fill(0.0);
        let r = &self.params[1 + nd..];
        let (gb, rest) = self.grads.split_first_mut().expect("a bias");
        let (gw, gr) = rest.split_at_mut(nd);
        for (s, &g) in dlogits.iter().enumerate() {
            let v = &pooled[s * row..(s + 1) * row];
            let dv = &mut dpooled[s * row..(s + 1) * row];
            *gb += g;
            for (gk, &x) in gw.iter_mut().zip(&dense[s * nd..(s + 1) * nd]) {
                *gk += g * x;
            }
            for (p, &(i, j)) in pairs.iter().enumerate() {
                let (vi, vj) = (&v[i * d..(i + 1) * d], &v[j * d..(j + 1) * d]);
                gr[p] += g * dot(vi, vj);
                for c in 0..d {
                    dv[i * d + c] += g * r[p] * vj[c];
                    dv[j * d + c] += g * r[p] * vi[c];
                }
            }
        }
    }
}

fn main() {
    let data = SyntheticCriteo::new(SyntheticConfig::kaggle_like(7, 1000)).expect("valid synthetic config");
    // What the FwFM handed to `with_model` reads: the shape the trainer checks batches
    // against (dense features, fields, row width).
    let shape = ModelConfig::Custom(ModelInputs::new(NUM_DENSE, NUM_SPARSE, DIM));
    let config = TrainerConfig::builder(shape, data.config().table_sizes.clone())
        .seed(7)
        .dense_hp(OptimizerParams::with_lr(0.01))
        .sparse_hp(OptimizerParams::with_lr(0.1))
        .build()
        .expect("valid config");
    let results = timely::execute(timely::Config::process(WORKERS), move |worker| {
        let (me, peers) = (worker.index() as u64, worker.peers() as u64);
        let model = Box::new(FwFm::new(NUM_DENSE, NUM_SPARSE, DIM));
        let mut trainer = Trainer::with_model(worker, &config, model).expect("the FwFM fits the shape");
        let mut loss = (0.0, 0);
        for step in 0..STEPS {
            // Worker `me` takes its slice of the step's global batch of the stream.
            let start = (step * peers + me) * MICRO;
            let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
            data.fill(start..start + MICRO, &mut batch);
            let stats = trainer.step(worker, StepKind::Train, batch).expect("a batch of the model's shape");
            if step >= STEPS - 10 {
                loss = (loss.0 + stats.loss_sum, loss.1 + stats.samples);
            }
        }
        // Held-out samples (past every trained one), scored on worker 0.
        let first = STEPS * peers * MICRO;
        let share = HELD_OUT / peers;
        let mut held_out = Batch::new(NUM_DENSE, NUM_SPARSE);
        let teacher: Vec<f32> = data
            .fill(first + me * share..first + (me + 1) * share, &mut held_out)
            .into_iter()
            .map(|p| p as f32)
            .collect();
        // What the data's hidden teacher scores on this share: the best AUC a model can reach.
        let teacher_auc = auc(&teacher, &held_out.labels);
        trainer.step(worker, StepKind::Eval, held_out).expect("a batch of the model's shape");
        let eval = trainer.take_eval();
        (me == 0).then(|| (eval, loss.0 / loss.1 as f64, teacher_auc))
    })
    .expect("timely starts")
    .join();
    let (eval, train_loss, teacher_auc) =
        results.into_iter().find_map(|r| r.expect("no worker panicked")).expect("worker 0 reports");
    let model_auc = auc(&eval.probs, &eval.labels).expect("both classes held out");
    println!("FwFM: {} training samples, loss over the last 10 steps {train_loss:.4}", STEPS * WORKERS as u64 * MICRO);
    println!(
        "held-out AUC {model_auc:.4} on {} samples (the data's teacher: {:.4} on worker 0's half)",
        eval.probs.len(),
        teacher_auc.unwrap_or(f64::NAN)
    );
    assert!(model_auc > 0.65, "the FwFM did not learn: held-out AUC {model_auc:.4}");
}
