//! The figures the benches take from several samples or runs.

/// The value at fraction `p` of sorted `values` (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

/// The run of median `secs` among `runs` (the slower middle one of an even
/// count: on a shared box, one run can be slowed by a neighbour); `None`
/// when there are none.
pub fn median_run<T: Clone>(runs: &[T], secs: impl Fn(&T) -> f64) -> Option<T> {
    let mut sorted: Vec<&T> = runs.iter().collect();
    sorted.sort_by(|a, b| secs(a).total_cmp(&secs(b)));
    sorted.get(sorted.len() / 2).map(|&run| run.clone())
}
