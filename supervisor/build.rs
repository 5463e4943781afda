//! Compiles the denial observer's BPF program (`bpf/denials.bpf.c`) with
//! clang into `$OUT_DIR/denials.bpf.o`, embedded in the binary. Without
//! clang (or the libbpf headers) the build still succeeds: the object is
//! empty and the supervisor reports at run time, in every turn's evidence
//! and in `doctor`, that the observer was not built and why.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    unwinder_linked_statically();
    let src = "bpf/denials.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=TURNSTILE_CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("denials.bpf.o");
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => Some(("__TARGET_ARCH_x86", "x86_64-linux-gnu")),
        Ok("aarch64") => Some(("__TARGET_ARCH_arm64", "aarch64-linux-gnu")),
        _ => None,
    };
    let clang = std::env::var("TURNSTILE_CLANG").unwrap_or_else(|_| "clang".into());
    let why = match arch {
        None => Some("this architecture has no BPF observer".to_owned()),
        Some((define, multiarch)) => {
            let r = Command::new(&clang)
                .args(["-g", "-O2", "-target", "bpf", "-Wall"])
                // The same object from every checkout: its hash names the
                // pinned observer all supervisors on a host share.
                .arg(format!(
                    "-ffile-prefix-map={}=.",
                    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()
                ))
                .arg(format!("-D{define}"))
                .arg(format!("-I/usr/include/{multiarch}"))
                .args(["-c", src, "-o"])
                .arg(&out)
                .output();
            match r {
                Ok(o) if o.status.success() => None,
                Ok(o) => Some(format!(
                    "{clang} failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .next()
                        .unwrap_or("")
                )),
                Err(e) => Some(format!(
                    "{clang} not found ({e}); install clang and libbpf-dev"
                )),
            }
        }
    };
    match why {
        None => println!("cargo:rustc-env=TURNSTILE_BPF_UNBUILT="),
        Some(why) => {
            println!("cargo:warning=denial observer not built: {why}");
            let _ = std::fs::write(&out, b"");
            println!("cargo:rustc-env=TURNSTILE_BPF_UNBUILT={why}");
        }
    }
}

/// Links GCC's unwinder statically (`libgcc_eh.a`) instead of loading
/// `libgcc_s.so.1` (issue 29). Shared libgcc runs a constructor at every
/// start that probes the CPU with `cpuid`, which traps to the hypervisor on
/// the hosts we measure: 181 µs of every `supervise` start (bpftrace,
/// `__cpu_indicator_init`, 23 starts), on every turn's path and every
/// client's. The unwinder is the same code either way (`gcc
/// -static-libgcc` does this for C programs); rustc asks for `-lgcc_s`
/// by name, so a linker script of that name, first on the search path,
/// answers with the static archive. Skipped (shared libgcc, as before)
/// where the C compiler has no `libgcc_eh.a` or the target is not
/// glibc's.
fn unwinder_linked_statically() {
    let gnu = std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
        && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && !std::env::var("CARGO_CFG_TARGET_FEATURE")
            .unwrap_or_default()
            .split(',')
            .any(|f| f == "crt-static");
    if !gnu {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let found = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_absolute() && p.is_file());
    let Some(archive) = found else {
        println!("cargo:warning=libgcc_eh.a not found: linking the shared libgcc_s");
        return;
    };
    let dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("unwinder");
    let script = format!("INPUT({})\n", archive.display());
    if std::fs::create_dir_all(&dir).is_err()
        || std::fs::write(dir.join("libgcc_s.so"), script).is_err()
    {
        return;
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rustc-link-search=native={}", dir.display());
}
