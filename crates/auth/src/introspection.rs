//! Token introspection (RFC 7662): the authorization server says whether a
//! token (opaque or not) is active and what it carries. cordon posts the
//! token with its own client credentials (HTTP Basic) and then checks what
//! a JWT would have been checked for: `active`, `exp`, `iss` (when the
//! configuration names an issuer, an answer without `iss` is refused: the
//! endpoint may vouch for tokens of other issuers it knows) and that `aud`
//! names this resource (an answer without `aud` is refused: a token for
//! another resource of the same server must not pass here).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{Map, Value};
use zeroize::Zeroizing;

use crate::Refusal;

/// Where and as whom to introspect.
pub struct IntrospectionSettings {
    pub endpoint: String,
    pub client_id: String,
    pub client_secret: Zeroizing<String>,
    /// The `aud` an active token must carry.
    pub audience: String,
    /// The `iss` an active token must carry, if set (an answer without one
    /// is refused).
    pub issuer: Option<String>,
    pub leeway_seconds: u64,
}

impl std::fmt::Debug for IntrospectionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntrospectionSettings")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

pub struct Introspector {
    settings: IntrospectionSettings,
    client: reqwest::Client,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Introspector {
    pub fn new(settings: IntrospectionSettings, client: reqwest::Client) -> Introspector {
        Introspector { settings, client }
    }

    pub fn settings(&self) -> &IntrospectionSettings {
        &self.settings
    }

    /// The claims of an active token for this resource, or why not.
    pub async fn introspect(&self, token: &str) -> Result<Map<String, Value>, Refusal> {
        let s = &self.settings;
        let enc = |v: &str| form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            enc(&s.client_id),
            enc(&s.client_secret)
        ));
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("token", token)
            .append_pair("token_type_hint", "access_token")
            .finish();
        let resp = self
            .client
            .post(&s.endpoint)
            .header("authorization", format!("Basic {basic}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await;
        let what = format!("introspection endpoint {}", s.endpoint);
        let m = crate::http::json_object(&what, resp)
            .await
            .map_err(Refusal::Unavailable)?;
        check_answer(s, m)
    }
}

/// What [`Introspector::introspect`] makes of the endpoint's answer (its JSON object): the
/// claims of an active token for this resource, or why it is refused.
pub fn check_answer(
    s: &IntrospectionSettings,
    m: Map<String, Value>,
) -> Result<Map<String, Value>, Refusal> {
    if m.get("active").and_then(Value::as_bool) != Some(true) {
        return Err(Refusal::Invalid("the token is not active".into()));
    }
    if let Some(exp) = m.get("exp").and_then(Value::as_u64)
        && exp.saturating_add(s.leeway_seconds) < now()
    {
        return Err(Refusal::Invalid("the token has expired".into()));
    }
    if let Some(nbf) = m.get("nbf").and_then(Value::as_u64)
        && nbf > now().saturating_add(s.leeway_seconds)
    {
        return Err(Refusal::Invalid("the token is not valid yet (nbf)".into()));
    }
    if let Some(want) = &s.issuer {
        match m.get("iss") {
            None => {
                return Err(Refusal::Invalid(format!(
                    "the introspection answer names no issuer (`iss`); tokens of {want} only are accepted"
                )));
            }
            Some(iss) if iss.as_str() != Some(want.as_str()) => {
                return Err(Refusal::Invalid(format!(
                    "the token was not issued by {want}"
                )));
            }
            Some(_) => {}
        }
    }
    let for_us = match m.get("aud") {
        Some(Value::String(a)) => *a == s.audience,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(s.audience.as_str())),
        _ => false,
    };
    if !for_us {
        return Err(Refusal::Invalid(format!(
            "the token is not for this resource (aud is not {})",
            s.audience
        )));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> IntrospectionSettings {
        IntrospectionSettings {
            endpoint: "http://127.0.0.1:9/introspect".into(),
            client_id: "cordon".into(),
            client_secret: String::from("secret").into(),
            audience: "https://cordon.test/mcp".into(),
            issuer: None,
            leeway_seconds: 30,
        }
    }

    fn answer(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_largest_exp_is_far_future_not_an_overflow() {
        let a = answer(json!({"active": true, "aud": "https://cordon.test/mcp", "exp": u64::MAX}));
        assert!(check_answer(&settings(), a).is_ok());
        // The positive control's counterpart: a past exp is refused, with the reason.
        let a = answer(json!({"active": true, "aud": "https://cordon.test/mcp", "exp": 1}));
        match check_answer(&settings(), a) {
            Err(Refusal::Invalid(why)) => assert_eq!(why, "the token has expired"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_answer_without_iss_is_refused_when_an_issuer_is_configured() {
        let mut s = settings();
        s.issuer = Some("https://iss.example".into());
        // Positive control: the configured issuer passes.
        let a = answer(
            json!({"active": true, "aud": "https://cordon.test/mcp", "iss": "https://iss.example"}),
        );
        assert!(check_answer(&s, a).is_ok());
        // No `iss`: refused, saying so.
        let a = answer(json!({"active": true, "aud": "https://cordon.test/mcp"}));
        match check_answer(&s, a) {
            Err(Refusal::Invalid(why)) => assert_eq!(
                why,
                "the introspection answer names no issuer (`iss`); tokens of https://iss.example only are accepted"
            ),
            other => panic!("{other:?}"),
        }
        // Another issuer, and a non-string `iss`: refused.
        for iss in [json!("https://evil.example"), json!(7)] {
            let a = answer(json!({"active": true, "aud": "https://cordon.test/mcp", "iss": iss}));
            match check_answer(&s, a) {
                Err(Refusal::Invalid(why)) => {
                    assert_eq!(why, "the token was not issued by https://iss.example")
                }
                other => panic!("{other:?}"),
            }
        }
        // Without a configured issuer, an answer without `iss` passes.
        let a = answer(json!({"active": true, "aud": "https://cordon.test/mcp"}));
        assert!(check_answer(&settings(), a).is_ok());
    }

    #[test]
    fn the_largest_leeway_does_not_overflow() {
        let mut s = settings();
        s.leeway_seconds = u64::MAX;
        let a = answer(
            json!({"active": true, "aud": "https://cordon.test/mcp", "nbf": u64::MAX, "exp": 1}),
        );
        assert!(check_answer(&s, a).is_ok());
    }
}
