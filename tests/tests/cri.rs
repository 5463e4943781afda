//! The CRI path (issue 12), as the kubelet drives it: a private containerd
//! 1.6 with its CRI plugin on (no TCP streaming service), a runtime handler
//! `turnstile` of type `io.containerd.turnstile.v2` that passes the
//! `io.turnstile.*` pod and container annotations through and hands the
//! shim its options file, CNI from Debian's containernetworking-plugins
//! (the CRI plugin's own loopback network plus a bridge + host-local
//! network for the pod's `eth0`, in a conf dir this test writes), and a
//! pause image built offline and imported into the `k8s.io` namespace as
//! `sandbox_image`. A CRI client (the `k8s-cri` crate over the unix socket)
//! runs RunPodSandbox with handler `turnstile`, CreateContainer,
//! StartContainer, waits for the exit, reads ContainerStatus (exit code per
//! `supervise run`'s contract: 0 committed, 12 blocked; a capability
//! violation fails StartContainer and leaves no shim), RemoveContainer,
//! StopPodSandbox, RemovePodSandbox. The declared output is committed with
//! the right bytes, both ledgers verify, and nothing is left behind.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatusRequest, CreateContainerRequest, ImageSpec,
    LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};
use turnstile_tests::containerd::{Containerd, Leftovers};
use turnstile_tests::cri::{
    HostCleanup, client, import, sessions_in, wait_for_cri, write_cni_conflist,
};
use turnstile_tests::{BUSYBOX_MANIFEST, Fixture, require_root, supervise_bin};

const IMAGE: &str = "docker.io/turnstile/busybox:cri-test";
const PAUSE: &str = "docker.io/turnstile/pause:cri-test";
/// CRI's ContainerState EXITED.
const EXITED: i32 = 2;
/// The test pod's Kubernetes namespace (the shim maps workspace `ws` to it).
const POD_NAMESPACE: &str = "agents";

#[test]
fn issue_12_cri_pod_with_runtime_handler_turnstile_runs_turns() {
    if !require_root("issue_12_cri_pod_with_runtime_handler_turnstile_runs_turns") {
        return;
    }
    let Some(shim) = turnstile_tests::cri::prerequisites() else {
        return;
    };

    let tag = std::process::id();
    let before = Leftovers::before();
    let fx = Fixture::new();
    fx.install("bb", BUSYBOX_MANIFEST);
    fx.write("data/in.txt", b"hello from a pod\n");
    fx.write("data/secret/key", b"k\n");
    let images = tempfile::tempdir().unwrap();
    let host = HostCleanup {
        bridge: format!("tscri{}", tag % 100_000),
        cgroup_parent: format!("/turnstile-cri-test-{tag}"),
        netns_before: HostCleanup::netns(),
        runc_root: fx.state.join("cri-sandbox-runc"),
    };

    // containerd's config: the CRI plugin with the `turnstile` handler.
    let cri = format!(
        r#"[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "{PAUSE}"
  # Root here lacks CAP_SYS_RESOURCE: the pause container's default
  # oom_score_adj (-998) cannot be set; clamp it to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "turnstile"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.turnstile]
      runtime_type = "io.containerd.turnstile.v2"
      pod_annotations = ["io.turnstile.*"]
      container_annotations = ["io.turnstile.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.turnstile.options]
        ConfigPath = "{{d}}/shim.json"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{{d}}/cni"
"#
    );
    // The conf dir and shim options must exist before containerd reads
    // them: containerd's dir is made by `start`, so they go in a dir of
    // ours and the config names that.
    let conf = tempfile::tempdir().unwrap();
    let cri = cri.replace("{d}", &conf.path().display().to_string());
    write_cni_conflist(
        &conf.path().join("cni"),
        &format!("turnstile-cri-test-{tag}"),
        &host.bridge,
        &format!("10.250.{}.0/24", tag % 250),
        &conf.path().join("ipam"),
    );
    // Workspace names (issue 25): `ws` for the pod's Kubernetes namespace
    // `agents` — not containerd's (`k8s.io` for every pod) — and another
    // tenant's `other`, for `tenant-a` only. runc named, as before issue
    // 25 made the backend optional.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(
        conf.path().join("shim.json"),
        serde_json::json!({
            "state_dir": fx.state,
            "supervise": supervise_bin(),
            "backend": "runc",
            "workspaces": {
                "ws": {"root": fx.root, "namespaces": [POD_NAMESPACE]},
                "other": {"root": other.path(), "namespaces": ["tenant-a"]},
            },
        })
        .to_string(),
    )
    .unwrap();

    let mut sessions = Vec::new();
    let mut c = Containerd::start(shim.parent().unwrap(), &cri);
    import(&c, images.path(), "busybox", IMAGE, &["/bin/sh"]);
    // The pause image: busybox-static's sleep, until the sandbox is killed.
    import(
        &c,
        images.path(),
        "pause",
        PAUSE,
        &["/bin/sleep", "2147483647"],
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cri = client(&rt, c.socket());
    wait_for_cri(&rt, &mut cri, &c);

    let logs = conf.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // As a kubelet sends it: the whole contract on the pod (Kubernetes has
    // no per-container annotations). The CRI plugin copies the pod's
    // io.turnstile.* into each container's spec, then the container's own
    // (a CRI client other than the kubelet can set those): the second
    // container overrides the outputs with `[]`.
    let pod = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "turn-pod".into(),
            uid: format!("uid-{tag}"),
            namespace: POD_NAMESPACE.into(),
            attempt: 0,
        }),
        hostname: "turn-pod".into(),
        log_directory: logs.display().to_string(),
        annotations: HashMap::from([
            ("io.turnstile.workspace".to_owned(), "ws".to_owned()),
            ("io.turnstile.package".to_owned(), "bb".to_owned()),
            (
                "io.turnstile.outputs".to_owned(),
                r#"[{"path":"output/<session_id>/r.txt","role":"result"}]"#.to_owned(),
            ),
        ]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: host.cgroup_parent.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_id = rt
        .block_on(cri.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: "turnstile".into(),
        }))
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.log()))
        .into_inner()
        .pod_sandbox_id;

    // One container per turn: (name, container-level outputs, script,
    // expected exit code).
    let cases = [
        (
            "commit",
            None,
            r#"cat data/in.txt > "output/$TURNSTILE_SESSION_ID/r.txt"; echo ok"#,
            0,
        ),
        (
            "block",
            Some("[]"),
            r#"echo x > "output/$TURNSTILE_SESSION_ID/r.txt""#,
            12,
        ),
    ];
    let mut committed = None;
    for (name, outputs, script, want) in cases {
        let log_path = format!("{name}.log");
        let id = rt
            .block_on(
                cri.create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    config: Some(ContainerConfig {
                        metadata: Some(ContainerMetadata {
                            name: name.into(),
                            attempt: 0,
                        }),
                        image: Some(ImageSpec {
                            image: IMAGE.into(),
                            ..Default::default()
                        }),
                        command: vec!["sh".into(), "-c".into(), script.into()],
                        annotations: outputs
                            .map(|o| ("io.turnstile.outputs".to_owned(), o.to_owned()))
                            .into_iter()
                            .collect(),
                        log_path: log_path.clone(),
                        ..Default::default()
                    }),
                    sandbox_config: Some(pod.clone()),
                }),
            )
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", c.log()))
            .into_inner()
            .container_id;
        rt.block_on(cri.start_container(StartContainerRequest {
            container_id: id.clone(),
        }))
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", c.log()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            let s = rt
                .block_on(cri.container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                }))
                .unwrap()
                .into_inner()
                .status
                .unwrap();
            if s.state == EXITED {
                break s;
            }
            assert!(Instant::now() < deadline, "{name} did not exit: {s:?}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = std::fs::read_to_string(logs.join(&log_path)).unwrap_or_default();
        assert_eq!(
            status.exit_code,
            want,
            "{name}: {status:?}\nlog:\n{log}\ncontainerd:\n{}",
            c.log()
        );
        let sid = sessions_in(&log)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("{name}: no session in the container log:\n{log}"));
        if name == "commit" {
            assert!(log.contains(" stdout ") && log.contains("ok"), "{log}");
            committed = Some(sid.clone());
        } else {
            assert!(!fx.root.join(format!("output/{sid}/r.txt")).exists());
        }
        fx.assert_ledgers_intact(&sid);
        sessions.push(sid);
        rt.block_on(cri.remove_container(RemoveContainerRequest { container_id: id }))
            .unwrap_or_else(|e| panic!("RemoveContainer {name}: {e}"));
    }
    // A capability violation fails StartContainer (the task's Create),
    // naming it; that container's shim is gone, the pod's stays.
    let id = rt
        .block_on(cri.create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "violation".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["/bin/ls".into(), "/".into()],
                log_path: "violation.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(pod.clone()),
        }))
        .unwrap_or_else(|e| panic!("CreateContainer violation: {e}"))
        .into_inner()
        .container_id;
    let refused = rt
        .block_on(cri.start_container(StartContainerRequest {
            container_id: id.clone(),
        }))
        .expect_err("a violation must fail StartContainer");
    assert!(refused.message().contains("E2042"), "{refused}");
    sessions.extend(sessions_in(refused.message()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.processes().iter().any(|(_, cmd)| cmd.contains(&id)) {
        assert!(
            Instant::now() < deadline,
            "the refused container's shim is left: {:?}",
            c.processes()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        c.processes()
            .iter()
            .any(|(_, cmd)| cmd.contains(&sandbox_id)),
        "the pod's shim must still run: {:?}",
        c.processes()
    );
    rt.block_on(cri.remove_container(RemoveContainerRequest { container_id: id }))
        .unwrap_or_else(|e| panic!("RemoveContainer violation: {e}"));

    // Issue 25: another tenant's workspace name, asked for by this pod (a
    // container-level annotation, as a CRI client may set): its pod
    // namespace is `agents`, the workspace is for `tenant-a` only — the
    // shim checks the pod's namespace, which the CRI plugin wrote on the
    // spec, and StartContainer fails naming it; nothing is written there.
    let id = rt
        .block_on(cri.create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "other-tenant".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["sh".into(), "-c".into(), "echo RAN".into()],
                annotations: HashMap::from([(
                    "io.turnstile.workspace".to_owned(),
                    "other".to_owned(),
                )]),
                log_path: "other-tenant.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(pod.clone()),
        }))
        .unwrap_or_else(|e| panic!("CreateContainer other-tenant: {e}"))
        .into_inner()
        .container_id;
    let refused = rt
        .block_on(cri.start_container(StartContainerRequest {
            container_id: id.clone(),
        }))
        .expect_err("another namespace's workspace must fail StartContainer");
    assert!(
        refused.message().contains("TS1045")
            && refused
                .message()
                .contains(&format!("namespace `{POD_NAMESPACE}`")),
        "{refused}"
    );
    assert!(
        std::fs::read_dir(other.path()).unwrap().next().is_none(),
        "nothing in the other tenant's workspace"
    );
    rt.block_on(cri.remove_container(RemoveContainerRequest { container_id: id }))
        .unwrap_or_else(|e| panic!("RemoveContainer other-tenant: {e}"));

    let sid = committed.unwrap();
    assert_eq!(
        std::fs::read(fx.root.join(format!("output/{sid}/r.txt"))).unwrap(),
        b"hello from a pod\n"
    );

    rt.block_on(cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: sandbox_id.clone(),
    }))
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", c.log()));
    rt.block_on(cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: sandbox_id,
    }))
    .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}\n{}", c.log()));
    drop(cri);
    drop(rt);

    // Nothing left: the CRI path's own host objects first (a sandbox runc
    // container, a netns mount, a pod cgroup with children), then what the
    // ctr test checks too.
    let left = host.sweep();
    assert!(
        left.is_empty(),
        "left behind: {left:?}\ncontainerd log:\n{}",
        c.log()
    );
    let cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
    before.assert_clean(
        &mut c,
        &[
            &fx.root,
            &fx.state,
            images.path(),
            conf.path(),
            other.path(),
        ],
        &cgroups,
    );
}
