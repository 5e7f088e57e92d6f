//! `gpreempt preempt` on a ROCr 6.1 process: the check the HIP and the gpreempt-on-ROCm sections
//! share.

use std::process::Command;

/// `gpreempt preempt` on `pid`, a ROCr 6.1 process with its utility queue and one more on the
/// first GPU: 5 cycles of 300 ms holds 100 ms apart, each suspending and resuming both queues,
/// every answer successful (its summary and its `--json` record).
pub(crate) fn preempt_two_queues_5_times(pid: u32) {
    let json = std::env::temp_dir().join(format!("preempt-rocm-{pid}.json"));
    let out = Command::new(gpreempt_tests::binary("gpreempt").unwrap())
        .args(["preempt", "--offline", &pid.to_string(), "--iterations", "5", "--hold", "300ms", "--gap", "100ms"])
        .args(["--no-trace", "--output"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().next(), Some("5 of 5 iterations, 5 fully successful (100.0%)"), "{stdout}");
    assert_eq!(
        stdout.lines().nth(1),
        Some("queues suspended in total: 10; INVALID answers: 0; ERROR answers: 0"),
        "{stdout}"
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    for it in doc["iterations"].as_array().unwrap() {
        assert_eq!((it["suspended"].as_i64(), it["resumed"].as_i64()), (Some(2), Some(2)), "{it}");
    }
}
