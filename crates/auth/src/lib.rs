//! cordon-auth: who is calling. A [`Principal`] is the authenticated caller
//! of one agent session (from a bearer token on HTTP, or the local process
//! on stdio) and the tenant it belongs to. Everything a session creates is
//! that tenant's.
//!
//! On HTTP, cordon is an OAuth 2.1 resource server: a [`Validator`] checks
//! a request's bearer token, by the mechanisms the authentication file
//! ([`config`]) turns on: JWTs against the issuer's keys ([`jwt`]), token
//! introspection ([`introspection`]), static tokens ([`static_tokens`]).
//! The claims become a [`Principal`] ([`claims`]).
#![forbid(unsafe_code)]

pub mod claims;
pub mod config;
mod files;
mod http;
pub mod introspection;
pub mod jwt;
pub mod static_tokens;

use serde::Serialize;

pub use claims::ClaimMapping;
pub use config::{AuthConfig, ConfigError};

/// How a principal was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The local process on stdio (or `cordon run`): the host's own user.
    Local,
    /// HTTP without authentication (loopback, or explicitly accepted).
    Unauthenticated,
    /// A JWT access token checked against the issuer's keys.
    Jwt,
    /// A token the authorization server's introspection (RFC 7662) vouched for.
    Introspection,
    /// A static bearer token from the token file.
    StaticToken,
}

/// The caller of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The token's subject (`sub`), the static token's name, or
    /// `local:<uid>`.
    pub subject: String,
    /// The OAuth client the token was issued to, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Group or role claims, for grants.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The tenant: nothing made for one tenant is handed to another.
    pub tenant: String,
    pub method: Method,
}

/// The tenant of callers that carry none (stdio, unauthenticated HTTP).
pub use cordon_config::DEFAULT_TENANT;

impl Principal {
    /// The local user running cordon (stdio, `cordon run`).
    pub fn local(uid: u32) -> Principal {
        Principal {
            subject: format!("local:{uid}"),
            client_id: None,
            groups: Vec::new(),
            tenant: DEFAULT_TENANT.to_string(),
            method: Method::Local,
        }
    }

    /// An HTTP caller when authentication is off.
    pub fn unauthenticated() -> Principal {
        Principal {
            subject: "anonymous".to_string(),
            client_id: None,
            groups: Vec::new(),
            tenant: DEFAULT_TENANT.to_string(),
            method: Method::Unauthenticated,
        }
    }
}

/// Why a request's token is refused. Each maps to the HTTP answer RFC 6750
/// gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token (`401`, no error code).
    Missing,
    /// The `Authorization` header is malformed (`400 invalid_request`).
    Malformed(String),
    /// The token is not valid here (`401 invalid_token`).
    Invalid(String),
    /// The token lacks a required scope (`403 insufficient_scope`); the
    /// scopes needed, space-separated.
    InsufficientScope { scope: String },
    /// The token cannot be checked now: the authorization server (its keys,
    /// its introspection) cannot be reached (`503`).
    Unavailable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Missing => f.write_str("no bearer token"),
            Refusal::Malformed(m) | Refusal::Invalid(m) | Refusal::Unavailable(m) => f.write_str(m),
            Refusal::InsufficientScope { scope } => write!(f, "the token lacks scope `{scope}`"),
        }
    }
}

/// Checks bearer tokens by the mechanisms of an [`AuthConfig`]. A static
/// token (it starts with [`static_tokens::TOKEN_PREFIX`]) is looked up in
/// the token file only; a JWT is verified against the issuer's keys when an
/// issuer is configured; anything else goes to introspection when that is
/// configured. A token the mechanism for its kind refuses is refused: it is
/// not tried against the others.
pub struct Validator {
    resource: String,
    authorization_servers: Vec<String>,
    mapping: ClaimMapping,
    jwt: Option<jwt::JwtValidator>,
    introspection: Option<introspection::Introspector>,
    statics: Option<static_tokens::StaticTokens>,
}

impl Validator {
    /// The validator of a checked authentication file: reads the client
    /// secret and the token file (each checked for its mode and owner).
    pub fn from_config(c: &AuthConfig) -> Result<Validator, String> {
        let shown = c.path.display();
        let client = http::client(c.ca_file.as_deref()).map_err(|e| format!("{shown}: {e}"))?;
        let jwt = c.issuer.as_ref().map(|issuer| {
            jwt::JwtValidator::new(
                jwt::JwtSettings {
                    issuer: issuer.clone(),
                    audience: c.audience.clone(),
                    jwks_uri: c.jwks_uri.clone(),
                    leeway_seconds: c.leeway_seconds,
                    refetch_floor: std::time::Duration::from_secs(c.jwks_refetch_floor_seconds),
                    keys_max_age: std::time::Duration::from_secs(c.jwks_cache_seconds),
                    max_stale: std::time::Duration::from_secs(c.jwks_max_stale_seconds),
                },
                client.clone(),
            )
        });
        let introspection = match &c.introspection {
            None => None,
            Some(i) => {
                let secret = files::read_checked(&i.client_secret_file, files::Privacy::Private)?;
                let secret = zeroize::Zeroizing::new(secret.trim().to_string());
                if secret.is_empty() {
                    return Err(format!("{}: is empty", i.client_secret_file.display()));
                }
                Some(introspection::Introspector::new(
                    introspection::IntrospectionSettings {
                        endpoint: i.endpoint.clone(),
                        client_id: i.client_id.clone(),
                        client_secret: secret,
                        audience: c.audience.clone(),
                        issuer: c.issuer.clone(),
                        leeway_seconds: c.leeway_seconds,
                    },
                    client.clone(),
                ))
            }
        };
        let statics = match &c.static_tokens {
            None => None,
            Some(p) => Some(static_tokens::StaticTokens::load(p)?),
        };
        Ok(Validator {
            resource: c.resource.clone(),
            authorization_servers: c.authorization_servers.clone(),
            mapping: ClaimMapping {
                tenant_claim: c.tenant_claim.clone(),
                groups_claim: c.groups_claim.clone(),
                required_scopes: c.scopes.clone(),
            },
            jwt,
            introspection,
            statics,
        })
    }

    /// The protected resource's URL (RFC 9728 `resource`).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The authorization servers clients are pointed at.
    pub fn authorization_servers(&self) -> &[String] {
        &self.authorization_servers
    }

    /// The scopes every token must carry.
    pub fn required_scopes(&self) -> &[String] {
        &self.mapping.required_scopes
    }

    /// The JWT validator, when JWTs are checked.
    pub fn jwt(&self) -> Option<&jwt::JwtValidator> {
        self.jwt.as_ref()
    }

    /// Which mechanisms are on, for the start line and `doctor`.
    pub fn describe(&self) -> String {
        let mut on = Vec::new();
        if let Some(j) = &self.jwt {
            let s = j.settings();
            on.push(format!(
                "JWT (issuer {}, keys from {})",
                s.issuer,
                s.jwks_uri.as_deref().unwrap_or("its metadata")
            ));
        }
        if let Some(i) = &self.introspection {
            on.push(format!("introspection ({})", i.settings().endpoint));
        }
        if let Some(t) = &self.statics {
            on.push(format!(
                "static tokens ({}, {})",
                t.path().display(),
                t.len()
            ));
        }
        let mut s = format!("bearer tokens for {}: {}", self.resource, on.join(", "));
        if let Some(t) = &self.mapping.tenant_claim {
            s.push_str(&format!("; tenant from `{t}`"));
        }
        if !self.mapping.required_scopes.is_empty() {
            s.push_str(&format!(
                "; scopes {}",
                self.mapping.required_scopes.join(" ")
            ));
        }
        s
    }

    /// Fetch what can be fetched ahead (the issuer's keys), so a wrong
    /// issuer shows at start.
    pub async fn prefetch(&self) -> Result<(), String> {
        match &self.jwt {
            Some(j) => j.prefetch().await,
            None => Ok(()),
        }
    }

    /// The principal of the value of a request's `Authorization` header
    /// (`None`: the request has none).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Refusal> {
        let Some(h) = authorization else {
            return Err(Refusal::Missing);
        };
        let (scheme, token) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refusal::Missing);
        }
        let token = token.trim();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(Refusal::Malformed(
                "the bearer token is empty or holds blanks".into(),
            ));
        }
        if token.starts_with(static_tokens::TOKEN_PREFIX) {
            return match self.statics.as_ref().and_then(|s| s.check(token)) {
                Some(p) => Ok(p),
                None => Err(Refusal::Invalid("unknown static token".into())),
            };
        }
        let looks_jwt = token.split('.').count() == 3;
        if let (Some(j), true) = (&self.jwt, looks_jwt) {
            let claims = j.verify(token).await?;
            return self.mapping.principal(&claims, Method::Jwt);
        }
        if let Some(i) = &self.introspection {
            let claims = i.introspect(token).await?;
            return self.mapping.principal(&claims, Method::Introspection);
        }
        Err(Refusal::Invalid(if looks_jwt {
            "JWTs are not accepted here".into()
        } else {
            "the token is not a JWT, and no introspection is configured".into()
        }))
    }
}
