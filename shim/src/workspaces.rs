//! Which host directory a container may use as its workspace (issue 25):
//! the shim's options map workspace NAMES to roots, each for some
//! namespaces; `io.turnstile.workspace` carries a name, never a path, so a
//! pod cannot name `/etc` or another tenant's workspace.
//!
//! ```json
//! {"workspaces": {"team-a": {"root": "/srv/agents/team-a", "namespaces": ["team-a"]},
//!                 "shared": {"root": "/srv/agents/shared"}}}
//! ```
//!
//! `namespaces` absent = any namespace. The namespace is containerd's,
//! or on the CRI path the pod's Kubernetes namespace (see
//! [`namespace_of`]). Parsing is pure; [`Workspaces::resolve`] reads one
//! `lstat` of the root, at Create, and creates nothing.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::cri::{CRI_CONTAINER_TYPE, CRI_CONTAINERD_NAMESPACE, CRI_SANDBOX_NAMESPACE};
use crate::error::ShimError;

/// The kubelet's name for the same thing (a container label there); read
/// only to refuse a spec where it disagrees with the CRI plugin's.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";

/// A workspace name: what `io.turnstile.workspace` carries and what the
/// options' `workspaces` keys are. Never a path: no `/`, no `..`, not
/// empty; ASCII letters, digits, `.`, `_`, `-`, at most 128 of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkspaceName(String);

impl std::fmt::Display for WorkspaceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for WorkspaceName {
    /// Why the value is not a name.
    type Error = String;

    fn try_from(v: &str) -> Result<Self, String> {
        if v.trim().is_empty() {
            return Err("is empty".into());
        }
        if v.contains('/') {
            return Err("is a path (contains `/`)".into());
        }
        if v.contains("..") {
            return Err("contains `..`".into());
        }
        if v == "." {
            return Err("is `.`".into());
        }
        if v.len() > 128 {
            return Err("is longer than 128 bytes".into());
        }
        if let Some(c) = v
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "contains {c:?} (a name is ASCII letters, digits, `.`, `_`, `-`)"
            ));
        }
        Ok(Self(v.to_owned()))
    }
}

/// One entry of the options' `workspaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// An absolute host directory (checked again, with `lstat`, at Create).
    pub root: PathBuf,
    /// The namespaces allowed to use it; `None` = any.
    pub namespaces: Option<Vec<String>>,
}

/// The options' `workspaces`: name -> entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workspaces(BTreeMap<WorkspaceName, Workspace>);

/// A malformed `workspaces` field: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

fn field_error(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Workspaces {
    /// The `workspaces` value of the options document; the field at fault
    /// is named (`workspaces.<name>.root`, …).
    pub fn from_value(v: &Value) -> Result<Self, FieldError> {
        let Value::Object(entries) = v else {
            return Err(field_error(
                "workspaces",
                "must be an object mapping workspace names to {\"root\", \"namespaces\"}",
            ));
        };
        let mut map = BTreeMap::new();
        for (key, entry) in entries {
            let at = format!("workspaces.{key}");
            let name = WorkspaceName::try_from(key.as_str())
                .map_err(|r| field_error(&at, format!("the name {r}")))?;
            let Value::Object(fields) = entry else {
                return Err(field_error(
                    &at,
                    "must be an object {\"root\", \"namespaces\"}",
                ));
            };
            if let Some(unknown) = fields
                .keys()
                .find(|k| !matches!(k.as_str(), "root" | "namespaces"))
            {
                return Err(field_error(
                    format!("{at}.{unknown}"),
                    "unknown field (expected `root`, `namespaces`)",
                ));
            }
            let root = match fields.get("root") {
                None => return Err(field_error(format!("{at}.root"), "is required")),
                Some(Value::String(s)) => PathBuf::from(s),
                Some(_) => return Err(field_error(format!("{at}.root"), "must be a string")),
            };
            if !root.is_absolute()
                || root
                    .components()
                    .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            {
                return Err(field_error(
                    format!("{at}.root"),
                    format!(
                        "`{}` must be an absolute path without `.` or `..`",
                        root.display()
                    ),
                ));
            }
            let namespaces = match fields.get("namespaces") {
                None => None,
                Some(Value::Array(items)) => {
                    let mut list = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        match item {
                            Value::String(s) if !s.trim().is_empty() => list.push(s.clone()),
                            _ => {
                                return Err(field_error(
                                    format!("{at}.namespaces[{i}]"),
                                    "must be a non-empty string",
                                ));
                            }
                        }
                    }
                    if list.is_empty() {
                        return Err(field_error(
                            format!("{at}.namespaces"),
                            "is empty: list the namespaces allowed, or leave it out for any",
                        ));
                    }
                    Some(list)
                }
                Some(_) => {
                    return Err(field_error(
                        format!("{at}.namespaces"),
                        "must be a list of strings",
                    ));
                }
            };
            map.insert(name, Workspace { root, namespaces });
        }
        // One root inside another: the outer workspace's turns would see
        // the inner one whole — its packages, ledgers and every session —
        // whichever namespaces each admits (red-team, stop 55).
        for (inner, w) in &map {
            if let Some((outer, o)) = map
                .iter()
                .find(|(_, o)| o.root != w.root && w.root.starts_with(&o.root))
            {
                return Err(field_error(
                    format!("workspaces.{inner}.root"),
                    format!(
                        "`{}` lies inside workspace `{outer}`'s root `{}`: its turns would see this one whole; give each workspace its own directory",
                        w.root.display(),
                        o.root.display()
                    ),
                ));
            }
        }
        Ok(Self(map))
    }

    #[cfg(test)]
    pub fn get(&self, name: &WorkspaceName) -> Option<&Workspace> {
        self.0.get(name)
    }

    /// The host root of workspace `name` for a container of `namespace`:
    /// refused when the name is not configured (TS1044), the namespace is
    /// not in its list (TS1045), or the root is a symlink or not an
    /// existing directory (TS1046). Reads one `lstat`; creates nothing.
    pub fn resolve(&self, name: &WorkspaceName, namespace: &str) -> Result<PathBuf, ShimError> {
        let Some(w) = self.0.get(name) else {
            return Err(ShimError::WorkspaceUnknown {
                name: name.0.clone(),
            });
        };
        if let Some(allowed) = &w.namespaces {
            if !allowed.iter().any(|n| n == namespace) {
                return Err(ShimError::WorkspaceNamespace {
                    name: name.0.clone(),
                    namespace: namespace.to_owned(),
                });
            }
        }
        check_root(&w.root).map_err(|reason| ShimError::WorkspaceRoot {
            name: name.0.clone(),
            root: w.root.clone(),
            reason,
        })?;
        Ok(w.root.clone())
    }
}

/// A workspace root must be an absolute directory that exists and is not
/// itself a symlink (`lstat`: a symlink could be re-pointed after the
/// options were written).
fn check_root(root: &Path) -> Result<(), String> {
    if !root.is_absolute() {
        return Err("is not an absolute path".into());
    }
    match root.symlink_metadata() {
        Err(e) => Err(format!("cannot be used: {e}")),
        Ok(m) if m.file_type().is_symlink() => Err("is a symlink".into()),
        Ok(m) if !m.is_dir() => Err("is not a directory".into()),
        Ok(_) => Ok(()),
    }
}

/// The namespace a container's workspace is checked against: on the CRI
/// path (containerd namespace `k8s.io` and a spec the CRI plugin marked
/// as a pod's container) the pod's Kubernetes namespace from
/// [`CRI_SANDBOX_NAMESPACE`]; otherwise the containerd namespace. The CRI
/// annotations are believed only in `k8s.io` (whoever can create
/// containers there can act as the CRI plugin anyway), so `ctr run -n
/// default --annotation io.kubernetes.cri.sandbox-namespace=team-a` is
/// still namespace `default`. A CRI container without the pod namespace,
/// or with a kubelet label [`POD_NAMESPACE`] that disagrees, is refused
/// (TS1049).
pub fn namespace_of(
    containerd_namespace: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<String, ShimError> {
    let cri_container = annotations
        .get(CRI_CONTAINER_TYPE)
        .is_some_and(|t| t == "container");
    if containerd_namespace != CRI_CONTAINERD_NAMESPACE || !cri_container {
        return Ok(containerd_namespace.to_owned());
    }
    let pod = match annotations.get(CRI_SANDBOX_NAMESPACE) {
        Some(ns) if !ns.trim().is_empty() => ns.clone(),
        _ => {
            return Err(ShimError::Namespace(format!(
                "a CRI container without `{CRI_SANDBOX_NAMESPACE}`: the pod's namespace is unknown"
            )));
        }
    };
    if let Some(other) = annotations.get(POD_NAMESPACE) {
        if *other != pod {
            return Err(ShimError::Namespace(format!(
                "`{POD_NAMESPACE}: {other}` disagrees with `{CRI_SANDBOX_NAMESPACE}: {pod}`"
            )));
        }
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Workspaces, FieldError> {
        Workspaces::from_value(&v)
    }

    fn name(s: &str) -> WorkspaceName {
        WorkspaceName::try_from(s).unwrap()
    }

    #[test]
    fn issue_25_a_workspace_value_must_be_a_name_never_a_path() {
        for (bad, why) in [
            ("/etc", "path"),
            ("team-a/../team-b", "path"),
            ("..", "`..`"),
            ("a..b", "`..`"),
            ("", "empty"),
            ("  ", "empty"),
            (".", "`.`"),
            ("a b", "contains"),
            ("ws\0", "contains"),
        ] {
            let e = WorkspaceName::try_from(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(WorkspaceName::try_from(&*"a".repeat(129)).is_err());
        for good in ["team-a", "ws_1", "a.b", "A9"] {
            assert_eq!(name(good).to_string(), good);
        }
    }

    #[test]
    fn issue_25_malformed_workspaces_name_the_field() {
        for (v, field) in [
            (serde_json::json!(["ws"]), "workspaces"),
            (serde_json::json!("ws"), "workspaces"),
            (serde_json::json!({"ws": "/srv"}), "workspaces.ws"),
            (serde_json::json!({"ws": {}}), "workspaces.ws.root"),
            (serde_json::json!({"ws": {"root": 7}}), "workspaces.ws.root"),
            (
                serde_json::json!({"ws": {"root": "rel"}}),
                "workspaces.ws.root",
            ),
            // Nested roots (red-team, stop 55): the inner one is named.
            (
                serde_json::json!({"parent": {"root": "/x", "namespaces": ["team-b"]},
                                   "wa": {"root": "/x/a", "namespaces": ["team-a"]}}),
                "workspaces.wa.root",
            ),
            (
                serde_json::json!({"ws": {"root": "/srv/../etc"}}),
                "workspaces.ws.root",
            ),
            (
                serde_json::json!({"ws": {"root": "/srv", "namespaces": "a"}}),
                "workspaces.ws.namespaces",
            ),
            (
                serde_json::json!({"ws": {"root": "/srv", "namespaces": ["a", 1]}}),
                "workspaces.ws.namespaces[1]",
            ),
            (
                serde_json::json!({"ws": {"root": "/srv", "namespaces": []}}),
                "workspaces.ws.namespaces",
            ),
            (
                serde_json::json!({"ws": {"root": "/srv", "path": "/x"}}),
                "workspaces.ws.path",
            ),
            (
                serde_json::json!({"../x": {"root": "/srv"}}),
                "workspaces.../x",
            ),
        ] {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.field, field, "{v}: {e:?}");
        }
        let w = parse(serde_json::json!({
            "a": {"root": "/srv/a", "namespaces": ["team-a"]},
            "b": {"root": "/srv/b"}
        }))
        .unwrap();
        assert_eq!(
            w.get(&name("a")).unwrap().namespaces.as_deref(),
            Some(&["team-a".to_owned()][..])
        );
        assert_eq!(w.get(&name("b")).unwrap().namespaces, None);
    }

    #[test]
    fn issue_25_resolve_refuses_unknown_names_namespaces_and_bad_roots() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ws");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, d.path().join("link")).unwrap();
        std::fs::write(d.path().join("file"), b"").unwrap();
        let root = |p: &str| d.path().join(p).display().to_string();
        let w = parse(serde_json::json!({
            "ok": {"root": root("ws"), "namespaces": ["team-a"]},
            "any": {"root": root("ws")},
            "link": {"root": root("link")},
            "file": {"root": root("file")},
            "gone": {"root": root("gone")},
        }))
        .unwrap();
        assert_eq!(w.resolve(&name("ok"), "team-a").unwrap(), dir);
        assert_eq!(w.resolve(&name("any"), "whoever").unwrap(), dir);
        for (n, ns, code, text) in [
            ("nope", "team-a", "TS1044", "nope"),
            ("ok", "team-b", "TS1045", "team-b"),
            ("link", "x", "TS1046", "symlink"),
            ("file", "x", "TS1046", "not a directory"),
            ("gone", "x", "TS1046", "No such file"),
        ] {
            let e = w.resolve(&name(n), ns).unwrap_err();
            assert_eq!(e.code(), code, "{n}: {e}");
            assert!(e.to_string().contains(text), "{n}: {e}");
            assert!(e.to_string().contains("io.turnstile.workspace"), "{e}");
        }
        assert!(!d.path().join("gone").exists(), "nothing is created");
    }

    #[test]
    fn issue_25_the_namespace_is_containerds_or_on_the_cri_path_the_pods() {
        let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let cri = [
            (CRI_CONTAINER_TYPE, "container"),
            (CRI_SANDBOX_NAMESPACE, "team-a"),
        ];
        assert_eq!(namespace_of("default", &ann(&[])).unwrap(), "default");
        assert_eq!(namespace_of("k8s.io", &ann(&cri)).unwrap(), "team-a");
        // Outside k8s.io the CRI annotations are not believed.
        assert_eq!(namespace_of("default", &ann(&cri)).unwrap(), "default");
        // k8s.io without the CRI's container marking: containerd's.
        assert_eq!(namespace_of("k8s.io", &ann(&[])).unwrap(), "k8s.io");
        let e = namespace_of("k8s.io", &ann(&[(CRI_CONTAINER_TYPE, "container")])).unwrap_err();
        assert_eq!(e.code(), "TS1049");
        let mut both = cri.to_vec();
        both.push((POD_NAMESPACE, "team-b"));
        assert_eq!(
            namespace_of("k8s.io", &ann(&both)).unwrap_err().code(),
            "TS1049"
        );
        both.pop();
        both.push((POD_NAMESPACE, "team-a"));
        assert_eq!(namespace_of("k8s.io", &ann(&both)).unwrap(), "team-a");
    }
}
