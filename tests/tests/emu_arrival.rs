//! The arrival path of `gpreempt schedule` end to end on the KFD emulator (one shared GPU, gpu
//! 0x1000): an HTTP service of the project's own (`emu-workload server --listen`, in a cgroup v2
//! directory of its own) whose requests spend a CPU phase before their dispatches, as an LLM
//! server tokenizes before its first kernel, with health probes and scrapes beside them; and a
//! offline job that keeps the GPU busy.
//!
//! Exact counts from the scheduler's summary: every request seen once and armed once, every
//! probe and scrape denied, one pending hold per request (none a probe's), each ended once, none
//! left open, and a phase of probes alone that makes no suspend. Then the
//! service's P50 in the same boot alone, co-located, under `schedule --no-arrival` and under
//! `schedule`: the CPU phase (25 ms) is longer than a SUSPEND in this guest (BENCHMARKS.md §7:
//! ioctl p50 1.6-4.9 ms, transition p99 13-24 ms under TCG), so with the arrival path the SUSPEND
//! is done before the first kernel, and without it the request waits for the SUSPEND at its
//! first dispatch. The orders are judged on medians over every request of a state, with the
//! differences the emulator makes large (10 ms offline dispatches that a co-located request
//! waits behind), never on one sample.
//!
//! The same path with a service the scheduler was never tuned on (`tests/services/hip_http.py`):
//! Python's threaded HTTP server, HIP 5.2's own fill kernels through ctypes (ROCr on the emulated
//! GPU's render node), requests and probes sent by curl, each on a connection of its own.

use std::{thread, time::Duration};

use gpreempt_tests::{
    LineHelper,
    http_service::{Cgroup, HttpService, LoadResult, Prober, cgroup_of, load},
    render_nodes::RenderNodes,
    schedule::{Elapsed, LONG, Schedule, summary},
    target::tracer_pid,
};
use serde_json::{Value, json};

/// Requests per state, and dispatches (3 ms each) per request.
const REQUESTS: u32 = 40;
const DISPATCHES: u32 = 2;
/// The service's CPU phase per request, ms: longer than a SUSPEND in the guest, and short enough
/// that a request's first kernel comes well within the bound of a pending hold before any lead is
/// learnt (50 ms, `lead::COLD_BOUND_NS`) even when a vCPU waits for the host.
const CPU_MS: f64 = 25.0;
/// Between an answer and the next request: the offline side is resumed (idle threshold, then a
/// RESUME) and the process armed again long before the next request, so each request is one
/// arming. 150 ms is several times the slowest transitions in the guest (§7: p99 24 ms).
const GAP_US: u64 = 150_000;
/// A health probe beside the requests this often (a Kubernetes liveness probe at 10 Hz).
const HEALTH_EVERY_MS: u64 = 100;
/// The probes-only phase: health probes, every fifth a metrics scrape, 50 ms apart (20/s, the
/// issue's stress rate).
const PROBES: u64 = 20;

fn load_state(service: &HttpService, state: &str) -> LoadResult {
    let r = load(&service.url(), REQUESTS, DISPATCHES, GAP_US, Some(HEALTH_EVERY_MS))
        .unwrap_or_else(|e| panic!("{state}: {e:#}"));
    say(&format!("emu_arrival: {state}: {r:?}"));
    assert_eq!((r.requests, r.dispatches), (u64::from(REQUESTS), u64::from(REQUESTS * DISPATCHES)), "{r:?}");
    r
}

/// Printed past libtest's capture (as [`Elapsed`] is), so the log has the figures pass or fail.
fn say(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// `u64` at `path` (slash-separated) of `v`.
fn n(v: &Value, path: &str) -> u64 {
    path.split('/').fold(v, |v, k| &v[k]).as_u64().unwrap_or_else(|| panic!("no {path} in {v}"))
}

#[test]
fn emu_arrival_holds_the_offline_side_from_each_requests_arrival_and_never_for_a_probe() {
    let _t = Elapsed::start("emu_arrival_holds_the_offline_side_from_each_requests_arrival");
    let cgroup = Cgroup::new("emu-arrival").unwrap();
    let cpu_ms = CPU_MS.to_string();
    let mut service = HttpService::start(
        &cgroup,
        &["--gpu-id", "0x1000", "--queues", "1", "--runtime-enable", "--dispatch-us", "3000", "--cpu-ms", &cpu_ms],
    )
    .unwrap();
    assert_eq!(cgroup_of(service.pid()).unwrap(), cgroup.0);
    let (pid, port) = (service.pid(), service.port);

    // Online alone: the offline job is not started yet.
    let alone = load_state(&service, "online alone");

    // An offline job on the same GPU: its ring kept full of 10 ms dispatches. It refills asleep
    // (not polling on the CPU as `train` does): in a 2-vCPU guest a polling job would take the
    // CPU the service's own phase and completions need, and the states would differ by that
    // rather than by what happens on the GPU.
    let offline = LineHelper::spawn(
        "emu-workload",
        &["offline", "--gpu-id", "0x1000", "--runtime-enable", "--dispatch-us", "10000"],
    )
    .unwrap();
    let offline_pid = offline.pid().to_string();
    let co_located = load_state(&service, "co-located");

    // schedule --no-arrival: suspends at the first dispatch (the doorbell probe), as before.
    let mut s = Schedule::between(pid, &offline_pid, &["--no-arrival"]);
    s.wait_events("offline_attached", 1, LONG);
    let no_arrival = load_state(&service, "schedule --no-arrival");
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    assert_eq!(sum["arrival"], json!([]), "{sum}");
    assert!(lines.iter().all(|l| l["event"] != "online_arrival"), "{lines:?}");
    let no_arrival_suspends = n(&sum, "suspends");
    assert!((1..=u64::from(REQUESTS) + 1).contains(&no_arrival_suspends), "{sum}");

    // schedule with its defaults: the arrival path on.
    let mut s = Schedule::between(pid, &offline_pid, &[]);
    s.wait_events("offline_attached", 1, LONG);
    let said = s.wait_events("online_arrival", 1, LONG);
    let cgroup_text = cgroup.0.display().to_string();
    assert_eq!(
        (&said[0]["pid"], &said[0]["ports"], &said[0]["cgroup"], &said[0]["why"]),
        (&json!(pid), &json!([port]), &json!(cgroup_text), &Value::Null),
        "{}",
        said[0]
    );

    // Probes and scrapes alone, at 20 a second: denied in the kernel, no arming, no suspend.
    let mut prober = Prober::connect(port).unwrap();
    let mut scrapes = 0;
    for i in 0..PROBES {
        if i % 5 == 4 {
            scrapes += 1;
            prober.get("/metrics").unwrap();
        } else {
            prober.get("/health").unwrap();
        }
        thread::sleep(Duration::from_millis(50));
    }
    drop(prober);
    // A hold the probes had opened would suspend at once (cold: no lead learnt yet).
    thread::sleep(Duration::from_millis(500));
    assert_eq!(s.transitions("suspend"), Vec::<Value>::new(), "a probe or a scrape made a suspend");

    let arrival = load_state(&service, "schedule");
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    let reports = sum["arrival"].as_array().unwrap_or_else(|| panic!("{sum}"));
    assert_eq!(reports.len(), 1, "{sum}");
    let a = &reports[0];
    say(&format!("emu_arrival: the arrival report: {a}"));
    assert_eq!(
        (&a["pid"], &a["ports"], &a["cgroup"], &a["why"]),
        (&json!(pid), &json!([port]), &json!(cgroup_text), &Value::Null),
        "{a}"
    );
    // Every segment is one message (one write each, answered before the next on its connection).
    let denied = PROBES + arrival.health;
    let requests = u64::from(REQUESTS);
    assert_eq!(
        a["counts"],
        json!({"segments": requests + denied, "allowed": requests, "denied": denied, "unmatched": 0, "tls": 0,
               "armings": requests}),
        "{a}"
    );
    // One arrival per arming, so per request: no probe or scrape ever opened a hold. Each ended
    // once: served or late (its GPU work came), or wasted (released at its bound before its work
    // came); none busy (each request came after the last one's work and resume), none open.
    // `wasted` is not asserted to be 0: in this guest the first request on the load's new
    // connection publishes its first dispatch 60-75 ms after its arrival (the others 26-56 ms),
    // past the 50 ms bound of a hold before any lead is learnt, so it is released as wasted and
    // its work suspends the offline side again when it comes (1 of 40 in 3 runs of 4, 0 in the
    // fourth). The identities below still prove that every wasted hold was a request's.
    let p = &a["pending"];
    assert_eq!(n(p, "arrivals"), requests, "{a}");
    assert_eq!((n(p, "busy"), n(p, "open")), (0, 0), "{a}");
    let (served, late, wasted) = (n(p, "served"), n(p, "late"), n(p, "wasted"));
    assert_eq!(served + late + wasted, requests, "{a}");
    // Each request's lead is its CPU phase at least: the arrival is stamped as the segment
    // reaches the socket, before the service reads it and spins.
    assert_eq!(n(a, "lead_us/count"), served + late, "{a}");
    assert!(a["lead_us"]["min"].as_f64().unwrap() >= CPU_MS * 1e3, "{a}");
    // At most one suspend per request, plus one per wasted hold (its request's work suspends
    // again) and one for a burst split by a stalled vCPU; each resumed.
    let suspends = n(&sum, "suspends");
    assert!((1..=requests + wasted + 1).contains(&suspends), "{sum}");
    assert_eq!(n(&sum, "resumes"), suspends, "{sum}");
    assert_eq!(n(&sum, "failed_suspends"), 0, "{sum}");

    // The service answered every request and probe of the four states.
    let stats = service.stats().unwrap();
    let health = alone.health + co_located.health + no_arrival.health + arrival.health + PROBES - scrapes;
    assert_eq!(
        (n(&stats, "requests"), n(&stats, "health"), n(&stats, "metrics")),
        (4 * requests, health, scrapes),
        "{stats}"
    );

    let ratio = |r: &LoadResult| r.p50_ms / alone.p50_ms;
    let table = [
        ("online alone", &alone),
        ("co-located", &co_located),
        ("schedule --no-arrival", &no_arrival),
        ("schedule", &arrival),
    ]
    .iter()
    .map(|(state, r)| format!("  {state:<22} P50 {:7.2} ms ×{:.2}  P99 {:7.2} ms", r.p50_ms, ratio(r), r.p99_ms))
    .collect::<Vec<_>>()
    .join("\n");
    say(&format!(
        "emu_arrival: {REQUESTS} requests per state ({CPU_MS} ms CPU phase, {DISPATCHES} x 3 ms dispatches); \
         pending holds served {served}, late {late}, wasted {wasted}; suspends {no_arrival_suspends} (--no-arrival) and \
         {suspends}\n{table}"
    ));
    // A co-located request waits behind the offline job's 10 ms dispatches at each of its own;
    // under `schedule` its SUSPEND is done during the CPU phase (over 4 runs: 41.8-45.8 ms against
    // 53.2-54.8 ms co-located, 36.6-37.1 ms alone).
    assert!(arrival.p50_ms <= co_located.p50_ms, "{table}");
    // With the arrival path against without it, the P50 is printed, not asserted: under software
    // emulation the SUSPEND's own cost on the guest's two vCPUs (a 2-39 ms ioctl at SCHED_FIFO)
    // and the reaction thread's polling through each pending hold take CPU from the service's own
    // phase, and move the median by as much as the lead gains (over 4 runs, with / without:
    // 41.8 / 48.2, 42.4 / 46.4, but 45.8 / 41.9 and 44.8 / 43.4 ms; the P99 59.9-85.4 / 61.3-86.2).
    drop(offline);
    assert_eq!(tracer_pid(service.pid()).unwrap(), 0);
}

/// The service the scheduler was never tuned on (`tests/services/hip_http.py`): Python's threaded
/// HTTP server, HIP 5.2's own fill kernels through ctypes, a CPU phase spun in the interpreter;
/// each request sent by curl on a connection of its own (a SYN, the request, a FIN), a health
/// probe by curl between requests.
const UNSEEN_REQUESTS: u32 = 20;
/// Its CPU phase, ms: as [`CPU_MS`], longer than the guest's SUSPENDs.
const UNSEEN_CPU_MS: &str = "25";
/// Its GPU work per request: 2 fills of 16 Ki words (what each fill kernel costs on the emulator
/// is HIP's choice of grid; the alone run's P50 is printed with the others).
const UNSEEN_KERNELS: &str = "2";
const UNSEEN_ELEMENTS: &str = "16384";

/// One curl request to the unseen service: its total time, ms (curl's own `time_total`).
fn curl_post(port: u16, id: u32) -> f64 {
    let body = format!("{{\"id\": {id}, \"prompt\": \"a question, request {id}\", \"max_tokens\": 16}}");
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "60", "-o", "/dev/null", "-w", "%{time_total}"])
        .args(["-H", "Content-Type: application/json", "--data", &body])
        .arg(format!("http://127.0.0.1:{port}/v1/completions"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl request {id}: {:?} {text}", String::from_utf8_lossy(&out.stderr));
    text.trim().parse::<f64>().unwrap_or_else(|e| panic!("curl's time_total {text:?}: {e}")) * 1e3
}

fn curl_health(port: u16) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "60", "-o", "/dev/null"])
        .arg(format!("http://127.0.0.1:{port}/health"))
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl /health: {:?}", String::from_utf8_lossy(&out.stderr));
}

/// [`UNSEEN_REQUESTS`] requests, a health probe after each, [`GAP_US`] apart: their P50, ms.
fn unseen_load(port: u16, state: &str) -> f64 {
    let mut ms: Vec<f64> = (0..UNSEEN_REQUESTS)
        .map(|id| {
            let t = curl_post(port, id);
            curl_health(port);
            thread::sleep(Duration::from_micros(GAP_US));
            t
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let p50 = ms[ms.len() / 2];
    say(&format!("emu_arrival: unseen service, {state}: P50 {p50:.1} ms, all {ms:.1?}"));
    p50
}

#[test]
fn emu_arrival_sees_a_python_hip_service_it_was_never_tuned_on() {
    let _t = Elapsed::start("emu_arrival_sees_a_python_hip_service_it_was_never_tuned_on");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("services/hip_http.py");
    // ROCr opens the GPUs' render nodes beside /dev/kfd: amdgpu_emu for the test's life (dropped
    // last: it checks that every KFD process and render file was released).
    let _nodes = RenderNodes::load();
    let cgroup = Cgroup::new("emu-arrival-unseen").unwrap();
    let service = HttpService::start_program(&cgroup, &script, &[UNSEEN_CPU_MS, UNSEEN_KERNELS, UNSEEN_ELEMENTS])
        .unwrap_or_else(|e| panic!("the Python HIP service: {e:#}"));
    say(&format!("emu_arrival: unseen service up: {}", service.hello));
    let (pid, port) = (service.pid(), service.port);
    // The interpreter's and HIP's first calls, and curl's first runs, out of the alone figures.
    unseen_load(port, "warm-up");
    let alone = unseen_load(port, "online alone");

    let offline = LineHelper::spawn(
        "emu-workload",
        &["offline", "--gpu-id", "0x1000", "--runtime-enable", "--dispatch-us", "10000"],
    )
    .unwrap();
    let offline_pid = offline.pid().to_string();
    let co_located = unseen_load(port, "co-located");

    // No `--no-arrival` state here: the project's own service above measures against it, and this
    // one's P50s are only printed (below), so the state would cost CI about 40 s for a figure.
    let mut s = Schedule::between(pid, &offline_pid, &[]);
    s.wait_events("offline_attached", 1, LONG);
    let said = s.wait_events("online_arrival", 1, LONG);
    assert_eq!((&said[0]["pid"], &said[0]["ports"], &said[0]["why"]), (&json!(pid), &json!([port]), &Value::Null));
    let scheduled = unseen_load(port, "schedule");
    thread::sleep(Duration::from_millis(300));
    let (lines, _) = s.stop();
    let sum = summary(&lines);
    let a = &sum["arrival"][0];
    say(&format!("emu_arrival: unseen service, the arrival report: {a}"));
    let requests = u64::from(UNSEEN_REQUESTS);
    // curl writes each request (headers and its small JSON body) in one segment, and each probe
    // in one: every request allowed and armed once, every probe denied, nothing else with payload.
    assert_eq!(
        a["counts"],
        json!({"segments": 2 * requests, "allowed": requests, "denied": requests, "unmatched": 0, "tls": 0,
               "armings": requests}),
        "{a}"
    );
    let p = &a["pending"];
    assert_eq!((n(p, "arrivals"), n(p, "busy"), n(p, "open")), (requests, 0, 0), "{a}");
    assert_eq!(n(p, "served") + n(p, "late") + n(p, "wasted"), requests, "{a}");
    assert_eq!(n(&sum, "failed_suspends"), 0, "{sum}");
    assert_eq!(n(&sum, "resumes"), n(&sum, "suspends"), "{sum}");
    say(&format!(
        "emu_arrival: unseen service P50: alone {alone:.1} ms, co-located {co_located:.1} ms (x{:.2}), schedule \
         {scheduled:.1} ms (x{:.2})",
        co_located / alone,
        scheduled / alone
    ));
    // The P50s are printed, not asserted. This Python service's requests run its CPU phase, the
    // emulator's CP thread and the trainer on the guest's software-emulated vCPUs: the SUSPENDs'
    // own CPU (the emulated CWSR save) moves its median by as much as the lead gains, and 20
    // requests do not settle a median (against co-located it came out 0.99x, 1.10x, 1.25x and
    // 1.35x in four runs of this test). Timing is judged natively (BENCHMARKS §9.5). What holds
    // in the guest is what the arrival path decided: most requests were held before their first
    // kernel (its leads are 30-40 ms, a SUSPEND here about 1 ms; the first few are issued at
    // arrival, before a lead is learnt).
    assert!(n(p, "served") * 2 > requests, "{a}");
    drop(offline);
    assert_eq!(tracer_pid(pid).unwrap(), 0);
}
