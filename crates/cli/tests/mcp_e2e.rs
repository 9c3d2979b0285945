//! `cordon serve` against clients and servers cordon did not write: the
//! official Python MCP SDK client (tests/e2e/mcp_python_client.py) and the
//! reference servers server-everything, server-filesystem and
//! mcp-server-fetch inside their sandboxes. A missing prerequisite fails the test
//! (scripts/setup.sh and tests/e2e/run.sh install them) unless skipping is
//! allowed (`skip_or_fail`).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python_mcp() -> Result<(), String> {
    match Command::new("python3").args(["-c", "import mcp"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        // The last line of the traceback names the missing module.
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_owned()),
        Err(e) => Err(format!("python3: {e}")),
    }
}

fn run(http: bool) {
    let test = this_test();
    if let Err(why) = python_mcp() {
        skip_or_fail(
            &test,
            &format!("the Python mcp SDK is not importable ({why}); run scripts/setup.sh"),
        );
        return;
    }
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("tests/e2e/mcp_python_client.py"))
        .args(["--cordon", env!("CARGO_BIN_EXE_cordon")]);
    if http {
        cmd.arg("--http");
    }
    match npm_dir() {
        Some(d) => {
            cmd.arg("--npm-dir").arg(d);
        }
        None => skip_or_fail(
            &test,
            "third-party servers: server-everything is not installed under $CORDON_E2E_NPM or /var/cache/cordon-e2e/npm; run scripts/setup.sh",
        ),
    }
    let py = std::env::var_os("CORDON_E2E_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/py"));
    if npm_dir().is_some() && py.join("mcp_server_fetch").is_dir() {
        cmd.arg("--py-dir").arg(py);
    } else {
        skip_or_fail(
            &test,
            "mcp-server-fetch: not installed under $CORDON_E2E_PY or /var/cache/cordon-e2e/py; run scripts/setup.sh",
        );
    }
    let out = cmd.output().expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The script ran its checks (not a silent skip).
    assert!(
        stdout.contains("PASS ") && stdout.contains("OK: 0 failed"),
        "{stdout}"
    );
}

#[test]
fn python_sdk_client_over_stdio() {
    run(false);
}

#[test]
fn python_sdk_client_over_http() {
    run(true);
}

/// mcp-server-fetch with its own SSRF guard on (no `--allow-private-ips`) fetches an allowed
/// host through the doors: the DNS door answers the address the broker resolved, which the
/// guard accepts. The broker runs in a network namespace made here, where 93.184.216.34 (the
/// stand-in public upstream) is bound on loopback, so nothing can leave this machine. The
/// script also checks that the guard is on (a private pin is refused by it) and that the door
/// still refuses an unlisted host.
#[test]
fn ssrf_guarded_fetch_accepts_the_dns_doors_answer() {
    let test = this_test();
    if std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|r| r.split_whitespace().nth(1) == Some("0"))
            })
        })
        != Some(true)
    {
        skip_or_fail(&test, "the stand-in network namespace needs root");
        return;
    }
    if let Err(why) = python_mcp() {
        skip_or_fail(
            &test,
            &format!("the Python mcp SDK is not importable ({why}); run scripts/setup.sh"),
        );
        return;
    }
    let py = std::env::var_os("CORDON_E2E_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/py"));
    if !py.join("mcp_server_fetch").is_dir() {
        skip_or_fail(
            &test,
            "mcp-server-fetch: not installed under $CORDON_E2E_PY or /var/cache/cordon-e2e/py; run scripts/setup.sh",
        );
        return;
    }
    let out = Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "ip link set lo up && ip addr add 93.184.216.34/32 dev lo && exec \"$@\"",
            "sh",
            "python3",
        ])
        .arg(repo().join("tests/e2e/ssrf_guard.py"))
        .args(["--cordon", env!("CARGO_BIN_EXE_cordon")])
        .arg("--py-dir")
        .arg(&py)
        .output()
        .expect("run the SSRF guard check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("PASS the guard accepts the DNS door's answer")
            && stdout.contains("OK: 0 failed"),
        "{stdout}"
    );
}
