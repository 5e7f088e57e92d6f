//! `gpreempt doctor` on the real driver: the KFD version and debug-trap availability of each
//! kernel of the matrix (Debian 5.10.223: KFD 1.3, no module BTF; 6.1.192: KFD 1.11, no
//! debug-trap; 6.12.117: 1.17 with it; 7.3.4: /dev/kfd cannot be opened without a GPU).

use std::process::Command;

use gpreempt_tests::{binary, expected_probes, field};

fn doctor() -> serde_json::Value {
    let out = Command::new(binary("gpreempt").unwrap()).args(["doctor", "--json"]).output().unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn reports_the_kfd_version_and_debug_trap_of_this_kernel() {
    let report = doctor();
    let kernel = std::env::var("GPREEMPT_VM_KERNEL").expect("run inside `cargo xtask vm` (sets GPREEMPT_VM_KERNEL)");
    let check = |name: &str| report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap();
    assert_eq!(report["kfd_module"], "amdgpu");
    assert_eq!(check("capabilities")["status"], "ok", "root in the VM");
    if kernel == "7" {
        // KFD ≥ 1.19 refuses to create a KFD process without a GPU (docs/kfd.md §1.4).
        assert_eq!(report["kfd_version"], serde_json::Value::Null);
        assert_eq!(report["debug_trap"], false);
        assert_eq!(check("kfd")["status"], "fail");
        assert_eq!(
            check("kfd")["detail"],
            "the KFD driver is loaded but has no GPU: open(/dev/kfd) fails with EINVAL (KFD ≥ 1.19 creates the \
             KFD process at open and refuses it without a GPU node; the topology lists none), so the KFD version \
             cannot be asked"
        );
        assert!(!check("kfd")["fix"].as_str().unwrap().contains("modprobe"), "{}", check("kfd"));
        assert_eq!(
            check("debug-trap")["detail"],
            "present in the driver (kfd_ioctl_set_debug_trap is loaded) but not usable: /dev/kfd cannot be opened"
        );
        assert_eq!(check("kfd-contexts")["status"], "info");
        assert_eq!(check("module-btf")["status"], "ok", "Debian 7.3.4 ships /sys/kernel/btf/amdgpu");
        return;
    }
    let (minor, debug_trap) = match kernel.as_str() {
        "5.10" => (3, false),
        "6.1" => (11, false),
        "6.12" => (17, true),
        other => panic!("unknown kernel {other}"),
    };
    assert_eq!(report["kfd_version"]["major"], 1);
    assert_eq!(report["kfd_version"]["minor"], minor);
    assert_eq!(report["debug_trap"], debug_trap);
    assert_eq!(check("kfd")["detail"], format!("KFD ioctl interface 1.{minor}"));
    assert_eq!(check("debug-trap")["status"], if debug_trap { "ok" } else { "warn" });
    if !debug_trap {
        assert_eq!(check("debug-trap")["detail"], format!("absent: needs KFD ≥ 1.13, this kernel has 1.{minor}"));
    }
    if kernel == "5.10" {
        assert_eq!(check("module-btf")["status"], "warn");
        assert_eq!(
            check("module-btf")["detail"],
            "/sys/kernel/btf/amdgpu missing: Linux 5.10.0-32-amd64 loads no module BTF \
             (CONFIG_DEBUG_INFO_BTF_MODULES appeared in 5.11)"
        );
    } else {
        assert_eq!(check("module-btf")["status"], "ok", "Debian 6.x kernels ship /sys/kernel/btf/amdgpu");
    }
}

#[test]
fn every_queue_probe_resolves_on_the_real_driver() {
    let report = doctor();
    let probes = report["probes"].as_array().unwrap();
    // The whole tracer table, resolved as this guest's kallsyms says.
    let expected = expected_probes().unwrap();
    assert_eq!(probes.len(), gpreempt::trace::probes::PROBES.len());
    let resolved: Vec<&str> = expected.iter().filter(|p| p.symbol.is_some()).map(|p| p.program).collect();
    let found: Vec<&str> =
        probes.iter().filter(|p| !p["symbol"].is_null()).map(|p| p["program"].as_str().unwrap()).collect();
    assert_eq!(found, resolved);
    for p in probes.iter().filter(|p| p["required"] == true) {
        assert_eq!(p["module"], "amdgpu", "{p}");
        assert_eq!(p["symbol"], p["function"], "no suffix on the ioctl handlers: {p}");
        assert_eq!(field(p, "missing_reason"), &serde_json::Value::Null);
    }
    let missing: Vec<&serde_json::Value> = probes.iter().filter(|p| p["symbol"].is_null()).collect();
    let reason = |program: &str| missing.iter().find(|p| p["program"] == program).unwrap()["missing_reason"].clone();
    assert_eq!(missing.len(), expected.len() - resolved.len(), "{missing:?}");
    match std::env::var("GPREEMPT_VM_KERNEL").unwrap_or_default().as_str() {
        "7" => assert!(missing.is_empty(), "{missing:?}"),
        "6.12" => {
            // set_queue_as_reset is inlined in Debian 6.12.117's amdgpu.ko (a symbol from 7.x);
            // CREATE_PROCESS came in 7.0 (2 programs).
            assert_eq!(missing.len(), 3, "{missing:?}");
            assert_eq!(
                reason("create_context_entry"),
                "kfd_ioctl_create_process appeared in KFD 1.19 (Linux 7.0); this kernel has 1.17"
            );
            assert_eq!(
                reason("set_queue_as_reset"),
                "set_queue_as_reset is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)"
            );
        }
        "6.1" => {
            // No debugger API (8 programs), no MES v12 (4), execute_queues_cpsch inlined (2), no
            // per-queue reset (1), no CREATE_PROCESS (2).
            assert_eq!(missing.len(), 17, "{missing:?}");
            assert_eq!(
                reason("suspend_queues_entry"),
                "suspend_queues appeared in KFD 1.13 (Linux 6.5); this kernel has 1.11"
            );
        }
        "5.10" => {
            // As 6.1, and no SMI helpers (2) nor MES v11 (4): 35 of 58 attach.
            assert_eq!(missing.len(), 23, "{missing:?}");
            assert_eq!(
                reason("smi_eviction"),
                "kfd_smi_event_queue_eviction appeared in KFD 1.10 (Linux 5.19); this kernel has 1.3"
            );
            assert_eq!(
                reason("mes11_add_entry"),
                "mes_v11_0_add_hw_queue appeared in Linux 6.0 (gfx11 MES); this kernel is 5.10.0-32-amd64"
            );
        }
        other => panic!("unknown kernel {other}"),
    }
}
