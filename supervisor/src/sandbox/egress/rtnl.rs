//! Two routes by rtnetlink, in the calling thread's network namespace:
//! every IPv4 and IPv6 address is local (`local 0.0.0.0/0 dev lo`,
//! `local ::/0 dev lo`), so a turn's connect reaches its namespace's
//! nftables and never a real interface (there is none). And, in the
//! supervisor's own namespace, the kernel's route to one address
//! ([`delivered_here`], `ip route get`): whether the host receives it
//! itself.

use std::os::fd::AsRawFd;

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTN_BROADCAST: u8 = 3;
const RTN_ANYCAST: u8 = 4;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const RT_TABLE_LOCAL: u8 = 255;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;

fn route_msg(family: u8, seq: u32, ifindex: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(36);
    // nlmsghdr (length filled below).
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&RTM_NEWROUTE.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // rtmsg: family, dst_len 0, src_len, tos, table, protocol, scope, type,
    // flags.
    m.extend_from_slice(&[
        family,
        0,
        0,
        0,
        RT_TABLE_LOCAL,
        RTPROT_BOOT,
        RT_SCOPE_HOST,
        RTN_LOCAL,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    // RTA_OIF.
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&RTA_OIF.to_ne_bytes());
    m.extend_from_slice(&ifindex.to_ne_bytes());
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    m
}

/// Adds the two local default routes on `lo`.
/// Sends one netlink request on `sock` and reads the kernel's one reply
/// into `buf`; the reply's length.
fn exchange(sock: &impl AsRawFd, msg: &[u8], buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: sending our own buffer; the kernel is the default peer.
    let n = unsafe { nix::libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: receiving into our own buffer, at most its length.
    let n = unsafe { nix::libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub fn local_default_routes() -> std::io::Result<()> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType};
    let sock = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    // `lo` is interface 1 in every network namespace.
    let lo = 1;
    for (seq, family) in [
        (1u32, nix::libc::AF_INET as u8),
        (2, nix::libc::AF_INET6 as u8),
    ] {
        let msg = route_msg(family, seq, lo);
        let mut buf = [0u8; 512];
        let n = exchange(&sock, &msg, &mut buf)?;
        // nlmsghdr (16) then the error's errno (i32, 0 for the ack).
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        if ty == NLMSG_ERROR && n >= 20 {
            let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            if errno != 0 {
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
        }
    }
    Ok(())
}

/// Whether the calling thread's network namespace delivers `ip` to itself
/// (`ip route get ADDR` answers `local`, `anycast` or `broadcast`): not only
/// its interfaces' addresses, but every address a `local` route covers
/// (`ip route add local 198.51.100.64/26 dev lo`, "AnyIP": a service
/// bound to 0.0.0.0 answers on each of them) and the IPv6 subnet-router
/// anycast addresses of a forwarding host. No route (unreachable) is not
/// local; a question the kernel cannot be asked is `Err` (the caller
/// refuses: fail closed).
pub fn delivered_here(ip: std::net::IpAddr) -> std::io::Result<bool> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType};
    let sock = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    let (family, addr, bits) = match ip {
        std::net::IpAddr::V4(a) => (nix::libc::AF_INET as u8, a.octets().to_vec(), 32),
        std::net::IpAddr::V6(a) => (nix::libc::AF_INET6 as u8, a.octets().to_vec(), 128),
    };
    let mut m = Vec::with_capacity(48);
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type,
    // flags.
    m.extend_from_slice(&[family, bits, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&((4 + addr.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&RTA_DST.to_ne_bytes());
    m.extend_from_slice(&addr);
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    let mut buf = [0u8; 1024];
    let n = exchange(&sock, &m, &mut buf)?;
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    match ty {
        // nlmsghdr (16), then rtmsg: its type is the 8th byte.
        RTM_NEWROUTE if n >= 16 + 12 => Ok(matches!(
            buf[16 + 7],
            RTN_LOCAL | RTN_ANYCAST | RTN_BROADCAST
        )),
        // No route to it (ENETUNREACH, EHOSTUNREACH, …): not local.
        NLMSG_ERROR if n >= 20 => {
            let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            if errno == 0 {
                Err(std::io::Error::other("an empty answer to a route lookup"))
            } else {
                Ok(false)
            }
        }
        _ => Err(std::io::Error::other(format!(
            "an unexpected answer ({ty}) to a route lookup"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_26_the_hosts_own_addresses_are_delivered_here() {
        for ip in ["127.0.0.1", "127.9.9.9", "::1"] {
            assert!(delivered_here(ip.parse().unwrap()).unwrap(), "{ip}");
        }
        // A documentation address no host holds: routed elsewhere, or
        // unreachable.
        assert!(!delivered_here("203.0.113.254".parse().unwrap()).unwrap());
        assert!(!delivered_here("2001:db8:dead::1".parse().unwrap()).unwrap());
    }
}
