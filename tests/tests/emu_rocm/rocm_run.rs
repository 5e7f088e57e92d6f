//! The ROCm programs the tests run (`tests/rocm`, built by `cargo xtask test`), and [`RocmRun`]:
//! one of them run with amdgpu_emu loaded.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use gpreempt_tests::render_nodes::{MODULE, RenderNodes};
use gpreempt_tests::wait_kfd_released;

use crate::emulator::cp_stats;

pub(crate) fn hsa_dispatch() -> (PathBuf, PathBuf) {
    let exe = gpreempt_tests::binary("hsa-dispatch").expect(
        "tests/rocm/hsa_dispatch.c is built by `cargo xtask test` once `cargo xtask setup` installed libhsa-runtime-dev",
    );
    let hsaco = gpreempt_tests::binary("hsa-dispatch-kernel.hsaco").expect(
        "the gfx90a code object is built by `cargo xtask test` once `cargo xtask setup` installed clang-15 and lld-15",
    );
    (exe, hsaco)
}

/// `exe ARGS` with piped stdin, stdout and stderr.
pub(crate) fn spawn_piped<I, S>(exe: &Path, args: I) -> std::process::Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()))
}

/// A ROCm program run by a test: the one-test-at-a-time lock, amdgpu_emu loaded, `cp_stats`
/// before the program started, and the program with piped stdin, stdout (read as lines) and
/// stderr. [`RocmRun::end`] unloads amdgpu_emu (with its checks) before releasing the lock.
pub(crate) struct RocmRun {
    pub(crate) child: std::process::Child,
    pub(crate) pid: u32,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    pub(crate) before: BTreeMap<u32, BTreeMap<String, u64>>,
    nodes: RenderNodes,
    one: std::sync::MutexGuard<'static, ()>,
}

impl RocmRun {
    pub(crate) fn start(exe: &Path, args: &[&std::ffi::OsStr]) -> Self {
        let one = MODULE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let nodes = RenderNodes::load();
        let before = cp_stats();
        let mut child = spawn_piped(exe, args);
        let pid = child.id();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        RocmRun { child, pid, lines, before, nodes, one }
    }

    /// The program's next stdout line; a program that ended instead fails with its stderr.
    pub(crate) fn line(&mut self) -> String {
        match self.lines.next() {
            Some(line) => line.unwrap(),
            None => {
                let status = self.child.wait().unwrap();
                let mut stderr = String::new();
                std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).unwrap();
                panic!("the program ended ({status}) before its next line:\n{stderr}");
            }
        }
    }

    /// Every line left, the exit status (asserted successful, with stderr) and the program's
    /// KFD process released.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let rest: Vec<String> = self.lines.by_ref().map(Result::unwrap).collect();
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "{status}\n{}\n{stderr}", rest.join("\n"));
        wait_kfd_released(self.pid).unwrap();
        rest
    }

    pub(crate) fn json_line(&mut self) -> serde_json::Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// `hsa-dispatch requests`: start them (a line on stdin), read the `n` requests' lines and the
    /// last one, and end the program (asserted successful, its KFD process released).
    pub(crate) fn requests(&mut self, n: usize) -> Vec<serde_json::Value> {
        self.requests_then(n, serde_json::json!({"completed": n, "read_index": n, "done": true}))
    }

    /// `requests` of a program whose last line is `last` (`hip-streams requests` has no read index).
    pub(crate) fn requests_then(&mut self, n: usize, last: serde_json::Value) -> Vec<serde_json::Value> {
        std::io::Write::write_all(self.child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let requests: Vec<serde_json::Value> = (0..n).map(|_| self.json_line()).collect();
        assert_eq!(self.json_line(), last);
        assert_eq!(self.finish(), Vec::<String>::new());
        requests
    }

    pub(crate) fn end(self) {
        let RocmRun { nodes, one, .. } = self;
        drop(nodes);
        drop(one);
    }
}

pub(crate) fn hsa_dispatch_run(args: &[&str]) -> RocmRun {
    let (exe, hsaco) = hsa_dispatch();
    let mut all: Vec<&std::ffi::OsStr> = vec![hsaco.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    RocmRun::start(&exe, &all)
}
