//! The scheduler's unit tests: the real [`Scheduler`] and reaction thread, with this test
//! process as the online process (its index words read with `process_vm_readv` like another's),
//! a recording controller side per test and a fake sysfs/procfs.

use std::{
    collections::BTreeMap,
    fs,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, Receiver},
    },
    thread,
    time::{Duration, Instant},
};

use super::{
    ScheduleConfig, ScheduleEvent, ScheduleReport, Scheduler,
    arrival::{ArrivalError, ArrivalLoader, ArrivalSource, Patterns},
    config::ArrivalConfig,
    discover::Discovery,
    policy::{PolicyConfig, ResumeReason},
    realtime::{Realtime, RealtimeConfig},
    runnable::Runnable,
    seams::{ControlSide, Seams, SysfsOccupancy},
};
use gpreempt_common::arrival::{ArrivalCounts, ArrivalHit};

use crate::{
    clock::monotonic_ns,
    controller::{
        control::Control,
        vocabulary::{Batch, DebugError, Detached, Options, Selection, SessionNotice},
    },
    domain::{GpuId, HostPid, QueueId, TransitionKind},
    host::select::Selector,
    kfd::uapi::QueueSnapshotEntry,
    model::{ModelNotice, QueueAddrs},
    test_support::FakeHost,
};

const A: u32 = 0x1000;
const B: u32 = 0x2000;

/// What one test's sessions answer and what was asked of them (each test has its own).
#[derive(Default)]
struct Script {
    online: Vec<QueueSnapshotEntry>,
    offline: Vec<QueueSnapshotEntry>,
    /// Per offline pid, its own queues instead of `offline`.
    offline_of: BTreeMap<HostPid, Vec<QueueSnapshotEntry>>,
    /// Every watchdog resume arrives at the next look after a suspend.
    release_at_once: bool,
    /// Stored into at the first RESUME of a GPU (the online job publishing during it).
    publish_during_resume: Option<(&'static AtomicU64, u64)>,
    /// A request reaches the online service at the first RESUME of a GPU.
    arrive_during_resume: Option<ScriptedArrivals>,
    /// A request reaches the online service at the first SUSPEND.
    arrive_during_suspend: Option<ScriptedArrivals>,
    /// How long each SUSPEND and each RESUME of a held GPU takes.
    transition: Duration,
    calls: Vec<String>,
}

/// The controller side of one test: its sessions record into the test's script.
#[derive(Clone, Default)]
struct RecorderSide(Arc<Mutex<Script>>);

impl std::fmt::Debug for RecorderSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecorderSide")
    }
}

impl RecorderSide {
    fn with<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    fn wait_until(&self, what: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !what(&self.calls()) {
            assert!(Instant::now() < deadline, "timed out; calls: {:?}", self.calls());
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl ControlSide for RecorderSide {
    type Control = Recorder;

    fn attach(&self, pid: HostPid, _: &Options) -> Result<Recorder, DebugError> {
        let online = pid.0 == std::process::id();
        let r = Recorder { pid, side: self.clone(), online, held: Vec::new() };
        r.log(format!("attach {pid}"));
        Ok(r)
    }
}

/// A session that records what the scheduler asks of it (offline calls only: the online
/// process is this test process in every test).
struct Recorder {
    pid: HostPid,
    side: RecorderSide,
    online: bool,
    /// GPUs held now.
    held: Vec<GpuId>,
}

impl Recorder {
    fn log(&self, call: String) {
        if !self.online {
            self.side.with(|s| s.calls.push(call));
        }
    }

    fn queues(&self) -> Vec<QueueSnapshotEntry> {
        self.side.with(|s| s.offline_of.get(&self.pid).unwrap_or(&s.offline).clone())
    }

    fn queues_on(&self, gpu: GpuId) -> usize {
        self.queues().iter().filter(|q| q.gpu_id == gpu.0).count()
    }
}

impl Control for Recorder {
    fn suspend(&mut self, selection: &Selection) -> Result<Batch, DebugError> {
        self.log(format!("suspend {selection:?}"));
        thread::sleep(self.side.with(|s| s.transition));
        if let Some(arrivals) = self.side.with(|s| s.arrive_during_suspend.take()) {
            arrivals.arrive();
        }
        let gpus: Vec<GpuId> = match selection {
            Selection::Gpu(gpu) => vec![*gpu],
            // `--gang`: every GPU it has queues on.
            Selection::All => self.queues().iter().map(|q| GpuId(q.gpu_id)).collect(),
            Selection::Ids(_) => panic!("the scheduler holds GPUs or processes, not {selection:?}"),
        };
        let mut n = 0;
        for gpu in gpus {
            let here = self.queues_on(gpu);
            if here > 0 && !self.held.contains(&gpu) {
                self.held.push(gpu);
                n += here;
            }
        }
        Ok(Batch { count: n as i32, latency_ns: 1_000, ..Batch::default() })
    }
    fn resume(&mut self) -> Result<Batch, DebugError> {
        self.log("resume all".into());
        let n: usize = self.held.iter().map(|g| self.queues_on(*g)).sum();
        self.held.clear();
        Ok(Batch { count: n as i32, latency_ns: 1_000, ..Batch::default() })
    }
    fn resume_gpu(&mut self, gpu: GpuId) -> Result<Batch, DebugError> {
        let n = self.queues_on(gpu);
        let held = self.held.contains(&gpu);
        self.held.retain(|g| *g != gpu);
        if held {
            self.log(format!("resume {gpu:#x}"));
            thread::sleep(self.side.with(|s| s.transition));
            if let Some((word, value)) = self.side.with(|s| s.publish_during_resume.take()) {
                word.store(value, Ordering::SeqCst);
            }
            if let Some(arrivals) = self.side.with(|s| s.arrive_during_resume.take()) {
                arrivals.arrive();
            }
            Ok(Batch { count: n as i32, latency_ns: 1_000, ..Batch::default() })
        } else {
            Ok(Batch { skipped: true, ..Batch::default() })
        }
    }
    fn snapshot(&mut self) -> Result<Vec<QueueSnapshotEntry>, DebugError> {
        if self.online { Ok(self.side.with(|s| s.online.clone())) } else { Ok(self.queues()) }
    }
    fn notices(&mut self, _: u64) -> Vec<SessionNotice> {
        let release = self.side.with(|s| s.release_at_once);
        if !release || self.held.is_empty() {
            return Vec::new();
        }
        self.held.clear();
        self.log("watchdog resumed".into());
        vec![SessionNotice::WatchdogResumed { held_ms: 1, resumed: Batch { count: 1, ..Batch::default() } }]
    }
    fn comm(&self) -> String {
        "recorder".into()
    }
    fn detach(self) -> Detached {
        self.log(format!("detach {}", self.pid));
        Detached::default()
    }
    fn queue_reset(&mut self, queue: QueueId) -> bool {
        self.log(format!("reset {queue}"));
        true
    }
}

/// The arrival path's kernel side as a script: a test (or a RESUME, `arrive_during_resume`) hands
/// over a request's hit, stamped when it is handed; the reaction thread takes it at its next look.
#[derive(Clone, Debug, Default)]
struct ScriptedArrivals(Arc<Mutex<ArrivalScript>>);

#[derive(Debug, Default)]
struct ArrivalScript {
    /// Watched pids and their ports, by slot.
    watched: Vec<Option<(HostPid, std::collections::BTreeSet<u16>)>>,
    hits: Vec<ArrivalHit>,
    /// Each slot's credits, as the program keeps them.
    armed: Vec<u32>,
    counts: ArrivalCounts,
    /// Where each `arm` is logged (`arm SLOT`) beside the sessions' calls, when a test orders them.
    log: Option<RecorderSide>,
}

impl ScriptedArrivals {
    /// A request reaches the (one) watched process now: one hit if it has a credit left, as the
    /// program sends one per credit.
    fn arrive(&self) {
        let mut s = self.0.lock().unwrap();
        s.counts.segments += 1;
        s.counts.allowed += 1;
        if let Some(slot) = s.armed.iter().position(|&a| a > 0) {
            s.armed[slot] -= 1;
            s.counts.armings += 1;
            let head = b"POST /generate HTTP/1.1\r\nContent-Length: 4\r\n\r\n";
            let mut hit = ArrivalHit {
                slot: slot as u32,
                port: 8000,
                payload_len: head.len() as u32 + 4,
                head_len: head.len() as u32,
                ktime_ns: monotonic_ns(),
                ..ArrivalHit::default()
            };
            hit.head[..head.len()].copy_from_slice(head);
            s.hits.push(hit);
        }
    }
}

impl ArrivalLoader for ScriptedArrivals {
    fn load(&self, _: &Patterns) -> Result<Box<dyn ArrivalSource>, ArrivalError> {
        Ok(Box::new(self.clone()))
    }
}

impl ArrivalSource for ScriptedArrivals {
    fn watch(
        &mut self,
        pid: HostPid,
        _: &std::path::Path,
        ports: &std::collections::BTreeSet<u16>,
    ) -> Result<u32, ArrivalError> {
        let mut s = self.0.lock().unwrap();
        if let Some(i) = s.watched.iter().position(|w| w.as_ref().is_some_and(|(p, _)| *p == pid)) {
            s.watched[i] = Some((pid, ports.clone()));
            return Ok(i as u32);
        }
        s.watched.push(Some((pid, ports.clone())));
        s.armed.push(gpreempt_common::arrival::ARMED_CREDITS);
        Ok(s.watched.len() as u32 - 1)
    }
    fn unwatch(&mut self, slot: u32) {
        let mut s = self.0.lock().unwrap();
        s.watched[slot as usize] = None;
        s.armed[slot as usize] = 0;
    }
    fn ports_of(&self, slot: u32) -> std::collections::BTreeSet<u16> {
        self.0.lock().unwrap().watched[slot as usize].as_ref().map(|(_, p)| p.clone()).unwrap_or_default()
    }
    fn arm(&mut self, slot: u32) -> Result<(), ArrivalError> {
        let mut s = self.0.lock().unwrap();
        s.armed[slot as usize] = gpreempt_common::arrival::ARMED_CREDITS;
        if let Some(side) = &s.log {
            side.with(|c| c.calls.push(format!("arm {slot}")));
        }
        Ok(())
    }
    fn counts(&self, _: u32) -> ArrivalCounts {
        self.0.lock().unwrap().counts
    }
    fn drain(&mut self, out: &mut Vec<ArrivalHit>) {
        out.append(&mut self.0.lock().unwrap().hits);
    }
    fn fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// The arrival path on for the online process (this one, in cgroup `user.slice` of a cgroup v2
/// mount in the fake host), watched on port 8000.
fn watched_on_8000(host: &mut FakeHost, config: ScheduleConfig) -> ScheduleConfig {
    let cgroups = host.path().join("cgroup");
    host.dir("cgroup/user.slice").file(
        "proc/self/mountinfo",
        format!("31 24 0:27 / {} rw,relatime shared:10 - cgroup2 cgroup2 rw\n", cgroups.display()),
    );
    ScheduleConfig { arrival: Some(ArrivalConfig { ports: vec![8000], ..ArrivalConfig::default() }), ..config }
}

/// A KFD process with one queue in the fake host, as the scheduler's checks see it.
fn kfd_process(host: &mut FakeHost, pid: u32) {
    host.kfd_file(pid, "queues/0/gpuid", "4096").kfd_file(pid, "queues/0/type", "0").kfd_process(pid).process(
        pid,
        "worker",
        &format!("Name:\tworker\nNSpid:\t{pid}\n"),
        "0::/user.slice\n",
    );
}

/// An online or offline queue on `gpu` whose read and write indices live at `read`/`write`.
fn queue(id: u32, gpu: u32, read: &AtomicU64, write: &AtomicU64) -> QueueSnapshotEntry {
    QueueSnapshotEntry {
        queue_id: id,
        gpu_id: gpu,
        read_pointer_address: read.as_ptr() as u64,
        write_pointer_address: write.as_ptr() as u64,
        ..QueueSnapshotEntry::default()
    }
}

/// One test's scheduler set-up: the fake host, the recording side and the configuration.
struct Setup {
    host: FakeHost,
    side: RecorderSide,
    config: ScheduleConfig,
}

/// The seams: this test's recorders, the given discovery, occupancy from the fake sysfs.
fn seams_of(side: &RecorderSide, config: &ScheduleConfig, discovery: Box<dyn Discovery>) -> Seams<RecorderSide> {
    Seams {
        control: side.clone(),
        discovery,
        occupancy: std::sync::Arc::new(SysfsOccupancy { roots: config.roots.clone() }),
        arrival: std::sync::Arc::new(ScriptedArrivals::default()),
    }
}

/// A scheduler configuration in a fake sysfs/procfs: this process online with `online`
/// queues, `offline` offline with `offline_queues` (5 ms idle, 100 µs polls, no real-time
/// footing: unit tests run wherever).
fn setup(
    offline: u32,
    online: Vec<QueueSnapshotEntry>,
    offline_queues: Vec<QueueSnapshotEntry>,
    release_at_once: bool,
) -> Setup {
    let mut host = FakeHost::new();
    kfd_process(&mut host, std::process::id());
    kfd_process(&mut host, offline);
    let roots = host.roots();
    let side = RecorderSide::default();
    side.with(|s| {
        s.online = online;
        s.offline = offline_queues;
        s.release_at_once = release_at_once;
    });
    let config = ScheduleConfig {
        online: vec![Selector::Pid(HostPid(std::process::id()))],
        offline: vec![Selector::Pid(HostPid(offline))],
        policy: PolicyConfig { idle: Duration::from_millis(5), ..PolicyConfig::default() },
        poll: Duration::from_micros(100),
        // The policy's tests; the probe has its own (tests/tests/doorbell.rs, emulator).
        doorbell: false,
        // Likewise the arrival probe (tests/tests/arrival.rs, and emu_schedule on the emulator).
        arrival: None,
        realtime: RealtimeConfig::default(),
        session: Options { roots: roots.clone(), ..Options::default() },
        roots,
        ..ScheduleConfig::default()
    };
    Setup { host, side, config }
}

fn count(calls: &[String], prefix: &str) -> usize {
    calls.iter().filter(|c| c.starts_with(prefix)).count()
}

/// Events of a run, collected.
/// Run a started scheduler on this thread while `script` drives the jobs from another, with its
/// own handle on the recorder; the run stops when the script returns or panics (a failed
/// assertion in it fails the test instead of leaving the run going). The script's result and the
/// run's report.
fn run_scripted<T: Send + 'static>(
    s: Scheduler,
    side: &RecorderSide,
    emit: &mut dyn FnMut(&ScheduleEvent),
    script: impl FnOnce(RecorderSide) -> T + Send + 'static,
) -> (T, ScheduleReport) {
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (guard, c) = (StopOnDrop(stop.clone()), side.clone());
    let driver = thread::spawn(move || {
        let _stop = guard;
        script(c)
    });
    let report = s.run(&stop, emit);
    match driver.join() {
        Ok(out) => (out, report),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn sink() -> (Arc<Mutex<Vec<ScheduleEvent>>>, impl FnMut(&ScheduleEvent)) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    (events, move |e: &ScheduleEvent| sink.lock().unwrap().push(e.clone()))
}

/// No tracer: nothing appears or goes.
struct Quiet;
impl Discovery for Quiet {
    fn poll(&mut self, _: &mut Vec<ModelNotice>) {}
    fn sees_queues(&self) -> bool {
        true
    }
}

static READ: AtomicU64 = AtomicU64::new(0);
static WRITE: AtomicU64 = AtomicU64::new(0);
static OFF_READ: AtomicU64 = AtomicU64::new(0);
const OFFLINE: u32 = 3_999_999;

#[test]
fn pending_online_work_suspends_the_offline_queues_of_its_gpu_once_and_idle_resumes_them() {
    let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
    let Setup { host: _host, side, config } = setup(OFFLINE, vec![queue(0, A, &READ, &WRITE)], offline, false);
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    assert_eq!(side.calls(), [format!("attach {OFFLINE}")]);
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // Two bursts of online work: one dispatch each, consumed after the suspend.
        for n in 1..=2u64 {
            WRITE.store(n, Ordering::SeqCst);
            c.wait_until(|calls| count(calls, "suspend") == n as usize);
            thread::sleep(Duration::from_millis(20));
            READ.store(n, Ordering::SeqCst);
            c.wait_until(|calls| count(calls, "resume") == n as usize);
        }
    });
    let gpu_a = format!("suspend Gpu(GpuId({A}))");
    assert_eq!(
        side.calls()[1..],
        [gpu_a.clone(), "resume 0x1000".into(), gpu_a, "resume 0x1000".into(), format!("detach {OFFLINE}")]
    );
    assert_eq!((report.suspends, report.resumes, report.failed_suspends), (2, 2, 0));
    assert_eq!(report.resumes_by_reason, BTreeMap::from([(ResumeReason::Idle, 2)]));
    // Online snapshot (ENABLE + DISABLE), offline ENABLE and DISABLE.
    assert_eq!(report.attach_refreshes, 4);
    assert_eq!(report.reaction_us.as_ref().map(|r| r.count), Some(2));
    assert_eq!(report.detection_us.as_ref().map(|r| r.count), Some(2));
    assert!(report.loop_step_us.as_ref().is_some_and(|s| s.count > 10), "{:?}", report.loop_step_us);
    assert!(report.polls > 10);
    // The steps that attached, suspended or resumed are left out of the poll's cadence: the
    // attach, 2 suspends and 2 resumes, each alone in its step but the first suspend, which may
    // share the attach's step (the first dispatch can be published before the first step).
    assert!((4..=5).contains(&report.transition_steps), "{}", report.transition_steps);
    assert!(report.loop_step_us.as_ref().is_some_and(|s| s.count as u64 + report.transition_steps < report.polls));
    // The reaction thread's CPU, measured by itself when it ended, holds its transitions'.
    assert!(report.reaction_cpu_ms > 0.0, "{}", report.reaction_cpu_ms);
    assert!(report.transition_cpu_ms <= report.reaction_cpu_ms, "{report:?}");
    // Each dispatch was seen pending once and consumed once.
    assert_eq!(report.online_dispatch_delay_us.as_ref().map(|d| d.count), Some(2));
    assert_eq!(report.realtime, Realtime { policy: "normal", ..Realtime::default() });
    assert_eq!(report.gpus.len(), 1);
    assert_eq!((report.gpus[0].gpu_id, report.gpus[0].suspends, report.gpus[0].scheduled), (GpuId(A), 2, true));
    let events = events.lock().unwrap();
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::Transition(t) => {
                Some(format!("{} {:#x} {:?} {}", t.action.name(), t.gpu_id, t.reason, t.queues))
            }
            ScheduleEvent::OnlineAdded { queues, snapshot, .. } => Some(format!("online_added {queues} {snapshot}")),
            ScheduleEvent::OfflineAttached { queues, gpus, picked_up, .. } => {
                Some(format!("offline_attached {queues} {gpus:?} {picked_up}"))
            }
            ScheduleEvent::OfflineDetached { reason, .. } => Some(format!("offline_detached {reason}")),
            ScheduleEvent::Summary(_) => Some("summary".into()),
            ScheduleEvent::Interval(_) | ScheduleEvent::OnlineSeenBy { .. } => None,
            other => Some(format!("{other:?}")),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "online_added 1 true",
            "offline_attached 1 [GpuId(4096)] false",
            "suspend 0x1000 None 1",
            "resume 0x1000 Some(Idle) 1",
            "suspend 0x1000 None 1",
            "resume 0x1000 Some(Idle) 1",
            "offline_detached stopped",
            "summary",
        ]
    );
}

static READ2: AtomicU64 = AtomicU64::new(0);
static WRITE2: AtomicU64 = AtomicU64::new(0);
const OFFLINE2: u32 = 3_999_998;

#[test]
fn time_after_a_session_watchdog_resume_is_not_counted_suspended() {
    let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
    let Setup { host: _host, side, config } = setup(OFFLINE2, vec![queue(0, A, &READ2, &WRITE2)], offline, true);
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let (pending, report) = run_scripted(s, &side, &mut emit, move |c| {
        // Online work stays pending 300 ms after the session watchdog released the offline
        // process, which runs meanwhile (the burst had its suspend: no second one).
        WRITE2.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "watchdog resumed") == 1);
        let pending = Instant::now();
        thread::sleep(Duration::from_millis(300));
        READ2.store(1, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(50));
        pending.elapsed()
    });
    assert_eq!(count(&side.calls(), "suspend"), 1);
    // The policy followed the release (every hold ended without it): no resume transition.
    assert_eq!((report.suspends, report.resumes), (1, 0));
    let released: Vec<(HostPid, usize)> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::WatchdogResumed { pid, still_held, .. } => Some((*pid, *still_held)),
            _ => None,
        })
        .collect();
    assert_eq!(released, [(HostPid(OFFLINE2), 0)]);
    // Held from the suspend to the next step's look at the session (100 µs steps; bounded
    // generously for a loaded machine), not for the 300 ms the online work stayed pending.
    assert!(pending >= Duration::from_millis(300));
    assert!(report.suspended_ms < 150.0, "suspended {} ms", report.suspended_ms);
}

static READ3: AtomicU64 = AtomicU64::new(0);
static WRITE3: AtomicU64 = AtomicU64::new(0);
static READ3B: AtomicU64 = AtomicU64::new(0);
static WRITE3B: AtomicU64 = AtomicU64::new(0);
const OFFLINE3: u32 = 3_999_997;

/// A discovery the test feeds.
struct Fed(Receiver<ModelNotice>);
impl Discovery for Fed {
    fn poll(&mut self, out: &mut Vec<ModelNotice>) {
        out.extend(self.0.try_iter());
    }
    fn sees_queues(&self) -> bool {
        true
    }
}

#[test]
fn online_work_on_one_gpu_suspends_only_that_gpus_offline_queues_and_a_new_online_gpu_gets_its_policy() {
    // Offline queues on A (ids 0, 2) and B (id 1); online starts with one queue on A.
    let offline =
        vec![queue(0, A, &OFF_READ, &OFF_READ), queue(1, B, &OFF_READ, &OFF_READ), queue(2, A, &OFF_READ, &OFF_READ)];
    let Setup { host: _host, side, config } = setup(OFFLINE3, vec![queue(0, A, &READ3, &WRITE3)], offline, false);
    let (events, mut emit) = sink();
    let (tx, rx) = mpsc::channel();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Fed(rx))), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        WRITE3.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 1);
        READ3.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 1);
        // The online process creates a queue on B mid-run: B's policy starts with it.
        let queue = QueueAddrs {
            queue_id: QueueId(1),
            gpu_id: GpuId(B),
            read: READ3B.as_ptr() as u64,
            write: WRITE3B.as_ptr() as u64,
        };
        tx.send(ModelNotice::QueueCreated { pid: HostPid(std::process::id()), queue }).unwrap();
        WRITE3B.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 2);
        READ3B.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 2);
    });
    assert_eq!(
        side.calls()[1..],
        [
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            format!("suspend Gpu(GpuId({B}))"),
            "resume 0x2000".into(),
            format!("detach {OFFLINE3}"),
        ]
    );
    let per_gpu: Vec<(GpuId, u64, u64)> = report.gpus.iter().map(|g| (g.gpu_id, g.suspends, g.resumes)).collect();
    assert_eq!(per_gpu, [(GpuId(A), 1, 1), (GpuId(B), 1, 1)]);
    let transitions: Vec<(GpuId, TransitionKind, i64)> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::Transition(t) => Some((t.gpu_id, t.action, t.queues)),
            _ => None,
        })
        .collect();
    // Two queues held on A, one on B.
    assert_eq!(
        transitions,
        [
            (GpuId(A), TransitionKind::Suspend, 2),
            (GpuId(A), TransitionKind::Resume, 2),
            (GpuId(B), TransitionKind::Suspend, 1),
            (GpuId(B), TransitionKind::Resume, 1),
        ]
    );
}

#[test]
fn a_gpu_with_online_work_but_no_offline_queue_holds_nothing() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const OFF: u32 = 3_999_996;
    // Offline only on B; online only on A.
    let Setup { host: _host, side, config } =
        setup(OFF, vec![queue(0, A, &R, &W)], vec![queue(0, B, &OFF_READ, &OFF_READ)], false);
    let (_events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 1);
        thread::sleep(Duration::from_millis(30));
        R.store(1, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(30));
    });
    // One SUSPEND asked for A, which held nothing of it (no ioctl in a real session): no
    // resume, and B's queue was never touched.
    assert_eq!(side.calls()[1..], [format!("suspend Gpu(GpuId({A}))"), format!("detach {OFF}")]);
    assert_eq!((report.suspends, report.resumes, report.suspended_ms), (1, 0, 0.0));
    let b = report.gpus.iter().find(|g| g.gpu_id == GpuId(B)).unwrap();
    assert_eq!((b.scheduled, b.suspends), (false, 0));
}

#[test]
fn a_started_online_dispatch_shown_only_by_cu_occupancy_holds_off_the_idle_resume() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const OFF: u32 = 3_999_995;
    let Setup { host, side, config } =
        setup(OFF, vec![queue(0, A, &R, &W)], vec![queue(0, A, &OFF_READ, &OFF_READ)], false);
    let stats = host.kfd_proc().join(format!("{}/stats_{A}", std::process::id()));
    fs::create_dir_all(&stats).unwrap();
    let occupancy = stats.join("cu_occupancy");
    fs::write(&occupancy, "0\n").unwrap();
    // Periodic reads every 10 ms, twice the 5 ms idle: only the fresh read before an idle
    // resume can tell that the dispatch still runs. (A busy read stands until the next
    // periodic one, so the period must stay short of the 5 s watchdog.)
    let config = ScheduleConfig { occupancy: Duration::from_millis(10), ..config };
    let (_events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let (resumed_while_running, report) = run_scripted(s, &side, &mut emit, move |c| {
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 1);
        // The dispatch starts (consumed from the ring) and runs for 100 ms: 20 idle periods.
        fs::write(&occupancy, "304\n").unwrap();
        R.store(1, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(100));
        let resumed_while_running = count(&c.calls(), "resume");
        fs::write(&occupancy, "0\n").unwrap();
        c.wait_until(|calls| count(calls, "resume") == 1);
        resumed_while_running
    });
    assert_eq!(resumed_while_running, 0, "resumed while the online dispatch ran");
    assert_eq!((report.suspends, report.resumes), (1, 1));
    assert_eq!(report.resumes_by_reason, BTreeMap::from([(ResumeReason::Idle, 1)]));
}

static READ_H: AtomicU64 = AtomicU64::new(0);
const OFFLINE_H: u32 = 3_999_990;

#[test]
fn hint_lines_read_on_the_reaction_thread_suspend_and_resume_and_are_counted() {
    use std::io::Write;
    let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
    let Setup { host: _host, side, mut config } = setup(OFFLINE_H, vec![queue(0, A, &READ_H, &READ_H)], offline, false);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hints.sock");
    config.hint_socket = Some(path.clone());
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // The indices never move: only the hints make online work.
        let mut client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        client.write_all(b"begin\n").unwrap();
        c.wait_until(|calls| count(calls, "suspend") == 1);
        client.write_all(b"bogus\nend\n").unwrap();
        c.wait_until(|calls| count(calls, "resume") == 1);
    });
    assert_eq!(
        side.calls(),
        [
            format!("attach {OFFLINE_H}"),
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            format!("detach {OFFLINE_H}")
        ]
    );
    assert_eq!((report.suspends, report.resumes), (1, 1));
    assert_eq!(report.resumes_by_reason, BTreeMap::from([(ResumeReason::Idle, 1)]));
    assert_eq!(report.hints, Some(super::hints::HintCounts { begins: 1, ends: 1, malformed: 1, connections: 1 }));
    let malformed: Vec<(String, u64)> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::HintMalformed { line, count } => Some((line.clone(), *count)),
            _ => None,
        })
        .collect();
    assert_eq!(malformed, [("bogus".to_owned(), 1)]);
}

/// A child process sharing one page with this test (mapped MAP_SHARED before the fork): an
/// offline process whose queue indices the test moves and the scheduler reads in *its* memory
/// with `process_vm_readv`. Killed and reaped when dropped.
struct SharedChild {
    pid: u32,
    page: *mut libc::c_void,
}

impl SharedChild {
    fn spawn() -> Self {
        // SAFETY: a fresh anonymous shared mapping of one page, checked below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        // SAFETY: the child only calls pause(), async-signal-safe, until it is killed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            loop {
                // SAFETY: no memory is touched.
                unsafe { libc::pause() };
            }
        }
        Self { pid: pid as u32, page }
    }

    /// The `i`th u64 of the shared page.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < 512);
        // SAFETY: in the mapping, aligned, alive as long as `self`; shared with the child only.
        unsafe { &*(self.page as *const AtomicU64).add(i) }
    }
}

impl Drop for SharedChild {
    fn drop(&mut self) {
        // SAFETY: our own child; reaped here so no zombie outlives the test.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
            libc::munmap(self.page, 4096);
        }
    }
}

/// The transitions of a run as "kind gpu queues held_no_ioctl".
fn transitions(events: &Mutex<Vec<ScheduleEvent>>) -> Vec<String> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::Transition(t) => {
                Some(format!("{} {:#x} {} {}", t.action.name(), t.gpu_id, t.queues, t.held_no_ioctl))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_offline_process_with_nothing_on_the_gpu_is_held_with_no_ioctl_and_suspended_at_its_first_submission() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    let child = SharedChild::spawn();
    let (off_read, off_write) = (child.word(0), child.word(1));
    let Setup { mut host, side, config } =
        setup(child.pid, vec![queue(0, A, &R, &W)], vec![queue(0, A, off_read, off_write)], false);
    let config = ScheduleConfig { defer_idle: true, ..config };
    // Its cu_occupancy on A: no wave in flight (kept open and re-read by the scheduler).
    host.kfd_file(child.pid, &format!("stats_{A}/cu_occupancy"), "0\n");
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let (words, seen, log) = (child.word(0) as *const AtomicU64 as usize, held.clone(), events.clone());
    let events_are = move |n: usize, last: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let t = transitions(&log);
            if t.len() >= n {
                assert_eq!(t[n - 1], last);
                return;
            }
            assert!(Instant::now() < deadline, "timed out; transitions: {t:?}");
            thread::sleep(Duration::from_millis(1));
        }
    };
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // SAFETY: the child's page outlives this thread (joined before `child` drops).
        let (off_read, off_write) = unsafe { (&*(words as *const AtomicU64), &*(words as *const AtomicU64).add(1)) };
        let s = |n: usize| move |calls: &[String]| count(calls, "suspend") == n;
        // Busy period 1: the offline process is idle; then it submits one packet in the hold.
        W.store(1, Ordering::SeqCst);
        events_are(1, "suspend 0x1000 0 1");
        seen.lock().unwrap().push(c.calls().len());
        off_write.store(1, Ordering::SeqCst);
        c.wait_until(s(1));
        R.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 1);
        // Resumed, the "CP" takes its packet and it runs to completion.
        off_read.store(1, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(30));
        // Busy period 2: it is idle again: held and resumed with no ioctl.
        W.store(2, Ordering::SeqCst);
        events_are(3, "suspend 0x1000 0 1");
        R.store(2, Ordering::SeqCst);
        events_are(4, "resume 0x1000 0 0");
    });
    // While idle and held, no call at all (only the attach before).
    assert_eq!(*held.lock().unwrap(), [1]);
    assert_eq!(
        side.calls(),
        [
            format!("attach {}", child.pid),
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            format!("detach {}", child.pid)
        ]
    );
    assert_eq!((report.offline_deferred, report.offline_late_suspends), (2, 1));
    assert_eq!((report.suspends, report.resumes), (2, 2));
    assert_eq!(report.resumes_by_reason, BTreeMap::from([(ResumeReason::Idle, 2)]));
    assert_eq!(
        transitions(&events),
        ["suspend 0x1000 0 1", "resume 0x1000 1 0", "suspend 0x1000 0 1", "resume 0x1000 0 0"]
    );
    assert_eq!((off_read.load(Ordering::SeqCst), off_write.load(Ordering::SeqCst)), (1, 1));
}

/// Two offline processes given by pid (one job, for `--gang`): `first` with a queue on A, the
/// online GPU (the online queue's indices are `online`), `second` with one on `second_gpu`.
fn two_offline(first: u32, second: u32, second_gpu: u32, online: (&AtomicU64, &AtomicU64)) -> Setup {
    let Setup { mut host, side, config } = setup(first, vec![queue(0, A, online.0, online.1)], Vec::new(), false);
    kfd_process(&mut host, second);
    side.with(|s| {
        s.offline_of.insert(HostPid(first), vec![queue(0, A, &OFF_READ, &OFF_READ)]);
        s.offline_of.insert(HostPid(second), vec![queue(0, second_gpu, &OFF_READ, &OFF_READ)]);
    });
    let offline = vec![Selector::Pid(HostPid(first)), Selector::Pid(HostPid(second))];
    Setup { host, side, config: ScheduleConfig { offline, ..config } }
}

#[test]
fn with_gang_the_job_is_held_on_all_of_its_gpus_when_one_of_them_is_and_resumed_when_none_is() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const RANK0: u32 = 3_999_980;
    const RANK1: u32 = 3_999_981;
    // Rank 0 on A (the online GPU), rank 1 on B: pids given together are one job.
    let Setup { host: _host, side, config } = two_offline(RANK0, RANK1, B, (&R, &W));
    let config = ScheduleConfig { gang: true, ..config };
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 2);
        thread::sleep(Duration::from_millis(20));
        R.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 2);
    });
    assert_eq!(
        side.calls(),
        [
            format!("attach {RANK0}"),
            format!("attach {RANK1}"),
            "suspend All".into(),
            "suspend All".into(),
            "resume all".into(),
            "resume all".into(),
            format!("detach {RANK0}"),
            format!("detach {RANK1}"),
        ]
    );
    // One transition of A, both ranks' queues (rank 1's on B too); nothing deferred.
    assert_eq!(transitions(&events), ["suspend 0x1000 2 0", "resume 0x1000 2 0"]);
    assert_eq!((report.suspends, report.resumes, report.offline_deferred), (1, 1, 0));
}

/// Two offline processes on A held, the idle resume's first RESUME cut short (the second process
/// stays held with no ioctl), the first suspended again, then both resumed at the end.
fn assert_one_resume_cut_short(
    side: &RecorderSide,
    events: &Mutex<Vec<ScheduleEvent>>,
    report: &ScheduleReport,
    (first, second): (u32, u32),
) {
    assert_eq!(
        side.calls(),
        [
            format!("attach {first}"),
            format!("attach {second}"),
            format!("suspend Gpu(GpuId({A}))"),
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            "resume 0x1000".into(),
            format!("detach {first}"),
            format!("detach {second}"),
        ]
    );
    assert_eq!(
        transitions(events),
        ["suspend 0x1000 2 0", "resume 0x1000 1 0", "suspend 0x1000 1 1", "resume 0x1000 2 0"]
    );
    assert_eq!((report.suspends, report.resumes, report.resumes_cut_short), (2, 2, 1));
}

#[test]
fn a_resume_of_several_offline_processes_stops_when_online_work_is_published_during_it() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const FIRST: u32 = 3_999_970;
    const SECOND: u32 = 3_999_971;
    // Two offline processes on A, the online GPU, both runnable (`auto` would park one).
    let Setup { host: _host, side, config } = two_offline(FIRST, SECOND, A, (&R, &W));
    let config = ScheduleConfig { runnable: Runnable::All, ..config };
    // The online job publishes its next dispatch while the first RESUME runs.
    side.with(|s| s.publish_during_resume = Some((&W, 2)));
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 2);
        R.store(1, Ordering::SeqCst);
        // The idle resume: the first RESUME publishes dispatch 2; the first process is suspended
        // again and the second, never resumed, stays held with no ioctl.
        c.wait_until(|calls| count(calls, "suspend") == 3);
        R.store(2, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 3);
    });
    assert_one_resume_cut_short(&side, &events, &report, (FIRST, SECOND));
}

#[test]
fn a_resume_of_several_offline_processes_stops_when_a_request_arrives_during_it() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const FIRST: u32 = 3_999_960;
    const SECOND: u32 = 3_999_961;
    // Two offline processes on A, both runnable; the online process (this one) in a cgroup v2 of
    // the fake host, watched on port 8000 by a scripted arrival source.
    let Setup { mut host, side, config } = two_offline(FIRST, SECOND, A, (&R, &W));
    let arrivals = ScriptedArrivals::default();
    let config = ScheduleConfig { runnable: Runnable::All, ..watched_on_8000(&mut host, config) };
    let seams = Seams { arrival: Arc::new(arrivals.clone()), ..seams_of(&side, &config, Box::new(Quiet)) };
    // A request reaches the service while the first RESUME runs. Nothing is known of its lead
    // yet: its SUSPENDs are due at once, before the second process could run, so that process's
    // RESUME is not made.
    side.with(|s| s.arrive_during_resume = Some(arrivals.clone()));
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams, &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 2);
        R.store(1, Ordering::SeqCst);
        // The idle resume: the request arrives during the first RESUME; the first process is
        // suspended again for it and the second stays held with no ioctl. The request brings no
        // GPU work: its hold ends at the cold bound (50 ms) as wasted, then the idle resume.
        c.wait_until(|calls| count(calls, "resume") == 3);
    });
    assert_one_resume_cut_short(&side, &events, &report, (FIRST, SECOND));
    // One arrival, through the scripted source, watched on the configured port; its hold wasted.
    assert_eq!(report.arrival.len(), 1);
    let a = &report.arrival[0];
    assert_eq!((a.pid, a.ports.as_slice(), a.why.as_deref()), (HostPid(std::process::id()), &[8000u16][..], None));
    assert_eq!((a.counts.allowed, a.counts.armings), (1, 1));
    assert_eq!((a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted), (1, 0, 0, 1));
    // It arrived while the reaction thread was inside the RESUME: counted apart.
    assert_eq!(a.arrival_to_suspend_us.as_ref().map(|s| s.count), None);
    assert_eq!(a.arrival_to_suspend_in_transition_us.as_ref().map(|s| s.count), Some(1));
}

#[test]
fn a_request_that_arrives_during_anothers_suspend_sends_its_own_record() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const PID: u32 = 3_999_940;
    let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
    let Setup { mut host, side, config } = setup(PID, vec![queue(0, A, &R, &W)], offline, false);
    let config = watched_on_8000(&mut host, config);
    let arrivals = ScriptedArrivals::default();
    arrivals.0.lock().unwrap().log = Some(side.clone());
    side.with(|s| s.arrive_during_suspend = Some(arrivals.clone()));
    let seams = Seams { arrival: Arc::new(arrivals.clone()), ..seams_of(&side, &config, Box::new(Quiet)) };
    let (_events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams, &mut emit).unwrap();
    let script = arrivals.clone();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // Cold (no lead learnt): the first request's SUSPEND is issued in the step that takes its
        // record, and the process is armed again before it; the second request reaches the
        // service during that SUSPEND and sends a record of its own. Neither brings GPU work:
        // both holds end at the cold bound, then the idle resume.
        script.arrive();
        c.wait_until(|calls| count(calls, "resume") == 1);
    });
    assert_eq!(
        side.calls(),
        [
            format!("attach {PID}"),
            "arm 0".into(),
            format!("suspend Gpu(GpuId({A}))"),
            "arm 0".into(),
            format!("resume {A:#x}"),
            format!("detach {PID}")
        ]
    );
    let a = &report.arrival[0];
    assert_eq!((a.counts.allowed, a.counts.armings), (2, 2));
    assert_eq!((a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted), (2, 0, 0, 2));
}

/// The scheduler over one online queue of this process on A (indices `r`, `w`) watched on port
/// 8000 through a scripted arrival source, and one offline process on A.
struct ArrivalRig {
    _host: FakeHost,
    side: RecorderSide,
    config: ScheduleConfig,
    arrivals: ScriptedArrivals,
}

fn arrival_rig(pid: u32, r: &'static AtomicU64, w: &'static AtomicU64) -> ArrivalRig {
    let offline = vec![queue(0, A, &OFF_READ, &OFF_READ)];
    let Setup { mut host, side, config } = setup(pid, vec![queue(0, A, r, w)], offline, false);
    let config = watched_on_8000(&mut host, config);
    ArrivalRig { _host: host, side, config, arrivals: ScriptedArrivals::default() }
}

impl ArrivalRig {
    /// Run the scheduler while `script` plays the requests (with the arrival source and the
    /// sessions' calls); its report.
    fn run(&self, script: impl FnOnce(ScriptedArrivals, RecorderSide) + Send + 'static) -> ScheduleReport {
        let seams =
            Seams { arrival: Arc::new(self.arrivals.clone()), ..seams_of(&self.side, &self.config, Box::new(Quiet)) };
        let (_events, mut emit) = sink();
        let s = Scheduler::start(self.config.clone(), seams, &mut emit).unwrap();
        let arrivals = self.arrivals.clone();
        run_scripted(s, &self.side, &mut emit, move |c| script(arrivals, c)).1
    }
}

/// Eight requests (the lead model's `MIN_SAMPLES`), one at a time, each publishing its work `lead`
/// after its arrival and completing at once, each waited for until the GPU is resumed, then
/// `pause`: nothing is known yet, so each is suspended for at its arrival, and its lead is learnt.
fn learn_the_lead(
    script: &ScriptedArrivals,
    c: &RecorderSide,
    (r, w): (&AtomicU64, &AtomicU64),
    lead: Duration,
    pause: Duration,
) {
    for n in 1..=crate::schedule::arrival::lead::MIN_SAMPLES as u64 {
        script.arrive();
        thread::sleep(lead);
        w.store(n, Ordering::SeqCst);
        r.store(n, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == n as usize);
        thread::sleep(pause);
    }
}

#[test]
fn a_hold_that_comes_due_while_another_requests_hold_has_the_gpu_suspended_is_served_not_late() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    // Margins of 2-5 ms on every side of each instant below (a stalled thread is not a failure).
    const LEAD: Duration = Duration::from_millis(10);
    let rig = arrival_rig(3_999_950, &R, &W);
    let report = rig.run(move |script, c| {
        learn_the_lead(&script, &c, (&R, &W), LEAD, Duration::ZERO);
        // Two more, 3 ms apart: the first's SUSPEND is issued just before its predicted work (at
        // about LEAD); the second comes due 3 ms later with the GPU still held for the first,
        // whose work comes at LEAD + 5 ms: no SUSPEND of its own. Its work comes at LEAD + 5 ms
        // too, well within its bound (twice the lead).
        script.arrive();
        thread::sleep(Duration::from_millis(3));
        script.arrive();
        thread::sleep(LEAD + Duration::from_millis(2));
        W.store(9, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(3));
        W.store(10, Ordering::SeqCst);
        R.store(10, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 9);
    });
    assert_eq!((report.suspends, report.resumes), (9, 9));
    let a = &report.arrival[0];
    assert_eq!(
        (a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted, a.pending.busy, a.pending.open),
        (10, 10, 0, 0, 0, 0)
    );
}

#[test]
fn a_request_on_the_gpu_that_submits_again_does_not_end_the_next_requests_hold() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    // Margins of several ms on every side of each instant below (a stalled thread is not a
    // failure): the second request's own work can come no earlier than its bracket allows, one
    // bracket width below it (a few ms on a loaded host), and the first's second submission comes
    // 8 ms before that.
    const LEAD: Duration = Duration::from_millis(30);
    let ms = Duration::from_millis;
    let rig = arrival_rig(3_999_955, &R, &W);
    let report = rig.run(move |script, c| {
        learn_the_lead(&script, &c, (&R, &W), LEAD, Duration::ZERO);
        // X arrives, then Y 15 ms later. X publishes 3 ms after its learnt lead (its SUSPEND,
        // planned at the lead's early edge, is done by then) and again 4 ms later, its work still
        // in flight (read index behind): that second submission is X's, 8 ms before Y's own work
        // could come. Y publishes 3 ms after its lead too; everything completes after.
        script.arrive();
        thread::sleep(ms(15));
        script.arrive();
        thread::sleep(LEAD + ms(3) - ms(15));
        W.store(9, Ordering::SeqCst);
        thread::sleep(ms(4));
        W.store(10, Ordering::SeqCst);
        thread::sleep(ms(11));
        W.store(11, Ordering::SeqCst);
        thread::sleep(ms(2));
        R.store(11, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 9);
    });
    assert_eq!((report.suspends, report.resumes), (9, 9));
    let a = &report.arrival[0];
    // Taken oldest first at any movement, X's second submission ended Y's hold before its issue
    // time (late, its lead learnt as 19 ms).
    assert_eq!(
        (a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted, a.pending.continued, a.pending.open),
        (10, 10, 0, 0, 1, 0)
    );
    // The eight and X are learnt; Y, whose hold saw a continuation, is not.
    assert_eq!(a.lead_us.as_ref().map(|s| s.count), Some(9));
}

#[test]
fn a_held_gpu_stays_held_when_a_pending_hold_comes_due_within_a_resume_and_a_suspend() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    // Each SUSPEND and RESUME takes 6 ms: a resume now and the suspend after it cost ≈ 12 ms.
    const LEAD: Duration = Duration::from_millis(30);
    let ms = Duration::from_millis;
    let mut rig = arrival_rig(3_999_957, &R, &W);
    // A fixed 5 ms idle threshold, no cost-aware holds: the idle resume comes 5 ms into the gap.
    rig.config.policy = PolicyConfig { idle: ms(5), cost_aware: false, learn_idle: false, ..rig.config.policy };
    rig.side.with(|s| s.transition = ms(6));
    let report = rig.run(move |script, c| {
        // The lead (≈ 30 ms) and the suspend's cost (≈ 6 ms) learnt; the offline side runs between
        // the requests (its share of the policy's window).
        learn_the_lead(&script, &c, (&R, &W), LEAD, LEAD);
        // X at 0: its SUSPEND planned at ≈ 30 − 2 × 6 = 18 ms; its work at 33 ms, done at once:
        // the idle resume is due at ≈ 38 ms. Y at 26 ms: its SUSPEND is planned at ≈ 44 ms, within
        // a RESUME and a SUSPEND of 38 ms (≈ 12 ms): the GPU stays held until Y's work at 59 ms.
        script.arrive();
        thread::sleep(ms(26));
        script.arrive();
        thread::sleep(ms(7));
        W.store(9, Ordering::SeqCst);
        R.store(9, Ordering::SeqCst);
        thread::sleep(ms(26));
        W.store(10, Ordering::SeqCst);
        R.store(10, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 9);
    });
    // Resumed at the idle threshold, Y's hold would have suspended it again 6 ms later: 10 and 10.
    assert_eq!((report.suspends, report.resumes), (9, 9));
    let a = &report.arrival[0];
    assert_eq!((a.pending.arrivals, a.pending.served, a.pending.late, a.pending.wasted), (10, 10, 0, 0));
}

#[test]
fn with_one_runnable_the_second_offline_process_is_parked_and_costs_no_ioctl_when_online_work_comes_and_goes() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const FIRST: u32 = 3_999_960;
    const SECOND: u32 = 3_999_961;
    // Two offline processes on A, the online GPU; one kept runnable, no rotation within the test.
    let Setup { host: _host, side, config } = two_offline(FIRST, SECOND, A, (&R, &W));
    let config = ScheduleConfig { runnable: Runnable::Keep(1), rotate: Duration::from_secs(3600), ..config };
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // The online GPU idle: one of the two is parked.
        c.wait_until(|calls| count(calls, "suspend") == 1);
        W.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "suspend") == 2);
        R.store(1, Ordering::SeqCst);
        c.wait_until(|calls| count(calls, "resume") == 1);
    });
    assert_eq!(
        side.calls(),
        [
            format!("attach {FIRST}"),
            format!("attach {SECOND}"),
            format!("suspend Gpu(GpuId({A}))"),
            format!("suspend Gpu(GpuId({A}))"),
            "resume 0x1000".into(),
            format!("detach {FIRST}"),
            format!("detach {SECOND}"),
        ]
    );
    // The online burst: one SUSPEND and the parked process held with no ioctl; one RESUME.
    assert_eq!(transitions(&events), ["suspend 0x1000 1 1", "resume 0x1000 1 0"]);
    assert_eq!((report.suspends, report.resumes, report.offline_parks, report.offline_unparks), (1, 1, 1, 0));
}

#[test]
fn parked_offline_processes_take_turns_while_the_gpu_has_no_online_work() {
    static R: AtomicU64 = AtomicU64::new(0);
    static W: AtomicU64 = AtomicU64::new(0);
    const FIRST: u32 = 3_999_950;
    const SECOND: u32 = 3_999_951;
    let Setup { host: _host, side, config } = two_offline(FIRST, SECOND, A, (&R, &W));
    let config = ScheduleConfig { runnable: Runnable::Keep(1), rotate: Duration::from_millis(5), ..config };
    let (events, mut emit) = sink();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Quiet)), &mut emit).unwrap();
    let ((), report) = run_scripted(s, &side, &mut emit, move |c| {
        // Parked, then two rotations: each a RESUME of the parked one and a SUSPEND of the other.
        c.wait_until(|calls| count(calls, "suspend") >= 3 && count(calls, "resume") >= 2);
    });
    let calls = side.calls();
    let park = format!("suspend Gpu(GpuId({A}))");
    assert_eq!(&calls[2..7], [park.clone(), "resume 0x1000".into(), park.clone(), "resume 0x1000".into(), park]);
    // No online work: no transition of the GPU's policy; every park and turn counted.
    assert_eq!(transitions(&events), Vec::<String>::new());
    assert_eq!(report.offline_parks, report.offline_unparks + 1, "one parked at a time");
    assert!(report.offline_unparks >= 2, "{report:?}");
}

/// A process with a secondary KFD context (Linux 7.0: `proc/<pid>/context_<id>/`) is refused at
/// start on either side, before anything is attached: DBG_TRAP reaches only its primary context
/// (docs/kfd.md §1.4).
#[test]
fn a_process_with_a_secondary_kfd_context_is_refused_at_start_on_either_side() {
    use super::{Role, ScheduleError, check_selection};
    use crate::controller::target::TargetError;
    let Setup { mut host, side, config } = setup(4242, Vec::new(), Vec::new(), false);
    host.kfd_file(4242, "context_0/pasid", "0\n").kfd_file(4242, "context_3/pasid", "0\n");
    let (comm, contexts) = ("worker".to_owned(), vec![0, 3]);
    let offline = check_selection(&config).unwrap_err();
    assert_eq!(
        offline.to_string(),
        ScheduleError::Target {
            role: Role::Offline,
            pid: HostPid(4242),
            cause: TargetError::SecondaryContexts {
                pid: HostPid(4242),
                comm: comm.clone(),
                contexts: contexts.clone()
            },
        }
        .to_string()
    );
    assert!(offline.to_string().starts_with(
        "--offline 4242: refusing pid 4242 (worker): it has secondary KFD contexts (context_0, context_3;"
    ));
    // As the online process: its work in those contexts could not be seen.
    let other = HostPid(4343);
    kfd_process(&mut host, other.0);
    let swapped =
        ScheduleConfig { online: vec![Selector::Pid(HostPid(4242))], offline: vec![Selector::Pid(other)], ..config };
    assert_eq!(
        check_selection(&swapped).unwrap_err().to_string(),
        ScheduleError::Target {
            role: Role::Online,
            pid: HostPid(4242),
            cause: TargetError::OnlineSecondaryContexts { pid: HostPid(4242), comm, contexts },
        }
        .to_string()
    );
    assert_eq!(side.calls(), Vec::<String>::new(), "nothing attached");
}

/// A secondary KFD context made during the run (the tracer's `context_create`) is said once per
/// side, naming the process and the context: the debug trap cannot reach it (docs/kfd.md §1.4).
/// One made by a process that is neither side says nothing.
#[test]
fn a_secondary_kfd_context_made_during_the_run_is_a_warning_naming_its_process() {
    const OFF: u32 = 3_999_940;
    let Setup { host: _host, side, config } = setup(OFF, Vec::new(), vec![queue(0, A, &OFF_READ, &OFF_READ)], false);
    let (events, mut emit) = sink();
    let (tx, rx) = mpsc::channel();
    let s = Scheduler::start(config.clone(), seams_of(&side, &config, Box::new(Fed(rx))), &mut emit).unwrap();
    let seen = events.clone();
    let warnings = move || -> Vec<String> {
        let events = seen.lock().unwrap();
        events
            .iter()
            .filter_map(|e| match e {
                ScheduleEvent::Warning { message } if message.contains("secondary KFD context") => {
                    Some(message.clone())
                }
                _ => None,
            })
            .collect()
    };
    let online = std::process::id();
    let ((), _) = run_scripted(s, &side, &mut emit, move |_| {
        tx.send(ModelNotice::ContextCreated { pid: HostPid(3_999_941), context_id: Some(1) }).unwrap();
        tx.send(ModelNotice::ContextCreated { pid: HostPid(OFF), context_id: Some(0) }).unwrap();
        tx.send(ModelNotice::ContextCreated { pid: HostPid(online), context_id: None }).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while warnings().len() < 2 {
            assert!(Instant::now() < deadline, "{:?}", warnings());
            thread::sleep(Duration::from_millis(1));
        }
    });
    let messages: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ScheduleEvent::Warning { message } if message.contains("secondary KFD context") => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        messages,
        [
            format!(
                "offline pid {OFF} made a secondary KFD context (context_0; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0): \
                 DBG_TRAP cannot suspend the queues it creates there, so they keep running while its primary \
                 context's queues are held; run it without that context to have all its work held"
            ),
            format!(
                "online pid {online} made a secondary KFD context (context_?; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0): \
                 its work there is not seen, so the offline processes are not held for it; run it without that \
                 context"
            ),
        ]
    );
}
