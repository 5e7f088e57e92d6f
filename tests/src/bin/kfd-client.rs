//! A small KFD client for the integration tests and the demo: opens /dev/kfd and makes the
//! queue ioctls it is told to, with exactly the given values, then prints a JSON report
//! (`{"pid":…, "op":…, "count":…, "results":{"EINVAL":1000}, "kfd_version":"1.17", "elapsed_ns":…}`).
//! `cargo xtask bench` uses it as the load generator: the loop does nothing but the ioctl
//! (arguments built once, results tallied by errno), optionally paced to `--rate` per second.

use gpreempt_tests::{parse_u32, parse_u64};
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpreempt::kfd::{Device, uapi};

#[derive(Parser)]
#[command(about = "Issue KFD queue ioctls with chosen values (test helper)")]
struct Cli {
    #[command(subcommand)]
    op: Op,
    /// Repeat the ioctl this many times.
    #[arg(long, global = true, default_value_t = 1)]
    count: u32,
    /// Issue at most this many ioctls per second (paced in 1 ms slots); default: as fast as possible.
    #[arg(long, global = true)]
    rate: Option<u32>,
}

#[derive(Subcommand)]
enum Op {
    /// AMDKFD_IOC_CREATE_QUEUE
    Create {
        #[arg(long, value_parser = parse_u32)]
        gpu_id: u32,
        /// compute, sdma, compute-aql, sdma-xgmi or a number
        #[arg(long, default_value = "compute-aql")]
        r#type: String,
        #[arg(long, default_value_t = 65536)]
        ring_size: u32,
        #[arg(long, default_value_t = 7)]
        priority: u32,
        #[arg(long, default_value_t = 100)]
        percentage: u32,
        #[arg(long, default_value = "0x7f0000000000", value_parser = parse_u64)]
        ring_base: u64,
    },
    /// AMDKFD_IOC_DESTROY_QUEUE
    Destroy {
        #[arg(long)]
        queue_id: u32,
    },
    /// AMDKFD_IOC_UPDATE_QUEUE
    Update {
        #[arg(long)]
        queue_id: u32,
        #[arg(long, default_value = "0x7f0000000000", value_parser = parse_u64)]
        ring_base: u64,
        #[arg(long, default_value_t = 65536)]
        ring_size: u32,
        #[arg(long, default_value_t = 100)]
        percentage: u32,
        #[arg(long, default_value_t = 7)]
        priority: u32,
    },
    /// Keep /dev/kfd open (a KFD process in sysfs) for this many milliseconds.
    Hold {
        #[arg(long, default_value_t = 3000)]
        ms: u64,
    },
}

fn queue_type(name: &str) -> Result<u32> {
    Ok(match name {
        "compute" => uapi::queue_type::COMPUTE,
        "sdma" => uapi::queue_type::SDMA,
        "compute-aql" => uapi::queue_type::COMPUTE_AQL,
        "sdma-xgmi" => uapi::queue_type::SDMA_XGMI,
        other => other.parse().with_context(|| format!("unknown queue type {other}"))?,
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let device = Device::open()?;
    let version = device.version()?;
    let mut queue_ids = Vec::new();
    let op = match &cli.op {
        Op::Create { .. } => "create",
        Op::Destroy { .. } => "destroy",
        Op::Update { .. } => "update",
        Op::Hold { ms } => {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            "hold"
        }
    };
    let create_args = match &cli.op {
        Op::Create { gpu_id, r#type, ring_size, priority, percentage, ring_base } => Some(uapi::CreateQueueArgsV17 {
            base: uapi::CreateQueueArgs {
                ring_base_address: *ring_base,
                write_pointer_address: ring_base + 0x1_0000_0000,
                read_pointer_address: ring_base + 0x1_0000_0008,
                ring_size: *ring_size,
                gpu_id: *gpu_id,
                queue_type: queue_type(r#type)?,
                queue_percentage: *percentage,
                queue_priority: *priority,
                ..Default::default()
            },
            ..Default::default()
        }),
        _ => None,
    };
    let mut tally: BTreeMap<Option<i32>, u32> = BTreeMap::new();
    let started = Instant::now();
    for i in 0..cli.count {
        if let Some(rate) = cli.rate {
            // Pacing: ioctl i is due at i / rate seconds; sleep in whole slots when ahead.
            let due = Duration::from_nanos(u64::from(i) * 1_000_000_000 / u64::from(rate.max(1)));
            let now = started.elapsed();
            if due > now + Duration::from_millis(1) {
                std::thread::sleep(due - now);
            }
        }
        let result = match &cli.op {
            Op::Create { .. } => {
                let mut args = create_args.unwrap_or_default();
                // SAFETY: the addresses come from the test's command line. The real driver this
                // client runs against has no GPU: `kfd_ioctl_create_queue` finds no device for the
                // gpu_id and fails (EINVAL) before it looks at an address.
                let r = unsafe { device.create_queue(&mut args) };
                if r.is_ok() {
                    queue_ids.push(args.base.queue_id);
                }
                r
            }
            Op::Destroy { queue_id } => device.destroy_queue(*queue_id),
            Op::Update { queue_id, ring_base, ring_size, percentage, priority } => {
                let args = uapi::UpdateQueueArgs {
                    ring_base_address: *ring_base,
                    queue_id: *queue_id,
                    ring_size: *ring_size,
                    queue_percentage: *percentage,
                    queue_priority: *priority,
                };
                // SAFETY: as for the create: the addresses are the test's, and the driver without a
                // GPU has no queue to point at them.
                unsafe { device.update_queue(&args) }
            }
            Op::Hold { .. } => Ok(()),
        };
        *tally.entry(result.err().map(|e| e as i32)).or_default() += 1;
    }
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    let results: BTreeMap<String, u32> = tally
        .into_iter()
        .map(|(errno, n)| {
            (errno.map_or_else(|| "OK".to_owned(), |e| format!("{:?}", nix::errno::Errno::from_raw(e))), n)
        })
        .collect();
    let report = serde_json::json!({
        "pid": std::process::id(),
        "op": op,
        "count": cli.count,
        "results": results,
        "queue_ids": queue_ids,
        "kfd_version": version.to_string(),
        "elapsed_ns": elapsed_ns,
    });
    println!("{report}");
    Ok(())
}
