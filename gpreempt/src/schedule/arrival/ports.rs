//! The watched processes' listening ports, read off the reaction thread.
//!
//! Reading a process's ports reads `/proc/PID/net/tcp` and `tcp6` ([`crate::host::sockets`]),
//! and the kernel builds those tables by walking every bucket of the namespace's TCP hash tables
//! (net/ipv4/tcp_ipv4.c `tcp_seq_start`/`established_get_first`, sized by the machine's memory,
//! not by the sockets in them): 6.6-6.9 ms here for 28 lines (a 24 GiB machine, Linux 6.18).
//! On the real-time reaction thread, that read every 2 s held a request's record for as long:
//! the native harness's request 141 (`harness run --cpu-phase vllm-mi300x`, seed 1) was taken
//! 7.5 ms after its arrival and found the offline side running at its first kernel, in every run.
//! So a thread of normal priority reads them and hands the result back; the reaction thread only
//! looks for results at its steps (a channel's `try_recv`).

use std::{
    collections::BTreeSet,
    io,
    path::PathBuf,
    sync::mpsc::{Receiver, Sender, channel},
    thread::JoinHandle,
};

use crate::{domain::HostPid, host::sockets::tcp_listening_ports, schedule::realtime::normal_footing};

/// One process's ports as read, or why they could not be.
pub type PortsRead = (HostPid, io::Result<BTreeSet<u16>>);

/// The reader thread and its two channels.
pub struct PortReader {
    /// None once dropped (the thread's loop ends when it is).
    asks: Option<Sender<HostPid>>,
    answers: Receiver<PortsRead>,
    thread: Option<JoinHandle<()>>,
}

impl PortReader {
    /// Start the reader over `proc_root` (`/proc`, or a test's fake). It runs at normal priority
    /// on the process's CPUs whatever its creator's ([`normal_footing`]).
    pub fn spawn(proc_root: PathBuf) -> io::Result<Self> {
        let (asks, asked) = channel::<HostPid>();
        let (answer, answers) = channel();
        let thread = std::thread::Builder::new().name("gpreempt-ports".into()).spawn(move || {
            normal_footing();
            for pid in asked {
                if answer.send((pid, tcp_listening_ports(&proc_root, pid))).is_err() {
                    break;
                }
            }
        })?;
        Ok(Self { asks: Some(asks), answers, thread: Some(thread) })
    }

    /// Read `pid`'s ports (the answer comes through [`PortReader::take`]).
    pub fn ask(&self, pid: HostPid) {
        if let Some(a) = &self.asks {
            // The thread ends only when this is dropped: a send cannot fail before.
            let _ = a.send(pid);
        }
    }

    /// An answer, if one is ready (never blocks).
    pub fn take(&self) -> Option<PortsRead> {
        self.answers.try_recv().ok()
    }
}

impl Drop for PortReader {
    fn drop(&mut self) {
        self.asks = None;
        if let Some(t) = self.thread.take() {
            // A read under way ends within milliseconds; the loop then sees the channel closed.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_come_from_the_reader_thread_in_order_and_a_missing_process_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let reader = PortReader::spawn(PathBuf::from("/proc")).expect("spawn the reader");
        assert!(reader.take().is_none(), "nothing asked, nothing answered");
        let me = HostPid(std::process::id());
        // Above the kernel's PID_MAX_LIMIT (4 194 304): never a process.
        let nobody = HostPid(4_194_305);
        reader.ask(me);
        reader.ask(nobody);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while got.len() < 2 && std::time::Instant::now() < deadline {
            match reader.take() {
                Some(a) => got.push(a),
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        assert_eq!(got.len(), 2, "both answered within 30 s");
        assert_eq!(got[0].0, me);
        assert!(got[0].1.as_ref().expect("our own ports").contains(&port));
        assert_eq!(got[1].0, nobody);
        assert_eq!(got[1].1.as_ref().map_err(io::Error::kind).expect_err("no such process"), io::ErrorKind::NotFound);
        // Dropped with no read under way: the thread ends and is joined.
        drop(reader);
    }
}
