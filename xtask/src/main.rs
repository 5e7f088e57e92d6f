//! gpreempt's developer and CI entry points. `cargo xtask --help` lists them.

mod bench;
mod binaries;
mod containerd;
mod demo;
mod dist;
mod fuzz;
mod image;
mod kernels;
mod kmod;
mod linkage;
mod manifests;
mod rocm6;
mod setup;
mod test;
mod text_pokes;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gpreempt developer and CI tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything this machine lacks (idempotent): nightly rust-src, bpf-linker, qemu,
    /// virtme-ng, busybox, podman, the tests' tools and Debian's ROCm/HIP 5.2, the Debian 5.10 /
    /// 6.1 / 6.12 / 7.x kernels for the VM tests, trixie's ROCm 6.1 unpacked beside them, and
    /// kubectl and kubernetes-validate for `manifests`.
    Setup,
    /// Build gpreempt, then run it as root (through `sudo -E` when not root) with the given args.
    Run {
        /// Build in release mode.
        #[arg(long)]
        release: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Boot a Debian kernel with the real amdgpu driver under software emulation and run a
    /// command in it as root with the working tree visible; returns the command's exit status.
    Vm(vm::VmArgs),
    /// Run every test layer: fmt, clippy, unit tests, then the integration tests in a VM per kernel.
    /// The last line is `N passed, M failed, K skipped` over all layers (skips: see test.rs).
    Test(test::TestArgs),
    /// The guest clock against the host's (through the shared directory's file times) and the
    /// timer floor, as JSON: run in a VM after a change to the guests' clock settings.
    ClockCheck(bench::clock_check::ClockCheckArgs),
    /// Summarise the kernel text patches a `--audit-text-pokes` boot recorded (Markdown on
    /// stdout): the functions patched, and each static key with what took it.
    TextPokes {
        /// The boot's directory, `target/vm/<kernel>`.
        dir: std::path::PathBuf,
    },
    /// The tool live in 6.12 VMs, in three parts: `gpreempt trace` on the real amdgpu driver while
    /// a built-in workload issues KFD ioctls; on the KFD emulator, an eviction, `gpreempt preempt`
    /// stopping and restarting an offline workload, and `gpreempt evaluate` measuring a service
    /// alone, co-located and under `gpreempt schedule`; Debian's ROCm user space on the emulated
    /// GPUs. `--amdgpu`, `--emulator`, `--rocm`: one part only.
    Demo(demo::DemoArgs),
    /// Build the gpreempt container image (deploy/Containerfile) offline with podman: the release
    /// binary and the shared objects it links, `FROM scratch`; tagged gpreempt:VERSION (what
    /// deploy/kubernetes runs) and gpreempt:latest.
    Image(image::ImageArgs),
    /// Render every kustomization of deploy/kubernetes (`kubectl kustomize`) and validate each
    /// object offline: built-in kinds against Kubernetes 1.29, 1.33 and the newest schemas
    /// kubernetes-validate carries, ServiceMonitor and PodMonitor against deploy/kubernetes/schemas.
    Manifests,
    /// Build the release artifacts into target/dist: a static gpreempt binary (no libc needed),
    /// a tarball with its man pages, completions, systemd unit and sample config, a Debian
    /// package, and the image gpreempt:VERSION from the same binary. `--check`: install the
    /// package in a Debian 11 root (glibc 2.31) with dpkg and run `gpreempt doctor` there (root).
    Dist(dist::DistArgs),
    /// (inside the VM) The guest half of `dist --check --guest`.
    #[command(hide = true)]
    DistGuestCheck(dist::check::GuestArgs),
    /// Run every cargo-fuzz target (record decoder, debugfs/sysfs/kallsyms/BTF parsers) briefly.
    Fuzz(fuzz::FuzzArgs),
    /// Benchmark gpreempt against bpftrace, ftrace and a minimal C program in one run (VMs on the
    /// real amdgpu driver and the KFD emulator; criterion for the userspace pipeline); writes
    /// BENCHMARKS.md and BENCHMARKS.json. `--quick`: under 5 minutes once built.
    Bench(bench::BenchArgs),
    /// (inside the VM) The guest half of `bench`.
    #[command(hide = true)]
    BenchGuest(bench::GuestArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::run(),
        Task::Run { release, args } => binaries::run_gpreempt(release, &args),
        Task::Vm(args) => vm::run(&args).and_then(|status| {
            if status == 0 { Ok(()) } else { Err(anyhow::anyhow!("command in the VM exited with status {status}")) }
        }),
        Task::Test(args) => test::run(&args),
        Task::ClockCheck(args) => bench::clock_check::run(&args),
        Task::TextPokes { dir } => text_pokes::summarise(&dir).map(|md| print!("{md}")),
        Task::Demo(args) => demo::run(&args),
        Task::Image(args) => image::run(&args),
        Task::Manifests => manifests::run(),
        Task::Dist(args) => dist::run(&args),
        Task::DistGuestCheck(args) => dist::check::guest_main(&args),
        Task::Fuzz(args) => fuzz::run_fuzz(&args),
        Task::Bench(args) => bench::run(&args),
        Task::BenchGuest(args) => bench::guest_main(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
