//! Resources of sandboxed MCP servers: which server a URI belongs to.
//!
//! A resource keeps the URI its server gave it, so links and URIs that
//! clients know (`file:///…`, `demo://…`) keep working. cordon routes a
//! `resources/read` by what the session's servers listed:
//!
//! 1. `cordon://<tool>/<percent-encoded URI>` names the server outright;
//! 2. otherwise a URI listed by exactly one server goes to it;
//! 3. otherwise a URI matching a listed URI template of exactly one server
//!    goes to it.
//!
//! A URI two servers both list is shown in the listing in the `cordon://`
//! form (for each of them), so one server can never shadow another's
//! resource. A URI that matches templates of two servers, or that no
//! listing exposed, is refused. The `cordon://` form is checked the same
//! way: its server must have listed the URI or a template it matches.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptResult, JsonObject, Prompt, ReadResourceResult,
    Reference, Resource, ResourceContents, ResourceTemplate,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::audit::CallAudit;
use crate::render::{Refusal, refusal};
use crate::session::{Session, not_started};
use crate::upstream::{Exposure, Upstream};
pub use crate::uri::{SCHEME, Template, cordon_uri, parse_cordon_uri};
use cordon_policy::access::Kind;

// ---- Routing within one agent session ----

impl Session {
    /// Sessions' servers whose offers are unknown are started (all at
    /// once) so that `initialize` can advertise what they offer.
    pub(crate) async fn learn_offers(&self) {
        let mut set = tokio::task::JoinSet::new();
        for u in &self.servers() {
            if u.known_offers().is_none() {
                let u = u.clone();
                let names = self.gw.names.clone();
                set.spawn(async move {
                    if let Err(e) = u.offers().await {
                        names.report_once(&not_started(u.name(), &e));
                    }
                });
            }
        }
        while set.join_next().await.is_some() {}
    }

    fn caller(context: &rmcp::service::RequestContext<rmcp::RoleServer>) -> String {
        context
            .client_info()
            .map(|i| format!("mcp:{}", i.name))
            .unwrap_or_else(|| "mcp".into())
    }

    /// Every server's resources. A URI listed by two servers is shown as
    /// `cordon://<tool>/<uri>` for each, so neither can shadow the other.
    pub(crate) async fn all_resources(&self, ct: &CancellationToken) -> Vec<Resource> {
        let mut per: Vec<(&Arc<Upstream>, Vec<Resource>)> = Vec::new();
        let servers = self.servers();
        for u in &servers {
            match u.list_resources(Some(ct)).await {
                Ok(r) => per.push((u, r)),
                Err(e) => eprintln!(
                    "cordon: warning: {}: resources not listed: {}",
                    u.name(),
                    e.message
                ),
            }
        }
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for (_, rs) in &per {
            for r in rs {
                *count.entry(r.uri.clone()).or_default() += 1;
            }
        }
        let mut out = Vec::new();
        for (u, rs) in per {
            for mut r in rs {
                if !self.resource_granted(u.name(), &r.uri) {
                    continue;
                }
                if count.get(&r.uri).copied().unwrap_or(0) > 1 {
                    r.uri = cordon_uri(u.name(), &r.uri);
                }
                out.push(r);
            }
        }
        out
    }

    pub(crate) async fn all_templates(&self, ct: &CancellationToken) -> Vec<ResourceTemplate> {
        let mut out = Vec::new();
        for u in &self.servers() {
            match u.list_templates(Some(ct)).await {
                Ok(t) => out.extend(
                    t.into_iter()
                        .filter(|t| self.resource_granted(u.name(), &t.uri_template)),
                ),
                Err(e) => eprintln!(
                    "cordon: warning: {}: resource templates not listed: {}",
                    u.name(),
                    e.message
                ),
            }
        }
        out
    }

    pub(crate) async fn all_prompts(&self, ct: &CancellationToken) -> Vec<Prompt> {
        let mut out = Vec::new();
        for u in &self.servers() {
            match u.list_prompts(Some(ct)).await {
                Ok(p) => out.extend(
                    p.into_iter()
                        .filter(|p| self.granted(Kind::Prompt, &p.name)),
                ),
                Err(e) => eprintln!(
                    "cordon: warning: {}: prompts not listed: {}",
                    u.name(),
                    e.message
                ),
            }
        }
        out
    }

    fn offering(&self, resources: bool) -> Vec<Arc<Upstream>> {
        self.servers()
            .into_iter()
            .filter(|u| {
                u.known_offers()
                    .is_none_or(|o| if resources { o.resources } else { o.prompts })
            })
            .collect()
    }

    /// The one server `uri` belongs to, and the URI to ask it for.
    async fn route(
        &self,
        uri: &str,
        ct: &CancellationToken,
    ) -> Result<(Arc<Upstream>, String), ErrorData> {
        if let Some(parsed) = parse_cordon_uri(uri) {
            let (tool, original) =
                parsed.map_err(|m| refusal(Refusal::UnknownResource, m, json!({"uri": uri})))?;
            let Some(u) = self.servers().into_iter().find(|u| u.name() == tool) else {
                return Err(refusal(
                    Refusal::UnknownResource,
                    format!(
                        "`{uri}` names `{tool}`, which is not an MCP server of this manifest; servers: {}",
                        self.servers()
                            .iter()
                            .map(|u| u.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    json!({"uri": uri}),
                ));
            };
            return Ok((u, original));
        }
        let candidates = self.offering(true);
        if candidates.is_empty() {
            return Err(refusal(
                Refusal::NotOffered,
                format!(
                    "no MCP server of this manifest offers resources; `{uri}` cannot be reached"
                ),
                json!({"uri": uri}),
            ));
        }
        let mut listed = Vec::new();
        let mut templated = Vec::new();
        for u in candidates {
            match u.exposure(uri, Some(ct)).await {
                Ok(Some(Exposure::Listed)) => listed.push(u),
                Ok(Some(Exposure::Template(t))) => templated.push((u, t)),
                Ok(None) => {}
                Err(e) => eprintln!(
                    "cordon: warning: {}: resources not listed: {}",
                    u.name(),
                    e.message
                ),
            }
        }
        let ambiguous = |names: Vec<String>| {
            refusal(
                Refusal::AmbiguousResource,
                format!(
                    "`{uri}` is exposed by more than one server; name one: {}",
                    names.join(", ")
                ),
                json!({"uri": uri}),
            )
        };
        match (listed.as_slice(), templated.as_slice()) {
            ([u], _) => Ok(((*u).clone(), uri.to_owned())),
            ([_, _, ..], _) => Err(ambiguous(
                listed.iter().map(|u| cordon_uri(u.name(), uri)).collect(),
            )),
            ([], [(u, _)]) => Ok(((*u).clone(), uri.to_owned())),
            ([], [_, _, ..]) => Err(ambiguous(
                templated
                    .iter()
                    .map(|(u, t)| format!("{} (template {t})", cordon_uri(u.name(), uri)))
                    .collect(),
            )),
            ([], []) => Err(refusal(
                Refusal::UnknownResource,
                format!(
                    "`{uri}` was not exposed by any server: cordon reads only URIs that resources/list lists or that match a template of resources/templates/list"
                ),
                json!({"uri": uri}),
            )),
        }
    }

    /// [`Session::route`] under the grants: a URI not granted is refused
    /// as such whether or not a server exposes it, and a caller granted no
    /// resource at all starts no server to find out.
    async fn granted_route(
        &self,
        uri: &str,
        ct: &CancellationToken,
    ) -> Result<(Arc<Upstream>, String), ErrorData> {
        if !self.granted_any(Kind::Resource) {
            return Err(self.not_granted(Kind::Resource, uri));
        }
        match self.route(uri, ct).await {
            Ok((u, original)) if !self.resource_granted(u.name(), &original) => {
                Err(self.not_granted(Kind::Resource, uri))
            }
            Err(_) if !self.granted(Kind::Resource, uri) => {
                Err(self.not_granted(Kind::Resource, uri))
            }
            r => r,
        }
    }

    /// `resources/read`: routed to exactly one server, the contents gated,
    /// the read audited like a call.
    pub(crate) async fn read(
        &self,
        uri: &str,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        let input = serde_json::to_vec(&json!({"method": "resources/read", "uri": uri}))
            .unwrap_or_default();
        let routed = self.granted_route(uri, &context.ct).await;
        let (audit, r) = match routed {
            Ok((u, original)) => (
                CallAudit::with_input(u.name(), u.profile(), "mcp", input).recording_input(),
                match self.gw.service.refusal(u.name(), uri) {
                    Some(e) => Err(e),
                    None => u.read(&original, Some(&context.ct)).await,
                },
            ),
            Err(e) => (
                CallAudit::with_input("", "", "none", input).recording_input(),
                Err(e),
            ),
        };
        let outcome = r.as_ref().map(|r| {
            let text = r
                .contents
                .iter()
                .filter_map(|c| match c {
                    ResourceContents::TextResourceContents { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n");
            (text, false)
        });
        audit.finish_with(&self.gw.broker, &self.who(&Self::caller(context)), outcome)?;
        r
    }

    /// `resources/subscribe` / `resources/unsubscribe`, routed like a read.
    pub(crate) async fn subscribe(
        &self,
        uri: &str,
        on: bool,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        let (u, original) = self.granted_route(uri, &context.ct).await?;
        u.subscribe(&original, on, context.peer.clone(), Some(&context.ct))
            .await
    }

    /// An unknown prompt: the message names the prompts the caller may
    /// get (under grants, only those granted).
    async fn unknown_prompt(
        &self,
        name: &str,
        ct: &tokio_util::sync::CancellationToken,
    ) -> ErrorData {
        let known: Vec<String> = self
            .all_prompts(ct)
            .await
            .into_iter()
            .map(|p| p.name)
            .collect();
        refusal(
            Refusal::UnknownPrompt,
            format!(
                "unknown prompt `{name}`; cordon serves: {}",
                if known.is_empty() {
                    "no prompts".to_owned()
                } else {
                    known.join(", ")
                }
            ),
            json!({"prompt": name}),
        )
    }

    /// `prompts/get` of an exposed prompt name, gated and audited like a call.
    pub(crate) async fn prompt(
        &self,
        name: &str,
        args: Option<JsonObject>,
        context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<GetPromptResult, ErrorData> {
        let input =
            serde_json::to_vec(&json!({"method": "prompts/get", "name": name, "arguments": args}))
                .unwrap_or_default();
        let owner = match self.granted(Kind::Prompt, name) {
            true => Ok(self.owner(crate::names::Space::Prompts, name).await),
            false => Err(self.not_granted(Kind::Prompt, name)),
        };
        let (audit, r) = match owner {
            Err(e) => (CallAudit::with_input(name, "", "none", input), Err(e)),
            Ok(Some(u)) if self.gw.service.out_of_service(u.name()).is_some() => (
                CallAudit::with_input(name, u.profile(), "mcp", input),
                Err(self
                    .gw
                    .service
                    .refusal(u.name(), name)
                    .unwrap_or_else(|| self.unknown(name))),
            ),
            Ok(Some(u)) => {
                let r = u.get_prompt(name, args, Some(&context.ct)).await;
                // Under grants, a server's own answer for a name it does
                // not have (which names all it has) is not passed on.
                let r = match r {
                    Err(e)
                        if self.grants_apply()
                            && e.data
                                .as_ref()
                                .and_then(|d| d.get("cordon/status"))
                                .and_then(|s| s.as_str())
                                == Some(Refusal::UnknownPrompt.as_str()) =>
                    {
                        Err(self.unknown_prompt(name, &context.ct).await)
                    }
                    other => other,
                };
                (CallAudit::with_input(name, u.profile(), "mcp", input), r)
            }
            Ok(None) if !self.granted_literally(Kind::Prompt, name) => (
                CallAudit::with_input(name, "", "none", input),
                Err(self.not_granted(Kind::Prompt, name)),
            ),
            Ok(None) => (
                CallAudit::with_input(name, "", "none", input),
                Err(self.unknown_prompt(name, &context.ct).await),
            ),
        };
        let outcome = r.as_ref().map(|r| {
            let text = r
                .messages
                .iter()
                .filter_map(|m| m.content.as_text().map(|t| t.text.as_str()))
                .collect::<Vec<_>>()
                .join("\n");
            (text, false)
        });
        audit.finish_with(&self.gw.broker, &self.who(&Self::caller(context)), outcome)?;
        r
    }

    /// `completion/complete`: a prompt's or a template's server answers;
    /// anything else gets no suggestions.
    pub(crate) async fn complete(
        &self,
        params: CompleteRequestParams,
        ct: &CancellationToken,
    ) -> Result<CompleteResult, ErrorData> {
        let owner = match &params.r#ref {
            Reference::Prompt(p) => {
                if !self.granted(Kind::Prompt, &p.name) {
                    return Err(self.not_granted(Kind::Prompt, &p.name));
                }
                self.owner(crate::names::Space::Prompts, &p.name).await
            }
            Reference::Resource(r) => {
                if !self.granted_any(Kind::Resource) {
                    return Err(self.not_granted(Kind::Resource, &r.uri));
                }
                let mut found = None;
                for u in self.offering(true) {
                    if u.list_templates(Some(ct))
                        .await
                        .is_ok_and(|ts| ts.iter().any(|t| t.uri_template == r.uri))
                    {
                        found = Some(u.clone());
                        break;
                    }
                }
                if let Some(u) = &found
                    && !self.resource_granted(u.name(), &r.uri)
                {
                    return Err(self.not_granted(Kind::Resource, &r.uri));
                }
                found
            }
            _ => None,
        };
        match owner {
            Some(u) => u.complete(params, Some(ct)).await,
            None => Ok(CompleteResult::default()),
        }
    }
}
