//! The small part of the DNS wire format (RFC 1035) the turn's resolver
//! needs: one question in, an A answer, NODATA or NXDOMAIN out; and, as a
//! client of the upstream resolver, A/AAAA queries and the addresses in
//! their answers. Every read is bounds-checked; anything else is refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
pub const RCODE_NOERROR: u8 = 0;
pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_REFUSED: u8 = 5;

/// A query's one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Lower-case, without the trailing dot.
    pub name: String,
    /// Whether every label is a host-name label ([`host_label`]): only
    /// then is `name` (its labels joined with dots) the name the query
    /// asks for, and the name the supervisor resolves.
    pub host: bool,
    pub qtype: u16,
    /// Where the question ends in the message.
    question_end: usize,
    rd: bool,
}

/// Whether a label's bytes (on the wire) may be part of a name the
/// policy matches and the supervisor resolves: printable ASCII without a
/// dot. A label may hold any byte on the wire, a dot included, but a name
/// is matched and resolved as its labels joined with dots: a label `.`
/// made `..wild.test` match `*.wild.test` while the upstream lookup
/// (split on dots) asked for the apex `wild.test` (red-team wave 4, W1).
/// Bytes outside ASCII would be replaced when made text, so two names
/// would read alike.
pub fn host_label(label: &[u8]) -> bool {
    !label.is_empty()
        && label
            .iter()
            .all(|c| (0x21..=0x7e).contains(c) && *c != b'.')
}

/// Whether `name` (labels joined with dots) is a host name the supervisor
/// may resolve: its labels, split on dots, are what [`build_query`] asks.
pub fn host_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(|l| host_label(l.as_bytes()))
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Parses a query with exactly one question (names uncompressed, as
/// queries write them).
pub fn parse_query(b: &[u8]) -> Option<Query> {
    let id = u16_at(b, 0)?;
    let flags = u16_at(b, 2)?;
    // A query (QR 0), standard opcode, one question.
    if flags & 0x8000 != 0 || (flags >> 11) & 0xf != 0 || u16_at(b, 4)? != 1 {
        return None;
    }
    let mut i = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut host = true;
    loop {
        let len = *b.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        let label = b.get(i..i + len)?;
        host &= host_label(label);
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        i += len;
    }
    let name = labels.join(".");
    if name.len() > 253 {
        return None;
    }
    let qtype = u16_at(b, i)?;
    let _class = u16_at(b, i + 2)?;
    Some(Query {
        id,
        host: host && !name.is_empty(),
        name,
        qtype,
        question_end: i + 4,
        rd: flags & 0x0100 != 0,
    })
}

/// The answer to `q` (from the message `raw` it was parsed from): `rcode`,
/// and an A record for `a` when given and the question asks for A.
pub fn answer(q: &Query, raw: &[u8], rcode: u8, a: Option<Ipv4Addr>) -> Vec<u8> {
    let answers = u16::from(a.is_some() && q.qtype == TYPE_A && rcode == RCODE_NOERROR);
    let mut out = Vec::with_capacity(q.question_end + 16);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, RD as asked, RA, the rcode.
    let flags: u16 = 0x8000 | if q.rd { 0x0100 } else { 0 } | 0x0080 | u16::from(rcode & 0xf);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&answers.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&raw[12..q.question_end]);
    if answers == 1 {
        if let Some(a) = a {
            // The name by pointer to the question, A, IN, TTL 30 s.
            out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
            out.extend_from_slice(&a.octets());
        }
    }
    out
}

/// An error answer for a message that is not a query we parse (FORMERR),
/// echoing its id; `None` when it has no header.
pub fn formerr(raw: &[u8]) -> Option<Vec<u8>> {
    let id = u16_at(raw, 0)?;
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&(0x8000u16 | u16::from(RCODE_FORMERR)).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    Some(out)
}

/// A recursive query for `name`'s `qtype`.
pub fn build_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 18);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out
}

/// Skips a (possibly compressed) name at `i`; the index after it.
fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    for _ in 0..128 {
        let len = *b.get(i)?;
        match len {
            0 => return Some(i + 1),
            l if l & 0xc0 == 0xc0 => return Some(i + 2),
            l if l <= 63 => i += 1 + l as usize,
            _ => return None,
        }
    }
    None
}

/// The rcode and the A/AAAA addresses of a response to query `id`.
pub fn parse_response(b: &[u8], id: u16) -> Option<(u8, Vec<IpAddr>)> {
    if u16_at(b, 0)? != id {
        return None;
    }
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 == 0 {
        return None;
    }
    let rcode = (flags & 0xf) as u8;
    let qd = u16_at(b, 4)?;
    let an = u16_at(b, 6)?;
    let mut i = 12;
    for _ in 0..qd {
        i = skip_name(b, i)? + 4;
    }
    let mut addrs = Vec::new();
    for _ in 0..an {
        i = skip_name(b, i)?;
        let rtype = u16_at(b, i)?;
        let rdlen = u16_at(b, i + 8)? as usize;
        let data = b.get(i + 10..i + 10 + rdlen)?;
        match (rtype, rdlen) {
            (TYPE_A, 4) => addrs.push(IpAddr::V4(Ipv4Addr::new(
                data[0], data[1], data[2], data[3],
            ))),
            (TYPE_AAAA, 16) => {
                let mut o = [0u8; 16];
                o.copy_from_slice(data);
                addrs.push(IpAddr::V6(Ipv6Addr::from(o)));
            }
            _ => {}
        }
        i += 10 + rdlen;
    }
    Some((rcode, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_26_a_query_round_trips_and_garbage_is_refused() {
        let q = build_query(7, "PyPI.org", TYPE_A);
        let p = parse_query(&q).unwrap();
        assert_eq!((p.id, p.name.as_str(), p.qtype), (7, "pypi.org", TYPE_A));
        let a = answer(&p, &q, RCODE_NOERROR, Some(Ipv4Addr::new(127, 64, 0, 1)));
        let (rcode, addrs) = parse_response(&a, 7).unwrap();
        assert_eq!((rcode, addrs), (0, vec!["127.64.0.1".parse().unwrap()]));
        let nx = answer(&p, &q, RCODE_NXDOMAIN, None);
        assert_eq!(parse_response(&nx, 7).unwrap(), (3, vec![]));
        for bad in [
            &[][..],
            &[0; 11],
            &[0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 200],
        ] {
            assert!(parse_query(bad).is_none());
        }
        // Red-team wave 4, W1: a label holding a dot, or bytes outside
        // printable ASCII, is no host name (its text would not be the name
        // asked); the root is none either.
        let raw = |labels: &[&[u8]]| {
            let mut m = vec![0, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
            for l in labels {
                m.push(l.len() as u8);
                m.extend_from_slice(l);
            }
            m.extend_from_slice(&[0, 0, 1, 0, 1]);
            m
        };
        for (labels, host) in [
            (&[&b"a"[..], b"wild", b"test"][..], true),
            (&[&b"_srv"[..], b"x-y", b"test"][..], true),
            (&[&b"."[..], b"wild", b"test"][..], false),
            (&[&b"a.b"[..], b"test"][..], false),
            (&[&b"a\xff"[..], b"test"][..], false),
            (&[&b"a b"[..], b"test"][..], false),
            (&[][..], false),
        ] {
            let p = parse_query(&raw(labels)).unwrap();
            assert_eq!(p.host, host, "{labels:?}");
            // The text of a dotted label reads as a host name; only the
            // query's own labels tell.
            assert!(!host || host_name(&p.name), "{labels:?}");
        }
        assert!(!host_name("..wild.test") && !host_name("a..b") && !host_name(""));
        // Truncated anywhere: never a panic.
        for n in 0..a.len() {
            let _ = parse_response(&a[..n], 7);
            let _ = parse_query(&q[..n.min(q.len())]);
        }
    }
}
