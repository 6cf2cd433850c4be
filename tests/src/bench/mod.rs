//! Benchmarks behind `cargo xtask bench`. Each measures Weft side by side
//! with its baseline in one run and reports ratios; none of them is a test.

pub mod control_plane;
pub mod datapath;
pub mod egress;
pub mod leases;
pub mod scale;

/// A `--flag VALUE` from the arguments, parsed.
pub fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// Percentile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
