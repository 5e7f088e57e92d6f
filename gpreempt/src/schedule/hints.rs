//! `--hint-socket PATH`: an online server that knows its request boundaries writes `begin` and
//! `end` lines to a Unix stream socket. Hints add to what the indices show: online work is
//! active while any `begin` has no `end`. Lines are parsed byte-wise; anything else (unknown
//! words, an `end` without a `begin`, over-long lines) is counted and otherwise ignored.
//!
//! The socket is read on the reaction thread at every step, and its descriptors are part of that
//! thread's wait, so a `begin` is acted on within one `--poll` (at once while the thread waits on
//! the doorbell probe), as a submission seen in the indices is.

use std::{
    io::{self, Read},
    os::{
        fd::{AsRawFd, RawFd},
        unix::net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
};

/// Longest line kept; a longer one is malformed.
const MAX_LINE: usize = 256;

/// What one line meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    Begin,
    End,
}

/// Parse one line (without its newline); surrounding blanks are ignored, case matters.
pub fn parse(line: &[u8]) -> Option<Hint> {
    match line.trim_ascii() {
        b"begin" => Some(Hint::Begin),
        b"end" => Some(Hint::End),
        _ => None,
    }
}

/// A malformed line, for the warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// The line, lossily decoded and cut to 64 characters.
    pub line: String,
    /// Malformed lines so far, this one included.
    pub count: u64,
}

/// Hint counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HintCounts {
    pub begins: u64,
    pub ends: u64,
    pub malformed: u64,
    pub connections: u64,
}

/// Open requests and counters, independent of the socket (tested alone).
#[derive(Debug, Default)]
pub struct HintState {
    open: u64,
    /// A `begin` arrived since the last [`HintState::take_activity`] (a request that began and
    /// ended between two polls still counts as online work once).
    begun: bool,
    pub counts: HintCounts,
}

impl HintState {
    /// Apply one line; returns the warning for a malformed one.
    pub fn line(&mut self, line: &[u8]) -> Option<Malformed> {
        match parse(line) {
            Some(Hint::Begin) if line.len() <= MAX_LINE => {
                self.open += 1;
                self.begun = true;
                self.counts.begins += 1;
                None
            }
            Some(Hint::End) if self.open > 0 => {
                self.open -= 1;
                self.counts.ends += 1;
                None
            }
            _ => {
                self.counts.malformed += 1;
                let text: String = String::from_utf8_lossy(line).chars().take(64).collect();
                Some(Malformed { line: text, count: self.counts.malformed })
            }
        }
    }

    /// A request is open (begun, not ended).
    pub fn active(&self) -> bool {
        self.open > 0
    }

    /// Online work per the hints since the last call: a request is open, or one began.
    pub fn take_activity(&mut self) -> bool {
        std::mem::take(&mut self.begun) || self.open > 0
    }

    /// A client went away: its open requests end with it.
    fn close(&mut self, open_by_client: u64) {
        self.open = self.open.saturating_sub(open_by_client);
    }
}

struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Requests this client has open.
    open: u64,
    /// Skipping the rest of an over-long line.
    skipping: bool,
}

/// The listening socket and its clients, polled without blocking.
pub struct HintSocket {
    path: PathBuf,
    listener: UnixListener,
    clients: Vec<Client>,
    pub state: HintState,
}

impl HintSocket {
    /// Listen at `path` (a stale socket file from an earlier run is replaced; any other existing
    /// file is an error, never removed).
    pub fn bind(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket; choose another --hint-socket path", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Self { path: path.to_path_buf(), listener, clients: Vec::new(), state: HintState::default() })
    }

    /// The listening socket's and every client's descriptor: readable when a client connects or
    /// writes (the reaction thread's wait includes them, so a `begin` ends it at once).
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        std::iter::once(self.listener.as_raw_fd()).chain(self.clients.iter().map(|c| c.stream.as_raw_fd()))
    }

    /// Accept new clients and apply every complete line received; returns the warnings.
    pub fn poll(&mut self) -> Vec<Malformed> {
        let mut warnings = Vec::new();
        while let Ok((stream, _)) = self.listener.accept() {
            if stream.set_nonblocking(true).is_ok() {
                self.state.counts.connections += 1;
                self.clients.push(Client { stream, buf: Vec::new(), open: 0, skipping: false });
            }
        }
        let state = &mut self.state;
        self.clients.retain_mut(|c| {
            let mut chunk = [0u8; 512];
            let alive = loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => break false,
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break false,
                }
            };
            while let Some(nl) = c.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = c.buf.drain(..=nl).collect();
                if std::mem::take(&mut c.skipping) {
                    continue;
                }
                let before = state.open;
                if let Some(w) = state.line(&line[..line.len() - 1]) {
                    warnings.push(w);
                }
                // Track what this client has open so its disconnect closes only its requests.
                if state.open > before {
                    c.open += 1;
                } else if state.open < before {
                    c.open = c.open.saturating_sub(1);
                }
            }
            if c.buf.len() > MAX_LINE {
                let text: Vec<u8> = c.buf.drain(..).take(64).collect();
                state.counts.malformed += 1;
                warnings.push(Malformed { line: String::from_utf8_lossy(&text).into(), count: state.counts.malformed });
                c.skipping = true;
            }
            if !alive {
                state.close(c.open);
            }
            alive
        });
        warnings
    }
}

impl Drop for HintSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn begin_and_end_lines_open_and_close_requests() {
        let mut s = HintState::default();
        assert_eq!(s.line(b"begin"), None);
        assert!(s.active());
        assert_eq!(s.line(b"  begin "), None);
        assert_eq!(s.line(b"end"), None);
        assert!(s.active());
        assert_eq!(s.line(b"end\r"), None);
        assert!(!s.active());
        assert_eq!(s.line(b"end"), Some(Malformed { line: "end".into(), count: 1 }));
        assert_eq!(s.line(b"BEGIN"), Some(Malformed { line: "BEGIN".into(), count: 2 }));
        assert_eq!(s.line(b"\xff\xfe"), Some(Malformed { line: "\u{fffd}\u{fffd}".into(), count: 3 }));
        assert!(!s.active());
        assert_eq!(s.counts, HintCounts { begins: 2, ends: 2, malformed: 3, connections: 0 });
        // A request that began and ended between two polls is seen once.
        assert!(s.take_activity());
        assert!(!s.take_activity());
        s.line(b"begin");
        s.line(b"end");
        assert!(s.take_activity());
        assert!(!s.take_activity());
    }

    #[test]
    fn a_socket_client_drives_the_state_and_its_disconnect_ends_its_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hints.sock");
        let mut sock = HintSocket::bind(&path).unwrap();
        let mut a = UnixStream::connect(&path).unwrap();
        let mut b = UnixStream::connect(&path).unwrap();
        a.write_all(b"begin\nbogus\nbeg").unwrap();
        b.write_all(b"begin\n").unwrap();
        // Poll until both clients' bytes have arrived (local sockets: at once, but not atomically).
        let mut warnings = Vec::new();
        for _ in 0..100 {
            warnings.extend(sock.poll());
            if sock.state.counts.begins == 2 && !warnings.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(warnings, vec![Malformed { line: "bogus".into(), count: 1 }]);
        assert_eq!(sock.state.counts.connections, 2);
        assert!(sock.state.active());
        drop(b);
        for _ in 0..100 {
            sock.poll();
            if sock.state.open == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(sock.state.open, 1);
        a.write_all(b"in\nend\n").unwrap();
        for _ in 0..100 {
            sock.poll();
            if sock.state.counts.begins == 3 && !sock.state.active() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // "beg" + "in" is one `begin`; one `end` leaves one open (the second begin of a).
        assert_eq!(sock.state.counts.begins, 3);
        assert_eq!(sock.state.counts.ends, 1);
        assert!(sock.state.active());
        // An over-long line is one malformed line, and the next line is read normally.
        a.write_all(&[b'x'; 1000]).unwrap();
        a.write_all(b"\nend\n").unwrap();
        for _ in 0..100 {
            sock.poll();
            if !sock.state.active() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!((sock.state.counts.malformed, sock.state.counts.ends), (2, 2));
        assert!(!sock.state.active());
        drop(sock);
        assert!(!path.exists());
        // A path that is not a socket is refused, not removed.
        std::fs::write(&path, "keep").unwrap();
        assert!(HintSocket::bind(&path).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep");
    }
}
