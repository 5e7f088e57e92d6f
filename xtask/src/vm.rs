//! `cargo xtask vm`: boot a Debian kernel of the matrix (kernels.rs) with the real amdgpu driver
//! under virtme-ng and run a command in it as root. Kernels unpacked outside `/` (5.10, 7.x)
//! bring their modules along: virtme-ng finds them beside the image and mounts them in the guest.
//!
//! The host root is shared read-only (9p; no virtiofsd here), so the working tree and the build
//! outputs are visible at the same paths. Only `target/vm/<kernel>/` is writable: the guest
//! writes the command's exit status and its kernel log there (the console can be garbled by control sequences, so
//! nothing is parsed from it). Software emulation (`--disable-kvm`): nested KVM hangs at boot here.

use std::{
    fs,
    io::{Read, Write},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
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
    // The kernel log goes to a file as it is written (9p without a cache: every write reaches the
    // host at once), so a guest that dies (an oops, a panic: virtme-ng then exits 0 without the
    // status) leaves its last words behind; the console itself is not kept (see the header).
    let script = format!(
        "#!/bin/bash\nexport GPREEMPT_VM_OUT='{out}' GPREEMPT_VM_KERNEL='{kernel}'\ncd '{root}'\n\
         dmesg --follow --time-format iso > \"$GPREEMPT_VM_OUT/{KERNEL_LOG}\" 2>&1 &\n{load}\
         bash -c {command}\necho $? > \"$GPREEMPT_VM_OUT/status\"\n",
        out = out.display(),
        kernel = args.kernel.name(),
        root = root.display(),
        command = shell_quote(&args.command.join(" ")),
    );
    let script_path = out.join("run.sh");
    fs::write(&script_path, script)?;

    eprintln!("xtask vm: booting {release} (software emulation, ~20-40 s)…");
    let mut child = Command::new("python3")
        .args(["-m", "virtme_ng.run", "--run"])
        .arg(args.kernel.image())
        .args(["--disable-kvm", "--force-9p", "--cpus", &args.cpus.to_string(), "--memory", &args.memory, "--rwdir"])
        .arg(&out)
        .arg("--exec")
        .arg(format!("bash {}", script_path.display()))
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
    let vng_status = loop {
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
    match fs::read_to_string(&status_file) {
        Ok(text) => text.trim().parse().with_context(|| format!("bad status file {}", status_file.display())),
        Err(_) => bail!(
            "the {release} VM ended ({vng_status}) without the command's exit status: the guest crashed or failed to \
             boot; the end of its kernel log ({}):\n{}",
            out.join(KERNEL_LOG).display(),
            log_tail(&out.join(KERNEL_LOG), 40)
        ),
    }
}

/// The guest's kernel log, written by `dmesg --follow` in the guest as it comes.
const KERNEL_LOG: &str = "kernel.log";

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
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("echo 'hi' there"), r"'echo '\''hi'\'' there'");
    }
}
