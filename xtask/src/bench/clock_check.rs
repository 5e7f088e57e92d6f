//! `cargo xtask clock-check --dir DIR`: does a guest's clock keep the host's, and what is its
//! timer floor? Run in a VM (`cargo xtask vm --no-amdgpu -- …/xtask clock-check --dir
//! "$GPREEMPT_VM_OUT"`) after a change to the guests' clock settings (`tsc=reliable`, xtask
//! vm.rs). The reference is the host's own clock, read through the shared 9p directory: qemu's 9p
//! server sets a file's mtime from the host's clock when the guest writes it, so the guest's
//! CLOCK_REALTIME against that mtime, at the start and the end of the run, gives the drift (to
//! within the 9p round trip, about a millisecond). Between the two, the timer floor of the
//! co-location bench (`colocation::timer_floor`, a SCHED_FIFO thread sleeping to 200 µs
//! deadlines, alone then beside busy loops) runs for the length of the check.

use std::{
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

#[derive(Args, Debug)]
pub struct ClockCheckArgs {
    /// A directory whose file times come from the reference clock (the VM's shared output dir).
    #[arg(long)]
    pub dir: PathBuf,
    /// Seconds each half of the timer floor runs (the drift is measured over both).
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// This clock and the reference's, read once: (ours, theirs), seconds since the epoch.
fn stamp(dir: &Path) -> Result<(f64, f64)> {
    let file = dir.join("clock-check.stamp");
    let before = SystemTime::now();
    fs::write(&file, b"x").with_context(|| format!("writing {}", file.display()))?;
    let after = SystemTime::now();
    let theirs = fs::metadata(&file)?.modified()?;
    // Ours: the middle of the write, which is when the reference stamped it.
    Ok(((secs(before) + secs(after)) / 2.0, secs(theirs)))
}

pub fn run(args: &ClockCheckArgs) -> Result<()> {
    let (ours0, theirs0) = stamp(&args.dir)?;
    let (idle, idle_cpu) = super::colocation::timer_floor_run(0, args.seconds)?;
    let (busy, busy_cpu) = super::colocation::timer_floor_run(3, args.seconds)?;
    let (ours1, theirs1) = stamp(&args.dir)?;
    let (ours, theirs) = (ours1 - ours0, theirs1 - theirs0);
    println!(
        "{}",
        json!({
            "elapsed_s": theirs,
            "offset_start_ms": (ours0 - theirs0) * 1e3,
            "offset_end_ms": (ours1 - theirs1) * 1e3,
            "drift_ms": (ours - theirs) * 1e3,
            "drift_ppm": if theirs > 0.0 { (ours - theirs) / theirs * 1e6 } else { 0.0 },
            "floor_alone_us": { "p50": idle.p50, "p99": idle.p99, "max": idle.max, "cpu_pct": idle_cpu },
            "floor_busy_us": { "p50": busy.p50, "p99": busy.p99, "max": busy.max, "cpu_pct": busy_cpu },
        })
    );
    Ok(())
}
