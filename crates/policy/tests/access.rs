//! The `access:` section: resolution, its errors at the line, and how
//! `diff` classifies a change of a grant.

use std::path::Path;

use cordon_policy::access::{Claims, Kind};
use cordon_policy::diff::{ACCESS, Change, diff};
use cordon_policy::load_str;

const TOOLS: &str = r#"
tools:
  word_count:
    profile: P1
    command: ["/usr/bin/wc"]
  scratch:
    profile: P1
    mcp: {command: ["/usr/bin/python3", "/srv/scratch.py"]}
"#;

fn with_access(access: &str) -> String {
    format!("{TOOLS}{access}")
}

const GRANTS: &str = r#"access:
  grants:
    - group: analysts
      tenant: acme
      tools: [word_count, "scratch__read*"]
      prompts: ["scratch__*"]
    - subject: alice
      tools: ["*"]
      resources: ["cordon://scratch/*"]
"#;

#[test]
fn no_section_means_no_grants_and_a_section_resolves() {
    let l = load_str(Path::new("m.yaml"), TOOLS).unwrap();
    assert!(l.policy.access.is_none());
    let l = load_str(Path::new("m.yaml"), &with_access(GRANTS)).unwrap();
    let a = l.policy.access.expect("access resolved");
    assert_eq!(a.grants.len(), 2);
    assert_eq!(a.grants[0].to.group.as_deref(), Some("analysts"));
    assert_eq!(a.grants[0].to.tenant.as_deref(), Some("acme"));
    assert_eq!(a.grants[0].tools, ["word_count", "scratch__read*"]);
    assert_eq!(a.grants[1].resources, ["cordon://scratch/*"]);
    let groups = ["analysts".to_string()];
    let bob = Claims {
        subject: "bob",
        client_id: None,
        groups: &groups,
        tenant: "acme",
    };
    assert!(a.allows(&bob, Kind::Tool, "scratch__read_file"));
    assert!(!a.allows(&bob, Kind::Tool, "scratch__write_file"));
    assert!(a.allows(&bob, Kind::Prompt, "scratch__hello"));
    assert!(!a.allows(&bob, Kind::Resource, "cordon://scratch/x"));
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
}

fn errors(yaml: &str) -> Vec<cordon_policy::Diagnostic> {
    match load_str(Path::new("m.yaml"), yaml) {
        Ok(_) => panic!("manifest was accepted:\n{yaml}"),
        Err(e) => e.diagnostics().to_vec(),
    }
}

#[test]
fn a_grant_without_a_principal_is_refused_at_its_line() {
    let yaml = with_access("access:\n  grants:\n    - tools: [word_count]\n");
    let errs = errors(&yaml);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let line = yaml.lines().position(|l| l.contains("- tools")).unwrap() as u64 + 1;
    assert_eq!(errs[0].line, line, "{}", errs[0]);
    assert!(
        errs[0].message.contains("names no principal"),
        "{}",
        errs[0]
    );
}

#[test]
fn an_empty_name_is_refused_at_its_line() {
    let yaml = with_access(
        "access:\n  grants:\n    - subject: alice\n      tools:\n        - word_count\n        - \"\"\n",
    );
    let errs = errors(&yaml);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let line = yaml.lines().position(|l| l.contains("- \"\"")).unwrap() as u64 + 1;
    assert_eq!(errs[0].line, line, "{}", errs[0]);
    assert!(errs[0].message.contains("empty name"), "{}", errs[0]);
}

#[test]
fn an_unknown_key_in_a_grant_is_refused() {
    let yaml = with_access("access:\n  grants:\n    - subjcet: alice\n      tools: [word_count]\n");
    let errs = errors(&yaml);
    assert!(errs[0].message.contains("unknown field"), "{}", errs[0]);
    let line = yaml.lines().position(|l| l.contains("subjcet")).unwrap() as u64 + 1;
    assert_eq!(errs[0].line, line, "{}", errs[0]);
}

#[test]
fn a_name_no_tool_can_have_is_a_warning() {
    let yaml = with_access(
        "access:\n  grants:\n    - subject: alice\n      tools: [wordcount, \"other__*\", \"scratch__*\"]\n",
    );
    let l = load_str(Path::new("m.yaml"), &yaml).unwrap();
    let w: Vec<&str> = l.warnings.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(w[0].contains("`wordcount` matches no tool"), "{w:#?}");
    assert!(w[1].contains("`other__*` matches no tool"), "{w:#?}");
}

fn access_changes(old: &str, new: &str) -> Vec<Change> {
    let a = load_str(Path::new("a.yaml"), &with_access(old)).unwrap();
    let b = load_str(Path::new("b.yaml"), &with_access(new)).unwrap();
    let c = diff(&a.policy, &b.policy);
    assert!(c.iter().all(|c| c.tool == ACCESS), "{c:#?}");
    c
}

fn weakening(c: &[Change]) -> Vec<String> {
    c.iter()
        .filter(|c| c.weakens)
        .map(|c| format!("{}: {}", c.field, c.new))
        .collect()
}

#[test]
fn identical_grants_have_no_changes() {
    assert!(access_changes(GRANTS, GRANTS).is_empty());
}

#[test]
fn dropping_the_section_weakens_and_adding_it_does_not() {
    let c = access_changes(GRANTS, "");
    assert_eq!(c.len(), 1, "{c:#?}");
    assert!(c[0].weakens);
    let c = access_changes("", GRANTS);
    assert_eq!(c.len(), 1, "{c:#?}");
    assert!(!c[0].weakens);
}

#[test]
fn a_new_principal_weakens() {
    let new = GRANTS.replace(
        "    - subject: alice\n",
        "    - subject: mallory\n      tools: [word_count]\n    - subject: alice\n",
    );
    let c = access_changes(GRANTS, &new);
    assert_eq!(
        weakening(&c),
        ["grants[subject=mallory]: tools: [word_count]"]
    );
}

#[test]
fn a_principal_widened_by_dropping_its_tenant_weakens() {
    let new = GRANTS.replace("      tenant: acme\n", "");
    let c = access_changes(GRANTS, &new);
    assert_eq!(weakening(&c).len(), 1, "{c:#?}");
    assert!(
        weakening(&c)[0].starts_with("grants[group=analysts]:"),
        "{c:#?}"
    );
    // The narrower grant's removal is listed, not weakening.
    assert!(
        c.iter()
            .any(|c| !c.weakens && c.field == "grants[group=analysts,tenant=acme]")
    );
}

#[test]
fn a_new_tool_or_a_broader_glob_weakens_a_narrower_one_does_not() {
    let broader = GRANTS.replace("\"scratch__read*\"", "\"scratch__*\"");
    let c = access_changes(GRANTS, &broader);
    assert_eq!(
        weakening(&c),
        ["grants[group=analysts,tenant=acme].tools: scratch__*"]
    );
    let c = access_changes(&broader, GRANTS);
    assert!(weakening(&c).is_empty(), "{c:#?}");
    assert_eq!(c.len(), 2, "{c:#?}");

    let more = GRANTS.replace("[word_count, ", "[word_count, other_tool, ");
    // (a warning for the unknown name, the diff still flags it)
    let c = access_changes(GRANTS, &more);
    assert_eq!(
        weakening(&c),
        ["grants[group=analysts,tenant=acme].tools: other_tool"]
    );
    // A name an existing glob covers is not a widening.
    let covered = GRANTS.replace("[\"*\"]", "[\"*\", word_count]");
    let c = access_changes(GRANTS, &covered);
    assert_eq!(c.len(), 1, "{c:#?}");
    assert!(!c[0].weakens, "{c:#?}");
    // Resources and prompts likewise.
    let res = GRANTS.replace("[\"cordon://scratch/*\"]", "[\"cordon://*\"]");
    let c = access_changes(GRANTS, &res);
    assert_eq!(
        weakening(&c),
        ["grants[subject=alice].resources: cordon://*"]
    );
}
