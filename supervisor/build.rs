//! Compiles the denial observer's BPF program (`bpf/denials.bpf.c`) with
//! clang into `$OUT_DIR/denials.bpf.o`, embedded in the binary. Without
//! clang (or the libbpf headers) the build still succeeds: the object is
//! empty and the supervisor reports at run time, in every turn's evidence
//! and in `doctor`, that the observer was not built and why.

use std::path::PathBuf;
use std::process::Command;

fn main() {
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
