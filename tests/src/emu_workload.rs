//! Command lines of the `emu-workload` helper (`src/bin/emu-workload.rs`) that several tests run.

/// `emu-workload online` as the tests' online server: on the emulator's first GPU (0x1000), with
/// the debug runtime enabled, `requests` requests of one 20 ms dispatch every 150 ms, started once
/// it is told `go`.
pub fn online_server(requests: &str) -> [&str; 13] {
    [
        "online",
        "--gpu-id",
        "0x1000",
        "--runtime-enable",
        "--dispatches",
        "1",
        "--dispatch-us",
        "20000",
        "--period-us",
        "150000",
        "--wait-go",
        "--requests",
        requests,
    ]
}
