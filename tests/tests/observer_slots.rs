//! The shared denial observer's ring buffers (issue 29): a supervisor
//! holds one slot and its ring; a ring of a slot above the usual
//! concurrency (16) is removed once no process holds that slot, so a burst
//! of concurrent supervisors leaves no kernel memory behind. Its own test
//! binary: no other test of this binary takes slots meanwhile.

use serde_json::Value;
use turnstile_tests::{Fixture, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {"read": ["data/**"], "execute": ["/bin/true", "/bin/sleep"]},
  "limits": {"timeout_seconds": 60}
}"#;

const SLOTS: &str = "/run/turnstile/observer";

/// Where this build's observer is pinned (another build's program, with
/// another hash, may be pinned beside it), as `doctor` says.
fn pin_dir() -> std::path::PathBuf {
    let out = std::process::Command::new(turnstile_tests::supervise_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    let via = d["denials_observed"]["landlock"]["via"]
        .as_str()
        .unwrap_or("");
    let dir = via
        .split("pinned in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("doctor names no pinned observer: {via}"));
    std::path::PathBuf::from(dir)
}

/// The slots that have a ring in this build's pinned `rings` map.
fn ring_slots() -> Vec<u32> {
    let dir = pin_dir();
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(dir.join("rings"))
        .output()
        .expect("bpftool (apt-get install bpftool)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let b: Vec<u8> = e["key"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    u8::from_str_radix(x.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
                })
                .collect();
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
        })
        .collect()
}

fn turn(fx: &Fixture) -> Value {
    let r = fx.run("o", &["--json", "--no-outputs", "--", "/bin/true"]);
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    r.json()
}

#[test]
fn issue_29_a_free_high_slot_loses_its_ring() {
    let test = "issue_29_a_free_high_slot_loses_its_ring";
    if !require_root(test) {
        return;
    }
    let fx = Fixture::new();
    fx.install("o", MANIFEST);
    fx.write("data/x", b"x");
    let v = turn(&fx);
    let o = &v["enforcement"]["denials_observed"]["landlock"];
    if o["observed"] != true {
        assert!(
            std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
            "{test}: the denial observer is unavailable: {o}"
        );
        eprintln!("turnstile-test: SKIPPED {test}: {o}");
        return;
    }
    // Every slot up to 16 held — here, or by another supervisor (a
    // daemon running on the host): the next turn takes one above. Never a
    // blocking lock: a slot's holder may live for days.
    std::fs::create_dir_all(SLOTS).unwrap();
    let mut held = Vec::new();
    for n in 0..=16 {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(format!("{SLOTS}/slot-{n}.lock"))
            .unwrap();
        if let Ok(l) = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            held.push(l);
        }
    }
    // While that turn runs, its slot (and ring) is above 16: checked
    // then, since a free high slot's ring may go as soon as any other
    // supervisor starts.
    let mut slow = fx
        .command(
            &turnstile_tests::supervise_bin(),
            &["run"],
            &[
                "--package",
                "o",
                "--json",
                "--no-outputs",
                "--",
                "/bin/sleep",
                "3",
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = ring_slots();
        if seen.iter().any(|&s| s > 16) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        seen.iter().any(|&s| s > 16),
        "no ring above slot 16: {seen:?}"
    );
    assert!(slow.wait().unwrap().success());
    drop(held);
    // Free again: a later supervisor removes those rings (on a thread of
    // its own, each removal an RCU grace period).
    // (A slot above 16 another process holds keeps its ring.)
    let held_elsewhere = |s: u32| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("{SLOTS}/slot-{s}.lock"))
            .is_ok_and(|f| {
                nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
            })
    };
    let mut left = Vec::new();
    for _ in 0..10 {
        turn(&fx);
        left = ring_slots()
            .into_iter()
            .filter(|&s| s >= 16 && !held_elsewhere(s))
            .collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(left.is_empty(), "rings of free high slots left: {left:?}");
}
