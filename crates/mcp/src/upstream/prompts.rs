//! The server's prompts (listed as `<tool>.<prompt>`, filtered by the
//! manifest's `prompts` allowlist, the messages of a `prompts/get` through
//! [`gate`](super::gate)) and completions of prompt and template arguments.

use rmcp::ErrorData;
use rmcp::model::{JsonObject, Prompt};
use serde_json::json;

use super::{State, Upstream, gate};
use crate::render::{self, Refusal};

/// Prompts and completions.
impl Upstream {
    /// `prompts/list`: the allowed prompts, named `<tool>.<prompt>`, their
    /// descriptions stripped.
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
        let listed: Vec<Prompt> = all
            .into_iter()
            .filter(|p| allow.is_none_or(|a| a.contains(&p.name)))
            .collect();
        self.state.lock().await.prompts = Some(listed.clone());
        Ok(listed
            .into_iter()
            .map(|mut p| {
                let mut meta = gate::listed_meta(&self.policy);
                meta.insert("cordon/server_prompt".into(), json!(p.name));
                p.name = format!("{}.{}", self.policy.name, p.name);
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

    /// `prompts/get` of `<tool>.<prompt>`; the messages gated.
    pub async fn get_prompt(
        &self,
        name: &str,
        args: Option<JsonObject>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::GetPromptResult, ErrorData> {
        if !self.offers().await?.prompts {
            return Err(self.refuse_unoffered("prompts"));
        }
        let server_name = name
            .strip_prefix(self.policy.name.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .unwrap_or(name)
            .to_owned();
        let known = |st: &State| {
            st.prompts
                .as_ref()
                .is_some_and(|p| p.iter().any(|p| p.name == server_name))
        };
        if !known(&*self.state.lock().await) {
            let listed = self.list_prompts(ct).await?;
            if !known(&*self.state.lock().await) {
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
        let mut params = rmcp::model::GetPromptRequestParams::new(server_name);
        params.arguments = args;
        let r = self
            .timed("prompts/get", ct, |p| async move {
                p.get_prompt_once(params).await
            })
            .await?;
        match r {
            rmcp::model::GetPromptResponse::Complete(r) => {
                gate::prompt_result(&self.policy, name, r)
            }
            _ => Err(self.failed(
                name,
                "prompts/get: the server asked the client for input, which cordon does not forward"
                    .into(),
            )),
        }
    }

    /// `completion/complete` for a prompt (`server_prompt` is the server's
    /// name) or a URI template of this server; the values stripped.
    pub async fn complete(
        &self,
        mut params: rmcp::model::CompleteRequestParams,
        server_prompt: Option<String>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::CompleteResult, ErrorData> {
        if !self.offers().await?.completions {
            return Ok(rmcp::model::CompleteResult::default());
        }
        if let (Some(p), rmcp::model::Reference::Prompt(r)) = (server_prompt, &mut params.r#ref) {
            // Only a prompt the listing exposed (the manifest's allowlist).
            let known = |st: &State| {
                st.prompts
                    .as_ref()
                    .is_some_and(|ps| ps.iter().any(|x| x.name == p))
            };
            if !known(&*self.state.lock().await) {
                self.list_prompts(ct).await?;
                if !known(&*self.state.lock().await) {
                    return Err(render::refusal(
                        Refusal::UnknownPrompt,
                        format!("unknown prompt `{}`", r.name),
                        json!({"prompt": r.name}),
                    ));
                }
            }
            r.name = p;
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
