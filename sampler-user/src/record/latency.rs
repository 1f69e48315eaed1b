//! Latency histograms of a run, for `PYEBPF_STATS=1`: how long after it was taken a sample
//! was built (the Python frames of a process are read from its memory then, so a process
//! that exits sooner than that keeps only unresolved frames), and how long after its exec a
//! new Python process was attached (the kernel captures its frames only from then on).
//!
//! Owns: [`Latency`], a fixed array of power-of-two buckets (no allocation, O(1) per value).
//! Constraints: quantiles are bucket upper bounds (within a factor of two); the maximum is exact.

use std::fmt;
use std::time::Duration;

/// Buckets: `< 2^(k+1)` µs for bucket `k`; the last takes everything above.
const BUCKETS: usize = 28;

/// A histogram of durations.
#[derive(Clone, Debug)]
pub struct Latency {
    counts: [u64; BUCKETS],
    n: u64,
    max_ns: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            counts: [0; BUCKETS],
            n: 0,
            max_ns: 0,
        }
    }
}

impl Latency {
    /// Adds one value, in nanoseconds.
    pub fn add_ns(&mut self, ns: u64) {
        let us = ns / 1000;
        let k = (u64::BITS - us.leading_zeros()) as usize;
        self.counts[k.min(BUCKETS - 1)] += 1;
        self.n += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds one duration.
    pub fn add(&mut self, d: Duration) {
        self.add_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// The upper bound of the bucket holding quantile `q` (0..=1), capped at the maximum.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.n == 0 {
            return Duration::ZERO;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank among at most u64::MAX values, rounded up"
        )]
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (k, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                if k == BUCKETS - 1 {
                    break;
                }
                let upper_us = 1u64 << k;
                return Duration::from_nanos((upper_us * 1000).min(self.max_ns));
            }
        }
        Duration::from_nanos(self.max_ns)
    }

    /// The largest value.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "p50 ≤ {:.1} ms, p99 ≤ {:.1} ms, max {:.1} ms ({} values)",
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.max()),
            self.n
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_bounds_and_the_max_is_exact() {
        let mut l = Latency::default();
        assert_eq!(l.quantile(0.5), Duration::ZERO);
        for _ in 0..98 {
            l.add(Duration::from_micros(900)); // bucket < 1024 µs
        }
        l.add(Duration::from_millis(40));
        l.add(Duration::from_millis(300));
        assert_eq!(l.count(), 100);
        assert_eq!(l.quantile(0.5), Duration::from_micros(1024));
        assert_eq!(l.quantile(0.99), Duration::from_micros(65_536));
        assert_eq!(l.quantile(1.0), Duration::from_millis(300));
        assert_eq!(l.max(), Duration::from_millis(300));
        let mut huge = Latency::default();
        huge.add_ns(u64::MAX);
        assert_eq!(huge.max(), Duration::from_nanos(u64::MAX));
        assert_eq!(huge.quantile(0.5), Duration::from_nanos(u64::MAX));
    }
}
