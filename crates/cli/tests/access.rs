//! The `access:` section on the command line: `check` and `explain` show
//! the grants, `diff` flags a widened one, and `audit query` selects by
//! principal and tenant.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn cordon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .output()
        .expect("run cordon")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const MANIFEST: &str = r#"tools:
  word_count:
    profile: P1
    command: ["/usr/bin/wc", "-w"]
  other:
    profile: P1
    command: ["/usr/bin/wc", "-c"]
access:
  grants:
    - group: analysts
      tenant: acme
      tools: [word_count, "scratch*"]
    - subject: bob
      tools: [other]
"#;

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn check_and_explain_show_the_grants() {
    let dir = common::tempdir();
    let m = write(dir.path(), "m.yaml", MANIFEST);
    let o = cordon(&["check", "--no-host", "-m", &m]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("access: 2 grants"),
        "{}",
        text(&o.stdout)
    );
    // `scratch*` names no tool of this manifest: a warning at its line.
    assert!(
        text(&o.stderr).contains("m.yaml:12:")
            && text(&o.stderr).contains("`scratch*` matches no tool"),
        "{}",
        text(&o.stderr)
    );

    let o = cordon(&["explain", "word_count", "-m", &m, "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "word_count");
    // Only the grants that reach this tool, with only its names.
    assert_eq!(
        v["access"],
        serde_json::json!({"grants": [{"group": "analysts", "tenant": "acme", "tools": ["word_count"]}]})
    );
    let o = cordon(&["explain", "word_count", "-m", &m]);
    let y = text(&o.stdout);
    assert!(y.contains("access:\n  grants:\n  - group: analysts"), "{y}");

    // Without the section, explain prints the policy alone.
    let plain = write(
        dir.path(),
        "plain.yaml",
        MANIFEST.split("access:").next().unwrap(),
    );
    let o = cordon(&["explain", "word_count", "-m", &plain, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.get("access").is_none(), "{v}");
    let o = cordon(&["check", "--no-host", "-m", &plain]);
    assert!(text(&o.stdout).contains("access: no grants; every caller may use every tool"));
}

#[test]
fn diff_flags_a_widened_grant() {
    let dir = common::tempdir();
    let a = write(dir.path(), "a.yaml", MANIFEST);
    let b = write(
        dir.path(),
        "b.yaml",
        &MANIFEST.replace("tools: [other]", "tools: [other, word_count]"),
    );
    let o = cordon(&["diff", &a, &b]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout)
            .contains("WEAKENS  (access): grants[subject=bob].tools: (none) -> word_count"),
        "{}",
        text(&o.stdout)
    );
    // Narrowed back: a change, none weakening.
    let o = cordon(&["diff", &b, &a]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout).contains("1 changes, 0 weaken"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn audit_query_selects_by_principal_and_tenant() {
    let dir = common::tempdir();
    let log = dir.path().join("audit.jsonl");
    let rec = |tool: &str, principal: &str, tenant: &str| {
        let mut r = cordon_audit::AuditRecord::new(tool, "P1");
        r.principal = Some(principal.into());
        r.tenant = Some(tenant.into());
        serde_json::to_string(&r).unwrap()
    };
    std::fs::write(
        &log,
        [
            rec("a", "alice", "acme"),
            rec("b", "bob", "globex"),
            rec("c", "alice", "globex"),
        ]
        .join("\n")
            + "\n",
    )
    .unwrap();
    let log = log.to_str().unwrap();
    let lines = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["audit", "query", "--file", log];
        a.extend_from_slice(args);
        let o = cordon(&a);
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout).lines().map(str::to_owned).collect()
    };
    let alice = lines(&["--principal", "alice"]);
    assert_eq!(alice.len(), 2, "{alice:?}");
    assert!(
        alice[0].contains("tool=\"a\"") && alice[0].contains("principal=\"alice\" tenant=\"acme\""),
        "{alice:?}"
    );
    let globex = lines(&["--tenant", "globex"]);
    assert_eq!(globex.len(), 2, "{globex:?}");
    assert!(
        globex.iter().all(|l| l.contains("tenant=\"globex\"")),
        "{globex:?}"
    );
    let both = lines(&["--principal", "alice", "--tenant", "globex", "--json"]);
    assert_eq!(both.len(), 1, "{both:?}");
    let v: serde_json::Value = serde_json::from_str(&both[0]).unwrap();
    assert_eq!(v["tool"], "c");
    assert!(lines(&["--principal", "mallory"]).is_empty());
}
