//! Each profile rule, broken by a manifest, with the exact error and line.

use std::path::Path;

use cordon_policy::policy::{Exec, Network};
use cordon_policy::{Diagnostic, load_str};

fn errors(yaml: &str) -> Vec<Diagnostic> {
    match load_str(Path::new("m.yaml"), yaml) {
        Ok(_) => panic!("manifest was accepted:\n{yaml}"),
        Err(e) => e.diagnostics().to_vec(),
    }
}

/// Exactly one error, at `line`, whose message contains `needle`.
fn assert_one(yaml: &str, line: u64, needle: &str) -> Diagnostic {
    let errs = errors(yaml);
    assert_eq!(errs.len(), 1, "expected one error, got {errs:#?}");
    let d = errs[0].clone();
    assert_eq!(d.line, line, "wrong line for {d}");
    assert!(
        d.message.contains(needle),
        "`{}` lacks `{needle}`",
        d.message
    );
    assert!(d.to_string().starts_with(&format!("m.yaml:{line}:")), "{d}");
    d
}

#[test]
fn the_seed_manifest_parses_verbatim() {
    let text = include_str!("fixtures/seed.yaml");
    let l = load_str(Path::new("seed.yaml"), text).unwrap();
    assert_eq!(l.policy.tools.len(), 3);
    let pdf = &l.policy.tools["pdf_to_text"];
    assert_eq!(pdf.network, Network::None);
    let lim = pdf.limits.unwrap();
    assert_eq!(
        (
            lim.wall.as_secs(),
            lim.memory_bytes,
            lim.tasks,
            lim.output_bytes
        ),
        (20, 512 << 20, 32, 2_000_000)
    );
    let jira = &l.policy.tools["jira_search"];
    assert!(
        matches!(&jira.exec, Exec::Image { reference, .. } if reference == "registry.internal/mcp/jira")
    );
    assert_eq!(jira.secrets[0].ttl_seconds, 900);
    // Defaults fill what the seed leaves out.
    assert_eq!(jira.limits.unwrap().tasks, 64);
    assert!(matches!(
        l.policy.tools["browse"].network,
        Network::Proxy { .. }
    ));
    // The abbreviated digest and the tool with nothing to run are warnings.
    assert_eq!(l.warnings.len(), 2, "{:#?}", l.warnings);
}

#[test]
fn unknown_key_is_refused_at_its_line() {
    let d = assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    netwrok: none\n",
        5,
        "unknown field `netwrok`",
    );
    assert_eq!(d.column, 5);
    assert!(d.hint.unwrap().contains("typo"));
}

#[test]
fn p1_refuses_egress() {
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    egress: [\"x.example:443\"]\n",
        5,
        "profile P1 requires `network: none`, but `egress` is set",
    );
}

#[test]
fn p1_refuses_secrets() {
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    secrets: [{name: T, scope: s, ttl: 5}]\n",
        5,
        "profile P1 allows no secrets, but 1 declared",
    );
}

#[test]
fn p2_refuses_proxy_and_missing_egress() {
    assert_one(
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    egress: proxy\n",
        5,
        "profile P2 requires egress as an explicit host:port allowlist, not `proxy`",
    );
    assert_one(
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n",
        3,
        "profile P2 requires `egress: [host:port, ...]`",
    );
}

#[test]
fn image_tag_is_refused_with_the_digest_form() {
    let d = assert_one(
        "tools:\n  a:\n    profile: P2\n    image: reg.example/mcp/jira:1.4\n    egress: [\"jira.example:443\"]\n",
        4,
        "is not pinned by digest",
    );
    assert!(
        d.message
            .contains("reg.example/mcp/jira@sha256:<64 hex digits>"),
        "{d}"
    );
}

#[test]
fn p3_requires_a_separate_kernel() {
    assert_one(
        "tools:\n  a:\n    profile: P3\n    command: [/bin/true]\n    runtime: native\n    egress: proxy\n",
        5,
        "profile P3 requires `runtime: gvisor` or `runtime: microvm`, found `runtime: native`",
    );
}

#[test]
fn network_none_and_egress_conflict() {
    let errs = errors(
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    network: none\n    egress: [\"a.example:443\"]\n",
    );
    assert!(
        errs.iter()
            .any(|d| d.line == 5 && d.message.contains("both `network: none` and `egress`")),
        "{errs:#?}"
    );
}

#[test]
fn bad_egress_entries() {
    for (entry, needle) in [
        ("a.example", "has no port"),
        ("a.example:0", "is not 1-65535"),
        ("u@a.example:443", "no userinfo"),
        ("*.example:443", "never a wildcard"),
        ("*", "write `egress: proxy`"),
    ] {
        assert_one(
            &format!(
                "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"{entry}\"]\n"
            ),
            5,
            needle,
        );
    }
}

#[test]
fn limits_are_validated() {
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    limits: {memory: 12Q}\n",
        5,
        "invalid size `12Q`",
    );
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    limits: {tasks: 0}\n",
        5,
        "tasks is 0",
    );
    assert_one(
        "tools:\n  a:\n    profile: P0\n    command: [/bin/true]\n    limits: {tasks: 3}\n",
        5,
        "would not be enforced",
    );
}

#[test]
fn every_profile_but_p0_gets_limits() {
    let l = load_str(
        Path::new("m.yaml"),
        "tools:\n  a: {profile: P1, command: [x]}\n  b: {profile: P0, command: [x]}\n",
    )
    .unwrap();
    assert!(l.policy.tools["a"].limits.is_some());
    assert!(l.policy.tools["b"].limits.is_none());
    assert_eq!(l.policy.tools["b"].network, Network::Host);
    let w: Vec<_> = l.warnings.iter().map(|w| w.message.clone()).collect();
    assert!(
        w.iter().any(|m| m.contains("P0 runs with no sandbox")),
        "{w:?}"
    );
}

#[test]
fn profile_must_be_written() {
    assert_one(
        "tools:\n  a:\n    command: [/bin/true]\n",
        3,
        "missing field `profile`",
    );
    assert_one("tools:\n  a:\n    profile: P9\n    command: [x]\n", 3, "P9");
}

#[test]
fn two_programs_are_refused() {
    assert_one(
        "tools:\n  a:\n    profile: P2\n    network: none\n    image: r@sha256:abcd\n    mcp: {command: [x]}\n",
        3,
        "declares more than one of `command`, `image` and `mcp`",
    );
    assert_one(
        "tools:\n  a:\n    profile: P2\n    network: none\n    command: [x]\n    mcp: {command: [x]}\n",
        3,
        "declares more than one of `command`, `image` and `mcp`",
    );
}

#[test]
fn a_command_beside_an_image_replaces_its_entrypoint() {
    let l = load_str(
        Path::new("m.yaml"),
        "tools:\n  a:\n    profile: P2\n    network: none\n    image: r@sha256:abcd\n    command: [/bin/tool, -x]\n",
    )
    .unwrap();
    match &l.policy.tools["a"].exec {
        Exec::Image {
            reference, command, ..
        } => {
            assert_eq!(reference, "r");
            assert_eq!(
                command.as_deref(),
                Some(&["/bin/tool".to_string(), "-x".to_string()][..])
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn mounts_and_env_are_checked() {
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [x]\n    mounts: [\"relative:/data\"]\n",
        5,
        "mount source `relative` must be an absolute path",
    );
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [x]\n    mounts: [\"/srv/x:/proc/x\"]\n",
        5,
        "inside a path cordon builds itself",
    );
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [x]\n    env: {LD_PRELOAD: /x.so}\n",
        3,
        "changes how every program is loaded",
    );
}

#[test]
fn binary_output_needs_a_media_type() {
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [x]\n    output: {kind: binary}\n",
        3,
        "binary output needs a `media_type`",
    );
}

#[test]
fn secrets_are_wellformed() {
    assert_one(
        "tools:\n  a:\n    profile: P2\n    command: [x]\n    egress: [\"a.b:443\"]\n    secrets: [{name: jira-token, scope: r, ttl: 5}]\n",
        6,
        "is not an environment variable name",
    );
}

const P2: &str = "tools:\n  a:\n    profile: P2\n    command: [x]\n";

#[test]
fn a_seed_secret_binds_to_the_single_egress_entry() {
    let l = load_str(
        Path::new("m.yaml"),
        &format!("{P2}    egress: [\"Jira.Example:443\"]\n    secrets: [{{name: JIRA_TOKEN, scope: r, ttl: 60}}]\n"),
    )
    .unwrap();
    let s = &l.policy.tools["a"].secrets[0];
    assert_eq!(s.deliver, cordon_policy::policy::Deliver::Proxy);
    let b = s.bind.as_ref().unwrap();
    assert_eq!(
        (b.host.as_str(), b.port, b.path.as_deref()),
        ("jira.example", 443, None)
    );
    assert_eq!(
        b.placement,
        cordon_policy::policy::Placement::Header {
            name: "Authorization".into(),
            template: "Bearer {token}".into()
        }
    );
    assert_eq!(
        l.secret_at[&("a".to_string(), "JIRA_TOKEN".to_string())].0,
        6
    );
}

#[test]
fn a_secret_binding_must_be_one_allowed_endpoint() {
    // Several egress entries and no bind: which one?
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\", \"c.d:443\"]\n    secrets:\n      - {{name: T, scope: r, ttl: 5}}\n"
        ),
        7,
        "2 egress entries; say which one",
    );
    // An endpoint outside the allowlist.
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\"]\n    secrets:\n      - {{name: T, scope: r, ttl: 5}}\n      - {{name: U, scope: r, ttl: 5, bind: {{endpoint: \"evil.example:443\"}}}}\n"
        ),
        8,
        "bind.endpoint `evil.example:443` is not in the tool's egress allowlist",
    );
    // No egress at all for a proxy secret.
    assert_one(
        &format!("{P2}    network: none\n    secrets: [{{name: T, scope: r, ttl: 5}}]\n"),
        6,
        "no egress allowlist to bind it to",
    );
    // A header without {token}; two placements; env with a bind.
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\"]\n    secrets: [{{name: T, scope: r, ttl: 5, bind: {{header: \"X-Key: abc\"}}}}]\n"
        ),
        6,
        "`{token}` exactly once",
    );
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\"]\n    secrets: [{{name: T, scope: r, ttl: 5, bind: {{basic: u, query: k}}}}]\n"
        ),
        6,
        "at most one of",
    );
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\"]\n    secrets: [{{name: T, scope: r, ttl: 5, deliver: env, bind: {{basic: u}}}}]\n"
        ),
        6,
        "`bind` applies to `deliver: proxy`",
    );
    // Bound to an endpoint the door only tunnels.
    assert_one(
        &format!(
            "{P2}    egress: [\"a.b:443\"]\n    tls_passthrough: [\"a.b:443\"]\n    secrets: [{{name: T, scope: r, ttl: 5}}]\n"
        ),
        7,
        "`tls_passthrough` endpoint",
    );
    assert_one(
        &format!("{P2}    egress: [\"a.b:443\"]\n    tls_passthrough: [\"c.d:443\"]\n"),
        6,
        "not in the tool's egress allowlist",
    );
}

#[test]
fn env_delivery_is_allowed_with_a_warning() {
    let l = load_str(
        Path::new("m.yaml"),
        &format!(
            "{P2}    network: none\n    secrets: [{{name: T, scope: r, ttl: 5, deliver: env}}]\n"
        ),
    )
    .unwrap();
    assert_eq!(l.policy.tools["a"].secrets[0].bind, None);
    assert!(
        l.warnings
            .iter()
            .any(|w| w.line == 6 && w.message.contains("delivered in the environment")),
        "{:?}",
        l.warnings
    );
}

#[test]
fn yaml_bombs_are_refused() {
    let mut y = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
    for i in 0..9 {
        let prev = if i == 0 {
            "a".to_string()
        } else {
            format!("b{}", i - 1)
        };
        y += &format!(
            "b{i}: &b{i} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        );
    }
    y += "tools: {}\n";
    assert!(load_str(Path::new("m.yaml"), &y).is_err());
}

#[test]
fn the_bundled_example_is_valid() {
    let text = include_str!("../../../examples/cordon.yaml");
    let l = load_str(Path::new("examples/cordon.yaml"), text).unwrap();
    assert!(l.warnings.is_empty(), "{:#?}", l.warnings);
}

#[test]
fn the_committed_schema_is_current() {
    let committed = include_str!("../../../schema/cordon.schema.json");
    let now = serde_json::to_string_pretty(&cordon_policy::json_schema()).unwrap() + "\n";
    assert!(
        committed == now,
        "schema/cordon.schema.json is stale: run `cordon schema > schema/cordon.schema.json`"
    );
}

#[test]
fn requirements_resolve_from_profile_manifest_and_tool() {
    use cordon_policy::policy::Mechanism::*;
    let l = load_str(
        Path::new("m.yaml"),
        "require: [landlock]\ntools:\n  a:\n    profile: P1\n    command: [/bin/true]\n  b:\n    profile: P2\n    network: none\n    command: [/bin/true]\n    accept: [cgroup]\n    require: [descriptors]\n  c:\n    profile: P2\n    network: none\n    command: [/bin/true]\n",
    )
    .unwrap();
    let t = &l.policy.tools;
    assert_eq!(
        t["a"].require,
        vec![Namespaces, ReadonlyRoot, Network, Seccomp, Landlock]
    );
    assert!(t["a"].accept.is_empty());
    assert_eq!(
        t["b"].require,
        vec![
            Namespaces,
            ReadonlyRoot,
            Descriptors,
            Network,
            Seccomp,
            Landlock
        ]
    );
    assert_eq!(t["b"].accept, vec![Cgroup]);
    assert!(t["c"].require.contains(&Cgroup));
}

#[test]
fn a_microvm_tool_requires_kvm_unless_it_accepts_emulation() {
    use cordon_policy::policy::Mechanism::*;
    let img = format!("i@sha256:{}", "a".repeat(64));
    let l = load_str(
        Path::new("m.yaml"),
        &format!(
            "tools:\n  vm:\n    profile: P3\n    runtime: microvm\n    image: {img}\n  emu:\n    profile: P3\n    runtime: microvm\n    image: {img}\n    accept: [kvm]\n  gv:\n    profile: P3\n    runtime: gvisor\n    image: {img}\n"
        ),
    )
    .unwrap();
    let t = &l.policy.tools;
    assert!(t["vm"].require.contains(&Kvm), "{:?}", t["vm"].require);
    assert!(!t["emu"].require.contains(&Kvm));
    assert_eq!(t["emu"].accept, vec![Kvm]);
    assert!(!t["gv"].require.contains(&Kvm), "only microvm needs kvm");
}

#[test]
fn an_unknown_mechanism_is_an_error() {
    let e =
        errors("tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    require: [magic]\n");
    assert!(e[0].message.contains("magic"), "{}", e[0]);
}

#[test]
fn mount_syntax_is_exact_and_errors_point_at_the_mount() {
    let ok = load_str(
        Path::new("m.yaml"),
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    mounts: [\"/srv/x:/data:ro\", {src: /srv/y, dst: /y, mode: rw}]\n",
    )
    .unwrap();
    let m = &ok.policy.tools["a"].mounts;
    assert_eq!((m[0].dst.as_str(), m[0].writable), ("/data", false));
    assert_eq!((m[1].dst.as_str(), m[1].writable), ("/y", true));
    // `src:/dst:ro` was once a bind to the path `/dst:ro`.
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    mounts:\n      - /srv/x:/data\n      - /srv/x:/data:ro:extra\n",
        7,
        "has 4 `:`-separated parts",
    );
    assert_one(
        "tools:\n  a:\n    profile: P1\n    command: [/bin/true]\n    mounts:\n      - /srv/x:/data:rx\n",
        6,
        "`rx` is not a mode",
    );
}

const MCP_HEAD: &str = "tools:\n  word_count:\n    profile: P1\n    command: [/usr/bin/wc]\n";

fn mcp_tool(name: &str, mcp: &str) -> String {
    format!("  {name}:\n    profile: P2\n    network: none\n    mcp:\n      command: [x]\n{mcp}")
}

#[test]
fn exposure_defaults_to_prefixed_and_as_is_is_accepted() {
    use cordon_policy::policy::Expose;
    let y = format!(
        "{MCP_HEAD}{}{}",
        mcp_tool("a", ""),
        mcp_tool("b", "      expose: as-is\n")
    );
    let l = load_str(Path::new("m.yaml"), &y).unwrap();
    let expose = |t: &str| match &l.policy.tools[t].exec {
        Exec::Mcp { expose, .. } => *expose,
        e => panic!("{e:?}"),
    };
    assert_eq!(expose("a"), Expose::Prefixed);
    assert_eq!(expose("b"), Expose::AsIs);
    assert_eq!(
        cordon_policy::policy::exposed_tool_name("a", Expose::Prefixed, &Default::default(), "x"),
        "a__x"
    );
    // An unknown exposure is refused.
    let bad = format!("{MCP_HEAD}{}", mcp_tool("a", "      expose: bare\n"));
    assert!(!errors(&bad).is_empty());
}

#[test]
fn a_rename_sets_the_full_name_and_must_be_one_model_apis_accept() {
    // Positive control: a valid full name.
    let ok = format!(
        "{MCP_HEAD}{}",
        mcp_tool("a", "      tools: {rename: {read_text_file: read}}\n")
    );
    let l = load_str(Path::new("m.yaml"), &ok).unwrap();
    match &l.policy.tools["a"].exec {
        Exec::Mcp { rename, .. } => assert_eq!(rename["read_text_file"], "read"),
        e => panic!("{e:?}"),
    }
    // A dotted name: refused at its line (line 10).
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            "      tools:\n        rename:\n          read_text_file: a.read\n"
        )
    );
    let d = assert_one(&y, 12, "exposed tool name `a.read` is refused");
    assert!(d.message.contains("`rename` of `read_text_file`"), "{d}");
    // Too long.
    let long = "x".repeat(65);
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            &format!("      tools:\n        rename: {{r: {long}}}\n")
        )
    );
    assert_one(&y, 11, "past the 64 model APIs accept");
}

#[test]
fn the_prefixed_form_of_an_allowed_name_is_checked() {
    let long = "y".repeat(62);
    // `a__` + 62 characters = 65: too long, at the allow entry's line.
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            &format!("      tools:\n        allow:\n          - {long}\n")
        )
    );
    assert_one(&y, 12, &format!("exposed tool name `a__{long}` is refused"));
    // As-is, the same name fits.
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            &format!("      expose: as-is\n      tools:\n        allow:\n          - {long}\n")
        )
    );
    load_str(Path::new("m.yaml"), &y).unwrap();
    // A command tool's name is held to the same length.
    let y = format!(
        "tools:\n  {}:\n    profile: P1\n    command: [x]\n",
        "z".repeat(65)
    );
    assert_one(&y, 3, "past the 64 model APIs accept");
}

#[test]
fn a_name_given_twice_is_an_error_naming_both() {
    // A rename onto a command tool's name.
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool("a", "      tools: {rename: {count: word_count}}\n")
    );
    let d = assert_one(&y, 10, "exposed tool name `word_count` is given twice");
    assert!(
        d.message.contains("tool `word_count`") && d.message.contains("tool `a`"),
        "{d}"
    );
    // Two servers exposing the same name as-is.
    let y = format!(
        "{MCP_HEAD}{}{}",
        mcp_tool(
            "a",
            "      expose: as-is\n      tools: {allow: [read_file]}\n"
        ),
        mcp_tool(
            "b",
            "      expose: as-is\n      tools: {allow: [read_file]}\n"
        )
    );
    let d = assert_one(&y, 18, "exposed tool name `read_file` is given twice");
    assert!(
        d.message.contains("tool `a`") && d.message.contains("tool `b`"),
        "{d}"
    );
    // The same for prompts.
    let y = format!(
        "{MCP_HEAD}{}{}",
        mcp_tool("a", "      expose: as-is\n      prompts: [greet]\n"),
        mcp_tool("b", "      expose: as-is\n      prompts: [greet]\n")
    );
    let d = assert_one(&y, 18, "exposed prompt name `greet` is given twice");
    assert!(
        d.message.contains("tool `a`") && d.message.contains("tool `b`"),
        "{d}"
    );
    // Positive control: prefixed, the same server names do not collide.
    let y = format!(
        "{MCP_HEAD}{}{}",
        mcp_tool(
            "a",
            "      tools: {allow: [read_file]}\n      prompts: [greet]\n"
        ),
        mcp_tool(
            "b",
            "      tools: {allow: [read_file]}\n      prompts: [greet]\n"
        )
    );
    load_str(Path::new("m.yaml"), &y).unwrap();
}

#[test]
fn a_server_start_up_deadline_is_set_or_defaults() {
    let startup = |y: &str| match &load_str(Path::new("m.yaml"), y).unwrap().policy.tools["a"].exec
    {
        Exec::Mcp {
            startup_seconds, ..
        } => *startup_seconds,
        e => panic!("{e:?}"),
    };
    let y = format!("{MCP_HEAD}{}", mcp_tool("a", ""));
    assert_eq!(startup(&y), cordon_policy::policy::DEFAULT_STARTUP_SECONDS);
    let y = format!("{MCP_HEAD}{}", mcp_tool("a", "      startup_seconds: 3\n"));
    assert_eq!(startup(&y), 3);
    let y = format!("{MCP_HEAD}{}", mcp_tool("a", "      startup_seconds: 0\n"));
    assert_one(&y, 10, "`startup_seconds` is 0");
}

#[test]
fn a_pool_has_a_size_and_refill_only_with_lifetime_pool() {
    let base = "tools:\n  b:\n    profile: P3\n    runtime: gvisor\n    command: [/bin/true]\n";
    // Positive control: the defaults, and the manifest's settings.
    let l = load_str(Path::new("m.yaml"), &format!("{base}    lifetime: pool\n")).unwrap();
    let p = l.policy.tools["b"].pool.unwrap();
    assert_eq!((p.size, p.refill), (2, true));
    let l = load_str(
        Path::new("m.yaml"),
        &format!("{base}    lifetime: pool\n    pool: {{size: 4, refill: false}}\n"),
    )
    .unwrap();
    let p = l.policy.tools["b"].pool.unwrap();
    assert_eq!((p.size, p.refill), (4, false));
    assert!(
        load_str(Path::new("m.yaml"), base).unwrap().policy.tools["b"]
            .pool
            .is_none()
    );
    assert_one(
        &format!("{base}    pool: {{size: 4}}\n"),
        3,
        "`pool:` applies only with `lifetime: pool`",
    );
    assert_one(
        &format!("{base}    lifetime: pool\n    pool: {{size: 0}}\n"),
        3,
        "keeps nothing ready",
    );
}

#[test]
fn boot_cold_is_a_microvm_setting_and_snapshot_its_default() {
    use cordon_policy::policy::Boot;
    let vm = "tools:\n  b:\n    profile: P3\n    runtime: microvm\n    accept: [kvm]\n    image: x@sha256:0000000000000000000000000000000000000000000000000000000000000000\n";
    let boot = |y: &str| load_str(Path::new("m.yaml"), y).unwrap().policy.tools["b"].boot;
    // Positive controls: the default, and both values on a microVM.
    assert_eq!(boot(vm), Some(Boot::Snapshot));
    assert_eq!(boot(&format!("{vm}    boot: cold\n")), Some(Boot::Cold));
    assert_eq!(
        boot(&format!("{vm}    boot: snapshot\n")),
        Some(Boot::Snapshot)
    );
    // Refused at the `boot:` line on any other runtime, and an unknown value.
    let gv = "tools:\n  b:\n    profile: P3\n    runtime: gvisor\n    command: [/bin/true]\n";
    assert_eq!(boot(gv), None);
    assert_one(
        &format!("{gv}    boot: cold\n"),
        6,
        "`boot:` applies only to `runtime: microvm`",
    );
    assert!(load_str(Path::new("m.yaml"), &format!("{vm}    boot: warm\n")).is_err());
}

#[test]
fn a_warm_pool_of_servers_is_bounded_and_only_for_session_servers() {
    let warm = |y: &str| match &load_str(Path::new("m.yaml"), y).unwrap().policy.tools["a"].exec {
        Exec::Mcp { warm, .. } => *warm,
        e => panic!("{e:?}"),
    };
    // Positive controls: none by default, the manifest's number otherwise.
    assert_eq!(warm(&format!("{MCP_HEAD}{}", mcp_tool("a", ""))), 0);
    let y = format!("{MCP_HEAD}{}", mcp_tool("a", "      warm: 2\n"));
    assert_eq!(warm(&y), 2);
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool("a", "      warm: 1\n    lifetime: session\n")
    );
    assert_eq!(warm(&y), 1);
    // Refused at the `warm:` line.
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool("a", "      warm: 1\n    lifetime: call\n")
    );
    assert_one(&y, 10, "applies only with `lifetime: session`");
    let y = format!("{MCP_HEAD}{}", mcp_tool("a", "      warm: 9\n"));
    assert_one(&y, 10, "keeps more than 8 sandboxes ready");
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            "      warm: 1\n    workspace: {mount: /work, size: 1M}\n"
        )
    );
    assert_one(&y, 10, "cannot be given a session workspace");
}

#[test]
fn a_warm_up_call_needs_a_pool_an_object_and_an_exposed_tool() {
    let warm_up = |y: &str| match &load_str(Path::new("m.yaml"), y).unwrap().policy.tools["a"].exec
    {
        Exec::Mcp { warm_up, .. } => warm_up.clone(),
        e => panic!("{e:?}"),
    };
    // Positive control.
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            "      warm: 1\n      warm_up: {tool: nav, arguments: {url: \"about:blank\"}}\n"
        )
    );
    let w = warm_up(&y).unwrap();
    assert_eq!(w.tool, "nav");
    assert_eq!(w.arguments["url"], "about:blank");
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool("a", "      warm_up: {tool: nav}\n")
    );
    assert_one(&y, 10, "`warm_up` needs `warm: N`");
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            "      warm: 1\n      warm_up: {tool: nav, arguments: [1]}\n"
        )
    );
    assert_one(&y, 11, "must be an object");
    let y = format!(
        "{MCP_HEAD}{}",
        mcp_tool(
            "a",
            "      warm: 1\n      warm_up: {tool: nav}\n      tools: {allow: [snap]}\n"
        )
    );
    assert_one(&y, 11, "which `tools: {allow:}` does not expose");
}

#[test]
fn a_wasm_tool_needs_its_pinned_module_and_p1() {
    let h = "ab".repeat(32);
    // Positive control: resolved with the module relative to the manifest.
    let ok = format!(
        "version: 1\ntools:\n  w:\n    profile: P1\n    runtime: wasm\n    module: {{path: m.wasm, sha256: {h}}}\n    network: none\n"
    );
    let l = load_str(Path::new("dir/m.yaml"), &ok).expect("valid");
    assert_eq!(
        l.policy.tools["w"].exec,
        Exec::Wasm {
            module: "dir/m.wasm".into(),
            sha256: h.clone(),
            argv: vec!["m".into()],
            worker: false,
            function: None,
        }
    );
    assert_one(
        "version: 1\ntools:\n  w:\n    profile: P1\n    runtime: wasm\n    network: none\n",
        5,
        "`runtime: wasm` needs `module",
    );
    assert_one(
        &format!(
            "version: 1\ntools:\n  w:\n    profile: P1\n    module: {{path: m.wasm, sha256: {h}}}\n    command: [\"/bin/true\"]\n    network: none\n"
        ),
        5,
        "`module` is run by `runtime: wasm` only",
    );
    assert_one(
        "version: 1\ntools:\n  w:\n    profile: P1\n    runtime: wasm\n    module: {path: m.wasm, sha256: abc}\n    network: none\n",
        6,
        "is not 64 hex digits",
    );
    assert_one(
        &format!(
            "version: 1\ntools:\n  w:\n    profile: P2\n    runtime: wasm\n    module: {{path: m.wasm, sha256: {h}}}\n    egress: [\"a.example:443\"]\n"
        ),
        4,
        "`runtime: wasm` runs P1 tools only",
    );
    // A typed function: its input is its parameters, not `input` or an argv.
    let f = format!(
        "version: 1\ntools:\n  w:\n    profile: P1\n    runtime: wasm\n    module: {{path: m.wasm, sha256: {h}, function: check}}\n    network: none\n"
    );
    let l = load_str(Path::new("dir/m.yaml"), &f).expect("valid");
    assert!(
        matches!(&l.policy.tools["w"].exec, Exec::Wasm { function: Some(f), .. } if f == "check")
    );
    assert!(
        l.policy.tools["w"].input.json,
        "its arguments go on stdin as JSON"
    );
    assert_one(
        &f.replace("    network: none\n", "    network: none\n    input: {}\n"),
        6,
        "`input` does not apply to a typed function (`function: check`)",
    );
    assert_one(
        &f.replace(
            "    network: none\n",
            "    network: none\n    command: [check]\n",
        ),
        6,
        "`command` does not apply to a typed function (`function: check`)",
    );
}
