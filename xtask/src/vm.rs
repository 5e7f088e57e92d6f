//! `cargo xtask vm`: boot a Debian kernel of the matrix (kernels.rs) with the real amdgpu driver
//! under virtme-ng and run a command in it as root. Kernels unpacked outside `/` (5.10, 7.x)
//! bring their modules along: virtme-ng finds them beside the image and mounts them in the guest.
//!
//! The host root is shared read-only (9p; no virtiofsd here), so the working tree and the build
//! outputs are visible at the same paths. Only `target/vm/<kernel>/` is writable: the guest
//! writes the command's exit status and its kernel log there, and qemu the kernel console
//! (`console.log`: what a guest that dies before the command starts leaves behind). Nothing is
//! parsed from virtme-ng's own output, which control sequences can garble. Software emulation
//! (`--disable-kvm`): nested KVM hangs at boot here.

use std::{
    fs,
    io::{Read, Write},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{kmod, util::target_dir};

pub use crate::kernels::Kernel;

#[derive(Args, Debug)]
pub struct VmArgs {
    /// Kernel to boot.
    #[arg(long, value_enum, default_value = "6.12")]
    pub kernel: Kernel,
    /// Kill the VM after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout: u64,
    /// Guest memory.
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Do not load amdgpu before the command.
    #[arg(long)]
    pub no_amdgpu: bool,
    /// Build this test module for the kernel on the host and insmod it instead of loading amdgpu.
    #[arg(long, value_enum)]
    pub module: Option<kmod::Module>,
    /// Record every kernel text patch while the command runs (`text_pokes.trace` and `kallsyms`
    /// in the VM's directory; `cargo xtask text-pokes` summarises them).
    #[arg(long)]
    pub audit_text_pokes: bool,
    /// Command to run as root in the guest (through `bash -c`), in the workspace root.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// The guest's writable directory for `kernel` (visible at the same path on both sides).
pub fn out_dir(kernel: Kernel) -> PathBuf {
    target_dir().join("vm").join(kernel.name())
}

/// Boot, run, return the command's exit status.
pub fn run(args: &VmArgs) -> Result<i32> {
    let release = args.kernel.release()?;
    let out = out_dir(args.kernel);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let status_file = out.join("status");
    let root = crate::util::workspace_root();
    let load = if let Some(module) = args.module {
        let ko = kmod::build(module, args.kernel)?;
        format!(
            "insmod '{}' || {{ echo 'xtask vm: insmod {}' failed >&2; echo 97 > \"$GPREEMPT_VM_OUT/status\"; exit 97; }}\n",
            ko.display(),
            module.name()
        )
    } else if args.no_amdgpu {
        String::new()
    } else {
        "modprobe amdgpu || { echo 'xtask vm: modprobe amdgpu failed' >&2; echo 97 > \"$GPREEMPT_VM_OUT/status\"; exit 97; }\n"
            .to_owned()
    };
    // The kernel log, every level, goes to a file line by line (stdbuf: dmesg's stdio would
    // buffer a file; 9p without a cache: every write reaches the host at once), so a guest that
    // dies while the command runs leaves what it logged last; the console (level < 5, see
    // `boot`) keeps the oops or panic itself. The file is also the sign the command started.
    // Switch the perf_sched_events static key once, now, and keep it on (see
    // tests/src/bin/perf-key-holder.rs): the doorbell probe's per-process uprobes would otherwise
    // switch it while the tests run.
    let holder = target_dir().join("debug").join("perf-key-holder");
    let hold_key = if holder.exists() {
        format!("{} &\nsleep 1\n", shell_quote(&holder.display().to_string()))
    } else {
        String::new()
    };
    let script = format!(
        "#!/bin/bash\nexport GPREEMPT_VM_OUT='{out}' GPREEMPT_VM_KERNEL='{kernel}'\ncd '{root}'\n\
         stdbuf -oL dmesg --follow --time-format iso > \"$GPREEMPT_VM_OUT/{KERNEL_LOG}\" 2>&1 &\n{hold_key}\
         touch \"$GPREEMPT_VM_OUT/{STARTED}\"\n{audit_on}{load}\
         bash -c {command}\nrc=$?\n{audit_off}echo $rc > \"$GPREEMPT_VM_OUT/status\"\n",
        audit_on = if args.audit_text_pokes { crate::text_pokes::GUEST_START } else { "" },
        audit_off = if args.audit_text_pokes { crate::text_pokes::GUEST_STOP } else { "" },
        out = out.display(),
        kernel = args.kernel.name(),
        root = root.display(),
        command = shell_quote(&args.command.join(" ")),
    );
    let script_path = out.join("run.sh");
    fs::write(&script_path, script)?;

    let console = out.join(CONSOLE_LOG);
    let kernel_log = out.join(KERNEL_LOG);
    let started_file = out.join(STARTED);
    for attempt in 1..=BOOT_ATTEMPTS {
        for stale in [&status_file, &console, &kernel_log, &started_file] {
            let _ = fs::remove_file(stale);
        }
        eprintln!("xtask vm: booting {release} (software emulation, ~20-40 s)…");
        let vng_status = boot(args, &out, &script_path, &console)?;
        if let Ok(text) = fs::read_to_string(&status_file) {
            return text.trim().parse().with_context(|| format!("bad status file {}", status_file.display()));
        }
        // The marker is written after the kernel log started and the perf key holder switched
        // its key, before the driver loads and the command runs: without it the guest died
        // before anything of the project ran, so booting again is safe and hides no failure of
        // the project. The 7.3 guest does so now and then under software emulation: an
        // `Oops: int3` ~2 s into boot while the kernel patches its code for the
        // sched_clock-stable static key; a 6.12 guest did once on `__schedule`'s int3 while the
        // holder's perf_event_open switched perf_sched_events (the console keeps the oops).
        let started = started_file.exists();
        if !started && attempt < BOOT_ATTEMPTS {
            let cause = fs::read_to_string(&console).ok().and_then(|text| death_cause(&text));
            eprintln!(
                "xtask vm: the {release} guest died before the command started ({vng_status}){}; its console \
                 ({}):\n{}\nxtask vm: booting again ({} of {BOOT_ATTEMPTS})",
                cause.map(|c| format!(": {c}")).unwrap_or_default(),
                console.display(),
                log_tail(&console, 30),
                attempt + 1
            );
            continue;
        }
        let cause = fs::read_to_string(&console).ok().and_then(|text| death_cause(&text));
        bail!(
            "the {release} VM ended ({vng_status}) without the command's exit status: the guest {}{}; the end of \
             its console ({}):\n{}\nthe end of its kernel log ({}):\n{}",
            if started { "crashed while the command ran" } else { "failed to boot, every time" },
            cause.map(|c| format!("\nxtask vm: cause seen in the console: {c}")).unwrap_or_default(),
            console.display(),
            log_tail(&console, 40),
            kernel_log.display(),
            log_tail(&kernel_log, 20)
        );
    }
    unreachable!("the loop returns or fails on its last attempt")
}

/// The guest kernel's command line (see `boot` for why each setting is there).
pub const GUEST_CMDLINE: &str = "console=hvc0 loglevel=5 cgroup.memory=nokmem,nosocket tsc=reliable";

/// Boots a guest before the command starts fail at most this often in a row before `run` gives up.
const BOOT_ATTEMPTS: u32 = 3;

/// One boot: virtme-ng runs `script` in the guest; its exit status says nothing (virtme-ng's
/// `python3 -m virtme_ng.run` drops the guest's status and exits 0), the status file does.
fn boot(
    args: &VmArgs,
    out: &std::path::Path,
    script: &std::path::Path,
    console: &std::path::Path,
) -> Result<ExitStatus> {
    let release = args.kernel.release()?;
    let mut child = Command::new("python3")
        .args(["-m", "virtme_ng.run", "--run"])
        .arg(args.kernel.image())
        .args(["--disable-kvm", "--force-9p", "--cpus", &args.cpus.to_string(), "--memory", &args.memory, "--rwdir"])
        .arg(out)
        // The kernel console, into a file: virtme-ng sends it to /dev/null unless --verbose,
        // which would mix it into the command's stderr. A virtio console (hvc0), not a second
        // serial port: the 8250 driver registers one console for all its ports. Level < 5
        // (warnings and worse: oopses, panics) keeps it short.
        //
        // cgroup.memory=nokmem: the first memory cgroup (a test's podman container) otherwise
        // enables memcg_kmem_online_key (mm/memcontrol.c memcg_online_kmem), which live-patches
        // every slab allocation site; under software emulation a patched site was seen to trap
        // on its left-over int3 ("Oops: int3" in kmem_cache_alloc_noprof during cgroup_mkdir,
        // 6.12, twice), killing the guest. nosocket likewise keeps memcg_sockets_enabled_key
        // (taken with the first memory cgroup) from patching the socket paths. Kernel-memory and
        // socket-memory accounting are not what the tests look at.
        //
        // tsc=reliable: the clocksource watchdog compares the TSC with the HPET every half
        // second; under software emulation two emulated clocks read by vCPUs the host deschedules
        // drift apart (680 µs over 511 ms was seen), the watchdog marks the TSC unstable, and
        // `tsc_cs_mark_unstable` (arch/x86/kernel/tsc.c, Linux 6.12) calls
        // `clear_sched_clock_stable`, whose work item disables the `__sched_clock_stable` static
        // key (kernel/sched/clock.c) at run time: the live patch of every `sched_clock_cpu` site
        // left an int3 another vCPU hit ("Oops: int3" at sched_clock_cpu+0x9, 6.12, the demo on
        // a fresh machine). `tsc=reliable` sets `tsc_clocksource_reliable`, which clears
        // CLOCK_SOURCE_MUST_VERIFY on the TSC clocksources, so the watchdog never looks at it
        // and the key never flips after boot. Harmless to the tests: they read CLOCK_MONOTONIC
        // for orders, counts and generously bounded durations, and the TSC stays the clocksource
        // either way (the guest's clock against the host's is measured by the bench). It does
        // not stop the key's switch at boot (`sched_clock_init_late`): the boot retry in `run`
        // stays for that.
        .args(["--append", GUEST_CMDLINE])
        .arg(format!(
            "--qemu-opts=-chardev file,id=klog,path={} -device virtio-serial-pci,id=klogbus \
             -device virtconsole,chardev=klog,bus=klogbus.0",
            console.display()
        ))
        .arg("--exec")
        .arg(format!("bash {}", script.display()))
        .stdin(Stdio::null())
        // Piped, not inherited: virtme reopens /dev/stdout, which would truncate a log file
        // the caller redirected our output to.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("cannot start virtme-ng: run `cargo xtask setup`")?;
    let relays = [
        child.stdout.take().map(|from| thread::spawn(move || relay(from, std::io::stdout()))),
        child.stderr.take().map(|from| thread::spawn(move || relay(from, std::io::stderr()))),
    ];

    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            // The whole group: vng, qemu and anything they started.
            // SAFETY: plain kill(2) on our own child's process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            bail!("the {release} VM did not finish within {} s and was killed (a hung guest?)", args.timeout);
        }
        thread::sleep(Duration::from_millis(200));
    };
    for relay in relays.into_iter().flatten() {
        let _ = relay.join();
    }
    Ok(status)
}

/// The guest's kernel console (hvc0), written by qemu: what the guest said before it died.
const CONSOLE_LOG: &str = "console.log";

/// The guest's kernel log, written by `dmesg --follow` in the guest as it comes.
const KERNEL_LOG: &str = "kernel.log";
/// Written by the guest script once the kernel log and the perf key holder run, before the
/// driver loads: the command may have started.
const STARTED: &str = "started";

/// The last `n` lines of `path`, or why there are none.
fn log_tail(path: &std::path::Path, n: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(none: {e})"),
    }
}

/// Why a guest died, in one line, from what its console kept: an int3 oops at a site the kernel
/// live-patched (a static key or alternative flipped while vCPUs ran: an artefact of software
/// emulation, docs/toolchain.md "Kernel text patches"), an int3 oops at a probed KFD site (our
/// kprobes: a bug of ours to fix), any other oops, a hung task, a stall, a panic.
pub fn death_cause(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let find = |needle: &str| lines.iter().position(|l| l.contains(needle));
    // The faulting instruction of the first oops: `RIP: 0010:sched_clock_cpu+0x9/0x1b0`, with
    // ` [module]` after it when the site is in a module.
    let rip_after = |from: usize| {
        lines[from..].iter().find_map(|l| {
            let at = l.find("RIP: ")?;
            let rest = l[at + 5..].trim();
            Some(rest.split_once(':').map_or(rest, |(_, site)| site).trim().to_owned())
        })
    };
    if let Some(i) = find("Oops: int3") {
        let site = rip_after(i).unwrap_or_else(|| "an unknown site".into());
        let symbol = site.split(['+', ' ']).next().unwrap_or_default();
        let ours = symbol.starts_with("kfd_") || site.contains("[amdgpu]") || site.contains("[kfd_emu]");
        return Some(if ours {
            format!(
                "an int3 oops at {site}, a probed KFD site: gpreempt's own kprobe breakpoint was hit after it was \
                 removed or while it was being placed (a bug of ours to fix)"
            )
        } else {
            format!(
                "an int3 oops at {site}, a site the kernel live-patched (a static key or alternative switched \
                 while the guest ran): an artefact of software emulation, not of the code under test"
            )
        });
    }
    if let Some(i) = lines.iter().position(|l| l.contains("Oops:") || l.contains("BUG: kernel NULL pointer")) {
        let what = lines[i].trim();
        let site = rip_after(i).map(|s| format!(" at {s}")).unwrap_or_default();
        return Some(format!("a kernel oops{site} ({what})"));
    }
    if let Some(i) = find("blocked for more than") {
        return Some(format!("a hung task ({})", lines[i].trim()));
    }
    if let Some(i) = lines.iter().position(|l| l.contains("soft lockup") || l.contains("rcu_sched detected stalls")) {
        return Some(format!("a CPU stall ({})", lines[i].trim()));
    }
    if let Some(i) = find("Kernel panic - not syncing") {
        return Some(format!("a kernel panic ({})", lines[i].trim()));
    }
    None
}

/// Copy the guest console to our own output as it comes.
fn relay(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            break;
        }
    }
}

/// Single-quote for bash.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tail_is_the_last_lines_or_why_there_are_none() {
        let dir = std::env::temp_dir().join(format!("xtask-vm-tail-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join(KERNEL_LOG);
        fs::write(&log, "a\nb\nc\n").unwrap();
        assert_eq!(log_tail(&log, 2), "b\nc");
        assert_eq!(log_tail(&log, 10), "a\nb\nc");
        assert!(log_tail(&dir.join("missing"), 2).starts_with("(none: "));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dead_guests_console_names_its_cause_in_one_line() {
        // The 6.12 demo's console on a fresh machine (issue: the first command never crashes).
        let static_key = "clocksource: timekeeping watchdog on CPU0: Marking clocksource 'tsc' as unstable\n\
            sched_clock: TSC found unstable after boot, most likely due to broken BIOS. Use 'tsc=unstable'.\n\
            Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
            CPU: 1 UID: 0 PID: 0 Comm: swapper/1 Not tainted 6.12.57+deb13-amd64 #1\n\
            RIP: 0010:sched_clock_cpu+0x9/0x1b0\n\
            Kernel panic - not syncing: Fatal exception in interrupt\n";
        assert_eq!(
            death_cause(static_key).unwrap(),
            "an int3 oops at sched_clock_cpu+0x9/0x1b0, a site the kernel live-patched (a static key or alternative \
             switched while the guest ran): an artefact of software emulation, not of the code under test"
        );
        let ours = "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\nRIP: 0010:kfd_ioctl_create_queue+0x1/0x2b0 [amdgpu]\n";
        assert!(
            death_cause(ours).unwrap().starts_with(
                "an int3 oops at kfd_ioctl_create_queue+0x1/0x2b0 [amdgpu], a probed KFD site: gpreempt's own"
            ),
            "{:?}",
            death_cause(ours)
        );
        let null = "BUG: kernel NULL pointer dereference, address: 0000000000000008\n\
            Oops: 0000 [#1] PREEMPT SMP NOPTI\nRIP: 0010:emu_cp_start+0x44/0x300 [kfd_emu]\n";
        assert_eq!(
            death_cause(null).unwrap(),
            "a kernel oops at emu_cp_start+0x44/0x300 [kfd_emu] (BUG: kernel NULL pointer dereference, address: \
             0000000000000008)"
        );
        let hung = "INFO: task podman:812 blocked for more than 122 seconds.\nKernel panic - not syncing: hung_task\n";
        assert_eq!(
            death_cause(hung).unwrap(),
            "a hung task (INFO: task podman:812 blocked for more than 122 seconds.)"
        );
        assert_eq!(
            death_cause("Kernel panic - not syncing: VFS: Unable to mount root fs\n").unwrap(),
            "a kernel panic (Kernel panic - not syncing: VFS: Unable to mount root fs)"
        );
        assert_eq!(death_cause("[    1.0] virtme-init: ok\n"), None);
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("echo 'hi' there"), r"'echo '\''hi'\'' there'");
    }
}
