//! The runtime core (issue 28, seed 001): ARA `receive` as a turn, the
//! event bus routing one agent's envelopes to the next, replay across
//! agents, and the strict file bus. Agents are python3 scripts the tests
//! write into their packages.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_tests::{Fixture, Run, read_entries, require_root};

/// A package `pkg` whose `entry.receive` is `installed/<pkg>/agent.py`.
fn agent(fx: &Fixture, pkg: &str, script: &str, extra: &str) {
    fx.install(
        pkg,
        &format!(
            r#"{{"capabilities":{{"read":["installed/{pkg}/**"],
                "write":["output/<session_id>/**"],
                "execute":["/usr/bin/python3 installed/{pkg}/agent.py"]}},
              "entry":{{"receive":["/usr/bin/python3","installed/{pkg}/agent.py"]}}{extra}}}"#
        ),
    );
    fx.write(&format!("installed/{pkg}/agent.py"), script.as_bytes());
}

fn envelope_doc(key: &str, kind: &str, payload: Value) -> Value {
    json!({
        "id": format!("EVT-{key}"),
        "ts": "2026-01-01T00:00:00Z",
        "type": kind,
        "schema_version": "1",
        "idempotency_key": key,
        "source": {"agent": "client", "adapter": "cli"},
        "payload": payload,
    })
}

/// Writes an input envelope and returns its path.
fn envelope(fx: &Fixture, key: &str, kind: &str, payload: Value) -> PathBuf {
    let p = fx.state.parent().unwrap().join(format!("in-{key}.json"));
    std::fs::write(&p, envelope_doc(key, kind, payload).to_string()).unwrap();
    p
}

fn receive(fx: &Fixture, pkg: &str, sid: &str, env: &std::path::Path, extra: &[&str]) -> Run {
    let env = env.display().to_string();
    let mut args = vec!["--package", pkg, "--session", sid, "--envelope", &env];
    args.extend_from_slice(extra);
    fx.supervise(&["receive"], &args)
}

fn last_evidence(fx: &Fixture, sid: &str) -> Value {
    read_entries(&fx.ledger(sid, "evidence"))
        .into_iter()
        .rev()
        .find(|e| e["event"] == "turn.finished")
        .expect("a finish entry")
}

fn turns_started(fx: &Fixture, sid: &str) -> usize {
    read_entries(&fx.ledger(sid, "exec"))
        .iter()
        .filter(|e| e["event"] == "turn.started")
        .count()
}

/// Echoes `n + 1`, and reports whether it could reach the network and
/// write outside its declared outputs (it must not).
const COUNTER: &str = r#"
import json, socket, sys
e = json.loads(sys.stdin.read())
port = int(e["payload"].get("port", 9))
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    net = "reached"
except OSError as x:
    net = "refused"
try:
    open("installed/escape.txt", "w").write("x")
    wrote = "wrote"
except OSError:
    wrote = "refused"
print(json.dumps({"type": "count.next", "payload": {"n": e["payload"]["n"] + 1, "net": net, "write": wrote}}))
print(json.dumps({"type": "count.seen", "idempotency_key": "own-key"}))
"#;

#[test]
fn issue_28_seed_001_pure_receive_function_emits_canonical_envelopes_in_order() {
    if !require_root("issue_28_seed_001_pure_receive_function_emits_canonical_envelopes_in_order") {
        return;
    }
    let fx = Fixture::new();
    // The manifest asks for egress; a receive turn is isolated regardless.
    agent(
        &fx,
        "a",
        COUNTER,
        r#","network":"restricted","egress":["192.0.2.1:1-65535"]"#,
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sid = fx.new_session();
    let env = envelope(&fx, "IDEM-1", "count.start", json!({"n": 1, "port": port}));
    let r = receive(&fx, "a", &sid, &env, &[]);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    let first: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first["type"], "count.next");
    assert_eq!(first["payload"]["n"], 2);
    assert_eq!(
        first["payload"]["net"], "refused",
        "network must be isolated"
    );
    assert_eq!(first["payload"]["write"], "refused");
    assert_eq!(first["source"]["agent"], "a");
    assert_eq!(first["schema_version"], "1");
    // Derived from the input key and the index; the agent's own kept.
    assert_eq!(first["idempotency_key"], "IDEM-1:0");
    let second: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(second["idempotency_key"], "own-key");
    // Printed canonical: keys sorted, no whitespace.
    assert!(lines[0].starts_with("{\"id\":"), "{}", lines[0]);
    assert!(!lines[0].contains(": "), "{}", lines[0]);
    assert_eq!(serde_json::to_string(&first).unwrap().len(), lines[0].len());
    // The hop is in the ledgers: input and emitted, network isolated.
    let e = last_evidence(&fx, &sid);
    assert_eq!(e["status"], "committed");
    assert_eq!(e["receive"]["input"]["idempotency_key"], "IDEM-1");
    assert_eq!(e["receive"]["emitted"][0]["type"], "count.next");
    assert_eq!(e["enforcement"]["network"], "isolated");
    assert!(!fx.root.join("installed/escape.txt").exists());
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn issue_28_invalid_envelope_from_agent_fails_the_turn_and_emits_nothing() {
    if !require_root("issue_28_invalid_envelope_from_agent_fails_the_turn_and_emits_nothing") {
        return;
    }
    let fx = Fixture::new();
    // A good line, then one claiming to be another agent.
    agent(
        &fx,
        "a",
        r#"
import json, sys
sys.stdin.read()
print(json.dumps({"type": "ok.fine"}))
print(json.dumps({"type": "ok.forged", "source": {"agent": "b", "adapter": "x"}}))
"#,
        "",
    );
    let sid = fx.new_session();
    let env = envelope(&fx, "K1", "x.y", json!({}));
    let r = receive(&fx, "a", &sid, &env, &[]);
    assert_eq!(r.status, 10, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.stdout, "", "nothing emitted");
    assert!(r.stderr.contains("TS1091"), "{}", r.stderr);
    assert!(r.stderr.contains("line 2"), "{}", r.stderr);
    let j = receive(&fx, "a", &sid, &env, &["--json"]).json();
    assert_eq!(j["error"]["code"], "TS1091");
    assert_eq!(j["emitted"], json!([]));
    let e = last_evidence(&fx, &sid);
    assert_eq!(e["receive"]["emitted"], json!([]));
    assert_eq!(e["receive"]["refused"]["code"], "TS1091");
    // A runtime type is refused the same way.
    agent(
        &fx,
        "c",
        "import sys\nsys.stdin.read()\nprint('{\"type\":\"turn.finished\"}')\n",
        "",
    );
    let r = receive(&fx, "c", &sid, &envelope(&fx, "K2", "x.y", json!({})), &[]);
    assert_eq!(r.status, 10);
    assert!(r.stderr.contains("TS1091") && r.stderr.contains("runtime"));
    // A malformed input envelope is bad input: exit 2 naming the field,
    // nothing run.
    let bad = fx.state.parent().unwrap().join("bad.json");
    let mut doc = envelope_doc("K3", "x.y", json!({}));
    doc["type"] = json!("nodots");
    std::fs::write(&bad, doc.to_string()).unwrap();
    let before = turns_started(&fx, &sid);
    let r = receive(&fx, "a", &sid, &bad, &[]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("envelope.type"), "{}", r.stderr);
    assert_eq!(turns_started(&fx, &sid), before);
    fx.assert_ledgers_intact(&sid);
}

#[test]
fn issue_28_agent_printing_100_mb_is_cut_with_a_clear_error() {
    if !require_root("issue_28_agent_printing_100_mb_is_cut_with_a_clear_error") {
        return;
    }
    let fx = Fixture::new();
    agent(
        &fx,
        "a",
        r#"
import sys
sys.stdin.read()
chunk = b"x" * (1 << 20)
for _ in range(100):
    sys.stdout.buffer.write(chunk)
"#,
        "",
    );
    let sid = fx.new_session();
    let t = Instant::now();
    let r = receive(&fx, "a", &sid, &envelope(&fx, "BIG", "x.y", json!({})), &[]);
    assert_eq!(r.status, 10, "{}", r.stderr);
    assert_eq!(r.stdout, "");
    assert!(r.stderr.contains("TS1092"), "{}", r.stderr);
    assert!(r.stderr.contains("output budget"), "{}", r.stderr);
    assert!(t.elapsed() < Duration::from_secs(120));
    let e = last_evidence(&fx, &sid);
    assert_eq!(e["receive"]["refused"]["code"], "TS1092");
    // Read and counted, never held: only the budget was kept.
    assert_eq!(e["output"]["stdout"]["bytes"], 100 << 20);
    assert!(e["output"]["stdout"]["forwarded"].as_u64().unwrap() <= 1 << 20);
}

#[test]
fn issue_28_agent_that_never_answers_hits_the_timeout() {
    if !require_root("issue_28_agent_that_never_answers_hits_the_timeout") {
        return;
    }
    let fx = Fixture::new();
    agent(
        &fx,
        "a",
        "import time\nwhile True:\n    time.sleep(60)\n",
        "",
    );
    let sid = fx.new_session();
    let t = Instant::now();
    let r = receive(
        &fx,
        "a",
        &sid,
        &envelope(&fx, "SLOW", "x.y", json!({})),
        &["--timeout", "2"],
    );
    assert_eq!(r.status, 14, "{}", r.stderr);
    assert_eq!(r.stdout, "");
    assert!(t.elapsed() < Duration::from_secs(30));
    let e = last_evidence(&fx, &sid);
    assert_eq!(e["status"], "timeout");
    assert_eq!(e["receive"]["emitted"], json!([]));
}

#[test]
fn issue_28_seed_001_idempotency_check_same_key_invokes_the_agent_once() {
    if !require_root("issue_28_seed_001_idempotency_check_same_key_invokes_the_agent_once") {
        return;
    }
    let fx = Fixture::new();
    agent(&fx, "a", COUNTER, "");
    let sid = fx.new_session();
    let env = envelope(&fx, "IDEM-123", "count.start", json!({"n": 41}));
    let first = receive(&fx, "a", &sid, &env, &[]);
    assert_eq!(first.status, 0, "{}", first.stderr);
    let again = receive(&fx, "a", &sid, &env, &[]);
    assert_eq!(again.status, 0, "{}", again.stderr);
    // The recorded envelopes, byte for byte; the agent ran once.
    assert_eq!(first.stdout, again.stdout);
    assert!(again.stderr.contains("replayed"), "{}", again.stderr);
    assert_eq!(turns_started(&fx, &sid), 1);
    let j = receive(&fx, "a", &sid, &env, &["--json"]).json();
    assert_eq!(j["replayed"], true);
    assert_eq!(j["emitted"][0]["payload"]["n"], 42);
    assert_eq!(turns_started(&fx, &sid), 1);
}

#[test]
fn issue_28_receive_entry_is_validated_at_load_and_required() {
    if !require_root("issue_28_receive_entry_is_validated_at_load_and_required") {
        return;
    }
    let fx = Fixture::new();
    let sid = fx.new_session();
    let env = envelope(&fx, "K", "x.y", json!({}));
    // An entry no execute entry admits grants nothing: exit 2, named.
    fx.install(
        "bad",
        r#"{"capabilities":{"execute":["/usr/bin/python3 installed/bad/other.py"]},
            "entry":{"receive":["/usr/bin/python3","installed/bad/agent.py"]}}"#,
    );
    let r = receive(&fx, "bad", &sid, &env, &[]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("entry.receive"), "{}", r.stderr);
    fx.install(
        "empty",
        r#"{"capabilities":{"execute":["/bin/true"]},"entry":{}}"#,
    );
    let r = receive(&fx, "empty", &sid, &env, &[]);
    assert_eq!(r.status, 2);
    assert!(r.stderr.contains("`entry`"), "{}", r.stderr);
    // No entry at all: TS1090.
    fx.install("none", r#"{"capabilities":{"execute":["/bin/true"]}}"#);
    let r = receive(&fx, "none", &sid, &env, &[]);
    assert_eq!(r.status, 2);
    assert!(r.stderr.contains("TS1090"), "{}", r.stderr);
    assert_eq!(turns_started(&fx, &sid), 0);
}

// ---- the daemon ------------------------------------------------------------

/// A running `supervise serve`; SIGTERM'd (then SIGKILL'd) when dropped.
struct Daemon {
    child: Option<std::process::Child>,
    socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(fx: &Fixture, extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new().prefix("ts-rc-").tempdir().unwrap();
        Self::start_in(fx, dir, extra)
    }

    fn start_in(fx: &Fixture, dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_env(fx, dir, extra, &[])
    }

    fn start_env(
        fx: &Fixture,
        dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let socket = dir.path().join("serve.sock");
        let n = std::fs::read_dir(dir.path()).unwrap().count();
        let log = dir.path().join(format!("daemon-{n}.log"));
        let child = std::process::Command::new(turnstile_tests::supervise_bin())
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--state-dir")
            .arg(&fx.state)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn supervise serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child: Some(child),
            socket,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, no goodbye.
    fn kill9(mut self) -> tempfile::TempDir {
        if let Some(mut c) = self.child.take() {
            turnstile_tests::kill9_daemon(&mut c);
        }
        let _ = std::fs::remove_file(&self.socket);
        let dir = tempfile::Builder::new().prefix("ts-rc-").tempdir().unwrap();
        std::mem::replace(&mut self._dir, dir)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- the strict file bus (item 6) ------------------------------------------

const ECHO_MANIFEST: &str = r#"{
  "capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/echo"]},
  "limits": {"memory": "128Mi", "pids": 32, "timeout_seconds": 30}
}"#;

fn bus_dir(fx: &Fixture, name: &str, approval: &str) -> PathBuf {
    let bus = fx.state.parent().unwrap().join(name);
    for sub in ["input", "approvals"] {
        std::fs::create_dir_all(bus.join(sub)).unwrap();
    }
    std::fs::write(
        bus.join("rules.v0.1.yaml"),
        format!(
            r#"rules:
  - id: live-echo
    trigger: {{command_type: exec, source: "*"}}
    guards: {{approval: {approval}}}
    actions:
      - run: "echo hello {{{{msg_id}}}}"
        allowlist: ["echo"]
        workspace: {}
        package: e
        mode: live
"#,
            fx.root.display()
        ),
    )
    .unwrap();
    bus
}

fn bus_message(id: &str) -> String {
    json!({
        "msg_id": id, "category": "A", "msg_type": "COMMAND", "command_type": "exec",
        "title": format!("title-{id}"), "run": ["x"],
        "context": {"phase": 1, "requested_by": "agent-7"},
        "timestamp": "2026-11-23T10:00:00Z",
    })
    .to_string()
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

fn drop_message(bus: &std::path::Path, id: &str) -> String {
    let msg = bus_message(id);
    let tmp = bus.join(format!("input/.{id}.tmp"));
    std::fs::write(&tmp, &msg).unwrap();
    std::fs::rename(&tmp, bus.join("input").join(format!("{id}.json"))).unwrap();
    msg
}

/// The evidence of `id`, once written: (output|error, the evidence).
fn bus_evidence(bus: &std::path::Path, id: &str) -> Option<(String, Value)> {
    for sub in ["output", "error"] {
        let p = bus.join(sub).join(format!("{id}.json"));
        if let Ok(b) = std::fs::read(&p) {
            return Some((sub.to_owned(), serde_json::from_slice(&b).unwrap()));
        }
    }
    None
}

fn daemon_config(fx: &Fixture, name: &str, v: Value) -> String {
    let p = fx.state.parent().unwrap().join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p.display().to_string()
}

#[test]
fn issue_28_bus_dry_run_wins_over_a_rules_mode_live() {
    if !require_root("issue_28_bus_dry_run_wins_over_a_rules_mode_live") {
        return;
    }
    let fx = Fixture::new();
    fx.install("e", ECHO_MANIFEST);
    let bus = bus_dir(&fx, "bus", "none");
    let b = bus.display().to_string();
    let daemon = Daemon::start(&fx, &["--bus", &b, "--dry-run"]);
    drop_message(&bus, "m1");
    wait_for("evidence", 60, || bus_evidence(&bus, "m1").is_some());
    let (sub, v) = bus_evidence(&bus, "m1").unwrap();
    assert_eq!(sub, "output", "{v}");
    let a = &v["actions"][0];
    assert_eq!(a["mode"], "dry-run", "{v}");
    assert_eq!(a["would_execute"][0], "/usr/bin/echo");
    assert!(a.get("session_id").is_none(), "a dry run ran a turn: {v}");
    assert!(
        !fx.state.join("bus-sessions").exists(),
        "no session was made"
    );
    assert!(daemon.log().contains("mode dry-run"), "{}", daemon.log());
}

#[test]
fn issue_28_bus_forged_approval_is_ignored_and_recorded() {
    if !require_root("issue_28_bus_forged_approval_is_ignored_and_recorded") {
        return;
    }
    let fx = Fixture::new();
    fx.install("e", ECHO_MANIFEST);
    let bus = bus_dir(&fx, "bus", "required");
    let b = bus.display().to_string();
    let cfg = daemon_config(&fx, "daemon.json", json!({"approvers": ["alice"]}));
    let daemon = Daemon::start(&fx, &["--bus", &b, "--daemon-config", &cfg]);
    let msg = drop_message(&bus, "m1");
    let sha = sha256_hex(msg.as_bytes());
    let approvals = bus.join("approvals");
    let held = || bus.join("processing/m1.json").exists() && bus_evidence(&bus, "m1").is_none();
    wait_for("the message held", 60, held);
    // An approver writes its file whole (temp file, rename): the daemon
    // must never see half of one.
    let staging = bus.parent().unwrap().join("approval-staging");
    std::fs::create_dir_all(&staging).unwrap();
    let put = |path: &std::path::Path, text: String| {
        let tmp = staging.join(path.file_name().unwrap());
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    };
    // Forgeries: a bare file, another content's hash, a stranger.
    put(&approvals.join("m1"), "ok".to_owned());
    wait_for("the bare file ignored", 30, || {
        daemon.log().contains("\"file\":\"m1\"")
    });
    put(
        &approvals.join("m1.json"),
        json!({"sha256": sha256_hex(b"other"), "approver": "alice"}).to_string(),
    );
    wait_for("the wrong hash ignored", 30, || {
        daemon.log().contains("other content")
    });
    put(
        &approvals.join("m1.json"),
        json!({"sha256": sha, "approver": "mallory"}).to_string(),
    );
    wait_for("the stranger ignored", 30, || {
        daemon.log().contains("mallory")
    });
    assert!(held(), "a forged approval released the message");
    let h = std::process::Command::new(turnstile_tests::supervise_bin())
        .args(["health", "--json", "--server"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let h: Value = serde_json::from_slice(&h.stdout).unwrap();
    let ignored = &h["daemon"]["bus"]["held"][0]["approvals_ignored"];
    assert_eq!(ignored.as_array().map(Vec::len), Some(3), "{h}");
    assert_eq!(ignored[0]["code"], "TS1095");
    // The real approval: runs, and the evidence records the forgeries.
    std::fs::remove_file(approvals.join("m1")).unwrap();
    put(
        &approvals.join("m1.json"),
        json!({"sha256": sha, "approver": "alice"}).to_string(),
    );
    wait_for("the approved message", 60, || {
        bus_evidence(&bus, "m1").is_some()
    });
    let (sub, v) = bus_evidence(&bus, "m1").unwrap();
    assert_eq!(sub, "output", "{v}");
    assert_eq!(v["actions"][0]["status"], "committed", "{v}");
    let rec = v["approvals_ignored"].as_array().unwrap();
    assert_eq!(rec.len(), 3, "{v}");
    assert!(rec.iter().all(|r| r["code"] == "TS1095"));
}

#[test]
fn issue_28_bus_production_requires_the_sandbox_bus_first() {
    if !require_root("issue_28_bus_production_requires_the_sandbox_bus_first") {
        return;
    }
    let fx = Fixture::new();
    fx.install("e", ECHO_MANIFEST);
    let sandbox = bus_dir(&fx, "sandbox-bus", "none");
    let prod = bus_dir(&fx, "prod-bus", "none");
    // m2 goes through the sandbox bus in dry-run first.
    {
        let sb = sandbox.display().to_string();
        let _d = Daemon::start(&fx, &["--bus", &sb, "--dry-run"]);
        drop_message(&sandbox, "m2");
        wait_for("sandbox evidence", 60, || {
            bus_evidence(&sandbox, "m2").is_some()
        });
    }
    let cfg = daemon_config(
        &fx,
        "prod.json",
        json!({"bus": {"role": "production", "sandbox_bus": sandbox}}),
    );
    let p = prod.display().to_string();
    let mut daemon = Daemon::start(&fx, &["--bus", &p, "--daemon-config", &cfg]);
    drop_message(&prod, "m1");
    drop_message(&prod, "m2");
    wait_for("production evidence", 60, || {
        bus_evidence(&prod, "m1").is_some() && bus_evidence(&prod, "m2").is_some()
    });
    let (sub, v) = bus_evidence(&prod, "m1").unwrap();
    assert_eq!(sub, "error", "{v}");
    assert_eq!(v["error"]["code"], "TS1096", "{v}");
    assert!(v.get("actions").is_none(), "nothing ran: {v}");
    let (sub, v) = bus_evidence(&prod, "m2").unwrap();
    assert_eq!(sub, "output", "{v}");
    assert_eq!(v["actions"][0]["mode"], "live");
    assert_eq!(v["actions"][0]["status"], "committed", "{v}");
    // Said at start.
    let log = daemon.log();
    assert!(log.contains("role production"), "{log}");
    assert!(
        log.contains("only after it was processed in dry-run on the sandbox bus"),
        "{log}"
    );
    assert_eq!(daemon.stop(), Some(0));
    // Unless the config says otherwise — and then it says so.
    let off = daemon_config(
        &fx,
        "off.json",
        json!({"bus": {"role": "production", "require_sandbox_first": false}}),
    );
    let daemon = Daemon::start(&fx, &["--bus", &p, "--daemon-config", &off]);
    drop_message(&prod, "m3");
    wait_for("m3 evidence", 60, || bus_evidence(&prod, "m3").is_some());
    assert_eq!(bus_evidence(&prod, "m3").unwrap().0, "output");
    assert!(
        daemon.log().contains("sandbox-first is NOT enforced"),
        "{}",
        daemon.log()
    );
    // A production role without a sandbox bus refuses to start.
    let bad = daemon_config(&fx, "bad.json", json!({"bus": {"role": "production"}}));
    let state = fx.state.display().to_string();
    let r = Fixture::raw(&[
        "serve",
        "--state-dir",
        &state,
        "--bus",
        &p,
        "--daemon-config",
        &bad,
    ]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("bus.sandbox_bus"), "{}", r.stderr);
}

// ---- serve subscriptions: chains (item 2) ---------------------------------

/// An agent that emits `next` (if any) with its input's payload and its
/// own name appended to `path`; sleeps `sleep` seconds first.
fn relay(next: Option<&str>, sleep: u32) -> String {
    let emit = match next {
        Some(t) => format!(
            "print(json.dumps({{\"type\": \"{t}\", \"payload\": {{\"path\": e[\"payload\"].get(\"path\", []) + [me]}}}}))"
        ),
        None => String::new(),
    };
    // With `probe` in the input: whether each path (the daemon's socket,
    // its event bus) can be reached from the turn.
    let probe = r#"
import socket
res = []
for p in e["payload"].get("probe", []):
    try:
        if p.endswith(".sock"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(p)
            s.close()
        else:
            os.listdir(p)
        res.append("reached")
    except OSError:
        res.append("unreachable")
"#;
    let emit = emit.replace("[me]}", "[me], \"probe\": res}");
    format!(
        "import json, os, sys, time\ne = json.loads(sys.stdin.read())\nme = os.path.basename(os.path.dirname(os.path.abspath(sys.argv[0])))\n{probe}\ntime.sleep({sleep})\n{emit}\n"
    )
}

/// Every committed receive of `pkg`, from every session's evidence.
fn receives_of(fx: &Fixture, pkg: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(fx.root.join("planes/ho1/sessions")) else {
        return out;
    };
    for s in rd.flatten() {
        let ledger = s.path().join("ledger/evidence.jsonl");
        if !ledger.exists() {
            continue;
        }
        for e in read_entries(&ledger) {
            if e["event"] == "turn.finished"
                && e["package_id"] == pkg
                && e["status"] == "committed"
                && e.get("receive").is_some()
            {
                out.push(e);
            }
        }
    }
    out
}

fn chain_config(fx: &Fixture, subs: &[(&str, &str)], max_hops: u32) -> String {
    let subs: Vec<Value> = subs
        .iter()
        .map(|(t, p)| json!({"type": t, "root": fx.root, "package": p}))
        .collect();
    daemon_config(
        fx,
        "chain.json",
        json!({"subscriptions": subs, "max_hops": max_hops}),
    )
}

fn receive_via(fx: &Fixture, daemon: &Daemon, pkg: &str, env: &std::path::Path) -> Run {
    let sock = daemon.socket.display().to_string();
    let env = env.display().to_string();
    let root = fx.root.display().to_string();
    Fixture::raw(&[
        "receive",
        "--root",
        &root,
        "--package",
        pkg,
        "--envelope",
        &env,
        "--server",
        &sock,
    ])
}

#[test]
fn issue_28_chain_a_b_c_through_serve_every_hop_in_the_ledgers() {
    if !require_root("issue_28_chain_a_b_c_through_serve_every_hop_in_the_ledgers") {
        return;
    }
    let fx = Fixture::new();
    agent(&fx, "a", &relay(Some("order.checked"), 0), "");
    agent(&fx, "b", &relay(Some("order.billed"), 0), "");
    agent(&fx, "c", &relay(Some("order.done"), 0), "");
    let cfg = chain_config(&fx, &[("order.checked", "b"), ("order.billed", "c")], 8);
    let daemon = Daemon::start(&fx, &["--daemon-config", &cfg]);
    // The bus is out of the agent's reach: the daemon's socket and its
    // event bus directory.
    let probe = json!([daemon.socket, fx.state.join("eventbus/pending")]);
    let env = envelope(&fx, "ORDER-1", "order.placed", json!({"probe": probe}));
    let r = receive_via(&fx, &daemon, "a", &env);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let a_out: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(a_out["type"], "order.checked");
    assert_eq!(
        a_out["payload"]["probe"],
        json!(["unreachable", "unreachable"]),
        "{a_out}"
    );
    wait_for("C's receive", 60, || receives_of(&fx, "c").len() == 1);
    let (a, b, c) = (
        receives_of(&fx, "a"),
        receives_of(&fx, "b"),
        receives_of(&fx, "c"),
    );
    assert_eq!((a.len(), b.len(), c.len()), (1, 1, 1));
    // Each hop's input is the previous hop's output, byte for byte.
    assert_eq!(a[0]["receive"]["hop"], 0);
    assert_eq!(b[0]["receive"]["hop"], 1);
    assert_eq!(c[0]["receive"]["hop"], 2);
    assert_eq!(b[0]["receive"]["input"], a[0]["receive"]["emitted"][0]);
    assert_eq!(c[0]["receive"]["input"], b[0]["receive"]["emitted"][0]);
    assert_eq!(a[0]["receive"]["emitted"][0], a_out);
    assert_eq!(
        c[0]["receive"]["emitted"][0]["payload"]["path"],
        json!(["a", "b", "c"])
    );
    assert_eq!(
        c[0]["receive"]["emitted"][0]["idempotency_key"],
        "ORDER-1:0:0:0"
    );
    // A subscribed package without an entry point refuses the start.
    fx.install("noentry", ECHO_MANIFEST);
    let bad = chain_config(&fx, &[("order.checked", "noentry")], 8);
    let state = fx.state.display().to_string();
    let r = Fixture::raw(&[
        "serve",
        "--state-dir",
        &state,
        "--socket",
        "/nonexistent-dir/x.sock",
        "--daemon-config",
        &bad,
    ]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("subscriptions[0].package") && r.stderr.contains("entry.receive"),
        "{}",
        r.stderr
    );
    // order.done has no subscriber: nothing else runs, nothing is dead.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(receives_of(&fx, "c").len(), 1);
    assert!(
        std::fs::read_dir(fx.state.join("eventbus/dead"))
            .unwrap()
            .next()
            .is_none()
    );
}

#[test]
fn issue_28_subscription_loop_a_b_a_is_cut_at_the_hop_limit() {
    if !require_root("issue_28_subscription_loop_a_b_a_is_cut_at_the_hop_limit") {
        return;
    }
    let fx = Fixture::new();
    agent(&fx, "a", &relay(Some("ping.a"), 0), "");
    agent(&fx, "b", &relay(Some("ping.b"), 0), "");
    let cfg = chain_config(&fx, &[("ping.a", "b"), ("ping.b", "a")], 3);
    let daemon = Daemon::start(&fx, &["--daemon-config", &cfg]);
    let r = receive_via(
        &fx,
        &daemon,
        "a",
        &envelope(&fx, "P", "ping.start", json!({})),
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let dead = fx.state.join("eventbus/dead");
    // The letters written whole: a letter is written to a `.name.tmp.PID`
    // file first and renamed (fsx::write_atomic).
    let letters = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dead)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_for("the dead letter", 60, || letters().len() == 1);
    let letter: Value = serde_json::from_slice(&std::fs::read(&letters()[0]).unwrap()).unwrap();
    assert_eq!(letter["error"]["code"], "TS1094", "{letter}");
    assert!(
        letter["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_hops 3")
    );
    assert_eq!(letter["package"], "a");
    // a (hop 0), b (1), a (2), b (3); the next hop is cut.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(receives_of(&fx, "a").len(), 2);
    assert_eq!(receives_of(&fx, "b").len(), 2);
    assert!(daemon.log().contains("TS1094"), "{}", daemon.log());
}

#[test]
fn issue_28_sigkill_of_the_daemon_mid_chain_then_restart_effects_exactly_once() {
    if !require_root("issue_28_sigkill_of_the_daemon_mid_chain_then_restart_effects_exactly_once") {
        return;
    }
    let fx = Fixture::new();
    agent(&fx, "a", &relay(Some("order.checked"), 0), "");
    // B is slow: the daemon dies while B's turn runs.
    agent(&fx, "b", &relay(Some("order.billed"), 3), "");
    agent(&fx, "c", &relay(None, 0), "");
    let cfg = chain_config(&fx, &[("order.checked", "b"), ("order.billed", "c")], 8);
    let daemon = Daemon::start(&fx, &["--daemon-config", &cfg]);
    let r = receive_via(
        &fx,
        &daemon,
        "a",
        &envelope(&fx, "ORDER-9", "order.placed", json!({})),
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    // B's turn has begun (its intent entry is in a ledger).
    wait_for("B's turn to start", 60, || {
        std::fs::read_dir(fx.root.join("planes/ho1/sessions"))
            .unwrap()
            .flatten()
            .any(|s| {
                let l = s.path().join("ledger/exec.jsonl");
                l.exists()
                    && read_entries(&l)
                        .iter()
                        .any(|e| e["event"] == "turn.started")
                    && read_entries(&s.path().join("ledger/evidence.jsonl"))
                        .iter()
                        .all(|e| e["event"] != "turn.finished")
            })
    });
    let dir = daemon.kill9();
    let daemon = Daemon::start_in(&fx, dir, &["--daemon-config", &cfg]);
    wait_for("C's receive after the restart", 90, || {
        receives_of(&fx, "c").len() == 1
    });
    std::thread::sleep(Duration::from_millis(1500));
    // Exactly once in effect: one committed receive per hop.
    assert_eq!(receives_of(&fx, "a").len(), 1);
    assert_eq!(receives_of(&fx, "b").len(), 1);
    assert_eq!(receives_of(&fx, "c").len(), 1);
    // B's cut turn is recorded `aborted`, then its second attempt.
    let b = &receives_of(&fx, "b")[0];
    assert_eq!(b["idempotency_key"], "ORDER-9:0:attempt1", "{b}");
    assert_eq!(
        receives_of(&fx, "c")[0]["receive"]["input"]["idempotency_key"],
        "ORDER-9:0:0"
    );
    // A third start finds nothing to do.
    let dir = daemon.kill9();
    let daemon = Daemon::start_in(&fx, dir, &["--daemon-config", &cfg]);
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(receives_of(&fx, "b").len(), 1);
    assert_eq!(receives_of(&fx, "c").len(), 1);
    drop(daemon);
}

// ---- replay determinism (item 3) --------------------------------------------

/// Keeps a running sum in `output/<session_id>/state.json` and emits it.
const SUMMER: &str = r#"
import json, os, sys
e = json.loads(sys.stdin.read())
p = "output/%s/state.json" % os.environ["TURNSTILE_SESSION_ID"]
n = json.load(open(p))["n"] if os.path.exists(p) else 0
n += e["payload"]["add"] * FACTOR
json.dump({"n": n}, open(p, "w"))
print(json.dumps({"type": "sum.updated", "payload": {"n": n}}))
"#;

fn summer(fx: &Fixture, factor: u32) {
    fx.install(
        "s",
        r#"{"capabilities":{"read":["installed/s/**","output/<session_id>/**"],
            "write":["output/<session_id>/**"],
            "execute":["/usr/bin/python3 installed/s/agent.py"]},
          "entry":{"receive":["/usr/bin/python3","installed/s/agent.py"]}}"#,
    );
    fx.write(
        "installed/s/agent.py",
        SUMMER.replace("FACTOR", &factor.to_string()).as_bytes(),
    );
}

fn replay_json(fx: &Fixture, sessions: &[&str], into: &std::path::Path) -> (i32, Value) {
    let into = into.display().to_string();
    let mut args = vec!["--into", &into, "--json"];
    for s in sessions {
        args.extend_from_slice(&["--session", s]);
    }
    let r = fx.supervise(&["replay"], &args);
    (r.status, r.json())
}

#[test]
fn issue_28_seed_001_replay_determinism_receive_stream_byte_identical_and_first_difference() {
    if !require_root(
        "issue_28_seed_001_replay_determinism_receive_stream_byte_identical_and_first_difference",
    ) {
        return;
    }
    let fx = Fixture::new();
    summer(&fx, 1);
    let r = fx.supervise(
        &["session", "new"],
        &[
            "--deterministic",
            "--seed",
            "7",
            "--clock",
            "2026-01-01T00:00:00Z",
        ],
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    let sid = r.stdout.trim().to_owned();
    let mut printed = String::new();
    for (i, add) in [3, 4, 5].iter().enumerate() {
        let env = envelope(&fx, &format!("S{i}"), "sum.add", json!({"add": add}));
        let r = receive(
            &fx,
            "s",
            &sid,
            &env,
            &["--output", "output/<session_id>/state.json:state"],
        );
        assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
        printed += &r.stdout;
    }
    assert!(printed.contains("{\"n\":12}"), "{printed}");
    let base = fx.state.parent().unwrap();
    let (status, v) = replay_json(&fx, &[&sid], &base.join("same"));
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["identical"], true, "{v}");
    assert_eq!(v["emitted"]["original"], 3);
    assert_eq!(v["emitted"]["replay"], 3);
    assert_eq!(v["tree_sha256"]["original"], v["tree_sha256"]["replay"]);
    // Deterministic: the replayed ledgers are the original's, byte for byte.
    let rsid = v["replayed_session_id"].as_str().unwrap();
    let replayed = base
        .join("same/root/planes/ho1/sessions")
        .join(rsid)
        .join("ledger/evidence.jsonl");
    assert_eq!(
        std::fs::read(fx.ledger(&sid, "evidence")).unwrap(),
        std::fs::read(replayed).unwrap()
    );
    // The agent changed since: the first emitted envelope that differs is
    // named, exit 3.
    summer(&fx, 2);
    let (status, v) = replay_json(&fx, &[&sid], &base.join("other"));
    assert_eq!(status, 3, "{v}");
    let d = v["first_difference"].as_str().unwrap();
    assert!(d.starts_with("emitted envelope 1 differs"), "{d}");
    assert!(d.contains("{\"n\":3}") && d.contains("{\"n\":6}"), "{d}");
    assert_ne!(v["tree_sha256"]["original"], v["tree_sha256"]["replay"]);
}

#[test]
fn issue_28_replay_across_agents_of_a_chain_reproduces_every_envelope() {
    if !require_root("issue_28_replay_across_agents_of_a_chain_reproduces_every_envelope") {
        return;
    }
    let fx = Fixture::new();
    agent(&fx, "a", &relay(Some("order.checked"), 0), "");
    agent(&fx, "b", &relay(Some("order.billed"), 0), "");
    agent(&fx, "c", &relay(Some("order.done"), 0), "");
    let cfg = chain_config(&fx, &[("order.checked", "b"), ("order.billed", "c")], 8);
    let mut daemon = Daemon::start(&fx, &["--daemon-config", &cfg]);
    let r = receive_via(
        &fx,
        &daemon,
        "a",
        &envelope(&fx, "R-1", "order.placed", json!({})),
    );
    assert_eq!(r.status, 0, "{}", r.stderr);
    wait_for("C's receive", 60, || receives_of(&fx, "c").len() == 1);
    assert_eq!(daemon.stop(), Some(0));
    let sid = |p: &str| {
        receives_of(&fx, p)[0]["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    let base = fx.state.parent().unwrap();
    let (status, v) = replay_json(&fx, &[&a, &b, &c], &base.join("chain"));
    assert_eq!(status, 0, "{v}");
    assert_eq!(v["identical"], true, "{v}");
    assert_eq!(v["sessions"].as_array().unwrap().len(), 3);
    for s in v["sessions"].as_array().unwrap() {
        assert_eq!(s["emitted"]["original"], 1, "{s}");
        assert_eq!(s["emitted"]["replay"], 1, "{s}");
    }
    // B changed: the report names B's session and its envelope.
    fx.write(
        "installed/b/agent.py",
        relay(Some("order.rebilled"), 0).as_bytes(),
    );
    let (status, v) = replay_json(&fx, &[&a, &b, &c], &base.join("chain2"));
    assert_eq!(status, 3, "{v}");
    let d = v["first_difference"].as_str().unwrap();
    assert!(
        d.starts_with(&format!("session {b}: emitted envelope 1")),
        "{d}"
    );
    assert!(d.contains("order.rebilled"), "{d}");
}

// ---- suspend / resume through the daemon (item 4) ---------------------------

const TICKER: &str = r#"{
  "capabilities": {"read": [], "write": [], "execute": ["/bin/sh", "/bin/sleep"]},
  "limits": {"timeout_seconds": 3}
}"#;

/// The lifecycle envelopes the daemon kept for `sid`: (type, reason).
fn lifecycle(fx: &Fixture, sid: &str) -> Vec<(String, String, Value)> {
    std::fs::read_to_string(fx.state.join("sessions").join(sid).join("lifecycle.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["type"].as_str().unwrap().to_owned(),
                v["payload"]["reason"].as_str().unwrap_or("").to_owned(),
                v,
            )
        })
        .collect()
}

/// The daemon's metrics text.
fn daemon_metrics(fx: &Fixture, daemon: &Daemon) -> String {
    let sock = daemon.socket.display().to_string();
    let state = fx.state.display().to_string();
    let h = Fixture::raw(&["health", "--json", "--server", &sock, "--state-dir", &state]);
    let v: Value = serde_json::from_str(h.stdout.trim()).expect("health --json");
    let addr = v["daemon"]["metrics"].as_str().expect("metrics address");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    out
}

/// The value of `series` (exact label text) in the metrics.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn active(state: &str) -> String {
    format!("agent_runtime_active_agents{{trust_level=\"standard\",state=\"{state}\"}}")
}

fn lifecycle_cmd(fx: &Fixture, daemon: &Daemon, op: &str, sid: &str) -> Run {
    let sock = daemon.socket.display().to_string();
    fx.supervise(&[op], &["--session", sid, "--server", &sock, "--json"])
}

#[test]
fn issue_28_suspend_resume_over_the_socket_timeout_waits_and_agent_events_reach_subscribers() {
    if !require_root(
        "issue_28_suspend_resume_over_the_socket_timeout_waits_and_agent_events_reach_subscribers",
    ) {
        return;
    }
    use std::io::BufRead;
    let fx = Fixture::new();
    fx.install("p", TICKER);
    // A subscriber to the runtime's lifecycle events.
    agent(&fx, "watch", &relay(None, 0), "");
    let cfg = chain_config(&fx, &[("agent.*", "watch")], 8);
    let daemon = Daemon::start(&fx, &["--daemon-config", &cfg, "--metrics", "127.0.0.1:0"]);
    let sid = fx.new_session();
    // Nothing runs in the session: refused, TS1052, over the socket too.
    let r = lifecycle_cmd(&fx, &daemon, "suspend", &sid);
    assert_eq!(r.status, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("TS1052"), "{}", r.stderr);
    // A bad request names the field.
    let r = fx.supervise(
        &["suspend"],
        &[
            "--session",
            "not-a-session",
            "--server",
            &daemon.socket.display().to_string(),
        ],
    );
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("session"), "{}", r.stderr);
    // A tenant is refused a session it does not own, over the socket too
    // (red-team H1, stop 54: `suspend`/`resume` checked no owner).
    let sock = daemon.socket.display().to_string();
    for op in ["suspend", "resume"] {
        let r = fx.supervise(
            &[op],
            &["--session", &sid, "--server", &sock, "--tenant", "team-b"],
        );
        assert_eq!(r.status, 2, "{op}: {}", r.stderr);
        assert!(r.stderr.contains("TS1041"), "{op}: {}", r.stderr);
    }
    let mut child = std::process::Command::new(turnstile_tests::supervise_bin())
        .args(["run", "--server"])
        .arg(&daemon.socket)
        .arg("--root")
        .arg(&fx.root)
        .args([
            "--package",
            "p",
            "--session",
            &sid,
            "--no-outputs",
            "--",
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 20 ]; do i=$((i+1)); echo $i; sleep 0.1; done",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = std::sync::Arc::clone(&lines);
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    wait_for("the first ticks", 20, || lines.lock().unwrap().len() >= 3);
    let r = lifecycle_cmd(&fx, &daemon, "suspend", &sid);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let rep: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(rep["frozen"], true, "{rep}");
    assert_eq!(rep["session_id"], sid.as_str());
    std::thread::sleep(Duration::from_millis(300));
    let frozen_at = lines.lock().unwrap().len();
    let m = daemon_metrics(&fx, &daemon);
    assert_eq!(series(&m, &active("suspended")), Some(1.0), "{m}");
    assert_eq!(series(&m, &active("running")), Some(0.0), "{m}");
    // Frozen for 3.5 s, longer than the whole timeout.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(
        lines.lock().unwrap().len(),
        frozen_at,
        "the counter advanced while suspended"
    );
    let r = lifecycle_cmd(&fx, &daemon, "resume", &sid);
    assert_eq!(r.status, 0, "{}{}", r.stdout, r.stderr);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    // Not timed out although it ran longer than its timeout.
    assert!(started.elapsed() > Duration::from_secs(4));
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(lines.lock().unwrap().len(), 20);
    let last = last_evidence(&fx, &sid);
    assert_eq!(last["status"], "committed", "{last}");
    let facts: Vec<(&str, &str)> = last["suspensions"]
        .as_array()
        .expect("suspensions")
        .iter()
        .map(|f| (f["event"].as_str().unwrap(), f["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        facts,
        [("turn.suspended", "request"), ("turn.resumed", "request")],
        "{last}"
    );
    // The transitions as the runtime's envelopes: kept, and delivered to
    // the subscriber of `agent.*`.
    let kinds: Vec<(String, String)> = lifecycle(&fx, &sid)
        .into_iter()
        .map(|(k, r, _)| (k, r))
        .collect();
    assert_eq!(
        kinds,
        [
            ("agent.suspended".to_owned(), "request".to_owned()),
            ("agent.resumed".to_owned(), "request".to_owned())
        ]
    );
    wait_for("the subscriber's receives", 60, || {
        receives_of(&fx, "watch").len() == 2
    });
    let mut seen: Vec<String> = receives_of(&fx, "watch")
        .iter()
        .map(|e| {
            assert_eq!(e["receive"]["input"]["payload"]["session_id"], sid.as_str());
            e["receive"]["input"]["type"].as_str().unwrap().to_owned()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, ["agent.resumed", "agent.suspended"]);
    let m = daemon_metrics(&fx, &daemon);
    assert_eq!(series(&m, &active("suspended")), Some(0.0), "{m}");
    fx.assert_ledgers_intact(&sid);
}

/// The warm sandbox of `sid` that the daemon keeps: its directory and the
/// published cgroup file's lines.
fn warm_sandbox(fx: &Fixture, sid: &str) -> Option<(PathBuf, Vec<String>)> {
    std::fs::read_dir(fx.state.join("sessions").join(sid))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("warm-") && e.path().is_dir())
        .find_map(|e| {
            let text = std::fs::read_to_string(e.path().join("cgroup.where")).ok()?;
            Some((e.path(), text.lines().map(str::to_owned).collect()))
        })
}

fn freezer_state(cg: &[String]) -> String {
    let f = cg.get(5).cloned().unwrap_or_default();
    std::fs::read_to_string(std::path::Path::new(&f).join("freezer.state"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn served(fx: &Fixture, daemon: &Daemon, sid: &str, cmd: &[&str]) -> Run {
    let sock = daemon.socket.display().to_string();
    let mut args = vec![
        "--package",
        "p",
        "--session",
        sid,
        "--no-outputs",
        "--json",
        "--server",
        &sock,
        "--",
    ];
    args.extend_from_slice(cmd);
    fx.supervise(&["run"], &args)
}

#[test]
fn issue_28_suspend_idle_after_seconds_freezes_the_warm_sandbox_a_turn_resumes_it_or_fails_e2024() {
    if !require_root(
        "issue_28_suspend_idle_after_seconds_freezes_the_warm_sandbox_a_turn_resumes_it_or_fails_e2024",
    ) {
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists() {
        assert!(
            std::env::var_os("TURNSTILE_REQUIRE_KERNEL").is_none(),
            "no v1 freezer hierarchy: this test breaks a warm sandbox's freezer"
        );
        eprintln!("skipped: no v1 freezer hierarchy here");
        return;
    }
    let fx = Fixture::new();
    fx.install("p", TICKER);
    let cfg = daemon_config(&fx, "idle.json", json!({"suspend_idle_after_seconds": 1}));
    let daemon = Daemon::start(&fx, &["--daemon-config", &cfg, "--metrics", "127.0.0.1:0"]);
    let sid = fx.new_session();
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo one"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    // Idle for a second: the warm sandbox is frozen, and says so.
    wait_for("the idle suspension", 30, || {
        lifecycle(&fx, &sid)
            .iter()
            .any(|(k, r, _)| k == "agent.suspended" && r == "idle")
    });
    let (_, cg) = warm_sandbox(&fx, &sid).expect("a warm sandbox");
    assert_eq!(freezer_state(&cg), "FROZEN");
    let m = daemon_metrics(&fx, &daemon);
    assert_eq!(series(&m, &active("suspended")), Some(1.0), "{m}");
    // The next turn resumes it transparently and runs in it.
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo two"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    let v: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["durations"]["sandbox"], "warm", "{v}");
    let last = last_evidence(&fx, &sid);
    let facts: Vec<(&str, &str)> = last["suspensions"]
        .as_array()
        .expect("suspensions")
        .iter()
        .map(|f| (f["event"].as_str().unwrap(), f["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        facts,
        [("turn.suspended", "idle"), ("turn.resumed", "turn")],
        "{last}"
    );
    assert!(
        lifecycle(&fx, &sid)
            .iter()
            .any(|(k, r, _)| k == "agent.resumed" && r == "turn")
    );

    // Idle again, frozen again; then its freezer is broken for real: the
    // sandbox's processes are moved out and its freezer cgroup removed, so
    // the thaw cannot be done.
    wait_for("the second idle suspension", 30, || {
        lifecycle(&fx, &sid)
            .iter()
            .filter(|(k, r, _)| k == "agent.suspended" && r == "idle")
            .count()
            == 2
    });
    let (warm_dir, cg) = warm_sandbox(&fx, &sid).expect("a warm sandbox");
    let freezer = PathBuf::from(&cg[5]);
    for pid in std::fs::read_to_string(freezer.join("cgroup.procs"))
        .unwrap()
        .lines()
    {
        std::fs::write("/sys/fs/cgroup/freezer/cgroup.procs", pid).unwrap();
    }
    std::fs::remove_dir(&freezer).unwrap();
    let before = turns_started(&fx, &sid);
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo three"]);
    assert_eq!(r.status, 20, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("E2024"), "{}{}", r.stdout, r.stderr);
    assert_eq!(turns_started(&fx, &sid), before, "a turn ran");
    let (k, reason, ended) = lifecycle(&fx, &sid).pop().unwrap();
    assert_eq!((k.as_str(), reason.as_str()), ("agent.terminated", "error"));
    assert_eq!(ended["payload"]["error"]["code"], "E2024", "{ended}");
    // The failure is in the hash chain too: the turn never started, so the
    // evidence ledger's last entry is the failed resume.
    let refused = read_entries(&fx.ledger(&sid, "evidence"))
        .into_iter()
        .last()
        .unwrap();
    assert_eq!(refused["event"], "session.resume_failed", "{refused}");
    assert_eq!(refused["error"]["code"], "E2024", "{refused}");
    assert_eq!(refused["package"], "p", "{refused}");
    fx.assert_ledgers_intact(&sid);
    // The sandbox is gone: processes, cgroups, directory.
    let memory = PathBuf::from(&cg[1]);
    wait_for("the broken sandbox to go", 30, || {
        !memory.exists() && !warm_dir.exists()
    });
    // The session still serves: the next turn builds its own sandbox.
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo four"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(last_evidence(&fx, &sid)["status"], "committed");
    fx.assert_ledgers_intact(&sid);
}

// ---- health that looks (item 5) --------------------------------------------

fn daemon_health(daemon: &Daemon) -> (i32, Value) {
    let sock = daemon.socket.display().to_string();
    let r = Fixture::raw(&["health", "--json", "--server", &sock]);
    (
        r.status,
        serde_json::from_str(r.stdout.trim()).unwrap_or(Value::Null),
    )
}

fn check<'a>(h: &'a Value, name: &str) -> &'a Value {
    h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {h}"))
}

/// Issue 28 item 5, each dependency broken for real: a pool worker
/// killed (DEGRADED, named), a served session's ledger edited (FAILED,
/// named), the denial observer switched off (DEGRADED); the network
/// policy's pieces are looked at. Seed 001 "Health Check": READY,
/// DEGRADED or FAILED, with the reasons when not READY.
#[test]
fn issue_28_seed_001_health_check_daemon_pool_ledgers_observer_network() {
    if !require_root("issue_28_seed_001_health_check_daemon_pool_ledgers_observer_network") {
        return;
    }
    let fx = Fixture::new();
    fx.install("p", TICKER);
    let daemon = Daemon::start(&fx, &[]);
    let sid = fx.new_session();
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo one"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    wait_for("the warm sandbox", 30, || warm_sandbox(&fx, &sid).is_some());
    let (code, h) = daemon_health(&daemon);
    for name in ["pool", "ledgers", "network", "denial_observer"] {
        let level = check(&h, name)["level"].as_str().unwrap();
        // The observer and nftables are the host's: ok here, degraded
        // where the host lacks them — never missing from the report.
        assert!(
            level == "ok" || (matches!(name, "network" | "denial_observer") && level == "degraded"),
            "{name}: {h}"
        );
    }
    let observer_here = check(&h, "denial_observer")["level"] == "ok";
    if h["status"] == "READY" {
        assert_eq!(code, 0);
        assert!(h["reasons"].as_array().unwrap().is_empty(), "{h}");
    }
    // The session's waiting worker, killed.
    let (warm, _) = warm_sandbox(&fx, &sid).unwrap();
    let pid: i32 = warm
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("warm-")
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the pool check to see it", 10, || {
        check(&daemon_health(&daemon).1, "pool")["level"] == "degraded"
    });
    let (code, h) = daemon_health(&daemon);
    assert_eq!((code, h["status"].as_str()), (0, Some("DEGRADED")), "{h}");
    let reasons = h["reasons"].to_string();
    assert!(
        reasons.contains(&format!("pid {pid}")) && reasons.contains(&sid),
        "{h}"
    );
    // The session still serves (a new worker); the pool is whole again.
    let r = served(&fx, &daemon, &sid, &["/bin/sh", "-c", "echo two"]);
    assert_eq!(r.status, 0, "{}", r.stderr);
    assert_eq!(check(&daemon_health(&daemon).1, "pool")["level"], "ok");
    // An acknowledged ledger entry of a served session, edited.
    let evidence = fx.ledger(&sid, "evidence");
    let text = std::fs::read_to_string(&evidence).unwrap();
    std::fs::write(&evidence, text.replacen("echo one", "echo 0ne", 1)).unwrap();
    let (code, h) = daemon_health(&daemon);
    assert_eq!((code, h["status"].as_str()), (1, Some("FAILED")), "{h}");
    assert_eq!(check(&h, "ledgers")["level"], "failed", "{h}");
    assert!(
        check(&h, "ledgers")["detail"]
            .as_str()
            .unwrap()
            .contains(&sid)
    );
    std::fs::write(&evidence, text).unwrap();
    assert_eq!(check(&daemon_health(&daemon).1, "ledgers")["level"], "ok");
    drop(daemon);
    // The denial observer switched off: DEGRADED, saying so.
    if observer_here {
        let dir = tempfile::Builder::new().prefix("ts-rc-").tempdir().unwrap();
        let off = Daemon::start_env(&fx, dir, &[], &[("TURNSTILE_DENIAL_OBSERVER", "off")]);
        let (code, h) = daemon_health(&off);
        assert_eq!((code, h["status"].as_str()), (0, Some("DEGRADED")), "{h}");
        assert_eq!(check(&h, "denial_observer")["level"], "degraded");
        assert!(
            h["reasons"]
                .to_string()
                .contains("TURNSTILE_DENIAL_OBSERVER=off"),
            "{h}"
        );
    }
}

/// Seed 001 "No Framework Dependencies": nothing in the workspace's
/// dependency graph (Cargo.lock) or its sources names an agent framework;
/// the runtime is std, well-kept crates and its own code.
#[test]
fn issue_28_seed_001_no_framework_dependencies() {
    const FRAMEWORKS: [&str; 4] = ["langchain", "autogen", "crewai", "maf"];
    let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let lock = std::fs::read_to_string(ws.join("Cargo.lock")).unwrap();
    let names: Vec<&str> = lock
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .map(|l| l.trim_end_matches('"'))
        .collect();
    assert!(names.len() > 50, "{} packages", names.len());
    for n in &names {
        let words: Vec<String> = n.split(['-', '_']).map(str::to_lowercase).collect();
        for f in FRAMEWORKS {
            assert!(
                !words
                    .iter()
                    .any(|w| w == f || (f != "maf" && w.contains(f))),
                "Cargo.lock depends on `{n}` (an agent framework)"
            );
        }
    }
    let mut stack = vec![
        ws.join("policy/src"),
        ws.join("supervisor/src"),
        ws.join("oci/src"),
        ws.join("shim/src"),
    ];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files += 1;
                let text = std::fs::read_to_string(&p).unwrap();
                for f in FRAMEWORKS {
                    for imp in [
                        format!("use {f}"),
                        format!("extern crate {f}"),
                        format!("{f}::"),
                    ] {
                        assert!(!text.contains(&imp), "{} imports {f}", p.display());
                    }
                }
            }
        }
    }
    assert!(files > 50, "{files} source files");
}
