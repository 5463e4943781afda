//! The CRI tests' shared pieces (`tests/cri.rs`, `tests/k8s_example.rs`):
//! what the CRI path leaves on the host and its sweep, a CRI client over
//! containerd's unix socket, offline images imported into `k8s.io`, a CNI
//! network the pod's `eth0` gets an address from, and waiting for the CRI
//! plugin to answer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1::VersionRequest;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::busybox_rootfs;
use crate::containerd::Containerd;

/// What the CRI path creates outside containerd's directory, removed on
/// drop even when the test fails: the CNI bridge, the pod cgroup parent,
/// netns mounts under /run/netns, a sandbox runc left.
#[derive(Debug)]
pub struct HostCleanup {
    pub bridge: String,
    pub cgroup_parent: String,
    pub netns_before: Vec<PathBuf>,
    pub runc_root: PathBuf,
}

impl HostCleanup {
    /// The netns mounts under /run/netns now.
    pub fn netns() -> Vec<PathBuf> {
        std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    }

    /// Cleans, returning what there was to clean.
    pub fn sweep(&self) -> Vec<String> {
        let mut left = Vec::new();
        let listed = Command::new("runc")
            .arg("--root")
            .arg(&self.runc_root)
            .args(["list", "-q"])
            .output();
        if let Ok(o) = listed {
            for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                left.push(format!("runc container {id}"));
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&self.runc_root)
                    .args(["delete", "--force", id])
                    .status();
            }
        }
        for ns in Self::netns() {
            if !self.netns_before.contains(&ns) {
                left.push(format!("netns {}", ns.display()));
                let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
                let _ = std::fs::remove_file(&ns);
            }
        }
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            // The bridge plugin never deletes the bridge it made: ours to
            // remove, not a leak of the shim's.
            let _ = Command::new("ip")
                .args(["link", "del", &self.bridge])
                .status();
        }
        for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten() {
            let Ok(h) = h else { continue };
            let dir = h.path().join(self.cgroup_parent.trim_start_matches('/'));
            if dir.is_dir() && std::fs::remove_dir(&dir).is_err() {
                left.push(format!("cgroup {}", dir.display()));
            }
        }
        left
    }
}

impl Drop for HostCleanup {
    fn drop(&mut self) {
        let _ = self.sweep();
    }
}

/// True when `tool` (a name on PATH or a path) is not there.
pub fn tool_missing(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
}

/// A CRI runtime-service client on containerd's unix socket.
pub fn client(rt: &tokio::runtime::Runtime, socket: PathBuf) -> RuntimeServiceClient<Channel> {
    rt.block_on(async move {
        // The URI is required by tonic and ignored: the connector dials the
        // unix socket.
        let channel = tonic::transport::Endpoint::try_from("http://[::1]:1")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                }
            }))
            .await
            .expect("connect to containerd's CRI socket");
        RuntimeServiceClient::new(channel)
    })
}

/// Imports an image built offline from busybox-static into `k8s.io`.
pub fn import(c: &Containerd, dir: &Path, name: &str, reference: &str, cmd: &[&str]) {
    let rootfs = dir.join(format!("{name}-rootfs"));
    assert!(busybox_rootfs(&rootfs));
    import_rootfs(c, &rootfs, &dir.join(format!("{name}.tar")), reference, cmd);
}

/// Imports `rootfs` into `k8s.io` as the image `reference` (command
/// `cmd`), through an OCI archive written at `archive`
/// (`images/oci_archive.py`).
pub fn import_rootfs(c: &Containerd, rootfs: &Path, archive: &Path, reference: &str, cmd: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/oci_archive.py");
    let st = Command::new("python3")
        .arg(&script)
        .arg(rootfs)
        .arg(archive)
        .arg(reference)
        .args(cmd)
        .status()
        .unwrap();
    assert!(st.success());
    let out = c.ctr(&[
        "-n",
        "k8s.io",
        "images",
        "import",
        archive.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The session ids (`SES-…`) named in `t`, in order.
pub fn sessions_in(t: &str) -> Vec<String> {
    t.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '-'))
        .filter(|w| w.starts_with("SES-"))
        .map(str::to_owned)
        .collect()
}

/// Writes `DIR/10-turnstile-test.conflist`: a bridge (`host.bridge`, no
/// gateway, no masquerade) with host-local addresses in `subnet`, its
/// state under `ipam_dir`. containerd 1.6 refuses a pod whose `eth0` gets
/// no address; the CRI plugin adds loopback itself.
pub fn write_cni_conflist(dir: &Path, name: &str, bridge: &str, subnet: &str, ipam_dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("10-turnstile-test.conflist"),
        serde_json::json!({
            "cniVersion": "0.4.0",
            "name": name,
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": false,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": ipam_dir,
                }
            }]
        })
        .to_string(),
    )
    .unwrap();
}

/// Waits up to 20 s for the CRI plugin to answer Version.
pub fn wait_for_cri(
    rt: &tokio::runtime::Runtime,
    cri: &mut RuntimeServiceClient<Channel>,
    c: &Containerd,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rt.block_on(cri.version(VersionRequest::default())) {
            Ok(v) => {
                eprintln!("CRI: {:?}", v.into_inner());
                return;
            }
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("CRI did not answer: {e}\n{}", c.log()),
        }
    }
}

/// What a CRI test needs on the host: containerd, ctr, runc, python3, ip,
/// the CNI plugins, busybox-static and the built shim. Returns the shim's
/// path; `None` (skipped) when something is missing — a failure instead
/// under `TURNSTILE_REQUIRE_KERNEL=1`, so CI never hides a missing tool.
pub fn prerequisites() -> Option<PathBuf> {
    let strict = std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() == Ok("1");
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "python3",
        "ip",
        "/usr/lib/cni/loopback",
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
    ] {
        if tool_missing(tool) {
            assert!(
                !strict,
                "{tool} is required (apt-get install containerd runc containernetworking-plugins iproute2)"
            );
            eprintln!("turnstile-test: SKIPPED: {tool} missing");
            return None;
        }
    }
    let shim = crate::supervise_bin().with_file_name("containerd-shim-turnstile-v2");
    assert!(
        shim.is_file(),
        "build the shim first: cargo build -p containerd-shim-turnstile-v2"
    );
    if !Path::new("/bin/busybox").is_file() {
        assert!(!strict, "busybox-static is required");
        return None;
    }
    Some(shim)
}
