//! The manifest's `gateway:` section (session lifetime and caps at the door
//! of `cordon serve`) and each tool's `max_concurrent`: as written, resolved,
//! and compared.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};

use crate::error::Diagnostic;

/// How an HTTP session ends and how much one caller may take, as written.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    /// A session with no request and no call in flight for this long is
    /// ended and its sandboxes stopped: seconds, or `90s`, `30m`, `2h`
    /// (default 5m).
    #[serde(default)]
    #[schemars(with = "Option<Duration>")]
    pub idle_timeout: Option<Spanned<Duration>>,
    /// A session whose client's connections (its SSE stream, its calls in
    /// flight) all dropped, and that sent nothing since, is ended after
    /// this long (default 5s).
    #[serde(default)]
    #[schemars(with = "Option<Duration>")]
    pub disconnect_grace: Option<Spanned<Duration>>,
    /// Live sandboxes of all sessions together (command calls running and
    /// MCP servers started); a call or server start beyond it is refused
    /// (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub max_sandboxes: Option<Spanned<u64>>,
    /// What each principal (subject within its tenant) may take.
    #[serde(default)]
    pub per_principal: Option<PerPrincipal>,
    /// What all principals of one tenant may take together.
    #[serde(default)]
    pub per_tenant: Option<PerTenant>,
    /// How often `cordon serve` proves each tool again while it serves.
    #[serde(default)]
    pub reprobe: Option<ReprobeSettings>,
}

/// Continuous conformance, as written: `reprobe: {every: 6h, jitter: 10%}`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReprobeSettings {
    /// Prove every served tool again this often: seconds, or `90s`, `30m`,
    /// `6h` (default 6h).
    #[serde(default)]
    #[schemars(with = "Option<Duration>")]
    pub every: Option<Spanned<Duration>>,
    /// Spread each run by up to this share of `every`, earlier or later:
    /// `10%` or a number of percent, 0 to 50 (default 10%).
    #[serde(default)]
    #[schemars(with = "Option<Percent>")]
    pub jitter: Option<Spanned<Percent>>,
}

/// A share: a number of percent, or text such as `10%`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Percent {
    Number(u64),
    Text(String),
}

/// Parse a [`Percent`] into whole percent.
pub fn parse_percent(p: &Percent) -> Result<u64, String> {
    match p {
        Percent::Number(n) => Ok(*n),
        Percent::Text(s) => s
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse()
            .map_err(|_| format!("invalid share `{s}`: write e.g. 10%")),
    }
}

/// Per-principal caps, as written.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerPrincipal {
    /// Tool calls in any rolling minute (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub calls_per_minute: Option<Spanned<u32>>,
    /// Sessions open at once; over stateless HTTP each request in flight
    /// is a session (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub sessions: Option<Spanned<u32>>,
    /// Tool calls running (or waiting for a slot) at once, all sessions
    /// together (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub calls_in_flight: Option<Spanned<u32>>,
    /// Live sandboxes at once (command calls running and MCP servers
    /// started), all sessions together (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub sandboxes: Option<Spanned<u32>>,
}

/// Per-tenant caps, as written: every principal of the tenant together.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerTenant {
    /// Tool calls running (or waiting for a slot) at once (absent: no
    /// bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub calls_in_flight: Option<Spanned<u32>>,
    /// Live sandboxes at once (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub sandboxes: Option<Spanned<u32>>,
}

/// A duration: whole seconds, or digits followed by `s`, `m` or `h`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Duration {
    Seconds(u64),
    Text(String),
}

/// Parse a [`Duration`] into seconds.
pub fn parse_duration(d: &Duration) -> Result<u64, String> {
    let s = match d {
        Duration::Seconds(n) => return Ok(*n),
        Duration::Text(s) => s.trim(),
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let bad = || format!("invalid duration `{s}`: write seconds, or e.g. 90s, 30m, 2h");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mul = match unit.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(bad()),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("duration `{s}` is too large"))
}

/// Default idle timeout of an HTTP session (what the transport used before
/// it was a setting).
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 300;
/// Default wait after a client's connections dropped.
pub const DEFAULT_DISCONNECT_GRACE_SECONDS: u64 = 5;
/// Default wait of a call for a tool at its `max_concurrent`.
pub const DEFAULT_QUEUE_SECONDS: u64 = 10;
/// Default interval of `cordon serve`'s re-probes: 6 hours.
pub const DEFAULT_REPROBE_SECONDS: u64 = 6 * 3600;
/// Default jitter of the re-probes, in percent of the interval.
pub const DEFAULT_REPROBE_JITTER_PERCENT: u64 = 10;
/// The largest jitter accepted, in percent.
pub const MAX_REPROBE_JITTER_PERCENT: u64 = 50;

/// Session lifetime and caps of the gateway, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayPolicy {
    pub idle_timeout_seconds: u64,
    pub disconnect_grace_seconds: u64,
    /// `None`: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    #[serde(default)]
    pub per_principal: PrincipalCaps,
    #[serde(default)]
    pub per_tenant: TenantCaps,
    /// How often each served tool is proved again.
    #[serde(default)]
    pub reprobe: Reprobe,
}

/// Continuous conformance, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reprobe {
    /// Interval between two runs of a tool's probes.
    pub every_seconds: u64,
    /// Each run is moved by up to this share of the interval, either way.
    pub jitter_percent: u64,
}

impl Default for Reprobe {
    fn default() -> Reprobe {
        Reprobe {
            every_seconds: DEFAULT_REPROBE_SECONDS,
            jitter_percent: DEFAULT_REPROBE_JITTER_PERCENT,
        }
    }
}

/// Per-principal caps, resolved (`None`: no bound).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalCaps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_in_flight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u32>,
}

/// Per-tenant caps, resolved (`None`: no bound).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCaps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_in_flight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u32>,
}

impl Default for GatewayPolicy {
    fn default() -> GatewayPolicy {
        GatewayPolicy {
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            disconnect_grace_seconds: DEFAULT_DISCONNECT_GRACE_SECONDS,
            max_sandboxes: None,
            per_principal: PrincipalCaps::default(),
            per_tenant: TenantCaps::default(),
            reprobe: Reprobe::default(),
        }
    }
}

/// A tool's cap on calls in flight, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Concurrency {
    /// Calls of this tool running at once, all sessions together.
    pub max_concurrent: u32,
    /// How long a call beyond it waits for a slot before it is refused
    /// as busy.
    pub queue_seconds: u64,
}

fn diag(file: &Path, at: Location, tool: Option<&str>, message: String) -> Diagnostic {
    let (line, column) = if at == Location::UNKNOWN {
        (1, 1)
    } else {
        (at.line(), at.column())
    };
    Diagnostic {
        file: file.to_path_buf(),
        line,
        column,
        tool: tool.map(str::to_string),
        message,
        hint: None,
    }
}

/// Resolve the `gateway:` section; every error points at its value.
pub fn resolve_gateway(
    file: &Path,
    g: Option<&GatewaySettings>,
) -> Result<GatewayPolicy, Vec<Diagnostic>> {
    let mut out = GatewayPolicy::default();
    let Some(g) = g else { return Ok(out) };
    let mut errors = Vec::new();
    let mut seconds = |what: &str, v: &Option<Spanned<Duration>>, into: &mut u64| {
        if let Some(s) = v {
            match parse_duration(&s.value) {
                Ok(0) => errors.push(diag(
                    file,
                    s.referenced,
                    None,
                    format!("gateway: `{what}` is 0: every session would end at once"),
                )),
                Ok(n) => *into = n,
                Err(e) => errors.push(diag(file, s.referenced, None, format!("gateway: {e}"))),
            }
        }
    };
    seconds(
        "idle_timeout",
        &g.idle_timeout,
        &mut out.idle_timeout_seconds,
    );
    seconds(
        "disconnect_grace",
        &g.disconnect_grace,
        &mut out.disconnect_grace_seconds,
    );
    let mut positive = |what: &str, at: Location, n: u64| {
        if n == 0 {
            errors.push(diag(
                file,
                at,
                None,
                format!("gateway: `{what}` is 0: nothing could ever run"),
            ));
        }
    };
    if let Some(m) = &g.max_sandboxes {
        positive("max_sandboxes", m.referenced, m.value);
        out.max_sandboxes = Some(m.value);
    }
    let mut cap = |what: &str, v: &Option<Spanned<u32>>, into: &mut Option<u32>| {
        if let Some(c) = v {
            positive(what, c.referenced, c.value.into());
            *into = Some(c.value);
        }
    };
    if let Some(p) = &g.per_principal {
        let o = &mut out.per_principal;
        cap(
            "per_principal.calls_per_minute",
            &p.calls_per_minute,
            &mut o.calls_per_minute,
        );
        cap("per_principal.sessions", &p.sessions, &mut o.sessions);
        cap(
            "per_principal.calls_in_flight",
            &p.calls_in_flight,
            &mut o.calls_in_flight,
        );
        cap("per_principal.sandboxes", &p.sandboxes, &mut o.sandboxes);
    }
    if let Some(t) = &g.per_tenant {
        let o = &mut out.per_tenant;
        cap(
            "per_tenant.calls_in_flight",
            &t.calls_in_flight,
            &mut o.calls_in_flight,
        );
        cap("per_tenant.sandboxes", &t.sandboxes, &mut o.sandboxes);
    }
    if let Some(r) = &g.reprobe {
        if let Some(e) = &r.every {
            match parse_duration(&e.value) {
                Ok(0) => errors.push(diag(
                    file,
                    e.referenced,
                    None,
                    "gateway: `reprobe.every` is 0: tools would be probed without pause".into(),
                )),
                Ok(n) => out.reprobe.every_seconds = n,
                Err(why) => errors.push(diag(file, e.referenced, None, format!("gateway: {why}"))),
            }
        }
        if let Some(j) = &r.jitter {
            match parse_percent(&j.value) {
                Ok(n) if n <= MAX_REPROBE_JITTER_PERCENT => out.reprobe.jitter_percent = n,
                Ok(n) => errors.push(diag(
                    file,
                    j.referenced,
                    None,
                    format!(
                        "gateway: `reprobe.jitter` is {n}%: at most {MAX_REPROBE_JITTER_PERCENT}%"
                    ),
                )),
                Err(why) => errors.push(diag(file, j.referenced, None, format!("gateway: {why}"))),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Resolve a tool's `max_concurrent` and `queue_seconds`.
pub fn resolve_concurrency(
    file: &Path,
    tool: &str,
    at: Location,
    max_concurrent: Option<&Spanned<u32>>,
    queue_seconds: Option<&Spanned<u64>>,
) -> Result<Option<Concurrency>, Diagnostic> {
    match (max_concurrent, queue_seconds) {
        (None, None) => Ok(None),
        (None, Some(q)) => Err(Diagnostic {
            hint: Some("add `max_concurrent: N`, or remove `queue_seconds`".into()),
            ..diag(
                file,
                pick(q.referenced, at),
                Some(tool),
                "`queue_seconds` without `max_concurrent` means nothing".into(),
            )
        }),
        (Some(m), _) if m.value == 0 => Err(diag(
            file,
            pick(m.referenced, at),
            Some(tool),
            "`max_concurrent` is 0: the tool could never run".into(),
        )),
        (Some(m), q) => Ok(Some(Concurrency {
            max_concurrent: m.value,
            queue_seconds: q.map(|q| q.value).unwrap_or(DEFAULT_QUEUE_SECONDS),
        })),
    }
}

fn pick(at: Location, or: Location) -> Location {
    if at == Location::UNKNOWN { or } else { at }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration(&Duration::Seconds(7)), Ok(7));
        assert_eq!(parse_duration(&Duration::Text("30m".into())), Ok(1800));
        assert_eq!(parse_duration(&Duration::Text("2h".into())), Ok(7200));
        assert_eq!(parse_duration(&Duration::Text("90s".into())), Ok(90));
        assert!(parse_duration(&Duration::Text("5 days".into())).is_err());
    }
}
