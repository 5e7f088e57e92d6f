//! Latency statistics: nearest-rank percentiles, mean, standard deviation and a power-of-two
//! histogram, over samples in microseconds.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Summary of a set of samples (all in the samples' unit).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    /// Population standard deviation.
    pub stddev: f64,
}

impl Summary {
    /// `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let mean = sorted.iter().sum::<f64>() / n;
        let var = sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Some(Self {
            count: sorted.len(),
            min: sorted[0],
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean,
            stddev: var.sqrt(),
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty samples: the smallest value with at least `p`%
/// of the samples at or below it.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[nearest_rank(sorted.len(), p)]
}

/// 0-based index of the nearest-rank `p`th percentile in `len` (> 0) sorted samples:
/// `ceil(p/100 · len)`, 1-based, at least 1.
pub fn nearest_rank(len: usize, p: f64) -> usize {
    let rank = ((p / 100.0) * len as f64).ceil() as usize;
    rank.clamp(1, len) - 1
}

/// One histogram bucket: samples in `[lo, hi)`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Bucket {
    pub lo: f64,
    pub hi: f64,
    pub count: usize,
}

/// Power-of-two buckets from the first occupied one to the last (empty ones between included,
/// so a printed histogram shows gaps).
pub fn histogram(samples: &[f64]) -> Vec<Bucket> {
    let index = |x: f64| if x < 1.0 { 0 } else { x.log2().floor() as i32 + 1 };
    let Some(lo) = samples.iter().map(|&x| index(x)).min() else { return Vec::new() };
    let hi = samples.iter().map(|&x| index(x)).max().unwrap_or(lo);
    (lo..=hi)
        .map(|i| {
            let (b_lo, b_hi) = if i == 0 { (0.0, 1.0) } else { (2f64.powi(i - 1), 2f64.powi(i)) };
            Bucket { lo: b_lo, hi: b_hi, count: samples.iter().filter(|&&x| index(x) == i).count() }
        })
        .collect()
}

/// Text rendering: one line per bucket with a bar scaled to `width`.
pub fn render_histogram(buckets: &[Bucket], unit: &str, width: usize) -> String {
    let most = buckets.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    buckets
        .iter()
        .map(|b| {
            let bar = "#".repeat((b.count * width).div_ceil(most).min(width));
            format!("  [{:>8} , {:>8}) {unit} {:>7}  {bar}\n", b.lo, b.hi, b.count)
        })
        .collect()
}

/// Sub-buckets per power of two of [`Histogram`]: a recorded value is known to 1/16 (6.25 %).
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A log-linear histogram of nanosecond values that one thread records into without allocating
/// or locking (relaxed atomic counters) while another reads it: the reaction thread's step
/// intervals. Percentiles are the recorded bucket's upper bound, so they overstate by at most
/// 1/16; `min`, `max` and `mean` are exact.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
            max: AtomicU64::new(0),
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    ((e - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The largest value of bucket `i`.
fn bucket_high(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let e = i / SUB + u64::from(SUB_BITS) - 1;
    let sub = i % SUB;
    let low = (1u64 << e) | (sub << (e - u64::from(SUB_BITS)));
    low.saturating_add((1u64 << (e - u64::from(SUB_BITS))) - 1)
}

impl Histogram {
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.min.fetch_min(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The nearest-rank percentile `p` (0-100), ns: the upper bound of its bucket, at most `max`.
    pub fn percentile_ns(&self, p: f64) -> Option<u64> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = nearest_rank(total as usize, p) as u64 + 1;
        let mut seen = 0;
        for (i, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_high(i).min(self.max.load(Ordering::Relaxed)));
            }
        }
        Some(self.max.load(Ordering::Relaxed))
    }

    /// The summary in microseconds (`stddev` is not kept: 0).
    pub fn summary_us(&self) -> Option<Summary> {
        let count = self.count();
        let us = |ns: u64| ns as f64 / 1e3;
        Some(Summary {
            count: count as usize,
            min: us(self.min.load(Ordering::Relaxed)),
            p50: us(self.percentile_ns(50.0)?),
            p90: us(self.percentile_ns(90.0)?),
            p99: us(self.percentile_ns(99.0)?),
            max: us(self.max.load(Ordering::Relaxed)),
            mean: us(self.sum.load(Ordering::Relaxed)) / count as f64,
            stddev: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!((s.count, s.min, s.p50, s.p90, s.p99, s.max), (100, 1.0, 50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.mean, 50.5);
        assert!((s.stddev - 28.866_070_047_722_12).abs() < 1e-9);
        let one = Summary::of(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99, one.stddev), (7.0, 7.0, 0.0));
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.0), 1.0);
    }

    #[test]
    fn histogram_buckets_are_powers_of_two_with_gaps() {
        let h = histogram(&[0.5, 3.0, 3.9, 17.0]);
        let shape: Vec<(f64, f64, usize)> = h.iter().map(|b| (b.lo, b.hi, b.count)).collect();
        assert_eq!(
            shape,
            vec![(0.0, 1.0, 1), (1.0, 2.0, 0), (2.0, 4.0, 2), (4.0, 8.0, 0), (8.0, 16.0, 0), (16.0, 32.0, 1)]
        );
        let text = render_histogram(&h, "us", 10);
        assert_eq!(text.lines().count(), 6);
        assert!(text.lines().nth(2).unwrap().ends_with("2  ##########"));
        assert!(histogram(&[]).is_empty());
    }

    #[test]
    fn the_log_histogram_places_every_value_within_a_sixteenth() {
        for v in [0u64, 1, 15, 16, 17, 31, 32, 200_000, 1_000_000, 123_456_789, u64::MAX / 3] {
            let i = bucket_of(v);
            assert!(bucket_high(i) >= v, "{v}: bucket {i} ends at {}", bucket_high(i));
            assert!(i == 0 || bucket_high(i - 1) < v, "{v}: bucket {i} is not the first that holds it");
            assert!((bucket_high(i) - v) as f64 <= v as f64 / 16.0, "{v}: bucket too wide");
        }
        let h = Histogram::default();
        assert_eq!(h.summary_us(), None);
        for v in 1..=100u64 {
            h.record(v * 1_000);
        }
        let s = h.summary_us().unwrap();
        assert_eq!((s.count, s.min, s.max, s.mean), (100, 1.0, 100.0, 50.5));
        // Nearest rank 50 is 50 µs; its bucket [49152, 51199] ns reports its upper bound.
        assert_eq!(h.percentile_ns(50.0), Some(51_199));
        // p99 is 99 µs, in [98304, 102399]: capped at the exact max.
        assert_eq!(h.percentile_ns(99.0), Some(100_000));
    }
}
