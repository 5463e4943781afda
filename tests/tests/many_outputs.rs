//! 10,000 declared outputs commit (issue 29): the commit keeps no
//! descriptor per output (it syncs the file system once instead), so a
//! turn that writes thousands of files commits within a small descriptor
//! limit, all or nothing.

use turnstile_tests::{Fixture, require_root, supervise_bin};

#[test]
fn issue_29_ten_thousand_outputs_commit_under_a_256_descriptor_limit() {
    if !require_root("issue_29_ten_thousand_outputs_commit_under_a_256_descriptor_limit") {
        return;
    }
    const N: usize = 10_000;
    let fx = Fixture::new();
    fx.install(
        "many",
        r#"{"capabilities": {"write": ["output/<session_id>/**"], "execute": ["/usr/bin/python3"]},
            "limits": {"files": 20000, "disk": "256Mi", "timeout_seconds": 120}}"#,
    );
    let outputs: Vec<serde_json::Value> = (0..N)
        .map(|i| {
            serde_json::json!({"path": format!("output/<session_id>/d{}/f{i}.txt", i % 100), "role": "data"})
        })
        .collect();
    let request = serde_json::json!({
        "command": ["/usr/bin/python3", "-c",
            "import os\nsid = os.environ['TURNSTILE_SESSION_ID']\nfor i in range(10000):\n    d = f'output/{sid}/d{i % 100}'\n    os.makedirs(d, exist_ok=True)\n    open(f'{d}/f{i}.txt', 'w').write(str(i))\n"],
        "declared_outputs": outputs,
    });
    let file = fx.root.parent().unwrap().join(format!(
        "many-{}.json",
        fx.root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&file, request.to_string()).unwrap();
    let out = std::process::Command::new("prlimit")
        .arg("--nofile=256")
        .arg(supervise_bin())
        .args(["run", "--root"])
        .arg(&fx.root)
        .arg("--state-dir")
        .arg(&fx.state)
        .args(["--package", "many", "--json", "--request"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["committed"].as_array().unwrap().len(), N);
    let sid = v["session_id"].as_str().unwrap();
    for i in [0, 1, 4_999, 9_999] {
        let p = fx.root.join(format!("output/{sid}/d{}/f{i}.txt", i % 100));
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            i.to_string(),
            "{}",
            p.display()
        );
    }
    fx.assert_ledgers_intact(sid);
}
