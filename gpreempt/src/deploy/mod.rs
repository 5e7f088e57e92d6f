//! The agent's contract with whatever deploys it: what it needs from its host ([`AGENT_NEEDS`],
//! which `gpreempt doctor` reports and gpreempt/tests/deploy.rs checks the files of `deploy/`
//! against) and the series it serves ([`series`], which `metrics` registers and `gpreempt top`
//! and the dashboard in `deploy/` read). A leaf: the agent, `metrics`, `doctor` and `views` all
//! sit above it.

pub mod series;

use serde::Serialize;

/// One thing a deployment grants the agent, and why the agent needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Need {
    pub name: &'static str,
    pub why: &'static str,
    /// Absent on hosts that do not use it (another container runtime, no Kubernetes): mounted
    /// when present, not required.
    pub optional: bool,
}

/// What `gpreempt agent` needs from its host, and nothing more: the one list the deployment
/// files (deploy/gpreempt-agent.service, deploy/kubernetes/) are checked against
/// (gpreempt/tests/deploy.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AgentNeeds {
    pub capabilities: &'static [Need],
    /// Host paths read (hostPath mounts in a container; read-only).
    pub paths: &'static [Need],
    /// Device nodes opened read-write.
    pub devices: &'static [Need],
}

const fn need(name: &'static str, why: &'static str) -> Need {
    Need { name, why, optional: false }
}

const fn optional(name: &'static str, why: &'static str) -> Need {
    Need { name, why, optional: true }
}

pub const AGENT_NEEDS: AgentNeeds = AgentNeeds {
    capabilities: &[
        need("CAP_BPF", "load the eBPF programs and create their maps"),
        need("CAP_PERFMON", "attach kprobes through the kprobe PMU and read kernel memory from the programs"),
        need("CAP_SYSLOG", "read the KFD functions' addresses in /proc/kallsyms (kptr_restrict hides them)"),
        need("CAP_SYS_PTRACE", "policies: attach the debug trap to offline processes (docs/kfd.md §2.1)"),
        // schedule/realtime.rs: pthread_setschedparam(SCHED_FIFO) and mlockall answer EPERM
        // without them, and the reaction thread then runs unprotected (said once in the log).
        need(
            "CAP_SYS_NICE",
            "policies: SCHED_FIFO priority for the scheduler's reaction thread (rt_priority), so CPU load does not delay a suspend",
        ),
        need("CAP_IPC_LOCK", "policies: mlockall, so no page fault stalls a step of the reaction thread"),
    ],
    paths: &[
        need("/sys/kernel/btf", "vmlinux and amdgpu BTF: the probes' struct offsets"),
        need("/sys/class/kfd", "the KFD processes and queues that exist when the agent starts"),
        need("/sys/devices/virtual/kfd", "where /sys/class/kfd's links point"),
        optional("/var/lib/kubelet/pods", "a pod's presence on this node"),
        optional(
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
            "containerd: a container's pod name and namespace",
        ),
        optional("/run/containers/storage/overlay-containers", "CRI-O: a container's pod name and namespace"),
        optional("/var/lib/containers/storage/overlay-containers", "Podman: a container's name (containers.json)"),
        optional("/var/lib/docker/containers", "Docker (cri-dockerd): a container's pod name and namespace"),
        // The sockets' directories, not the sockets: a hostPath socket that is absent would be
        // created as a directory. connect(2) needs no write access to the mount (the kernel
        // checks write permission on the socket inode only, and a read-only mount refuses writes
        // to files, directories and links, not sockets: fs/namei.c sb_permission).
        optional("/run/containerd", "containerd's CRI socket (containerd.sock): the pods of pod-label: selectors"),
        optional("/var/run/crio", "CRI-O's CRI socket (crio.sock): the pods of pod-label: selectors"),
    ],
    devices: &[
        need("/dev/kfd", "policies: the debug-trap ioctls on offline processes"),
        optional(
            "/dev/cpu_dma_latency",
            "policies: the CPU wake latency request (cpu_wake_latency), so an idle CPU wakes the reaction thread at once",
        ),
    ],
};
