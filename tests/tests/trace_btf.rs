//! Offsets from the real BTF of the kernel in the VM (`/sys/kernel/btf/vmlinux` plus the split
//! `/sys/kernel/btf/amdgpu` of Debian's own module): the tracer must find BTF mode, the
//! layout-stable offsets (docs/kfd.md §3.3) and the signature facts that differ between 6.1 and
//! 6.12 (docs/kfd.md §3.1).

use std::path::Path;

use gpreempt::trace::btf::{OffsetMode, describe, discover};
use gpreempt_tests::{skip, vm_kernel};

const BTF_DIR: &str = "/sys/kernel/btf";

#[test]
fn the_running_kernels_btf_gives_every_offset() {
    if vm_kernel() == "5.10" {
        assert!(!Path::new(BTF_DIR).join("amdgpu").exists(), "5.10 has no module BTF");
        skip!("Linux 5.10 loads no module BTF (CONFIG_DEBUG_INFO_BTF_MODULES appeared in 5.11): pointer learning");
    }
    if !Path::new(BTF_DIR).join("amdgpu").is_file() {
        skip!("{BTF_DIR}/amdgpu is absent (amdgpu not loaded, or built without module BTF)");
    }
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
    // 6.1 (KFD 1.11): (struct file *) and (uint64_t *fence_addr, …). Both pass a pid to the SMI
    // helpers; 7.3.4 passes the task_struct * (BTF of 7.3.4: kfd_smi_event_queue_eviction(struct
    // kfd_node *node, struct task_struct *task, u32 trigger)).
    let (task, dqm, pid) = match vm_kernel().as_str() {
        "6.1" => (0, 0, 1),
        "6.12" => (1, 1, 1),
        "7" => (1, 1, 0),
        other => panic!("unknown kernel {other}"),
    };
    assert_eq!((c.create_process_takes_task, c.fence_wait_takes_dqm, c.smi_arg_is_pid), (task, dqm, pid));
    // lead_thread follows a struct mutex: bit 768 on 6.12.117, bit 704 on 7.3.4 (module BTF).
    match vm_kernel().as_str() {
        "6.12" => assert_eq!(c.process_lead_thread, 96),
        "7" => assert_eq!(c.process_lead_thread, 88),
        _ => {}
    }
}
