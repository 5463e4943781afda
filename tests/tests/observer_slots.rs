//! The shared denial observer's ring buffers (issue 29): a supervisor
//! holds one slot and its ring; a ring of a slot above the usual
//! concurrency (16) is removed once no process holds that slot, so a burst
//! of concurrent supervisors leaves no kernel memory behind. Its own test
//! binary: no other test of this binary takes slots meanwhile.

use serde_json::Value;
use turnstile_tests::{Fixture, require_root};

const MANIFEST: &str = r#"{
  "capabilities": {"read": ["data/**"], "execute": ["/bin/true"]},
  "limits": {"timeout_seconds": 60}
}"#;

const SLOTS: &str = "/run/turnstile/observer";

/// The slots that have a ring in the pinned observer's `rings` map.
fn ring_slots() -> Vec<u32> {
    let dir = std::fs::read_dir("/sys/fs/bpf/turnstile")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("link_exec").exists())
        .expect("no pinned observer");
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
    // Every slot up to 16 held here: the next turn takes one above.
    std::fs::create_dir_all(SLOTS).unwrap();
    let mut held = Vec::new();
    for n in 0..=16 {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(format!("{SLOTS}/slot-{n}.lock"))
            .unwrap();
        held.push(nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap());
    }
    turn(&fx);
    assert!(
        ring_slots().iter().any(|&s| s > 16),
        "no ring above slot 16: {:?}",
        ring_slots()
    );
    drop(held);
    // Free again: a later supervisor removes those rings (on a thread of
    // its own, each removal an RCU grace period).
    let mut left = Vec::new();
    for _ in 0..10 {
        turn(&fx);
        left = ring_slots().into_iter().filter(|&s| s >= 16).collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(left.is_empty(), "rings of free high slots left: {left:?}");
}
