//! bubblewrap with the seed's flags, through PrefixSandbox, inside the same
//! kind of stand-in network namespace as the P0 test (where the same
//! targets are shown to be reachable). Network, host files and environment
//! hold; running bwrap as root keeps capabilities, which the suite reports.

mod common;

use cordon_probes::{Filter, PrefixSandbox, Profile, Report, Verdict, run_suite};

/// The seed's bwrap flags, adapted to Debian's merged /usr, plus a
/// read-only bind of the agent's directory.
fn seed_prefix(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin",
        "--ro-bind",
        "{agent_dir}",
        "/.cordon",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push("--".into());
    v.push("/.cordon/cordon-probe-agent".into());
    v
}

fn require_bwrap() {
    let ok = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "bwrap is needed: apt-get install -y bubblewrap");
}

fn escape_probes() -> Filter {
    Filter {
        only: vec!["escape".into(), "daemon".into()],
        skip: vec![],
    }
}

fn run(extra: &'static [&'static str]) -> Report {
    require_bwrap();
    common::in_standin_netns(move |targets| {
        let sb = PrefixSandbox::new(seed_prefix(extra)).expect("prefix sandbox");
        run_suite(
            &sb,
            &common::agent(),
            &Profile::unclaimed("P1 (bwrap, seed flags)"),
            &targets,
            &escape_probes(),
        )
    })
}

fn verdict<'a>(r: &'a Report, p: &str) -> &'a cordon_probes::ProbeResult {
    r.get(p).unwrap_or_else(|| panic!("no result for {p}"))
}

#[test]
fn bwrap_seed_flags_hold_network_files_env_and_report_root_caps() {
    let report = run(&[]);
    let human = report.to_human();
    println!("{human}");
    assert_eq!(
        verdict(&report, "control").verdict,
        Verdict::Held,
        "{human}"
    );
    for p in [
        "network",
        "metadata",
        "host_loopback",
        "private",
        "dns",
        "host_fs",
        "env",
        "processes",
        "write",
        "tmp_persist",
        "tty",
        "daemon",
    ] {
        assert_eq!(verdict(&report, p).verdict, Verdict::Held, "{p}:\n{human}");
    }
    // The refusals are the specific ones a network namespace with only a
    // loopback gives, not a generic failure.
    let net = &verdict(&report, "network").evidence;
    assert!(net.contains("connect 1.1.1.1:443: ENETUNREACH"), "{net}");
    let lo = &verdict(&report, "host_loopback").evidence;
    assert!(
        lo.contains("ECONNREFUSED (the sandbox's own loopback)"),
        "{lo}"
    );
    let fs = &verdict(&report, "host_fs").evidence;
    assert!(fs.contains("read /etc/shadow: ENOENT"), "{fs}");
    let env = &verdict(&report, "env").evidence;
    assert!(env.contains("none secret-looking, no canary"), "{env}");
    let w = &verdict(&report, "write").evidence;
    assert!(w.contains("create in /usr: EROFS"), "{w}");
    // True findings of bwrap run as root: it keeps capabilities and stays
    // uid 0 mapped to host uid 0.
    let caps = verdict(&report, "caps");
    assert_eq!(caps.verdict, Verdict::Escaped, "{human}");
    assert!(caps.evidence.contains("CAP_SYS_ADMIN"), "{}", caps.evidence);
    assert_eq!(verdict(&report, "uid").verdict, Verdict::Escaped, "{human}");
    // bwrap passes the caller's descriptors on: the harness's canary
    // descriptor (a non-close-on-exec duplicate of its stderr) is visible.
    let fds = verdict(&report, "fds");
    assert_eq!(fds.verdict, Verdict::Escaped, "{human}");
    assert!(
        fds.evidence.contains("inherited descriptors"),
        "{}",
        fds.evidence
    );
    // No seccomp filter in these flags.
    assert_eq!(
        verdict(&report, "io_uring").verdict,
        Verdict::Escaped,
        "{human}"
    );
    assert_eq!(report.exit_code(), 1);
}

#[test]
fn bwrap_with_caps_dropped_holds_caps() {
    // The fix the finding above calls for: same flags plus --cap-drop ALL.
    let report = run(&["--cap-drop", "ALL"]);
    let human = report.to_human();
    println!("{human}");
    assert_eq!(
        verdict(&report, "control").verdict,
        Verdict::Held,
        "{human}"
    );
    let caps = verdict(&report, "caps");
    assert_eq!(caps.verdict, Verdict::Held, "{human}");
    assert!(caps.evidence.starts_with("CapEff 0"), "{}", caps.evidence);
    for p in ["mount", "raw_socket"] {
        assert_eq!(verdict(&report, p).verdict, Verdict::Held, "{p}:\n{human}");
    }
}
