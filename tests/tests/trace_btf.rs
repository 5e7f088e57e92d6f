//! Offsets from the real BTF of the kernel in the VM (`/sys/kernel/btf/vmlinux` plus the split
//! `/sys/kernel/btf/amdgpu` of Debian's own module): the tracer must find BTF mode, the
//! layout-stable offsets (docs/kfd.md §3.3) and the signature facts that differ between 6.1 and
//! 6.12 (docs/kfd.md §3.1).

use std::path::Path;

use gpreempt::{
    kfd::Device,
    trace::btf::{OffsetMode, describe, discover},
};
use gpreempt_tests::skip;

const BTF_DIR: &str = "/sys/kernel/btf";

#[test]
fn the_running_kernels_btf_gives_every_offset() {
    if !Path::new(BTF_DIR).join("amdgpu").is_file() {
        skip!("{BTF_DIR}/amdgpu is absent (amdgpu not loaded, or built without module BTF)");
    }
    let debug_trap = Device::open().unwrap().version().unwrap().has_debug_trap();
    let (c, mode) = discover(Path::new(BTF_DIR), Some("amdgpu"));
    eprintln!("{mode}: {}", describe(&c));
    assert_eq!(mode, OffsetMode::Btf { module: "amdgpu".to_owned() });
    // Identical in every version read (docs/kfd.md §3.3).
    assert_eq!((c.queue_queue_id, c.qpd_pqm, c.pqm_process), (48, 8, 0));
    // Found, whatever the config puts before them.
    for (name, offset) in [
        ("kfd_process.lead_thread", c.process_lead_thread),
        ("task_struct.tgid", c.task_tgid),
        ("kfd_process.release_work", c.process_release_work),
        ("device_queue_manager.dev", c.dqm_dev),
        ("kfd_node.id", c.node_id),
    ] {
        assert!(offset != 0 && offset != u32::MAX, "{name} not found: {}", describe(&c));
    }
    // 6.12 (KFD 1.17): kfd_create_process(task_struct *), amdkfd_fence_wait_timeout(dqm, …);
    // 6.1 (KFD 1.11): (struct file *) and (uint64_t *fence_addr, …). Both pass a pid to the SMI helpers.
    let expected = u32::from(debug_trap);
    assert_eq!((c.create_process_takes_task, c.fence_wait_takes_dqm, c.smi_arg_is_pid), (expected, expected, 1));
    if debug_trap {
        // Debian 6.12.117: lead_thread at bit 768 of struct kfd_process (docs/toolchain.md).
        assert_eq!(c.process_lead_thread, 96);
    }
}
