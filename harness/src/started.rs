//! What one state's run has started — the model GPUs' driver threads, the client processes, the
//! scheduler, the threads that watch the run — owned in one place so that every way out of the
//! run stops it. A run that returned early on an error (or panicked) used to leave the model GPUs
//! serving and the clients running on through the scenarios after it, their load and CPU time
//! charged to those.

use std::{
    io::{self, Read},
    mem::MaybeUninit,
    process::{Child, ChildStdout, ExitStatus},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver},
    },
    thread::JoinHandle,
};

use anyhow::{Context, Result, bail};
use gpreempt::schedule::Scheduler;

use crate::{
    client::ClientResult,
    gpu::ModelGpu,
    shm::{Shm, futex_wake, ring},
};

/// Dropping it stops, in this order: the scheduler (it resumes and detaches the offline clients
/// through the model), the clients not collected yet (told to stop, then killed), the watching
/// threads (joined: a client they wait on is dead by then), the clients (reaped), the model GPUs
/// (their drivers joined), and removes the served client's cgroup. The normal path collects the clients itself and then drops it.
pub struct Started {
    shm: Arc<Shm>,
    gpus: Vec<Arc<ModelGpu>>,
    gpu_stop: Arc<AtomicBool>,
    drivers: Vec<JoinHandle<()>>,
    /// In the order adopted; `None` once collected.
    clients: Vec<Option<Child>>,
    /// Set once started; taken by the run.
    pub scheduler: Option<Scheduler>,
    watchers: Vec<JoinHandle<()>>,
    /// The served online client's cgroup: removed after the clients are reaped (a field is
    /// dropped after `drop` ran).
    pub cgroup: Option<crate::cgroup::OwnCgroup>,
}

impl Started {
    /// Starts each GPU's driver thread (`model-gpu-INDEX`).
    pub fn new(shm: Arc<Shm>, gpus: Vec<Arc<ModelGpu>>) -> Result<Self> {
        let mut started = Self {
            shm,
            gpus: Vec::new(),
            gpu_stop: Arc::new(AtomicBool::new(false)),
            drivers: Vec::new(),
            clients: Vec::new(),
            scheduler: None,
            watchers: Vec::new(),
            cgroup: None,
        };
        for g in gpus {
            // Pushed before the next spawn can fail, so that a failure stops the ones started.
            let (gpu, stop) = (g.clone(), started.gpu_stop.clone());
            let driver =
                std::thread::Builder::new().name(format!("model-gpu-{}", g.index)).spawn(move || gpu.run(&stop))?;
            started.gpus.push(g);
            started.drivers.push(driver);
        }
        Ok(started)
    }

    /// Owns a client process just spawned; returns its index.
    pub fn adopt(&mut self, child: Child) -> usize {
        self.clients.push(Some(child));
        self.clients.len() - 1
    }

    /// Runs `f` on a thread of its own, joined when this is dropped; its result comes through
    /// the receiver (which errs if `f` panicked).
    pub fn spawn<T: Send + 'static>(&mut self, f: impl FnOnce() -> T + Send + 'static) -> Result<Receiver<T>> {
        let (tx, rx) = mpsc::sync_channel(1);
        let watcher = std::thread::Builder::new().spawn(move || {
            // The receiver may be gone (the run ended early): the result is then no one's.
            let _ = tx.send(f());
        })?;
        self.watchers.push(watcher);
        Ok(rx)
    }

    /// Client `i`'s output and exit, for a thread to wait on while this keeps the process (and
    /// reaps it: [`Self::collect_from`]).
    pub fn watch(&mut self, i: usize) -> Result<ClientWatch> {
        let child = self.clients.get_mut(i).and_then(Option::as_mut).context("no such client")?;
        let stdout = child.stdout.take().context("the client's output is already taken")?;
        Ok(ClientWatch { pid: child.id(), stdout })
    }

    /// Tells every client to stop (the offline ones run until told).
    pub fn stop_clients(&self) {
        self.shm.stop.store(1, Ordering::Release);
        for w in &self.shm.client_wake {
            ring(w);
        }
        futex_wake(&self.shm.barrier_generation);
    }

    /// Reads client `i`'s output to its end, reaps it, and parses its result.
    pub fn collect(&mut self, i: usize) -> Result<ClientResult> {
        let mut out = Vec::new();
        if let Some(stdout) = self.clients.get_mut(i).and_then(Option::as_mut).and_then(|c| c.stdout.as_mut()) {
            stdout.read_to_end(&mut out).context("reading a client's result")?;
        }
        self.collect_from(i, &out)
    }

    /// Reaps client `i`, whose output a [`ClientWatch`] read as `out`, and parses its result.
    pub fn collect_from(&mut self, i: usize, out: &[u8]) -> Result<ClientResult> {
        let mut child = self.clients.get_mut(i).and_then(Option::take).context("no such client")?;
        parse(child.wait()?, out)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        drop(self.scheduler.take());
        self.stop_clients();
        for child in self.clients.iter_mut().flatten() {
            // An error here means it has exited already; it is reaped below either way.
            let _ = child.kill();
        }
        for watcher in self.watchers.drain(..) {
            let _ = watcher.join();
        }
        for mut child in self.clients.drain(..).flatten() {
            let _ = child.wait();
        }
        self.gpu_stop.store(true, Ordering::Release);
        for g in &self.gpus {
            ring(&self.shm.doorbell[g.index]);
        }
        for driver in self.drivers.drain(..) {
            let _ = driver.join();
        }
    }
}

/// A client's output and exit, watched from another thread; the process stays [`Started`]'s.
pub struct ClientWatch {
    pid: u32,
    stdout: ChildStdout,
}

impl ClientWatch {
    /// Until the client has exited: its output. The client is left unreaped, so its pid stays
    /// its own until [`Started`] reaps it (and can still kill it meanwhile).
    pub fn wait(mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.stdout.read_to_end(&mut out)?;
        let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
        loop {
            // SAFETY: `info` is a siginfo_t waitid may write; WNOWAIT leaves the child a zombie,
            // so no other waiter loses it.
            let r = unsafe { libc::waitid(libc::P_PID, self.pid, info.as_mut_ptr(), libc::WEXITED | libc::WNOWAIT) };
            if r == 0 {
                return Ok(out);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

fn parse(status: ExitStatus, out: &[u8]) -> Result<ClientResult> {
    if !status.success() {
        bail!("a client process failed: {status}");
    }
    let line = String::from_utf8_lossy(out);
    serde_json::from_str(line.trim()).context("parsing a client's result")
}

#[cfg(test)]
mod tests {
    use std::{
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;
    use crate::{
        gpu::core::{Bound, GpuCore},
        shm::fresh_path,
    };

    /// The threads of this process named `name`.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                std::fs::read_to_string(t.as_ref().unwrap().path().join("comm")).is_ok_and(|c| c.trim_end() == name)
            })
            .count()
    }

    fn alive(pid: u32) -> Result<(), io::Error> {
        // SAFETY: signal 0 checks that the pid exists; nothing is sent.
        if unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// A run that starts a model GPU, a client that would run for a minute and a thread that
    /// waits for it, then fails (`Err`) or panics half-way: the pid of its client.
    fn half_way(shm: &Arc<Shm>, gpu: &Arc<ModelGpu>, token: &Arc<()>, panics: bool, pid: &mut u32) -> Result<()> {
        let mut started = Started::new(shm.clone(), vec![gpu.clone()])?;
        let client = Command::new("sleep").arg("60").stdin(Stdio::null()).stdout(Stdio::piped()).spawn()?;
        *pid = client.id();
        let i = started.adopt(client);
        let watch = started.watch(i)?;
        let held = token.clone();
        let _exited = started.spawn(move || {
            let _held = held;
            watch.wait()
        })?;
        // This test, the run and the driver thread hold the GPU; the watcher holds the token.
        assert_eq!(Arc::strong_count(gpu), 3);
        assert_eq!(Arc::strong_count(token), 2);
        // A thread names itself once it runs.
        let named_by = Instant::now() + Duration::from_secs(5);
        while threads_named("model-gpu-3") == 0 && Instant::now() < named_by {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(threads_named("model-gpu-3"), 1);
        assert_eq!(alive(*pid).map_err(|e| e.raw_os_error()), Ok(()));
        if panics {
            panic!("half-way");
        }
        bail!("the clients did not attach within 20 s");
    }

    #[test]
    fn a_run_that_fails_or_panics_half_way_leaves_no_client_and_no_thread() {
        let shm = Arc::new(Shm::create(&fresh_path("teardown")).unwrap());
        let gpu = Arc::new(ModelGpu::new(3, GpuCore::new(Bound::Serial, 0), shm.clone()));
        for panics in [false, true] {
            let token = Arc::new(());
            let mut pid = 0;
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                half_way(&shm, &gpu, &token, panics, &mut pid)
            }));
            match outcome {
                Ok(result) => {
                    assert!(!panics);
                    assert_eq!(result.unwrap_err().to_string(), "the clients did not attach within 20 s");
                }
                Err(panic) => {
                    assert!(panics);
                    assert_eq!(panic.downcast_ref::<&str>(), Some(&"half-way"));
                }
            }
            assert_ne!(pid, 0);
            // Killed and reaped: not even a zombie holds the pid.
            assert_eq!(alive(pid).map_err(|e| e.raw_os_error()), Err(Some(libc::ESRCH)), "panics: {panics}");
            // The driver thread has ended and been joined; the watcher too.
            assert_eq!(threads_named("model-gpu-3"), 0, "panics: {panics}");
            assert_eq!(Arc::strong_count(&gpu), 1, "panics: {panics}");
            assert_eq!(Arc::strong_count(&token), 1, "panics: {panics}");
            assert_eq!(shm.stop.load(Ordering::Acquire), 1);
        }
    }
}
