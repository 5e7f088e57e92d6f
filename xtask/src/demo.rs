//! `cargo xtask demo`: the tracer on the real amdgpu driver of Debian 6.12, in a VM, while a
//! built-in workload (the `kfd-client` test helper) issues KFD queue ioctls.

use anyhow::{Result, bail};

use crate::{
    setup,
    util::build_binaries,
    vm::{self, Kernel, VmArgs},
};

pub fn run() -> Result<()> {
    setup::run()?;
    let bin = build_binaries()?;
    let (gpreempt, client) = (bin.join("gpreempt"), bin.join("kfd-client"));
    let (gpreempt, client) = (gpreempt.display(), client.display());
    let script = format!(
        r#"
echo "== gpreempt trace on $(uname -r), amdgpu loaded, no GPU: every ioctl reaches the real KFD handlers"
{gpreempt} trace 2> "$GPREEMPT_VM_OUT/trace.err" &
tracer=$!
for _ in $(seq 600); do grep -q attached "$GPREEMPT_VM_OUT/trace.err" 2>/dev/null && break; sleep 0.1; done
cat "$GPREEMPT_VM_OUT/trace.err"
echo "== workload: 3 queue creates (gpu 0x1234/0x5678), 2 destroys, from kfd-client"
{client} create --gpu-id 0x1234 --type compute-aql --ring-size 65536 --priority 7 > /dev/null
{client} create --gpu-id 0x5678 --type sdma --ring-size 4096 --priority 15 > /dev/null
{client} create --gpu-id 0x1234 --type compute --ring-size 1048576 --priority 0 > /dev/null
{client} destroy --queue-id 42 > /dev/null
{client} destroy --queue-id 0 > /dev/null
sleep 1
kill -INT $tracer
wait $tracer
"#
    );
    let status = vm::run(&VmArgs {
        kernel: Kernel::V6_12,
        timeout: 600,
        memory: "2G".to_owned(),
        no_amdgpu: false,
        module: None,
        command: vec![script],
    })?;
    if status != 0 {
        bail!("the demo exited with status {status}");
    }
    Ok(())
}
