//! The TCP ports a process listens on, from `/proc`: its socket inodes (`/proc/PID/fd/*` links
//! `socket:[INODE]`) matched against the listening sockets of its network namespace
//! (`/proc/PID/net/tcp` and `tcp6`, state `0A` = `TCP_LISTEN`, include/net/tcp_states.h). The
//! tables are read through the process's own `/proc/PID/net`, so a server in a container's
//! network namespace is read in that namespace.
//!
//! What the arrival probe filters on: a request to one of these ports is a request to the process.

use std::{collections::BTreeSet, fs, io, path::Path};

use crate::domain::HostPid;

/// `st` of a listening socket in `/proc/net/tcp{,6}`.
const TCP_LISTEN: &str = "0A";

/// The socket inodes among `pid`'s open files.
pub fn socket_inodes(proc_root: &Path, pid: HostPid) -> io::Result<BTreeSet<u64>> {
    let mut inodes = BTreeSet::new();
    for entry in fs::read_dir(proc_root.join(pid.0.to_string()).join("fd"))? {
        // An fd closed between the listing and the readlink is simply not there.
        let Ok(target) = fs::read_link(entry?.path()) else { continue };
        if let Some(inode) = target.to_str().and_then(socket_inode) {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// `socket:[12345]` → 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The local ports of the listening sockets in one `/proc/net/tcp{,6}` table whose inode is in
/// `inodes`. Lines that do not parse are skipped (the header, a format this reader does not know).
pub fn listening_ports(table: &str, inodes: &BTreeSet<u64>) -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    for line in table.lines().skip(1) {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode …
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else { continue };
        if *state != TCP_LISTEN {
            continue;
        }
        let Ok(inode) = inode.parse::<u64>() else { continue };
        if !inodes.contains(&inode) {
            continue;
        }
        if let Some(port) = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok()) {
            ports.insert(port);
        }
    }
    ports
}

/// The TCP ports `pid` listens on (IPv4 and IPv6).
pub fn tcp_listening_ports(proc_root: &Path, pid: HostPid) -> io::Result<BTreeSet<u16>> {
    let inodes = socket_inodes(proc_root, pid)?;
    let mut ports = BTreeSet::new();
    if inodes.is_empty() {
        return Ok(ports);
    }
    let net = proc_root.join(pid.0.to_string()).join("net");
    for table in ["tcp", "tcp6"] {
        match fs::read_to_string(net.join(table)) {
            Ok(text) => ports.extend(listening_ports(&text, &inodes)),
            // A kernel without IPv6 has no tcp6.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from this project's machine (Linux 6.18): a server listening on 8000 (inode
    /// 41234) and 9464 (41240), one connection accepted on 8000 (41300), and another process's
    /// listener on 22 (1999).
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1999 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 41300 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:24F8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41240 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn only_the_processs_own_listening_sockets_count() {
        let inodes = BTreeSet::from([41234, 41240, 41300]);
        assert_eq!(listening_ports(TCP, &inodes), BTreeSet::from([8000]));
        assert_eq!(listening_ports(TCP6, &inodes), BTreeSet::from([9464]));
        assert_eq!(listening_ports(TCP, &BTreeSet::from([41300])), BTreeSet::new(), "a connection is no listener");
        assert_eq!(listening_ports("garbage\n1: x", &inodes), BTreeSet::new());
    }

    #[test]
    fn socket_links_name_their_inode() {
        assert_eq!(socket_inode("socket:[41234]"), Some(41234));
        assert_eq!(socket_inode("pipe:[41234]"), None);
        assert_eq!(socket_inode("/dev/kfd"), None);
    }

    #[test]
    fn a_live_listener_of_this_process_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let ports = tcp_listening_ports(Path::new("/proc"), HostPid(std::process::id())).expect("read /proc");
        assert!(ports.contains(&port), "{port} not in {ports:?}");
        drop(listener);
        let ports = tcp_listening_ports(Path::new("/proc"), HostPid(std::process::id())).expect("read /proc");
        assert!(!ports.contains(&port), "{port} still in {ports:?} after close");
    }
}
