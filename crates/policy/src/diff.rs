//! `cordon diff`: every change between two resolved policy sets, each
//! marked when it weakens isolation. The seed: moving a tool to a weaker
//! profile is a security change with its own review.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::access::{Access, Grantee, Kind, glob_covers};
use crate::gateway::{Concurrency, GatewayPolicy};
use crate::policy::{
    Boot, Deliver, Exec, Expose, Lifetime, Limits, Mechanism, Network, PolicySet, Runtime, Seccomp,
    Secret, ToolPolicy,
};
use crate::units::format_size;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub tool: String,
    /// Dotted path of the setting, e.g. `limits.memory`.
    pub field: String,
    pub old: String,
    pub new: String,
    /// True when the new setting gives the tool more reach than the old one.
    pub weakens: bool,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.weakens { "WEAKENS" } else { "       " };
        write!(
            f,
            "{mark}  {}: {}: {} -> {}",
            self.tool, self.field, self.old, self.new
        )
    }
}

const ABSENT: &str = "(none)";

/// Every change from `old` to `new`, tools in name order.
pub fn diff(old: &PolicySet, new: &PolicySet) -> Vec<Change> {
    let mut out = Vec::new();
    let names: BTreeSet<&String> = old.tools.keys().chain(new.tools.keys()).collect();
    for name in names {
        match (old.tools.get(name), new.tools.get(name)) {
            (None, Some(n)) => out.push(change(name, "tool", ABSENT, &summary(n), true)),
            (Some(o), None) => out.push(change(name, "tool", &summary(o), ABSENT, false)),
            (Some(o), Some(n)) => diff_tool(o, n, &mut out),
            (None, None) => {}
        }
    }
    diff_gateway(&old.gateway, &new.gateway, &mut out);
    diff_access(old.access.as_ref(), new.access.as_ref(), &mut out);
    out
}

/// What [`Change::tool`] says for a change of the manifest's grants.
pub const ACCESS: &str = "(access)";

const EVERYONE: &str = "(none: every caller may use everything)";

fn grants_summary(a: &Access) -> String {
    format!("{} grants", a.grants.len())
}

/// The patterns each grantee is given, grants to the same principals
/// merged.
fn by_grantee(a: &Access) -> BTreeMap<&Grantee, [BTreeSet<&String>; 3]> {
    let mut m: BTreeMap<&Grantee, [BTreeSet<&String>; 3]> = BTreeMap::new();
    for g in &a.grants {
        let e = m.entry(&g.to).or_default();
        for (i, k) in Kind::ALL.iter().enumerate() {
            e[i].extend(g.patterns(*k));
        }
    }
    m
}

/// Grants added, removed or changed: dropping the section, a new
/// principal, and a name or glob no old one covers weaken.
fn diff_access(old: Option<&Access>, new: Option<&Access>, out: &mut Vec<Change>) {
    let (o, n) = match (old, new) {
        (None, None) => return,
        (Some(o), None) => {
            out.push(change(ACCESS, "access", &grants_summary(o), EVERYONE, true));
            return;
        }
        (None, Some(n)) => {
            out.push(change(
                ACCESS,
                "access",
                EVERYONE,
                &grants_summary(n),
                false,
            ));
            return;
        }
        (Some(o), Some(n)) => (by_grantee(o), by_grantee(n)),
    };
    let who: BTreeSet<&&Grantee> = o.keys().chain(n.keys()).collect();
    for g in who {
        let field = |k: &str| format!("grants[{g}]{k}");
        let list = |p: &[BTreeSet<&String>; 3]| {
            Kind::ALL
                .iter()
                .enumerate()
                .filter(|(i, _)| !p[*i].is_empty())
                .map(|(i, k)| {
                    let v: Vec<&str> = p[i].iter().map(|s| s.as_str()).collect();
                    format!("{}: [{}]", k.key(), v.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        match (o.get(*g), n.get(*g)) {
            (None, Some(np)) => {
                let grants_any = np.iter().any(|s| !s.is_empty());
                out.push(change(ACCESS, &field(""), ABSENT, &list(np), grants_any));
            }
            (Some(op), None) => out.push(change(ACCESS, &field(""), &list(op), ABSENT, false)),
            (Some(op), Some(np)) => {
                for (i, k) in Kind::ALL.iter().enumerate() {
                    let f = field(&format!(".{}", k.key()));
                    for p in np[i].difference(&op[i]) {
                        let covered = op[i].iter().any(|w| glob_covers(w, p));
                        out.push(change(ACCESS, &f, ABSENT, p, !covered));
                    }
                    for p in op[i].difference(&np[i]) {
                        out.push(change(ACCESS, &f, p, ABSENT, false));
                    }
                }
            }
            (None, None) => {}
        }
    }
}

fn summary(t: &ToolPolicy) -> String {
    format!("{:?} {}", t.profile, runtime_name(t.runtime))
}

fn change(tool: &str, field: &str, old: &str, new: &str, weakens: bool) -> Change {
    Change {
        tool: tool.to_string(),
        field: field.to_string(),
        old: old.to_string(),
        new: new.to_string(),
        weakens,
    }
}

fn runtime_name(r: Runtime) -> &'static str {
    match r {
        Runtime::Native => "native",
        Runtime::Gvisor => "gvisor",
        Runtime::Microvm => "microvm",
        Runtime::Wasm => "wasm",
    }
}

/// Kernel-boundary strength: a separate kernel beats a shared one (Wasm
/// runs inside the native jail, on the host's kernel).
fn runtime_strength(r: Runtime) -> u8 {
    match r {
        Runtime::Native | Runtime::Wasm => 0,
        Runtime::Gvisor | Runtime::Microvm => 1,
    }
}

fn network_reach(n: &Network) -> u8 {
    match n {
        Network::None => 0,
        Network::Allowlist { .. } => 1,
        Network::Proxy { .. } => 2,
        Network::Host => 3,
    }
}

fn network_mode(n: &Network) -> &'static str {
    match n {
        Network::None => "none",
        Network::Allowlist { .. } => "allowlist",
        Network::Proxy { .. } => "proxy",
        Network::Host => "host",
    }
}

fn deliver_name(d: Deliver) -> &'static str {
    match d {
        Deliver::Proxy => "proxy",
        Deliver::Env => "env",
    }
}

/// Each secret added, removed or changed: a new secret, a longer ttl,
/// another scope, audience, provider or endpoint, and delivery in the
/// environment instead of through the proxy all weaken.
fn diff_secrets(t: &str, old: &[Secret], new: &[Secret], out: &mut Vec<Change>) {
    let names: BTreeSet<&String> = old.iter().chain(new).map(|s| &s.name).collect();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(default)".into());
    for name in names {
        let field = |f: &str| format!("secrets.{name}{f}");
        match (
            old.iter().find(|s| &s.name == name),
            new.iter().find(|s| &s.name == name),
        ) {
            (None, Some(n)) => out.push(change(t, &field(""), ABSENT, &secret_summary(n), true)),
            (Some(o), None) => out.push(change(t, &field(""), &secret_summary(o), ABSENT, false)),
            (Some(o), Some(n)) => {
                if o.scope != n.scope {
                    out.push(change(t, &field(".scope"), &o.scope, &n.scope, true));
                }
                if o.ttl_seconds != n.ttl_seconds {
                    out.push(change(
                        t,
                        &field(".ttl"),
                        &format!("{}s", o.ttl_seconds),
                        &format!("{}s", n.ttl_seconds),
                        n.ttl_seconds > o.ttl_seconds,
                    ));
                }
                if o.provider != n.provider {
                    out.push(change(
                        t,
                        &field(".provider"),
                        &opt(&o.provider),
                        &opt(&n.provider),
                        true,
                    ));
                }
                if o.audience != n.audience {
                    out.push(change(
                        t,
                        &field(".audience"),
                        &opt(&o.audience),
                        &opt(&n.audience),
                        true,
                    ));
                }
                if o.deliver != n.deliver {
                    out.push(change(
                        t,
                        &field(".deliver"),
                        deliver_name(o.deliver),
                        deliver_name(n.deliver),
                        n.deliver == Deliver::Env,
                    ));
                }
                if o.bind != n.bind {
                    let b = |s: &Secret| {
                        s.bind
                            .as_ref()
                            .map(|b| b.describe())
                            .unwrap_or_else(|| ABSENT.into())
                    };
                    out.push(change(t, &field(".bind"), &b(o), &b(n), n.bind.is_some()));
                }
            }
            (None, None) => {}
        }
    }
}

fn secret_summary(s: &Secret) -> String {
    let mut v = format!(
        "scope={} ttl={}s deliver={}",
        s.scope,
        s.ttl_seconds,
        deliver_name(s.deliver)
    );
    if let Some(b) = &s.bind {
        v.push_str(&format!(" bind={}", b.describe()));
    }
    v
}

fn boot_name(b: Boot) -> &'static str {
    match b {
        Boot::Snapshot => "snapshot",
        Boot::Cold => "cold",
    }
}

fn lifetime_name(l: Lifetime) -> &'static str {
    match l {
        Lifetime::Call => "call",
        Lifetime::Session => "session",
        Lifetime::Pool => "pool",
    }
}

fn diff_tool(o: &ToolPolicy, n: &ToolPolicy, out: &mut Vec<Change>) {
    let t = &o.name;
    diff_concurrency(t, o.concurrency, n.concurrency, out);
    if o.profile != n.profile {
        out.push(change(
            t,
            "profile",
            &format!("{:?}", o.profile),
            &format!("{:?}", n.profile),
            n.profile < o.profile,
        ));
    }
    if o.runtime != n.runtime {
        out.push(change(
            t,
            "runtime",
            runtime_name(o.runtime),
            runtime_name(n.runtime),
            runtime_strength(n.runtime) < runtime_strength(o.runtime),
        ));
    }
    diff_exec(t, &o.exec, &n.exec, out);
    diff_limits(t, o.limits, n.limits, out);
    diff_network(t, &o.network, &n.network, out);
    diff_secrets(t, &o.secrets, &n.secrets, out);
    diff_keyed(
        t,
        "tls_passthrough",
        &o.tls_passthrough
            .iter()
            .map(|e| (e.clone(), "passthrough".to_string()))
            .collect(),
        &n.tls_passthrough
            .iter()
            .map(|e| (e.clone(), "passthrough".to_string()))
            .collect(),
        // A tunnelled endpoint is one whose requests the door no longer reads.
        |_, _| true,
        out,
    );
    diff_keyed(
        t,
        "mounts",
        &o.mounts.iter().map(mount_entry).collect(),
        &n.mounts.iter().map(mount_entry).collect(),
        |_, _| true,
        out,
    );
    diff_keyed(t, "env", &o.env, &n.env, |_, _| true, out);
    diff_volumes(t, o, n, out);
    diff_mechanisms(t, &o.require, &n.require, &o.accept, &n.accept, out);
    if o.lifetime != n.lifetime {
        out.push(change(
            t,
            "lifetime",
            lifetime_name(o.lifetime),
            lifetime_name(n.lifetime),
            // Anything but a fresh sandbox per call lets state carry over.
            o.lifetime == Lifetime::Call,
        ));
    }
    if o.boot != n.boot {
        out.push(change(
            t,
            "boot",
            o.boot.map_or(ABSENT, boot_name),
            n.boot.map_or(ABSENT, boot_name),
            // Both start each task in a fresh guest: a restore of a
            // template that ran no task, or a boot.
            false,
        ));
    }
    if o.output_schema != n.output_schema {
        out.push(change(
            t,
            "output_schema",
            if o.output_schema.is_some() {
                "set"
            } else {
                ABSENT
            },
            if n.output_schema.is_some() {
                "changed"
            } else {
                ABSENT
            },
            n.output_schema.is_none(),
        ));
    }
    if o.input_schema != n.input_schema {
        out.push(change(
            t,
            "input_schema",
            if o.input_schema.is_some() {
                "set"
            } else {
                ABSENT
            },
            if n.input_schema.is_some() {
                "changed"
            } else {
                ABSENT
            },
            n.input_schema.is_none(),
        ));
    }
    let (os, ns) = (o.output.strip, n.output.strip);
    for (field, a, b) in [
        ("output.strip.control", os.control, ns.control),
        ("output.strip.ansi", os.ansi, ns.ansi),
        ("output.strip.bidi", os.bidi, ns.bidi),
        ("output.strip.zero_width", os.zero_width, ns.zero_width),
        ("output.strip.tags", os.tags, ns.tags),
        (
            "output.strip_html",
            o.output.strip_html,
            n.output.strip_html,
        ),
        (
            "output.strip_markdown",
            o.output.strip_markdown,
            n.output.strip_markdown,
        ),
        (
            "output.block_secrets",
            o.output.block_secrets,
            n.output.block_secrets,
        ),
    ] {
        if a != b {
            out.push(change(t, field, &a.to_string(), &b.to_string(), a && !b));
        }
    }
    if o.output.kind != n.output.kind || o.output.media_type != n.output.media_type {
        out.push(change(
            t,
            "output.kind",
            &format!("{:?} {:?}", o.output.kind, o.output.media_type),
            &format!("{:?} {:?}", n.output.kind, n.output.media_type),
            false,
        ));
    }
    if o.output.label != n.output.label {
        out.push(change(
            t,
            "output.label",
            &format!("{:?}", o.output.label).to_lowercase(),
            &format!("{:?}", n.output.label).to_lowercase(),
            n.output.label == crate::policy::Label::None,
        ));
    }
    if o.output.invalid_utf8 != n.output.invalid_utf8 {
        out.push(change(
            t,
            "output.invalid_utf8",
            &format!("{:?}", o.output.invalid_utf8).to_lowercase(),
            &format!("{:?}", n.output.invalid_utf8).to_lowercase(),
            false,
        ));
    }
    if o.output.on_overflow != n.output.on_overflow {
        out.push(change(
            t,
            "output.on_overflow",
            &format!("{:?}", o.output.on_overflow),
            &format!("{:?}", n.output.on_overflow),
            false,
        ));
    }
    if o.input != n.input {
        out.push(change(
            t,
            "input",
            &serde_json::to_string(&o.input).unwrap_or_default(),
            &serde_json::to_string(&n.input).unwrap_or_default(),
            // What reaches argv is what the tool acts on.
            n.input.argv.iter().any(|a| !o.input.argv.contains(a)),
        ));
    }
    diff_seccomp(t, &o.seccomp, &n.seccomp, out);
    if o.description != n.description {
        out.push(change(
            t,
            "description",
            &o.description,
            &n.description,
            false,
        ));
    }
}

fn diff_exec(t: &str, o: &Exec, n: &Exec, out: &mut Vec<Change>) {
    if o == n {
        return;
    }
    match (o, n) {
        (
            Exec::Image {
                reference: r1,
                digest: d1,
                command: c1,
            },
            Exec::Image {
                reference: r2,
                digest: d2,
                command: c2,
            },
        ) => {
            if r1 != r2 {
                out.push(change(t, "image", r1, r2, true));
            }
            if d1 != d2 {
                out.push(change(t, "image.digest", d1, d2, true));
            }
            if c1 != c2 {
                let show = |c: &Option<Vec<String>>| {
                    c.as_ref()
                        .map(|v| v.join(" "))
                        .unwrap_or_else(|| "(the image's)".into())
                };
                out.push(change(t, "command", &show(c1), &show(c2), true));
            }
        }
        (
            Exec::Wasm {
                module: m1,
                sha256: s1,
                argv: a1,
                worker: w1,
                function: f1,
            },
            Exec::Wasm {
                module: m2,
                sha256: s2,
                argv: a2,
                worker: w2,
                function: f2,
            },
        ) => {
            if m1 != m2 || s1 != s2 {
                let show = |m: &str, s: &str| format!("{m} (sha256 {s})");
                // The same pinned bytes elsewhere are the same module.
                out.push(change(t, "module", &show(m1, s1), &show(m2, s2), s1 != s2));
            }
            if a1 != a2 {
                out.push(change(t, "command", &a1.join(" "), &a2.join(" "), true));
            }
            if f1 != f2 {
                let show = |f: &Option<String>| f.clone().unwrap_or_else(|| "(command)".into());
                out.push(change(t, "module.function", &show(f1), &show(f2), true));
            }
            if w1 != w2 {
                // A worker's calls share one jail: only Wasm separates them.
                out.push(change(
                    t,
                    "module.worker",
                    &w1.to_string(),
                    &w2.to_string(),
                    *w2,
                ));
            }
        }
        (Exec::Command { argv: a }, Exec::Command { argv: b }) => {
            out.push(change(t, "command", &a.join(" "), &b.join(" "), true));
        }
        (
            Exec::Mcp {
                allow: a1,
                resources: r1,
                prompts: p1,
                expose: e1,
                allow_sampling: s1,
                allow_elicitation: l1,
                ..
            },
            Exec::Mcp {
                allow: a2,
                resources: r2,
                prompts: p2,
                expose: e2,
                allow_sampling: s2,
                allow_elicitation: l2,
                ..
            },
        ) => {
            // The server may then reach the agent's model or user.
            for (field, o, n) in [
                ("mcp.allow_sampling", s1, s2),
                ("mcp.allow_elicitation", l1, l2),
            ] {
                if o != n {
                    out.push(change(t, field, &o.to_string(), &n.to_string(), *n));
                }
            }
            if e1 != e2 {
                // As-is, the server picks the names the model sees.
                out.push(change(
                    t,
                    "mcp.expose",
                    expose_name(*e1),
                    expose_name(*e2),
                    *e2 == Expose::AsIs,
                ));
            }
            let wider = |a: &Option<Vec<String>>, b: &Option<Vec<String>>| match (a, b) {
                (Some(x), Some(y)) => y.iter().any(|e| !x.contains(e)),
                (Some(_), None) => true,
                _ => false,
            };
            let widened = wider(a1, a2) || wider(r1, r2) || wider(p1, p2);
            out.push(change(
                t,
                "mcp",
                &serde_json::to_string(o).unwrap_or_default(),
                &serde_json::to_string(n).unwrap_or_default(),
                // Another server, another image, or more of its tools,
                // resources or prompts exposed.
                widened || !mcp_same_server(o, n),
            ));
        }
        _ => out.push(change(
            t,
            "exec",
            &serde_json::to_string(o).unwrap_or_default(),
            &serde_json::to_string(n).unwrap_or_default(),
            true,
        )),
    }
}

fn expose_name(e: Expose) -> &'static str {
    match e {
        Expose::Prefixed => "prefixed",
        Expose::AsIs => "as-is",
    }
}

fn mcp_same_server(o: &Exec, n: &Exec) -> bool {
    match (o, n) {
        (
            Exec::Mcp {
                command: c1,
                image: i1,
                descriptions: d1,
                ..
            },
            Exec::Mcp {
                command: c2,
                image: i2,
                descriptions: d2,
                ..
            },
        ) => c1 == c2 && i1 == i2 && d1 == d2,
        _ => false,
    }
}

fn diff_limits(t: &str, o: Option<Limits>, n: Option<Limits>, out: &mut Vec<Change>) {
    let (o, n) = match (o, n) {
        (Some(o), Some(n)) => (o, n),
        (Some(_), None) => {
            out.push(change(t, "limits", "enforced", "none (P0)", true));
            return;
        }
        (None, Some(_)) => {
            out.push(change(t, "limits", "none (P0)", "enforced", false));
            return;
        }
        (None, None) => return,
    };
    let secs = |v: u64| format!("{v}s");
    let size = |v: u64| format_size(v);
    let plain = |v: u64| v.to_string();
    let pct = |v: u64| format!("{v}%");
    type Fmt<'a> = &'a dyn Fn(u64) -> String;
    let rows: [(&str, u64, u64, Fmt); 8] = [
        (
            "limits.wall_seconds",
            o.wall.as_secs(),
            n.wall.as_secs(),
            &secs,
        ),
        ("limits.memory", o.memory_bytes, n.memory_bytes, &size),
        ("limits.tasks", o.tasks, n.tasks, &plain),
        (
            "limits.cpu",
            o.cpu_percent.map_or(0, u64::from),
            n.cpu_percent.map_or(0, u64::from),
            &pct,
        ),
        (
            "limits.output_bytes",
            o.output_bytes,
            n.output_bytes,
            &plain,
        ),
        (
            "limits.stderr_bytes",
            o.stderr_bytes,
            n.stderr_bytes,
            &plain,
        ),
        ("limits.nofile", o.nofile, n.nofile, &plain),
        ("limits.disk", o.disk_bytes, n.disk_bytes, &size),
    ];
    for (field, a, b, fmt) in rows {
        if a != b {
            out.push(change(t, field, &fmt(a), &fmt(b), b > a));
        }
    }
}

fn diff_network(t: &str, o: &Network, n: &Network, out: &mut Vec<Change>) {
    if network_mode(o) != network_mode(n) {
        out.push(change(
            t,
            "network",
            network_mode(o),
            network_mode(n),
            network_reach(n) > network_reach(o),
        ));
    }
    let parts = |x: &Network| -> (
        BTreeMap<String, String>,
        BTreeMap<String, String>,
        BTreeMap<String, String>,
    ) {
        match x {
            Network::Allowlist {
                allow,
                resolve,
                allow_cidrs,
            } => (
                allow.iter().map(|a| (a.clone(), String::new())).collect(),
                resolve.clone(),
                allow_cidrs
                    .iter()
                    .map(|a| (a.clone(), String::new()))
                    .collect(),
            ),
            Network::Proxy {
                resolve,
                allow_cidrs,
            } => (
                BTreeMap::new(),
                resolve.clone(),
                allow_cidrs
                    .iter()
                    .map(|a| (a.clone(), String::new()))
                    .collect(),
            ),
            _ => Default::default(),
        }
    };
    let (a1, r1, c1) = parts(o);
    let (a2, r2, c2) = parts(n);
    diff_keyed(t, "egress", &a1, &a2, |_, _| true, out);
    diff_keyed(t, "resolve", &r1, &r2, |_, _| true, out);
    diff_keyed(t, "allow_cidrs", &c1, &c2, |_, _| true, out);
}

fn diff_seccomp(t: &str, o: &Seccomp, n: &Seccomp, out: &mut Vec<Change>) {
    match (o, n) {
        (Seccomp::AllowList { extra: a }, Seccomp::AllowList { extra: b }) => {
            for s in b.iter().filter(|s| !a.contains(s)) {
                out.push(change(t, "seccomp.allow", ABSENT, s, true));
            }
            for s in a.iter().filter(|s| !b.contains(s)) {
                out.push(change(t, "seccomp.allow", s, ABSENT, false));
            }
        }
        (Seccomp::AllowList { .. }, Seccomp::DenyList) => {
            out.push(change(t, "seccomp", "allowlist", "denylist", true));
        }
        (Seccomp::DenyList, Seccomp::AllowList { .. }) => {
            out.push(change(t, "seccomp", "denylist", "allowlist", false));
        }
        (Seccomp::DenyList, Seccomp::DenyList) => {}
    }
}

/// `workspace` and `state`: one added, a larger size, a longer `retain`
/// or a moved mount widens what the tool can keep and weakens; one removed
/// or made smaller does not.
fn diff_volumes(t: &str, o: &ToolPolicy, n: &ToolPolicy, out: &mut Vec<Change>) {
    type Vol = (String, u64, Option<u64>);
    let ws = |p: &ToolPolicy| -> Option<Vol> {
        p.workspace
            .as_ref()
            .map(|w| (w.mount.clone(), w.size_bytes, Some(w.retain_seconds)))
    };
    let st = |p: &ToolPolicy| -> Option<Vol> {
        p.state
            .as_ref()
            .map(|s| (s.mount.clone(), s.size_bytes, None))
    };
    for (field, a, b) in [("workspace", ws(o), ws(n)), ("state", st(o), st(n))] {
        match (a, b) {
            (None, None) => {}
            (None, Some(b)) => out.push(change(t, field, ABSENT, &volume_text(&b), true)),
            (Some(a), None) => out.push(change(t, field, &volume_text(&a), ABSENT, false)),
            (Some(a), Some(b)) => {
                if a.0 != b.0 {
                    out.push(change(t, &format!("{field}.mount"), &a.0, &b.0, true));
                }
                if a.1 != b.1 {
                    out.push(change(
                        t,
                        &format!("{field}.size"),
                        &format_size(a.1),
                        &format_size(b.1),
                        b.1 > a.1,
                    ));
                }
                if a.2 != b.2 {
                    let r = |v: Option<u64>| format!("{}s", v.unwrap_or(0));
                    out.push(change(
                        t,
                        &format!("{field}.retain"),
                        &r(a.2),
                        &r(b.2),
                        b.2 > a.2,
                    ));
                }
            }
        }
    }
}

fn volume_text(v: &(String, u64, Option<u64>)) -> String {
    match v.2 {
        Some(r) if r > 0 => format!("{} {} retain {r}s", v.0, format_size(v.1)),
        _ => format!("{} {}", v.0, format_size(v.1)),
    }
}

/// Compare two keyed sets: an added key always weakens, a removed key never
/// does, a changed value weakens when `changed_weakens(old, new)` says so.
fn mount_entry(m: &crate::policy::Mount) -> (String, String) {
    let v = if m.writable {
        format!("{}:rw", m.src)
    } else {
        m.src.clone()
    };
    (m.dst.clone(), v)
}

/// A mechanism no longer required, or a degradation newly accepted, weakens.
fn diff_mechanisms(
    t: &str,
    o_req: &[Mechanism],
    n_req: &[Mechanism],
    o_acc: &[Mechanism],
    n_acc: &[Mechanism],
    out: &mut Vec<Change>,
) {
    let list = |v: &[Mechanism]| {
        if v.is_empty() {
            ABSENT.to_string()
        } else {
            v.iter().map(|m| m.name()).collect::<Vec<_>>().join(",")
        }
    };
    if o_req != n_req {
        let dropped = o_req.iter().any(|m| !n_req.contains(m));
        out.push(change(t, "require", &list(o_req), &list(n_req), dropped));
    }
    if o_acc != n_acc {
        let added = n_acc.iter().any(|m| !o_acc.contains(m));
        out.push(change(t, "accept", &list(o_acc), &list(n_acc), added));
    }
}

fn diff_keyed(
    t: &str,
    field: &str,
    o: &BTreeMap<String, String>,
    n: &BTreeMap<String, String>,
    changed_weakens: impl Fn(&str, &str) -> bool,
    out: &mut Vec<Change>,
) {
    let show = |k: &str, v: &str| {
        if v.is_empty() {
            k.to_string()
        } else {
            format!("{k}={v}")
        }
    };
    for (k, v) in n {
        match o.get(k) {
            None => out.push(change(t, field, ABSENT, &show(k, v), true)),
            Some(ov) if ov != v => out.push(change(
                t,
                field,
                &show(k, ov),
                &show(k, v),
                changed_weakens(ov, v),
            )),
            _ => {}
        }
    }
    for (k, v) in o {
        if !n.contains_key(k) {
            out.push(change(t, field, &show(k, v), ABSENT, false));
        }
    }
}

/// The tool name [`Change`]s of the gateway section carry.
pub const GATEWAY_CHANGE: &str = "(gateway)";

fn bound(v: Option<impl ToString>) -> String {
    v.map(|n| n.to_string())
        .unwrap_or_else(|| "unbounded".into())
}

/// A cap that is raised or removed loosens it.
fn looser(old: Option<u64>, new: Option<u64>) -> bool {
    match (old, new) {
        (Some(_), None) => true,
        (Some(o), Some(n)) => n > o,
        _ => false,
    }
}

/// Changes of the gateway section: a longer idle timeout or grace keeps
/// sandboxes of gone clients longer, and a raised or removed cap lets a
/// caller take more; each weakens.
pub fn diff_gateway(old: &GatewayPolicy, new: &GatewayPolicy, out: &mut Vec<Change>) {
    let mut push = |field: &str, o: String, n: String, weakens: bool| {
        if o != n {
            out.push(Change {
                tool: GATEWAY_CHANGE.into(),
                field: field.into(),
                old: o,
                new: n,
                weakens,
            });
        }
    };
    push(
        "idle_timeout",
        format!("{}s", old.idle_timeout_seconds),
        format!("{}s", new.idle_timeout_seconds),
        new.idle_timeout_seconds > old.idle_timeout_seconds,
    );
    push(
        "disconnect_grace",
        format!("{}s", old.disconnect_grace_seconds),
        format!("{}s", new.disconnect_grace_seconds),
        new.disconnect_grace_seconds > old.disconnect_grace_seconds,
    );
    push(
        "reprobe.every",
        format!("{}s", old.reprobe.every_seconds),
        format!("{}s", new.reprobe.every_seconds),
        new.reprobe.every_seconds > old.reprobe.every_seconds,
    );
    push(
        "reprobe.jitter",
        format!("{}%", old.reprobe.jitter_percent),
        format!("{}%", new.reprobe.jitter_percent),
        false,
    );
    push(
        "max_sandboxes",
        bound(old.max_sandboxes),
        bound(new.max_sandboxes),
        looser(old.max_sandboxes, new.max_sandboxes),
    );
    let (o, n) = (&old.per_principal, &new.per_principal);
    push(
        "per_principal.calls_per_minute",
        bound(o.calls_per_minute),
        bound(n.calls_per_minute),
        looser(
            o.calls_per_minute.map(u64::from),
            n.calls_per_minute.map(u64::from),
        ),
    );
    let mut count = |field: &str, o: Option<u32>, n: Option<u32>| {
        push(
            field,
            bound(o),
            bound(n),
            looser(o.map(u64::from), n.map(u64::from)),
        )
    };
    count("per_principal.sessions", o.sessions, n.sessions);
    count(
        "per_principal.calls_in_flight",
        o.calls_in_flight,
        n.calls_in_flight,
    );
    count("per_principal.sandboxes", o.sandboxes, n.sandboxes);
    let (o, n) = (&old.per_tenant, &new.per_tenant);
    count(
        "per_tenant.calls_in_flight",
        o.calls_in_flight,
        n.calls_in_flight,
    );
    count("per_tenant.sandboxes", o.sandboxes, n.sandboxes);
}

/// Changes of a tool's concurrency cap (raised or removed weakens).
pub fn diff_concurrency(
    tool: &str,
    old: Option<Concurrency>,
    new: Option<Concurrency>,
    out: &mut Vec<Change>,
) {
    let (om, nm) = (
        old.map(|c| u64::from(c.max_concurrent)),
        new.map(|c| u64::from(c.max_concurrent)),
    );
    if om != nm {
        out.push(Change {
            tool: tool.into(),
            field: "max_concurrent".into(),
            old: bound(om),
            new: bound(nm),
            weakens: looser(om, nm),
        });
    }
    if let (Some(o), Some(n)) = (old, new)
        && o.queue_seconds != n.queue_seconds
    {
        out.push(Change {
            tool: tool.into(),
            field: "queue_seconds".into(),
            old: o.queue_seconds.to_string(),
            new: n.queue_seconds.to_string(),
            weakens: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::PrincipalCaps;

    #[test]
    fn raised_and_removed_caps_weaken() {
        let a = GatewayPolicy {
            max_sandboxes: Some(10),
            per_principal: PrincipalCaps {
                calls_per_minute: Some(60),
                sessions: Some(4),
                calls_in_flight: Some(3),
                sandboxes: Some(2),
            },
            per_tenant: crate::gateway::TenantCaps {
                calls_in_flight: Some(6),
                sandboxes: Some(4),
            },
            ..GatewayPolicy::default()
        };
        let mut b = a.clone();
        b.max_sandboxes = None;
        b.per_principal.sessions = Some(8);
        b.per_principal.calls_per_minute = Some(30);
        b.per_principal.calls_in_flight = None;
        b.per_principal.sandboxes = Some(1);
        b.per_tenant.sandboxes = Some(5);
        b.per_tenant.calls_in_flight = Some(6);
        b.idle_timeout_seconds = 3600;
        let mut out = Vec::new();
        diff_gateway(&a, &b, &mut out);
        let weak: Vec<&str> = out
            .iter()
            .filter(|c| c.weakens)
            .map(|c| c.field.as_str())
            .collect();
        assert_eq!(
            weak,
            [
                "idle_timeout",
                "max_sandboxes",
                "per_principal.sessions",
                "per_principal.calls_in_flight",
                "per_tenant.sandboxes"
            ]
        );
        assert!(
            out.iter()
                .any(|c| c.field == "per_principal.calls_per_minute" && !c.weakens)
        );
        assert!(
            out.iter()
                .any(|c| c.field == "per_principal.sandboxes" && !c.weakens)
        );
        assert!(!out.iter().any(|c| c.field == "per_tenant.calls_in_flight"));
    }
}
