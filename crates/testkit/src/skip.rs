//! What an integration test does when this machine lacks something it needs
//! (root, a tool, a kernel feature, an installed server): it fails, unless
//! skipping was asked for with `CORDON_TEST_ALLOW_SKIP=1`. A security test
//! that passes without running proves nothing.
//!

use std::io::Write;
use std::path::PathBuf;

/// Set to `1` to let tests skip what this machine cannot run.
pub const ALLOW_SKIP_ENV: &str = "CORDON_TEST_ALLOW_SKIP";
/// Where skips are listed, one line each (default `target/test-skips.log`).
pub const SKIP_LOG_ENV: &str = "CORDON_TEST_SKIP_LOG";

/// `test` cannot run here because of `why`: panics, or, when
/// `CORDON_TEST_ALLOW_SKIP=1`, prints `SKIP <test>: <why>`, lists the skip
/// in the skip log and returns, and the caller returns (or leaves out the
/// part that cannot run).
#[track_caller]
pub fn skip_or_fail(test: &str, why: &str) {
    if std::env::var(ALLOW_SKIP_ENV).as_deref() != Ok("1") {
        panic!("{test}: cannot run: {why}; set {ALLOW_SKIP_ENV}=1 to allow skipping");
    }
    eprintln!("SKIP {test}: {why}");
    let log = skip_log();
    let why: Vec<&str> = why
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let line = format!("{} {test}: {}\n", package(), why.join(" / "));
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one short line with O_APPEND: lines of test processes
    // running at once do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // A skip that the summary would not show is not allowed.
    if let Err(e) = written {
        panic!(
            "{test}: skipped ({why:?}), but the skip cannot be listed in {}: {e}",
            log.display()
        );
    }
}

/// The name of the running test: libtest names each test's thread after it.
pub fn this_test() -> String {
    std::thread::current()
        .name()
        .map(str::to_string)
        .unwrap_or_else(package)
}

/// The package whose tests run: cargo sets `CARGO_PKG_NAME` for the test
/// binaries it runs, and the re-run copies inherit it.
fn package() -> String {
    std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "cordon".to_string())
}

fn skip_log() -> PathBuf {
    std::env::var_os(SKIP_LOG_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/test-skips.log"
            ))
        })
}
