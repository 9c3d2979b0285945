//! `workspace:` and `state:`: resolved, refused at their line when wrong,
//! and each widening flagged by `diff`.

use std::path::Path;

use cordon_policy::diff::diff;
use cordon_policy::{Diagnostic, load_str};

const TOOL: &str = r#"
tools:
  t:
    profile: P1
    command: ["/bin/true"]
    mounts: ["/opt/data:/opt/data:ro"]
"#;

fn errors(yaml: &str) -> Vec<Diagnostic> {
    match load_str(Path::new("m.yaml"), yaml) {
        Ok(_) => panic!("manifest was accepted:\n{yaml}"),
        Err(e) => e.diagnostics().to_vec(),
    }
}

fn with(extra: &str) -> String {
    format!("{TOOL}    {extra}\n")
}

#[test]
fn workspace_and_state_resolve() {
    let l = load_str(
        Path::new("m.yaml"),
        &format!(
            "{TOOL}    workspace: {{mount: /work, size: 512M, retain: 10m}}\n    state: {{mount: /data, size: 256M}}\n"
        ),
    )
    .unwrap();
    let t = &l.policy.tools["t"];
    let w = t.workspace.as_ref().unwrap();
    assert_eq!(
        (w.mount.as_str(), w.size_bytes, w.retain_seconds),
        ("/work", 512 << 20, 600)
    );
    let s = t.state.as_ref().unwrap();
    assert_eq!((s.mount.as_str(), s.size_bytes), ("/data", 256 << 20));
    // `cordon explain` prints the resolved policy: both are in it.
    let json = serde_json::to_value(t).unwrap();
    assert_eq!(json["workspace"]["size_bytes"], 512 << 20);
    assert_eq!(json["state"]["mount"], "/data");
}

#[test]
fn bad_declarations_are_refused_at_their_line() {
    for (extra, needle) in [
        ("workspace: {mount: work, size: 1M}", "absolute path"),
        (
            "workspace: {mount: /work/../etc, size: 1M}",
            "absolute path",
        ),
        (
            "workspace: {mount: /tmp/w, size: 1M}",
            "inside a path cordon builds",
        ),
        (
            "workspace: {mount: /proc/x, size: 1M}",
            "inside a path cordon builds",
        ),
        (
            "state: {mount: /etc, size: 1M}",
            "inside a path cordon builds",
        ),
        ("workspace: {mount: /work, size: 1K}", "below the smallest"),
        ("workspace: {mount: /work, size: lots}", "invalid size"),
        (
            "workspace: {mount: /work, size: 1M, retain: soon}",
            "invalid duration",
        ),
        (
            "workspace: {mount: /opt/data/w, size: 1M}",
            "overlaps the mount",
        ),
    ] {
        let errs = errors(&with(extra));
        assert_eq!(errs.len(), 1, "{extra}: {errs:#?}");
        assert_eq!(errs[0].line, 7, "{extra}: {}", errs[0]);
        assert!(errs[0].message.contains(needle), "{extra}: {}", errs[0]);
    }
    let errs = errors(&format!(
        "{TOOL}    workspace: {{mount: /work, size: 1M}}\n    state: {{mount: /work/s, size: 1M}}\n"
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].line, 8);
    assert!(
        errs[0].message.contains("overlaps the workspace"),
        "{}",
        errs[0]
    );
    let errs = errors(&with(
        "lifetime: pool\n    workspace: {mount: /work, size: 1M}",
    ));
    assert!(
        errs.iter()
            .any(|e| e.line == 8 && e.message.contains("pooled sandbox")),
        "{errs:#?}"
    );
    let errs = errors(&with("workspace: {mount: /work, size: 1M, colour: red}"));
    assert_eq!(errs[0].line, 7, "{}", errs[0]);
    assert!(errs[0].message.contains("unknown field"), "{}", errs[0]);
}

fn changes(old_extra: &str, new_extra: &str) -> Vec<(String, bool)> {
    let a = load_str(Path::new("a.yaml"), &with(old_extra)).unwrap();
    let b = load_str(Path::new("b.yaml"), &with(new_extra)).unwrap();
    diff(&a.policy, &b.policy)
        .into_iter()
        .map(|c| (c.field, c.weakens))
        .collect()
}

#[test]
fn diff_flags_what_widens_what_persists() {
    let ws = "workspace: {mount: /work, size: 1M}";
    let st = "state: {mount: /data, size: 1M}";
    assert_eq!(changes("env: {}", ws), [("workspace".into(), true)]);
    assert_eq!(changes(ws, "env: {}"), [("workspace".into(), false)]);
    assert_eq!(changes("env: {}", st), [("state".into(), true)]);
    assert_eq!(
        changes(ws, "workspace: {mount: /work, size: 2M}"),
        [("workspace.size".into(), true)]
    );
    assert_eq!(
        changes("workspace: {mount: /work, size: 2M}", ws),
        [("workspace.size".into(), false)]
    );
    assert_eq!(
        changes(ws, "workspace: {mount: /work, size: 1M, retain: 30s}"),
        [("workspace.retain".into(), true)]
    );
    assert_eq!(
        changes("workspace: {mount: /work, size: 1M, retain: 30s}", ws),
        [("workspace.retain".into(), false)]
    );
    assert_eq!(
        changes(st, "state: {mount: /data, size: 2M}"),
        [("state.size".into(), true)]
    );
    assert_eq!(
        changes(st, "state: {mount: /db, size: 1M}"),
        [("state.mount".into(), true)]
    );
    assert!(changes(ws, ws).is_empty());
}

#[test]
fn diff_flags_a_read_only_mount_made_writable() {
    let a = load_str(Path::new("a.yaml"), TOOL).unwrap();
    let b = load_str(
        Path::new("b.yaml"),
        &TOOL.replace("/opt/data:/opt/data:ro", "/opt/data:/opt/data:rw"),
    )
    .unwrap();
    let c = diff(&a.policy, &b.policy);
    assert_eq!(c.len(), 1, "{c:#?}");
    assert_eq!(c[0].field, "mounts");
    assert!(c[0].weakens, "{}", c[0]);
    assert_eq!(c[0].old, "/opt/data=/opt/data");
    assert_eq!(c[0].new, "/opt/data=/opt/data:rw");
}
