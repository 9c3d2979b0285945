//! From a verified token's claims (a JWT's payload, an introspection
//! answer) to a [`Principal`]: subject, client, groups, tenant, and the
//! scopes the resource requires.

use serde_json::{Map, Value};

use crate::{DEFAULT_TENANT, Method, Principal, Refusal};

/// Which claims say what, and which scopes every token must carry.
#[derive(Debug, Clone, Default)]
pub struct ClaimMapping {
    /// The claim naming the tenant (a dotted path reaches into objects,
    /// e.g. `org.id`). When set, a token without it is refused; when not,
    /// every caller is in [`DEFAULT_TENANT`].
    pub tenant_claim: Option<String>,
    /// The claim listing groups or roles (an array of strings, or one
    /// space-separated string; dotted paths as for the tenant).
    pub groups_claim: Option<String>,
    /// Scopes every token must carry (`scope`, space-separated, or `scp`).
    pub required_scopes: Vec<String>,
}

/// A claim by dotted path.
fn lookup<'a>(claims: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    let mut parts = path.split('.');
    let mut cur = claims.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// An array of strings, or one space-separated string.
fn strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::String(s) => Some(s.split_whitespace().map(str::to_string).collect()),
        Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string)).collect(),
        _ => None,
    }
}

/// A tenant names per-tenant state (pools, workspaces, state images): by
/// the rule of every name that becomes one path component
/// ([`cordon_config::valid_name_component`]), checked once, here, so that
/// no authenticated tenant is refused later by the volumes.
pub(crate) fn check_tenant(t: &str) -> Result<(), String> {
    cordon_config::check_name_component("tenant", t).map(|_| ())
}

impl ClaimMapping {
    /// The principal the claims name, or why the token is refused.
    pub fn principal(
        &self,
        claims: &Map<String, Value>,
        method: Method,
    ) -> Result<Principal, Refusal> {
        let subject = match claims.get("sub") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(Refusal::Invalid(
                    "the token names no subject (`sub`)".into(),
                ));
            }
        };
        let client_id = ["client_id", "azp"]
            .iter()
            .find_map(|k| claims.get(*k).and_then(Value::as_str))
            .map(str::to_string);
        let groups = match &self.groups_claim {
            None => Vec::new(),
            Some(c) => match lookup(claims, c) {
                None => Vec::new(),
                Some(v) => strings(v).ok_or_else(|| {
                    Refusal::Invalid(format!(
                        "the token's `{c}` claim is neither a string nor a list of strings"
                    ))
                })?,
            },
        };
        let tenant = match &self.tenant_claim {
            None => DEFAULT_TENANT.to_string(),
            Some(c) => match lookup(claims, c) {
                Some(Value::String(t)) => {
                    check_tenant(t).map_err(|e| Refusal::Invalid(format!("the token's {e}")))?;
                    t.clone()
                }
                Some(_) => {
                    return Err(Refusal::Invalid(format!(
                        "the token's tenant claim `{c}` is not a string"
                    )));
                }
                None => {
                    return Err(Refusal::Invalid(format!(
                        "the token carries no tenant claim `{c}`"
                    )));
                }
            },
        };
        if !self.required_scopes.is_empty() {
            let have: Vec<String> = ["scope", "scp"]
                .iter()
                .filter_map(|k| claims.get(*k).and_then(strings))
                .flatten()
                .collect();
            if !self.required_scopes.iter().all(|s| have.contains(s)) {
                return Err(Refusal::InsufficientScope {
                    scope: self.required_scopes.join(" "),
                });
            }
        }
        Ok(Principal {
            subject,
            client_id,
            groups,
            tenant,
            method,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn claims_map_to_a_principal() {
        let map = ClaimMapping {
            tenant_claim: Some("org.id".into()),
            groups_claim: Some("roles".into()),
            required_scopes: vec!["mcp".into()],
        };
        let p = map
            .principal(
                &m(json!({"sub": "ann", "azp": "cli", "roles": ["a", "b"], "org": {"id": "t1"}, "scope": "x mcp"})),
                Method::Jwt,
            )
            .unwrap();
        assert_eq!(p.subject, "ann");
        assert_eq!(p.client_id.as_deref(), Some("cli"));
        assert_eq!(p.groups, vec!["a", "b"]);
        assert_eq!(p.tenant, "t1");
        // Without the tenant claim: refused, saying which.
        let e = map
            .principal(&m(json!({"sub": "ann", "scope": "mcp"})), Method::Jwt)
            .unwrap_err();
        assert_eq!(
            e,
            Refusal::Invalid("the token carries no tenant claim `org.id`".into())
        );
        // A tenant that could name a path elsewhere, or that no workspace
        // or state directory could be named after, is refused, saying why.
        for bad in ["../x", ".hidden", "-", "-x", "a/b", ""] {
            let e = map
                .principal(
                    &m(json!({"sub": "ann", "org": {"id": bad}, "scope": "mcp"})),
                    Method::Jwt,
                )
                .unwrap_err();
            assert_eq!(
                e,
                Refusal::Invalid(format!(
                    "the token's tenant `{bad}` cannot name a directory (1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.` or `-`)"
                )),
                "{bad}"
            );
        }
        // The positive control: the same rule the volumes use.
        for good in ["t1", "a.b", "a-b", "a_b"] {
            assert!(cordon_config::valid_name_component(good), "{good}");
            map.principal(
                &m(json!({"sub": "ann", "org": {"id": good}, "scope": "mcp"})),
                Method::Jwt,
            )
            .unwrap();
        }
        // Missing scope: insufficient_scope, naming the required ones.
        let e = map
            .principal(
                &m(json!({"sub": "ann", "org": {"id": "t1"}, "scp": ["x"]})),
                Method::Jwt,
            )
            .unwrap_err();
        assert_eq!(
            e,
            Refusal::InsufficientScope {
                scope: "mcp".into()
            }
        );
        // No subject.
        let e = ClaimMapping::default()
            .principal(&m(json!({"aud": "x"})), Method::Jwt)
            .unwrap_err();
        assert!(matches!(e, Refusal::Invalid(_)));
        let p = ClaimMapping::default()
            .principal(&m(json!({"sub": "bo"})), Method::Jwt)
            .unwrap();
        assert_eq!(p.tenant, DEFAULT_TENANT);
    }
}
