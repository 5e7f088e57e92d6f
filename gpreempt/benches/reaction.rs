//! The userspace reaction path of `gpreempt schedule`, natively: from the poll step in which an
//! online queue's write dispatch index moves past its read index to the SUSPEND_QUEUES call on the
//! offline session. The real [`Scheduler`] runs (its loop, the `process_vm_readv` of the indices,
//! the policy, the suspend dispatch); only the debug-trap session is replaced by one that stamps
//! the moment `suspend` is called instead of issuing the ioctl, and the "online process" is this
//! process, whose two index words the scheduler reads as it would another's.
//!
//! Paced: each sample posts one dispatch (write index + 1) at the start of a loop step, before
//! that step reads the indices; once suspended the dispatch is consumed (read index = write
//! index), the policy resumes after its idle time, and the next dispatch is posted at least
//! `GAP` later. Prints one JSON object: samples, p50/p99/max in ns, and the loop's mean step.
//!
//! `cargo bench -p gpreempt --bench reaction [-- --quick]`

use std::{
    fs,
    path::Path,
    sync::{
        Arc, Mutex,
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
    domain::HostPid,
    host::{roots::Roots, select::Selector},
    kfd::uapi::QueueSnapshotEntry,
    schedule::{ScheduleConfig, ScheduleEvent, Scheduler, discover::Discovery, policy::PolicyConfig},
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

impl Control for Stamp {
    fn attach(_: HostPid, _: &Options) -> Result<Self, DebugError> {
        Ok(Self)
    }
    fn suspend(&mut self, _: &Selection) -> Result<Batch, DebugError> {
        SUSPENDED_AT.store(monotonic_ns(), Ordering::SeqCst);
        Ok(Batch { count: 1, ..Batch::default() })
    }
    fn resume(&mut self) -> Result<Batch, DebugError> {
        RESUMES.fetch_add(1, Ordering::SeqCst);
        Ok(Batch { count: 1, ..Batch::default() })
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
    fn notices(&mut self) -> Vec<SessionNotice> {
        Vec::new()
    }
    fn comm(&self) -> String {
        "offline".into()
    }
    fn detach(self) -> Detached {
        Detached::default()
    }
}

#[derive(Clone, Copy)]
enum Phase {
    /// Quiet since this time (ns).
    Gap(u64),
    /// A dispatch was posted at this time (ns).
    Posted(u64),
    /// Suspended; waiting for the resume that follows the consumed dispatch.
    Held(u64),
}

/// Drives the online "process" from the scheduler's own loop: `poll` runs at the top of every
/// loop step, before the step reads the indices.
struct Driver {
    phase: Phase,
    /// The scheduler owns the driver: the samples leave through this handle.
    samples: Arc<Mutex<Vec<u64>>>,
    wanted: usize,
    stop: Arc<AtomicBool>,
}

impl Discovery for Driver {
    fn poll(&mut self, _: &mut Vec<gpreempt::model::ModelNotice>) {
        let now = monotonic_ns();
        self.phase = match self.phase {
            Phase::Gap(since) if now - since >= GAP.as_nanos() as u64 => {
                SUSPENDED_AT.store(0, Ordering::SeqCst);
                WRITE.fetch_add(1, Ordering::SeqCst);
                Phase::Posted(monotonic_ns())
            }
            Phase::Posted(at) => match SUSPENDED_AT.load(Ordering::SeqCst) {
                0 => Phase::Posted(at),
                suspended => {
                    let taken = self.samples.lock().map_or(self.wanted, |mut v| {
                        v.push(suspended.saturating_sub(at));
                        v.len()
                    });
                    if taken >= self.wanted {
                        self.stop.store(true, Ordering::SeqCst);
                    }
                    READ.store(WRITE.load(Ordering::SeqCst), Ordering::SeqCst);
                    Phase::Held(RESUMES.load(Ordering::SeqCst))
                }
            },
            Phase::Held(resumes) if RESUMES.load(Ordering::SeqCst) > resumes => Phase::Gap(now),
            unchanged => unchanged,
        };
    }
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
        policy: PolicyConfig { idle: Duration::ZERO, ..PolicyConfig::default() },
        // No sleep between steps: a posted dispatch is read in the step that posts it.
        poll: Duration::ZERO,
        occupancy: Duration::from_secs(3600),
        interval: Duration::from_secs(3600),
        roots,
        ..ScheduleConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(wanted)));
    let driver = Driver { phase: Phase::Gap(monotonic_ns()), samples: samples.clone(), wanted, stop: stop.clone() };
    let mut ignore = |_: &ScheduleEvent| {};
    let scheduler = Scheduler::<Stamp>::start(config, Box::new(driver), &mut ignore)?;
    let report = scheduler.run(&stop, &mut ignore);
    let samples: Vec<f64> =
        samples.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.iter().map(|&ns| ns as f64).collect();
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
            "gap_us": GAP.as_micros(),
        })
    );
    Ok(())
}
