//! `cargo xtask demo`: first the tracer on the real amdgpu driver of Debian 6.12, in a VM, while a
//! built-in workload (the `kfd-client` test helper) issues KFD queue ioctls; then the whole tool
//! on the KFD emulator, where queues exist and consume work, ending with the scheduling story
//! (online latency alone, co-located, with `gpreempt schedule`). `--amdgpu` or `--emulator` runs
//! one part only.

use anyhow::{Result, bail};

use crate::{
    kmod, setup,
    util::{self, build_binaries, cargo, target_dir},
    vm::{self, Kernel, VmArgs},
};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Only the second part: the KFD emulator (tests/kfd-emu) scenario, ending with scheduling.
    #[arg(long, conflicts_with = "amdgpu")]
    pub emulator: bool,
    /// Only the first part: the tracer on the real amdgpu driver.
    #[arg(long)]
    pub amdgpu: bool,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    pub no_setup: bool,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    if !args.emulator {
        amdgpu()?;
    }
    if !args.amdgpu {
        emulator()?;
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
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        cpus: 2,
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

/// The tool on an emulated GPU: the tracer live, a TTM eviction through the emulator's control
/// file, and `gpreempt preempt` holding an offline workload while a monitor prints its
/// read-index progress twice a second. It ends with the story `gpreempt schedule` exists for:
/// an online workload's request latency (from the completion records the emulated CP writes)
/// alone, next to a saturating offline workload (worse), and with `gpreempt schedule` (back near
/// alone), with the offline workload's throughput in each state.
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
{gpreempt} preempt --offline "$offline" --online "$online" --iterations 3 --hold-ms 2000 --gap-ms 2000 --quiet
kill $monitor $tailer
echo "== tracer summary"
kill -INT $tracer
wait $tracer
# The two `run` workloads keep their rings full: they leave the GPU to the story's workloads.
kill $online $offline
sleep 1
echo "== the story: an online workload (2 dispatches of 2 ms every 40 ms: 10 % of the GPU) and an offline one (5 ms dispatches, saturating) on gpu 0x1000"
python3 - {workload} {gpreempt} <<'PY'
import json, math, signal, subprocess, sys, threading, time
workload, gpreempt = sys.argv[1], sys.argv[2]
REQUESTS = 50

def pct(v, q):
    v = sorted(v)
    return v[max(0, math.ceil(q * len(v)) - 1)]

class Proc:
    """A load generator: JSON lines out, commands in."""
    def __init__(self, *args):
        self.p = subprocess.Popen([workload, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.next()["pid"]
    def next(self, event=None):
        while True:
            line = self.p.stdout.readline()
            if not line:
                sys.exit(f"emu-workload {{self.p.args[1]}} ended early")
            v = json.loads(line)
            if event is None or v.get("event") == event:
                return v
    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

def online():
    return Proc("online", "--gpu-id", "0x1000", "--runtime-enable", "--dispatches", "2", "--dispatch-us", "2000",
                "--period-us", "40000", "--requests", str(REQUESTS), "--wait-go")

def offline():
    p = Proc("offline", "--gpu-id", "0x1000", "--runtime-enable", "--dispatch-us", "5000")
    time.sleep(0.2)
    return p

def done(p):
    p.send("stats")
    s = p.next("stats")
    return s["completed"], s["now_ns"]

def requests(p, off=None):
    """Run the online requests; with an offline workload, its dispatches/s over the same time."""
    a = done(off) if off else None
    p.send("go")
    lat = [p.next("request")["latency_ns"] / 1e6 for _ in range(REQUESTS)]
    p.next("summary")
    rate = None
    if off:
        b = done(off)
        rate = (b[0] - a[0]) * 1e9 / (b[1] - a[1])
        off.send("stop")
        off.next("summary")
    return lat, rate

rows = []
def show(name, lat, rate, alone=None):
    rows.append((name, lat, rate))
    base = rows[0][1]
    ratio = f"  ({{pct(lat, .5) / pct(base, .5):.1f}}x / {{pct(lat, .99) / pct(base, .99):.1f}}x alone)"
    print(f"   {{name:<24}} online p50 {{pct(lat, .5):6.2f}} ms  p99 {{pct(lat, .99):6.2f}} ms{{ratio if len(rows) > 1 else ' ' * len(ratio)}}"
          + (f"   offline {{rate:4.0f}} dispatches/s ({{100 * rate / alone:.0f}} % of alone)" if rate else ""), flush=True)

lat, _ = requests(online())
off = offline()
a = done(off)
time.sleep(REQUESTS * 0.04)
b = done(off)
alone = (b[0] - a[0]) * 1e9 / (b[1] - a[1])
off.send("stop")
off.next("summary")
show("online alone", lat, None)
print(f"   {{'offline alone':<24}} {{alone:.0f}} dispatches/s", flush=True)
lat, rate = requests(online(), offline())
show("co-located", lat, rate, alone)

off, on = offline(), online()
print("   starting gpreempt schedule (its in-process tracer attaches first, then the offline process)", flush=True)
sched = subprocess.Popen([gpreempt, "schedule", "--json", "--online", str(on.pid), "--offline", str(off.pid)],
                         stdout=subprocess.PIPE, text=True, bufsize=1)
events = []
attached = threading.Event()
def read():
    for line in sched.stdout:
        events.append(json.loads(line))
        if events[-1].get("event") == "offline_attached":
            attached.set()
reader = threading.Thread(target=read, daemon=True)
reader.start()
if not attached.wait(600):
    sys.exit("gpreempt schedule did not attach")
lat, rate = requests(on, off)
sched.send_signal(signal.SIGINT)
sched.wait()
reader.join(10)
show("with gpreempt schedule", lat, rate, alone)
s = next(e for e in events if e.get("event") == "summary")
r = s.get("reaction_us") or {{}}
print(f"   gpreempt schedule: {{s['suspends']}} suspends for {{REQUESTS}} requests, reaction p50 {{r.get('p50', 0):.0f}} us "
      f"p99 {{r.get('p99', 0):.0f}} us, its CPU {{100 * s['cpu_share']:.1f}} % of one vCPU", flush=True)
PY
"#
    );
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        cpus: 2,
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
