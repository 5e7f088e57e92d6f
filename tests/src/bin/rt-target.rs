//! A stand-in for a ROCm process, for the controller's VM tests: opens /dev/kfd, calls
//! AMDKFD_IOC_RUNTIME_ENABLE as ROCr does at start-up (works without a GPU on 6.5+), counts the
//! SIGUSR1s it receives, and at the end calls RUNTIME_ENABLE with mode 0 (ROCr's shutdown), which
//! blocks while a debugger has not acknowledged EC_PROCESS_RUNTIME (docs/kfd.md §2.6).
//!
//! One JSON object per line on stdout: `{"event":"runtime_enable","result":0}`, `{"event":"usr1",
//! "count":N}`, `{"event":"runtime_disable","result":0}`, `{"event":"exit"}`. A result is 0 or the
//! negated errno.

use std::{
    sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::Parser;
use gpreempt::kfd::{Device, uapi};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

#[derive(Parser)]
#[command(about = "Runtime-enabled KFD process for the controller tests")]
struct Cli {
    /// Wait this long after opening /dev/kfd before RUNTIME_ENABLE (to be attached first).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Call RUNTIME_ENABLE only after the first SIGUSR2 (so a test can attach a debugger first).
    #[arg(long)]
    enable_on_usr2: bool,
    /// Instead of one RUNTIME_ENABLE: a second thread enables and disables the runtime in a loop
    /// (SIGUSR1 then reports `{"event":"runtime_loop","cycles":N,"failures":F,"last_error":E}`;
    /// the loop thread blocks every signal so none can wake it from KFD's wait, docs/kfd.md §2.6).
    #[arg(long)]
    runtime_loop: bool,
    /// Exit after this many seconds (SIGTERM also ends it).
    #[arg(long, default_value_t = 120)]
    seconds: u64,
}

static USR1: AtomicU32 = AtomicU32::new(0);
static TERM: AtomicBool = AtomicBool::new(false);
static USR2: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.fetch_add(1, Ordering::Relaxed);
}
extern "C" fn on_usr2(_: libc::c_int) {
    USR2.store(true, Ordering::Relaxed);
}
extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::Relaxed);
}

fn emit(value: serde_json::Value) {
    println!("{value}");
}

fn runtime(device: &Device, mode_mask: u32) -> i32 {
    let mut args = uapi::RuntimeEnableArgs { r_debug: 0, mode_mask, capabilities_mask: 0 };
    match device.runtime_enable(&mut args) {
        Ok(()) => 0,
        Err(e) => -(e as i32),
    }
}

static CYCLES: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: AtomicI32 = AtomicI32::new(0);

/// RUNTIME_ENABLE, RUNTIME_ENABLE(0), … until SIGTERM: one cycle counted per pair that returned.
fn runtime_loop() {
    let mut all = SigSet::all();
    all.remove(Signal::SIGKILL);
    let _ = all.thread_block();
    let Ok(device) = Device::open() else {
        FAILURES.fetch_add(1, Ordering::Relaxed);
        return;
    };
    while !TERM.load(Ordering::Relaxed) {
        for mode in [uapi::runtime_enable::MODE_ENABLE_MASK, 0] {
            let r = runtime(&device, mode);
            if r != 0 {
                FAILURES.fetch_add(1, Ordering::Relaxed);
                LAST_ERROR.store(r, Ordering::Relaxed);
            }
        }
        CYCLES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Until `seconds` pass or SIGTERM: `report(count)` whenever SIGUSR1s arrived since the last look.
fn on_each_usr1(seconds: u64, mut report: impl FnMut(u32)) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut seen = 0;
    while Instant::now() < end && !TERM.load(Ordering::Relaxed) {
        let n = USR1.load(Ordering::Relaxed);
        if n != seen {
            seen = n;
            report(n);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // SAFETY: the handlers only touch atomics.
    unsafe {
        sigaction(
            Signal::SIGUSR1,
            &SigAction::new(SigHandler::Handler(on_usr1), SaFlags::SA_RESTART, SigSet::empty()),
        )?;
        sigaction(
            Signal::SIGUSR2,
            &SigAction::new(SigHandler::Handler(on_usr2), SaFlags::SA_RESTART, SigSet::empty()),
        )?;
        sigaction(
            Signal::SIGTERM,
            &SigAction::new(SigHandler::Handler(on_term), SaFlags::SA_RESTART, SigSet::empty()),
        )?;
    }
    let device = Device::open()?;
    emit(serde_json::json!({"event": "open", "pid": std::process::id()}));
    if cli.runtime_loop {
        let looping = thread::spawn(runtime_loop);
        emit(serde_json::json!({"event": "runtime_loop_started"}));
        on_each_usr1(cli.seconds, |_| {
            emit(serde_json::json!({"event": "runtime_loop", "cycles": CYCLES.load(Ordering::Relaxed),
                "failures": FAILURES.load(Ordering::Relaxed), "last_error": LAST_ERROR.load(Ordering::Relaxed)}));
        });
        TERM.store(true, Ordering::Relaxed);
        let _ = looping.join();
        emit(serde_json::json!({"event": "exit"}));
        return Ok(());
    }
    thread::sleep(Duration::from_millis(cli.delay_ms));
    while cli.enable_on_usr2 && !USR2.load(Ordering::Relaxed) && !TERM.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(10));
    }
    emit(
        serde_json::json!({"event": "runtime_enable", "result": runtime(&device, uapi::runtime_enable::MODE_ENABLE_MASK)}),
    );
    on_each_usr1(cli.seconds, |n| emit(serde_json::json!({"event": "usr1", "count": n})));
    emit(serde_json::json!({"event": "runtime_disable", "result": runtime(&device, 0)}));
    emit(serde_json::json!({"event": "exit"}));
    Ok(())
}
