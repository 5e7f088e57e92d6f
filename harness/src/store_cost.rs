//! What the doorbell probe costs the online program per kernel launch, natively: the stand-in
//! runtime's `hsa_signal_store_screlease` called in a loop by this process, timed per call,
//! without the probe and with it in each of the states a store can meet (`harness store-cost`).
//! The scheduler's reaction thread is not running here, so no call is preempted by the wake-up a
//! hit causes: that is the trap and the BPF program alone.

use anyhow::{Context, Result, bail};
use gpreempt::{
    clock::monotonic_ns,
    domain::HostPid,
    schedule::doorbell::{Coverage, DoorbellProbe},
    stats::Summary,
};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct StoreCost {
    pub calls: usize,
    /// No probe attached.
    pub bare_us: Option<Summary>,
    /// Probe attached, a signal it does not filter on (another queue, the offline side's).
    pub unregistered_us: Option<Summary>,
    /// Probe attached, the queue registered and disarmed (every store of a busy period but its
    /// first): counted, no hit.
    pub disarmed_us: Option<Summary>,
    /// Registered and armed before each call (the first store after an idle gap): one hit each.
    pub armed_us: Option<Summary>,
    /// Attaching the probe to this process (both symbols of the one runtime it maps) and
    /// detaching it, µs each: what taking the uprobe out of a process's text while its work is
    /// held, and putting it back, would cost the calling thread.
    pub attach_us: Option<Summary>,
    pub detach_us: Option<Summary>,
}

/// Time `rounds` detaches and attaches of `pid`'s probe (it ends attached).
fn attach_detach(probe: &mut DoorbellProbe, pid: HostPid, rounds: usize) -> (Option<Summary>, Option<Summary>) {
    let (mut attach, mut detach) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let t = monotonic_ns();
        probe.uncover(pid);
        // The whole detach, not only the hand-off to the reaper thread (the reaction thread's
        // share since `schedule/reaper.rs`): the uprobe is out of the text once settled.
        probe.settle();
        detach.push((monotonic_ns() - t) as f64 / 1e3);
        let t = monotonic_ns();
        let covered = probe.cover(pid).covered();
        attach.push((monotonic_ns() - t) as f64 / 1e3);
        if !covered {
            break;
        }
    }
    (Summary::of(&attach), Summary::of(&detach))
}

fn time_calls(n: usize, mut call: impl FnMut(usize)) -> Option<Summary> {
    let mut us = Vec::with_capacity(n);
    for i in 0..n {
        let t = monotonic_ns();
        call(i);
        us.push((monotonic_ns() - t) as f64 / 1e3);
    }
    Summary::of(&us)
}

pub fn measure(n: usize) -> Result<StoreCost> {
    let lib = crate::doorbell_stub::path().context("the stand-in runtime could not be built")?;
    let (store, handle) = crate::doorbell_stub::open_store(lib)?;
    let words = Box::new([0i64; 2]);
    let (queue, other) = (&words[0] as *const i64 as u64, &words[1] as *const i64 as u64);
    // The stub stores through the handle, a live word of `words` (every call below).
    let call = |handle: u64, i: usize| {
        // SAFETY: `handle` is the address of a word of `words`, which outlives every call.
        unsafe { store(handle, i as i64) }
    };
    let bare_us = time_calls(n, |i| call(queue, i));
    let me = HostPid(std::process::id());
    let mut probe = DoorbellProbe::load()?;
    match probe.cover(me) {
        Coverage::Probe { .. } => {}
        other => bail!("the probe did not attach to this process: {other:?}"),
    }
    let (attach_us, detach_us) = attach_detach(&mut probe, me, 50);
    probe.register(me, queue)?;
    let unregistered_us = time_calls(n, |i| call(other, i));
    // The first call takes the registration's arm.
    call(queue, 0);
    let disarmed_us = time_calls(n, |i| call(queue, i));
    let mut hits = Vec::new();
    let mut armed = Vec::with_capacity(n);
    for i in 0..n {
        probe.arm(me, queue)?;
        let t = monotonic_ns();
        call(queue, i);
        armed.push((monotonic_ns() - t) as f64 / 1e3);
        if i % 64 == 63 {
            probe.drain(&mut hits);
        }
    }
    probe.drain(&mut hits);
    let counted = probe.stores(me, queue).unwrap_or(0);
    let expected = 1 + 2 * n as u64;
    if counted != expected {
        bail!("the probe counted {counted} stores on the queue, {expected} were made");
    }
    drop(probe);
    // SAFETY: nothing of the library is used after this.
    unsafe { libc::dlclose(handle) };
    Ok(StoreCost {
        calls: n,
        bare_us,
        unregistered_us,
        disarmed_us,
        armed_us: Summary::of(&armed),
        attach_us,
        detach_us,
    })
}
