//! Authorization in the gateway: what a session's principal may list and
//! use (the manifest's `access:` grants), and that a session is only ever
//! served to the principal that opened it.
//!
//! Without an `access:` section every caller may use everything. With one,
//! a name no grant gives the session's principal is left out of
//! `tools/list`, `prompts/list`, `resources/list` and
//! `resources/templates/list`, and a call, get, read, subscription or
//! completion of it is refused with `cordon/status: not_granted`, whether
//! or not it exists (a caller learns nothing of what it was not granted).
//!
//! A name a grant matches only by a pattern (`fs__read*`) is used only
//! when it is the name of something that exists: one that does not is
//! refused as not granted too, without starting anything to look for it
//! beyond the server whose name it carries, and without naming what that
//! server has. Only a name a grant gives literally is told it is unknown,
//! with a list of what the caller is granted.

use cordon_auth::Principal;
use cordon_policy::access::{Claims, Kind};
use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use serde_json::json;

use crate::render::{Refusal, refusal};
use crate::session::Session;
use crate::uri::cordon_uri;

/// The claims of `p` a grant is held against.
pub(crate) fn claims(p: &Principal) -> Claims<'_> {
    Claims {
        subject: &p.subject,
        client_id: p.client_id.as_deref(),
        groups: &p.groups,
        tenant: &p.tenant,
    }
}

/// The principal an HTTP request carries (the authentication layer put it
/// in its extensions; the unauthenticated one without); `None` off HTTP.
pub(crate) fn of_request(context: &RequestContext<RoleServer>) -> Option<Principal> {
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    Some(
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .unwrap_or_else(Principal::unauthenticated),
    )
}

impl Session {
    fn grants_on(&self) -> bool {
        self.gw.access.is_some()
    }

    /// Whether the session's principal may use the `kind` named `name`.
    pub(crate) fn granted(&self, kind: Kind, name: &str) -> bool {
        let Some(access) = &self.gw.access else {
            return true;
        };
        let p = self
            .principal()
            .cloned()
            .unwrap_or_else(Principal::unauthenticated);
        access.allows(&claims(&p), kind, name)
    }

    /// Whether a grant gives the session's principal the `kind` named
    /// `name` by that very name (not by a pattern); without grants, every
    /// name.
    pub(crate) fn granted_literally(&self, kind: Kind, name: &str) -> bool {
        let Some(access) = &self.gw.access else {
            return true;
        };
        let p = self
            .principal()
            .cloned()
            .unwrap_or_else(Principal::unauthenticated);
        let c = claims(&p);
        access
            .grants
            .iter()
            .any(|g| g.to.matches(&c) && g.patterns(kind).iter().any(|x| x == name))
    }

    /// Whether a grant could give the session's principal anything of
    /// the server `u` (any resource grant counts: resources are named by
    /// URI, not by server). A server it could not is never started, listed
    /// or asked for it.
    pub(crate) fn may_use_server(&self, u: &crate::upstream::Upstream) -> bool {
        let Some(access) = &self.gw.access else {
            return true;
        };
        let p = self
            .principal()
            .cloned()
            .unwrap_or_else(Principal::unauthenticated);
        let c = claims(&p);
        access.grants.iter().filter(|g| g.to.matches(&c)).any(|g| {
            !g.resources.is_empty()
                || g.tools
                    .iter()
                    .chain(&g.prompts)
                    .any(|x| u.may_expose_match(x))
        })
    }

    /// Whether grants decide what the session may use.
    pub(crate) fn grants_apply(&self) -> bool {
        self.grants_on()
    }

    /// Whether a grant could give the session's principal any `kind` at
    /// all (no grant of it: nothing of that kind is looked up for it).
    pub(crate) fn granted_any(&self, kind: Kind) -> bool {
        let Some(access) = &self.gw.access else {
            return true;
        };
        let p = self
            .principal()
            .cloned()
            .unwrap_or_else(Principal::unauthenticated);
        let c = claims(&p);
        access
            .grants
            .iter()
            .any(|g| g.to.matches(&c) && !g.patterns(kind).is_empty())
    }

    /// Whether the session may use the resource (or template) `uri` of the
    /// server `tool`: as the server gave it, or in its `cordon://` form.
    pub(crate) fn resource_granted(&self, tool: &str, uri: &str) -> bool {
        !self.grants_on()
            || self.granted(Kind::Resource, uri)
            || self.granted(Kind::Resource, &cordon_uri(tool, uri))
    }

    /// The refusal of something not granted. It says no more than that, so
    /// that it reads the same for a name that exists and one that does not.
    pub(crate) fn not_granted(&self, kind: Kind, name: &str) -> ErrorData {
        let who = self
            .principal()
            .map(|p| p.subject.clone())
            .unwrap_or_else(|| Principal::unauthenticated().subject);
        let (what, key) = match kind {
            Kind::Tool => ("tool", "tool"),
            Kind::Prompt => ("prompt", "prompt"),
            Kind::Resource => ("resource", "uri"),
        };
        refusal(
            Refusal::NotGranted,
            format!("{what} `{name}` is not granted to `{who}`"),
            json!({ key: name }),
        )
    }

    /// A request of this session from another principal than the one
    /// that opened it is refused (`cordon/status: session_refused`); the
    /// principal of the request is returned either way (`None` off HTTP).
    pub(crate) fn same_caller(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<Principal>, Box<(Principal, ErrorData)>> {
        let Some(p) = of_request(context) else {
            return Ok(None);
        };
        match self.set_principal(p.clone()) {
            Ok(()) => Ok(Some(p)),
            Err(owner) => {
                let e = refusal(
                    Refusal::SessionRefused,
                    format!(
                        "this session belongs to `{}`, not to `{}`",
                        owner.subject, p.subject
                    ),
                    json!({}),
                );
                Err(Box::new((p, e)))
            }
        }
    }

    /// Take the principal of an `initialize`: on HTTP the request's (the
    /// authentication layer puts it in the request's extensions; a session
    /// initialized again by another principal is refused), without one the
    /// unauthenticated one. On stdio it was set when the session was made.
    pub(crate) fn initial_principal(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match of_request(context) {
            Some(_) => self.check_caller(context),
            None => {
                let _ = self.set_principal(Principal::unauthenticated());
                Ok(())
            }
        }
    }

    /// [`Session::same_caller`] for requests that are not audited.
    pub(crate) fn check_caller(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.same_caller(context).map(|_| ()).map_err(|b| b.1)
    }
}
