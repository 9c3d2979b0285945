//! Authorization, resolved: which principals may list and use which
//! exposed tools, prompts and resources. A plain value, printed by
//! `cordon explain` and compared by `cordon diff`; the gateway asks
//! [`Access::allows`] before it lists, calls, gets or reads anything.
//!
//! No `access:` section (`PolicySet::access` is `None`) lets every caller
//! use everything. With one, a caller may use exactly what some grant whose
//! principal fields all match it names.

use serde::{Deserialize, Serialize};

/// The grants of a manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    pub grants: Vec<Grant>,
}

/// Principals (every field given must match) and what they may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    #[serde(flatten)]
    pub to: Grantee,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
}

/// Who a grant is for. At least one field is set (load refuses a grant
/// for everyone written by omission).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Grantee {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl std::fmt::Display for Grantee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            ("subject", &self.subject),
            ("client", &self.client),
            ("group", &self.group),
            ("tenant", &self.tenant),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
        .collect();
        f.write_str(&parts.join(","))
    }
}

/// What a name is the name of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Tool,
    Prompt,
    Resource,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Tool, Kind::Prompt, Kind::Resource];

    /// The grant's key for this kind.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Tool => "tools",
            Kind::Prompt => "prompts",
            Kind::Resource => "resources",
        }
    }
}

/// The caller a grant is held against (a view of `cordon_auth::Principal`).
#[derive(Debug, Clone, Copy)]
pub struct Claims<'a> {
    pub subject: &'a str,
    pub client_id: Option<&'a str>,
    pub groups: &'a [String],
    pub tenant: &'a str,
}

impl Grantee {
    /// Whether every field given matches `c`.
    pub fn matches(&self, c: &Claims<'_>) -> bool {
        self.subject.as_deref().is_none_or(|s| s == c.subject)
            && self
                .client
                .as_deref()
                .is_none_or(|s| c.client_id == Some(s))
            && self
                .group
                .as_deref()
                .is_none_or(|g| c.groups.iter().any(|x| x == g))
            && self.tenant.as_deref().is_none_or(|t| t == c.tenant)
    }
}

impl Grant {
    /// The patterns of `kind`.
    pub fn patterns(&self, kind: Kind) -> &[String] {
        match kind {
            Kind::Tool => &self.tools,
            Kind::Prompt => &self.prompts,
            Kind::Resource => &self.resources,
        }
    }
}

impl Access {
    /// Whether a grant gives `c` the `kind` named `name`.
    pub fn allows(&self, c: &Claims<'_>, kind: Kind, name: &str) -> bool {
        self.grants
            .iter()
            .any(|g| g.to.matches(c) && g.patterns(kind).iter().any(|p| glob_matches(p, name)))
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Whether every name `narrow` matches is matched by `wide` (conservative:
/// `false` may be answered for a pattern that is in fact covered, which
/// only makes `cordon diff` flag a change for review).
pub fn glob_covers(wide: &str, narrow: &str) -> bool {
    if wide == narrow || !wide.contains('*') && !narrow.contains('*') {
        return wide == narrow;
    }
    if !narrow.contains('*') {
        return glob_matches(wide, narrow);
    }
    // `narrow` is a glob: covered when `wide` is `<prefix>*` or
    // `*<suffix>` and `narrow` keeps that prefix or suffix literally.
    let stars = wide.matches('*').count();
    if stars == 1 {
        if let Some(prefix) = wide.strip_suffix('*') {
            let lit = narrow.split('*').next().unwrap_or("");
            return lit.starts_with(prefix);
        }
        if let Some(suffix) = wide.strip_prefix('*') {
            let lit = narrow.rsplit('*').next().unwrap_or("");
            return lit.ends_with(suffix);
        }
    }
    false
}

/// Resolve the manifest's `access:` section. Errors and warnings point at
/// the grant or the pattern concerned.
pub(crate) fn resolve(
    file: &std::path::Path,
    m: &crate::manifest::Manifest,
    errors: &mut Vec<crate::Diagnostic>,
    warnings: &mut Vec<crate::Diagnostic>,
) -> Option<Access> {
    use serde_saphyr::Location;
    let section = m.access.as_ref()?;
    let diag = |at: Location, message: String, hint: Option<&str>| crate::Diagnostic {
        file: file.to_path_buf(),
        line: if at == Location::UNKNOWN {
            section.referenced.line()
        } else {
            at.line()
        },
        column: if at == Location::UNKNOWN {
            section.referenced.column()
        } else {
            at.column()
        },
        tool: None,
        message,
        hint: hint.map(str::to_string),
    };
    let mut grants = Vec::new();
    for g in &section.value.grants {
        let at = g.referenced;
        let w = &g.value;
        let to = Grantee {
            subject: w.subject.clone(),
            client: w.client.clone(),
            group: w.group.clone(),
            tenant: w.tenant.clone(),
        };
        let given = [&to.subject, &to.client, &to.group, &to.tenant];
        if given.iter().all(|v| v.is_none()) {
            errors.push(diag(
                at,
                "access: a grant names no principal".into(),
                Some("give `subject`, `client`, `group` or `tenant` (every one given must match); grant everyone with `tenant: <tenant>` per tenant"),
            ));
        }
        for (key, v) in [
            ("subject", &to.subject),
            ("client", &to.client),
            ("group", &to.group),
            ("tenant", &to.tenant),
        ] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                errors.push(diag(at, format!("access: `{key}` is empty"), None));
            }
        }
        let mut lists = [Vec::new(), Vec::new(), Vec::new()];
        for (i, (key, written)) in [
            ("tools", &w.tools),
            ("prompts", &w.prompts),
            ("resources", &w.resources),
        ]
        .into_iter()
        .enumerate()
        {
            for p in written {
                let pat = p.value.trim();
                if pat.is_empty() {
                    errors.push(diag(
                        p.referenced,
                        format!("access: an empty name in `{key}`"),
                        Some("write an exposed name, or a glob such as `scratch__*`"),
                    ));
                    continue;
                }
                if key == "tools" && !could_name_a_tool(m, pat) {
                    warnings.push(diag(
                        p.referenced,
                        format!("access: `{pat}` matches no tool this manifest can expose"),
                        Some("command tools are granted by their key, a server's tools as `<tool>__<name>` (or as-is)"),
                    ));
                }
                lists[i].push(pat.to_string());
            }
        }
        let [tools, prompts, resources] = lists;
        if tools.is_empty() && prompts.is_empty() && resources.is_empty() {
            warnings.push(diag(
                at,
                format!("access: the grant to {to} grants nothing"),
                Some("list `tools`, `prompts` or `resources`"),
            ));
        }
        grants.push(Grant {
            to,
            tools,
            prompts,
            resources,
        });
    }
    Some(Access { grants })
}

/// Whether `pat` can match a command tool's name or a name a server of
/// `m` may expose (any name, for a server exposed as-is).
fn could_name_a_tool(m: &crate::manifest::Manifest, pat: &str) -> bool {
    let literal = pat.split('*').next().unwrap_or("");
    m.tools.iter().any(|(name, t)| match &t.value.mcp {
        None => glob_matches(pat, name),
        Some(server) => {
            if server.expose.as_ref().map(|e| e.value).unwrap_or_default()
                == crate::manifest::Expose::AsIs
            {
                return true;
            }
            let prefix = format!("{name}{}", crate::manifest::NAME_SEPARATOR);
            if pat.contains('*') {
                literal.starts_with(&prefix) || prefix.starts_with(literal)
            } else {
                pat.starts_with(&prefix)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims<'a>(subject: &'a str, groups: &'a [String], tenant: &'a str) -> Claims<'a> {
        Claims {
            subject,
            client_id: Some("agent-app"),
            groups,
            tenant,
        }
    }

    #[test]
    fn globs_match_runs_of_any_characters() {
        assert!(glob_matches("scratch__*", "scratch__read"));
        assert!(glob_matches("scratch__*", "scratch__"));
        assert!(!glob_matches("scratch__*", "scratch_read"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*_count", "word_count"));
        assert!(glob_matches("a*b*c", "a-x-b-y-c"));
        assert!(!glob_matches("a*b*c", "a-x-c-y-b"));
        assert!(!glob_matches("ab*ba", "aba"));
        assert!(glob_matches("word_count", "word_count"));
        assert!(!glob_matches("word_count", "word_counts"));
    }

    #[test]
    fn coverage_is_conservative() {
        assert!(glob_covers("*", "scratch__*"));
        assert!(glob_covers("scratch__*", "scratch__read*"));
        assert!(glob_covers("scratch__*", "scratch__read"));
        assert!(!glob_covers("scratch__read*", "scratch__*"));
        assert!(!glob_covers("scratch__read", "scratch__*"));
        assert!(!glob_covers("a", "b"));
        assert!(glob_covers("*_count", "*word_count"));
    }

    #[test]
    fn a_grant_needs_every_field_it_gives() {
        let a = Access {
            grants: vec![
                Grant {
                    to: Grantee {
                        group: Some("analysts".into()),
                        tenant: Some("acme".into()),
                        ..Default::default()
                    },
                    tools: vec!["scratch__*".into()],
                    ..Default::default()
                },
                Grant {
                    to: Grantee {
                        subject: Some("alice".into()),
                        ..Default::default()
                    },
                    tools: vec!["word_count".into()],
                    prompts: vec!["*".into()],
                    ..Default::default()
                },
            ],
        };
        let analysts = ["analysts".to_string()];
        let acme = claims("bob", &analysts, "acme");
        assert!(a.allows(&acme, Kind::Tool, "scratch__read"));
        assert!(!a.allows(&acme, Kind::Tool, "word_count"));
        assert!(!a.allows(&acme, Kind::Prompt, "scratch__read"));
        // The same group in another tenant is not granted.
        let other = claims("bob", &analysts, "globex");
        assert!(!a.allows(&other, Kind::Tool, "scratch__read"));
        let alice = claims("alice", &[], "globex");
        assert!(a.allows(&alice, Kind::Tool, "word_count"));
        assert!(a.allows(&alice, Kind::Prompt, "anything"));
        assert!(!a.allows(&alice, Kind::Resource, "file:///x"));
        // No grant at all: nothing.
        assert!(!Access::default().allows(&alice, Kind::Tool, "word_count"));
    }
}
