//! A real containerd in the test VM, and the CRI calls a kubelet makes to run a pod on it.
//!
//! `cargo xtask setup` unpacks Debian forky's containerd 2.x and bookworm's runc beside the
//! kernels (xtask/src/containerd.rs). The VM shares the host's root read-only, so containerd's
//! root goes on a tmpfs; its state is `/run/containerd` (the guest's `/run` is a tmpfs), where
//! gpreempt looks for its socket and its task records as on a node. The kubelet's pod
//! directories (`/var/lib/kubelet/pods/<uid>`, created by the kubelet before it asks for the
//! sandbox) get a tmpfs too. A pause image needs no registry: a static `pause` built here, in an
//! image built `FROM scratch` with podman and imported with `ctr`. Everything is undone when the
//! [`Containerd`] guard is dropped, on every path including a panic.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpreempt::host::cri::{CriClient, messages::*};

/// Where the guest's containerd listens: the kubelet's default, which gpreempt finds unasked.
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// containerd's state: task bundles under `io.containerd.runtime.v2.task/k8s.io/<id>`.
pub const STATE: &str = "/run/containerd";
/// The kubelet's pod directories (gpreempt's proof that a pod is on this node).
pub const KUBELET_PODS: &str = "/var/lib/kubelet/pods";
/// The sandbox image, imported under the name containerd's config pins.
pub const PAUSE_IMAGE: &str = "localhost/pause:3.10";

/// How long the kubelet's calls may take: the kubelet's own `--runtime-request-timeout`
/// default (2 min; kubelet configuration `runtimeRequestTimeout`). Starting a sandbox under
/// software emulation takes seconds, beyond gpreempt's 2 s for its lookups.
pub const KUBELET_TIMEOUT: Duration = Duration::from_secs(120);

/// `~/.local/share/gpreempt/containerd` (xtask/src/containerd.rs).
pub fn unpacked() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".local/share/gpreempt/containerd")
}

/// Why containerd cannot run here, if it cannot (for a reported skip).
pub fn unavailable() -> Option<String> {
    let root = unpacked();
    if !root.join("usr/bin/containerd").exists() || !root.join("usr/sbin/runc").exists() {
        return Some(format!("no containerd under {}: run `cargo xtask setup`", root.display()));
    }
    if !Path::new(KUBELET_PODS).is_dir() {
        return Some(format!("{KUBELET_PODS} does not exist on the host: run `cargo xtask setup`"));
    }
    None
}

/// A running containerd; killed, its pods' processes with it, and its mounts removed on drop.
pub struct Containerd {
    child: Child,
    mounts: Vec<PathBuf>,
    pub client: CriClient,
    pods: Vec<String>,
}

fn mount_tmpfs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1g", "tmpfs"]).arg(dir).status()?;
    if !ok.success() {
        bail!("cannot mount a tmpfs on {}", dir.display());
    }
    Ok(())
}

fn run(command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Containerd {
    /// Start containerd with a configuration of its own, under `scratch`.
    pub fn start(scratch: &Path) -> Result<Self> {
        let bin = unpacked().join("usr/bin");
        let root = scratch.join("containerd-root");
        let mut guard = Guard { mounts: Vec::new() };
        for dir in [root.as_path(), Path::new(STATE), Path::new(KUBELET_PODS)] {
            mount_tmpfs(dir)?;
            guard.mounts.push(dir.to_owned());
        }
        let config = scratch.join("containerd.toml");
        let cni = cni_config(scratch)?;
        // containerd 2.x's configuration version 3: the CRI plugins' names are
        // io.containerd.cri.v1.{runtime,images}; cgroupfs driver (SystemdCgroup false: the VM
        // has no systemd), the native snapshotter (overlayfs needs no upper on a tmpfs, but the
        // native one needs nothing at all); the CNI plugins from Debian's
        // containernetworking-plugins in /usr/lib/cni (Debian's containerd looks there by
        // default), their configuration here.
        std::fs::write(
            &config,
            format!(
                "version = 3\nroot = \"{root}\"\nstate = \"{STATE}\"\n[grpc]\n  address = \"{SOCKET}\"\n\
                 [plugins.'io.containerd.cri.v1.images']\n  snapshotter = \"native\"\n\
                 [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"{PAUSE_IMAGE}\"\n\
                 [plugins.'io.containerd.cri.v1.runtime'.cni]\n  conf_dir = \"{cni}\"\n\
                 [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
                 [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  BinaryName = \"{runc}\"\n",
                root = root.display(),
                cni = cni.display(),
                runc = unpacked().join("usr/sbin/runc").display(),
            ),
        )?;
        let log = std::fs::File::create(scratch.join("containerd.log"))?;
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let child = Command::new(bin.join("containerd"))
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .context("starting containerd")?;
        let mut mounts = std::mem::take(&mut guard.mounts);
        // From here on the Containerd's own drop undoes everything.
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            match CriClient::connect_path(Path::new(SOCKET), KUBELET_TIMEOUT).and_then(|mut c| c.version().map(|_| c)) {
                Ok(c) => break Some(c),
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
                Err(_) => break None,
            }
        };
        let Some(client) = client else {
            let mut dead = Dead { child, mounts: std::mem::take(&mut mounts) };
            dead.undo();
            bail!(
                "containerd did not answer on {SOCKET} within 30 s: see {}",
                scratch.join("containerd.log").display()
            );
        };
        Ok(Self { child, mounts, client, pods: Vec::new() })
    }

    /// `ctr -n k8s.io images import ARCHIVE` (an OCI archive `podman save` wrote).
    pub fn import(&self, archive: &Path) -> Result<()> {
        run(Command::new(unpacked().join("usr/bin/ctr"))
            .args(["--address", SOCKET, "-n", "k8s.io", "images", "import"])
            .arg(archive))
        .map(drop)
    }

    /// What the kubelet does for a new pod: its directory, then RunPodSandbox with the pod's
    /// metadata, labels and annotations, on the host network, the pod's cgroup under
    /// `kubepods/besteffort` (cgroupfs driver).
    pub fn run_pod(&mut self, namespace: &str, name: &str, uid: &str, labels: &[(&str, &str)]) -> Result<Pod> {
        let host_network = NamespaceOption {
            network: NamespaceMode::Node as i32,
            pid: NamespaceMode::Pod as i32,
            ipc: NamespaceMode::Pod as i32,
        };
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            // A host-network pod has no UTS namespace of its own: the kubelet leaves the hostname empty.
            hostname: String::new(),
            log_directory: format!("{KUBELET_PODS}/{uid}/logs"),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            annotations: HashMap::from([("kubernetes.io/config.source".to_owned(), "api".to_owned())]),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network),
                    privileged: false,
                }),
            }),
        };
        self.run_sandbox(config)
    }

    /// The pod's directory under the kubelet's (created before the sandbox, as the kubelet
    /// does), then RunPodSandbox with `config`.
    pub fn run_sandbox(&mut self, config: PodSandboxConfig) -> Result<Pod> {
        let uid = config.metadata.as_ref().map(|m| m.uid.clone()).unwrap_or_default();
        std::fs::create_dir_all(Path::new(KUBELET_PODS).join(&uid))?;
        let id = self
            .client
            .call(&RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })?
            .pod_sandbox_id;
        self.pods.push(id.clone());
        Ok(Pod { id, config })
    }

    /// CreateContainer then StartContainer: `command` from `image` in `pod`, with /dev/kfd and
    /// a stdin kept open.
    pub fn start_container(&mut self, pod: &Pod, name: &str, image: &str, command: &[&str]) -> Result<String> {
        self.start_container_with(pod, name, image, command, Vec::new())
    }

    /// [`Containerd::start_container`] with the kubelet's bind mounts of the pod's volumes.
    pub fn start_container_with(
        &mut self,
        pod: &Pod,
        name: &str,
        image: &str,
        command: &[&str],
        mounts: Vec<Mount>,
    ) -> Result<String> {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata { name: name.into(), attempt: 0 }),
            image: Some(ImageSpec { image: image.into() }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            mounts,
            devices: vec![Device {
                container_path: "/dev/kfd".into(),
                host_path: "/dev/kfd".into(),
                permissions: "rwm".into(),
            }],
            log_path: format!("{name}.log"),
            stdin: true,
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: pod.namespace_options(),
                    ..LinuxContainerSecurityContext::default()
                }),
                ..LinuxContainerConfig::default()
            }),
            ..ContainerConfig::default()
        };
        self.create_and_start(pod, config)
    }

    /// CreateContainer with `config` in `pod`, then StartContainer: the container's id.
    pub fn create_and_start(&mut self, pod: &Pod, config: ContainerConfig) -> Result<String> {
        let id = self
            .client
            .call(&CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            })?
            .container_id;
        self.client.call(&StartContainerRequest { container_id: id.clone() })?;
        Ok(id)
    }

    /// StopContainer as the kubelet ends a container: SIGTERM, SIGKILL after `grace_s` seconds.
    pub fn stop_container(&mut self, id: &str, grace_s: i64) -> Result<()> {
        self.client.call(&StopContainerRequest { container_id: id.into(), timeout: grace_s })?;
        Ok(())
    }

    /// The pod's IP on its own network (none on the host network).
    pub fn pod_ip(&mut self, pod: &Pod) -> Result<String> {
        let status = self.client.pod_status(&pod.id)?.context("the runtime does not know the pod")?;
        let ip = status.network.map(|n| n.ip).unwrap_or_default();
        if ip.is_empty() {
            bail!("pod {} has no IP", pod.id);
        }
        Ok(ip)
    }
}

/// A pod the test runs: what CreateContainer needs again.
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

impl Pod {
    /// The sandbox's namespaces, which its containers share.
    pub fn namespace_options(&self) -> Option<NamespaceOption> {
        self.config.linux.as_ref()?.security_context.as_ref()?.namespace_options.clone()
    }

    /// Where the runtime writes the output of the container whose `log_path` is `log_path`.
    pub fn log(&self, log_path: &str) -> PathBuf {
        Path::new(&self.config.log_directory).join(log_path)
    }
}

/// Mounts made before containerd runs, undone if starting fails half-way.
struct Guard {
    mounts: Vec<PathBuf>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("--lazy").arg(m).status();
        }
    }
}

/// A containerd that never answered.
struct Dead {
    child: Child,
    mounts: Vec<PathBuf>,
}

impl Dead {
    fn undo(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(Guard { mounts: std::mem::take(&mut self.mounts) });
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The kubelet's way out first (the shims end their containers), then containerd.
        for id in std::mem::take(&mut self.pods) {
            let _ = self.client.call(&StopPodSandboxRequest { pod_sandbox_id: id.clone() });
            let _ = self.client.call(&RemovePodSandboxRequest { pod_sandbox_id: id });
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A shim that outlived its containerd (a failed stop) would keep the mounts busy: each
        // wrote its pid beside its task's bundle.
        let tasks = Path::new(STATE).join("io.containerd.runtime.v2.task/k8s.io");
        for entry in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            let pid =
                std::fs::read_to_string(entry.path().join("shim.pid")).ok().and_then(|s| s.trim().parse::<i32>().ok());
            if let Some(pid) = pid.filter(|p| *p > 1) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        // The pods' bridge, which the CNI plugin leaves when the last pod goes.
        let _ = Command::new("ip").args(["link", "delete", "cni0"]).stderr(Stdio::null()).status();
        drop(Guard { mounts: std::mem::take(&mut self.mounts) });
    }
}

/// The image the tests' workload pods run: the emulator workload's podman image, under the name
/// it is imported as.
pub const WORKLOAD_IMAGE: &str = "localhost/emu-workload:latest";

/// containerd started under `scratch` with the pause image and, for each `(binary, name)`, the
/// project's podman image of `binary` (`gpreempt`, `emu-workload`) imported as `name`.
pub fn with_images(scratch: &Path, images: &[(&str, &str)]) -> Result<Containerd> {
    crate::podman::ready()?;
    let mut archives = vec![pause_archive(scratch)?];
    for (binary, name) in images {
        crate::podman::podman(&["tag", &crate::podman::image(binary), name])?;
        archives.push(save(name, &scratch.join(format!("{binary}.tar")))?);
    }
    let ctrd = Containerd::start(scratch)?;
    for archive in &archives {
        ctrd.import(archive)?;
    }
    Ok(ctrd)
}

/// The host pid of the process of container `id` whose comm is `comm`, once it has opened
/// /dev/kfd (KFD made its directory under /sys/class/kfd/kfd/proc).
pub fn kfd_pid_of(id: &str, comm: &str) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if cgroup.contains(id)
                && name.trim() == comm
                && Path::new(&format!("/sys/class/kfd/kfd/proc/{pid}")).exists()
            {
                return Ok(pid);
            }
        }
        if Instant::now() > deadline {
            bail!("no KFD process {comm} in container {id} after 60 s");
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// The subnet of the pods that are not on the host network.
pub const POD_SUBNET: &str = "10.244.0.0/24";

/// A CNI network as a node's simplest plugin setup gives it: the `bridge` plugin on `cni0` with
/// the node as the gateway (so the node reaches a pod's IP, as under every CNI), addresses from
/// `host-local` (its leases in `scratch`: the VM's /var/lib is read-only). No masquerade: the
/// pods talk to the node only. Returns the configuration directory.
fn cni_config(scratch: &Path) -> Result<PathBuf> {
    let dir = scratch.join("cni");
    std::fs::create_dir_all(&dir)?;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "gpreempt-test",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_SUBNET}]],
                "dataDir": scratch.join("cni-leases"),
            },
        }],
    });
    std::fs::write(dir.join("10-gpreempt-test.conflist"), serde_json::to_string_pretty(&conf)?)?;
    Ok(dir)
}

/// The static `pause` a sandbox runs, built with `cc -static`, in an image `FROM scratch`,
/// saved as an OCI archive for `ctr images import`.
pub fn pause_archive(scratch: &Path) -> Result<PathBuf> {
    let dir = scratch.join("pause");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("pause.c"),
        "#include <signal.h>\n#include <unistd.h>\nstatic void quit(int s) { (void)s; _exit(0); }\n\
         int main(void) { signal(SIGTERM, quit); signal(SIGINT, quit); for (;;) pause(); }\n",
    )?;
    run(Command::new("cc").args(["-static", "-Os", "-o"]).arg(dir.join("pause")).arg(dir.join("pause.c")))?;
    std::fs::write(dir.join("Containerfile"), "FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n")?;
    crate::podman::podman(&["build", "--pull=never", "--network=none", "--tag", PAUSE_IMAGE, path(&dir)?])?;
    save(PAUSE_IMAGE, &scratch.join("pause.tar"))
}

/// `podman save --format oci-archive IMAGE` into `archive`.
pub fn save(image: &str, archive: &Path) -> Result<PathBuf> {
    crate::podman::podman(&["save", "--format", "oci-archive", "--output", path(archive)?, image])?;
    Ok(archive.to_owned())
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("{} is not UTF-8", p.display()))
}
