use gpreempt_common::record::KfdFn;
use ratatui::{
    Terminal,
    backend::TestBackend,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
};

use super::{
    render::{self, Action, Ui},
    scheduler::{SchedulerGpu, SchedulerStatus},
    *,
};
use crate::{
    domain::EvictionTrigger,
    event::{Event, EventKind, QueueEviction, QueueRestore},
    host::procinfo::Runtime,
    model::Model,
    test_support::{call, create, create_in, ev, suspend},
};

fn evict(pid: u32, ts: u64, gpu: u32, restore: bool) -> Event {
    let kind = if restore {
        EventKind::QueueRestore(QueueRestore { target_pid: HostPid(pid), gpu_id: Some(GpuId(gpu)) })
    } else {
        EventKind::QueueEviction(QueueEviction {
            target_pid: HostPid(pid),
            gpu_id: Some(GpuId(gpu)),
            trigger: EvictionTrigger::Ttm,
        })
    };
    ev(pid, ts, kind)
}

/// pid 10: queues 0 and 1 on 0x1000, suspended by a debugger (thread 30) whose SUSPEND_QUEUES
/// took 950 ns (unmap 490, fence wait 400, remap 280); pid 20: queue 0 on 0x2000, evicted for
/// 3000 ns, restored, evicted again (open). Returns the model and the spans it closed, in a log.
fn scene() -> (Model, SpanLog) {
    let mut m = Model::new(None);
    let mut log = SpanLog::default();
    let mut events = vec![ev(10, 1, create(0, 0x1000)), ev(10, 1, create(1, 0x1000)), ev(20, 1, create(0, 0x2000))];
    events.extend([
        call(30, KfdFn::FenceWaitTimeout, Some(0x1000), 150, 550),
        call(30, KfdFn::UnmapQueuesCpsch, Some(0x1000), 110, 600),
        call(30, KfdFn::MapQueuesCpsch, Some(0x1000), 610, 890),
        call(30, KfdFn::ExecuteQueuesCpsch, Some(0x1000), 100, 900),
    ]);
    let mut s = ev(30, 1000, suspend(10, &[0, 1], false));
    s.entry_ns = 50;
    events.extend([s, evict(20, 2000, 0x2000, false), evict(20, 5000, 0x2000, true), evict(20, 6000, 0x2000, false)]);
    for e in &events {
        for span in m.apply(e).spans {
            let comm = span.target_pid.and_then(|p| m.comm_of(p)).map(str::to_owned);
            log.push(SpanRow::of(&span, comm.as_deref()));
        }
    }
    (m, log)
}

fn no_pod(_: &Container) -> Option<PodRef> {
    None
}

fn snapshot(scheduler: SchedulerStatus) -> Snapshot {
    let (m, log) = scene();
    let tracer = TracerStatus { probes_attached: 55, probes_missing: 0, events: 11, lost: 0 };
    // 0x3000 is in the topology without queues.
    Snapshot::take(1_000_000_000, &m, &log, &[GpuId(0x3000)], &mut no_pod, scheduler, tracer)
}

#[test]
fn the_snapshot_has_every_queue_in_its_state_and_the_spans_with_their_driver_times() {
    let s = snapshot(SchedulerStatus::default());
    let pids: Vec<HostPid> = s.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [HostPid(10), HostPid(20)]);
    let p10 = &s.processes[0];
    assert_eq!((p10.comm.as_deref(), p10.queue_count(), p10.suspends, p10.evictions), (Some("p10"), 2, 1, 0));
    assert_eq!(p10.gpus.len(), 1);
    assert_eq!(p10.gpus[0].gpu_id, Some(GpuId(0x1000)));
    let states: Vec<(QueueId, QueueState, bool)> =
        p10.gpus[0].queues.iter().map(|q| (q.queue_id, q.state, q.state_seen)).collect();
    assert_eq!(states, [(QueueId(0), QueueState::Suspended, true), (QueueId(1), QueueState::Suspended, true)]);
    assert_eq!(p10.gpus[0].state_label(), "suspended");
    let p20 = &s.processes[1];
    assert_eq!((p20.count(QueueState::Evicted), p20.evictions, p20.suspends), (1, 2, 0));
    // GPUs: the topology's 0x3000 with zeros; spans counted where they happened.
    let g: Vec<(GpuId, usize, usize, usize, usize, usize, SpanTotals)> =
        s.gpus.iter().map(|g| (g.gpu_id, g.processes, g.queues, g.active, g.evicted, g.suspended, g.spans)).collect();
    assert_eq!(
        g,
        [
            (GpuId(0x1000), 1, 2, 0, 0, 2, SpanTotals { evictions: 0, suspends: 1, resumes: 0 }),
            (GpuId(0x2000), 1, 1, 0, 1, 0, SpanTotals { evictions: 1, suspends: 0, resumes: 0 }),
            (GpuId(0x3000), 0, 0, 0, 0, 0, SpanTotals::default()),
        ]
    );
    // Spans, newest first: the closed eviction (3000 ns, ttm), then the suspend.
    assert_eq!(s.spans.len(), 2);
    let e = &s.spans[0];
    assert_eq!(
        (e.kind, e.pid, e.gpus.as_slice(), e.start_ns, e.duration_ns, e.trigger.as_deref()),
        (SpanKind::Eviction, Some(HostPid(20)), &[GpuId(0x2000)][..], 2000, 3000, Some("ttm"))
    );
    let su = &s.spans[1];
    assert_eq!(
        (su.kind, su.pid, su.comm.as_deref(), su.queues, su.duration_ns),
        (SpanKind::Suspend, Some(HostPid(10)), Some("p10"), 2, 950)
    );
    assert_eq!((su.unmap_ns, su.fence_wait_ns, su.remap_ns, su.collateral), (Some(490), Some(400), Some(280), 0));
    let cells = span_cells(su, 1_000_000_000);
    assert_eq!(
        cells,
        ["1.0", "suspend", "10", "p10", "0x1000", "2", "0.9", "0.5", "0.4", "0.3", "0"].map(String::from)
    );
    assert_eq!(span_cells(e, 5000)[1], "eviction/ttm");
}

#[test]
fn the_json_twin_names_pid_gpu_queues_and_states() {
    let v = serde_json::to_value(snapshot(SchedulerStatus::default())).unwrap();
    assert_eq!(v["processes"][0]["pid"], 10);
    assert_eq!(v["processes"][0]["gpus"][0]["gpu_id"], 0x1000);
    assert_eq!(v["processes"][0]["gpus"][0]["queues"][1]["queue_id"], 1);
    assert_eq!(v["processes"][0]["gpus"][0]["queues"][1]["state"], "suspended");
    assert_eq!(v["gpus"][0]["suspends"], 1);
    assert_eq!(v["spans"][1]["span"], "suspend");
    assert_eq!(v["spans"][1]["fence_wait_ns"], 400);
    assert_eq!(v["tracer"]["probes_attached"], 55);
}

fn row(pid: u32, comm: &str, container: Option<&str>, queues: u32, suspended: u32, evictions: u64) -> ProcessRow {
    let q = |i: u32| QueueStateRow {
        queue_id: QueueId(i),
        context_id: None,
        queue_type: None,
        state: if i < suspended { QueueState::Suspended } else { QueueState::Active },
        state_seen: true,
    };
    ProcessRow {
        pid: HostPid(pid),
        ns_pid: None,
        comm: Some(comm.into()),
        container: container.map(str::to_owned),
        pod: None,
        container_name: None,
        gpus: vec![ProcessGpu { gpu_id: Some(GpuId(0x1000)), queues: (0..queues).map(q).collect() }],
        evictions,
        suspends: 0,
    }
}

#[test]
fn sort_keys_and_the_filter_order_and_select_rows() {
    let rows = [
        row(30, "trainer", Some("podman:train"), 1, 1, 5),
        row(10, "vllm", Some("podman:serve"), 3, 0, 0),
        row(20, "bench", None, 2, 2, 1),
    ];
    let pids = |o: &Order| o.apply(&rows).iter().map(|p| p.pid.0).collect::<Vec<_>>();
    let mut o = Order::default();
    assert_eq!(pids(&o), [10, 20, 30]);
    o.sort = SortKey::Comm;
    assert_eq!(pids(&o), [20, 30, 10]);
    o.sort = SortKey::Container;
    assert_eq!(pids(&o), [20, 10, 30], "`-` first, then podman:serve, podman:train");
    o.sort = SortKey::Queues;
    assert_eq!(pids(&o), [10, 20, 30], "largest first");
    o.sort = SortKey::Suspended;
    assert_eq!(pids(&o), [20, 30, 10]);
    o.sort = SortKey::Evictions;
    assert_eq!(pids(&o), [30, 20, 10]);
    o.reverse = true;
    assert_eq!(pids(&o), [10, 20, 30]);
    o = Order { filter: "PODMAN".into(), ..Order::default() };
    assert_eq!(pids(&o), [10, 30], "case-insensitive, on the container");
    o.filter = "2".into();
    assert_eq!(pids(&o), [20], "on the pid");
    o.filter = "rain".into();
    assert_eq!(pids(&o), [30], "on the comm");
    assert_eq!(SortKey::Evictions.next(), SortKey::Pid);
}

#[test]
fn process_cells_say_the_state_or_the_mix() {
    let p = row(30, "trainer", Some("podman:train"), 3, 1, 5);
    assert_eq!(
        process_cells(&p),
        [["30", "podman:train", "trainer", "0x1000", "3", "0,1,2", "2 active, 1 suspended", "5", "0"]
            .map(String::from)]
    );
    let mut bare = row(40, "x\x1b[2J", None, 0, 0, 0);
    bare.gpus.clear();
    assert_eq!(process_cells(&bare), [["40", "-", "x\\e[2J", "-", "0", "-", "-", "0", "0"].map(String::from)]);
    let mut in_pod = row(50, "y", Some("containerd:abc"), 1, 0, 0);
    in_pod.pod = Some(PodRef { namespace: "ml".into(), name: "serve-0".into(), uid: "u-1".into(), container: None });
    assert_eq!(process_cells(&in_pod)[0][1], "ml/serve-0");
    // With the container's name from the pod spec: namespace/pod/container.
    in_pod.container_name = Some("server".into());
    assert_eq!(process_cells(&in_pod)[0][1], "ml/serve-0/server");
}

/// Linux 7.0: pid 10's queue 0 and its secondary KFD context 0's queue 0 are two queues; the
/// secondary's is named by its context (IDS, `context_id` in JSON), and a suspend (DBG_TRAP)
/// leaves it running.
#[test]
fn a_secondary_context_s_queue_is_named_by_its_context() {
    let mut m = Model::new(None);
    for e in [ev(10, 1, create(0, 0x1000)), ev(10, 2, create_in(0, 0, 0x1000)), ev(30, 3, suspend(10, &[0], false))] {
        m.apply(&e);
    }
    let (scheduler, tracer) = (SchedulerStatus::default(), TracerStatus::default());
    let s = Snapshot::take(1_000, &m, &SpanLog::default(), &[], &mut no_pod, scheduler, tracer);
    assert_eq!(
        process_cells(&s.processes[0]),
        [["10", "-", "p10", "0x1000", "2", "0,context_0/0", "1 active, 1 suspended", "0", "1"].map(String::from)]
    );
    let text = render::text(&s, &Order::default(), 10);
    let line = text.lines().find(|l| l.starts_with("10 ")).unwrap_or_default();
    assert_eq!(line, "10   -          p10   0x1000  2  0,context_0/0  1 active, 1 suspended  0      1", "{text}");
    let v = serde_json::to_value(&s).unwrap();
    let queues = &v["processes"][0]["gpus"][0]["queues"];
    assert_eq!((&queues[0]["queue_id"], &queues[0]["context_id"]), (&serde_json::json!(0), &serde_json::Value::Null));
    assert_eq!(
        (&queues[1]["queue_id"], &queues[1]["context_id"], &queues[1]["state"]),
        (&serde_json::json!(0), &serde_json::json!(0), &serde_json::json!("active"))
    );
}

#[test]
fn a_container_and_its_pod_come_from_the_model_entry() {
    let (m, _) = scene();
    let mut entry = m.process(HostPid(10)).unwrap().clone();
    entry.container = Some(Container {
        runtime: Runtime::Containerd,
        id: "0123456789abcdef0123".into(),
        name: None,
        pod_uid: Some("u-1".into()),
    });
    let mut asked = Vec::new();
    let row = ProcessRow::of(&entry, &mut |c: &Container| {
        asked.push(c.id.clone());
        Some(PodRef { namespace: "ml".into(), name: "serve-0".into(), uid: "u-1".into(), container: None })
    });
    assert_eq!(row.container.as_deref(), Some("containerd:0123456789ab"));
    assert_eq!(row.pod.as_ref().map(|p| (p.namespace.as_str(), p.name.as_str())), Some(("ml", "serve-0")));
    assert_eq!(row.container_name, None);
    assert_eq!(asked, ["0123456789abcdef0123"]);
    // The runtime's record names the container in the pod spec: that name, not the id.
    let row = ProcessRow::of(&entry, &mut |_: &Container| {
        Some(PodRef {
            namespace: "ml".into(),
            name: "serve-0".into(),
            uid: "u-1".into(),
            container: Some("server".into()),
        })
    });
    assert_eq!((row.container_name.as_deref(), row.place()), (Some("server"), "ml/serve-0/server".into()));
    let json = serde_json::to_value(&row).unwrap();
    assert_eq!(
        (&json["pod"], &json["container_name"], &json["container"]),
        (
            &serde_json::json!({"namespace": "ml", "name": "serve-0", "uid": "u-1"}),
            &serde_json::json!("server"),
            &serde_json::json!("containerd:0123456789ab")
        )
    );
}

#[test]
fn a_queue_found_at_start_is_marked_until_the_tracer_sees_it_change() {
    let (mut m, mut log) = scene();
    let mut m2 = Model::new(None);
    // A bootstrapped queue: state as of start.
    let mut h = crate::test_support::FakeHost::new();
    h.kfd_process(77).kfd_file(77, "queues/3/gpuid", "4096\n").kfd_file(77, "queues/3/type", "1\n");
    m2.bootstrap(&h.roots());
    let p = ProcessRow::of(m2.process(HostPid(77)).unwrap(), &mut no_pod);
    assert_eq!((p.gpus[0].queues[0].queue_id, p.gpus[0].queues[0].state_seen), (QueueId(3), false));
    let s = Snapshot::take(
        10,
        &m2,
        &SpanLog::default(),
        &[],
        &mut no_pod,
        SchedulerStatus::default(),
        TracerStatus::default(),
    );
    let text = render::text(&s, &Order::default(), 10);
    assert!(text.contains("active*"), "{text}");
    assert!(text.contains(render::STATE_NOTE), "{text}");
    // Seen by the tracer: no mark.
    m.apply(&ev(10, 7000, suspend(10, &[0, 1], true))).spans.iter().for_each(|s| log.push(SpanRow::of(s, None)));
    let s = Snapshot::take(9000, &m, &log, &[], &mut no_pod, SchedulerStatus::default(), TracerStatus::default());
    assert_eq!(s.processes[0].gpus[0].state_label(), "active");
    assert!(s.processes[0].gpus[0].queues.iter().all(|q| q.state_seen));
    assert!(!render::text(&s, &Order::default(), 10).contains(render::STATE_NOTE));
    assert_eq!(
        s.gpus[0].spans,
        SpanTotals { evictions: 0, suspends: 1, resumes: 0 },
        "a resume without nested calls has no GPU"
    );
}

fn scheduler() -> SchedulerStatus {
    SchedulerStatus {
        source: Some("http://127.0.0.1:9464/metrics".into()),
        error: None,
        gpus: vec![SchedulerGpu {
            policy: "colocate".into(),
            gpu_id: GpuId(0x1000),
            state: "held",
            suspends: 2,
            resumes: 1,
            held_s: 0.003,
            reactions: 2,
            reaction_mean_us: Some(470.0),
            reaction_p99_le_us: Some(1000.0),
            resumes_skipped: 1,
        }],
    }
}

#[test]
fn the_text_frame_has_every_table_with_exact_rows() {
    let text = render::text(&snapshot(scheduler()), &Order::default(), 10);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "gpreempt top: 2 KFD processes, 3 queues, 3 GPUs; tracer 55 probes (0 missing), 11 events, 0 lost; sort pid"
    );
    assert!(
        lines.contains(&"0x1000  -          1      2       0       0        2          0          1         0"),
        "{text}"
    );
    assert!(lines.contains(&"10   -          p10   0x1000  2  0,1  suspended  0      1"), "{text}");
    assert!(lines.contains(&"20   -          p20   0x2000  1  0    evicted    2      0"), "{text}");
    assert!(lines.contains(&"scheduler: agent at http://127.0.0.1:9464/metrics"), "{text}");
    assert!(
        lines.contains(&"colocate  0x1000  held   2         1        0.003   2          470.0     1000.0     1"),
        "{text}"
    );
    assert!(lines.contains(&"spans, latest first (2 shown):"), "{text}");
    let no_agent = render::text(
        &snapshot(SchedulerStatus {
            source: Some("x".into()),
            error: Some("no gpreempt agent answers".into()),
            gpus: vec![],
        }),
        &Order { filter: "p20".into(), ..Order::default() },
        1,
    );
    assert!(no_agent.contains("\nscheduler: no gpreempt agent answers\n"), "{no_agent}");
    assert!(no_agent.contains("spans, latest first (1 shown):"), "{no_agent}");
    assert!(!no_agent.contains("p10   0x1000"), "filtered out: {no_agent}");
    assert!(no_agent.lines().next().unwrap().ends_with("sort pid, filter \"p20\""), "{no_agent}");
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

#[test]
fn keys_sort_filter_and_quit() {
    let mut ui = Ui::default();
    assert_eq!(ui.key(key(KeyCode::Char('s'))), Action::Redraw);
    assert_eq!(ui.order.sort, SortKey::Comm);
    assert_eq!(ui.key(key(KeyCode::Char('r'))), Action::Redraw);
    assert!(ui.order.reverse);
    assert_eq!(ui.key(key(KeyCode::Char('/'))), Action::Redraw);
    for c in "vq".chars() {
        assert_eq!(ui.key(key(KeyCode::Char(c))), Action::Redraw, "`q` is text while typing a filter");
    }
    assert_eq!(ui.key(key(KeyCode::Backspace)), Action::Redraw);
    assert_eq!(ui.key(key(KeyCode::Enter)), Action::Redraw);
    assert_eq!((ui.order.filter.as_str(), ui.editing), ("v", false));
    assert_eq!(ui.key(key(KeyCode::Char('x'))), Action::None);
    assert_eq!(ui.key(key(KeyCode::Char('c'))), Action::Redraw);
    assert_eq!(ui.order.filter, "");
    ui.key(key(KeyCode::Char('/')));
    ui.key(key(KeyCode::Char('z')));
    assert_eq!(ui.key(key(KeyCode::Esc)), Action::Redraw);
    assert_eq!((ui.order.filter.as_str(), ui.editing), ("", false));
    assert_eq!(ui.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
    assert_eq!(ui.key(key(KeyCode::Char('q'))), Action::Quit);
}

#[test]
fn the_live_frame_shows_the_rows_on_screen() {
    let mut terminal = Terminal::new(TestBackend::new(140, 40)).unwrap();
    let s = snapshot(scheduler());
    let ui = Ui::default();
    terminal.draw(|f| render::draw(f, &s, &ui)).unwrap();
    let buffer = terminal.backend().buffer();
    let screen: Vec<String> = (0..40)
        .map(|y| (0..140).map(|x| buffer[(x, y)].symbol().to_owned()).collect::<String>().trim_end().to_owned())
        .collect();
    let has = |needle: &str| screen.iter().any(|l| l.contains(needle));
    assert!(screen[0].starts_with("gpreempt top: 2 KFD processes, 3 queues, 3 GPUs"), "{screen:#?}");
    assert!(has("│10  -         p10  0x1000 2 0,1 suspended 0     1"), "{screen:#?}");
    assert!(has("│20  -         p20  0x2000 1 0   evicted   2     0"), "{screen:#?}");
    assert!(has("│colocate 0x1000 held  2        1       0.003  2         470.0    1000.0    1"), "{screen:#?}");
    assert!(has("│1.0   eviction/ttm 20  p20  0x2000 0 3.0      -        -        -        0"), "{screen:#?}");
    assert!(has("│1.0   suspend      10  p10  0x1000 2 0.9      0.5      0.4      0.3      0"), "{screen:#?}");
    assert!(screen[39].starts_with(render::KEYS), "{screen:#?}");
}

/// The GPU table and its JSON twin name each GPU's partition: 0x1000 and 0x2000 are partitions 0
/// and 1 of one package at 0000:03:00.0 in CPX (a made-up two-node package), 0x3000 is not in
/// the topology.
#[test]
fn gpus_are_named_by_their_package_partition_and_mode() {
    let mut host = crate::test_support::FakeHost::new();
    let nodes = "sys/class/kfd/kfd/topology/nodes";
    for (n, gpu, minor) in [(1, 0x1000, 128), (2, 0x2000, 129)] {
        host.file(format!("{nodes}/{n}/gpu_id"), format!("{gpu}\n"))
            .file(format!("{nodes}/{n}/properties"), format!("location_id 768\ndomain 0\ndrm_render_minor {minor}\n"));
    }
    host.file("sys/class/drm/renderD128/device/current_compute_partition", "CPX\n");
    let mut s = snapshot(SchedulerStatus::default());
    s.name_partitions(&crate::host::partition::Partitions::read(&host.path().join("sys")));
    let cells: Vec<(String, String)> = s.gpus.iter().map(gpu_cells).map(|c| (c[0].clone(), c[1].clone())).collect();
    assert_eq!(
        cells,
        [("0x1000", "0000:03:00.0 CPX 0/2"), ("0x2000", "0000:03:00.0 CPX 1/2"), ("0x3000", "-")]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["gpus"][1]["partition"],
        serde_json::json!({"package": "0000:03:00.0", "index": 1, "count": 2, "mode": "cpx"})
    );
    assert_eq!(v["gpus"][2]["partition"], serde_json::Value::Null);
}
