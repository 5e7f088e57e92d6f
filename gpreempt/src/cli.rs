//! Command-line definitions (clap derive). Each subcommand's `run` is in `commands/`.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gpreempt",
    version,
    about = "See and control the compute queues of AMD GPUs through the stock KFD driver",
    long_about = "gpreempt traces the KFD queue paths of the amdgpu driver with eBPF (queue creation \
and destruction, with the exact ioctl arguments and results) and, on kernels with the KFD debug-trap \
API, suspends and resumes another process's GPU queues.\n\nTracing needs root and the amdgpu module \
loaded; it works on any kernel with kprobes, with or without an AMD GPU."
)]
pub struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn", env = "GPREEMPT_LOG")]
    pub log: log::LevelFilter,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Trace KFD queue events live, one line per event (root).
    ///
    /// Attaches kprobes/kretprobes to the KFD paths of amdgpu.ko: queue create/destroy/update with
    /// their exact arguments and results, process open and exit, evictions and restores, debug-trap
    /// suspend/resume with the HWS unmap / fence wait / remap breakdown (and the other processes'
    /// queues a device-wide unmap preempted), MES, and GPU resets. Keeps a live PID → queue map
    /// (printed on SIGUSR1, every --map-interval and at exit). Ctrl-C (or SIGTERM/SIGHUP) ends the
    /// trace with a summary: queues and churn per process, evictions, suspend/resume latency
    /// percentiles, and every dropped record.
    Trace(TraceArgs),
    /// Check this host for everything gpreempt needs, and say what to do about each gap.
    ///
    /// Kernel and KFD ioctl version, debug-trap availability, the module that provides KFD and its
    /// BTF, every tracer probe (found or missing, and why), debugfs, Yama ptrace_scope, the
    /// caller's capabilities, and the amdgpu parameters that matter for preemption. Exits 1 when a
    /// check fails.
    Doctor(DoctorArgs),
    /// Compare queue ids across recorded runs (`gpreempt trace --json` output, one file per run).
    ///
    /// Per run: the queue ids each process created, per GPU, in creation order. Across runs of the
    /// same command: identical ids, the same count with different ids, or a different count.
    /// Within a run: concurrently running processes that were handed the same ids.
    Analyze(AnalyzeArgs),
    /// List every process that uses KFD now, with its queues per GPU.
    ///
    /// Host pid, container (Docker, containerd, Podman, CRI-O, Kubernetes, LXC; from cgroup paths,
    /// no container CLI needed), pid inside the container, command, and per GPU: queue ids and
    /// types, VRAM, evicted_ms and cu_occupancy, from /sys/class/kfd/kfd/proc. `--hw` adds the
    /// hardware view from debugfs (MQDs and active HQD slots) and a consistency check per GPU.
    Ps(PsArgs),
    /// Show one process's GPU queues, without disturbing the GPU.
    ///
    /// By default reads sysfs (/sys/class/kfd/kfd/proc/PID/queues: queue id, gpu, type, ring
    /// size): no ptrace, no ioctl, nothing the GPU notices. `--debug-snapshot` adds addresses, CWSR
    /// and exception bits from the KFD debug-trap API (KFD ≥ 1.13, root), at a price: its debug
    /// ENABLE and DISABLE each preempt every queue on the GPU (two device-wide preemptions). `--watch`
    /// samples repeatedly and ends with statistics; while it watches, the tracer (when it can attach)
    /// adds the ring/index/CWSR addresses, priority, doorbell and creation time of the queues created
    /// meanwhile, without any debug-trap call (see --no-trace).
    Queues(QueuesArgs),
    /// Suspend and resume another process's GPU queues in a loop and measure it (root).
    ///
    /// Per iteration: SUSPEND_QUEUES, hold, RESUME_QUEUES, gap. The target keeps running on the
    /// CPU and receives its signals as usual; its queues are resumed on every way out (end,
    /// error, Ctrl-C/SIGTERM/SIGHUP, panic; if gpreempt is killed, the kernel resumes them).
    /// Prints per-iteration progress on a terminal, then success rate, latency percentiles
    /// (p50/p90/p99/max/mean/stddev) and a histogram. On HWS GPUs (MI200/MI300) every suspend and
    /// resume briefly preempts every process's queues on the GPU, not only the target's.
    Preempt(PreemptArgs),
    /// Run as a node daemon: trace continuously and serve Prometheus metrics (root).
    ///
    /// Serves `/metrics` (OpenMetrics) and `/healthz` on --metrics-addr: queues per process and
    /// GPU by type and state, creates and destroys, evictions by trigger, debug-trap suspends and
    /// their in-driver breakdown, collateral preemptions, tracer losses, labelled with the pod,
    /// namespace and container when the process runs in a Kubernetes pod. Memory stays bounded:
    /// an exited process's series leave after the config's grace period. Logs key=value lines to
    /// stderr. SIGHUP reloads --config (an invalid file is rejected and the old one kept);
    /// SIGTERM or Ctrl-C exits cleanly.
    Agent(AgentArgs),
    /// Suspend the offline processes' GPU queues while the online processes have work (root).
    ///
    /// Attaches once to each offline process (debug-trap ENABLE: one runlist refresh) and keeps
    /// it attached; watches the online processes' AQL dispatch indices (process_vm_readv) and
    /// cu_occupancy without attaching to them (an online process that already has queues costs
    /// one snapshot at start: ENABLE, GET_QUEUE_SNAPSHOT, DISABLE, two runlist refreshes).
    /// Processes that open /dev/kfd later are picked up by their selector. Runs until Ctrl-C or
    /// SIGTERM, then resumes and detaches everything and prints a summary. On HWS GPUs
    /// (MI200/MI300) every suspend and resume preempts every queue of the GPU once.
    Schedule(ScheduleArgs),
    /// A live terminal view of the KFD processes, their queues and what happens to them (root).
    ///
    /// Rows: every KFD process (host pid, container or pod, command) with its queues per GPU and
    /// each queue's state (active, evicted, suspended); per GPU, the processes and queues by
    /// state and the evictions, suspends and resumes seen since `top` started; the eviction and
    /// debug-trap suspend/resume spans as the tracer closes them, with the driver's time inside
    /// (unmap, fence wait = the preemption, remap) and the other processes' queues a device-wide
    /// unmap preempted. The data comes from the in-process tracer (as `trace`, no debug-trap
    /// call); queues that exist when `top` starts are read from sysfs, which has no queue state:
    /// they show as active, marked `*`, until the tracer sees them change.
    ///
    /// The scheduler's per-GPU state (held or running, suspends, resumes, time held, reaction
    /// mean and p99 bound, resumes skipped) is read from a running `gpreempt agent`'s metrics
    /// endpoint (--agent, default 127.0.0.1:9464: HTTP GET /metrics, the agent's `[[policy]]`
    /// schedulers); a standalone `gpreempt schedule` serves no endpoint, but its suspends and
    /// resumes show in the queue states and spans.
    ///
    /// Keys: q (or Esc, Ctrl-C) quit, s next sort key, r reverse, / type a filter (Enter keeps
    /// it, Esc clears it), c clear the filter. The terminal is restored on every exit: q,
    /// SIGTERM, SIGINT, SIGHUP, an error or a panic. `--once` prints one frame as text and
    /// exits; `--json` prints the same snapshot as one JSON object.
    Top(TopArgs),
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Latency-critical processes: host pids or container:NAME (name, id or id prefix).
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub online: Vec<gpreempt::host::select::Selector>,
    /// Throughput processes whose queues are suspended: host pids or container:NAME.
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub offline: Vec<gpreempt::host::select::Selector>,
    /// Resume the offline queues after this long without online work, ms.
    #[arg(long, default_value_t = 2.0, value_name = "MS")]
    pub idle_ms: f64,
    /// Interval between the reaction thread's steps (reads of the online dispatch indices), µs.
    #[arg(long, default_value_t = 200, value_name = "US")]
    pub poll_us: u64,
    /// SCHED_FIFO priority of the reaction thread (1-99; 0: normal scheduling). Without
    /// CAP_SYS_NICE it is said once and the thread runs at normal priority.
    #[arg(long, default_value_t = gpreempt::schedule::DEFAULT_RT_PRIORITY, value_name = "N",
          value_parser = clap::value_parser!(u8).range(0..=99))]
    pub rt_priority: u8,
    /// Pin the reaction thread to this CPU (give it one no other busy task uses).
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
    /// The reaction thread polls without sleeping between steps: the shortest detection, at the
    /// cost of one CPU kept busy (for hosts with a core to spare; combine with --cpu).
    #[arg(long)]
    pub busy_poll: bool,
    /// Do not lock gpreempt's memory (mlockall) against page faults in the reaction thread.
    #[arg(long)]
    pub no_mlock: bool,
    /// Resume after every idle gap of --idle-ms, even one predicted shorter than what the resume
    /// and the next suspend cost the online job (by default such resumes are skipped).
    #[arg(long)]
    pub no_cost_aware: bool,
    /// Interval between reads of the online processes' cu_occupancy, µs.
    #[arg(long, default_value_t = 1000, value_name = "US")]
    pub occupancy_us: u64,
    /// Guarantee the offline job this share of GPU time over --share-window-ms even under
    /// continuous online load (0..1; 0: none). The online work waits during those slices.
    #[arg(long, default_value_t = 0.0, value_name = "F", value_parser = parse_share)]
    pub offline_min_share: f64,
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub share_window_ms: u64,
    /// Resume (watchdog) a suspension that lasts longer than this, ms.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub max_suspend_ms: u64,
    /// Unix socket where an online server writes `begin` / `end` lines around its requests.
    #[arg(long, value_name = "PATH")]
    pub hint_socket: Option<PathBuf>,
    /// JSON Lines on stdout: one object per transition and per interval, a summary at the end.
    #[arg(long)]
    pub json: bool,
    /// Interval between interval records and status-line updates, ms.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,
    /// Do not attach the tracer (processes that appear later are found in sysfs; their new
    /// online queues are not watched).
    #[arg(long)]
    pub no_trace: bool,
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a share in [0, 1) (e.g. 0.2 for 20 %)")),
    }
}

#[derive(Debug, Args)]
pub struct QueuesArgs {
    /// Host pid of the process (see `gpreempt ps`).
    pub pid: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print only queue ids, one per line.
    #[arg(long)]
    pub ids_only: bool,
    /// Sample every INTERVAL (e.g. 100ms) instead of once; needs --duration.
    #[arg(long, value_parser = parse_duration, value_name = "INTERVAL", requires = "duration")]
    pub watch: Option<Duration>,
    /// With --watch: how long to sample (e.g. 10s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// With --watch: sysfs alone, without the in-process tracer. By default the tracer (root,
    /// BTF) is attached while watching and fills, for the queues created during the watch, what
    /// sysfs lacks: ring address (RING), read/write index addresses (RPTR, WPTR), CWSR area
    /// (CWSR, CWSR_SIZE), and in the "created while watching" table the priority, doorbell offset
    /// and creation/destruction times. It sees a queue only at its CREATE_QUEUE, so queues made
    /// before the watch began show sysfs's columns only. Tracing calls no debug-trap ioctl.
    #[arg(long, requires = "watch")]
    pub no_trace: bool,
    /// Take a KFD debug-trap snapshot instead of reading sysfs (root, KFD ≥ 1.13): ring, read and
    /// write pointer and CWSR addresses, exception bits. DISTURBS THE GPU: gpreempt ptrace-seizes the
    /// process and enables debugging on it; the debug ENABLE and DISABLE each refresh the hardware
    /// scheduler's runlist, which preempts every queue of every process on the GPU (twice), and
    /// on some GPUs reserve a debug VMID while the session lasts.
    #[arg(long)]
    pub debug_snapshot: bool,
}

#[derive(Debug, Args)]
pub struct PreemptArgs {
    /// The processes whose queues are suspended (the offline work): host pids and
    /// container:NAME (name, id or id prefix: every KFD process in it, as `gpreempt ps` shows),
    /// space-separated. With more than one process, each cycle suspends all of them, holds, and
    /// resumes all; processes that open /dev/kfd in a selected container later are attached for
    /// the next cycle, and `--json` writes one record per target (`"version": 2`). A pid named
    /// here that exits during the run is detached, the others go on, and the command then exits
    /// with status 1; a container's processes may exit without failing the run.
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub offline: Vec<gpreempt::host::select::Selector>,
    /// Suspend/resume cycles.
    #[arg(long, default_value_t = 100)]
    pub iterations: u32,
    /// How long the queues stay suspended per iteration, ms.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    pub hold_ms: u64,
    /// Pause between a resume and the next suspend, ms.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub gap_ms: u64,
    /// CWSR grace period in units of 1000 GPU cycles (HWS only; 0 = shortest, as ROCdbgapi uses),
    /// or `driver` to leave the driver's setting.
    #[arg(long, default_value = "0", value_parser = parse_grace_period, value_name = "N|driver")]
    pub grace_period: u32,
    /// Which queues: `all` (every queue, re-snapshotted when new ones appear) or ids `0,1,5`.
    #[arg(long, default_value = "all", value_parser = parse_queue_selection, value_name = "all|ID,...")]
    pub queues: QueueSelectionArg,
    /// Resume automatically (watchdog) if queues stay suspended longer than this, ms.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub max_suspend_ms: u64,
    /// Write every iteration record and the summary to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No per-iteration progress line.
    #[arg(long)]
    pub quiet: bool,
    /// The latency-critical process sharing the GPU: report how often the device-wide unmaps
    /// preempted its queues (needs the tracer).
    #[arg(long, value_name = "PID")]
    pub online: Option<u32>,
    /// Do not attach the tracer (no kernel-side breakdown: fence wait, collateral queues).
    #[arg(long)]
    pub no_trace: bool,
}

/// `--queues` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueSelectionArg {
    All,
    Ids(Vec<u32>),
}

fn parse_queue_selection(text: &str) -> Result<QueueSelectionArg, String> {
    if text == "all" {
        return Ok(QueueSelectionArg::All);
    }
    text.split(',')
        .map(|id| {
            let id = id.trim();
            id.parse::<u32>()
                .ok()
                .filter(|&v| v < 1024)
                .ok_or_else(|| format!("`{id}` is not a queue id (0-1023); use `all` or ids like 0,1,5"))
        })
        .collect::<Result<Vec<u32>, String>>()
        .and_then(|ids| {
            // Each id once: a repeated id would be suspended once but counted twice.
            match ids.iter().enumerate().find(|(i, id)| ids[..*i].contains(id)) {
                Some((_, id)) => Err(format!("queue id {id} is given twice; list each queue once")),
                None => Ok(QueueSelectionArg::Ids(ids)),
            }
        })
}

fn parse_grace_period(text: &str) -> Result<u32, String> {
    if text == "driver" {
        return Ok(gpreempt::controller::vocabulary::DRIVER_GRACE_PERIOD);
    }
    text.parse::<u32>()
        .ok()
        .filter(|&v| v != gpreempt::controller::vocabulary::DRIVER_GRACE_PERIOD)
        .ok_or_else(|| format!("`{text}` is not a grace period (a number of 1000-cycle units, or `driver`)"))
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Print JSON (an array of processes, with notes) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Add the hardware view from debugfs and check KFD queues vs MQDs vs active HQD slots.
    #[arg(long)]
    pub hw: bool,
    /// Block until a new KFD process appears (in --container if given), print it and exit.
    #[arg(long)]
    pub wait_new: bool,
    /// Only processes in this container (name, full id or id prefix).
    #[arg(long, value_name = "NAME_OR_ID")]
    pub container: Option<String>,
    /// With --wait-new: give up after this long (e.g. 30s); default: wait forever.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Print only host pids, one per line (for `gpreempt trace --pid $(gpreempt ps --ids-only …)`).
    #[arg(long)]
    pub ids_only: bool,
    /// Read a captured /sys tree from DIR instead of the live one.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Read a captured debugfs tree from DIR (expects DIR/kfd/{mqds,hqds,rls}).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/debug")]
    pub debugfs_root: PathBuf,
    /// Read a captured /proc tree from DIR (process identity).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// JSON Lines recordings, one per run.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print the analysis as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Configuration file (TOML; see deploy/agent.toml). Without it: defaults, no policies.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve /metrics and /healthz here (IP:PORT); overrides the config's metrics_addr.
    /// Default: 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The `hostname` label of every series (a DaemonSet passes the node name). Default: the
    /// kernel's hostname.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub hostname: Option<String>,
    /// Read BTF from DIR (see `trace --btf-dir`).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/btf", hide = true)]
    pub btf_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame as text after one --interval of tracing, and exit.
    #[arg(long)]
    pub once: bool,
    /// Print one snapshot as JSON after one --interval of tracing, and exit: {"ts_ns",
    /// "processes": [{"pid", "ns_pid", "comm", "container", "pod", "gpus": [{"gpu_id", "queues":
    /// [{"queue_id", "queue_type", "state", "state_seen"}]}], "evictions", "suspends"}], "gpus",
    /// "spans", "scheduler", "tracer"} (processes in the --sort order, --filter applied).
    #[arg(long, conflicts_with = "once")]
    pub json: bool,
    /// How often the view refreshes (e.g. 500ms, 2s).
    #[arg(long, value_parser = parse_duration, default_value = "1s", value_name = "DURATION")]
    pub interval: Duration,
    /// The process table's order (the `s` key cycles through them; counts sort largest first).
    #[arg(long, value_enum, default_value = "pid")]
    pub sort: gpreempt::views::top::SortKey,
    /// Show only processes whose pid, command, container or pod contains TEXT (case-insensitive).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub filter: String,
    /// Where a `gpreempt agent` serves its metrics, to show its schedulers' per-GPU state.
    #[arg(long, value_name = "ADDR", default_value = gpreempt::agent::config::DEFAULT_METRICS_ADDR)]
    pub agent: std::net::SocketAddr,
    /// Do not ask an agent for the scheduler's state.
    #[arg(long)]
    pub no_agent: bool,
    /// With --once: how many of the latest spans to print.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub spans: usize,
    /// Read BTF from DIR (see `trace --btf-dir`).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/btf", hide = true)]
    pub btf_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Read a captured /sys tree from DIR instead of the live one (module parameters, BTF).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Read a captured debugfs tree from DIR instead of /sys/kernel/debug.
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/debug")]
    pub debugfs_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Write JSON Lines (one object per event, then a summary object) instead of text.
    #[arg(long)]
    pub json: bool,

    /// Only show events of this host pid (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Stop after this long (e.g. 30s, 5m, 500ms); default: until Ctrl-C.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// Colour: auto (only on a terminal), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,

    /// Also write the JSON Lines stream to this file (the console keeps its text lines).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Only show processes in this container (name, full id or id prefix; from cgroup paths).
    #[arg(long, value_name = "NAME_OR_ID")]
    pub container: Option<String>,

    /// Print the live PID → queue map this often (e.g. 5s); it is also printed on SIGUSR1 and at exit.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub map_interval: Option<Duration>,

    /// Write a Chrome trace-event JSON file (open it in ui.perfetto.dev): a track per process and
    /// per queue, spans for evictions, suspends/resumes and fence waits.
    #[arg(long, value_name = "FILE")]
    pub perfetto: Option<PathBuf>,

    /// Write the exit summary as one JSON object to this file.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,

    /// Read BTF (vmlinux and the KFD module's split BTF) from DIR; a directory without it forces
    /// the pointer-learning fallback (tests).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/btf", hide = true)]
    pub btf_dir: PathBuf,

    /// Attach empty programs to the benchmarked functions instead, and nothing else: the kprobe
    /// + kretprobe floor for `cargo xtask bench`.
    #[arg(long, hide = true)]
    pub empty_probes: bool,

    /// Run this command and trace only it and its children (`gpreempt trace [opts] -- CMD ARGS`);
    /// the trace ends when it exits.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `500ms`, `30s`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("`{text}` is not a duration (try 500ms, 30s, 5m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit `{other}` in `{text}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("3d"), Err("unknown unit `d` in `3d` (use ms, s, m or h)".to_owned()));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn trace_flags_parse() {
        let cli = Cli::try_parse_from(["gpreempt", "trace", "--json", "--pid", "7", "--pid", "9", "--duration", "1s"])
            .unwrap();
        let Command::Trace(t) = cli.command else { panic!("not trace") };
        assert!(t.json);
        assert_eq!(t.pids, vec![7, 9]);
        assert_eq!(t.duration, Some(Duration::from_secs(1)));
        Cli::command_for_test();
        let cli = Cli::try_parse_from([
            "gpreempt",
            "trace",
            "--container",
            "abc",
            "--map-interval",
            "5s",
            "--perfetto",
            "t.json",
            "--summary-json",
            "s.json",
            "--",
            "./gemm",
            "--size",
            "4096",
        ])
        .unwrap();
        let Command::Trace(t) = cli.command else { panic!("not trace") };
        assert_eq!(t.container.as_deref(), Some("abc"));
        assert_eq!(t.map_interval, Some(Duration::from_secs(5)));
        assert_eq!(t.perfetto, Some(PathBuf::from("t.json")));
        assert_eq!(t.summary_json, Some(PathBuf::from("s.json")));
        assert_eq!(t.command, ["./gemm", "--size", "4096"]);
    }

    #[test]
    fn preempt_flags_parse_with_defaults() {
        use gpreempt::{domain::HostPid, host::select::Selector};
        let cli =
            Cli::try_parse_from(["gpreempt", "preempt", "--offline", "42", "container:trainer", "--quiet"]).unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!(p.offline, vec![Selector::Pid(HostPid(42)), Selector::Container("trainer".into())]);
        let cli = Cli::try_parse_from(["gpreempt", "preempt", "--offline", "42", "--iterations", "1000"]).unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!(
            (p.offline, p.iterations, p.hold_ms, p.gap_ms, p.grace_period),
            (vec![Selector::Pid(HostPid(42))], 1000, 100, 500, 0)
        );
        assert_eq!((p.queues, p.max_suspend_ms), (QueueSelectionArg::All, 5000));
        let cli = Cli::try_parse_from([
            "gpreempt",
            "preempt",
            "--offline",
            "1",
            "--queues",
            "0, 3",
            "--grace-period",
            "driver",
        ])
        .unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!((p.queues, p.grace_period), (QueueSelectionArg::Ids(vec![0, 3]), 0xffff_ffff));
        let err = Cli::try_parse_from(["gpreempt", "preempt", "--offline", "1", "--queues", "0,3,0"]).unwrap_err();
        assert!(err.to_string().contains("queue id 0 is given twice; list each queue once"), "{err}");
        let err = Cli::try_parse_from(["gpreempt", "preempt", "--offline", "1", "--queues", "0,x"]).unwrap_err();
        assert!(err.to_string().contains("`x` is not a queue id (0-1023)"), "{err}");
        assert!(Cli::try_parse_from(["gpreempt", "queues", "7", "--watch", "100ms"]).is_err());
    }

    #[test]
    fn schedule_takes_several_selectors_per_side() {
        use gpreempt::{domain::HostPid, host::select::Selector};
        let cli = Cli::try_parse_from([
            "gpreempt",
            "schedule",
            "--online",
            "10",
            "container:vllm",
            "--offline",
            "20",
            "--idle-ms",
            "0.5",
            "--offline-min-share",
            "0.2",
            "--json",
        ])
        .unwrap();
        let Command::Schedule(s) = cli.command else { panic!("not schedule") };
        assert_eq!(s.online, vec![Selector::Pid(HostPid(10)), Selector::Container("vllm".into())]);
        assert_eq!(s.offline, vec![Selector::Pid(HostPid(20))]);
        assert_eq!((s.idle_ms, s.offline_min_share, s.poll_us, s.max_suspend_ms, s.json), (0.5, 0.2, 200, 5000, true));
        let err = Cli::try_parse_from(["gpreempt", "schedule", "--online", "1", "--offline", "vllm"]).unwrap_err();
        assert!(err.to_string().contains("`vllm` is none of: a host pid, container:NAME, pod:NAMESPACE/NAME"), "{err}");
        let err = Cli::try_parse_from([
            "gpreempt",
            "schedule",
            "--online",
            "1",
            "--offline",
            "2",
            "--offline-min-share",
            "1",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("`1` is not a share in [0, 1)"), "{err}");
        assert!(Cli::try_parse_from(["gpreempt", "schedule", "--online", "1"]).is_err());
    }

    impl Cli {
        fn command_for_test() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
        }
    }
}
