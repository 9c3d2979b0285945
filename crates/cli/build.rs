//! Link the `cordon` binary with packed relative relocations (DT_RELR) where
//! the toolchain and the C library support them.
//!
//! The binary carries ~20,000 relative relocations that the dynamic loader
//! applies at every start; packed, they take a few hundred bytes instead of
//! ~500 KB, which a one-shot `cordon exec` reads on every call
//! (docs/benchmarks/jail.md). Support is probed by linking and running a
//! small program with the same C compiler and flag: an older linker rejects
//! the flag, an older glibc (before 2.36) refuses to load the result, and in
//! both cases the binary is linked as before.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CORDON_NO_RELR");
    if env::var_os("CORDON_NO_RELR").is_some() || !target_is_linux_gnu() {
        return;
    }
    if supported() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    } else {
        println!("cargo:warning=linking without packed relative relocations ({FLAG} unsupported)");
    }
}

fn target_is_linux_gnu() -> bool {
    env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
        && env::var("TARGET").ok() == env::var("HOST").ok()
}

fn supported() -> bool {
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let src = out.join("relr_probe.c");
    let bin = out.join("relr_probe");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let linked = Command::new(cc)
        .args(["-pie", "-fPIE", FLAG, "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    linked && Command::new(&bin).status().is_ok_and(|s| s.success())
}
