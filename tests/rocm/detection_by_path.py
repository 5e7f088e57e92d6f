"""Detection by path in the VM, same run (issue 36): a HIP 5.7 program's requests (ROCr 6.1,
`hip-streams-6 requests 4096 40 60000`: one kernel of 4096 work-items and hipStreamSynchronize every
60 ms) under `gpreempt schedule` next to a HIP 5.7 training loop (`hip-streams-6 offline 4096`),
alternately with the doorbell probe and with `--no-doorbell`, two rounds, the order swapped in the
second. Prints each run's summary figures (detection, the probe's detection and wake-up, reaction)
and where the probe sat (`online_seen_by`'s probes: ROCr 6.1's stores' implementations).

Usage, in a 6.12 guest with the KFD emulator and amdgpu_emu loaded (see the closing note that
quotes it):
  cargo xtask vm --kernel 6.12 --module kfd-emu -- "modprobe drm && insmod \
    target/kfd-emu/<release>/amdgpu_emu.ko && python3 tests/rocm/detection_by_path.py \
    target/release/gpreempt target/debug/hip-streams-6 \\$GPREEMPT_VM_OUT/bypath.json; rmmod amdgpu_emu"
"""
import json, signal, subprocess, sys, time
gpreempt, hip6, out = sys.argv[1:4]
N = 40
res = {}
offline = subprocess.Popen([hip6, "offline", "4096"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
offline.stdout.readline()
for rnd in range(2):
    for variant in (["doorbell", "poll"] if rnd == 0 else ["poll", "doorbell"]):
        prog = subprocess.Popen([hip6, "requests", "4096", str(N), "60000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pid = json.loads(prog.stdout.readline())["pid"]
        args = [gpreempt, "schedule", "--json", "--online", str(pid), "--offline", str(offline.pid), "--idle", "5ms"]
        if variant == "poll":
            args.append("--no-doorbell")
        sched = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        path, probes = None, None
        for line in sched.stdout:
            e = json.loads(line)
            if e.get("event") == "online_seen_by":
                path, probes = e.get("path"), e.get("probes")
            if e.get("event") == "offline_attached":
                break
        time.sleep(0.5)
        prog.stdin.write("go\n"); prog.stdin.flush()
        for _ in range(N):
            prog.stdout.readline()
        prog.stdout.readline(); prog.wait()
        sched.send_signal(signal.SIGINT)
        summ = None
        for line in sched.stdout:
            e = json.loads(line)
            if e.get("event") == "summary":
                summ = e
        sched.wait()
        key = f"round{rnd+1}/{variant}"
        res[key] = {k: summ.get(k) for k in ("suspends", "resumes", "detection_us", "detection_doorbell_us", "doorbell_wake_us", "doorbell_waits", "doorbell_wakes", "reaction_us")}
        res[key]["seen_by"] = path
        res[key]["probes"] = probes
        print(key, json.dumps(res[key]), flush=True)
offline.stdin.write("stop\n"); offline.stdin.flush()
json.dump(res, open(out, "w"), indent=1)
