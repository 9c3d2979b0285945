//! The server's prompts (listed as `<tool>__<prompt>` or under the
//! server's names, as `expose` says, each name claimed for this server
//! alone, filtered by the manifest's `prompts` allowlist, the messages of a `prompts/get` through
//! [`gate`](super::gate)) and completions of prompt and template arguments.

use rmcp::ErrorData;
use rmcp::model::{JsonObject, Prompt};
use serde_json::json;

use super::{Upstream, gate};
use crate::names::{Owner, Space};
use crate::render::{self, Refusal};

/// Prompts and completions.
impl Upstream {
    /// The exposed name of the server's prompt `server_name`.
    fn exposed_prompt(&self, server_name: &str) -> String {
        cordon_policy::policy::exposed_prompt_name(&self.policy.name, self.expose, server_name)
    }

    /// The server's name of the exposed prompt `name`, when the last
    /// listing exposed it.
    pub async fn server_prompt_name(&self, name: &str) -> Option<String> {
        let st = self.state.lock().await;
        st.prompts
            .as_ref()?
            .iter()
            .find(|p| self.exposed_prompt(&p.name) == name)
            .map(|p| p.name.clone())
    }

    /// `prompts/list`: the allowed prompts, under their exposed names, their
    /// descriptions stripped. A prompt whose exposed name model APIs do not
    /// accept, or that another server has, is left out and reported.
    pub async fn list_prompts(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<Prompt>, ErrorData> {
        if !self.offers().await?.prompts {
            return Ok(vec![]);
        }
        let all = self
            .timed(
                "prompts/list",
                ct,
                |p| async move { p.list_all_prompts().await },
            )
            .await?;
        let allow = self.prompt_allow.as_ref();
        let server = &self.policy.name;
        let listed: Vec<Prompt> = all
            .into_iter()
            .filter(|p| allow.is_none_or(|a| a.contains(&p.name)))
            .filter(|p| {
                let full = self.exposed_prompt(&p.name);
                let refused = if let Some(why) = cordon_policy::policy::invalid_name_reason(&full)
                {
                    format!(
                        "server `{server}`: its prompt `{}` is refused: the exposed name `{}` is not one model APIs accept ({why})",
                        gate::strip_text(&p.name),
                        gate::strip_text(&full)
                    )
                } else if let Err(other) =
                    self.names
                        .claim(Space::Prompts, &full, Owner::Server(server.clone()))
                {
                    format!(
                        "server `{server}`: its prompt `{}` is refused: the name `{full}` is {other}",
                        gate::strip_text(&p.name)
                    )
                } else {
                    return true;
                };
                self.names.report_once(&refused);
                false
            })
            .collect();
        self.state.lock().await.prompts = Some(listed.clone());
        Ok(listed
            .into_iter()
            .map(|mut p| {
                let mut meta = gate::listed_meta(&self.policy);
                meta.insert("cordon/server_prompt".into(), json!(p.name));
                p.name = self.exposed_prompt(&p.name);
                p.title = p.title.map(|t| gate::strip_text(&t));
                p.description = p.description.map(|d| gate::strip_text(&d));
                if let Some(args) = &mut p.arguments {
                    for a in args {
                        a.title = a.title.take().map(|t| gate::strip_text(&t));
                        a.description = a.description.take().map(|d| gate::strip_text(&d));
                    }
                }
                p.meta = Some(meta);
                p
            })
            .collect())
    }

    /// `prompts/get` of an exposed prompt name; the messages gated.
    pub async fn get_prompt(
        &self,
        name: &str,
        args: Option<JsonObject>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::GetPromptResult, ErrorData> {
        if !self.offers().await?.prompts {
            return Err(self.refuse_unoffered("prompts"));
        }
        let server_name = match self.server_prompt_name(name).await {
            Some(s) => s,
            None => {
                let listed = self.list_prompts(ct).await?;
                match self.server_prompt_name(name).await {
                    Some(s) => s,
                    None => {
                        return Err(render::refusal(
                            Refusal::UnknownPrompt,
                            format!(
                                "unknown prompt `{name}`; server {} exposes: {}",
                                self.policy.name,
                                listed
                                    .iter()
                                    .map(|p| p.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            json!({"prompt": name}),
                        ));
                    }
                }
            }
        };
        let mut params = rmcp::model::GetPromptRequestParams::new(server_name);
        params.arguments = args;
        let r = self
            .timed("prompts/get", ct, |p| async move {
                p.get_prompt_once(params).await
            })
            .await?;
        match r {
            rmcp::model::GetPromptResponse::Complete(r) => {
                gate::prompt_result(&self.policy, name, r, &self.live_tokens().await)
            }
            _ => Err(self.failed(
                name,
                "prompts/get: the server asked the client for input, which cordon does not forward"
                    .into(),
            )),
        }
    }

    /// `completion/complete` for a prompt (by its exposed name) or a URI
    /// template of this server; the values stripped.
    pub async fn complete(
        &self,
        mut params: rmcp::model::CompleteRequestParams,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::CompleteResult, ErrorData> {
        if !self.offers().await?.completions {
            return Ok(rmcp::model::CompleteResult::default());
        }
        if let rmcp::model::Reference::Prompt(r) = &mut params.r#ref {
            // Only a prompt the listing exposed (the manifest's allowlist).
            let server_name = match self.server_prompt_name(&r.name).await {
                Some(s) => Some(s),
                None => {
                    self.list_prompts(ct).await?;
                    self.server_prompt_name(&r.name).await
                }
            };
            let Some(server_name) = server_name else {
                return Err(render::refusal(
                    Refusal::UnknownPrompt,
                    format!("unknown prompt `{}`", r.name),
                    json!({"prompt": r.name}),
                ));
            };
            r.name = server_name;
        }
        params.meta = None;
        let mut r = self
            .timed("completion/complete", ct, |p| async move {
                p.complete(params).await
            })
            .await?;
        r.completion.values = r
            .completion
            .values
            .iter()
            .map(|v| gate::strip_text(v))
            .take(100)
            .collect();
        r.meta = None;
        Ok(r)
    }
}
