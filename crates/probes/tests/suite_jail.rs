//! The native jail: every probe holds, resource probes end in the jail's
//! typed limits. Run inside a stand-in network namespace (where the P0
//! test shows the same targets are reachable) so no packet can leave.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cordon_probes::{Filter, RuntimeSandbox, run_suite, runtime::AGENT_IN_JAIL};
use cordon_runtime::native::Native;
use cordon_runtime::{Limits, SandboxSpec};

fn small_limits() -> Limits {
    Limits {
        wall: Duration::from_secs(4),
        memory_bytes: 128 << 20,
        tasks: 16,
        output_bytes: 1 << 20,
        disk_bytes: 16 << 20,
        nofile: 64,
        ..SandboxSpec::new("x", ["x"]).limits
    }
}

#[test]
fn jail_holds_every_probe() {
    let report = common::in_standin_netns(|targets| {
        let native = Arc::new(Native::new(Default::default()).expect("native runtime"));
        let mut spec = SandboxSpec::new("cordon-probe", [AGENT_IN_JAIL]);
        spec.limits = small_limits();
        let sb = RuntimeSandbox::new(native, spec);
        let profile = sb.profile("P1");
        run_suite(
            &sb,
            &common::agent(),
            &profile,
            &targets,
            &Filter::default(),
        )
    });
    let human = report.to_human();
    println!("{human}");
    // No egress is granted to this profile: the egress probe is skipped.
    common::assert_all_held(&report);
    assert_eq!(report.exit_code(), 0);
}
