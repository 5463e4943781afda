//! The agent package manifest, `installed/<pkg-id>/manifest.json`
//! (FR-RT-001, FR-RT-002).
//!
//! Parsed straight into typed values: unknown fields, malformed patterns,
//! malformed limits and write grants on reserved paths are errors that name
//! the field. A [`Manifest`] that exists is valid.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::PolicyError;
use crate::pattern::{Pattern, PatternSet};

/// Largest manifest accepted.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Paths no write pattern may ever reach (hierarchically). Segments are
/// literals or `*`. Ledgers live under `planes/`; a package's manifest is its
/// own grant of authority, so a turn writing one would escalate the next turn,
/// and a package's code is as much its authority: a turn of one package
/// writing `installed/OTHER/main.py` runs as OTHER next (red-team wave 4).
pub const RESERVED_WRITE: &[&str] = &["planes", "installed"];

/// A package id: the directory name under `installed/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PackageId(String);

impl PackageId {
    pub fn parse(value: &str) -> Result<Self, PolicyError> {
        let invalid = |reason: &str| PolicyError::InvalidPackageId {
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        if value.is_empty() || value.len() > 64 {
            return Err(invalid("must be 1 to 64 characters"));
        }
        let mut bytes = value.bytes();
        let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
        if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid(
                "must start with a letter or digit and contain only letters, digits, `.`, `_` and `-`",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PackageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How far the package is trusted; selects the runtime class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrustLevel {
    Trusted,
    #[default]
    Standard,
    Untrusted,
    Confidential,
}

impl TrustLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trusted => "trusted",
            Self::Standard => "standard",
            Self::Untrusted => "untrusted",
            Self::Confidential => "confidential",
        }
    }
}

/// An enforcement layer a manifest may let a backend lack
/// (`allow_degraded`): without it listed, a turn on a backend or kernel
/// that cannot enforce the layer is refused (exit 20), never run as if
/// enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DegradableLayer {
    /// Landlock, wholly or in part (gVisor has none; older kernels lack
    /// newer rights): the view, seccomp and the other layers still hold.
    Landlock,
    /// gVisor's own network stack (netstack): a runsc turn with
    /// `restricted` or `allow_egress` runs on the host kernel's stack
    /// (`--network=host`, inside the turn's own network namespace), where
    /// the supervisor's resolver, nftables and proxy enforce the policy as
    /// for the other backends; the sentry's sockets are host sockets.
    GvisorNetstack,
}

impl DegradableLayer {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Landlock => "landlock",
            Self::GvisorNetstack => "gvisor_netstack",
        }
    }
}

/// Network policy for a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// Own network namespace with loopback only.
    #[default]
    Isolated,
    /// Only what `egress` lists (names or CIDRs, with ports).
    Restricted,
    /// Any public destination, except private, loopback, link-local,
    /// CGNAT, ULA and the host's own addresses unless `egress` lists one.
    AllowEgress,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Isolated => "isolated",
            Self::Restricted => "restricted",
            Self::AllowEgress => "allow_egress",
        }
    }
}

/// Where an `egress` entry lets a turn connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressHost {
    /// An exact DNS name (lower-case).
    Name(String),
    /// `*.suffix`: one or more labels before the suffix.
    Wildcard(String),
    /// An IPv4 or IPv6 network.
    Cidr(std::net::IpAddr, u8),
}

/// The transport an `egress` entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// The most distinct UDP ports a turn's `/udp` entries may name together:
/// the supervisor relays each port with a socket of its own in the turn's
/// network namespace (issue 26), so a wider range is refused at load.
pub const MAX_UDP_PORTS: usize = 64;

/// One `egress` entry: `HOST:PORT[-PORT][/udp]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    pub host: EgressHost,
    pub ports: (u16, u16),
    pub transport: Transport,
    /// As written (for evidence and hints).
    pub raw: String,
}

impl Egress {
    /// Parses one entry; the error says what is wrong with it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (rest, transport) = match raw.rsplit_once('/') {
            Some((r, "udp")) => (r, Transport::Udp),
            Some((r, "tcp")) => (r, Transport::Tcp),
            // A CIDR's `/len` comes before the port: `10.0.0.0/8:443`.
            _ => (raw, Transport::Tcp),
        };
        let (host, ports) = rest
            .rsplit_once(':')
            .ok_or("needs a port: HOST:PORT, HOST:LOW-HIGH, or CIDR:PORT")?;
        let ports = match ports.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(ports)?;
                (p, p)
            }
        };
        if ports.0 > ports.1 {
            return Err(format!("the port range {}-{} is empty", ports.0, ports.1));
        }
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Ok(Self {
            host: egress_host(host)?,
            ports,
            transport,
            raw: raw.to_owned(),
        })
    }
}

impl Egress {
    /// Why this entry can grant nothing, if it cannot: it names only
    /// loopback addresses. A turn's loopback is its own network
    /// namespace's, always reachable, and the host's is never opened to a
    /// turn, not even by a CIDR entry (the supervisor's egress ruleset).
    pub fn inert_reason(&self) -> Option<&'static str> {
        const WHY: &str = "it names only loopback addresses: the turn's own loopback needs no entry, and the host's is never reachable from a turn";
        if let EgressHost::Cidr(std::net::IpAddr::V6(a), len) = &self.host {
            if let Some(v4) = a.to_ipv4_mapped().filter(|_| *len >= 96) {
                if !v4.is_loopback() {
                    return Some(
                        "it names IPv4-mapped IPv6 addresses (`::ffff:…`), which no connection carries: a turn's IPv4 connections are matched by their IPv4 address; write the entry in IPv4 (`A.B.C.D/N:PORT`)",
                    );
                }
            }
        }
        let loopback_net = match &self.host {
            EgressHost::Cidr(std::net::IpAddr::V4(a), len) => a.is_loopback() && *len >= 8,
            EgressHost::Cidr(std::net::IpAddr::V6(a), len) => match a.to_ipv4_mapped() {
                Some(v4) => v4.is_loopback() && *len >= 104,
                None => a.is_loopback() && *len == 128,
            },
            // RFC 6761: `localhost` and every name under it are loopback.
            EgressHost::Name(n) | EgressHost::Wildcard(n) => {
                n == "localhost" || n.ends_with(".localhost")
            }
        };
        loopback_net.then_some(WHY)
    }
}

fn port(p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) => Err("port 0 is not a port".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{p}` is not a port (1-65535)")),
    }
}

fn egress_host(h: &str) -> Result<EgressHost, String> {
    if let Some((addr, len)) = h.split_once('/') {
        let ip: std::net::IpAddr = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IP address"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("`/{len}` is not a prefix length (0-{max})"))?;
        return Ok(EgressHost::Cidr(ip, len));
    }
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return Ok(EgressHost::Cidr(ip, if ip.is_ipv4() { 32 } else { 128 }));
    }
    let (wild, name) = match h.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, h),
    };
    if name.is_empty() || name == "*" || h == "*" {
        return Err("`*` alone allows everything: name the hosts".into());
    }
    let name = name.to_ascii_lowercase();
    let labels_ok = name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !labels_ok {
        return Err(format!("`{h}` is not a DNS name (empty or invalid label)"));
    }
    Ok(if wild {
        EgressHost::Wildcard(name)
    } else {
        EgressHost::Name(name)
    })
}

/// A size in bytes, written `<n>Ki`, `<n>Mi` or `<n>Gi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct ByteSize(pub u64);

impl TryFrom<String> for ByteSize {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a size like `256Mi` (digits, then Ki, Mi or Gi)");
        let (digits, shift) = if let Some(d) = s.strip_suffix("Ki") {
            (d, 10)
        } else if let Some(d) = s.strip_suffix("Mi") {
            (d, 20)
        } else if let Some(d) = s.strip_suffix("Gi") {
            (d, 30)
        } else {
            return Err(bad());
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let bytes = n
            .checked_mul(1 << shift)
            .ok_or_else(|| format!("`{s}` is too large"))?;
        if bytes == 0 {
            return Err(format!("`{s}` must be greater than zero"));
        }
        Ok(Self(bytes))
    }
}

/// CPU in thousandths of a core: `1` is one core, `500m` half a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct MilliCpu(pub u64);

impl TryFrom<String> for MilliCpu {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a CPU amount like `1` or `500m`");
        let (digits, milli) = match s.strip_suffix('m') {
            Some(d) => (d, true),
            None => (s.as_str(), false),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let m = if milli { Some(n) } else { n.checked_mul(1000) };
        match m {
            Some(0) => Err(format!("`{s}` must be greater than zero")),
            // The kernel's CFS quota is at least 1 ms a period (100 ms here):
            // less could never be written to the turn's cgroup.
            Some(m) if m < 10 => Err(format!(
                "`{s}` is less than `10m`, the smallest CPU quota the kernel accepts (1 ms every 100 ms)"
            )),
            Some(m) if m <= 1_000_000 => Ok(Self(m)),
            _ => Err(format!("`{s}` is more than 1000 cores")),
        }
    }
}

/// Resource limits, with the defaults a manifest may lower or raise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub memory: ByteSize,
    pub cpu: MilliCpu,
    pub pids: u32,
    pub timeout_seconds: u64,
    pub disk: ByteSize,
    pub files: u64,
    pub output_bytes: ByteSize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: ByteSize(1 << 30),
            cpu: MilliCpu(1000),
            pids: 256,
            timeout_seconds: 600,
            disk: ByteSize(1 << 30),
            files: 100_000,
            output_bytes: ByteSize(1 << 20),
        }
    }
}

/// Longest timeout a manifest or a request may ask for: one week.
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

pub use crate::capabilities::{Capabilities, ExecEntry};

/// The manifests this process loaded last, with the file and bytes each
/// was parsed from: [`Manifest::from_slice`] is a function of the bytes,
/// the package and the path alone, and a serve worker loads its
/// package's manifest at every turn. [`Manifest::load`] still reads the
/// file each time; only bytes seen before skip the parse and validation.
/// Four are kept (a worker serves one package, a daemon's process few).
static LOADED: crate::recent::Recent<(PathBuf, PackageId, Vec<u8>, Manifest)> =
    crate::recent::Recent::new(4);

/// A loaded, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub package_id: PackageId,
    pub version: Option<String>,
    pub trust_level: TrustLevel,
    pub capabilities: Capabilities,
    pub limits: Limits,
    pub network: Network,
    /// `egress` entries (for `restricted`, and exceptions for
    /// `allow_egress`).
    pub egress: Vec<Egress>,
    /// Layers the package accepts running without (see [`DegradableLayer`]).
    pub allow_degraded: Vec<DegradableLayer>,
    /// `entry.receive`: the ARA entry point, the argv a `receive` turn runs
    /// (issue 28); an execute entry admits it (checked at load).
    pub receive: Option<Vec<String>>,
    /// The file it was loaded from.
    pub source: PathBuf,
}

// ---- the document as written on disk ------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestDoc {
    package_id: Option<String>,
    version: Option<String>,
    #[serde(default)]
    trust_level: TrustLevel,
    capabilities: CapabilitiesDoc,
    #[serde(default)]
    limits: LimitsDoc,
    #[serde(default)]
    network: Network,
    #[serde(default)]
    egress: Vec<String>,
    #[serde(default)]
    allow_degraded: Vec<DegradableLayer>,
    #[serde(default)]
    entry: Option<EntryDoc>,
}

/// `entry`: how the runtime invokes the package.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryDoc {
    receive: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilitiesDoc {
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default)]
    execute: Vec<String>,
    #[serde(default)]
    forbidden: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsDoc {
    memory: Option<ByteSize>,
    cpu: Option<MilliCpu>,
    pids: Option<u32>,
    timeout_seconds: Option<u64>,
    disk: Option<ByteSize>,
    files: Option<u64>,
    output_bytes: Option<ByteSize>,
}

impl Manifest {
    /// The manifest path of `package` under `root`.
    pub fn path(root: &Path, package: &PackageId) -> PathBuf {
        root.join("installed")
            .join(package.as_str())
            .join("manifest.json")
    }

    /// Loads `installed/<package>/manifest.json` under `root` (FR-RT-001).
    pub fn load(root: &Path, package: &PackageId) -> Result<Self, PolicyError> {
        let path = Self::path(root, package);
        let bytes = match crate::input::read_regular_file(&path, MAX_MANIFEST_BYTES) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Err(PolicyError::PackageNotFound {
                    package: package.to_string(),
                    path,
                });
            }
            Err(crate::input::InputError::Io(source)) => {
                return Err(PolicyError::ManifestUnreadable { path, source });
            }
            Err(e) => {
                return Err(PolicyError::InvalidManifest {
                    path,
                    field: "(file)".into(),
                    reason: e.to_string(),
                });
            }
        };
        let kept = LOADED
            .find(|(p, id, b, m)| (*p == path && id == package && *b == bytes).then(|| m.clone()));
        if let Some(m) = kept {
            return Ok(m);
        }
        let m = Self::from_slice(&bytes, package, path.clone())?;
        LOADED.keep((path, package.clone(), bytes, m.clone()));
        Ok(m)
    }

    /// Parses and validates manifest bytes for `package`; `source` is used in
    /// error messages.
    pub fn from_slice(
        bytes: &[u8],
        package: &PackageId,
        source: PathBuf,
    ) -> Result<Self, PolicyError> {
        let invalid = |field: &str, reason: String| PolicyError::InvalidManifest {
            path: source.clone(),
            field: field.to_owned(),
            reason,
        };
        let doc: ManifestDoc = crate::strict::from_json_slice(bytes).map_err(|e| {
            let (field, reason) = e.field_and_reason();
            invalid(&field, reason)
        })?;

        if let Some(id) = &doc.package_id {
            if id != package.as_str() {
                return Err(invalid(
                    "package_id",
                    format!("`{id}` does not match the package directory `{package}`"),
                ));
            }
        }
        if doc.version.as_deref() == Some("") {
            return Err(invalid("version", "is empty".into()));
        }

        let patterns = |list: &[String], name: &str| -> Result<Vec<Pattern>, PolicyError> {
            list.iter()
                .enumerate()
                .map(|(i, raw)| {
                    Pattern::parse(raw).map_err(|reason| {
                        invalid(
                            &format!("capabilities.{name}[{i}]"),
                            format!("`{raw}` {reason}"),
                        )
                    })
                })
                .collect()
        };
        let caps = &doc.capabilities;
        let read = patterns(&caps.read, "read")?;
        let write = patterns(&caps.write, "write")?;
        let forbidden = patterns(&caps.forbidden, "forbidden")?;
        let execute = caps
            .execute
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                ExecEntry::parse(raw)
                    .map_err(|reason| invalid(&format!("capabilities.execute[{i}]"), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;

        // Compile every list now, with a probe session id (every id has the
        // same length and alphabet, so what compiles here compiles for any
        // session): a list too complex for the matcher is bad input at load,
        // never a failure after a session was created.
        let probe = crate::pattern::probe_session();
        let execute_programs: Vec<Pattern> = execute.iter().map(|e| e.program.clone()).collect();
        for (name, list) in [
            ("read", &read),
            ("write", &write),
            ("forbidden", &forbidden),
            ("execute", &execute_programs),
        ] {
            PatternSet::compile_checked(list, &probe).map_err(|e| {
                let field = match e.index {
                    Some(i) => format!("capabilities.{name}[{i}]"),
                    None => format!("capabilities.{name}"),
                };
                invalid(&field, e.reason)
            })?;
        }

        for (i, pattern) in write.iter().enumerate() {
            let field = format!("capabilities.write[{i}]");
            if pattern.is_absolute() {
                return Err(invalid(
                    &field,
                    format!(
                        "`{pattern}` is absolute; write patterns must be relative to the workspace root (host paths outside it cannot be granted write)"
                    ),
                ));
            }
            if let Some(reserved) = RESERVED_WRITE.iter().find(|r| pattern.may_cover(r)) {
                return Err(PolicyError::ReservedWrite {
                    path: source.clone(),
                    field,
                    pattern: pattern.to_string(),
                    reserved: (*reserved).to_owned(),
                });
            }
            // Its scope would hold every session's directory: readable and
            // writable in the turn, and a declared output there committed
            // into another session's (another tenant's) outputs.
            if let Some(tree) = pattern.reaches_other_sessions() {
                return Err(invalid(
                    &field,
                    format!(
                        "`{pattern}` reaches other sessions' directories under `{tree}/` (other tenants' in a shared workspace); a turn's own `{tree}/<session_id>/` is always writable: write `{tree}/<session_id>/**`, or leave it out"
                    ),
                ));
            }
        }

        for (i, layer) in doc.allow_degraded.iter().enumerate() {
            if doc.allow_degraded[..i].contains(layer) {
                return Err(invalid(
                    &format!("allow_degraded[{i}]"),
                    format!("`{}` is listed twice", layer.as_str()),
                ));
            }
        }
        let limits = limits_from(doc.limits).map_err(|(field, reason)| invalid(&field, reason))?;
        let egress = doc
            .egress
            .iter()
            .enumerate()
            .map(|(i, e)| {
                Egress::parse(e)
                    .map_err(|r| invalid(&format!("egress[{i}]"), format!("`{e}`: {r}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // An entry that can grant nothing is an error, not a no-op.
        for (i, e) in egress.iter().enumerate() {
            let reason = egress[..i]
                .iter()
                .position(|d| d.host == e.host && d.ports == e.ports && d.transport == e.transport)
                .map(|j| format!("it repeats egress[{j}]; remove the duplicate"))
                .or_else(|| e.inert_reason().map(str::to_owned));
            if let Some(reason) = reason {
                return Err(PolicyError::EntryGrantsNothing {
                    path: source.clone(),
                    field: format!("egress[{i}]"),
                    entry: e.raw.clone(),
                    reason,
                });
            }
        }
        // `/udp` entries are relayed one port at a time: bounded.
        let mut udp_ports = std::collections::BTreeSet::new();
        for (i, e) in egress.iter().enumerate() {
            if e.transport != Transport::Udp {
                continue;
            }
            let (lo, hi) = (usize::from(e.ports.0), usize::from(e.ports.1));
            if hi - lo + 1 > MAX_UDP_PORTS || {
                udp_ports.extend(e.ports.0..=e.ports.1);
                udp_ports.len() > MAX_UDP_PORTS
            } {
                return Err(PolicyError::EgressUdpTooWide {
                    path: source.clone(),
                    field: format!("egress[{i}]"),
                    entry: e.raw.clone(),
                    reason: format!(
                        "UDP egress is relayed port by port: the `/udp` entries may name at most {MAX_UDP_PORTS} ports together (list the ports the service uses)"
                    ),
                });
            }
        }
        if doc.network == Network::Isolated && !egress.is_empty() {
            return Err(invalid(
                "egress",
                "`isolated` allows no egress: remove `egress` or choose `network: restricted`"
                    .into(),
            ));
        }
        if doc.network == Network::Restricted && egress.is_empty() {
            return Err(invalid(
                "egress",
                "`restricted` with no `egress` entry allows nothing: list the hosts (or use `isolated`)"
                    .into(),
            ));
        }
        let capabilities = Capabilities {
            read,
            write,
            execute,
            forbidden,
        };
        // Entries that can grant nothing are refused, naming the entry.
        crate::grants::check_pure(&capabilities, &source)?;
        let receive = match doc.entry {
            None => None,
            Some(EntryDoc { receive: None }) => {
                return Err(invalid(
                    "entry",
                    "names no entry point; give `receive` or remove `entry`".into(),
                ));
            }
            Some(EntryDoc {
                receive: Some(argv),
            }) => {
                check_receive_entry(&argv, &capabilities.execute, &probe)
                    .map_err(|reason| invalid("entry.receive", reason))?;
                Some(argv)
            }
        };

        Ok(Self {
            package_id: package.clone(),
            version: doc.version,
            trust_level: doc.trust_level,
            capabilities,
            limits,
            network: doc.network,
            egress,
            allow_degraded: doc.allow_degraded,
            receive,
            source,
        })
    }
}

/// An `entry.receive` argv is a command some execute entry admits: its
/// program matches the entry's executable and its arguments start with the
/// entry's fixed ones. One no entry admits could never run: refused.
fn check_receive_entry(
    argv: &[String],
    execute: &[ExecEntry],
    probe: &crate::session::SessionId,
) -> Result<(), String> {
    let Some(program) = argv.first() else {
        return Err("is empty; expected [\"<executable>\", \"<arg>\"...]".into());
    };
    if let Some(i) = argv
        .iter()
        .position(|a| a.is_empty() || a.contains('\0') || a.len() > 4096)
    {
        return Err(format!(
            "argument {i} is empty, too long or holds a NUL byte"
        ));
    }
    // Relative programs and patterns resolve against the workspace root;
    // any root gives the same answer for both.
    let target = crate::pattern::Target::new("/probe-root", program);
    let admitted = execute.iter().any(|e| {
        PatternSet::compile(std::slice::from_ref(&e.program), probe)
            .ok()
            .is_some_and(|set| set.matching(&target).is_some())
            && argv.len() > e.args.len()
            && argv[1..=e.args.len()] == e.args[..]
    });
    if admitted {
        Ok(())
    } else {
        Err(format!(
            "`{}` is admitted by no `capabilities.execute` entry: the entry grants nothing",
            argv.join(" ")
        ))
    }
}

/// The kernel's `PID_MAX_LIMIT` on 64-bit hosts: the largest `pids.max`.
const MAX_PIDS: u32 = 4_194_304;

fn limits_from(doc: LimitsDoc) -> Result<Limits, (String, String)> {
    let d = Limits::default();
    let positive = |name: &str, v: u64| {
        if v == 0 {
            Err((
                format!("limits.{name}"),
                "must be greater than zero".to_owned(),
            ))
        } else {
            Ok(v)
        }
    };
    let timeout_seconds = match doc.timeout_seconds {
        Some(t) if t > MAX_TIMEOUT_SECONDS => {
            return Err((
                "limits.timeout_seconds".into(),
                format!("{t} is more than {MAX_TIMEOUT_SECONDS} (one week)"),
            ));
        }
        Some(t) => positive("timeout_seconds", t)?,
        None => d.timeout_seconds,
    };
    let pids = match doc.pids {
        Some(0) => return Err(("limits.pids".into(), "must be greater than zero".into())),
        // pids.max takes no more than the kernel's PID_MAX_LIMIT.
        Some(p) if p > MAX_PIDS => {
            return Err((
                "limits.pids".into(),
                format!("{p} is more than {MAX_PIDS}, the most processes the kernel allows"),
            ));
        }
        Some(p) => p,
        None => d.pids,
    };
    Ok(Limits {
        memory: doc.memory.unwrap_or(d.memory),
        cpu: doc.cpu.unwrap_or(d.cpu),
        pids,
        timeout_seconds,
        disk: doc.disk.unwrap_or(d.disk),
        files: match doc.files {
            Some(f) => positive("files", f)?,
            None => d.files,
        },
        output_bytes: doc.output_bytes.unwrap_or(d.output_bytes),
    })
}

#[cfg(test)]
mod egress_tests {
    use super::*;

    /// Issue 26's manifest contract: names (exact or `*.` wildcard) and
    /// CIDRs, always with a port or range, TCP unless `/udp`; bad entries
    /// refused with what is wrong.
    #[test]
    fn egress_entries_that_grant_nothing_are_refused_naming_the_entry() {
        let load = |egress: &str| {
            Manifest::from_slice(
                format!(
                    r#"{{"capabilities":{{"read":["a/**"]}},"network":"restricted","egress":{egress}}}"#
                )
                .as_bytes(),
                &PackageId::parse("p").unwrap(),
                std::path::PathBuf::from("installed/p/manifest.json"),
            )
        };
        for (egress, field) in [
            (r#"["a.test:443","a.test:443"]"#, "egress[1]"),
            (r#"["a.test:443","A.test:443/tcp"]"#, "egress[1]"),
            (r#"["127.0.0.1:80"]"#, "egress[0]"),
            (r#"["a.test:443","127.0.0.0/8:1-65535"]"#, "egress[1]"),
            (r#"["[::1]:80"]"#, "egress[0]"),
            (r#"["[::ffff:127.0.0.1]:80"]"#, "egress[0]"),
            (r#"["localhost:8080"]"#, "egress[0]"),
            (r#"["*.localhost:8080"]"#, "egress[0]"),
            (r#"["[::ffff:203.0.113.10/128]:443"]"#, "egress[0]"),
            (r#"["[::ffff:0:0/96]:443"]"#, "egress[0]"),
        ] {
            match load(egress) {
                Err(e @ PolicyError::EntryGrantsNothing { .. }) => {
                    assert_eq!(e.field(), Some(field), "{egress}: {e}");
                }
                other => panic!("{egress}: {other:?}"),
            }
        }
        // Not inert: another port or transport, a wider network that holds
        // more than loopback, a name merely containing `localhost`.
        for egress in [
            r#"["a.test:443","a.test:80"]"#,
            r#"["a.test:53","a.test:53/udp"]"#,
            r#"["0.0.0.0/0:443"]"#,
            r#"["localhost.example:443"]"#,
        ] {
            assert!(load(egress).is_ok(), "{egress}");
        }
    }

    #[test]
    fn issue_26_egress_entries_parse_and_bad_ones_are_refused() {
        let e = Egress::parse("pypi.org:443").unwrap();
        assert_eq!(e.host, EgressHost::Name("pypi.org".into()));
        assert_eq!((e.ports, e.transport), ((443, 443), Transport::Tcp));
        let e = Egress::parse("*.files.example.org:443").unwrap();
        assert_eq!(e.host, EgressHost::Wildcard("files.example.org".into()));
        let e = Egress::parse("10.20.0.0/16:50051").unwrap();
        assert_eq!(e.host, EgressHost::Cidr("10.20.0.0".parse().unwrap(), 16));
        let e = Egress::parse("dns.internal:53/udp").unwrap();
        assert_eq!(e.transport, Transport::Udp);
        let e = Egress::parse("[2001:db8::1]:8000-8010").unwrap();
        assert_eq!(e.ports, (8000, 8010));
        let e = Egress::parse("2001:db8::/32:443").unwrap();
        assert_eq!(e.host, EgressHost::Cidr("2001:db8::".parse().unwrap(), 32));
        for bad in [
            "pypi.org",
            "pypi.org:0",
            "pypi.org:70000",
            "*:443",
            "*.:443",
            "a..b:443",
            "10.0.0.0/33:443",
            "pypi.org:500-400",
            ":443",
            "-bad.org:443",
        ] {
            assert!(Egress::parse(bad).is_err(), "{bad} accepted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Manifest, PolicyError> {
        Manifest::from_slice(
            json.as_bytes(),
            &PackageId::parse("hello-agent").unwrap(),
            PathBuf::from("installed/hello-agent/manifest.json"),
        )
    }

    /// A manifest loaded again from the same bytes is the one parsed
    /// before; changed bytes are parsed anew (never a stale manifest), and
    /// a bad file is refused even after a good one of the same path.
    #[test]
    fn issue_29_load_parses_again_only_bytes_it_has_not_seen() {
        let root = tempfile::tempdir().unwrap();
        let id = PackageId::parse("memo").unwrap();
        let path = Manifest::path(root.path(), &id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let with = |exec: &str| format!(r#"{{"capabilities":{{"execute":["{exec}"]}}}}"#);
        let program = |m: &Manifest| m.capabilities.execute[0].program.as_str().to_owned();
        std::fs::write(&path, with("/bin/true")).unwrap();
        let a = Manifest::load(root.path(), &id).unwrap();
        assert_eq!(program(&a), "/bin/true");
        assert_eq!(Manifest::load(root.path(), &id).unwrap(), a);
        std::fs::write(&path, with("/bin/echo")).unwrap();
        assert_eq!(
            program(&Manifest::load(root.path(), &id).unwrap()),
            "/bin/echo"
        );
        std::fs::write(&path, with("/bin/true")).unwrap();
        assert_eq!(Manifest::load(root.path(), &id).unwrap(), a);
        std::fs::write(&path, r#"{"capabilities":{"execute":[""]}}"#).unwrap();
        assert!(Manifest::load(root.path(), &id).is_err());
    }

    #[test]
    fn fr_rt_002_reads_all_four_capability_lists() {
        let m = parse(
            r#"{"package_id":"hello-agent","version":"1.0.0","trust_level":"trusted",
                "capabilities":{"read":["installed/hello-agent/**","registries/*.csv"],
                "write":["output/<session_id>/**"],
                "execute":["/usr/bin/python3","installed/hello-agent/bin/run.sh --fast"],
                "forbidden":["installed/hello-agent/secrets/**","/etc/shadow"]},
                "limits":{"memory":"256Mi","cpu":"500m","pids":64,"timeout_seconds":60,
                          "disk":"1Gi","files":1000,"output_bytes":"1Mi"},
                "network":"allow_egress"}"#,
        )
        .unwrap();
        let c = &m.capabilities;
        assert_eq!(c.read.len(), 2);
        assert_eq!(c.write[0].as_str(), "output/<session_id>/**");
        assert_eq!(
            c.execute[1].program.as_str(),
            "installed/hello-agent/bin/run.sh"
        );
        assert_eq!(c.execute[1].args, vec!["--fast"]);
        assert_eq!(c.forbidden[1].as_str(), "/etc/shadow");
        assert_eq!(m.trust_level, TrustLevel::Trusted);
        assert_eq!(m.network, Network::AllowEgress);
        assert_eq!(m.limits.memory, ByteSize(256 << 20));
        assert_eq!(m.limits.cpu, MilliCpu(500));
        assert_eq!(m.limits.pids, 64);
        assert_eq!(m.limits.files, 1000);
    }

    #[test]
    fn issue_26_a_udp_port_range_too_wide_to_relay_is_refused_naming_the_entry() {
        let ok = parse(
            r#"{"capabilities":{},"network":"restricted",
                "egress":["dns.internal:53/udp","10.0.0.0/8:5000-5062/udp","a.test:1-65535"]}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
        for (egress, entry) in [
            (r#"["a.test:443","q.test:1000-2000/udp"]"#, "egress[1]"),
            (
                r#"["dns.internal:53/udp","10.0.0.0/8:5000-5063/udp"]"#,
                "egress[1]",
            ),
        ] {
            let e = parse(&format!(
                r#"{{"capabilities":{{}},"network":"restricted","egress":{egress}}}"#
            ))
            .unwrap_err();
            assert_eq!(e.code().code, "TS1075", "{e}");
            assert_eq!(e.field(), Some(entry), "{e}");
        }
    }

    #[test]
    fn fr_rt_002_only_capabilities_is_required() {
        let m = parse(r#"{"capabilities":{}}"#).unwrap();
        assert_eq!(m.capabilities, Capabilities::default());
        assert_eq!(m.limits, Limits::default());
        assert_eq!(m.trust_level, TrustLevel::Standard);
        assert_eq!(m.network, Network::Isolated);
        assert!(m.allow_degraded.is_empty());
        let m = parse(r#"{"capabilities":{},"allow_degraded":["landlock"]}"#).unwrap();
        assert_eq!(m.allow_degraded, [DegradableLayer::Landlock]);
        let m = parse(r#"{"capabilities":{},"allow_degraded":["gvisor_netstack"]}"#).unwrap();
        assert_eq!(m.allow_degraded, [DegradableLayer::GvisorNetstack]);
        assert_eq!(m.allow_degraded[0].as_str(), "gvisor_netstack");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{}"#, "(document)", "capabilities"),
            (r#"{"capabilities":{},"extra":1}"#, "extra", "unknown field"),
            (
                r#"{"capabilities":{"reed":[]}}"#,
                "capabilities.reed",
                "unknown field",
            ),
            (
                r#"{"capabilities":{"read":["a/../b"]}}"#,
                "capabilities.read[0]",
                "`..`",
            ),
            (
                r#"{"capabilities":{"write":["/tmp/**"]}}"#,
                "capabilities.write[0]",
                "absolute",
            ),
            (
                r#"{"capabilities":{"execute":[""]}}"#,
                "capabilities.execute[0]",
                "empty",
            ),
            (
                r#"{"capabilities":{},"limits":{"memory":"1GB"}}"#,
                "limits.memory",
                "256Mi",
            ),
            (
                r#"{"capabilities":{},"limits":{"cpu":"1.5"}}"#,
                "limits.cpu",
                "500m",
            ),
            (
                r#"{"capabilities":{},"limits":{"pids":0}}"#,
                "limits.pids",
                "greater than zero",
            ),
            // Values the kernel would refuse when the turn's cgroup is made
            // (red-team, wave 3): refused here, naming the field.
            (
                r#"{"capabilities":{},"limits":{"cpu":"1m"}}"#,
                "limits.cpu",
                "10m",
            ),
            (
                r#"{"capabilities":{},"limits":{"pids":4294967295}}"#,
                "limits.pids",
                "4194304",
            ),
            (
                r#"{"capabilities":{},"trust_level":"root"}"#,
                "trust_level",
                "unknown variant",
            ),
            (
                r#"{"capabilities":{},"package_id":"other"}"#,
                "package_id",
                "does not match",
            ),
            (
                r#"{"capabilities":{},"allow_degraded":["seccomp"]}"#,
                "allow_degraded[0]",
                "unknown variant",
            ),
            (
                r#"{"capabilities":{},"allow_degraded":["landlock","landlock"]}"#,
                "allow_degraded[1]",
                "listed twice",
            ),
        ];
        for (json, field, needle) in cases {
            let err = parse(json).unwrap_err();
            assert_eq!(err.field(), Some(field), "{json}: {err}");
            assert!(err.to_string().contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn reserved_paths_cannot_be_granted_write() {
        for p in [
            "planes/ho1/sessions/<session_id>/ledger/exec.jsonl",
            "**",
            "*/ho1/**",
            "installed/hello-agent/*",
        ] {
            let err = parse(&format!(r#"{{"capabilities":{{"write":["{p}"]}}}}"#)).unwrap_err();
            assert!(
                matches!(err, PolicyError::ReservedWrite { .. }),
                "{p}: {err}"
            );
            assert_eq!(err.code().code, "E2042");
            assert!(err.to_string().contains(p), "{err}");
        }
    }

    /// A manifest with every field present, so every object position occurs.
    const FULL: &str = r#"{"package_id":"hello-agent","version":"1.0.0","trust_level":"trusted",
        "capabilities":{"read":["installed/hello-agent/**"],"write":["output/<session_id>/**"],
        "execute":["/usr/bin/python3"],"forbidden":["installed/hello-agent/secrets/**"]},
        "limits":{"memory":"256Mi","cpu":"500m","pids":64,"timeout_seconds":60,
                  "disk":"1Gi","files":1000,"output_bytes":"1Mi"},
        "network":"isolated"}"#;

    #[test]
    fn every_object_position_refuses_an_array_or_any_non_object() {
        let full: serde_json::Value = serde_json::from_str(FULL).unwrap();
        parse(FULL).unwrap();
        // The attack: an object written as the array of its values (which
        // serde's derive would read as the fields in order), and every other
        // JSON type.
        let mut positions = std::collections::BTreeSet::new();
        for replace in crate::strict::test_support::non_objects() {
            for (field, doc) in crate::strict::test_support::each_object_replaced(&full, &*replace)
            {
                positions.insert(field.clone());
                let err = parse(&doc.to_string()).unwrap_err();
                assert_eq!(err.field(), Some(field.as_str()), "{doc}: {err}");
                assert_eq!(err.code().code, "TS1002", "{doc}: {err}");
                assert!(err.to_string().contains("JSON object"), "{doc}: {err}");
            }
        }
        assert_eq!(
            positions.into_iter().collect::<Vec<_>>(),
            ["(document)", "capabilities", "limits"]
        );
    }

    #[test]
    fn issue_8_capabilities_as_arrays_grant_nothing_and_are_refused() {
        let err = parse(r#"{"capabilities":[["**"],["output/<session_id>/**"],["/bin/sh"]]}"#)
            .unwrap_err();
        assert_eq!(err.field(), Some("capabilities"), "{err}");
    }

    #[test]
    fn issue_8_ten_thousand_complex_globs_are_refused_naming_the_list_and_limit() {
        let read: Vec<String> = (0..10_000)
            .map(|i| format!("data/{{a{i},b{i},c{i}}}/**/[a-z]*{i}?x/*.{{csv,txt,json}}"))
            .collect();
        let json = serde_json::json!({"capabilities": {"read": read}}).to_string();
        let err = parse(&json).unwrap_err();
        assert_eq!(err.field(), Some("capabilities.read"), "{err}");
        assert!(err.to_string().contains("at most 1024"), "{err}");
    }

    #[test]
    fn package_ids_are_plain_names() {
        for bad in ["", "..", ".hidden", "a/b", "a b", "-x", &"x".repeat(65)] {
            assert!(PackageId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(PackageId::parse("hello-agent_2.0").is_ok());
    }
}
