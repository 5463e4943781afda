//! The kernel's refusal counts in a turn's namespace, read over nfnetlink
//! (issue 26, cost).
//!
//! The turn's ruleset refuses what the proxy and the relay do not take and
//! adds each refused destination to a set with a counter (`tcp4`, `tcp6`,
//! `udp4`, `udp6`), the rest to the named counter `refused_other`. At the
//! turn's end these are read here, with two kinds of requests on one
//! `NETLINK_NETFILTER` socket opened in the namespace when the egress was
//! set up: a `GETSETELEM` dump per set and a `GETOBJ` for the counter.
//! Listing the table through libnftables instead (`nft -j list table`)
//! took 1.2–1.9 ms at the end of every turn (its first JSON listing in a
//! process, and a thread entering the namespace); this takes tens of
//! microseconds, on the caller's thread.
//!
//! Only what the ruleset made is read, and every length is checked: a
//! message that does not parse is an error, never a guess.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

use super::nfbatch::{self, message, nft};

const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NFPROTO_INET: u8 = 1;
const NFT_OBJECT_COUNTER: u32 = 1;
// Attribute numbers of <linux/netfilter/nf_tables.h>.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_EXPR: u16 = 7;
const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
/// The type bits of `nla_type` (the rest are the nested and byte-order
/// flags).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// One refused destination: address, port, packets refused.
pub type Refusal = (IpAddr, u16, u64);

/// What the kernel refused: per set, its elements; and the named counter.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Refused {
    pub sets: Vec<(String, Vec<Refusal>)>,
    pub other: u64,
}

/// A `NETLINK_NETFILTER` socket of one network namespace.
#[derive(Debug)]
pub struct Reader {
    sock: OwnedFd,
}

impl Reader {
    /// Reads through `sock`, a `NETLINK_NETFILTER` socket of the namespace
    /// ([`super::nfbatch::socket`]: it stays in that namespace whichever
    /// thread uses it later).
    pub fn new(sock: OwnedFd) -> Self {
        Self { sock }
    }

    /// The ruleset's generation (`NFT_MSG_GETGEN`): the cheapest question
    /// nf_tables answers, and only nf_tables.
    pub fn generation(&self) -> Result<u32, String> {
        let msg = request(NFT_MSG_GETGEN, NLM_F_REQUEST, 1, &[], &[]);
        let mut id = None;
        self.exchange(&msg, 1, false, |ty, body| {
            if ty == nft(NFT_MSG_NEWGEN) {
                let v = find(body, NFTA_GEN_ID)?.ok_or("no generation id")?;
                let b: [u8; 4] = v
                    .try_into()
                    .map_err(|_| "a generation id of the wrong size")?;
                id = Some(u32::from_be_bytes(b));
            }
            Ok(())
        })?;
        id.ok_or_else(|| "no answer".to_owned())
    }

    /// Reads `sets` and the named counter `counter` of table `inet table`.
    pub fn read(&self, table: &str, sets: &[&str], counter: &str) -> Result<Refused, String> {
        let mut out = Refused::default();
        let mut seq = 0;
        for set in sets {
            seq += 1;
            let msg = request(
                NFT_MSG_GETSETELEM,
                NLM_F_REQUEST | NLM_F_DUMP,
                seq,
                &[
                    (NFTA_SET_ELEM_LIST_TABLE, table),
                    (NFTA_SET_ELEM_LIST_SET, set),
                ],
                &[],
            );
            let mut elems = Vec::new();
            self.exchange(&msg, seq, true, |ty, body| {
                if ty == nft(NFT_MSG_NEWSETELEM) {
                    elems.extend(set_elements(body)?);
                }
                Ok(())
            })
            .map_err(|e| format!("set {set}: {e}"))?;
            out.sets.push(((*set).to_owned(), elems));
        }
        seq += 1;
        let msg = request(
            NFT_MSG_GETOBJ,
            NLM_F_REQUEST,
            seq,
            &[(NFTA_OBJ_TABLE, table), (NFTA_OBJ_NAME, counter)],
            &[(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER)],
        );
        let mut packets = None;
        self.exchange(&msg, seq, false, |ty, body| {
            if ty == nft(NFT_MSG_NEWOBJ) {
                packets = Some(object_packets(body)?);
            }
            Ok(())
        })
        .map_err(|e| format!("counter {counter}: {e}"))?;
        out.other = packets.ok_or_else(|| format!("counter {counter}: no answer"))?;
        Ok(out)
    }

    /// Sends `msg` and hands every answer of sequence `seq` to `each`
    /// (type, payload after the nfgenmsg header) until a dump's DONE or,
    /// for a plain request, its one answer.
    fn exchange(
        &self,
        msg: &[u8],
        seq: u32,
        dump: bool,
        mut each: impl FnMut(u16, &[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let fd = self.sock.as_raw_fd();
        // SAFETY: sending our own buffer; the kernel is the default peer.
        let n = unsafe { nix::libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receiving into our own buffer.
            let n = unsafe { nix::libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.to_string());
            }
            let mut rest = buf.get(..n as usize).unwrap_or_default();
            while !rest.is_empty() {
                let (ty, got_seq, payload, next) = message(rest)?;
                rest = next;
                if got_seq != seq {
                    continue;
                }
                match ty {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .ok_or("a short error message")?;
                        if errno == 0 {
                            return Ok(());
                        }
                        return Err(std::io::Error::from_raw_os_error(-errno).to_string());
                    }
                    _ => {
                        // nfgenmsg (4 bytes) first.
                        each(ty, payload.get(4..).ok_or("a short message")?)?;
                        if !dump {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

/// An nftables request: nlmsghdr, nfgenmsg (inet), string and other
/// attributes.
fn request(ty: u16, flags: u16, seq: u32, strs: &[(u16, &str)], u32s: &[(u16, u32)]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    nfbatch::message_into(&mut m, nft(ty), flags, seq, NFPROTO_INET, 0, |m| {
        for (t, s) in strs {
            nfbatch::put_str(m, *t, s);
        }
        for (t, v) in u32s {
            nfbatch::put_u32(m, *t, *v);
        }
    });
    m
}

/// The attributes of `b`: (type without flags, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), String>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        let Some(h) = b.get(..4) else {
            b = &[];
            return Some(Err("a short attribute header".into()));
        };
        let len = usize::from(u16::from_ne_bytes([h[0], h[1]]));
        let ty = u16::from_ne_bytes([h[2], h[3]]) & NLA_TYPE_MASK;
        let Some(payload) = b.get(4..len).filter(|_| len >= 4) else {
            b = &[];
            return Some(Err(format!("an attribute of {len} bytes")));
        };
        b = b.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some(Ok((ty, payload)))
    })
}

/// The attribute `ty` of `b`, if there.
fn find(b: &[u8], ty: u16) -> Result<Option<&[u8]>, String> {
    for a in attrs(b) {
        let (t, v) = a?;
        if t == ty {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

fn be_u64(b: &[u8]) -> Result<u64, String> {
    let a: [u8; 8] = b
        .try_into()
        .map_err(|_| format!("a counter of {} bytes", b.len()))?;
    Ok(u64::from_be_bytes(a))
}

/// The packets of a `counter` expression's data.
fn counter_packets(data: &[u8]) -> Result<u64, String> {
    be_u64(find(data, NFTA_COUNTER_PACKETS)?.ok_or("a counter without packets")?)
}

/// The packets of a set element's counter (one expression, or a list).
fn element_packets(elem: &[u8]) -> Result<Option<u64>, String> {
    let expr = |e: &[u8]| -> Result<Option<u64>, String> {
        if find(e, NFTA_EXPR_NAME)? != Some(b"counter\0") {
            return Ok(None);
        }
        find(e, NFTA_EXPR_DATA)?.map(counter_packets).transpose()
    };
    if let Some(e) = find(elem, NFTA_SET_ELEM_EXPR)? {
        return expr(e);
    }
    if let Some(list) = find(elem, NFTA_SET_ELEM_EXPRESSIONS)? {
        for a in attrs(list) {
            let (t, e) = a?;
            if t == NFTA_LIST_ELEM {
                if let Some(p) = expr(e)? {
                    return Ok(Some(p));
                }
            }
        }
    }
    Ok(None)
}

/// An `ipv4_addr . inet_service` or `ipv6_addr . inet_service` key: the
/// address, then the port in network order padded to 4 bytes.
fn key(v: &[u8]) -> Result<(IpAddr, u16), String> {
    let port = |p: &[u8]| u16::from_be_bytes([p[0], p[1]]);
    match v.len() {
        8 => Ok((
            IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3])),
            port(&v[4..6]),
        )),
        20 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&v[..16]);
            Ok((IpAddr::V6(Ipv6Addr::from(a)), port(&v[16..18])))
        }
        n => Err(format!("a set key of {n} bytes")),
    }
}

/// The elements of one `NEWSETELEM` message's payload.
fn set_elements(body: &[u8]) -> Result<Vec<Refusal>, String> {
    let mut out = Vec::new();
    let Some(list) = find(body, NFTA_SET_ELEM_LIST_ELEMENTS)? else {
        return Ok(out);
    };
    for a in attrs(list) {
        let (t, elem) = a?;
        if t != NFTA_LIST_ELEM {
            continue;
        }
        let k = find(elem, NFTA_SET_ELEM_KEY)?.ok_or("an element without a key")?;
        let v = find(k, NFTA_DATA_VALUE)?.ok_or("a key without a value")?;
        let (ip, port) = key(v)?;
        // A set element without a counter was refused at least once.
        let packets = element_packets(elem)?.unwrap_or(1);
        out.push((ip, port, packets));
    }
    Ok(out)
}

/// The packets of a `NEWOBJ` (counter) message's payload.
fn object_packets(body: &[u8]) -> Result<u64, String> {
    counter_packets(find(body, NFTA_OBJ_DATA)?.ok_or("an object without data")?)
}

/// Parses `b` as a stream of nftables answers (the fuzz target's entry):
/// never panics, whatever the bytes.
pub fn fuzz_one(b: &[u8]) -> usize {
    let mut rest = b;
    let mut n = 0;
    while let Ok((_, _, payload, next)) = message(rest) {
        if let Some(body) = payload.get(4..) {
            n += set_elements(body).map_or(0, |v| v.len());
            n += usize::from(object_packets(body).is_ok());
        }
        if next.len() >= rest.len() {
            break;
        }
        rest = next;
    }
    n
}

#[cfg(test)]
mod tests {
    /// In a network namespace of its own (root, nftables): refusals added
    /// to the sets and the counter by real packets are read back, as the
    /// turn's end reads them.
    #[test]
    fn issue_26_refusal_counts_are_read_over_nfnetlink() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(
                std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
                "root is required (nftables in a network namespace of its own)"
            );
            return;
        }
        let got = std::thread::spawn(|| {
            use super::super::nfbatch::{
                Chain, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, Rule, Table,
            };
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            crate::sandbox::sys::loopback_up().unwrap();
            super::super::rtnl::local_default_routes().unwrap();
            let loopback = |v6: bool| {
                if v6 {
                    Rule::new().daddr(std::net::Ipv6Addr::LOCALHOST.into(), 128)
                } else {
                    Rule::new().daddr(std::net::Ipv4Addr::new(127, 0, 0, 0).into(), 8)
                }
            };
            let flow = |set: &str, v6: bool| {
                Rule::new()
                    .nfproto(v6)
                    .l4proto(IPPROTO_TCP)
                    .add_flow(set, v6, IPPROTO_TCP)
                    .reset()
            };
            let table = Table {
                name: "t".into(),
                sets: vec![
                    ("tcp4".into(), false, 16),
                    ("tcp6".into(), true, 16),
                    ("empty".into(), false, 16),
                ],
                counters: vec!["other".into()],
                chains: vec![Chain {
                    name: "o".into(),
                    kind: "filter",
                    priority: 0,
                    rules: vec![
                        loopback(false).accept(),
                        loopback(true).accept(),
                        Rule::new().l4proto(IPPROTO_ICMP).accept(),
                        Rule::new().l4proto(IPPROTO_ICMPV6).accept(),
                        Rule::new().not_a_first_syn().accept(),
                        flow("tcp4", false),
                        flow("tcp6", true),
                        Rule::new().count("other").reject(),
                    ],
                }],
            };
            let sock = super::super::nfbatch::socket().unwrap();
            table.load(&sock).unwrap();
            let reader = super::Reader::new(sock);
            for (addr, times) in [("192.0.2.7:8443", 3), ("[2001:db8::9]:22", 1)] {
                for _ in 0..times {
                    let e = std::net::TcpStream::connect(addr).unwrap_err();
                    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{addr}");
                }
            }
            let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let _ = udp.send_to(b"x", "192.0.2.8:53");
            let _ = udp.send_to(b"x", "192.0.2.8:53");
            let read = reader
                .read("t", &["tcp4", "tcp6", "empty"], "other")
                .unwrap();
            let missing = reader.read("t", &["nope"], "other").unwrap_err();
            (read, missing)
        })
        .join()
        .unwrap();
        let (read, missing) = got;
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(
            read,
            super::Refused {
                sets: vec![
                    ("tcp4".into(), vec![(ip("192.0.2.7"), 8443, 3)]),
                    ("tcp6".into(), vec![(ip("2001:db8::9"), 22, 1)]),
                    ("empty".into(), vec![]),
                ],
                other: 2,
            }
        );
        assert!(missing.contains("set nope"), "{missing}");
    }

    fn attr(t: u16, v: &[u8]) -> Vec<u8> {
        let mut a = ((4 + v.len()) as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(&t.to_ne_bytes());
        a.extend_from_slice(v);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    #[test]
    fn issue_26_malformed_answers_are_errors_not_panics() {
        use super::*;
        assert!(message(&[0; 8]).is_err());
        let mut m = vec![0u8; 20];
        m[..4].copy_from_slice(&200u32.to_ne_bytes());
        assert!(message(&m).is_err());
        let elements = |value: &[u8]| {
            attr(
                NFTA_SET_ELEM_LIST_ELEMENTS,
                &attr(
                    NFTA_LIST_ELEM,
                    &attr(NFTA_SET_ELEM_KEY, &attr(NFTA_DATA_VALUE, value)),
                ),
            )
        };
        // A well-formed element without a counter: refused once.
        assert_eq!(
            set_elements(&elements(&[192, 0, 2, 1, 0x01, 0xbb, 0, 0])),
            Ok(vec![("192.0.2.1".parse().unwrap(), 443, 1)])
        );
        let bad = set_elements(&elements(&[1, 2, 3])).unwrap_err();
        assert!(bad.contains("3 bytes"), "{bad}");
        // An attribute shorter than its own header.
        assert!(set_elements(&[2, 0, 3, 0]).is_err());
        assert!(
            object_packets(&attr(NFTA_OBJ_DATA, &attr(NFTA_COUNTER_PACKETS, &[1, 2]))).is_err()
        );
        for seed in 0u8..=255 {
            let junk: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(seed) ^ seed).collect();
            let _ = fuzz_one(&junk);
        }
    }
}
