//! The HTTP client that reaches the authorization server (metadata, JWKS,
//! introspection): rustls on ring, no proxy, no redirects, the system roots
//! or a configured CA file.

use std::path::Path;
use std::time::Duration;

/// How long one request to the authorization server may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read from it.
const MAX_BODY: usize = 1 << 20;

pub(crate) fn client(ca_file: Option<&Path>) -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("ca_file {}: {e}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {}: not PEM certificates: {e}", ca.display()))?;
        b = b.tls_certs_only(certs);
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// The JSON object a successful answer carries.
pub(crate) async fn json_object(
    what: &str,
    resp: Result<reqwest::Response, reqwest::Error>,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let resp = resp.map_err(|e| format!("{what}: {}", without_url(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("{what}: answered {status}"));
    }
    let body = resp
        .bytes()
        .await
        .map_err(|e| format!("{what}: {}", without_url(&e)))?;
    if body.len() > MAX_BODY {
        return Err(format!("{what}: answer larger than {MAX_BODY} bytes"));
    }
    match serde_json::from_slice(&body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("{what}: the answer is not a JSON object")),
        Err(e) => Err(format!("{what}: the answer is not JSON: {e}")),
    }
}

fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s
            .replace(&format!(" ({u})"), "")
            .replace(u.as_str(), "<url>");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}
