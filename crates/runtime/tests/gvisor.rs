//! The gVisor runtime against the real `runsc`. Every test body runs in a
//! re-executed copy of this test binary, as root and (where it does not
//! need cgroup limits, which uid 65534 has no delegation for here) as uid
//! 65534 through `setpriv`. A missing or too old `runsc` fails the tests
//! (unless `CORDON_TEST_ALLOW_SKIP=1`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_runtime::gvisor::{Gvisor, Options};
use cordon_runtime::{Context, EgressEvent, EgressPolicy, Network, Runtime, SandboxSpec, Status};

#[path = "../../../tests/support/skip.rs"]
mod skip;
use skip::skip_or_fail;

const CHILD_ENV: &str = "CORDON_GVISOR_TEST_CHILD";

fn euid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn reexec(test: &str, unprivileged: bool) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if unprivileged && euid() == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c.arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args([
        "--exact",
        test,
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "1")
    // An unprivileged broker's state directory: its own under /tmp.
    .env_remove("XDG_RUNTIME_DIR");
    let out = cmd.output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && so.contains("1 passed"),
        "{test} (unprivileged={unprivileged}) failed:\n{so}\n{se}"
    );
    for l in so.lines().chain(se.lines()).filter(|l| l.contains("SKIP")) {
        println!("{l}");
    }
}

fn as_root(test: &str) {
    if euid() != 0 {
        let name = format!("{}::as_root", test.trim_end_matches("::body"));
        skip_or_fail(&name, &format!("the tests run as uid {}, not root", euid()));
        return;
    }
    reexec(test, false);
}

fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Both as root and as uid 65534.
macro_rules! gvisor_test {
    ($name:ident) => {
        mod $name {
            #[test]
            fn as_root() {
                super::as_root(concat!(stringify!($name), "::body"));
            }
            #[test]
            fn as_nobody() {
                super::reexec(concat!(stringify!($name), "::body"), true);
            }
            #[test]
            #[ignore = "runs through as_root / as_nobody"]
            fn body() {
                if super::in_child() {
                    super::$name();
                }
            }
        }
    };
}

/// As root only: needs cgroup limits.
macro_rules! gvisor_root_test {
    ($name:ident) => {
        mod $name {
            #[test]
            fn as_root() {
                super::as_root(concat!(stringify!($name), "::body"));
            }
            #[test]
            #[ignore = "runs through as_root"]
            fn body() {
                if super::in_child() {
                    super::$name();
                }
            }
        }
    };
}

/// The runtime, or a failure (skip only when allowed) naming what is
/// missing.
fn gvisor() -> Option<Gvisor> {
    let g = Gvisor::new(Options::default(), Default::default()).expect("gvisor runtime");
    let problems = g.check(&SandboxSpec::new("probe", ["/bin/true"])).problems;
    if !problems.is_empty() {
        skip_or_fail(&skip::this_test(), &problems.join("; "));
        return None;
    }
    Some(g)
}

fn spec(argv: &[&str]) -> SandboxSpec {
    let mut s = SandboxSpec::new("gv", argv.iter().copied());
    s.profile = cordon_policy::policy::Profile::P3;
    let l = cordon_policy::resolve::default_limits(s.profile).expect("P3 limits");
    s.limits = l.into();
    s.limits.wall = Duration::from_secs(30);
    s
}

fn sh(script: &str) -> SandboxSpec {
    spec(&["/bin/sh", "-c", script])
}

fn run(g: &Gvisor, s: &SandboxSpec, input: &[u8]) -> cordon_runtime::Outcome {
    g.run(s, input.to_vec(), &Context::discard("t"))
        .expect("run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

gvisor_test!(runs_a_program_with_stdin_and_stdout);
fn runs_a_program_with_stdin_and_stdout() {
    let Some(g) = gvisor() else { return };
    let o = run(&g, &sh("cat; echo; id -u; uname -r; exit 3"), b"hello");
    assert_eq!(o.status, Status::Exited, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.exit_code, Some(3));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello");
    assert_eq!(lines[1], "1000");
    // gVisor's own kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(lines[2], host.trim(), "uname came from the host kernel");
}
