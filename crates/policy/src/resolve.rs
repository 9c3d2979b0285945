//! From manifest to resolved policy: parse, apply the profile rules, fill
//! in defaults. A manifest cannot claim a profile it does not meet: every
//! rule below is checked at load, and each is one function in [`RULES`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use crate::error::{Diagnostic, ManifestError};
use crate::manifest::{self, Egress, Manifest, Mechanism, Profile, Runtime, Tool};
use crate::policy::{
    self, Exec, Expose, Limits, Network, PolicySet, ToolPolicy, invalid_name_reason,
};
use crate::units::{parse_cpu, parse_duration, parse_size};

/// A loaded manifest: the resolved policies and the warnings `cordon check` prints.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub policy: PolicySet,
    pub warnings: Vec<Diagnostic>,
    /// Where each secret is declared, by (tool, secret name): line and
    /// column, for diagnostics made after resolution (an unknown provider).
    pub secret_at: BTreeMap<(String, String), (u64, u64)>,
    /// Where each tool is declared (its key under `tools:`): line and
    /// column, for diagnostics made after resolution (`cordon check`'s
    /// admission on this host).
    pub tool_at: BTreeMap<String, (u64, u64)>,
    /// Where each mount is written, by (tool, host source path): line and
    /// column.
    pub mount_at: BTreeMap<(String, String), (u64, u64)>,
}

/// Profile defaults for every limit. P0 has none: nothing enforces them.
pub fn default_limits(profile: Profile) -> Option<Limits> {
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    match profile {
        Profile::P0 => None,
        Profile::P1 => Some(Limits::P1),
        Profile::P2 => Some(Limits {
            wall: Duration::from_secs(30),
            memory_bytes: 256 * M,
            tasks: 64,
            cpu_percent: Some(100),
            output_bytes: 2_000_000,
            stderr_bytes: 64 << 10,
            nofile: 1024,
            disk_bytes: 64 * M,
        }),
        Profile::P3 => Some(Limits {
            wall: Duration::from_secs(120),
            memory_bytes: 2 * G,
            tasks: 256,
            cpu_percent: Some(200),
            output_bytes: 8_000_000,
            stderr_bytes: 256 << 10,
            nofile: 4096,
            disk_bytes: 512 * M,
        }),
    }
}

/// The mechanisms each profile requires by default: a tool whose runtime
/// cannot fully enforce one on this host is refused unless the manifest
/// accepts the degradation. P0 has no sandbox and requires nothing; every
/// sandbox needs its namespaces, a read-only root, an isolated network and
/// seccomp; P2 and P3 also need cgroup limits (a long-lived server or a
/// build capped by rlimits alone is too weak).
pub fn default_requirements(profile: Profile) -> &'static [Mechanism] {
    use Mechanism::*;
    match profile {
        Profile::P0 => &[],
        Profile::P1 => &[Namespaces, ReadonlyRoot, Network, Seccomp],
        Profile::P2 | Profile::P3 => &[Namespaces, ReadonlyRoot, Network, Seccomp, Cgroup],
    }
}

/// The PATH every sandboxed tool gets.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// Load and resolve a manifest file.
pub fn load(path: &Path) -> Result<Loaded, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|e| ManifestError::Io {
        path: path.to_path_buf(),
        source: std::sync::Arc::new(e),
    })?;
    load_str(path, &text)
}

/// Load and resolve manifest text; `path` is used in diagnostics only.
pub fn load_str(path: &Path, text: &str) -> Result<Loaded, ManifestError> {
    let manifest = parse(path, text)?;
    resolve(path, &manifest)
}

fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 200_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_depth: 64,
        },
    };
    serde_saphyr::from_str_with_options::<Manifest>(text, options).map_err(|e| {
        let y = cordon_config::yaml_error(&e);
        let hint = parse_hint(&y.message);
        ManifestError::Invalid(vec![Diagnostic {
            file: path.to_path_buf(),
            line: y.line,
            column: y.column,
            tool: None,
            message: y.message,
            hint,
        }])
    })
}

/// What would be right for the parse errors people make most.
fn parse_hint(message: &str) -> Option<String> {
    if message.contains("unknown field") {
        Some(
            "unknown keys are refused so that a typo cannot weaken a policy; \
             `cordon schema` prints every key the manifest accepts"
                .to_string(),
        )
    } else if message.contains("did not match any variant") || message.contains("unknown variant") {
        Some("see `cordon schema` for the accepted values".to_string())
    } else {
        None
    }
}

/// One profile rule: checks a tool and reports what it does not meet.
type Rule = fn(&Ctx<'_>) -> Vec<Diagnostic>;

/// Every rule, in the order its diagnostics are reported.
const RULES: &[Rule] = &[
    rule_one_exec,
    rule_network_exclusive,
    rule_p1_no_network,
    rule_p1_no_secrets,
    rule_p2_explicit_allowlist,
    rule_p3_runtime,
    rule_wasm,
    rule_pool,
    rule_boot,
    rule_image_pinned,
    rule_egress_entries,
    rule_resolve_and_cidrs,
    rule_secrets_wellformed,
    rule_secret_delivery,
    rule_tls_passthrough,
    rule_mounts,
    rule_volumes,
    rule_env,
    rule_output,
    rule_input,
    rule_mcp_names,
];

struct Ctx<'a> {
    file: &'a Path,
    manifest: &'a Manifest,
    name: &'a str,
    tool: &'a Tool,
    at: Location,
}

impl Ctx<'_> {
    fn diag(&self, at: Location, message: String, hint: Option<&str>) -> Diagnostic {
        let (line, column) = if at == Location::UNKNOWN {
            (self.at.line(), self.at.column())
        } else {
            (at.line(), at.column())
        };
        Diagnostic {
            file: self.file.to_path_buf(),
            line,
            column,
            tool: Some(self.name.to_string()),
            message,
            hint: hint.map(str::to_string),
        }
    }
    fn profile(&self) -> Profile {
        self.tool.profile.value
    }
    fn profile_at(&self) -> Location {
        self.tool.profile.referenced
    }
    fn egress(&self) -> Option<&Spanned<Egress>> {
        self.tool.egress.as_ref()
    }
    fn secrets(&self) -> &[Spanned<manifest::Secret>] {
        self.tool
            .secrets
            .as_ref()
            .map(|s| s.value.as_slice())
            .unwrap_or(&[])
    }
    fn secrets_at(&self) -> Location {
        self.tool
            .secrets
            .as_ref()
            .map(|s| s.referenced)
            .unwrap_or(self.at)
    }
}

fn rule_one_exec(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let t = c.tool;
    // `command` with `image` replaces the image's Entrypoint and Cmd.
    let n = [
        t.command.is_some() && t.image.is_none(),
        t.image.is_some(),
        t.mcp.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    let mut out = Vec::new();
    if n > 1 || (t.mcp.is_some() && t.command.is_some()) {
        out.push(c.diag(
            c.at,
            "declares more than one of `command`, `image` and `mcp`; one says what runs (`command` beside `image` replaces the image's entrypoint)".into(),
            Some("write `command: [\"/path/to/tool\", \"arg\"]`, `image: name@sha256:<digest>`, or `mcp: {command: [...]}`"),
        ));
    }
    if let Some(cmd) = &t.command
        && (cmd.is_empty() || cmd[0].is_empty())
    {
        out.push(c.diag(
            c.at,
            "`command` is empty".into(),
            Some("give the program and its arguments, e.g. [\"/usr/bin/pdftotext\", \"-\", \"-\"]"),
        ));
    }
    if let Some(m) = &t.mcp
        && m.command.is_none()
        && m.image.is_none()
    {
        out.push(c.diag(
            c.at,
            "`mcp` needs `command` or `image` (with `image`, `command` replaces the image's entrypoint)".into(),
            None,
        ));
    }
    out
}

fn rule_network_exclusive(c: &Ctx<'_>) -> Vec<Diagnostic> {
    match (&c.tool.network, c.egress()) {
        (Some(n), Some(_)) => vec![c.diag(
            n.referenced,
            "both `network: none` and `egress` are set".into(),
            Some("keep `network: none` for no network, or `egress` for an allowlist, not both"),
        )],
        _ => vec![],
    }
}

fn rule_p1_no_network(c: &Ctx<'_>) -> Vec<Diagnostic> {
    match (c.profile(), c.egress()) {
        (Profile::P1, Some(e)) => vec![c.diag(
            e.referenced,
            "profile P1 requires `network: none`, but `egress` is set".into(),
            Some("a parser jail has no network: remove `egress`, or move the tool to P2 (a security change that needs review)"),
        )],
        _ => vec![],
    }
}

fn rule_p1_no_secrets(c: &Ctx<'_>) -> Vec<Diagnostic> {
    if c.profile() == Profile::P1 && !c.secrets().is_empty() {
        return vec![c.diag(
            c.secrets_at(),
            format!(
                "profile P1 allows no secrets, but {} declared",
                c.secrets().len()
            ),
            Some("write `secrets: []`; a tool that needs a credential belongs in P2"),
        )];
    }
    vec![]
}

fn rule_p2_explicit_allowlist(c: &Ctx<'_>) -> Vec<Diagnostic> {
    if c.profile() != Profile::P2 {
        return vec![];
    }
    match (c.egress(), &c.tool.network) {
        (Some(e), _) if matches!(e.value, Egress::Proxy(_)) => vec![c.diag(
            e.referenced,
            "profile P2 requires egress as an explicit host:port allowlist, not `proxy`".into(),
            Some("write `egress: [\"api.example.com:443\"]`; open proxy egress is for P3 runtimes"),
        )],
        (Some(e), _) if matches!(&e.value, Egress::Allow(v) if v.is_empty()) => vec![c.diag(
            e.referenced,
            "`egress: []` allows nothing".into(),
            Some("write `network: none` for no network"),
        )],
        (None, None) => vec![c.diag(
            c.profile_at(),
            "profile P2 requires `egress: [host:port, ...]` (or `network: none`)".into(),
            Some("name the one API the server fronts, e.g. `egress: [\"jira.example.com:443\"]`"),
        )],
        _ => vec![],
    }
}

/// `runtime: wasm` runs a pinned `module` (and nothing else) for P1; a
/// `module` belongs to `runtime: wasm`.
fn rule_wasm(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let t = c.tool;
    let wasm = t.runtime.as_ref().map(|r| r.value) == Some(Runtime::Wasm);
    let mut out = Vec::new();
    match (&t.module, wasm) {
        (None, true) => out.push(c.diag(
            t.runtime.as_ref().map(|r| r.referenced).unwrap_or(c.at),
            "`runtime: wasm` needs `module: {path: ..., sha256: ...}`".into(),
            Some("give the WASI preview 1 module and its sha256 (`sha256sum FILE.wasm`)"),
        )),
        (Some(m), false) => out.push(c.diag(
            m.referenced,
            "`module` is run by `runtime: wasm` only".into(),
            Some("add `runtime: wasm`, or remove `module`"),
        )),
        (Some(m), true) => {
            let h = &m.value.sha256;
            if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.push(c.diag(
                    m.referenced,
                    format!(
                        "module sha256 `{h}` is not 64 hex digits: the module cannot be verified"
                    ),
                    Some("write the output of `sha256sum FILE.wasm`"),
                ));
            }
            if m.value.path.is_empty() {
                out.push(c.diag(m.referenced, "module path is empty".into(), None));
            }
            if t.image.is_some() || t.mcp.is_some() {
                out.push(c.diag(
                    m.referenced,
                    "a wasm tool runs its `module`, not an `image` or `mcp` server".into(),
                    None,
                ));
            }
            if let Some(f) = &m.value.function {
                if f.is_empty() {
                    out.push(c.diag(m.referenced, "module function is empty".into(), None));
                }
                for (key, given, why) in [
                    (
                        "input",
                        t.input.is_some(),
                        "its arguments are its parameters, given as one JSON object",
                    ),
                    (
                        "command",
                        t.command.is_some(),
                        "it is called, not run with an argv",
                    ),
                ] {
                    if given {
                        out.push(c.diag(
                            m.referenced,
                            format!(
                                "`{key}` does not apply to a typed function (`function: {f}`): {why}"
                            ),
                            Some(&format!("remove `{key}`")),
                        ));
                    }
                }
            }
        }
        (None, false) => {}
    }
    if wasm && c.profile() != Profile::P1 {
        out.push(c.diag(
            c.profile_at(),
            format!(
                "`runtime: wasm` runs P1 tools only (a parser jail: no network, no secrets), not {:?}",
                c.profile()
            ),
            Some("write `profile: P1`"),
        ));
    }
    out
}

fn rule_p3_runtime(c: &Ctx<'_>) -> Vec<Diagnostic> {
    if c.profile() != Profile::P3 {
        return vec![];
    }
    let rt = c.tool.runtime.as_ref();
    match rt.map(|r| r.value) {
        Some(Runtime::Gvisor) | Some(Runtime::Microvm) => vec![],
        other => vec![c.diag(
            rt.map(|r| r.referenced).unwrap_or(c.profile_at()),
            format!(
                "profile P3 requires `runtime: gvisor` or `runtime: microvm`, found {}",
                match other {
                    Some(_) => "`runtime: native`",
                    None => "no runtime (native by default)",
                }
            ),
            Some("P3 tools run attacker-authored content and need a separate kernel boundary"),
        )],
    }
}

fn rule_boot(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let t = c.tool;
    let Some(boot) = &t.boot else {
        return vec![];
    };
    if t.runtime.as_ref().map(|r| r.value) == Some(Runtime::Microvm) {
        return vec![];
    }
    vec![c.diag(
        boot.referenced,
        "`boot:` applies only to `runtime: microvm` (how each task's guest starts)".into(),
        Some("remove `boot:`, or write `runtime: microvm`"),
    )]
}

fn rule_pool(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let t = c.tool;
    let pooled = t.lifetime == Some(manifest::Lifetime::Pool);
    let mut out = Vec::new();
    if t.pool.is_some() && !pooled {
        out.push(c.diag(
            c.profile_at(),
            "`pool:` applies only with `lifetime: pool`".into(),
            Some("write `lifetime: pool`, or remove `pool:`"),
        ));
    }
    if pooled && t.mcp.is_some() {
        out.push(c.diag(
            c.profile_at(),
            "`lifetime: pool` is for tools called once per task, not `mcp:` servers".into(),
            Some("an MCP server's sandbox lives for its session (`lifetime: session`)"),
        ));
    }
    if let Some(w) = t.mcp.as_ref().and_then(|m| m.warm.as_ref()) {
        let at = w.referenced;
        if t.lifetime.is_some_and(|l| l != manifest::Lifetime::Session) {
            out.push(c.diag(
                at,
                "`mcp: {warm: N}` applies only with `lifetime: session`: a warm sandbox is handed to one session".into(),
                Some("remove `lifetime:` (an MCP server's default is `session`), or remove `warm:`"),
            ));
        }
        if w.value > policy::MAX_WARM {
            out.push(c.diag(
                at,
                format!(
                    "`mcp: {{warm: {}}}` keeps more than {} sandboxes ready",
                    w.value,
                    policy::MAX_WARM
                ),
                Some("give at most 8; each is a running server"),
            ));
        }
        if w.value > 0 && t.secrets.as_ref().is_some_and(|s| !s.value.is_empty()) {
            out.push(c.diag(
                at,
                "`mcp: {warm: N}` cannot be given secrets: they are minted for the session, and a warm sandbox is made before it".into(),
                Some("remove `warm:`, or the secrets"),
            ));
        }
        if w.value > 0 && t.workspace.is_some() {
            out.push(c.diag(
                at,
                "`mcp: {warm: N}` cannot be given a session workspace: a warm sandbox is made before the session".into(),
                Some("remove `warm:`, or the workspace"),
            ));
        }
    }
    if pooled && t.pool.is_some_and(|p| p.size == 0) {
        out.push(c.diag(
            c.profile_at(),
            "`pool: {size: 0}` keeps nothing ready".into(),
            Some("give a size of 1 or more, or write `lifetime: call`"),
        ));
    }
    out
}

/// Split `name@sha256:hex` into (reference, digest); Err says why not.
pub fn split_digest(image: &str) -> Result<(String, String), String> {
    let Some((name, digest)) = image.rsplit_once('@') else {
        let base = image
            .rsplit_once(':')
            .filter(|(_, tag)| !tag.contains('/'))
            .map(|(n, _)| n)
            .unwrap_or(image);
        return Err(format!(
            "image `{image}` is not pinned by digest: write it as `{base}@sha256:<64 hex digits>` (a tag can move)"
        ));
    };
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(format!(
            "image `{image}` has digest `{digest}`: write it as `{name}@sha256:<64 hex digits>`"
        ));
    };
    let body = hex.trim_end_matches("...").trim_end_matches('…');
    if body.is_empty() || !body.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "image `{image}`: digest must be `sha256:` followed by 64 hex digits"
        ));
    }
    Ok((name.to_string(), digest.to_string()))
}

/// True when a digest is the full 64 hex digits (not an abbreviation).
pub fn digest_is_complete(digest: &str) -> bool {
    digest
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

fn rule_image_pinned(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if let Some(img) = &c.tool.image
        && let Err(m) = split_digest(&img.value)
    {
        out.push(c.diag(img.referenced, m, None));
    }
    if let Some(img) = c.tool.mcp.as_ref().and_then(|m| m.image.as_ref())
        && let Err(m) = split_digest(img)
    {
        out.push(c.diag(c.at, m, None));
    }
    out
}

/// Validate `host:port` (IPv6 in brackets); returns the text unchanged.
pub fn check_host_port(entry: &str) -> Result<(), String> {
    let hint = "write `host:port`, e.g. `api.example.com:443` or `[2001:db8::1]:443`";
    if entry.contains('*') {
        return Err(format!(
            "egress entry `{entry}`: an allowlist names hosts, never a wildcard; for a tool that must reach any host, write `egress: proxy` (P3 only: every destination goes through the filtering proxy and is logged), otherwise {hint}"
        ));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| format!("egress entry `{entry}` is not host:port; {hint}"))?;
        h.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("egress entry `{entry}`: `{h}` is not an IPv6 address"))?;
        (h, p)
    } else {
        entry
            .rsplit_once(':')
            .ok_or_else(|| format!("egress entry `{entry}` has no port; {hint}"))?
    };
    if host.is_empty() || host.contains('@') || host.contains('/') || host.contains('*') {
        return Err(format!(
            "egress entry `{entry}`: `{host}` is not a host name (no userinfo, paths or wildcards); {hint}"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!(
            "egress entry `{entry}`: port `{port}` is not 1-65535; {hint}"
        )),
    }
}

fn rule_egress_entries(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let Some(e) = c.egress() else { return vec![] };
    let Egress::Allow(list) = &e.value else {
        return vec![];
    };
    list.iter()
        .filter_map(|entry| check_host_port(entry).err())
        .map(|m| c.diag(e.referenced, m, None))
        .collect()
}

/// Parse `a.b.c.d/n` or `v6/n`.
pub fn check_cidr(s: &str) -> Result<(), String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a CIDR: write e.g. 10.1.2.0/24"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("`{s}`: `{ip}` is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match len.parse::<u8>() {
        Ok(n) if n <= max => Ok(()),
        _ => Err(format!("`{s}`: prefix length must be 0-{max}")),
    }
}

fn rule_resolve_and_cidrs(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let t = c.tool;
    if (!t.resolve.is_empty() || !t.allow_cidrs.is_empty()) && t.egress.is_none() {
        out.push(c.diag(
            c.at,
            "`resolve` and `allow_cidrs` apply only to a tool with `egress`".into(),
            Some("remove them, or grant egress"),
        ));
    }
    for (name, ip) in &t.resolve {
        if ip.parse::<IpAddr>().is_err() {
            out.push(c.diag(
                c.at,
                format!("resolve `{name}`: `{ip}` is not an IP address"),
                None,
            ));
        }
    }
    for cidr in &t.allow_cidrs {
        if let Err(m) = check_cidr(cidr) {
            out.push(c.diag(c.at, format!("allow_cidrs: {m}"), None));
        }
    }
    out
}

fn rule_secrets_wellformed(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for ss in c.secrets() {
        let (s, at) = (&ss.value, ss.referenced);
        let ok_name = !s.name.is_empty()
            && s.name
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_')
            && !s.name.starts_with(|ch: char| ch.is_ascii_digit());
        if !ok_name {
            out.push(c.diag(
                at,
                format!(
                    "secret name `{}` is not an environment variable name",
                    s.name
                ),
                Some("use upper case letters, digits and _, e.g. JIRA_TOKEN"),
            ));
        }
        if !seen.insert(s.name.as_str()) {
            out.push(c.diag(at, format!("secret `{}` is declared twice", s.name), None));
        }
        if c.tool.env.contains_key(&s.name) {
            out.push(c.diag(
                at,
                format!("secret `{}` is also set in `env`", s.name),
                Some("a secret's variable is the broker's to fill; remove it from `env`"),
            ));
        }
        if s.ttl == 0 {
            out.push(c.diag(
                at,
                format!("secret `{}` has ttl 0", s.name),
                Some("give a lifetime in seconds, e.g. ttl: 900"),
            ));
        }
        if s.scope.trim().is_empty() {
            out.push(c.diag(
                at,
                format!("secret `{}` has an empty scope", s.name),
                Some("name what the credential may do, e.g. scope: \"read:issues\""),
            ));
        }
        if let Some(p) = &s.provider
            && (p.is_empty()
                || !p
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'))
        {
            out.push(c.diag(
                at,
                format!(
                    "secret `{}`: provider `{p}` must be letters, digits, `_` or `-`",
                    s.name
                ),
                None,
            ));
        }
    }
    out
}

fn rule_secret_delivery(c: &Ctx<'_>) -> Vec<Diagnostic> {
    if c.profile() == Profile::P1 {
        // Refused outright by rule_p1_no_secrets.
        return vec![];
    }
    c.secrets()
        .iter()
        .filter_map(|s| resolve_secret(c, s).err())
        .collect()
}

fn rule_tls_passthrough(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let allow = allow_entries(c);
    for e in &c.tool.tls_passthrough {
        match split_endpoint(&e.value) {
            Err(m) => out.push(c.diag(e.referenced, format!("tls_passthrough: {m}"), None)),
            Ok(hp) if !allow.contains(&hp) => out.push(c.diag(
                e.referenced,
                format!(
                    "tls_passthrough `{}` is not in the tool's egress allowlist",
                    e.value
                ),
                Some("name an entry of `egress:`; passthrough only changes how an allowed endpoint is handled"),
            )),
            Ok(_) => {}
        }
    }
    out
}

/// `host:port` (IPv6 in brackets) as (normalised host, port).
pub fn split_endpoint(entry: &str) -> Result<(String, u16), String> {
    check_host_port(entry)?;
    let (host, port) = match entry.strip_prefix('[') {
        Some(rest) => rest
            .split_once("]:")
            .ok_or_else(|| format!("`{entry}` is not host:port"))?,
        None => entry
            .rsplit_once(':')
            .ok_or_else(|| format!("`{entry}` is not host:port"))?,
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("`{entry}`: port `{port}` is not 1-65535"))?;
    Ok((host.trim_end_matches('.').to_ascii_lowercase(), port))
}

/// The tool's egress allowlist entries, normalised (empty for `proxy` or
/// no egress).
fn allow_entries(c: &Ctx<'_>) -> Vec<(String, u16)> {
    match c.egress().map(|e| &e.value) {
        Some(Egress::Allow(list)) => list.iter().filter_map(|e| split_endpoint(e).ok()).collect(),
        _ => Vec::new(),
    }
}

/// A header line `Name: value` whose value holds `{token}` exactly once.
fn parse_header_template(h: &str) -> Result<(String, String), String> {
    let (name, template) = h
        .split_once(':')
        .ok_or_else(|| format!("header `{h}` is not `Name: value`"))?;
    let (name, template) = (name.trim(), template.trim());
    let token_char = |ch: char| ch.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(ch);
    if name.is_empty() || !name.chars().all(token_char) {
        return Err(format!("header `{h}`: `{name}` is not a header name"));
    }
    if template.matches("{token}").count() != 1 {
        return Err(format!(
            "header `{h}`: the value must contain `{{token}}` exactly once"
        ));
    }
    if template.chars().any(|ch| ch.is_control()) {
        return Err(format!("header `{h}`: control characters in the value"));
    }
    Ok((name.to_string(), template.to_string()))
}

/// One secret as resolved: its delivery and, for the proxy, its binding.
fn resolve_secret(
    c: &Ctx<'_>,
    ss: &Spanned<manifest::Secret>,
) -> Result<policy::Secret, Diagnostic> {
    let (s, at) = (&ss.value, ss.referenced);
    let err = |m: String, hint: Option<&str>| c.diag(at, format!("secret `{}`: {m}", s.name), hint);
    let deliver = s.deliver.unwrap_or(manifest::Deliver::Proxy);
    let bind = match deliver {
        manifest::Deliver::Env => {
            if s.bind.is_some() {
                return Err(err(
                    "`bind` applies to `deliver: proxy`; with `deliver: env` the tool holds the token itself".into(),
                    None,
                ));
            }
            None
        }
        manifest::Deliver::Proxy => {
            let b = s.bind.clone().unwrap_or(manifest::Bind {
                endpoint: None,
                path: None,
                header: None,
                basic: None,
                query: None,
            });
            let allow = allow_entries(c);
            let (host, port) = match &b.endpoint {
                Some(e) => {
                    let hp =
                        split_endpoint(e).map_err(|m| err(format!("bind.endpoint: {m}"), None))?;
                    if !allow.contains(&hp) {
                        return Err(err(
                            format!("bind.endpoint `{e}` is not in the tool's egress allowlist"),
                            Some("bind the secret to one of the `egress:` entries"),
                        ));
                    }
                    hp
                }
                None => match allow.as_slice() {
                    [one] => one.clone(),
                    [] => {
                        return Err(err(
                            "delivered by the proxy (the default), but the tool has no egress allowlist to bind it to".into(),
                            Some("give `egress: [host:port]` and `bind: {endpoint: host:port}`, or `deliver: env`"),
                        ));
                    }
                    _ => {
                        return Err(err(
                            format!(
                                "the tool has {} egress entries; say which one the secret is for",
                                allow.len()
                            ),
                            Some("add `bind: {endpoint: \"host:port\"}`"),
                        ));
                    }
                },
            };
            let passthrough = c
                .tool
                .tls_passthrough
                .iter()
                .filter_map(|e| split_endpoint(&e.value).ok())
                .any(|hp| hp == (host.clone(), port));
            if passthrough {
                return Err(err(
                    "bound to a `tls_passthrough` endpoint, whose requests the door never reads"
                        .into(),
                    Some("remove the endpoint from `tls_passthrough`, or use `deliver: env`"),
                ));
            }
            if let Some(p) = &b.path
                && (!p.starts_with('/') || p.chars().any(|ch| ch.is_control() || ch == ' '))
            {
                return Err(err(
                    format!("bind.path `{p}` must start with `/` (no spaces)"),
                    None,
                ));
            }
            let n = [b.header.is_some(), b.basic.is_some(), b.query.is_some()]
                .iter()
                .filter(|x| **x)
                .count();
            if n > 1 {
                return Err(err(
                    "give at most one of `bind.header`, `bind.basic` and `bind.query`".into(),
                    None,
                ));
            }
            let placement = if let Some(h) = &b.header {
                let (name, template) =
                    parse_header_template(h).map_err(|m| err(format!("bind.{m}"), None))?;
                policy::Placement::Header { name, template }
            } else if let Some(u) = &b.basic {
                if u.is_empty() || u.contains(':') || u.chars().any(|ch| ch.is_control()) {
                    return Err(err(
                        format!("bind.basic `{u}` is not a user name (no `:`)"),
                        None,
                    ));
                }
                policy::Placement::Basic {
                    username: u.clone(),
                }
            } else if let Some(q) = &b.query {
                if q.is_empty()
                    || !q
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-._~".contains(ch))
                {
                    return Err(err(
                        format!("bind.query `{q}` is not a parameter name"),
                        None,
                    ));
                }
                policy::Placement::Query { param: q.clone() }
            } else {
                policy::Placement::Header {
                    name: "Authorization".into(),
                    template: "Bearer {token}".into(),
                }
            };
            Some(policy::SecretBinding {
                host,
                port,
                path: b.path.clone(),
                placement,
            })
        }
    };
    Ok(policy::Secret {
        name: s.name.clone(),
        scope: s.scope.clone(),
        ttl_seconds: s.ttl,
        provider: s.provider.clone(),
        audience: s.audience.clone(),
        deliver,
        bind,
    })
}

/// A mount as written: `src`, `src:dst`, `src:dst:ro` or `src:dst:rw`
/// (or the long form). Anything else is an error.
fn parse_mount(m: &manifest::Mount) -> Result<policy::Mount, String> {
    let (src, dst, mode) = match m {
        manifest::Mount::Short(s) => {
            let parts: Vec<&str> = s.split(':').collect();
            match parts.as_slice() {
                [src] => (src.to_string(), src.to_string(), None),
                [src, dst] => (src.to_string(), dst.to_string(), None),
                [src, dst, mode] => {
                    let mode = match *mode {
                        "ro" => manifest::MountMode::Ro,
                        "rw" => manifest::MountMode::Rw,
                        other => {
                            return Err(format!(
                                "mount `{s}`: `{other}` is not a mode (write `ro` or `rw`)"
                            ));
                        }
                    };
                    (src.to_string(), dst.to_string(), Some(mode))
                }
                _ => {
                    return Err(format!(
                        "mount `{s}` has {} `:`-separated parts; write `src`, `src:dst` or `src:dst:ro|rw`",
                        parts.len()
                    ));
                }
            }
        }
        manifest::Mount::Long(l) => (
            l.src.clone(),
            l.dst.clone().unwrap_or_else(|| l.src.clone()),
            l.mode,
        ),
    };
    for (what, p) in [("source", &src), ("target", &dst)] {
        if p.is_empty() {
            return Err(format!("mount {what} is empty"));
        }
    }
    Ok(policy::Mount {
        src,
        dst,
        writable: mode == Some(manifest::MountMode::Rw),
    })
}

const RESERVED_DSTS: &[&str] = &["/", "/proc", "/dev", "/sys", "/tmp", "/etc"];

fn rule_mounts(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for sm in &c.tool.mounts {
        let at = sm.referenced;
        let m = match parse_mount(&sm.value) {
            Ok(m) => m,
            Err(e) => {
                out.push(c.diag(
                    at,
                    e,
                    Some("e.g. `/opt/data:/data:ro`; paths cannot contain `:`"),
                ));
                continue;
            }
        };
        let (src, dst) = (m.src, m.dst);
        for (what, p) in [("source", &src), ("target", &dst)] {
            if !p.starts_with('/') || p.split('/').any(|seg| seg == "..") {
                out.push(c.diag(
                    at,
                    format!("mount {what} `{p}` must be an absolute path without `..`"),
                    None,
                ));
            }
        }
        let d = dst.trim_end_matches('/');
        let d = if d.is_empty() { "/" } else { d };
        if RESERVED_DSTS
            .iter()
            .any(|r| d == *r || (*r != "/" && d.starts_with(&format!("{r}/"))))
        {
            out.push(c.diag(
                at,
                format!("mount target `{dst}` is inside a path cordon builds itself"),
                Some("mount somewhere else, e.g. /opt/tools or /data"),
            ));
        }
    }
    out
}

/// The smallest workspace or state: room for a few files.
pub const MIN_VOLUME_BYTES: u64 = 64 << 10;

/// Why a `workspace` or `state` mount path cannot be used, if it cannot:
/// the rules of a mount target.
fn volume_mount_problem(p: &str) -> Option<String> {
    if !p.starts_with('/') || p.split('/').any(|seg| seg == ".." || seg == ".") {
        return Some(format!(
            "`{p}` must be an absolute path without `.` or `..`"
        ));
    }
    let d = p.trim_end_matches('/');
    let d = if d.is_empty() { "/" } else { d };
    if RESERVED_DSTS
        .iter()
        .any(|r| d == *r || (*r != "/" && d.starts_with(&format!("{r}/"))))
    {
        return Some(format!("`{p}` is inside a path cordon builds itself"));
    }
    None
}

/// `workspace` and `state`: mount paths like a mount target's, apart from
/// each other and from the tool's mounts; a size cordon can enforce; a
/// sandbox that has a session to belong to.
fn rule_volumes(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let t = c.tool;
    let mut seen: Vec<(&str, String)> = Vec::new();
    let decls = [
        t.workspace
            .as_ref()
            .map(|w| ("workspace", w.referenced, &w.value.mount, &w.value.size)),
        t.state
            .as_ref()
            .map(|s| ("state", s.referenced, &s.value.mount, &s.value.size)),
    ];
    for (what, at, mount, size) in decls.into_iter().flatten() {
        if c.profile() == Profile::P0 {
            out.push(c.diag(
                at,
                format!("profile P0 has no sandbox to mount a {what} in"),
                Some("remove it, or choose P1-P3"),
            ));
            continue;
        }
        if let Some(why) = volume_mount_problem(mount) {
            out.push(c.diag(
                at,
                format!("{what} mount {why}"),
                Some("mount it somewhere else, e.g. /work or /data"),
            ));
        }
        match parse_size(size) {
            Err(e) => out.push(c.diag(at, format!("{what} size: {e}"), None)),
            Ok(n) if n < MIN_VOLUME_BYTES => out.push(c.diag(
                at,
                format!("{what} size {n} is below the smallest, 64K"),
                None,
            )),
            Ok(_) => {}
        }
        let norm = mount.trim_end_matches('/').to_string();
        for (other, p) in &seen {
            if *p == norm
                || p.starts_with(&format!("{norm}/"))
                || norm.starts_with(&format!("{p}/"))
            {
                out.push(c.diag(
                    at,
                    format!("{what} mount `{mount}` overlaps the {other}'s"),
                    None,
                ));
            }
        }
        for m in &t.mounts {
            if let Ok(m) = parse_mount(&m.value) {
                let d = m.dst.trim_end_matches('/');
                if d == norm
                    || d.starts_with(&format!("{norm}/"))
                    || norm.starts_with(&format!("{d}/"))
                {
                    out.push(c.diag(
                        at,
                        format!("{what} mount `{mount}` overlaps the mount at `{}`", m.dst),
                        None,
                    ));
                }
            }
        }
        seen.push((what, norm));
        if t.lifetime == Some(manifest::Lifetime::Pool) {
            out.push(c.diag(
                at,
                format!("a {what} cannot be given to a pooled sandbox, which is made before the session that calls it"),
                Some("use `lifetime: call` or `lifetime: session`"),
            ));
        }
    }
    if let Some(w) = &t.workspace
        && let Some(r) = &w.value.retain
        && let Err(e) = parse_duration(r)
    {
        out.push(c.diag(w.referenced, format!("workspace retain: {e}"), None));
    }
    out
}

fn rule_env(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for k in c.tool.env.keys() {
        let ok = !k.is_empty()
            && !k.starts_with(|ch: char| ch.is_ascii_digit())
            && k.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !ok {
            out.push(c.diag(c.at, format!("env name `{k}` is not a variable name"), None));
        }
        if k.starts_with("LD_") {
            out.push(c.diag(
                c.at,
                format!("env `{k}` changes how every program is loaded"),
                Some("bind the library into the sandbox instead of preloading it"),
            ));
        }
    }
    out
}

fn rule_output(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let Some(o) = &c.tool.output else {
        return vec![];
    };
    let mut out = Vec::new();
    let binary = o.kind == Some(manifest::OutputKind::Binary);
    if binary && o.media_type.is_none() {
        out.push(c.diag(
            c.at,
            "binary output needs a `media_type`".into(),
            Some("e.g. `output: {kind: binary, media_type: image/png}`"),
        ));
    }
    if !binary && o.media_type.is_some() {
        out.push(c.diag(
            c.at,
            "`media_type` applies only to `kind: binary`".into(),
            None,
        ));
    }
    out
}

fn rule_input(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let Some(i) = &c.tool.input else {
        return vec![];
    };
    let mut out = Vec::new();
    if c.tool.command.is_none() && c.tool.module.is_none() {
        out.push(c.diag(
            c.at,
            "`input` maps arguments onto a `command`; this tool has none".into(),
            None,
        ));
    }
    let props = c
        .tool
        .input_schema
        .as_ref()
        .and_then(|s| s.get("properties"))
        .and_then(|p| p.as_object());
    let named = i.stdin.iter().chain(i.argv.iter());
    for a in named {
        match props {
            Some(p) if p.contains_key(a) => {}
            _ => out.push(c.diag(
                c.at,
                format!("input argument `{a}` is not a property of `input_schema`"),
                Some("declare every mapped argument in input_schema.properties"),
            )),
        }
    }
    out
}

/// The `expose` setting of an `mcp:` tool (default prefixed).
fn expose_of(m: &manifest::McpServer) -> Expose {
    m.expose.as_ref().map(|e| e.value).unwrap_or_default()
}

/// An exposed name known from the manifest alone, and where it comes from.
struct StaticName {
    name: String,
    at: Location,
    /// What gives the name, for messages (`rename of read_text_file`).
    from: String,
}

/// The tool names an `mcp:` tool exposes that the manifest fixes: each
/// `rename` target, and each `allow` entry's exposed form. The prompts of
/// its `prompts` allowlist, in their exposed form.
fn static_names(c: &Ctx<'_>) -> (Vec<StaticName>, Vec<StaticName>) {
    let (mut tools, mut prompts) = (Vec::new(), Vec::new());
    let Some(m) = &c.tool.mcp else {
        return (tools, prompts);
    };
    let expose = expose_of(m);
    let t = m.tools.as_ref();
    let rename: BTreeMap<String, String> = t
        .map(|t| {
            t.rename
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    let allow = t.and_then(|t| t.allow.as_ref());
    for (k, v) in t.map(|t| &t.rename).into_iter().flatten() {
        // A rename of a tool `allow` leaves out exposes nothing.
        if allow.is_some_and(|a| !a.iter().any(|x| &x.value == k)) {
            continue;
        }
        tools.push(StaticName {
            name: v.value.clone(),
            at: v.referenced,
            from: format!("`rename` of `{k}`"),
        });
    }
    for a in allow.into_iter().flatten() {
        if rename.contains_key(&a.value) {
            continue;
        }
        tools.push(StaticName {
            name: policy::exposed_tool_name(c.name, expose, &rename, &a.value),
            at: a.referenced,
            from: format!("`allow` entry `{}`", a.value),
        });
    }
    for p in m.prompts.iter().flatten() {
        prompts.push(StaticName {
            name: policy::exposed_prompt_name(c.name, expose, &p.value),
            at: p.referenced,
            from: format!("`prompts` entry `{}`", p.value),
        });
    }
    (tools, prompts)
}

/// Every name an `mcp:` tool fixes must be one model APIs accept, and the
/// prefixed form must leave room for a server's name.
fn rule_mcp_names(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let Some(m) = &c.tool.mcp else {
        return out;
    };
    let (tools, prompts) = static_names(c);
    for (kind, n) in tools
        .iter()
        .map(|n| ("tool", n))
        .chain(prompts.iter().map(|n| ("prompt", n)))
    {
        if let Some(why) = invalid_name_reason(&n.name) {
            out.push(c.diag(
                n.at,
                format!(
                    "{}: exposed {kind} name `{}` is refused: {why}",
                    n.from, n.name
                ),
                Some("give a shorter name with `rename`, or choose `expose: as-is`"),
            ));
        }
    }
    let prefix = c.name.len() + policy::NAME_SEPARATOR.len();
    if expose_of(m) == Expose::Prefixed && prefix >= policy::MAX_NAME_LEN {
        out.push(c.diag(
            m.expose.as_ref().map(|e| e.referenced).unwrap_or(c.at),
            format!(
                "with `expose: prefixed`, the prefix `{}{}` leaves no room for a server's names within {} characters",
                c.name,
                policy::NAME_SEPARATOR,
                policy::MAX_NAME_LEN
            ),
            Some("give the tool a shorter name, or choose `expose: as-is`"),
        ));
    }
    out
}

/// Every exposed name the manifest fixes belongs to one tool: command
/// tools by their keys, `mcp:` tools by [`static_names`]. A name given
/// twice is an error naming both.
fn check_collisions(file: &Path, m: &Manifest) -> Vec<Diagnostic> {
    let mut errors = Vec::new();
    let mut tools: BTreeMap<String, (String, String, Location)> = BTreeMap::new();
    let mut prompts: BTreeMap<String, (String, String, Location)> = BTreeMap::new();
    // Command tools' names first: a server's name is the one reported.
    for (name, spanned) in &m.tools {
        if spanned.value.mcp.is_none() {
            tools.insert(
                name.clone(),
                (name.clone(), "a command tool".into(), spanned.referenced),
            );
        }
    }
    for (name, spanned) in &m.tools {
        let c = Ctx {
            file,
            manifest: m,
            name,
            tool: &spanned.value,
            at: spanned.referenced,
        };
        let (t, p) = static_names(&c);
        for (kind, seen, list) in [("tool", &mut tools, t), ("prompt", &mut prompts, p)] {
            for n in list {
                match seen.get(&n.name) {
                    Some((owner, from, at)) => errors.push(c.diag(
                        n.at,
                        format!(
                            "exposed {kind} name `{}` is given twice: by tool `{owner}` ({from}, line {}) and by tool `{name}` ({}); each exposed name must belong to one tool",
                            n.name,
                            at.line(),
                            n.from
                        ),
                        Some("rename one of them (`mcp: {tools: {rename: {server_name: new_name}}}`)"),
                    )),
                    None => {
                        seen.insert(n.name.clone(), (name.clone(), n.from, n.at));
                    }
                }
            }
        }
    }
    errors
}

/// Warnings: allowed, but a reviewer should see them.
fn warnings(c: &Ctx<'_>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if c.profile() == Profile::P0 {
        out.push(c.diag(
            c.profile_at(),
            "profile P0 runs with no sandbox: the tool gets the broker's files, network and environment".into(),
            Some("classify by the worst input the tool can receive; a parser of untrusted bytes belongs in P1"),
        ));
    }
    let digest = c
        .tool
        .image
        .as_ref()
        .map(|i| (i.referenced, i.value.clone()))
        .or_else(|| {
            c.tool
                .mcp
                .as_ref()
                .and_then(|m| m.image.clone())
                .map(|i| (c.at, i))
        });
    if let Some((at, img)) = digest
        && let Ok((_, d)) = split_digest(&img)
        && !digest_is_complete(&d)
    {
        out.push(c.diag(
            at,
            format!("image digest `{d}` is abbreviated: it cannot be pulled or verified"),
            Some("write the full sha256 digest (64 hex digits)"),
        ));
    }
    let t = c.tool;
    if t.command.is_none() && t.image.is_none() && t.mcp.is_none() && t.module.is_none() {
        out.push(c.diag(
            c.at,
            "declares nothing to run: cordon refuses to run it until `command`, `image` or `mcp` is given".into(),
            Some("e.g. `image: name@sha256:<digest>` for the runtime to start"),
        ));
    }
    for s in c.secrets() {
        if s.value.deliver == Some(manifest::Deliver::Env) {
            out.push(c.diag(
                s.referenced,
                format!(
                    "secret `{}` is delivered in the environment (`deliver: env`): the tool holds the token itself and can send it anywhere its egress reaches",
                    s.value.name
                ),
                Some("prefer `deliver: proxy`: the sandbox sees a placeholder the door replaces only on the bound endpoint"),
            ));
        }
    }
    for k in c.tool.env.keys() {
        let lk = k.to_ascii_lowercase();
        if ["token", "secret", "password", "key"]
            .iter()
            .any(|w| lk.contains(w))
        {
            out.push(c.diag(
                c.at,
                format!("env `{k}` looks like a credential"),
                Some("declare it under `secrets:` so it is scoped, short-lived and redacted from logs"),
            ));
        }
    }
    out
}

fn resolve(file: &Path, m: &Manifest) -> Result<Loaded, ManifestError> {
    let mut errors = Vec::new();
    let mut warns = Vec::new();
    let mut tools = BTreeMap::new();
    let mut secret_at = BTreeMap::new();
    let mut tool_at = BTreeMap::new();
    let mut mount_at = BTreeMap::new();
    if let Some(v) = m.version
        && v != 1
    {
        errors.push(Diagnostic {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
            tool: None,
            message: format!("manifest version {v} is not supported"),
            hint: Some("write `version: 1` or omit it".into()),
        });
    }
    for (name, spanned) in &m.tools {
        let c = Ctx {
            file,
            manifest: m,
            name,
            tool: &spanned.value,
            at: spanned.referenced,
        };
        tool_at.insert(name.clone(), (c.at.line(), c.at.column()));
        for sm in &c.tool.mounts {
            if let Ok(pm) = parse_mount(&sm.value) {
                let at = if sm.referenced == Location::UNKNOWN {
                    c.at
                } else {
                    sm.referenced
                };
                mount_at
                    .entry((name.clone(), pm.src))
                    .or_insert((at.line(), at.column()));
            }
        }
        for s in c.secrets() {
            let at = if s.referenced == Location::UNKNOWN {
                c.at
            } else {
                s.referenced
            };
            secret_at.insert(
                (name.clone(), s.value.name.clone()),
                (at.line(), at.column()),
            );
        }
        let before = errors.len();
        if let Some(why) = invalid_name_reason(name) {
            errors.push(c.diag(c.at, format!("tool name `{name}` is refused: {why}"), None));
        }
        for rule in RULES {
            errors.extend(rule(&c));
        }
        warns.extend(warnings(&c));
        if errors.len() == before {
            match resolve_tool(&c) {
                Ok(p) => {
                    tools.insert(name.clone(), p);
                }
                Err(d) => errors.push(d),
            }
        }
    }
    if errors.is_empty() {
        errors.extend(check_collisions(file, m));
    }
    let gateway = crate::gateway::resolve_gateway(file, m.gateway.as_ref()).unwrap_or_else(|e| {
        errors.extend(e);
        Default::default()
    });
    let access = crate::access::resolve(file, m, &mut errors, &mut warns);
    if errors.is_empty() {
        Ok(Loaded {
            path: file.to_path_buf(),
            policy: PolicySet {
                tools,
                gateway,
                access,
            },
            warnings: warns,
            secret_at,
            tool_at,
            mount_at,
        })
    } else {
        errors.sort_by_key(|d| (d.line, d.column));
        Err(ManifestError::Invalid(errors))
    }
}

/// The effective requirements of a tool: the profile's defaults and every
/// `require`, less every `accept`; and the accepted degradations (sorted).
fn requirements(profile: Profile, m: &Manifest, t: &Tool) -> (Vec<Mechanism>, Vec<Mechanism>) {
    if profile == Profile::P0 {
        return (Vec::new(), Vec::new());
    }
    let accept: std::collections::BTreeSet<Mechanism> =
        m.accept.iter().chain(&t.accept).copied().collect();
    // A microVM guest under emulation is slow, not weaker, but a host
    // without working KVM is said aloud: accepted by name or refused.
    let vm: &[Mechanism] = if t.runtime.as_ref().map(|r| r.value) == Some(Runtime::Microvm) {
        &[Mechanism::Kvm]
    } else {
        &[]
    };
    let require: std::collections::BTreeSet<Mechanism> = default_requirements(profile)
        .iter()
        .chain(vm)
        .chain(&m.require)
        .chain(&t.require)
        .copied()
        .filter(|x| !accept.contains(x))
        .collect();
    (require.into_iter().collect(), accept.into_iter().collect())
}

fn resolve_tool(c: &Ctx<'_>) -> Result<ToolPolicy, Diagnostic> {
    let t = c.tool;
    let profile = c.profile();
    let limits = resolve_limits(c, profile)?;
    let exec = resolve_exec(c)?;
    let network = resolve_network(t, profile);
    let env = resolve_env(t, profile);
    let mounts = resolve_mounts(c)?;
    let (workspace, state) = resolve_volumes(c)?;
    let output = resolve_output(t);

    let (require, accept) = requirements(profile, c.manifest, t);

    let lifetime = t.lifetime.unwrap_or(if t.mcp.is_some() {
        manifest::Lifetime::Session
    } else {
        manifest::Lifetime::Call
    });

    Ok(ToolPolicy {
        name: c.name.to_string(),
        profile,
        description: t.description.clone().unwrap_or_default(),
        runtime: t
            .runtime
            .as_ref()
            .map(|r| r.value)
            .unwrap_or(Runtime::Native),
        exec,
        limits,
        network,
        secrets: c
            .secrets()
            .iter()
            .map(|s| resolve_secret(c, s))
            .collect::<Result<_, _>>()?,
        tls_passthrough: {
            let mut v: Vec<String> = t.tls_passthrough.iter().map(|e| e.value.clone()).collect();
            v.sort();
            v.dedup();
            v
        },
        mounts,
        workspace,
        state,
        env,
        lifetime,
        boot: (t.runtime.as_ref().map(|r| r.value) == Some(Runtime::Microvm))
            .then(|| t.boot.as_ref().map(|b| b.value).unwrap_or_default()),
        pool: (lifetime == manifest::Lifetime::Pool).then(|| t.pool.unwrap_or_default()),
        input: {
            let i = t.input.clone().unwrap_or_default();
            policy::Input {
                stdin: i.stdin,
                encoding: i.encoding.unwrap_or(manifest::Encoding::Text),
                argv: i.argv,
                json: t
                    .module
                    .as_ref()
                    .is_some_and(|m| m.value.function.is_some()),
            }
        },
        input_schema: t.input_schema.clone(),
        output_schema: t.output_schema.clone(),
        output,
        seccomp: match &t.seccomp {
            None => policy::Seccomp::DenyList,
            Some(s) => policy::Seccomp::AllowList {
                extra: s.allow.clone(),
            },
        },
        require,
        accept,
        concurrency: crate::gateway::resolve_concurrency(
            c.file,
            c.name,
            c.at,
            t.max_concurrent.as_ref(),
            t.queue_seconds.as_ref(),
        )?,
    })
}

/// The tool's limits: the profile's defaults with the manifest's
/// `limits:` over them (none for P0, which has no sandbox to enforce them).
fn resolve_limits(c: &Ctx<'_>, profile: Profile) -> Result<Option<Limits>, Diagnostic> {
    let t = c.tool;
    let limits = match default_limits(profile) {
        None => None,
        Some(mut l) => {
            if let Some(sl) = &t.limits {
                let ml = &sl.value;
                let bad = |m: String| c.diag(sl.referenced, format!("limits: {m}"), None);
                if let Some(v) = ml.wall_seconds {
                    l.wall = Duration::from_secs(v);
                }
                if let Some(v) = &ml.memory {
                    l.memory_bytes = parse_size(v).map_err(bad)?;
                }
                if let Some(v) = ml.tasks {
                    l.tasks = v;
                }
                if let Some(v) = &ml.cpu {
                    l.cpu_percent = Some(parse_cpu(v).map_err(bad)?);
                }
                if let Some(v) = &ml.output_bytes {
                    l.output_bytes = parse_size(v).map_err(bad)?;
                }
                if let Some(v) = &ml.stderr_bytes {
                    l.stderr_bytes = parse_size(v).map_err(bad)?;
                }
                if let Some(v) = ml.nofile {
                    l.nofile = v;
                }
                if let Some(v) = &ml.disk {
                    l.disk_bytes = parse_size(v).map_err(bad)?;
                }
                for (what, v) in [
                    ("wall_seconds", l.wall.as_secs()),
                    ("memory", l.memory_bytes),
                    ("tasks", l.tasks),
                    ("output_bytes", l.output_bytes),
                    ("nofile", l.nofile),
                ] {
                    if v == 0 {
                        return Err(bad(format!("{what} is 0: the tool could never run")));
                    }
                }
                if l.memory_bytes < (4 << 20) {
                    return Err(bad("memory below 4M cannot start a process".into()));
                }
            }
            Some(l)
        }
    };
    if let (Profile::P0, Some(sl)) = (profile, &t.limits) {
        return Err(c.diag(
            sl.referenced,
            "profile P0 has no sandbox, so `limits` would not be enforced".into(),
            Some("remove `limits`, or choose P1-P3 to have them enforced"),
        ));
    }
    Ok(limits)
}

/// What the tool runs: an image, a command, an MCP server, or nothing yet.
fn resolve_exec(c: &Ctx<'_>) -> Result<Exec, Diagnostic> {
    let t = c.tool;
    let exec = if let Some(m) = &t.module {
        let path = Path::new(&m.value.path);
        let module = if path.is_absolute() {
            path.to_path_buf()
        } else {
            c.file.parent().unwrap_or(Path::new(".")).join(path)
        };
        let argv = match &t.command {
            Some(cmd) => cmd.clone(),
            None => vec![
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "module".into()),
            ],
        };
        Exec::Wasm {
            module: module.to_string_lossy().into_owned(),
            sha256: m.value.sha256.to_ascii_lowercase(),
            argv,
            worker: m.value.worker,
            function: m.value.function.clone(),
        }
    } else if let Some(img) = &t.image {
        let (reference, digest) =
            split_digest(&img.value).map_err(|m| c.diag(img.referenced, m, None))?;
        Exec::Image {
            reference,
            digest,
            command: t.command.clone(),
        }
    } else if let Some(cmd) = &t.command {
        Exec::Command { argv: cmd.clone() }
    } else if let Some(mcp) = &t.mcp {
        let tools = mcp.tools.clone();
        Exec::Mcp {
            command: mcp.command.clone(),
            image: mcp.image.clone(),
            expose: expose_of(mcp),
            allow_sampling: mcp.allow_sampling.unwrap_or(false),
            allow_elicitation: mcp.allow_elicitation.unwrap_or(false),
            fold_resources: mcp.fold_resources.unwrap_or(false),
            warm: mcp.warm.as_ref().map(|w| w.value).unwrap_or(0),
            warm_up: match &mcp.warm_up {
                None => None,
                Some(w) => {
                    if mcp.warm.as_ref().is_none_or(|n| n.value == 0) {
                        return Err(c.diag(
                            w.referenced,
                            "`warm_up` needs `warm: N` (1 or more): it is made before a server is pooled".into(),
                            None,
                        ));
                    }
                    let arguments = match &w.value.arguments {
                        None => serde_json::Map::new(),
                        Some(serde_json::Value::Object(o)) => o.clone(),
                        Some(_) => {
                            return Err(c.diag(
                                w.referenced,
                                "`warm_up: {arguments:}` must be an object".into(),
                                None,
                            ));
                        }
                    };
                    if let Some(allow) = mcp.tools.as_ref().and_then(|t| t.allow.as_ref())
                        && !allow.iter().any(|a| a.value == w.value.tool)
                    {
                        return Err(c.diag(
                            w.referenced,
                            format!(
                                "`warm_up` calls `{}`, which `tools: {{allow:}}` does not expose",
                                w.value.tool
                            ),
                            None,
                        ));
                    }
                    Some(policy::WarmUpCall {
                        tool: w.value.tool.clone(),
                        arguments,
                    })
                }
            },
            startup_seconds: match &mcp.startup_seconds {
                None => policy::DEFAULT_STARTUP_SECONDS,
                Some(s) if s.value == 0 => {
                    return Err(c.diag(
                        s.referenced,
                        "`startup_seconds` is 0: the server could never start".into(),
                        None,
                    ));
                }
                Some(s) => s.value,
            },
            allow: tools
                .as_ref()
                .and_then(|t| t.allow.as_ref())
                .map(|a| a.iter().map(|x| x.value.clone()).collect()),
            rename: tools
                .as_ref()
                .map(|t| {
                    t.rename
                        .iter()
                        .map(|(k, v)| (k.clone(), v.value.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            descriptions: tools.map(|t| t.descriptions).unwrap_or_default(),
            resources: mcp.resources.clone(),
            prompts: mcp
                .prompts
                .as_ref()
                .map(|p| p.iter().map(|x| x.value.clone()).collect()),
        }
    } else {
        Exec::Unspecified
    };
    Ok(exec)
}

/// What the tool may reach: the host's network for P0, else its `egress:`.
fn resolve_network(t: &Tool, profile: Profile) -> Network {
    if profile == Profile::P0 {
        Network::Host
    } else {
        match t.egress.as_ref().map(|e| &e.value) {
            None => Network::None,
            Some(Egress::Proxy(_)) => Network::Proxy {
                resolve: t.resolve.clone(),
                allow_cidrs: t.allow_cidrs.clone(),
            },
            Some(Egress::Allow(list)) => {
                let mut allow = list.clone();
                allow.sort();
                allow.dedup();
                Network::Allowlist {
                    allow,
                    resolve: t.resolve.clone(),
                    allow_cidrs: t.allow_cidrs.clone(),
                }
            }
        }
    }
}

/// The tool's environment: the sandbox's own, then the manifest's.
fn resolve_env(t: &Tool, profile: Profile) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if profile != Profile::P0 {
        env.insert("PATH".to_string(), SANDBOX_PATH.to_string());
        env.insert("HOME".to_string(), "/tmp".to_string());
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
    }
    env.extend(t.env.clone());
    env
}

/// The tool's mounts, parsed and sorted.
fn resolve_mounts(c: &Ctx<'_>) -> Result<Vec<policy::Mount>, Diagnostic> {
    let t = c.tool;
    let mut mounts: Vec<policy::Mount> = t
        .mounts
        .iter()
        .map(|m| parse_mount(&m.value).map_err(|e| c.diag(m.referenced, e, None)))
        .collect::<Result<_, _>>()?;
    mounts.sort();
    Ok(mounts)
}

/// The tool's session workspace and persistent state volume.
fn resolve_volumes(
    c: &Ctx<'_>,
) -> Result<(Option<policy::Workspace>, Option<policy::State>), Diagnostic> {
    let t = c.tool;
    let workspace = match &t.workspace {
        None => None,
        Some(w) => {
            let bad = |m: String| c.diag(w.referenced, format!("workspace: {m}"), None);
            Some(policy::Workspace {
                mount: w.value.mount.clone(),
                size_bytes: parse_size(&w.value.size).map_err(bad)?,
                retain_seconds: match &w.value.retain {
                    None => 0,
                    Some(r) => parse_duration(r).map_err(bad)?,
                },
            })
        }
    };
    let state = match &t.state {
        None => None,
        Some(s) => Some(policy::State {
            mount: s.value.mount.clone(),
            size_bytes: parse_size(&s.value.size)
                .map_err(|m| c.diag(s.referenced, format!("state: {m}"), None))?,
        }),
    };
    Ok((workspace, state))
}

/// How the tool's output is checked and labelled, after defaults.
fn resolve_output(t: &Tool) -> policy::Output {
    let o = t.output.clone().unwrap_or_default();
    policy::Output {
        kind: o.kind.unwrap_or(manifest::OutputKind::Text),
        media_type: o.media_type,
        on_overflow: o.on_overflow.unwrap_or(manifest::Overflow::Fail),
        strip_html: o.strip_html.unwrap_or(false),
        strip_markdown: o.strip_markdown.unwrap_or(false),
        strip: {
            let d = policy::StripClasses::default();
            let c = o.strip.clone().unwrap_or_default();
            policy::StripClasses {
                control: c.control.unwrap_or(d.control),
                ansi: c.ansi.unwrap_or(d.ansi),
                bidi: c.bidi.unwrap_or(d.bidi),
                zero_width: c.zero_width.unwrap_or(d.zero_width),
                tags: c.tags.unwrap_or(d.tags),
            }
        },
        label: o.label.unwrap_or(manifest::Label::Wrapped),
        invalid_utf8: o.invalid_utf8.unwrap_or(manifest::InvalidUtf8::Replace),
        block_secrets: o.block_secrets.unwrap_or(false),
    }
}
