//! What containerd's CRI plugin writes on the containers it creates: the
//! names the shim reads to tell the pod sandbox from a pod's container and
//! to learn the pod's Kubernetes namespace (containerd 1.6).

/// containerd's namespace for everything its CRI plugin creates (1.6:
/// `constants.K8sContainerdNamespace`).
pub const CRI_CONTAINERD_NAMESPACE: &str = "k8s.io";
/// The pod's Kubernetes namespace, which the CRI plugin writes on every
/// container's spec (containerd 1.6 `annotations.SandboxNamespace`).
pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// The annotation the CRI plugin marks its containers with.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// Its value on the pod sandbox container.
pub const CRI_SANDBOX: &str = "sandbox";
/// The pod sandbox's id, which the CRI plugin also sets on the sandbox
/// container itself (where it equals the container's id).
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
