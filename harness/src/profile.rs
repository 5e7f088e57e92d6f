//! Cost profiles: what the model ioctls, the model GPU's context switches and the model
//! `cu_occupancy` reads cost, with their sources. PROFILES.md is the reviewed copy of these
//! figures (committed before anything was measured); a change here changes it too.

use serde::Serialize;

use crate::rng::Rng;

const US: f64 = 1_000.0;

/// A cost distribution, ns.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dist {
    Fixed(u64),
    /// Uniform in `[lo, hi]`.
    Uniform {
        lo: u64,
        hi: u64,
    },
    /// Inverse CDF through (probability, ns) points, linear between them; the first point has
    /// probability 0 and the last 1.
    Quantiles(Vec<(f64, f64)>),
}

impl Dist {
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Self::Fixed(ns) => *ns,
            Self::Uniform { lo, hi } => rng.between(*lo, *hi),
            Self::Quantiles(points) => {
                let u = rng.unit();
                let i = points.iter().position(|&(p, _)| p >= u).unwrap_or(points.len() - 1).max(1);
                let ((p0, v0), (p1, v1)) = (points[i - 1], points[i]);
                let f = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
                (v0 + f * (v1 - v0)).max(0.0) as u64
            }
        }
    }

    /// The least value it can take, ns.
    pub fn min(&self) -> u64 {
        match self {
            Self::Fixed(ns) | Self::Uniform { lo: ns, .. } => *ns,
            Self::Quantiles(points) => points.first().map_or(0, |&(_, v)| v.max(0.0) as u64),
        }
    }

    /// The median, ns (for the report).
    pub fn median(&self) -> u64 {
        match self {
            Self::Fixed(ns) => *ns,
            Self::Uniform { lo, hi } => (lo + hi) / 2,
            Self::Quantiles(points) => {
                let i = points.iter().position(|&(p, _)| p >= 0.5).unwrap_or(points.len() - 1).max(1);
                let ((p0, v0), (p1, v1)) = (points[i - 1], points[i]);
                (v0 + (0.5 - p0) / (p1 - p0).max(f64::EPSILON) * (v1 - v0)) as u64
            }
        }
    }

    fn scaled(&self, k: f64) -> Self {
        let s = |ns: u64| (ns as f64 * k) as u64;
        match self {
            Self::Fixed(ns) => Self::Fixed(s(*ns)),
            Self::Uniform { lo, hi } => Self::Uniform { lo: s(*lo), hi: s(*hi) },
            Self::Quantiles(p) => Self::Quantiles(p.iter().map(|&(q, v)| (q, v * k)).collect()),
        }
    }
}

/// Quantiles given in µs as (min, p50, p90, p99, max).
fn quantiles_us(min: f64, p50: f64, p90: f64, p99: f64, max: f64, minus_us: f64, floor_us: f64) -> Dist {
    let v = |x: f64| (x - minus_us).max(floor_us) * US;
    Dist::Quantiles(vec![(0.0, v(min)), (0.5, v(p50)), (0.9, v(p90)), (0.99, v(p99)), (1.0, v(max))])
}

/// Every cost the models charge.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    pub name: String,
    /// SUSPEND_QUEUES of one process, without the CWSR saves (added per running queue).
    pub suspend: Dist,
    pub resume: Dist,
    /// CWSR save per queue with a dispatch running when an unmap begins, ns.
    pub save_ns: u64,
    /// Restore per preempted dispatch when its queue is mapped again, ns.
    pub restore_ns: u64,
    /// One `cu_occupancy` read (CPU spin on the reader's thread).
    pub occupancy_read: Dist,
    /// Extra sleep per reaction step (a guest's timer floor beyond the 200 µs poll), if any.
    pub step_stretch: Option<Dist>,
}

/// The reaction thread's default poll, which the guest's stretch is measured against.
const POLL_US: f64 = 200.0;

impl Profile {
    /// §7's measured costs (BENCHMARKS.json `colocation` at `80409da`; PROFILES.md).
    pub fn emulator() -> Self {
        let save_us = 200.0;
        Self {
            name: "emulator".into(),
            // §7.3 1-offline `suspend_us`; the save the model adds is taken out.
            suspend: quantiles_us(638.0, 1323.0, 4400.0, 8106.0, 8118.0, save_us, 100.0),
            // §7.3 1-offline `resume_us`.
            resume: quantiles_us(482.0, 1088.0, 3388.0, 9473.0, 11642.0, 0.0, 0.0),
            save_ns: (save_us * US) as u64,
            restore_ns: (100.0 * US) as u64,
            occupancy_read: Dist::Fixed(0),
            // `colocation.timer_floor.busy`: p50 232, p90 620, p99 4895, max 12635 µs per 200 µs sleep.
            step_stretch: Some(quantiles_us(200.0, 232.0, 620.0, 4895.0, 12635.0, POLL_US, 0.0)),
        }
    }

    /// The MI300X central point (PROFILES.md).
    pub fn mi300x() -> Self {
        Self {
            name: "mi300x".into(),
            suspend: Dist::Uniform { lo: 450_000, hi: 750_000 },
            resume: Dist::Uniform { lo: 375_000, hi: 625_000 },
            save_ns: 100_000,
            restore_ns: 50_000,
            occupancy_read: Dist::Fixed(50_000),
            step_stretch: None,
        }
    }

    /// The MI300X sweep: each unknown to either end of its range, the others central.
    pub fn mi300x_sweep() -> Vec<Self> {
        let c = Self::mi300x();
        let with = |name: &str, f: &dyn Fn(&mut Self)| {
            let mut p = c.clone();
            p.name = format!("mi300x-{name}");
            f(&mut p);
            p
        };
        vec![
            with("suspend-0.2ms", &|p| {
                p.suspend = p.suspend.scaled(0.2 / 0.6);
                p.resume = p.resume.scaled(0.2 / 0.6);
            }),
            with("suspend-2ms", &|p| {
                p.suspend = p.suspend.scaled(2.0 / 0.6);
                p.resume = p.resume.scaled(2.0 / 0.6);
            }),
            with("save-35us", &|p| {
                p.save_ns = 35_000;
                p.restore_ns = 17_500;
            }),
            with("save-200us", &|p| {
                p.save_ns = 200_000;
                p.restore_ns = 100_000;
            }),
            with("occupancy-5us", &|p| p.occupancy_read = Dist::Fixed(5_000)),
            with("occupancy-500us", &|p| p.occupancy_read = Dist::Fixed(500_000)),
        ]
    }

    /// A profile by name (`emulator`, `mi300x`, or a sweep point's name).
    pub fn by_name(name: &str) -> Option<Self> {
        [Self::emulator(), Self::mi300x()].into_iter().chain(Self::mi300x_sweep()).find(|p| p.name == name)
    }
}

/// §7.3's 1-offline point and the tolerance the emulator profile must reproduce it within
/// (PROFILES.md, "Tolerance").
pub mod section7 {
    pub const KEPT_SCHEDULE: f64 = 0.80;
    pub const KEPT_SCHEDULE_TOLERANCE: f64 = 0.08;
    pub const SUSPENDS_PER_REQUEST: f64 = 157.0 / 200.0;
    pub const SUSPENDS_PER_REQUEST_TOLERANCE: f64 = 0.20;
    pub const KEPT_COLOCATED: f64 = 0.93;
    pub const KEPT_COLOCATED_TOLERANCE: f64 = 0.05;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_sampling_stays_within_the_given_points_and_hits_the_median() {
        let d = quantiles_us(638.0, 1323.0, 4400.0, 8106.0, 8118.0, 200.0, 100.0);
        assert_eq!(d.median(), 1_123_000);
        let mut rng = Rng::new(1);
        let mut xs: Vec<u64> = (0..2001).map(|_| d.sample(&mut rng)).collect();
        xs.sort_unstable();
        assert!(xs[0] >= 438_000 && xs[2000] <= 7_918_000);
        let p50 = xs[1000] as f64;
        assert!((p50 - 1_123_000.0).abs() < 150_000.0, "p50 {p50}");
    }

    #[test]
    fn every_profile_is_found_by_its_name() {
        for p in [Profile::emulator(), Profile::mi300x()].into_iter().chain(Profile::mi300x_sweep()) {
            assert_eq!(Profile::by_name(&p.name).as_ref(), Some(&p));
        }
        assert_eq!(Profile::mi300x_sweep().len(), 6);
        assert_eq!(Profile::by_name("mi300x-save-35us").map(|p| p.save_ns), Some(35_000));
    }
}
