//! Return probes on a sleeping call are never lost silently (emulator VM pass): 16 threads of one
//! process create queues at once while every create sleeps behind the previous one (each waits
//! `preempt_delay_us` in `amdkfd_fence_wait_timeout` under the process mutex), so up to 16 calls
//! are inside `kfd_ioctl_create_queue` together, more than the kretprobe instance limit of a
//! 2-vCPU guest (max(10, 2 × CPUs) = 10). Every create then shows up as an event or as a missed
//! return probe in the summary; where the kernel cannot count misses (before 6.7), the summary
//! says unknown and `doctor` says so.

use std::{
    fs::{File, OpenOptions},
    os::fd::AsRawFd,
    sync::{Arc, Barrier},
    thread,
};

use gpreempt::{kfd::uapi, trace::missed};
use gpreempt_tests::{Tracer, binary, events_of, read_sysfs, summary, vm_kernel};
use serde_json::Value;

const THREADS: usize = 16;
const GPU: u32 = 0x1000;
const PREEMPT_DELAY: &str = "/sys/module/kfd_emu/parameters/preempt_delay_us";
/// Each create's unmap waits this long (µs) in the fence wait: with 16 creates serialised behind
/// it, the threads are all inside the ioctl for seconds, however slowly TCG wakes them.
const SLOW_PREEMPT_US: &str = "500000";

/// Restores the module parameter even when an assertion fails.
struct ParamGuard(String);

impl Drop for ParamGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(PREEMPT_DELAY, &self.0);
    }
}

/// `AMDKFD_IOC_CREATE_QUEUE` of a compute queue with real (leaked) ring and index memory: the
/// emulated CP reads them until the process exits.
fn create_queue(fd: i32) -> Result<u32, nix::errno::Errno> {
    let ring: &'static mut [u8] = Box::leak(vec![0u8; 4096].into_boxed_slice());
    let pointers: &'static mut [u64; 2] = Box::leak(Box::new([0u64, 1 << 40]));
    let mut args = uapi::CreateQueueArgsV17 {
        base: uapi::CreateQueueArgs {
            ring_base_address: ring.as_ptr() as u64,
            read_pointer_address: &pointers[0] as *const u64 as u64,
            write_pointer_address: &pointers[1] as *const u64 as u64,
            ring_size: 4096,
            gpu_id: GPU,
            queue_type: uapi::queue_type::COMPUTE_AQL,
            queue_percentage: 100,
            queue_priority: 7,
            ..Default::default()
        },
        ..Default::default()
    };
    // SAFETY: `args` is the ioctl's argument struct, alive for the call; the memory it points to
    // is leaked, so it outlives the queue.
    unsafe { uapi::create_queue(fd, &mut args) }?;
    Ok(args.base.queue_id)
}

fn doctor_check(name: &str) -> Value {
    let out = std::process::Command::new(binary("gpreempt").unwrap()).args(["doctor", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().expect("check present")
}

#[test]
fn sixteen_concurrent_sleeping_creates_are_events_or_counted_misses() {
    let limit = missed::default_maxactive(&read_sysfs("/sys/devices/system/cpu/possible").unwrap()).unwrap();
    assert!(limit < THREADS as u32, "the guest allows {limit} concurrent return probes: the test needs fewer");
    let tracer = Tracer::start(&[]).unwrap();
    let kfd: File = OpenOptions::new().read(true).write(true).open("/dev/kfd").unwrap();
    let fd = kfd.as_raw_fd();
    // One queue first: from then on the runlist is active and every create unmaps it (and waits).
    assert_eq!(create_queue(fd), Ok(0));
    let restore = ParamGuard(read_sysfs(PREEMPT_DELAY).unwrap());
    std::fs::write(PREEMPT_DELAY, SLOW_PREEMPT_US).unwrap();

    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                create_queue(fd)
            })
        })
        .collect();
    let mut ids: Vec<u32> = workers.into_iter().map(|w| w.join().unwrap().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (1..=THREADS as u32).collect::<Vec<_>>(), "every create succeeded");
    drop(restore);
    let objects = tracer.stop().unwrap();

    let calls = THREADS as u64 + 1;
    let creates = events_of(&objects, std::process::id(), "queue_create").len() as u64;
    // The first `limit` calls inside the function always get an instance.
    assert!((u64::from(limit) + 1..=calls).contains(&creates), "{creates} create events of {calls} calls");
    let losses = &summary(&objects).unwrap()["losses"];
    assert!(losses.as_object().unwrap().contains_key("return_probes_missed"), "{losses}");
    let check = doctor_check("return-probe-losses");
    match vm_kernel().as_str() {
        "6.12" | "7" => {
            let missed = losses["return_probes_missed"].as_u64().expect("6.12 counts missed return probes");
            // Conservation is the check: a count that stayed 0 while returns were lost fails it, and
            // so does one that counts what was delivered. Whether misses happen at all depends on
            // how many callers are inside at once, which a stalled vCPU can change.
            assert_eq!(creates + missed, calls, "every create is an event or a counted miss: {losses}");
            assert_eq!(check["status"], "ok", "{check}");
        }
        kernel @ ("6.1" | "5.10") => {
            // bpf_link_info.perf_event.kprobe.missed appeared in 6.7.
            assert_eq!(losses["return_probes_missed"], Value::Null, "{kernel} cannot count them: {losses}");
            assert_eq!(check["status"], "warn", "{check}");
            let prefix = format!("not counted: Linux {kernel}");
            assert!(check["detail"].as_str().unwrap().starts_with(&prefix), "{check}");
        }
        other => panic!("unknown VM kernel {other:?}"),
    }
}
