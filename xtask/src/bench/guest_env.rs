//! What both guest halves (rows 1-6 in `guest.rs`, section 7 in `colocation.rs`) share inside the
//! VM: `xtask bench-guest`'s arguments, the KFD emulator's parameters and the /proc reads.

use std::{
    fs,
    path::{Path, PathBuf},
    thread,
};

use anyhow::{Context, Result};
use clap::Args;

use super::results::Scenario;

const EMU_PARAMS: &str = "/sys/module/kfd_emu/parameters";

/// File name of the Rust twin of the C baseline (xtask/bench/dbg_pair.rs), next to `--dbg-pair`.
pub const RUST_PAIR: &str = "dbg-pair-rs";

#[derive(Args, Debug)]
pub struct GuestArgs {
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Fewer repetitions and smaller loops (`cargo xtask bench --quick`).
    #[arg(long)]
    pub quick: bool,
    /// Release binaries: gpreempt and the test helpers.
    #[arg(long)]
    pub bin: PathBuf,
    /// The C baseline of the controller row (xtask/bench/dbg_pair.c, compiled on the host); its
    /// Rust twin [`RUST_PAIR`] is in the same directory.
    #[arg(long)]
    pub dbg_pair: PathBuf,
    /// The JSON results file.
    #[arg(long)]
    pub out: PathBuf,
    /// Emulator scenario: only row 5, the controller's userspace time per cycle.
    #[arg(long, conflicts_with = "no_controller")]
    pub controller_only: bool,
    /// Emulator scenario: every row but row 5.
    #[arg(long)]
    pub no_controller: bool,
    /// Co-location scenario: the previous global policy's `gpreempt` binary.
    #[arg(long)]
    pub previous_gpreempt: Option<PathBuf>,
    /// Co-location scenario: the commit that binary was built from (for the report).
    #[arg(long)]
    pub previous_commit: Option<String>,
    /// Co-location scenario: only these of its scenarios (`single-gpu`, `two-gpu`, `offline-sweep`;
    /// default all).
    #[arg(long, value_delimiter = ',')]
    pub colocation_scenarios: Vec<String>,
}

/// A parameter of the KFD emulator module.
pub fn emu_param(name: &str) -> Result<u64> {
    let path = Path::new(EMU_PARAMS).join(name);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.trim().parse().with_context(|| format!("{}: {text:?}", path.display()))
}

pub fn set_emu_param(name: &str, value: u64) -> Result<()> {
    let path = Path::new(EMU_PARAMS).join(name);
    fs::write(&path, value.to_string()).with_context(|| format!("writing {}", path.display()))
}

/// User + system CPU time of process `pid` so far (all threads), ns.
pub fn process_cpu_ns(pid: u32) -> Option<f64> {
    stat_cpu_ns(&format!("/proc/{pid}/stat"))
}

/// User + system CPU time so far of the thread of process `pid` named `comm`, ns (`None`: no
/// such thread, or /proc could not be read).
pub fn thread_cpu_ns(pid: u32, comm: &str) -> Option<f64> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let task = tasks.flatten().find(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == comm))?;
    stat_cpu_ns(&task.path().join("stat").to_string_lossy())
}

/// utime + stime of a `/proc/…/stat` file, ns.
fn stat_cpu_ns(path: &str) -> Option<f64> {
    let stat = fs::read_to_string(path).ok()?;
    // Fields after the parenthesised comm: state is the 1st, utime the 12th, stime the 13th.
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks * 1e9 / hz)
}

/// The guest kernel's release ("" if unreadable: it only labels the results).
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned()
}

/// The guest's CPUs.
pub fn cpus() -> usize {
    thread::available_parallelism().map_or(1, std::num::NonZero::get)
}
