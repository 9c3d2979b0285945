//! cordon-auth: who is calling. A [`Principal`] is the authenticated caller
//! of one agent session (from a bearer token on HTTP, or the local process
//! on stdio) and the tenant it belongs to. Everything a session creates is
//! that tenant's.
#![forbid(unsafe_code)]

use serde::Serialize;

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
pub const DEFAULT_TENANT: &str = "default";

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
