//! Builds the eBPF programs (`gpreempt-ebpf`, nightly + bpf-linker) into `$OUT_DIR/gpreempt` and
//! `$OUT_DIR/doorbell` and `$OUT_DIR/arrival`, which `trace::loader` and `doorbell` embed. `AYA_BUILD_SKIP=1` skips that for clippy/doc; an empty object
//! is written instead and the tracer then refuses to start with a message that says why.
//!
//! The nested cargo runs with its output captured: on success nothing is printed (a build script's
//! only way to show a line is `cargo:warning=`, which would put the eBPF build's `Compiling …`
//! progress among the warnings of every build and of `cargo xtask demo`); on failure its whole
//! output goes to stderr, which cargo prints under the failed build script. The command is the one
//! aya-build 0.2 runs, with the same target directory so an existing build is reused.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow, bail};

const PACKAGE: &str = "gpreempt-ebpf";
/// The `[[bin]]` names of `gpreempt-ebpf`: the objects' file names in the target directory (the
/// tracer's probes; the scheduler's doorbell uprobe and arrival program).
const OBJECTS: [&str; 3] = ["gpreempt", "doorbell", "arrival"];

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().ok_or_else(|| anyhow!("no workspace dir"))?;
    for dir in ["gpreempt-ebpf", "gpreempt-common"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // The binary still has to compile: it embeds empty objects and says so at run time.
        for name in OBJECTS {
            fs::write(out_dir.join(name), b"").context("write placeholder eBPF object")?;
        }
        return Ok(());
    }
    let built = build_ebpf(&out_dir)?;
    for name in OBJECTS {
        let (from, to) = (built.join(name), out_dir.join(name));
        fs::copy(&from, &to).with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Runs `cargo +nightly build` of the eBPF crate for the host's bpf target; returns the directory
/// of its objects.
fn build_ebpf(out_dir: &Path) -> anyhow::Result<PathBuf> {
    let target = match env::var("CARGO_CFG_TARGET_ENDIAN")?.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported target endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    let arch = if arch.starts_with("riscv64") { "riscv64".to_owned() } else { arch };
    let target_dir = out_dir.join("aya-build/target").join(PACKAGE);
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", "nightly", "cargo", "build", "--package", PACKAGE, "--bins", "--release", "--target", target])
        .args(["-Z", "build-std=core", "--features", ""])
        .arg("--target-dir")
        .arg(&target_dir)
        // Separated by 0x1f, as CARGO_ENCODED_RUSTFLAGS wants; `--btf` keeps the BTF CO-RE needs.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
        )
        // The outer build's compiler is the stable one; the nested build must use nightly's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = cargo.output().context(
        "cannot run `rustup run nightly cargo` to build the eBPF programs; run `cargo xtask setup` (rustup, nightly)",
    )?;
    if !output.status.success() {
        for stream in [&output.stdout, &output.stderr] {
            eprint!("{}", String::from_utf8_lossy(stream));
        }
        bail!(
            "building the eBPF programs failed ({}; its output is above); run `cargo xtask setup` if nightly \
             rust-src or bpf-linker is missing",
            output.status
        );
    }
    Ok(target_dir.join(target).join("release"))
}
