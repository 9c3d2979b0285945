//! "The control did not run" never reads as "held", and the resource
//! judgement compares what the kernel refused with what the profile claims.

mod common;

use cordon_probes::{
    Filter, Limits, NoSandbox, PrefixSandbox, Profile, Targets, Verdict, report, run_suite,
};

fn only(names: &[&str]) -> Filter {
    Filter {
        only: names.iter().map(|s| s.to_string()).collect(),
        skip: vec![],
    }
}

#[test]
fn a_sandbox_that_runs_nothing_voids_every_result() {
    // `true` ignores its arguments: the agent never runs.
    let sb = PrefixSandbox::new(vec!["true".into()]).unwrap();
    let report = run_suite(
        &sb,
        &common::agent(),
        &Profile::unclaimed("broken"),
        &Targets::default(),
        &only(&["env", "host_fs", "memory"]),
    );
    let human = report.to_human();
    let c = report.get("control").unwrap();
    assert_eq!(c.verdict, Verdict::Error, "{human}");
    assert!(
        c.evidence.contains("the agent did not start: exit 0"),
        "{human}"
    );
    for p in ["env", "host_fs", "memory"] {
        let r = report.get(p).unwrap();
        assert_eq!(r.verdict, Verdict::Void, "{human}");
        assert!(
            r.evidence.starts_with("not run: the control failed"),
            "{human}"
        );
    }
    assert!(human.contains("the control FAILED"), "{human}");
    assert_eq!(report.exit_code(), report::EXIT_ESCAPED);
}

#[test]
fn an_exit_code_that_looks_like_held_is_not_held() {
    // Exits with the agent's "held" code but prints nothing.
    let sb = PrefixSandbox::new(vec![
        "sh".into(),
        "-c".into(),
        "exit 40".into(),
        "sh".into(),
    ])
    .unwrap();
    let report = run_suite(
        &sb,
        &common::agent(),
        &Profile::unclaimed("liar"),
        &Targets::default(),
        &only(&["env"]),
    );
    assert_eq!(report.get("control").unwrap().verdict, Verdict::Error);
    assert_eq!(report.get("env").unwrap().verdict, Verdict::Void);
    assert_eq!(report.exit_code(), report::EXIT_ESCAPED);
}

#[test]
fn agent_dying_before_its_result_is_an_error() {
    // `sh -c SCRIPT AGENT __probe-agent NAME...`: the control runs the real
    // agent; for env the shell prints the start line and dies of SIGTERM:
    // started, no result, no typed stop.
    let script = r#"case "$2" in
        control) exec "$0" "$@" ;;
        *) echo '{"probe":"env","event":"start","value":1}'; kill -TERM $$ ;;
    esac"#;
    let sb = PrefixSandbox::new(vec![
        "sh".into(),
        "-c".into(),
        script.into(),
        "{agent}".into(),
    ])
    .unwrap();
    let report = run_suite(
        &sb,
        &common::agent(),
        &Profile::unclaimed("dies"),
        &Targets::default(),
        &only(&["env"]),
    );
    let human = report.to_human();
    assert_eq!(
        report.get("control").unwrap().verdict,
        Verdict::Held,
        "{human}"
    );
    let env = report.get("env").unwrap();
    assert_eq!(env.verdict, Verdict::Error, "{human}");
    assert!(
        env.evidence
            .contains("started but printed no result: killed by signal 15"),
        "{human}"
    );
}

fn memory_under_rlimit_as(claim_mib: u64) -> (Verdict, String) {
    // RLIMIT_AS of 384 MiB refuses the allocation somewhere below it.
    let sb =
        PrefixSandbox::new(vec!["prlimit".into(), "--as=402653184".into(), "--".into()]).unwrap();
    let profile = Profile {
        name: format!("claims {claim_mib} MiB"),
        limits: Limits {
            memory_bytes: Some(claim_mib << 20),
            ..Limits::default()
        },
        egress_allow: Vec::new(),
        mounts: Vec::new(),
    };
    let report = run_suite(
        &sb,
        &common::agent(),
        &profile,
        &Targets::default(),
        &only(&["memory"]),
    );
    let r = report.get("memory").unwrap();
    (r.verdict, r.evidence.clone())
}

#[test]
fn a_refusal_within_the_claim_holds() {
    let (v, e) = memory_under_rlimit_as(384);
    assert_eq!(v, Verdict::Held, "{e}");
    assert!(e.contains("allocation refused after"), "{e}");
}

#[test]
fn a_refusal_far_beyond_the_claim_escapes() {
    // Positive control of the judgement: the same kernel refusal (near
    // 384 MiB of address space), against a profile claiming 160 MiB (the
    // agent pushes to 2 x 160 + 64 MiB), is an escape.
    let (v, e) = memory_under_rlimit_as(160);
    assert_eq!(v, Verdict::Escaped, "{e}");
    assert!(e.contains("the profile claims 160 MiB (+32 margin)"), "{e}");
    assert!(e.contains("allocation refused after"), "{e}");
}

#[test]
fn p0_output_flood_reaches_the_caller_in_full() {
    let report = run_suite(
        &NoSandbox,
        &common::agent(),
        &Profile::unclaimed("P0"),
        &Targets::default(),
        &only(&["output"]),
    );
    let r = report.get("output").unwrap();
    assert_eq!(r.verdict, Verdict::Escaped, "{}", r.evidence);
    let n: u64 = r
        .evidence
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap();
    assert!(n >= 100 << 20, "{}", r.evidence);
}
