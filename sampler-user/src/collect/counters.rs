//! Totals of the kernel-side per-CPU `COUNTERS` plus the collector's own user-side counts.
//!
//! Input: one per-CPU value slice per `sampler_common::Counter`, and the user-side counts.
//! Output: [`CounterTotals`], readable by counter, by name, or as the subset that means loss or
//! error (for the run summary).
use sampler_common::{COUNTERS_LEN, Counter};

use crate::failure::{Failure, Failures, KERNEL_FAILURES};

/// Summed counters of one collector run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterTotals {
    /// Kernel counters summed over CPUs, indexed by `Counter as usize`.
    pub kernel: [u64; COUNTERS_LEN as usize],
    /// Ring-buffer records that could not be decoded (skipped).
    pub malformed: u64,
}

/// Kernel counters of the in-kernel Python walk.
const PYTHON_COUNTERS: [Counter; 10] = [
    Counter::PySamples,
    Counter::PyNoTstate,
    Counter::PyReadErrors,
    Counter::PyTruncated,
    Counter::PyTstateWalks,
    Counter::PyThreadBudget,
    Counter::PyBadProcInfo,
    Counter::PyPidNsErrors,
    Counter::PyInvalidFrames,
    Counter::PyCodeUnreadable,
];

impl CounterTotals {
    /// Sum per-CPU values: `per_cpu(counter)` returns that counter's value on every CPU.
    pub fn from_per_cpu<E>(
        mut per_cpu: impl FnMut(Counter) -> Result<Vec<u64>, E>,
    ) -> Result<CounterTotals, E> {
        let mut totals = CounterTotals::default();
        for counter in Counter::ALL {
            let values = per_cpu(counter)?;
            totals.kernel[counter as usize] = values.iter().fold(0u64, |a, &v| a.wrapping_add(v));
        }
        Ok(totals)
    }

    /// One kernel counter.
    pub fn get(&self, counter: Counter) -> u64 {
        self.kernel[counter as usize]
    }

    /// Samples lost because the ring buffer was full.
    pub fn lost_samples(&self) -> u64 {
        self.get(Counter::LostSamples)
    }

    /// Every counter as `(name, value)`: the kernel counters in index order, then `malformed`.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL
            .iter()
            .map(|&c| (c.name(), self.get(c)))
            .chain(std::iter::once(("malformed", self.malformed)))
    }

    /// The counters of the in-kernel Python walk, as `(name, value)` (zeros included).
    pub fn python(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        PYTHON_COUNTERS.iter().map(|&c| (c.name(), self.get(c)))
    }

    /// The counters that mean loss or error ([`KERNEL_FAILURES`], and undecodable records),
    /// as failures.
    pub fn failures(&self) -> Failures {
        let mut f = Failures::default();
        for c in KERNEL_FAILURES {
            f.add(Failure::Kernel(c), self.get(c));
        }
        f.add(Failure::MalformedRecords, self.malformed);
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_cpu_for_every_counter() {
        let totals = CounterTotals::from_per_cpu::<()>(|c| Ok(vec![c as u64, 10, 100])).unwrap();
        for c in Counter::ALL {
            assert_eq!(totals.get(c), c as u64 + 110, "{}", c.name());
        }
        assert_eq!(totals.lost_samples(), Counter::LostSamples as u64 + 110);
    }

    #[test]
    fn sum_wraps_instead_of_panicking() {
        let totals = CounterTotals::from_per_cpu::<()>(|_| Ok(vec![u64::MAX, 2])).unwrap();
        assert_eq!(totals.get(Counter::Runs), 1);
    }

    #[test]
    fn read_errors_propagate() {
        let err = CounterTotals::from_per_cpu(|c| {
            if c == Counter::Sent {
                Err("boom")
            } else {
                Ok(vec![1])
            }
        });
        assert_eq!(err, Err("boom"));
    }

    #[test]
    fn iter_names_every_counter_once() {
        let mut totals = CounterTotals {
            malformed: 3,
            ..Default::default()
        };
        totals.kernel[Counter::Idle as usize] = 9;
        let all: Vec<_> = totals.iter().collect();
        assert_eq!(all.len(), COUNTERS_LEN as usize + 1);
        assert!(all.contains(&("idle", 9)));
        assert!(all.contains(&("malformed", 3)));
        totals.kernel[Counter::PyReadErrors as usize] = 2;
        totals.kernel[Counter::PyNoTstate as usize] = 5;
        totals.kernel[Counter::Sent as usize] = 7;
        let errors = totals.failures().named();
        assert_eq!(
            errors,
            [
                ("malformed_records".to_string(), 3),
                ("py_read_errors".to_string(), 2)
            ],
            "only the counters that mean loss or error, only when not 0"
        );
        let python: Vec<_> = totals.python().map(|(n, _)| n).collect();
        assert_eq!(python.len(), 10);
        assert!(python.iter().all(|n| n.starts_with("py_")));
        // Every `py_*` counter is listed as a Python counter.
        let named = Counter::ALL
            .iter()
            .filter(|c| c.name().starts_with("py_"))
            .count();
        assert_eq!(named, python.len());
    }
}
