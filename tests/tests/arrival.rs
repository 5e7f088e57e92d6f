//! The arrival probe (`gpreempt::schedule::arrival`) on this kernel's `cgroup_skb` ingress hook:
//! an HTTP service (`emu-workload server --no-gpu --listen`, no GPU needed) in a cgroup v2
//! directory of its own, driven from this test process (outside that cgroup, so only the
//! service's side of each connection is seen). Exact counts of what the program classified, one
//! hit per arming, nothing seen on a port not watched, every answer intact, and nothing left
//! attached or loaded after the probe is dropped or its holder is killed with SIGKILL.
//!
//! Each request is written with one `write` on a TCP_NODELAY socket and answered before the next
//! is sent, so it is one segment: the counts are exact, not bounds. The program runs in softirq
//! before the segment is queued to the socket, so once the answer is back the segment has been
//! counted and its hit (if any) is in the ring buffer.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use gpreempt::{
    clock::monotonic_ns,
    domain::HostPid,
    host::{
        cgroup::{cgroup_dir, unified_mount},
        sockets::tcp_listening_ports,
    },
    schedule::arrival::{ArrivalProbe, Patterns, size::request_size},
};
use gpreempt_common::arrival::{ARMED_CREDITS, ArrivalCounts, ArrivalHit, HEAD_BYTES, PROGRAM};
use gpreempt_tests::{LineHelper, binary, target::eventually};
use serde_json::{Value, json};

/// The tests load probes into this process and count the programs named `arrival_ingress` on
/// the host: one at a time, whatever the harness's thread count.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The probe, or the calling test skipped when this kernel is older than the probe needs (ring
/// buffers: Linux 5.8; cgroup bpf_links: 5.7). On a kernel that has both, a load error fails the
/// test with the verifier's log.
macro_rules! probe_or_skip {
    () => {
        match ArrivalProbe::load(&Patterns::default()) {
            Ok(probe) => probe,
            Err(e) if kernel_below(5, 8) => {
                gpreempt_tests::skip!("the arrival probe needs Linux >= 5.8 (BPF ring buffers); loading it: {e:#?}")
            }
            Err(e) => panic!("the arrival probe did not load on Linux {}: {e:#?}", kernel_release()),
        }
    };
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_owned()
}

fn kernel_below(major: u32, minor: u32) -> bool {
    let release = kernel_release();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (major, minor)
}

/// A cgroup v2 directory of this test's, removed (empty by then) when dropped.
struct Cgroup(PathBuf);

impl Cgroup {
    /// `<cgroup2 mount>/gpreempt-arrival-<tag>-<pid>`, cgroup2 mounted at /sys/fs/cgroup first if
    /// the guest has no cgroup2 mount.
    fn new(tag: &str) -> Self {
        let mountinfo = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = unified_mount(&mountinfo()).unwrap_or_else(|| {
            let ok = Command::new("mount").args(["-t", "cgroup2", "none", "/sys/fs/cgroup"]).status().unwrap();
            assert!(ok.success(), "cannot mount cgroup2 at /sys/fs/cgroup");
            unified_mount(&mountinfo()).expect("cgroup2 mounted")
        });
        let dir = mount.join(format!("gpreempt-arrival-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes are gone by now (the servers are declared after it, so dropped first).
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `emu-workload server --no-gpu --listen 127.0.0.1:0 --cpu-ms 1`, moved into `cgroup` before it
/// starts (by the shell it is exec'd from, so the listening socket, and every connection it
/// accepts, belongs to that cgroup: a socket keeps the cgroup it was created in).
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    port: u16,
}

impl Server {
    fn start(cgroup: &Cgroup) -> Self {
        let bin = binary("emu-workload").unwrap();
        let mut child = Command::new("sh")
            .args([
                "-c",
                r#"echo $$ > "$1/cgroup.procs" && exec "$2" server --no-gpu --listen 127.0.0.1:0 --cpu-ms 1"#,
                "sh",
            ])
            .arg(&cgroup.0)
            .arg(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut server = Self { child, stdin, stdout, port: 0 };
        let hello = server.recv();
        assert_eq!(hello["gpu"], json!(false), "{hello}");
        server.port = u16::try_from(hello["port"].as_u64().unwrap()).unwrap();
        assert_eq!(hello["pid"], json!(server.child.id()), "the shell exec'd the server: one pid");
        server
    }

    fn pid(&self) -> HostPid {
        HostPid(self.child.id())
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        assert_ne!(self.stdout.read_line(&mut line).unwrap(), 0, "the server closed its output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// `stop`: its summary.
    fn stop(mut self) -> Value {
        writeln!(self.stdin.as_mut().unwrap(), "stop").unwrap();
        let summary = self.recv();
        assert_eq!(summary["event"], "summary", "{summary}");
        summary
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's totals in its summary.
fn totals(summary: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| summary[k].as_u64().unwrap_or_else(|| panic!("no {k} in {summary}"));
    (n("requests"), n("health"), n("metrics"), n("connections"))
}

/// The server's pid, cgroup and ports, as the scheduler reads them, checked against what the
/// test set up.
fn watched(server: &Server, cgroup: &Cgroup) -> (PathBuf, BTreeSet<u16>) {
    let proc_root = Path::new("/proc");
    let dir = cgroup_dir(proc_root, server.pid()).unwrap();
    assert_eq!(dir, cgroup.0, "the server is in the test's cgroup");
    let ports = tcp_listening_ports(proc_root, server.pid()).unwrap();
    assert_eq!(ports, BTreeSet::from([server.port]), "its one listening port");
    (dir, ports)
}

/// One keep-alive HTTP connection to a server.
struct Client(TcpStream);

impl Client {
    fn connect(port: u16) -> Self {
        let conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_nodelay(true).unwrap();
        // An answer shorter than expected fails the test instead of hanging it.
        conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Self(conn)
    }

    /// Send `request` in one write and read exactly `answer` back.
    fn exchange(&mut self, request: &[u8], answer: &str) {
        self.0.write_all(request).unwrap();
        let mut got = vec![0; answer.len()];
        self.0.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8_lossy(&got), answer, "the answer to {:?}", String::from_utf8_lossy(request));
    }
}

fn post(body: &[u8]) -> Vec<u8> {
    let mut request = format!("POST /generate HTTP/1.1\r\nHost: arrival\r\nContent-Length: {}\r\n\r\n", body.len());
    request.push_str(std::str::from_utf8(body).unwrap());
    request.into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: arrival\r\n\r\n").into_bytes()
}

fn ok(body: &str) -> String {
    format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

/// The answer to a request of 0 dispatches: the CPU phase alone.
const DONE: &str = "done 0 0\n";

fn metrics(requests: u64, health: u64, scrapes: u64) -> String {
    format!(
        "emu_workload_requests_total {requests}\nemu_workload_dispatches_total 0\nemu_workload_health_total \
         {health}\nemu_workload_metrics_total {scrapes}\n"
    )
}

/// The hits waiting now (none is late: see the module docs).
fn drained(probe: &mut ArrivalProbe) -> Vec<ArrivalHit> {
    let mut hits = Vec::new();
    probe.drain(&mut hits);
    hits
}

/// The hits, once at least one came (10 s at most: a guest under software emulation).
fn hits_when_any(probe: &mut ArrivalProbe) -> Vec<ArrivalHit> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let hits = drained(probe);
        if !hits.is_empty() || Instant::now() > deadline {
            return hits;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn counts(segments: u64, allowed: u64, denied: u64, unmatched: u64, armings: u64) -> ArrivalCounts {
    ArrivalCounts { segments, allowed, denied, unmatched, tls: 0, armings }
}

/// `bpf(2)` with an attribute block of 128 zeroed bytes but for the fields set.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Self([0; 128])
    }
    fn u32(mut self, offset: usize, v: u32) -> Self {
        self.0[offset..offset + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, offset: usize, v: u64) -> Self {
        self.0[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn get_u32(&self, offset: usize) -> u32 {
        u32::from_ne_bytes(self.0[offset..offset + 4].try_into().unwrap())
    }
    fn call(&mut self, cmd: i32) -> std::io::Result<i64> {
        // SAFETY: bpf(2) reads and writes at most the 128 bytes passed; every pointer set in them
        // (an info buffer) is valid for the length set beside it.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_mut_ptr(), self.0.len()) };
        if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
    }
}

// include/uapi/linux/bpf.h: enum bpf_cmd, enum bpf_attach_type.
const BPF_PROG_GET_NEXT_ID: i32 = 11;
const BPF_PROG_GET_FD_BY_ID: i32 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i32 = 15;
const BPF_PROG_QUERY: i32 = 16;
const BPF_CGROUP_INET_INGRESS: u32 = 0;

/// Programs attached to `cgroup`'s ingress hook itself (not inherited): BPF_PROG_QUERY with no
/// id buffer answers the count (`query.prog_cnt`, offset 24).
fn attached_ingress(cgroup: &Path) -> u32 {
    let dir = std::fs::File::open(cgroup).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&dir) as u32;
    let mut attr = Attr::new().u32(0, fd).u32(4, BPF_CGROUP_INET_INGRESS);
    attr.call(BPF_PROG_QUERY).unwrap();
    attr.get_u32(24)
}

/// The names of every BPF program loaded on the host (`bpf_prog_info.name`, offset 64).
fn loaded_program_names() -> Vec<String> {
    let mut names = Vec::new();
    let mut id = 0;
    loop {
        let mut next = Attr::new().u32(0, id);
        match next.call(BPF_PROG_GET_NEXT_ID) {
            Ok(_) => id = next.get_u32(4),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return names,
            Err(e) => panic!("BPF_PROG_GET_NEXT_ID: {e}"),
        }
        // A program freed since the listing is simply not there.
        let Ok(fd) = Attr::new().u32(0, id).call(BPF_PROG_GET_FD_BY_ID) else { continue };
        // SAFETY: a new fd the kernel just returned, owned here.
        let fd: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) };
        let mut info = Attr::new();
        let mut query = Attr::new()
            .u32(0, std::os::fd::AsRawFd::as_raw_fd(&fd) as u32)
            .u32(4, 80)
            .u64(8, info.0.as_mut_ptr() as u64);
        query.call(BPF_OBJ_GET_INFO_BY_FD).unwrap();
        let name = &info.0[64..80];
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        names.push(String::from_utf8_lossy(&name[..len]).into_owned());
    }
}

fn arrival_programs() -> usize {
    loaded_program_names().iter().filter(|n| *n == PROGRAM).count()
}

#[test]
fn arrival_hits_once_per_credit_and_counts_requests_and_probes_exactly() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("counts");
    let server = Server::start(&cgroup);
    let (dir, ports) = watched(&server, &cgroup);
    let mut probe = probe_or_skip!();
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    assert_eq!(probe.cgroups(), vec![cgroup.0.clone()]);
    assert_eq!(probe.counts(slot), ArrivalCounts::default());
    let mut client = Client::connect(server.port);
    let request = post(b"0");

    // N requests, the slot re-armed after each hit (watch armed it for the first): one hit each,
    // stamped between the send and the answer, with the segment's payload (the whole request).
    const N: u64 = 5;
    for i in 0..N {
        if i > 0 {
            probe.arm(slot).unwrap();
        }
        let sent_ns = monotonic_ns();
        client.exchange(&request, &ok(DONE));
        let answered_ns = monotonic_ns();
        let hits = hits_when_any(&mut probe);
        assert_eq!(hits.len(), 1, "request {i}: {hits:?}");
        let hit = hits[0];
        assert_eq!((hit.slot, hit.port, hit.payload_len), (slot, u32::from(server.port), request.len() as u32));
        // The whole request is its head, and its size.
        assert_eq!((hit.head(), request_size(&hit)), (&request[..], request.len() as u32));
        assert!((sent_ns..=answered_ns).contains(&hit.ktime_ns), "{sent_ns} ≤ {} ≤ {answered_ns}", hit.ktime_ns);
    }
    assert_eq!(probe.counts(slot), counts(N, N, 0, 0, N));

    // Not re-armed: the N-th hit took one of the last arm's credits; the rest send a hit each (a
    // burst between two looks of the scheduler is recorded whole)…
    let c = u64::from(ARMED_CREDITS) - 1;
    for _ in 0..c {
        client.exchange(&request, &ok(DONE));
    }
    assert_eq!(drained(&mut probe).len() as u64, c, "one hit per credit left");
    assert_eq!(probe.counts(slot), counts(N + c, N + c, 0, 0, N + c));

    // …then, the credits spent, K requests are counted and none is a hit.
    const K: u64 = 4;
    for _ in 0..K {
        client.exchange(&request, &ok(DONE));
    }
    assert_eq!(drained(&mut probe), vec![], "no hit with no credit");
    assert_eq!(probe.counts(slot), counts(N + c + K, N + c + K, 0, 0, N + c));

    // Armed: M health probes and scrapes are denied and leave it armed…
    probe.arm(slot).unwrap();
    const M: u64 = 6;
    let (mut health, mut scrapes) = (0, 0);
    for i in 0..M {
        if i % 2 == 0 {
            health += 1;
            client.exchange(&get("/health"), &ok("ok\n"));
        } else {
            scrapes += 1;
            client.exchange(&get("/metrics"), &ok(&metrics(N + c + K, health, scrapes)));
        }
    }
    assert_eq!(drained(&mut probe), vec![], "no hit for a probe or a scrape");
    assert_eq!(probe.counts(slot), counts(N + c + K + M, N + c + K, M, 0, N + c));

    // …for the next request, which hits.
    client.exchange(&request, &ok(DONE));
    assert_eq!(hits_when_any(&mut probe).len(), 1);
    assert_eq!(probe.counts(slot), counts(N + c + K + M + 1, N + c + K + 1, M, 0, N + c + 1));

    // Disarmed: a request is counted and sends no hit.
    probe.disarm(slot);
    client.exchange(&request, &ok(DONE));
    assert_eq!(drained(&mut probe), vec![], "no hit while disarmed");
    assert_eq!(probe.counts(slot), counts(N + c + K + M + 2, N + c + K + 2, M, 0, N + c + 1));

    // The server answered every request and probe on the one connection.
    drop(client);
    assert_eq!(totals(&server.stop()), (N + c + K + 2, health, scrapes, 1));
}

#[test]
fn arrival_counts_a_request_larger_than_a_segment_once() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("large");
    let server = Server::start(&cgroup);
    let (dir, ports) = watched(&server, &cgroup);
    let mut probe = probe_or_skip!();
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    let mut client = Client::connect(server.port);
    // 0 dispatches, then a 64 KiB "prompt": headers and body exceed loopback's 64 KiB segments.
    let mut body = b"0\n".to_vec();
    body.resize(64 * 1024, b'x');
    let request = post(&body);
    client.exchange(&request, &ok(DONE));
    let hits = hits_when_any(&mut probe);
    assert_eq!(hits.len(), 1, "{hits:?}");
    let first = hits[0].payload_len as usize;
    assert!(first < request.len(), "the hit is the first segment's: {first} of {} bytes", request.len());
    // Its first HEAD_BYTES came with it; the size is the header block and its Content-Length.
    assert_eq!(hits[0].head(), &request[..HEAD_BYTES]);
    assert_eq!(request_size(&hits[0]), request.len() as u32);
    let c = probe.counts(slot);
    assert!(c.segments >= 2, "{c:?}");
    assert_eq!(c, counts(c.segments, 1, 0, c.segments - 1, 1), "the first segment a request, the rest unmatched");
    // The body's segments took no credit (armings 1 above); armed again, the next request hits.
    probe.arm(slot).unwrap();
    client.exchange(&post(b"0"), &ok(DONE));
    assert_eq!(hits_when_any(&mut probe).len(), 1);
    assert_eq!(probe.counts(slot), counts(c.segments + 1, 2, 0, c.segments - 1, 2));
    drop(client);
    assert_eq!(totals(&server.stop()), (2, 0, 0, 1));
}

#[test]
fn arrival_sizes_a_request_whose_body_follows_its_headers_by_its_content_length() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("split");
    let server = Server::start(&cgroup);
    let (dir, ports) = watched(&server, &cgroup);
    let mut probe = probe_or_skip!();
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    let mut client = Client::connect(server.port);
    // As an HTTP client with TCP_NODELAY that writes the header block, then the JSON body: two
    // segments, the first of headers only (what a 1448-byte MSS also makes of a large prompt).
    client.0.set_nodelay(true).unwrap();
    let mut body = b"0\n".to_vec();
    body.resize(3000, b'x');
    let request = post(&body);
    let headers = request.len() - body.len();
    client.0.write_all(&request[..headers]).unwrap();
    client.exchange(&request[headers..], &ok(DONE));
    let hits = hits_when_any(&mut probe);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!((hits[0].payload_len as usize, hits[0].head()), (headers, &request[..headers]));
    assert_eq!(request_size(&hits[0]), request.len() as u32);
    // The body's segment: not a request (it starts with no pattern's bytes), counted unmatched.
    assert_eq!(probe.counts(slot), counts(2, 1, 0, 1, 1));
    drop(client);
    assert_eq!(totals(&server.stop()), (1, 0, 0, 1));
}

#[test]
fn arrival_sees_nothing_on_a_port_it_does_not_watch_in_the_same_cgroup() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("ports");
    let server = Server::start(&cgroup);
    // Another service in the same cgroup (so the program runs on its segments too), not watched.
    let other = Server::start(&cgroup);
    assert_eq!(cgroup_dir(Path::new("/proc"), other.pid()).unwrap(), cgroup.0);
    let (dir, ports) = watched(&server, &cgroup);
    let mut probe = probe_or_skip!();
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    let mut unwatched = Client::connect(other.port);
    for _ in 0..3 {
        unwatched.exchange(&post(b"0"), &ok(DONE));
    }
    unwatched.exchange(&get("/health"), &ok("ok\n"));
    assert_eq!(drained(&mut probe), vec![], "no hit from the unwatched port, though armed");
    assert_eq!(probe.counts(slot), ArrivalCounts::default());
    assert_eq!(probe.slot_of(other.pid()), None);
    // Still armed: the watched port's first request hits.
    Client::connect(server.port).exchange(&post(b"0"), &ok(DONE));
    let hits = hits_when_any(&mut probe);
    assert_eq!(hits.iter().map(|h| (h.slot, h.port)).collect::<Vec<_>>(), [(slot, u32::from(server.port))]);
    assert_eq!(probe.counts(slot), counts(1, 1, 0, 0, 1));
    drop(unwatched);
    assert_eq!(totals(&other.stop()), (3, 1, 0, 1));
    assert_eq!(totals(&server.stop()), (1, 0, 0, 1));
}

#[test]
fn arrival_probe_dropped_leaves_no_program_attached_or_loaded() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("drop");
    let server = Server::start(&cgroup);
    let (dir, ports) = watched(&server, &cgroup);
    assert_eq!(attached_ingress(&cgroup.0), 0);
    // An earlier test's probe is released as its fds close; none of any process is left.
    assert!(eventually(Duration::from_secs(10), || arrival_programs() == 0), "{:?}", loaded_program_names());
    let mut probe = probe_or_skip!();
    assert_eq!((attached_ingress(&cgroup.0), arrival_programs()), (0, 1), "loaded, not attached");
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    assert_eq!(attached_ingress(&cgroup.0), 1);
    // Unwatching the cgroup's only process detaches; the program stays loaded for the next.
    probe.unwatch(slot);
    assert_eq!(probe.cgroups(), Vec::<PathBuf>::new());
    assert_eq!((attached_ingress(&cgroup.0), arrival_programs()), (0, 1));
    let slot = probe.watch(server.pid(), &dir, &ports).unwrap();
    assert_eq!(attached_ingress(&cgroup.0), 1);
    let mut client = Client::connect(server.port);
    client.exchange(&post(b"0"), &ok(DONE));
    assert_eq!(probe.counts(slot), counts(1, 1, 0, 0, 1));
    drop(probe);
    assert_eq!(attached_ingress(&cgroup.0), 0, "the link closed with the probe");
    assert!(eventually(Duration::from_secs(10), || arrival_programs() == 0), "{:?}", loaded_program_names());
    // The service is unaffected.
    client.exchange(&post(b"0"), &ok(DONE));
    drop(client);
    assert_eq!(totals(&server.stop()), (2, 0, 0, 1));
}

#[test]
fn arrival_probe_of_a_process_killed_with_sigkill_leaves_no_program_attached_or_loaded() {
    let _serial = one_at_a_time();
    let cgroup = Cgroup::new("sigkill");
    let server = Server::start(&cgroup);
    watched(&server, &cgroup);
    assert_eq!(attached_ingress(&cgroup.0), 0);
    assert!(eventually(Duration::from_secs(10), || arrival_programs() == 0), "{:?}", loaded_program_names());
    // Another process loads the probe and watches the server, as `gpreempt schedule` would.
    let pid = server.pid().0.to_string();
    let holder = match LineHelper::spawn("emu-workload", &["hold-arrival", "--pid", &pid]) {
        Ok(holder) => holder,
        Err(e) if kernel_below(5, 8) => gpreempt_tests::skip!("the arrival probe needs Linux >= 5.8: {e:#}"),
        Err(e) => panic!("emu-workload hold-arrival: {e:#}"),
    };
    assert_eq!(holder.hello["cgroups"], json!([cgroup.0]), "{}", holder.hello);
    assert_eq!(holder.hello["ports"], json!([server.port]), "{}", holder.hello);
    assert_eq!((attached_ingress(&cgroup.0), arrival_programs()), (1, 1));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(holder.pid() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    assert_eq!(holder.finish().unwrap().signal(), Some(libc::SIGKILL));
    // Its fds closed as it exited: the link's (detached from the cgroup) and the program's.
    assert!(
        eventually(Duration::from_secs(10), || attached_ingress(&cgroup.0) == 0 && arrival_programs() == 0),
        "attached {}, loaded {:?}",
        attached_ingress(&cgroup.0),
        loaded_program_names()
    );
    let mut client = Client::connect(server.port);
    client.exchange(&post(b"0"), &ok(DONE));
    drop(client);
    assert_eq!(totals(&server.stop()), (1, 0, 0, 1));
}
