//! What a client's first bytes on port 80 or 443 say about the host it
//! wants (issue 26: the name a connection was opened for must be the name
//! it talks to): a TLS ClientHello's server name; an HTTP/1 request's
//! `Host`, its absolute-form target and a `CONNECT` tunnel's target; an
//! HTTP/2 prior-knowledge (h2c) connection's `:authority` / `host` of every
//! HEADERS block in the first bytes (HPACK-decoded).
//!
//! A message that is not complete yet asks for more bytes; one that stays
//! incomplete, or an HTTP/2 header block that does not decode, is refused
//! by the caller (fail closed). A ClientHello is reassembled from every
//! handshake record it spans; bytes that begin as TLS but are not one
//! well-formed ClientHello are unreadable, not "no name". Bytes that are
//! none of these are not inspected (another protocol).

use super::http;
use super::syntax::{H2_PREFACE, host_only, may_be_request, unversioned_request, versioned};

/// The most bytes of a connection peeked at before its first message is
/// complete: a [`MAX_HELLO`] ClientHello with room for the record headers
/// of one split into many records (5 bytes each).
pub const MAX_PEEK: usize = MAX_HELLO + 8 * 1024;

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
    if tls_record(b) {
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

/// [`first_bytes`] for a client that has closed its sending side after
/// `b`: nothing more will come. An HTTP/1 head left unfinished is read up
/// to its last complete line, as the port-80 guard passes it at the end
/// of stream (`echo GET / HTTP/1.1 | nc host 80`); another unfinished
/// message names nothing a server could act on.
pub fn first_bytes_at_end(b: &[u8]) -> Seen {
    match first_bytes(b) {
        Seen::More => {}
        seen => return seen,
    }
    let skip = b
        .iter()
        .take_while(|c| **c == b'\r' || **c == b'\n')
        .count();
    let b = &b[skip..];
    let Some(last) = b.iter().rposition(|c| *c == b'\n') else {
        // An unended line at the end of the stream is a line to a server
        // that reads to EOF (Python's http.server does).
        if !tls_record(b) && !versioned(b) && unversioned_request(b) {
            return http09();
        }
        return Seen::Names(Vec::new());
    };
    let line = b.split(|c| *c == b'\n').next().unwrap_or_default();
    if !tls_record(b) && !versioned(line) && unversioned_request(line) {
        return http09();
    }
    if tls_record(b) || !versioned(line) {
        return Seen::Names(Vec::new());
    }
    match http::parse_head(&b[..last]) {
        Ok(head) => Seen::Names(head.names),
        Err(http::Refusal::Unparseable(why)) => Seen::Unreadable(why),
        Err(http::Refusal::Other(what, h)) => Seen::Names(vec![(what, h)]),
    }
}

/// Whether `b` begins as a TLS record of any content type
/// (change_cipher_spec 20, alert 21, handshake 22, application_data 23,
/// heartbeat 24) of a TLS 1.x / SSL 3 version: [`tls`] then wants one
/// ClientHello from the first record on. Not only 0x16: Go's crypto/tls
/// (Caddy, Traefik) takes an alert as a connection's first record, drops
/// a warning one and serves the ClientHello after it, so a warning alert
/// in front of the hello hid its server name when only a handshake record
/// was read as TLS (red-team wave 4, W4).
/// (A handshake record is TLS whatever its version byte, as before.)
fn tls_record(b: &[u8]) -> bool {
    match b.first() {
        Some(0x16) => true,
        Some(20..=24) => b.get(1).is_none_or(|v| *v == 3),
        _ => false,
    }
}

/// The largest ClientHello handshake message read (its body): beyond any
/// client's (a post-quantum key share and a large session ticket stay
/// within a few KiB), and a TLS record's largest plaintext (2^14).
pub const MAX_HELLO: usize = 16 * 1024;

/// The largest TLS record plaintext (RFC 8446 §5.1: 2^14).
const MAX_RECORD: usize = 1 << 14;

/// A TLS ClientHello, reassembled from as many consecutive handshake
/// records as it spans (RFC 8446 §5.1 lets a client fragment it, and
/// servers accept that): its server names. Bytes that start as TLS but
/// are not one complete, well-formed ClientHello are unreadable, never
/// "no name".
fn tls(b: &[u8]) -> Seen {
    let mut msg: Vec<u8> = Vec::new();
    let mut rest = b;
    loop {
        let Some(h) = rest.get(..5) else {
            return Seen::More;
        };
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if h[0] != 0x16 {
            return Seen::Unreadable(format!(
                "a TLS record of type {} inside the ClientHello",
                h[0]
            ));
        }
        if h[1] != 3 {
            return Seen::Unreadable("a TLS record that is not TLS 1.x".into());
        }
        if len == 0 || len > MAX_RECORD {
            return Seen::Unreadable(format!("a TLS handshake record of {len} bytes"));
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            return Seen::More;
        };
        msg.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        let Some(head) = msg.get(..4) else {
            continue;
        };
        if head[0] != 1 {
            return Seen::Unreadable(format!(
                "a TLS handshake message of type {} where a ClientHello belongs",
                head[0]
            ));
        }
        let body = u32::from_be_bytes([0, head[1], head[2], head[3]]) as usize;
        if body > MAX_HELLO {
            return Seen::Unreadable(format!(
                "a TLS ClientHello of {body} bytes (at most {MAX_HELLO} are read)"
            ));
        }
        if msg.len() >= 4 + body {
            return match client_hello(&msg[4..4 + body]) {
                Ok(names) => {
                    Seen::Names(names.into_iter().map(|n| ("TLS server name", n)).collect())
                }
                Err(why) => Seen::Unreadable(format!("a malformed TLS ClientHello ({why})")),
            };
        }
    }
}

/// A ClientHello's body (after its 4-byte handshake header): every
/// `host_name` of its `server_name` extensions, or why it does not parse.
/// Every length must fit its enclosure exactly.
fn client_hello(b: &[u8]) -> Result<Vec<String>, &'static str> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
            let (a, b) = (self.0.get(..n), self.0.get(n..));
            match (a, b) {
                (Some(a), Some(b)) => {
                    self.0 = b;
                    Ok(a)
                }
                _ => Err("a length past its end"),
            }
        }
        fn u8(&mut self) -> Result<usize, &'static str> {
            Ok(usize::from(self.take(1)?[0]))
        }
        fn u16(&mut self) -> Result<usize, &'static str> {
            let b = self.take(2)?;
            Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
        }
        fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
            let n = self.u8()?;
            self.take(n)
        }
        fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
            let n = self.u16()?;
            self.take(n)
        }
    }
    let mut r = Reader(b);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        // TLS 1.2 allows a ClientHello without extensions: no name.
        return Ok(Vec::new());
    }
    let mut exts = Reader(r.vec16()?);
    if !r.0.is_empty() {
        return Err("bytes after the extensions");
    }
    let mut names = Vec::new();
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        if ty != 0 {
            continue;
        }
        // server_name: a list of (name_type, name) (RFC 6066 §3).
        let mut ext = Reader(data);
        let mut list = Reader(ext.vec16()?);
        if !ext.0.is_empty() {
            return Err("bytes after the server name list");
        }
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let name = list.vec16()?;
            if kind == 0 {
                names.push(host_only(&String::from_utf8_lossy(name)));
            }
        }
    }
    Ok(names)
}

/// A TLS ClientHello's server name (the last, when it names several):
/// `b` is its records, from the first.
pub fn sni(b: &[u8]) -> Option<String> {
    match tls(b) {
        Seen::Names(n) => n.into_iter().map(|(_, h)| h).next_back(),
        _ => None,
    }
}

/// Whether a client's first bytes are cleartext HTTP, as [`first_bytes`]
/// reads them: the HTTP/2 preface, or (after empty lines) a first line
/// naming an `HTTP/` version ([`versioned`]). On a checked port the rest
/// of such a connection goes through the port-80 guard; TLS and other
/// protocols (an SSH banner, HTTP/0.9) are not HTTP here.
pub fn cleartext_http(b: &[u8]) -> bool {
    let skip = b
        .iter()
        .take_while(|c| **c == b'\r' || **c == b'\n')
        .count();
    let b = &b[skip..];
    let n = b.len().min(H2_PREFACE.len());
    if n > 0 && b[..n] == H2_PREFACE[..n] {
        return true;
    }
    versioned(b.split(|c| *c == b'\n').next().unwrap_or_default())
}

/// An HTTP/0.9 request line (see [`unversioned_request`]): refused, as the
/// port-80 guard refuses it.
fn http09() -> Seen {
    Seen::Unreadable(
        "an HTTP/0.9 request line (a method and a target, no version): a server may take its target's host"
            .into(),
    )
}

/// An HTTP/1 request's names, read by the port-80 guard's own parser
/// ([`http::parse_head`]): lines ending in CRLF or a bare LF, empty lines
/// before the request skipped, and anything it cannot follow unreadable.
/// Bytes that do not begin like a request line are another protocol.
fn http1(b: &[u8]) -> Seen {
    let skip = b
        .iter()
        .take_while(|c| **c == b'\r' || **c == b'\n')
        .count();
    let b = &b[skip..];
    if b.is_empty() {
        return Seen::More;
    }
    let window = &b[..b.len().min(http::MAX_HEAD + 4)];
    let line = window.split(|c| *c == b'\n').next().unwrap_or_default();
    let complete = line.len() < window.len();
    if complete && !versioned(line) && unversioned_request(line) {
        return http09();
    }
    if complete && !versioned(line) || !complete && !versioned(line) && !may_be_request(b) {
        // A line of another protocol, or the start of one that cannot
        // become a request line.
        return Seen::Names(Vec::new());
    }
    match http::head_end(window) {
        Some((end, _)) => match http::parse_head(&b[..end]) {
            Ok(head) => Seen::Names(head.names),
            Err(http::Refusal::Unparseable(why)) => Seen::Unreadable(why),
            Err(http::Refusal::Other(what, h)) => Seen::Names(vec![(what, h)]),
        },
        None if b.len() >= http::MAX_HEAD + 4 => Seen::Unreadable(format!(
            "an HTTP request head longer than {} bytes",
            http::MAX_HEAD
        )),
        None => Seen::More,
    }
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

    #[track_caller]
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

    /// Red-team stop 60: an HTTP/0.9 request line on a checked port (443
    /// too) names no `Host`, yet nginx serves the virtual host of its
    /// absolute-form target: refused, whatever whitespace, complete or at
    /// the end of the client's stream; a bare word is another protocol.
    #[test]
    fn an_http09_request_line_is_refused_not_passed_as_another_protocol() {
        for b in [
            &b"GET http://secret.test/\r\n"[..],
            b"GET http://secret.test/ \r\n",
            b"\r\nGET http://secret.test/\r\n",
            b"GET /\n",
            b" GET\t/x\r\n",
        ] {
            assert!(matches!(first_bytes(b), Seen::Unreadable(_)), "{b:?}");
            assert!(
                matches!(first_bytes_at_end(b), Seen::Unreadable(_)),
                "{b:?}"
            );
        }
        assert!(matches!(
            first_bytes_at_end(b"GET http://secret.test/"),
            Seen::Unreadable(_)
        ));
        assert_eq!(first_bytes_at_end(b"EHLO x"), Seen::Names(Vec::new()));
        assert_eq!(first_bytes(b"GET http://secret.test/"), Seen::More);
        for b in [
            &b"PING\r\n"[..],
            b"GET \r\n",
            b"SSH-2.0-x\r\n",
            b"EHLO client.example\r\n",
            b"USER anonymous\r\n",
        ] {
            assert_eq!(names(first_bytes(b)), Vec::<String>::new(), "{b:?}");
        }
    }

    /// A ClientHello handshake message naming `names` (none: no
    /// server_name extension; `exts: false`: no extensions at all).
    fn hello(names: &[&str], exts: bool) -> Vec<u8> {
        let mut ext = Vec::new();
        if !names.is_empty() {
            let mut list = Vec::new();
            for n in names {
                list.push(0);
                list.extend_from_slice(&(n.len() as u16).to_be_bytes());
                list.extend_from_slice(n.as_bytes());
            }
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(list.len() as u16 + 2).to_be_bytes());
            ext.extend_from_slice(&(list.len() as u16).to_be_bytes());
            ext.extend_from_slice(&list);
        }
        // ALPN h2, after the name.
        ext.extend_from_slice(&[0, 0x10, 0, 5, 0, 3, 2, b'h', b'2']);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        if exts {
            body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            body.extend_from_slice(&ext);
        }
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        hs
    }

    /// `hs` in TLS handshake records of at most `piece` bytes.
    fn records(hs: &[u8], piece: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for p in hs.chunks(piece) {
            out.extend_from_slice(&[0x16, 3, 1]);
            out.extend_from_slice(&(p.len() as u16).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    /// Red-team F2: a ClientHello split over records is reassembled, at
    /// every split point, whole or in 1-byte records; each prefix asks
    /// for more.
    #[test]
    fn issue_26_a_client_hello_split_over_records_is_reassembled() {
        let hs = hello(&["Evil.Test."], true);
        assert_eq!(names(first_bytes(&records(&hs, hs.len()))), ["evil.test"]);
        for piece in 1..hs.len() {
            let b = records(&hs, piece);
            assert_eq!(names(first_bytes(&b)), ["evil.test"], "pieces of {piece}");
            for n in 1..b.len() {
                assert_eq!(first_bytes(&b[..n]), Seen::More, "{piece}: {n}");
            }
        }
        // Split once at every offset, as the red team's probe did at 20.
        for at in 1..hs.len() {
            let mut b = records(&hs[..at], at);
            b.extend(records(&hs[at..], hs.len()));
            assert_eq!(names(first_bytes(&b)), ["evil.test"], "split at {at}");
        }
        // Bytes after the ClientHello (a client that does not wait) are
        // not part of it.
        let mut b = records(&hs, 30);
        b.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
        assert_eq!(names(first_bytes(&b)), ["evil.test"]);
        assert_eq!(sni(&records(&hs, 7)).as_deref(), Some("evil.test"));
    }

    /// Red-team F2: what starts as TLS but is not one well-formed
    /// ClientHello is unreadable (refused), never "no name"; a hello that
    /// really has no name, or names two hosts, says so.
    #[test]
    fn issue_26_a_client_hello_that_does_not_parse_is_unreadable() {
        let unreadable = |b: &[u8]| matches!(first_bytes(b), Seen::Unreadable(_));
        let hs = hello(&["evil.test"], true);
        // Another record type before the hello is complete.
        let mut b = records(&hs[..20], 20);
        b.extend_from_slice(&[0x17, 3, 3, 0, 4, 1, 2, 3, 4]);
        assert!(unreadable(&b));
        // Not a ClientHello (a ServerHello's type), an empty record, a
        // record over 2^14, an SSL 2-like version byte.
        let mut sh = hs.clone();
        sh[0] = 2;
        assert!(unreadable(&records(&sh, 100)));
        assert!(unreadable(&[0x16, 3, 1, 0, 0, 1, 0, 0, 0]));
        assert!(unreadable(&[0x16, 3, 1, 0x40, 0x01]));
        assert!(unreadable(&[0x16, 2, 0, 0, 4, 1, 0, 0, 0]));
        // Red-team wave 4, W4: another record first — a warning alert, a
        // change_cipher_spec — is not "another protocol": no ClientHello
        // may hide behind it. One byte of it waits for the next.
        for first in [
            &[0x15, 3, 1, 0, 2, 1, 0x5a][..],
            &[0x14, 3, 3, 0, 1, 1],
            &[0x17, 3, 3, 0, 1, 0],
            &[0x18, 3, 3, 0, 1, 0],
        ] {
            let mut b = first.to_vec();
            b.extend(records(&hs, 40));
            assert!(unreadable(&b), "{first:?}");
        }
        assert_eq!(first_bytes(&[0x15]), Seen::More);
        assert_eq!(
            first_bytes_at_end(&[0x15, 3, 1, 0, 2, 1, 0x5a, 0x16]),
            Seen::Unreadable("a TLS record of type 21 inside the ClientHello".into())
        );
        // A byte of that range that is not followed by a TLS version is
        // another protocol.
        assert_eq!(first_bytes(&[0x15, 0x41, 0x42]), Seen::Names(Vec::new()));
        // A hello longer than MAX_HELLO.
        let mut big = vec![0x16, 3, 1, 0, 4, 1];
        big.extend_from_slice(&((MAX_HELLO + 1) as u32).to_be_bytes()[1..]);
        assert!(unreadable(&big));
        // Lengths that do not fit: the server_name list running past the
        // extension, the extensions past the message, a truncated body.
        let at = hs.windows(2).position(|w| w == b"ev").unwrap();
        let mut bad = hs.clone();
        bad[at - 2] = 0x40;
        assert!(unreadable(&records(&bad, 50)));
        let mut bad = hs.clone();
        let ext_len = 4 + 2 + 32 + 1 + 4 + 2;
        bad[ext_len] = 0x40;
        assert!(unreadable(&records(&bad, 50)));
        let mut cut = hs[..hs.len() - 3].to_vec();
        let n = (cut.len() - 4) as u32;
        cut[1..4].copy_from_slice(&n.to_be_bytes()[1..]);
        assert!(unreadable(&records(&cut, 50)));
        // Garbage inside complete records.
        assert!(unreadable(&records(&[1, 0, 0, 3, 0xff, 0xff, 0xff], 7)));
        // Really no name; two names are both reported.
        assert_eq!(
            names(first_bytes(&records(&hello(&[], true), 40))),
            Vec::<String>::new()
        );
        assert_eq!(
            names(first_bytes(&records(&hello(&[], false), 40))),
            Vec::<String>::new()
        );
        assert_eq!(
            names(first_bytes(&records(
                &hello(&["good.test", "evil.test"], true),
                40
            ))),
            ["good.test", "evil.test"]
        );
    }

    /// Red-team F4: HTTP/1 on a checked port is read by the port-80
    /// guard's parser: bare-LF line ends, empty lines before the request,
    /// a partial line with bytes outside ASCII, a first line that never
    /// ends, and framing the guard refuses.
    #[test]
    fn issue_26_http1_first_bytes_are_read_as_the_port_80_guard_reads_them() {
        assert_eq!(
            names(first_bytes(b"GET / HTTP/1.1\nHost: other.rt\n\n")),
            ["other.rt"]
        );
        assert_eq!(
            names(first_bytes(
                b"GET / HTTP/1.1\r\nHost: a.rt\nHost: b.rt\r\n\n"
            )),
            ["a.rt", "b.rt"]
        );
        assert_eq!(
            names(first_bytes(
                b"\r\n\nGET / HTTP/1.1\r\nHost: other.rt\r\n\r\n"
            )),
            ["other.rt"]
        );
        assert_eq!(first_bytes(b"\r\n"), Seen::More);
        assert_eq!(first_bytes(b"GET / HTTP/1.1\nHost: other.rt\n"), Seen::More);
        // The client's end of stream: the complete lines are what a server
        // may act on, as the guard passes them.
        assert_eq!(
            names(first_bytes_at_end(b"GET / HTTP/1.1\nHost: other.rt\n")),
            ["other.rt"]
        );
        assert_eq!(
            names(first_bytes_at_end(b"GET / HTTP/1.1\n")),
            Vec::<String>::new()
        );
        assert_eq!(
            names(first_bytes_at_end(b"GET / HTTP/1.1")),
            Vec::<String>::new()
        );
        assert_eq!(
            names(first_bytes_at_end(b"\x16\x03\x01\x00\x10\x01")),
            Vec::<String>::new()
        );
        assert!(matches!(
            first_bytes_at_end(b"GET / HTTP/1.1\n Host: other.rt\n"),
            Seen::Unreadable(_)
        ));
        // Not ASCII yet, but a request line has begun: wait for it.
        assert_eq!(first_bytes(b"GET /\xff"), Seen::More);
        assert!(matches!(
            first_bytes(b"GET /\xff HTTP/1.1\r\nHost: other.rt\r\n\r\n"),
            Seen::Unreadable(_)
        ));
        let long = [b"GET /".as_slice(), &[b'a'; http::MAX_HEAD + 8]].concat();
        assert!(matches!(first_bytes(&long), Seen::Unreadable(_)));
        for refused in [
            &b"GET  / HTTP/1.1\r\nHost: other.rt\r\n\r\n"[..],
            b"GET / HTTP/1.1\rHost: other.rt\r\n\r\n",
            b"GET / HTTP/1.1\r\n Host: other.rt\r\n\r\n",
            b"GET / HTTP/1.2\r\nHost: other.rt\r\n\r\n",
            b"GET\t/\tHTTP/1.1\r\nHost: other.rt\r\n\r\n",
        ] {
            assert!(
                matches!(first_bytes(refused), Seen::Unreadable(_)),
                "{:?}",
                String::from_utf8_lossy(refused)
            );
        }
        // What is guarded after the first request on a checked port.
        for http in [
            &b"GET / HTTP/1.1\r\nHost: a.rt\r\n\r\n"[..],
            b"\r\nget / http/1.0\n\n",
            H2_PREFACE,
        ] {
            assert!(cleartext_http(http), "{:?}", String::from_utf8_lossy(http));
        }
        for other in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"[..],
            b"EHLO client.example\r\n",
            b"GET /\r\n",
            b"\x16\x03\x01\x00\x05",
            b"",
        ] {
            assert!(
                !cleartext_http(other),
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        // Red-team wave 4, W5: a first line naming an HTTP version is HTTP
        // whatever separates its words (Python's http.server splits on
        // any whitespace and skips it before the method): refused unless
        // the strict parser reads it. Its start waits for the rest.
        for lenient in [
            &b"GET\x1c/\x1cHTTP/1.1\r\nHost: other.rt\r\n\r\n"[..],
            b" GET / HTTP/1.1\r\nHost: other.rt\r\n\r\n",
            b"\x85GET\xa0/ HTTP/1.1\r\nHost: other.rt\r\n\r\n",
            b"\x0cGET / HTTP/1.1\r\nHost: other.rt\r\n\r\n",
            b"\x00 HTTP/1.1\r\nHost: other.rt\r\n\r\n",
        ] {
            assert!(
                matches!(first_bytes(lenient), Seen::Unreadable(_)),
                "{:?}",
                String::from_utf8_lossy(lenient)
            );
            assert!(cleartext_http(lenient));
            if lenient[0] != 0 {
                let at = lenient.iter().position(|c| *c == b'/').unwrap();
                assert_eq!(first_bytes(&lenient[..at]), Seen::More);
            }
        }
        assert!(matches!(
            first_bytes_at_end(b" GET / HTTP/1.1\nHost: other.rt\n"),
            Seen::Unreadable(_)
        ));
        // Other protocols stay uninspected (HTTP/0.9 is refused: see
        // `an_http09_request_line_is_refused_not_passed_as_another_protocol`).
        for other in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"[..],
            b"EHLO client.example\r\n",
        ] {
            assert_eq!(names(first_bytes(other)), Vec::<String>::new());
        }
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
