//! The authentication file of `cordon serve --http ADDR --auth FILE`:
//!
//! ```yaml
//! # The URL clients reach the MCP endpoint at: the `resource` of the
//! # protected resource metadata and the `aud` tokens must carry.
//! resource: https://mcp.example.com/mcp
//! # JWT access tokens of this issuer (keys from its metadata, or jwks_uri).
//! issuer: https://auth.example.com
//! jwks_uri: https://auth.example.com/jwks          # optional
//! # Or / and: token introspection (RFC 7662) for opaque tokens.
//! introspection:
//!   endpoint: https://auth.example.com/introspect
//!   client_id: cordon
//!   client_secret_file: /etc/cordon/introspect.secret
//! # Static bearer tokens (`cordon token add NAME`), hashed at rest.
//! static_tokens: /etc/cordon/tokens
//! tenant_claim: tenant        # a token without it is refused
//! groups_claim: groups
//! scopes: [mcp]               # every token must carry these
//! jwks_cache_seconds: 600     # keys are fetched again after this
//! jwks_max_stale_seconds: 900 # and used at most this long past it while
//!                             # the issuer cannot be reached
//! ```
//!
//! The file may not be writable by group or others and must be owned by
//! this user or root; the files holding secrets (the client secret, the
//! token hashes) may not be readable by group or others either.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use cordon_config::Privacy;

/// Why the file cannot be used (file:line:column).
pub use cordon_config::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File_ {
    resource: Spanned<String>,
    #[serde(default)]
    authorization_servers: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    issuer: Option<Spanned<String>>,
    #[serde(default)]
    jwks_uri: Option<Spanned<String>>,
    #[serde(default)]
    audience: Option<Spanned<String>>,
    #[serde(default)]
    introspection: Option<Spanned<IntrospectionFile>>,
    #[serde(default)]
    static_tokens: Option<Spanned<PathBuf>>,
    #[serde(default)]
    tenant_claim: Option<Spanned<String>>,
    #[serde(default)]
    groups_claim: Option<Spanned<String>>,
    #[serde(default)]
    scopes: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    leeway_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    jwks_refetch_floor_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    jwks_cache_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    jwks_max_stale_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    ca_file: Option<Spanned<PathBuf>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IntrospectionFile {
    endpoint: String,
    client_id: String,
    client_secret_file: PathBuf,
}

/// Introspection as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntrospectionConfig {
    pub endpoint: String,
    pub client_id: String,
    pub client_secret_file: PathBuf,
}

/// The largest `leeway_seconds`.
pub const MAX_LEEWAY: u64 = 300;
/// `leeway_seconds` when not given.
pub const DEFAULT_LEEWAY: u64 = 30;

/// The largest `jwks_cache_seconds` and `jwks_max_stale_seconds` (a day).
pub const MAX_JWKS_SECONDS: u64 = 86_400;

/// A checked authentication file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    pub path: PathBuf,
    pub resource: String,
    /// Advertised in the protected resource metadata; default: the issuer.
    pub authorization_servers: Vec<String>,
    pub issuer: Option<String>,
    pub jwks_uri: Option<String>,
    /// The `aud` tokens must carry; default: `resource`.
    pub audience: String,
    pub introspection: Option<IntrospectionConfig>,
    pub static_tokens: Option<PathBuf>,
    pub tenant_claim: Option<String>,
    pub groups_claim: Option<String>,
    pub scopes: Vec<String>,
    pub leeway_seconds: u64,
    pub jwks_refetch_floor_seconds: u64,
    /// How long fetched keys are used before they are fetched again.
    pub jwks_cache_seconds: u64,
    /// How long past `jwks_cache_seconds` the keys are still used while
    /// they cannot be fetched again; after that, tokens are refused (503).
    pub jwks_max_stale_seconds: u64,
    pub ca_file: Option<PathBuf>,
}

/// `https://...`, or `http://` to a loopback address only.
fn check_url(key: &str, u: &str) -> Result<(), String> {
    if let Some(rest) = u.strip_prefix("https://") {
        if rest.is_empty() {
            return Err(format!("`{key}` {u} names no host"));
        }
        return Ok(());
    }
    if let Some(rest) = u.strip_prefix("http://") {
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = match host.strip_prefix('[') {
            Some(h) => h.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host),
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return Ok(());
        }
        return Err(format!(
            "`{key}` {u} is plain HTTP to a host that is not loopback; use https://"
        ));
    }
    Err(format!("`{key}` {u} is not an https:// URL"))
}

fn yaml_error(path: &Path, e: serde_saphyr::Error) -> ConfigError {
    let y = cordon_config::yaml_error(&e);
    ConfigError {
        path: path.to_path_buf(),
        line: y.line,
        column: y.column,
        message: y.message,
    }
}

impl AuthConfig {
    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<AuthConfig, ConfigError> {
        let text =
            cordon_config::read_checked(path, Privacy::NotWritableByOthers).map_err(|message| {
                ConfigError {
                    path: path.to_path_buf(),
                    line: 0,
                    column: 0,
                    message,
                }
            })?;
        Self::parse(path, &text)
    }

    /// Check the text of an authentication file (`path` for messages).
    pub fn parse(path: &Path, text: &str) -> Result<AuthConfig, ConfigError> {
        let f: File_ = serde_saphyr::from_str(text).map_err(|e| yaml_error(path, e))?;
        let at = |s: &serde_saphyr::Location, message: String| ConfigError {
            path: path.to_path_buf(),
            line: s.line(),
            column: s.column(),
            message,
        };
        let url = |key: &str, v: &Spanned<String>| {
            check_url(key, &v.value).map_err(|m| at(&v.referenced, m))
        };
        url("resource", &f.resource)?;
        if f.resource.value.contains('#') {
            return Err(at(
                &f.resource.referenced,
                "`resource` may not have a fragment (RFC 9728)".into(),
            ));
        }
        if let Some(i) = &f.issuer {
            url("issuer", i)?;
        }
        if let Some(j) = &f.jwks_uri {
            url("jwks_uri", j)?;
            if f.issuer.is_none() {
                return Err(at(
                    &j.referenced,
                    "`jwks_uri` needs `issuer` (the `iss` tokens must carry)".into(),
                ));
            }
        }
        if let Some(a) = &f.audience
            && a.value.is_empty()
        {
            return Err(at(&a.referenced, "`audience` is empty".into()));
        }
        let introspection = match &f.introspection {
            None => None,
            Some(s) => {
                let i = &s.value;
                check_url("introspection.endpoint", &i.endpoint)
                    .map_err(|m| at(&s.referenced, m))?;
                if i.client_id.is_empty() {
                    return Err(at(
                        &s.referenced,
                        "`introspection.client_id` is empty".into(),
                    ));
                }
                Some(IntrospectionConfig {
                    endpoint: i.endpoint.clone(),
                    client_id: i.client_id.clone(),
                    client_secret_file: i.client_secret_file.clone(),
                })
            }
        };
        if f.issuer.is_none() && introspection.is_none() && f.static_tokens.is_none() {
            return Err(ConfigError {
                path: path.to_path_buf(),
                line: 0,
                column: 0,
                message: "names no way to check a token: give `issuer` (JWTs), `introspection` or `static_tokens`".into(),
            });
        }
        let leeway = match &f.leeway_seconds {
            None => DEFAULT_LEEWAY,
            Some(l) if l.value > MAX_LEEWAY => {
                return Err(at(
                    &l.referenced,
                    format!("`leeway_seconds` {} is above {MAX_LEEWAY}", l.value),
                ));
            }
            Some(l) => l.value,
        };
        for c in [&f.tenant_claim, &f.groups_claim].into_iter().flatten() {
            if c.value.is_empty() {
                return Err(at(&c.referenced, "a claim name is empty".into()));
            }
        }
        let scopes =
            match &f.scopes {
                None => Vec::new(),
                Some(s) => {
                    if let Some(bad) = s.value.iter().find(|x| {
                        x.is_empty() || x.contains(char::is_whitespace) || x.contains('"')
                    }) {
                        return Err(at(
                            &s.referenced,
                            format!(
                                "scope `{}` is empty or holds blanks or quotes",
                                bad.escape_debug()
                            ),
                        ));
                    }
                    s.value.clone()
                }
            };
        let jwks_cache_seconds = match &f.jwks_cache_seconds {
            None => crate::jwt::DEFAULT_KEYS_MAX_AGE.as_secs(),
            Some(c) if c.value == 0 => {
                return Err(at(&c.referenced, "`jwks_cache_seconds` is 0".into()));
            }
            Some(c) => c.value,
        };
        for (key, v) in [
            ("jwks_cache_seconds", &f.jwks_cache_seconds),
            ("jwks_max_stale_seconds", &f.jwks_max_stale_seconds),
        ] {
            if let Some(v) = v
                && v.value > MAX_JWKS_SECONDS
            {
                return Err(at(
                    &v.referenced,
                    format!("`{key}` {} is above {MAX_JWKS_SECONDS}", v.value),
                ));
            }
        }
        let authorization_servers = match &f.authorization_servers {
            Some(a) => {
                for u in &a.value {
                    check_url("authorization_servers", u).map_err(|m| at(&a.referenced, m))?;
                }
                a.value.clone()
            }
            None => f.issuer.iter().map(|i| i.value.clone()).collect(),
        };
        Ok(AuthConfig {
            path: path.to_path_buf(),
            audience: f
                .audience
                .map(|a| a.value)
                .unwrap_or_else(|| f.resource.value.clone()),
            resource: f.resource.value,
            authorization_servers,
            issuer: f.issuer.map(|i| i.value),
            jwks_uri: f.jwks_uri.map(|j| j.value),
            introspection,
            static_tokens: f.static_tokens.map(|s| s.value),
            tenant_claim: f.tenant_claim.map(|c| c.value),
            groups_claim: f.groups_claim.map(|c| c.value),
            scopes,
            leeway_seconds: leeway,
            jwks_refetch_floor_seconds: f
                .jwks_refetch_floor_seconds
                .map(|s| s.value)
                .unwrap_or(crate::jwt::DEFAULT_REFETCH_FLOOR.as_secs()),
            jwks_cache_seconds,
            jwks_max_stale_seconds: f
                .jwks_max_stale_seconds
                .map(|s| s.value)
                .unwrap_or(crate::jwt::DEFAULT_MAX_STALE.as_secs()),
            ca_file: f.ca_file.map(|c| c.value),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn err(text: &str) -> ConfigError {
        AuthConfig::parse(Path::new("auth.yaml"), text).unwrap_err()
    }

    #[test]
    fn a_full_file_parses() {
        let c = AuthConfig::parse(
            Path::new("a"),
            "resource: https://m.example/mcp\nissuer: https://i.example\nstatic_tokens: /t\ntenant_claim: org\nscopes: [mcp]\n",
        )
        .unwrap();
        assert_eq!(c.audience, "https://m.example/mcp");
        assert_eq!(c.authorization_servers, vec!["https://i.example"]);
        assert_eq!(c.leeway_seconds, DEFAULT_LEEWAY);
        assert_eq!(c.scopes, vec!["mcp"]);
        assert_eq!(c.jwks_cache_seconds, 600);
        assert_eq!(c.jwks_max_stale_seconds, 900);
    }

    #[test]
    fn errors_name_the_line() {
        let e = err("resource: https://m.example/mcp\nissuer: http://i.example\n");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("plain HTTP"), "{e}");
        let e = err("resource: https://m.example/mcp\nissuer: https://i\nleeway_seconds: 9000\n");
        assert_eq!(e.line, 3, "{e}");
        let e = err("resource: https://m.example/mcp\nissuer: https://i\nbogus: 1\n");
        assert_eq!(e.line, 3, "{e}");
        let e = err("resource: https://m.example/mcp\njwks_uri: https://i/jwks\n");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("needs `issuer`"), "{e}");
        let e = err("resource: https://m.example/mcp\n");
        assert!(e.message.contains("no way to check a token"), "{e}");
        let e = err(
            "resource: https://m.example/mcp\nissuer: https://i\njwks_max_stale_seconds: 90000\n",
        );
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("is above 86400"), "{e}");
        let e = err("resource: https://m.example/mcp\nissuer: https://i\njwks_cache_seconds: 0\n");
        assert_eq!(e.line, 3, "{e}");
        let e = err("resource: https://m.example/mcp\nstatic_tokens: /t\nscopes: [\"a b\"]\n");
        assert_eq!(e.line, 3, "{e}");
    }

    #[test]
    fn a_file_others_may_write_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("auth.yaml");
        std::fs::write(&p, "resource: https://m.example/mcp\nstatic_tokens: /t\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        AuthConfig::load(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = AuthConfig::load(&p).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
    }
}
