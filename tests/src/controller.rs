//! The controller under test in the background, and the progress of an emulated queue it holds.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    os::unix::fs::FileExt,
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::Duration,
};

use crate::binary;

/// `gpreempt preempt --no-trace ARGS` in the background, returned once it has attached, with its
/// stderr lines (echoed to the test's stderr as they come). Panics if it does not attach.
pub fn spawn_preempt(args: &[&str]) -> (Child, Receiver<String>) {
    let mut child = Command::new(binary("gpreempt").unwrap())
        .args(["preempt", "--no-trace"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[gpreempt] {line}");
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(60)).expect("gpreempt preempt said nothing");
    assert!(first.starts_with("gpreempt: attached to pid "), "{first}");
    (child, rx)
}

/// A queue's read index, read from its process's memory.
pub fn rptr_now(pid: u32, address: u64) -> u64 {
    let mut buf = [0u8; 8];
    File::open(format!("/proc/{pid}/mem")).unwrap().read_exact_at(&mut buf, address).unwrap();
    u64::from_ne_bytes(buf)
}

/// The queue's read index moves within 200 ms.
pub fn advances(pid: u32, address: u64) -> bool {
    let a = rptr_now(pid, address);
    thread::sleep(Duration::from_millis(200));
    rptr_now(pid, address) > a
}
