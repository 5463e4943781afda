//! UDP egress for `/udp` entries (issue 26): a relay in the turn's network
//! namespace, transparent to the turn.
//!
//! Every address is local in the namespace (`local 0.0.0.0/0` on `lo`),
//! so a socket the supervisor binds there to `0.0.0.0:PORT` (and `[::]:PORT`
//! for an IPv6 network entry) receives every datagram the turn sends to
//! any address on `PORT`, and `IP_PKTINFO` / `IPV6_RECVPKTINFO` say which
//! address it was sent to — no NAT, no conntrack. nftables lets through
//! only datagrams to a synthetic address on a port a `/udp` name entry
//! lists, or to a `/udp` network on its ports; the rest is refused by the
//! kernel as before (EPERM) and counted.
//!
//! The relay decides each new flow (client address and port, destination
//! address and port) like the proxy decides a connection: a synthetic
//! address back to its name, the name's `/udp` entry on that port, the
//! name resolved by the supervisor and its answers checked (never
//! loopback, link-local or unspecified through a name; private only where
//! listed, as for TCP); a literal address only under a `/udp` network
//! entry. An allowed flow gets an upstream socket of its own in the
//! supervisor's namespace, connected to the real destination; replies go
//! back to the turn's socket from the address and port it sent to
//! (`IP_PKTINFO` on send). A refused datagram is answered at once with an
//! ICMP port unreachable the relay writes (ECONNREFUSED on the turn's
//! connected socket, as the kernel would), and recorded with its hint.
//!
//! Bounded: [`MAX_UDP_FLOWS`] flows at once per turn, each ending after
//! [`UDP_IDLE`] without a datagram either way, datagrams up to 64 KiB
//! (longer ones are dropped), [`MAX_PENDING`] datagrams queued while a flow
//! resolves its name. Each flow is one [`super::Flow`] (protocol `udp`) with
//! bytes each way and its first and last time.

use std::collections::{BTreeSet, HashMap};
use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockProtocol, SockType,
    SockaddrIn, SockaddrIn6, SockaddrStorage, recvmsg, sendmsg, sendto, setsockopt, socket,
    sockopt,
};

use super::{Decision, Shared, synthetic};
use turnstile_policy::manifest::Transport;

/// The mark on the relay's sockets: nftables lets their datagrams (the
/// replies, from the addresses the turn sent to) and refusals through.
pub const MARK: u32 = 0x7473_7564;
/// UDP flows relayed at once per turn; more are refused and recorded.
pub const MAX_UDP_FLOWS: usize = 256;
/// A flow without a datagram either way for this long ends.
pub const UDP_IDLE: Duration = Duration::from_secs(30);
/// Datagrams queued for a flow while it resolves its name.
pub const MAX_PENDING: usize = 16;
/// The largest datagram relayed (a longer one is dropped).
const MAX_DATAGRAM: usize = 65_536;

/// The relay's sockets, made inside the turn's namespace.
#[derive(Debug)]
pub struct Sockets {
    relays: Vec<Arc<UdpSocket>>,
    /// Raw ICMP and ICMPv6 sockets for the refusals.
    icmp: Option<OwnedFd>,
    icmp6: Option<OwnedFd>,
}

fn errno(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// A datagram socket for the relay or the resolver, `SO_REUSEADDR` (the
/// resolver's 127.0.0.53:53 and a relay on `0.0.0.0:53` coexist; the more
/// specific address gets its datagrams), bound to `at`.
pub fn bound(at: SocketAddr, relay: bool) -> std::io::Result<UdpSocket> {
    let fam = if at.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(fam, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(errno)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(errno)?;
    if relay {
        setsockopt(&fd, sockopt::Mark, &MARK).map_err(errno)?;
        if at.is_ipv4() {
            setsockopt(&fd, sockopt::Ipv4PacketInfo, &true).map_err(errno)?;
            // Replies are sent from whatever address the turn sent to.
            setsockopt(&fd, sockopt::IpFreebind, &true).map_err(errno)?;
        } else {
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(errno)?;
            setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true).map_err(errno)?;
            const IPV6_FREEBIND: nix::libc::c_int = 78;
            let on: nix::libc::c_int = 1;
            // SAFETY: an int option of its own size on a socket we own.
            unsafe {
                nix::libc::setsockopt(
                    fd.as_raw_fd(),
                    nix::libc::IPPROTO_IPV6,
                    IPV6_FREEBIND,
                    (&raw const on).cast(),
                    std::mem::size_of_val(&on) as nix::libc::socklen_t,
                );
            }
        }
    }
    let sock = UdpSocket::from(fd);
    // std's bind takes a fresh socket; bind this one through nix.
    match at {
        SocketAddr::V4(a) => nix::sys::socket::bind(sock.as_raw_fd(), &SockaddrIn::from(a)),
        SocketAddr::V6(a) => nix::sys::socket::bind(sock.as_raw_fd(), &SockaddrIn6::from(a)),
    }
    .map_err(errno)?;
    Ok(sock)
}

/// Makes the relay's sockets for `ports` (in the turn's namespace: call
/// from a thread inside it).
pub fn sockets(ports: &BTreeSet<u16>, v6: bool) -> std::io::Result<Sockets> {
    let mut relays = Vec::new();
    for &p in ports {
        relays.push(Arc::new(bound(
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, p)),
            true,
        )?));
        if v6 {
            relays.push(Arc::new(bound(
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, p)),
                true,
            )?));
        }
    }
    // Raw sockets that only send the port-unreachable answers: nothing is
    // read from them, so every ICMP type is filtered out (ICMP_FILTER is a
    // u32 mask; ICMP6_FILTER an icmp6_filter of 8 u32, the kernel fills in
    // the checksum of what is sent).
    const ICMP_FILTER: nix::libc::c_int = 1;
    const ICMP6_FILTER: nix::libc::c_int = 1;
    let icmp = (!relays.is_empty())
        .then(|| {
            icmp_sender(
                AddressFamily::Inet,
                SockProtocol::Icmp,
                nix::libc::SOL_RAW,
                ICMP_FILTER,
                &[u32::MAX],
            )
        })
        .transpose()?;
    let icmp6 = (v6 && !ports.is_empty())
        .then(|| {
            icmp_sender(
                AddressFamily::Inet6,
                SockProtocol::IcmpV6,
                nix::libc::IPPROTO_ICMPV6,
                ICMP6_FILTER,
                &[u32::MAX; 8],
            )
        })
        .transpose()?;
    Ok(Sockets {
        relays,
        icmp,
        icmp6,
    })
}

/// A raw ICMP socket of `family`, marked (the ruleset lets it through),
/// with `filter` (all types blocked) set at `level`/`option`.
fn icmp_sender(
    family: AddressFamily,
    protocol: SockProtocol,
    level: nix::libc::c_int,
    option: nix::libc::c_int,
    filter: &[u32],
) -> std::io::Result<OwnedFd> {
    let fd = socket(family, SockType::Raw, SockFlag::SOCK_CLOEXEC, protocol).map_err(errno)?;
    setsockopt(&fd, sockopt::Mark, &MARK).map_err(errno)?;
    // SAFETY: `filter` is read for its own size, on a socket we own.
    unsafe {
        nix::libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            filter.as_ptr().cast(),
            std::mem::size_of_val(filter) as nix::libc::socklen_t,
        );
    }
    Ok(fd)
}

type Key = (SocketAddr, SocketAddr);

#[derive(Debug)]
struct UdpFlow {
    state: Mutex<State>,
    bytes_out: AtomicU64,
    /// Time of the last datagram either way, as µs since the flow began.
    last: AtomicU64,
    began: Instant,
}

#[derive(Debug, Default)]
struct State {
    up: Option<UdpSocket>,
    pending: Vec<Vec<u8>>,
}

impl UdpFlow {
    fn touch(&self) {
        self.last
            .store(self.began.elapsed().as_micros() as u64, Ordering::SeqCst);
    }

    fn last(&self) -> Instant {
        self.began + Duration::from_micros(self.last.load(Ordering::SeqCst))
    }
}

#[derive(Debug)]
struct Relay {
    shared: Arc<Shared>,
    flows: Mutex<HashMap<Key, Arc<UdpFlow>>>,
    icmp: Option<OwnedFd>,
    icmp6: Option<OwnedFd>,
}

/// Runs the relay until the turn's egress stops.
pub fn run(shared: Arc<Shared>, socks: Sockets) {
    let relay = Arc::new(Relay {
        shared,
        flows: Mutex::new(HashMap::new()),
        icmp: socks.icmp,
        icmp6: socks.icmp6,
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        if relay.shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut fds: Vec<PollFd> = socks
            .relays
            .iter()
            .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.push(PollFd::new(relay.shared.wake.0.as_fd(), PollFlags::POLLIN));
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready.last().copied().unwrap_or(true) {
            return;
        }
        for (i, sock) in socks.relays.iter().enumerate() {
            if !ready[i] {
                continue;
            }
            while let Some((n, from, to)) = receive(sock, &mut buf) {
                if let Some(n) = n {
                    relay.datagram(sock, from, to, &buf[..n]);
                }
            }
        }
    }
}

/// One datagram from the relay socket: `(length or None when too long,
/// source, original destination)`; `None` when nothing is left to read.
fn receive(sock: &UdpSocket, buf: &mut [u8]) -> Option<(Option<usize>, SocketAddr, SocketAddr)> {
    let port = sock.local_addr().ok()?.port();
    let mut cmsg = nix::cmsg_space!(nix::libc::in6_pktinfo);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )
    .ok()?;
    let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
    let from = msg.address.and_then(|a| {
        a.as_sockaddr_in()
            .map(|v4| SocketAddr::V4(SocketAddrV4::from(*v4)))
            .or_else(|| {
                a.as_sockaddr_in6()
                    .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
            })
    });
    let mut to = None;
    for c in msg.cmsgs().ok()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(pi) => {
                to = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr))));
            }
            ControlMessageOwned::Ipv6PacketInfo(pi) => {
                to = Some(IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    let n = msg.bytes;
    match (from, to) {
        (Some(from), Some(to)) => {
            Some(((!truncated).then_some(n), from, SocketAddr::new(to, port)))
        }
        // Unreadable: skip it, keep reading.
        _ => Some((
            None,
            SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::from(([0, 0, 0, 0], 0)),
        )),
    }
}

/// Sends `data` to `client` from `from` (the address it sent to) through
/// the relay socket.
fn reply(sock: &UdpSocket, client: SocketAddr, from: IpAddr, data: &[u8]) -> bool {
    let iov = [IoSlice::new(data)];
    let fd = sock.as_raw_fd();
    match (client, from) {
        (SocketAddr::V4(c), IpAddr::V4(f)) => {
            let pi = nix::libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: nix::libc::in_addr {
                    s_addr: u32::from(f).to_be(),
                },
                ipi_addr: nix::libc::in_addr { s_addr: 0 },
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv4PacketInfo(&pi)],
                MsgFlags::empty(),
                Some(&SockaddrIn::from(c)),
            )
            .is_ok()
        }
        (SocketAddr::V6(c), IpAddr::V6(f)) => {
            let pi = nix::libc::in6_pktinfo {
                ipi6_addr: nix::libc::in6_addr {
                    s6_addr: f.octets(),
                },
                ipi6_ifindex: 0,
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv6PacketInfo(&pi)],
                MsgFlags::empty(),
                Some(&SockaddrIn6::from(c)),
            )
            .is_ok()
        }
        _ => false,
    }
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMPv6 port unreachable for the datagram `client` sent to `dst`
/// (`len` bytes), its checksum left to the kernel.
pub fn port_unreachable6(client: SocketAddrV6, dst: SocketAddrV6, len: usize) -> Vec<u8> {
    let mut m = vec![1, 4, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0];
    m.extend_from_slice(&((8 + len).min(0xffff) as u16).to_be_bytes());
    m.extend_from_slice(&[17, 64]);
    m.extend_from_slice(&client.ip().octets());
    m.extend_from_slice(&dst.ip().octets());
    m.extend_from_slice(&client.port().to_be_bytes());
    m.extend_from_slice(&dst.port().to_be_bytes());
    m.extend_from_slice(&((8 + len).min(0xffff) as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    m
}

/// An ICMP port unreachable for the datagram `client` sent to `dst`
/// (`len` bytes): what the kernel would answer with nothing listening.
pub fn port_unreachable(client: SocketAddrV4, dst: SocketAddrV4, len: usize) -> Vec<u8> {
    let mut m = vec![3, 3, 0, 0, 0, 0, 0, 0];
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + len).min(0xffff) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&client.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    m.extend_from_slice(&ip);
    m.extend_from_slice(&client.port().to_be_bytes());
    m.extend_from_slice(&dst.port().to_be_bytes());
    m.extend_from_slice(&((8 + len).min(0xffff) as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0]);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

impl Relay {
    /// Refuses the datagram `client` sent to `dst` at once: an ICMP port
    /// unreachable, as the kernel answers with nothing listening.
    fn refuse(&self, client: SocketAddr, dst: SocketAddr, len: usize) {
        match (client, dst) {
            (SocketAddr::V4(c), SocketAddr::V4(d)) => {
                if let Some(icmp) = &self.icmp {
                    let _ = sendto(
                        icmp.as_raw_fd(),
                        &port_unreachable(c, d, len),
                        &SockaddrIn::from(SocketAddrV4::new(*c.ip(), 0)),
                        MsgFlags::empty(),
                    );
                }
            }
            (SocketAddr::V6(c), SocketAddr::V6(d)) => {
                if let Some(icmp) = &self.icmp6 {
                    let _ = sendto(
                        icmp.as_raw_fd(),
                        &port_unreachable6(c, d, len),
                        &SockaddrIn6::from(SocketAddrV6::new(*c.ip(), 0, 0, 0)),
                        MsgFlags::empty(),
                    );
                }
            }
            _ => {}
        }
    }

    fn deny(
        &self,
        name: Option<&str>,
        client: SocketAddr,
        dst: SocketAddr,
        d: &Decision,
        len: usize,
    ) {
        let s = &self.shared;
        s.record(s.flow(
            name,
            dst.ip().to_string(),
            dst.port(),
            "udp",
            d,
            Instant::now(),
        ));
        self.refuse(client, dst, len);
    }

    fn datagram(
        self: &Arc<Self>,
        sock: &Arc<UdpSocket>,
        client: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
    ) {
        let key = (client, dst);
        let have = self.flows.lock().ok().and_then(|f| f.get(&key).cloned());
        if let Some(flow) = have {
            let Ok(mut st) = flow.state.lock() else {
                return;
            };
            match &st.up {
                Some(up) if up.send(data).is_ok() => {
                    flow.bytes_out
                        .fetch_add(data.len() as u64, Ordering::SeqCst);
                }
                Some(_) => {}
                None if st.pending.len() < MAX_PENDING => st.pending.push(data.to_vec()),
                None => {}
            }
            flow.touch();
            return;
        }
        // A new flow: decide.
        let ip = dst.ip();
        let name = synthetic(ip).map(|a| {
            self.shared
                .names
                .lock()
                .ok()
                .and_then(|n| n.by_addr.get(&a).cloned())
        });
        if name.is_none() && (ip.is_loopback() || ip.to_canonical().is_loopback()) {
            // The turn's own loopback on a relayed port, nothing of its
            // own listening: as the kernel would answer.
            return self.refuse(client, dst, data.len());
        }
        let policy = &self.shared.policy;
        let (name, decision) = match name {
            Some(None) => (
                None,
                Decision::Denied {
                    rule: format!("{ip} is not an address the turn's resolver gave"),
                    hint: None,
                },
            ),
            Some(Some(n)) => {
                let d = policy.decide_udp_name(&n, dst.port());
                (Some(n), d)
            }
            None => (None, policy.decide_udp_ip(ip, dst.port())),
        };
        if let Decision::Denied { .. } = decision {
            return self.deny(name.as_deref(), client, dst, &decision, data.len());
        }
        let flow = {
            let Ok(mut flows) = self.flows.lock() else {
                return;
            };
            if flows.len() >= MAX_UDP_FLOWS {
                drop(flows);
                let d = Decision::Denied {
                    rule: format!("more than {MAX_UDP_FLOWS} UDP flows at once"),
                    hint: None,
                };
                return self.deny(name.as_deref(), client, dst, &d, data.len());
            }
            let f = Arc::new(UdpFlow {
                state: Mutex::new(State::default()),
                bytes_out: AtomicU64::new(0),
                last: AtomicU64::new(0),
                began: Instant::now(),
            });
            flows.insert(key, Arc::clone(&f));
            f
        };
        let (relay, sock, first) = (Arc::clone(self), Arc::clone(sock), data.to_vec());
        relay.shared.active.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            relay.flow(&sock, key, name, decision, first, &flow);
            if let Ok(mut flows) = relay.flows.lock() {
                flows.remove(&key);
            }
            relay.shared.active.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// One allowed flow: resolve, connect upstream, relay both ways until
    /// idle or the turn ends; record it.
    fn flow(
        &self,
        sock: &UdpSocket,
        (client, dst): Key,
        name: Option<String>,
        decision: Decision,
        first: Vec<u8>,
        flow: &UdpFlow,
    ) {
        let s = &self.shared;
        let at = flow.began;
        let port = dst.port();
        let target = match &name {
            Some(n) => match s.resolve(n) {
                Ok(addrs) => {
                    let ok = addrs.iter().find(|ip| {
                        s.policy
                            .address_ok_on(Transport::Udp, true, **ip, port)
                            .is_ok()
                    });
                    match ok {
                        Some(ip) => SocketAddr::new(*ip, port),
                        None => {
                            let bad = addrs.first().copied();
                            let why = bad
                                .and_then(|ip| {
                                    s.policy.address_ok_on(Transport::Udp, true, ip, port).err()
                                })
                                .unwrap_or_default();
                            let d = Decision::Denied {
                                rule: format!("{n} resolves to {why} (DNS rebinding refused)"),
                                hint: bad.and_then(|ip| super::cidr_hint(ip, port, "/udp")),
                            };
                            s.record(s.flow(
                                Some(n),
                                bad.map_or(String::new(), |ip| ip.to_string()),
                                port,
                                "udp",
                                &d,
                                at,
                            ));
                            return self.refuse(client, dst, first.len());
                        }
                    }
                }
                Err(e) => {
                    let mut f = s.flow(Some(n), String::new(), port, "udp", &decision, at);
                    f.error = Some(e.to_string());
                    s.record(f);
                    return self.refuse(client, dst, first.len());
                }
            },
            None => dst,
        };
        let up = UdpSocket::bind(if target.is_ipv4() {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
        })
        .and_then(|u| u.connect(target).map(|()| u));
        let up = match up.and_then(|u| u.try_clone().map(|c| (u, c))) {
            Ok(u) => u,
            Err(e) => {
                let mut f = s.flow(
                    name.as_deref(),
                    target.ip().to_string(),
                    port,
                    "udp",
                    &decision,
                    at,
                );
                f.error = Some(format!("{target}: {e}"));
                s.record(f);
                return self.refuse(client, dst, first.len());
            }
        };
        let (up, up_send) = up;
        let mut error = None;
        {
            let Ok(mut st) = flow.state.lock() else {
                return;
            };
            for d in std::iter::once(first).chain(std::mem::take(&mut st.pending)) {
                match up_send.send(&d) {
                    Ok(_) => {
                        flow.bytes_out.fetch_add(d.len() as u64, Ordering::SeqCst);
                    }
                    Err(e) => error = Some(format!("{target}: {e}")),
                }
            }
            st.up = Some(up_send);
        }
        flow.touch();
        let mut bytes_in = 0u64;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
            let idle = flow.last().elapsed();
            if idle >= UDP_IDLE || s.stop.load(Ordering::SeqCst) {
                break;
            }
            let left = (UDP_IDLE - idle).as_millis().min(60_000) as u16;
            let mut fds = [
                PollFd::new(up.as_fd(), PollFlags::POLLIN),
                PollFd::new(s.wake.0.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::from(left.max(1))) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => break,
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                break;
            }
            if fds[0].revents().is_none_or(|r| r.is_empty()) {
                continue;
            }
            match up.recv(&mut buf) {
                Ok(n) => {
                    if reply(sock, client, dst.ip(), &buf[..n]) {
                        bytes_in += n as u64;
                    }
                    flow.touch();
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::ECONNREFUSED) => {
                    // Nothing listens upstream: tell the turn so.
                    error = Some(format!("{target}: {e}"));
                    self.refuse(client, dst, 0);
                    flow.touch();
                }
                Err(e) => {
                    error = Some(format!("{target}: {e}"));
                    break;
                }
            }
        }
        let mut f = s.flow(
            name.as_deref(),
            target.ip().to_string(),
            port,
            "udp",
            &decision,
            at,
        );
        f.bytes_out = flow.bytes_out.load(Ordering::SeqCst);
        f.bytes_in = bytes_in;
        f.last = Some(flow.last());
        f.error = error;
        s.record(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_26_port_unreachable_carries_the_datagrams_header_and_sums_to_zero() {
        let m = port_unreachable(
            "127.0.0.1:40000".parse().unwrap(),
            "127.64.0.1:53".parse().unwrap(),
            5,
        );
        assert_eq!(m.len(), 8 + 20 + 8);
        assert_eq!((m[0], m[1]), (3, 3));
        assert_eq!(checksum(&m), 0);
        assert_eq!(checksum(&m[8..28]), 0);
        assert_eq!(&m[20..24], &[127, 0, 0, 1]);
        assert_eq!(&m[24..28], &[127, 64, 0, 1]);
        assert_eq!(u16::from_be_bytes([m[28], m[29]]), 40000);
        assert_eq!(u16::from_be_bytes([m[30], m[31]]), 53);
        let m = port_unreachable6(
            "[::1]:40000".parse().unwrap(),
            "[2001:db8::1]:53".parse().unwrap(),
            5,
        );
        assert_eq!(m.len(), 8 + 40 + 8);
        assert_eq!((m[0], m[1], m[8] >> 4, m[14]), (1, 4, 6, 17));
        assert_eq!(u16::from_be_bytes([m[50], m[51]]), 53);
    }
}
