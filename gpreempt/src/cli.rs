//! Command-line definitions (clap derive). Each subcommand's `run` is in `commands/`.
//!
//! One convention across the commands: `-j/--json` prints JSON on stdout, `-o/--output FILE`
//! writes a file, every duration carries its unit ([`duration`]: `--hold 20ms`, `--poll 200us`),
//! processes are named by selectors (a host pid, `container:NAME`, `pod:NAMESPACE/NAME`,
//! `pod-label:KEY=VALUE`), and
//! `--log` comes last. Older spellings of some flags (`--hold-ms 20`, `--idle-ms 0.5`: a bare
//! number in the unit of the name; `preempt --json FILE`) are kept as hidden aliases that work
//! and say what to write instead ([`Cli::deprecations`], [`rewrite_legacy_json`]).

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use gpreempt::{duration, host::select::Selector, schedule::SchedulerSettings};

/// The exit statuses every command shares (its `--help` ends with them; docs/cli.md).
pub const EXIT_CODES: &str = "Exit status: 0 success; 1 runtime error (stderr says what failed); 2 usage \
error (an unknown flag, a bad value: nothing was done). `ps` exits 0 when it finds no KFD process; `doctor` \
exits 1 when a check fails.";

#[derive(Debug, Parser)]
#[command(
    name = "gpreempt",
    version,
    about = "Protect latency-critical GPU work from batch work on the stock AMD driver",
    long_about = "gpreempt protects latency-critical GPU work from batch work sharing the same AMD GPU, on \
the stock amdgpu driver: `gpreempt schedule` suspends the batch (offline) processes' compute queues while the \
latency-critical (online) processes have work, and resumes them when those go idle, through the KFD \
debug-trap API (Linux 6.5+ or amdgpu-dkms; root). It also shows and traces every process's GPU queues (eBPF \
on the KFD paths of amdgpu, any kernel with kprobes).\n\nFirst steps: `gpreempt doctor` (what this host \
supports), `gpreempt schedule --online SEL --offline SEL`, `gpreempt top`. A process is named by a selector: \
a host pid, container:NAME (name, id or id prefix), pod:NAMESPACE/NAME (globs) or pod-label:KEY=VALUE[,KEY!=VALUE] \
(the pods' labels, asked of the node's CRI runtime: see --cri-socket).",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// The node's CRI runtime socket, for pod-label: selectors (a path or unix:///path); stands
    /// over the agent config's cri_socket. Default: the kubelet's defaults,
    /// /run/containerd/containerd.sock then /var/run/crio/crio.sock.
    #[arg(long, global = true, value_name = "PATH", env = "GPREEMPT_CRI_SOCKET", display_order = 999)]
    pub cri_socket: Option<String>,

    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    // Last in every help (global options are listed after the subcommand's own).
    #[arg(long, global = true, default_value = "warn", env = "GPREEMPT_LOG", display_order = 1000)]
    pub log: log::LevelFilter,
}

// The subcommands in the order a user meets them: check the host (doctor), do what the tool is
// for (schedule), watch it (top), look at processes and queues (ps, queues), measure what a
// suspend costs (preempt), dig into the driver (trace), deploy on a fleet (agent), and compare
// recorded traces afterwards (analyze). Help lists them in this order.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check this host for everything gpreempt needs, and say what to do about each gap.
    ///
    /// Kernel and KFD ioctl version, debug-trap availability, the module that provides KFD and its
    /// BTF, every tracer probe (found or missing, and why), debugfs, Yama ptrace_scope, the
    /// caller's capabilities, and the amdgpu parameters that matter for preemption. Without the
    /// amdgpu module, one line says so and the checks that need it are skipped. Exits 1 when a
    /// check fails.
    #[command(after_help = EXIT_CODES)]
    Doctor(DoctorArgs),
    /// Suspend the offline processes' GPU queues while the online processes have work (root).
    ///
    /// Attaches once to each offline process (debug-trap ENABLE: one runlist refresh) and keeps
    /// it attached; watches the online processes' AQL dispatch indices (process_vm_readv) and
    /// cu_occupancy without attaching to them (an online process that already has queues costs
    /// one snapshot at start: ENABLE, GET_QUEUE_SNAPSHOT, DISABLE, two runlist refreshes).
    /// Processes that open /dev/kfd later are picked up by their selector. Runs until Ctrl-C or
    /// SIGTERM, then resumes and detaches everything and prints a summary. On HWS GPUs
    /// (MI200/MI300) every suspend and resume preempts every queue of the GPU once. Every setting
    /// from --idle to --busy-share is also a key of the agent's [[policy]] tables (`-` as `_`,
    /// the same units and defaults).
    #[command(after_help = EXIT_CODES)]
    Schedule(ScheduleArgs),
    /// Measure what gpreempt does for your own service and training job on your GPUs (root).
    ///
    /// With the online service and the offline jobs already running, runs your load command once
    /// per state and round: co-located (nothing held), online alone (the offline processes' GPU
    /// queues held suspended for the whole state; their CPU threads still run), scheduled
    /// (`gpreempt schedule` with the options below) and offline alone (no load, as long as the
    /// longest load run). The first state is co-located: a load command that fails or drives no
    /// online dispatch, or a --metric that does not match its output, is refused there, before
    /// anything is held. The order of the states rotates between rounds. Measured from outside in
    /// every state: the online dispatch delay (published → consumed, AQL indices), the dispatches
    /// the online processes published, the offline progress per GPU; with schedule, its
    /// transitions, detection and reaction. Prints a table (states × figures, ratio to alone,
    /// range over the rounds), or --markdown, or -j/--json. Ctrl-C ends the current state,
    /// releases everything and prints what was measured. See docs/evaluate.md.
    #[command(after_help = EXIT_CODES)]
    Evaluate(EvaluateArgs),
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
    #[command(after_help = EXIT_CODES)]
    Top(TopArgs),
    /// List every process that uses KFD now, with its queues per GPU.
    ///
    /// Host pid, container (Docker, containerd, Podman, CRI-O, Kubernetes, LXC; from cgroup paths,
    /// no container CLI needed), pid inside the container, command, and per GPU: queue ids and
    /// types, VRAM, evicted_ms and cu_occupancy, from /sys/class/kfd/kfd/proc. `--hw` adds the
    /// hardware view from debugfs (MQDs and active HQD slots) and a consistency check per GPU.
    /// Finding no KFD process is an answer, not an error: an empty table (or `"processes": []`)
    /// and exit status 0.
    #[command(after_help = EXIT_CODES)]
    Ps(PsArgs),
    /// Show one process's GPU queues, without disturbing the GPU.
    ///
    /// Reads sysfs only (/sys/class/kfd/kfd/proc/PID/queues: queue id, gpu, type, ring size): no
    /// /dev/kfd, no ptrace, no ioctl, nothing the GPU notices; it works without access to
    /// /dev/kfd. `--debug-snapshot` (opt-in) adds addresses, CWSR and exception bits from the KFD
    /// debug-trap API (KFD ≥ 1.13, root), at a price: its debug ENABLE and DISABLE each preempt
    /// every queue on the GPU (two device-wide preemptions). `--watch` samples repeatedly and ends
    /// with statistics; while it watches, the tracer (when it can attach) adds the
    /// ring/index/CWSR addresses, priority, doorbell and creation time of the queues created
    /// meanwhile, without any debug-trap call (see --no-trace).
    #[command(after_help = EXIT_CODES)]
    Queues(QueuesArgs),
    /// Suspend and resume another process's GPU queues in a loop and measure it (root).
    ///
    /// Per iteration: SUSPEND_QUEUES, hold, RESUME_QUEUES, gap. The target keeps running on the
    /// CPU and receives its signals as usual; its queues are resumed on every way out (end,
    /// error, Ctrl-C/SIGTERM/SIGHUP, panic; if gpreempt is killed, the kernel resumes them).
    /// Prints per-iteration progress on a terminal, then success rate, latency percentiles
    /// (p50/p90/p99/max/mean/stddev) and a histogram. On HWS GPUs (MI200/MI300) every suspend and
    /// resume briefly preempts every process's queues on the GPU, not only the target's.
    #[command(after_help = EXIT_CODES)]
    Preempt(PreemptArgs),
    /// Trace KFD queue events live, one line per event (root).
    ///
    /// Attaches kprobes/kretprobes to the KFD paths of amdgpu.ko: queue create/destroy/update with
    /// their exact arguments and results, process open and exit, evictions and restores, debug-trap
    /// suspend/resume with the HWS unmap / fence wait / remap breakdown (and the other processes'
    /// queues a device-wide unmap preempted), MES, and GPU resets. Keeps a live PID → queue map
    /// (printed on SIGUSR1, every --map-interval and at exit). Ctrl-C (or SIGTERM/SIGHUP) ends the
    /// trace with a summary: queues and churn per process, evictions, suspend/resume latency
    /// percentiles, and every dropped record.
    #[command(after_help = EXIT_CODES)]
    Trace(TraceArgs),
    /// Run as a node daemon: trace continuously and serve Prometheus metrics (root).
    ///
    /// Serves `/metrics` (OpenMetrics) and `/healthz` on --metrics-addr: queues per process and
    /// GPU by type and state, creates and destroys, evictions by trigger, debug-trap suspends and
    /// their in-driver breakdown, collateral preemptions, tracer losses, labelled with the pod,
    /// namespace and container when the process runs in a Kubernetes pod. Memory stays bounded:
    /// an exited process's series leave after the config's grace period. Logs key=value lines to
    /// stderr. --config is reloaded when its content changes (its directory is watched, which
    /// also sees a Kubernetes ConfigMap update) or on SIGHUP; an invalid file is rejected and the
    /// old one kept. SIGTERM or Ctrl-C exits cleanly. `--check FILE` validates a configuration
    /// and exits.
    #[command(after_help = EXIT_CODES)]
    Agent(AgentArgs),
    /// Compare queue ids across recorded runs (`gpreempt trace --json` output, one file per run).
    ///
    /// Per run: the queue ids each process created, per GPU, in creation order. Across runs of the
    /// same command: identical ids, the same count with different ids, or a different count.
    /// Within a run: concurrently running processes that were handed the same ids. A file with no
    /// trace record (empty, or not `trace --json` output) is an error (exit status 1).
    #[command(after_help = EXIT_CODES)]
    Analyze(AnalyzeArgs),
    /// Print the shell completion script for SHELL on stdout (the Debian package installs them).
    ///
    /// bash: `gpreempt completions bash > /etc/bash_completion.d/gpreempt`; zsh: write `_gpreempt`
    /// into a directory of $fpath; fish: `~/.config/fish/completions/gpreempt.fish`.
    #[command(hide = true)]
    Completions(CompletionsArgs),
    /// Write the man pages (gpreempt.1 and one gpreempt-COMMAND.1 per command) into DIR.
    #[command(hide = true)]
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The directory to write the pages into (created if missing; pages there are replaced).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// An older flag spelling's value: a bare number in the unit its name carries (`--hold-ms 20`).
#[derive(Clone, Debug, PartialEq)]
pub struct OldDuration {
    /// As given (`20`, `0.5`).
    pub text: String,
    pub duration: Duration,
}

/// Value parser of an older `--…-ms`/`--…-us` flag spelling.
fn old_in(unit: &'static str) -> impl Fn(&str) -> Result<OldDuration, String> + Clone + Send + Sync + 'static {
    move |text| duration::in_unit(unit)(text).map(|duration| OldDuration { text: text.trim().to_owned(), duration })
}

/// Put an older flag spelling's value where the current flag's goes, and say so: `--hold-ms 20` is
/// `--hold 20ms`.
fn migrate(
    new: &mut Duration,
    old: Option<OldDuration>,
    (old_flag, new_flag, unit): (&str, &str, &str),
    warnings: &mut Vec<String>,
) {
    if let Some(old) = old {
        warnings.push(format!("{old_flag} is an older spelling kept as an alias: write {new_flag} {}{unit}", old.text));
        *new = old.duration;
    }
}

impl Cli {
    /// Apply the older flag spellings given (hidden aliases) to their
    /// successors; one warning each, for stderr.
    pub fn deprecations(&mut self) -> Vec<String> {
        let mut w = Vec::new();
        match &mut self.command {
            Command::Preempt(p) => {
                migrate(&mut p.hold, p.hold_ms.take(), ("--hold-ms", "--hold", "ms"), &mut w);
                migrate(&mut p.gap, p.gap_ms.take(), ("--gap-ms", "--gap", "ms"), &mut w);
                let names = ("--max-suspend-ms", "--max-suspend", "ms");
                migrate(&mut p.max_suspend, p.max_suspend_ms.take(), names, &mut w);
            }
            Command::Schedule(s) => {
                migrate(&mut s.settings.idle, s.idle_ms.take(), ("--idle-ms", "--idle", "ms"), &mut w);
                migrate(&mut s.settings.poll, s.poll_us.take(), ("--poll-us", "--poll", "us"), &mut w);
                migrate(
                    &mut s.settings.occupancy,
                    s.occupancy_us.take(),
                    ("--occupancy-us", "--occupancy", "us"),
                    &mut w,
                );
                let names = ("--share-window-ms", "--share-window", "ms");
                migrate(&mut s.settings.share_window, s.share_window_ms.take(), names, &mut w);
                let names = ("--max-suspend-ms", "--max-suspend", "ms");
                migrate(&mut s.settings.max_suspend, s.max_suspend_ms.take(), names, &mut w);
                migrate(&mut s.interval, s.interval_ms.take(), ("--interval-ms", "--interval", "ms"), &mut w);
            }
            _ => {}
        }
        w
    }
}

/// `preempt --json FILE` (an older spelling) is `preempt --output FILE` now that
/// `--json` prints to stdout: rewritten before parsing (a `--json` followed by a value that is
/// not a flag), with a warning for stderr. Everything after a `--` is left alone.
pub fn rewrite_legacy_json(args: Vec<OsString>) -> (Vec<OsString>, Option<String>) {
    // The subcommand: the first word that is neither a flag nor the global --log's value.
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if a == "--log" {
            i += 2;
        } else if a.starts_with('-') {
            i += 1;
        } else {
            break;
        }
    }
    if args.get(i).is_none_or(|a| a != "preempt") {
        return (args, None);
    }
    let mut out = args[..=i].to_vec();
    let mut warning = None;
    let mut rest = args[i + 1..].iter().peekable();
    while let Some(a) = rest.next() {
        let text = a.to_string_lossy();
        if text == "--" {
            out.push(a.clone());
            out.extend(rest.by_ref().cloned());
            break;
        }
        let file = if let Some(f) = text.strip_prefix("--json=") {
            Some(OsString::from(f))
        } else if text == "--json"
            && let Some(next) = rest.peek()
            && !next.to_string_lossy().starts_with('-')
        {
            rest.next().cloned()
        } else {
            None
        };
        match file {
            Some(f) => {
                warning = Some(format!(
                    "`preempt --json FILE` is an older spelling kept as an alias: write -o/--output {} \
                     (--json now prints the JSON on stdout)",
                    f.to_string_lossy()
                ));
                out.push("--output".into());
                out.push(f);
            }
            None => out.push(a.clone()),
        }
    }
    (out, warning)
}

/// The help text of every selector flag ends with this.
macro_rules! selector_forms {
    () => {
        "a host pid, container:NAME (a container's name, id or id prefix, or a Kubernetes container's \
         name: every KFD process in it), pod:NAMESPACE/NAME (a Kubernetes pod, globs allowed: \
         pod:batch/train-*) or pod-label:KEY=VALUE[,KEY2!=VALUE2] (the pods with these labels, \
         kubectl's equality syntax: pod-label:gpreempt.io/role=offline; asked of the CRI runtime, see \
         --cri-socket)"
    };
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[arg(help = concat!("Latency-critical processes (space-separated selectors): ", selector_forms!(), "."))]
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub online: Vec<Selector>,
    #[arg(help = concat!("Throughput processes whose queues are suspended (space-separated selectors): ", selector_forms!(), "."))]
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub offline: Vec<Selector>,
    /// Unix socket where an online server writes `begin` / `end` lines around its requests.
    #[arg(long, value_name = "PATH")]
    pub hint_socket: Option<PathBuf>,
    /// Print JSON Lines on stdout: one object per transition and per interval, a summary at the end.
    #[arg(short, long)]
    pub json: bool,
    /// Interval between interval records and status-line updates, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    pub interval: Duration,
    /// Do not attach the tracer (processes that appear later are found in sysfs; their new
    /// online queues are not watched).
    #[arg(long)]
    pub no_trace: bool,
    // The agent's `[[policy]]` keys, `-` as `_` (one type: SchedulerSettings). No heading of its
    // own: --log stays the last option.
    #[command(flatten)]
    pub settings: SchedulerSettings,
    /// Older spelling: --idle with a unit.
    #[arg(long = "idle-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "idle")]
    pub idle_ms: Option<OldDuration>,
    /// Older spelling: --poll with a unit.
    #[arg(long = "poll-us", hide = true, value_parser = old_in("us"), conflicts_with = "poll")]
    pub poll_us: Option<OldDuration>,
    /// Older spelling: --occupancy with a unit.
    #[arg(long = "occupancy-us", hide = true, value_parser = old_in("us"), conflicts_with = "occupancy")]
    pub occupancy_us: Option<OldDuration>,
    /// Older spelling: --share-window with a unit.
    #[arg(long = "share-window-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "share_window")]
    pub share_window_ms: Option<OldDuration>,
    /// Older spelling: --max-suspend with a unit.
    #[arg(long = "max-suspend-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "max_suspend")]
    pub max_suspend_ms: Option<OldDuration>,
    /// Older spelling: --interval with a unit.
    #[arg(long = "interval-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "interval")]
    pub interval_ms: Option<OldDuration>,
}

#[derive(Debug, Args)]
pub struct EvaluateArgs {
    #[arg(help = concat!("The online (latency-critical) service, running (space-separated selectors): ", selector_forms!(), "."))]
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub online: Vec<Selector>,
    #[arg(help = concat!("The offline (throughput) jobs, running (space-separated selectors): ", selector_forms!(), "."))]
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub offline: Vec<Selector>,
    /// The command that sends requests to the online service and reports its own latency, run
    /// through /bin/sh once per state and round (e.g. 'vllm bench serve --num-prompts 200'). Its
    /// program must exist and be executable (a usage error otherwise).
    #[arg(long, value_name = "COMMAND", value_parser = parse_load)]
    pub load: gpreempt::evaluate::LoadCommand,
    /// A figure of the load command's output: NAME=REGEX (the first capture group, or the whole
    /// match, as a number; the last match wins) or NAME=json:PATH (a number at PATH in its JSON
    /// output, e.g. json:latency.p99). Repeat for several.
    #[arg(long, value_name = "NAME=REGEX", value_parser = parse_metric)]
    pub metric: Vec<gpreempt::evaluate::MetricSpec>,
    /// The offline job's log file (e.g. its container's log under /var/log/pods): what it writes
    /// there during each state is where --offline-metric looks.
    #[arg(long, value_name = "FILE", requires = "offline_metric")]
    pub offline_log: Option<PathBuf>,
    /// A figure of the offline job's own, in what --offline-log got during a state, as --metric
    /// takes it (e.g. samples_s='samples/s: ([0-9.]+)'); compared with offline alone. Repeat
    /// for several.
    #[arg(long, value_name = "NAME=REGEX", value_parser = parse_offline_metric, requires = "offline_log")]
    pub offline_metric: Vec<gpreempt::evaluate::MetricSpec>,
    /// Rounds: each runs every state once, the order rotated by one between rounds.
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// The longest one load run may take, e.g. 10m; after it the load is ended and the state
    /// reported as timed out.
    #[arg(long, default_value = "10m", value_parser = duration::with_unit("s"), value_name = "DURATION")]
    pub state_timeout: Duration,
    /// Interval between the reads of the online dispatch indices that time the dispatch delay,
    /// e.g. 500us.
    #[arg(long, default_value = "500us", value_parser = duration::with_unit("us"), value_name = "DURATION")]
    pub sample: Duration,
    /// Scheduled state: no tracer (it takes seconds to attach per scheduled state; without it
    /// the driver's side of the transitions is not reported).
    #[arg(long)]
    pub no_trace: bool,
    /// Print the report as Markdown (to paste into an issue) instead of the terminal table.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print the report as one JSON document on stdout (progress stays on stderr).
    #[arg(short, long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    // The scheduled state's settings, as `gpreempt schedule`'s.
    #[command(flatten)]
    pub settings: SchedulerSettings,
}

fn parse_metric(s: &str) -> Result<gpreempt::evaluate::MetricSpec, String> {
    s.parse().map_err(|e: gpreempt::evaluate::MetricError| e.to_string())
}

/// As [`parse_metric`]; the error names the flag given.
/// `--load`: a program that is not there is a usage error, refused before anything starts.
fn parse_load(s: &str) -> Result<gpreempt::evaluate::LoadCommand, String> {
    let path = std::env::var("PATH").ok();
    gpreempt::evaluate::LoadCommand::check(s, path.as_deref()).map_err(|e| e.to_string())
}

fn parse_offline_metric(s: &str) -> Result<gpreempt::evaluate::MetricSpec, String> {
    parse_metric(s).map_err(|e| e.replacen("--metric", "--offline-metric", 1))
}

#[derive(Debug, Args)]
pub struct QueuesArgs {
    #[arg(help = concat!("The process: ", selector_forms!(), "; a container or pod must hold exactly one KFD process (see `gpreempt ps`)."))]
    #[arg(value_name = "SEL")]
    pub process: Selector,
    /// Print JSON on stdout instead of a table.
    #[arg(short, long)]
    pub json: bool,
    /// Print only queue ids, one per line.
    #[arg(long)]
    pub ids_only: bool,
    /// Sample every INTERVAL (e.g. 100ms) instead of once; needs --duration.
    #[arg(long, value_parser = duration::with_unit("ms"), value_name = "INTERVAL", requires = "duration")]
    pub watch: Option<Duration>,
    /// With --watch: how long to sample (e.g. 10s).
    #[arg(long, value_parser = duration::with_unit("s"), value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// With --watch: sysfs alone, without the in-process tracer. By default the tracer (root,
    /// BTF) is attached while watching and fills, for the queues created during the watch, what
    /// sysfs lacks: ring address (RING), read/write index addresses (RPTR, WPTR), CWSR area
    /// (CWSR, CWSR_SIZE), and in the "created while watching" table the priority, doorbell offset
    /// and creation/destruction times. It sees a queue only at its CREATE_QUEUE, so queues made
    /// before the watch began show sysfs's columns only. Tracing calls no debug-trap ioctl.
    #[arg(long, requires = "watch")]
    pub no_trace: bool,
    /// Opt-in: take a KFD debug-trap snapshot instead of reading sysfs (opens /dev/kfd; root, KFD
    /// ≥ 1.13): ring, read and write pointer and CWSR addresses, exception bits. DISTURBS THE GPU:
    /// gpreempt ptrace-seizes the process and enables debugging on it; the debug ENABLE and DISABLE
    /// each refresh the hardware scheduler's runlist, which preempts every queue of every process
    /// on the GPU (twice), and on some GPUs reserve a debug VMID while the session lasts.
    #[arg(long)]
    pub debug_snapshot: bool,
    /// Read a captured /sys tree from DIR instead of the live one.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Read a captured /proc tree from DIR (process identity).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct PreemptArgs {
    #[arg(help = concat!(
        "The processes whose queues are suspended (the offline work), space-separated selectors: ",
        selector_forms!(),
        ". With more than one process, each cycle suspends all of them, holds, and resumes all; \
         processes that open /dev/kfd in a selected container or pod later are attached for the \
         next cycle, and the JSON has one record per target (`\"version\": 2`). A pid named here \
         that exits during the run is detached, the others go on, and the command then exits with \
         status 1; a container's processes may exit without failing the run."
    ))]
    #[arg(long, value_name = "SEL", num_args = 1.., required = true)]
    pub offline: Vec<Selector>,
    /// Suspend/resume cycles (at least 1).
    #[arg(long, default_value_t = 100, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// How long the queues stay suspended per iteration, e.g. 100ms.
    #[arg(long, default_value = "100ms", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    pub hold: Duration,
    /// Pause between a resume and the next suspend, e.g. 500ms.
    #[arg(long, default_value = "500ms", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    pub gap: Duration,
    /// CWSR grace period in units of 1000 GPU cycles (HWS only; 0 = shortest, as ROCdbgapi uses),
    /// or `driver` to leave the driver's setting.
    #[arg(long, default_value = "0", value_parser = parse_grace_period, value_name = "N|driver")]
    pub grace_period: u32,
    /// Which queues: `all` (every queue, re-snapshotted when new ones appear) or ids `0,1,5`.
    #[arg(long, default_value = "all", value_parser = parse_queue_selection, value_name = "all|ID,...")]
    pub queues: QueueSelectionArg,
    /// Resume automatically (watchdog) if queues stay suspended longer than this, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    pub max_suspend: Duration,
    /// Print every iteration record and the summary as one JSON document on stdout (the text
    /// summary then goes to stderr).
    #[arg(short, long)]
    pub json: bool,
    /// Write every iteration record and the summary to FILE as JSON (the text summary stays on
    /// stdout).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// No per-iteration progress line.
    #[arg(short, long)]
    pub quiet: bool,
    #[arg(help = concat!(
        "The latency-critical process sharing the GPU, to report how often the device-wide unmaps \
         preempted its queues (needs the tracer): ",
        selector_forms!(),
        "; a container or pod must hold exactly one KFD process."
    ))]
    #[arg(long, value_name = "SEL")]
    pub online: Option<Selector>,
    /// Do not attach the tracer (no kernel-side breakdown: fence wait, collateral queues).
    #[arg(long)]
    pub no_trace: bool,
    /// Older spelling: --hold with a unit.
    #[arg(long = "hold-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "hold")]
    pub hold_ms: Option<OldDuration>,
    /// Older spelling: --gap with a unit.
    #[arg(long = "gap-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "gap")]
    pub gap_ms: Option<OldDuration>,
    /// Older spelling: --max-suspend with a unit.
    #[arg(long = "max-suspend-ms", hide = true, value_parser = old_in("ms"), conflicts_with = "max_suspend")]
    pub max_suspend_ms: Option<OldDuration>,
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
    /// Print JSON on stdout instead of a table: one object, {"processes": [...], "notes": [...]}
    /// (and "hw" with --hw); with --wait-new, one process object per line.
    #[arg(short, long)]
    pub json: bool,
    /// Add the hardware view from debugfs and check KFD queues vs MQDs vs active HQD slots.
    #[arg(long)]
    pub hw: bool,
    /// Block until a new KFD process appears (in --container if given), print it and exit; says
    /// on stderr what it waits for. Ends at --timeout (exit status 1), and at once when KFD is
    /// absent.
    #[arg(long)]
    pub wait_new: bool,
    /// Only processes in this container (name, full id or id prefix, as container:NAME selects).
    #[arg(long, value_name = "NAME_OR_ID")]
    pub container: Option<String>,
    /// With --wait-new: give up after this long (e.g. 30s, 1h) with exit status 1; 0 waits
    /// without a bound.
    #[arg(long, value_parser = duration::with_unit("s"), value_name = "DURATION", default_value = "10m",
          requires = "wait_new")]
    pub timeout: Duration,
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
    /// JSON Lines recordings (`gpreempt trace --json` or `trace -o FILE`), one per run.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print the analysis as one JSON object on stdout.
    #[arg(short, long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Configuration file (TOML; see deploy/agent.toml): its policies name processes by selectors
    /// (a host pid, container:NAME, pod:NAMESPACE/NAME or pod-label:KEY=VALUE). Without it: defaults, no policies.
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Validate FILE as --config would (its syntax, every policy's selectors and settings, and
    /// policies that contradict one another) and exit: 0 valid, 1 with every problem named. Starts
    /// nothing and needs neither root nor a GPU.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "metrics_addr", "hostname"])]
    pub check: Option<PathBuf>,
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
    /// Print one snapshot as JSON on stdout after one --interval of tracing, and exit: {"ts_ns",
    /// "processes": [{"pid", "ns_pid", "comm", "container", "pod", "gpus": [{"gpu_id", "queues":
    /// [{"queue_id", "queue_type", "state", "state_seen"}]}], "evictions", "suspends"}], "gpus",
    /// "spans", "scheduler", "tracer"} (processes in the --sort order, --filter applied).
    #[arg(short, long, conflicts_with = "once")]
    pub json: bool,
    /// How often the view refreshes (e.g. 500ms, 2s).
    #[arg(long, value_parser = duration::with_unit("s"), default_value = "1s", value_name = "DURATION")]
    pub interval: Duration,
    /// The process table's order (the `s` key cycles through them; counts sort largest first).
    #[arg(long, value_enum, default_value = "pid")]
    pub sort: gpreempt::views::top::SortKey,
    /// Show only processes whose pid, command, container or pod contains TEXT (case-insensitive).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub filter: String,
    /// Where a `gpreempt agent` serves its metrics (IP:PORT), to show its schedulers' per-GPU
    /// state. The DaemonSet's agent listens on its pod's IP, not the node's loopback: pass that
    /// IP (`kubectl -n gpreempt get pod -o wide`), or `kubectl port-forward` it to 127.0.0.1:9464.
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
    /// Print the report as one JSON object on stdout.
    #[arg(short, long)]
    pub json: bool,
    /// Read a captured /sys tree from DIR instead of the live one (module parameters, BTF).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Read a captured debugfs tree from DIR instead of /sys/kernel/debug.
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/debug")]
    pub debugfs_root: PathBuf,
    /// Read a captured /proc tree from DIR (kallsyms, kernel release, Yama, capabilities).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Print JSON Lines on stdout (one object per event, then a summary object) instead of text.
    #[arg(short, long)]
    pub json: bool,

    /// Only show events of this host pid (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Stop after this long (e.g. 30s, 5m, 500ms); default: until Ctrl-C.
    #[arg(long, value_parser = duration::with_unit("s"), value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// Colour: auto (only on a terminal), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,

    /// Also write the JSON Lines stream to FILE (the console keeps its text lines).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Only show processes in this container (name, full id or id prefix, as container:NAME
    /// selects; from cgroup paths).
    #[arg(long, value_name = "NAME_OR_ID")]
    pub container: Option<String>,

    /// Print the live PID → queue map this often (e.g. 5s); it is also printed on SIGUSR1 and at exit.
    #[arg(long, value_parser = duration::with_unit("s"), value_name = "DURATION")]
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use gpreempt::{domain::HostPid, host::select::Selector};

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gpreempt").chain(args.iter().copied()))
    }

    #[test]
    fn the_definitions_are_consistent_and_every_visible_option_has_help() {
        let mut cli = Cli::command();
        cli.build();
        cli.clone().debug_assert();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                assert!(arg.get_help().is_some(), "`{} --{}` has no help", sub.get_name(), arg.get_id());
            }
        }
    }

    #[test]
    fn trace_flags_parse() {
        let cli = parse(&["trace", "-j", "-p", "7", "--pid", "9", "--duration", "1s", "-o", "t.jsonl"]).unwrap();
        let Command::Trace(t) = cli.command else { panic!("not trace") };
        assert!(t.json);
        assert_eq!(t.pids, vec![7, 9]);
        assert_eq!(t.duration, Some(Duration::from_secs(1)));
        assert_eq!(t.output, Some(PathBuf::from("t.jsonl")));
        let cli = parse(&[
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
        let err = parse(&["trace", "--duration", "30"]).unwrap_err().to_string();
        assert!(err.contains("`30` has no unit: write 30s"), "{err}");
    }

    #[test]
    fn preempt_flags_parse_with_defaults() {
        let cli = parse(&["preempt", "--offline", "42", "container:trainer", "-q"]).unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!(p.offline, vec![Selector::Pid(HostPid(42)), Selector::Container("trainer".into())]);
        assert!(p.quiet);
        let cli = parse(&["preempt", "--offline", "42", "--iterations", "1000"]).unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!(
            (p.offline, p.iterations, p.hold, p.gap, p.grace_period),
            (vec![Selector::Pid(HostPid(42))], 1000, Duration::from_millis(100), Duration::from_millis(500), 0)
        );
        assert_eq!(
            (p.queues, p.max_suspend, p.json, p.output),
            (QueueSelectionArg::All, Duration::from_secs(5), false, None)
        );
        let cli = parse(&[
            "preempt",
            "--offline",
            "1",
            "--queues",
            "0, 3",
            "--grace-period",
            "driver",
            "--hold",
            "20ms",
            "--gap",
            "0ms",
            "-j",
            "-o",
            "r.json",
            "--online",
            "pod:web/api-*",
        ])
        .unwrap();
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!((p.queues, p.grace_period), (QueueSelectionArg::Ids(vec![0, 3]), 0xffff_ffff));
        assert_eq!(
            (p.hold, p.gap, p.json, p.output),
            (Duration::from_millis(20), Duration::ZERO, true, Some("r.json".into()))
        );
        assert_eq!(p.online, Some("pod:web/api-*".parse().unwrap()));
        let err = parse(&["preempt", "--offline", "1", "--queues", "0,3,0"]).unwrap_err();
        assert!(err.to_string().contains("queue id 0 is given twice; list each queue once"), "{err}");
        let err = parse(&["preempt", "--offline", "1", "--queues", "0,x"]).unwrap_err();
        assert!(err.to_string().contains("`x` is not a queue id (0-1023)"), "{err}");
        assert!(parse(&["queues", "7", "--watch", "100ms"]).is_err());
    }

    #[test]
    fn zero_iterations_and_bare_durations_are_usage_errors() {
        let err = parse(&["preempt", "--offline", "1", "--iterations", "0"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("invalid value '0' for '--iterations <N>': 0 is not in 1..="), "{err}");
        let err = parse(&["preempt", "--offline", "1", "--hold", "20"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("`20` has no unit: write 20ms"), "{err}");
        let err = parse(&["schedule", "--online", "1", "--offline", "2", "--poll", "200"]).unwrap_err();
        assert!(err.to_string().contains("`200` has no unit: write 200us"), "{err}");
    }

    #[test]
    fn old_flags_still_work_and_say_what_replaces_them() {
        let mut cli =
            parse(&["preempt", "--offline", "1", "--hold-ms", "20", "--gap-ms", "5", "--max-suspend-ms", "900"])
                .unwrap();
        assert_eq!(
            cli.deprecations(),
            [
                "--hold-ms is an older spelling kept as an alias: write --hold 20ms",
                "--gap-ms is an older spelling kept as an alias: write --gap 5ms",
                "--max-suspend-ms is an older spelling kept as an alias: write --max-suspend 900ms",
            ]
        );
        let Command::Preempt(p) = cli.command else { panic!("not preempt") };
        assert_eq!(
            (p.hold, p.gap, p.max_suspend),
            (Duration::from_millis(20), Duration::from_millis(5), Duration::from_millis(900))
        );
        let mut cli = parse(&[
            "schedule",
            "--online",
            "1",
            "--offline",
            "2",
            "--idle-ms",
            "0.5",
            "--poll-us",
            "300",
            "--occupancy-us",
            "2000",
            "--share-window-ms",
            "250",
            "--max-suspend-ms",
            "400",
            "--interval-ms",
            "200",
        ])
        .unwrap();
        assert_eq!(cli.deprecations().len(), 6);
        let Command::Schedule(s) = cli.command else { panic!("not schedule") };
        assert_eq!(
            (
                s.settings.idle,
                s.settings.poll,
                s.settings.occupancy,
                s.settings.share_window,
                s.settings.max_suspend,
                s.interval
            ),
            (
                Duration::from_micros(500),
                Duration::from_micros(300),
                Duration::from_millis(2),
                Duration::from_millis(250),
                Duration::from_millis(400),
                Duration::from_millis(200)
            )
        );
        // Old and new spelling of the same setting at once: which one was meant?
        let err = parse(&["preempt", "--offline", "1", "--hold-ms", "20", "--hold", "5ms"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let mut cli = parse(&["preempt", "--offline", "1"]).unwrap();
        assert!(cli.deprecations().is_empty());
    }

    #[test]
    fn preempt_json_file_becomes_output() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let (args, warning) = rewrite_legacy_json(os(&[
            "gpreempt",
            "--log",
            "info",
            "preempt",
            "--offline",
            "1",
            "--json",
            "r.json",
            "-q",
        ]));
        assert_eq!(args, os(&["gpreempt", "--log", "info", "preempt", "--offline", "1", "--output", "r.json", "-q"]));
        assert_eq!(
            warning.as_deref(),
            Some(
                "`preempt --json FILE` is an older spelling kept as an alias: write -o/--output r.json (--json now prints the JSON on stdout)"
            )
        );
        let (args, warning) = rewrite_legacy_json(os(&["gpreempt", "preempt", "--json=r.json", "--offline", "1"]));
        assert_eq!(
            (args, warning.is_some()),
            (os(&["gpreempt", "preempt", "--output", "r.json", "--offline", "1"]), true)
        );
        // A switch stays a switch; other commands and `--` are left alone.
        for argv in [
            &["gpreempt", "preempt", "--json", "--offline", "1"][..],
            &["gpreempt", "preempt", "--offline", "1", "--json"],
            &["gpreempt", "doctor", "--json"],
            &["gpreempt", "trace", "--json", "--", "x", "--json", "y"],
        ] {
            assert_eq!(rewrite_legacy_json(os(argv)), (os(argv), None));
        }
    }

    #[test]
    fn schedule_takes_several_selectors_per_side() {
        let cli = parse(&[
            "schedule",
            "--online",
            "10",
            "container:vllm",
            "pod:web/api-*",
            "--offline",
            "20",
            "--idle",
            "0.5ms",
            "--offline-min-share",
            "0.2",
            "-j",
        ])
        .unwrap();
        let Command::Schedule(s) = cli.command else { panic!("not schedule") };
        assert_eq!(
            s.online,
            vec![Selector::Pid(HostPid(10)), Selector::Container("vllm".into()), "pod:web/api-*".parse().unwrap()]
        );
        assert_eq!(s.offline, vec![Selector::Pid(HostPid(20))]);
        assert_eq!(
            (s.settings.idle, s.settings.offline_min_share, s.settings.poll, s.settings.max_suspend, s.json),
            (Duration::from_micros(500), 0.2, Duration::from_micros(200), Duration::from_secs(5), true)
        );
        assert_eq!(
            (s.settings.occupancy, s.settings.share_window, s.interval),
            (Duration::from_millis(10), Duration::from_secs(1), Duration::from_secs(1))
        );
        let err = parse(&["schedule", "--online", "1", "--offline", "vllm"]).unwrap_err();
        assert!(err.to_string().contains("`vllm` is none of: a host pid, container:NAME, pod:NAMESPACE/NAME"), "{err}");
        let err = parse(&["schedule", "--online", "1", "--offline", "2", "--offline-min-share", "1"]).unwrap_err();
        assert!(err.to_string().contains("`1` is not a share in [0, 1)"), "{err}");
        assert!(parse(&["schedule", "--online", "1"]).is_err());
    }
}
