//! `oauth2`: the client credentials grant (RFC 6749 §4.4) or token
//! exchange (RFC 8693) against a token endpoint, with scope and audience
//! from the manifest, and RFC 7009 revocation where the server offers it
//! (`revocation_endpoint`). The client secret comes from a file or the
//! broker's environment, never from a manifest. HTTPS is verified against
//! the system roots or the provider's `ca_file`.
//!
//! Each request runs on a thread of its own with its own small async
//! runtime, so that minting may be asked from anywhere (a gateway's async
//! task included).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use zeroize::Zeroizing;

use crate::config::{ClientAuth, ProviderSpec, read_private};
use crate::provider::{
    MintRequest, Minted, Provider, Revoked, clamp_expiry, client_auth, is_exchange,
};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

pub(crate) struct OAuth2 {
    name: String,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
    exchange: bool,
    client_id: String,
    secret_file: Option<PathBuf>,
    secret_env: Option<String>,
    auth: ClientAuth,
    subject_file: Option<PathBuf>,
    subject_env: Option<String>,
    subject_type: String,
    ca_file: Option<PathBuf>,
    timeout: Duration,
}

/// Read a secret from a private file or a variable of the broker.
fn secret_from(
    what: &str,
    file: &Option<PathBuf>,
    env: &Option<String>,
) -> Result<Option<Zeroizing<String>>, String> {
    match (file, env) {
        (Some(f), _) => {
            let s = read_private(f).map_err(|e| format!("{what}: {e}"))?;
            Ok(Some(Zeroizing::new(
                s.trim_end_matches(['\n', '\r']).to_string(),
            )))
        }
        (None, Some(v)) => std::env::var(v)
            .map(|s| Some(Zeroizing::new(s)))
            .map_err(|_| format!("{what}: the broker's ${v} is not set (or not UTF-8)")),
        (None, None) => Ok(None),
    }
}

impl OAuth2 {
    pub(crate) fn new(name: &str, s: &ProviderSpec, timeout: Duration) -> Result<OAuth2, String> {
        Ok(OAuth2 {
            name: name.to_string(),
            token_endpoint: s.token_endpoint.clone().unwrap_or_default(),
            revocation_endpoint: s.revocation_endpoint.clone(),
            exchange: is_exchange(s.grant),
            client_id: s.client_id.clone().unwrap_or_default(),
            secret_file: s.client_secret_file.clone(),
            secret_env: s.client_secret_env.clone(),
            auth: client_auth(s.client_auth),
            subject_file: s.subject_token_file.clone(),
            subject_env: s.subject_token_env.clone(),
            subject_type: s
                .subject_token_type
                .clone()
                .unwrap_or_else(|| ACCESS_TOKEN_TYPE.to_string()),
            ca_file: s.ca_file.clone(),
            timeout,
        })
    }

    fn what(&self) -> String {
        format!("provider {}", self.name)
    }

    fn client(&self) -> Result<reqwest::Client, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.timeout)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .https_only(false);
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| format!("{}: ca_file {}: {e}", self.what(), ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                format!(
                    "{}: ca_file {}: not PEM certificates: {e}",
                    self.what(),
                    ca.display()
                )
            })?;
            b = b.tls_certs_only(certs);
        }
        b.build()
            .map_err(|e| format!("{}: HTTP client: {e}", self.what()))
    }

    /// POST `form` to `url` with the client's authentication; the status
    /// and body (kept zeroised), on a thread of its own.
    fn post(
        &self,
        url: &str,
        mut form: Vec<(&'static str, Zeroizing<String>)>,
    ) -> Result<(u16, Zeroizing<Vec<u8>>), String> {
        let what = self.what();
        let secret = secret_from(
            &format!("{what}: client secret"),
            &self.secret_file,
            &self.secret_env,
        )?;
        let client = self.client()?;
        let mut req = client.post(url).header("Accept", "application/json");
        match (self.auth, &secret) {
            (ClientAuth::Basic, Some(s)) => {
                // RFC 6749 §2.3.1: both form-urlencoded before Basic.
                let enc = |v: &str| {
                    Zeroizing::new(
                        form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>(),
                    )
                };
                let user = enc(&self.client_id);
                let pass = enc(s);
                req = req.basic_auth(user.as_str(), Some(pass.as_str()));
            }
            (ClientAuth::Basic, None) | (ClientAuth::Post, None) => {
                form.push(("client_id", Zeroizing::new(self.client_id.clone())));
            }
            (ClientAuth::Post, Some(s)) => {
                form.push(("client_id", Zeroizing::new(self.client_id.clone())));
                form.push(("client_secret", s.clone()));
            }
        }
        let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let req = req.form(&pairs);
        let url_shown = url.to_string();
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("{what}: async runtime: {e}"))?;
                rt.block_on(async move {
                    let resp = req
                        .send()
                        .await
                        .map_err(|e| format!("{what}: {url_shown}: {}", without_url(&e)))?;
                    let status = resp.status().as_u16();
                    let body = resp.bytes().await.map_err(|e| {
                        format!(
                            "{what}: {url_shown}: reading the answer: {}",
                            without_url(&e)
                        )
                    })?;
                    Ok((status, Zeroizing::new(body.to_vec())))
                })
            })
            .join()
            .map_err(|_| format!("{}: the request thread failed", self.what()))?
        })
    }
}

/// A reqwest error's text without its URL (which the caller names).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" ({u})"), "").replace(u.as_str(), "");
    }
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The error an authorization server gives, or the status alone.
fn server_error(status: u16, body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct E {
        error: Option<String>,
        error_description: Option<String>,
    }
    let printable =
        |s: String| -> String { s.chars().filter(|c| !c.is_control()).take(200).collect() };
    match serde_json::from_slice::<E>(body) {
        Ok(E {
            error: Some(e),
            error_description,
        }) => format!(
            "HTTP {status}: {}{}",
            printable(e),
            error_description
                .map(|d| format!(" ({})", printable(d)))
                .unwrap_or_default()
        ),
        _ => format!("HTTP {status}"),
    }
}

impl Provider for OAuth2 {
    fn kind(&self) -> crate::config::Kind {
        crate::config::Kind::Oauth2
    }

    fn mint(&self, req: &MintRequest) -> Result<Minted, String> {
        let what = self.what();
        let mut form: Vec<(&'static str, Zeroizing<String>)> = Vec::new();
        if self.exchange {
            let subject = secret_from(
                &format!("{what}: subject token"),
                &self.subject_file,
                &self.subject_env,
            )?
            .ok_or_else(|| format!("{what}: token exchange without a subject token"))?;
            form.push(("grant_type", Zeroizing::new(TOKEN_EXCHANGE.into())));
            form.push(("subject_token", subject));
            form.push((
                "subject_token_type",
                Zeroizing::new(self.subject_type.clone()),
            ));
            form.push((
                "requested_token_type",
                Zeroizing::new(ACCESS_TOKEN_TYPE.into()),
            ));
        } else {
            form.push(("grant_type", Zeroizing::new("client_credentials".into())));
        }
        form.push(("scope", Zeroizing::new(req.scope.clone())));
        if let Some(a) = &req.audience {
            form.push(("audience", Zeroizing::new(a.clone())));
        }
        let (status, body) = self.post(&self.token_endpoint, form)?;
        if !(200..300).contains(&status) {
            return Err(format!(
                "{what}: {} refused the token request: {}",
                self.token_endpoint,
                server_error(status, &body)
            ));
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            access_token: String,
            #[serde(default)]
            token_type: Option<String>,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        let a: Answer = serde_json::from_slice(&body).map_err(|_| {
            format!(
                "{what}: {} answered without an `access_token`",
                self.token_endpoint
            )
        })?;
        let token = Zeroizing::new(a.access_token);
        if let Some(t) = &a.token_type
            && !t.eq_ignore_ascii_case("bearer")
            && !t.eq_ignore_ascii_case("n_a")
        {
            return Err(format!(
                "{what}: the token type is `{}`, not Bearer",
                t.chars()
                    .filter(|c| !c.is_control())
                    .take(40)
                    .collect::<String>()
            ));
        }
        if token.is_empty() || token.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{what}: the access token is empty or has control characters"
            ));
        }
        let expires_at = SystemTime::now() + Duration::from_secs(a.expires_in.unwrap_or(req.ttl));
        Ok(Minted {
            token,
            expires_at: clamp_expiry(expires_at, req.ttl),
        })
    }

    fn revoke(&self, token: &Zeroizing<String>) -> Result<Revoked, String> {
        let Some(url) = &self.revocation_endpoint else {
            return Ok(Revoked::NotOffered);
        };
        let form = vec![
            ("token", token.clone()),
            ("token_type_hint", Zeroizing::new("access_token".into())),
        ];
        let (status, body) = self.post(url, form)?;
        if (200..300).contains(&status) {
            Ok(Revoked::Done)
        } else {
            Err(format!(
                "{}: {url} refused the revocation: {}",
                self.what(),
                server_error(status, &body)
            ))
        }
    }
}
