//! Bearer-token authentication of the HTTP transport: a
//! [`cordon_auth::Validator`] as the transport's [`Authenticator`], with the
//! answers the MCP authorization specification and RFC 6750 require
//! (`401` with `WWW-Authenticate: Bearer resource_metadata="..."`, `403
//! insufficient_scope`), and the Protected Resource Metadata (RFC 9728)
//! that points clients at the authorization server.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cordon_auth::{Refusal, Validator};

use crate::http::{Authenticated, Authenticator};

/// The well-known path of the protected resource metadata (RFC 9728).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The metadata URL of `resource`: the well-known part inserted between
/// its origin and its path (RFC 9728 section 3.1).
pub fn metadata_url(resource: &str) -> String {
    let r = resource.trim_end_matches('/');
    let start = r.find("://").map(|i| i + 3).unwrap_or(0);
    match r[start..].find('/') {
        Some(p) => {
            let (origin, path) = r.split_at(start + p);
            format!("{origin}{METADATA_PATH}{path}")
        }
        None => format!("{r}{METADATA_PATH}"),
    }
}

/// A quoted-string for a `WWW-Authenticate` parameter: quotes and
/// backslashes escaped, control characters dropped.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            c if c.is_control() || !c.is_ascii() => q.push(' '),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// [`Validator`] as the transport's authenticator.
pub struct BearerAuthenticator {
    validator: Arc<Validator>,
    metadata_url: String,
}

impl BearerAuthenticator {
    pub fn new(validator: Arc<Validator>) -> BearerAuthenticator {
        let metadata_url = metadata_url(validator.resource());
        BearerAuthenticator {
            validator,
            metadata_url,
        }
    }

    pub fn validator(&self) -> &Validator {
        &self.validator
    }

    /// The answer to a refused request.
    pub fn refusal(&self, r: &Refusal) -> Response {
        let meta = format!("resource_metadata={}", quoted(&self.metadata_url));
        let (status, challenge, text) = match r {
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                format!("Bearer {meta}"),
                "a bearer token is required".to_string(),
            ),
            Refusal::Malformed(m) => (
                StatusCode::BAD_REQUEST,
                format!(
                    "Bearer error=\"invalid_request\", error_description={}, {meta}",
                    quoted(m)
                ),
                m.clone(),
            ),
            Refusal::Invalid(m) => (
                StatusCode::UNAUTHORIZED,
                format!(
                    "Bearer error=\"invalid_token\", error_description={}, {meta}",
                    quoted(m)
                ),
                m.clone(),
            ),
            Refusal::InsufficientScope { scope } => (
                StatusCode::FORBIDDEN,
                format!(
                    "Bearer error=\"insufficient_scope\", scope={}, {meta}",
                    quoted(scope)
                ),
                format!("the token lacks scope `{scope}`"),
            ),
            Refusal::Unavailable(m) => {
                tracing::warn!("a token could not be checked: {m}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("Bearer {meta}"),
                    "the token cannot be checked now".to_string(),
                )
            }
        };
        let mut resp = (status, text).into_response();
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        resp
    }
}

impl Authenticator for BearerAuthenticator {
    fn authenticate<'a>(
        &'a self,
        parts: &'a axum::http::request::Parts,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Authenticated> + Send + 'a>> {
        Box::pin(async move {
            let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
            let first = values.next();
            let result = if values.next().is_some() {
                Err(Refusal::Malformed(
                    "more than one Authorization header".into(),
                ))
            } else {
                match first.map(|v| v.to_str()) {
                    None => self.validator.authenticate(None).await,
                    Some(Err(_)) => Err(Refusal::Malformed(
                        "the Authorization header is not visible ASCII".into(),
                    )),
                    Some(Ok(v)) => self.validator.authenticate(Some(v)).await,
                }
            };
            result.map_err(|r| self.refusal(&r))
        })
    }

    fn resource_metadata(&self) -> Option<serde_json::Value> {
        let mut m = serde_json::json!({
            "resource": self.validator.resource(),
            "authorization_servers": self.validator.authorization_servers(),
            "bearer_methods_supported": ["header"],
        });
        if !self.validator.required_scopes().is_empty() {
            m["scopes_supported"] = serde_json::json!(self.validator.required_scopes());
        }
        Some(m)
    }

    fn describe(&self) -> String {
        self.validator.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_follow_rfc_9728() {
        assert_eq!(
            metadata_url("https://m.example/mcp"),
            "https://m.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("https://m.example"),
            "https://m.example/.well-known/oauth-protected-resource"
        );
        assert_eq!(quoted("a\"b\\c\n"), "\"a\\\"b\\\\c \"");
    }
}
