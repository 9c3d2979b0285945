//! The `gateway:` section and `max_concurrent`: resolved values, errors at
//! their line, and `cordon diff` flagging a loosened cap.

use std::path::Path;

use cordon_policy::gateway::{Concurrency, GatewayPolicy, PrincipalCaps, TenantCaps};
use cordon_policy::load_str;

const TOOL: &str = "tools:\n  t:\n    profile: P1\n    command: [/bin/true]\n";

fn load(yaml: &str) -> cordon_policy::Loaded {
    load_str(Path::new("m.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn error(yaml: &str) -> cordon_policy::Diagnostic {
    match load_str(Path::new("m.yaml"), yaml) {
        Ok(_) => panic!("manifest was accepted:\n{yaml}"),
        Err(e) => {
            let d = e.diagnostics();
            assert_eq!(d.len(), 1, "{d:#?}");
            d[0].clone()
        }
    }
}

#[test]
fn absent_gateway_is_the_transport_default() {
    let l = load(TOOL);
    assert_eq!(l.policy.gateway, GatewayPolicy::default());
    assert_eq!(l.policy.gateway.idle_timeout_seconds, 300);
    assert_eq!(l.policy.tools["t"].concurrency, None);
}

#[test]
fn gateway_section_resolves() {
    let y = format!(
        "gateway:\n  idle_timeout: 30m\n  disconnect_grace: 2\n  max_sandboxes: 50\n  per_principal: {{calls_per_minute: 120, sessions: 4, calls_in_flight: 3, sandboxes: 2}}\n  per_tenant: {{calls_in_flight: 10, sandboxes: 6}}\n{TOOL}    max_concurrent: 2\n    queue_seconds: 3\n"
    );
    let l = load(&y);
    assert_eq!(
        l.policy.gateway,
        GatewayPolicy {
            idle_timeout_seconds: 1800,
            disconnect_grace_seconds: 2,
            max_sandboxes: Some(50),
            per_principal: PrincipalCaps {
                calls_per_minute: Some(120),
                sessions: Some(4),
                calls_in_flight: Some(3),
                sandboxes: Some(2),
            },
            per_tenant: TenantCaps {
                calls_in_flight: Some(10),
                sandboxes: Some(6),
            },
            reprobe: Default::default(),
        }
    );
    assert_eq!(
        l.policy.tools["t"].concurrency,
        Some(Concurrency {
            max_concurrent: 2,
            queue_seconds: 3
        })
    );
}

#[test]
fn errors_point_at_the_value() {
    let d = error(&format!("gateway:\n  idle_timeout: 5 days\n{TOOL}"));
    assert_eq!(d.line, 2, "{d}");
    assert!(d.message.contains("invalid duration"), "{d}");
    let d = error(&format!(
        "gateway:\n  per_principal:\n    sessions: 0\n{TOOL}"
    ));
    assert_eq!(d.line, 3, "{d}");
    assert!(d.message.contains("per_principal.sessions"), "{d}");
    let d = error(&format!("{TOOL}    max_concurrent: 0\n"));
    assert_eq!(d.line, 5, "{d}");
    assert!(d.message.contains("`max_concurrent` is 0"), "{d}");
    let d = error(&format!("{TOOL}    queue_seconds: 4\n"));
    assert_eq!(d.line, 5, "{d}");
    assert!(d.message.contains("without `max_concurrent`"), "{d}");
    let d = error(&format!(
        "gateway:\n  per_principal:\n    sessions: 2\n    sandboxes: 0\n{TOOL}"
    ));
    assert_eq!(d.line, 4, "{d}");
    assert!(d.message.contains("per_principal.sandboxes"), "{d}");
    let d = error(&format!(
        "gateway:\n  per_tenant:\n    calls_in_flight: 0\n{TOOL}"
    ));
    assert_eq!(d.line, 3, "{d}");
    assert!(d.message.contains("per_tenant.calls_in_flight"), "{d}");
    let d = error(&format!("gateway:\n  per_tenant:\n    calls: 3\n{TOOL}"));
    assert!(d.message.contains("unknown field"), "{d}");
    let d = error(&format!("gateway:\n  max_sandbox: 3\n{TOOL}"));
    assert!(d.message.contains("unknown field"), "{d}");
}

#[test]
fn diff_flags_loosened_caps() {
    let a = load(&format!(
        "gateway: {{max_sandboxes: 10, per_principal: {{sessions: 2}}, per_tenant: {{sandboxes: 4}}}}\n{TOOL}    max_concurrent: 2\n"
    ));
    let b = load(&format!(
        "gateway: {{idle_timeout: 10m, per_principal: {{sessions: 2}}, per_tenant: {{sandboxes: 8}}}}\n{TOOL}    max_concurrent: 4\n"
    ));
    let changes = cordon_policy::diff::diff(&a.policy, &b.policy);
    let weak: Vec<(&str, &str)> = changes
        .iter()
        .filter(|c| c.weakens)
        .map(|c| (c.tool.as_str(), c.field.as_str()))
        .collect();
    assert_eq!(
        weak,
        [
            ("t", "max_concurrent"),
            ("(gateway)", "idle_timeout"),
            ("(gateway)", "max_sandboxes"),
            ("(gateway)", "per_tenant.sandboxes")
        ]
    );
    // Tightening is a change, not a weakening.
    let back = cordon_policy::diff::diff(&b.policy, &a.policy);
    assert!(back.iter().all(|c| !c.weakens), "{back:#?}");
    assert_eq!(back.len(), 4);
}

#[test]
fn reprobe_resolves_with_defaults_and_errors_at_its_value() {
    use cordon_policy::gateway::Reprobe;
    assert_eq!(
        load(TOOL).policy.gateway.reprobe,
        Reprobe {
            every_seconds: 6 * 3600,
            jitter_percent: 10
        }
    );
    let l = load(&format!(
        "gateway:\n  reprobe: {{every: 30m, jitter: 5%}}\n{TOOL}"
    ));
    assert_eq!(
        l.policy.gateway.reprobe,
        Reprobe {
            every_seconds: 1800,
            jitter_percent: 5
        }
    );
    let l = load(&format!("gateway:\n  reprobe: {{jitter: 0}}\n{TOOL}"));
    assert_eq!(l.policy.gateway.reprobe.every_seconds, 6 * 3600);
    assert_eq!(l.policy.gateway.reprobe.jitter_percent, 0);
    let e = error(&format!("gateway:\n  reprobe: {{every: 0}}\n{TOOL}"));
    assert!(e.message.contains("`reprobe.every` is 0"), "{e:?}");
    assert_eq!(e.line, 2);
    let e = error(&format!("gateway:\n  reprobe:\n    jitter: 80%\n{TOOL}"));
    assert!(e.message.contains("at most 50%"), "{e:?}");
    assert_eq!(e.line, 3);
}
