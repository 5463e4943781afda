//! The lexical facts about HTTP both the first-bytes inspector
//! (`inspect`) and the port-80 guard (`http`) go by: one place, so the two
//! read a request alike (and neither module imports the other both ways).

/// The HTTP/2 connection preface.
pub(super) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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

/// Whether a (first) line names an HTTP version, `HTTP/` in any case,
/// wherever: then it is an HTTP request line to some server, whatever
/// separates its words — Python's `http.server` splits it on any
/// whitespace ([`lenient_space`]) and skips that in front of the method
/// (red-team wave 4, W5) — and the strict parser must read it, or it is
/// refused.
pub(super) fn versioned(line: &[u8]) -> bool {
    line.to_ascii_uppercase().windows(5).any(|w| w == b"HTTP/")
}

/// The bytes some HTTP server takes for whitespace between (and before)
/// a request line's words: ASCII's (tab, LF, VT, FF, CR, space), the
/// separators 0x1c-0x1f and, read as Latin-1, NEL 0x85 and NBSP 0xa0 (what
/// Python's `str.split()` splits on).
pub(super) fn lenient_space(c: u8) -> bool {
    matches!(c, b'\t'..=b'\r' | 0x1c..=0x20 | 0x85 | 0xa0)
}

/// Whether `b`, the start of a first line not complete yet, may still
/// become an HTTP request line to a lenient server: (after whitespace it
/// may skip) a method token, then whitespace or nothing yet.
pub(super) fn may_be_request(b: &[u8]) -> bool {
    let b = &b[b.iter().take_while(|c| lenient_space(**c)).count()..];
    let token = b.iter().take_while(|c| is_tchar(**c)).count();
    b.is_empty() || (token > 0 && (token == b.len() || lenient_space(b[token])))
}

/// Whether a complete first line without a version reads as an HTTP/0.9
/// request to a lenient server: (after whitespace it may skip) an HTTP
/// method, whitespace, then a target. It names no `Host`, but a server
/// that still speaks HTTP/0.9 (nginx) takes the virtual host from an
/// absolute-form target (red-team stop 60): never "another protocol".
/// Another word first (`EHLO host`, `USER x`) is another protocol.
pub(super) fn unversioned_request(line: &[u8]) -> bool {
    const METHODS: &[&[u8]] = &[
        b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH",
    ];
    let b = &line[line.iter().take_while(|c| lenient_space(**c)).count()..];
    let token = b.iter().take_while(|c| is_tchar(**c)).count();
    METHODS.iter().any(|m| m.eq_ignore_ascii_case(&b[..token]))
        && b.get(token).is_some_and(|c| lenient_space(*c))
        && b[token..].iter().any(|c| !lenient_space(*c))
}

pub(super) fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}
