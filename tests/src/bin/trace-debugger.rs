//! Test helper for the tracer's debug-trap tests (KFD 1.13+): forks a target that opens
//! /dev/kfd and calls `AMDKFD_IOC_RUNTIME_ENABLE` on it, then debugs it from this (single,
//! hence the same) thread: PTRACE_SEIZE, DBG_TRAP ENABLE, SUSPEND_QUEUES, RESUME_QUEUES,
//! DISABLE. Prints a JSON report (`{"debugger":…, "target":…, "ops":[{"op":"enable","ret":0},…],
//! "cycles":1, "elapsed_ns":…}`; `elapsed_ns` covers the suspend/resume loop).
//!
//! Without a GPU the target has no queues, so SUSPEND/RESUME return 0 and every id comes back
//! with bit 31 (INVALID) set (docs/toolchain.md).

use std::{
    fs::OpenOptions,
    io::{Read, Write},
    os::fd::{AsRawFd, OwnedFd},
};

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpreempt::kfd::uapi::{self, DbgTrapArgs, RuntimeEnableArgs, RuntimeInfo, dbg_trap_op, runtime_enable};
use nix::{
    fcntl::OFlag,
    sys::{
        ptrace,
        signal::{Signal, kill},
        wait::waitpid,
    },
    unistd::{ForkResult, Pid, fork, pipe2},
};

#[derive(Parser)]
#[command(about = "Debug a forked KFD process through the debug-trap ioctls (test helper)")]
struct Cli {
    /// Queue ids to suspend and resume.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    queues: Vec<u32>,
    /// Grace period for SUSPEND_QUEUES (1000-cycle units).
    #[arg(long, default_value_t = 5)]
    grace_period: u32,
    /// Exception mask cleared on suspended queues.
    #[arg(long, default_value_t = 0)]
    exception_mask: u64,
    /// Suspend and resume this many times (`cargo xtask bench`'s debug-trap load); the report
    /// keeps the first pair's results and the whole loop's `elapsed_ns`.
    #[arg(long, default_value_t = 1)]
    cycles: u32,
}

fn kfd() -> Result<std::fs::File> {
    OpenOptions::new().read(true).write(true).open("/dev/kfd").context("opening /dev/kfd")
}

/// The target: open /dev/kfd, RUNTIME_ENABLE, report the result on `ready`, wait for `done`.
fn target(mut ready: std::fs::File, mut done: std::fs::File) -> i32 {
    let Ok(device) = kfd() else { return 2 };
    let mut args = RuntimeEnableArgs { r_debug: 0, mode_mask: runtime_enable::MODE_ENABLE_MASK, capabilities_mask: 0 };
    // SAFETY: `args` is the ioctl's argument struct, alive for the call.
    let ret = match unsafe { uapi::runtime_enable(device.as_raw_fd(), &mut args) } {
        Ok(r) => r,
        Err(e) => -(e as i32),
    };
    let _ = ready.write_all(&ret.to_le_bytes());
    let mut byte = [0u8; 1];
    let _ = done.read(&mut byte);
    0
}

fn dbg_trap(device: &std::fs::File, args: &mut DbgTrapArgs) -> i64 {
    // SAFETY: `args` and every pointer inside it stay alive for the call.
    match unsafe { uapi::dbg_trap(device.as_raw_fd(), args) } {
        Ok(r) => i64::from(r),
        Err(e) => -(e as i64),
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let (ready_r, ready_w) = pipe2(OFlag::O_CLOEXEC)?;
    let (done_r, done_w) = pipe2(OFlag::O_CLOEXEC)?;
    // SAFETY: single-threaded here; the child only does async-signal-safe-enough work (open,
    // ioctl, read/write on pipes) before exiting.
    let child = match unsafe { fork() }? {
        ForkResult::Child => {
            drop(ready_r);
            drop(done_w);
            let code = target(std::fs::File::from(ready_w), std::fs::File::from(done_r));
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_w);
    drop(done_r);
    let mut ready = std::fs::File::from(ready_r);
    let mut word = [0u8; 4];
    ready.read_exact(&mut word).context("the target did not report RUNTIME_ENABLE")?;
    let runtime_enable_ret = i32::from_le_bytes(word);

    let result = debug(child, &cli);
    // Let the target go and reap it whatever happened.
    let _ = std::fs::File::from(done_w).write_all(b"x");
    let _ = ptrace::detach(child, None);
    let status = waitpid(child, None);
    let (ops, elapsed_ns) = result?;
    if status.is_err() {
        let _ = kill(child, Signal::SIGKILL);
    }
    let report = serde_json::json!({
        "debugger": std::process::id(),
        "target": child.as_raw(),
        "runtime_enable": runtime_enable_ret,
        "ops": ops,
        "cycles": cli.cycles,
        "elapsed_ns": elapsed_ns,
    });
    println!("{report}");
    Ok(())
}

fn debug(child: Pid, cli: &Cli) -> Result<(Vec<serde_json::Value>, u64)> {
    ptrace::seize(child, ptrace::Options::empty()).context("PTRACE_SEIZE")?;
    let device = kfd()?;
    let pid = child.as_raw() as u32;
    // KFD writes one byte to this fd per enabled exception; keep it non-blocking.
    let (event_r, event_w): (OwnedFd, OwnedFd) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let mut rinfo = RuntimeInfo::default();
    let mut ops = Vec::new();
    let mut record = |op: &str, args: &DbgTrapArgs, ret: i64, ids: Option<&[u32]>| {
        ops.push(serde_json::json!({"op": op, "ret": ret, "num_queues": args.num_queues(), "ids": ids}));
    };

    let mut enable = DbgTrapArgs::enable(
        pid,
        0,
        std::ptr::from_mut(&mut rinfo) as u64,
        size_of::<RuntimeInfo>() as u32,
        event_w.as_raw_fd() as u32,
    );
    let ret = dbg_trap(&device, &mut enable);
    record("enable", &enable, ret, None);
    if ret < 0 {
        bail!("DBG_TRAP ENABLE failed: {ret}");
    }

    let started = std::time::Instant::now();
    for cycle in 0..cli.cycles {
        let mut ids = cli.queues.clone();
        let mut suspend = DbgTrapArgs::suspend_queues(
            pid,
            cli.exception_mask,
            ids.as_mut_ptr() as u64,
            ids.len() as u32,
            cli.grace_period,
        );
        let ret = dbg_trap(&device, &mut suspend);
        if cycle == 0 {
            record("suspend_queues", &suspend, ret, Some(&ids));
        }

        let mut ids = cli.queues.clone();
        let mut resume = DbgTrapArgs::resume_queues(pid, ids.as_mut_ptr() as u64, ids.len() as u32);
        let ret = dbg_trap(&device, &mut resume);
        if cycle == 0 {
            record("resume_queues", &resume, ret, Some(&ids));
        }
    }
    let elapsed_ns = started.elapsed().as_nanos() as u64;

    let mut disable = DbgTrapArgs::bare(pid, dbg_trap_op::DISABLE);
    let ret = dbg_trap(&device, &mut disable);
    record("disable", &disable, ret, None);

    // The write end stayed open until DISABLE released KFD's reference to it.
    drop(event_r);
    drop(event_w);
    Ok((ops, elapsed_ns))
}
