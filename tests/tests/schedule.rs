//! `gpreempt schedule` on the real amdgpu driver, with `rt-target`s (runtime-enabled KFD
//! processes; without a GPU they have no queues). 6.12.117 (KFD 1.17) has the debug trap: the
//! scheduler attaches to the offline process, keeps it attached and detaches on SIGTERM. 6.1
//! (KFD 1.11) has none: the scheduler is refused at once with the cause and the fix, before the
//! tracer starts and before any process is touched.

use std::time::Duration;

use gpreempt::kfd::{Device, KfdVersion};
use gpreempt_tests::{
    schedule::{Elapsed, LONG, Privilege, Schedule, refused, summary},
    target::{RtTarget, tracer_pid},
};
use nix::sys::signal::Signal;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn schedule_on_the_real_driver_attaches_with_the_debug_trap_and_is_refused_clearly_without_it() {
    gpreempt_tests::skip_without_kfd_open!();
    let _t =
        Elapsed::start("schedule_on_the_real_driver_attaches_with_the_debug_trap_and_is_refused_clearly_without_it");
    let online = RtTarget::start(&[]).unwrap();
    let offline = RtTarget::start(&[]).unwrap();
    let (on, off) = (online.pid().to_string(), offline.pid().to_string());
    let version = Device::open().unwrap().version().unwrap();
    if !version.has_debug_trap() {
        // 6.1 and 5.10: RUNTIME_ENABLE is past kfd_ioctl's command table (ENOTTY on 6.1.192,
        // EINVAL on 5.10.223; docs/kfd.md §2.1).
        let (old, errno) = gpreempt_tests::without_debug_trap().expect("a kernel of the matrix");
        assert_eq!(version, old);
        for t in [&online, &offline] {
            assert_eq!(t.wait_for("runtime_enable", 30 * SECOND).unwrap()["result"], -(errno as i32));
        }
        // With the tracer (the default): the kernel is checked first, so the refusal is immediate.
        let (code, e) = refused(&["--online", &on, "--offline", &off], Privilege::Root);
        assert_eq!(code, Some(1), "{e}");
        assert_eq!(
            e.trim_end().lines().last(),
            Some(format!("gpreempt: error: {}", gpreempt_tests::no_debug_trap_message(old)).as_str()),
            "{e}"
        );
        assert!(!e.contains("tracer"), "the tracer was started before the refusal: {e}");
        // Nothing attached; both still answer their signals.
        for t in [&online, &offline] {
            assert_eq!(tracer_pid(t.pid()).unwrap(), 0);
            t.signal(Signal::SIGUSR1).unwrap();
            assert_eq!(t.wait_for("usr1", 10 * SECOND).unwrap()["count"], 1);
        }
        return;
    }
    assert_eq!(version, KfdVersion { major: 1, minor: 17 });
    for t in [&online, &offline] {
        assert_eq!(t.wait_for("runtime_enable", 30 * SECOND).unwrap()["result"], 0);
    }
    // A pid that does not exist is refused before the tracer starts, and said once (the cause is
    // not repeated by the error chain).
    let (code, e) = refused(&["--online", "999999999", "--offline", &off], Privilege::Root);
    assert_eq!(code, Some(1), "{e}");
    assert_eq!(
        e.trim_end().lines().last(),
        Some(
            "gpreempt: error: --online 999999999: no process with pid 999999999 (see `gpreempt ps` for the KFD processes)"
        ),
        "{e}"
    );
    assert_eq!(e.matches("no process with pid").count(), 1, "{e}");
    assert_eq!(tracer_pid(offline.pid()).unwrap(), 0, "nothing attached");
    let mut s = Schedule::between(online.pid(), &off, &["--no-trace"]);
    let attached = s.wait_events("offline_attached", 1, LONG);
    assert_eq!((attached[0]["pid"].as_u64(), attached[0]["queues"].as_u64()), (off.parse().ok(), Some(0)));
    let added = s.wait_events("online_added", 1, LONG);
    // No queues (no GPU): nothing to learn, so no snapshot and the online process is never attached.
    assert_eq!((added[0]["queues"].as_u64(), added[0]["snapshot"].as_bool()), (Some(0), Some(false)));
    assert_eq!(tracer_pid(offline.pid()).unwrap(), s.child.id(), "the offline process stays attached");
    assert_eq!(tracer_pid(online.pid()).unwrap(), 0);
    s.signal(Signal::SIGTERM);
    let (status, lines, stderr) = s.wait();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("gpreempt: stopped by SIGTERM"), "{stderr}");
    let detached: Vec<_> = lines.iter().filter(|v| v["event"] == "offline_detached").collect();
    assert_eq!(detached.len(), 1, "{lines:?}");
    assert_eq!(
        (detached[0]["reason"].as_str(), detached[0]["detached"]["disabled"].as_bool()),
        (Some("stopped"), Some(true))
    );
    let sum = summary(&lines);
    assert_eq!(
        (sum["suspends"].as_u64(), sum["attach_refreshes"].as_u64()),
        (Some(0), Some(2)),
        "ENABLE + DISABLE: {sum}"
    );
    assert!(sum["kernel"].is_null(), "no tracer, no driver breakdown: {sum}");
    for t in [&online, &offline] {
        assert_eq!(tracer_pid(t.pid()).unwrap(), 0);
        t.signal(Signal::SIGUSR1).unwrap();
        assert_eq!(t.wait_for("usr1", 10 * SECOND).unwrap()["count"], 1);
    }
}
