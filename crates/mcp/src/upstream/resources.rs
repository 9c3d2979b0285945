//! The server's resources and resource templates: listed (filtered by the
//! manifest's `resources` allowlist, names stripped), read only when the
//! listing exposed the URI (the contents through [`gate`](super::gate)),
//! and subscribed to.

use rmcp::model::{Resource, ResourceTemplate};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::json;

use super::{State, Upstream, gate};
use crate::render::{self, Refusal};

/// Where a URI stands with one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// The server listed this URI.
    Listed,
    /// The URI matches this listed URI template.
    Template(String),
}

/// Resources and resource templates.
impl Upstream {
    /// `resources/list`, filtered by the manifest's `resources` allowlist;
    /// names and descriptions stripped. Empty when the server offers none.
    pub async fn list_resources(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<Resource>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(vec![]);
        }
        let all = self
            .timed("resources/list", ct, |p| async move {
                p.list_all_resources().await
            })
            .await?;
        let allow = self.resource_allow.as_ref();
        let out: Vec<Resource> = all
            .into_iter()
            .filter(|r| allow.is_none_or(|a| a.contains(&r.uri)))
            .map(|mut r| {
                r.name = gate::strip_text(&r.name);
                r.title = r.title.map(|t| gate::strip_text(&t));
                r.description = r.description.map(|d| gate::strip_text(&d));
                r.meta = Some(gate::listed_meta(&self.policy));
                r
            })
            .collect();
        self.state.lock().await.resources = Some(out.clone());
        Ok(out)
    }

    /// `resources/templates/list`, filtered and stripped likewise. A
    /// template cordon cannot parse is left out (nothing could be routed
    /// to it).
    pub async fn list_templates(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<ResourceTemplate>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(vec![]);
        }
        let all = self
            .timed("resources/templates/list", ct, |p| async move {
                p.list_all_resource_templates().await
            })
            .await?;
        let allow = self.resource_allow.as_ref();
        let mut out = Vec::new();
        for mut t in all {
            if allow.is_some_and(|a| !a.contains(&t.uri_template)) {
                continue;
            }
            let compiled = match crate::uri::Template::new(&t.uri_template) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("cordon: warning: {}: not listed: {e}", self.policy.name);
                    continue;
                }
            };
            t.name = gate::strip_text(&t.name);
            t.title = t.title.map(|x| gate::strip_text(&x));
            t.description = t.description.map(|d| gate::strip_text(&d));
            t.meta = Some(gate::listed_meta(&self.policy));
            out.push((t, compiled));
        }
        let listed = out.iter().map(|(t, _)| t.clone()).collect();
        self.state.lock().await.templates = Some(out);
        Ok(listed)
    }

    fn exposure_in(st: &State, uri: &str) -> Option<Exposure> {
        if st
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r.uri == uri))
        {
            return Some(Exposure::Listed);
        }
        st.templates.as_ref().and_then(|ts| {
            ts.iter()
                .find(|(_, c)| c.matches(uri))
                .map(|(t, _)| Exposure::Template(t.uri_template.clone()))
        })
    }

    /// Whether this server exposed `uri`: listed it, or listed a template
    /// it matches. Lists again when the last listing does not have it.
    pub async fn exposure(
        &self,
        uri: &str,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Option<Exposure>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(None);
        }
        if let Some(e) = Self::exposure_in(&*self.state.lock().await, uri) {
            return Ok(Some(e));
        }
        self.list_resources(ct).await?;
        self.list_templates(ct).await?;
        Ok(Self::exposure_in(&*self.state.lock().await, uri))
    }

    /// `resources/read` of a URI this server exposed; the contents gated.
    pub async fn read(
        &self,
        uri: &str,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::ReadResourceResult, ErrorData> {
        if !self.offers().await?.resources {
            return Err(self.refuse_unoffered("resources"));
        }
        if self.exposure(uri, ct).await?.is_none() {
            return Err(render::refusal(
                Refusal::UnknownResource,
                format!(
                    "{}: the server did not list `{uri}` nor a URI template it matches; cordon reads only what resources/list or resources/templates/list exposed",
                    self.policy.name
                ),
                json!({"tool": self.policy.name, "uri": uri}),
            ));
        }
        let params = rmcp::model::ReadResourceRequestParams::new(uri);
        let r = self
            .timed("resources/read", ct, |p| async move {
                p.read_resource_once(params).await
            })
            .await?;
        match r {
            rmcp::model::ReadResourceResponse::Complete(r) => {
                gate::read_result(&self.policy, uri, r, &self.live_tokens().await)
            }
            _ => Err(self.failed(
                &self.policy.name,
                format!("resources/read of `{uri}`: the server asked the client for input, which cordon does not forward"),
            )),
        }
    }

    /// `resources/subscribe` (`on: true`) or `resources/unsubscribe` of a
    /// URI this server exposed. Updates the server sends for it reach
    /// `agent` as `notifications/resources/updated`. A restarted server
    /// has forgotten its subscriptions. (The servers cordon runs speak the
    /// protocol revisions that still have these requests.)
    #[allow(deprecated)]
    pub async fn subscribe(
        &self,
        uri: &str,
        on: bool,
        agent: Peer<RoleServer>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<(), ErrorData> {
        let offers = self.offers().await?;
        if !offers.subscribe {
            return Err(self.refuse_unoffered("resource subscriptions"));
        }
        if self.exposure(uri, ct).await?.is_none() {
            return Err(render::refusal(
                Refusal::UnknownResource,
                format!(
                    "{}: the server did not list `{uri}` nor a URI template it matches",
                    self.policy.name
                ),
                json!({"tool": self.policy.name, "uri": uri}),
            ));
        }
        if let Ok(mut s) = self.subscriptions.lock() {
            s.agent = Some(agent);
            if on {
                s.uris.insert(uri.to_owned());
            } else {
                s.uris.remove(uri);
            }
        }
        let params = rmcp::model::SubscribeRequestParams::new(uri);
        if on {
            self.timed("resources/subscribe", ct, |p| async move {
                p.subscribe(params).await
            })
            .await
        } else {
            let params = rmcp::model::UnsubscribeRequestParams::new(params.uri);
            self.timed("resources/unsubscribe", ct, |p| async move {
                p.unsubscribe(params).await
            })
            .await
        }
    }
}
