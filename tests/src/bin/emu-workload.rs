//! Workload and debugger for the KFD emulator tests (`tests/kfd-emu`), driven line by line on
//! stdin; every reply is one JSON object on stdout. Integer results (`ret`) are the ioctl's
//! return value or `-errno`.
//!
//! `emu-workload run --gpu-id 0x1000 --queues 2 [--runtime-enable]` opens /dev/kfd, creates queues
//! with real ring / read-index / write-index memory (the write index starts far ahead, so the
//! emulated GPU always has work), prints `{"pid", "queues": [{queue_id, gpu_id, rptr, wptr}], …}`
//! and then answers `rptr` (current read indices), `create GPU TYPE RING_SIZE PERCENT PRIORITY`,
//! `destroy ID`, `update ID RING_SIZE PERCENT PRIORITY`, `wptr VALUE`, `runtime_enable MODE_MASK`. EOF exits without
//! destroying anything (the driver tears the queues down).
//!
//! `emu-workload debug --pid P [--no-ptrace]` opens /dev/kfd, PTRACE_SEIZEs P (from this, the
//! only thread that issues debug-trap ioctls) and answers `enable MASK`, `snapshot CLEAR_MASK
//! MAX`, `suspend CLEAR_MASK IDS`, `resume IDS` (IDS comma-separated), `query CLEAR_MASK`,
//! `info CODE CLEAR`, `send_runtime MASK`, `set_exceptions MASK`, `pipe` (bytes pending on the
//! dbg_fd pipe), `disable`, `exit` (exit without DISABLE).

use gpreempt_tests::{parse_u32, parse_u64};
use std::{
    fs::File,
    io::{BufRead, Write},
    os::fd::{AsRawFd, OwnedFd},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpreempt::kfd::uapi;
use nix::{errno::Errno, fcntl::OFlag};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "KFD emulator workload / debugger (test helper)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    Run {
        #[arg(long, value_parser = parse_u32, default_value = "0x1000")]
        gpu_id: u32,
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// AMDKFD_IOC_RUNTIME_ENABLE before creating queues (as ROCr does).
        #[arg(long)]
        runtime_enable: bool,
        #[arg(long, default_value_t = 4096)]
        ring_size: u32,
    },
    Debug {
        #[arg(long)]
        pid: i32,
        #[arg(long)]
        no_ptrace: bool,
    },
}

/// `ret` of an ioctl: its value, or `-errno`. Read errno right after the call: nix maps errnos
/// libc does not name (the kernel-internal ENOTSUPP, 524) to `UnknownErrno`.
fn ret_of(r: Result<i32, Errno>) -> i64 {
    match r {
        Ok(n) => i64::from(n),
        Err(Errno::UnknownErrno) => -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
        Err(e) => -i64::from(e as i32),
    }
}

fn reply(v: Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}")?;
    out.flush()?;
    Ok(())
}

/// Memory one emulated queue reads and writes. Leaked: it must outlive the queue, which the
/// driver may tear down only at process exit.
struct QueueMem {
    queue_id: u32,
    gpu_id: u32,
    rptr: *mut u64,
    wptr: *mut u64,
}

const WPTR_START: u64 = 1 << 40;

/// /dev/kfd, opened here (not through `gpreempt::kfd::Device`) because the debug-trap and
/// runtime-enable ioctls need the raw fd.
struct Kfd(File);

impl Kfd {
    fn open() -> Result<Self> {
        Ok(Self(std::fs::OpenOptions::new().read(true).write(true).open("/dev/kfd").context("opening /dev/kfd")?))
    }

    fn fd(&self) -> i32 {
        self.0.as_raw_fd()
    }

    fn version(&self) -> Result<String> {
        let mut args = uapi::GetVersionArgs::default();
        // SAFETY: `args` is the ioctl's argument struct, alive for the call.
        unsafe { uapi::get_version(self.fd(), &mut args) }?;
        Ok(format!("{}.{}", args.major_version, args.minor_version))
    }

    fn create_queue(&self, args: &mut uapi::CreateQueueArgsV17) -> Result<i32, Errno> {
        // SAFETY: as above.
        unsafe { uapi::create_queue(self.fd(), args) }
    }

    fn destroy_queue(&self, queue_id: u32) -> Result<i32, Errno> {
        let mut args = uapi::DestroyQueueArgs { queue_id, pad: 0 };
        // SAFETY: as above.
        unsafe { uapi::destroy_queue(self.fd(), &mut args) }
    }

    /// AMDKFD_IOC_RUNTIME_ENABLE with ROCr's r_debug stand-in 0x12345000; returns `ret`.
    fn runtime_enable(&self, mode_mask: u32) -> i64 {
        let mut args = uapi::RuntimeEnableArgs { r_debug: 0x1234_5000, mode_mask, capabilities_mask: 0 };
        // SAFETY: `args` is the ioctl's argument struct, alive for the call.
        ret_of(unsafe { uapi::runtime_enable(self.fd(), &mut args) })
    }

    fn update_queue(&self, args: &uapi::UpdateQueueArgs) -> Result<i32, Errno> {
        // SAFETY: as above.
        unsafe { uapi::update_queue(self.fd(), args) }
    }
}

fn create(
    device: &Kfd,
    gpu_id: u32,
    queue_type: u32,
    ring_size: u32,
    percentage: u32,
    priority: u32,
) -> (i64, Option<QueueMem>) {
    let ring: &'static mut [u8] = Box::leak(vec![0u8; ring_size.max(64) as usize].into_boxed_slice());
    let pointers: &'static mut [u64; 2] = Box::leak(Box::new([0u64, WPTR_START]));
    let rptr = &mut pointers[0] as *mut u64;
    // SAFETY: both point into the leaked array.
    let wptr = unsafe { rptr.add(1) };
    let mut args = uapi::CreateQueueArgsV17 {
        base: uapi::CreateQueueArgs {
            ring_base_address: ring.as_ptr() as u64,
            write_pointer_address: wptr as u64,
            read_pointer_address: rptr as u64,
            ring_size,
            gpu_id,
            queue_type,
            queue_percentage: percentage,
            queue_priority: priority,
            ..Default::default()
        },
        ..Default::default()
    };
    match device.create_queue(&mut args) {
        Ok(_) => (0, Some(QueueMem { queue_id: args.base.queue_id, gpu_id, rptr, wptr })),
        Err(e) => (ret_of(Err(e)), None),
    }
}

fn describe(q: &QueueMem) -> Value {
    json!({"queue_id": q.queue_id, "gpu_id": q.gpu_id, "rptr": q.rptr as u64, "wptr": q.wptr as u64})
}

fn words(line: &str) -> Vec<u64> {
    line.split_whitespace().skip(1).filter_map(|w| parse_u64(w).ok()).collect()
}

fn arg(words: &[u64], i: usize) -> Result<u64> {
    words.get(i).copied().with_context(|| format!("missing argument {i}"))
}

fn run(gpu_id: u32, queues: u32, runtime_enable: bool, ring_size: u32) -> Result<()> {
    let device = Kfd::open()?;
    let version = device.version()?;
    let mut runtime = Value::Null;
    if runtime_enable {
        runtime = json!(device.runtime_enable(uapi::runtime_enable::MODE_ENABLE_MASK));
    }
    let mut mems = Vec::new();
    let mut errors = Vec::new();
    for _ in 0..queues {
        match create(&device, gpu_id, uapi::queue_type::COMPUTE_AQL, ring_size, 100, 7) {
            (_, Some(q)) => mems.push(q),
            (ret, None) => errors.push(ret),
        }
    }
    reply(json!({
        "pid": std::process::id(),
        "kfd_version": version,
        "runtime_enable": runtime,
        "queues": mems.iter().map(describe).collect::<Vec<_>>(),
        "errors": errors,
    }))?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let w = words(&line);
        match line.split_whitespace().next().unwrap_or_default() {
            "rptr" => {
                // SAFETY: the pointers are into leaked memory the emulator writes with put_user.
                let values: Vec<u64> = mems.iter().map(|q| unsafe { q.rptr.read_volatile() }).collect();
                reply(json!({"rptr": values, "queue_ids": mems.iter().map(|q| q.queue_id).collect::<Vec<_>>()}))?;
            }
            "create" => {
                let (ret, q) = create(
                    &device,
                    arg(&w, 0)? as u32,
                    arg(&w, 1)? as u32,
                    arg(&w, 2)? as u32,
                    arg(&w, 3)? as u32,
                    arg(&w, 4)? as u32,
                );
                let queue_id = q.as_ref().map(|q| q.queue_id);
                mems.extend(q);
                reply(json!({"ret": ret, "queue_id": queue_id}))?;
            }
            "destroy" => {
                let id = arg(&w, 0)? as u32;
                let r = device.destroy_queue(id);
                if r.is_ok() {
                    mems.retain(|q| q.queue_id != id);
                }
                reply(json!({"ret": ret_of(r)}))?;
            }
            "update" => {
                let q = mems.iter().find(|q| u64::from(q.queue_id) == w.first().copied().unwrap_or(u64::MAX));
                let args = uapi::UpdateQueueArgs {
                    ring_base_address: q.map_or(0x7f00_0000_0000, |q| q.rptr as u64),
                    queue_id: arg(&w, 0)? as u32,
                    ring_size: arg(&w, 1)? as u32,
                    queue_percentage: arg(&w, 2)? as u32,
                    queue_priority: arg(&w, 3)? as u32,
                };
                reply(json!({"ret": ret_of(device.update_queue(&args))}))?;
            }
            "runtime_enable" => reply(json!({"ret": device.runtime_enable(arg(&w, 0)? as u32)}))?,
            "wptr" => {
                let value = arg(&w, 0)?;
                for q in &mems {
                    // SAFETY: as for `rptr`.
                    unsafe { q.wptr.write_volatile(value) };
                }
                reply(json!({"ret": 0}))?;
            }
            other => bail!("unknown command {other:?}"),
        }
    }
    Ok(())
}

fn dbg_trap(device: &Kfd, args: &mut uapi::DbgTrapArgs) -> i64 {
    // SAFETY: `args` is the ioctl's argument struct; pointers inside it point to live buffers.
    ret_of(unsafe { uapi::dbg_trap(device.fd(), args) })
}

fn ids_of(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .last()
        .map(|list| list.split(',').filter_map(|id| parse_u32(id).ok()).collect())
        .unwrap_or_default()
}

fn debug(pid: i32, no_ptrace: bool) -> Result<()> {
    let device = Kfd::open()?;
    let target = nix::unistd::Pid::from_raw(pid);
    let ptrace = if no_ptrace {
        Value::Null
    } else {
        json!(ret_of(nix::sys::ptrace::seize(target, nix::sys::ptrace::Options::empty()).map(|()| 0)))
    };
    let (pipe_read, pipe_write): (OwnedFd, OwnedFd) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    reply(json!({"pid": std::process::id(), "ptrace": ptrace}))?;
    let target_pid = pid as u32;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let w = words(&line);
        let started = Instant::now();
        let reply_value = match line.split_whitespace().next().unwrap_or_default() {
            "enable" => {
                let mut rinfo = uapi::RuntimeInfo::default();
                let mut args = uapi::DbgTrapArgs::enable(
                    target_pid,
                    arg(&w, 0)?,
                    &mut rinfo as *mut _ as u64,
                    size_of::<uapi::RuntimeInfo>() as u32,
                    pipe_write.as_raw_fd() as u32,
                );
                let ret = dbg_trap(&device, &mut args);
                json!({"ret": ret, "rinfo_size": args.rinfo_size(), "runtime_state": rinfo.runtime_state,
                       "r_debug": rinfo.r_debug})
            }
            "snapshot" => {
                let max = arg(&w, 1)? as usize;
                let mut entries = vec![uapi::QueueSnapshotEntry::default(); max.max(1)];
                let mut args = uapi::DbgTrapArgs::queue_snapshot(
                    target_pid,
                    arg(&w, 0)?,
                    entries.as_mut_ptr() as u64,
                    max as u32,
                    size_of::<uapi::QueueSnapshotEntry>() as u32,
                );
                let ret = dbg_trap(&device, &mut args);
                let n = (args.num_queues() as usize).min(max);
                let list: Vec<Value> = entries[..n]
                    .iter()
                    .map(|e| {
                        json!({"queue_id": e.queue_id, "gpu_id": e.gpu_id, "exception_status": e.exception_status,
                               "queue_type": e.queue_type, "ring_size": e.ring_size,
                               "read_pointer_address": e.read_pointer_address,
                               "write_pointer_address": e.write_pointer_address})
                    })
                    .collect();
                json!({"ret": ret, "num_queues": args.num_queues(), "entry_size": args.entry_size(), "entries": list})
            }
            "suspend" => {
                let mut ids = ids_of(&line);
                let mut args = uapi::DbgTrapArgs::suspend_queues(
                    target_pid,
                    arg(&w, 0)?,
                    ids.as_mut_ptr() as u64,
                    ids.len() as u32,
                    0,
                );
                let ret = dbg_trap(&device, &mut args);
                json!({"ret": ret, "ids": ids, "elapsed_us": started.elapsed().as_micros() as u64})
            }
            "resume" => {
                let mut ids = ids_of(&line);
                let mut args = uapi::DbgTrapArgs::resume_queues(target_pid, ids.as_mut_ptr() as u64, ids.len() as u32);
                let ret = dbg_trap(&device, &mut args);
                json!({"ret": ret, "ids": ids, "elapsed_us": started.elapsed().as_micros() as u64})
            }
            "query" => {
                let mut args = uapi::DbgTrapArgs::query_debug_event(target_pid, arg(&w, 0)?);
                let ret = dbg_trap(&device, &mut args);
                json!({"ret": ret, "exception_mask": args.exception_mask(), "gpu_id": args.event_gpu_id(),
                       "queue_id": args.event_queue_id()})
            }
            "info" => {
                let mut rinfo = uapi::RuntimeInfo::default();
                let mut args = uapi::DbgTrapArgs::query_exception_info(
                    target_pid,
                    &mut rinfo as *mut _ as u64,
                    size_of::<uapi::RuntimeInfo>() as u32,
                    0,
                    arg(&w, 0)? as u32,
                    arg(&w, 1)? != 0,
                );
                let ret = dbg_trap(&device, &mut args);
                json!({"ret": ret, "runtime_state": rinfo.runtime_state, "r_debug": rinfo.r_debug})
            }
            "send_runtime" => {
                let mut args = uapi::DbgTrapArgs::send_runtime_event(target_pid, arg(&w, 0)?, 0, 0);
                json!({"ret": dbg_trap(&device, &mut args)})
            }
            "set_exceptions" => {
                let mut args = uapi::DbgTrapArgs::set_exceptions_enabled(target_pid, arg(&w, 0)?);
                json!({"ret": dbg_trap(&device, &mut args)})
            }
            "pipe" => {
                let mut buf = [0u8; 256];
                let n = nix::unistd::read(&pipe_read, &mut buf).unwrap_or(0);
                json!({"bytes": n, "text": String::from_utf8_lossy(&buf[..n])})
            }
            "disable" => {
                let mut args = uapi::DbgTrapArgs::bare(target_pid, uapi::dbg_trap_op::DISABLE);
                json!({"ret": dbg_trap(&device, &mut args)})
            }
            "exit" => std::process::exit(0),
            other => bail!("unknown command {other:?}"),
        };
        reply(reply_value)?;
    }
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().mode {
        Mode::Run { gpu_id, queues, runtime_enable, ring_size } => run(gpu_id, queues, runtime_enable, ring_size),
        Mode::Debug { pid, no_ptrace } => debug(pid, no_ptrace),
    }
}
