//! Egress-granted profiles: only the allowlisted host:port may be reached.
//! The "sandbox" is the host side of a stand-in network namespace, with and
//! without an nftables filter that allows one host:port.

mod common;

use cordon_probes::{Filter, NoSandbox, Profile, Verdict, run_suite};

fn egress_report(filter_on: bool) -> cordon_probes::Report {
    common::in_standin_netns(move |targets| {
        if filter_on {
            common::nft_allow_only("1.1.1.1", 443);
        }
        let mut profile = Profile::unclaimed("P2 (1.1.1.1:443)");
        profile.egress_allow = vec![common::OUTSIDE.parse().unwrap()];
        run_suite(
            &NoSandbox,
            &common::agent(),
            &profile,
            &targets,
            &Filter {
                only: vec!["egress".into()],
                skip: vec![],
            },
        )
    })
}

#[test]
fn without_a_filter_the_other_port_escapes() {
    let r = egress_report(false);
    let e = r.get("egress").unwrap();
    assert_eq!(e.verdict, Verdict::Escaped, "{}", r.to_human());
    assert!(
        e.evidence.contains(
            "connect 1.1.1.1:22 (not allowlisted) (= 1.1.1.1:22): ECONNREFUSED (a host answered"
        ),
        "{}",
        e.evidence
    );
}

#[test]
fn with_the_filter_only_the_allowlisted_port_answers() {
    let r = egress_report(true);
    let e = r.get("egress").unwrap();
    assert_eq!(e.verdict, Verdict::Held, "{}", r.to_human());
    assert!(
        e.evidence.contains("allowlisted 1.1.1.1:443: connected"),
        "{}",
        e.evidence
    );
    assert!(
        e.evidence.contains("1.1.1.1:22): EHOSTUNREACH"),
        "{}",
        e.evidence
    );
}

#[test]
fn a_grant_that_does_not_work_is_an_error_not_a_pass() {
    // The netns has the stand-in on 1.1.1.1:443; a profile granting a port
    // nothing listens on finds its grant broken.
    let r = common::in_standin_netns(|targets| {
        let mut profile = Profile::unclaimed("P2 (broken grant)");
        profile.egress_allow = vec!["1.1.1.1:8443".parse().unwrap()];
        run_suite(
            &NoSandbox,
            &common::agent(),
            &profile,
            &targets,
            &Filter {
                only: vec!["egress".into()],
                skip: vec![],
            },
        )
    });
    let e = r.get("egress").unwrap();
    // 1.1.1.1:22 is refused by a host: the escape wins over the error.
    assert_eq!(e.verdict, Verdict::Escaped, "{}", r.to_human());
    let r2 = common::in_standin_netns(|targets| {
        common::nft_allow_only("1.1.1.1", 8443);
        let mut profile = Profile::unclaimed("P2 (broken grant, filtered)");
        profile.egress_allow = vec!["1.1.1.1:8443".parse().unwrap()];
        run_suite(
            &NoSandbox,
            &common::agent(),
            &profile,
            &targets,
            &Filter {
                only: vec!["egress".into()],
                skip: vec![],
            },
        )
    });
    let e = r2.get("egress").unwrap();
    assert_eq!(e.verdict, Verdict::Error, "{}", r2.to_human());
    assert!(
        e.evidence
            .contains("allowlisted 1.1.1.1:8443 is not reachable"),
        "{}",
        e.evidence
    );
    assert_eq!(r2.exit_code(), cordon_probes::report::EXIT_INCONCLUSIVE);
    assert_eq!(r2.exit_code(), 3);
}

#[test]
fn door_addresses_local_to_the_sandbox_refusing_are_its_own_stack() {
    // Doors (as the jail's P2 mode builds them): the allowlisted address is
    // local to the sandbox's namespace, with a listener on the allowed port
    // only. The other port is refused by the sandbox's own stack: held.
    let r = common::in_standin_netns(|targets| {
        let st = std::process::Command::new("ip")
            .args(["addr", "add", "198.18.0.1/32", "dev", "lo"])
            .status()
            .unwrap();
        assert!(st.success());
        let door = std::net::TcpListener::bind("198.18.0.1:443").unwrap();
        std::thread::spawn(move || for _c in door.incoming() {});
        let mut profile = Profile::unclaimed("P2 (door)");
        profile.egress_allow = vec!["198.18.0.1:443".parse().unwrap()];
        run_suite(
            &NoSandbox,
            &common::agent(),
            &profile,
            &targets,
            &Filter {
                only: vec!["egress".into()],
                skip: vec![],
            },
        )
    });
    let e = r.get("egress").unwrap();
    assert_eq!(e.verdict, Verdict::Held, "{}", r.to_human());
    assert!(
        e.evidence
            .contains("198.18.0.1:22): ECONNREFUSED (an address of the sandbox's own namespace)"),
        "{}",
        e.evidence
    );
}
