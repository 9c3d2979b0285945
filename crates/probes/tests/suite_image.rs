//! The probe agent inside an image root: a busybox image (built here from
//! busybox-static, `cordon_testkit::image`) has none of the host's
//! libraries, so a dynamically linked agent runs through its own loader,
//! bound with its libraries under `/.cordon/lib` (see
//! `cordon_probes::runtime`). The control and the host file system probe
//! hold there, and so does every other probe, also as uid 0 inside.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cordon_probes::{Filter, RuntimeSandbox, Targets, Verdict, run_suite, runtime::AGENT_IN_JAIL};
use cordon_runtime::native::Native;
use cordon_runtime::{Limits, Root, SandboxSpec};

use cordon_testkit::image;
use cordon_testkit::skip;

fn image_spec(rootfs: &Path) -> SandboxSpec {
    let mut spec = SandboxSpec::new("cordon-probe", [AGENT_IN_JAIL]);
    spec.root = Root::Image {
        rootfs: rootfs.to_path_buf(),
        digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
    };
    spec.env[0].1 = "/bin".into();
    spec.limits = Limits {
        wall: Duration::from_secs(4),
        memory_bytes: 128 << 20,
        tasks: 16,
        output_bytes: 1 << 20,
        disk_bytes: 16 << 20,
        nofile: 64,
        ..spec.limits
    };
    spec
}

fn busybox(test: &str) -> Option<cordon_testkit::Scratch> {
    if let Some(why) = image::missing() {
        skip::skip_or_fail(test, &why);
        return None;
    }
    Some(image::busybox())
}

#[test]
fn control_and_host_fs_hold_in_a_busybox_image() {
    let Some(img) = busybox("control_and_host_fs_hold_in_a_busybox_image") else {
        return;
    };
    let native = Arc::new(Native::new(Default::default()).expect("native runtime"));
    let sb = RuntimeSandbox::new(native, image_spec(img.path()));
    let report = run_suite(
        &sb,
        &common::agent(),
        &sb.profile("P1"),
        &Targets::default(),
        &Filter {
            only: vec!["host_fs".into()],
            skip: vec![],
        },
    );
    let human = report.to_human();
    println!("{human}");
    let control = report.get("control").expect("control");
    assert_eq!(control.verdict, Verdict::Held, "{human}");
    // The agent saw the image's root (it has no /usr).
    assert!(control.evidence.contains(", / has "), "{human}");
    let host_fs = report.get("host_fs").expect("host_fs");
    assert_eq!(host_fs.verdict, Verdict::Held, "{human}");
    assert!(host_fs.evidence.contains("/etc/shadow"), "{human}");
    assert_eq!(report.exit_code(), 0, "{human}");
}

#[test]
fn every_probe_holds_in_a_busybox_image_as_uid_0() {
    let Some(img) = busybox("every_probe_holds_in_a_busybox_image_as_uid_0") else {
        return;
    };
    let rootfs = img.path().to_path_buf();
    let report = common::in_standin_netns(move |targets| {
        let native = Arc::new(Native::new(Default::default()).expect("native runtime"));
        let mut spec = image_spec(&rootfs);
        spec.user = Some((0, 0));
        spec.cwd = Some("/".into());
        let sb = RuntimeSandbox::new(native, spec);
        let profile = sb.profile("P2");
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
    common::assert_all_held(&report);
    // The helpers (fork bomb children, the ptrace child) ran through the
    // loader too.
    for p in ["fork", "ptrace", "daemon"] {
        assert_eq!(
            report.get(p).map(|r| r.verdict),
            Some(Verdict::Held),
            "{p}\n{human}"
        );
    }
}
