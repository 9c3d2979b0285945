//! The suite can fail: with no sandbox at all (P0), the escape and resource
//! probes report ESCAPED. The network probes reach stand-ins inside a
//! private network namespace.

mod common;

use cordon_probes::{Filter, NoSandbox, Profile, Verdict, run_suite};

#[test]
fn p0_escapes_are_reported() {
    let report = common::in_standin_netns(|targets| {
        run_suite(
            &NoSandbox,
            &common::agent(),
            &Profile::unclaimed("P0"),
            &targets,
            &Filter::default(),
        )
    });
    let human = report.to_human();
    println!("{human}");
    let get = |p: &str| {
        report
            .get(p)
            .unwrap_or_else(|| panic!("no result for {p}:\n{human}"))
    };
    assert_eq!(get("control").verdict, Verdict::Held, "{human}");
    let escaped = |p: &str, needle: &str| {
        let r = get(p);
        assert_eq!(
            r.verdict,
            Verdict::Escaped,
            "{p} should escape on P0:\n{human}"
        );
        assert!(
            r.evidence.contains(needle),
            "{p}: evidence {:?} lacks {needle:?}",
            r.evidence
        );
    };
    escaped(
        "network",
        "connect 1.1.1.1:443: connected, read \"stand-in\"",
    );
    escaped(
        "metadata",
        "connect 2852039166 (= 169.254.169.254:80): connected",
    );
    escaped("metadata", "connect [::ffff:169.254.169.254]:80");
    escaped("metadata", "connect [fd00:ec2::254]:80: connected");
    escaped("private", "connect 10.0.0.1:80: connected");
    escaped("host_loopback", "cordon-probe host loopback listener");
    escaped("dns", "dns target 1.1.1.1:53: 38-byte reply");
    escaped("host_fs", "bytes of /etc/shadow");
    escaped("env", "HOST_SECRET_TOKEN");
    escaped(
        "processes",
        "processes beyond the sandbox's own are visible",
    );
    escaped("write", "created /usr/.cordon-probe-");
    escaped("tmp_persist", "from an earlier call is still there");
    escaped("fresh_task", "from the earlier task is still there");
    escaped("uid", "host root");
    escaped("caps", "CAP_SYS_ADMIN");
    escaped("no_new_privs", "PR_GET_NO_NEW_PRIVS = 0");
    escaped("userns", "unshare(CLONE_NEWUSER) succeeded");
    escaped("mount", "mounted a tmpfs");
    escaped("raw_socket", "succeeded");
    escaped("bpf", "BPF_MAP_CREATE");
    escaped("ptrace", "PTRACE_TRACEME succeeded");
    escaped("memory", "allocated and touched 1024 MiB");
    escaped("fork", "256 processes ran at once");
    escaped("output", "bytes of output reached the caller");
    escaped("disk", "wrote 256 MiB");
    // The host's own RLIMIT_NOFILE may stop this one: either way it must
    // be a decided answer, not an error.
    let fdl = get("fd_limit");
    assert!(
        (fdl.verdict == Verdict::Escaped && fdl.evidence.contains("opened 65536 descriptors"))
            || (fdl.verdict == Verdict::Held && fdl.evidence.contains("EMFILE")),
        "{human}"
    );
    escaped("time", "busy loop ran 3 s");
    escaped("daemon", "outlived the call");
    assert_eq!(report.exit_code(), 1);
}
