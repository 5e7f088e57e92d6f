//! Latency statistics: nearest-rank percentiles, mean, standard deviation and a power-of-two
//! histogram, over samples in microseconds.

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
}
