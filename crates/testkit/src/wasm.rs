//! The example's WebAssembly builds, made in a test's own directory as
//! scripts/build-wasm-example.sh makes them: C built for wasm32-wasi with
//! Debian's clang-14 and wasi-libc (scripts/setup.sh installs them; without
//! them the test fails), and components made by `cordon-wasm-componentize`
//! (built beside the test's binaries by the workspace's build).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The checkout.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `src` (relative to the checkout) built for wasm32-wasi into `out`, with
/// `extra` flags (e.g. `-mexec-model=reactor`), readable by all.
pub fn clang(src: &str, out: &Path, extra: &[&str]) {
    let r = Command::new("clang-14")
        .args(["--target=wasm32-wasi", "--sysroot=/usr", "-O2"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(repo().join(src))
        .output()
        .unwrap_or_else(|e| {
            panic!("clang-14: {e}: install clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32 (scripts/setup.sh)")
        });
    assert!(
        r.status.success(),
        "clang-14 --target=wasm32-wasi {src} failed (scripts/setup.sh installs wasi-libc and libclang-rt-14-dev-wasm32):\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    fs::set_permissions(out, fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// `cordon-wasm-componentize` in `bin_dir` (a directory of the workspace's
/// binaries) with `args`; its output, the last argument, made readable by
/// all.
pub fn componentize(bin_dir: &Path, args: &[&Path]) {
    let tool = bin_dir.join("cordon-wasm-componentize");
    let r = Command::new(&tool).args(args).output().unwrap_or_else(|e| {
        panic!(
            "{}: {e}: build it with `cargo build -p cordon-wasm-componentize`",
            tool.display()
        )
    });
    assert!(
        r.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    if let Some(out) = args.last() {
        fs::set_permissions(out, fs::Permissions::from_mode(0o644)).expect("chmod");
    }
}

/// The example's typed functions (examples/wasm/json-tools.c, world
/// `json-tools` of examples/wasm/json-tools.wit) as a component in `dir`.
pub fn json_tools(bin_dir: &Path, dir: &Path) -> PathBuf {
    let core = dir.join("json-tools.core.wasm");
    clang(
        "examples/wasm/json-tools.c",
        &core,
        &["-mexec-model=reactor"],
    );
    let out = dir.join("json-tools.wasm");
    componentize(
        bin_dir,
        &[
            Path::new("exports"),
            &core,
            &repo().join("examples/wasm/json-tools.wit"),
            Path::new("json-tools"),
            &out,
        ],
    );
    out
}
