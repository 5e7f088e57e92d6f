//! Debian's unmodified `rocminfo` on the emulated GPUs: both listed as gfx90a agents, and a
//! `rocminfo` killed mid-run released.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use gpreempt_tests::{
    render_nodes::{MODULE, RenderNodes, run},
    wait_kfd_released,
};

use crate::emulator::topology;

/// `rocminfo`'s agents: `Agent N` → (`key:` → value) for the agent's top-level lines, plus
/// `Pool N Size` and `ISA 1 Name`.
fn agents(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut agents: Vec<BTreeMap<String, String>> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("Agent ") && trimmed[6..].chars().all(|c| c.is_ascii_digit()) {
            agents.push(BTreeMap::new());
            section.clear();
            continue;
        }
        let Some(agent) = agents.last_mut() else { continue };
        if trimmed.starts_with("Pool ") || trimmed.starts_with("ISA ") {
            section = format!("{trimmed} ");
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let key = if line.starts_with("  ") && !line.starts_with("   ") {
            section.clear();
            key.trim().to_owned()
        } else {
            format!("{section}{}", key.trim())
        };
        agent.entry(key).or_insert_with(|| value.trim().to_owned());
    }
    agents
}

pub(crate) fn rocminfo_lists_both_emulated_gpus_as_gfx90a_agents() {
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(Path::new("/usr/bin/rocminfo").exists(), "rocminfo is not installed: run `cargo xtask setup`");
    let nodes = RenderNodes::load();
    // The render nodes the topology names exist (DRM render minors start at 128).
    let minors: Vec<u64> = [1, 2].iter().map(|&n| topology(n)["drm_render_minor"]).collect();
    assert!(minors[0] >= 128 && minors[1] == minors[0] + 1, "render minors {minors:?}");
    for m in &minors {
        assert!(Path::new(&format!("/dev/dri/renderD{m}")).exists(), "/dev/dri/renderD{m}");
    }
    // rocminfo's own check, `lsmod | grep amdgpu`, finds the render-node module.
    let lsmod = String::from_utf8_lossy(&run("lsmod", &[]).stdout).into_owned();
    assert!(lsmod.lines().any(|l| l.starts_with("amdgpu_emu ")), "{lsmod}");

    let child = Command::new("rocminfo").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "rocminfo: {}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("ROCk module is loaded"), "{text}");
    assert!(text.contains("*** Done ***"), "{text}");
    let agents = agents(&text);
    assert_eq!(agents.len(), 3, "a CPU and two GPU agents: {agents:#?}");
    assert_eq!(agents[0]["Device Type"], "CPU");
    assert_eq!(agents[0]["Node"], "0");
    for (gpu, agent) in agents[1..].iter().enumerate() {
        let node = gpu + 1;
        let expect = [
            ("Name", "gfx90a".to_owned()),
            ("Uuid", format!("GPU-4b46445f454d550{node}")),
            ("Marketing Name", "AMD Instinct MI210".to_owned()),
            ("Vendor Name", "AMD".to_owned()),
            ("Feature", "KERNEL_DISPATCH".to_owned()),
            ("Profile", "BASE_PROFILE".to_owned()),
            ("Max Queue Number", "128(0x80)".to_owned()),
            ("Queue Min Size", "64(0x40)".to_owned()),
            ("Queue Max Size", "131072(0x20000)".to_owned()),
            ("Node", node.to_string()),
            ("Device Type", "GPU".to_owned()),
            ("Chip ID", "29711(0x740f)".to_owned()),
            ("Max Clock Freq. (MHz)", "1700".to_owned()),
            ("BDFID", ((2 + node) << 8).to_string()),
            ("Internal Node ID", node.to_string()),
            ("Compute Unit", "104".to_owned()),
            ("SIMDs per CU", "4".to_owned()),
            ("Wavefront Size", "64(0x40)".to_owned()),
            ("L1", "16(0x10) KB".to_owned()),
            ("L2", "8192(0x2000) KB".to_owned()),
            ("Pool 1 Segment", "GLOBAL; FLAGS: COARSE GRAINED".to_owned()),
            ("Pool 1 Size", "67108864(0x4000000) KB".to_owned()),
            ("Pool 2 Segment", "GROUP".to_owned()),
            ("Pool 2 Size", "64(0x40) KB".to_owned()),
            ("ISA 1 Name", "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-".to_owned()),
        ];
        for (key, value) in expect {
            assert_eq!(agent.get(key), Some(&value), "agent {} {key}: {agent:#?}", node + 1);
        }
    }
    wait_kfd_released(pid).unwrap();
    drop(nodes);
}

pub(crate) fn a_rocm_process_killed_mid_run_is_released_and_the_modules_unload() {
    let _one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(Path::new("/usr/bin/rocminfo").exists(), "rocminfo is not installed: run `cargo xtask setup`");
    let nodes = RenderNodes::load();
    let mut child = Command::new("rocminfo").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    // Killed once it holds /dev/kfd and its render nodes (ACQUIRE_VM follows the open at once).
    let proc_dir = format!("/sys/class/kfd/kfd/proc/{pid}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !Path::new(&proc_dir).exists() {
        assert!(child.try_wait().unwrap().is_none(), "rocminfo ended before it opened /dev/kfd");
        assert!(Instant::now() < deadline, "rocminfo did not open /dev/kfd within 2 min");
        thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    wait_kfd_released(pid).unwrap();
    drop(nodes);
}
