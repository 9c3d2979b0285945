//! The microVM tests' shared pieces: the static guest init, built once per
//! test binary by `scripts/build-vm-init.sh`, and a scan for processes
//! left behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The static `cordon-vm-init`, built (or found up to date) once.
pub fn init() -> &'static PathBuf {
    static INIT: OnceLock<PathBuf> = OnceLock::new();
    INIT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-vm-init.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .expect("run scripts/build-vm-init.sh");
        assert!(
            out.status.success(),
            "scripts/build-vm-init.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
    })
}

/// Processes (other than cargo) whose command line names `needle`, as
/// `/proc/PID: COMMAND LINE`.
pub fn processes_naming(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        if let Ok(cmd) = std::fs::read(p.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) && !cmd.contains("cargo") {
                out.push(format!("{}: {cmd}", p.path().display()));
            }
        }
    }
    out
}
