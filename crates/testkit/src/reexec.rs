//! A test body re-run in a copy of its own test binary: as root (the
//! broker's usual case) and as uid 65534 through `setpriv` (an
//! unprivileged broker). The body is an ignored test that does its work
//! only in the copy (where the harness's `child_env` is set); the two
//! outer tests start the copies and fail with the copy's output when it
//! does not pass. Skips of the copy are printed by the outer test.
//!
//! ```ignore
//! const HARNESS: Harness = Harness { child_env: "CORDON_X_TEST_CHILD", ..Harness::NONE };
//! macro_rules! x_test {
//!     ($name:ident) => { cordon_testkit::reexec_test!(HARNESS, $name); };
//! }
//! x_test!(some_test); // some_test::as_root, some_test::as_nobody
//! ```

use std::process::Command;

use crate::{euid, skip_or_fail};

/// The uid and gid the unprivileged copy runs as.
pub const NOBODY: u32 = 65534;

/// How a test binary re-runs its bodies.
#[derive(Debug, Clone, Copy)]
pub struct Harness {
    /// Set to `1` in the copies: the body runs only there.
    pub child_env: &'static str,
    /// Set in both copies.
    pub env: &'static [(&'static str, &'static str)],
    /// Removed from both copies' environment.
    pub env_remove: &'static [&'static str],
    /// Removed from the environment of the copy run as uid 65534 only.
    pub env_remove_as_nobody: &'static [&'static str],
    /// Give the copy run as uid 65534 a runtime directory of its own
    /// (`CORDON_RUN_DIR`, a scratch directory it owns): it has no
    /// `XDG_RUNTIME_DIR`, and cordon never falls back to a path under /tmp.
    pub run_dir_as_nobody: bool,
}

impl Harness {
    /// No environment of its own: start from this with `..Harness::NONE`.
    pub const NONE: Harness = Harness {
        child_env: "",
        env: &[],
        env_remove: &[],
        env_remove_as_nobody: &[],
        run_dir_as_nobody: false,
    };

    /// Whether this process is a copy (the body runs).
    pub fn in_child(&self) -> bool {
        std::env::var_os(self.child_env).is_some()
    }

    /// Run `test` (`module::body`) in a copy of this binary, as uid 65534
    /// when `unprivileged` and this process is root, else as this process's
    /// uid; panics with the copy's output unless it passed.
    pub fn reexec(&self, test: &str, unprivileged: bool) {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = if unprivileged && euid() == 0 {
            let mut c = Command::new("setpriv");
            let id = NOBODY.to_string();
            c.arg(format!("--reuid={id}"))
                .arg(format!("--regid={id}"))
                .args(["--clear-groups", "--"]);
            c.arg(&exe);
            for k in self.env_remove_as_nobody {
                c.env_remove(k);
            }
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
        .env(self.child_env, "1");
        for (k, v) in self.env {
            cmd.env(k, v);
        }
        for k in self.env_remove {
            cmd.env_remove(k);
        }
        let run_dir = crate::scratch();
        if unprivileged && self.run_dir_as_nobody {
            if euid() == 0 {
                std::os::unix::fs::chown(run_dir.path(), Some(NOBODY), Some(NOBODY))
                    .expect("chown the runtime directory to uid 65534");
            }
            cmd.env("CORDON_RUN_DIR", run_dir.path());
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("re-run {test} (unprivileged={unprivileged}): {e}"));
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && so.contains("1 passed"),
            "{test} (unprivileged={unprivileged}) failed:\n{so}\n{se}"
        );
        // Surface skips of the copy.
        for l in so.lines().chain(se.lines()).filter(|l| l.contains("SKIP")) {
            println!("{l}");
        }
    }

    /// `test` re-run as root; fails (skips only when allowed) when this
    /// process is not root.
    pub fn as_root(&self, test: &str) {
        if euid() != 0 {
            let name = format!("{}::as_root", test.trim_end_matches("::body"));
            skip_or_fail(&name, &format!("the tests run as uid {}, not root", euid()));
            return;
        }
        self.reexec(test, false);
    }

    /// `test` re-run as uid 65534 (as this process's uid when not root).
    pub fn as_nobody(&self, test: &str) {
        self.reexec(test, true);
    }
}

/// `mod NAME { as_root, as_nobody, body }` for the function `NAME` of the
/// calling module, re-run through the [`Harness`] `$harness` (a path seen
/// from the calling module). `root_only` leaves out `as_nobody`.
#[macro_export]
macro_rules! reexec_test {
    ($harness:ident, $name:ident) => {
        mod $name {
            #[test]
            fn as_root() {
                super::$harness.as_root(concat!(stringify!($name), "::body"));
            }
            #[test]
            fn as_nobody() {
                super::$harness.as_nobody(concat!(stringify!($name), "::body"));
            }
            #[test]
            #[ignore = "runs through as_root / as_nobody"]
            fn body() {
                if super::$harness.in_child() {
                    super::$name();
                }
            }
        }
    };
    (root_only, $harness:ident, $name:ident) => {
        mod $name {
            #[test]
            fn as_root() {
                super::$harness.as_root(concat!(stringify!($name), "::body"));
            }
            #[test]
            #[ignore = "runs through as_root"]
            fn body() {
                if super::$harness.in_child() {
                    super::$name();
                }
            }
        }
    };
}
