//! From manifest to resolved policy: parse, apply the profile rules, fill
//! in defaults. A manifest cannot claim a profile it does not meet: every
//! rule below is checked at load, and each is one function in [`RULES`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_saphyr::{Location, Spanned};

use crate::error::{Diagnostic, ManifestError};
use crate::manifest::{self, Egress, Manifest, Mechanism, Profile, Runtime, Tool};
use crate::policy::{self, Exec, Limits, Network, PolicySet, ToolPolicy};
use crate::units::{parse_cpu, parse_size};

/// A loaded manifest: the resolved policies and the warnings `cordon check` prints.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub policy: PolicySet,
    pub warnings: Vec<Diagnostic>,
}

/// Profile defaults for every limit. P0 has none: nothing enforces them.
pub fn default_limits(profile: Profile) -> Option<Limits> {
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    match profile {
        Profile::P0 => None,
        Profile::P1 => Some(Limits {
            wall_seconds: 20,
            memory_bytes: 512 * M,
            tasks: 32,
            cpu_percent: 100,
            output_bytes: 2_000_000,
            stderr_bytes: 64 << 10,
            nofile: 256,
            disk_bytes: 64 * M,
        }),
        Profile::P2 => Some(Limits {
            wall_seconds: 30,
            memory_bytes: 256 * M,
            tasks: 64,
            cpu_percent: 100,
            output_bytes: 2_000_000,
            stderr_bytes: 64 << 10,
            nofile: 1024,
            disk_bytes: 64 * M,
        }),
        Profile::P3 => Some(Limits {
            wall_seconds: 120,
            memory_bytes: 2 * G,
            tasks: 256,
            cpu_percent: 200,
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
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        let (message, hint) = explain_parse_error(&e.to_string());
        ManifestError::Invalid(vec![Diagnostic {
            file: path.to_path_buf(),
            line,
            column,
            tool: None,
            message,
            hint,
        }])
    })
}

/// serde-saphyr renders a snippet; keep its first line as the message and
/// add what would be right for the errors people make most.
fn explain_parse_error(rendered: &str) -> (String, Option<String>) {
    let first = rendered
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(rendered)
        .trim()
        .trim_start_matches("error: ")
        .to_string();
    // Drop a leading "line N column M:" that duplicates our own prefix.
    let message = match first.find(": ") {
        Some(i) if first.starts_with("line ") => first[i + 2..].to_string(),
        _ => first,
    };
    let hint = if message.contains("unknown field") {
        Some(
            "unknown keys are refused so that a typo cannot weaken a policy; \
             `cordon schema` prints every key the manifest accepts"
                .to_string(),
        )
    } else if message.contains("did not match any variant") || message.contains("unknown variant") {
        Some("see `cordon schema` for the accepted values".to_string())
    } else {
        None
    };
    (message, hint)
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
    rule_pool,
    rule_image_pinned,
    rule_egress_entries,
    rule_resolve_and_cidrs,
    rule_secrets_wellformed,
    rule_mounts,
    rule_env,
    rule_output,
    rule_input,
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
    fn secrets(&self) -> &[manifest::Secret] {
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
    for s in c.secrets() {
        let ok_name = !s.name.is_empty()
            && s.name
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_')
            && !s.name.starts_with(|ch: char| ch.is_ascii_digit());
        if !ok_name {
            out.push(c.diag(
                c.secrets_at(),
                format!(
                    "secret name `{}` is not an environment variable name",
                    s.name
                ),
                Some("use upper case letters, digits and _, e.g. JIRA_TOKEN"),
            ));
        }
        if s.ttl == 0 {
            out.push(c.diag(
                c.secrets_at(),
                format!("secret `{}` has ttl 0", s.name),
                Some("give a lifetime in seconds, e.g. ttl: 900"),
            ));
        }
        if s.scope.trim().is_empty() {
            out.push(c.diag(
                c.secrets_at(),
                format!("secret `{}` has an empty scope", s.name),
                Some("name what the credential may do, e.g. scope: \"read:issues\""),
            ));
        }
    }
    out
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
    if c.tool.command.is_none() {
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
    if t.command.is_none() && t.image.is_none() && t.mcp.is_none() {
        out.push(c.diag(
            c.at,
            "declares nothing to run: cordon refuses to run it until `command`, `image` or `mcp` is given".into(),
            Some("e.g. `image: name@sha256:<digest>` for the runtime to start"),
        ));
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
        let before = errors.len();
        if name.is_empty()
            || !name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            errors.push(c.diag(
                c.at,
                format!("tool name `{name}` must be letters, digits, `_` or `-`"),
                None,
            ));
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
        Ok(Loaded {
            path: file.to_path_buf(),
            policy: PolicySet { tools },
            warnings: warns,
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
    let require: std::collections::BTreeSet<Mechanism> = default_requirements(profile)
        .iter()
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
    let limits = match default_limits(profile) {
        None => None,
        Some(mut l) => {
            if let Some(sl) = &t.limits {
                let ml = &sl.value;
                let bad = |m: String| c.diag(sl.referenced, format!("limits: {m}"), None);
                if let Some(v) = ml.wall_seconds {
                    l.wall_seconds = v;
                }
                if let Some(v) = &ml.memory {
                    l.memory_bytes = parse_size(v).map_err(bad)?;
                }
                if let Some(v) = ml.tasks {
                    l.tasks = v;
                }
                if let Some(v) = &ml.cpu {
                    l.cpu_percent = parse_cpu(v).map_err(bad)?;
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
                    ("wall_seconds", l.wall_seconds),
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

    let exec = if let Some(img) = &t.image {
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
            allow: tools.as_ref().and_then(|t| t.allow.clone()),
            rename: tools.as_ref().map(|t| t.rename.clone()).unwrap_or_default(),
            descriptions: tools.map(|t| t.descriptions).unwrap_or_default(),
            resources: mcp.resources.clone(),
            prompts: mcp.prompts.clone(),
        }
    } else {
        Exec::Unspecified
    };

    let network = if profile == Profile::P0 {
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
    };

    let mut env = BTreeMap::new();
    if profile != Profile::P0 {
        env.insert("PATH".to_string(), SANDBOX_PATH.to_string());
        env.insert("HOME".to_string(), "/tmp".to_string());
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
    }
    env.extend(t.env.clone());

    let mut mounts: Vec<policy::Mount> = t
        .mounts
        .iter()
        .map(|m| parse_mount(&m.value).map_err(|e| c.diag(m.referenced, e, None)))
        .collect::<Result<_, _>>()?;
    mounts.sort();

    let o = t.output.clone().unwrap_or_default();
    let output = policy::Output {
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
    };

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
            .map(|s| policy::Secret {
                name: s.name.clone(),
                scope: s.scope.clone(),
                ttl_seconds: s.ttl,
            })
            .collect(),
        mounts,
        env,
        lifetime,
        pool: (lifetime == manifest::Lifetime::Pool).then(|| t.pool.unwrap_or_default()),
        input: {
            let i = t.input.clone().unwrap_or_default();
            policy::Input {
                stdin: i.stdin,
                encoding: i.encoding.unwrap_or(manifest::Encoding::Text),
                argv: i.argv,
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
    })
}
