//! A seeded stream of DIEN-shaped samples (user, target item and category,
//! behaviour history) whose labels come from a hidden teacher that cares
//! about the *order* of the history.
//!
//! Sample `i` depends only on `(seed, i)`, like [`crate::synthetic`], so
//! every worker count sees the same global batches.
//!
//! * Items belong to categories: item `c·items_per_category + k` is in
//!   category `c`; ranks inside a category are Zipf-skewed.
//! * A user's history is a Markov chain of interests: it starts in the
//!   user's home category and moves to a random category with probability
//!   `drift` at each step, so the most recent categories say more about the
//!   next click than the oldest ones.
//! * The target comes from the current interest half of the time and from
//!   a random category otherwise.
//! * Teacher: `σ(bias + a·[target category = last category] + b·(recency-
//!   weighted share of the history in the target category) + item effect)`.
//!   A model that pools the history without order (sum pooling) cannot see
//!   the recency weights; GRU + attention can.
//!
//! Fields: sparse `[user, target item, target category]`; sequences
//! `[history items, history categories]`, reading the item and category
//! tables (sparse fields 1 and 2).

use crate::SourceError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tiderec_records::features::mix64;
use tiderec_records::rng::normal_f64;
use tiderec_records::Batch;

/// Sparse fields: user, target item, target category.
pub const NUM_SPARSE: usize = 3;
/// Sequence fields: history items, history categories.
pub const NUM_SEQUENCES: usize = 2;
/// The table each sequence field reads (the target item's and category's).
pub const SEQUENCE_TABLES: [usize; 2] = [1, 2];
/// The target field of each sequence field.
pub const TARGET_FIELDS: [usize; 2] = [1, 2];

/// Settings of the behaviour stream.
#[derive(Clone, Debug)]
pub struct BehaviorConfig {
    /// Seed of the data and the teacher.
    pub seed: u64,
    /// Number of users.
    pub users: u64,
    /// Number of categories.
    pub categories: u64,
    /// Items per category.
    pub items_per_category: u64,
    /// Longest history.
    pub max_len: usize,
    /// Probability that the interest moves to a random category at each step.
    pub drift: f64,
}

impl BehaviorConfig {
    /// 20,000 users, 40 categories × 250 items, histories of up to `max_len` events.
    pub fn standard(seed: u64, max_len: usize) -> Self {
        BehaviorConfig { seed, users: 20_000, categories: 40, items_per_category: 250, max_len, drift: 0.3 }
    }

    /// Table sizes of the three sparse fields (user, item, category).
    pub fn table_sizes(&self) -> Vec<u64> {
        vec![self.users, self.categories * self.items_per_category, self.categories]
    }
}

/// The generator; cheap to clone and share.
#[derive(Clone, Debug)]
pub struct SyntheticBehavior {
    config: BehaviorConfig,
    zipf: Zipf<f64>,
}

impl SyntheticBehavior {
    /// Builds the generator; errors name the bad setting.
    pub fn new(config: BehaviorConfig) -> Result<Self, SourceError> {
        let bad = |key: &str, reason: String| Err(SourceError::config(key, reason));
        if config.users == 0 || config.categories < 2 || config.items_per_category == 0 {
            return bad("synthetic", format!("needs users > 0, categories ≥ 2 and items > 0, got {config:?}"));
        }
        if config.max_len == 0 {
            return bad("max_len", "must be positive".into());
        }
        if !(0.0..=1.0).contains(&config.drift) {
            return bad("drift", format!("must be in [0, 1], got {}", config.drift));
        }
        let zipf = Zipf::new(config.items_per_category as f64, 1.05).expect("validated above");
        Ok(SyntheticBehavior { config, zipf })
    }

    /// The configuration.
    pub fn config(&self) -> &BehaviorConfig {
        &self.config
    }

    fn item_effect(&self, item: u64) -> f64 {
        0.4 * normal_f64(self.config.seed ^ 0xbe4a, 7, item, 0)
    }

    fn item_in(&self, rng: &mut SmallRng, category: u64) -> u64 {
        let rank = self.zipf.sample(rng) as u64 - 1;
        category * self.config.items_per_category + rank.min(self.config.items_per_category - 1)
    }

    /// Appends samples `range` to `out` (which must carry 0 dense, 3 sparse
    /// and 2 sequence fields) and returns the teacher's click probability of each.
    pub fn fill(&self, range: std::ops::Range<u64>, out: &mut Batch) -> Vec<f64> {
        let c = &self.config;
        let mut probs = Vec::with_capacity((range.end - range.start) as usize);
        let mut cats = Vec::with_capacity(c.max_len);
        for i in range {
            let mut rng = SmallRng::seed_from_u64(mix64(c.seed ^ mix64(i.wrapping_add(0x5eed))));
            let user = rng.random_range(0..c.users);
            let home = mix64(user ^ c.seed) % c.categories;
            let len = rng.random_range(1..=c.max_len);
            cats.clear();
            let mut interest = home;
            for _ in 0..len {
                if rng.random::<f64>() < c.drift {
                    interest = rng.random_range(0..c.categories);
                }
                cats.push(interest);
                let item = self.item_in(&mut rng, interest);
                out.sequences[0].ids.push(item);
                out.sequences[1].ids.push(interest);
            }
            out.sequences[0].close_bag();
            out.sequences[1].close_bag();
            let last = *cats.last().expect("len ≥ 1");
            let target_cat = if rng.random::<bool>() { last } else { rng.random_range(0..c.categories) };
            let target = self.item_in(&mut rng, target_cat);
            // Recency-weighted share of the history in the target category (newest weighs most).
            let (mut share, mut total) = (0.0, 0.0);
            for (t, &cat) in cats.iter().enumerate() {
                let w = 0.6f64.powi((len - 1 - t) as i32);
                total += w;
                if cat == target_cat {
                    share += w;
                }
            }
            let logit = -1.6 + 1.2 * f64::from(u8::from(target_cat == last)) + 1.5 * share / total
                - 0.8 * f64::from(u8::from(target_cat == home && target_cat != last))
                + self.item_effect(target);
            let p = 1.0 / (1.0 + (-logit).exp());
            probs.push(p);
            out.labels.push(if rng.random::<f64>() < p { 1.0 } else { 0.0 });
            for (field, id) in [user, target, target_cat].into_iter().enumerate() {
                out.sparse[field].ids.push(id);
                out.sparse[field].close_bag();
            }
        }
        probs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch::with_sequences(0, NUM_SPARSE, NUM_SEQUENCES)
    }

    #[test]
    fn ranges_compose_and_ids_fit_the_tables() {
        let g = SyntheticBehavior::new(BehaviorConfig::standard(3, 12)).unwrap();
        let (mut whole, mut parts) = (batch(), batch());
        let p = g.fill(0..50, &mut whole);
        let mut q = g.fill(0..20, &mut parts);
        q.extend(g.fill(20..50, &mut parts));
        assert_eq!(whole, parts);
        assert_eq!(p, q);
        whole.check().unwrap();
        let sizes = g.config().table_sizes();
        for (f, field) in whole.sparse.iter().enumerate() {
            assert!(field.ids.iter().all(|&id| id < sizes[f]));
        }
        for (s, field) in whole.sequences.iter().enumerate() {
            assert!(field.ids.iter().all(|&id| id < sizes[SEQUENCE_TABLES[s]]));
            assert!((0..whole.len()).all(|i| (1..=12).contains(&field.bag(i).len())));
        }
        // Items belong to their category.
        for i in 0..whole.len() {
            for (item, cat) in whole.sequences[0].bag(i).iter().zip(whole.sequences[1].bag(i)) {
                assert_eq!(item / g.config().items_per_category, *cat);
            }
        }
    }

    #[test]
    fn labels_follow_the_teacher() {
        let g = SyntheticBehavior::new(BehaviorConfig::standard(5, 10)).unwrap();
        let mut b = batch();
        let p = g.fill(0..20_000, &mut b);
        let auc = tiderec_records::metrics::auc(&p.iter().map(|&x| x as f32).collect::<Vec<_>>(), &b.labels).unwrap();
        assert!(auc > 0.7, "teacher AUC {auc}");
        let ctr = b.labels.iter().sum::<f32>() / b.len() as f32;
        assert!((0.15..0.6).contains(&ctr), "ctr {ctr}");
    }

    #[test]
    fn bad_settings_are_errors() {
        let mut c = BehaviorConfig::standard(1, 5);
        c.drift = 2.0;
        assert!(SyntheticBehavior::new(c).unwrap_err().to_string().contains("drift"));
    }
}
