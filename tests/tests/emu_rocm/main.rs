//! Debian's ROCm 5.2 user space on the emulated GPUs (`tests/kfd-emu`, README "ROCm"): the
//! unmodified `rocminfo` (package `rocminfo`, with `libhsa-runtime64-1` and `libhsakmt1`, which
//! `cargo xtask setup` installs) lists both emulated GPUs as gfx90a agents, through kfd_emu's
//! topology and ioctls and amdgpu_emu's render nodes. Runs in the emulator VM pass of
//! `cargo xtask test`; each test loads amdgpu_emu (built beside kfd_emu) and unloads it at the end,
//! which must leave kfd_emu without references and the kernel log without a warning.
//!
//! One module per section (below); the shared set-up is in `gpreempt_tests::render_nodes`
//! (amdgpu_emu loaded for one test at a time), `emulator` (what the emulated GPUs show) and
//! `rocm_run` (the ROCm programs run). The tests themselves are declared here, at the crate root, each calling its section's
//! function of the same name: their names are what `cargo xtask test` selects with `--exact`
//! (`FOCUSED` in xtask/src/test.rs) and what [`run_in_child`] runs again, so a test keeps its
//! name whichever file its body is in.

use std::process::{Command, Stdio};

use gpreempt_tests::wait_kfd_released;

mod emulator;
mod gpreempt_on_rocm;
mod hip;
mod ioctls;
mod packets;
mod preempt_rocm;
mod rocm_run;
mod rocminfo;
mod sdma;

// ---- rocminfo (rocminfo.rs) ----

#[test]
fn rocminfo_lists_both_emulated_gpus_as_gfx90a_agents() {
    rocminfo::rocminfo_lists_both_emulated_gpus_as_gfx90a_agents();
}

#[test]
fn a_rocm_process_killed_mid_run_is_released_and_the_modules_unload() {
    rocminfo::a_rocm_process_killed_mid_run_is_released_and_the_modules_unload();
}

// ---- the ioctls ROCm issues, one by one, with the kernel's answers (README "ROCm"; ioctls.rs) ----

#[test]
fn rocms_open_memory_and_event_ioctls_have_the_kernels_answers() {
    ioctls::rocms_open_memory_and_event_ioctls_have_the_kernels_answers();
}

#[test]
fn rocm_hsa_queue_create_makes_kfd_queues_on_both_gpus_with_rocrs_amd_queue_t() {
    ioctls::rocm_hsa_queue_create_makes_kfd_queues_on_both_gpus_with_rocrs_amd_queue_t();
}

// ---- ROCr's packets executed by the emulated CP (README "ROCm's packets"; packets.rs) ----

#[test]
fn rocm_dispatches_barriers_and_interrupt_signals_complete_on_the_emulated_cp() {
    packets::rocm_dispatches_barriers_and_interrupt_signals_complete_on_the_emulated_cp();
}

#[test]
fn amd_barrier_value_packets_wait_for_their_condition_and_an_unknown_condition_stops_the_queue() {
    packets::amd_barrier_value_packets_wait_for_their_condition_and_an_unknown_condition_stops_the_queue();
}

#[test]
fn an_agent_dispatch_packet_stops_a_rocm_queue_with_a_packet_exception_not_a_warning() {
    packets::an_agent_dispatch_packet_stops_a_rocm_queue_with_a_packet_exception_not_a_warning();
}

#[test]
fn a_rocm_process_killed_mid_dispatch_is_released_and_the_modules_unload() {
    packets::a_rocm_process_killed_mid_dispatch_is_released_and_the_modules_unload();
}

#[test]
fn gpreempt_preempt_refuses_rocm_5_2_with_the_cause_and_its_dispatches_all_complete() {
    packets::gpreempt_preempt_refuses_rocm_5_2_with_the_cause_and_its_dispatches_all_complete();
}

// ---- HIP (Debian's hipcc; bookworm's HIP 5.2, trixie's 5.7) on the emulated GPU (README "HIP"; hip.rs) ----

#[test]
fn a_rocm_hip_program_with_streams_events_and_copies_runs_to_completion_on_the_emulated_gpu() {
    hip::a_rocm_hip_program_with_streams_events_and_copies_runs_to_completion_on_the_emulated_gpu();
}

#[test]
fn a_rocm_hip_program_killed_with_its_sdma_queues_is_released_and_the_modules_unload() {
    hip::a_rocm_hip_program_killed_with_its_sdma_queues_is_released_and_the_modules_unload();
}

#[test]
fn a_hip_5_7_program_on_rocr_6_1_runs_its_streams_with_barrier_value_markers_and_sdma_copies() {
    hip::a_hip_5_7_program_on_rocr_6_1_runs_its_streams_with_barrier_value_markers_and_sdma_copies();
}

#[test]
fn gpreempt_preempt_suspends_a_hip_5_7_program_mid_kernel_and_its_results_come_back_exact() {
    hip::gpreempt_preempt_suspends_a_hip_5_7_program_mid_kernel_and_its_results_come_back_exact();
}

// ---- the SDMA engines' packets, written by hand (README "SDMA"; sdma.rs) ----

#[test]
fn rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op() {
    sdma::rocm_sdma_packets_move_bytes_wait_and_stop_the_queue_on_an_unknown_op();
}

// ---- gpreempt on ROCm programs: trace, schedule, the agent; preempt on ROCm 6.1 (gpreempt_on_rocm.rs) ----

#[test]
fn gpreempt_preempt_suspends_rocm_6_1_mid_dispatch_and_every_dispatch_completes() {
    gpreempt_on_rocm::gpreempt_preempt_suspends_rocm_6_1_mid_dispatch_and_every_dispatch_completes();
}

#[test]
fn schedule_suspends_an_offline_job_during_each_request_of_a_rocm_program_seen_through_rocrs_queue() {
    gpreempt_on_rocm::schedule_suspends_an_offline_job_during_each_request_of_a_rocm_program_seen_through_rocrs_queue();
}

#[test]
fn trace_shows_rocrs_queue_ioctls_with_their_exact_arguments() {
    gpreempt_on_rocm::trace_shows_rocrs_queue_ioctls_with_their_exact_arguments();
}

#[test]
fn the_agent_exports_rocrs_queues_of_a_rocm_program_per_gpu() {
    gpreempt_on_rocm::the_agent_exports_rocrs_queues_of_a_rocm_program_per_gpu();
}

#[test]
fn schedule_protects_a_rocm_5_2_program_against_a_rocm_6_1_training_job() {
    gpreempt_on_rocm::schedule_protects_a_rocm_5_2_program_against_a_rocm_6_1_training_job();
}

#[test]
fn schedule_protects_a_hip_program_against_a_hip_training_job() {
    gpreempt_on_rocm::schedule_protects_a_hip_program_against_a_hip_training_job();
}

#[test]
fn evaluate_measures_a_hip_5_7_service_against_a_hip_5_7_training_job() {
    gpreempt_on_rocm::evaluate_measures_a_hip_5_7_service_against_a_hip_5_7_training_job();
}

/// Run this binary's `test` again in a child process with `env` set, where the test runs its
/// sequence (the child's KFD process lives until it exits); assert that it passed and wait for
/// its KFD process to be released.
fn run_in_child(test: &str, env: &str) {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Its libtest lines are renamed so that the harness, which sums every "test result:" line of
    // the log, counts this test once.
    let shown = text.replace("test result:", "child result:");
    assert!(out.status.success(), "{test} in a child failed:\n{shown}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "{shown}");
    wait_kfd_released(pid).unwrap();
}
