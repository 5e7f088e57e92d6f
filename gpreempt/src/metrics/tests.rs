//! The exposition text of a scripted event sequence, exactly.

use gpreempt_common::record::KfdFn;

use std::collections::BTreeSet;

use super::*;
use crate::{
    domain::{EvictionTrigger, GpuId, QueueId},
    event::{Event, EventKind, ProcessExit, QueueEviction, QueueRestore},
    model::Limits,
    pipeline::Pipeline,
    pipeline::filter::Filter,
    test_support::{call, create, ev, suspend},
};

/// Two partitions of a CPX package at 0000:03:00.0 (gpu 0xa, its first, and 0xb), and a GPU
/// whose mode amdgpu does not say (0000:04:00.0).
fn cpx_package() -> crate::host::partition::Partitions {
    let mut host = crate::test_support::FakeHost::new();
    let nodes = "sys/class/kfd/kfd/topology/nodes";
    for (n, gpu, location) in [(1, 0xa, 0x300), (2, 0xb, 0x300), (3, 0xc, 0x400)] {
        host.file(format!("{nodes}/{n}/gpu_id"), format!("{gpu}\n"))
            .file(format!("{nodes}/{n}/properties"), format!("location_id {location}\ndomain 0\n"));
    }
    host.file("sys/bus/pci/devices/0000:03:00.0/current_compute_partition", "CPX\n");
    crate::host::partition::Partitions::read(&host.path().join("sys"))
}

fn exit(pid: u32, ts: u64) -> Event {
    ev(5, ts, EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(pid)), stage: "kfd_process_wq_release" }))
}

/// pid 10 (in pod ml/trainer-0) and pid 20 share GPU 0xa; 10 is evicted (TTM) for 0.25 s and
/// suspended by a debugger (pid 30) with an HWS unmap that also preempts 20's queue; then 20
/// exits and, past the grace period, its series go.
fn scripted() -> (Metrics, Pipeline, std::rc::Rc<std::cell::RefCell<Recorder>>) {
    let metrics = Metrics::new("node-a", "0.1.0");
    let identify: Identify = Box::new(|p: &ProcessEntry| {
        (p.pid == HostPid(10)).then(|| PodRef {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            uid: "5f1c2b3a-9d8e-4f70-a1b2-c3d4e5f60718".into(),
            container: Some("trainer".into()),
        })
    });
    let recorder = std::rc::Rc::new(std::cell::RefCell::new(Recorder::new(metrics.clone(), identify)));
    let model = Model::new(None).with_limits(Limits { finished_max: 16, finished_grace_ns: Some(1_000_000_000) });
    let mut p = Pipeline::new(model, Filter::default());
    p.subscribe(Box::new(recorder.clone()));
    p.deliver(&ev(10, 1, create(0, 0xa)));
    p.deliver(&ev(10, 2, create(1, 0xa)));
    p.deliver(&ev(20, 3, create(4, 0xa)));
    let evict = QueueEviction { target_pid: HostPid(10), gpu_id: Some(GpuId(0xa)), trigger: EvictionTrigger::Ttm };
    p.deliver(&ev(7, 1_000_000_000, EventKind::QueueEviction(evict)));
    recorder.borrow_mut().refresh(p.model());
    (metrics, p, recorder)
}

/// The script after the eviction: its restore, a debugger's suspend (with an HWS unmap that also
/// preempts pid 20's queue) and resume of pid 10, a destroyed queue, pid 20's exit, and one of
/// each tracer and scheduler series.
fn rest_of_the_script(metrics: &Metrics, p: &mut Pipeline, recorder: &std::rc::Rc<std::cell::RefCell<Recorder>>) {
    let restore = QueueRestore { target_pid: HostPid(10), gpu_id: Some(GpuId(0xa)) };
    p.deliver(&ev(7, 1_250_000_000, EventKind::QueueRestore(restore)));
    // The debugger's thread: HWS unmap 200 µs with a 100 µs fence wait inside, then the 400 µs
    // suspend that claims them; a resume of 50 µs without nested calls.
    p.deliver(&call(30, KfdFn::UnmapQueuesCpsch, Some(0xa), 2_000_100_000, 2_000_300_000));
    p.deliver(&call(30, KfdFn::FenceWaitTimeout, Some(0xa), 2_000_150_000, 2_000_250_000));
    let mut s = ev(30, 2_000_400_000, suspend(10, &[0, 1], false));
    s.entry_ns = 2_000_000_000;
    p.deliver(&s);
    let mut r = ev(30, 3_000_050_000, suspend(10, &[0, 1], true));
    r.entry_ns = 3_000_000_000;
    p.deliver(&r);
    p.deliver(&ev(
        10,
        3_100_000_000,
        EventKind::QueueDestroy(crate::event::QueueDestroy {
            queue_id: QueueId(1),
            context_id: None,
            result: crate::event::KernelResult(0),
            ret: 0,
        }),
    ));
    p.deliver(&exit(20, 4_000_000_000));
    recorder.borrow_mut().refresh(p.model());
    metrics.add_events(9);
    metrics.set_probes(21, 2);
    metrics.set_partitions(&cpx_package());
    metrics.set_losses(&Losses { ringbuf_full: 3, return_probes_missed: Some(1), ..Default::default() });
    metrics.config_reload(false);
    let gpu = crate::domain::GpuId(0x1000);
    metrics.scheduler_transition("colocate", gpu, TransitionKind::Suspend);
    metrics.scheduler_suspended("colocate", gpu, 0.5);
    metrics.scheduler_reaction("colocate", gpu, 0.002);
    metrics.scheduler_detection("colocate", gpu, 0.0003);
    metrics.scheduler_resume_skipped("colocate", gpu);
    metrics.scheduler_loop_step("colocate", 0.0002, 0.0004, 0.0021);
}

#[test]
fn exposition_of_a_scripted_sequence_is_exact() {
    let (metrics, mut p, recorder) = scripted();
    let during = metrics.encode();
    assert!(during.contains(
        "gpreempt_queues{hostname=\"node-a\",kfd_process_id=\"10\",pod=\"trainer-0\",namespace=\"ml\",container=\"trainer\",gpu_id=\"10\",queue_type=\"compute-aql\",state=\"evicted\"} 2\n"
    ), "{during}");
    rest_of_the_script(&metrics, &mut p, &recorder);
    expect(&metrics, "exposition-before-expiry.txt", include_str!("exposition-before-expiry.txt"));
    assert_eq!((recorder.borrow().tracked(), recorder.borrow().process_series()), (2, 15));
    // Exited at 4 s with a 1 s grace period: pid 20's series are gone at 5 s, pid 10's stay.
    p.expire(5_000_000_001);
    assert_eq!((recorder.borrow().tracked(), recorder.borrow().process_series()), (1, 10));
    expect(&metrics, "exposition-after-expiry.txt", include_str!("exposition-after-expiry.txt"));
}

/// Every family the agent exposes is one of deploy::series, with its name, kind and unit there,
/// and every family there is exposed: the whole script and a resume whose driver calls remapped
/// (so that each family has a sample).
#[test]
fn every_family_is_exposed_as_deploy_series_names_it() {
    let (metrics, mut p, recorder) = scripted();
    rest_of_the_script(&metrics, &mut p, &recorder);
    let resume = Span {
        kind: SpanKind::Resume,
        target_pid: Some(HostPid(10)),
        gpu_id: Some(GpuId(0xa)),
        start_ns: 3_200_000_000,
        end_ns: 3_200_050_000,
        duration_ns: 50_000,
        trigger: None,
        queues: vec![QueueId(0)],
        rejected: Vec::new(),
        collateral: Vec::new(),
        breakdown: Some(crate::model::spans::Breakdown {
            unmap_ns: 10_000,
            fence_wait_ns: 5_000,
            remap_ns: 20_000,
            gpus: vec![GpuId(0xa)],
        }),
        phases: Vec::new(),
        open: false,
    };
    recorder.borrow_mut().span(&resume, p.model());
    let text = metrics.encode();
    let meta = |tag: &str| -> BTreeSet<String> {
        text.lines().filter_map(|l| l.strip_prefix(tag)).map(str::to_owned).collect()
    };
    let families = series::FAMILIES;
    let typed: BTreeSet<String> = families.iter().map(|f| format!("{} {}", f.exposed(), f.kind.name())).collect();
    assert_eq!(meta("# TYPE "), typed);
    let units: BTreeSet<String> =
        families.iter().filter(|f| f.seconds).map(|f| format!("{} seconds", f.exposed())).collect();
    assert_eq!(meta("# UNIT "), units);
    let samples: BTreeSet<String> = families.iter().flat_map(series::Family::samples).collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(samples.contains(name), "{name} is no sample of a deploy::series family");
    }
}

/// The exposition with each family's samples in sorted order: the encoder walks label sets in
/// hash order, which a scrape does not care about and a comparison must not depend on.
fn sorted(text: &str) -> String {
    let mut out = String::new();
    let mut samples: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort_unstable();
            for s in samples.drain(..) {
                out.push_str(s);
                out.push('\n');
            }
            out.push_str(line);
            out.push('\n');
        } else {
            samples.push(line);
        }
    }
    out
}

/// Compare with the expected file; `GPREEMPT_BLESS=1` rewrites it instead (then review the diff).
fn expect(metrics: &Metrics, file: &str, expected: &str) {
    let text = sorted(&metrics.encode());
    if std::env::var_os("GPREEMPT_BLESS").is_some() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics").join(file);
        std::fs::write(path, &text).unwrap();
        return;
    }
    assert_eq!(text, expected, "{file}");
}

/// 10,000 short-lived processes (open, two queues, one destroyed, exit) through the pipeline:
/// once their grace period has passed the exposition is the baseline again, byte for byte, and
/// nothing is kept for them.
#[test]
fn ten_thousand_short_lived_processes_leave_no_series_behind() {
    let metrics = Metrics::new("node-a", "0.1.0");
    let recorder = std::rc::Rc::new(std::cell::RefCell::new(Recorder::new(metrics.clone(), Box::new(|_| None))));
    let grace = 1_000_000_000;
    let model = Model::new(None).with_limits(Limits { finished_max: 4096, finished_grace_ns: Some(grace) });
    let mut p = Pipeline::new(model, Filter::default());
    p.subscribe(Box::new(recorder.clone()));
    recorder.borrow_mut().refresh(p.model());
    let baseline = metrics.encode();
    let mut peak = 0;
    for i in 0..10_000u32 {
        let (pid, ts) = (1000 + i, u64::from(i) * 1_000_000);
        p.deliver(&ev(pid, ts, create(0, 0xa)));
        p.deliver(&ev(pid, ts + 1, create(1, 0xa)));
        let destroy = crate::event::QueueDestroy {
            queue_id: QueueId(0),
            context_id: None,
            result: crate::event::KernelResult(0),
            ret: 0,
        };
        p.deliver(&ev(pid, ts + 2, EventKind::QueueDestroy(destroy)));
        p.deliver(&exit(pid, ts + 3));
        if i % 100 == 0 {
            recorder.borrow_mut().refresh(p.model());
            p.expire(ts + 4);
        }
        peak = peak.max(recorder.borrow().tracked());
    }
    // One process per ms with a 1 s grace period: each exit expires those past it.
    assert_eq!(peak, 1001, "the ones exited within the last second, and the current one");
    p.expire(10_000 * 1_000_000 + grace + 4);
    recorder.borrow_mut().refresh(p.model());
    assert_eq!((recorder.borrow().tracked(), recorder.borrow().process_series()), (0, 0));
    assert_eq!((p.model().registry().processes.len(), p.model().registry().finished.len()), (0, 0));
    assert_eq!(metrics.encode(), baseline);
}

/// A process in a Podman container (no pod) carries the container's name, as containers/storage
/// records it; one outside any container carries only its pid.
#[test]
fn a_named_container_outside_kubernetes_labels_its_processes() {
    const ID: &str = "1d1580dd9c68206259d9bc0de4d033e858cc154bb7ffd6a10ccd797c05a81457";
    let mut host = crate::test_support::FakeHost::new();
    host.process(
        10,
        "emu-workload",
        "Name:\temu-workload\nNSpid:\t10\t1\n",
        &format!("0::/libpod_parent/libpod-{ID}\n"),
    )
    .process(20, "python3", "Name:\tpython3\nNSpid:\t20\n", "0::/user.slice/session-1.scope\n")
    .file(
        "containers/storage/overlay-containers/containers.json",
        format!(r#"[{{"id":"{ID}","names":["trainer"],"flags":{{"Volatile":true}}}}]"#),
    );
    let metrics = Metrics::new("node-a", "0.1.0");
    let recorder = std::rc::Rc::new(std::cell::RefCell::new(Recorder::new(metrics.clone(), Box::new(|_| None))));
    let mut p = Pipeline::new(Model::new(Some(host.roots())), Filter::default());
    p.subscribe(Box::new(recorder.clone()));
    p.deliver(&ev(10, 1, create(0, 0xa)));
    p.deliver(&ev(20, 2, create(1, 0xa)));
    recorder.borrow_mut().refresh(p.model());
    let text = metrics.encode();
    for line in [
        "gpreempt_queues{hostname=\"node-a\",kfd_process_id=\"10\",container=\"trainer\",gpu_id=\"10\",queue_type=\"compute-aql\",state=\"active\"} 1\n",
        "gpreempt_queues{hostname=\"node-a\",kfd_process_id=\"20\",gpu_id=\"10\",queue_type=\"compute-aql\",state=\"active\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}
