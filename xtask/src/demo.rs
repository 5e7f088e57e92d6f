//! `cargo xtask demo`: first the tracer on the real amdgpu driver of Debian 6.12, in a VM, while a
//! built-in workload (the `kfd-client` test helper) issues KFD queue ioctls; then the whole tool
//! on the KFD emulator, where queues exist and consume work, ending with the scheduling story
//! (`gpreempt evaluate` of an HTTP service whose requests have a CPU phase: alone, co-located,
//! under `schedule --no-arrival` and under `schedule`); last, Debian's ROCm 5.2 user space on the
//! emulated GPUs: `rocminfo`, and an HSA program's requests under `gpreempt schedule`.
//! `--amdgpu`, `--emulator` or `--rocm` runs one part only.

use anyhow::{Result, bail};

use crate::{
    binaries::build_binaries,
    kmod, setup,
    util::{self, cargo, target_dir},
    vm::{self, Kernel, VmArgs},
};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Only the second part: the KFD emulator (tests/kfd-emu) scenario, ending with scheduling.
    #[arg(long, conflicts_with_all = ["amdgpu", "rocm"])]
    pub emulator: bool,
    /// Only the first part: the tracer on the real amdgpu driver.
    #[arg(long, conflicts_with = "rocm")]
    pub amdgpu: bool,
    /// Only the third part: Debian's ROCm 5.2 (rocminfo, an HSA program) on the emulated GPUs.
    #[arg(long)]
    pub rocm: bool,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    pub no_setup: bool,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    let all = !(args.amdgpu || args.emulator || args.rocm);
    if all || args.amdgpu {
        amdgpu()?;
    }
    if all || args.emulator {
        emulator()?;
    }
    if all || args.rocm {
        rocm()?;
    }
    Ok(())
}

/// The tracer on the real driver (no GPU: every ioctl reaches KFD's handlers).
fn amdgpu() -> Result<()> {
    let bin = build_binaries()?;
    let (gpreempt, client) = (bin.join("gpreempt"), bin.join("kfd-client"));
    let (gpreempt, client) = (gpreempt.display(), client.display());
    let script = format!(
        r#"
echo "== gpreempt trace on $(uname -r), amdgpu loaded, no GPU: every ioctl reaches the real KFD handlers"
{gpreempt} trace 2> "$GPREEMPT_VM_OUT/trace.err" &
tracer=$!
for _ in $(seq 600); do grep -q attached "$GPREEMPT_VM_OUT/trace.err" 2>/dev/null && break; sleep 0.1; done
cat "$GPREEMPT_VM_OUT/trace.err"
echo "== workload: 3 queue creates (gpu 0x1234/0x5678), 2 destroys, from kfd-client"
{client} create --gpu-id 0x1234 --type compute-aql --ring-size 65536 --priority 7 > /dev/null
{client} create --gpu-id 0x5678 --type sdma --ring-size 4096 --priority 15 > /dev/null
{client} create --gpu-id 0x1234 --type compute --ring-size 1048576 --priority 0 > /dev/null
{client} destroy --queue-id 42 > /dev/null
{client} destroy --queue-id 0 > /dev/null
sleep 1
kill -INT $tracer
wait $tracer
"#
    );
    in_vm(script, None, 600, "the demo")
}

/// The tool on an emulated GPU: the tracer live, a TTM eviction through the emulator's control
/// file, and `gpreempt preempt` holding an offline workload while a monitor prints its
/// read-index progress twice a second. It ends with the story `gpreempt schedule` exists for, told
/// the way a user would find it out on their own node: `gpreempt evaluate` against a running
/// HTTP service (`emu-workload server --listen`, in a cgroup of its own, each request a CPU phase
/// longer than a SUSPEND before its dispatches, as an LLM server's), its load command with health
/// probes beside it, an offline job on the service's GPU and a training job on another; run twice,
/// with `--no-arrival` and with the arrival path on, so the table shows the service's P50/P99
/// alone, co-located, under `schedule --no-arrival` and under `schedule`, and what the arrival
/// path did; then where gpreempt cannot help (a request with no lead, shorter than a SUSPEND).
fn emulator() -> Result<()> {
    // Release binaries: the scheduler's poll loop is what the demo times.
    util::run(cargo().args(["build", "--release", "--package", "gpreempt", "--package", "gpreempt-tests", "--bins"]))?;
    let bin = target_dir().join("release");
    let (gpreempt, workload) = (bin.join("gpreempt"), bin.join("emu-workload"));
    let (gpreempt, workload) = (gpreempt.display(), workload.display());
    let script = format!(
        r#"
out="$GPREEMPT_VM_OUT"
echo "== KFD emulator on $(uname -r): /dev/kfd with emulated GPUs 0x1000 and 0x2000 whose queues consume work"
echo "   emulated CWSR save $(cat /sys/module/kfd_emu/parameters/preempt_delay_us) us, restore $(cat /sys/module/kfd_emu/parameters/restore_delay_us) us, doorbell tick $(cat /sys/module/kfd_emu/parameters/tick_us) us"
{gpreempt} trace --map-interval 30s 2> "$out/trace.err" &
tracer=$!
for _ in $(seq 600); do grep -q attached "$out/trace.err" 2>/dev/null && break; sleep 0.1; done
head -2 "$out/trace.err"
echo "== two workloads on gpu 0x1000: online (1 queue) and offline (2 queues)"
sleep 600 | {workload} run --gpu-id 0x1000 --queues 1 --runtime-enable > "$out/online.json" &
sleep 600 | {workload} run --gpu-id 0x1000 --queues 2 --runtime-enable > "$out/offline.json" &
for _ in $(seq 100); do [ -s "$out/offline.json" ] && [ -s "$out/online.json" ] && break; sleep 0.1; done
online=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$out/online.json")
offline=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$out/offline.json")
rptr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["queues"][0]["rptr"])' "$out/offline.json")
sleep 1
echo "== TTM eviction of the online workload (pid $online) and its restore, via /sys/kernel/kfd_emu"
echo "$online" > /sys/kernel/kfd_emu/evict; sleep 0.5; echo "$online" > /sys/kernel/kfd_emu/restore; sleep 0.5
echo "== the live map (SIGUSR1)"
kill -USR1 $tracer; sleep 1
echo "== gpreempt preempt: 3 x (suspend 2 s, resume 2 s) of the offline workload (pid $offline)"
python3 - "$offline" "$rptr" > "$out/progress.log" <<'PY' &
import os, struct, sys, time
pid, addr = int(sys.argv[1]), int(sys.argv[2])
fd = os.open(f"/proc/{{pid}}/mem", os.O_RDONLY)
last = None
while True:
    v = struct.unpack("<Q", os.pread(fd, 8, addr))[0]
    if last is not None:
        print(f"offline queue 0 read index {{v:>8}}  +{{v - last:>4}} in 0.5 s  {{'RUNNING' if v > last else 'stopped'}}", flush=True)
    last = v
    time.sleep(0.5)
PY
monitor=$!
tail -f "$out/progress.log" &
tailer=$!
{gpreempt} preempt --offline "$offline" --online "$online" --iterations 3 --hold 2000ms --gap 2000ms --quiet
kill $monitor $tailer
echo "== tracer summary"
kill -INT $tracer
wait $tracer
# The two `run` workloads keep their rings full: they leave the GPU to the story's workloads.
kill $online $offline
sleep 1
echo "== the story, as a user runs it: gpreempt evaluate"
echo "   online: an HTTP service on gpu 0x1000 (one queue, 3 ms dispatches) in a cgroup of its own; each request spends"
echo "   {STORY_CPU_MS} ms on the CPU before its 2 dispatches, as an LLM server tokenizes and templates a prompt before its first kernel"
echo "   its load: 40 requests, 80 ms apart, a health probe every 100 ms beside them (emu-workload request --url, which prints p50_ms/p99_ms)"
echo "   offline: a job that keeps its ring full of 10 ms dispatches on the service's GPU (and waits asleep, leaving the guest's two"
echo "   vCPUs to the service), and a training job on gpu 0x2000 (2 ms dispatches back to back)"
echo "   (the emulated CP runs one dispatch at a time, taking the queues in turn: co-located, a request waits behind the offline job's)"
echo "   evaluated twice in this boot, one round each: under schedule --no-arrival (the SUSPEND issued when the request's first"
echo "   dispatch is seen), then schedule with its defaults (the arrival path: issued when the request reaches the service's socket)"
# The service joins its cgroup before it listens (a socket keeps the cgroup it was created in):
# the arrival probe is attached there and sees the segments to its listening port.
cg=$(findmnt -n -t cgroup2 -o TARGET | head -1)
if [ -z "$cg" ]; then mount -t cgroup2 none /sys/fs/cgroup && cg=/sys/fs/cgroup; fi
cg="$cg/gpreempt-demo-service"
mkdir -p "$cg"
sleep 900 | sh -c 'echo $$ > "$1/cgroup.procs" && exec "$0" server --gpu-id 0x1000 --queues 1 --runtime-enable --dispatch-us 3000 --cpu-ms {STORY_CPU_MS} --listen 127.0.0.1:0' {workload} "$cg" > "$out/service.json" &
sleep 900 | {workload} offline --gpu-id 0x1000 --runtime-enable --dispatch-us 10000 > "$out/train1.json" &
sleep 900 | {workload} train --gpu-ids 0x2000 --queues 1 --runtime-enable --dispatch-us 2000 > "$out/train2.json" &
for _ in $(seq 100); do [ -s "$out/service.json" ] && [ -s "$out/train1.json" ] && [ -s "$out/train2.json" ] && break; sleep 0.1; done
field_of() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }}
service=$(field_of "$out/service.json" pid) && port=$(field_of "$out/service.json" port) \
  && train1=$(field_of "$out/train1.json" pid) && train2=$(field_of "$out/train2.json" pid) \
  || {{ echo "the story's workloads did not start" >&2; exit 1; }}
load="{workload} request --url http://127.0.0.1:$port --requests 40 --dispatches 2 --gap-us 80000 --health-every-ms 100"
evaluate() {{
  {gpreempt} evaluate --online "$service" --offline "$train1" "$train2" --load "$load" \
    --metric 'p50_ms=p50_ms=([0-9.]+)' --metric 'p99_ms=p99_ms=([0-9.]+)' --rounds 1 --idle 5ms "$@"
}}
rc=0
echo "== gpreempt evaluate … --no-arrival"
evaluate --no-arrival --output "$out/story-no-arrival.json" || rc=$?
echo "== gpreempt evaluate (the arrival path on, as by default)"
evaluate --output "$out/story-arrival.json" || rc=$?
if [ $rc = 0 ]; then
python3 - "$out/story-no-arrival.json" "$out/story-arrival.json" <<'PY' || rc=$?
{STORY_TABLE}
PY
fi
# The workloads and the `sleep`s that keep their stdin open (a `wait` on a pipeline's last
# process would wait for its `sleep` too).
kill $service $train1 $train2 2>/dev/null; pkill -x sleep
sleep 1; rmdir "$cg" 2>/dev/null
exit $rc
"#
    );
    in_vm(script, Some(kmod::Module::KfdEmu), 900, "the emulator demo")
}

/// The story service's CPU phase per request, ms: longer than a SUSPEND in the guest
/// (BENCHMARKS.md §7: the ioctl's p50 1.6-4.9 ms under TCG), as a Python LLM server's is on real
/// hardware (vLLM on MI300X: 7 ms at 1 k tokens of context, 15 ms at 8 k; issue 45).
const STORY_CPU_MS: u32 = 30;

/// The story's table from the two evaluations' reports (`--output`): the service's P50 and P99
/// alone, co-located, under `schedule --no-arrival` and under `schedule`, the offline job's
/// progress on the service's GPU, what the arrival path did, and where gpreempt cannot help.
const STORY_TABLE: &str = r#"
import json, sys

no_arrival, arrival = (json.load(open(p)) for p in sys.argv[1:3])

def runs(report, state):
    return [r for r in report["runs"] if r["state"] == state and not r["interrupted"]]

def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")

def on_gpu(run, gpu=0x1000):
    for g in run["offline_gpus"]:
        if g["gpu_id"] in (gpu, hex(gpu)):
            return g["per_s"]
    return 0.0

both = (no_arrival, arrival)
rows = [
    ("online alone", [r for rep in both for r in runs(rep, "online_alone")]),
    ("co-located, no gpreempt", [r for rep in both for r in runs(rep, "co_located")]),
    ("schedule --no-arrival", runs(no_arrival, "scheduled")),
    ("schedule", runs(arrival, "scheduled")),
]
alone = {m: mean([r["metrics"][m] for r in rows[0][1]]) for m in ("p50_ms", "p99_ms")}
offline_alone = mean([on_gpu(r) for rep in both for r in runs(rep, "offline_alone")])
print("== the story: the service's latency per request (arrival to answer) and the offline job on its GPU")
print(f"   {'state':<26} {'P50':>16} {'P99':>16}   offline job on 0x1000")
for label, rs in rows:
    cells = []
    for m in ("p50_ms", "p99_ms"):
        v = mean([r["metrics"][m] for r in rs])
        cells.append(f"{v:7.1f} ms x{v / alone[m]:.2f}")
    kept = "-" if label == "online alone" else f"{100 * mean([on_gpu(r) for r in rs]) / offline_alone:.0f} % of its progress alone"
    print(f"   {label:<26} {cells[0]:>16} {cells[1]:>16}   {kept}")
print("   (online alone and co-located: the mean of both evaluations' runs)")
for a in arrival.get("arrival", []):
    if a.get("why"):
        print(f"   the arrival path did not watch pid {a['pid']}: {a['why']}")
        continue
    lead = a["lead_p50_us"]["median"] / 1e3 if a["lead_p50_us"] else float("nan")
    print(f"   schedule's arrival path: {a['requests']} requests seen at port {','.join(map(str, a['ports']))} before their first kernel,"
          f" {a['denied']} health probes let by (no hold, no SUSPEND); of {a['arrivals']} pending holds {a['served']} were served"
          f" (the SUSPEND done before the request's first kernel), {a['late']} late, {a['wasted']} wasted;"
          f" arrival to first kernel p50 {lead:.1f} ms")
suspend = [r["schedule"]["suspend_us"]["p50"] for r in runs(arrival, "scheduled") if r["schedule"].get("suspend_us")]
print(f"   Where gpreempt cannot help: a SUSPEND took {mean(suspend) / 1e3:.1f} ms here (p50). A request whose first kernel"
      " comes sooner after its arrival than that (no CPU phase before it, so no lead) waits for the SUSPEND whenever it is"
      " issued: gpreempt then bounds the request's tail, not its median, which can be worse than co-located.")
"#;

/// Debian's ROCm user space on the emulated GPUs (amdgpu_emu's render nodes beside kfd_emu): the
/// unmodified `rocminfo` (5.2), then a HIP 5.2 program (`tests/rocm/hip_streams.hip requests`:
/// one 8 ms kernel and `hipStreamSynchronize` every 150 ms, timed by its own clock) alone, next to
/// a HIP training loop on trixie's HIP 5.7 and ROCm 6.1 (`hip_streams.hip offline`: 8 ms kernels
/// back to back, each synchronized), and under `gpreempt schedule`, which reads the requests from
/// ROCr's own queues. ROCr 5.2 (under HIP 5.2) never enables the debug runtime, so it can be the
/// online side only; ROCr 6.1 does, so it can be suspended.
fn rocm() -> Result<()> {
    let debug = build_binaries()?;
    util::run(cargo().args(["build", "--release", "--package", "gpreempt"]))?;
    let release = target_dir().join("release");
    let (hip, hip6) = (debug.join("hip-streams"), debug.join("hip-streams-6"));
    if let Some(missing) = [&hip, &hip6].into_iter().find(|p| !p.exists()) {
        bail!(
            "{} was not built: `cargo xtask setup` installs hipcc, libamdhip64-dev and libhsa-runtime-dev and \
             unpacks trixie's ROCm 6.1 runtime and HIP 5.7",
            missing.display()
        );
    }
    let ko = kmod::build(kmod::Module::KfdEmu, Kernel::V6_12)?;
    let amdgpu_emu = ko.with_file_name("amdgpu_emu.ko");
    let script = format!(
        r#"
set -e
modprobe drm
insmod {amdgpu_emu}
echo "== Debian's rocminfo (ROCm 5.2, unmodified) on the emulated GPUs"
rocminfo | awk '/^Agent [0-9]+/ {{ agent = $0 }} /^  Name:/ {{ name = $2 }}
  /^  Marketing Name:/ {{ sub(/^  Marketing Name: +/, ""); sub(/ +$/, ""); market = $0 }}
  /^  Device Type:/ {{ type = $3 }}
  /^  Compute Unit:/ {{ if (type == "GPU") print "   " agent ": " name ", " market ", " $3 " CUs" }}'
echo "== a HIP 5.2 program's requests (one 8 ms kernel, hipStreamSynchronize, every 150 ms) alone, next to a HIP 5.7 training loop on ROCm 6.1 (8 ms kernels back to back), under gpreempt schedule"
python3 - {gpreempt} {hip6} {hip} <<'PY'
import json, signal, subprocess, sys
gpreempt, hip6, hip = sys.argv[1:4]
N = 20

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

def requests(label, offline=None, schedule=False):
    prog = subprocess.Popen([hip, "requests", "8000", str(N), "150000"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    pid = json.loads(prog.stdout.readline())["pid"]
    sched = None
    if schedule:
        sched = subprocess.Popen([gpreempt, "schedule", "--json", "--online", str(pid), "--offline", str(offline.pid),
                                  "--idle", "5ms"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in sched.stdout:
            event = json.loads(line)
            if event.get("event") == "online_added":
                print(f"   schedule: online pid {{pid}}: {{event['queues']}} KFD queues on the GPU (ROCr's utility queue and the stream's)")
            if event.get("event") == "offline_attached":
                break
    prog.stdin.write("go\n")
    prog.stdin.flush()
    ms = [json.loads(prog.stdout.readline())["latency_ns"] / 1e6 for _ in range(N)]
    prog.stdout.readline()
    prog.wait()
    print(f"   {{label:<28}} request latency P50 {{pct(ms, 50):6.1f}} ms  P99 {{pct(ms, 99):6.1f}} ms  ({{N}} requests)")
    if sched:
        sched.send_signal(signal.SIGINT)
        for line in sched.stdout:
            event = json.loads(line)
            if event.get("event") == "summary":
                print(f"   schedule summary: {{event['suspends']}} suspends, {{event['resumes']}} resumes, "
                      f"{{event['failed_suspends']}} failed")
        sched.wait()

requests("alone")
offline = subprocess.Popen([hip6, "offline", "8000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
offline.stdout.readline()
requests("next to the HIP 5.7 job", offline)
requests("under gpreempt schedule", offline, schedule=True)
offline.stdin.write("stop\n")
offline.stdin.flush()
offline.stdout.readline()
done = json.loads(offline.stdout.readline())
offline.wait()
print(f"   the HIP 5.7 job: {{done['completed']}} kernels, all completed; its copy back: {{done['equal']}} of "
      f"{{done['bytes']}} bytes equal")
PY
rmmod amdgpu_emu
"#,
        amdgpu_emu = vm::shell_quote(&amdgpu_emu.display().to_string()),
        gpreempt = vm::shell_quote(&release.join("gpreempt").display().to_string()),
        hip6 = vm::shell_quote(&hip6.display().to_string()),
        hip = vm::shell_quote(&hip.display().to_string()),
    );
    in_vm(script, Some(kmod::Module::KfdEmu), 900, "the ROCm demo")
}

/// Run `script` as root in a Debian 6.12 VM (amdgpu, or `module` instead), killed after
/// `timeout` s; `what` names the part in the error a failing script gives.
fn in_vm(script: String, module: Option<kmod::Module>, timeout: u64, what: &str) -> Result<()> {
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        cpus: 2,
        timeout,
        memory: "2G".to_owned(),
        no_amdgpu: false,
        module,
        audit_text_pokes: false,
        command: vec![script],
    })?;
    if status != 0 {
        bail!("{what} exited with status {status}");
    }
    Ok(())
}
