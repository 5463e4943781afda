//! Network policy `restricted` and `allow_egress` (issue 26) on the
//! native, runc and crun backends (and runsc on hostinet, with the
//! manifest's `allow_degraded: gvisor_netstack`), through `supervise serve` (cold and
//! warm sandboxes) and through the containerd shim: egress by name through
//! the supervisor's resolver and proxy in the turn's own network
//! namespace, every flow in the evidence; the namespace gone after the
//! turn, after a SIGKILLed supervisor or daemon, and after recovery.
//!
//! The "internet" is the test's own: a network namespace behind a veth
//! pair holding documentation addresses (203.0.113.0/24, 2001:db8::/32), a
//! private-range address and a link-local one standing in for a metadata
//! service, with plain socket servers bound there and a DNS server that
//! logs every query it receives. Nothing is sent anywhere else.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::inet::{GETS, Internet, UPSTREAM};
use turnstile_tests::{Fixture, read_entries, require_root, supervise_bin};

/// What the turn runs: each probe of argv[1] (JSON), results as JSON.
const PROBES: &str = r#"
import socket, json, sys, time, struct
out = []
for p in json.loads(sys.argv[1]):
    t = time.time(); r = None
    try:
        k = p["kind"]
        if k == "resolve":
            r = "ok:" + ",".join(sorted({a[4][0] for a in socket.getaddrinfo(p["host"], 80, proto=socket.IPPROTO_TCP)}))
        elif k == "tcp":
            fam = socket.AF_INET6 if ":" in p["host"] else socket.AF_INET
            c = socket.socket(fam); c.settimeout(5); c.connect((p["host"], p["port"]))
            if p.get("delay"): time.sleep(p["delay"])
            c.sendall(bytes.fromhex(p.get("send", "")) or b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % p["host"].encode())
            if p.get("send2"):
                time.sleep(0.1); c.sendall(bytes.fromhex(p["send2"]))
            data = b""
            while True:
                d = c.recv(65536)
                if not d: break
                data += d
            r = "ok:" + (data.decode().strip() if len(data) < 200 else "bytes=%d" % len(data))
        elif k == "many":
            n, errs = 0, set()
            for _ in range(p["n"]):
                # Connects run far ahead of the proxy's accepts (the kernel
                # completes each handshake): under load its queue can fill
                # and a SYN waits for a retransmit (1 s, then 3 s), so an
                # allowed connection gets 10 s, not 2.
                try: socket.create_connection((p["host"], p["port"]), timeout=10).close()
                except ConnectionRefusedError: n += 1
                except OSError as e: n += 1; errs.add(type(e).__name__ + ":" + str(e.errno))
            r = "refused=%d" % n + (" " + ",".join(sorted(errs)) if errs else "")
        elif k == "udp":
            u = socket.socket(socket.AF_INET6 if ":" in p["host"] else socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
            u.connect((p["host"], p["port"])); u.send(b"x"); r = "ok:" + u.recv(200).decode()
        elif k == "seq":
            # Sends each message in turn, reading what has come 0.3 s
            # after each; then reads to the end.
            c = socket.create_connection((p["host"], p["port"]), timeout=3); got = b""; end = "eof"
            try:
                for m in p["sends"]:
                    c.sendall(bytes.fromhex(m)); time.sleep(0.3); c.setblocking(False)
                    try:
                        while True:
                            d = c.recv(65536)
                            if not d: break
                            got += d
                    except BlockingIOError: pass
                    c.setblocking(True); c.settimeout(3)
                while True:
                    d = c.recv(65536)
                    if not d: break
                    got += d
            except OSError as e:
                end = __import__("errno").errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
            r = "got=%s end=%s" % (got.decode("latin1").replace("\r\n", "|").replace("\n", "|"), end)
        elif k == "serverfirst":
            # Reads the server's banner line first, then sends, then reads
            # to the end.
            c = socket.create_connection((p["host"], p["port"]), timeout=5); data = b""
            while not data.endswith(b"\n"):
                d = c.recv(200)
                if not d: break
                data += d
            c.sendall(bytes.fromhex(p["send"]))
            while True:
                d = c.recv(65536)
                if not d: break
                data += d
            r = "ok:" + data.decode("latin1").strip().replace("\r\n", "|").replace("\n", "|")
        elif k == "dnsudp":
            q = struct.pack("!HHHHHH", 9, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in p["name"].split(".")) + b"\0\0\1\0\1"
            fam = socket.AF_INET6 if ":" in p["host"] else socket.AF_INET
            dst = socket.getaddrinfo(p["host"], p["port"], fam, socket.SOCK_DGRAM)[0][4]
            u = socket.socket(fam, socket.SOCK_DGRAM); u.settimeout(3); u.sendto(q, dst)
            resp, src = u.recvfrom(4096)
            r = "rcode=%d answers=%d from_sent_to=%s" % (resp[3] & 15, struct.unpack("!H", resp[6:8])[0], src[:2] == dst[:2])
        elif k == "dnstcp":
            q = struct.pack("!HHHHHH", 7, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in p["host"].split(".")) + b"\0\0\1\0\1"
            c = socket.create_connection((p.get("server", "127.0.0.53"), 53), timeout=5); c.sendall(struct.pack("!H", len(q)) + q)
            resp = c.recv(4096)[2:]
            r = "rcode=%d answers=%d" % (resp[3] & 15, struct.unpack("!H", resp[6:8])[0])
        elif k == "rawname":
            # A query whose labels are given as they are (a label may hold
            # a dot), then a connection to the answer with that name as Host.
            q = struct.pack("!HHHHHH", 11, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in p["labels"]) + b"\0\0\1\0\1"
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(3); u.sendto(q, ("127.0.0.53", 53))
            resp = u.recv(4096)
            if resp[3] & 15 or struct.unpack("!H", resp[6:8])[0] == 0:
                r = "rcode=%d" % (resp[3] & 15)
            else:
                c = socket.create_connection((socket.inet_ntoa(resp[-4:]), p["port"]), timeout=5)
                c.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % ".".join(p["labels"]).encode())
                data = b""
                while True:
                    d = c.recv(65536)
                    if not d: break
                    data += d
                r = "ok:" + data.decode().strip()
        elif k == "lookups":
            # p["n"] lookups of random names, one after another, through
            # the turn's resolver: how each was answered.
            import random
            rc = {}
            for _ in range(p["n"]):
                name = "r%08x.%s" % (random.getrandbits(32), p["suffix"])
                q = struct.pack("!HHHHHH", 5, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0\0\1\0\1"
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5); u.sendto(q, ("127.0.0.53", 53))
                code = u.recv(4096)[3] & 15; u.close()
                rc[code] = rc.get(code, 0) + 1
            r = "rcodes=" + ",".join("%d:%d" % kv for kv in sorted(rc.items()))
        elif k == "rawquery":
            # One query whose labels are given as hex (any bytes).
            q = struct.pack("!HHHHHH", 13, 0x100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l for l in (bytes.fromhex(x) for x in p["labels"])) + b"\0\0\1\0\1"
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(3); u.sendto(q, ("127.0.0.53", 53))
            r = "rcode=%d" % (u.recv(4096)[3] & 15)
        elif k == "urlopen":
            import urllib.request
            r = "ok:%d" % urllib.request.urlopen(p["url"], timeout=5).status
        elif k == "netns":
            r = "ok:" + __import__("os").readlink("/proc/self/ns/net")
        elif k == "loopback":
            l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
            c = socket.create_connection(l.getsockname(), timeout=2); a, _ = l.accept(); a.sendall(b"hi")
            r = "ok:" + c.recv(10).decode()
    except OSError as e:
        e = getattr(e, "reason", e) if not e.errno and isinstance(getattr(e, "reason", None), OSError) else e
        r = "err:" + (__import__("errno").errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
    out.append({"probe": p, "result": r, "ms": round((time.time() - t) * 1000)})
print(json.dumps(out))
"#;

fn manifest(network: &str, egress: &[&str]) -> String {
    format!(
        r#"{{"capabilities":{{"execute":["/usr/bin/python3"]}},"limits":{{"timeout_seconds":60,"pids":256}},"network":"{network}","egress":{}}}"#,
        serde_json::to_string(egress).unwrap()
    )
}

/// Runs the probes in a turn of `pkg`; (results by index, the evidence).
fn probe(fx: &Fixture, pkg: &str, probes: &Value) -> (Vec<Value>, Value) {
    probe_on(fx, pkg, "native", probes)
}

/// [`probe`] on `backend`.
fn probe_on(fx: &Fixture, pkg: &str, backend: &str, probes: &Value) -> (Vec<Value>, Value) {
    probe_with(fx, pkg, &["--backend", backend], probes)
}

/// [`probe`] with `extra` arguments to `supervise run` (a backend, a
/// server, a session).
fn probe_with(fx: &Fixture, pkg: &str, extra: &[&str], probes: &Value) -> (Vec<Value>, Value) {
    let (r, ev, _) = probe_full(fx, pkg, extra, probes);
    (r, ev)
}

/// [`probe_with`], also returning what `--json` printed.
fn probe_full(
    fx: &Fixture,
    pkg: &str,
    extra: &[&str],
    probes: &Value,
) -> (Vec<Value>, Value, Value) {
    probe_via(fx, pkg, extra, UPSTREAM, probes)
}

/// [`probe_full`] with the supervisor's upstream resolver at `upstream`.
fn probe_via(
    fx: &Fixture,
    pkg: &str,
    extra: &[&str],
    upstream: &str,
    probes: &Value,
) -> (Vec<Value>, Value, Value) {
    let out = Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(extra)
        .args([
            "--package",
            pkg,
            "--json",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            PROBES,
        ])
        .arg(probes.to_string())
        .env("TURNSTILE_DNS_UPSTREAM", upstream)
        .env_remove("TURNSTILE_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    // The command's stdout goes to our stderr in --json mode: its last
    // JSON line is the probes' results.
    let results: Vec<Value> = stderr
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Vec<Value>>(l).ok())
        .unwrap_or_else(|| panic!("no probe results: {stderr}"));
    let sid = v["session_id"].as_str().unwrap().to_owned();
    let evidence = read_entries(&fx.ledger(&sid, "evidence"))
        .into_iter()
        .rev()
        .find(|e| e["event"] == "turn.finished")
        .unwrap();
    (results, evidence, v)
}

fn result(r: &[Value], i: usize) -> (&str, u64) {
    (
        r[i]["result"].as_str().unwrap_or(""),
        r[i]["ms"].as_u64().unwrap_or(0),
    )
}

fn calls<'a>(ev: &'a Value, f: impl Fn(&Value) -> bool + 'a) -> Vec<&'a Value> {
    ev["external_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| f(c))
        .collect()
}

fn root_and_tools(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    let has = |p: &str| Path::new(p).exists();
    if !has("/usr/sbin/nft") || !has("/usr/sbin/ip") {
        assert!(
            std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
            "{test}: nft and ip are needed (packages nftables, iproute2)"
        );
        eprintln!("turnstile-test: SKIPPED {test}: nft or ip missing");
        return false;
    }
    true
}

#[test]
fn issue_26_restricted_egress_by_name_dns_tcp_and_evidence() {
    if !root_and_tools("issue_26_restricted_egress_by_name_dns_tcp_and_evidence") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "r",
        &manifest(
            "restricted",
            &[
                "good.test:80",
                "good.test:8080",
                "*.wild.test:80",
                "203.0.113.11/32:9000",
                "[2001:db8:77::/48]:80",
            ],
        ),
    );
    let probes = serde_json::json!([
        {"kind": "resolve", "host": "good.test"},                 // 0
        {"kind": "tcp", "host": "good.test", "port": 80},         // 1
        {"kind": "resolve", "host": "secret-data.exfil.test"},    // 2
        {"kind": "tcp", "host": "other.test", "port": 80},        // 3 same address, not listed
        {"kind": "tcp", "host": "203.0.113.10", "port": 80},      // 4 literal, no CIDR
        {"kind": "tcp", "host": "203.0.113.11", "port": 9000},    // 5 CIDR
        {"kind": "tcp", "host": "good.test", "port": 9000},       // 6 listed name, port not listed
        {"kind": "tcp", "host": "a.wild.test", "port": 80},       // 7 wildcard
        {"kind": "udp", "host": "203.0.113.53", "port": 53},      // 8 another resolver, UDP
        {"kind": "dnstcp", "host": "good.test"},                  // 9
        {"kind": "dnstcp", "host": "nope.test"},                  // 10
        {"kind": "tcp", "host": "2001:db8:77::10", "port": 80},   // 11 IPv6 literal by CIDR
        {"kind": "tcp", "host": "2001:db8:77::10", "port": 443},  // 12 IPv6 port not listed
        {"kind": "tcp", "host": "good.test", "port": 8080},       // 13 1 MiB
        {"kind": "loopback"},                                     // 14
        {"kind": "many", "host": "203.0.113.10", "port": 9000, "n": 1000}, // 15
    ]);
    let started = Instant::now();
    let (r, ev) = probe(&fx, "r", &probes);
    eprintln!("turn took {:?}; results {r:#?}", started.elapsed());
    assert_eq!(
        result(&r, 0).0,
        "ok:127.64.0.1",
        "an allowed name gets an address of its own"
    );
    assert_eq!(result(&r, 1).0, "ok:OK 203.0.113.10 80 GET / HTTP/1.1");
    assert!(
        result(&r, 2).0.starts_with("err:") && result(&r, 2).0 != "err:timeout",
        "{:?}",
        r[2]
    );
    assert!(
        !net.queries().iter().any(|q| q.contains("exfil")),
        "a denied name reached the upstream resolver: {:?}",
        net.queries()
    );
    assert!(
        net.queries().iter().any(|q| q == "good.test"),
        "{:?}",
        net.queries()
    );
    assert!(result(&r, 3).0.starts_with("err:"), "{:?}", r[3]);
    assert_eq!(result(&r, 4).0, "err:ECONNREFUSED");
    assert!(result(&r, 4).1 < 500);
    assert_eq!(result(&r, 5).0, "ok:OK 203.0.113.11 9000 GET / HTTP/1.1");
    assert!(result(&r, 6).0.starts_with("err:"), "{:?}", r[6]);
    assert_eq!(result(&r, 7).0, "ok:OK 203.0.113.11 80 GET / HTTP/1.1");
    assert!(
        matches!(result(&r, 8).0, "err:EPERM" | "err:ECONNREFUSED"),
        "{:?}",
        r[8]
    );
    assert!(result(&r, 8).1 < 500);
    assert_eq!(result(&r, 9).0, "rcode=0 answers=1");
    assert_eq!(result(&r, 10).0, "rcode=3 answers=0");
    assert_eq!(result(&r, 11).0, "ok:OK 2001:db8:77::10 80 GET / HTTP/1.1");
    assert_eq!(result(&r, 12).0, "err:ECONNREFUSED");
    assert_eq!(result(&r, 13).0, "ok:bytes=1048576");
    assert_eq!(result(&r, 14).0, "ok:hi", "loopback inside the turn works");
    assert_eq!(result(&r, 15).0, "refused=1000");
    assert!(result(&r, 15).1 < 10_000, "{:?}", r[15]);

    // Evidence: the allowed flows with bytes, the denied ones with a count.
    let big = calls(&ev, |c| c["name"] == "good.test" && c["port"] == 8080);
    assert_eq!(big.len(), 1, "{}", ev["external_calls"]);
    assert_eq!(big[0]["allowed"], true);
    assert_eq!(big[0]["bytes_in"], 1 << 20);
    assert_eq!(big[0]["decided_by"], "good.test:8080");
    assert!(big[0]["first"].is_string());
    let exfil = calls(&ev, |c| c["name"] == "secret-data.exfil.test");
    assert_eq!(exfil.len(), 1);
    assert_eq!(
        (exfil[0]["allowed"].as_bool(), exfil[0]["protocol"].as_str()),
        (Some(false), Some("dns"))
    );
    let many = calls(&ev, |c| c["address"] == "203.0.113.10" && c["port"] == 9000);
    assert_eq!(many.len(), 1, "1,000 refusals are one record");
    assert_eq!(many[0]["count"], 1000);
    assert_eq!(many[0]["allowed"], false);
    assert!(ev["external_calls"].as_array().unwrap().len() < 40);
    let other = calls(&ev, |c| c["name"] == "other.test");
    assert!(other.is_empty() || other.iter().all(|c| c["allowed"] == false));
    let v = ev["violations"].as_array().unwrap();
    let net_v: Vec<&Value> = v.iter().filter(|x| x["layer"] == "network").collect();
    assert!(
        net_v.iter().any(|x| x["target"] == "203.0.113.10:9000"
            && x["count"] == 1000
            && x["hint"].as_str().unwrap().contains("203.0.113.10/32:9000")),
        "{net_v:#?}"
    );
    assert!(
        net_v.iter().any(|x| x["target"] == "good.test:9000"
            && x["hint"].as_str().unwrap().contains("good.test:9000")),
        "{net_v:#?}"
    );
    drop(net);
}

#[test]
fn issue_26_sni_and_host_must_match_the_name() {
    if !root_and_tools("issue_26_sni_and_host_must_match_the_name") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "s",
        &manifest("restricted", &["good.test:443", "good.test:80"]),
    );
    // A ClientHello naming evil.test, then an HTTP request with another Host.
    let hello = client_hello("evil.test");
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hello},
        {"kind": "tcp", "host": "good.test", "port": 80, "send": hex("GET / HTTP/1.1\r\nHost: second.test\r\n\r\n")},
        {"kind": "tcp", "host": "good.test", "port": 80, "send": hex("GET / HTTP/1.1\r\nHost: good.test\r\n\r\n")},
    ]);
    let (r, ev) = probe(&fx, "s", &probes);
    assert!(
        matches!(result(&r, 0).0, "err:ECONNRESET" | "ok:"),
        "{:?}",
        r[0]
    );
    assert!(
        matches!(result(&r, 1).0, "err:ECONNRESET" | "ok:"),
        "{:?}",
        r[1]
    );
    assert_eq!(result(&r, 2).0, "ok:OK 203.0.113.10 80 GET / HTTP/1.1");
    let denied = calls(&ev, |c| c["allowed"] == false && c["name"] == "good.test");
    assert!(
        denied.iter().any(|c| c["decided_by"]
            .as_str()
            .unwrap()
            .contains("TLS server name `evil.test`")),
        "{}",
        ev["external_calls"]
    );
    assert!(
        denied.iter().any(|c| c["decided_by"]
            .as_str()
            .unwrap()
            .contains("HTTP Host `second.test`")),
        "{}",
        ev["external_calls"]
    );
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn issue_26_allow_egress_refuses_private_link_local_and_rebinding() {
    if !root_and_tools("issue_26_allow_egress_refuses_private_link_local_and_rebinding") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("e", &manifest("allow_egress", &[]));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "second.test", "port": 80},     // 0 public name
        {"kind": "tcp", "host": "203.0.113.10", "port": 9000},  // 1 public literal
        {"kind": "tcp", "host": "10.255.77.10", "port": 80},    // 2 private literal
        {"kind": "tcp", "host": "169.254.77.1", "port": 80},    // 3 link-local (metadata stand-in)
        {"kind": "tcp", "host": "private.test", "port": 80},    // 4 name -> private (rebinding)
        {"kind": "tcp", "host": "meta.test", "port": 80},       // 5 name -> link-local
        {"kind": "resolve", "host": "missing.test"},            // 6 NXDOMAIN upstream
        {"kind": "tcp", "host": "2001:db8:77::10", "port": 443}, // 7 public IPv6 literal
        {"kind": "resolve", "host": "private.test"},            // 8 exists, private only
        {"kind": "resolve", "host": "meta.test"},               // 9 exists, link-local only
        {"kind": "resolve", "host": "second.test"},             // 10 exists, public
    ]);
    let (r, ev) = probe(&fx, "e", &probes);
    eprintln!("{r:#?}");
    assert_eq!(result(&r, 0).0, "ok:OK 203.0.113.11 80 GET / HTTP/1.1");
    assert_eq!(result(&r, 1).0, "ok:OK 203.0.113.10 9000 GET / HTTP/1.1");
    for i in [2, 3] {
        assert_eq!(result(&r, i).0, "err:ECONNREFUSED", "{:?}", r[i]);
        assert!(result(&r, i).1 < 500);
    }
    for i in [4, 5] {
        assert!(result(&r, i).0.starts_with("err:"), "{:?}", r[i]);
    }
    assert!(result(&r, 6).0.starts_with("err:"), "{:?}", r[6]);
    assert_eq!(
        result(&r, 7).0,
        "ok:OK 2001:db8:77::10 443 GET / HTTP/1.1",
        "a public IPv6 literal is reached through the proxy"
    );
    // A name that exists but only at addresses the turn may never reach
    // looks like one that does not exist (red-team stop 60: the synthetic
    // answer told the turn which internal names exist).
    for i in [8, 9] {
        assert_eq!(result(&r, i).0, result(&r, 6).0, "{:?}", r[i]);
    }
    assert!(result(&r, 10).0.starts_with("ok:"), "{:?}", r[10]);
    let rebind = calls(&ev, |c| c["name"] == "private.test");
    assert!(
        rebind.iter().any(|c| c["allowed"] == false
            && c["decided_by"].as_str().unwrap().contains("DNS rebinding")),
        "{}",
        ev["external_calls"]
    );
    let meta = calls(&ev, |c| {
        c["address"] == "169.254.77.1" && c["name"].is_null()
    });
    assert!(
        meta.iter()
            .any(|c| c["allowed"] == false
                && c["decided_by"].as_str().unwrap().contains("link-local")),
        "{}",
        ev["external_calls"]
    );
}

#[test]
fn issue_26_isolated_turns_are_unchanged_and_runsc_needs_consent_for_egress() {
    if !root_and_tools("issue_26_isolated_turns_are_unchanged_and_runsc_needs_consent_for_egress") {
        return;
    }
    let fx = Fixture::new();
    fx.install("i", r#"{"capabilities":{"execute":["/usr/bin/python3"]}}"#);
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "203.0.113.10", "port": 80},
        {"kind": "loopback"},
    ]);
    let (r, ev) = probe(&fx, "i", &probes);
    assert_eq!(result(&r, 0).0, "err:ENETUNREACH");
    assert_eq!(result(&r, 1).0, "ok:hi");
    assert_eq!(ev["external_calls"], serde_json::json!([]));
    // runsc enforces egress only on hostinet: without the manifest's
    // consent (`allow_degraded: gvisor_netstack`) the turn is refused,
    // the field named, nothing run.
    fx.install("o", &manifest("restricted", &["good.test:443"]));
    for backend in ["runsc"] {
        let r = fx.run(
            "o",
            &[
                "--backend",
                backend,
                "--json",
                "--no-outputs",
                "--",
                "/usr/bin/python3",
                "-c",
                "0",
            ],
        );
        let v = r.json();
        if v["error"]["code"] == "E2040" {
            continue; // not installed here
        }
        assert_eq!(r.status, 20, "{backend}: {}", r.stdout);
        assert_eq!(v["error"]["code"], "TS1070", "{backend}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("gvisor_netstack"),
            "{backend}: {v}"
        );
    }
    let _ = Duration::ZERO;
}

#[test]
fn issue_26_restricted_on_runc_and_crun() {
    if !root_and_tools("issue_26_restricted_on_runc_and_crun") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "r",
        &manifest("restricted", &["good.test:80", "203.0.113.11/32:9000"]),
    );
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 80},
        {"kind": "resolve", "host": "secret.exfil.test"},
        {"kind": "tcp", "host": "203.0.113.10", "port": 80},
        {"kind": "tcp", "host": "203.0.113.11", "port": 9000},
        {"kind": "loopback"},
    ]);
    for backend in ["runc", "crun"] {
        let which = Command::new("sh")
            .args(["-c", &format!("command -v {backend}")])
            .output()
            .unwrap();
        if !which.status.success() {
            assert!(
                std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
                "{backend} missing"
            );
            continue;
        }
        let (r, ev) = probe_on(&fx, "r", backend, &probes);
        assert_eq!(
            result(&r, 0).0,
            "ok:OK 203.0.113.10 80 GET / HTTP/1.1",
            "{backend}: {r:#?}"
        );
        assert!(result(&r, 1).0.starts_with("err:"), "{backend}: {r:#?}");
        assert_eq!(result(&r, 2).0, "err:ECONNREFUSED", "{backend}");
        assert_eq!(
            result(&r, 3).0,
            "ok:OK 203.0.113.11 9000 GET / HTTP/1.1",
            "{backend}"
        );
        assert_eq!(result(&r, 4).0, "ok:hi", "{backend}");
        assert!(
            !calls(&ev, |c| c["name"] == "good.test" && c["allowed"] == true).is_empty(),
            "{backend}: {}",
            ev["external_calls"]
        );
        assert!(
            !calls(&ev, |c| c["address"] == "203.0.113.10"
                && c["allowed"] == false)
            .is_empty(),
            "{backend}"
        );
    }
    assert!(!net.queries().iter().any(|q| q.contains("exfil")));
}

/// A runsc manifest: egress on hostinet accepted (`gvisor_netstack`),
/// and gVisor's missing Landlock.
fn runsc_manifest(network: &str, egress: &[&str]) -> String {
    format!(
        r#"{{"capabilities":{{"execute":["/usr/bin/python3"]}},"limits":{{"timeout_seconds":60,"pids":256}},"network":"{network}","egress":{},"allow_degraded":["landlock","gvisor_netstack"]}}"#,
        serde_json::to_string(egress).unwrap()
    )
}

/// The network namespaces (host side) of session `sid`'s turn processes
/// but the host's own: under runsc the turn's `/proc/self/ns/net` is
/// gVisor's, so the sandbox's is read from its cgroup.
fn turn_netns(sid: &str) -> Vec<String> {
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    cgroup_netns(sid)
        .into_iter()
        .filter(|n| Path::new(n) != host)
        .collect()
}

/// runsc (issue 26 item 4): `restricted` and `allow_egress` on hostinet
/// in the turn's own network namespace, with the manifest's consent —
/// allowed by name with its bytes, a denied name NXDOMAIN and never
/// upstream, a second name on the same address, an uncovered literal and
/// the metadata stand-in refused in well under a second, every flow and
/// violation in the evidence, the degradation recorded; the namespace
/// gone after the turn and after a SIGKILLed supervisor.
#[test]
fn issue_26_restricted_and_allow_egress_on_runsc() {
    if !root_and_tools("issue_26_restricted_and_allow_egress_on_runsc") {
        return;
    }
    if !have("runsc") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "r",
        &runsc_manifest("restricted", &["good.test:80", "203.0.113.11/32:9000"]),
    );
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 80},        // 0
        {"kind": "resolve", "host": "secret.exfil.test"},        // 1
        {"kind": "tcp", "host": "other.test", "port": 80},       // 2 same address, not listed
        {"kind": "tcp", "host": "203.0.113.10", "port": 80},     // 3 literal, no CIDR
        {"kind": "tcp", "host": "169.254.77.1", "port": 80},     // 4 metadata stand-in
        {"kind": "tcp", "host": "203.0.113.11", "port": 9000},   // 5 CIDR
        {"kind": "loopback"},                                    // 6
        {"kind": "dnstcp", "host": "nope.test"},                 // 7
    ]);
    let started = Instant::now();
    let (r, ev) = probe_on(&fx, "r", "runsc", &probes);
    eprintln!("runsc turn took {:?}; results {r:#?}", started.elapsed());
    assert_eq!(result(&r, 0).0, "ok:OK 203.0.113.10 80 GET / HTTP/1.1");
    assert!(
        result(&r, 1).0.starts_with("err:") && result(&r, 1).1 < 1000,
        "{:?}",
        r[1]
    );
    assert!(result(&r, 2).0.starts_with("err:"), "{:?}", r[2]);
    for i in [3, 4] {
        assert!(
            matches!(
                result(&r, i).0,
                "err:ECONNREFUSED" | "err:EHOSTUNREACH" | "err:ENETUNREACH"
            ),
            "{:?}",
            r[i]
        );
        assert!(result(&r, i).1 < 1000, "refused fast: {:?}", r[i]);
    }
    assert_eq!(result(&r, 5).0, "ok:OK 203.0.113.11 9000 GET / HTTP/1.1");
    assert_eq!(result(&r, 6).0, "ok:hi", "loopback inside the turn works");
    assert_eq!(result(&r, 7).0, "rcode=3 answers=0");
    assert!(
        !net.queries()
            .iter()
            .any(|q| q.contains("exfil") || q.contains("nope")),
        "a denied name reached the upstream resolver: {:?}",
        net.queries()
    );
    let good = calls(&ev, |c| c["name"] == "good.test" && c["allowed"] == true);
    assert_eq!(good.len(), 1, "{}", ev["external_calls"]);
    assert!(good[0]["bytes_in"].as_u64().unwrap() > 0);
    assert_eq!(good[0]["decided_by"], "good.test:80");
    assert!(
        !calls(&ev, |c| c["name"] == "secret.exfil.test"
            && c["allowed"] == false)
        .is_empty(),
        "{}",
        ev["external_calls"]
    );
    for addr in ["203.0.113.10", "169.254.77.1"] {
        assert!(
            !calls(&ev, |c| c["address"] == addr && c["allowed"] == false).is_empty(),
            "{addr}: {}",
            ev["external_calls"]
        );
    }
    let v = ev["violations"].as_array().unwrap();
    assert!(
        v.iter().any(|x| x["layer"] == "network"
            && x["target"] == "203.0.113.10:80"
            && x["hint"].as_str().unwrap().contains("203.0.113.10/32:80")),
        "{v:#?}"
    );
    assert!(
        ev.to_string()
            .contains("gvisor_netstack (allowed by the manifest)"),
        "the degradation is recorded: {}",
        ev["enforcement"]
    );

    // allow_egress: public yes, private and link-local refused fast.
    fx.install("e", &runsc_manifest("allow_egress", &[]));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "second.test", "port": 80},   // 0
        {"kind": "tcp", "host": "10.255.77.10", "port": 80},  // 1 private
        {"kind": "tcp", "host": "169.254.77.1", "port": 80},  // 2 link-local
        {"kind": "tcp", "host": "private.test", "port": 80},  // 3 rebinding
    ]);
    let (r, ev) = probe_on(&fx, "e", "runsc", &probes);
    eprintln!("{r:#?}");
    assert_eq!(result(&r, 0).0, "ok:OK 203.0.113.11 80 GET / HTTP/1.1");
    for i in [1, 2] {
        assert_eq!(result(&r, i).0, "err:ECONNREFUSED", "{:?}", r[i]);
        assert!(result(&r, i).1 < 1000, "{:?}", r[i]);
    }
    assert!(result(&r, 3).0.starts_with("err:"), "{:?}", r[3]);
    assert!(
        !calls(&ev, |c| c["address"] == "10.255.77.10"
            && c["allowed"] == false)
        .is_empty(),
        "{}",
        ev["external_calls"]
    );

    // The turn's namespace: there while it runs, gone after it ends, gone
    // after its supervisor is SIGKILLed (the guard ends the sandbox), and
    // — guard killed too — gone after `supervise recover`.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum End {
        Turn,
        Sigkill,
        SigkillGuardToo,
    }
    for end in [End::Turn, End::Sigkill, End::SigkillGuardToo] {
        let sid = fx.new_session();
        let mut child = Command::new(supervise_bin())
            .args(["run", "--root"])
            .arg(&fx.root)
            .arg("--state-dir")
            .arg(&fx.state)
            .args([
                "--backend",
                "runsc",
                "--session",
                &sid,
                "--package",
                "r",
                "--no-outputs",
                "--",
                "/usr/bin/python3",
                "-c",
                "import socket, time\n\
                 c = socket.create_connection(('good.test', 80), timeout=5)\n\
                 c.sendall(b'GET / HTTP/1.1\\r\\n\\r\\n'); print(c.recv(100).decode().strip(), flush=True)\n\
                 time.sleep(float(__import__('sys').argv[1]))\n",
                if end == End::Turn { "1" } else { "60" },
            ])
            .env("TURNSTILE_DNS_UPSTREAM", UPSTREAM)
            .env_remove("TURNSTILE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let got = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(got, "OK 203.0.113.10 80 GET / HTTP/1.1", "{end:?}");
        let held = turn_netns(&sid);
        assert!(!held.is_empty(), "the sandbox's network namespace");
        let kill = |pid: u32| {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
        };
        if end == End::SigkillGuardToo {
            let out = Command::new("pgrep")
                .args(["-P", &child.id().to_string(), "-x", "turnstile-guard"])
                .output()
                .expect("pgrep (procps) is required");
            let guards: Vec<u32> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
            assert_eq!(guards.len(), 1, "the turn's guard: {guards:?}");
            kill(guards[0]);
        }
        if end != End::Turn {
            kill(child.id());
        }
        let _ = child.wait();
        if end == End::SigkillGuardToo {
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                held.iter().all(|ns| !ns_holders(ns).is_empty()),
                "without its guard the sandbox (and its namespace) should still be there"
            );
            let r = Command::new(supervise_bin())
                .args(["recover", "--root"])
                .arg(&fx.root)
                .arg("--state-dir")
                .arg(&fx.state)
                .output()
                .unwrap();
            assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        }
        for ns in &held {
            assert_ns_gone(ns, &format!("runsc: {end:?}"));
        }
        fx.assert_ledgers_intact(&sid);
    }
}

/// Thirty 1 MiB GETs through the proxy, each on a connection of its own,
/// each arriving whole (the script asserts every byte count): the
/// per-connection relay, not a single lucky one. Prints the timing beside
/// the same GETs outside, for information.
#[test]
fn issue_26_thirty_1_mib_gets_through_the_proxy_arrive_whole() {
    if !root_and_tools("issue_26_thirty_1_mib_gets_through_the_proxy_arrive_whole") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("g", &manifest("restricted", &["good.test:8080"]));
    let out = Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--package",
            "g",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            GETS,
            "good.test",
            "30",
        ])
        .env("TURNSTILE_DNS_UPSTREAM", "203.0.113.53:53")
        .output()
        .unwrap();
    let inside = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{inside}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outside = Command::new("python3")
        .args(["-c", GETS, "203.0.113.10", "30"])
        .output()
        .unwrap();
    let outside = String::from_utf8_lossy(&outside.stdout).to_string();
    let ms = |s: &str| -> f64 {
        s.lines()
            .find_map(|l| l.strip_prefix("GETS "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no timing in {s}"))
    };
    let (i, o) = (ms(&inside), ms(&outside));
    // Informational only: no test asserts a duration (issue 29); the
    // 1.5x target is measured by `cargo xtask bench network`.
    eprintln!(
        "1 MiB GET, median of 30: through the proxy {i:.3} ms, outside {o:.3} ms ({:.2}x)",
        i / o
    );
}

/// What still holds the network namespace `ns` (`net:[inode]`): processes
/// in it or with a descriptor of it, and nsfs mounts of it. Empty: the
/// kernel has freed it, with its routes and nftables.
fn ns_holders(ns: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let mut links = vec![e.path().join("ns/net")];
        for f in std::fs::read_dir(e.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            links.push(f.path());
        }
        for l in links {
            if std::fs::read_link(&l).is_ok_and(|t| t.as_os_str() == ns) {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                // Its parent and state: who should have taken it down.
                let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                let field = |k: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(k))
                        .map_or(String::new(), |v| v.trim().to_owned())
                };
                out.push(format!(
                    "{}: {} (state {}, ppid {}, cgroup {})",
                    l.display(),
                    String::from_utf8_lossy(&cmd).replace('\0', " "),
                    field("State:"),
                    field("PPid:"),
                    std::fs::read_to_string(e.path().join("cgroup"))
                        .unwrap_or_default()
                        .lines()
                        .find(|l| l.contains("freezer") || l.starts_with("0::"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    out.extend(mounts.lines().filter(|l| l.contains(ns)).map(str::to_owned));
    out
}

/// Waits up to 30 s for `ns` to have no holder. (Once, on a host loaded
/// by three builds, a warm sandbox's two init processes still held it 10 s
/// after the daemon's SIGKILL; the death chain is PDEATHSIG from the daemon
/// to its worker to S1 to PID 1, each in the kernel, so a process in
/// uninterruptible sleep — a mount under I/O load — is the likely holder.)
fn assert_ns_gone(ns: &str, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = ns_holders(ns);
        if held.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}, the turn's network namespace {ns} is still held: {held:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The network namespaces of the processes in the cgroups whose names
/// start with `prefix` (a session's warm sandboxes: `SID-w`).
fn cgroup_netns(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for controller in ["pids", "memory", "unified", ""] {
        let base = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("turnstile");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            if !e.file_name().to_string_lossy().starts_with(prefix) {
                continue;
            }
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                if let Ok(t) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
                    out.push(t.to_string_lossy().into_owned());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `supervise serve` for the network tests: the test internet's resolver
/// upstream; SIGKILLed on drop.
struct Served {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start(fx: &Fixture) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ts-serve-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("serve.sock");
        let child = Command::new(supervise_bin())
            .arg("serve")
            .arg("--state-dir")
            .arg(&fx.state)
            .arg("--socket")
            .arg(&socket)
            .env("TURNSTILE_DNS_UPSTREAM", UPSTREAM)
            .env_remove("TURNSTILE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("daemon.log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "supervise serve did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            socket,
            _dir: dir,
        }
    }
}

impl Served {
    /// SIGTERM, as a service manager stops it: its workers discard their
    /// warm sandboxes before it exits. Returns its exit code.
    fn stop(mut self) -> Option<i32> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serve (issue 26 item 4): each turn through the daemon, cold or in a
/// warm sandbox, keeps its own manifest's network policy — allowed by
/// name, a denied name and a denied address refused fast and recorded —
/// an `isolated` package's turn through the same daemon has no egress;
/// each turn's network namespace (with its nftables) is gone after the
/// turn, and a warm sandbox's after the daemon is SIGKILLed.
#[test]
fn issue_26_serve_turns_keep_their_own_network_policy_cold_and_warm() {
    if !root_and_tools("issue_26_serve_turns_keep_their_own_network_policy_cold_and_warm") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install("r", &manifest("restricted", &["good.test:80"]));
    fx.install("i", &manifest("isolated", &[]));
    let daemon = Served::start(&fx);
    let server = daemon.socket.to_str().unwrap().to_owned();
    let sid = fx.new_session();
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 80},        // 0 allowed by name
        {"kind": "resolve", "host": "secret.exfil.test"},        // 1 denied name
        {"kind": "tcp", "host": "other.test", "port": 80},       // 2 same address, not listed
        {"kind": "tcp", "host": "203.0.113.10", "port": 80},     // 3 literal
        {"kind": "loopback"},                                    // 4
        {"kind": "netns"},                                       // 5
    ]);
    for turn in 1..=3 {
        let (r, ev, out) = probe_full(&fx, "r", &["--server", &server, "--session", &sid], &probes);
        let sandbox = out["durations"]["sandbox"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        eprintln!("turn {turn} ({sandbox}): {r:#?}");
        assert_eq!(
            result(&r, 0).0,
            "ok:OK 203.0.113.10 80 GET / HTTP/1.1",
            "turn {turn}"
        );
        assert!(
            result(&r, 1).0.starts_with("err:"),
            "turn {turn}: {:?}",
            r[1]
        );
        assert!(
            result(&r, 2).0.starts_with("err:"),
            "turn {turn}: {:?}",
            r[2]
        );
        assert_eq!(result(&r, 3).0, "err:ECONNREFUSED", "turn {turn}");
        for i in 1..=3 {
            assert!(result(&r, i).1 < 1000, "turn {turn}: {:?}", r[i]);
        }
        assert_eq!(result(&r, 4).0, "ok:hi");
        let ns = result(&r, 5).0.trim_start_matches("ok:").to_owned();
        assert!(ns.starts_with("net:["), "{ns}");
        // The evidence is this turn's own.
        let allowed = calls(&ev, |c| c["name"] == "good.test" && c["allowed"] == true);
        assert_eq!(allowed.len(), 1, "turn {turn}: {}", ev["external_calls"]);
        assert_eq!(allowed[0]["count"], 1, "turn {turn}");
        assert!(
            !calls(&ev, |c| c["name"] == "secret.exfil.test"
                && c["allowed"] == false)
            .is_empty(),
            "turn {turn}: {}",
            ev["external_calls"]
        );
        assert!(
            !calls(&ev, |c| c["address"] == "203.0.113.10"
                && c["port"] == 80
                && c["allowed"] == false)
            .is_empty(),
            "turn {turn}: {}",
            ev["external_calls"]
        );
        assert!(
            ev["violations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["layer"] == "network" && v["target"] == "203.0.113.10:80"),
            "turn {turn}: {}",
            ev["violations"]
        );
        assert_ns_gone(&ns, &format!("served turn {turn}"));
        if turn == 1 {
            // The next turn's sandbox is built after this one.
            let deadline = Instant::now() + Duration::from_secs(20);
            while cgroup_netns(&format!("{sid}-w")).is_empty() {
                assert!(Instant::now() < deadline, "no warm sandbox was built");
                std::thread::sleep(Duration::from_millis(50));
            }
        } else {
            assert_eq!(sandbox, "warm", "turn {turn}");
        }
    }
    assert!(!net.queries().iter().any(|q| q.contains("exfil")));
    // Another package's turn through the same daemon: its own (isolated)
    // policy, not the last one's.
    let (r, ev) = probe_with(&fx, "i", &["--server", &server], &probes);
    assert!(result(&r, 0).0.starts_with("err:"), "{r:#?}");
    assert!(result(&r, 0).1 < 500, "{r:#?}");
    assert_eq!(result(&r, 3).0, "err:ENETUNREACH");
    assert_eq!(result(&r, 4).0, "ok:hi");
    assert_eq!(ev["external_calls"], serde_json::json!([]));
    // A warm sandbox with egress waits for the session's next turn; the
    // daemon SIGKILLed, its namespace goes with it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let warm = loop {
        let w = cgroup_netns(&format!("{sid}-w"));
        if !w.is_empty() {
            break w;
        }
        assert!(Instant::now() < deadline, "no warm sandbox was built");
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(daemon);
    for ns in &warm {
        assert_ns_gone(ns, "the daemon was SIGKILLed");
    }
    // The next start recovers the session; its next turn is served.
    let again = Served::start(&fx);
    let (r, _) = probe_with(
        &fx,
        "r",
        &[
            "--server",
            again.socket.to_str().unwrap(),
            "--session",
            &sid,
        ],
        &probes,
    );
    assert_eq!(result(&r, 0).0, "ok:OK 203.0.113.10 80 GET / HTTP/1.1");
    fx.assert_ledgers_intact(&sid);
    // Stopped, the daemon leaves nothing mounted: the SIGKILLed one's warm
    // sandbox was recovered, the new one's discarded. (Ending on a SIGKILL
    // instead left this test's last warm sandbox mounted for good: nothing
    // recovers that session again.)
    assert_eq!(again.stop(), Some(0));
    let state = format!("{}/", fx.state.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.lines().any(|l| l.contains(state.as_str())),
        "mounted under the state directory after the daemon stopped:\n{mounts}"
    );
}

/// A turn that prints its network namespace, connects to good.test:80
/// once, then sleeps: `supervise run` on `backend`, its stdout piped.
fn sleeping_turn(fx: &Fixture, sid: &str, backend: &str) -> (Child, String) {
    let script = "import os, socket, time\n\
                  print(os.readlink('/proc/self/ns/net'), flush=True)\n\
                  c = socket.create_connection(('good.test', 80), timeout=5)\n\
                  c.sendall(b'GET / HTTP/1.1\\r\\nHost: good.test\\r\\n\\r\\n'); print(c.recv(100).decode().strip(), flush=True)\n\
                  time.sleep(60)\n";
    let mut child = Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args([
            "--backend",
            backend,
            "--session",
            sid,
            "--package",
            "r",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            script,
        ])
        .env("TURNSTILE_DNS_UPSTREAM", UPSTREAM)
        .env_remove("TURNSTILE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let ns = lines.next().and_then(Result::ok).unwrap_or_default();
    let got = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(ns.starts_with("net:["), "{backend}: {ns:?}");
    assert_eq!(got, "OK 203.0.113.10 80 GET / HTTP/1.1", "{backend}");
    (child, ns)
}

/// A SIGKILLed supervisor (issue 26 item 4): the turn's network namespace
/// — its routes, nftables, resolver and proxy sockets — is gone within
/// seconds on native, runc and crun, before any later `supervise`; when
/// an OCI turn's guard was killed too, the container keeps it until
/// `supervise recover` removes the container, and then it is gone.
#[test]
fn issue_26_a_sigkilled_supervisor_leaves_no_network_namespace() {
    if !root_and_tools("issue_26_a_sigkilled_supervisor_leaves_no_network_namespace") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("r", &manifest("restricted", &["good.test:80"]));
    let sid = fx.new_session();
    let kill = |pid: u32| {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
    };
    for backend in ["native", "runc", "crun"] {
        if backend != "native" && !have(backend) {
            continue;
        }
        let (mut child, ns) = sleeping_turn(&fx, &sid, backend);
        eprintln!(
            "{backend}: the turn's namespace {ns}: {:?}",
            ns_holders(&ns)
        );
        assert!(!ns_holders(&ns).is_empty());
        kill(child.id());
        let _ = child.wait();
        assert_ns_gone(&ns, &format!("{backend}: supervise was SIGKILLed"));
    }
    if !have("runc") {
        return;
    }
    let (mut child, ns) = sleeping_turn(&fx, &sid, "runc");
    let out = Command::new("pgrep")
        .args(["-P", &child.id().to_string(), "-x", "turnstile-guard"])
        .output()
        .expect("pgrep (procps) is required");
    let guards: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(guards.len(), 1, "the turn's guard: {guards:?}");
    kill(guards[0]);
    kill(child.id());
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !ns_holders(&ns).is_empty(),
        "without its guard the container (and its namespace) should still be there"
    );
    let r = Command::new(supervise_bin())
        .args(["recover", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_ns_gone(&ns, "supervise recover");
    fx.assert_ledgers_intact(&sid);
}

/// Whether `tool` is installed (required under TURNSTILE_REQUIRE_KERNEL).
fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
        "{tool} missing"
    );
    ok
}

/// The shim's image: busybox-static.
const SHIM_IMAGE: &str = "docker.io/turnstile/busybox:net";

/// The containerd shim (issue 26 item 4): `ctr run` through
/// `containerd-shim-turnstile-v2` runs the container as a turn with its
/// package's own network policy — allowed by name, a denied name and a
/// denied address refused and recorded in `external_calls[]` — and not
/// in the network namespace the container spec names (here the test
/// internet's own, where every test address is local): the turn has its
/// own. With the trust level choosing the backend, and with runc named.
#[test]
fn issue_26_shim_turns_keep_their_own_network_policy() {
    use turnstile_tests::containerd::Containerd;
    let test = "issue_26_shim_turns_keep_their_own_network_policy";
    if !root_and_tools(test) || !have("containerd") || !have("ctr") {
        return;
    }
    let shim = supervise_bin().with_file_name("containerd-shim-turnstile-v2");
    assert!(
        shim.is_file(),
        "build the shim first: cargo build -p containerd-shim-turnstile-v2"
    );
    let image_dir = tempfile::tempdir().unwrap();
    let rootfs = image_dir.path().join("rootfs");
    if !turnstile_tests::busybox_rootfs(&rootfs) {
        assert!(
            std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
            "busybox-static is required"
        );
        return;
    }
    let archive = image_dir.path().join("image.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/oci_archive.py");
    let st = Command::new("python3")
        .arg(&script)
        .arg(&rootfs)
        .arg(&archive)
        .arg(SHIM_IMAGE)
        .status()
        .unwrap();
    assert!(st.success());
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "bb",
        r#"{"capabilities":{"execute":["/bin/sh","/bin/busybox"]},"limits":{"timeout_seconds":30},"network":"restricted","egress":["good.test:80"]}"#,
    );
    let c = Containerd::start_with_env(
        shim.parent().unwrap(),
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  disable = true",
        &[("TURNSTILE_DNS_UPSTREAM", UPSTREAM)],
    );
    let imported = c.ctr(&["images", "import", archive.to_str().unwrap()]);
    assert!(imported.status.success(), "{imported:?}");
    let pod_ns = format!("/run/netns/{}", net.ns);
    let script = "echo GET / HTTP/1.1 | nc good.test 80; echo \"rc=$?\"; \
                  nc secret.exfil.test 80 </dev/null; echo \"rc=$?\"; \
                  nc 203.0.113.10 80 </dev/null; echo \"rc=$?\"";
    for (i, backend) in [None, Some("runc")].into_iter().enumerate() {
        if backend.is_some_and(|b| !have(b)) {
            continue;
        }
        let mut options = serde_json::json!({
            "state_dir": fx.state,
            "supervise": supervise_bin(),
            "workspaces": {"ws": {"root": fx.root, "namespaces": ["default"]}},
        });
        if let Some(b) = backend {
            options["backend"] = b.into();
        }
        let config = c.dir.path().join("shim.json");
        std::fs::write(&config, options.to_string()).unwrap();
        let fifos = c.dir.path().join("fifo").display().to_string();
        let id = format!("net{i}");
        let with_ns = format!("network:{pod_ns}");
        let started = Instant::now();
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.turnstile.v2",
            "--runtime-config-path",
            config.to_str().unwrap(),
            "--fifo-dir",
            &fifos,
            "--with-ns",
            &with_ns,
            "--annotation",
            "io.turnstile.workspace=ws",
            "--annotation",
            "io.turnstile.package=bb",
            "--annotation",
            "io.turnstile.outputs=[]",
            SHIM_IMAGE,
            &id,
            "sh",
            "-c",
            script,
        ]);
        let took = started.elapsed();
        let t = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{backend:?} ({took:?}): {t}");
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {t}\n{}", c.log());
        let rcs: Vec<&str> = t.lines().filter(|l| l.starts_with("rc=")).collect();
        assert_eq!(rcs, ["rc=0", "rc=1", "rc=1"], "{backend:?}: {t}");
        assert!(t.contains("OK 203.0.113.10 80 GET / HTTP/1.1"), "{t}");
        assert!(took < Duration::from_secs(20), "{backend:?}: {took:?}");
        let sid = t
            .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '-'))
            .find(|w| w.starts_with("SES-"))
            .unwrap_or_else(|| panic!("no session in {t}"))
            .to_owned();
        let ev = read_entries(&fx.ledger(&sid, "evidence"))
            .into_iter()
            .rev()
            .find(|e| e["event"] == "turn.finished")
            .unwrap();
        assert!(
            !calls(&ev, |c| c["name"] == "good.test" && c["allowed"] == true).is_empty(),
            "{backend:?}: {}",
            ev["external_calls"]
        );
        assert!(
            !calls(&ev, |c| c["name"] == "secret.exfil.test"
                && c["allowed"] == false)
            .is_empty(),
            "{backend:?}: {}",
            ev["external_calls"]
        );
        assert!(
            !calls(&ev, |c| c["address"] == "203.0.113.10"
                && c["allowed"] == false)
            .is_empty(),
            "{backend:?}: {}",
            ev["external_calls"]
        );
        assert!(
            ev["violations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["layer"] == "network" && v["target"] == "203.0.113.10:80"),
            "{backend:?}: {}",
            ev["violations"]
        );
    }
    assert!(!net.queries().iter().any(|q| q.contains("exfil")));
    drop(c);
}

/// A TLS ClientHello naming `name`, offering ALPN `h2`, as hex.
fn client_hello(name: &str) -> String {
    let mut ext = Vec::new();
    // server_name
    let n = name.len() as u16;
    ext.extend_from_slice(&[0, 0]);
    ext.extend_from_slice(&(n + 5).to_be_bytes());
    ext.extend_from_slice(&(n + 3).to_be_bytes());
    ext.push(0);
    ext.extend_from_slice(&n.to_be_bytes());
    ext.extend_from_slice(name.as_bytes());
    // application_layer_protocol_negotiation: h2
    ext.extend_from_slice(&[0, 0x10, 0, 5, 0, 3, 2, b'h', b'2']);
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[0; 32]);
    hello.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    hello.extend_from_slice(&ext);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    hs.extend_from_slice(&hello);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec.iter().map(|b| format!("{b:02x}")).collect()
}

/// HTTP/2 with prior knowledge (h2c): the preface, an empty SETTINGS and
/// one HEADERS frame (GET http://`authority`/, HPACK without Huffman), as
/// hex.
fn h2c_request(authority: &str) -> String {
    let mut block = vec![0x82, 0x86, 0x84, 0x01, authority.len() as u8];
    block.extend_from_slice(authority.as_bytes());
    let mut m = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    m.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
    m.extend_from_slice(&[1, 5, 0, 0, 0, 1]);
    m.extend_from_slice(&block);
    m.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tricks of issue 26's list, each refused fast and recorded: a
/// CONNECT tunnel and an absolute-form request through an allowed name's
/// connection to another host, a Host header that arrives in a second
/// segment, HTTP/2 with prior knowledge whose `:authority` is another
/// name (and one that is the name: allowed), TLS with ALPN h2 whose server
/// name is another, a redirect to a denied host, DNS over TCP to another
/// resolver and over UDP to it, an IPv6 literal no entry covers (TCP and
/// UDP), UDP to a denied port, QUIC (UDP/443) to an allowed name, and
/// 1,000 allowed connections (one record with a count, no hang).
#[test]
fn issue_26_tunnels_h2_redirects_dns_ipv6_udp_quic_and_1000_connections() {
    if !root_and_tools("issue_26_tunnels_h2_redirects_dns_ipv6_udp_quic_and_1000_connections") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "t",
        &manifest(
            "restricted",
            &["good.test:80", "good.test:443", "good.test:9000"],
        ),
    );
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 80,
         "send": hex("CONNECT second.test:443 HTTP/1.1\r\nHost: second.test:443\r\n\r\n")},   // 0
        {"kind": "tcp", "host": "good.test", "port": 80,
         "send": hex("CONNECT second.test:443 HTTP/1.1\r\nHost: good.test\r\n\r\n")},         // 1
        {"kind": "tcp", "host": "good.test", "port": 80,
         "send": hex("GET http://second.test/ HTTP/1.1\r\nHost: good.test\r\n\r\n")},         // 2
        {"kind": "tcp", "host": "good.test", "port": 80,
         "send": hex("GET / HTTP/1.1\r\n"), "send2": hex("Host: second.test\r\n\r\n")},      // 3
        {"kind": "tcp", "host": "good.test", "port": 80, "send": h2c_request("second.test")}, // 4
        {"kind": "tcp", "host": "good.test", "port": 80, "send": h2c_request("good.test")},   // 5
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello("second.test")}, // 6
        {"kind": "urlopen", "url": "http://good.test/redirect"},                              // 7
        {"kind": "dnstcp", "host": "good.test", "server": "203.0.113.53"},                     // 8
        {"kind": "udp", "host": "203.0.113.53", "port": 53},                                   // 9
        {"kind": "tcp", "host": "2001:db8:77::10", "port": 80},                                // 10
        {"kind": "udp", "host": "2001:db8:77::10", "port": 53},                                // 11
        {"kind": "udp", "host": "203.0.113.10", "port": 9000},                                 // 12
        {"kind": "udp", "host": "good.test", "port": 443},                                     // 13 QUIC
        {"kind": "many", "host": "good.test", "port": 9000, "n": 1000},                        // 14
        {"kind": "tcp", "host": "good.test", "port": 80},                                      // 15 still fine
    ]);
    let started = Instant::now();
    let (r, ev) = probe(&fx, "t", &probes);
    eprintln!("turn took {:?}; {r:#?}", started.elapsed());
    let refused = |i: usize| {
        let (res, ms) = result(&r, i);
        assert!(
            res.starts_with("err:") || res == "ok:",
            "probe {i} was not refused: {:?}",
            r[i]
        );
        assert!(ms < 1000, "probe {i} took {ms} ms");
    };
    // Probe 3 waits for the rest of the request head (100 ms).
    for i in [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13] {
        refused(i);
    }
    assert_eq!(result(&r, 5).0, "ok:OK 203.0.113.10 80 PRI * HTTP/2.0");
    assert_eq!(result(&r, 14).0, "refused=0");
    assert!(result(&r, 14).1 < 30_000, "{:?}", r[14]);
    assert!(
        !net.queries().iter().any(|q| q == "second.test"),
        "a denied name reached the upstream resolver: {:?}",
        net.queries()
    );
    let denied = |needle: &str| {
        assert!(
            calls(&ev, |c| c["allowed"] == false)
                .iter()
                .any(|c| c["decided_by"].as_str().unwrap_or("").contains(needle)),
            "no denied flow decided by {needle:?}: {:#}",
            ev["external_calls"]
        );
    };
    denied("HTTP CONNECT target `second.test`");
    denied("HTTP request target `second.test`");
    denied("HTTP Host `second.test`");
    denied("HTTP/2 :authority `second.test`");
    denied("TLS server name `second.test`");
    // Right after, the proxy may still hold its limit of connections
    // (the test server is slow to accept): then this one is refused, and
    // recorded as such — never left hanging.
    if result(&r, 15).0 != "ok:OK 203.0.113.10 80 GET / HTTP/1.1" {
        assert!(result(&r, 15).1 < 1000, "{:?}", r[15]);
        denied("connections at once");
    }
    assert!(
        !calls(&ev, |c| c["name"] == "second.test"
            && c["protocol"] == "dns")
        .is_empty(),
        "the redirect's lookup: {}",
        ev["external_calls"]
    );
    for (addr, port, proto) in [
        ("203.0.113.53", 53, "tcp"),
        ("203.0.113.53", 53, "udp"),
        ("2001:db8:77::10", 80, "tcp"),
        ("2001:db8:77::10", 53, "udp"),
        ("203.0.113.10", 9000, "udp"),
    ] {
        assert!(
            !calls(&ev, |c| c["address"] == addr
                && c["port"] == port
                && c["protocol"] == proto
                && c["allowed"] == false)
            .is_empty(),
            "{addr}:{port}/{proto}: {}",
            ev["external_calls"]
        );
    }
    let quic = calls(&ev, |c| {
        c["name"] == "good.test" && c["protocol"] == "udp" && c["port"] == 443
    });
    assert!(
        quic.iter().any(|c| c["allowed"] == false),
        "{}",
        ev["external_calls"]
    );
    let many = calls(&ev, |c| {
        c["name"] == "good.test" && c["port"] == 9000 && c["allowed"] == true
    });
    assert_eq!(many.len(), 1, "{}", ev["external_calls"]);
    assert_eq!(many[0]["count"], 1000);
    assert!(ev["external_calls"].as_array().unwrap().len() < 40);
}

/// `/udp` entries (issue 26): a datagram to an allowed name's synthetic
/// address (or a covered network) on its port is relayed by the
/// supervisor to the real destination, the answer comes back to the
/// turn's socket from the address it sent to; a datagram to a name not
/// listed for UDP on that port is refused at once (ECONNREFUSED on the
/// relayed port, EPERM on another) and recorded with the entry to add.
#[test]
fn issue_26_udp_entries_are_relayed_and_the_rest_refused_and_recorded() {
    if !root_and_tools("issue_26_udp_entries_are_relayed_and_the_rest_refused_and_recorded") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "u",
        &manifest(
            "restricted",
            &[
                "dns.test:53/udp",
                "good.test:80",
                "other.test:80",
                "good.test:9053/udp",
                "[2001:db8:77::/48]:9053/udp",
            ],
        ),
    );
    let probes = serde_json::json!([
        {"kind": "dnsudp", "host": "dns.test", "port": 53, "name": "good.test"}, // 0
        {"kind": "udp", "host": "good.test", "port": 53},                        // 1 relayed port, name not listed for it
        {"kind": "udp", "host": "good.test", "port": 443},                       // 2 QUIC, port not listed
        {"kind": "udp", "host": "good.test", "port": 9053},                      // 3 allowed name and port
        {"kind": "udp", "host": "203.0.113.53", "port": 53},                     // 4 literal, no UDP CIDR
        {"kind": "udp", "host": "2001:db8:77::10", "port": 9053},                // 5 IPv6 network entry
        {"kind": "udp", "host": "other.test", "port": 9053},                     // 6 same address, listed for TCP only
        {"kind": "tcp", "host": "good.test", "port": 80},                        // 7 TCP unchanged
        {"kind": "dnsudp", "host": "dns.test", "port": 53, "name": "second.test"}, // 8 a second flow
        {"kind": "udp", "host": "127.0.0.1", "port": 53},                        // 9 own loopback, relayed port, nothing there
        {"kind": "udp", "host": "::1", "port": 9053},                            // 10 the same in IPv6
    ]);
    let (r, ev) = probe(&fx, "u", &probes);
    eprintln!("{r:#?}");
    assert_eq!(
        result(&r, 0).0,
        "rcode=0 answers=1 from_sent_to=True",
        "the test's own DNS server answered through the relay"
    );
    assert!(
        net.queries().iter().any(|q| q == "dns.test"),
        "{:?}",
        net.queries()
    );
    assert_eq!(result(&r, 1).0, "err:ECONNREFUSED", "{:?}", r[1]);
    assert!(
        matches!(result(&r, 2).0, "err:EPERM" | "err:ECONNREFUSED"),
        "{:?}",
        r[2]
    );
    assert_eq!(result(&r, 3).0, "ok:ECHO 203.0.113.10 x");
    assert!(
        matches!(result(&r, 4).0, "err:EPERM" | "err:ECONNREFUSED"),
        "{:?}",
        r[4]
    );
    assert_eq!(result(&r, 5).0, "ok:ECHO 2001:db8:77::10 x");
    assert_eq!(result(&r, 6).0, "err:ECONNREFUSED", "{:?}", r[6]);
    assert_eq!(result(&r, 7).0, "ok:OK 203.0.113.10 80 GET / HTTP/1.1");
    assert_eq!(result(&r, 8).0, "rcode=0 answers=1 from_sent_to=True");
    for i in [9, 10] {
        assert_eq!(result(&r, i).0, "err:ECONNREFUSED", "{:?}", r[i]);
    }
    for i in [1, 2, 4, 6, 9, 10] {
        assert!(
            result(&r, i).1 < 500,
            "probe {i} was not refused at once: {:?}",
            r[i]
        );
    }
    // Evidence: the relayed flows with bytes each way, the refused ones
    // as violations with the entry to add.
    let dns = calls(&ev, |c| {
        c["name"] == "dns.test" && c["protocol"] == "udp" && c["allowed"] == true
    });
    assert_eq!(dns.len(), 1, "{:#}", ev["external_calls"]);
    assert_eq!(dns[0]["count"], 2, "two flows, one record");
    assert_eq!(dns[0]["address"], "203.0.113.53");
    assert_eq!(dns[0]["decided_by"], "dns.test:53/udp");
    assert!(dns[0]["bytes_out"].as_u64().unwrap() > 40);
    assert!(dns[0]["bytes_in"].as_u64().unwrap() > 40);
    assert!(dns[0]["first"].is_string() && dns[0]["last"].is_string());
    let echo = calls(&ev, |c| {
        c["address"] == "2001:db8:77::10" && c["protocol"] == "udp" && c["allowed"] == true
    });
    assert_eq!(echo.len(), 1, "{:#}", ev["external_calls"]);
    assert_eq!(
        (echo[0]["bytes_out"].as_u64(), echo[0]["port"].as_u64()),
        (Some(1), Some(9053))
    );
    let v = ev["violations"].as_array().unwrap();
    for (target, hint) in [
        ("good.test:53", "good.test:53/udp"),
        ("good.test:443", "good.test:443/udp"),
        ("other.test:9053", "other.test:9053/udp"),
        ("203.0.113.53:53", "203.0.113.53/32:53/udp"),
    ] {
        assert!(
            v.iter().any(|x| x["layer"] == "network"
                && x["target"] == target
                && x["hint"].as_str().unwrap_or("").contains(hint)),
            "{target}: {v:#?}"
        );
    }
}

/// `/udp` under `allow_egress`: only listed UDP is relayed, and a listed
/// name is still never relayed to a link-local address (the metadata
/// stand-in the test hosts); a private address is reached only where an
/// entry lists it (the name, or its network), never as a bare literal.
#[test]
fn issue_26_udp_under_allow_egress_refuses_link_local_and_unlisted_private() {
    if !root_and_tools("issue_26_udp_under_allow_egress_refuses_link_local_and_unlisted_private") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install(
        "ue",
        &manifest(
            "allow_egress",
            &[
                "private.test:9053/udp",
                "meta.test:9053/udp",
                "203.0.113.11/32:9053/udp",
            ],
        ),
    );
    let probes = serde_json::json!([
        {"kind": "udp", "host": "private.test", "port": 9053},  // 0 listed name -> private: listed
        {"kind": "udp", "host": "meta.test", "port": 9053},     // 1 listed name -> link-local: never
        {"kind": "udp", "host": "10.255.77.10", "port": 9053},  // 2 private literal, not listed
        {"kind": "udp", "host": "second.test", "port": 9053},   // 3 public name, not listed for UDP
        {"kind": "udp", "host": "203.0.113.11", "port": 9053},  // 4 listed network
        {"kind": "udp", "host": "169.254.77.1", "port": 9053},  // 5 link-local literal
    ]);
    let (r, ev) = probe(&fx, "ue", &probes);
    eprintln!("{r:#?}");
    assert_eq!(result(&r, 0).0, "ok:ECHO 10.255.77.10 x");
    for i in [1, 2, 3, 5] {
        assert!(
            matches!(result(&r, i).0, "err:ECONNREFUSED" | "err:EPERM"),
            "{:?}",
            r[i]
        );
        assert!(result(&r, i).1 < 1000, "{:?}", r[i]);
    }
    assert_eq!(result(&r, 4).0, "ok:ECHO 203.0.113.11 x");
    // A UDP port range too wide to relay is refused at load, the entry
    // named, nothing run (TS1075, exit 2).
    fx.install(
        "wide",
        &manifest("allow_egress", &["dns.test:53/udp", "q.test:1000-2000/udp"]),
    );
    let w = fx.run(
        "wide",
        &[
            "--json",
            "--no-outputs",
            "--",
            "/usr/bin/python3",
            "-c",
            "0",
        ],
    );
    let v = w.json();
    assert_eq!(w.status, 2, "{}", w.stdout);
    assert_eq!(v["error"]["code"], "TS1075", "{v}");
    assert_eq!(v["error"]["field"], "egress[1]", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("q.test:1000-2000/udp"),
        "{v}"
    );
    let meta = calls(&ev, |c| c["name"] == "meta.test" && c["protocol"] == "udp");
    assert!(
        meta.iter().all(|c| c["allowed"] == false)
            && meta
                .iter()
                .any(|c| c["decided_by"].as_str().unwrap().contains("link-local")),
        "{:#}",
        ev["external_calls"]
    );
    assert!(
        !calls(&ev, |c| c["address"] == "10.255.77.10"
            && c["protocol"] == "udp"
            && c["allowed"] == false
            && c["name"].is_null())
        .is_empty(),
        "{:#}",
        ev["external_calls"]
    );
    assert!(
        !calls(&ev, |c| c["name"] == "second.test"
            && c["protocol"] == "udp"
            && c["allowed"] == false)
        .is_empty(),
        "{:#}",
        ev["external_calls"]
    );
}

/// HTTP/2 HEADERS on `stream` (END_STREAM, END_HEADERS) for
/// `authority`, HPACK without indexing, as hex.
fn h2c_stream(stream: u8, authority: &str) -> String {
    let mut block = vec![0x82, 0x86, 0x84, 0x01, authority.len() as u8];
    block.extend_from_slice(authority.as_bytes());
    let mut m = (block.len() as u32).to_be_bytes()[1..].to_vec();
    m.extend_from_slice(&[1, 5, 0, 0, 0, stream]);
    m.extend_from_slice(&block);
    m.iter().map(|b| format!("{b:02x}")).collect()
}

/// Cleartext port 80 (issue 26): every request on a connection opened for
/// a name is checked, not only the first — a keep-alive second request
/// naming another Host, and a second HTTP/2 (h2c) stream with another
/// `:authority`, close the connection and are recorded as denied flows
/// (violations with the hint) while the first request got its answer; a
/// pipelined pair for the allowed name both succeed.
#[test]
fn issue_26_port_80_checks_every_request_keep_alive_pipelined_and_h2c() {
    if !root_and_tools("issue_26_port_80_checks_every_request_keep_alive_pipelined_and_h2c") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("k", &manifest("restricted", &["good.test:80"]));
    let get = |path: &str, host: &str| hex(&format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n"));
    let pipelined = format!("{}{}", get("/ka", "good.test"), get("/ka", "good.test:80"));
    let probes = serde_json::json!([
        {"kind": "seq", "host": "good.test", "port": 80,
         "sends": [get("/ka", "good.test"), get("/ka", "second.test")]},                      // 0
        {"kind": "seq", "host": "good.test", "port": 80, "sends": [pipelined]},                // 1
        {"kind": "seq", "host": "good.test", "port": 80,
         "sends": [h2c_request("good.test"), h2c_stream(3, "second.test")]},                 // 2
        {"kind": "seq", "host": "good.test", "port": 80,
         "sends": [get("/ka", "good.test"), get("/ka", "good.test")]},                        // 3 keep-alive, same name
    ]);
    let (r, ev) = probe(&fx, "k", &probes);
    eprintln!("{r:#?}");
    let (r0, r1, r2, r3) = (
        result(&r, 0).0,
        result(&r, 1).0,
        result(&r, 2).0,
        result(&r, 3).0,
    );
    assert!(
        r0.starts_with("got=HTTP/1.1 200 OK|") && r0.contains("host=good.test|"),
        "the first request got its answer: {r0}"
    );
    assert!(!r0.contains("second.test"), "{r0}");
    assert!(
        r0.ends_with("end=ECONNRESET") || r0.ends_with("end=eof"),
        "{r0}"
    );
    assert_eq!(
        r1.matches("OK 203.0.113.10 80 GET /ka HTTP/1.1 host=good.test")
            .count(),
        2,
        "a pipelined pair for the allowed name both succeed: {r1}"
    );
    assert!(r1.ends_with("end=eof"), "{r1}");
    assert!(r2.contains("OK 203.0.113.10 80 PRI * HTTP/2.0"), "{r2}");
    assert_eq!(
        r3.matches("host=good.test").count(),
        2,
        "keep-alive requests for the name both succeed: {r3}"
    );
    let denied = |needle: &str| {
        calls(&ev, |c| {
            c["allowed"] == false
                && c["name"] == "good.test"
                && c["decided_by"].as_str().unwrap_or("").contains(needle)
        })
        .len()
    };
    assert_eq!(
        denied("HTTP Host `second.test`"),
        1,
        "{:#}",
        ev["external_calls"]
    );
    assert_eq!(
        denied("HTTP/2 :authority `second.test`"),
        1,
        "{:#}",
        ev["external_calls"]
    );
    let allowed = calls(&ev, |c| c["allowed"] == true && c["name"] == "good.test");
    assert_eq!(allowed.len(), 1, "{:#}", ev["external_calls"]);
    assert_eq!(allowed[0]["count"], 4);
    assert!(allowed[0]["bytes_in"].as_u64().unwrap() > 200);
    assert!(
        ev["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["layer"] == "network"
                && v["target"] == "good.test:80"
                && v["hint"].as_str().unwrap_or("").contains("second.test:80")),
        "{:#}",
        ev["violations"]
    );
}

// ---- the red-team's network-policy escapes (issue 26) ----------------------
//
// These tests add to the test internet services of their own: a resolver
// on the host's loopback (so a name may answer with any address the test
// chooses, the host's own ones included), a server that speaks first, in
// the internet's namespace, and services on the host side of its veth
// (the host's own addresses). Nothing is sent anywhere else.

/// A resolver for `TURNSTILE_DNS_UPSTREAM`: argv[1] is JSON `{name:
/// [addresses]}` (A and AAAA answered from it, other names NXDOMAIN);
/// prints its port on 127.0.0.1.
const LOCAL_DNS: &str = r#"
import socket, struct, sys, json
names = json.loads(sys.argv[1])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print(u.getsockname()[1], flush=True)
while True:
    q, src = u.recvfrom(1500)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i+1:i+1+q[i]].decode()); i += 1 + q[i]
    name = ".".join(labels).lower(); qtype = struct.unpack("!H", q[i+1:i+3])[0]
    addrs = names.get(name)
    ans, n = b"", 0
    for a in addrs or []:
        fam = socket.AF_INET6 if ":" in a else socket.AF_INET
        if (qtype, fam) in ((1, socket.AF_INET), (28, socket.AF_INET6)):
            raw = socket.inet_pton(fam, a)
            ans += b"\xc0\x0c" + struct.pack("!HHIH", qtype, 1, 60, len(raw)) + raw; n += 1
    head = q[:2] + (b"\x81\x80" if addrs is not None else b"\x81\x83")
    u.sendto(head + q[4:6] + struct.pack("!H", n) + b"\x00\x00\x00\x00" + q[12:i+5] + ans, src)
"#;

/// A service on argv[1] port argv[2] that speaks first: TCP sends the line
/// argv[3], reads the client's line and answers `GOT <line>`; with argv[4]
/// `udp`, every datagram is answered with argv[3]. Prints `ready`.
const BANNER_SERVER: &str = r#"
import socket, threading, sys
addr, port, banner = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
if len(sys.argv) > 4 and sys.argv[4] == "udp":
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((addr, port)); print("ready", flush=True)
    while True:
        d, src = u.recvfrom(65536); u.sendto(banner, src)
l = socket.socket(fam); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((addr, port)); l.listen(64); print("ready", flush=True)
def one(c):
    try:
        c.settimeout(5); c.sendall(banner + b"\r\n"); line = b""
        while not line.endswith(b"\n"):
            d = c.recv(200)
            if not d: break
            line += d
        c.sendall(b"GOT " + line.strip() + b"\n")
    except Exception: pass
    finally: c.close()
while True:
    c, _ = l.accept(); threading.Thread(target=one, args=(c,), daemon=True).start()
"#;

/// The test's own services beside the test internet; killed on drop.
struct Services {
    children: Vec<Child>,
    /// The local resolver's `ADDR:PORT`, once started.
    dns: Option<String>,
}

impl Services {
    fn new() -> Self {
        Self {
            children: Vec::new(),
            dns: None,
        }
    }

    /// Starts `script` (in the network namespace `ns`, if given) and
    /// returns its first output line.
    fn start(&mut self, ns: Option<&str>, script: &str, args: &[&str]) -> String {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "python3"]);
                c
            }
            None => Command::new("python3"),
        };
        let mut child = cmd
            .args(["-c", script])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        self.children.push(child);
        line.trim().to_owned()
    }

    /// A resolver on 127.0.0.1 answering `names` (name, addresses).
    fn dns(&mut self, names: &[(&str, &[&str])]) -> String {
        let map: serde_json::Map<String, Value> = names
            .iter()
            .map(|(n, a)| ((*n).to_owned(), serde_json::json!(a)))
            .collect();
        let port = self.start(None, LOCAL_DNS, &[&Value::Object(map).to_string()]);
        let addr = format!("127.0.0.1:{port}");
        self.dns = Some(addr.clone());
        addr
    }

    /// A service that speaks first (see [`BANNER_SERVER`]).
    fn banner(&mut self, ns: Option<&str>, addr: &str, port: u16, banner: &str, udp: bool) {
        let port = port.to_string();
        let mut args = vec![addr, port.as_str(), banner];
        if udp {
            args.push("udp");
        }
        assert_eq!(self.start(ns, BANNER_SERVER, &args), "ready");
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn client_hello_bytes(name: &str) -> Vec<u8> {
    let h = client_hello(name);
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// The ClientHello of [`client_hello`] with its handshake message split
/// over TLS records of at most `piece` bytes each.
fn client_hello_split(name: &str, piece: usize) -> String {
    let rec = client_hello_bytes(name);
    let mut out = Vec::new();
    for part in rec[5..].chunks(piece) {
        out.extend_from_slice(&rec[..3]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `ev` has a denied flow for `name` whose rule contains `needle`,
/// and a `network` violation for it.
fn denied_and_recorded(ev: &Value, name: &str, needle: &str) -> bool {
    let flow = !calls(ev, |c| {
        c["allowed"] == false
            && c["name"] == name
            && c["decided_by"].as_str().unwrap_or("").contains(needle)
    })
    .is_empty();
    let violation =
        ev["violations"].as_array().unwrap().iter().any(|v| {
            v["layer"] == "network" && v["target"].as_str().unwrap_or("").starts_with(name)
        });
    flow && violation
}

/// Red-team F1 (FR-RT-007 evidence): a client that sends its first
/// message only after the proxy's 1.5 s first-message window (a TLS
/// ClientHello or an HTTP request naming another host, on 443 and 80) is
/// still checked: reset and recorded like the undelayed case. The same
/// delay with the right name goes through, and a service whose server
/// speaks first (SSH-like, on 443) still works: no over-block.
#[test]
fn issue_26_a_first_message_sent_after_the_window_is_still_checked() {
    if !root_and_tools("issue_26_a_first_message_sent_after_the_window_is_still_checked") {
        return;
    }
    let net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[
        ("good.test", &["203.0.113.10"]),
        ("ssh.test", &["203.0.113.53"]),
    ]);
    svc.banner(
        Some(&net.ns),
        "203.0.113.53",
        443,
        "SSH-2.0-turnstile-test",
        false,
    );
    let fx = Fixture::new();
    fx.install(
        "d",
        &manifest(
            "restricted",
            &["good.test:443", "good.test:80", "ssh.test:443"],
        ),
    );
    let http = |host: &str| hex(&format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n"));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "delay": 1.8, "send": client_hello("other.test")}, // 0
        {"kind": "tcp", "host": "good.test", "port": 443, "delay": 1.8, "send": http("other.test")},         // 1
        {"kind": "tcp", "host": "good.test", "port": 80, "delay": 1.8, "send": http("second.test")},         // 2
        {"kind": "tcp", "host": "good.test", "port": 443, "delay": 1.8, "send": client_hello("good.test")},  // 3
        {"kind": "tcp", "host": "good.test", "port": 443, "delay": 1.8, "send": http("good.test")},          // 4
        {"kind": "serverfirst", "host": "ssh.test", "port": 443, "send": hex("SSH-2.0-client\r\n")},         // 5
    ]);
    let (r, ev, _) = probe_via(&fx, "d", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in [0, 1, 2] {
        let got = result(&r, i).0;
        assert!(
            matches!(got, "err:ECONNRESET" | "ok:"),
            "probe {i} must be refused: {got}"
        );
    }
    assert_eq!(result(&r, 3).0, "ok:OK 203.0.113.10 443 tls");
    assert_eq!(result(&r, 4).0, "ok:OK 203.0.113.10 443 GET / HTTP/1.1");
    assert_eq!(
        result(&r, 5).0,
        "ok:SSH-2.0-turnstile-test|GOT SSH-2.0-client",
        "a server-first service on an allowed name:port works"
    );
    for needle in [
        "TLS server name `other.test`",
        "HTTP Host `other.test`",
        "HTTP Host `second.test`",
    ] {
        assert!(
            denied_and_recorded(&ev, "good.test", needle),
            "{needle}: {:#}\n{:#}",
            ev["external_calls"],
            ev["violations"]
        );
    }
    assert!(
        calls(&ev, |c| c["name"] == "ssh.test" && c["allowed"] == true).len() == 1,
        "{:#}",
        ev["external_calls"]
    );
    drop(svc);
    drop(net);
}

/// Red-team F2 (FR-RT-007 evidence): a ClientHello whose handshake
/// message is split over several TLS records is reassembled: a wrong
/// server name in it is reset and recorded, the right one split the same
/// way goes through, and bytes that begin as TLS but are no ClientHello
/// are refused (not taken for "no name").
#[test]
fn issue_26_a_client_hello_split_over_records_is_checked_whole() {
    if !root_and_tools("issue_26_a_client_hello_split_over_records_is_checked_whole") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("f", &manifest("restricted", &["good.test:443"]));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello_split("other.test", 20)}, // 0
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello_split("other.test", 1)},  // 1
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello_split("good.test", 20)},  // 2
        {"kind": "tcp", "host": "good.test", "port": 443, "send": "160301000701000003ffffff"},            // 3 hello that does not parse
    ]);
    let (r, ev) = probe(&fx, "f", &probes);
    eprintln!("{r:#?}");
    for i in [0, 1, 3] {
        let got = result(&r, i).0;
        assert!(
            matches!(got, "err:ECONNRESET" | "ok:"),
            "probe {i} must be refused: {got}"
        );
    }
    assert_eq!(result(&r, 2).0, "ok:OK 203.0.113.10 443 tls");
    assert!(
        denied_and_recorded(&ev, "good.test", "TLS server name `other.test`"),
        "{:#}",
        ev["external_calls"]
    );
    assert!(
        denied_and_recorded(&ev, "good.test", "a malformed TLS ClientHello"),
        "{:#}",
        ev["external_calls"]
    );
    let split = calls(&ev, |c| {
        c["allowed"] == false
            && c["decided_by"]
                .as_str()
                .unwrap_or("")
                .contains("TLS server name `other.test`")
    });
    assert_eq!(split[0]["count"], 2, "{:#}", ev["external_calls"]);
}

/// Red-team F3 (FR-RT-007 evidence): a listed name, exact or wildcard,
/// whose answer is one of the host's own addresses (here the host side of
/// the test internet's veth, 198.51.100.1 and 2001:db8:ffff::1, with a
/// service of the test's own listening there) is refused and recorded as
/// DNS rebinding, for TCP and the UDP relay, under `restricted` and
/// `allow_egress`; a CIDR entry listing the address opens it; a listed
/// name resolving to a private address still works.
#[test]
fn issue_26_a_listed_name_resolving_to_the_hosts_own_address_is_refused() {
    if !root_and_tools("issue_26_a_listed_name_resolving_to_the_hosts_own_address_is_refused") {
        return;
    }
    let _net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[
        ("host.test", &["198.51.100.1"]),
        ("host6.test", &["2001:db8:ffff::1"]),
        ("evil.wild.test", &["198.51.100.1"]),
        ("lifted.test", &["198.51.100.1"]),
        ("private.test", &["10.255.77.10"]),
    ]);
    for port in [8098, 8099] {
        svc.banner(None, "198.51.100.1", port, "HOSTSECRET", false);
    }
    svc.banner(None, "2001:db8:ffff::1", 8099, "HOSTSECRET", false);
    svc.banner(None, "198.51.100.1", 9099, "HOSTSECRET", true);
    let fx = Fixture::new();
    fx.install(
        "h",
        &manifest(
            "restricted",
            &[
                "host.test:8099",
                "host6.test:8099",
                "*.wild.test:8099",
                "host.test:9099/udp",
                "lifted.test:8098",
                "198.51.100.1/32:8098",
                "private.test:80",
            ],
        ),
    );
    fx.install(
        "a",
        &manifest("allow_egress", &["host.test:8099", "host6.test:8099"]),
    );
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "host.test", "port": 8099},      // 0
        {"kind": "tcp", "host": "host6.test", "port": 8099},     // 1
        {"kind": "tcp", "host": "evil.wild.test", "port": 8099}, // 2
        {"kind": "udp", "host": "host.test", "port": 9099},      // 3
        {"kind": "tcp", "host": "lifted.test", "port": 8098},    // 4
        {"kind": "tcp", "host": "private.test", "port": 80},     // 5
    ]);
    let (r, ev, _) = probe_via(&fx, "h", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in 0..4 {
        let got = result(&r, i).0;
        assert!(
            got.starts_with("err:") && !got.contains("HOSTSECRET"),
            "probe {i} must be refused: {got}"
        );
    }
    assert!(result(&r, 4).0.contains("HOSTSECRET"), "{:?}", r[4]);
    assert_eq!(result(&r, 5).0, "ok:OK 10.255.77.10 80 GET / HTTP/1.1");
    for name in ["host.test", "host6.test", "evil.wild.test"] {
        assert!(
            denied_and_recorded(
                &ev,
                name,
                "one of the host's own addresses (DNS rebinding refused)"
            ),
            "{name}: {:#}",
            ev["external_calls"]
        );
    }
    assert!(
        !calls(&ev, |c| c["name"] == "host.test"
            && c["protocol"] == "udp"
            && c["allowed"] == false
            && c["decided_by"]
                .as_str()
                .unwrap_or("")
                .contains("host's own"))
        .is_empty(),
        "{:#}",
        ev["external_calls"]
    );
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "host.test", "port": 8099},  // 0
        {"kind": "tcp", "host": "host6.test", "port": 8099}, // 1
    ]);
    let (r, ev, _) = probe_via(&fx, "a", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in 0..2 {
        let got = result(&r, i).0;
        assert!(
            got.starts_with("err:") && !got.contains("HOSTSECRET"),
            "allow_egress probe {i} must be refused: {got}"
        );
    }
    for name in ["host.test", "host6.test"] {
        assert!(
            denied_and_recorded(&ev, name, "one of the host's own addresses"),
            "{name}: {:#}",
            ev["external_calls"]
        );
    }
}

/// Red-team F4 (FR-RT-007 evidence): cleartext HTTP on port 443 is read
/// as port 80's guard reads it — bare-LF line ends and empty lines before
/// the request included: another Host is reset and recorded, the name's
/// own goes through.
#[test]
fn issue_26_bare_lf_http_on_443_is_checked_as_on_80() {
    if !root_and_tools("issue_26_bare_lf_http_on_443_is_checked_as_on_80") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("l", &manifest("restricted", &["good.test:443"]));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("GET / HTTP/1.1\nHost: other.test\n\n")},           // 0
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("\r\n\nGET / HTTP/1.1\r\nHost: second.test\r\n\r\n")}, // 1
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("GET / HTTP/1.1\nHost: good.test\n\n")},            // 2
    ]);
    let (r, ev) = probe(&fx, "l", &probes);
    eprintln!("{r:#?}");
    for i in [0, 1] {
        let got = result(&r, i).0;
        assert!(
            matches!(got, "err:ECONNRESET" | "ok:"),
            "probe {i} must be refused: {got}"
        );
    }
    assert!(
        result(&r, 2)
            .0
            .starts_with("ok:OK 203.0.113.10 443 GET / HTTP/1.1"),
        "{:?}",
        r[2]
    );
    for needle in ["HTTP Host `other.test`", "HTTP Host `second.test`"] {
        assert!(
            denied_and_recorded(&ev, "good.test", needle),
            "{needle}: {:#}",
            ev["external_calls"]
        );
    }
}

/// Red-team stop 60: an HTTP/0.9 request line (a method and a target, no
/// version) on 443 was passed as "another protocol", and nginx serves the
/// virtual host of its absolute-form target: refused and recorded, as on
/// port 80; a line of another protocol still passes.
#[test]
fn issue_26_an_http09_request_line_on_443_is_refused() {
    if !root_and_tools("issue_26_an_http09_request_line_on_443_is_refused") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("l", &manifest("restricted", &["good.test:443"]));
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("GET http://secret.test/\r\n")}, // 0
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("\r\nget http://secret.test/ \r\n")}, // 1
        {"kind": "tcp", "host": "good.test", "port": 443, "send": hex("EHLO client.example\r\n")}, // 2
    ]);
    let (r, ev) = probe(&fx, "l", &probes);
    eprintln!("{r:#?}");
    for i in [0, 1] {
        let got = result(&r, i).0;
        assert!(
            matches!(got, "err:ECONNRESET" | "ok:"),
            "probe {i} must be refused: {got}"
        );
    }
    assert!(
        result(&r, 2).0.starts_with("ok:OK 203.0.113.10 443 EHLO"),
        "{:?}",
        r[2]
    );
    assert!(
        denied_and_recorded(&ev, "good.test", "HTTP/0.9"),
        "{:#}",
        ev["external_calls"]
    );
}

/// Red-team wave 4, W1 (FR-RT-007 evidence): the name the policy matches
/// is the name the supervisor resolves. A DNS label may hold any byte on
/// the wire, a dot included: a query whose first label is `.` read as
/// `..wild.test` matched `*.wild.test`, and the upstream lookup (the name
/// split on its dots, empty labels dropped) asked for `wild.test`, the
/// apex the wildcard does not list — the turn reached it. Such names are
/// refused (NXDOMAIN, recorded); real subdomains still resolve.
#[test]
fn issue_26_a_dotted_dns_label_does_not_reach_the_wildcards_apex() {
    if !root_and_tools("issue_26_a_dotted_dns_label_does_not_reach_the_wildcards_apex") {
        return;
    }
    let _net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[
        ("wild.test", &["203.0.113.10"]),
        ("a.wild.test", &["203.0.113.11"]),
        ("a.b.wild.test", &["203.0.113.11"]),
    ]);
    let fx = Fixture::new();
    fx.install("w", &manifest("restricted", &["*.wild.test:80"]));
    let probes = serde_json::json!([
        {"kind": "rawname", "labels": [".", "wild", "test"], "port": 80},  // 0
        {"kind": "rawname", "labels": ["a.", "wild", "test"], "port": 80}, // 1
        {"kind": "rawname", "labels": ["a", "wild", "test"], "port": 80},  // 2
        {"kind": "rawname", "labels": ["a", "b", "wild", "test"], "port": 80}, // 3
        {"kind": "rawname", "labels": ["wild", "test"], "port": 80},       // 4
    ]);
    let (r, ev, _) = probe_via(&fx, "w", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in [0, 1] {
        let got = result(&r, i).0;
        assert!(
            !got.contains("203.0.113.10"),
            "probe {i} reached the apex wild.test: {got}"
        );
        assert_eq!(got, "rcode=3", "probe {i}");
    }
    assert_eq!(result(&r, 2).0, "ok:OK 203.0.113.11 80 GET / HTTP/1.1");
    assert_eq!(result(&r, 3).0, "ok:OK 203.0.113.11 80 GET / HTTP/1.1");
    assert_eq!(result(&r, 4).0, "rcode=3", "the apex is not listed");
    assert!(
        !calls(&ev, |c| c["protocol"] == "dns"
            && c["allowed"] == false
            && c["decided_by"]
                .as_str()
                .unwrap_or("")
                .contains("not a host name"))
        .is_empty(),
        "{:#}",
        ev["external_calls"]
    );
}

/// Red-team wave 4, W2 (FR-RT-007 evidence): cleartext HTTP on port 443
/// had only its first request checked, then was spliced unread: a
/// keep-alive or pipelined second request naming another Host (and a
/// second h2c stream with another `:authority`) reached the name's server
/// — a virtual host the policy does not list. Cleartext HTTP on 443 now
/// goes through port 80's guard: the second request resets the
/// connection and is recorded; requests for the name keep working, and so
/// do TLS and a server-first service on 443.
#[test]
fn issue_26_cleartext_http_on_443_checks_every_request() {
    if !root_and_tools("issue_26_cleartext_http_on_443_checks_every_request") {
        return;
    }
    let _net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[
        ("good.test", &["203.0.113.10"]),
        ("ssh.test", &["203.0.113.53"]),
    ]);
    svc.banner(
        Some(&_net.ns),
        "203.0.113.53",
        443,
        "SSH-2.0-turnstile-test",
        false,
    );
    let fx = Fixture::new();
    fx.install(
        "c",
        &manifest("restricted", &["good.test:443", "ssh.test:443"]),
    );
    let get = |path: &str, host: &str| hex(&format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n"));
    let pipelined = format!("{}{}", get("/ka", "good.test"), get("/ka", "second.test"));
    let probes = serde_json::json!([
        {"kind": "seq", "host": "good.test", "port": 443,
         "sends": [get("/ka", "good.test"), get("/ka", "second.test")]},        // 0 keep-alive
        {"kind": "seq", "host": "good.test", "port": 443, "sends": [pipelined]}, // 1 pipelined
        {"kind": "seq", "host": "good.test", "port": 443,
         "sends": [h2c_request("good.test"), h2c_stream(3, "second.test")]},   // 2 h2c
        {"kind": "seq", "host": "good.test", "port": 443,
         "sends": [get("/ka", "good.test"), get("/ka", "good.test")]},          // 3 same name
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello("good.test")}, // 4 TLS
        {"kind": "serverfirst", "host": "ssh.test", "port": 443, "send": hex("SSH-2.0-client\r\n")}, // 5
    ]);
    let (r, ev, _) = probe_via(&fx, "c", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in [0, 1] {
        let got = result(&r, i).0;
        assert!(
            !got.contains("second.test"),
            "probe {i}: the second request reached the server: {got}"
        );
        assert!(
            got.ends_with("end=ECONNRESET") || got.ends_with("end=eof"),
            "probe {i}: {got}"
        );
    }
    assert!(
        result(&r, 0).0.contains("host=good.test|"),
        "the first request got its answer: {:?}",
        r[0]
    );
    let r2 = result(&r, 2).0;
    assert!(r2.contains("OK 203.0.113.10 443 PRI * HTTP/2.0"), "{r2}");
    assert!(
        r2.ends_with("end=ECONNRESET") || r2.ends_with("end=eof"),
        "{r2}"
    );
    assert_eq!(
        result(&r, 3).0.matches("host=good.test").count(),
        2,
        "keep-alive requests for the name both succeed: {:?}",
        r[3]
    );
    assert_eq!(result(&r, 4).0, "ok:OK 203.0.113.10 443 tls");
    assert_eq!(
        result(&r, 5).0,
        "ok:SSH-2.0-turnstile-test|GOT SSH-2.0-client",
        "a server-first service on 443 works"
    );
    let denied = |needle: &str| {
        calls(&ev, |c| {
            c["allowed"] == false
                && c["name"] == "good.test"
                && c["port"] == 443
                && c["decided_by"].as_str().unwrap_or("").contains(needle)
        })
        .len()
    };
    assert!(
        denied("HTTP Host `second.test`") >= 1,
        "{:#}",
        ev["external_calls"]
    );
    assert!(
        denied("HTTP/2 :authority `second.test`") >= 1,
        "{:#}",
        ev["external_calls"]
    );
}

/// A network namespace of the test's own standing in for the host the
/// supervisor runs on; removed on drop.
struct HostNs(String);

impl HostNs {
    fn new(tag: &str) -> Self {
        let ns = format!("ts-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let me = Self(ns);
        for args in [
            vec!["netns", "add", me.0.as_str()],
            vec!["-n", me.0.as_str(), "link", "set", "lo", "up"],
        ] {
            let out = Command::new("ip").args(&args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        }
        me
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip")
            .args(["-n", &self.0])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
}

impl Drop for HostNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Red-team wave 4, W3 (FR-RT-007 evidence): "the host's own addresses"
/// were its interfaces' addresses only. An address range the host
/// receives through a `local` route (`ip route add local
/// 198.51.100.64/26 dev lo`, "AnyIP": a service bound to 0.0.0.0 answers
/// on every address of it) was a public address to the proxy: a listed
/// name resolving there, and under `allow_egress` the literal address,
/// reached the host's own service, IPv4 and IPv6, TCP and the UDP relay.
/// Now whatever the kernel delivers to the host itself is the host's own.
/// The supervisor runs in a namespace of the test's own (the "host"),
/// with its resolver and services there; nothing leaves it.
#[test]
fn issue_26_addresses_the_host_receives_by_a_local_route_are_its_own() {
    if !root_and_tools("issue_26_addresses_the_host_receives_by_a_local_route_are_its_own") {
        return;
    }
    let host = HostNs::new("anyip");
    host.ip(&["route", "add", "local", "198.51.100.64/26", "dev", "lo"]);
    host.ip(&[
        "-6",
        "route",
        "add",
        "local",
        "2001:db8:64::/64",
        "dev",
        "lo",
    ]);
    let mut svc = Services::new();
    for port in [8099, 8098] {
        svc.banner(Some(&host.0), "::", port, "HOSTSECRET", false);
    }
    svc.banner(Some(&host.0), "0.0.0.0", 9099, "HOSTSECRET", true);
    let names = serde_json::json!({
        "anyip.test": ["198.51.100.70"],
        "anyip6.test": ["2001:db8:64::70"],
    });
    let port = svc.start(Some(&host.0), LOCAL_DNS, &[&names.to_string()]);
    let dns = format!("127.0.0.1:{port}");
    let fx = Fixture::new();
    fx.install(
        "r",
        &manifest(
            "restricted",
            &[
                "anyip.test:8099",
                "anyip6.test:8099",
                "anyip.test:9099/udp",
                "198.51.100.70/32:8098",
            ],
        ),
    );
    fx.install("a", &manifest("allow_egress", &[]));
    // `supervise` in the stand-in host's namespace (nsenter: its mounts,
    // cgroups included, stay the real host's).
    let run = |pkg: &str, probes: &Value| -> (Vec<Value>, Value) {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", host.0))
            .arg(supervise_bin())
            .args(["run", "--root"])
            .arg(&fx.root)
            .arg("--state-dir")
            .arg(&fx.state)
            .args(["--package", pkg, "--json", "--no-outputs", "--"])
            .args(["/usr/bin/python3", "-c", PROBES])
            .arg(probes.to_string())
            .env("TURNSTILE_DNS_UPSTREAM", &dns)
            .env_remove("TURNSTILE_LOG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        let results: Vec<Value> = stderr
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Vec<Value>>(l).ok())
            .unwrap_or_else(|| panic!("no probe results: {stderr}"));
        let sid = v["session_id"].as_str().unwrap();
        let ev = read_entries(&fx.ledger(sid, "evidence"))
            .into_iter()
            .rev()
            .find(|e| e["event"] == "turn.finished")
            .unwrap();
        (results, ev)
    };
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "anyip.test", "port": 8099},    // 0
        {"kind": "tcp", "host": "anyip6.test", "port": 8099},   // 1
        {"kind": "udp", "host": "anyip.test", "port": 9099},    // 2
        {"kind": "tcp", "host": "198.51.100.70", "port": 8098}, // 3 a CIDR entry lists it
    ]);
    let (r, ev) = run("r", &probes);
    eprintln!("{r:#?}");
    for i in 0..3 {
        let got = result(&r, i).0;
        assert!(
            got.starts_with("err:") && !got.contains("HOSTSECRET"),
            "probe {i} reached the host's own service: {got}"
        );
    }
    assert!(result(&r, 3).0.contains("HOSTSECRET"), "{:?}", r[3]);
    for name in ["anyip.test", "anyip6.test"] {
        assert!(
            denied_and_recorded(
                &ev,
                name,
                "one of the host's own addresses (DNS rebinding refused)"
            ),
            "{name}: {:#}",
            ev["external_calls"]
        );
    }
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "198.51.100.70", "port": 8099},   // 0
        {"kind": "tcp", "host": "2001:db8:64::70", "port": 8099}, // 1
    ]);
    let (r, ev) = run("a", &probes);
    eprintln!("{r:#?}");
    for i in 0..2 {
        let got = result(&r, i).0;
        assert!(
            got.starts_with("err:") && !got.contains("HOSTSECRET"),
            "allow_egress probe {i} reached the host's own service: {got}"
        );
    }
    assert_eq!(
        calls(&ev, |c| c["allowed"] == false
            && c["decided_by"]
                .as_str()
                .unwrap_or("")
                .contains("one of the host's own addresses"))
        .len(),
        2,
        "{:#}",
        ev["external_calls"]
    );
    drop(svc);
    drop(host);
}

/// Red-team wave 4, W4 (FR-RT-007 evidence): only a first byte 0x16 (a
/// TLS handshake record) was read as TLS. A warning alert record
/// (`15 03 01 00 02 01 5a`) before the ClientHello made the bytes
/// "another protocol", spliced unchecked — and Go's crypto/tls (Caddy,
/// Traefik: SNI-routing frontends) drops warning alerts before the
/// handshake and serves the ClientHello's server name (checked by hand
/// with go1.19: `sni=evil.test`). Bytes that begin as any TLS record now
/// are TLS: anything but a well-formed ClientHello first is refused.
#[test]
fn issue_26_a_tls_record_before_the_client_hello_is_refused() {
    if !root_and_tools("issue_26_a_tls_record_before_the_client_hello_is_refused") {
        return;
    }
    let _net = Internet::up();
    let fx = Fixture::new();
    fx.install("t", &manifest("restricted", &["good.test:443"]));
    let alert = "1503010002015a";
    let ccs = "140303000101";
    let probes = serde_json::json!([
        {"kind": "tcp", "host": "good.test", "port": 443, "send": format!("{alert}{}", client_hello("other.test"))}, // 0
        {"kind": "tcp", "host": "good.test", "port": 443, "send": format!("{ccs}{}", client_hello("other.test"))},   // 1
        {"kind": "tcp", "host": "good.test", "port": 443, "send": format!("{alert}{}", client_hello("good.test"))},  // 2
        {"kind": "tcp", "host": "good.test", "port": 443, "send": client_hello("good.test")},                       // 3
    ]);
    let (r, ev) = probe(&fx, "t", &probes);
    eprintln!("{r:#?}");
    for i in 0..3 {
        let got = result(&r, i).0;
        assert!(
            matches!(got, "err:ECONNRESET" | "ok:"),
            "probe {i} must be refused before it reaches the server: {got}"
        );
    }
    assert_eq!(result(&r, 3).0, "ok:OK 203.0.113.10 443 tls");
    assert!(
        denied_and_recorded(&ev, "good.test", "a TLS record of type 21"),
        "{:#}",
        ev["external_calls"]
    );
    assert!(
        denied_and_recorded(&ev, "good.test", "a TLS record of type 20"),
        "{:#}",
        ev["external_calls"]
    );
}

/// A virtual-host server on argv[1] port argv[2] with Python's own HTTP
/// parser (`http.server`, keep-alive until idle 1 s): every GET answered
/// `VHOST <Host>`.
/// Prints `ready`. (socketserver, not HTTPServer: no reverse lookup at
/// bind.)
const VHOST_SERVER: &str = r#"
import socketserver, http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 1  # an idle keep-alive connection is closed after 1 s
    def do_GET(self):
        body = ("VHOST %s\n" % self.headers.get("Host")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True; daemon_threads = True
srv = S((sys.argv[1], int(sys.argv[2])), H)
print("ready", flush=True)
srv.serve_forever()
"#;

/// Red-team wave 4, W5 (FR-RT-007 evidence): what a lenient HTTP server
/// takes for a request was not always HTTP to the proxy. Python's
/// `http.server` splits a request line on any whitespace — bytes 0x1c-0x1f
/// and, read as Latin-1, 0x85 and 0xa0 included — and skips it in front of
/// the method. On 443 a first message `GET\x1c/\x1cHTTP/1.1` or ` GET / …`
/// did not begin like a request line, so it was "another protocol",
/// spliced unchecked; after an `Upgrade` request the server ignored (80 or
/// 443), a next request beginning with a space was taken for the upgraded
/// protocol and passed unread. Both reached `evil.test` on the name's
/// server. Now a first line naming an `HTTP/` version is HTTP whatever
/// separates its words (and refused unless the strict parser reads it),
/// and bytes a server may skip before a request line are HTTP after an
/// upgrade too; WebSocket frames and TLS in a tunnel still pass.
#[test]
fn issue_26_a_request_line_a_lenient_server_reads_is_checked() {
    if !root_and_tools("issue_26_a_request_line_a_lenient_server_reads_is_checked") {
        return;
    }
    let net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[("vhost.test", &["203.0.113.53"])]);
    for port in ["80", "443"] {
        assert_eq!(
            svc.start(Some(&net.ns), VHOST_SERVER, &["203.0.113.53", port]),
            "ready"
        );
    }
    let fx = Fixture::new();
    fx.install(
        "v",
        &manifest("restricted", &["vhost.test:80", "vhost.test:443"]),
    );
    let raw = |s: &[u8]| s.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let upgrade = hex(
        "GET / HTTP/1.1\r\nHost: vhost.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    );
    let spaced = hex(" GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
    let probes = serde_json::json!([
        {"kind": "seq", "host": "vhost.test", "port": 443,
         "sends": [raw(b"GET\x1c/\x1cHTTP/1.1\r\nHost: evil.test\r\n\r\n")]},            // 0
        {"kind": "seq", "host": "vhost.test", "port": 443, "sends": [spaced.clone()]},          // 1
        {"kind": "seq", "host": "vhost.test", "port": 443,
         "sends": [raw(b"\x85GET\xa0/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")]},           // 2
        {"kind": "seq", "host": "vhost.test", "port": 80, "sends": [upgrade.clone(), spaced.clone()]},  // 3
        {"kind": "seq", "host": "vhost.test", "port": 443, "sends": [upgrade.clone(), spaced]},  // 4
        {"kind": "seq", "host": "vhost.test", "port": 443,
         "sends": [hex("GET / HTTP/1.1\r\nHost: vhost.test\r\n\r\n")]},                   // 5
        {"kind": "seq", "host": "vhost.test", "port": 80,
         "sends": [upgrade, raw(b"\x81\x85\x00\x00\x00\x00hello")]},                      // 6 a WebSocket frame
    ]);
    let (r, ev, _) = probe_via(&fx, "v", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in 0..5 {
        let got = result(&r, i).0;
        assert!(
            !got.contains("VHOST evil.test"),
            "probe {i} reached evil.test on the name's server: {got}"
        );
    }
    for i in [3, 4] {
        assert!(
            result(&r, i).0.contains("VHOST vhost.test"),
            "the upgrade request itself is answered: {:?}",
            r[i]
        );
    }
    assert!(result(&r, 5).0.contains("VHOST vhost.test"), "{:?}", r[5]);
    // The server ignores the upgrade: the frame is no request to it (400).
    assert!(result(&r, 6).0.contains("VHOST vhost.test"), "{:?}", r[6]);
    let denied = calls(&ev, |c| {
        c["allowed"] == false
            && c["name"] == "vhost.test"
            && c["decided_by"].as_str().unwrap_or("").contains("HTTP")
    });
    assert!(denied.len() >= 3, "{:#}", ev["external_calls"]);
}

/// Red-team wave 4, W6 (FR-RT-007 evidence): a request's body was passed
/// unread by its Content-Length, but a server that does not read the
/// body of a GET (Python's `http.server` handlers, many small ones) takes
/// the body for the next request: a body that is itself a request for
/// `evil.test` reached it, on 80 and on 443. Now the start of a body is
/// read as the next request would be: a body beginning with a request
/// head (a first line naming an `HTTP/` version) must name only the name,
/// and must end within the body. Bodies that are data still pass.
#[test]
fn issue_26_a_request_inside_a_body_is_checked() {
    if !root_and_tools("issue_26_a_request_inside_a_body_is_checked") {
        return;
    }
    let net = Internet::up();
    let mut svc = Services::new();
    let dns = svc.dns(&[("vhost.test", &["203.0.113.53"])]);
    for port in ["80", "443"] {
        assert_eq!(
            svc.start(Some(&net.ns), VHOST_SERVER, &["203.0.113.53", port]),
            "ready"
        );
    }
    let fx = Fixture::new();
    fx.install(
        "b",
        &manifest("restricted", &["vhost.test:80", "vhost.test:443"]),
    );
    let with_body = |body: &str| {
        hex(&format!(
            "GET / HTTP/1.1\r\nHost: vhost.test\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ))
    };
    let inner = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    let probes = serde_json::json!([
        {"kind": "seq", "host": "vhost.test", "port": 80, "sends": [with_body(inner)]},                       // 0
        {"kind": "seq", "host": "vhost.test", "port": 443, "sends": [with_body(inner)]},                      // 1
        {"kind": "seq", "host": "vhost.test", "port": 80, "sends": [with_body(&format!("\r\n{inner}"))]},    // 2
        {"kind": "seq", "host": "vhost.test", "port": 80,
         "sends": [with_body("GET / HTTP/1.1\r\nHost: evil.test\r\n"), hex("X: y\r\n\r\n")]},        // 3 a head finished after the body
        {"kind": "seq", "host": "vhost.test", "port": 80,
         "sends": [with_body("GET / HTTP/1.1\r\nHost: vhost.test\r\n\r\n")]},                           // 4 the name's own
        {"kind": "seq", "host": "vhost.test", "port": 80, "sends": [with_body("{\"q\": \"HTTP/1.1\"}\n")]},  // 5 data
    ]);
    let (r, ev, _) = probe_via(&fx, "b", &[], &dns, &probes);
    eprintln!("{r:#?}");
    for i in 0..4 {
        let got = result(&r, i).0;
        assert!(
            !got.contains("VHOST evil.test"),
            "probe {i} reached evil.test on the name's server: {got}"
        );
        assert!(got.ends_with("end=ECONNRESET"), "probe {i}: {got}");
    }
    assert_eq!(
        result(&r, 4).0.matches("VHOST vhost.test").count(),
        2,
        "{:?}",
        r[4]
    );
    assert!(result(&r, 5).0.contains("VHOST vhost.test"), "{:?}", r[5]);
    assert!(
        denied_and_recorded(&ev, "vhost.test", "HTTP Host `evil.test`"),
        "{:#}",
        ev["external_calls"]
    );
}

/// Red-team wave 4, W7 (resource exhaustion): the upstream resolver is the
/// host's, shared by every turn. An `allow_egress` turn asking its
/// resolver for random names (each looked up upstream, A and AAAA, never
/// cached) drove ~12,000 queries a second into it — enough to trip a cloud
/// resolver's per-host limit for every other turn and the host. A turn's
/// upstream lookups now have a budget (a burst of 100, then 25 a second):
/// beyond it the turn's resolver answers SERVFAIL, and the upstream sees
/// no more.
#[test]
fn issue_26_upstream_lookups_are_budgeted_per_turn() {
    if !root_and_tools("issue_26_upstream_lookups_are_budgeted_per_turn") {
        return;
    }
    let net = Internet::up();
    let fx = Fixture::new();
    fx.install("q", &manifest("allow_egress", &[]));
    let probes = serde_json::json!([
        {"kind": "lookups", "n": 400, "suffix": "flood.test"}, // 0
    ]);
    let t = Instant::now();
    let (r, _ev) = probe(&fx, "q", &probes);
    let secs = t.elapsed().as_secs_f64();
    eprintln!("{r:#?}");
    let asked = net
        .queries()
        .iter()
        .filter(|q| q.ends_with(".flood.test"))
        .count();
    // A and AAAA per lookup: at most the burst and the rate over the
    // turn's whole life.
    let bound = (2.0 * (100.0 + 25.0 * (secs + 1.0))) as usize;
    assert!(
        asked <= bound,
        "{asked} upstream queries in {secs:.1} s (at most {bound})"
    );
    let got = result(&r, 0).0;
    let count = |code: &str| {
        got.trim_start_matches("rcodes=")
            .split(',')
            .find_map(|kv| kv.strip_prefix(code))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0)
    };
    assert!(count("3:") >= 100, "the first names were looked up: {got}");
    assert!(count("2:") > 0, "then SERVFAIL: {got}");
}

/// Red-team wave 4, W8: what a violation says comes partly from the turn —
/// here a DNS name it asked — and `run` (without `--json`) and `explain`
/// printed it raw to the operator's terminal: a name holding an escape
/// sequence recolored (or could clear, retitle) the terminal, one holding
/// a line feed added a line of its own to the report. Both print such
/// characters escaped now; the evidence keeps the name as it was.
#[test]
fn issue_26_names_a_turn_sends_are_printed_escaped() {
    if !root_and_tools("issue_26_names_a_turn_sends_are_printed_escaped") {
        return;
    }
    let fx = Fixture::new();
    fx.install("e", &manifest("restricted", &["good.test:443"]));
    let label = |s: &[u8]| s.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let probes = serde_json::json!([
        {"kind": "rawquery", "labels": [label(b"\x1b]0;owned\x07\x1b[2J"), label(b"test")]},
        {"kind": "rawquery", "labels": [label(b"ok\n  - [network] forged"), label(b"test")]},
    ]);
    let out = Command::new(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(["--package", "e", "--no-outputs", "--"])
        .args(["/usr/bin/python3", "-c", PROBES])
        .arg(probes.to_string())
        .env("TURNSTILE_DNS_UPSTREAM", UPSTREAM)
        .env_remove("TURNSTILE_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("supervise: turn "))
        .collect();
    let sid = summary[0]
        .split_whitespace()
        .nth(4)
        .unwrap_or_default()
        .trim_end_matches(':')
        .to_owned();
    let explain = Command::new(supervise_bin())
        .args(["explain", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(["--session", &sid, "--turn", "1"])
        .output()
        .unwrap();
    let explained = String::from_utf8_lossy(&explain.stdout);
    assert!(explain.status.success(), "{explained}");
    for (what, text) in [
        ("run", summary.join("\n")),
        ("explain", explained.to_string()),
    ] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{what}: {text:?}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("- [network] forged")),
            "{what}: {text}"
        );
        assert!(text.contains("\\u{1b}]0;owned"), "{what}: {text}");
        assert!(text.contains("ok\\n  - [network] forged"), "{what}: {text}");
    }
}
