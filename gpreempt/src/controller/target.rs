//! The process we are asked to debug: the checks made before touching it (exists, not us, a KFD
//! process, not already traced) and the diagnosis of a refused `PTRACE_SEIZE`.
//!
//! A pid names a process only while it lives: between `inspect` and `PTRACE_SEIZE` the target
//! may exit and its pid be reused. `inspect` therefore opens a pidfd, which keeps naming the
//! inspected process, and [`Target::confirm`] asks it after the seize whether that process is
//! still the one alive.

use std::{
    fs,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::Arc,
};

use nix::errno::Errno;

use crate::{
    domain::HostPid,
    host::{
        procinfo::{effective_caps, status_field, status_number},
        roots::{PROC_ROOT, Roots},
        sysfs,
    },
    output::text::escape,
};

/// Facts about a target process read from `/proc/<pid>` and the KFD sysfs tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: HostPid,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    /// `TracerPid:` of `/proc/<pid>/status` (0 = not traced). The kernel reports the tracing
    /// *thread*; see [`Target::already_traced`] for its process.
    pub tracer_pid: u32,
    /// `State:` is `Z`.
    pub zombie: bool,
    /// `Tgid:`: the thread-group leader KFD checks the ptrace link against.
    pub tgid: HostPid,
    /// `/sys/class/kfd/kfd/proc/<pid>` exists: the process has opened `/dev/kfd`.
    pub uses_kfd: bool,
    /// Its secondary KFD contexts (`proc/<pid>/context_<id>/`, Linux 7.0), sorted; empty for a
    /// process with only its primary context, however many `/dev/kfd` files it has open.
    pub secondary_contexts: Vec<u16>,
    /// The inspected process itself (None for a captured `/proc` tree, or a kernel before 5.3).
    pub handle: Option<ProcessHandle>,
}

/// A pidfd (`pidfd_open(2)`): refers to one process for good, whatever later reuses its pid.
#[derive(Clone, Debug)]
pub struct ProcessHandle(Arc<OwnedFd>);

impl ProcessHandle {
    pub fn open(pid: HostPid) -> Result<Self, Errno> {
        // SAFETY: plain syscall with integer arguments; a non-negative result is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.0 as libc::pid_t, 0) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(Self(Arc::new(unsafe { OwnedFd::from_raw_fd(fd as i32) })))
    }

    /// Whether the process still exists: `pidfd_send_signal(fd, 0)` answers ESRCH once it has been
    /// reaped, even if its pid was reused since (kernel/signal.c, 6.12; an unreaped zombie still
    /// exists, and `inspect` reports it as such). EPERM (another user's process) means it exists.
    pub fn alive(&self) -> bool {
        // SAFETY: signal 0 with a null siginfo only checks existence and permission.
        let r = unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.0.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0)
        };
        r == 0 || Errno::last() != Errno::ESRCH
    }
}

/// Two handles are equal when they are the same open pidfd.
impl PartialEq for ProcessHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for ProcessHandle {}

/// Why a pid cannot be debugged, found before any ptrace or ioctl.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("no process with pid {0} (see `gpreempt ps` for the KFD processes)")]
    NoSuchProcess(HostPid),
    #[error("pid {0} is gpreempt itself; give the pid of another process that uses the GPU (see `gpreempt ps`)")]
    OwnProcess(HostPid),
    #[error(
        "pid {pid} ({}) has never opened /dev/kfd, so it has no GPU queues to suspend \
         (see `gpreempt ps` for the processes that do)",
        escape(.comm)
    )]
    NotKfdProcess { pid: HostPid, comm: String },
    #[error("pid {pid} is a thread of process {tgid}; KFD knows whole processes: give pid {tgid}")]
    NotLeader { pid: HostPid, tgid: HostPid },
    #[error(
        "pid {pid} ({}) exited after it was inspected; the pid may now name another process, so it was not \
         debugged",
        escape(.comm)
    )]
    Replaced { pid: HostPid, comm: String },
    #[error("pid {pid} ({}) has exited (a zombie its parent has not reaped)", escape(.comm))]
    Exited { pid: HostPid, comm: String },
    #[error(
        "pid {pid} ({}) is already traced by pid {tracer_pid} ({}); a process has one tracer: \
         detach that one (quit gdb/rocgdb/strace) and retry",
        escape(.comm),
        escape(.tracer_comm)
    )]
    AlreadyTraced { pid: HostPid, comm: String, tracer_pid: HostPid, tracer_comm: String },
    #[error(
        "refusing pid {pid} ({}): it has secondary KFD contexts ({}; AMDKFD_IOC_CREATE_PROCESS, Linux 7.0), and \
         DBG_TRAP returns EOPNOTSUPP for a secondary context while the pid names only its primary one, so the \
         queues of those contexts can be neither listed nor suspended and would keep running while gpreempt \
         reported the process suspended",
        escape(.comm),
        contexts_list(.contexts)
    )]
    SecondaryContexts { pid: HostPid, comm: String, contexts: Vec<u16> },
    /// The online side's form of [`TargetError::SecondaryContexts`]: nothing suspends an online
    /// process, but its work in a secondary context cannot be seen.
    #[error(
        "refusing pid {pid} ({}) as online: it has secondary KFD contexts ({}; AMDKFD_IOC_CREATE_PROCESS, Linux \
         7.0), whose queues DBG_TRAP's snapshot does not reach and the scheduler does not watch (`gpreempt trace` \
         lists them, by context), so its work there would go unseen and the offline processes would keep running \
         beside it; plain ROCr opens only the primary context",
        escape(.comm),
        contexts_list(.contexts)
    )]
    OnlineSecondaryContexts { pid: HostPid, comm: String, contexts: Vec<u16> },
}

/// `context_0, context_3`: the contexts as sysfs names them.
fn contexts_list(contexts: &[u16]) -> String {
    contexts.iter().map(|id| format!("context_{id}")).collect::<Vec<_>>().join(", ")
}

impl Target {
    /// Read the target's facts, refusing pids that cannot possibly be debugged.
    pub fn inspect(roots: &Roots, pid: HostPid) -> Result<Self, TargetError> {
        if pid.0 == std::process::id() {
            return Err(TargetError::OwnProcess(pid));
        }
        // Opened before /proc is read, so what is read is known to be this process's if the handle
        // still says it lives afterwards.
        let handle = if roots.proc == Path::new(PROC_ROOT) { ProcessHandle::open(pid).ok() } else { None };
        let dir = roots.proc.join(pid.to_string());
        let status = fs::read_to_string(dir.join("status")).map_err(|_| TargetError::NoSuchProcess(pid))?;
        if handle.as_ref().is_some_and(|h| !h.alive()) {
            return Err(TargetError::NoSuchProcess(pid));
        }
        let comm = read_comm(&dir).unwrap_or_else(|| status_field(&status, "Name").unwrap_or_default().to_owned());
        let tgid = status_number(&status, "Tgid").map_or(pid, HostPid);
        let tracer_pid = status_number(&status, "TracerPid").unwrap_or(0);
        let uses_kfd = roots.kfd_proc().join(pid.to_string()).is_dir();
        // Exact, where the fd count was a guess: amdsmi and rocprofiler-sdk keep a second /dev/kfd
        // file on the same primary context; only CREATE_PROCESS makes a context_<id> directory.
        let secondary_contexts = sysfs::secondary_contexts(&roots.kfd_proc(), pid).unwrap_or_default();
        let zombie = status_field(&status, "State").is_some_and(|v| v.starts_with('Z'));
        Ok(Self { pid, comm, tracer_pid, zombie, tgid, uses_kfd, secondary_contexts, handle })
    }

    /// Call right after `PTRACE_SEIZE`: the seized pid is still the inspected process. A process
    /// that exited in between fails even if its pid was reused by the one just seized.
    pub fn confirm(&self) -> Result<(), TargetError> {
        match &self.handle {
            Some(h) if !h.alive() => Err(TargetError::Replaced { pid: self.pid, comm: self.comm.clone() }),
            _ => Ok(()),
        }
    }

    /// The checks `inspect` leaves to the caller so `gpreempt queues` can still fall back to sysfs.
    pub fn check_debuggable(&self, roots: &Roots) -> Result<(), TargetError> {
        if self.zombie {
            return Err(TargetError::Exited { pid: self.pid, comm: self.comm.clone() });
        }
        if self.tgid != self.pid {
            return Err(TargetError::NotLeader { pid: self.pid, tgid: self.tgid });
        }
        if !self.uses_kfd {
            return Err(TargetError::NotKfdProcess { pid: self.pid, comm: self.comm.clone() });
        }
        if !self.secondary_contexts.is_empty() {
            return Err(TargetError::SecondaryContexts {
                pid: self.pid,
                comm: self.comm.clone(),
                contexts: self.secondary_contexts.clone(),
            });
        }
        if self.tracer_pid != 0 {
            return Err(self.already_traced(roots, self.tracer_pid));
        }
        Ok(())
    }

    /// The error naming the tracer's process (TracerPid is the tracing thread; its Tgid and the
    /// process's comm are what a user recognises: `strace`, `gdb`, …).
    pub fn already_traced(&self, roots: &Roots, tracer_tid: u32) -> TargetError {
        let thread = roots.proc.join(tracer_tid.to_string());
        let tracer_pid = fs::read_to_string(thread.join("status"))
            .ok()
            .and_then(|s| status_number(&s, "Tgid"))
            .map_or(HostPid(tracer_tid), HostPid);
        TargetError::AlreadyTraced {
            pid: self.pid,
            comm: self.comm.clone(),
            tracer_pid,
            tracer_comm: read_comm(&roots.proc.join(tracer_pid.to_string())).unwrap_or_else(|| "?".to_owned()),
        }
    }
}

/// Why the kernel refused `PTRACE_SEIZE` with EPERM, from what this host says.
pub fn explain_ptrace_denied(roots: &Roots, target: &Target) -> String {
    // The target may have been attached by someone else since `inspect`.
    if let Ok(now) = Target::inspect(roots, target.pid)
        && now.tracer_pid != 0
    {
        return now.already_traced(roots, now.tracer_pid).to_string();
    }
    let has_cap = has_cap_sys_ptrace(roots);
    let scope = fs::read_to_string(roots.proc.join("sys/kernel/yama/ptrace_scope"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match (scope, has_cap) {
        (Some(3), _) => "Yama ptrace_scope is 3: ptrace is disabled on this host until reboot \
                         (kernel.yama.ptrace_scope cannot be lowered from 3)"
            .to_owned(),
        (Some(2), false) => "Yama ptrace_scope is 2: only processes with CAP_SYS_PTRACE may attach; run as root \
                             (or with CAP_SYS_PTRACE)"
            .to_owned(),
        (Some(1), false) => format!(
            "Yama ptrace_scope is 1: pid {} is not a descendant of gpreempt; run as root (CAP_SYS_PTRACE) or set \
             kernel.yama.ptrace_scope=0",
            target.pid
        ),
        (_, false) => format!(
            "not allowed to ptrace pid {} ({}): it belongs to another user or is not dumpable; run as root \
             (CAP_SYS_PTRACE)",
            target.pid,
            escape(&target.comm)
        ),
        (_, true) => format!(
            "the kernel refused to ptrace pid {} ({}) although gpreempt has CAP_SYS_PTRACE (a security module \
             such as SELinux/AppArmor, or a container without CAP_SYS_PTRACE in the target's user namespace)",
            target.pid,
            escape(&target.comm)
        ),
    }
}

/// CAP_SYS_PTRACE (bit 19) in our effective set (`CapEff:` of /proc/self/status).
fn has_cap_sys_ptrace(roots: &Roots) -> bool {
    fs::read_to_string(roots.proc.join("self/status"))
        .ok()
        .and_then(|s| effective_caps(&s))
        .is_some_and(|caps| caps & (1 << 19) != 0)
}

fn read_comm(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join("comm")).ok().map(|s| s.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    /// `proc` holds (path under /proc, text) pairs; `kfd_pids` are the KFD processes.
    fn fake(proc: &[(&str, &str)], kfd_pids: &[u32]) -> (FakeHost, Roots) {
        let mut host = FakeHost::new();
        for (path, text) in proc {
            host.file(Path::new("proc").join(path), text);
        }
        for &pid in kfd_pids {
            host.kfd_process(pid);
        }
        let roots = host.roots();
        (host, roots)
    }

    const TRAIN: &str = "Name:\ttrain\nTgid:\t4242\nPid:\t4242\nTracerPid:\t0\n";

    #[test]
    fn a_kfd_process_passes() {
        let (_d, roots) = fake(&[("4242/status", TRAIN), ("4242/comm", "train\n")], &[4242]);
        let t = Target::inspect(&roots, HostPid(4242)).unwrap();
        assert_eq!(
            t,
            Target {
                pid: HostPid(4242),
                comm: "train".into(),
                tracer_pid: 0,
                zombie: false,
                tgid: HostPid(4242),
                uses_kfd: true,
                secondary_contexts: vec![],
                handle: None
            }
        );
        assert_eq!(t.check_debuggable(&roots), Ok(()));
    }

    /// The fd count is no test: a process with two `/dev/kfd` files on its one primary context
    /// (as amdsmi's event notification or rocprofiler-sdk keep) is accepted; only a `context_<id>`
    /// directory in sysfs (Linux 7.0 CREATE_PROCESS) refuses it, naming why.
    #[test]
    fn secondary_contexts_refuse_and_an_extra_primary_fd_does_not() {
        let (host, roots) = fake(&[("4242/status", TRAIN), ("4242/comm", "train\n")], &[4242]);
        let fd = host.path().join("proc/4242/fd");
        fs::create_dir_all(&fd).unwrap();
        for (n, target) in [("0", "/dev/null"), ("3", "/dev/kfd"), ("4", "/dev/dri/renderD128"), ("9", "/dev/kfd")] {
            std::os::unix::fs::symlink(target, fd.join(n)).unwrap();
        }
        let t = Target::inspect(&roots, HostPid(4242)).unwrap();
        assert_eq!(t.secondary_contexts, [] as [u16; 0]);
        assert_eq!(t.check_debuggable(&roots), Ok(()));

        fs::create_dir_all(roots.kfd_proc().join("4242/context_1/queues")).unwrap();
        let t = Target::inspect(&roots, HostPid(4242)).unwrap();
        assert_eq!(t.secondary_contexts, [1]);
        let err = t.check_debuggable(&roots).unwrap_err();
        assert_eq!(err, TargetError::SecondaryContexts { pid: HostPid(4242), comm: "train".into(), contexts: vec![1] });
        assert_eq!(
            err.to_string(),
            "refusing pid 4242 (train): it has secondary KFD contexts (context_1; AMDKFD_IOC_CREATE_PROCESS, Linux \
             7.0), and DBG_TRAP returns EOPNOTSUPP for a secondary context while the pid names only its primary one, \
             so the queues of those contexts can be neither listed nor suspended and would keep running while \
             gpreempt reported the process suspended"
        );
    }

    #[test]
    fn bad_targets_name_the_cause() {
        let (_d, roots) = fake(
            &[
                ("1/status", "Name:\tsystemd\nTgid:\t1\nTracerPid:\t0\n"),
                ("1/comm", "systemd\n"),
                ("4242/status", "Name:\ttrain\nTgid:\t4242\nTracerPid:\t78\n"),
                ("4242/comm", "train\n"),
                ("78/status", "Name:\tworker\nTgid:\t77\n"),
                ("77/comm", "strace\n"),
                ("5000/status", "Name:\tdone\nState:\tZ (zombie)\nTgid:\t5000\nTracerPid:\t0\n"),
                ("4243/status", "Name:\ttrain\nTgid:\t4242\nTracerPid:\t0\n"),
            ],
            &[4242],
        );
        assert_eq!(
            Target::inspect(&roots, HostPid(999_999)).unwrap_err(),
            TargetError::NoSuchProcess(HostPid(999_999))
        );
        let own = Target::inspect(&roots, HostPid(std::process::id())).unwrap_err();
        assert_eq!(own, TargetError::OwnProcess(HostPid(std::process::id())));
        // Said to --online as to --offline: no side is named.
        assert_eq!(
            own.to_string(),
            format!(
                "pid {} is gpreempt itself; give the pid of another process that uses the GPU (see `gpreempt ps`)",
                std::process::id()
            )
        );
        let init = Target::inspect(&roots, HostPid(1)).unwrap();
        assert_eq!(
            init.check_debuggable(&roots).unwrap_err().to_string(),
            "pid 1 (systemd) has never opened /dev/kfd, so it has no GPU queues to suspend (see `gpreempt ps` for \
             the processes that do)"
        );
        let traced = Target::inspect(&roots, HostPid(4242)).unwrap();
        assert_eq!(
            traced.check_debuggable(&roots).unwrap_err(),
            TargetError::AlreadyTraced {
                pid: HostPid(4242),
                comm: "train".into(),
                tracer_pid: HostPid(77),
                tracer_comm: "strace".into()
            }
        );
        let tty = Target { comm: "x\x1b]0;owned\x07".into(), ..init.clone() };
        assert_eq!(
            tty.check_debuggable(&roots).unwrap_err().to_string(),
            "pid 1 (x\\e]0;owned\\x07) has never opened /dev/kfd, so it has no GPU queues to suspend (see `gpreempt \
             ps` for the processes that do)"
        );
        assert_eq!(
            Target::inspect(&roots, HostPid(5000)).unwrap().check_debuggable(&roots).unwrap_err(),
            TargetError::Exited { pid: HostPid(5000), comm: "done".into() }
        );
        assert_eq!(
            Target::inspect(&roots, HostPid(4243)).unwrap().check_debuggable(&roots).unwrap_err(),
            TargetError::NotLeader { pid: HostPid(4243), tgid: HostPid(4242) }
        );
    }

    #[test]
    fn confirm_fails_once_the_inspected_process_has_exited() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        // spawn returns once the child exists, possibly before its exec renamed it.
        let comm_path = format!("/proc/{}/comm", child.id());
        for _ in 0..500 {
            if fs::read_to_string(&comm_path).is_ok_and(|c| c.trim() == "sleep") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let target = Target::inspect(&Roots::default(), HostPid(child.id())).unwrap();
        assert!(target.handle.is_some(), "a live /proc gives a pidfd");
        assert_eq!(target.comm, "sleep");
        assert_eq!(target.confirm(), Ok(()));
        child.kill().unwrap();
        child.wait().unwrap();
        // Whether or not the pid is reused meanwhile, the pidfd names the exited process.
        assert_eq!(target.confirm(), Err(TargetError::Replaced { pid: HostPid(child.id()), comm: "sleep".into() }));
    }

    #[test]
    fn ptrace_refusals_are_explained_from_yama_and_caps() {
        let (_d, roots) = fake(
            &[
                ("4242/status", TRAIN),
                ("sys/kernel/yama/ptrace_scope", "2\n"),
                ("self/status", "CapEff:\t0000000000000000\n"),
            ],
            &[4242],
        );
        let t = Target::inspect(&roots, HostPid(4242)).unwrap();
        assert!(explain_ptrace_denied(&roots, &t).starts_with("Yama ptrace_scope is 2"));
        fs::write(roots.proc.join("self/status"), "CapEff:\t000001ffffffffff\n").unwrap();
        assert!(explain_ptrace_denied(&roots, &t).starts_with("the kernel refused to ptrace pid 4242 (train)"));
    }
}
