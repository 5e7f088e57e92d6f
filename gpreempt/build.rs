//! Builds the eBPF programs (`gpreempt-ebpf`, nightly + bpf-linker) into `$OUT_DIR/gpreempt`,
//! which `trace::loader` embeds. `AYA_BUILD_SKIP=1` skips that for clippy/doc; an empty object
//! is written instead and the tracer then refuses to start with a message that says why.

use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().ok_or_else(|| anyhow!("no workspace dir"))?;
    let ebpf_dir = workspace.join("gpreempt-ebpf");
    let common_dir = workspace.join("gpreempt-common");
    println!("cargo:rerun-if-changed={}", common_dir.display());

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let object = out_dir.join("gpreempt");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // aya-build writes nothing in that case; the binary still has to compile.
        fs::write(&object, b"").context("write placeholder eBPF object")?;
    }
    let ebpf_dir = ebpf_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package { name: "gpreempt-ebpf", root_dir: ebpf_dir, ..Default::default() }],
        aya_build::Toolchain::Nightly,
    )
    .context("building the eBPF programs failed; run `cargo xtask setup` (needs nightly rust-src and bpf-linker)")
}
