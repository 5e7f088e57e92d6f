//! Diagnostic: back-to-back SUSPEND/RESUME cycles on another process's queues, printed in
//! dbg-pair's format (per cycle, CLOCK_MONOTONIC ns: suspend call, suspend return, resume call,
//! resume return), through different layers:
//!
//!   session-pair raw PID CYCLES [mask] [async] [watchdog]  (libc only, like dbg_pair.c)
//!   session-pair tally PID CYCLES [nowatchdog]              (Session::suspend_tally/resume_tally)
//!   session-pair run PID CYCLES [nowatchdog]                (preempt::run, hold 0, gap 0)

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::AtomicBool,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::monotonic_ns,
    domain::HostPid,
    kfd::{
        debugger::{Options, Selection},
        session::Session,
        watchdog::Watchdog,
    },
    preempt::{self, Plan},
};

#[repr(C)]
struct Args {
    pid: u32,
    op: u32,
    data: [u64; 3],
}
const IOC: libc::c_ulong = 0xC000_0000 | ((std::mem::size_of::<Args>() as libc::c_ulong) << 16) | (0x4B << 8) | 0x26;

fn dbg(kfd: i32, pid: u32, op: u32, a: u64, b: u64, c: u64) -> i64 {
    let mut args = Args { pid, op, data: [a, b, c] };
    // SAFETY: the ioctl's argument struct.
    let r = unsafe { libc::ioctl(kfd, IOC, &mut args) };
    if r < 0 { -(std::io::Error::last_os_error().raw_os_error().unwrap_or(1) as i64) } else { r as i64 }
}

fn raw(pid: u32, cycles: usize, flags: &[String]) -> Result<Vec<[u64; 4]>> {
    let has = |f: &str| flags.iter().any(|x| x == f);
    let wd = if has("watchdog") { Some(Watchdog::spawn()?) } else { None };
    // SAFETY: plain syscalls.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) < 0 {
            bail!("seize");
        }
        let kfd = libc::open(c"/dev/kfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        let mut ev = [0i32; 2];
        libc::pipe2(ev.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC);
        let _keep = (OwnedFd::from_raw_fd(ev[0]), OwnedFd::from_raw_fd(ev[1]));
        let mut sig = None;
        if has("async") {
            sig = Some(gpreempt::signal_pipe::SignalPipe::new(&[libc::SIGCHLD, libc::SIGIO])?);
            libc::fcntl(ev[0], libc::F_SETOWN, libc::getpid());
            libc::fcntl(ev[0], libc::F_SETFL, libc::O_NONBLOCK | libc::O_ASYNC);
        }
        let mask: u64 = if has("mask") { (1 << 30) | 0x8000_0000_0000 } else { 0 };
        let mut rinfo = [0u8; 16];
        let r = dbg(kfd, pid, 0, mask, rinfo.as_mut_ptr() as u64, 16 | ((ev[1] as u64) << 32));
        if r < 0 {
            bail!("enable {r}");
        }
        let mut snap = [[0u64; 8]; 64];
        let mut s = Args { pid, op: 13, data: [if has("mask") { 1 << 30 } else { 0 }, snap.as_mut_ptr() as u64, 64 | (64u64 << 32)] };
        if libc::ioctl(kfd, IOC, &mut s) < 0 {
            bail!("snapshot");
        }
        let n = (s.data[2] as u32).min(64) as usize;
        let ids: Vec<u32> = (0..n).map(|i| snap[i][5] as u32).collect();
        let mut again = ids.clone();
        let mut times = vec![[0u64; 4]; cycles];
        for t in times.iter_mut() {
            again.copy_from_slice(&ids);
            t[0] = monotonic_ns();
            let mut r = dbg(kfd, pid, 6, 0, again.as_mut_ptr() as u64, n as u64);
            t[1] = monotonic_ns();
            if let Some(w) = &wd {
                w.arm(Duration::from_secs(5));
            }
            again.copy_from_slice(&ids);
            t[2] = monotonic_ns();
            r |= dbg(kfd, pid, 7, again.as_mut_ptr() as u64, n as u64, 0);
            t[3] = monotonic_ns();
            if let Some(w) = &wd {
                w.disarm();
            }
            if r < 0 {
                bail!("cycle {r}");
            }
        }
        dbg(kfd, pid, 1, 0, 0, 0);
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
        drop(sig);
        libc::close(kfd);
        Ok(times)
    }
}

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let mode = a.get(1).context("mode")?.as_str();
    let pid: u32 = a.get(2).context("pid")?.parse()?;
    let cycles: usize = a.get(3).context("cycles")?.parse()?;
    let flags = &a[4.min(a.len())..];
    let options = Options {
        max_suspend: (!flags.iter().any(|f| f == "nowatchdog")).then(|| Duration::from_millis(5000)),
        ..Options::default()
    };
    let times = match mode {
        "raw" => raw(pid, cycles, flags)?,
        "tally" => {
            let mut s = Session::attach(HostPid(pid), &options)?;
            let mut times = vec![[0u64; 4]; cycles];
            for t in times.iter_mut() {
                let su = s.suspend_tally(&Selection::All, 0)?;
                let re = s.resume_tally()?;
                *t = [su.called_ns, su.returned_ns, re.called_ns, re.returned_ns];
            }
            s.detach();
            times
        }
        "run" => {
            let mut s = Session::attach(HostPid(pid), &options)?;
            let plan = Plan {
                iterations: cycles as u32,
                hold: Duration::ZERO,
                gap: Duration::ZERO,
                grace_period: 0,
                selection: Selection::All,
            };
            let stop = AtomicBool::new(false);
            let run = preempt::run(&mut s, &plan, &stop, &[], |_| {});
            s.detach();
            if let Some(why) = run.stopped {
                bail!("stopped: {why}");
            }
            run.iterations
                .iter()
                .map(|i| [i.suspend_called_ns, i.suspended_at_ns, i.resumed_at_ns, i.resume_returned_ns])
                .collect()
        }
        _ => bail!("mode raw|tally|run"),
    };
    let _ = std::io::stdout().as_raw_fd();
    let mut out = String::with_capacity(times.len() * 64);
    for t in &times {
        out.push_str(&format!("{} {} {} {}\n", t[0], t[1], t[2], t[3]));
    }
    print!("{out}");
    Ok(())
}
