//! The provider file: which providers the broker may mint from, outside
//! any manifest (a manifest names a provider, never how to reach it).
//!
//! ```yaml
//! default: jira
//! providers:
//!   jira:
//!     type: oauth2
//!     token_endpoint: https://auth.internal.example/oauth2/token
//!     client_id: cordon
//!     client_secret_file: /etc/cordon/jira-client.secret
//! ```
//!
//! The file, and every file it names that holds a secret, must be owned by
//! the broker's user or root and be neither group- nor world-readable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;
use zeroize::Zeroizing;

/// Where the provider file is looked for when neither `--providers` nor
/// `CORDON_PROVIDERS` names one.
pub const DEFAULT_PATH: &str = "/etc/cordon/providers.yaml";
/// The variable naming the provider file.
pub const ENV: &str = "CORDON_PROVIDERS";

/// Why the file cannot be used (file:line:column).
pub use cordon_config::ConfigError;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File_ {
    #[serde(default)]
    default: Option<Spanned<String>>,
    providers: BTreeMap<String, Spanned<ProviderSpec>>,
}

/// The kinds of provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A command answering `{token, expires_at}` for `{tool, session, scope, ttl}`.
    Exec,
    /// An OAuth2 token endpoint (client credentials or token exchange).
    Oauth2,
    /// A fixed value from a file or the broker's environment (development only).
    Static,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Oauth2 => "oauth2",
            Kind::Static => "static",
        }
    }
}

/// An OAuth2 grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// RFC 6749 §4.4.
    ClientCredentials,
    /// RFC 8693: the broker's own subject token exchanged for a scoped one.
    TokenExchange,
}

/// How the client authenticates to the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// `client_secret_basic` (the default).
    Basic,
    /// `client_secret_post`.
    Post,
}

/// One provider as written: every key of every kind, checked by kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    #[serde(rename = "type")]
    pub kind: Kind,
    /// exec: the mint command, argv form (never through a shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// exec: the revoke command (given the token on stdin).
    #[serde(default)]
    pub revoke: Option<Vec<String>>,
    /// exec, oauth2: seconds one mint or revocation may take (default 10).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// oauth2: the token endpoint URL.
    #[serde(default)]
    pub token_endpoint: Option<String>,
    /// oauth2: the RFC 7009 revocation endpoint, when the server has one.
    #[serde(default)]
    pub revocation_endpoint: Option<String>,
    #[serde(default)]
    pub grant: Option<Grant>,
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub client_secret_env: Option<String>,
    #[serde(default)]
    pub client_auth: Option<ClientAuth>,
    /// oauth2 token exchange: the broker's subject token.
    #[serde(default)]
    pub subject_token_file: Option<PathBuf>,
    #[serde(default)]
    pub subject_token_env: Option<String>,
    #[serde(default)]
    pub subject_token_type: Option<String>,
    /// oauth2: PEM roots to verify the endpoints with instead of the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// static: the file holding the value.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// static: the broker's variable holding the value.
    #[serde(default)]
    pub env: Option<String>,
}

/// A loaded provider file.
#[derive(Debug, Clone)]
pub struct ProviderFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The provider a secret without `provider` uses.
    pub default: Option<String>,
    /// Each provider by name, with its line and column.
    pub providers: BTreeMap<String, (ProviderSpec, u64, u64)>,
}

/// Which provider file to use: `explicit` (`--providers`), else
/// `$CORDON_PROVIDERS`, else [`DEFAULT_PATH`] when it exists. `Ok(None)`:
/// none configured. A file that was named but cannot be read is an error.
pub fn discover(explicit: Option<&Path>) -> Result<Option<ProviderFile>, ConfigError> {
    if let Some(p) = explicit {
        return load(p).map(Some);
    }
    if let Some(p) = std::env::var_os(ENV).filter(|v| !v.is_empty()) {
        return load(Path::new(&p)).map(Some);
    }
    let d = Path::new(DEFAULT_PATH);
    match std::fs::symlink_metadata(d) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => load(d).map(Some),
    }
}

fn whole(path: &Path, message: String) -> ConfigError {
    ConfigError {
        path: path.to_path_buf(),
        line: 0,
        column: 0,
        message,
    }
}

/// Read a file that holds secrets: owned by the caller or root, neither
/// group- nor world-readable (checked on the open descriptor).
pub fn read_private(path: &Path) -> Result<Zeroizing<String>, ConfigError> {
    cordon_config::read_checked(path, cordon_config::Privacy::Private).map_err(|m| whole(path, m))
}

/// Load and check a provider file.
pub fn load(path: &Path) -> Result<ProviderFile, ConfigError> {
    let text = read_private(path)?;
    parse(path, &text)
}

/// Parse provider-file text (`path` for messages).
pub fn parse(path: &Path, text: &str) -> Result<ProviderFile, ConfigError> {
    let f: File_ = serde_saphyr::from_str(text).map_err(|e| {
        let y = cordon_config::yaml_error(&e);
        ConfigError {
            path: path.to_path_buf(),
            line: y.line,
            column: y.column,
            message: y.message,
        }
    })?;
    let mut providers = BTreeMap::new();
    for (name, spec) in f.providers {
        let at = spec.referenced;
        let (line, column) = (at.line(), at.column());
        let err = |m: String| ConfigError {
            path: path.to_path_buf(),
            line,
            column,
            message: format!("provider `{name}`: {m}"),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(err("a name is letters, digits, `_` or `-`".into()));
        }
        check_spec(&spec.value).map_err(err)?;
        providers.insert(name, (spec.value, line, column));
    }
    let default = match f.default {
        None => None,
        Some(d) => {
            if !providers.contains_key(&d.value) {
                return Err(ConfigError {
                    path: path.to_path_buf(),
                    line: d.referenced.line(),
                    column: d.referenced.column(),
                    message: format!("default provider `{}` is not defined", d.value),
                });
            }
            Some(d.value)
        }
    };
    Ok(ProviderFile {
        path: path.to_path_buf(),
        default,
        providers,
    })
}

/// The keys each kind takes, and those it needs.
fn check_spec(s: &ProviderSpec) -> Result<(), String> {
    let set = |present: bool, key: &str, out: &mut Vec<String>| {
        if present {
            out.push(key.to_string());
        }
    };
    let mut given = Vec::new();
    set(s.command.is_some(), "command", &mut given);
    set(s.revoke.is_some(), "revoke", &mut given);
    set(s.timeout_seconds.is_some(), "timeout_seconds", &mut given);
    set(s.token_endpoint.is_some(), "token_endpoint", &mut given);
    set(
        s.revocation_endpoint.is_some(),
        "revocation_endpoint",
        &mut given,
    );
    set(s.grant.is_some(), "grant", &mut given);
    set(s.client_id.is_some(), "client_id", &mut given);
    set(
        s.client_secret_file.is_some(),
        "client_secret_file",
        &mut given,
    );
    set(
        s.client_secret_env.is_some(),
        "client_secret_env",
        &mut given,
    );
    set(s.client_auth.is_some(), "client_auth", &mut given);
    set(
        s.subject_token_file.is_some(),
        "subject_token_file",
        &mut given,
    );
    set(
        s.subject_token_env.is_some(),
        "subject_token_env",
        &mut given,
    );
    set(
        s.subject_token_type.is_some(),
        "subject_token_type",
        &mut given,
    );
    set(s.ca_file.is_some(), "ca_file", &mut given);
    set(s.file.is_some(), "file", &mut given);
    set(s.env.is_some(), "env", &mut given);
    let allowed: &[&str] = match s.kind {
        Kind::Exec => &["command", "revoke", "timeout_seconds"],
        Kind::Oauth2 => &[
            "token_endpoint",
            "revocation_endpoint",
            "grant",
            "client_id",
            "client_secret_file",
            "client_secret_env",
            "client_auth",
            "subject_token_file",
            "subject_token_env",
            "subject_token_type",
            "ca_file",
            "timeout_seconds",
        ],
        Kind::Static => &["file", "env"],
    };
    if let Some(k) = given.iter().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "`{k}` does not apply to a provider of type {}",
            s.kind.name()
        ));
    }
    if s.timeout_seconds == Some(0) {
        return Err("timeout_seconds is 0".into());
    }
    match s.kind {
        Kind::Exec => {
            for (key, argv) in [("command", &s.command), ("revoke", &s.revoke)] {
                if let Some(a) = argv
                    && (a.is_empty() || a[0].is_empty())
                {
                    return Err(format!("`{key}` is empty"));
                }
            }
            if s.command.is_none() {
                return Err("an exec provider needs `command: [program, args...]`".into());
            }
        }
        Kind::Oauth2 => {
            let Some(ep) = &s.token_endpoint else {
                return Err("an oauth2 provider needs `token_endpoint`".into());
            };
            check_url("token_endpoint", ep)?;
            if let Some(r) = &s.revocation_endpoint {
                check_url("revocation_endpoint", r)?;
            }
            if s.client_id.as_deref().is_none_or(str::is_empty) {
                return Err("an oauth2 provider needs `client_id`".into());
            }
            if s.client_secret_file.is_some() && s.client_secret_env.is_some() {
                return Err("give one of `client_secret_file` and `client_secret_env`".into());
            }
            let exchange = s.grant == Some(Grant::TokenExchange);
            let subject =
                s.subject_token_file.is_some() as u8 + s.subject_token_env.is_some() as u8;
            match (exchange, subject) {
                (true, 1) => {}
                (true, _) => {
                    return Err(
                        "token exchange needs one of `subject_token_file` and `subject_token_env`"
                            .into(),
                    );
                }
                (false, 0) if s.subject_token_type.is_none() => {}
                (false, _) => {
                    return Err("`subject_token_*` applies to `grant: token_exchange`".into());
                }
            }
        }
        Kind::Static => {
            if s.file.is_some() == s.env.is_some() {
                return Err("a static provider needs one of `file` and `env`".into());
            }
        }
    }
    Ok(())
}

/// `https://...`, or `http://` to a loopback address only.
fn check_url(key: &str, u: &str) -> Result<(), String> {
    if u.starts_with("https://") {
        return Ok(());
    }
    if let Some(rest) = u.strip_prefix("http://") {
        let host = rest.split(['/', '?']).next().unwrap_or("");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        parse(Path::new("p.yaml"), text).unwrap_err()
    }

    #[test]
    fn each_kind_parses_and_errors_name_the_line() {
        let f = parse(
            Path::new("p.yaml"),
            "default: a\nproviders:\n  a:\n    type: exec\n    command: [/bin/mint]\n  b:\n    type: static\n    env: TOKEN\n  c:\n    type: oauth2\n    token_endpoint: https://auth.example/token\n    client_id: x\n",
        )
        .unwrap();
        assert_eq!(f.default.as_deref(), Some("a"));
        assert_eq!(f.providers["b"].1, 7);
        let e = err(
            "providers:\n  a:\n    type: exec\n  b:\n    type: static\n    file: /x\n    command: [y]\n",
        );
        assert_eq!(
            (e.line, e.message.as_str()),
            (
                3,
                "provider `a`: an exec provider needs `command: [program, args...]`"
            )
        );
        let e = err("providers:\n  a:\n    type: static\n    file: /x\n    command: [y]\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("`command` does not apply"), "{e}");
        let e = err("providers:\n  a:\n    type: vault\n");
        assert_eq!(e.line, 3, "{e}");
        let e = err("default: b\nproviders:\n  a:\n    type: static\n    env: X\n");
        assert_eq!(
            (e.line, e.message.as_str()),
            (1, "default provider `b` is not defined")
        );
        let e = err(
            "providers:\n  a:\n    type: oauth2\n    token_endpoint: http://auth.example/token\n    client_id: x\n",
        );
        assert!(e.message.contains("not loopback"), "{e}");
        assert!(e.to_string().starts_with("p.yaml:3:"), "{e}");
    }

    #[test]
    fn a_readable_file_is_refused_with_its_path_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("providers.yaml");
        std::fs::write(&p, "providers: {}\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&p).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(&p.display().to_string()) && m.contains("mode 0644"),
            "{m}"
        );
        // Positive control: the same file at 0600 loads.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&p).unwrap().providers.is_empty());
    }
}
