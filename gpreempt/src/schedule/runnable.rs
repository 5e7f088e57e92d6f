//! How many offline processes are kept runnable on a GPU while it has no online work
//! (`--runnable`), and, for `auto`, the rule that learns it from the GPU itself. Pure: no clock
//! of its own, no I/O.
//!
//! Why fewer than all: on HWS GPUs each SUSPEND_QUEUES unmaps every queue of the device and KFD
//! takes one process per call (docs/kfd.md), so with K offline processes runnable every online
//! burst pays K SUSPENDs before its work runs (MI300X profile: 0.45-0.75 ms each). The native
//! harness (BENCHMARKS §9.5, Poisson with 2 and 3 compute-bound trainers) measured one runnable
//! against all: the requests finding the offline side held 100 % against 98 %, the offline side
//! 89 % of the idle GPU time against 85 / 83 %. Why not always one: a trainer that cannot fill the
//! GPU alone (loader-bound: one step in flight, host work between steps) leaves the GPU idle
//! while the others are parked, which is the offline throughput parking was meant to keep.
//!
//! `auto` starts with all of them runnable (nothing is parked on a guess) and watches those
//! running while the GPU has no online work: every [`SAMPLE_NS`] it asks whether any of them has
//! something on the GPU (a queue with `write > read`, or a wave in flight). Over a window of
//! [`WINDOW`] looks, a GPU found with nothing of theirs less than [`LOWER_BELOW`] of the time for
//! [`CALM_WINDOWS`] windows in a row gets one fewer runnable, down to one; one found so more than
//! [`RAISE_ABOVE`] of the time gets one more (a loader-bound trainer's GPU is idle for its host
//! work, 5-25 ms of every step, so loader-bound trainers are never lowered from all).

use std::{fmt, str::FromStr};

use serde::{Serialize, Serializer};

/// `--runnable`: how many offline processes run on a GPU while it has no online work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runnable {
    /// Every offline process (`all`, or `0`).
    All,
    /// As many as keep the GPU busy, learnt per GPU ([`RunnableTarget`]).
    #[default]
    Auto,
    /// At most this many (≥ 1), the others parked and taking turns.
    Keep(usize),
}

/// A `--runnable` value that is none of `auto`, `all` or a count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a runnable count: give `auto` (as many as keep the GPU busy), `all` (or 0), or a number such as 1"
)]
pub struct RunnableError(String);

impl FromStr for Runnable {
    type Err = RunnableError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "all" | "0" => Ok(Self::All),
            n => match n.parse::<usize>() {
                Ok(n) => Ok(Self::Keep(n)),
                Err(_) => Err(RunnableError(s.to_owned())),
            },
        }
    }
}

impl fmt::Display for Runnable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Auto => f.write_str("auto"),
            Self::Keep(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Runnable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Runnable {
    /// A config file may give the count as a number (`runnable = 1`) or as the flag's words
    /// (`runnable = "auto"`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(0) => Ok(Self::All),
            Raw::Count(n) => Ok(Self::Keep(usize::try_from(n).map_err(serde::de::Error::custom)?)),
            Raw::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// How often `auto` looks at the runnable processes while the GPU has no online work: a look
/// reads their queues' indices and, when those are drained, `cu_occupancy` (the kernel asks the
/// hardware: MI300X profile 50 µs), so 1 % of a core at most.
pub const SAMPLE_NS: u64 = 5_000_000;
/// Looks per decision. The reaction thread looks at its steps, which come every 10 ms or less
/// while it waits on the probes (the cross-check), so a window spans 0.25-0.5 s of idle time, a
/// dozen loader-bound steps. Two loader-bound trainers running together leave the GPU idle ~14 %
/// of the looks (the native harness): a window with at most one such look comes by chance
/// with p < 0.3 %.
pub const WINDOW: u32 = 50;
/// More than this share of a window's looks found nothing of the runnable processes on the GPU:
/// one more runs. A compute-bound trainer leaves its queue empty only between two steps.
pub const RAISE_ABOVE: f64 = 0.10;
/// Less than this share (at most one look of a window) for [`CALM_WINDOWS`] windows in a row:
/// one fewer runs.
pub const LOWER_BELOW: f64 = 0.021;
pub const CALM_WINDOWS: u32 = 2;

/// What one window decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetChange {
    Raised(usize),
    Lowered(usize),
}

/// `auto`'s learnt count for one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnableTarget {
    target: usize,
    next_sample_ns: u64,
    looks: u32,
    starved: u32,
    calm: u32,
}

impl Default for RunnableTarget {
    /// All runnable until the GPU shows fewer keep it busy.
    fn default() -> Self {
        Self { target: usize::MAX, next_sample_ns: 0, looks: 0, starved: 0, calm: 0 }
    }
}

impl RunnableTarget {
    /// How many of `processes` run (at least one, at most all).
    pub fn of(&self, processes: usize) -> usize {
        self.target.clamp(1, processes.max(1))
    }

    /// A look is due at `now` (the GPU has no online work and its offline side runs).
    pub fn look_due(&self, now: u64) -> bool {
        now >= self.next_sample_ns
    }

    /// One look at `now`: `starved` when none of the runnable processes had anything on the GPU.
    /// `processes`: the offline processes with queues there (the target never passes them).
    pub fn look(&mut self, now: u64, starved: bool, processes: usize) -> Option<TargetChange> {
        self.next_sample_ns = now + SAMPLE_NS;
        self.looks += 1;
        self.starved += u32::from(starved);
        if self.looks < WINDOW {
            return None;
        }
        let share = f64::from(self.starved) / f64::from(self.looks);
        self.looks = 0;
        self.starved = 0;
        let current = self.of(processes);
        if share > RAISE_ABOVE {
            self.calm = 0;
            if current < processes {
                self.target = current + 1;
                return Some(TargetChange::Raised(self.target));
            }
            self.target = current;
            return None;
        }
        if share < LOWER_BELOW && current > 1 {
            self.calm += 1;
            if self.calm >= CALM_WINDOWS {
                self.calm = 0;
                self.target = current - 1;
                return Some(TargetChange::Lowered(self.target));
            }
        } else {
            self.calm = 0;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_takes_auto_all_zero_and_counts_and_names_the_syntax_otherwise() {
        assert_eq!("auto".parse(), Ok(Runnable::Auto));
        assert_eq!("all".parse(), Ok(Runnable::All));
        assert_eq!("0".parse(), Ok(Runnable::All));
        assert_eq!("2".parse(), Ok(Runnable::Keep(2)));
        let err = "some".parse::<Runnable>().unwrap_err().to_string();
        assert_eq!(
            err,
            "`some` is not a runnable count: give `auto` (as many as keep the GPU busy), `all` (or 0), or a number such as 1"
        );
        assert_eq!(Runnable::default(), Runnable::Auto);
        assert_eq!([Runnable::All, Runnable::Auto, Runnable::Keep(3)].map(|r| r.to_string()), ["all", "auto", "3"]);
    }

    #[test]
    fn a_config_gives_it_as_a_number_or_a_word() {
        #[derive(serde::Deserialize)]
        struct C {
            runnable: Runnable,
        }
        let of = |s: &str| toml::from_str::<C>(s).map(|c| c.runnable);
        assert_eq!(of("runnable = 1").ok(), Some(Runnable::Keep(1)));
        assert_eq!(of("runnable = 0").ok(), Some(Runnable::All));
        assert_eq!(of("runnable = \"auto\"").ok(), Some(Runnable::Auto));
        assert!(of("runnable = \"many\"").is_err());
    }

    /// Looks every SAMPLE_NS (from the next due) with `starved(i)` for look i; the changes, with the look they came at.
    fn run(
        t: &mut RunnableTarget,
        looks: u32,
        processes: usize,
        starved: impl Fn(u32) -> bool,
    ) -> Vec<(u32, TargetChange)> {
        let mut out = Vec::new();
        for i in 0..looks {
            let now = t.next_sample_ns;
            assert!(t.look_due(now));
            if let Some(c) = t.look(now, starved(i), processes) {
                out.push((i, c));
            }
        }
        out
    }

    #[test]
    fn compute_bound_trainers_are_lowered_to_one_after_calm_windows_each() {
        // A compute-bound trainer's queue is drained only between two steps: 1 look in 120.
        let mut t = RunnableTarget::default();
        assert_eq!(t.of(3), 3);
        let w = CALM_WINDOWS * WINDOW;
        let changes = run(&mut t, 3 * w, 3, |i| i % 120 == 7);
        assert_eq!(changes, [(w - 1, TargetChange::Lowered(2)), (2 * w - 1, TargetChange::Lowered(1))]);
        assert_eq!(t.of(3), 1);
    }

    #[test]
    fn loader_bound_trainers_all_stay_runnable_and_a_lowered_gpu_found_idle_is_raised_again() {
        // A loader-bound trainer leaves the GPU idle about half the time (5-25 ms of host work
        // per 16 ms step); with k of them running about 0.5^k (independent): 25 % with two.
        let mut t = RunnableTarget::default();
        assert_eq!(run(&mut t, 10 * WINDOW, 2, |i| i % 4 == 0), []);
        assert_eq!(t.of(2), 2);
        // Lowered to one (the trainers were busy), then they turn loader-bound: one window raises.
        let mut t = RunnableTarget { target: 1, ..RunnableTarget::default() };
        assert_eq!(run(&mut t, WINDOW, 3, |i| i % 2 == 0), [(WINDOW - 1, TargetChange::Raised(2))]);
        assert_eq!(run(&mut t, WINDOW, 3, |i| i % 4 == 0), [(WINDOW - 1, TargetChange::Raised(3))]);
        // All run already: starved windows change nothing.
        assert_eq!(run(&mut t, WINDOW, 3, |i| i % 2 == 0), []);
        assert_eq!(t.of(3), 3);
    }

    #[test]
    fn a_busy_gpu_lowers_the_count_only_after_calm_windows_in_a_row() {
        let mut t = RunnableTarget::default();
        // CALM_WINDOWS - 1 calm windows, then one with 6 % starved (above LOWER_BELOW, below
        // RAISE_ABOVE): the calm run starts over.
        let changes = run(&mut t, CALM_WINDOWS * WINDOW, 3, |i| i >= (CALM_WINDOWS - 1) * WINDOW && i % 16 == 0);
        assert_eq!(changes, []);
        let changes = run(&mut t, CALM_WINDOWS * WINDOW, 3, |_| false);
        assert_eq!(changes, [(CALM_WINDOWS * WINDOW - 1, TargetChange::Lowered(2))]);
        assert_eq!(t.of(3), 2);
    }

    #[test]
    fn the_count_stays_within_the_processes_there() {
        let t = RunnableTarget::default();
        assert_eq!((t.of(2), t.of(0)), (2, 1));
        let t = RunnableTarget { target: 2, ..RunnableTarget::default() };
        assert_eq!((t.of(5), t.of(1)), (2, 1));
        // A look is due only SAMPLE_NS after the last.
        let mut t = RunnableTarget::default();
        t.look(100, false, 2);
        assert!(!t.look_due(100 + SAMPLE_NS - 1));
        assert!(t.look_due(100 + SAMPLE_NS));
    }
}
