//! `--request` names a regular file: a FIFO, a directory or a device is
//! refused at once (exit 2, the field named), never read (a FIFO would block
//! forever), and nothing is created.

use std::time::{Duration, Instant};

use turnstile_tests::Fixture;

#[test]
fn fr_rt_013_request_that_is_not_a_regular_file_is_refused_without_blocking() {
    let fx = Fixture::new();
    fx.install("p", r#"{"capabilities": {"execute": ["/bin/true"]}}"#);
    let fifo = fx.root.join("..").join(format!(
        "req-{}.fifo",
        fx.root.file_name().unwrap().to_string_lossy()
    ));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let before = fx.snapshot();
    for target in [fifo.to_str().unwrap(), "/dev/zero", "/tmp"] {
        let t = Instant::now();
        let r = fx.run("p", &["--request", target, "--json"]);
        assert!(t.elapsed() < Duration::from_secs(5), "{target} blocked");
        assert_eq!(r.status, 2, "{target}: {}{}", r.stdout, r.stderr);
        let v = r.json();
        assert_eq!(v["error"]["field"], "--request", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not a regular file"),
            "{v}"
        );
    }
    assert_eq!(before, fx.snapshot(), "a refused request changed the disk");
    let _ = std::fs::remove_file(&fifo);
}
