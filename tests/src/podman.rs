//! Debian's podman in the test VM: storage on a tmpfs, the project's images built from
//! deploy/Containerfile, and emulator workloads running in named containers.
//!
//! The VM shares the host's root read-only; `/var/lib/containers` (podman's graphroot as root,
//! created on the host by `cargo xtask setup`) gets a tmpfs, `/run` already is one. The build
//! contexts are assembled on the host by `cargo xtask test` (`target/vm-images/<binary>`: the
//! debug binary and the shared objects `ldd` names, as `cargo xtask image` does for the release
//! one) and built here with `podman build --pull=never --network=none`: no registry.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::OnceLock,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Podman's graphroot as root; containers/storage records container names under it.
pub const GRAPHROOT: &str = "/var/lib/containers";

/// `podman ARGS`: its stdout, or an error with its stderr.
pub fn podman(args: &[&str]) -> Result<String> {
    let out = Command::new("podman").args(args).output().context("running podman (cargo xtask setup installs it)")?;
    if !out.status.success() {
        bail!("podman {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The image of `binary` (`gpreempt` → `gpreempt:latest`).
pub fn image(binary: &str) -> String {
    format!("{binary}:latest")
}

/// Storage on a tmpfs and the images of `gpreempt` and `emu-workload`, once per test binary.
pub fn ready() -> Result<()> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY.get_or_init(|| prepare().map_err(|e| format!("{e:#}"))).clone().map_err(anyhow::Error::msg)
}

fn prepare() -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    if !mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(GRAPHROOT)) {
        if !Path::new(GRAPHROOT).is_dir() {
            bail!("{GRAPHROOT} does not exist on the host: run `cargo xtask setup`");
        }
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1g", "tmpfs", GRAPHROOT]).status()?;
        if !ok.success() {
            bail!("cannot mount a tmpfs on {GRAPHROOT}");
        }
    }
    let containerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/Containerfile");
    for binary in ["gpreempt", "emu-workload"] {
        let context = context(binary)?;
        podman(&[
            "build",
            "--pull=never",
            "--network=none",
            "--file",
            path_str(&containerfile)?,
            "--tag",
            &image(binary),
            path_str(&context)?,
        ])?;
    }
    Ok(())
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}

/// `target/vm-images`, where `cargo xtask test` prepares what the guest cannot make itself.
pub fn vm_images() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe.ancestors().nth(3).context("test binary is not in target/<profile>/deps")?;
    Ok(target.join("vm-images"))
}

/// `target/vm-images/<binary>`, assembled by `cargo xtask test`.
fn context(binary: &str) -> Result<PathBuf> {
    let dir = vm_images()?.join(binary);
    if !dir.join("rootfs/usr/bin").join(binary).exists() {
        bail!("{} has no build context: run the test through `cargo xtask test`, which assembles it", dir.display());
    }
    Ok(dir)
}

/// The host pid of `name`'s first process and its full id (`podman inspect`).
pub fn inspect(name: &str) -> Result<(u32, String)> {
    let text = podman(&["inspect", "--format", "{{.State.Pid}} {{.Id}}", name])?;
    let (pid, id) = text.trim().split_once(' ').with_context(|| format!("podman inspect {name}: {text:?}"))?;
    Ok((pid.parse().with_context(|| format!("pid {pid:?}"))?, id.to_owned()))
}

/// The host pid of the process that is `ns_pid` inside container `id` (its cgroup is the
/// container's and the last `NSpid:` value is `ns_pid`).
pub fn host_pid(id: &str, ns_pid: u64) -> Result<u32> {
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let (Ok(status), Ok(cgroup)) = (
            std::fs::read_to_string(format!("/proc/{pid}/status")),
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")),
        ) else {
            continue;
        };
        if cgroup.contains(&format!("libpod-{id}"))
            && gpreempt::host::procinfo::ns_pid(&status) == Some(ns_pid as u32)
            && pid != ns_pid as u32
        {
            return Ok(pid);
        }
    }
    bail!("no process {ns_pid} in container {id}")
}

/// An `emu-workload` in a container, driven line by line through `podman run -i` / `exec -i`
/// like [`crate::LineHelper`]; removed (`podman rm -f`) on drop when it owns the container.
pub struct Workload {
    pub name: String,
    /// Its host pid (KFD's name for it).
    pub pid: u32,
    pub container_id: String,
    pub hello: Value,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    owns_container: bool,
}

impl Workload {
    /// `emu-workload ARGS` as the first process of a new container `name`, with /dev/kfd.
    pub fn run(name: &str, args: &[&str]) -> Result<Self> {
        ready()?;
        let _ = podman(&["rm", "--force", "--time", "0", name]);
        let mut command = Command::new("podman");
        command
            .args(["run", "-i", "--rm", "--name", name, "--network", "none", "--device", "/dev/kfd"])
            .args(["--entrypoint", "/usr/bin/emu-workload", &image("emu-workload")])
            .args(args);
        let mut w = Self::spawn(name, command, true)?;
        let (pid, id) = inspect(name)?;
        w.pid = pid;
        w.container_id = id;
        assert_eq!(w.hello["pid"], 1, "the container's first process: {}", w.hello);
        Ok(w)
    }

    /// `emu-workload ARGS` started later in the running container `name` (`podman exec`).
    pub fn exec(name: &str, args: &[&str]) -> Result<Self> {
        let mut command = Command::new("podman");
        command.args(["exec", "-i", name, "/usr/bin/emu-workload"]).args(args);
        let mut w = Self::spawn(name, command, false)?;
        let (_, id) = inspect(name)?;
        let ns_pid = w.hello["pid"].as_u64().context("no pid in the hello line")?;
        w.pid = host_pid(&id, ns_pid)?;
        w.container_id = id;
        Ok(w)
    }

    fn spawn(name: &str, mut command: Command, owns_container: bool) -> Result<Self> {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().context("podman")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut w = Self {
            name: name.to_owned(),
            pid: 0,
            container_id: String::new(),
            hello: Value::Null,
            child,
            stdin,
            stdout,
            owns_container,
        };
        w.hello = w.recv().with_context(|| format!("emu-workload in {name} did not start"))?;
        Ok(w)
    }

    pub fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the workload in {} closed its output", self.name);
        }
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))
    }

    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The sum of its queues' read indices.
    pub fn rptr(&mut self) -> Result<u64> {
        self.send("rptr")?;
        let reply = self.recv()?;
        Ok(reply["rptr"].as_array().context("no rptr")?.iter().filter_map(Value::as_u64).sum())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.owns_container {
            let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
