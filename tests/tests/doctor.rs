//! `gpreempt doctor` on the real driver: the KFD version and debug-trap availability of each
//! kernel of the matrix (Debian 6.1.x: KFD 1.11, no debug-trap; 6.12.117: 1.17 with it).

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
    let (minor, debug_trap) = match kernel.as_str() {
        "6.1" => (11, false),
        "6.12" => (17, true),
        other => panic!("unknown kernel {other}"),
    };
    assert_eq!(report["kfd_version"]["major"], 1);
    assert_eq!(report["kfd_version"]["minor"], minor);
    assert_eq!(report["debug_trap"], debug_trap);
    assert_eq!(report["kfd_module"], "amdgpu");
    let check = |name: &str| report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap();
    assert_eq!(check("debug-trap")["status"], if debug_trap { "ok" } else { "warn" });
    if !debug_trap {
        assert_eq!(check("debug-trap")["detail"], "absent: needs KFD ≥ 1.13, this kernel has 1.11");
    }
    assert_eq!(check("module-btf")["status"], "ok", "Debian kernels ship /sys/kernel/btf/amdgpu");
    assert_eq!(check("capabilities")["status"], "ok", "root in the VM");
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
    match std::env::var("GPREEMPT_VM_KERNEL").unwrap_or_default().as_str() {
        "6.12" => assert!(missing.is_empty(), "{missing:?}"),
        _ => {
            // 6.1: no debugger API (8 programs), no MES v12 (4), execute_queues_cpsch inlined (2).
            assert_eq!(missing.len(), expected.len() - resolved.len(), "{missing:?}");
            let suspend = missing.iter().find(|p| p["program"] == "suspend_queues_entry").unwrap();
            assert_eq!(suspend["missing_reason"], "suspend_queues appeared in KFD 1.13; this kernel has 1.11");
        }
    }
}
