//! Substitution: a secret's token put in place of its placeholder where the
//! secret is bound (header, Basic auth or query parameter, on the bound
//! host, port and path), and any placeholder left over refused.

use base64::Engine as _;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{StatusCode, Uri};
use zeroize::Zeroizing;

use super::report::{Refusal, exfil};
use crate::event::clean;
use crate::inject::{Injection, Placement};
use crate::interception::Interception;
use crate::name::Host;

/// Does `path` (a request path, no query) fall under `prefix`? A path with
/// dot segments or an encoded dot or slash never does.
fn path_under(path: &str, prefix: Option<&str>) -> bool {
    let Some(prefix) = prefix else {
        return true;
    };
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
    {
        return false;
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return false;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (
                (b[i + 1] as char).to_digit(16),
                (b[i + 2] as char).to_digit(16),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        if b[i] == b'+' {
            out.push(b' ');
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Substitute the tokens of the secrets bound to this request (`dest`,
/// `path`) in their placement, then refuse the request if any placeholder
/// is left in its target or headers. Returns the secrets substituted.
pub(crate) fn apply(
    icpt: &Interception,
    dest_host: &Host,
    dest_port: u16,
    parts: &mut Parts,
) -> Result<Vec<String>, Refusal> {
    let mut injected = Vec::new();
    let path = parts.uri.path().to_string();
    for (inj, host) in icpt.injections.iter().zip(icpt.bound.iter()) {
        let b = &inj.binding;
        if host != dest_host || b.port != dest_port || !path_under(&path, b.path_prefix.as_deref())
        {
            continue;
        }
        let hit = match &b.placement {
            Placement::Header { name, template } => in_header(icpt, inj, name, template, parts)?,
            Placement::Basic { username } => in_basic(icpt, inj, username, parts)?,
            Placement::Query { param } => in_query(icpt, inj, param, parts)?,
        };
        if hit {
            injected.push(inj.secret.clone());
        }
    }
    leftover(icpt, parts)?;
    Ok(injected)
}

/// The current token of `inj`'s secret, or the refusal to send without it.
/// A token handed out here is remembered, to be looked for in responses.
fn token(icpt: &Interception, inj: &Injection) -> Result<Zeroizing<String>, Refusal> {
    let tok = inj.source.current().map_err(|e| Refusal::Other {
        status: StatusCode::FORBIDDEN,
        why: format!(
            "no token for secret {} ({}); the request is not sent",
            inj.secret,
            clean(&e)
        ),
    })?;
    icpt.substituted(&inj.secret, &tok, &inj.placeholder);
    Ok(tok)
}

/// The refusal of a token that cannot be put in a header.
fn not_a_header_value(inj: &Injection) -> Refusal {
    Refusal::Other {
        status: StatusCode::BAD_GATEWAY,
        why: format!(
            "the token of secret {} is not a valid header value",
            inj.secret
        ),
    }
}

/// The refusal of a token that cannot be put in a request target.
fn not_a_target(inj: &Injection) -> Refusal {
    Refusal::Other {
        status: StatusCode::BAD_GATEWAY,
        why: format!(
            "the token of secret {} does not fit in a request target",
            inj.secret
        ),
    }
}

/// Header `name` holding exactly `template` with the placeholder: the
/// token put in its place. Returns whether it was there.
fn in_header(
    icpt: &Interception,
    inj: &Injection,
    name: &str,
    template: &str,
    parts: &mut Parts,
) -> Result<bool, Refusal> {
    let Ok(hn) = HeaderName::from_bytes(name.as_bytes()) else {
        return Ok(false);
    };
    let want = template.replace("{token}", &inj.placeholder);
    let values: Vec<HeaderValue> = parts.headers.get_all(&hn).iter().cloned().collect();
    if !values.iter().any(|v| v.as_bytes() == want.as_bytes()) {
        return Ok(false);
    }
    let tok = token(icpt, inj)?;
    parts.headers.remove(&hn);
    for v in values {
        if v.as_bytes() == want.as_bytes() {
            let real = Zeroizing::new(template.replace("{token}", &tok));
            let mut hv = HeaderValue::from_str(&real).map_err(|_| not_a_header_value(inj))?;
            hv.set_sensitive(true);
            parts.headers.append(hn.clone(), hv);
        } else {
            parts.headers.append(hn.clone(), v);
        }
    }
    Ok(true)
}

/// Basic auth as `username` with the placeholder for password: the token
/// put in its place. Returns whether it was there.
fn in_basic(
    icpt: &Interception,
    inj: &Injection,
    username: &str,
    parts: &mut Parts,
) -> Result<bool, Refusal> {
    let Some(v) = parts.headers.get(header::AUTHORIZATION) else {
        return Ok(false);
    };
    let Some(enc) = v.to_str().ok().and_then(|s| {
        s.strip_prefix("Basic ")
            .or_else(|| s.strip_prefix("basic "))
    }) else {
        return Ok(false);
    };
    let Ok(dec) = base64::engine::general_purpose::STANDARD.decode(enc.trim()) else {
        return Ok(false);
    };
    let want = format!("{username}:{}", inj.placeholder);
    if dec != want.as_bytes() {
        return Ok(false);
    }
    let tok = token(icpt, inj)?;
    let real = Zeroizing::new(format!("{username}:{}", tok.as_str()));
    let b64 = Zeroizing::new(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(real.as_bytes())
    ));
    let mut hv = HeaderValue::from_str(&b64).map_err(|_| not_a_header_value(inj))?;
    hv.set_sensitive(true);
    parts.headers.insert(header::AUTHORIZATION, hv);
    Ok(true)
}

/// Query parameter `param` with the placeholder for value: the token
/// (percent-encoded) put in its place. Returns whether it was there.
fn in_query(
    icpt: &Interception,
    inj: &Injection,
    param: &str,
    parts: &mut Parts,
) -> Result<bool, Refusal> {
    let Some(q) = parts.uri.query() else {
        return Ok(false);
    };
    let mut hit = false;
    let pairs: Vec<(String, Option<String>)> = q
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (kv.to_string(), None),
        })
        .collect();
    if !pairs.iter().any(|(k, v)| {
        percent_decode(k) == param.as_bytes()
            && v.as_deref()
                .is_some_and(|v| percent_decode(v) == inj.placeholder.as_bytes())
    }) {
        return Ok(false);
    }
    let tok = token(icpt, inj)?;
    let enc = Zeroizing::new(percent_encode(&tok));
    let mut nq = Zeroizing::new(String::with_capacity(q.len() + enc.len()));
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            nq.push('&');
        }
        nq.push_str(k);
        if let Some(v) = v {
            nq.push('=');
            if percent_decode(k) == param.as_bytes()
                && percent_decode(v) == inj.placeholder.as_bytes()
            {
                nq.push_str(&enc);
                hit = true;
            } else {
                nq.push_str(v);
            }
        }
    }
    let pq = Zeroizing::new(format!("{}?{}", parts.uri.path(), nq.as_str()));
    let mut up = parts.uri.clone().into_parts();
    up.path_and_query = Some(pq.parse().map_err(|_| not_a_target(inj))?);
    parts.uri = Uri::from_parts(up).map_err(|_| not_a_target(inj))?;
    Ok(hit)
}

/// Whatever placeholder is left is somewhere it is not bound: refused.
fn leftover(icpt: &Interception, parts: &Parts) -> Result<(), Refusal> {
    let needles = icpt.needles();
    if let Some(s) = needles.find(parts.uri.to_string().as_bytes()) {
        return Err(exfil(&s, "the request target", icpt));
    }
    for (k, v) in parts.headers.iter() {
        if let Some(s) = needles
            .find(k.as_str().as_bytes())
            .or_else(|| needles.find(v.as_bytes()))
        {
            return Err(exfil(&s, &format!("header {}", k.as_str()), icpt));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefix_is_segment_wise_and_refuses_dot_segments() {
        assert!(path_under("/rest/api", Some("/rest")));
        assert!(path_under("/rest", Some("/rest")));
        assert!(path_under("/rest/", Some("/rest/")));
        assert!(!path_under("/restore", Some("/rest")));
        assert!(!path_under("/rest/../admin", Some("/rest")));
        assert!(!path_under("/rest/%2e%2e/admin", Some("/rest")));
        assert!(!path_under("/rest%2Fadmin", Some("/rest")));
        assert!(!path_under("/other", Some("/rest")));
        assert!(path_under("/anything", None));
    }

    #[test]
    fn percent_round_trip() {
        assert_eq!(percent_decode("a%20b+c"), b"a b c");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
    }
}
