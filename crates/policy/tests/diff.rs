//! `diff` classifies each kind of change: weakening or not.

use std::path::Path;

use cordon_policy::diff::{Change, diff};
use cordon_policy::load_str;

const BASE: &str = r#"
tools:
  p:
    profile: P1
    command: ["/usr/bin/pdftotext", "-", "-"]
    limits: {wall_seconds: 20, memory: 512M, tasks: 32, output_bytes: 2000000}
  j:
    profile: P2
    image: reg.example/jira@sha256:1111111111111111111111111111111111111111111111111111111111111111
    egress: ["jira.example:443"]
    secrets: [{name: JIRA_TOKEN, scope: "read:issues", ttl: 900, bind: {endpoint: "jira.example:443"}}]
  b:
    profile: P3
    runtime: gvisor
    command: ["/usr/bin/chromium"]
    egress: proxy
"#;

fn changes(new: &str) -> Vec<Change> {
    let a = load_str(Path::new("a.yaml"), BASE).unwrap();
    let b = load_str(Path::new("b.yaml"), new).unwrap();
    diff(&a.policy, &b.policy)
}

/// Apply `from -> to` to BASE; assert one change to `field` with `weakens`.
fn one(from: &str, to: &str, field: &str, weakens: bool) {
    assert!(BASE.contains(from), "fixture lacks {from}");
    let c = changes(&BASE.replacen(from, to, 1));
    let hit: Vec<_> = c.iter().filter(|c| c.field == field).collect();
    assert_eq!(hit.len(), 1, "{from} -> {to}: {c:#?}");
    assert_eq!(hit[0].weakens, weakens, "{from} -> {to}: {}", hit[0]);
}

#[test]
fn identical_manifests_have_no_changes() {
    assert!(changes(BASE).is_empty());
}

#[test]
fn profile_lowered_weakens_and_raised_does_not() {
    one(
        "profile: P3\n    runtime: gvisor",
        "profile: P0\n    runtime: gvisor",
        "profile",
        true,
    );
    one(
        "profile: P1\n    command: [\"/usr/bin/pdftotext\"",
        "profile: P3\n    runtime: gvisor\n    command: [\"/usr/bin/pdftotext\"",
        "profile",
        false,
    );
}

#[test]
fn limits_raised_weaken_and_lowered_do_not() {
    one("memory: 512M", "memory: 1G", "limits.memory", true);
    one("memory: 512M", "memory: 256M", "limits.memory", false);
    one("tasks: 32", "tasks: 64", "limits.tasks", true);
    one(
        "wall_seconds: 20",
        "wall_seconds: 10",
        "limits.wall_seconds",
        false,
    );
    one(
        "output_bytes: 2000000",
        "output_bytes: 9000000",
        "limits.output_bytes",
        true,
    );
}

#[test]
fn egress_widened_weakens() {
    one(
        r#"["jira.example:443"]"#,
        r#"["jira.example:443", "evil.example:443"]"#,
        "egress",
        true,
    );
    one(
        r#"egress: ["jira.example:443"]
    secrets: [{name: JIRA_TOKEN, scope: "read:issues", ttl: 900, bind: {endpoint: "jira.example:443"}}]"#,
        r#"network: none
    secrets: [{name: JIRA_TOKEN, scope: "read:issues", ttl: 900, deliver: env}]"#,
        "network",
        false,
    );
}

#[test]
fn secret_added_or_longer_weakens() {
    one(
        "ttl: 900, bind: {endpoint: \"jira.example:443\"}}",
        "ttl: 900, bind: {endpoint: \"jira.example:443\"}}, {name: S3, scope: w, ttl: 60}",
        "secrets.S3",
        true,
    );
    one("ttl: 900", "ttl: 3600", "secrets.JIRA_TOKEN.ttl", true);
    one("ttl: 900", "ttl: 60", "secrets.JIRA_TOKEN.ttl", false);
    one(
        "scope: \"read:issues\"",
        "scope: \"write:issues\"",
        "secrets.JIRA_TOKEN.scope",
        true,
    );
}

#[test]
fn secret_delivered_in_env_or_rebound_weakens() {
    one(
        "ttl: 900, bind: {endpoint: \"jira.example:443\"}}",
        "ttl: 900, deliver: env}",
        "secrets.JIRA_TOKEN.deliver",
        true,
    );
    one(
        "ttl: 900, bind: {endpoint: \"jira.example:443\"}}",
        "ttl: 900, bind: {endpoint: \"jira.example:443\", path: /rest/}}",
        "secrets.JIRA_TOKEN.bind",
        true,
    );
    one(
        "ttl: 900,",
        "ttl: 900, provider: vault,",
        "secrets.JIRA_TOKEN.provider",
        true,
    );
    // Back from env to the proxy is a strengthening.
    let env = BASE.replacen(
        "ttl: 900, bind: {endpoint: \"jira.example:443\"}}",
        "ttl: 900, deliver: env}",
        1,
    );
    let a = load_str(Path::new("a.yaml"), &env).unwrap();
    let b = load_str(Path::new("b.yaml"), BASE).unwrap();
    let c = diff(&a.policy, &b.policy);
    let d: Vec<_> = c
        .iter()
        .filter(|c| c.field == "secrets.JIRA_TOKEN.deliver")
        .collect();
    assert_eq!(d.len(), 1, "{c:#?}");
    assert!(!d[0].weakens);
}

#[test]
fn tls_passthrough_added_weakens() {
    one(
        "egress: [\"jira.example:443\"]",
        "egress: [\"jira.example:443\", \"pin.example:443\"]\n    tls_passthrough: [\"pin.example:443\"]",
        "tls_passthrough",
        true,
    );
}

#[test]
fn mount_and_env_added_weaken() {
    one(
        "tasks: 32, output_bytes: 2000000}",
        "tasks: 32, output_bytes: 2000000}\n    mounts: [/srv/fonts]",
        "mounts",
        true,
    );
    one(
        "tasks: 32, output_bytes: 2000000}",
        "tasks: 32, output_bytes: 2000000}\n    env: {LC_ALL: C}",
        "env",
        true,
    );
}

#[test]
fn image_digest_changed_weakens() {
    one("@sha256:1111", "@sha256:2222", "image.digest", true);
}

#[test]
fn tool_added_weakens_and_removed_does_not() {
    let added = changes(&format!("{BASE}  n:\n    profile: P1\n    command: [x]\n"));
    assert_eq!(added.len(), 1);
    assert!(added[0].weakens && added[0].field == "tool");
    let removed = changes(&BASE.replace("  b:\n    profile: P3\n    runtime: gvisor\n    command: [\"/usr/bin/chromium\"]\n    egress: proxy\n", ""));
    assert_eq!(removed.len(), 1, "{removed:#?}");
    assert!(!removed[0].weakens);
}

#[test]
fn runtime_to_native_weakens() {
    one(
        "profile: P3\n    runtime: gvisor\n    command: [\"/usr/bin/chromium\"]\n    egress: proxy",
        "profile: P2\n    command: [\"/usr/bin/chromium\"]\n    egress: [\"docs.example:443\"]",
        "runtime",
        true,
    );
}

#[test]
fn turning_off_a_gate_class_or_the_label_weakens() {
    let base = "tools:\n  t:\n    profile: P1\n    command: [x]\n";
    let a = load_str(Path::new("a.yaml"), base).unwrap();
    for (extra, field, weakens) in [
        (
            "    output: {strip: {ansi: false}}\n",
            "output.strip.ansi",
            true,
        ),
        (
            "    output: {strip: {bidi: false}}\n",
            "output.strip.bidi",
            true,
        ),
        ("    output: {label: none}\n", "output.label", true),
        ("    output: {label: envelope}\n", "output.label", false),
        (
            "    output: {invalid_utf8: reject}\n",
            "output.invalid_utf8",
            false,
        ),
        ("    output: {strip: {ansi: true}}\n", "", false),
    ] {
        let b = load_str(Path::new("b.yaml"), &format!("{base}{extra}")).unwrap();
        let c = diff(&a.policy, &b.policy);
        if field.is_empty() {
            assert!(c.is_empty(), "{extra}: {c:#?}");
            continue;
        }
        assert_eq!(c.len(), 1, "{extra}: {c:#?}");
        assert_eq!(
            (c[0].field.as_str(), c[0].weakens),
            (field, weakens),
            "{extra}"
        );
    }
}

#[test]
fn accepting_a_degradation_or_dropping_a_requirement_weakens() {
    // P2 requires cgroup by default; accepting it drops the requirement.
    let c = changes(&format!("accept: [cgroup]\n{BASE}"));
    let j: Vec<_> = c.iter().filter(|c| c.tool == "j").collect();
    assert!(
        j.iter()
            .any(|c| c.field == "accept" && c.weakens && c.new == "cgroup"),
        "{c:#?}"
    );
    assert!(
        j.iter().any(|c| c.field == "require" && c.weakens),
        "{c:#?}"
    );
    // Requiring more does not weaken.
    let c = changes(&format!("require: [landlock]\n{BASE}"));
    assert!(!c.is_empty() && c.iter().all(|c| !c.weakens), "{c:#?}");
}

#[test]
fn a_mount_made_writable_weakens() {
    let base =
        "tools:\n  t:\n    profile: P1\n    command: [/bin/true]\n    mounts: [\"/srv/a:/data\"]\n";
    let a = load_str(Path::new("a.yaml"), base).unwrap();
    let b = load_str(Path::new("b.yaml"), &base.replace("/data\"", "/data:rw\"")).unwrap();
    let c = diff(&a.policy, &b.policy);
    assert_eq!(c.len(), 1, "{c:#?}");
    assert!(c[0].weakens && c[0].new.ends_with(":rw"), "{}", c[0]);
}

#[test]
fn an_exposure_change_is_flagged() {
    let m = |expose: &str| {
        format!(
            "tools:\n  s:\n    profile: P2\n    network: none\n    mcp:\n      command: [x]\n{expose}"
        )
    };
    let a = load_str(Path::new("a.yaml"), &m("")).unwrap();
    let b = load_str(Path::new("b.yaml"), &m("      expose: as-is\n")).unwrap();
    let c = diff(&a.policy, &b.policy);
    let hit: Vec<_> = c.iter().filter(|c| c.field == "mcp.expose").collect();
    assert_eq!(hit.len(), 1, "{c:#?}");
    assert_eq!(
        (hit[0].old.as_str(), hit[0].new.as_str()),
        ("prefixed", "as-is")
    );
    assert!(hit[0].weakens, "{}", hit[0]);
    let back = diff(&b.policy, &a.policy);
    let hit: Vec<_> = back.iter().filter(|c| c.field == "mcp.expose").collect();
    assert_eq!(hit.len(), 1, "{back:#?}");
    assert!(!hit[0].weakens, "{}", hit[0]);
}

#[test]
fn allowing_sampling_or_elicitation_is_a_weakening() {
    let m = |extra: &str| {
        format!(
            "tools:\n  s:\n    profile: P2\n    network: none\n    mcp:\n      command: [x]\n{extra}"
        )
    };
    let off = load_str(Path::new("a.yaml"), &m("")).unwrap();
    let on = load_str(
        Path::new("b.yaml"),
        &m("      allow_sampling: true\n      allow_elicitation: true\n"),
    )
    .unwrap();
    for field in ["mcp.allow_sampling", "mcp.allow_elicitation"] {
        let c = diff(&off.policy, &on.policy);
        let hit: Vec<_> = c.iter().filter(|c| c.field == field).collect();
        assert_eq!(hit.len(), 1, "{c:#?}");
        assert!(hit[0].weakens, "{}", hit[0]);
        let c = diff(&on.policy, &off.policy);
        let hit: Vec<_> = c.iter().filter(|c| c.field == field).collect();
        assert_eq!(hit.len(), 1, "{c:#?}");
        assert!(!hit[0].weakens, "{}", hit[0]);
    }
}

/// A Wasm tool: another module weakens (other code), the same pinned bytes
/// at another path do not; serving from a warm worker weakens (its calls
/// share one jail), back to a jail per call does not.
#[test]
fn a_wasm_tools_module_and_worker() {
    let h = "a".repeat(64);
    let h2 = "b".repeat(64);
    let wasm = |path: &str, sha: &str, worker: bool| {
        format!(
            "tools:\n  w:\n    profile: P1\n    runtime: wasm\n    network: none\n    module: {{path: {path}, sha256: {sha}, worker: {worker}}}\n"
        )
    };
    let diff_of = |a: &str, b: &str| {
        let a = load_str(Path::new("a.yaml"), a).unwrap();
        let b = load_str(Path::new("a.yaml"), b).unwrap();
        diff(&a.policy, &b.policy)
    };
    let only = |c: Vec<Change>, field: &str| {
        assert_eq!(c.len(), 1, "{c:#?}");
        assert_eq!(c[0].field, field, "{c:#?}");
        c[0].weakens
    };
    let base = wasm("/m.wasm", &h, false);
    assert!(only(diff_of(&base, &wasm("/m.wasm", &h2, false)), "module"));
    assert!(!only(
        diff_of(&base, &wasm("/elsewhere/m.wasm", &h, false)),
        "module"
    ));
    assert!(only(
        diff_of(&base, &wasm("/m.wasm", &h, true)),
        "module.worker"
    ));
    assert!(!only(
        diff_of(&wasm("/m.wasm", &h, true), &base),
        "module.worker"
    ));
}
