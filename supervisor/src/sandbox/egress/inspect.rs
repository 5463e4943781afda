//! What a client's first bytes on port 80 or 443 say about the host it
//! wants (issue 26: the name a connection was opened for must be the name
//! it talks to): a TLS ClientHello's server name; an HTTP/1 request's
//! `Host`, its absolute-form target and a `CONNECT` tunnel's target; an
//! HTTP/2 prior-knowledge (h2c) connection's `:authority` / `host` of every
//! HEADERS block in the first bytes (HPACK-decoded).
//!
//! A message that is not complete yet asks for more bytes; one that stays
//! incomplete, or an HTTP/2 header block that does not decode, is refused
//! by the caller (fail closed). Bytes that are none of these are not
//! inspected (another protocol).

/// The HTTP/2 connection preface.
pub(super) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The longest message looked at (an HTTP/1 request head).
pub const MAX_INSPECT: usize = 16 * 1024;
/// The most bytes of a connection peeked at before its first message is
/// complete.
pub const MAX_PEEK: usize = MAX_INSPECT;

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not complete yet.
    More,
    /// Complete: every (what, host) they name; empty when they name none
    /// or are not a protocol inspected here.
    Names(Vec<(&'static str, String)>),
    /// A protocol inspected here whose names cannot be read.
    Unreadable(String),
}

/// Inspects `b`, the first bytes a client sent.
pub fn first_bytes(b: &[u8]) -> Seen {
    if b.is_empty() {
        return Seen::More;
    }
    if b[0] == 0x16 {
        return tls(b);
    }
    let n = b.len().min(H2_PREFACE.len());
    if b[..n] == H2_PREFACE[..n] {
        return if b.len() < H2_PREFACE.len() {
            Seen::More
        } else {
            h2(&b[H2_PREFACE.len()..])
        };
    }
    http1(b)
}

fn tls(b: &[u8]) -> Seen {
    let Some(len) = b
        .get(3..5)
        .map(|l| u16::from_be_bytes([l[0], l[1]]) as usize)
    else {
        return Seen::More;
    };
    if b.len() < 5 + len {
        return Seen::More;
    }
    Seen::Names(
        sni(&b[..5 + len])
            .map(|s| vec![("TLS server name", s)])
            .unwrap_or_default(),
    )
}

/// A TLS ClientHello's server name.
pub fn sni(b: &[u8]) -> Option<String> {
    let u16_at = |i: usize| -> Option<usize> {
        Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]) as usize)
    };
    // Record header (5), handshake type 1 (1), length (3), version (2),
    // random (32).
    if *b.get(5)? != 1 {
        return None;
    }
    let mut i = 5 + 4 + 2 + 32;
    i += 1 + *b.get(i)? as usize; // session id
    i += 2 + u16_at(i)?; // cipher suites
    i += 1 + *b.get(i)? as usize; // compression
    let ext_end = (i + 2 + u16_at(i)?).min(b.len());
    i += 2;
    while i + 4 <= ext_end {
        let (ty, len) = (u16_at(i)?, u16_at(i + 2)?);
        if ty == 0 {
            // server_name list: len (2), type (1), name len (2), name.
            let n = u16_at(i + 7)?;
            let name = b.get(i + 9..i + 9 + n)?;
            return Some(host_only(&String::from_utf8_lossy(name)));
        }
        i += 4 + len;
    }
    None
}

/// `host[:port]` or `[v6]:port`, lower case, without a trailing dot.
pub(super) fn host_only(v: &str) -> String {
    let v = v.trim();
    let host = if let Some(rest) = v.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        v.split(':').next().unwrap_or(v)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn http1(b: &[u8]) -> Seen {
    let b = &b[..b.len().min(MAX_INSPECT)];
    let Some(line_end) = b.windows(2).position(|w| w == b"\r\n") else {
        // An unfinished first line of printable ASCII may still become a
        // request.
        return if b.len() < 8192 && b.iter().all(|c| (0x20..0x7f).contains(c)) {
            Seen::More
        } else {
            Seen::Names(Vec::new())
        };
    };
    let Ok(line) = std::str::from_utf8(&b[..line_end]) else {
        return Seen::Names(Vec::new());
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Seen::Names(Vec::new());
    };
    if !version.starts_with("HTTP/1.") {
        return Seen::Names(Vec::new());
    }
    let Some(head_end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if b.len() >= MAX_INSPECT {
            Seen::Unreadable(format!(
                "an HTTP request head longer than {MAX_INSPECT} bytes"
            ))
        } else {
            Seen::More
        };
    };
    let head = String::from_utf8_lossy(&b[..head_end]);
    let mut names = Vec::new();
    if method.eq_ignore_ascii_case("CONNECT") {
        names.push(("HTTP CONNECT target", host_only(target)));
    } else if let Some(rest) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        names.push(("HTTP request target", host_only(authority)));
    }
    for l in head.split("\r\n").skip(1) {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                names.push(("HTTP Host", host_only(v)));
            }
        }
    }
    Seen::Names(names)
}

/// The frames after the preface: every HEADERS block's `:authority` and
/// `host`, once a HEADERS block is complete.
fn h2(mut b: &[u8]) -> Seen {
    let mut decoder = loona_hpack::Decoder::new();
    let mut names = Vec::new();
    let mut block: Option<Vec<u8>> = None;
    let mut seen_headers = false;
    loop {
        if b.len() < 9 {
            break;
        }
        let len = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
        let (ty, flags) = (b[3], b[4]);
        if b.len() < 9 + len {
            break;
        }
        let payload = &b[9..9 + len];
        b = &b[9 + len..];
        let fragment = match (ty, &mut block) {
            // HEADERS: optional padding length and priority first.
            (1, None) => {
                let mut p = payload;
                let mut pad = 0;
                if flags & 0x8 != 0 {
                    let Some((&n, rest)) = p.split_first() else {
                        return Seen::Unreadable("a malformed HTTP/2 HEADERS frame".into());
                    };
                    pad = n as usize;
                    p = rest;
                }
                if flags & 0x20 != 0 {
                    p = p.get(5..).unwrap_or_default();
                }
                let Some(p) = p
                    .get(..p.len().saturating_sub(pad))
                    .filter(|_| pad <= p.len())
                else {
                    return Seen::Unreadable("a malformed HTTP/2 HEADERS frame".into());
                };
                block = Some(Vec::new());
                p
            }
            (9, Some(_)) => payload,
            (_, Some(_)) => {
                return Seen::Unreadable("an HTTP/2 header block interrupted".into());
            }
            _ => continue,
        };
        let Some(buf) = block.as_mut() else { continue };
        buf.extend_from_slice(fragment);
        if flags & 0x4 == 0 {
            continue;
        }
        let Some(buf) = block.take() else { continue };
        seen_headers = true;
        match decoder.decode(&buf) {
            Ok(headers) => {
                for (k, v) in headers {
                    if k == b":authority" || k.eq_ignore_ascii_case(b"host") {
                        names.push(("HTTP/2 :authority", host_only(&String::from_utf8_lossy(&v))));
                    }
                }
            }
            Err(e) => {
                return Seen::Unreadable(format!(
                    "an HTTP/2 header block that does not decode ({e:?})"
                ));
            }
        }
    }
    if seen_headers {
        Seen::Names(names)
    } else {
        Seen::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: Seen) -> Vec<String> {
        match s {
            Seen::Names(n) => n.into_iter().map(|(_, h)| h).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn issue_26_http1_names_host_absolute_targets_and_connect() {
        assert_eq!(first_bytes(b"GET / HTTP/1.1\r\nHost: a"), Seen::More);
        assert_eq!(first_bytes(b"GET / HTT"), Seen::More);
        assert_eq!(
            names(first_bytes(
                b"GET / HTTP/1.1\r\nHost: Example.ORG:8080\r\n\r\n"
            )),
            ["example.org"]
        );
        assert_eq!(
            names(first_bytes(
                b"CONNECT evil.test:443 HTTP/1.1\r\nHost: good.test\r\n\r\n"
            )),
            ["evil.test", "good.test"]
        );
        assert_eq!(
            names(first_bytes(
                b"GET http://u@evil.test:81/x HTTP/1.1\r\nHost: good.test\r\n\r\n"
            )),
            ["evil.test", "good.test"]
        );
        assert_eq!(names(first_bytes(b"\x00\x01binary")), Vec::<String>::new());
        assert_eq!(names(first_bytes(b"SSH-2.0-x\r\n")), Vec::<String>::new());
    }

    #[test]
    fn issue_26_h2c_authority_is_decoded_from_every_headers_block() {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([
            (&b":method"[..], &b"GET"[..]),
            (&b":authority"[..], &b"evil.test"[..]),
        ]);
        let mut m = H2_PREFACE.to_vec();
        // SETTINGS (empty), then HEADERS (END_HEADERS) on stream 1.
        m.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(first_bytes(&m), Seen::More);
        let len = block.len() as u32;
        m.extend_from_slice(&len.to_be_bytes()[1..]);
        m.extend_from_slice(&[1, 4, 0, 0, 0, 1]);
        m.extend_from_slice(&block);
        assert_eq!(names(first_bytes(&m)), ["evil.test"]);
        for n in 0..m.len() {
            let _ = first_bytes(&m[..n]);
        }
        // A block split over HEADERS + CONTINUATION.
        let mut m = H2_PREFACE.to_vec();
        let (a, b) = block.split_at(3);
        m.extend_from_slice(&(a.len() as u32).to_be_bytes()[1..]);
        m.extend_from_slice(&[1, 0, 0, 0, 0, 1]);
        m.extend_from_slice(a);
        assert_eq!(first_bytes(&m), Seen::More);
        m.extend_from_slice(&(b.len() as u32).to_be_bytes()[1..]);
        m.extend_from_slice(&[9, 4, 0, 0, 0, 1]);
        m.extend_from_slice(b);
        assert_eq!(names(first_bytes(&m)), ["evil.test"]);
        // Garbage as a header block is refused, not waved through.
        let mut m = H2_PREFACE.to_vec();
        m.extend_from_slice(&[0, 0, 2, 1, 4, 0, 0, 0, 1, 0xff, 0xff]);
        assert!(matches!(first_bytes(&m), Seen::Unreadable(_)));
    }
}
