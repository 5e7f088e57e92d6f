//! The [`Scheduler`]: its reaction thread, and on the caller's thread everything else — the
//! online processes' watch, the offline processes' attach requests, discovery, the tracer's spans,
//! hints, the reaction thread's reports, and every [`ScheduleEvent`] — until the stop flag is set;
//! then the reaction thread resumes and detaches everything and the summary is emitted.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    accounting::{Accounts, RunFacts, cpu_ms},
    config::{Role, ScheduleConfig, ScheduleError, resolve_selection},
    discover::Discovery,
    doorbell::wake::Nudge,
    events::{DetachReason, ResetQueue, ScheduleEvent, ScheduleReport},
    hints::HintSocket,
    offline::{self, JobId},
    online,
    policy::State,
    reaction::{Command, LoopStats, Reaction, ReactionConfig, Report},
    realtime::Realtime,
    seams::{ControlSide, OccupancySource, Seams},
};
use crate::{
    clock::monotonic_ns,
    controller::{
        control::Control,
        target::TargetError,
        vocabulary::{DebugError, Options},
    },
    domain::{GpuId, HostPid},
    host::select,
    model::{ModelNotice, QueueAddrs, spans::Span},
};

/// The scheduler: its reaction thread and, on the caller's thread, everything else.
pub struct Scheduler {
    config: ScheduleConfig,
    discovery: Box<dyn Discovery>,
    occupancy: Arc<dyn OccupancySource>,
    commands: SyncSender<Command>,
    /// Wakes the reaction thread when it waits on the doorbell probe (see [`Self::send`]).
    nudge: Option<Arc<Nudge>>,
    reports: Receiver<Report>,
    loop_stats: Arc<LoopStats>,
    reaction_stop: Arc<AtomicBool>,
    reaction: Option<JoinHandle<Realtime>>,
    accounts: Accounts,
    /// The online processes watched now (their indices and occupancy are the reaction thread's).
    online: BTreeSet<HostPid>,
    /// Pids already decided on (attached, watched or refused), so a repeated open is ignored.
    seen: BTreeMap<HostPid, Role>,
    /// Offline processes seen opening /dev/kfd whose KFD state was not complete yet, retried
    /// until the deadline (ns).
    retry: Vec<(HostPid, u64)>,
    /// Attaches asked of the reaction thread and not answered yet.
    attaching: BTreeSet<HostPid>,
    /// Every online process watched so far (their queues among the collateral).
    online_ever: BTreeSet<HostPid>,
    spans: Vec<Span>,
    realtime: Realtime,
    reaction_panicked: bool,
}

/// How long a picked-up offline process is retried while its KFD state is incomplete.
const PICKUP_RETRY: Duration = Duration::from_secs(2);
/// Reports the reaction thread may have in flight before it drops some (and counts them).
const REPORT_QUEUE: usize = 4096;
/// Commands in flight to the reaction thread (this side waits when it is full).
const COMMAND_QUEUE: usize = 1024;
/// Period of this side's loop: tracer, reports, discovery. Nothing on it decides a suspend (the
/// hint socket is read on the reaction thread); what it hands over (a new queue, a process to
/// attach) comes from processes that take milliseconds to create them. At 2 ms, its wake-ups
/// were 0.9 % of a core with nothing happening (the native harness's idle load).
const COMPANION_TICK: Duration = Duration::from_millis(10);
/// How long [`Scheduler::start`] waits for the reaction thread to attach one offline process.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

fn ns_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Scheduler {
    /// Check the selectors, start the reaction thread, learn the online queues, have every
    /// offline process attached (on the reaction thread, through `seams.control`). On any error
    /// everything attached so far is detached before returning. `seams.discovery` must already
    /// run, so that nothing that appears from now on is missed.
    pub fn start<S: ControlSide>(
        config: ScheduleConfig,
        seams: Seams<S>,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<Self, ScheduleError> {
        let cpu_start = cpu_ms();
        let (online_sel, offline_sel) = resolve_selection(&config)?;
        let mut session = config.session.clone();
        // The policy's watchdog comes first; the session's backs it up if the thread stalls.
        session.max_suspend = Some(config.policy.max_suspend + Duration::from_millis(500));
        let hints = match &config.hint_socket {
            Some(path) => Some(
                HintSocket::bind(path)
                    .map_err(|source| ScheduleError::HintSocket { path: path.clone(), cause: source })?,
            ),
            None => None,
        };
        let Seams { control, discovery, occupancy, arrival: arrival_loader } = seams;
        let side = Arc::new(control);
        let (commands, command_rx) = mpsc::sync_channel(COMMAND_QUEUE);
        let (report_tx, reports) = mpsc::sync_channel(REPORT_QUEUE);
        let loop_stats = Arc::new(LoopStats::default());
        let reaction_stop = Arc::new(AtomicBool::new(false));
        let reaction_config = ReactionConfig {
            policy: config.policy,
            poll_ns: ns_of(config.poll),
            occupancy_ns: ns_of(config.occupancy),
            watch_writes: config.watch_writes,
            busy_poll: config.busy_poll,
            doorbell: config.doorbell,
            cross_check_ns: ns_of(config.cross_check),
            realtime: config.realtime,
            session: session.clone(),
            defer_idle: config.defer_idle,
            gang: config.gang,
            arrival: config.arrival.clone(),
            arrival_loader,
            proc_root: config.roots.proc.clone(),
            runnable: config.runnable,
            rotate_ns: ns_of(config.rotate),
        };
        // Without an eventfd the thread never waits on the probe (it steps every --poll).
        let nudge = if config.doorbell { Nudge::new().ok().map(Arc::new) } else { None };
        let (stats, stop, thread_side, thread_nudge, thread_occupancy) =
            (loop_stats.clone(), reaction_stop.clone(), side.clone(), nudge.clone(), occupancy.clone());
        let reaction_config =
            ReactionConfig { doorbell: reaction_config.doorbell && nudge.is_some(), ..reaction_config };
        let reaction = std::thread::Builder::new()
            .name("gpreempt-react".into())
            .spawn(move || {
                Reaction::new(
                    reaction_config,
                    thread_side,
                    thread_occupancy,
                    command_rx,
                    report_tx,
                    stats,
                    thread_nudge,
                    hints,
                )
                .run(&stop)
            })
            .map_err(ScheduleError::Thread)?;
        let accounts = Accounts::new(monotonic_ns(), cpu_start, discovery.sees_driver());
        let mut s = Self {
            config: ScheduleConfig { session, ..config },
            discovery,
            occupancy,
            commands,
            nudge,
            reports,
            loop_stats,
            reaction_stop,
            reaction: Some(reaction),
            accounts,
            online: BTreeSet::new(),
            seen: BTreeMap::new(),
            retry: Vec::new(),
            attaching: BTreeSet::new(),
            online_ever: BTreeSet::new(),
            spans: Vec::new(),
            realtime: Realtime::default(),
            reaction_panicked: false,
        };
        if let Err(e) = s.attach_initial(side.as_ref(), &online_sel.pids, &offline_sel.pids, emit) {
            s.finish(emit);
            return Err(e);
        }
        for note in online_sel.notes.iter().chain(&offline_sel.notes) {
            emit(&ScheduleEvent::Warning { message: note.clone() });
        }
        for selector in online_sel.empty_containers.iter().chain(&offline_sel.empty_containers) {
            emit(&ScheduleEvent::Warning {
                message: format!(
                    "{selector} has no KFD process yet; its processes are picked up when they open /dev/kfd"
                ),
            });
        }
        if !s.discovery.sees_queues() {
            emit(&ScheduleEvent::Warning {
                message: "without the tracer, queues an online process creates from now on are not watched (their \
                          index addresses are unknown); run as root on a kernel with BTF for the tracer"
                    .into(),
            });
        }
        Ok(s)
    }

    /// The online processes (learnt here) and the offline ones (attached by the reaction
    /// thread, waited for one by one).
    fn attach_initial<S: ControlSide>(
        &mut self,
        side: &S,
        online: &[HostPid],
        offline: &[HostPid],
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        for &pid in online {
            self.seen.insert(pid, Role::Online);
            self.add_online(side, pid, emit)?;
        }
        for &pid in offline {
            self.seen.insert(pid, Role::Offline);
            self.send(Command::AttachOffline { pid, picked_up: false, job: self.job_of(pid) });
            self.attaching.insert(pid);
            let deadline = Instant::now() + ATTACH_TIMEOUT;
            while self.attaching.contains(&pid) {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.reports.recv_timeout(left) {
                    Ok(Report::AttachFailed { pid: p, error, .. }) if p == pid => {
                        return Err(ScheduleError::Debug { role: Role::Offline, pid, cause: error });
                    }
                    Ok(r) => self.take(r, emit),
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(ScheduleError::Debug {
                            role: Role::Offline,
                            pid,
                            cause: DebugError::Target(TargetError::NoSuchProcess(pid)),
                        });
                    }
                    Err(RecvTimeoutError::Disconnected) => return Err(ScheduleError::ThreadDied),
                }
            }
        }
        Ok(())
    }

    /// The `--gang` job of offline process `pid`. Only `--gang` uses jobs, and matching a
    /// container or pod selector reads /proc: without it every process gets the same one.
    fn job_of(&self, pid: HostPid) -> JobId {
        if !self.config.gang {
            return JobId(0);
        }
        offline::job_of(&self.config.offline, &self.config.roots, pid)
    }

    /// Hand the reaction thread a command (waits only when its queue is full).
    fn send(&self, c: Command) {
        let _ = self.commands.send(c);
        if let Some(n) = &self.nudge {
            n.nudge();
        }
    }

    /// Watch an online process present at start: its existing queues are learnt with one
    /// snapshot (a session attached and detached at once, on this thread).
    fn add_online<S: ControlSide>(
        &mut self,
        side: &S,
        pid: HostPid,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        let kfd_proc = self.config.roots.kfd_proc();
        let has_queues =
            crate::host::sysfs::read_process(&kfd_proc, pid).map(|s| !s.queues.is_empty()).unwrap_or(false);
        let mut queues = Vec::new();
        if has_queues {
            // Before the snapshot, whose attach would fail with a less telling error.
            online::check_readable(pid).map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
            let mut c = side
                .attach(pid, &Options { max_suspend: None, ..self.config.session.clone() })
                .map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            let entries = c.snapshot();
            c.detach();
            self.accounts.attach_refreshes += 2;
            let entries = entries.map_err(|source| ScheduleError::Debug { role: Role::Online, pid, cause: source })?;
            queues.extend(entries.iter().map(QueueAddrs::of_snapshot));
        }
        self.watch_online(pid, &queues, has_queues, emit)
    }

    /// Watch an online process with the queues known of it; its indices are read once here, so
    /// an unreadable process is refused rather than ignored.
    fn watch_online(
        &mut self,
        pid: HostPid,
        queues: &[QueueAddrs],
        snapshot: bool,
        emit: &mut dyn FnMut(&ScheduleEvent),
    ) -> Result<(), ScheduleError> {
        let occupancy = self.occupancy.open(pid);
        // A read of the queues' indices proves access; with none, the access check alone.
        let addrs: Vec<u64> = queues.iter().flat_map(|q| [q.read, q.write]).collect();
        let mut scratch = vec![0; addrs.len()];
        let readable =
            if addrs.is_empty() { online::check_readable(pid) } else { online::read_u64s(pid, &addrs, &mut scratch) };
        readable.map_err(|source| ScheduleError::Unreadable { pid, cause: source })?;
        for &q in queues {
            self.accounts.note_gpu(q.gpu_id);
            self.send(Command::OnlineQueue { pid, addrs: q });
        }
        let occupancy_files = occupancy.len();
        for reader in occupancy {
            self.send(Command::OnlineOccupancy { pid, reader });
        }
        emit(&ScheduleEvent::OnlineAdded { pid, queues: queues.len(), snapshot, occupancy_files });
        self.online.insert(pid);
        self.online_ever.insert(pid);
        Ok(())
    }

    /// Run until `stop` is set, then have the reaction thread resume and detach everything;
    /// returns the report (also emitted as [`ScheduleEvent::Summary`]).
    pub fn run(mut self, stop: &AtomicBool, emit: &mut dyn FnMut(&ScheduleEvent)) -> ScheduleReport {
        let mut changes = Vec::new();
        let mut next_interval = self.accounts.start_ns() + ns_of(self.config.interval);
        while !stop.load(Ordering::Relaxed) {
            if self.reaction.as_ref().is_none_or(JoinHandle::is_finished) {
                emit(&ScheduleEvent::Warning {
                    message: "the reaction thread ended (it panicked: see the message above); its sessions resumed \
                              and detached the offline processes while it unwound; stopping"
                        .into(),
                });
                break;
            }
            let now = monotonic_ns();
            self.discovery.poll(&mut changes);
            for c in changes.drain(..) {
                self.apply_change(c, emit);
            }
            self.collect_spans();
            self.retry_pickups(now, emit);
            self.drain_reports(emit);
            if now >= next_interval {
                next_interval = now + ns_of(self.config.interval);
                let interval = self.accounts.interval(now, self.online.len(), &self.loop_stats);
                emit(&ScheduleEvent::Interval(interval));
            }
            std::thread::sleep(COMPANION_TICK);
        }
        self.finish(emit)
    }

    /// Picked-up offline processes whose KFD state was incomplete: asked again until their deadline.
    fn retry_pickups(&mut self, now: u64, emit: &mut dyn FnMut(&ScheduleEvent)) {
        let due = std::mem::take(&mut self.retry);
        for (pid, deadline) in due {
            if now >= deadline {
                emit(&ScheduleEvent::OfflineAttachFailed {
                    pid,
                    error: format!("its KFD state was still incomplete after {PICKUP_RETRY:?}"),
                });
            } else {
                self.retry.push((pid, deadline));
                if !self.attaching.contains(&pid) {
                    self.attaching.insert(pid);
                    self.send(Command::AttachOffline { pid, picked_up: true, job: self.job_of(pid) });
                }
            }
        }
    }

    /// Stop the reaction thread (it resumes and detaches), take its last reports, emit the summary.
    fn finish(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) -> ScheduleReport {
        self.reaction_stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.reaction.take() {
            match thread.join() {
                Ok(realtime) => self.realtime = realtime,
                Err(_) => self.reaction_panicked = true,
            }
        }
        self.drain_reports(emit);
        // The stop's resumes, before the summary.
        let mut changes = Vec::new();
        self.discovery.poll(&mut changes);
        self.collect_spans();
        self.accounts.offline_progress();
        let facts = RunFacts {
            loop_stats: &self.loop_stats,
            realtime: self.realtime.clone(),
            reaction_panicked: self.reaction_panicked,
            hints: self
                .config
                .hint_socket
                .as_ref()
                .map(|_| self.loop_stats.hints.lock().map(|h| *h).unwrap_or_default()),
        };
        let report = self.accounts.report(monotonic_ns(), facts);
        emit(&ScheduleEvent::Summary(Box::new(report.clone())));
        report
    }

    fn drain_reports(&mut self, emit: &mut dyn FnMut(&ScheduleEvent)) {
        while let Ok(r) = self.reports.try_recv() {
            self.take(r, emit);
        }
    }

    /// One report of the reaction thread: accounting and the event.
    fn take(&mut self, r: Report, emit: &mut dyn FnMut(&ScheduleEvent)) {
        match r {
            Report::Attached { pid, comm, queues, picked_up } => {
                self.attaching.remove(&pid);
                self.retry.retain(|(p, _)| *p != pid);
                let gpus = self.accounts.offline_attached(pid, &queues);
                emit(&ScheduleEvent::OfflineAttached { pid, comm, queues: queues.len(), gpus, picked_up });
            }
            Report::AttachFailed { pid, error, retry } => {
                self.attaching.remove(&pid);
                if retry && self.retry.iter().any(|(p, _)| *p == pid) {
                    return; // retried at the next tick until its deadline
                }
                self.retry.retain(|(p, _)| *p != pid);
                emit(&ScheduleEvent::OfflineAttachFailed { pid, error: error.to_string() });
            }
            Report::Detached { pid, reason, detached } => {
                self.accounts.offline_detached(pid);
                if reason == DetachReason::Exited {
                    self.seen.remove(&pid);
                }
                emit(&ScheduleEvent::OfflineDetached { pid, reason, detached });
            }
            Report::QueuesHeld { pid, queues } => emit(&ScheduleEvent::OfflineQueuesHeld { pid, queues }),
            Report::QueuesReset { pid, queues } => {
                self.accounts.queues_reset.extend(queues.iter().map(|&queue_id| ResetQueue { pid, queue_id }));
                emit(&ScheduleEvent::OfflineQueuesReset { pid, queues });
            }
            Report::WatchdogResumed { t_ns, pid, held_ms, still_held } => {
                emit(&ScheduleEvent::WatchdogResumed { t_ms: self.accounts.t_ms(t_ns), pid, held_ms, still_held });
            }
            Report::Transition(record, errors) => {
                let t = self.accounts.transition(record, errors);
                emit(&ScheduleEvent::Transition(t));
            }
            Report::ResumeSkipped { t_ns, gpu, verdict } => emit(&self.accounts.resume_skipped(t_ns, gpu, verdict)),
            Report::Released { t_ns, gpu } => self.accounts.released(t_ns, gpu),
            Report::OnlineGone { pid } => {
                if self.online.remove(&pid) {
                    self.seen.remove(&pid);
                    emit(&ScheduleEvent::OnlineGone { pid });
                }
            }
            Report::DoorbellStores(count) => self.accounts.doorbell_stores.push(count),
            Report::SeenBy { pid, path, libraries, probes, why } => {
                emit(&ScheduleEvent::OnlineSeenBy { pid, path, libraries, probes, why });
            }
            Report::ArrivalWatch { pid, ports, cgroup, why } => {
                emit(&ScheduleEvent::OnlineArrival { pid, ports, cgroup, why });
            }
            Report::ArrivalDone(r) => self.accounts.arrival.push(*r),
            Report::HintMalformed { line, count } => emit(&ScheduleEvent::HintMalformed { line, count }),
            Report::Warning(message) => emit(&ScheduleEvent::Warning { message }),
        }
    }

    /// A lifecycle notice of discovery: a process to watch or attach, one gone, a queue.
    fn apply_change(&mut self, change: ModelNotice, emit: &mut dyn FnMut(&ScheduleEvent)) {
        match change {
            ModelNotice::ProcessOpened { pid } => {
                if self.seen.contains_key(&pid) || pid.0 == std::process::id() {
                    return;
                }
                let roots = &self.config.roots;
                if select::any_matches_new(&self.config.online, roots, pid) {
                    self.seen.insert(pid, Role::Online);
                    if let Err(e) = self.watch_online(pid, &[], false, emit) {
                        emit(&ScheduleEvent::Warning { message: e.to_string() });
                    }
                } else if select::any_matches_new(&self.config.offline, roots, pid) {
                    self.seen.insert(pid, Role::Offline);
                    let deadline = monotonic_ns() + ns_of(PICKUP_RETRY);
                    self.retry.push((pid, deadline));
                    self.attaching.insert(pid);
                    self.send(Command::AttachOffline { pid, picked_up: true, job: self.job_of(pid) });
                }
            }
            ModelNotice::ProcessGone { pid } => {
                self.seen.remove(&pid);
                self.retry.retain(|(p, _)| *p != pid);
                if self.online.remove(&pid) {
                    self.send(Command::OnlineGone { pid });
                    emit(&ScheduleEvent::OnlineGone { pid });
                }
                if self.accounts.is_offline(pid) {
                    self.send(Command::OfflineGone { pid });
                }
            }
            ModelNotice::QueueCreated { pid, queue: addrs } => {
                if self.online.contains(&pid) {
                    self.accounts.note_gpu(addrs.gpu_id);
                    self.send(Command::OnlineQueue { pid, addrs });
                    emit(&ScheduleEvent::OnlineQueue { pid, queue_id: addrs.queue_id, gpu_id: addrs.gpu_id });
                } else {
                    self.accounts.offline_queue(pid, addrs);
                }
            }
            ModelNotice::QueueGone { pid, queue_id } => {
                if self.online.contains(&pid) {
                    self.send(Command::OnlineQueueGone { pid, queue_id });
                }
            }
            // The SUSPEND that caused it counted it suspended (docs/kfd.md §2.4): its session
            // learns it from here.
            ModelNotice::QueueReset { pid, queue_id, .. } => {
                if self.accounts.is_offline(pid) {
                    self.send(Command::OfflineQueueReset { pid, queue_id });
                }
            }
            // A process with one is refused at start (config::resolve_selection); one made during
            // the run is said once per context, and the process stays attached (its primary
            // context's queues are still held): the debug trap cannot reach it (docs/kfd.md §1.4).
            ModelNotice::ContextCreated { pid, context_id } => {
                let context = context_id.map_or_else(|| "context_?".to_owned(), |id| format!("context_{id}"));
                let made = format!("made a secondary KFD context ({context}; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0)");
                let message = if self.accounts.is_offline(pid) {
                    format!(
                        "offline pid {pid} {made}: DBG_TRAP cannot suspend the queues it creates there, so they keep \
                         running while its primary context's queues are held; run it without that context to have \
                         all its work held"
                    )
                } else if self.online.contains(&pid) {
                    format!(
                        "online pid {pid} {made}: its work there is not seen, so the offline processes are not held \
                         for it; run it without that context"
                    )
                } else {
                    return;
                };
                emit(&ScheduleEvent::Warning { message });
            }
        }
    }

    /// The driver's spans of the offline processes' suspends and resumes so far.
    fn collect_spans(&mut self) {
        if !self.discovery.sees_driver() {
            return;
        }
        self.discovery.driver_spans(&mut self.spans);
        if !self.spans.is_empty() {
            self.accounts.add_spans(&mut self.spans, &self.online_ever);
        }
    }

    /// Each GPU with a policy and its state now (as the reaction thread last reported it).
    pub fn states(&self) -> Vec<(GpuId, State)> {
        self.accounts.states()
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped without [`Scheduler::run`] (an error at start, a panic on this side):
    /// the reaction thread still resumes and detaches everything before this returns.
    fn drop(&mut self) {
        self.reaction_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.reaction.take() {
            let _ = t.join();
        }
    }
}
