//! `cargo xtask demo`: the tracer on the real amdgpu driver of Debian 6.12, in a VM, while a
//! built-in workload (the `kfd-client` test helper) issues KFD queue ioctls; `--emulator`: the
//! whole tool on the KFD emulator, where queues exist and consume work.

use anyhow::{Result, bail};

use crate::{
    kmod, setup,
    util::{self, build_binaries, cargo, target_dir},
    vm::{self, Kernel, VmArgs},
};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Run the scenario on the KFD emulator (tests/kfd-emu) instead of amdgpu.
    #[arg(long)]
    pub emulator: bool,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    pub no_setup: bool,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    if args.emulator {
        return emulator();
    }
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
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        timeout: 600,
        memory: "2G".to_owned(),
        no_amdgpu: false,
        module: None,
        command: vec![script],
    })?;
    if status != 0 {
        bail!("the demo exited with status {status}");
    }
    Ok(())
}

/// The emulated GPU's contention first: an online workload's per-request latency (from the
/// completion records the emulated CP writes) alone, then with an offline workload saturating
/// the same GPU. Then the tool: the tracer live, a TTM eviction through the emulator's control
/// file, and `gpreempt preempt` holding the offline workload while a monitor prints its
/// read-index progress twice a second. It ends with `gpreempt schedule`: the same online
/// requests next to the saturating offline workload, back near their latency alone, with the
/// offline workload's progress per second.
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
echo "== online: 80 requests, one every 25 ms, each 2 dispatches of 1 ms on gpu 0x1000; offline (5 ms dispatches) joins after request 20"
{workload} online --gpu-id 0x1000 --dispatches 2 --dispatch-us 1000 --period-us 25000 --requests 80 > "$out/latency.jsonl" &
online_load=$!
python3 - "$out/latency.jsonl" <<'PY' &
import json, sys, time
seen = 0
while seen < 81:
    try:
        lines = open(sys.argv[1]).read().splitlines()
    except FileNotFoundError:
        lines = []
    for l in lines[seen:]:
        seen += 1
        v = json.loads(l)
        if v.get("event") == "request":
            r = v["records"]
            print(f"  request {{v['request']:>2}}: latency {{v['latency_ns']/1e6:7.2f}} ms  (first dispatch waited {{(r[0]['start_ns']-v['submit_ns'])/1e6:6.2f}} ms for the GPU)", flush=True)
    time.sleep(0.1)
PY
printer=$!
for _ in $(seq 600); do [ "$(grep -c '"request"' "$out/latency.jsonl" 2>/dev/null)" -ge 20 ] && break; sleep 0.05; done
sleep 600 | {workload} offline --gpu-id 0x1000 --dispatch-us 5000 > "$out/offline-load.jsonl" &
offline_load=$!
for _ in $(seq 600); do [ -s "$out/offline-load.jsonl" ] && break; sleep 0.05; done
offline_since=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["started_ns"])' "$out/offline-load.jsonl")
wait $online_load
wait $printer
kill $offline_load 2>/dev/null
python3 - "$out/latency.jsonl" "$offline_since" <<'PY'
import json, math, sys
reqs = [json.loads(l) for l in open(sys.argv[1]) if '"request"' in l]
since = int(sys.argv[2])
def pct(v, q):
    v = sorted(v)
    return v[max(0, math.ceil(q * len(v)) - 1)]
colocated = [r for r in reqs if r["submit_ns"] >= since]
if colocated:
    print(f"  -- the offline workload ran from request {{colocated[0]['request']}} on, keeping the GPU saturated with 5 ms dispatches")
# A few dozen requests: p90 and the maximum, not a p99 that would only repeat the maximum.
for name, part in (("alone", reqs[:20]), ("co-located", colocated)):
    lat = [r["latency_ns"] / 1e6 for r in part]
    if lat:
        print(f"== online latency {{name:>10}}: p50 {{pct(lat, 0.5):6.2f}} ms  p90 {{pct(lat, 0.9):6.2f}} ms  max {{max(lat):6.2f}} ms  ({{len(lat)}} requests)")
PY
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
{gpreempt} preempt --offline "$offline" --online "$online" --iterations 3 --hold-ms 2000 --gap-ms 2000 --quiet
kill $monitor $tailer
echo "== tracer summary"
kill -INT $tracer
wait $tracer
echo "== with gpreempt schedule: the same online requests next to the same saturating offline workload"
sleep 600 | {workload} offline --gpu-id 0x1000 --runtime-enable --dispatch-us 5000 --interval-ms 1000 > "$out/offline-sched.jsonl" &
offline_sched=$!
# The online workload waits for a line on fd 9 (a FIFO held open here) until gpreempt is attached.
mkfifo "$out/go"
exec 9<>"$out/go"
{workload} online --gpu-id 0x1000 --runtime-enable --dispatches 2 --dispatch-us 1000 --period-us 25000 --requests 60 --wait-go <&9 > "$out/latency-sched.jsonl" &
online_sched=$!
for _ in $(seq 600); do [ -s "$out/offline-sched.jsonl" ] && [ -s "$out/latency-sched.jsonl" ] && break; sleep 0.05; done
{gpreempt} schedule --online $online_sched --offline $offline_sched --idle-ms 2 --json > "$out/schedule.jsonl" 2> "$out/schedule.err" &
scheduler=$!
for _ in $(seq 600); do grep -q offline_attached "$out/schedule.jsonl" 2>/dev/null && break; sleep 0.1; done
echo go >&9
wait $online_sched
kill -INT $scheduler
wait $scheduler
exec 9>&-
kill $offline_sched 2>/dev/null
python3 - "$out/latency.jsonl" "$out/latency-sched.jsonl" "$out/schedule.jsonl" "$out/offline-sched.jsonl" <<'PY'
import json, math, sys
def pct(v, q):
    v = sorted(v)
    return v[max(0, math.ceil(q * len(v)) - 1)]
def lat(path, part=slice(None)):
    return [r["latency_ns"] / 1e6 for r in [json.loads(l) for l in open(path) if '"request"' in l][part]]
alone, sched = lat(sys.argv[1], slice(0, 20)), lat(sys.argv[2])
print(f"== online latency  alone     : p50 {{pct(alone, 0.5):6.2f}} ms  p90 {{pct(alone, 0.9):6.2f}} ms  max {{max(alone):6.2f}} ms  ({{len(alone)}} requests)")
print(f"== online latency  scheduled : p50 {{pct(sched, 0.5):6.2f}} ms  p90 {{pct(sched, 0.9):6.2f}} ms  max {{max(sched):6.2f}} ms  ({{len(sched)}} requests)")
events = [json.loads(l) for l in open(sys.argv[3])]
s = next(e for e in events if e["event"] == "summary")
r = s.get("reaction_us") or {{}}
print(f"   gpreempt schedule: {{s['suspends']}} suspends for {{len(sched)}} requests, reaction p50 {{r.get('p50', 0):.0f}} us p99 {{r.get('p99', 0):.0f}} us, offline suspended {{100 * s['suspended_share']:.0f}}% of the time")
per_s = [e["per_s"] for e in (json.loads(l) for l in open(sys.argv[4])) if e.get("event") == "interval"]
if per_s:
    print(f"   offline progress while scheduled: {{', '.join(f'{{v:.0f}}' for v in per_s)}} dispatches/s per second")
PY
"#
    );
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        timeout: 900,
        memory: "2G".to_owned(),
        no_amdgpu: false,
        module: Some(kmod::Module::KfdEmu),
        command: vec![script],
    })?;
    if status != 0 {
        bail!("the emulator demo exited with status {status}");
    }
    Ok(())
}
