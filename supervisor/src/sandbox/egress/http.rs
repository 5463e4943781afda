//! Cleartext HTTP on port 80 (and on 443 when the client's first message
//! is HTTP): every request checked, not only the first (issue 26). The client→upstream direction of a connection opened for a
//! name goes through a [`Guard`], a bounded parser that passes bytes on
//! only once the request they belong to is checked:
//!
//! - HTTP/1.x: each request head (request line and headers, at most
//!   [`MAX_HEAD`] bytes) is read whole; its `Host` headers, its
//!   absolute-form target and a `CONNECT` target must all be the name the
//!   connection was opened for; then its body is passed by its framing
//!   (`Content-Length`, or `chunked`), and the next request (pipelined or
//!   keep-alive) is read the same way. A Content-Length body that begins
//!   with a request head is read as that request too (a server that does
//!   not read the body takes it for the next one). Lines may end with CRLF or a bare
//!   LF (as lenient servers accept); at the client's end of stream an
//!   unfinished head passes up to its last complete line, checked. Framing
//!   that cannot be followed (a bare CR,
//!   no parseable request line, a header line without a name, an
//!   obsolete line fold, both or conflicting lengths, a transfer coding
//!   other than chunked last) closes the connection: fail closed.
//! - HTTP/2 with prior knowledge (h2c, the preface at a request
//!   boundary): frame by frame, one stateful HPACK decoder per connection;
//!   every HEADERS block (with its CONTINUATION frames, at most
//!   [`MAX_BLOCK`] bytes) is decoded before it is passed, and its
//!   `:authority` and `host` must be the name. DATA and other frames are
//!   passed as they come.
//! - `Upgrade:` and `CONNECT`: after such a (checked) request the next
//!   client bytes decide. If they can begin an HTTP/1 request (a token
//!   character, or whitespace a lenient server skips before one: CR/LF,
//!   space, tab, …) or the HTTP/2 preface, the connection is still
//!   HTTP — the server refused the upgrade, or it is h2c after
//!   `Upgrade: h2c` — and inspection goes on; anything else (a WebSocket
//!   frame, TLS in a tunnel) is another protocol and is passed unread
//!   from there on. So a refused upgrade cannot smuggle an unchecked
//!   request, and inspection ends only where the bytes are not HTTP.
//!
//! A request naming no host at all (HTTP/1.0 without `Host`, HTTP/2
//! without `:authority`) is let through, as the first-bytes check does:
//! the connection goes only to the name's own addresses.

use super::syntax::{H2_PREFACE, host_only, is_tchar, lenient_space, may_be_request, versioned};

/// The longest HTTP/1 request head.
pub const MAX_HEAD: usize = 16 * 1024;
/// The longest HTTP/2 header block (HEADERS and its CONTINUATIONs).
pub const MAX_BLOCK: usize = 64 * 1024;
/// The largest HPACK dynamic table a client may ask for.
const MAX_TABLE: usize = 64 * 1024;
/// The longest chunk-size or trailer line.
const MAX_LINE: usize = 4096;
/// The longest request line a server that does not read bodies takes
/// (Python's `http.server`: 65,536 bytes), and so the longest first line
/// of a body read as a request ([`body_start`]).
const MAX_BODY_LINE: usize = 65_537;

/// What the start of a Content-Length body is ([`body_start`]).
enum BodyStep {
    /// Not decided yet: more of the body must come.
    Wait,
    /// Data: the rest of the body passes unread.
    Data,
    /// A request head of this many bytes (with the empty lines before it)
    /// naming these hosts; the body goes on after it.
    Head(usize, Vec<(&'static str, String)>),
}

/// The start of a request body, `avail` of its `n` bytes, read as a
/// server that does not read the body of the request (Python's
/// `http.server` handlers, many small servers) reads it: as the next
/// request. A body that begins with a request head — a first line naming
/// an `HTTP/` version that may be a request line ([`versioned`],
/// [`may_be_request`]) — is one: it must parse, end within the body and
/// name only the name; otherwise the body is data (red-team wave 4, W6).
/// A first line is held until it is complete, so no server acts on a head
/// the guard has not read; a body that ends first is data.
fn body_start(avail: &[u8], n: u64) -> Result<BodyStep, Refusal> {
    let whole = avail.len() as u64 >= n;
    let skip = avail
        .iter()
        .take_while(|c| **c == b'\r' || **c == b'\n')
        .count();
    let b = &avail[skip..];
    let Some(nl) = b.iter().position(|c| *c == b'\n') else {
        let may = !b.is_empty() && (may_be_request(b) || versioned(b));
        return Ok(
            if whole || b.len() >= MAX_BODY_LINE || !may && !b.is_empty() {
                BodyStep::Data
            } else {
                BodyStep::Wait
            },
        );
    };
    let line = &b[..nl];
    if !(versioned(line) && may_be_request(line)) {
        return Ok(BodyStep::Data);
    }
    match head_end(&b[..b.len().min(MAX_BODY_LINE + MAX_HEAD)]) {
        Some((end, after)) => {
            let head = parse_head(&b[..end])?;
            Ok(BodyStep::Head(skip + after, head.names))
        }
        None if whole || b.len() >= MAX_BODY_LINE + MAX_HEAD => {
            unparseable("a request body that begins with an HTTP request head not ending within it")
        }
        None => Ok(BodyStep::Wait),
    }
}

/// Why a connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A request names another host: (what names it, the host).
    Other(&'static str, String),
    /// Framing that cannot be followed.
    Unparseable(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Between HTTP/1 requests (or before the first).
    Boundary,
    /// The start of a Content-Length body (bytes left, upgrade): read as
    /// the next request would be by a server that does not read the body
    /// (see [`body_start`]); then `Length`.
    BodyStart(u64, bool),
    /// Body bytes left; then `Boundary`, or `AfterUpgrade` when set.
    Length(u64, bool),
    Chunked(Chunk, bool),
    /// After an `Upgrade` or `CONNECT` request: the next bytes decide.
    AfterUpgrade,
    /// HTTP/2 frames.
    H2,
    /// Not HTTP any more: passed unread.
    Opaque,
}

/// The parsing relay of one connection's client→upstream bytes.
pub struct Guard {
    name: String,
    buf: Vec<u8>,
    mode: Mode,
    hpack: loona_hpack::Decoder<'static>,
    /// HTTP/2: the bytes after the forwarded ones held with an incomplete
    /// header block, and the block so far.
    held: usize,
    block: Option<Vec<u8>>,
    /// HTTP/2: payload bytes of a passed frame still to come.
    pass: u64,
    /// Requests (HTTP/1 heads and HTTP/2 header blocks) checked.
    pub requests: u64,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

fn unparseable<T>(why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::Unparseable(why.into()))
}

fn find(b: &[u8], what: &[u8]) -> Option<usize> {
    b.windows(what.len()).position(|w| w == what)
}

/// One parsed HTTP/1 request head.
pub(super) struct Head {
    pub(super) names: Vec<(&'static str, String)>,
    body: Option<BodyLen>,
    upgrade: bool,
}

enum BodyLen {
    Length(u64),
    Chunked,
}

pub(super) fn parse_head(head: &[u8]) -> Result<Head, Refusal> {
    let Ok(head) = std::str::from_utf8(head) else {
        return unparseable("an HTTP request head that is not text");
    };
    // Lines end with CRLF, or a bare LF (RFC 9112 lets servers accept
    // it, so it is followed here too); a bare CR is refused.
    if head
        .bytes()
        .zip(head.bytes().skip(1).chain([b'\n']))
        .any(|(a, b)| a == b'\r' && b != b'\n')
    {
        return unparseable("an HTTP request head with a bare CR");
    }
    let mut lines = head
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty());
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return unparseable("an HTTP request line that is not `METHOD TARGET VERSION`");
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return unparseable("an HTTP request method that is not a token");
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return unparseable(format!(
            "an HTTP version `{version}` that is not 1.0 or 1.1"
        ));
    }
    if target.is_empty() || target.bytes().any(|c| c <= b' ' || c == 0x7f) {
        return unparseable("an HTTP request target with control characters");
    }
    let mut names = Vec::new();
    let connect = method.eq_ignore_ascii_case("CONNECT");
    if connect {
        names.push(("HTTP CONNECT target", host_only(target)));
    } else if let Some(rest) = target
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
        .or_else(|| {
            target
                .get(..8)
                .filter(|p| p.eq_ignore_ascii_case("https://"))
                .map(|_| &target[8..])
        })
    {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        names.push(("HTTP request target", host_only(authority)));
    } else if !target.starts_with('/') && target != "*" {
        return unparseable("an HTTP request target in no form this relay follows");
    }
    let (mut length, mut chunked, mut coded, mut upgrade) = (None::<u64>, false, false, connect);
    for l in lines {
        if l.starts_with([' ', '\t']) {
            return unparseable("an obsolete folded HTTP header line");
        }
        let Some((k, v)) = l.split_once(':') else {
            return unparseable("an HTTP header line without a name");
        };
        if k.is_empty() || !k.bytes().all(is_tchar) {
            return unparseable("an HTTP header name that is not a token");
        }
        let v = v.trim_matches([' ', '\t']);
        if k.eq_ignore_ascii_case("host") {
            names.push(("HTTP Host", host_only(v)));
        } else if k.eq_ignore_ascii_case("content-length") {
            for n in v.split(',') {
                let n = n.trim();
                let Some(n) = n
                    .bytes()
                    .all(|c| c.is_ascii_digit())
                    .then(|| n.parse::<u64>().ok())
                    .flatten()
                else {
                    return unparseable("an HTTP Content-Length that is not a number");
                };
                if length.is_some_and(|l| l != n) {
                    return unparseable("conflicting HTTP Content-Length headers");
                }
                length = Some(n);
            }
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            coded = true;
            chunked = v
                .rsplit(',')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        } else if k.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
    }
    let body = match (coded, chunked, length) {
        (true, _, Some(_)) => {
            return unparseable("an HTTP request with both Transfer-Encoding and Content-Length");
        }
        (true, false, None) => {
            return unparseable("an HTTP request whose last transfer coding is not chunked");
        }
        (true, true, None) => Some(BodyLen::Chunked),
        (false, _, Some(n)) => Some(BodyLen::Length(n)),
        (false, _, None) => None,
    };
    Ok(Head {
        names,
        body,
        upgrade,
    })
}

/// Where a request head ends in `b`: (its last line's end, the first byte
/// after the empty line), with CRLF or bare LF line ends.
pub(super) fn head_end(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while let Some(n) = b[i..].iter().position(|c| *c == b'\n') {
        let at = i + n;
        match (b.get(at + 1), b.get(at + 2)) {
            (Some(b'\n'), _) => return Some((at, at + 2)),
            (Some(b'\r'), Some(b'\n')) => return Some((at, at + 3)),
            _ => i = at + 1,
        }
    }
    None
}

impl Guard {
    /// The client has closed its side: a request head it left unfinished
    /// is passed up to its last complete line, once those lines are
    /// checked (a server may act on it at end of stream); an unfinished
    /// HTTP/2 header block is dropped.
    pub fn finish(&mut self) -> Result<Vec<u8>, Refusal> {
        if self.mode != Mode::Boundary || self.buf.is_empty() {
            return Ok(Vec::new());
        }
        let Some(last) = self.buf.iter().rposition(|c| *c == b'\n') else {
            return Ok(Vec::new());
        };
        let head = parse_head(&self.buf[..last])?;
        self.check(head.names)?;
        self.requests += 1;
        Ok(self.buf.drain(..=last).collect())
    }

    /// A guard for a connection opened for `name`.
    pub fn new(name: &str) -> Self {
        let mut hpack = loona_hpack::Decoder::new();
        hpack.set_max_allowed_table_size(MAX_TABLE);
        Self {
            name: name.to_owned(),
            buf: Vec::new(),
            mode: Mode::Boundary,
            hpack,
            held: 0,
            block: None,
            pass: 0,
            requests: 0,
        }
    }

    fn check(&self, names: Vec<(&'static str, String)>) -> Result<(), Refusal> {
        match names.into_iter().find(|(_, h)| *h != self.name) {
            Some((what, h)) => Err(Refusal::Other(what, h)),
            None => Ok(()),
        }
    }

    /// Takes the client's next bytes; returns those that may go upstream
    /// now (the rest wait for the end of their request head or header
    /// block), or why the connection must close.
    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        if self.mode == Mode::Opaque && self.buf.is_empty() {
            return Ok(data.to_vec());
        }
        self.buf.extend_from_slice(data);
        let mut out = Vec::with_capacity(self.buf.len());
        let r = self.run(&mut out);
        // What was passed leaves the buffer.
        let done = out.len();
        self.buf.drain(..done);
        r.map(|()| out)
    }

    /// Parses from `self.buf[out.len()..]`, appending what may pass.
    fn run(&mut self, out: &mut Vec<u8>) -> Result<(), Refusal> {
        loop {
            let i = out.len();
            let rest = &self.buf[i..];
            if rest.is_empty() {
                return Ok(());
            }
            match self.mode {
                Mode::Opaque => {
                    out.extend_from_slice(rest);
                }
                Mode::BodyStart(n, up) => {
                    let avail = &rest[..rest.len().min(usize::try_from(n).unwrap_or(usize::MAX))];
                    match body_start(avail, n)? {
                        BodyStep::Wait => return Ok(()),
                        BodyStep::Data => self.mode = Mode::Length(n, up),
                        BodyStep::Head(k, names) => {
                            self.check(names)?;
                            self.requests += 1;
                            out.extend_from_slice(&rest[..k]);
                            self.mode = match n - k as u64 {
                                0 if up => Mode::AfterUpgrade,
                                0 => Mode::Boundary,
                                left => Mode::BodyStart(left, up),
                            };
                        }
                    }
                }
                Mode::Length(n, up) | Mode::Chunked(Chunk::Data(n), up) => {
                    let take = (n.min(rest.len() as u64)) as usize;
                    out.extend_from_slice(&rest[..take]);
                    let left = n - take as u64;
                    self.mode = match (self.mode, left) {
                        (Mode::Length(..), 0) if up => Mode::AfterUpgrade,
                        (Mode::Length(..), 0) => Mode::Boundary,
                        (Mode::Length(..), l) => Mode::Length(l, up),
                        (_, 0) => Mode::Chunked(Chunk::DataEnd, up),
                        (_, l) => Mode::Chunked(Chunk::Data(l), up),
                    };
                }
                Mode::Chunked(Chunk::DataEnd, up) => {
                    if rest.len() < 2 {
                        return Ok(());
                    }
                    if &rest[..2] != b"\r\n" {
                        return unparseable("an HTTP chunk not followed by CRLF");
                    }
                    out.extend_from_slice(b"\r\n");
                    self.mode = Mode::Chunked(Chunk::Size, up);
                }
                Mode::Chunked(c @ (Chunk::Size | Chunk::Trailers), up) => {
                    let Some(end) = find(&rest[..rest.len().min(MAX_LINE)], b"\r\n") else {
                        return if rest.len() >= MAX_LINE {
                            unparseable("an HTTP chunk-size or trailer line too long")
                        } else {
                            Ok(())
                        };
                    };
                    let line = &rest[..end];
                    self.mode = if c == Chunk::Size {
                        let hex = line.split(|b| *b == b';').next().unwrap_or_default();
                        let hex = std::str::from_utf8(hex)
                            .unwrap_or("!")
                            .trim_matches([' ', '\t']);
                        let Some(size) = (!hex.is_empty() && hex.len() <= 15)
                            .then(|| u64::from_str_radix(hex, 16).ok())
                            .flatten()
                        else {
                            return unparseable("an HTTP chunk size that is not hexadecimal");
                        };
                        if size == 0 {
                            Mode::Chunked(Chunk::Trailers, up)
                        } else {
                            Mode::Chunked(Chunk::Data(size), up)
                        }
                    } else if line.is_empty() {
                        if up {
                            Mode::AfterUpgrade
                        } else {
                            Mode::Boundary
                        }
                    } else {
                        Mode::Chunked(Chunk::Trailers, up)
                    };
                    out.extend_from_slice(&rest[..end + 2]);
                }
                Mode::AfterUpgrade => {
                    // Bytes a lenient server skips before a request line
                    // (` GET …` to Python's http.server) are HTTP too, and
                    // refused as such (red-team wave 4, W5); a WebSocket
                    // frame or TLS in a tunnel begins otherwise.
                    let c = rest[0];
                    self.mode = if is_tchar(c) || lenient_space(c) {
                        Mode::Boundary
                    } else {
                        Mode::Opaque
                    };
                }
                Mode::Boundary => {
                    // Empty lines before a request are allowed (RFC 9112).
                    let skip = rest
                        .iter()
                        .take_while(|c| **c == b'\r' || **c == b'\n')
                        .count();
                    if skip > 0 {
                        out.extend_from_slice(&rest[..skip]);
                        continue;
                    }
                    let n = rest.len().min(H2_PREFACE.len());
                    if rest[..n] == H2_PREFACE[..n] {
                        if n < H2_PREFACE.len() {
                            return Ok(());
                        }
                        out.extend_from_slice(H2_PREFACE);
                        self.mode = Mode::H2;
                        continue;
                    }
                    if !is_tchar(rest[0]) {
                        return unparseable("bytes that are not an HTTP request");
                    }
                    let window = &rest[..rest.len().min(MAX_HEAD + 4)];
                    let Some((end, after)) = head_end(window) else {
                        return if rest.len() >= MAX_HEAD + 4 {
                            unparseable(format!(
                                "an HTTP request head longer than {MAX_HEAD} bytes"
                            ))
                        } else {
                            Ok(())
                        };
                    };
                    let head = parse_head(&rest[..end])?;
                    self.check(head.names)?;
                    self.requests += 1;
                    out.extend_from_slice(&rest[..after]);
                    let up = head.upgrade;
                    self.mode = match head.body {
                        Some(BodyLen::Length(n)) if n > 0 => Mode::BodyStart(n, up),
                        Some(BodyLen::Chunked) => Mode::Chunked(Chunk::Size, up),
                        _ if up => Mode::AfterUpgrade,
                        _ => Mode::Boundary,
                    };
                }
                Mode::H2 => {
                    if !self.h2(out)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// One step of HTTP/2: `false` when more bytes are needed.
    fn h2(&mut self, out: &mut Vec<u8>) -> Result<bool, Refusal> {
        let i = out.len();
        if self.pass > 0 {
            let rest = &self.buf[i..];
            let take = (self.pass.min(rest.len() as u64)) as usize;
            out.extend_from_slice(&rest[..take]);
            self.pass -= take as u64;
            return Ok(take > 0);
        }
        let p = i + self.held;
        let Some(h) = self.buf.get(p..p + 9) else {
            return Ok(false);
        };
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let (ty, flags) = (h[3], h[4]);
        match (ty, self.block.is_some()) {
            (1, false) | (9, true) => {}
            (_, true) => return unparseable("an HTTP/2 header block interrupted"),
            (9, false) => return unparseable("an HTTP/2 CONTINUATION without HEADERS"),
            (5, _) => return unparseable("an HTTP/2 PUSH_PROMISE from the client"),
            _ => {
                out.extend_from_slice(&self.buf[i..i + 9]);
                self.pass = len as u64;
                return Ok(true);
            }
        }
        if len > MAX_BLOCK {
            return unparseable(format!(
                "an HTTP/2 header block longer than {MAX_BLOCK} bytes"
            ));
        }
        let Some(payload) = self.buf.get(p + 9..p + 9 + len) else {
            return Ok(false);
        };
        let fragment = if ty == 1 {
            let mut f = payload;
            let mut pad = 0;
            if flags & 0x8 != 0 {
                let Some((&n, rest)) = f.split_first() else {
                    return unparseable("a malformed HTTP/2 HEADERS frame");
                };
                pad = n as usize;
                f = rest;
            }
            if flags & 0x20 != 0 {
                let Some(rest) = f.get(5..) else {
                    return unparseable("a malformed HTTP/2 HEADERS frame");
                };
                f = rest;
            }
            if pad > f.len() {
                return unparseable("a malformed HTTP/2 HEADERS frame");
            }
            &f[..f.len() - pad]
        } else {
            payload
        };
        let block = self.block.get_or_insert_with(Vec::new);
        block.extend_from_slice(fragment);
        if block.len() > MAX_BLOCK {
            return unparseable(format!(
                "an HTTP/2 header block longer than {MAX_BLOCK} bytes"
            ));
        }
        self.held += 9 + len;
        if flags & 0x4 == 0 {
            return Ok(true);
        }
        let block = self.block.take().unwrap_or_default();
        let headers = self.hpack.decode(&block).map_err(|e| {
            Refusal::Unparseable(format!(
                "an HTTP/2 header block that does not decode ({e:?})"
            ))
        })?;
        let names = headers
            .into_iter()
            .filter(|(k, _)| k == b":authority" || k.eq_ignore_ascii_case(b"host"))
            .map(|(_, v)| ("HTTP/2 :authority", host_only(&String::from_utf8_lossy(&v))))
            .collect();
        self.check(names)?;
        self.requests += 1;
        out.extend_from_slice(&self.buf[i..i + self.held]);
        self.held = 0;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `b` in pieces of `step` bytes; everything passed, or the
    /// refusal.
    fn run(b: &[u8], step: usize) -> Result<Vec<u8>, Refusal> {
        let mut g = Guard::new("good.test");
        let mut out = Vec::new();
        for c in b.chunks(step.max(1)) {
            out.extend(g.feed(c)?);
        }
        Ok(out)
    }

    fn all_steps(b: &[u8]) -> Result<Vec<u8>, Refusal> {
        let whole = run(b, b.len());
        for step in [1, 2, 3, 7, 64] {
            assert_eq!(run(b, step), whole, "step {step}");
        }
        whole
    }

    #[test]
    fn issue_26_every_http1_request_is_checked_keep_alive_pipelined_and_bodies() {
        let two = b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\nGET /b HTTP/1.1\r\nHost: Good.Test:80\r\n\r\n";
        assert_eq!(all_steps(two).unwrap(), two);
        let smuggled =
            b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\nGET / HTTP/1.1\r\nHost: second.test\r\n\r\n";
        assert_eq!(
            all_steps(smuggled),
            Err(Refusal::Other("HTTP Host", "second.test".into()))
        );
        // The first request passes before the second is refused.
        let mut g = Guard::new("good.test");
        assert_eq!(g.feed(&smuggled[..35]).unwrap(), &smuggled[..35]);
        assert!(g.feed(&smuggled[35..]).is_err());
        // Red-team wave 4, W6: a body that begins with a request is read
        // as one (a server that does not read the body takes it for the
        // next request): another host is refused, the name's own passes,
        // and so does data.
        let post = b"POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 37\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\nGET / HTTP/1.1\r\nHost: good.test\r\n\r\n";
        assert_eq!(
            all_steps(post),
            Err(Refusal::Other("HTTP Host", "evil.test".into()))
        );
        let inner = b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\n";
        let own = [
            &b"GET / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 37\r\n\r\n"[..],
            inner,
            b"GET / HTTP/1.1\r\nHost: good.test\r\n\r\n",
        ]
        .concat();
        assert_eq!(all_steps(&own).unwrap(), own);
        for body in [
            &b"{\"q\": \"GET / HTTP/1.1\"}\n"[..],
            b"hello world",
            b"GET / HTTP/1.1",
            b"\x00\x01GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
            b"q=HTTP/1.1\nHost: evil.test\n\n",
        ] {
            let mut m = format!(
                "POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            m.extend_from_slice(body);
            assert_eq!(
                all_steps(&m).unwrap(),
                m,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        for body in [
            &b"\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"[..],
            b" GET\x1c/ HTTP/1.1\r\nHost: good.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: good.test\r\n",
        ] {
            let mut m = format!(
                "POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            m.extend_from_slice(body);
            m.extend_from_slice(b"X: y\r\n\r\n");
            assert!(
                all_steps(&m).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        // The body's first line is held until it is complete (nothing of
        // a head passes before it is read), not longer.
        let mut g = Guard::new("good.test");
        let head = b"POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 40\r\n\r\n";
        assert_eq!(g.feed(head).unwrap(), head);
        assert!(g.feed(b"GET / HTTP/1.1").unwrap().is_empty());
        assert!(g.feed(b"\r\nHost: evil.test\r\n").unwrap().is_empty());
        assert!(g.feed(b"\r\n").is_err());
        let mut g = Guard::new("good.test");
        assert_eq!(g.feed(head).unwrap(), head);
        assert_eq!(g.feed(b"{\"a\":").unwrap(), b"{\"a\":");
        let chunked = b"POST / HTTP/1.1\r\nHost: good.test\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        assert_eq!(
            all_steps(chunked),
            Err(Refusal::Other("HTTP Host", "evil.test".into()))
        );
        assert_eq!(
            all_steps(b"GET http://evil.test/ HTTP/1.1\r\nHost: good.test\r\n\r\n"),
            Err(Refusal::Other("HTTP request target", "evil.test".into()))
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: good.test\r\n X: folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : good.test\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
            b"\x00\x01\x02",
            b"POST / HTTP/1.1\r\nHost: good.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nHost: good.test\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            assert!(
                matches!(all_steps(bad), Err(Refusal::Unparseable(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Bare LF line ends are followed (servers may accept them).
        let lf = b"GET / HTTP/1.1\nHost: good.test\n\nGET / HTTP/1.1\nHost: evil.test\n\n";
        assert_eq!(
            all_steps(lf),
            Err(Refusal::Other("HTTP Host", "evil.test".into()))
        );
        assert!(matches!(
            all_steps(b"GET / HTTP/1.1\r\nHost: good.test\rHost: evil.test\r\n\r\n"),
            Err(Refusal::Unparseable(_))
        ));
        // At the client's end of stream an unfinished head passes up to
        // its last complete line, checked.
        let mut g = Guard::new("good.test");
        assert!(
            g.feed(b"GET / HTTP/1.1\nHost: good.test\nX-Par")
                .unwrap()
                .is_empty()
        );
        assert_eq!(g.finish().unwrap(), b"GET / HTTP/1.1\nHost: good.test\n");
        let mut g = Guard::new("good.test");
        assert!(
            g.feed(b"GET / HTTP/1.1\nHost: evil.test\n")
                .unwrap()
                .is_empty()
        );
        assert!(g.finish().is_err());
        // A head that never ends is refused once past the bound.
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert!(matches!(run(&long, 512), Err(Refusal::Unparseable(_))));
    }

    #[test]
    fn issue_26_upgrade_ends_inspection_only_for_a_protocol_that_is_not_http() {
        let ws = b"GET /ws HTTP/1.1\r\nHost: good.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        let mut m = ws.to_vec();
        m.extend_from_slice(&[0x81, 0x85, 1, 2, 3, 4, b'G', b'E', b'T', b' ', b'/']);
        assert_eq!(all_steps(&m).unwrap(), m);
        // The server refused the upgrade: the next request is checked.
        let mut m = ws.to_vec();
        m.extend_from_slice(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
        assert!(matches!(all_steps(&m), Err(Refusal::Other(..))));
        // Red-team wave 4, W5: whitespace a lenient server skips before a
        // request line is HTTP too (and refused), not the upgraded
        // protocol.
        for lead in [
            &b" "[..],
            b"\t",
            b"\x0b",
            b"\x0c",
            b"\x1c",
            b"\x85",
            b"\xa0",
        ] {
            let mut m = ws.to_vec();
            m.extend_from_slice(lead);
            m.extend_from_slice(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
            assert!(
                matches!(all_steps(&m), Err(Refusal::Unparseable(_))),
                "{lead:?}"
            );
        }
        // CONNECT to the name, then TLS inside: passed.
        let mut m = b"CONNECT good.test:443 HTTP/1.1\r\nHost: good.test\r\n\r\n".to_vec();
        m.extend_from_slice(&[0x16, 3, 1, 0, 5, 1, 2, 3, 4, 5]);
        assert_eq!(all_steps(&m).unwrap(), m);
    }

    fn h2_headers(stream: u8, authority: &str, enc: &mut loona_hpack::Encoder) -> Vec<u8> {
        let block = enc.encode([
            (&b":method"[..], &b"GET"[..]),
            (&b":scheme"[..], &b"http"[..]),
            (&b":path"[..], &b"/"[..]),
            (&b":authority"[..], authority.as_bytes()),
        ]);
        let mut f = (block.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[1, 5, 0, 0, 0, stream]);
        f.extend_from_slice(&block);
        f
    }

    #[test]
    fn issue_26_every_h2c_header_block_is_checked_with_one_hpack_state() {
        let mut enc = loona_hpack::Encoder::new();
        let mut m = H2_PREFACE.to_vec();
        m.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        m.extend(h2_headers(1, "good.test", &mut enc));
        // DATA on stream 1, then a second stream for the same name: its
        // block refers to the first's dynamic table entries.
        m.extend_from_slice(&[0, 0, 3, 0, 1, 0, 0, 0, 1, b'a', b'b', b'c']);
        m.extend(h2_headers(3, "good.test", &mut enc));
        assert_eq!(all_steps(&m).unwrap(), m);
        let ok = m.len();
        m.extend(h2_headers(5, "second.test", &mut enc));
        assert_eq!(
            all_steps(&m),
            Err(Refusal::Other("HTTP/2 :authority", "second.test".into()))
        );
        // What came before the refused block passed.
        let mut g = Guard::new("good.test");
        assert_eq!(g.feed(&m[..ok]).unwrap().len(), ok);
        // HEADERS split over CONTINUATION, interrupted: refused.
        let mut m = H2_PREFACE.to_vec();
        m.extend_from_slice(&[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x82]);
        m.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert!(matches!(all_steps(&m), Err(Refusal::Unparseable(_))));
        // Undecodable block: refused.
        let mut m = H2_PREFACE.to_vec();
        m.extend_from_slice(&[0, 0, 2, 1, 4, 0, 0, 0, 1, 0xff, 0xff]);
        assert!(matches!(all_steps(&m), Err(Refusal::Unparseable(_))));
    }
}
