//! nftables through libnftables, in this process (issue 26, setup cost).
//!
//! A turn with egress loads its ruleset at start (its sets and counters
//! are read at the end over nfnetlink directly: see `counts`). An `nft`
//! process costs a fork, an exec and the dynamic loading of libnftables
//! and its five libraries: on this 2-core host ~3.5 ms to load the
//! ruleset, against ~1.2 ms through the library from a thread already in
//! the turn's namespace (`unshare -n`, median of 30, loaded host); the
//! first load in a process pays ~2 ms more (the library mapped, its tables
//! read), which [`preload`] moves off the turn's path. The library is the
//! one the `nft` binary itself links (`libnftables.so.1`), opened once per
//! process with `dlopen`; where it is missing (or lacks a symbol) the
//! caller falls back to the `nft` binary, so a host with `nft` works
//! either way.
//!
//! A context is made, used and freed on the calling thread: its netlink
//! socket is opened in that thread's network namespace (the caller enters
//! the turn's first), and nothing of it is shared between threads.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `NFT_CTX_OUTPUT_JSON` of `<nftables/libnftables.h>` (stable ABI).
const OUTPUT_JSON: u32 = 1 << 4;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type Buffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type SetFlags = unsafe extern "C" fn(*mut c_void, u32);
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// The library's entry points, resolved once.
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_output: Buffer,
    buffer_error: Buffer,
    get_output: GetBuffer,
    get_error: GetBuffer,
    set_output_flags: SetFlags,
    run_cmd: RunCmd,
    /// Keeps the functions above mapped for the life of the process.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("libnftables")
    }
}

static API: OnceLock<Option<Api>> = OnceLock::new();

fn load() -> Option<Api> {
    // SAFETY: libnftables' initialisers only set up its own state (no
    // code of ours runs on load); the library is the system's, the one the
    // `nft` binary links.
    let lib = unsafe { libloading::Library::new("libnftables.so.1") }.ok()?;
    macro_rules! sym {
        ($name:literal, $ty:ty) => {
            // SAFETY: the symbol has this C signature in every
            // libnftables.so.1 (its public API, `libnftables.h`); the
            // pointer is copied out and stays valid while `_lib` lives.
            *unsafe { lib.get::<$ty>($name) }.ok()?
        };
    }
    Some(Api {
        ctx_new: sym!(b"nft_ctx_new\0", CtxNew),
        ctx_free: sym!(b"nft_ctx_free\0", CtxFree),
        buffer_output: sym!(b"nft_ctx_buffer_output\0", Buffer),
        buffer_error: sym!(b"nft_ctx_buffer_error\0", Buffer),
        get_output: sym!(b"nft_ctx_get_output_buffer\0", GetBuffer),
        get_error: sym!(b"nft_ctx_get_error_buffer\0", GetBuffer),
        set_output_flags: sym!(b"nft_ctx_output_set_flags\0", SetFlags),
        run_cmd: sym!(b"nft_run_cmd_from_buffer\0", RunCmd),
        _lib: lib,
    })
}

/// Opens the library and makes (and frees) one context on a thread of its
/// own, once per process: a turn with egress calls it as its sandbox
/// starts being built, so the ruleset's load later finds the library
/// mapped and its tables read (~2 ms of the first load otherwise).
pub fn preload() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::thread::spawn(warm);
    });
}

/// [`preload`]'s work, on the calling thread.
fn warm() {
    let Some(api) = API.get_or_init(load).as_ref() else {
        return;
    };
    // `nft_ctx_new` of libnftables 1.0.x opens its netlink socket, and
    // exits the process if it cannot (the VM matrix's 6.1 kernel has no
    // nf_tables): the socket is tried first, as before every command.
    if netfilter_socket().is_err() {
        return;
    }
    // SAFETY: a context made and freed on this thread.
    unsafe {
        let ctx = (api.ctx_new)(0);
        if !ctx.is_null() {
            (api.ctx_free)(ctx);
        }
    }
}

/// Whether libnftables can be used here.
#[cfg(test)]
pub fn available() -> bool {
    API.get_or_init(load).is_some()
}

/// Runs `commands` (nft syntax, as `nft -f -` reads them) in the calling
/// thread's network namespace; with `json`, the output is JSON (`nft -j`).
/// `None` when the library is not available (use the `nft` binary).
pub fn run(commands: &str, json: bool) -> Option<Result<String, String>> {
    let api = API.get_or_init(load).as_ref()?;
    let Ok(text) = CString::new(commands) else {
        return Some(Err("nft: a command holds a NUL byte".into()));
    };
    // libnftables up to 1.0.x calls `exit(3)` when it cannot open its
    // netlink socket (a kernel built without nf_tables, as the VM
    // matrix's minimal 6.1 image): that would end the supervisor mid-turn,
    // with no ledger entry. The same socket, opened first on this thread
    // (already in the turn's namespace), answers the question safely.
    if let Err(errno) = netfilter_socket() {
        return Some(Err(format!(
            "nft: this kernel has no nftables netlink ({errno}); egress cannot be enforced"
        )));
    }
    // SAFETY: every call below follows libnftables' contract: a context
    // from `nft_ctx_new` (checked non-null), used on this thread only,
    // freed once at the end; the buffers it returns are NUL-terminated,
    // owned by the context and read before it is freed; `text` outlives
    // the command that reads it.
    unsafe {
        let ctx = (api.ctx_new)(0);
        if ctx.is_null() {
            return Some(Err("nft: libnftables could not make a context".into()));
        }
        let buffered = (api.buffer_output)(ctx) == 0 && (api.buffer_error)(ctx) == 0;
        if json {
            (api.set_output_flags)(ctx, OUTPUT_JSON);
        }
        let rc = if buffered {
            (api.run_cmd)(ctx, text.as_ptr())
        } else {
            -1
        };
        let read = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let out = read((api.get_output)(ctx));
        let err = read((api.get_error)(ctx));
        (api.ctx_free)(ctx);
        Some(match (buffered, rc) {
            (false, _) => Err("nft: libnftables could not buffer its output".into()),
            (true, 0) => Ok(out),
            (true, _) => Err(format!("nft: {}", err.trim())),
        })
    }
}

/// Opens and closes a `NETLINK_NETFILTER` socket in the calling thread's
/// network namespace: what libnftables needs before its first command.
fn netfilter_socket() -> Result<(), nix::errno::Errno> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    /// In a network namespace of its own (root only): a table loaded and
    /// listed as JSON through the library, a bad command's error read.
    #[test]
    fn issue_26_the_library_loads_lists_and_reports_errors_in_the_callers_namespace() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        if !super::available() {
            assert!(
                std::env::var("TURNSTILE_REQUIRE_KERNEL").as_deref() != Ok("1"),
                "libnftables.so.1 is required (apt-get install nftables)"
            );
            return;
        }
        let got = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let load = super::run(
                "table inet t { counter c { }; chain o { type filter hook output priority 0; policy accept; }; }",
                false,
            );
            let list = super::run("list table inet t", true);
            let bad = super::run("list table inet missing", false);
            (load, list, bad)
        })
        .join()
        .unwrap();
        assert_eq!(got.0, Some(Ok(String::new())));
        let list = got.1.unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&list).unwrap();
        assert!(
            v["nftables"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["counter"]["name"] == "c"),
            "{list}"
        );
        let bad = got.2.unwrap().unwrap_err();
        assert!(
            bad.contains("No such file or directory") || bad.contains("missing"),
            "{bad}"
        );
        // The host's own namespace never saw the table.
        assert!(super::run("list table inet t", false).unwrap().is_err());
    }

    /// A kernel without nf_tables (simulated on this thread alone: a
    /// seccomp filter answers EPROTONOSUPPORT to a netfilter netlink
    /// socket, as the VM matrix's 6.1 image does) is an error returned,
    /// never libnftables' `exit(3)` of the whole process.
    #[test]
    fn issue_26_a_kernel_without_nftables_netlink_is_an_error_not_an_exit() {
        use libseccomp::{
            ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
        };
        if !nix::unistd::Uid::effective().is_root() || !super::available() {
            return;
        }
        let got = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut f = ScmpFilterContext::new(ScmpAction::Allow).unwrap();
            f.set_ctl_tsync(false).unwrap();
            f.add_rule_conditional(
                ScmpAction::Errno(nix::libc::EPROTONOSUPPORT),
                ScmpSyscall::from_name("socket").unwrap(),
                &[
                    ScmpArgCompare::new(0, ScmpCompareOp::Equal, nix::libc::AF_NETLINK as u64),
                    ScmpArgCompare::new(
                        2,
                        ScmpCompareOp::Equal,
                        nix::libc::NETLINK_NETFILTER as u64,
                    ),
                ],
            )
            .unwrap();
            f.load().unwrap();
            // The background warm-up too (it makes a context).
            super::warm();
            super::run("list tables", false)
        })
        .join()
        .unwrap();
        let err = got.unwrap().unwrap_err();
        assert!(err.contains("no nftables netlink"), "{err}");
    }
}
