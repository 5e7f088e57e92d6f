//! Workload and debugger for the KFD emulator tests (`tests/kfd-emu`), driven line by line on
//! stdin; every reply is one JSON object on stdout. Integer results (`ret`) are the ioctl's
//! return value or `-errno`.
//!
//! `emu-workload run --gpu-id 0x1000 --queues 2 [--runtime-enable] [--fill-us 1000]
//! [--full-save-area]` opens /dev/kfd, creates AQL queues with real ring / read-index /
//! write-index / CWSR-header memory (with `--full-save-area`, the whole save area libhsakmt
//! allocates, which the emulator's gfx942 profile checks: `emu_workload/save_area.rs`),
//! keeps each ring full of dispatches of `--fill-us` µs (0: leave them empty), prints
//! `{"pid", "queues": [{queue_id, gpu_id, rptr, wptr, ring, error_payload}], …}` and then answers
//! `rptr` (current read indices), `create GPU TYPE RING_SIZE PERCENT PRIORITY` (replies the new
//! queue's id and, as in `queues`, its description), `destroy ID`,
//! `update ID RING_SIZE PERCENT PRIORITY`, `runtime_enable MODE_MASK`, `stop` (the fillers stop;
//! replies the final write indices), `submit QID N COST_US` (N dispatches with completion
//! records), `packet QID TYPE SETUP WG_X GRID_X COST_NS` (one raw packet), `wptr QID VALUE` (raw
//! write index), `reserve QID` (move the write index past a slot whose packet is not written
//! yet: queued work the CP cannot start), `commit QID INDEX COST_US` (write that slot's dispatch),
//! `records QID` (the completion records written so far), `error QID` (the CWSR error payload). QID is an index into `queues`. EOF exits without destroying anything (the
//! driver tears the queues down).
//! With `--secondary-context N` it also opens /dev/kfd once more, turns that file into a secondary
//! KFD context (`AMDKFD_IOC_CREATE_PROCESS`, Linux 7.0) and creates N queues there, filled like the
//! others (the hello line's `secondary`: `{create_process, queues, errors}`); then
//! `dbg_trap FILE OP` issues DBG_TRAP op OP on this process's own pid through the primary (FILE
//! 0) or the secondary (1) file, `create_process` CREATE_PROCESS again on the secondary file,
//! and `destroy_secondary ID` DESTROY_QUEUE of the secondary context's queue ID.
//!
//! `emu-workload online …` and `emu-workload offline …`: the load generators of `load.rs`.
//! `emu-workload serve …` and `emu-workload train …`: an inference-like and a training-like
//! client (`serve.rs`, `train.rs`): Poisson arrivals, several queues (and GPUs) whose indices
//! sit in ROCr's `amd_queue_t`, varying dispatch costs, completions polled on the CPU.
//!
//! `emu-workload server …` and `emu-workload request …`: an online service that takes requests
//! on a Unix socket (`--socket PATH`, a line `N` per request) or over HTTP/1.1 (`--listen
//! ADDR:PORT`: `POST /generate` with the body `N`; `GET /health` and `GET /metrics` answered at
//! once), each a CPU phase of `--cpu-ms` then N dispatches (none with `--no-gpu`, which opens no
//! /dev/kfd), and the load command that sends them (`--socket PATH` or `--url http://HOST:PORT`,
//! with `--health-every-ms M` a health prober on a second connection) (`server.rs`, for `gpreempt
//! evaluate` and the arrival probe's tests).
//!
//! `emu-workload hold-arrival --pid P` loads the arrival probe, watches P's listening TCP ports in
//! P's cgroup (v2), prints `{"pid", "slot", "cgroups", "ports"}` and holds it until EOF on stdin:
//! the process the arrival tests kill with SIGKILL to see that nothing stays attached.
//!
//! `emu-workload debug --pid P [--no-ptrace]` opens /dev/kfd, PTRACE_SEIZEs P (from this, the
//! only thread that issues debug-trap ioctls) and answers `enable MASK`, `snapshot CLEAR_MASK
//! MAX`, `suspend CLEAR_MASK IDS`, `resume IDS` (IDS comma-separated), `query CLEAR_MASK`,
//! `info CODE CLEAR`, `send_runtime MASK`, `set_exceptions MASK`, `pipe` (bytes pending on the
//! dbg_fd pipe), `disable`, `exit` (exit without DISABLE).

#[path = "emu_workload/aql.rs"]
mod aql;
#[path = "emu_workload/load.rs"]
mod load;
#[path = "emu_workload/rocr.rs"]
mod rocr;
#[path = "emu_workload/save_area.rs"]
mod save_area;
#[path = "emu_workload/serve.rs"]
mod serve;
#[path = "emu_workload/server.rs"]
mod server;
#[path = "emu_workload/train.rs"]
mod train;

use gpreempt_tests::{parse_u32, parse_u64};
use std::{
    io::BufRead,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use aql::{DispatchPacket, QueueMem, Records};
use save_area::SaveAreas;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpreempt::kfd::{Device, uapi};
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
        /// Keep every queue's ring full of dispatches of this many µs (0: empty rings).
        #[arg(long, default_value_t = 1000)]
        fill_us: u64,
        /// Move into this cgroup (v2 directory) before opening /dev/kfd, e.g. one named as a
        /// container runtime names its containers.
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// Open /dev/kfd this many more times and keep the files open (on KFD ≥ 1.19 a process
        /// turns such a file into a secondary context with AMDKFD_IOC_CREATE_PROCESS).
        #[arg(long, default_value_t = 0)]
        extra_kfd_files: u32,
        /// Open /dev/kfd once more, make that file a secondary KFD context
        /// (AMDKFD_IOC_CREATE_PROCESS, Linux 7.0) and create this many queues on it.
        #[arg(long)]
        secondary_context: Option<u32>,
        /// Give each compute queue the full context-save area libhsakmt allocates (a GPU memory
        /// object of (cwsr_size + debug) x num_xcc bytes: the emulator's gfx942 profile checks
        /// it), through the GPU's render node (amdgpu_emu loaded); default: a header only.
        #[arg(long)]
        full_save_area: bool,
    },
    /// Periodic requests of K dispatches of D µs every P µs (+ jitter): per-request latency.
    Online {
        #[command(flatten)]
        queue: QueueArgs,
        #[arg(long, default_value_t = 1)]
        dispatches: u32,
        #[arg(long, default_value_t = 1000)]
        dispatch_us: u64,
        #[arg(long, default_value_t = 10_000)]
        period_us: u64,
        #[arg(long, default_value_t = 0)]
        jitter_us: u64,
        #[arg(long, default_value_t = 100)]
        requests: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// After the hello line, wait for one line on stdin before the first request (so a
        /// controller can attach first).
        #[arg(long)]
        wait_go: bool,
        /// Also write the whole result as one JSON document here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Keeps its queue saturated with dispatches of D µs until `stop` or EOF on stdin.
    Offline {
        #[command(flatten)]
        queue: QueueArgs,
        #[arg(long, default_value_t = 1000)]
        dispatch_us: u64,
        /// Print completions per interval while running (0: only the summary).
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
        /// Include every completion record in the summary.
        #[arg(long)]
        records: bool,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Inference-like online client: Poisson arrivals over several queues, CPU-polled completions.
    Serve {
        #[arg(long, value_parser = parse_u32, default_value = "0x1000")]
        gpu_id: u32,
        /// Queues ("streams"); requests go to them in turn.
        #[arg(long, default_value_t = 2)]
        queues: u32,
        /// Mean request arrival rate (Poisson: exponential inter-arrival times).
        #[arg(long, default_value_t = 20.0)]
        rate_hz: f64,
        /// Mean dispatches per request; each request has 1 to 2K-1 of them, uniformly.
        #[arg(long, default_value_t = 3)]
        dispatches: u32,
        /// Mean cost of a dispatch, µs; each is drawn uniformly within ±`--spread` of it.
        #[arg(long, default_value_t = 1000)]
        dispatch_us: u64,
        #[arg(long, default_value_t = 0.5)]
        spread: f64,
        #[arg(long, default_value_t = 200)]
        requests: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Create one more queue this long after the first request (a stream opened mid-run).
        #[arg(long, value_name = "MS")]
        second_queue_after_ms: Option<u64>,
        /// After the hello line, wait for one line on stdin before the first request.
        #[arg(long)]
        wait_go: bool,
        #[arg(long)]
        runtime_enable: bool,
        #[arg(long, default_value_t = 16384)]
        ring_size: u32,
        #[arg(long, value_enum, default_value = "yield")]
        poll: rocr::Poll,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Training-like offline client: steps of varying dispatches on several queues (and GPUs),
    /// CPU-polled completions; answers `stats`, ends on `stop` or EOF.
    Train {
        /// GPUs its queues go to, in turn (comma-separated).
        #[arg(long, alias = "gpu-id", value_parser = parse_u32, value_delimiter = ',', default_value = "0x1000")]
        gpu_ids: Vec<u32>,
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// Mean cost of a dispatch, µs; each is drawn uniformly within ±`--spread` of it.
        #[arg(long, default_value_t = 4000)]
        dispatch_us: u64,
        #[arg(long, default_value_t = 0.5)]
        spread: f64,
        /// Dispatches per step (published together).
        #[arg(long, default_value_t = 4)]
        step_dispatches: u32,
        /// Steps kept queued per queue (asynchronous launches ahead of the synchronization).
        #[arg(long, default_value_t = 2)]
        inflight_steps: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        runtime_enable: bool,
        #[arg(long, default_value_t = 4096)]
        ring_size: u32,
        #[arg(long, value_enum, default_value = "yield")]
        poll: rocr::Poll,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Append a progress line here whenever dispatches completed (`train: completed N
        /// dispatches, R dispatches/s`), as a training job logs its throughput.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// An online service driven from outside: a request (a line `N` on the Unix socket, or an
    /// HTTP `POST /generate` with the body `N`) is a CPU phase, then N dispatches on its queues,
    /// answered when they completed (`server.rs`).
    Server {
        #[arg(long, value_parser = parse_u32, default_value = "0x1000")]
        gpu_id: u32,
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// Serve this Unix socket: a request is a line `N`.
        #[arg(long, required_unless_present = "listen", conflicts_with = "listen")]
        socket: Option<PathBuf>,
        /// Serve HTTP/1.1 on this TCP address (`127.0.0.1:0`: a port the kernel picks, printed
        /// as the hello line's `port`).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<String>,
        /// Cost of each dispatch, µs.
        #[arg(long, default_value_t = 2000)]
        dispatch_us: u64,
        /// CPU time each request spins before its dispatches, ms (a tokenizer's), 0 for none.
        #[arg(long, default_value_t = 0.0)]
        cpu_ms: f64,
        /// Open no /dev/kfd: requests of 0 dispatches only (the CPU phase).
        #[arg(long)]
        no_gpu: bool,
        #[arg(long)]
        runtime_enable: bool,
        #[arg(long, default_value_t = 4096)]
        ring_size: u32,
    },
    /// The load command of `server`: K requests of N dispatches, then one summary line.
    Request {
        /// The server's Unix socket.
        #[arg(long, required_unless_present = "url", conflicts_with = "url")]
        socket: Option<PathBuf>,
        /// The server's HTTP address, `http://HOST:PORT[/PATH]` (`/generate` if no path): the
        /// requests go over one keep-alive connection.
        #[arg(long)]
        url: Option<String>,
        #[arg(long, default_value_t = 10)]
        requests: u32,
        #[arg(long, default_value_t = 1)]
        dispatches: u32,
        /// Pause between an answer and the next request, µs.
        #[arg(long, default_value_t = 0)]
        gap_us: u64,
        /// With `--url`: also `GET /health` this often on a second connection while the requests
        /// run (a Kubernetes probe); the summary line then ends with `health=H`.
        #[arg(long, value_name = "MS", requires = "url")]
        health_every_ms: Option<u64>,
    },
    /// Load the arrival probe and watch a process's listening ports in its cgroup until EOF.
    HoldArrival {
        #[arg(long)]
        pid: u32,
    },
    Debug {
        #[arg(long)]
        pid: i32,
        #[arg(long)]
        no_ptrace: bool,
    },
}

#[derive(clap::Args)]
struct QueueArgs {
    #[arg(long, value_parser = parse_u32, default_value = "0x1000")]
    gpu_id: u32,
    /// AMDKFD_IOC_RUNTIME_ENABLE before creating the queue (as ROCr does).
    #[arg(long)]
    runtime_enable: bool,
    #[arg(long, default_value_t = 4096)]
    ring_size: u32,
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
    load::line(&v)
}

/// `ret` of a queue or runtime ioctl that succeeded: KFD's handlers answer 0 on success (6.12
/// `kfd_ioctl_destroy_queue`, `_update_queue`, `_runtime_enable`; `kfd_emu` mirrors them), which
/// `Device`'s methods return as `()`.
fn ret_of_unit(r: Result<(), Errno>) -> i64 {
    ret_of(r.map(|()| 0))
}

/// /dev/kfd; the error keeps the context the helper always gave it.
fn open_kfd() -> Result<Device> {
    Device::open().context("opening /dev/kfd")
}

/// AMDKFD_IOC_RUNTIME_ENABLE with ROCr's r_debug stand-in 0x12345000; returns `ret`.
fn runtime_enable(device: &Device, mode_mask: u32) -> i64 {
    let mut args = uapi::RuntimeEnableArgs { r_debug: 0x1234_5000, mode_mask, capabilities_mask: 0 };
    ret_of_unit(device.runtime_enable(&mut args))
}

#[allow(clippy::too_many_arguments)]
fn create(
    device: &Device,
    save: &mut SaveAreas,
    gpu_id: u32,
    queue_type: u32,
    ring_size: u32,
    percentage: u32,
    priority: u32,
) -> Result<(i64, Option<QueueMem>)> {
    let mut mem = QueueMem::alloc(ring_size);
    let mut args = uapi::CreateQueueArgsV17 {
        base: uapi::CreateQueueArgs {
            ring_base_address: mem.ring as u64,
            write_pointer_address: mem.wptr as u64,
            read_pointer_address: mem.rptr as u64,
            ring_size,
            gpu_id,
            queue_type,
            queue_percentage: percentage,
            queue_priority: priority,
            ..Default::default()
        },
        ..Default::default()
    };
    if queue_type == uapi::queue_type::COMPUTE_AQL || queue_type == uapi::queue_type::COMPUTE {
        mem.ctx_save = save.provide(&mut args.base, mem.ctx_save)?;
    } else {
        args.base.ctx_save_restore_address = mem.ctx_save as u64;
        args.base.ctx_save_restore_size = size_of::<aql::ContextSaveAreaHeader>() as u32;
    }
    // SAFETY: every address is `mem`'s, which `QueueMem::alloc` leaked: it lives until the
    // process exits, longer than any queue. The ring covers `ring_size` bytes and at least 1 KiB,
    // 256-byte aligned (`ring_bytes`); the indices are 8-byte-aligned u64s; the CWSR header is the
    // size passed and its `err_payload_addr` a leaked u64; no EOP buffer. Everything the CP writes
    // is accessed atomically or volatilely here.
    match unsafe { device.create_queue(&mut args) } {
        Ok(()) => {
            mem.queue_id = args.base.queue_id;
            mem.gpu_id = gpu_id;
            Ok((0, Some(mem)))
        }
        Err(e) => Ok((ret_of(Err(e)), None)),
    }
}

fn describe(q: &QueueMem) -> Value {
    json!({"queue_id": q.queue_id, "gpu_id": q.gpu_id, "rptr": q.rptr as u64, "wptr": q.wptr as u64,
           "ring": q.ring as u64, "ring_packets": q.ring_packets, "error_payload": q.error_payload as u64})
}

fn words(line: &str) -> Vec<u64> {
    line.split_whitespace().skip(1).filter_map(|w| parse_u64(w).ok()).collect()
}

fn arg(words: &[u64], i: usize) -> Result<u64> {
    words.get(i).copied().with_context(|| format!("missing argument {i}"))
}

/// Keeps `q`'s ring full of dispatches of `cost_ns` until `stop` is set (no completion records:
/// the read index shows the progress).
fn fill(q: QueueMem, cost_ns: u64, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        while q.space() > 0 {
            q.publish(DispatchPacket::dispatch(cost_ns, 0));
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn queue_arg(mems: &[QueueMem], words: &[u64]) -> Result<QueueMem> {
    let i = arg(words, 0)? as usize;
    mems.get(i).copied().with_context(|| format!("no queue #{i}"))
}

/// `AMDKFD_IOC_CREATE_PROCESS`: `AMDKFD_IO(0x27)`, no argument (kfd_ioctl.h 7.0, commit
/// cc6b66d661fd), on `file`; returns `ret`.
fn create_process(file: &Device) -> i64 {
    const AMDKFD_IOC_CREATE_PROCESS: libc::c_ulong = 0x4B27; // _IO('K', 0x27)
    // SAFETY: an ioctl without argument on a file this process owns.
    let r = unsafe { libc::ioctl(file.as_fd().as_raw_fd(), AMDKFD_IOC_CREATE_PROCESS, 0) };
    if r < 0 { -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { i64::from(r) }
}

/// The secondary context of `--secondary-context`: its file and queues.
struct Secondary {
    file: Device,
    mems: Vec<QueueMem>,
}

/// Opens /dev/kfd again, makes the file a secondary context and creates `queues` queues there.
fn secondary(gpu_id: u32, queues: u32, ring_size: u32) -> Result<(Secondary, Value)> {
    let file = open_kfd()?;
    let ret = create_process(&file);
    let mut save = SaveAreas::HeaderOnly;
    let (mut mems, mut errors) = (Vec::new(), Vec::new());
    for _ in 0..queues {
        match create(&file, &mut save, gpu_id, uapi::queue_type::COMPUTE_AQL, ring_size, 100, 7)? {
            (_, Some(q)) => mems.push(q),
            (ret, None) => errors.push(ret),
        }
    }
    let hello =
        json!({"create_process": ret, "queues": mems.iter().map(describe).collect::<Vec<_>>(), "errors": errors});
    Ok((Secondary { file, mems }, hello))
}

#[allow(clippy::too_many_arguments)]
fn run(
    gpu_id: u32,
    queues: u32,
    runtime_enable: bool,
    ring_size: u32,
    fill_us: u64,
    extra_files: u32,
    full_save_area: bool,
    secondary_queues: Option<u32>,
) -> Result<()> {
    let device = open_kfd()?;
    let mut save = if full_save_area { SaveAreas::full(device.as_fd().as_raw_fd()) } else { SaveAreas::HeaderOnly };
    // Held open until the process exits.
    let _extra: Vec<Device> = (0..extra_files).map(|_| open_kfd()).collect::<Result<_>>()?;
    let version = device.version()?.to_string();
    let mut runtime = Value::Null;
    if runtime_enable {
        runtime = json!(self::runtime_enable(&device, uapi::runtime_enable::MODE_ENABLE_MASK));
    }
    let mut mems = Vec::new();
    let mut errors = Vec::new();
    for _ in 0..queues {
        match create(&device, &mut save, gpu_id, uapi::queue_type::COMPUTE_AQL, ring_size, 100, 7)? {
            (_, Some(q)) => mems.push(q),
            (ret, None) => errors.push(ret),
        }
    }
    let (secondary, secondary_hello) = match secondary_queues {
        Some(n) => {
            let (s, hello) = self::secondary(gpu_id, n, ring_size)?;
            (Some(s), hello)
        }
        None => (None, Value::Null),
    };
    let secondary_mems = secondary.as_ref().map(|s| s.mems.clone()).unwrap_or_default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut fillers = Vec::new();
    if fill_us > 0 {
        for q in mems.iter().chain(&secondary_mems) {
            let (q, stop) = (*q, stop.clone());
            fillers.push(thread::spawn(move || fill(q, fill_us * 1000, stop)));
        }
    }
    // Completion records of `submit`ted dispatches, per queue: (packet index, records, slot).
    let mut submitted: Vec<Vec<(u64, Records, usize)>> = vec![Vec::new(); mems.len()];
    reply(json!({
        "pid": std::process::id(),
        "kfd_version": version,
        "runtime_enable": runtime,
        "queues": mems.iter().map(describe).collect::<Vec<_>>(),
        "errors": errors,
        "secondary": secondary_hello,
    }))?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let w = words(&line);
        match line.split_whitespace().next().unwrap_or_default() {
            "rptr" => {
                let values: Vec<u64> = mems.iter().map(QueueMem::read_index).collect();
                let secondary: Vec<u64> = secondary_mems.iter().map(QueueMem::read_index).collect();
                reply(json!({"rptr": values, "queue_ids": mems.iter().map(|q| q.queue_id).collect::<Vec<_>>(),
                             "secondary_rptr": secondary}))?;
            }
            "create" => {
                let (ret, q) = create(
                    &device,
                    &mut save,
                    arg(&w, 0)? as u32,
                    arg(&w, 1)? as u32,
                    arg(&w, 2)? as u32,
                    arg(&w, 3)? as u32,
                    arg(&w, 4)? as u32,
                )?;
                let queue_id = q.as_ref().map(|q| q.queue_id);
                let queue = q.as_ref().map(describe);
                if let Some(q) = q {
                    mems.push(q);
                    submitted.push(Vec::new());
                }
                reply(json!({"ret": ret, "queue_id": queue_id, "queue": queue}))?;
            }
            "destroy" => {
                let id = arg(&w, 0)? as u32;
                let r = device.destroy_queue(id);
                if r.is_ok()
                    && let Some(i) = mems.iter().position(|q| q.queue_id == id)
                {
                    mems.remove(i);
                    submitted.remove(i);
                }
                reply(json!({"ret": ret_of_unit(r)}))?;
            }
            "update" => {
                let q = mems.iter().find(|q| u64::from(q.queue_id) == w.first().copied().unwrap_or(u64::MAX));
                let args = uapi::UpdateQueueArgs {
                    ring_base_address: q.map_or(0x7f00_0000_0000, |q| q.ring as u64),
                    queue_id: arg(&w, 0)? as u32,
                    ring_size: arg(&w, 1)? as u32,
                    queue_percentage: arg(&w, 2)? as u32,
                    queue_priority: arg(&w, 3)? as u32,
                };
                if q.is_some_and(|q| u64::from(args.ring_size) > q.ring_bytes) {
                    // KFD would take a ring larger than the queue's memory at the same address
                    // and the CP would write past it: refused here, as EINVAL.
                    reply(json!({"ret": -(Errno::EINVAL as i64)}))?;
                    continue;
                }
                // SAFETY: a known queue keeps its own leaked ring (see `create`), which covers
                // `ring_size` (just checked); an id that is none of this process's queues is
                // refused by KFD before the placeholder address is used (EFAULT, 6.12
                // `pqm_update_queue_properties`): every queue this process has is in `mems`.
                let r = unsafe { device.update_queue(&args) };
                reply(json!({"ret": ret_of_unit(r)}))?;
            }
            "runtime_enable" => reply(json!({"ret": self::runtime_enable(&device, arg(&w, 0)? as u32)}))?,
            "stop" => {
                stop.store(true, Ordering::Relaxed);
                for f in fillers.drain(..) {
                    let _ = f.join();
                }
                reply(json!({"wptr": mems.iter().map(QueueMem::write_index).collect::<Vec<_>>()}))?;
            }
            "submit" => {
                let qi = arg(&w, 0)? as usize;
                let q = queue_arg(&mems, &w)?;
                let (n, cost_ns) = (arg(&w, 1)? as usize, arg(&w, 2)? * 1000);
                if q.space() < n as u64 {
                    reply(json!({"ret": -28, "space": q.space()}))?;
                    continue;
                }
                let records = Records::alloc(n);
                let packets: Vec<DispatchPacket> =
                    (0..n).map(|slot| DispatchPacket::dispatch(cost_ns, records.arm(slot))).collect();
                let submit_ns = gpreempt::clock::monotonic_ns();
                let first = q.publish_batch(&packets);
                submitted[qi].extend((0..n).map(|slot| (first + slot as u64, records, slot)));
                reply(json!({"ret": 0, "first": first, "submit_ns": submit_ns}))?;
            }
            "packet" => {
                let q = queue_arg(&mems, &w)?;
                let packet = DispatchPacket {
                    header: arg(&w, 1)? as u16,
                    setup: arg(&w, 2)? as u16,
                    workgroup_size: [arg(&w, 3)? as u16, 1, 1],
                    grid_size: [arg(&w, 4)? as u32, 1, 1],
                    kernel_object: arg(&w, 5)?,
                    ..Default::default()
                };
                reply(json!({"index": q.publish(packet)}))?;
            }
            "reserve" => reply(json!({"index": queue_arg(&mems, &w)?.reserve()}))?,
            "commit" => {
                let q = queue_arg(&mems, &w)?;
                q.commit(arg(&w, 1)?, DispatchPacket::dispatch(arg(&w, 2)? * 1000, 0));
                reply(json!({"ret": 0}))?;
            }
            "wptr" => {
                queue_arg(&mems, &w)?.set_write_index(arg(&w, 1)?);
                reply(json!({"ret": 0}))?;
            }
            "records" => {
                let qi = arg(&w, 0)? as usize;
                let list = submitted.get(qi).with_context(|| format!("no queue #{qi}"))?;
                let done: Vec<_> = list.iter().filter_map(|(_, records, slot)| records.done(*slot)).collect();
                let pending = list.len() - done.len();
                reply(json!({"records": done, "pending": pending}))?;
            }
            "error" => reply(json!({"err_payload": queue_arg(&mems, &w)?.error_payload()}))?,
            "dbg_trap" => {
                let file = match (arg(&w, 0)?, &secondary) {
                    (0, _) => &device,
                    (1, Some(s)) => &s.file,
                    (f, _) => bail!("no file #{f}"),
                };
                let op = arg(&w, 1)? as u32;
                if op == uapi::dbg_trap_op::ENABLE {
                    bail!("dbg_trap: ENABLE would take fd 0 (stdin) as its event file");
                }
                let mut args = uapi::DbgTrapArgs { pid: std::process::id(), op, data: [0; 3] };
                // SAFETY: no pointer in the arguments (the data words are 0: null pointers, arrays
                // of 0 queues, buffers of size 0) and not ENABLE, the op that keeps an fd.
                let r = unsafe { file.dbg_trap(&mut args) };
                reply(json!({"ret": ret_of(r)}))?;
            }
            "create_process" => match &secondary {
                Some(s) => reply(json!({"ret": create_process(&s.file)}))?,
                None => bail!("no secondary context"),
            },
            // Queue ids are per context (Linux 7.0): through the secondary file, ID is its queue.
            // Its memory stays mapped (the fillers may still write it), as `destroy`'s does.
            "destroy_secondary" => match &secondary {
                Some(s) => reply(json!({"ret": ret_of_unit(s.file.destroy_queue(arg(&w, 0)? as u32))}))?,
                None => bail!("no secondary context"),
            },
            other => bail!("unknown command {other:?}"),
        }
    }
    Ok(())
}

/// One AQL queue for the `online` / `offline` workloads; the hello line describes it.
fn load_queue(a: &QueueArgs) -> Result<(Device, QueueMem, Value)> {
    let device = open_kfd()?;
    let runtime = if a.runtime_enable {
        json!(runtime_enable(&device, uapi::runtime_enable::MODE_ENABLE_MASK))
    } else {
        Value::Null
    };
    let q = match create(
        &device,
        &mut SaveAreas::HeaderOnly,
        a.gpu_id,
        uapi::queue_type::COMPUTE_AQL,
        a.ring_size,
        100,
        7,
    )? {
        (_, Some(q)) => q,
        (ret, None) => bail!("CREATE_QUEUE on gpu {:#x} failed: {ret}", a.gpu_id),
    };
    let hello = json!({"pid": std::process::id(), "runtime_enable": runtime, "queues": [describe(&q)],
                       "started_ns": gpreempt::clock::monotonic_ns()});
    reply(hello.clone())?;
    Ok((device, q, hello))
}

fn ids_of(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .last()
        .map(|list| list.split(',').filter_map(|id| parse_u32(id).ok()).collect())
        .unwrap_or_default()
}

/// The debugger drives `Device::dbg_trap` with the argument structs it builds, not the library's
/// typed debug-trap functions: it passes ops and masks those fix (SET_EXCEPTIONS_ENABLED, any
/// exception's info, a suspend's clear mask) and replies with the struct as the kernel left it,
/// also when the op failed.
fn debug(pid: i32, no_ptrace: bool) -> Result<()> {
    let device = open_kfd()?;
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
                // SAFETY: `rinfo_ptr` is `rinfo`, of the size passed, alive and unborrowed for the
                // call; `dbg_fd` is this debugger's own pipe, kept for exactly this.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
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
                // SAFETY: `snapshot_buf_ptr` is `entries`, at least `num_queues` (≤ `max`) entries
                // of `entry_size` bytes, alive and unborrowed for the call.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
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
                // SAFETY: `queue_array_ptr` is `ids`, with at least `num_queues` u32s, alive and
                // unborrowed for the call.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
                json!({"ret": ret, "ids": ids, "elapsed_us": started.elapsed().as_micros() as u64})
            }
            "resume" => {
                let mut ids = ids_of(&line);
                let mut args = uapi::DbgTrapArgs::resume_queues(target_pid, ids.as_mut_ptr() as u64, ids.len() as u32);
                // SAFETY: as for `suspend`.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
                json!({"ret": ret, "ids": ids, "elapsed_us": started.elapsed().as_micros() as u64})
            }
            "query" => {
                let mut args = uapi::DbgTrapArgs::query_debug_event(target_pid, arg(&w, 0)?);
                // SAFETY: QUERY_DEBUG_EVENT carries no pointer.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
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
                // SAFETY: `info_ptr` is `rinfo`, of the size passed (the kernel copies at most
                // that much of any exception's info), alive and unborrowed for the call.
                let ret = ret_of(unsafe { device.dbg_trap(&mut args) });
                json!({"ret": ret, "runtime_state": rinfo.runtime_state, "r_debug": rinfo.r_debug})
            }
            "send_runtime" => {
                let mut args = uapi::DbgTrapArgs::send_runtime_event(target_pid, arg(&w, 0)?, 0, 0);
                // SAFETY: SEND_RUNTIME_EVENT carries no pointer.
                json!({"ret": ret_of(unsafe { device.dbg_trap(&mut args) })})
            }
            "set_exceptions" => {
                let mut args = uapi::DbgTrapArgs::set_exceptions_enabled(target_pid, arg(&w, 0)?);
                // SAFETY: SET_EXCEPTIONS_ENABLED carries no pointer.
                json!({"ret": ret_of(unsafe { device.dbg_trap(&mut args) })})
            }
            "pipe" => {
                let mut buf = [0u8; 256];
                let n = nix::unistd::read(&pipe_read, &mut buf).unwrap_or(0);
                json!({"bytes": n, "text": String::from_utf8_lossy(&buf[..n])})
            }
            "disable" => {
                let mut args = uapi::DbgTrapArgs::bare(target_pid, uapi::dbg_trap_op::DISABLE);
                // SAFETY: DISABLE carries no pointer.
                json!({"ret": ret_of(unsafe { device.dbg_trap(&mut args) })})
            }
            "exit" => std::process::exit(0),
            other => bail!("unknown command {other:?}"),
        };
        reply(reply_value)?;
    }
    Ok(())
}

/// `hold-arrival`: the arrival probe on `pid`'s cgroup and listening ports, held until EOF on
/// stdin (its links close with this process, however it ends).
fn hold_arrival(pid: u32) -> Result<()> {
    use gpreempt::{
        domain::HostPid,
        host::{cgroup::cgroup_dir, sockets::tcp_listening_ports},
        schedule::arrival::{ArrivalProbe, Patterns},
    };
    let (pid, proc_root) = (HostPid(pid), std::path::Path::new("/proc"));
    let cgroup = cgroup_dir(proc_root, pid)?;
    let ports = tcp_listening_ports(proc_root, pid).with_context(|| format!("reading {pid}'s sockets"))?;
    let mut probe = ArrivalProbe::load(&Patterns::default())?;
    let slot = probe.watch(pid, &cgroup, &ports)?;
    reply(json!({"pid": std::process::id(), "mode": "hold-arrival", "slot": slot, "cgroups": probe.cgroups(),
                 "ports": ports}))?;
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest)?;
    drop(probe);
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().mode {
        Mode::Run {
            gpu_id,
            queues,
            runtime_enable,
            ring_size,
            fill_us,
            cgroup,
            extra_kfd_files,
            full_save_area,
            secondary_context,
        } => {
            if let Some(dir) = cgroup {
                let procs = dir.join("cgroup.procs");
                std::fs::write(&procs, std::process::id().to_string())
                    .with_context(|| format!("joining {}", procs.display()))?;
            }
            run(gpu_id, queues, runtime_enable, ring_size, fill_us, extra_kfd_files, full_save_area, secondary_context)
        }
        Mode::Online { queue, dispatches, dispatch_us, period_us, jitter_us, requests, seed, wait_go, out } => {
            let (_device, q, hello) = load_queue(&queue)?;
            if wait_go {
                let mut go = String::new();
                std::io::stdin().read_line(&mut go)?;
            }
            let args = load::OnlineArgs { dispatches, dispatch_us, period_us, jitter_us, requests, seed, out };
            load::online(&q, hello, &args)
        }
        Mode::Offline { queue, dispatch_us, interval_ms, records, out } => {
            let (_device, q, hello) = load_queue(&queue)?;
            load::offline(&q, hello, &load::OfflineArgs { dispatch_us, interval_ms, records, out })
        }
        Mode::Serve {
            gpu_id,
            queues,
            rate_hz,
            dispatches,
            dispatch_us,
            spread,
            requests,
            seed,
            second_queue_after_ms,
            wait_go,
            runtime_enable,
            ring_size,
            poll,
            out,
        } => serve::serve(&serve::ServeArgs {
            gpu_id,
            queues,
            rate_hz,
            dispatches,
            dispatch_us,
            spread,
            requests,
            seed,
            second_queue_after_ms,
            wait_go,
            runtime_enable,
            ring_size,
            poll,
            out,
        }),
        Mode::Train {
            gpu_ids,
            queues,
            dispatch_us,
            spread,
            step_dispatches,
            inflight_steps,
            seed,
            runtime_enable,
            ring_size,
            poll,
            out,
            log,
        } => train::train(&train::TrainArgs {
            gpu_ids,
            queues,
            dispatch_us,
            spread,
            step_dispatches,
            inflight_steps,
            seed,
            runtime_enable,
            ring_size,
            poll,
            out,
            log,
        }),
        Mode::Server { gpu_id, queues, socket, listen, dispatch_us, cpu_ms, no_gpu, runtime_enable, ring_size } => {
            server::server(&server::ServerArgs {
                gpu_id,
                queues,
                socket,
                listen,
                dispatch_us,
                cpu_ms,
                no_gpu,
                runtime_enable,
                ring_size,
            })
        }
        Mode::Request { socket, url, requests, dispatches, gap_us, health_every_ms } => {
            server::request(&server::RequestArgs { socket, url, requests, dispatches, gap_us, health_every_ms })
        }
        Mode::HoldArrival { pid } => hold_arrival(pid),
        Mode::Debug { pid, no_ptrace } => debug(pid, no_ptrace),
    }
}
