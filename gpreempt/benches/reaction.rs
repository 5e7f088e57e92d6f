//! The userspace reaction path of `gpreempt schedule`, natively: from an online queue's write
//! dispatch index moving past its read index to the SUSPEND_QUEUES call on the offline session.
//! The real [`Scheduler`] runs (its reaction thread, the `process_vm_readv` of the indices, the
//! per-GPU policy, the suspend dispatch); only the debug-trap session is replaced by one that
//! stamps the moment `suspend` is called instead of issuing the ioctl, and the "online process"
//! is this process, whose two index words the reaction thread reads as it would another's.
//!
//! Paced from a thread of its own: each sample posts one dispatch (write index + 1) and ends at
//! the stamp; the dispatch is then consumed (read index = write index), the policy resumes after
//! its idle time, and the next dispatch is posted at least `GAP` later. The reaction thread
//! busy-polls (`--busy-poll`), so a sample is the detection (up to one step) plus the step's
//! work, with no sleep. Prints one JSON object: samples, p50/p99/max in ns, and the loop's mean
//! step.
//!
//! `cargo bench -p gpreempt --bench reaction [-- --quick]`

use std::{
    fs,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use gpreempt::{
    clock::monotonic_ns,
    controller::{
        control::Control,
        vocabulary::{Batch, DebugError, Detached, Options, Selection, SessionNotice},
    },
    domain::{GpuId, HostPid},
    host::{roots::Roots, select::Selector},
    kfd::uapi::QueueSnapshotEntry,
    schedule::{
        ScheduleConfig, ScheduleEvent, Scheduler,
        discover::Discovery,
        policy::PolicyConfig,
        seams::{ControlSide, Seams, SysfsOccupancy},
    },
    stats::Summary,
};
use serde_json::json;

/// The online queue's AQL indices, in this process.
static READ: AtomicU64 = AtomicU64::new(0);
static WRITE: AtomicU64 = AtomicU64::new(0);
/// When the last SUSPEND was called (monotonic ns; 0: not since the last post).
static SUSPENDED_AT: AtomicU64 = AtomicU64::new(0);
static RESUMES: AtomicU64 = AtomicU64::new(0);
/// A pid no process has: the offline side exists only in the fake sysfs/proc tree.
const OFFLINE: u32 = 3_999_998;
/// Least time between a resume and the next post, so every sample starts from a quiet loop.
const GAP: Duration = Duration::from_micros(200);

/// The debug-trap session, with the ioctls replaced by a stamp.
struct Stamp;

/// Its controller side: every attach is a [`Stamp`].
struct StampSide;

impl ControlSide for StampSide {
    type Control = Stamp;

    fn attach(&self, _: HostPid, _: &Options) -> Result<Stamp, DebugError> {
        Ok(Stamp)
    }
}

impl Control for Stamp {
    fn suspend(&mut self, _: &Selection) -> Result<Batch, DebugError> {
        SUSPENDED_AT.store(monotonic_ns(), Ordering::SeqCst);
        Ok(Batch { count: 1, ..Batch::default() })
    }
    fn resume(&mut self) -> Result<Batch, DebugError> {
        RESUMES.fetch_add(1, Ordering::SeqCst);
        Ok(Batch { count: 1, ..Batch::default() })
    }
    fn resume_gpu(&mut self, _: GpuId) -> Result<Batch, DebugError> {
        self.resume()
    }
    fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        Ok(vec![QueueSnapshotEntry {
            queue_id: 0,
            gpu_id: 0x1000,
            read_pointer_address: READ.as_ptr() as u64,
            write_pointer_address: WRITE.as_ptr() as u64,
            ..QueueSnapshotEntry::default()
        }])
    }
    fn notices(&mut self, _: u64) -> Vec<SessionNotice> {
        Vec::new()
    }
    fn comm(&self) -> String {
        "offline".into()
    }
    fn detach(self) -> Detached {
        Detached::default()
    }
}

/// Post one dispatch at a time and time the suspend it causes, until `wanted` samples.
fn drive(wanted: usize, stop: &AtomicBool) -> Vec<u64> {
    let mut samples = Vec::with_capacity(wanted);
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while samples.len() < wanted && std::time::Instant::now() < deadline {
        let resumes = RESUMES.load(Ordering::SeqCst);
        SUSPENDED_AT.store(0, Ordering::SeqCst);
        let posted = monotonic_ns();
        WRITE.fetch_add(1, Ordering::SeqCst);
        let suspended = loop {
            match SUSPENDED_AT.load(Ordering::SeqCst) {
                0 => std::hint::spin_loop(),
                t => break t,
            }
        };
        samples.push(suspended.saturating_sub(posted));
        READ.store(WRITE.load(Ordering::SeqCst), Ordering::SeqCst);
        while RESUMES.load(Ordering::SeqCst) == resumes {
            std::thread::yield_now();
        }
        let quiet = monotonic_ns();
        while monotonic_ns() - quiet < GAP.as_nanos() as u64 {
            std::hint::spin_loop();
        }
    }
    stop.store(true, Ordering::SeqCst);
    samples
}

/// Nothing appears or goes.
struct Quiet;

impl Discovery for Quiet {
    fn poll(&mut self, _: &mut Vec<gpreempt::model::ModelNotice>) {}
    fn sees_queues(&self) -> bool {
        true
    }
}

/// The sysfs and /proc entries the scheduler checks for a KFD process with one queue.
fn kfd_process(root: &Path, pid: u32) -> std::io::Result<()> {
    let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}/queues/0"));
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("gpuid"), "4096")?;
    fs::write(dir.join("type"), "0")?;
    fs::write(root.join(format!("sys/class/kfd/kfd/proc/{pid}/pasid")), "32770\n")?;
    let proc_dir = root.join(format!("proc/{pid}"));
    fs::create_dir_all(&proc_dir)?;
    fs::write(proc_dir.join("comm"), "worker\n")?;
    fs::write(proc_dir.join("status"), format!("Name:\tworker\nNSpid:\t{pid}\n"))?;
    fs::write(proc_dir.join("cgroup"), "0::/user.slice\n")
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let wanted = if quick { 2_000 } else { 20_000 };
    let dir = tempfile::tempdir()?;
    let me = std::process::id();
    kfd_process(dir.path(), me)?;
    kfd_process(dir.path(), OFFLINE)?;
    let roots = Roots {
        sys: dir.path().join("sys"),
        proc: dir.path().join("proc"),
        docker: dir.path().join("docker"),
        ..Roots::default()
    };
    let config = ScheduleConfig {
        online: vec![Selector::Pid(HostPid(me))],
        offline: vec![Selector::Pid(HostPid(OFFLINE))],
        // Resume at the first idle step: the bench times suspends, not the hysteresis.
        policy: PolicyConfig { idle: Duration::ZERO, cost_aware: false, ..PolicyConfig::default() },
        // No sleep between steps; the product's default footing (SCHED_FIFO 20 when allowed:
        // the JSON says what was granted), so the driver thread spinning beside it does not
        // take its core.
        poll: Duration::ZERO,
        busy_poll: true,
        occupancy: Duration::from_secs(3600),
        interval: Duration::from_secs(3600),
        session: Options { roots: roots.clone(), ..Options::default() },
        roots,
        ..ScheduleConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut ignore = |_: &ScheduleEvent| {};
    let seams = Seams {
        control: StampSide,
        discovery: Box::new(Quiet),
        occupancy: std::sync::Arc::new(SysfsOccupancy { roots: config.roots.clone() }),
        arrival: std::sync::Arc::new(gpreempt::schedule::arrival::ProbeLoader),
    };
    let scheduler = Scheduler::start(config, seams, &mut ignore)?;
    let flag = stop.clone();
    let driver = std::thread::spawn(move || drive(wanted, &flag));
    let report = scheduler.run(&stop, &mut ignore);
    let samples = driver.join().map_err(|_| anyhow::anyhow!("the driver thread panicked"))?;
    let samples: Vec<f64> = samples.iter().map(|&ns| ns as f64).collect();
    let stats = Summary::of(&samples).ok_or_else(|| anyhow::anyhow!("no sample"))?;
    let step_ns = report.elapsed_ms * 1e6 / report.polls.max(1) as f64;
    eprintln!(
        "reaction path (index change read -> SUSPEND called): p50 {:.0} ns, p99 {:.0} ns, max {:.0} ns over {} \
         samples; mean loop step {step_ns:.0} ns ({} suspends)",
        stats.p50, stats.p99, stats.max, stats.count, report.suspends
    );
    println!(
        "{}",
        json!({
            "samples": stats.count, "p50_ns": stats.p50, "p99_ns": stats.p99, "max_ns": stats.max,
            "min_ns": samples.iter().copied().fold(f64::INFINITY, f64::min),
            "loop_step_ns": step_ns, "suspends": report.suspends, "resumes": report.resumes,
            "gap_us": GAP.as_micros(), "realtime": report.realtime.policy,
        })
    );
    Ok(())
}
