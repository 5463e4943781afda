//! The container's cgroup, where containerd (and the kubelet, through CRI)
//! says it is: `linux.cgroupsPath`, in the cgroupfs form
//! (`/kubepods/burstable/pod…/<id>`) or the systemd form
//! (`slice:prefix:name`, expanded as runc does to
//! `/kubepods.slice/…/kubepods-burstable-pod….slice/prefix-name.scope`).
//! The shim makes it, as runc would, with `linux.resources` (the pod's
//! limits), and the turn's cgroup is made inside it by `supervise run
//! --cgroup-parent`: the pod's limits bound the turn, the manifest's apply
//! inside, and the kubelet's accounting sees the turn. The systemd form is
//! written to cgroupfs directly (no D-Bus to systemd), under the slices the
//! kubelet made.
//!
//! What the shim made (the directories it created, deepest last) is
//! written to [`CREATED_FILE`] in the bundle, so Delete — also the
//! `delete` action after a dead daemon — removes exactly those.

use std::path::{Path, PathBuf};

use turnstile_supervisor::sandbox::cgroup::{self, Version};

use crate::contract::Resources;
use crate::error::ShimError;

/// The cgroup directories the shim created, one a line, in the bundle.
pub const CREATED_FILE: &str = "turnstile-cgroups";

fn bad(path: &str, reason: impl Into<String>) -> ShimError {
    ShimError::PodCgroup {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// `linux.cgroupsPath` as a path relative to each hierarchy's root.
pub fn relative(raw: &str) -> Result<PathBuf, ShimError> {
    let expanded = if raw.starts_with('/') {
        raw.to_owned()
    } else {
        let parts: Vec<&str> = raw.split(':').collect();
        let [slice, prefix, name] = parts.as_slice() else {
            return Err(bad(
                raw,
                "neither an absolute cgroupfs path nor the systemd form `slice:prefix:name`",
            ));
        };
        if name.is_empty() || [slice, prefix, name].iter().any(|p| p.contains('/')) {
            return Err(bad(raw, "systemd form: a part is empty or holds `/`"));
        }
        let slice = if slice.is_empty() {
            "system.slice"
        } else {
            slice
        };
        let Some(stem) = slice.strip_suffix(".slice") else {
            return Err(bad(raw, "systemd form: the slice must end in `.slice`"));
        };
        // `a-b-c.slice` lives in `a.slice/a-b.slice/a-b-c.slice`.
        let mut path = String::new();
        if stem != "-" {
            let mut acc = String::new();
            for (i, part) in stem.split('-').enumerate() {
                if part.is_empty() {
                    return Err(bad(raw, "systemd form: an empty slice component"));
                }
                if i > 0 {
                    acc.push('-');
                }
                acc.push_str(part);
                path.push_str(&format!("/{acc}.slice"));
            }
        }
        let unit = if name.ends_with(".slice") {
            (*name).to_owned()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        format!("{path}/{unit}")
    };
    if expanded.split('/').any(|c| c == "." || c == "..") {
        return Err(bad(raw, "`.` and `..` components are refused"));
    }
    let rel: PathBuf = Path::new(&expanded).components().skip(1).collect();
    if rel.as_os_str().is_empty() {
        return Err(bad(
            raw,
            "the root of a hierarchy is not a container's cgroup",
        ));
    }
    Ok(rel)
}

/// The hierarchies (relative to `root`) the container's cgroup is made in:
/// v2 one; v1 memory, pids, cpu, a separate cpuacct, and freezer.
fn hierarchies(root: &Path, version: Version) -> Vec<PathBuf> {
    match version {
        Version::V2 => vec![PathBuf::new()],
        Version::V1 => ["memory", "pids", "cpu", "cpuacct", "freezer"]
            .iter()
            .filter(|h| root.join(h).join("cgroup.procs").exists())
            .filter(|h| **h != "cpuacct" || !root.join("cpuacct/cpu.cfs_quota_us").exists())
            .map(PathBuf::from)
            .collect(),
    }
}

/// The container's cgroup the shim made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// `/` + the path relative to each hierarchy (what `--cgroup-parent`
    /// gets).
    pub path: String,
    /// Directories this shim created, parents first.
    pub created: Vec<PathBuf>,
    /// The container's directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
    pub version: Version,
}

fn write(path: &Path, value: &str) -> Result<(), ShimError> {
    std::fs::write(path, value).map_err(ShimError::io("write", path))
}

impl PodCgroup {
    /// Makes the container's cgroup `rel` under `root` with `resources`
    /// (as runc would); on any failure removes what it made.
    pub fn create(
        root: &Path,
        raw: &str,
        resources: Option<&Resources>,
    ) -> Result<Self, ShimError> {
        let rel = relative(raw)?;
        let version = cgroup::detect(root)
            .ok_or_else(|| bad(raw, format!("no cgroup hierarchy under {}", root.display())))?;
        let mut cg = Self {
            path: format!("/{}", rel.display()),
            created: Vec::new(),
            dirs: Vec::new(),
            version,
        };
        match cg.make(root, &rel, resources) {
            Ok(()) => Ok(cg),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    fn make(
        &mut self,
        root: &Path,
        rel: &Path,
        resources: Option<&Resources>,
    ) -> Result<(), ShimError> {
        for h in hierarchies(root, self.version) {
            let mut dir = root.join(&h);
            for c in rel.components() {
                if self.version == Version::V2 {
                    // Each level hands the controllers down.
                    let _ =
                        std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids +cpu");
                }
                dir.push(c);
                match std::fs::symlink_metadata(&dir) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        return Err(bad(
                            &self.path,
                            format!("{} is not a directory", dir.display()),
                        ));
                    }
                    Err(_) => {
                        std::fs::create_dir(&dir).map_err(ShimError::io("create cgroup", &dir))?;
                        self.created.push(dir.clone());
                    }
                }
            }
            self.dirs.push(dir);
        }
        let Some(r) = resources else { return Ok(()) };
        let find = |h: &str| {
            self.dirs
                .iter()
                .find(|d| self.version == Version::V2 || d.starts_with(root.join(h)))
                .cloned()
        };
        let memory = r.memory.as_ref().and_then(|m| m.limit).filter(|l| *l > 0);
        let pids = r.pids.as_ref().and_then(|p| p.limit).filter(|l| *l > 0);
        let cpu = r.cpu.as_ref().and_then(|c| {
            c.quota
                .filter(|q| *q > 0)
                .map(|q| (q, c.period.unwrap_or(100_000)))
        });
        match self.version {
            Version::V2 => {
                let d = find("").unwrap_or_default();
                let _ = std::fs::write(d.join("cgroup.subtree_control"), "+memory +pids +cpu");
                if let Some(m) = memory {
                    write(&d.join("memory.max"), &m.to_string())?;
                }
                if let Some(p) = pids {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
                if let Some((q, p)) = cpu {
                    write(&d.join("cpu.max"), &format!("{q} {p}"))?;
                }
            }
            Version::V1 => {
                if let (Some(m), Some(d)) = (memory, find("memory")) {
                    write(&d.join("memory.limit_in_bytes"), &m.to_string())?;
                }
                if let (Some(p), Some(d)) = (pids, find("pids")) {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
                if let (Some((q, p)), Some(d)) = (cpu, find("cpu")) {
                    write(&d.join("cpu.cfs_period_us"), &p.to_string())?;
                    write(&d.join("cpu.cfs_quota_us"), &q.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The directory of hierarchy `h` (`memory`, `pids`, `cpu`,
    /// `cpuacct`, `freezer`; v2: the one directory).
    fn dir(&self, root: &Path, h: &str) -> Option<PathBuf> {
        self.dirs
            .iter()
            .find(|d| self.version == Version::V2 || d.starts_with(root.join(h)))
            .cloned()
    }

    /// Update: `resources` applied to the container's cgroup, which bounds
    /// the turn's; the manifest's limits stay in force inside it (the
    /// stricter wins), so an update can only tighten what the manifest
    /// allows, never widen it.
    pub fn update(&self, root: &Path, resources: &Resources) -> Result<(), ShimError> {
        let mut me = self.clone();
        me.created.clear();
        let rel = PathBuf::from(self.path.trim_start_matches('/'));
        me.dirs.clear();
        me.make(root, &rel, Some(resources))
    }

    /// Stats: the container's cgroup (the turn's is inside it, so its
    /// hierarchical counters hold the turn's), as containerd's metrics type
    /// for the layout: `io.containerd.cgroups.v1.Metrics` (memory usage,
    /// max usage, limit and failcnt; cpuacct usage; pids current and
    /// limit; oom_kill) on v1, `io.containerd.cgroups.v2.Metrics` on v2.
    pub fn metrics(
        &self,
        root: &Path,
    ) -> Result<containerd_shim::protos::protobuf::well_known_types::any::Any, ShimError> {
        use containerd_shim::protos::protobuf::Message;
        use containerd_shim::protos::protobuf::well_known_types::any::Any;
        let num = |p: PathBuf| -> u64 {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        };
        let key = |p: PathBuf, k: &str| -> u64 {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    let (a, b) = l.split_once(' ')?;
                    (a == k).then(|| b.trim().parse().ok()).flatten()
                })
                .unwrap_or(0)
        };
        let fail = |e: containerd_shim::protos::protobuf::Error| ShimError::Io {
            op: "encode metrics of",
            path: PathBuf::from(&self.path),
            source: std::io::Error::other(e.to_string()),
        };
        let mut any = Any::new();
        match self.version {
            Version::V1 => {
                use containerd_shim::protos::cgroups::metrics as m;
                let mem = self.dir(root, "memory").unwrap_or_default();
                let pids = self.dir(root, "pids").unwrap_or_default();
                let cpuacct = self
                    .dirs
                    .iter()
                    .find(|d| d.join("cpuacct.usage").exists())
                    .cloned()
                    .unwrap_or_default();
                let mut x = m::Metrics::new();
                let mut memory = m::MemoryStat::new();
                memory.usage =
                    containerd_shim::protos::protobuf::MessageField::some(m::MemoryEntry {
                        usage: num(mem.join("memory.usage_in_bytes")),
                        max: num(mem.join("memory.max_usage_in_bytes")),
                        limit: num(mem.join("memory.limit_in_bytes")),
                        failcnt: num(mem.join("memory.failcnt")),
                        ..Default::default()
                    });
                memory.rss = key(mem.join("memory.stat"), "rss");
                memory.total_rss = key(mem.join("memory.stat"), "total_rss");
                memory.cache = key(mem.join("memory.stat"), "cache");
                x.memory = containerd_shim::protos::protobuf::MessageField::some(memory);
                let mut oom = m::MemoryOomControl::new();
                oom.oom_kill = key(mem.join("memory.oom_control"), "oom_kill");
                oom.under_oom = key(mem.join("memory.oom_control"), "under_oom");
                x.memory_oom_control = containerd_shim::protos::protobuf::MessageField::some(oom);
                let mut cpu = m::CPUStat::new();
                cpu.usage = containerd_shim::protos::protobuf::MessageField::some(m::CPUUsage {
                    total: num(cpuacct.join("cpuacct.usage")),
                    user: num(cpuacct.join("cpuacct.usage_user")),
                    kernel: num(cpuacct.join("cpuacct.usage_sys")),
                    ..Default::default()
                });
                x.cpu = containerd_shim::protos::protobuf::MessageField::some(cpu);
                x.pids = containerd_shim::protos::protobuf::MessageField::some(m::PidsStat {
                    current: num(pids.join("pids.current")),
                    limit: num(pids.join("pids.max")),
                    ..Default::default()
                });
                any.type_url = "io.containerd.cgroups.v1.Metrics".into();
                any.value = x.write_to_bytes().map_err(fail)?;
            }
            Version::V2 => {
                use containerd_shim::protos::cgroups_v2::metrics as m;
                let d = self.dir(root, "").unwrap_or_default();
                let mut x = m::Metrics::new();
                x.memory = containerd_shim::protos::protobuf::MessageField::some(m::MemoryStat {
                    usage: num(d.join("memory.current")),
                    usage_limit: num(d.join("memory.max")),
                    max_usage: num(d.join("memory.peak")),
                    anon: key(d.join("memory.stat"), "anon"),
                    file: key(d.join("memory.stat"), "file"),
                    ..Default::default()
                });
                x.cpu = containerd_shim::protos::protobuf::MessageField::some(m::CPUStat {
                    usage_usec: key(d.join("cpu.stat"), "usage_usec"),
                    user_usec: key(d.join("cpu.stat"), "user_usec"),
                    system_usec: key(d.join("cpu.stat"), "system_usec"),
                    ..Default::default()
                });
                x.pids = containerd_shim::protos::protobuf::MessageField::some(m::PidsStat {
                    current: num(d.join("pids.current")),
                    limit: num(d.join("pids.max")),
                    ..Default::default()
                });
                x.memory_events =
                    containerd_shim::protos::protobuf::MessageField::some(m::MemoryEvents {
                        oom: key(d.join("memory.events"), "oom"),
                        oom_kill: key(d.join("memory.events"), "oom_kill"),
                        max: key(d.join("memory.events"), "max"),
                        ..Default::default()
                    });
                any.type_url = "io.containerd.cgroups.v2.Metrics".into();
                any.value = x.write_to_bytes().map_err(fail)?;
            }
        }
        Ok(any)
    }

    /// Records what was created in `bundle` (for the `delete` action).
    pub fn save(&self, bundle: &Path) {
        let text: Vec<String> = self
            .created
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let _ = std::fs::write(bundle.join(CREATED_FILE), text.join("\n"));
    }

    /// Removes the directories this shim created (deepest first), with any
    /// empty turn cgroup left inside them.
    pub fn remove(&self) {
        remove_created(&self.created);
    }
}

/// Removes `created` (parents first in the list) deepest first, with the
/// empty directories inside each. On v1 the same paths go in every other
/// hierarchy too: an OCI runtime running the turn (runc, runsc) makes the
/// turn's `cgroupsPath`, and so its parents, in all of them (blkio,
/// devices, name=systemd…). Only empty cgroups can be removed, and only
/// paths this shim created are tried.
pub fn remove_created(created: &[PathBuf]) {
    let root = cgroup::root();
    let v1 = cgroup::detect(&root) == Some(Version::V1);
    let others: Vec<PathBuf> = if v1 {
        std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    } else {
        Vec::new()
    };
    for d in created.iter().rev() {
        let mut all = vec![d.clone()];
        if let Some(rel) = d.strip_prefix(&root).ok().filter(|_| v1) {
            let rel: PathBuf = rel.components().skip(1).collect();
            all.extend(others.iter().map(|h| h.join(&rel)).filter(|p| p != d));
        }
        for d in all {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rmdir(&e.path());
                }
            }
            rmdir(&d);
        }
    }
}

fn rmdir(d: &Path) {
    if !d.is_dir() {
        return;
    }
    for _ in 0..400 {
        match std::fs::remove_dir(d) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            _ => return,
        }
    }
}

/// The `delete` action: removes what [`PodCgroup::save`] recorded.
pub fn remove_saved(bundle: &Path) {
    if let Ok(text) = std::fs::read_to_string(bundle.join(CREATED_FILE)) {
        let created: Vec<PathBuf> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect();
        remove_created(&created);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_and_systemd_forms() {
        assert_eq!(
            relative("/kubepods/burstable/pod1/c1").unwrap(),
            PathBuf::from("kubepods/burstable/pod1/c1")
        );
        assert_eq!(
            relative("kubepods-burstable-pod1.slice:cri-containerd:c1").unwrap(),
            PathBuf::from(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-c1.scope"
            )
        );
        for bad in [
            "/a/../b",
            "/",
            "a:b",
            "x.slice:p:../n",
            "noslice:p:n",
            "/a/./b",
        ] {
            assert!(relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn v1_container_cgroup_is_made_limited_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for c in ["memory", "pids", "cpu", "freezer"] {
            std::fs::create_dir_all(r.join(c)).unwrap();
            std::fs::write(r.join(c).join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(r.join("memory/memory.limit_in_bytes"), "0").unwrap();
        std::fs::create_dir_all(r.join("memory/kubepods")).unwrap();
        let res: Resources = serde_json::from_str(
            r#"{"memory":{"limit":1048576},"pids":{"limit":10},"cpu":{"quota":50000,"period":100000}}"#,
        )
        .unwrap();
        let cg = PodCgroup::create(r, "/kubepods/pod1/c1", Some(&res)).unwrap();
        assert_eq!(cg.path, "/kubepods/pod1/c1");
        let read = |p: &str| std::fs::read_to_string(r.join(p)).unwrap();
        assert_eq!(
            read("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
            "1048576"
        );
        assert_eq!(read("pids/kubepods/pod1/c1/pids.max"), "10");
        assert_eq!(read("cpu/kubepods/pod1/c1/cpu.cfs_quota_us"), "50000");
        assert!(r.join("freezer/kubepods/pod1/c1").is_dir());
        // Update: the new resources land in the same directories (the
        // manifest's limits stay in force in the turn's cgroup inside).
        let upd: Resources =
            serde_json::from_str(r#"{"memory":{"limit":524288},"pids":{"limit":5}}"#).unwrap();
        cg.update(r, &upd).unwrap();
        assert_eq!(
            read("memory/kubepods/pod1/c1/memory.limit_in_bytes"),
            "524288"
        );
        assert_eq!(read("pids/kubepods/pod1/c1/pids.max"), "5");
        // The existing kubepods dir of memory is not the shim's.
        assert!(!cg.created.contains(&r.join("memory/kubepods")));
        // Plain directories stand in for cgroupfs: empty them first.
        for d in cg.dirs.iter() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        cg.remove();
        assert!(r.join("memory/kubepods").is_dir());
        assert!(!r.join("memory/kubepods/pod1").exists());
        assert!(!r.join("pids/kubepods").exists());
    }
}
