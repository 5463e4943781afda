//! The test internet (issue 26): a network namespace behind a veth pair
//! standing in for the internet, holding documentation addresses
//! (203.0.113.0/24, 2001:db8::/32), a private-range address and a
//! link-local one standing in for a metadata service, with plain socket
//! servers bound there and a DNS server that logs every query it receives.
//! Routes on the host side send those ranges to it; nothing is sent
//! anywhere else. Used by tests/tests/network.rs and by `cargo xtask
//! bench` (tests/src/bin/bench.rs).
//!
//! Names it answers: `dns.test` 203.0.113.53, `good.test` and `other.test`
//! 203.0.113.10, `second.test` and `a.wild.test` 203.0.113.11,
//! `private.test` 10.255.77.10, `meta.test` 169.254.77.1.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The internet namespace's servers: TCP on every test address answers
/// `OK <addr> <port> <first line>` (after reading the client's first
/// bytes), port 8080 (and `GET /big` on port 80) sends 1 MiB, `GET /ka`
/// on port 80 (and cleartext on 443) answers every request of a keep-alive connection (with its
/// Host) until the client is idle for 1 s; UDP port 9053 on every test address
/// echoes `ECHO <addr> <datagram>`; DNS on 203.0.113.53 answers the test
/// names and appends every query name to the log.
pub const SERVERS: &str = r#"
import socket, threading, sys, struct
log = sys.argv[1]
addrs = [("203.0.113.10", socket.AF_INET), ("203.0.113.11", socket.AF_INET),
         ("10.255.77.10", socket.AF_INET), ("169.254.77.1", socket.AF_INET),
         ("2001:db8:77::10", socket.AF_INET6)]
def serve(l, addr, port):
    while True:
        c, _ = l.accept()
        def one(c):
            try:
                c.settimeout(2)
                try: first = c.recv(4096)
                except Exception: first = b""
                line = first.split(b"\r\n")[0][:60].decode("latin1") if first and first[0] != 0x16 else ("tls" if first else "")
                if port == 8080 or (port == 80 and b" /big " in first.split(b"\r\n")[0]):
                    c.sendall(b"x" * (1 << 20))
                elif port in (80, 443) and b" /ka " in first.split(b"\r\n")[0]:
                    # Keep-alive: every request answered (Content-Length)
                    # until the client is idle for 1 s.
                    buf = first; c.settimeout(1)
                    while True:
                        while b"\r\n\r\n" in buf:
                            head, buf = buf.split(b"\r\n\r\n", 1)
                            ls = head.split(b"\r\n")
                            host = [l.split(b":", 1)[1].strip().decode() for l in ls[1:] if l.lower().startswith(b"host:")]
                            body = f"OK {addr} {port} {ls[0].decode('latin1')} host={','.join(host)}\n".encode()
                            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                        try: d = c.recv(4096)
                        except Exception: break
                        if not d: break
                        buf += d
                elif b" /redirect " in first.split(b"\r\n")[0]:
                    c.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://second.test/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                else:
                    c.sendall(f"OK {addr} {port} {line}\n".encode())
            finally:
                c.close()
        threading.Thread(target=one, args=(c,), daemon=True).start()
for addr, fam in addrs:
    for port in (80, 443, 8080, 9000):
        l = socket.socket(fam); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        l.bind((addr, port)); l.listen(1024)  # the 1,000-connection probes
        threading.Thread(target=serve, args=(l, addr, port), daemon=True).start()
def echo(u, addr):
    while True:
        d, src = u.recvfrom(65536)
        u.sendto(b"ECHO %s %s" % (addr.encode(), d[:100]), src)
for addr, fam in addrs:
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((addr, 9053))
    threading.Thread(target=echo, args=(u, addr), daemon=True).start()
names = {"dns.test": "203.0.113.53", "good.test": "203.0.113.10", "other.test": "203.0.113.10",
         "second.test": "203.0.113.11", "private.test": "10.255.77.10",
         "meta.test": "169.254.77.1", "a.wild.test": "203.0.113.11"}
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("203.0.113.53", 53))
print("ready", flush=True)
while True:
    q, src = u.recvfrom(1500)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i+1:i+1+q[i]].decode()); i += 1 + q[i]
    name = ".".join(labels).lower(); qtype = struct.unpack("!H", q[i+1:i+3])[0]
    with open(log, "a") as f: f.write(name + "\n")
    head = q[:2] + (b"\x81\x80" if name in names else b"\x81\x83")
    ans = b""
    if name in names and qtype == 1:
        ans = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(names[name])
    u.sendto(head + q[4:6] + struct.pack("!H", 1 if ans else 0) + b"\x00\x00\x00\x00" + q[12:i+5] + ans, src)
"#;

/// The test internet's resolver (the supervisor's upstream:
/// `TURNSTILE_DNS_UPSTREAM`).
pub const UPSTREAM: &str = "203.0.113.53:53";

/// Times `n` GETs of 1 MiB from `host`:8080 (a name or an address) in
/// Python; prints `GETS <median ms>`.
pub const GETS: &str = r#"
import socket, sys, time, statistics
host, n = sys.argv[1], int(sys.argv[2])
ts = []
for _ in range(n):
    t = time.perf_counter()
    c = socket.create_connection((host, 8080), timeout=5); c.sendall(b"GET / HTTP/1.1\r\n\r\n"); k = 0
    while True:
        d = c.recv(1 << 16)
        if not d: break
        k += len(d)
    assert k == 1 << 20
    ts.append((time.perf_counter() - t) * 1000)
print("GETS", round(statistics.median(ts), 3))
"#;

/// The test internet: a namespace, a veth pair, routes on the host side,
/// and the servers. Removed on drop.
///
/// One at a time on the host: every test internet holds the same
/// documentation addresses and host routes. The test harness runs tests
/// on several threads (a mutex), and other test binaries and the bench
/// may run beside them (a lock file); one left by a killed process is
/// removed first.
pub struct Internet {
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    _one_on_the_host: nix::fcntl::Flock<std::fs::File>,
    /// The namespace's name (`/run/netns/<ns>`).
    pub ns: String,
    veth: String,
    servers: Option<Child>,
    routes: bool,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The test internet's hosts (on its loopback) and the host's routes to
/// them (IPv4; the IPv6 one goes with the veth): one per address, never a
/// whole documentation range. These machines reach every outside host
/// (the apt mirror, crates.io, pypi) through a proxy whose address is in
/// 203.0.113.0/24 (203.0.113.80 here): a /24 route to the test internet
/// cut the host off while a test ran (a VM stage's `apt-get download`
/// timed out beside it).
const ROUTES: [&str; 5] = [
    "203.0.113.10/32",
    "203.0.113.11/32",
    "203.0.113.53/32",
    "10.255.77.10/32",
    "169.254.77.1/32",
];

/// A test internet whose process is gone (SIGKILLed, or one that failed
/// half-way up before [`Internet::try_up`] cleaned up after itself) still
/// holds 198.51.100.1 on its veth: the next one's routes could lead into
/// it. Removed, with its namespace; one whose process lives is an error.
fn remove_leftovers() -> Result<(), String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show", "type", "veth"])
        .output()
        .map_err(|e| format!("ip link: {e}"))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("tsi")
            .and_then(|r| r.strip_suffix('h'))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!(
                "another test internet is up (veth {name} of process {pid}; if that process \
                 is not a test, remove it: ip link del {name}; ip netns del ts-inet-{pid})"
            ));
        }
        let _ = Command::new("ip").args(["link", "del", name]).output();
        let _ = Command::new("ip")
            .args(["netns", "del", &format!("ts-inet-{pid}")])
            .output();
    }
    Ok(())
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

impl Internet {
    /// Brings it up; panics on any failure (a test's failure).
    pub fn up() -> Self {
        Self::try_up().unwrap_or_else(|e| panic!("the test internet: {e}"))
    }

    /// Brings it up; whatever was made before a failure is removed.
    pub fn try_up() -> Result<Self, String> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let guard = ONE.lock().unwrap_or_else(|p| p.into_inner());
        let dir = ["/run/lock", "/tmp"]
            .into_iter()
            .find(|d| std::path::Path::new(d).is_dir())
            .unwrap_or("/tmp");
        let path = format!("{dir}/turnstile-test-internet.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        let host_lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("flock {path}: {e}"))?;
        // One of a process that does not take the lock (older test code)
        // is waited for, a while.
        let start = std::time::Instant::now();
        while let Err(e) = remove_leftovers() {
            if start.elapsed() > std::time::Duration::from_secs(300) {
                return Err(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let id = std::process::id();
        let (ns, veth, peer) = (
            format!("ts-inet-{id}"),
            format!("tsi{id}h"),
            format!("tsi{id}n"),
        );
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("queries.log");
        std::fs::write(&log, "").map_err(|e| e.to_string())?;
        sh(&["ip", "netns", "add", &ns])?;
        // From here on, drop removes what exists.
        let mut me = Self {
            _one_at_a_time: guard,
            _one_on_the_host: host_lock,
            ns,
            veth,
            servers: None,
            routes: false,
            log,
            _dir: dir,
        };
        let (ns, veth) = (me.ns.clone(), me.veth.clone());
        sh(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
        ])?;
        sh(&["ip", "link", "set", &peer, "netns", &ns])?;
        sh(&["ip", "addr", "add", "198.51.100.1/30", "dev", &veth])?;
        sh(&[
            "ip",
            "-6",
            "addr",
            "add",
            "2001:db8:ffff::1/64",
            "dev",
            &veth,
            "nodad",
        ])?;
        sh(&["ip", "link", "set", &veth, "up"])?;
        let inns = |a: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", ns.as_str()];
            v.extend_from_slice(a);
            sh(&v)
        };
        inns(&["ip", "link", "set", "lo", "up"])?;
        inns(&["ip", "addr", "add", "198.51.100.2/30", "dev", &peer])?;
        inns(&[
            "ip",
            "-6",
            "addr",
            "add",
            "2001:db8:ffff::2/64",
            "dev",
            &peer,
            "nodad",
        ])?;
        for a in ROUTES {
            inns(&["ip", "addr", "add", a, "dev", "lo"])?;
        }
        inns(&[
            "ip",
            "-6",
            "addr",
            "add",
            "2001:db8:77::10/128",
            "dev",
            "lo",
            "nodad",
        ])?;
        inns(&["ip", "link", "set", &peer, "up"])?;
        inns(&["ip", "route", "add", "default", "via", "198.51.100.1"])?;
        inns(&[
            "ip",
            "-6",
            "route",
            "add",
            "default",
            "via",
            "2001:db8:ffff::1",
        ])?;
        me.routes = true;
        for net in ROUTES {
            sh(&[
                "ip",
                "route",
                "add",
                net,
                "via",
                "198.51.100.2",
                "dev",
                &veth,
            ])?;
        }
        sh(&[
            "ip",
            "-6",
            "route",
            "add",
            "2001:db8:77::/48",
            "via",
            "2001:db8:ffff::2",
        ])?;
        let servers = me.servers.insert(
            Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-c", SERVERS])
                .arg(&me.log)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("python3: {e}"))?,
        );
        let mut line = String::new();
        if let Some(out) = servers.stdout.as_mut() {
            std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
                .map_err(|e| format!("the servers: {e}"))?;
        }
        if line.trim() != "ready" {
            return Err(format!("the servers did not start: {line:?}"));
        }
        Ok(me)
    }

    /// Every name the internet's DNS server was asked, in order.
    pub fn queries(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        if let Some(mut s) = self.servers.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        // Only this internet's routes (another's, if one is up despite
        // the lock, keeps its own).
        if self.routes {
            for net in ROUTES {
                let _ = Command::new("ip")
                    .args(["route", "del", net, "dev", &self.veth])
                    .output();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}
