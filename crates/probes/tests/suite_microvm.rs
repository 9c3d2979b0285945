//! The whole catalogue inside a microVM guest: real QEMU under TCG, Debian's
//! cloud kernel, the static guest init and a busybox image. The agent (and
//! its loader and libraries) goes into the guest on the carried disk, a
//! second read-only disk at `/.cordon`; nothing of the host is shared. The
//! tool runs as uid 0 inside its own user namespace in the guest, so the
//! probes that look for root, other processes, ptrace, keyrings or
//! io_uring see what a tool would. A missing piece fails the test.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cordon_probes::{Filter, RuntimeSandbox, run_suite, runtime::AGENT_IN_JAIL};
use cordon_runtime::microvm::{Microvm, Options};
use cordon_runtime::{Limits, Root, Runtime, SandboxSpec};
use cordon_vm_init::qemu::Accel;

fn spec(rootfs: &Path) -> SandboxSpec {
    let mut spec = SandboxSpec::new("cordon-probe", [AGENT_IN_JAIL]);
    spec.root = Root::Image {
        rootfs: rootfs.to_path_buf(),
        digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
    };
    spec.env[0].1 = "/bin".into();
    spec.user = Some((0, 0));
    spec.cwd = Some("/".into());
    spec.limits = Limits {
        wall: Duration::from_secs(20),
        memory_bytes: 128 << 20,
        tasks: 32,
        output_bytes: 1 << 20,
        disk_bytes: 16 << 20,
        nofile: 64,
        ..spec.limits
    };
    spec
}

#[test]
fn every_probe_holds_inside_a_guest_with_the_agent_carried_in() {
    common::require_root();
    let dir = cordon_testkit::scratch::named("cordon-probe-vm-");
    let rootfs = cordon_testkit::image::busybox();
    let opts = Options {
        init: Some(cordon_testkit::vm::init().clone()),
        state_dir: Some(dir.join("state")),
        store: Some(dir.join("store")),
        accel: Some(Accel::Tcg),
        ..Options::default()
    };
    let root = rootfs.path().to_path_buf();
    let report = common::in_standin_netns(move |targets| {
        let vm = Arc::new(Microvm::new(opts, Default::default()).expect("microvm runtime"));
        let s = spec(&root);
        let problems = vm.check(&s).problems;
        assert!(problems.is_empty(), "run scripts/setup.sh: {problems:?}");
        let sb = RuntimeSandbox::new(vm, s);
        let profile = sb.profile("P3");
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
    // The positive control: the agent ran in the guest, from the carried
    // disk, and saw the image's root.
    common::assert_all_held(&report);
    // Each held for the guest's reason, not by accident.
    let evidence = |p: &str| {
        report
            .get(p)
            .map(|r| r.evidence.clone())
            .unwrap_or_default()
    };
    for (probe, why) in [
        // Its own pid namespace in the guest: not the guest's kernel
        // threads, not the init.
        ("processes", "only the sandbox's own processes"),
        // Root inside its user namespace, 1000 in the guest.
        ("uid", "maps to uid 1000 outside"),
        // The native jail's seccomp filter, installed by the guest's init.
        ("ptrace", "EPERM"),
        ("keyctl", "EPERM"),
        ("io_uring", "EPERM"),
        // The carried disk is read-only.
        ("write", "/.cordon/agent is on a read-only mount"),
        // Nothing of the earlier task's guest in the next one.
        ("fresh_task", "no process of the earlier task is visible"),
        // Cut by the guest's cgroup, not by the host's.
        ("memory", "killed at its memory limit in the guest"),
        // Its 32 tasks exactly: the agent and 31 children (the init and its
        // threads in the same cgroup are not counted against the tool).
        ("fork", "process #32 refused: EAGAIN (31 children running)"),
    ] {
        let e = evidence(probe);
        assert!(e.contains(why), "{probe}: {e}\n{human}");
    }
}
