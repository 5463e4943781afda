//! `supervise bundle` (issue 10 items 2-3): the OCI bundle a turn would run
//! with a runtime backend, validated against the official runtime-spec
//! 1.3.0 schemas (vendored unchanged in `oci/runtime-spec-1.3.0/`, with
//! their license), including the spec's own good and bad samples (so the
//! validator is not vacuous).

use std::path::{Path, PathBuf};

use serde_json::Value;
use turnstile_tests::Fixture;

const MANIFEST: &str = r#"{
  "capabilities": {
    "read": ["data/**"],
    "write": ["output/<session_id>/**"],
    "execute": ["/usr/bin/python3"],
    "forbidden": ["data/secret/**"]
  },
  "limits": {"memory": "256Mi", "cpu": "1500m", "pids": 64}
}"#;

fn schema_dir() -> PathBuf {
    let env = std::env::var_os("TURNSTILE_OCI_SCHEMA_DIR").map(PathBuf::from);
    env.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../oci/runtime-spec-1.3.0/schema")
    })
}

/// `valid`/`invalid` per document, with the official config schema.
fn validate(docs: &[&Path]) -> Vec<String> {
    let dir = schema_dir();
    assert!(
        dir.join("config-schema.json").is_file(),
        "runtime-spec schemas not found at {} (set TURNSTILE_OCI_SCHEMA_DIR)",
        dir.display()
    );
    turnstile_tests::validate_json(&dir, "config-schema.json", docs)
}

#[test]
fn issue_10_the_validator_accepts_the_spec_good_samples_and_refuses_the_bad() {
    let tests = schema_dir().join("test/config");
    for (kind, want) in [("good", "valid "), ("bad", "invalid ")] {
        let docs: Vec<PathBuf> = std::fs::read_dir(tests.join(kind))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!docs.is_empty());
        let refs: Vec<&Path> = docs.iter().map(PathBuf::as_path).collect();
        for line in validate(&refs) {
            assert!(line.starts_with(want), "{kind} sample: {line}");
        }
    }
}

fn bundle(fx: &Fixture, backend: &str, out: &Path) -> (i32, String) {
    let r = fx.supervise(
        &["bundle"],
        &[
            "--package",
            "b",
            "--backend",
            backend,
            "--out",
            &out.display().to_string(),
            "--output",
            "output/<session_id>/r.txt:result",
            "--",
            "/usr/bin/python3",
            "-c",
            "print(1)",
        ],
    );
    (r.status, r.stderr)
}

#[test]
fn issue_10_bundles_for_runc_and_kata_validate_and_carry_the_turn() {
    let fx = Fixture::new();
    fx.install("b", MANIFEST);
    fx.write("data/users.csv", b"a\n");
    fx.write("data/secret/key", b"k");
    let base = fx.state.parent().unwrap().to_owned();
    let before = fx.snapshot();
    let runc = base.join("runc-bundle");
    let (s, err) = bundle(&fx, "runc", &runc);
    assert_eq!(s, 0, "{err}");
    // Nothing else: no session, no ledger, no state.
    assert_eq!(before, fx.snapshot(), "bundle changed the workspace");
    assert!(!fx.state.exists(), "bundle created the state dir");
    let config_path = runc.join("config.json");
    assert_eq!(
        validate(&[&config_path]),
        vec![format!("valid {}", config_path.display())]
    );
    let c: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let p = &c["process"];
    assert_eq!(p["user"]["uid"], 65534);
    assert_eq!(p["noNewPrivileges"], true);
    assert_eq!(p["capabilities"]["bounding"], serde_json::json!([]));
    // turnstile's init applies Landlock, then execs the command.
    let args: Vec<&str> = p["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let build = format!(
        "--init-build={}",
        turnstile_supervisor::sandbox::initbin::BUILD_ID
    );
    assert_eq!(
        &args[..5],
        [
            "/.turnstile/init",
            "__landlock-exec",
            "/.turnstile/landlock.json",
            build.as_str(),
            "--"
        ]
    );
    assert_eq!(args[5], "/usr/bin/python3");
    assert!(runc.join("generated/landlock.json").is_file());
    assert_eq!(c["root"]["readonly"], true);
    assert_eq!(c["hostname"], "turnstile");
    let ann = &c["annotations"];
    assert_eq!(ann["org.turnstile.package"], "b");
    assert!(
        ann["org.turnstile.outputs"]
            .as_str()
            .unwrap()
            .contains("r.txt")
    );
    let masked: Vec<&str> = c["linux"]["maskedPaths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // Forbidden paths are masked by explicit mode-0000 mounts, never by
    // maskedPaths (which runc and crun fill with a listable tmpfs).
    let secret = format!("{}/data/secret", fx.root.display());
    assert!(!masked.contains(&secret.as_str()), "{masked:?}");
    let mask = c["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == secret.as_str())
        .expect("a mount over the forbidden directory");
    assert_eq!(mask["type"], "bind");
    assert!(
        mask["source"]
            .as_str()
            .unwrap()
            .ends_with("/generated/masked.d"),
        "{mask}"
    );
    assert!(masked.contains(&"/proc/kcore"));
    let r = &c["linux"]["resources"];
    assert_eq!(r["memory"]["limit"], 256 << 20);
    assert_eq!(
        (r["cpu"]["quota"].as_u64(), r["cpu"]["period"].as_u64()),
        (Some(150_000), Some(100_000))
    );
    let ns: Vec<&str> = c["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    for want in ["pid", "network", "ipc", "uts", "mount", "cgroup"] {
        assert!(ns.contains(&want), "{ns:?}");
    }
    let seccomp = &c["linux"]["seccomp"];
    assert_eq!(seccomp["defaultAction"], "SCMP_ACT_ERRNO");
    // The writable scopes are binds of the overlays the backend mounts.
    let scope = c["mounts"].as_array().unwrap().iter().find(|m| {
        m["destination"]
            .as_str()
            .unwrap()
            .ends_with(&"output/".to_string())
            || m["source"].as_str().unwrap_or("").contains("/scopes/")
    });
    assert!(scope.is_some(), "no scope mount");
    assert!(c.get("vm").is_none());

    let kata = base.join("kata-bundle");
    let (s, err) = bundle(&fx, "kata", &kata);
    assert_eq!(s, 0, "{err}");
    let path = kata.join("config.json");
    assert_eq!(
        validate(&[&path]),
        vec![format!("valid {}", path.display())]
    );
    let k: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        k["vm"]["hwConfig"]["vcpus"], 2,
        "1500m rounds up to 2 vCPUs"
    );
    assert_eq!(
        k["vm"]["hwConfig"]["memory"],
        256u64 << 20,
        "memory in bytes"
    );
    assert!(k["vm"]["kernel"]["path"].is_string());
}

#[test]
fn issue_10_bundle_refuses_bad_input_and_creates_nothing() {
    let fx = Fixture::new();
    fx.install("b", MANIFEST);
    let base = fx.state.parent().unwrap().to_owned();
    let (s, err) = bundle(&fx, "native", &base.join("x"));
    assert_eq!(s, 2, "{err}");
    assert!(!base.join("x").exists());
    std::fs::create_dir(base.join("exists")).unwrap();
    let (s, err) = bundle(&fx, "runc", &base.join("exists"));
    assert_eq!(s, 2, "{err}");
    assert!(err.contains("--out"), "{err}");
}

/// The spec ships no bad sample for `vm` or `linux.seccomp`: these are ours.
/// Each is a bundle `supervise bundle` emitted, broken in one field the
/// schema constrains; the validator must refuse every one (and accept the
/// unbroken original), so the objects we emit are really checked.
#[test]
fn issue_10_the_schema_refuses_our_bundles_broken_in_the_objects_we_emit() {
    let fx = Fixture::new();
    fx.install("b", MANIFEST);
    fx.write("data/users.csv", b"a\n");
    let base = fx.state.parent().unwrap().to_owned();
    let mut docs: Vec<(String, PathBuf)> = Vec::new();
    type Break = fn(&mut Value);
    let breaks: [(&str, &str, Break); 7] = [
        ("kata", "unbroken", |_| {}),
        ("kata", "vm without kernel", |c| {
            c["vm"].as_object_mut().unwrap().remove("kernel");
        }),
        ("kata", "memory as a quantity string", |c| {
            c["vm"]["hwConfig"]["memory"] = "256Mi".into();
        }),
        ("kata", "negative vcpus", |c| {
            c["vm"]["hwConfig"]["vcpus"] = (-1).into()
        }),
        ("runc", "unbroken", |_| {}),
        ("runc", "unknown seccomp action", |c| {
            c["linux"]["seccomp"]["defaultAction"] = "SCMP_ACT_MAYBE".into();
        }),
        ("runc", "unknown namespace type", |c| {
            c["linux"]["namespaces"][0]["type"] = "bogus".into();
        }),
    ];
    for backend in ["kata", "runc"] {
        let dir = base.join(format!("{backend}-bundle"));
        let (s, err) = bundle(&fx, backend, &dir);
        assert_eq!(s, 0, "{err}");
        let original: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        for (i, (_, what, f)) in breaks.iter().enumerate().filter(|b| b.1.0 == backend) {
            let mut c = original.clone();
            f(&mut c);
            let path = base.join(format!("{backend}-{i}.json"));
            std::fs::write(&path, c.to_string()).unwrap();
            docs.push((format!("{backend}: {what}"), path));
        }
    }
    let paths: Vec<&Path> = docs.iter().map(|d| d.1.as_path()).collect();
    let verdicts = validate(&paths);
    assert_eq!(verdicts.len(), docs.len(), "{verdicts:?}");
    for ((what, path), verdict) in docs.iter().zip(&verdicts) {
        let want = if what.ends_with("unbroken") {
            format!("valid {}", path.display())
        } else {
            format!("invalid {}", path.display())
        };
        assert!(verdict.starts_with(&want), "{what}: {verdict}");
    }
}
