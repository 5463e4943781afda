//! Egress by name for `restricted` and `allow_egress` turns (issue 26),
//! with nothing changed on the host: every piece lives in the turn's own
//! network namespace and dies with it.
//!
//! - Routes: every address is local in the turn's namespace (`local
//!   0.0.0.0/0` and `local ::/0` on `lo`), so nothing leaves it by itself.
//! - A resolver on 127.0.0.53:53 (UDP and TCP; the turn's
//!   `/etc/resolv.conf`) created by the supervisor inside the namespace: an
//!   allowed name gets a synthetic address of its own from 127.64.0.0/10,
//!   any other name NXDOMAIN — never forwarded upstream (no exfiltration
//!   through DNS).
//! - nftables in the namespace: TCP to a synthetic address, to a CIDR entry
//!   (and under `allow_egress` to any public address) is redirected to the
//!   supervisor's listener; any other connect or datagram is refused at
//!   once (ECONNREFUSED, EPERM) and counted per destination in a set.
//! - The listener reads the original destination, maps a synthetic address
//!   back to its name, checks name and port (and the TLS server name or
//!   HTTP Host on 443/80), resolves the name itself, refuses private,
//!   loopback and link-local answers (DNS rebinding) unless listed, connects
//!   from the supervisor's namespace and splices, counting bytes. On port
//!   80 (and 443 when they begin as cleartext HTTP) the client's bytes go
//!   through [`http::Guard`]: every later request
//!   (keep-alive, pipelined, each h2c stream) is checked too.
//! - UDP for `/udp` entries: a relay in the namespace ([`udp`]) sees each
//!   datagram's original destination with `IP_PKTINFO`, decides it as the
//!   proxy decides a connection, relays it and answers from the address
//!   the turn sent to.
//!
//! Every flow, allowed or denied, becomes a [`Flow`] of the evidence.
//!
//! runsc (gVisor): its netstack (`--network=sandbox`) has its own loopback
//! and takes the namespace's interfaces over, so nothing it sends meets
//! this namespace's loopback or nftables. A runsc turn with egress runs on
//! hostinet instead (`--network=host`, the sandbox in the spec's own new
//! network namespace, set up here exactly as for runc): the sentry's
//! sockets are host-kernel sockets in that namespace. That gives up a
//! layer of gVisor's isolation (the host kernel's network stack is
//! reachable through the sentry), so the turn is refused (TS1070) unless
//! the manifest's `allow_degraded` lists `gvisor_netstack`, and the
//! evidence records the degradation. Why not a router namespace (veth to
//! a per-turn namespace holding the resolver, a prerouting redirect and
//! non-loopback synthetic addresses), which keeps the netstack: measured
//! on these hosts, it carries the traffic, but this runsc (2022-12)
//! refuses `--network=sandbox` in every namespace on kernels ≥ 6 ("cannot
//! run with network enabled in root network namespace": it tests for
//! `/proc/sys/net/core/rmem_default`, which every namespace has now); it
//! ran only with /proc/sys/net hidden from runsc in a private mount
//! namespace — a workaround of a runtime bug, left for a newer runsc.

mod counts;
pub mod dns;
mod http;
pub mod inspect;
mod nfbatch;
mod rtnl;
mod syntax;
mod udp;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnstile_policy::manifest::{Egress, EgressHost, MAX_UDP_PORTS, Network, Transport};

/// The synthetic range names are given addresses from.
const SYNTHETIC: (Ipv4Addr, u8) = (Ipv4Addr::new(127, 64, 0, 0), 10);
/// Distinct flows kept per turn; more are counted in one record.
pub const MAX_FLOWS: usize = 1024;
/// The proxy's port on the turn's loopback (127.0.0.1 and ::1): below
/// 1024, so the turn (no capabilities) could never have bound it.
const PROXY_PORT: u16 = 1;
/// Distinct names given an address per turn.
const MAX_NAMES: u32 = 65_000;
const NFT_TABLE: &str = "turnstile";
/// The ruleset's sets of refused destinations and its counter of the rest
/// (see [`ruleset`]), read at the turn's end by [`counts`].
const NFT_SETS: [&str; 4] = ["tcp4", "tcp6", "udp4", "udp6"];
const NFT_OTHER: &str = "refused_other";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PEEK_WAIT: Duration = Duration::from_millis(1500);
/// Connections (resolver and proxy) handled at once per turn.
const MAX_ACTIVE: usize = 512;
/// How long an upstream answer is reused within a turn.
const CACHE_TTL: Duration = Duration::from_secs(30);
/// Upstream lookups (of names not in the cache) a turn may start: this
/// many at once, then this many per second. The upstream resolver is the
/// host's, shared by every turn and the host itself: a turn asking it for
/// random names (unlisted ones under `allow_egress`, a wildcard's under
/// `restricted`) drove 12,000 queries a second into it (red-team wave 4,
/// W7). Beyond the budget the resolver answers SERVFAIL and a connection
/// is refused, recorded.
const LOOKUP_BURST: f64 = 100.0;
const LOOKUP_RATE: f64 = 25.0;

/// Why an upstream lookup gave no address.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LookupError {
    /// The turn's lookup budget is spent for now.
    Budget,
    /// The upstream said so, or did not answer.
    Failed(String),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Budget => write!(
                f,
                "more than {LOOKUP_RATE} upstream lookups a second (after {LOOKUP_BURST}): the host's resolver is shared"
            ),
            Self::Failed(why) => f.write_str(why),
        }
    }
}

/// A token bucket of upstream lookups.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new() -> Self {
        Self {
            tokens: LOOKUP_BURST,
            at: Instant::now(),
        }
    }

    /// Takes one lookup, if the budget has one.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * LOOKUP_RATE)
            .min(LOOKUP_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What a turn can send the supervisor's egress, parsed as the egress
/// parses it (the `egress` fuzz target): a DNS query (and, with the same
/// bytes, an upstream answer), the first bytes of a connection (a TLS
/// ClientHello's server name, an HTTP Host), and a cleartext port-80
/// stream fed in two pieces through its guard; and, as the kernel's
/// answers, the nfnetlink parser of [`counts`]. Panics if the guard passes
/// a byte that was not sent, or out of order. `true` when some parser
/// accepted the input.
#[doc(hidden)]
pub fn fuzz_one(b: &[u8]) -> bool {
    let query = dns::parse_query(b).is_some();
    let _ = dns::formerr(b);
    let id = u16::from_be_bytes([
        b.first().copied().unwrap_or(0),
        b.get(1).copied().unwrap_or(0),
    ]);
    let _ = dns::parse_response(b, id);
    let _ = inspect::first_bytes(b);
    let _ = inspect::sni(b);
    let _ = counts::fuzz_one(b);
    let split = usize::from(b.get(2).copied().unwrap_or(0)) % (b.len() + 1);
    let (first, second) = b.split_at(split);
    let mut guard = http::Guard::new("good.test");
    let mut passed = Vec::new();
    let mut accepted = true;
    for piece in [first, second] {
        match guard.feed(piece) {
            Ok(out) => passed.extend(out),
            Err(_) => {
                accepted = false;
                break;
            }
        }
    }
    if accepted {
        match guard.finish() {
            Ok(out) => passed.extend(out),
            Err(_) => accepted = false,
        }
    }
    assert!(
        b.starts_with(&passed),
        "the port-80 guard passed bytes that were not sent"
    );
    query | accepted
}

/// Egress entries this release cannot enforce: `Err(why)` refuses the turn.
/// `/udp` entries are relayed port by port (see [`udp`]): at most
/// [`MAX_UDP_PORTS`] ports together (the manifest refuses more at load,
/// TS1075; this is the same bound, checked again for the runtime).
pub fn supported(entries: &[Egress]) -> Result<(), String> {
    let mut ports = std::collections::BTreeSet::new();
    for e in entries.iter().filter(|e| e.transport == Transport::Udp) {
        if usize::from(e.ports.1 - e.ports.0) >= MAX_UDP_PORTS || {
            ports.extend(e.ports.0..=e.ports.1);
            ports.len() > MAX_UDP_PORTS
        } {
            return Err(format!(
                "egress entry `{}`: UDP egress is relayed port by port, at most {MAX_UDP_PORTS} ports together",
                e.raw
            ));
        }
    }
    Ok(())
}

/// What this host lacks for egress by name (nftables in the kernel), or
/// `Ok`: a `NETLINK_NETFILTER` socket, and the ruleset generation over it
/// (`NFT_MSG_GETGEN`: read-only, and the kernel loads nf_tables for it
/// where it is a module). Asked until it answers once, then known for the
/// process's life (a kernel does not lose nf_tables).
pub fn host_support() -> Result<(), String> {
    static ANSWERED: AtomicBool = AtomicBool::new(false);
    if ANSWERED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let sock = nfbatch::socket().map_err(|e| {
        format!("the kernel has no nftables netlink ({e}): egress by name needs nftables in the turn's network namespace")
    })?;
    counts::Reader::new(sock).generation().map_err(|e| {
        format!("the kernel's nftables does not answer ({e}): egress by name needs nftables in the turn's network namespace")
    })?;
    ANSWERED.store(true, Ordering::Relaxed);
    Ok(())
}

/// A turn's egress policy.
#[derive(Debug, Clone)]
pub struct Policy {
    network: Network,
    entries: Vec<Egress>,
    /// The host's own addresses (never reachable under `allow_egress`
    /// unless listed).
    host: Vec<IpAddr>,
}

fn wildcard_match(suffix: &str, name: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

fn cidr_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

/// A range of addresses that are not public: (network, prefix length,
/// why, whether a listed name may resolve into it). A listed name may
/// reach a private service named on purpose (`dns.internal:53/udp`);
/// never loopback, link-local (cloud metadata) or "this network", which
/// only a CIDR entry can open (and loopback not even that: see
/// [`ruleset`]).
type Range = (&'static str, u8, &'static str, bool);

const NOT_PUBLIC_V4: &[Range] = &[
    (
        "0.0.0.0",
        8,
        "an unspecified (\"this network\") address",
        false,
    ),
    ("10.0.0.0", 8, "a private address", true),
    ("100.64.0.0", 10, "a carrier-grade NAT address", true),
    ("127.0.0.0", 8, "a loopback address", false),
    (
        "169.254.0.0",
        16,
        "a link-local address (cloud metadata)",
        false,
    ),
    ("172.16.0.0", 12, "a private address", true),
    ("192.0.0.0", 24, "an IETF protocol address", true),
    ("192.168.0.0", 16, "a private address", true),
    ("198.18.0.0", 15, "a benchmarking address", true),
    ("224.0.0.0", 4, "a multicast address", true),
    ("240.0.0.0", 4, "a reserved address", true),
];

const NOT_PUBLIC_V6: &[Range] = &[
    ("::", 128, "the unspecified address", false),
    ("::1", 128, "a loopback address", false),
    ("fc00::", 7, "a unique local (ULA) address", true),
    ("fe80::", 10, "a link-local address", false),
    // Deprecated (RFC 3879) but still routed on legacy internal networks.
    ("fec0::", 10, "a site-local address", true),
    ("ff00::", 8, "a multicast address", true),
    ("100::", 64, "a discard-only address", true),
    ("2001::", 32, "a Teredo tunnelling address", true),
    // Local-use NAT64 (RFC 8215): operators split it into /48../96
    // prefixes, and where a translated address carries its IPv4 address
    // depends on that length (RFC 6052), unknown here: the metadata
    // address can hide in one that reads as public in its last 32 bits
    // (red-team stop 60). Only a CIDR entry opens it.
    (
        "64:ff9b:1::",
        48,
        "a local-use NAT64 address (the IPv4 address it carries is not known)",
        false,
    ),
    ("2001:2::", 48, "a benchmarking address", true),
    ("2001:10::", 28, "an ORCHID address", true),
];

/// The non-public range `ip` is in, if any. An IPv4 address carried in an
/// IPv6 one is judged as that IPv4 address.
fn non_public(ip: IpAddr) -> Option<&'static Range> {
    if let IpAddr::V6(a) = ip {
        if let Some(v4) = a.to_ipv4_mapped() {
            return non_public(IpAddr::V4(v4));
        }
        // An IPv4 address carried inside an IPv6 one reaches that IPv4
        // host through a translator or tunnel (NAT64 64:ff9b::/96 and
        // 64:ff9b:1::/48, SIIT ::ffff:0:0/96, IPv4-compatible ::/96, 6to4
        // 2002::/16): it is as public as the address it carries.
        if let Some(r) = embedded_v4(a).and_then(|v4| non_public(IpAddr::V4(v4))) {
            return Some(r);
        }
    }
    let table = if ip.is_ipv4() {
        NOT_PUBLIC_V4
    } else {
        NOT_PUBLIC_V6
    };
    table
        .iter()
        .find(|(net, len, ..)| cidr_contains(net.parse().unwrap_or(ip), *len, ip))
}

/// Why `ip` is not a public address, if it is not one.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    non_public(ip).map(|(_, _, why, _)| *why)
}

/// The IPv4 address an IPv6 address of a translation or tunnelling
/// prefix carries (IPv4-mapped addresses are handled by their caller).
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // NAT64, well-known (RFC 6052) and local-use (RFC 8215) prefixes.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 1, ..] => Some(low),
        // SIIT IPv4-translated (RFC 2765).
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(low),
        // IPv4-compatible (deprecated), not `::` or `::1`.
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 || lo > 1 => Some(low),
        // 6to4 (RFC 3056): 2002:AABB:CCDD::/48.
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// A decision: the entry or rule that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed(String),
    Denied { rule: String, hint: Option<String> },
}

impl Policy {
    pub fn new(network: Network, raw: &[String], host: Vec<IpAddr>) -> Result<Self, String> {
        let entries = raw
            .iter()
            .map(|r| Egress::parse(r).map_err(|e| format!("egress entry `{r}`: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        supported(&entries)?;
        Ok(Self {
            network,
            entries,
            host,
        })
    }

    fn of(&self, t: Transport) -> impl Iterator<Item = &Egress> {
        self.entries.iter().filter(move |e| e.transport == t)
    }

    fn tcp(&self) -> impl Iterator<Item = &Egress> {
        self.of(Transport::Tcp)
    }

    /// The entry listing `name` (on `port`, when given).
    fn name_entry(&self, name: &str, port: Option<u16>) -> Option<&Egress> {
        self.name_entry_on(Transport::Tcp, name, port)
    }

    /// The `t` entry listing `name` (on `port`, when given).
    fn name_entry_on(&self, t: Transport, name: &str, port: Option<u16>) -> Option<&Egress> {
        self.of(t).find(|e| {
            let host = match &e.host {
                EgressHost::Name(n) => n == name,
                EgressHost::Wildcard(s) => wildcard_match(s, name),
                EgressHost::Cidr(..) => false,
            };
            host && port.is_none_or(|p| (e.ports.0..=e.ports.1).contains(&p))
        })
    }

    fn cidr_entry(&self, ip: IpAddr, port: u16) -> Option<&Egress> {
        self.cidr_entry_on(Transport::Tcp, ip, port)
    }

    fn cidr_entry_on(&self, t: Transport, ip: IpAddr, port: u16) -> Option<&Egress> {
        self.of(t).find(|e| {
            matches!(e.host, EgressHost::Cidr(net, len) if cidr_contains(net, len, ip))
                && (e.ports.0..=e.ports.1).contains(&port)
        })
    }

    /// Every port a `/udp` entry names (each relayed by a socket of its
    /// own), and whether an IPv6 network is among them.
    pub fn udp_ports(&self) -> (std::collections::BTreeSet<u16>, bool) {
        let ports = self.of(Transport::Udp).flat_map(|e| e.ports.0..=e.ports.1);
        let v6 = self
            .of(Transport::Udp)
            .any(|e| matches!(e.host, EgressHost::Cidr(IpAddr::V6(_), _)));
        (ports.collect(), v6)
    }

    /// A datagram to `name:port` (a synthetic address's name).
    pub fn decide_udp_name(&self, name: &str, port: u16) -> Decision {
        match self.name_entry_on(Transport::Udp, name, Some(port)) {
            Some(e) => Decision::Allowed(e.raw.clone()),
            None => Decision::Denied {
                rule: format!("no UDP egress entry lists {name} port {port}"),
                hint: Some(format!("{name}:{port}/udp")),
            },
        }
    }

    /// A datagram to the literal address `ip:port`: only a `/udp` CIDR
    /// entry allows it (under `allow_egress` too: UDP is relayed only
    /// where an entry lists it).
    pub fn decide_udp_ip(&self, ip: IpAddr, port: u16) -> Decision {
        match self.cidr_entry_on(Transport::Udp, ip, port) {
            Some(e) => Decision::Allowed(e.raw.clone()),
            None => Decision::Denied {
                rule: format!("no UDP egress entry covers {ip} port {port}"),
                hint: cidr_hint(ip, port, "/udp"),
            },
        }
    }

    /// Whether the resolver answers `name` (with a synthetic address).
    pub fn resolves(&self, name: &str) -> bool {
        match self.network {
            Network::Restricted => {
                self.name_entry(name, None).is_some()
                    || self.name_entry_on(Transport::Udp, name, None).is_some()
            }
            _ => !name.is_empty(),
        }
    }

    /// A connection to the literal address `ip:port`.
    pub fn decide_ip(&self, ip: IpAddr, port: u16) -> Decision {
        if let Some(e) = self.cidr_entry(ip, port) {
            return Decision::Allowed(e.raw.clone());
        }
        let hint = cidr_hint(ip, port, "");
        if is_loopback(ip) {
            // Only the proxy's own port on the turn's loopback gets here.
            return Decision::Denied {
                rule: format!(
                    "{ip} port {port} is the supervisor's proxy on the turn's loopback, \
                     which no egress entry opens: connect to a listed name or address"
                ),
                hint: None,
            };
        }
        match self.network {
            Network::AllowEgress => match self.special(ip) {
                Some(why) => Decision::Denied {
                    rule: format!("allow_egress: {ip} is {why}"),
                    hint,
                },
                None => Decision::Allowed("allow_egress: a public address".into()),
            },
            _ => Decision::Denied {
                rule: format!("restricted: no egress entry covers {ip} port {port}"),
                hint,
            },
        }
    }

    fn special(&self, ip: IpAddr) -> Option<&'static str> {
        self.own(ip).or_else(|| not_public(ip))
    }

    /// Whether `ip` is one of the host's own addresses (the supervisor
    /// connects from the host's namespace, so such an address reaches the
    /// host's own services), also when an IPv6 address carries it: an
    /// address of its interfaces, or any the kernel delivers to the host
    /// itself ([`rtnl::delivered_here`]: a `local` route's whole range, an
    /// anycast address; red-team wave 4, W3). Must be called in the
    /// supervisor's namespace (the proxy's and relay's threads are).
    fn own(&self, ip: IpAddr) -> Option<&'static str> {
        let carried = match ip {
            IpAddr::V6(a) => a
                .to_ipv4_mapped()
                .or_else(|| embedded_v4(a))
                .map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let listed = |a: IpAddr| self.host.contains(&a);
        // A lookup that fails is taken for local: refused (fail closed).
        let local = |a: IpAddr| rtnl::delivered_here(a).unwrap_or(true);
        let own =
            listed(ip) || carried.is_some_and(listed) || local(ip) || carried.is_some_and(local);
        own.then_some("one of the host's own addresses")
    }

    /// A connection to `name:port`.
    pub fn decide_name(&self, name: &str, port: u16) -> Decision {
        match self.name_entry(name, Some(port)) {
            Some(e) => Decision::Allowed(e.raw.clone()),
            None if self.network == Network::AllowEgress => {
                Decision::Allowed("allow_egress: any public name".into())
            }
            None => Decision::Denied {
                rule: format!("restricted: no egress entry lists {name} port {port}"),
                hint: Some(format!("{name}:{port}")),
            },
        }
    }

    /// Whether `name` (allowed by `rule`) may be reached at `ip`, the
    /// upstream resolver's answer (DNS rebinding): never the host's own
    /// addresses, loopback, link-local or unspecified through a name; a
    /// private, CGNAT, ULA (…) address only through a name the policy
    /// lists (under `allow_egress` an unlisted name gets public addresses
    /// only) — unless a CIDR entry lists the address.
    fn address_ok(&self, name_listed: bool, ip: IpAddr, port: u16) -> Result<(), String> {
        self.address_ok_on(Transport::Tcp, name_listed, ip, port)
    }

    /// Whether a name `egress` does not list could reach `ip` at all, on
    /// some port of some transport ([`Policy::address_ok_on`] for every
    /// port): a public address not the host's own, or one a CIDR entry
    /// lists.
    fn reachable_unlisted(&self, ip: IpAddr) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.host, EgressHost::Cidr(net, len) if cidr_contains(net, len, ip)))
            || (self.own(ip).is_none() && non_public(ip).is_none())
    }

    /// [`Policy::address_ok`] for transport `t` (its CIDR entries).
    fn address_ok_on(
        &self,
        t: Transport,
        name_listed: bool,
        ip: IpAddr,
        port: u16,
    ) -> Result<(), String> {
        if self.cidr_entry_on(t, ip, port).is_some() {
            return Ok(());
        }
        if let Some(why) = self.own(ip) {
            return Err(format!("{ip} is {why}"));
        }
        match non_public(ip) {
            None => Ok(()),
            Some((_, _, _, by_name)) if *by_name && name_listed => Ok(()),
            Some((_, _, why, _)) => Err(format!("{ip} is {why}")),
        }
    }
}

/// The CIDR entry that would open `ip:port` (`suffix`: `/udp` or none),
/// when one can: none for loopback — the ruleset returns loopback before
/// any CIDR redirect (the turn's loopback is its own), so such an entry
/// would never take effect.
///
/// Nor for what a listed name may never resolve into — "this network",
/// link-local (the cloud metadata address), the broadcast address: a CIDR
/// entry could open those, but a refusal's hint must not advise it
/// (red-team, stop 55: "add `169.254.169.254/32:80`").
fn cidr_hint(ip: IpAddr, port: u16, suffix: &str) -> Option<String> {
    let v4 = match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    };
    let never_advised = v4.is_some_and(|a| a.is_broadcast())
        || non_public(ip).is_some_and(|(_, _, _, names_may)| !names_may);
    (!is_loopback(ip) && !never_advised).then(|| format!("{}:{port}{suffix}", host_entry(ip)))
}

/// A loopback address, IPv4-mapped ones included.
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

fn host_entry(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("[{a}/128]"),
    }
}

/// One flow of the turn, as the evidence records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub name: Option<String>,
    pub address: String,
    pub port: u16,
    /// `tcp`, `udp` or `dns`.
    pub protocol: &'static str,
    pub allowed: bool,
    /// The manifest entry or the rule that decided.
    pub decided_by: String,
    /// For a denied flow: the `egress` entry that would allow it.
    pub hint: Option<String>,
    pub count: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// `None` when only counted (the kernel's refusals).
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    /// An allowed flow that failed upstream, with why.
    pub error: Option<String>,
}

type FlowKey = (Option<String>, String, u16, &'static str, bool, String);

#[derive(Debug, Default)]
struct Flows {
    map: BTreeMap<FlowKey, Flow>,
    /// Flows not kept (beyond [`MAX_FLOWS`]).
    dropped: u64,
}

impl Flows {
    fn add(&mut self, f: Flow) {
        let key = (
            f.name.clone(),
            f.address.clone(),
            f.port,
            f.protocol,
            f.allowed,
            f.decided_by.clone(),
        );
        if let Some(have) = self.map.get_mut(&key) {
            have.count += f.count;
            have.bytes_out += f.bytes_out;
            have.bytes_in += f.bytes_in;
            have.first = match (have.first, f.first) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            have.last = have.last.max(f.last);
            if f.error.is_some() {
                have.error = f.error;
            }
        } else if self.map.len() < MAX_FLOWS {
            self.map.insert(key, f);
        } else {
            self.dropped += f.count;
        }
    }
}

/// Names given synthetic addresses.
#[derive(Debug, Default)]
struct Names {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    next: u32,
}

impl Names {
    fn address(&mut self, name: &str) -> Option<Ipv4Addr> {
        if let Some(a) = self.by_name.get(name) {
            return Some(*a);
        }
        if self.next >= MAX_NAMES {
            return None;
        }
        self.next += 1;
        let a = Ipv4Addr::from(u32::from(SYNTHETIC.0) + self.next);
        self.by_name.insert(name.to_owned(), a);
        self.by_addr.insert(a, name.to_owned());
        Some(a)
    }
}

fn synthetic(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) if cidr_contains(IpAddr::V4(SYNTHETIC.0), SYNTHETIC.1, ip) => Some(a),
        _ => None,
    }
}

/// What the resolver and the proxy share.
#[derive(Debug)]
struct Shared {
    policy: Policy,
    names: Mutex<Names>,
    flows: Mutex<Flows>,
    upstream: Option<SocketAddr>,
    /// Upstream answers, per name, for [`CACHE_TTL`] (every connection is
    /// checked against them as against a fresh answer).
    cache: Mutex<HashMap<String, (Instant, Vec<IpAddr>)>>,
    /// The turn's budget of upstream lookups.
    lookups: Mutex<Bucket>,
    stop: AtomicBool,
    /// Readable once the egress stops (a byte is written and never read):
    /// wakes every thread waiting in poll.
    wake: (OwnedFd, OwnedFd),
    active: AtomicUsize,
    /// The sockets of every connection being spliced (client and upstream
    /// clones), by connection number: [`Running::finish`] shuts them down,
    /// so no connection outlives the turn and every flow is recorded.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
    next_conn: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// Waits until `fd` is readable; `false` once the egress stops.
    fn wait(&self, fd: std::os::fd::BorrowedFd<'_>) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            let mut fds = [
                PollFd::new(fd, PollFlags::POLLIN),
                PollFd::new(self.wake.0.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {
                    if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                        return false;
                    }
                    if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                        return true;
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.wake.1, b"x");
    }
}

impl Shared {
    /// `name`'s upstream addresses, from the cache when fresh; a lookup
    /// upstream within the turn's budget ([`LOOKUP_RATE`]).
    fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        if let Some((at, addrs)) = self.cache.lock().ok().and_then(|c| c.get(name).cloned()) {
            if at.elapsed() < CACHE_TTL {
                return Ok(addrs);
            }
        }
        if !self.lookups.lock().is_ok_and(|mut b| b.take()) {
            return Err(LookupError::Budget);
        }
        let addrs = resolve(self.upstream, name).map_err(LookupError::Failed)?;
        if let Ok(mut c) = self.cache.lock() {
            if c.len() < 4096 {
                c.insert(name.to_owned(), (Instant::now(), addrs.clone()));
            }
        }
        Ok(addrs)
    }

    fn record(&self, f: Flow) {
        if let Ok(mut flows) = self.flows.lock() {
            flows.add(f);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn flow(
        &self,
        name: Option<&str>,
        address: String,
        port: u16,
        protocol: &'static str,
        decision: &Decision,
        at: Instant,
    ) -> Flow {
        let (allowed, decided_by, hint) = match decision {
            Decision::Allowed(by) => (true, by.clone(), None),
            Decision::Denied { rule, hint } => (false, rule.clone(), hint.clone()),
        };
        Flow {
            name: name.map(str::to_owned),
            address,
            port,
            protocol,
            allowed,
            decided_by,
            hint,
            count: 1,
            bytes_out: 0,
            bytes_in: 0,
            first: Some(at),
            last: Some(Instant::now()),
            error: None,
        }
    }
}

/// The upstream resolver: `TURNSTILE_DNS_UPSTREAM` (`ADDR:PORT`), else the
/// first `nameserver` of the host's `/etc/resolv.conf`.
fn upstream() -> Option<SocketAddr> {
    if let Ok(v) = std::env::var("TURNSTILE_DNS_UPSTREAM") {
        return v.parse().ok();
    }
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
}

/// Resolves `name` through the upstream resolver (A and AAAA).
fn resolve(upstream: Option<SocketAddr>, name: &str) -> Result<Vec<IpAddr>, String> {
    // Only a name whose text is the name asked (the policy matched that
    // text): never a shorter one (red-team wave 4, W1).
    if !dns::host_name(name) {
        return Err(format!("`{name}` is not a host name"));
    }
    let server = upstream.ok_or("no upstream resolver is configured")?;
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().unwrap_or(server)
    } else {
        "[::]:0".parse().unwrap_or(server)
    };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("resolver socket: {e}"))?;
    sock.connect(server)
        .map_err(|e| format!("upstream resolver {server}: {e}"))?;
    let mut out = Vec::new();
    let mut nx = false;
    let mut id_seed = 0u16;
    let mut buf = [0u8; 1500];
    for qtype in [dns::TYPE_A, dns::TYPE_AAAA] {
        use turnstile_policy::session::RandomSource;
        let id = crate::ids::OsRandom.next_u64().unwrap_or(0) as u16 ^ id_seed;
        id_seed = id_seed.wrapping_add(1);
        let q = dns::build_query(id, name, qtype);
        sock.send(&q)
            .map_err(|e| format!("upstream resolver {server}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("upstream resolver {server} did not answer"));
            }
            let _ = sock.set_read_timeout(Some(left));
            match sock.recv(&mut buf) {
                Ok(n) => {
                    if let Some((rcode, addrs)) = dns::parse_response(&buf[..n], id) {
                        nx |= rcode == dns::RCODE_NXDOMAIN;
                        out.extend(addrs);
                        break;
                    }
                }
                Err(e) => return Err(format!("upstream resolver {server}: {e}")),
            }
        }
    }
    if out.is_empty() {
        return Err(if nx {
            format!("{name} does not exist (NXDOMAIN upstream)")
        } else {
            format!("{name} has no address upstream")
        });
    }
    Ok(out)
}

/// Runs `f` on a short-lived thread inside the network namespace `ns`
/// (sockets created there stay in it).
fn in_netns<T: Send + 'static>(
    ns: &OwnedFd,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::spawn(move || {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("network namespace thread panicked"))?
}

/// The nftables ruleset of a turn whose proxy listens on `port`: loaded
/// as one netlink batch ([`nfbatch`]), its nft text in error messages and
/// tests.
fn ruleset(policy: &Policy, port: u16) -> nfbatch::Table {
    use nfbatch::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, Rule};
    let (sn, sl) = SYNTHETIC;
    let synthetic = || Rule::new().daddr(IpAddr::V4(sn), sl);
    let v4_loopback = || Rule::new().daddr(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8);
    let v6_loopback = || Rule::new().daddr(IpAddr::V6(Ipv6Addr::LOCALHOST), 128);
    let mut nat = vec![
        synthetic().l4proto(IPPROTO_TCP).redirect(port),
        v4_loopback().ret(),
        v6_loopback().ret(),
    ];
    for e in policy.tcp() {
        if let EgressHost::Cidr(net, len) = e.host {
            nat.push(
                Rule::new()
                    .daddr(net, len)
                    .dport(IPPROTO_TCP, e.ports)
                    .redirect(port),
            );
        }
    }
    if policy.network == Network::AllowEgress {
        // Anything public; the rest is refused below (the host's own
        // addresses are refused by the proxy, and so are IPv4 addresses
        // carried in IPv6 ones, judged by the address they carry): the
        // non-public ranges are the proxy's own list ([`not_public`]).
        let ranges = NOT_PUBLIC_V4.iter().chain(NOT_PUBLIC_V6);
        let private = ranges
            .filter_map(|(net, len, ..)| Some((net.parse::<IpAddr>().ok()?, *len)))
            .chain([(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0).into(), 96)]);
        nat.extend(private.map(|(net, len)| Rule::new().daddr(net, len).ret()));
        nat.push(Rule::new().l4proto(IPPROTO_TCP).redirect(port));
    }
    // UDP the relay serves (see [`udp`]): to a synthetic address on a
    // port some `/udp` name entry lists, to a `/udp` network on its ports;
    // the relay's own datagrams (replies, refusals) carry its mark.
    let mut filter = vec![Rule::new().mark(udp::MARK).accept()];
    let name_ports: std::collections::BTreeSet<(u16, u16)> = policy
        .of(Transport::Udp)
        .filter(|e| !matches!(e.host, EgressHost::Cidr(..)))
        .map(|e| e.ports)
        .collect();
    for ports in name_ports {
        filter.push(synthetic().dport(IPPROTO_UDP, ports).accept());
    }
    for e in policy.of(Transport::Udp) {
        if let EgressHost::Cidr(net, len) = e.host {
            filter.push(
                Rule::new()
                    .daddr(net, len)
                    .dport(IPPROTO_UDP, e.ports)
                    .accept(),
            );
        }
    }
    filter.extend([
        synthetic()
            .l4proto(IPPROTO_UDP)
            .add_flow("udp4", false, IPPROTO_UDP)
            .reject(),
        v4_loopback().accept(),
        v6_loopback().accept(),
        Rule::new().ct_dnat().accept(),
        Rule::new().l4proto(IPPROTO_ICMP).accept(),
        Rule::new().l4proto(IPPROTO_ICMPV6).accept(),
        Rule::new().not_a_first_syn().accept(),
    ]);
    for (set, v6, proto) in [
        ("tcp4", false, IPPROTO_TCP),
        ("tcp6", true, IPPROTO_TCP),
        ("udp4", false, IPPROTO_UDP),
        ("udp6", true, IPPROTO_UDP),
    ] {
        let r = Rule::new()
            .nfproto(v6)
            .l4proto(proto)
            .add_flow(set, v6, proto);
        filter.push(if proto == IPPROTO_TCP {
            r.reset()
        } else {
            r.reject()
        });
    }
    filter.push(Rule::new().count(NFT_OTHER).reject());
    nfbatch::Table {
        name: NFT_TABLE.into(),
        sets: NFT_SETS
            .iter()
            .map(|s| ((*s).to_owned(), s.ends_with('6'), MAX_FLOWS as u32))
            .collect(),
        counters: vec![NFT_OTHER.into()],
        chains: vec![
            nfbatch::Chain {
                name: "nat_out".into(),
                kind: "nat",
                priority: -100,
                rules: nat,
            },
            nfbatch::Chain {
                name: "filter_out".into(),
                kind: "filter",
                priority: 0,
                rules: filter,
            },
        ],
    }
}

/// A turn's egress, running: its resolver and proxy threads, and the
/// namespace they serve.
#[derive(Debug)]
pub struct Running {
    /// The namespace's nftables, read at the turn's end.
    counts: counts::Reader,
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Where the setup's time went: (phase, µs).
    pub phases: Vec<(&'static str, u64)>,
}

/// Sets up egress in the network namespace `ns` (a fresh one, the turn's)
/// for `plan`; the turn is refused if this fails (fail closed).
/// [`start`] in the network namespace of process `pid` (an OCI runtime's
/// container init, made by the runtime and still empty).
pub fn start_for(pid: i32, network: &str, egress: &[String]) -> Result<Running, String> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
    start(network, egress, ns.into())
}

pub fn start(network: &str, egress: &[String], ns: OwnedFd) -> Result<Running, String> {
    let network = match network {
        "restricted" => Network::Restricted,
        "allow_egress" => Network::AllowEgress,
        other => return Err(format!("network `{other}` has no egress")),
    };
    let mut t = Instant::now();
    let mut phases = Vec::new();
    let mut lap = |name: &'static str, phases: &mut Vec<(&'static str, u64)>| {
        phases.push((name, t.elapsed().as_micros() as u64));
        t = Instant::now();
    };
    let host = host_addresses();
    let policy = Policy::new(network, egress, host)?;
    let table = ruleset(&policy, PROXY_PORT);
    tracing::debug!(ruleset = %table.text(), "the turn's nftables ruleset");
    lap("egress_plan", &mut phases);
    let (udp_ports, udp_v6) = policy.udp_ports();
    let sockets = in_netns(&ns, move || {
        let t = Instant::now();
        crate::sandbox::sys::loopback_up()?;
        rtnl::local_default_routes()?;
        let udp = udp::bound(SocketAddr::from((Ipv4Addr::new(127, 0, 0, 53), 53)), false)?;
        let tcp_dns = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 53), 53))?;
        let l4 = TcpListener::bind((Ipv4Addr::LOCALHOST, PROXY_PORT))?;
        let l6 = TcpListener::bind((Ipv6Addr::LOCALHOST, PROXY_PORT))?;
        let relay = udp::sockets(&udp_ports, udp_v6)?;
        let made = t.elapsed();
        // The namespace's nftables socket: a kernel without nf_tables
        // refuses it (EPROTONOSUPPORT), and the turn with it. The ruleset
        // goes through it (the proxy's port is fixed: the namespace is new
        // and empty), and the counts are read through it at the end.
        let nft = nfbatch::socket().map_err(|e| {
            std::io::Error::other(format!(
                "nft: this kernel has no nftables netlink ({e}); egress cannot be enforced"
            ))
        })?;
        table.load(&nft).map_err(std::io::Error::other)?;
        let laps = [("egress_sockets", made), ("egress_nft", t.elapsed() - made)];
        Ok((udp, tcp_dns, l4, l6, relay, counts::Reader::new(nft), laps))
    })
    .map_err(|e| format!("preparing the turn's network namespace: {e}"));
    let (udp, tcp_dns, l4, l6, relay, counts, laps) = sockets?;
    phases.extend(laps.map(|(name, d)| (name, d.as_micros() as u64)));
    let shared = Arc::new(Shared {
        policy,
        names: Mutex::new(Names::default()),
        flows: Mutex::new(Flows::default()),
        upstream: upstream(),
        cache: Mutex::new(HashMap::new()),
        lookups: Mutex::new(Bucket::new()),
        stop: AtomicBool::new(false),
        wake: nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?,
        active: AtomicUsize::new(0),
        open: Mutex::new(HashMap::new()),
        next_conn: std::sync::atomic::AtomicU64::new(0),
    });
    let threads = vec![
        {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || serve_udp(&s, &udp))
        },
        {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || accept_loop(&s, &tcp_dns, serve_dns_tcp))
        },
        {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || accept_loop(&s, &l4, proxy))
        },
        {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || accept_loop(&s, &l6, proxy))
        },
        {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || udp::run(s, relay))
        },
    ];
    Ok(Running {
        counts,
        shared,
        threads,
        phases,
    })
}

/// The addresses of the supervisor's own (the host's) interfaces.
fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut nix::libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below; each entry is read
    // while the list is alive, addresses by their family's layout.
    unsafe {
        if nix::libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    nix::libc::AF_INET => {
                        let s = &*a.cast::<nix::libc::sockaddr_in>();
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))));
                    }
                    nix::libc::AF_INET6 => {
                        let s = &*a.cast::<nix::libc::sockaddr_in6>();
                        out.push(IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        nix::libc::freeifaddrs(list);
    }
    out
}

/// What the turn's egress saw: every flow, and how many were not kept.
#[derive(Debug, Default)]
pub struct Report {
    pub flows: Vec<Flow>,
    pub dropped: u64,
}

impl Running {
    /// Stops the resolver and the proxy (the turn's processes are gone) and
    /// returns every flow: the proxy's and resolver's, and the kernel's
    /// refusals counted in the namespace.
    pub fn finish(mut self) -> Report {
        // The turn's processes are gone: the kernel's counts are final;
        // read them while the threads stop.
        self.shared.stop();
        let listed = self.counts.read(NFT_TABLE, &NFT_SETS, NFT_OTHER);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Connections still being spliced usually end with their peers (the
        // turn's sockets are closed): a short grace for their last bytes.
        // Then whatever is still open is shut down (an upstream that keeps
        // a connection idle would otherwise hold its thread past the turn),
        // and the threads record their flows: a connect still in progress
        // ends within CONNECT_TIMEOUT.
        let wait_idle = |for_: Duration| {
            let deadline = Instant::now() + for_;
            while self.shared.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait_idle(Duration::from_millis(500));
        if let Ok(open) = self.shared.open.lock() {
            for [c, u] in open.values() {
                let _ = c.shutdown(Shutdown::Both);
                let _ = u.shutdown(Shutdown::Both);
            }
        }
        wait_idle(CONNECT_TIMEOUT + Duration::from_secs(1));
        let in_flight = self.shared.active.load(Ordering::SeqCst);
        if in_flight > 0 {
            tracing::warn!(
                in_flight,
                "proxied connections still running after the turn; their flows are not in the evidence"
            );
        }
        let refused = listed.map(|s| {
            let names = self
                .shared
                .names
                .lock()
                .map(|n| n.by_addr.clone())
                .unwrap_or_default();
            kernel_refusals(&s, &self.shared.policy, &names)
        });
        let mut flows = self
            .shared
            .flows
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default();
        match refused {
            Ok((list, other)) => {
                for f in list {
                    flows.add(f);
                }
                flows.dropped += other;
            }
            Err(e) => flows.add(Flow {
                name: None,
                address: String::new(),
                port: 0,
                protocol: "tcp",
                allowed: false,
                decided_by: format!("the kernel's refusals could not be read: {e}"),
                hint: None,
                count: 0,
                bytes_out: 0,
                bytes_in: 0,
                first: None,
                last: None,
                error: None,
            }),
        }
        Report {
            flows: flows.map.into_values().collect(),
            dropped: flows.dropped,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

/// The connects and datagrams the namespace's nftables refused (read by
/// [`counts`]): one flow per destination with its count, and the count of
/// those beyond the sets' size.
fn kernel_refusals(
    refused: &counts::Refused,
    policy: &Policy,
    names: &HashMap<Ipv4Addr, String>,
) -> (Vec<Flow>, u64) {
    let mut flows = Vec::new();
    for (set, elems) in &refused.sets {
        let protocol = if set.starts_with("udp") { "udp" } else { "tcp" };
        for &(ip, port, count) in elems {
            let name = synthetic(ip).and_then(|s| names.get(&s).cloned());
            let decision = match (protocol, &name) {
                ("udp", Some(n)) => policy.decide_udp_name(n, port),
                ("udp", None) if synthetic(ip).is_some() => Decision::Denied {
                    rule: format!("{ip} is not an address the turn's resolver gave"),
                    hint: None,
                },
                ("udp", None) => policy.decide_udp_ip(ip, port),
                _ => policy.decide_ip(ip, port),
            };
            let (rule, hint) = match decision {
                Decision::Denied { rule, hint } => (rule, hint),
                Decision::Allowed(_) => (
                    format!("refused in the turn's namespace: {ip} port {port}"),
                    None,
                ),
            };
            flows.push(Flow {
                name,
                address: ip.to_string(),
                port,
                protocol,
                allowed: false,
                decided_by: rule,
                hint,
                count,
                bytes_out: 0,
                bytes_in: 0,
                first: None,
                last: None,
                error: None,
            });
        }
    }
    (flows, refused.other)
}

/// How long an accepted connection waits for one of the [`MAX_ACTIVE`]
/// handlers to finish before it is refused (reset, recorded).
const ROOM_WAIT: Duration = Duration::from_secs(2);

/// Whether a handler is free (waiting up to [`ROOM_WAIT`] for one); `false`
/// when none frees in time or the egress stops.
fn room(shared: &Shared) -> bool {
    let deadline = Instant::now() + ROOM_WAIT;
    while shared.active.load(Ordering::SeqCst) >= MAX_ACTIVE {
        if shared.stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// Accepts connections on `l` until the turn's egress stops, each on its
/// own thread.
fn accept_loop(shared: &Arc<Shared>, l: &TcpListener, handle: fn(&Shared, TcpStream)) {
    let _ = l.set_nonblocking(true);
    while shared.wait(l.as_fd()) {
        while let Ok((s, _)) = l.accept() {
            let _ = s.set_nonblocking(false);
            // Bounded: a turn cannot make the supervisor hold more than
            // this many connections (threads) at once. A burst (or a slow,
            // loaded host) waits for room first, up to ROOM_WAIT: the
            // connection is already established, so waiting slows the
            // turn's traffic down instead of resetting allowed connections.
            if !room(shared) {
                let at = Instant::now();
                let d = Decision::Denied {
                    rule: format!("more than {MAX_ACTIVE} connections at once"),
                    hint: None,
                };
                let addr = original_dst(&s);
                shared.record(shared.flow(
                    None,
                    addr.map_or(String::new(), |a| a.ip().to_string()),
                    addr.map_or(0, |a| a.port()),
                    "tcp",
                    &d,
                    at,
                ));
                reset(s);
                continue;
            }
            let s2 = Arc::clone(shared);
            s2.active.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                handle(&s2, s);
                s2.active.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

/// The resolver's answer to one query message.
fn resolve_query(shared: &Shared, raw: &[u8]) -> Option<Vec<u8>> {
    let Some(q) = dns::parse_query(raw) else {
        return dns::formerr(raw);
    };
    let at = Instant::now();
    if !q.host {
        // Not a name the supervisor could resolve as asked (see
        // [`dns::host_label`]): refused under either policy, recorded.
        shared.record(shared.flow(
            Some(&q.name),
            crate::sandbox::egress::RESOLVER_ADDR.into(),
            53,
            "dns",
            &Decision::Denied {
                rule:
                    "not a host name: a label holds a dot or a byte outside printable ASCII".into(),
                hint: None,
            },
            at,
        ));
        return Some(dns::answer(&q, raw, dns::RCODE_NXDOMAIN, None));
    }
    let allowed = shared.policy.resolves(&q.name);
    // Under `allow_egress` an unlisted name is answered only when it
    // exists upstream (SERVFAIL when the turn's lookup budget is spent).
    let upstream = (allowed
        && shared.policy.network == Network::AllowEgress
        && shared.policy.name_entry(&q.name, None).is_none())
    .then(|| shared.resolve(&q.name));
    // An unlisted name whose every address the turn could never reach (a
    // private, link-local, the host's own…) is answered as a name that
    // does not exist: a synthetic address would tell the turn that an
    // internal name exists (split-horizon names mapped from inside;
    // red-team stop 60), and no connection through it could be made.
    let listed_for_udp = shared
        .policy
        .name_entry_on(Transport::Udp, &q.name, None)
        .is_some();
    let unreachable = !listed_for_udp
        && matches!(&upstream, Some(Ok(addrs))
            if addrs.iter().all(|ip| !shared.policy.reachable_unlisted(*ip)));
    let rcode_addr = if !allowed || unreachable {
        (dns::RCODE_NXDOMAIN, None)
    } else if let Some(Err(e)) = &upstream {
        if *e == LookupError::Budget {
            (dns::RCODE_SERVFAIL, None)
        } else {
            (dns::RCODE_NXDOMAIN, None)
        }
    } else {
        match shared
            .names
            .lock()
            .ok()
            .and_then(|mut n| n.address(&q.name))
        {
            Some(a) => (dns::RCODE_NOERROR, Some(a)),
            None => (dns::RCODE_SERVFAIL, None),
        }
    };
    let decision = if unreachable {
        let why = match &upstream {
            Some(Ok(addrs)) => addrs
                .first()
                .and_then(|ip| shared.policy.address_ok(false, *ip, 0).err()),
            _ => None,
        };
        Decision::Denied {
            rule: format!(
                "allow_egress: {} resolves only to addresses no unlisted name may reach (DNS rebinding: {}); answered as a name that does not exist",
                q.name,
                why.unwrap_or_default()
            ),
            hint: None,
        }
    } else if allowed {
        Decision::Allowed(
            shared
                .policy
                .name_entry(&q.name, None)
                .map_or_else(|| "allow_egress: any public name".into(), |e| e.raw.clone()),
        )
    } else {
        Decision::Denied {
            rule: format!("restricted: no egress entry lists {}", q.name),
            hint: Some(format!("{}:443", q.name)),
        }
    };
    // Only the denied names are flows of their own (an allowed name's
    // connections are).
    if !allowed || unreachable {
        shared.record(shared.flow(
            Some(&q.name),
            crate::sandbox::egress::RESOLVER_ADDR.into(),
            53,
            "dns",
            &decision,
            at,
        ));
    }
    Some(dns::answer(&q, raw, rcode_addr.0, rcode_addr.1))
}

/// The resolver's address in the turn (`/etc/resolv.conf`).
pub const RESOLVER_ADDR: &str = turnstile_policy::plan::RESOLVER;

fn serve_udp(shared: &Shared, sock: &UdpSocket) {
    let _ = sock.set_nonblocking(true);
    let mut buf = [0u8; 1500];
    while shared.wait(sock.as_fd()) {
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            if let Some(reply) = resolve_query(shared, &buf[..n]) {
                let _ = sock.send_to(&reply, from);
            }
        }
    }
}

fn serve_dns_tcp(shared: &Shared, mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut len = [0u8; 2];
    while s.read_exact(&mut len).is_ok() {
        let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
        if s.read_exact(&mut msg).is_err() {
            return;
        }
        let Some(reply) = resolve_query(shared, &msg) else {
            return;
        };
        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

/// The destination a redirected connection was opened for.
fn original_dst(s: &TcpStream) -> Option<SocketAddr> {
    let fd = s.as_raw_fd();
    const SO_ORIGINAL_DST: nix::libc::c_int = 80;
    if s.local_addr().ok()?.is_ipv4() {
        // SAFETY: sockaddr_in is plain old data; zeroed is a valid value.
        let mut a: nix::libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&a) as nix::libc::socklen_t;
        // SAFETY: `a` is a sockaddr_in of `len` bytes.
        let r = unsafe {
            nix::libc::getsockopt(
                fd,
                nix::libc::SOL_IP,
                SO_ORIGINAL_DST,
                (&raw mut a).cast(),
                &mut len,
            )
        };
        (r == 0).then(|| {
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                u16::from_be(a.sin_port),
            )
        })
    } else {
        // SAFETY: sockaddr_in6 is plain old data; zeroed is a valid value.
        let mut a: nix::libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&a) as nix::libc::socklen_t;
        // SAFETY: `a` is a sockaddr_in6 of `len` bytes.
        let r = unsafe {
            nix::libc::getsockopt(
                fd,
                nix::libc::SOL_IPV6,
                SO_ORIGINAL_DST,
                (&raw mut a).cast(),
                &mut len,
            )
        };
        (r == 0).then(|| {
            SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)),
                u16::from_be(a.sin6_port),
            )
        })
    }
}

/// Closes `s` with a reset (the peer's next read or write fails at once).
fn reset(s: TcpStream) {
    let l = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger of its own size.
    unsafe {
        nix::libc::setsockopt(
            s.as_raw_fd(),
            nix::libc::SOL_SOCKET,
            nix::libc::SO_LINGER,
            (&raw const l).cast(),
            std::mem::size_of_val(&l) as nix::libc::socklen_t,
        );
    }
    drop(s);
}

/// The server name a client's first bytes name: a TLS ClientHello's SNI,
/// or an HTTP request's Host (without port). `None`: neither is there.
pub fn named_host(b: &[u8]) -> Option<String> {
    match inspect::first_bytes(b) {
        inspect::Seen::Names(n) => n.into_iter().map(|(_, h)| h).next_back(),
        _ => None,
    }
}

/// What [`inspect_first`] found.
#[derive(Debug)]
enum First {
    /// The client's first message (or its end of stream: no names), and
    /// whether it is cleartext HTTP ([`inspect::cleartext_http`]): then
    /// every later request on the connection is checked too.
    Message(inspect::Seen, bool),
    /// Nothing from the client within [`PEEK_WAIT`]: either a protocol
    /// whose server speaks first, or a client that waits. Decided once the
    /// upstream is connected: see [`first_speaker`].
    Silent,
}

/// Waits up to [`PEEK_WAIT`] for the client's first bytes, until they are
/// a complete message (see [`inspect`]); what they say. The window starts
/// at the call: a second call after [`first_speaker`] saw the client's
/// first byte gives that message a full window of its own.
fn inspect_first(s: &TcpStream) -> First {
    let deadline = Instant::now() + PEEK_WAIT;
    let mut buf = vec![0u8; inspect::MAX_PEEK];
    let mut http = false;
    let seen = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break inspect::Seen::Unreadable(format!(
                "the client's first message was not complete within {} ms",
                PEEK_WAIT.as_millis()
            ));
        }
        let _ = s.set_read_timeout(Some(left));
        let n = match s.peek(&mut buf) {
            Ok(n) => n,
            // The timeout (EAGAIN) with nothing sent: not "no names" —
            // the client may still send a message naming another host.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let _ = s.set_read_timeout(None);
                return First::Silent;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Reset by the client: it can send nothing more; the splice
            // ends at once.
            Err(_) => break inspect::Seen::Names(Vec::new()),
        };
        if n == 0 {
            // The client's end of stream before any byte: nothing it sends
            // can follow.
            break inspect::Seen::Names(Vec::new());
        }
        http = inspect::cleartext_http(&buf[..n]);
        match inspect::first_bytes(&buf[..n]) {
            inspect::Seen::More if n < buf.len() && sent_all(s) => {
                break inspect::first_bytes_at_end(&buf[..n]);
            }
            inspect::Seen::More if n < buf.len() => {
                std::thread::sleep(Duration::from_millis(2));
            }
            inspect::Seen::More => {
                break inspect::Seen::Unreadable(format!(
                    "the client's first message is longer than {} bytes",
                    buf.len()
                ));
            }
            seen => break seen,
        }
    };
    let _ = s.set_read_timeout(None);
    First::Message(seen, http)
}

/// Whether the client has shut its sending side down (POLLRDHUP: seen
/// while its last bytes are still unread).
fn sent_all(s: &TcpStream) -> bool {
    // nix's PollFd cannot report POLLRDHUP (it drops unknown bits).
    let mut fd = nix::libc::pollfd {
        fd: s.as_raw_fd(),
        events: nix::libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd of a descriptor `s` keeps open; no wait.
    let n = unsafe { nix::libc::poll(&raw mut fd, 1, 0) };
    n == 1 && fd.revents & (nix::libc::POLLRDHUP | nix::libc::POLLHUP) != 0
}

/// Who sent first on a connection whose client was silent for
/// [`PEEK_WAIT`].
#[derive(Debug, PartialEq, Eq)]
enum Speaker {
    /// The client (or both at once: the client's message is inspected,
    /// fail closed).
    Client,
    /// The upstream server (SSH, SMTP, …): what the client sends after it
    /// answers the server is not a first message.
    Server,
    /// The turn's egress stopped.
    Stopped,
}

/// Waits, without a deadline (an idle connection may stay open), until
/// the client or the upstream has something to read: their end of
/// stream counts.
fn first_speaker(shared: &Shared, client: &TcpStream, up: &TcpStream) -> Speaker {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Speaker::Stopped;
        }
        let mut fds = [
            PollFd::new(client.as_fd(), PollFlags::POLLIN),
            PollFd::new(up.as_fd(), PollFlags::POLLIN),
            PollFd::new(shared.wake.0.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {
                let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
                if ready(2) {
                    return Speaker::Stopped;
                }
                if ready(0) {
                    return Speaker::Client;
                }
                if ready(1) {
                    return Speaker::Server;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            // Cannot wait: inspect the client (it blocks at most
            // PEEK_WAIT, then refuses).
            Err(_) => return Speaker::Client,
        }
    }
}

/// Whether the client's first message on `port` must name the host the
/// connection was opened for (TLS server name, HTTP Host).
fn names_checked(port: u16) -> bool {
    port == 443 || port == 80
}

/// The refusal a client's first message earns on a connection opened for
/// `name` on `port`, if any.
fn first_message_refusal(seen: inspect::Seen, name: &str, port: u16) -> Option<Decision> {
    match seen {
        inspect::Seen::Names(names) => {
            names
                .into_iter()
                .find(|(_, h)| h != name)
                .map(|(what, h)| Decision::Denied {
                    rule: format!(
                        "{what} `{h}` is not `{name}`, the name the connection was opened for"
                    ),
                    hint: Some(format!("{h}:{port}")),
                })
        }
        inspect::Seen::Unreadable(why) => Some(Decision::Denied {
            rule: format!("{why}: the server name it asks for cannot be checked against `{name}`"),
            hint: None,
        }),
        // Not produced by inspect_first (it waits, then refuses).
        inspect::Seen::More => Some(Decision::Denied {
            rule: format!(
                "an incomplete first message: the server name it asks for cannot be checked against `{name}`"
            ),
            hint: None,
        }),
    }
}

/// One intercepted connection: decide, connect upstream, splice.
fn proxy(shared: &Shared, client: TcpStream) {
    let at = Instant::now();
    let Some(dst) = original_dst(&client) else {
        return reset(client);
    };
    let port = dst.port();
    let name = synthetic(dst.ip()).map(|a| {
        shared
            .names
            .lock()
            .ok()
            .and_then(|n| n.by_addr.get(&a).cloned())
    });
    let (name, decision) = match name {
        Some(None) => (
            None,
            Decision::Denied {
                rule: format!("{} is not an address the turn's resolver gave", dst.ip()),
                hint: None,
            },
        ),
        Some(Some(n)) => {
            let d = shared.policy.decide_name(&n, port);
            (Some(n), d)
        }
        None => (None, shared.policy.decide_ip(dst.ip(), port)),
    };
    let deny = |decision: &Decision, address: String, client: TcpStream| {
        shared.record(shared.flow(name.as_deref(), address, port, "tcp", decision, at));
        reset(client);
    };
    if let Decision::Denied { .. } = decision {
        return deny(&decision, dst.ip().to_string(), client);
    }
    // By name: the server name the client sends must be that name. A
    // client silent for PEEK_WAIT has its first message checked after the
    // connect, unless the server speaks first.
    let mut deferred = false;
    // Whether the client's first message was cleartext HTTP.
    let mut http_first = false;
    let targets: Vec<SocketAddr> = match &name {
        Some(n) => {
            if names_checked(port) {
                match inspect_first(&client) {
                    First::Message(seen, http) => {
                        if let Some(d) = first_message_refusal(seen, n, port) {
                            return deny(&d, dst.ip().to_string(), client);
                        }
                        http_first = http;
                    }
                    First::Silent => deferred = true,
                }
            }
            let listed = shared.policy.name_entry(n, Some(port)).is_some();
            match shared.resolve(n) {
                Ok(addrs) => {
                    let (ok, bad): (Vec<IpAddr>, Vec<IpAddr>) = addrs
                        .into_iter()
                        .partition(|ip| shared.policy.address_ok(listed, *ip, port).is_ok());
                    if ok.is_empty() {
                        let why = bad
                            .first()
                            .and_then(|ip| shared.policy.address_ok(listed, *ip, port).err())
                            .unwrap_or_default();
                        let d = Decision::Denied {
                            rule: format!("{n} resolves to {why} (DNS rebinding refused)"),
                            hint: bad.first().and_then(|ip| cidr_hint(*ip, port, "")),
                        };
                        return deny(
                            &d,
                            bad.first().map_or(String::new(), ToString::to_string),
                            client,
                        );
                    }
                    ok.into_iter().map(|ip| SocketAddr::new(ip, port)).collect()
                }
                Err(e) => {
                    let mut f = shared.flow(Some(n), String::new(), port, "tcp", &decision, at);
                    f.error = Some(e.to_string());
                    shared.record(f);
                    return reset(client);
                }
            }
        }
        None => vec![dst],
    };
    let mut last_err = String::new();
    let upstream = targets.iter().find_map(|t| {
        TcpStream::connect_timeout(t, CONNECT_TIMEOUT)
            .map(|s| (s, *t))
            .map_err(|e| last_err = format!("{t}: {e}"))
            .ok()
    });
    let Some((up, addr)) = upstream else {
        let mut f = shared.flow(
            name.as_deref(),
            targets
                .first()
                .map_or(String::new(), |t| t.ip().to_string()),
            port,
            "tcp",
            &decision,
            at,
        );
        f.error = Some(last_err);
        shared.record(f);
        return reset(client);
    };
    // Registered while spliced, so the turn's end can close it.
    let conn = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    if let (Ok(c), Ok(u), Ok(mut open)) = (client.try_clone(), up.try_clone(), shared.open.lock()) {
        open.insert(conn, [c, u]);
    }
    if let (true, Some(n)) = (deferred, &name) {
        let refusal = match first_speaker(shared, &client, &up) {
            Speaker::Server | Speaker::Stopped => None,
            Speaker::Client => match inspect_first(&client) {
                First::Message(seen, http) => {
                    http_first = http;
                    first_message_refusal(seen, n, port)
                }
                // Readable a moment ago: its bytes cannot have gone.
                First::Silent => first_message_refusal(inspect::Seen::More, n, port),
            },
        };
        if let Some(d) = refusal {
            if let Ok(mut open) = shared.open.lock() {
                open.remove(&conn);
            }
            let _ = up.shutdown(Shutdown::Both);
            return deny(&d, addr.ip().to_string(), client);
        }
    }
    // Cleartext HTTP: every request checked, not only the first — on port
    // 80 always, and on 443 when the client's first message was HTTP (a
    // keep-alive or pipelined request, or a second h2c stream, naming
    // another host reached the name's server there: red-team wave 4, W2).
    // TLS, and protocols that are not HTTP (SSH, …), are spliced as they
    // are.
    let guard = match (&name, port) {
        (Some(n), 80) => Some(http::Guard::new(n)),
        (Some(n), p) if names_checked(p) && http_first => Some(http::Guard::new(n)),
        _ => None,
    };
    let (out, inn, refused) = match guard {
        Some(g) => splice_guarded(client, up, g),
        None => {
            let (o, i) = splice(client, up);
            (o, i, None)
        }
    };
    if let Ok(mut open) = shared.open.lock() {
        open.remove(&conn);
    }
    if let (Some(r), Some(n)) = (refused, &name) {
        let d = match r {
            http::Refusal::Other(what, h) => Decision::Denied {
                rule: format!(
                    "{what} `{h}` is not `{n}`, the name the connection was opened for (a later request on it)"
                ),
                hint: Some(format!("{h}:{port}")),
            },
            http::Refusal::Unparseable(why) => Decision::Denied {
                rule: format!(
                    "{why}: a later request's server name cannot be checked against `{n}`"
                ),
                hint: None,
            },
        };
        shared.record(shared.flow(Some(n), addr.ip().to_string(), port, "tcp", &d, at));
    }
    let mut f = shared.flow(
        name.as_deref(),
        addr.ip().to_string(),
        port,
        "tcp",
        &decision,
        at,
    );
    f.bytes_out = out;
    f.bytes_in = inn;
    f.last = Some(Instant::now());
    shared.record(f);
}

/// Copies both ways until both sides are done: (bytes to upstream, bytes
/// back). On this thread, with nonblocking sockets and poll(2): a second
/// thread per connection (the previous design) put its start-up latency
/// in front of the first bytes back, milliseconds on a loaded host. Each
/// direction ends at its source's end of stream or an error, then shuts
/// its destination's write side (the peer sees the end); a slow
/// destination stops the reading of its source (64 KiB each way at most).
fn splice(client: TcpStream, up: TcpStream) -> (u64, u64) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    /// One direction: its buffer, what of it is still to be written, and
    /// whether its source ended.
    struct Dir {
        buf: Vec<u8>,
        at: usize,
        end: usize,
        eof: bool,
        done: bool,
        bytes: u64,
    }
    if client.set_nonblocking(true).is_err() || up.set_nonblocking(true).is_err() {
        return (0, 0);
    }
    let socks = [&client, &up];
    let new = || Dir {
        buf: vec![0u8; 64 * 1024],
        at: 0,
        end: 0,
        eof: false,
        done: false,
        bytes: 0,
    };
    // 0: client to upstream, 1: upstream to client.
    let mut dirs = [new(), new()];
    loop {
        for (i, d) in dirs.iter_mut().enumerate() {
            let (mut from, mut to) = (socks[i], socks[1 - i]);
            while !d.done {
                let step = if d.at < d.end {
                    to.write(&d.buf[d.at..d.end]).map(|k| {
                        d.at += k;
                        d.bytes += k as u64;
                    })
                } else if d.eof {
                    d.done = true;
                    let _ = to.shutdown(Shutdown::Write);
                    break;
                } else {
                    from.read(&mut d.buf).map(|k| {
                        (d.at, d.end) = (0, k);
                        d.eof = k == 0;
                    })
                };
                match step {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // A failed read ends the direction like its end of
                    // stream; a failed write drops what is left.
                    Err(_) => (d.at, d.end, d.eof) = (0, 0, true),
                }
            }
        }
        if dirs.iter().all(|d| d.done) {
            break;
        }
        // Wait for what the unfinished directions need: their source
        // readable, or their destination writable while bytes wait.
        let mut want = [PollFlags::empty(); 2];
        for (i, d) in dirs.iter().enumerate() {
            if d.done {
                continue;
            }
            if d.at < d.end {
                want[1 - i] |= PollFlags::POLLOUT;
            } else {
                want[i] |= PollFlags::POLLIN;
            }
        }
        let mut fds: Vec<PollFd<'_>> = socks
            .iter()
            .zip(want)
            .filter(|(_, w)| !w.is_empty())
            .map(|(s, w)| PollFd::new(s.as_fd(), w))
            .collect();
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    (dirs[0].bytes, dirs[1].bytes)
}

/// [`splice`] with the client's bytes through `guard`: a request it
/// refuses ends the connection with a reset (the upstream is shut down, the
/// client gets no FIN first). (bytes to upstream, bytes back, the refusal).
fn splice_guarded(
    mut client: TcpStream,
    mut up: TcpStream,
    mut guard: http::Guard,
) -> (u64, u64, Option<http::Refusal>) {
    let (c2, u2) = match (client.try_clone(), up.try_clone()) {
        (Ok(c), Ok(u)) => (c, u),
        _ => return (0, 0, None),
    };
    let refused = Arc::new(AtomicBool::new(false));
    let back = {
        let refused = Arc::clone(&refused);
        std::thread::spawn(move || {
            let (mut from, mut to) = (u2, c2);
            let mut buf = vec![0u8; 64 * 1024];
            let mut n = 0u64;
            while let Ok(k) = from.read(&mut buf) {
                if k == 0 || refused.load(Ordering::SeqCst) || to.write_all(&buf[..k]).is_err() {
                    break;
                }
                n += k as u64;
            }
            if !refused.load(Ordering::SeqCst) {
                let _ = to.shutdown(Shutdown::Write);
            }
            n
        })
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = 0u64;
    let mut refusal = None;
    loop {
        match client.read(&mut buf) {
            Ok(0) => {
                match guard.finish() {
                    Ok(pass) => {
                        if up.write_all(&pass).is_ok() {
                            out += pass.len() as u64;
                        }
                    }
                    Err(r) => refusal = Some(r),
                }
                break;
            }
            Err(_) => break,
            Ok(k) => match guard.feed(&buf[..k]) {
                Ok(pass) => {
                    if up.write_all(&pass).is_err() {
                        break;
                    }
                    out += pass.len() as u64;
                }
                Err(r) => {
                    refusal = Some(r);
                    break;
                }
            },
        }
    }
    if refusal.is_some() {
        refused.store(true, Ordering::SeqCst);
        let _ = up.shutdown(Shutdown::Both);
    } else {
        let _ = up.shutdown(Shutdown::Write);
    }
    let inn = back.join().unwrap_or(0);
    if refusal.is_some() {
        reset(client);
    }
    (out, inn, refusal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(network: Network, raw: &[&str]) -> Policy {
        let raw: Vec<String> = raw.iter().map(|s| (*s).to_owned()).collect();
        Policy::new(network, &raw, vec!["192.0.2.77".parse().unwrap()]).unwrap()
    }

    #[test]
    fn issue_26_names_wildcards_cidrs_and_public_addresses_are_decided_by_the_policy() {
        let p = policy(
            Network::Restricted,
            &[
                "pypi.org:443",
                "*.files.example.org:443",
                "10.20.0.0/16:50051",
            ],
        );
        assert!(p.resolves("pypi.org") && p.resolves("a.b.files.example.org"));
        assert!(!p.resolves("files.example.org") && !p.resolves("evil.org"));
        assert_eq!(
            p.decide_name("pypi.org", 443),
            Decision::Allowed("pypi.org:443".into())
        );
        assert!(
            matches!(p.decide_name("pypi.org", 80), Decision::Denied { hint: Some(h), .. } if h == "pypi.org:80")
        );
        assert!(matches!(
            p.decide_ip("10.20.3.4".parse().unwrap(), 50051),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            p.decide_ip("10.21.3.4".parse().unwrap(), 50051),
            Decision::Denied { .. }
        ));
        let e = policy(Network::AllowEgress, &["10.1.2.3/32:80"]);
        for ip in [
            "169.254.169.254",
            "10.0.0.1",
            "100.64.1.1",
            "127.0.0.1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "192.0.2.77",
            // The metadata address and private ones inside IPv6: NAT64,
            // local-use NAT64, SIIT, IPv4-compatible, 6to4; Teredo.
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::10.0.0.1",
            "::ffff:0:169.254.169.254",
            "::169.254.169.254",
            "2002:a9fe:a9fe::1",
            "2002:0a00:0001::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "100::1",
            // 169.254.169.254 in a /48 local-use NAT64 prefix's layout;
            // its last 32 bits read 198.51.100.10.
            "64:ff9b:1:a9fe:a9:fe00:c633:640a",
            "64:ff9b:1::203.0.113.9",
        ] {
            assert!(
                matches!(
                    e.decide_ip(ip.parse().unwrap(), 80),
                    Decision::Denied { .. }
                ),
                "{ip}"
            );
        }
        assert!(matches!(
            e.decide_ip("10.1.2.3".parse().unwrap(), 80),
            Decision::Allowed(_)
        ));
        // Public ones stay reachable, in IPv6 and carried in it.
        for ip in [
            "203.0.113.9",
            "2001:db8::9",
            "64:ff9b::203.0.113.9",
            "2002:cb00:7109::1",
        ] {
            assert!(
                matches!(e.decide_ip(ip.parse().unwrap(), 80), Decision::Allowed(_)),
                "{ip}"
            );
        }
        assert!(
            e.address_ok(false, "10.0.0.1".parse().unwrap(), 443)
                .is_err()
        );
        assert!(p.address_ok(true, "10.0.0.1".parse().unwrap(), 443).is_ok());
        assert!(
            p.address_ok(true, "169.254.169.254".parse().unwrap(), 443)
                .is_err()
        );
    }

    /// Red-team wave 4, W7: the upstream lookup budget: a burst, then a
    /// rate.
    #[test]
    fn issue_26_upstream_lookups_have_a_budget() {
        let mut b = Bucket::new();
        let took = (0..1000).filter(|_| b.take()).count();
        assert!(
            (LOOKUP_BURST as usize..LOOKUP_BURST as usize + 5).contains(&took),
            "{took}"
        );
        b.at -= Duration::from_secs(1);
        let again = (0..1000).filter(|_| b.take()).count();
        assert!(
            (LOOKUP_RATE as usize..LOOKUP_RATE as usize + 5).contains(&again),
            "{again}"
        );
        assert!(LookupError::Budget.to_string().contains("shared"));
    }

    /// Red-team F1: a client silent through the first-message window is
    /// `Silent` (checked later), not a message naming no host; once it
    /// sends, its message gets a window of its own and is checked.
    #[test]
    fn issue_26_a_silent_client_is_not_a_message_without_names() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(matches!(inspect_first(&s), First::Silent));
        c.write_all(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
            .unwrap();
        let First::Message(seen, true) = inspect_first(&s) else {
            panic!("the client has sent")
        };
        let d = first_message_refusal(seen, "good.test", 443);
        assert!(
            matches!(&d, Some(Decision::Denied { rule, .. }) if rule.contains("`evil.test`")),
            "{d:?}"
        );
        // A client that sends an unfinished head and closes its side
        // (`echo GET / HTTP/1.1 | nc`): its complete lines are checked.
        let mut c2 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s2, _) = l.accept().unwrap();
        c2.write_all(b"GET / HTTP/1.1\n").unwrap();
        c2.shutdown(Shutdown::Write).unwrap();
        let t = Instant::now();
        assert!(matches!(
            inspect_first(&s2),
            First::Message(inspect::Seen::Names(n), _) if n.is_empty()
        ));
        assert!(t.elapsed() < PEEK_WAIT);
        // A client that closes without sending: nothing can follow.
        drop(c);
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        assert!(matches!(
            inspect_first(&s),
            First::Message(inspect::Seen::Names(n), _) if n.is_empty()
        ));
        let _ = c.flush();
    }

    /// Red-team F3: a name (listed, wildcard, or any under
    /// `allow_egress`) that resolves to one of the host's own addresses
    /// is refused — IPv4, IPv6, ULA, and carried in IPv6 — for TCP and
    /// UDP, unless a CIDR entry lists the address; a listed name may still
    /// reach a private address (F6: site-local fec0::/10 is not public).
    #[test]
    fn issue_26_a_name_never_reaches_the_hosts_own_addresses() {
        let host: Vec<IpAddr> = ["192.0.2.77", "fd00::2", "2001:db8::77"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let raw = |r: &[&str]| r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let entries = raw(&[
            "host.test:8099",
            "*.wild.test:8099",
            "host.test:9099/udp",
            "192.0.2.77/32:8098",
        ]);
        for network in [Network::Restricted, Network::AllowEgress] {
            let p = Policy::new(network, &entries, host.clone()).unwrap();
            for ip in [
                "192.0.2.77",
                "fd00::2",
                "2001:db8::77",
                "::ffff:192.0.2.77",
                "64:ff9b::192.0.2.77",
            ] {
                let ip: IpAddr = ip.parse().unwrap();
                for listed in [true, false] {
                    let e = p.address_ok(listed, ip, 8099).unwrap_err();
                    assert!(e.contains("the host's own addresses"), "{ip}: {e}");
                    assert!(p.address_ok_on(Transport::Udp, listed, ip, 9099).is_err());
                }
            }
            // A CIDR entry lists it: reachable, by name too.
            assert!(
                p.address_ok(true, "192.0.2.77".parse().unwrap(), 8098)
                    .is_ok()
            );
            assert!(
                p.address_ok_on(Transport::Udp, true, "192.0.2.77".parse().unwrap(), 8098)
                    .is_err(),
                "a TCP CIDR entry does not open UDP"
            );
            // Private answers: listed names only.
            for ip in ["10.0.0.1", "fd00::9", "fec0::1", "100.64.0.1"] {
                let ip: IpAddr = ip.parse().unwrap();
                assert!(p.address_ok(true, ip, 8099).is_ok(), "{ip}");
                assert!(p.address_ok(false, ip, 8099).is_err(), "{ip}");
            }
            for ip in ["127.0.0.1", "169.254.169.254", "0.0.0.0", "fe80::1", "::1"] {
                assert!(
                    p.address_ok(true, ip.parse().unwrap(), 8099).is_err(),
                    "{ip}"
                );
            }
            assert!(
                p.address_ok(false, "203.0.113.9".parse().unwrap(), 8099)
                    .is_ok()
            );
        }
        // F6: no hint that could never take effect (loopback).
        let e = policy(Network::AllowEgress, &[]);
        for ip in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let d = e.decide_ip(ip.parse().unwrap(), 1);
            assert!(
                matches!(&d, Decision::Denied { hint: None, rule } if rule.contains("turn's loopback")),
                "{ip}: {d:?}"
            );
        }
        assert_eq!(cidr_hint("127.0.0.1".parse().unwrap(), 8098, ""), None);
        // Never advised: link-local (cloud metadata), this network,
        // broadcast, IPv6 link-local.
        for ip in [
            "169.254.1.1",
            "169.254.169.254",
            "0.0.0.1",
            "255.255.255.255",
            "fe80::1",
        ] {
            assert_eq!(cidr_hint(ip.parse().unwrap(), 80, "/udp"), None, "{ip}");
        }
        assert_eq!(
            cidr_hint("10.1.1.1".parse().unwrap(), 80, "/udp").as_deref(),
            Some("10.1.1.1/32:80/udp")
        );
        assert!(matches!(
            e.decide_ip("fec0::99".parse().unwrap(), 80),
            Decision::Denied { rule, .. } if rule.contains("site-local")
        ));
        let r = ruleset(&e, 4000).text();
        assert!(r.contains("fec0::/10"), "{r}");
    }

    #[test]
    fn issue_26_sni_and_host_are_read_from_the_first_bytes() {
        assert_eq!(
            named_host(b"GET / HTTP/1.1\r\nHost: Example.ORG:8080\r\n\r\n").as_deref(),
            Some("example.org")
        );
        // A minimal ClientHello naming a.example.
        let name = b"a.example";
        let mut ext = vec![0, 0];
        let list_len = (3 + name.len()) as u16;
        ext.extend_from_slice(&(list_len + 2).to_be_bytes());
        ext.extend_from_slice(&list_len.to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name);
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[0; 32]);
        hello.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hello.extend_from_slice(&ext);
        let hs_len = hello.len() as u16;
        let rec_len = (hello.len() + 4) as u16;
        let mut msg = vec![0x16, 3, 1];
        msg.extend_from_slice(&rec_len.to_be_bytes());
        msg.extend_from_slice(&[1, 0]);
        msg.extend_from_slice(&hs_len.to_be_bytes());
        msg.extend_from_slice(&hello);
        assert_eq!(named_host(&msg).as_deref(), Some("a.example"));
        for n in 0..msg.len() {
            let _ = named_host(&msg[..n]);
        }
    }

    #[test]
    fn issue_26_the_ruleset_redirects_names_and_cidrs_and_refuses_the_rest() {
        let r = ruleset(
            &policy(Network::Restricted, &["10.20.0.0/16:50051", "pypi.org:443"]),
            4000,
        )
        .text();
        assert!(r.contains("ip daddr 127.64.0.0/10 meta l4proto tcp redirect to :4000"));
        assert!(r.contains("ip daddr 10.20.0.0/16 tcp dport 50051 redirect to :4000"));
        assert!(!r.contains("meta l4proto tcp redirect to :4000\n  }"));
        let r = ruleset(&policy(Network::AllowEgress, &[]), 4000).text();
        assert!(r.contains("169.254.0.0/16"));
        let p = policy(
            Network::Restricted,
            &[
                "dns.internal:53/udp",
                "10.0.0.0/8:5000-5001/udp",
                "[fd00::/8]:53/udp",
            ],
        );
        let r = ruleset(&p, 4000).text();
        assert!(r.contains("ip daddr 127.64.0.0/10 udp dport 53 accept"));
        assert!(r.contains("ip daddr 10.0.0.0/8 udp dport 5000-5001 accept"));
        assert!(r.contains("ip6 daddr fd00::/8 udp dport 53 accept"));
        assert!(r.contains(&format!("meta mark {:#x} accept", udp::MARK)));
        assert!(p.resolves("dns.internal"));
        assert_eq!(
            p.decide_udp_name("dns.internal", 53),
            Decision::Allowed("dns.internal:53/udp".into())
        );
        assert!(matches!(
            p.decide_name("dns.internal", 53),
            Decision::Denied { .. }
        ));
        assert!(matches!(
            p.decide_udp_name("dns.internal", 54),
            Decision::Denied { hint: Some(h), .. } if h == "dns.internal:54/udp"
        ));
        assert!(matches!(
            p.decide_udp_ip("10.1.1.1".parse().unwrap(), 5001),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            p.decide_udp_ip("10.1.1.1".parse().unwrap(), 80),
            Decision::Denied { hint: Some(h), .. } if h == "10.1.1.1/32:80/udp"
        ));
        assert_eq!(p.udp_ports().0.len(), 3);
        assert!(p.udp_ports().1);
        let wide: Vec<String> = vec!["a.test:1000-1100/udp".into()];
        assert!(Policy::new(Network::Restricted, &wide, vec![]).is_err());
    }

    /// The batch loads, and the kernel holds the same bytecode for it as
    /// for its nft text compiled by `nft` (root, nftables; each in a
    /// network namespace of its own): every kind of policy's ruleset.
    #[test]
    fn issue_29_the_ruleset_batch_is_what_nft_makes_of_its_text() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(
                std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
                "root is required (nftables in network namespaces of their own)"
            );
            return;
        }
        let nft = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("`nft` is required to compare (apt-get install nftables)");
        // `nft --debug=netlink list` in the calling thread's namespace: the
        // rules' bytecode as the kernel holds it.
        let listed = move || {
            let out = std::process::Command::new(nft)
                .args(["--debug=netlink", "list", "table", "inet", NFT_TABLE])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .chain(String::from_utf8_lossy(&out.stderr).lines())
                .filter(|l| l.trim_start().starts_with('[') || l.starts_with("inet "))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let policies = [
            policy(Network::Restricted, &["pypi.org:443"]),
            policy(
                Network::Restricted,
                &[
                    "good.test:80",
                    "203.0.113.11/32:9000",
                    "10.20.0.0/16:50051-50060",
                    "[2001:db8:77::/48]:80",
                    "[2001:db8:80::/41]:443",
                    "dns.test:53/udp",
                    "q.test:1000-1020/udp",
                    "r.test:53/udp",
                    "10.0.0.0/9:5000-5001/udp",
                    "[fd00::/8]:9053/udp",
                ],
            ),
            policy(Network::AllowEgress, &[]),
            policy(Network::AllowEgress, &["dns.test:53/udp", "10.1.2.0/23:22"]),
        ];
        for p in &policies {
            let table = ruleset(p, PROXY_PORT);
            let text = table.text();
            let (batch, nft_text) = std::thread::spawn(move || {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let sock = nfbatch::socket().unwrap();
                table.load(&sock).unwrap();
                let batch = listed();
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let mut child = std::process::Command::new(nft)
                    .args(["-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(text.as_bytes())
                    .unwrap();
                assert!(child.wait().unwrap().success(), "nft -f:\n{text}");
                (batch, listed())
            })
            .join()
            .unwrap();
            assert!(batch.len() > 40, "{batch:#?}");
            assert_eq!(batch, nft_text, "{}", ruleset(p, PROXY_PORT).text());
        }
        // A rule the kernel refuses is named, and nothing of the batch
        // stays.
        let mut bad = ruleset(&policies[0], PROXY_PORT);
        bad.chains[1].rules.push(
            nfbatch::Rule::new()
                .add_flow("nope", false, nfbatch::IPPROTO_TCP)
                .accept(),
        );
        let (err, after) = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let sock = nfbatch::socket().unwrap();
            let err = bad.load(&sock).unwrap_err();
            let out = std::process::Command::new(nft)
                .args(["list", "ruleset"])
                .output()
                .unwrap();
            (err, String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .join()
        .unwrap();
        assert!(err.contains("add @nope"), "{err}");
        assert!(err.contains("No such file or directory"), "{err}");
        assert_eq!(after.trim(), "", "the refused batch left a ruleset");
    }
}
