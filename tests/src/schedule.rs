//! `gpreempt schedule` under test: the running scheduler with its `--json` stream read live, a
//! refused start, and whether an emulated queue runs or is held.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{binary, controller::rptr_now};

/// Under TCG the in-process tracer alone takes tens of seconds to start.
pub const LONG: Duration = Duration::from_secs(240);

/// `gpreempt schedule --json …` with its stdout collected by a reader thread.
pub struct Schedule {
    pub child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Schedule {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(args, Privilege::Root, &[])
    }

    /// [`Schedule::start`] with `privilege` and extra environment variables.
    pub fn start_with(args: &[&str], privilege: Privilege, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(binary("gpreempt").unwrap());
        command.arg("schedule").arg("--json").args(args).envs(env.iter().copied());
        privilege.apply(&mut command);
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Self { child, lines, reader: Some(reader) }
    }

    /// `--online ONLINE --offline OFFLINE` plus `extra`.
    pub fn between(online: u32, offline: &str, extra: &[&str]) -> Self {
        let online = online.to_string();
        Self::start(&[&["--online", &online, "--offline", offline], extra].concat())
    }

    /// Every object printed so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.lines.lock().unwrap().iter().filter(|v| v["event"] == kind).cloned().collect()
    }

    pub fn transitions(&self, action: &str) -> Vec<Value> {
        self.events("transition").into_iter().filter(|t| t["action"] == action).collect()
    }

    /// Wait until `find` returns `n` items (panics with the stream and, if the scheduler
    /// exited, its stderr after `timeout`).
    pub fn wait_n(
        &mut self,
        what: &str,
        n: usize,
        timeout: Duration,
        find: impl Fn(&Self) -> Vec<Value>,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = find(self);
            if found.len() >= n {
                return found;
            }
            if Instant::now() > deadline || self.child.try_wait().unwrap().is_some() {
                let stderr = self.stderr_now();
                panic!("no {n} `{what}`: {:?}\nstderr: {stderr}", self.lines.lock().unwrap());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn wait_events(&mut self, kind: &str, n: usize, timeout: Duration) -> Vec<Value> {
        self.wait_n(kind, n, timeout, |s| s.events(kind))
    }

    pub fn wait_transitions(&mut self, action: &str, n: usize, timeout: Duration) -> Vec<Value> {
        self.wait_n(action, n, timeout, |s| s.transitions(action))
    }

    /// Its stderr once it has exited (empty while it runs).
    pub fn stderr_now(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_none() {
            return String::new();
        }
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Wait for exit; the whole stdout has been read when this returns.
    pub fn wait(mut self) -> (ExitStatus, Vec<Value>, String) {
        let status = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let stderr = self.stderr_now();
        let lines = self.lines();
        (status, lines, stderr)
    }

    /// SIGINT (Ctrl-C); it must exit 0. Its output and stderr.
    pub fn stop(self) -> (Vec<Value>, String) {
        self.signal(Signal::SIGINT);
        let (status, lines, stderr) = self.wait();
        assert!(status.success(), "schedule failed: {stderr}");
        (lines, stderr)
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn summary(lines: &[Value]) -> Value {
    lines.iter().find(|v| v["event"] == "summary").cloned().unwrap_or_else(|| panic!("no summary in {lines:?}"))
}

/// How `gpreempt schedule` is run by [`refused`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Root,
    /// Root without CAP_SYS_PTRACE (dropped from the bounding set before exec, so the exec'd
    /// root process does not get it back).
    RootWithoutPtrace,
    /// Root without CAP_SYS_NICE: no SCHED_FIFO (root's RLIMIT_RTPRIO is 0 by default).
    RootWithoutNice,
}

impl Privilege {
    fn apply(self, command: &mut Command) {
        let cap = match self {
            Privilege::Root => return,
            Privilege::RootWithoutPtrace => CAP_SYS_PTRACE,
            Privilege::RootWithoutNice => CAP_SYS_NICE,
        };
        // SAFETY: prctl and the capability system calls are async-signal-safe and change only
        // the child's own credentials.
        unsafe { command.pre_exec(move || drop_capability(cap)) };
    }
}

/// `CAP_SYS_PTRACE` and `CAP_SYS_NICE` (include/uapi/linux/capability.h; libc does not name the
/// capabilities).
const CAP_SYS_PTRACE: libc::c_ulong = 19;
const CAP_SYS_NICE: libc::c_ulong = 23;

/// In a child before exec: root's permitted set after exec is its inheritable set plus its
/// bounding set (execve of a binary without file capabilities, Linux capabilities(7)), so `cap`
/// leaves both.
fn drop_capability(cap: libc::c_ulong) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let err = std::io::Error::last_os_error;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: the header and the two data words are what capget/capset take for version 3.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
            return Err(err());
        }
        data[0].inheritable &= !(1 << cap);
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return Err(err());
        }
        let zero: libc::c_ulong = 0;
        if libc::prctl(libc::PR_CAPBSET_DROP, cap, zero, zero, zero) != 0 {
            return Err(err());
        }
    }
    Ok(())
}

/// `gpreempt schedule ARGS` that must refuse to start: its exit code and stderr.
pub fn refused(args: &[&str], privilege: Privilege) -> (Option<i32>, String) {
    let mut command = Command::new(binary("gpreempt").unwrap());
    command.arg("schedule").args(args);
    privilege.apply(&mut command);
    let out = command.output().unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The read index at `address` of `pid` moves within 2 s (the queue is running).
pub fn progresses(pid: u32, address: u64) -> bool {
    let a = rptr_now(pid, address);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if rptr_now(pid, address) > a {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The read index at `address` of `pid` stays put for 300 ms (the queue is suspended).
pub fn holds(pid: u32, address: u64) -> bool {
    // The running dispatch is stopped by the unmap; what started before the suspend returned
    // is visible by now.
    thread::sleep(Duration::from_millis(50));
    let a = rptr_now(pid, address);
    thread::sleep(Duration::from_millis(300));
    rptr_now(pid, address) == a
}

/// Prints `elapsed: NAME: S s` on the process's stdout when dropped (past libtest's capture, as
/// [`crate::report_skip`] does), so a run's log shows what each test costs.
pub struct Elapsed {
    name: &'static str,
    start: Instant,
}

impl Elapsed {
    pub fn start(name: &'static str) -> Self {
        Self { name, start: Instant::now() }
    }
}

impl Drop for Elapsed {
    fn drop(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "elapsed: {}: {:.1} s", self.name, self.start.elapsed().as_secs_f64());
        let _ = out.flush();
    }
}
