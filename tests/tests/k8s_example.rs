//! Issue 31 item 3: the Kubernetes example runs. `examples/kubernetes/`
//! holds what an operator installs — `containerd-config.toml` (the CRI
//! runtime handler `turnstile`), `shim.json` (the shim's options: the
//! workspaces pods may name) and `runtimeclass.yaml` (the RuntimeClass and
//! a Pod). This test reads those three files and applies them through the
//! CRI path as written, on a private containerd 1.6 with its CRI plugin
//! (as `tests/cri.rs`): the containerd config with only its host paths
//! swapped for the test's, `shim.json` likewise, the Pod parsed from the
//! YAML and turned field by field into the kubelet's RunPodSandbox,
//! CreateContainer and StartContainer, with the runtime handler the
//! RuntimeClass named by `runtimeClassName` gives. The workspace is
//! `examples/workspace/`, copied. The pod's turn must commit its declared
//! output with the bytes `hello.sh` computes from the registry, both
//! ledgers verify, and nothing is left behind.
//!
//! A drift between the files fails it: a field of the Pod this test does
//! not apply (unknown fields are refused), an annotation naming a
//! workspace `shim.json` does not map for the pod's namespace, a
//! `runtimeClassName` no RuntimeClass here has, a handler with no runtime
//! in the containerd config, a host path the test expects to substitute
//! that is no longer there, a command the package does not allow.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatusRequest, CreateContainerRequest, ImageSpec,
    LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};
use serde::Deserialize;
use turnstile_tests::containerd::{Containerd, Leftovers};
use turnstile_tests::cri::{
    HostCleanup, client, import, import_rootfs, sessions_in, wait_for_cri, write_cni_conflist,
};
use turnstile_tests::{Fixture, busybox_rootfs, read_entries, require_root, supervise_bin};

/// The pause image the test's containerd config names as `sandbox_image`
/// (built offline from busybox-static, as in `tests/cri.rs`).
const PAUSE: &str = "docker.io/turnstile/pause:k8s-example";
/// CRI's ContainerState EXITED.
const EXITED: i32 = 2;

/// The host paths of the example files that the test swaps for its own
/// (and nothing else): each must occur exactly once, quoted, so a change
/// in the example that moves one fails here instead of silently running
/// something else.
const CONTAINERD_SHIM_CONFIG: &str = "/etc/turnstile/shim.json";
const CONTAINERD_CNI_CONF_DIR: &str = "/etc/cni/net.d";
const SHIM_STATE_DIR: &str = "/var/lib/turnstile";
const SHIM_SUPERVISE: &str = "/usr/local/bin/supervise";
/// The workspace root the example maps for the pod (the test checks that
/// it is the root of the workspace the pod names).
const SHIM_TEAM_ROOT: &str = "/srv/agents/team-a";

fn example(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(rel)
}

/// One document of `runtimeclass.yaml`: the kinds the example holds.
/// Every struct refuses unknown fields, so a field added to the example
/// that this test would not apply fails the parse.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind")]
enum Document {
    RuntimeClass(RuntimeClass),
    Pod(Pod),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuntimeClass {
    api_version: String,
    metadata: ObjectMeta,
    handler: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ObjectMeta {
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Pod {
    api_version: String,
    metadata: ObjectMeta,
    spec: PodSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodSpec {
    runtime_class_name: String,
    restart_policy: String,
    containers: Vec<Container>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Container {
    name: String,
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
}

/// `shim.json` as the shim reads it (its unknown fields are refused too).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShimOptions {
    state_dir: String,
    supervise: String,
    workspaces: BTreeMap<String, ShimWorkspace>,
    backend: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShimWorkspace {
    root: String,
    namespaces: Option<Vec<String>>,
}

/// One entry of `io.turnstile.outputs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclaredOutput {
    path: String,
    role: String,
}

/// Replaces the one quoted occurrence of `from` in `text` with `to`;
/// panics naming `file` when it is not there exactly once.
fn substitute(text: &str, file: &str, from: &str, to: &Path) -> String {
    let quoted = format!("\"{from}\"");
    assert_eq!(
        text.matches(&quoted).count(),
        1,
        "{file}: expected {quoted} exactly once (the host path the test substitutes); the example drifted"
    );
    text.replace(&quoted, &format!("\"{}\"", to.display()))
}

/// Copies `src` (a directory tree of plain files) into `dst`.
fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// Whether this process's effective capabilities hold CAP_SYS_RESOURCE.
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap();
    eff & (1 << 24) != 0
}

/// The report `hello.sh` (and `main.py`) write for a registry.
fn expected_report(users_csv: &str) -> String {
    let names: Vec<&str> = users_csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(1))
        .collect();
    format!("{} users: {}\n", names.len(), names.join(", "))
}

#[test]
fn issue_31_kubernetes_example_runs_through_cri_as_written() {
    if !require_root("issue_31_kubernetes_example_runs_through_cri_as_written") {
        return;
    }
    let Some(shim) = turnstile_tests::cri::prerequisites() else {
        return;
    };

    // The example's three files, parsed.
    let yaml = std::fs::read_to_string(example("kubernetes/runtimeclass.yaml")).unwrap();
    let mut classes = Vec::new();
    let mut pods = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&yaml) {
        match Document::deserialize(doc)
            .unwrap_or_else(|e| panic!("runtimeclass.yaml: a document this test cannot apply: {e}"))
        {
            Document::RuntimeClass(c) => classes.push(c),
            Document::Pod(p) => pods.push(p),
        }
    }
    let [pod] = <[Pod; 1]>::try_from(pods).expect("runtimeclass.yaml: exactly one Pod");
    assert_eq!(pod.api_version, "v1");
    let class = classes
        .iter()
        .find(|c| c.metadata.name == pod.spec.runtime_class_name)
        .unwrap_or_else(|| {
            panic!(
                "runtimeclass.yaml: no RuntimeClass `{}` (the pod's runtimeClassName)",
                pod.spec.runtime_class_name
            )
        });
    assert_eq!(class.api_version, "node.k8s.io/v1");
    // The kubelet runs a restartPolicy: Never pod's container once; that
    // is what this test does (no restart loop to emulate).
    assert_eq!(pod.spec.restart_policy, "Never");
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .expect("the example pod names its namespace");
    let annotation = |key: &str| {
        pod.metadata
            .annotations
            .get(key)
            .unwrap_or_else(|| panic!("the example pod has no {key}"))
            .clone()
    };
    let workspace = annotation("io.turnstile.workspace");
    let package = annotation("io.turnstile.package");
    let outputs: Vec<DeclaredOutput> =
        serde_json::from_str(&annotation("io.turnstile.outputs")).unwrap();
    assert!(!outputs.is_empty(), "the example declares an output");

    let shim_json = std::fs::read_to_string(example("kubernetes/shim.json")).unwrap();
    let options: ShimOptions = serde_json::from_str(&shim_json).unwrap();
    let mapped = options.workspaces.get(&workspace).unwrap_or_else(|| {
        panic!("shim.json maps no workspace `{workspace}` (the pod's io.turnstile.workspace)")
    });
    assert!(
        mapped
            .namespaces
            .as_ref()
            .is_none_or(|n| n.contains(&namespace)),
        "shim.json's workspace `{workspace}` is not for the pod's namespace `{namespace}`: {:?}",
        mapped.namespaces
    );
    assert_eq!(
        mapped.root, SHIM_TEAM_ROOT,
        "shim.json: the pod's workspace root moved; the test installs examples/workspace there"
    );
    assert_eq!(options.state_dir, SHIM_STATE_DIR);
    assert_eq!(options.supervise, SHIM_SUPERVISE);
    // No backend: the package's trust level chooses (the README says so).
    assert_eq!(options.backend, None);

    let containerd_toml =
        std::fs::read_to_string(example("kubernetes/containerd-config.toml")).unwrap();
    let runtime_header = format!(
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{}]",
        class.handler
    );
    assert!(
        containerd_toml.contains(&runtime_header),
        "containerd-config.toml has no runtime for the RuntimeClass's handler `{}`",
        class.handler
    );

    let tag = std::process::id();
    let before = Leftovers::before();
    let fx = Fixture::new();
    // The example workspace, as the operator installs it at the root
    // shim.json maps; the package through `install` so a kernel whose
    // Landlock lacks rights (the 6.1 VM) adds allow_degraded as every
    // test's package does — byte for byte on this host.
    copy_tree(&example("workspace"), &fx.root);
    let manifest_rel = format!("installed/{package}/manifest.json");
    fx.install(
        &package,
        &std::fs::read_to_string(fx.root.join(&manifest_rel)).unwrap(),
    );
    let images = tempfile::tempdir().unwrap();
    let host = HostCleanup {
        bridge: format!("tsk8s{}", tag % 100_000),
        cgroup_parent: format!("/turnstile-k8s-example-{tag}"),
        netns_before: HostCleanup::netns(),
        runc_root: fx.state.join("cri-sandbox-runc"),
    };

    // The host files the example names, in a dir of the test's (they
    // must exist before containerd reads its config).
    let conf = tempfile::tempdir().unwrap();
    let shim_path = conf.path().join("shim.json");
    let cni_dir = conf.path().join("cni");
    // shim.json as written, with only its host paths swapped: the
    // workspace root for the fixture's, the state dir for the fixture's,
    // `supervise` for the one built with the tests.
    let shim_json = substitute(&shim_json, "shim.json", SHIM_TEAM_ROOT, &fx.root);
    let shim_json = substitute(&shim_json, "shim.json", SHIM_STATE_DIR, &fx.state);
    let shim_json = substitute(&shim_json, "shim.json", SHIM_SUPERVISE, &supervise_bin());
    std::fs::write(&shim_path, &shim_json).unwrap();
    write_cni_conflist(
        &cni_dir,
        &format!("turnstile-k8s-example-{tag}"),
        &host.bridge,
        &format!("10.251.{}.0/24", tag % 250),
        &conf.path().join("ipam"),
    );

    // containerd-config.toml as written, with only its host paths swapped:
    // the shim's ConfigPath (/etc/turnstile/shim.json) for the file above,
    // the CNI conf_dir (/etc/cni/net.d) for the test's network. Then, in
    // the CRI plugin's table, the settings a private test daemon needs
    // and the example leaves to the node: no streaming server on a real
    // port, the offline pause image, and (as the example's comment says)
    // restrict_oom_score_adj where root lacks CAP_SYS_RESOURCE.
    let cri_toml = substitute(
        &containerd_toml,
        "containerd-config.toml",
        CONTAINERD_SHIM_CONFIG,
        &shim_path,
    );
    let cri_toml = substitute(
        &cri_toml,
        "containerd-config.toml",
        CONTAINERD_CNI_CONF_DIR,
        &cni_dir,
    );
    let plugin_header = "[plugins.\"io.containerd.grpc.v1.cri\"]\n";
    assert_eq!(
        cri_toml.matches(plugin_header).count(),
        1,
        "containerd-config.toml: expected one {plugin_header:?} table"
    );
    let test_settings = format!(
        "{plugin_header}  # tests/tests/k8s_example.rs: a private daemon's settings\n  \
         disable_tcp_service = true\n  stream_server_address = \"127.0.0.1\"\n  \
         stream_server_port = \"0\"\n  sandbox_image = \"{PAUSE}\"\n{}",
        if has_cap_sys_resource() {
            ""
        } else {
            "  restrict_oom_score_adj = true\n"
        }
    );
    let cri_toml = cri_toml.replace(plugin_header, &test_settings);

    let mut c = Containerd::start(shim.parent().unwrap(), &cri_toml);
    // The pod's image, offline, under the example's exact name: busybox,
    // laid out as the official image is (/bin/sh a hard link to
    // /bin/busybox).
    let image = &pod.spec.containers[0].image;
    let busybox = images.path().join("busybox-rootfs");
    assert!(busybox_rootfs(&busybox));
    std::fs::remove_file(busybox.join("bin/sh")).unwrap();
    std::fs::hard_link(busybox.join("bin/busybox"), busybox.join("bin/sh")).unwrap();
    import_rootfs(
        &c,
        &busybox,
        &images.path().join("busybox.tar"),
        image,
        &["/bin/sh"],
    );
    for other in &pod.spec.containers[1..] {
        assert_eq!(&other.image, image, "one image stand-in only");
    }
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

    // The Pod, field by field, as the kubelet sends it: the metadata, the
    // pod's annotations (all of them: the CRI plugin copies only those
    // the runtime's pod_annotations match), the uid the API server would
    // assign, the hostname (the pod's name), a log directory and the pod
    // cgroup (the kubelet's own, here the test's).
    let logs = conf.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let uid = format!("uid-{tag}");
    let sandbox_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: pod.metadata.name.clone(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            attempt: 0,
        }),
        hostname: pod.metadata.name.clone(),
        log_directory: logs.display().to_string(),
        labels: HashMap::from([
            ("io.kubernetes.pod.name".into(), pod.metadata.name.clone()),
            ("io.kubernetes.pod.namespace".into(), namespace.clone()),
            ("io.kubernetes.pod.uid".into(), uid),
        ]),
        annotations: pod.metadata.annotations.clone().into_iter().collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: host.cgroup_parent.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_id = rt
        .block_on(cri.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            // runtimeClassName -> the RuntimeClass's handler, as the
            // kubelet resolves it.
            runtime_handler: class.handler.clone(),
        }))
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.log()))
        .into_inner()
        .pod_sandbox_id;

    let mut sessions = Vec::new();
    for container in &pod.spec.containers {
        let log_path = format!("{}/0.log", container.name);
        let id = rt
            .block_on(cri.create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: container.name.clone(),
                        attempt: 0,
                    }),
                    image: Some(ImageSpec {
                        image: container.image.clone(),
                        ..Default::default()
                    }),
                    command: container.command.clone(),
                    args: container.args.clone(),
                    labels: HashMap::from([(
                        "io.kubernetes.container.name".into(),
                        container.name.clone(),
                    )]),
                    log_path: log_path.clone(),
                    ..Default::default()
                }),
                sandbox_config: Some(sandbox_config.clone()),
            }))
            .unwrap_or_else(|e| panic!("CreateContainer {}: {e}\n{}", container.name, c.log()))
            .into_inner()
            .container_id;
        rt.block_on(cri.start_container(StartContainerRequest {
            container_id: id.clone(),
        }))
        .unwrap_or_else(|e| panic!("StartContainer {}: {e}\n{}", container.name, c.log()));
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
            assert!(
                Instant::now() < deadline,
                "{} did not exit: {s:?}",
                container.name
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = std::fs::read_to_string(logs.join(&log_path)).unwrap_or_default();
        assert_eq!(
            status.exit_code,
            0,
            "{}: the example's turn must commit: {status:?}\nlog:\n{log}\ncontainerd:\n{}",
            container.name,
            c.log()
        );
        let sid = sessions_in(&log)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no session in the container log:\n{log}"));
        // The declared output, committed with what hello.sh computes from
        // the example registry.
        let want = expected_report(
            &std::fs::read_to_string(example("workspace/registries/users.csv")).unwrap(),
        );
        for out in &outputs {
            let path = fx.root.join(out.path.replace("<session_id>", &sid));
            assert_eq!(
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!(
                    "{} ({}): {e}",
                    path.display(),
                    out.role
                )),
                want,
                "{}",
                out.role
            );
        }
        // The turn's evidence: committed, on the backend the package's
        // trust level chose (shim.json names none).
        let ev = read_entries(&fx.ledger(&sid, "evidence"));
        let last = ev.last().expect("evidence");
        assert_eq!(last["status"], "committed", "{last}");
        assert_eq!(last["package_id"], package.as_str(), "{last}");
        let chosen_by = last["enforcement"]["backend_chosen_by"]
            .as_str()
            .unwrap_or_default();
        assert!(
            chosen_by.starts_with("trust_level "),
            "backend chosen by {chosen_by:?}: {last}"
        );
        fx.assert_ledgers_intact(&sid);
        sessions.push(sid);
        rt.block_on(cri.remove_container(RemoveContainerRequest { container_id: id }))
            .unwrap_or_else(|e| panic!("RemoveContainer {}: {e}", container.name));
    }

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

    // Nothing left: the CRI path's host objects, then what the ctr and
    // CRI tests check.
    let left = host.sweep();
    assert!(
        left.is_empty(),
        "left behind: {left:?}\ncontainerd log:\n{}",
        c.log()
    );
    let cgroups: Vec<String> = sessions.iter().map(|s| format!("turnstile/{s}")).collect();
    before.assert_clean(
        &mut c,
        &[&fx.root, &fx.state, images.path(), conf.path()],
        &cgroups,
    );
}
