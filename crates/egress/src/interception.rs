//! What the doors of one sandbox need to intercept its HTTP: the secrets
//! bound to hosts (with their placeholders to find), the session CA the
//! sandbox trusts, and the roots the real upstreams are verified against.
//! The engine holds one per sandbox; the intercepting doors serve with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use zeroize::Zeroizing;

use crate::ca::{SessionCa, UpstreamTrust};
use crate::event::clean;
use crate::inject::Injections;
use crate::name::{Host, normalize_host};
use crate::scan::Needles;
use cordon_gate::tokens::Forms;

/// What the doors of one sandbox need to intercept: its injections, the
/// session CA whose certificate the sandbox trusts, and the roots the real
/// upstreams are verified against.
#[derive(Clone)]
pub struct Interception {
    /// The secrets delivered by the proxy, each with its binding.
    pub(crate) injections: Injections,
    /// Each injection's bound host, normalized (same order).
    pub(crate) bound: Vec<Host>,
    pub(crate) ca: Arc<SessionCa>,
    pub(crate) trust: UpstreamTrust,
    needles: Arc<Needles>,
    /// Extra upstream CA certificates (PEM) per bound `(host, port)`.
    pub(crate) extra_ca: HashMap<(Host, u16), String>,
    /// Every token substituted in this session, to be looked for in the
    /// responses of bound endpoints.
    substituted: Arc<Mutex<Substituted>>,
}

/// The tokens substituted so far, and their forms.
#[derive(Default)]
struct Substituted {
    /// (secret, token, placeholder).
    tokens: Vec<(String, Zeroizing<String>, String)>,
    forms: Option<Arc<Forms>>,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interception")
            .field("injections", &self.injections)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

impl Interception {
    /// Interception for `injections`, terminating TLS with `ca` and
    /// verifying upstreams against `trust` (plus each binding's
    /// `upstream_ca`, read now). Fails on a binding whose host is not a
    /// valid host name or whose CA file cannot be read.
    pub fn new(
        injections: Injections,
        ca: Arc<SessionCa>,
        trust: UpstreamTrust,
    ) -> Result<Interception, String> {
        let mut bound = Vec::new();
        let mut extra_ca: HashMap<(Host, u16), String> = HashMap::new();
        for inj in injections.iter() {
            let b = &inj.binding;
            let host = normalize_host(&b.host).map_err(|e| {
                format!(
                    "secret {}: bound host `{}`: {e}",
                    inj.secret,
                    clean(&b.host)
                )
            })?;
            if let Some(path) = &b.upstream_ca {
                let pem = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "secret {}: upstream CA file {}: {e}",
                        inj.secret,
                        path.display()
                    )
                })?;
                crate::ca::parse_pem_certs(&pem).map_err(|e| {
                    format!(
                        "secret {}: upstream CA file {}: {e}",
                        inj.secret,
                        path.display()
                    )
                })?;
                extra_ca
                    .entry((host.clone(), b.port))
                    .or_default()
                    .push_str(&pem);
            }
            bound.push(host);
        }
        let needles = Arc::new(Needles::new(
            injections
                .iter()
                .map(|i| (i.secret.as_str(), i.placeholder.as_str())),
        ));
        Ok(Interception {
            injections,
            bound,
            ca,
            trust,
            needles,
            extra_ca,
            substituted: Arc::default(),
        })
    }

    /// The session CA.
    pub fn ca(&self) -> &Arc<SessionCa> {
        &self.ca
    }

    pub(crate) fn needles(&self) -> &Arc<Needles> {
        &self.needles
    }

    /// Remember that `token` of `secret` (placeholder `placeholder`) was
    /// sent: from now on it is looked for in every response of a bound
    /// endpoint of this session.
    pub(crate) fn substituted(&self, secret: &str, token: &str, placeholder: &str) {
        let mut g = self.substituted.lock().unwrap_or_else(|p| p.into_inner());
        if g.tokens
            .iter()
            .any(|(s, t, _)| s == secret && t.as_str() == token)
        {
            return;
        }
        g.tokens.push((
            secret.to_string(),
            Zeroizing::new(token.to_string()),
            placeholder.to_string(),
        ));
        let forms = Forms::new(
            g.tokens
                .iter()
                .map(|(s, t, p)| (s.as_str(), t.as_str(), p.as_str())),
        );
        g.forms = Some(Arc::new(forms));
    }

    /// The forms of every token substituted so far; `None` before the
    /// first substitution.
    pub(crate) fn reflected_forms(&self) -> Option<Arc<Forms>> {
        self.substituted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forms
            .clone()
    }

    /// Is `host:port` an endpoint some secret is bound to (any path)?
    pub(crate) fn is_bound(&self, host: &Host, port: u16) -> bool {
        self.injections
            .iter()
            .zip(self.bound.iter())
            .any(|(i, h)| h == host && i.binding.port == port)
    }
}
