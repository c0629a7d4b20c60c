//! Zipf-distributed integers over a closed range: P(k) is proportional to
//! k^-s. Group sizes in chat apps are heavy-tailed: most groups are small,
//! a few are huge.

use crate::random::Random;

#[derive(Clone, Debug)]
pub struct Zipf {
    low: u64,
    /// Cumulative weights of low, low+1, ..., high.
    cumulative: Vec<f64>,
}

impl Zipf {
    /// Over `low..=high` (1 <= low <= high) with exponent `s` > 0.
    pub fn new(low: u64, high: u64, s: f64) -> Self {
        assert!(1 <= low && low <= high && s > 0.0);
        let mut total = 0.0;
        let cumulative = (low..=high)
            .map(|k| {
                total += (k as f64).powf(-s);
                total
            })
            .collect();
        Zipf { low, cumulative }
    }

    pub fn sample(&self, random: &mut Random) -> u64 {
        let total = *self.cumulative.last().expect("a non-empty range");
        let x = random.unit() * total;
        let i = self.cumulative.partition_point(|c| *c <= x);
        self.low + i.min(self.cumulative.len() - 1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_stay_in_range_and_small_values_dominate() {
        let zipf = Zipf::new(3, 5000, 1.5);
        let mut random = Random::new(1);
        let samples: Vec<u64> = (0..100_000).map(|_| zipf.sample(&mut random)).collect();
        assert!(samples.iter().all(|k| (3..=5000).contains(k)));
        let threes = samples.iter().filter(|k| **k == 3).count() as f64 / 1e5;
        let expected = 3f64.powf(-1.5) / (3..=5000).map(|k| (k as f64).powf(-1.5)).sum::<f64>();
        assert!((threes - expected).abs() < 0.01, "{threes} vs {expected}");
        assert!(samples.iter().any(|k| *k > 1000), "the tail is there");
    }
}
