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
fn issue_28_receive_happy_path_pure_turn_emits_canonical_envelopes_in_order() {
    if !require_root("issue_28_receive_happy_path_pure_turn_emits_canonical_envelopes_in_order") {
        return;
    }
    let fx = Fixture::new();
    // The manifest asks for egress; a receive turn is isolated regardless.
    agent(
        &fx,
        "a",
        COUNTER,
        r#","network":"restricted","egress":["127.0.0.1:1-65535"]"#,
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
    assert_eq!(first["idempotency_key"], "IDEM-1#0");
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
