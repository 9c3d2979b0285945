//! Fuzz the resource server's token checks: a JWT against a fixed key set, a key set (JWKS)
//! from the issuer, and an introspection endpoint's answer. Nothing panics; a token is
//! accepted only when signed by the one key with an asymmetric algorithm and carrying this
//! resource's issuer and audience and a live `exp`; an introspection answer is accepted only
//! when it says `active: true` and names this resource in `aud`.
//!
//! Input: a mode byte, then the token (mode 0), the JWKS (mode 1) or the introspection
//! answer (mode 2).
#![no_main]

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cordon_auth::introspection::{IntrospectionSettings, check_answer};
use cordon_auth::jwt::{JwtSettings, JwtValidator};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "https://cordon.test/mcp";
/// A token of the key below with every claim right, for the JWKS mode.
const GOOD: &str = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCIsImtpZCI6ImsxIn0.eyJpc3MiOiJodHRwczovL2lzc3Vlci50ZXN0IiwiYXVkIjoiaHR0cHM6Ly9jb3Jkb24udGVzdC9tY3AiLCJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMCwic2NvcGUiOiJ0b29scyJ9.xrySMusQyk461sCQCKVBZBobiTQUQWR2DPIDmz7j58GddLEsqDFrUnATGqJ37zbu1Paf488fJz5eXKFVy1AgCw";

fn settings() -> JwtSettings {
    JwtSettings {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        // Never fetched: the keys are taken as just fetched, and the floor is long.
        jwks_uri: Some("http://127.0.0.1:9/jwks".into()),
        leeway_seconds: 30,
        refetch_floor: Duration::from_secs(1 << 30),
        keys_max_age: Duration::from_secs(1 << 30),
        max_stale: Duration::ZERO,
    }
}

fn jwks() -> Map<String, Value> {
    let v = json!({"keys": [
        {"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"},
        {"kty": "oct", "kid": "sym", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}
    ]});
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

static RT: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
});

static V: LazyLock<JwtValidator> =
    LazyLock::new(|| JwtValidator::with_keys(settings(), &jwks()).expect("validator"));

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn for_us(aud: Option<&Value>) -> bool {
    match aud {
        Some(Value::String(a)) => a == AUDIENCE,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(AUDIENCE)),
        _ => false,
    }
}

fn check_claims(c: &Map<String, Value>) {
    assert_eq!(c.get("iss").and_then(Value::as_str), Some(ISSUER), "{c:?}");
    assert!(for_us(c.get("aud")), "{c:?}");
    let exp = c.get("exp").and_then(Value::as_f64).expect("exp");
    assert!(exp + 60.0 >= now() as f64, "expired {exp}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            let Ok(token) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(c) = RT.block_on(V.verify(token)) {
                check_claims(&c);
            }
        }
        1 => {
            let Ok(Value::Object(set)) = serde_json::from_slice::<Value>(rest) else {
                return;
            };
            let Ok(v) = JwtValidator::with_keys(settings(), &set) else {
                return;
            };
            if let Ok(c) = RT.block_on(v.verify(GOOD)) {
                check_claims(&c);
            }
        }
        _ => {
            let Ok(Value::Object(answer)) = serde_json::from_slice::<Value>(rest) else {
                return;
            };
            let s = IntrospectionSettings {
                endpoint: "http://127.0.0.1:9/introspect".into(),
                client_id: "cordon".into(),
                client_secret: String::from("secret").into(),
                audience: AUDIENCE.into(),
                issuer: Some(ISSUER.into()),
                leeway_seconds: 30,
            };
            if let Ok(c) = check_answer(&s, answer) {
                assert_eq!(c.get("active"), Some(&Value::Bool(true)));
                assert!(for_us(c.get("aud")), "{c:?}");
            }
        }
    }
});
