//! `harness run` (one scenario, JSON on stdout), `harness suite [--quick]` (the matrix), and the
//! hidden `harness client` the harness re-executes itself as for each client process.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use harness::{
    client::{self, QueueRef},
    cpu_phase::CpuPhase,
    evaluate::evaluate,
    gpu::core::Bound,
    load::{ClientSpec, Trace},
    profile::Profile,
    scenario::{self, NO_PROBES, Online, STRESS_PROBES, Scenario, Serving, USUAL_PROBES},
    suite, timer_floor,
};

#[derive(Parser)]
#[command(about = "Native evaluation of `gpreempt schedule` against a model GPU (issue 35)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LoadArg {
    Poisson,
    AzureConv,
    AzureCode,
    Batching,
    /// No online work for --requests seconds, then one request: the scheduler's cost while it
    /// waits.
    Idle,
    /// §7.3's 1-offline point (Poisson 20/s over 2 queues, one §7 trainer).
    Section7,
}

/// Health probes and metric scrapes beside requests over TCP.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ProbesArg {
    None,
    /// `GET /health` every second, `GET /metrics` every 15 s.
    Usual,
    /// `GET /health` 20 times a second, `GET /metrics` every 15 s.
    Stress,
}

#[derive(Subcommand)]
enum Cmd {
    /// One scenario: every state, JSON on stdout, progress on stderr.
    Run {
        #[arg(long, value_enum, default_value = "poisson")]
        load: LoadArg,
        /// Offline trainers on the online GPU (ignored with --data-parallel).
        #[arg(long, default_value_t = 1)]
        offline: usize,
        /// The offline job is a 2-GPU data-parallel job instead.
        #[arg(long)]
        data_parallel: bool,
        /// The trainers are loader-bound: one step in flight, 5-25 ms of host work between steps.
        #[arg(long)]
        loader_bound: bool,
        #[arg(long, default_value = "mi300x")]
        profile: String,
        #[arg(long, value_enum, default_value = "serial")]
        bound: Bound,
        #[arg(long, value_delimiter = ',', default_value = "default")]
        variants: Vec<String>,
        #[arg(long, default_value_t = 200)]
        requests: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Send the requests over loopback TCP to the online client (in a cgroup of its own),
        /// each with this CPU phase before its first dispatch (Poisson and trace loads) or before
        /// it joins the engine's next step (batching).
        #[arg(long, value_enum)]
        cpu_phase: Option<CpuPhase>,
        /// With --cpu-phase: health probes and scrapes beside the requests.
        #[arg(long, value_enum, default_value = "none")]
        probes: ProbesArg,
    },
    /// The whole matrix (BENCHMARKS §9); `--quick`: fewer requests and sweep points.
    Suite {
        #[arg(long)]
        quick: bool,
    },
    /// The suite's arrival part alone (issue 45): the arrival matrix and packet-cost, JSON.
    Arrival {
        #[arg(long)]
        quick: bool,
    },
    /// The doorbell probe's cost per doorbell store (per kernel launch) in this process, natively:
    /// without the probe, and with it on an unregistered, a disarmed and an armed signal (root).
    StoreCost {
        #[arg(long, default_value_t = 100_000)]
        calls: usize,
    },
    /// The host's wake-up floor: a SCHED_FIFO thread in poll(2) on an eventfd, woken by another
    /// thread's write every 1-3 ms (what the reaction thread's wait on the probe pays at least).
    WakeFloor {
        #[arg(long, default_value_t = 4.0)]
        seconds: f64,
    },
    /// The arrival probe's cost per packet: a loopback request load on one keep-alive
    /// connection to a receiver in a cgroup of its own, without and with the cgroup_skb program
    /// attached (root, and a build with the eBPF objects).
    PacketCost {
        #[arg(long, default_value_t = 40_000)]
        requests: usize,
    },
    /// The receiver of packet-cost (prints its port, answers everything, ends at stdin's EOF).
    #[command(hide = true)]
    Sink,
    #[command(hide = true)]
    Client {
        #[arg(long)]
        shm: PathBuf,
        #[arg(long)]
        client: usize,
        /// SLOT:GPU, once per queue.
        #[arg(long)]
        queue: Vec<String>,
        #[arg(long)]
        spec: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Run {
            load,
            offline,
            data_parallel,
            loader_bound,
            profile,
            bound,
            variants,
            requests,
            seed,
            cpu_phase,
            probes,
        } => {
            let profile = Profile::by_name(&profile).with_context(|| format!("no profile named {profile}"))?;
            let online = match load {
                LoadArg::Poisson | LoadArg::Section7 => scenario::poisson(requests),
                LoadArg::AzureConv => Online::Trace { trace: Trace::Conv, requests },
                LoadArg::AzureCode => Online::Trace { trace: Trace::Code, requests },
                LoadArg::Batching => Online::Batching { trace: Trace::Conv, requests },
                LoadArg::Idle => Online::Idle { seconds: requests as u64 },
            };
            let offline_set = match (load, data_parallel) {
                (_, true) => scenario::data_parallel(),
                (LoadArg::Section7, false) => scenario::section7_trainer(),
                _ if loader_bound => scenario::loader_bound_trainers(offline),
                _ => scenario::trainers(offline),
            };
            let sc = Scenario {
                name: format!("{load:?}-{}-{bound:?}", profile.name).to_lowercase(),
                online,
                offline: offline_set,
                profile,
                bound,
                variants,
                seed,
                serving: cpu_phase.map(|cpu| {
                    let rates = match probes {
                        ProbesArg::None => NO_PROBES,
                        ProbesArg::Usual => USUAL_PROBES,
                        ProbesArg::Stress => STRESS_PROBES,
                    };
                    Serving::new(cpu, rates)
                }),
            };
            let floor = timer_floor::measure(1.0);
            let result = evaluate(&sc, matches!(load, LoadArg::Section7))?;
            println!("{}", serde_json::to_string(&serde_json::json!({"timer_floor_us": floor, "result": result}))?);
            Ok(())
        }
        Cmd::Suite { quick } => suite::run(quick),
        Cmd::Arrival { quick } => {
            println!("{}", serde_json::to_string(&suite::arrival(quick)?)?);
            Ok(())
        }
        Cmd::StoreCost { calls } => {
            println!("{}", serde_json::to_string(&harness::store_cost::measure(calls)?)?);
            Ok(())
        }
        Cmd::PacketCost { requests } => {
            println!("{}", serde_json::to_string(&harness::packet_cost::measure(requests)?)?);
            Ok(())
        }
        Cmd::Sink => harness::sink::run(),
        Cmd::WakeFloor { seconds } => {
            println!("{}", serde_json::to_string(&harness::wake_floor::measure(seconds))?);
            Ok(())
        }
        Cmd::Client { shm, client, queue, spec } => {
            let queues = queue
                .iter()
                .map(|q| {
                    let (s, g) = q.split_once(':').context("--queue SLOT:GPU")?;
                    Ok(QueueRef { slot: s.parse()?, gpu: g.parse()? })
                })
                .collect::<Result<Vec<_>>>()?;
            if queues.is_empty() {
                bail!("a client needs at least one --queue");
            }
            let spec: ClientSpec = serde_json::from_slice(&std::fs::read(&spec)?)?;
            let result = client::run(&shm, client, &queues, &spec)?;
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        }
    }
}
