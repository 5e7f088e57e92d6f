//! The one percentile both halves of the bench use: the guest for row 5's per-run p50 and p99,
//! the host for section 7's latencies.

/// Nearest-rank percentile `q` (0 to 1) of `values`, in any order (0 when empty): the smallest
/// value with at least `q` of them at or below it.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The p50 and p99 of `values`, labelled.
pub fn p50_p99(values: &[f64]) -> [(&'static str, f64); 2] {
    [("p50", percentile(values, 0.5)), ("p99", percentile(values, 0.99))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_of_the_sorted_values() {
        let values: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        assert_eq!(p50_p99(&values), [("p50", 100.0), ("p99", 198.0)]);
        assert_eq!(p50_p99(&[7.0]), [("p50", 7.0), ("p99", 7.0)]);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
