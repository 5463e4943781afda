//! `TURNSTILE_INIT_BUILD_ID`: a hash of every source the init's protocol
//! is made of (this crate's, and the Plan's and OCI constants' crates
//! below it). `supervise` hands its own to the init it starts; an init
//! built from other sources refuses to run (see `turnstile_init::BUILD_ID`):
//! a `turnstile-init` left beside a rebuilt `supervise` fails the turn with
//! that said, instead of reading a Plan it may not understand.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dirs = [
        root.join("src"),
        root.join("../policy/src"),
        root.join("../oci/src"),
    ];
    let mut all = Vec::new();
    for d in &dirs {
        println!("cargo:rerun-if-changed={}", d.display());
        files(d, &mut all);
    }
    all.sort();
    // FNV-1a, 64 bits, over each file's path (relative) and bytes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for f in &all {
        eat(f
            .strip_prefix(&root)
            .unwrap_or(f)
            .to_string_lossy()
            .as_bytes());
        eat(&std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=TURNSTILE_INIT_BUILD_ID={h:016x}");
}
