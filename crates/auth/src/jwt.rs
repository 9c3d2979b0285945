//! JWT access tokens, checked as an OAuth 2.1 resource server does: the
//! signature against the issuer's published keys (JWKS), `iss`, `aud` (this
//! resource), `exp` and `nbf` with a small leeway.
//!
//! The keys come from `jwks_uri`, or from the issuer's metadata (RFC 8414
//! `/.well-known/oauth-authorization-server`, else OpenID Connect
//! discovery) whose `issuer` must be the configured one. They are cached
//! for `keys_max_age` (default [`DEFAULT_KEYS_MAX_AGE`]) and fetched again
//! when a token names a `kid` the cache lacks (a rotation), at most once
//! per `refetch_floor`, so tokens with made-up key ids cannot make cordon
//! hammer the issuer.
//!
//! Keys past their cache lifetime that cannot be fetched again (the issuer
//! is unreachable, or answers wrongly) are still used for at most
//! `max_stale` (default [`DEFAULT_MAX_STALE`]) past that lifetime, so a
//! short outage of the issuer does not stop every caller; after that every
//! token is refused as unverifiable ([`Refusal::Unavailable`], `503`) until
//! the keys are fetched again: keys the issuer may have revoked are not
//! trusted for as long as it stays unreachable.
//!
//! The algorithm is pinned to the key: a key's own `alg` when the JWKS
//! gives one, else the algorithms of its type (RSA: RS*/PS*, EC: the
//! curve's ES*, OKP: EdDSA). Symmetric (`HS*`) and `none` tokens are never
//! accepted, and symmetric keys in the JWKS are ignored. Signature checks
//! are `jsonwebtoken`'s (on ring).

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::Refusal;

/// How long fetched keys are used before they are fetched again, by default.
pub const DEFAULT_KEYS_MAX_AGE: Duration = Duration::from_secs(600);
/// How long past their cache lifetime keys are still used while they cannot
/// be fetched again, by default.
pub const DEFAULT_MAX_STALE: Duration = Duration::from_secs(900);
/// The default least time between two fetches of the keys.
pub const DEFAULT_REFETCH_FLOOR: Duration = Duration::from_secs(30);

/// Where the keys are.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    pub issuer: String,
    /// The `aud` a token must carry (the resource's URL).
    pub audience: String,
    /// `None`: from the issuer's metadata.
    pub jwks_uri: Option<String>,
    /// Allowed clock skew for `exp` and `nbf`, in seconds.
    pub leeway_seconds: u64,
    pub refetch_floor: Duration,
    /// How long fetched keys are used before they are fetched again.
    pub keys_max_age: Duration,
    /// How long past `keys_max_age` they are still used while they cannot
    /// be fetched again; after that, tokens are refused as unverifiable.
    pub max_stale: Duration,
}

struct Key {
    kid: Option<String>,
    algs: Vec<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
struct Keys {
    keys: Vec<Arc<Key>>,
    fetched: Option<Instant>,
}

#[derive(Default)]
struct Fetch {
    last_attempt: Option<Instant>,
    jwks_uri: Option<String>,
    fetches: u64,
    /// Why the last attempt failed, until one succeeds.
    last_error: Option<String>,
}

/// Checks JWT access tokens of one issuer for one resource.
pub struct JwtValidator {
    settings: JwtSettings,
    client: reqwest::Client,
    keys: RwLock<Arc<Keys>>,
    fetch: tokio::sync::Mutex<Fetch>,
}

/// The algorithms a JWK may verify, or `None` for keys cordon does not
/// use (symmetric, encryption-only, unknown).
fn key_algs(jwk: &Map<String, Value>) -> Option<Vec<Algorithm>> {
    if jwk
        .get("use")
        .and_then(Value::as_str)
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let by_type: Vec<Algorithm> = match jwk.get("kty").and_then(Value::as_str)? {
        "RSA" => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        "EC" => match jwk.get("crv").and_then(Value::as_str)? {
            "P-256" => vec![Algorithm::ES256],
            "P-384" => vec![Algorithm::ES384],
            _ => return None,
        },
        "OKP" => match jwk.get("crv").and_then(Value::as_str)? {
            "Ed25519" => vec![Algorithm::EdDSA],
            _ => return None,
        },
        _ => return None,
    };
    match jwk.get("alg").and_then(Value::as_str) {
        None => Some(by_type),
        Some(a) => {
            let a = Algorithm::from_str(a).ok()?;
            by_type.contains(&a).then(|| vec![a])
        }
    }
}

fn parse_jwks(set: &Map<String, Value>) -> Result<Vec<Arc<Key>>, String> {
    let list = set
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("the JWKS has no `keys` list")?;
    let mut keys = Vec::new();
    for k in list {
        let Some(obj) = k.as_object() else { continue };
        let Some(algs) = key_algs(obj) else { continue };
        let Ok(jwk) = serde_json::from_value::<jsonwebtoken::jwk::Jwk>(k.clone()) else {
            continue;
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        keys.push(Arc::new(Key {
            kid: obj.get("kid").and_then(Value::as_str).map(str::to_string),
            algs,
            key,
        }));
    }
    Ok(keys)
}

/// The metadata URLs of an issuer: RFC 8414 (with the issuer's path after
/// the well-known part), then OpenID Connect discovery.
fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.find("://").map(|i| i + 3) {
        Some(s) => match trimmed[s..].find('/') {
            Some(p) => trimmed.split_at(s + p),
            None => (trimmed, ""),
        },
        None => (trimmed, ""),
    };
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{trimmed}/.well-known/openid-configuration"),
    ]
}

impl JwtValidator {
    pub fn new(settings: JwtSettings, client: reqwest::Client) -> JwtValidator {
        JwtValidator {
            settings,
            client,
            keys: RwLock::new(Arc::new(Keys::default())),
            fetch: tokio::sync::Mutex::new(Fetch::default()),
        }
    }

    /// A validator whose keys are the key set `jwks` (a JWKS object with a `keys` list, as
    /// an issuer publishes it), taken as just fetched: nothing is fetched until
    /// `refetch_floor` and then `keys_max_age` have passed. For a fixed key set (tests, the
    /// fuzz targets); keys cordon does not use are skipped as when fetched.
    pub fn with_keys(
        settings: JwtSettings,
        jwks: &Map<String, Value>,
    ) -> Result<JwtValidator, String> {
        let keys = parse_jwks(jwks).map_err(|e| format!("JWKS: {e}"))?;
        let client = crate::http::client(None)?;
        let now = Instant::now();
        Ok(JwtValidator {
            settings,
            client,
            keys: RwLock::new(Arc::new(Keys {
                keys,
                fetched: Some(now),
            })),
            fetch: tokio::sync::Mutex::new(Fetch {
                last_attempt: Some(now),
                jwks_uri: None,
                fetches: 0,
                last_error: None,
            }),
        })
    }

    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// How many times the keys were fetched (for tests and `doctor`).
    pub async fn fetches(&self) -> u64 {
        self.fetch.lock().await.fetches
    }

    async fn discover(&self) -> Result<String, String> {
        let mut last = String::new();
        for url in metadata_urls(&self.settings.issuer) {
            let what = format!("authorization server metadata {url}");
            match crate::http::json_object(&what, self.client.get(&url).send().await).await {
                Ok(m) => {
                    let iss = m.get("issuer").and_then(Value::as_str).unwrap_or("");
                    if iss != self.settings.issuer {
                        return Err(format!(
                            "{what}: names issuer `{iss}`, not `{}`",
                            self.settings.issuer
                        ));
                    }
                    return m
                        .get("jwks_uri")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| format!("{what}: has no `jwks_uri`"));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Fetch the keys unless the last attempt was less than the floor ago
    /// (then the cached keys stay, and the error is the last attempt's, if
    /// it failed).
    async fn refresh(&self) -> Result<(), String> {
        let mut f = self.fetch.lock().await;
        if f.last_attempt
            .is_some_and(|t| t.elapsed() < self.settings.refetch_floor)
        {
            return match &f.last_error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            };
        }
        f.last_attempt = Some(Instant::now());
        let r = self.fetch_keys(&mut f).await;
        f.last_error = r.as_ref().err().cloned();
        r
    }

    async fn fetch_keys(&self, f: &mut Fetch) -> Result<(), String> {
        let uri = match (&self.settings.jwks_uri, &f.jwks_uri) {
            (Some(u), _) | (None, Some(u)) => u.clone(),
            (None, None) => {
                let u = self.discover().await?;
                f.jwks_uri = Some(u.clone());
                u
            }
        };
        f.fetches += 1;
        let what = format!("JWKS {uri}");
        let set = crate::http::json_object(&what, self.client.get(&uri).send().await).await?;
        let keys = parse_jwks(&set).map_err(|e| format!("{what}: {e}"))?;
        tracing::debug!(keys = keys.len(), %uri, "fetched the issuer's keys");
        let fresh = Arc::new(Keys {
            keys,
            fetched: Some(Instant::now()),
        });
        match self.keys.write() {
            Ok(mut k) => *k = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        Ok(())
    }

    fn snapshot(&self) -> Arc<Keys> {
        match self.keys.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Fetch the keys now (at start, so a misconfigured issuer shows at
    /// once).
    pub async fn prefetch(&self) -> Result<(), String> {
        self.refresh().await
    }

    /// The key for a token's header.
    fn find(keys: &Keys, kid: Option<&str>, alg: Algorithm) -> Option<Arc<Key>> {
        let fits = |k: &&Arc<Key>| k.algs.contains(&alg);
        match kid {
            Some(kid) => keys
                .keys
                .iter()
                .filter(fits)
                .find(|k| k.kid.as_deref() == Some(kid))
                .cloned(),
            None => {
                let mut c = keys.keys.iter().filter(fits);
                match (c.next(), c.next()) {
                    (Some(k), None) => Some(k.clone()),
                    _ => None,
                }
            }
        }
    }

    /// The verified claims of `token`, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Map<String, Value>, Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            Refusal::Invalid(format!(
                "not a signed JWT with an asymmetric algorithm ({e})"
            ))
        })?;
        let alg = header.alg;
        if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
            return Err(Refusal::Invalid(format!(
                "algorithm {alg:?} is refused: only the issuer's public keys verify tokens"
            )));
        }
        let kid = header.kid.as_deref();
        let mut keys = self.snapshot();
        let max_age = self.settings.keys_max_age;
        let stale = keys.fetched.is_none_or(|t| t.elapsed() >= max_age);
        let mut key = if stale {
            None
        } else {
            Self::find(&keys, kid, alg)
        };
        if key.is_none() {
            let fetched = self.refresh().await;
            if let Err(e) = &fetched {
                tracing::warn!("cannot fetch the issuer's keys: {e}");
            }
            keys = self.snapshot();
            // Keys that could not be fetched again: used for at most
            // `max_stale` past their lifetime, then none are trusted.
            let age = keys.fetched.map(|t| t.elapsed());
            let bound = max_age.saturating_add(self.settings.max_stale);
            if let Err(e) = fetched {
                match age {
                    Some(age) if age >= bound => {
                        return Err(Refusal::Unavailable(format!(
                            "the issuer's keys are {} s old, past their {} s lifetime and the {} s they may be used while they cannot be fetched again: {e}",
                            age.as_secs(),
                            max_age.as_secs(),
                            self.settings.max_stale.as_secs(),
                        )));
                    }
                    Some(_) if !keys.keys.is_empty() => {}
                    _ => return Err(Refusal::Unavailable(e)),
                }
            }
            key = Self::find(&keys, kid, alg);
        }
        let Some(key) = key else {
            return Err(Refusal::Invalid(match kid {
                Some(k) => format!("no key `{k}` of the issuer verifies {alg:?}"),
                None => format!("the token names no key and the issuer has no single {alg:?} key"),
            }));
        };
        let mut v = Validation::new(alg);
        v.algorithms = vec![alg];
        v.leeway = self.settings.leeway_seconds;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.set_issuer(&[&self.settings.issuer]);
        v.set_audience(&[&self.settings.audience]);
        v.required_spec_claims = ["exp", "iss", "aud", "sub"]
            .into_iter()
            .map(str::to_string)
            .collect::<HashSet<_>>();
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &v).map_err(|e| {
                Refusal::Invalid(match e.kind() {
                    ErrorKind::ExpiredSignature => "the token has expired".into(),
                    ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
                    ErrorKind::InvalidAudience => {
                        format!(
                            "the token is not for this resource (aud is not {})",
                            self.settings.audience
                        )
                    }
                    ErrorKind::InvalidIssuer => {
                        format!("the token was not issued by {}", self.settings.issuer)
                    }
                    ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
                    ErrorKind::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
                    _ => format!("the token is refused: {e}"),
                })
            })?;
        Ok(data.claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_algorithms_are_pinned_to_the_key() {
        let m = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            key_algs(&m(json!({"kty": "RSA", "alg": "RS256"}))),
            Some(vec![Algorithm::RS256])
        );
        assert!(
            key_algs(&m(json!({"kty": "RSA"})))
                .unwrap()
                .contains(&Algorithm::PS256)
        );
        // A symmetric key, an RSA key claiming HS256, an encryption key,
        // an unknown curve: never used.
        assert_eq!(key_algs(&m(json!({"kty": "oct", "k": "c2VjcmV0"}))), None);
        assert_eq!(key_algs(&m(json!({"kty": "RSA", "alg": "HS256"}))), None);
        assert_eq!(key_algs(&m(json!({"kty": "RSA", "use": "enc"}))), None);
        assert_eq!(key_algs(&m(json!({"kty": "EC", "crv": "P-521"}))), None);
        assert_eq!(
            key_algs(&m(json!({"kty": "EC", "crv": "P-256"}))),
            Some(vec![Algorithm::ES256])
        );
    }

    #[test]
    fn metadata_urls_insert_the_well_known_part() {
        assert_eq!(
            metadata_urls("https://a.example/tenant1"),
            vec![
                "https://a.example/.well-known/oauth-authorization-server/tenant1",
                "https://a.example/tenant1/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("http://127.0.0.1:9/"),
            vec![
                "http://127.0.0.1:9/.well-known/oauth-authorization-server",
                "http://127.0.0.1:9/.well-known/openid-configuration"
            ]
        );
    }

    mod served {
        //! Against a JWKS served on loopback by the test: rotation, the
        //! refetch floor, algorithm and claim checks.
        use super::super::*;
        use base64::Engine;
        use jsonwebtoken::{EncodingKey, Header};
        use ring::signature::KeyPair;
        use serde_json::json;
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        struct Signer {
            enc: EncodingKey,
            jwk: Value,
        }

        fn signer(kid: &str) -> Signer {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
            let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
            let x =
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
            Signer {
                enc: EncodingKey::from_ed_der(pkcs8.as_ref()),
                jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig"}),
            }
        }

        fn now() -> i64 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        }

        fn token(s: &Signer, kid: &str, claims: Value) -> String {
            let mut h = Header::new(Algorithm::EdDSA);
            h.kid = Some(kid.into());
            let mut c = json!({"iss": "https://iss.example", "aud": "https://r.example/mcp",
                "sub": "ann", "exp": now() + 300});
            for (k, v) in claims.as_object().unwrap() {
                c[k] = v.clone();
            }
            jsonwebtoken::encode(&h, &c, &s.enc).unwrap()
        }

        /// A JWKS server: what it serves, how often it was asked; while `up`
        /// is false it answers 503.
        async fn jwks_server(
            keys: Arc<Mutex<Vec<Value>>>,
            hits: Arc<AtomicU64>,
            up: Arc<AtomicBool>,
        ) -> String {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move {
                loop {
                    let Ok((mut c, _)) = l.accept().await else {
                        return;
                    };
                    let keys = keys.clone();
                    let hits = hits.clone();
                    let up = up.clone();
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut b = [0u8; 1024];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match c.read(&mut b).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&b[..n]),
                            }
                        }
                        hits.fetch_add(1, Ordering::SeqCst);
                        if !up.load(Ordering::SeqCst) {
                            let _ = c
                                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                                .await;
                            return;
                        }
                        let body = json!({"keys": *keys.lock().unwrap()}).to_string();
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = c.write_all(resp.as_bytes()).await;
                    });
                }
            });
            format!("http://{addr}/jwks")
        }

        fn validator(uri: &str, floor: Duration) -> JwtValidator {
            JwtValidator::new(
                JwtSettings {
                    issuer: "https://iss.example".into(),
                    audience: "https://r.example/mcp".into(),
                    jwks_uri: Some(uri.into()),
                    leeway_seconds: 30,
                    refetch_floor: floor,
                    keys_max_age: DEFAULT_KEYS_MAX_AGE,
                    max_stale: DEFAULT_MAX_STALE,
                },
                crate::http::client(None).unwrap(),
            )
        }

        #[tokio::test]
        async fn stale_keys_serve_an_unreachable_issuer_only_within_the_bound() {
            let k1 = signer("k1");
            let keys = Arc::new(Mutex::new(vec![k1.jwk.clone()]));
            let hits = Arc::new(AtomicU64::new(0));
            let up = Arc::new(AtomicBool::new(true));
            let uri = jwks_server(keys, hits.clone(), up.clone()).await;
            // Keys past their lifetime at once (max age 0), so every token
            // makes cordon fetch them again.
            let with_stale = |max_stale: Duration| {
                let mut v = validator(&uri, Duration::ZERO);
                v.settings.keys_max_age = Duration::ZERO;
                v.settings.max_stale = max_stale;
                v
            };
            let within = with_stale(Duration::from_secs(3600));
            let past = with_stale(Duration::ZERO);
            // Positive control: both verify while the issuer answers.
            for v in [&within, &past] {
                assert_eq!(
                    v.verify(&token(&k1, "k1", json!({}))).await.unwrap()["sub"],
                    "ann"
                );
            }
            up.store(false, Ordering::SeqCst);
            let before = hits.load(Ordering::SeqCst);
            // The issuer is down: within the bound the stale keys verify
            // (after trying to fetch them again)...
            within.verify(&token(&k1, "k1", json!({}))).await.unwrap();
            assert_eq!(hits.load(Ordering::SeqCst), before + 1);
            // ...past it the token is refused as unverifiable, saying why.
            match past.verify(&token(&k1, "k1", json!({}))).await {
                Err(Refusal::Unavailable(m)) => {
                    assert!(m.starts_with("the issuer's keys are "), "{m}");
                    assert!(
                        m.contains("past their 0 s lifetime and the 0 s they may be used while they cannot be fetched again"),
                        "{m}"
                    );
                    assert!(m.contains("answered 503"), "{m}");
                }
                other => panic!("expected an unavailable refusal, got {other:?}"),
            }
            // The issuer is back: the keys are fetched and verify again.
            up.store(true, Ordering::SeqCst);
            past.verify(&token(&k1, "k1", json!({}))).await.unwrap();
        }

        fn invalid(r: Result<Map<String, Value>, Refusal>) -> String {
            match r {
                Err(Refusal::Invalid(m)) => m,
                other => panic!("expected an invalid-token refusal, got {other:?}"),
            }
        }

        #[tokio::test]
        async fn rotated_keys_are_fetched_and_made_up_kids_do_not_hammer_the_issuer() {
            let (k1, k2) = (signer("k1"), signer("k2"));
            let keys = Arc::new(Mutex::new(vec![k1.jwk.clone()]));
            let hits = Arc::new(AtomicU64::new(0));
            let uri =
                jwks_server(keys.clone(), hits.clone(), Arc::new(AtomicBool::new(true))).await;

            // Rotation (no floor): k1 verifies; the issuer moves to k2; a k2
            // token makes cordon fetch again and verifies; k1 is gone.
            let v = validator(&uri, Duration::ZERO);
            assert_eq!(
                v.verify(&token(&k1, "k1", json!({}))).await.unwrap()["sub"],
                "ann"
            );
            assert_eq!(hits.load(Ordering::SeqCst), 1);
            *keys.lock().unwrap() = vec![k2.jwk.clone()];
            v.verify(&token(&k2, "k2", json!({}))).await.unwrap();
            assert_eq!(hits.load(Ordering::SeqCst), 2);
            let m = invalid(v.verify(&token(&k1, "k1", json!({}))).await);
            assert!(m.contains("no key `k1`"), "{m}");

            // With a floor: one fetch, then made-up kids are refused from
            // the cache without asking the issuer again.
            let w = validator(&uri, Duration::from_secs(3600));
            let before = hits.load(Ordering::SeqCst);
            w.verify(&token(&k2, "k2", json!({}))).await.unwrap();
            for i in 0..5 {
                let m = invalid(w.verify(&token(&k2, &format!("bogus{i}"), json!({}))).await);
                assert!(m.contains("no key"), "{m}");
            }
            assert_eq!(hits.load(Ordering::SeqCst), before + 1);
            assert_eq!(w.fetches().await, 1);

            // Claims: leeway holds for a token just expired, not for one
            // long expired; issuer, audience and subject are required.
            w.verify(&token(&k2, "k2", json!({"exp": now() - 5})))
                .await
                .unwrap();
            let m = invalid(
                w.verify(&token(&k2, "k2", json!({"exp": now() - 300})))
                    .await,
            );
            assert!(m.contains("expired"), "{m}");
            let m = invalid(
                w.verify(&token(&k2, "k2", json!({"nbf": now() + 600})))
                    .await,
            );
            assert!(m.contains("not valid yet"), "{m}");
            let m = invalid(
                w.verify(&token(&k2, "k2", json!({"iss": "https://evil.example"})))
                    .await,
            );
            assert!(m.contains("not issued by"), "{m}");
            let m = invalid(
                w.verify(&token(&k2, "k2", json!({"aud": "https://other.example"})))
                    .await,
            );
            assert!(m.contains("not for this resource"), "{m}");
            // Signed by another key under the same kid.
            let m = invalid(w.verify(&token(&k1, "k2", json!({}))).await);
            assert!(m.contains("signature does not verify"), "{m}");

            // HS256 with the public key's bytes as the secret: refused
            // before any key is looked at.
            let mut h = Header::new(Algorithm::HS256);
            h.kid = Some("k2".into());
            let x = k2.jwk["x"].as_str().unwrap();
            let hs = jsonwebtoken::encode(
                &h,
                &json!({"iss": "https://iss.example", "aud": "https://r.example/mcp", "sub": "ann", "exp": now() + 60}),
                &EncodingKey::from_secret(x.as_bytes()),
            )
            .unwrap();
            let m = invalid(w.verify(&hs).await);
            assert!(m.contains("HS256 is refused"), "{m}");
            // alg none.
            let b =
                |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
            let none = format!(
                "{}.{}.",
                b(json!({"alg": "none", "kid": "k2"})),
                b(
                    json!({"iss": "https://iss.example", "aud": "https://r.example/mcp", "sub": "ann", "exp": now() + 60})
                )
            );
            let m = invalid(w.verify(&none).await);
            assert!(m.contains("not a signed JWT"), "{m}");
        }
    }
}
