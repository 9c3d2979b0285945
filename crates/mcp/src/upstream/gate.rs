//! The one path by which what a server produces reaches the agent: results
//! of `tools/call`, `resources/read` and `prompts/get` through the output
//! gate (the wrapped untrusted rendering, media-type checks, the tool's
//! size cap) with their labels and the summary `_meta`; names,
//! descriptions, progress messages and completion values stripped
//! ([`strip_text`]); the server's error messages through the gate's error
//! path ([`server_message`]); what it lists labelled ([`listed_meta`]).

use base64::Engine as _;
use cordon_gate::{Gate, GatePolicy, Gated, OutputKind, ToolMeta};
use cordon_policy::policy::ToolPolicy;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::json;

use super::Upstream;
use crate::render::{self, Refusal};

/// Text through the gate's default stripping (no wrapper).
pub(super) fn strip_text(s: &str) -> String {
    match Gate::new(GatePolicy::default()) {
        Ok(g) => match g.check(&ToolMeta::new("", ""), s.as_bytes()) {
            Ok(x) => x.content.to_text(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

/// A message of the server (its error text, its exit report and stderr
/// tail) through the gate's error path, as text for an MCP error.
pub(super) fn server_message(policy: &ToolPolicy, msg: &str) -> String {
    let meta = ToolMeta::new(&policy.name, cordon_broker::profile_name(policy.profile));
    cordon_gate::gate_error(&meta, msg.as_bytes())
        .content
        .to_text()
}

/// The labels of a resource, template or prompt the server listed.
pub(super) fn listed_meta(policy: &ToolPolicy) -> rmcp::model::MetaObject {
    let mut meta = rmcp::model::MetaObject::default();
    meta.insert("cordon/server".into(), json!(policy.name));
    meta.insert(
        "cordon/profile".into(),
        json!(cordon_broker::profile_name(policy.profile)),
    );
    meta.insert("cordon/trust".into(), json!("untrusted"));
    meta
}

impl Upstream {
    /// Pass an upstream result through the gate: all text (text blocks,
    /// text resources, resource links) as one wrapped text, images and audio
    /// checked against their declared media type, blobs likewise.
    pub(super) fn gate(&self, name: &str, r: CallToolResult) -> Result<CallToolResult, ErrorData> {
        let base = cordon_broker::gate_for(&self.policy).map_err(|e| {
            render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
        })?;
        let base = base.policy().clone();
        let meta = ToolMeta::new(name, self.profile());
        let mut texts: Vec<String> = Vec::new();
        let mut binaries: Vec<ContentBlock> = Vec::new();
        let refuse = |msg: String| {
            render::refusal(
                Refusal::GateRefused,
                format!("{name}: {msg}"),
                json!({"tool": name}),
            )
        };
        let check_binary = |mime: &str, data: &str| -> Result<String, ErrorData> {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|e| {
                    refuse(format!(
                        "output refused: {mime} content is not base64 ({e})"
                    ))
                })?;
            let gate = Gate::new(GatePolicy {
                kind: OutputKind::Binary,
                media_type: Some(mime.to_owned()),
                schema: None,
                ..base.clone()
            })
            .map_err(|e| refuse(e.to_string()))?;
            gate.check(&meta, &bytes)
                .map_err(|e| refuse(e.to_string()))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(&bytes))
        };
        for block in &r.content {
            match block {
                ContentBlock::Text(t) => texts.push(t.text.clone()),
                ContentBlock::Image(i) => {
                    let data = check_binary(&i.mime_type, &i.data)?;
                    binaries.push(ContentBlock::image(data, i.mime_type.clone()));
                }
                ContentBlock::Audio(a) => {
                    let data = check_binary(&a.mime_type, &a.data)?;
                    binaries.push(ContentBlock::audio(data, a.mime_type.clone()));
                }
                ContentBlock::Resource(res) => match &res.resource {
                    ResourceContents::TextResourceContents { uri, text, .. } => {
                        texts.push(format!("[resource {uri}]\n{text}"));
                    }
                    ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        ..
                    } => {
                        let mime = mime_type.clone().unwrap_or_default();
                        let data = check_binary(&mime, blob)?;
                        binaries.push(ContentBlock::resource(
                            ResourceContents::BlobResourceContents {
                                uri: uri.clone(),
                                mime_type: mime_type.clone(),
                                blob: data,
                                meta: None,
                            },
                        ));
                    }
                    _ => texts.push("[resource content dropped]".into()),
                },
                ContentBlock::ResourceLink(l) => {
                    texts.push(format!("[resource link {} {}]", l.uri, l.name));
                }
                other => texts.push(format!("[{} content dropped]", other.kind_name())),
            }
        }
        let joined = texts.join("\n");
        if r.is_error == Some(true) {
            let mut out = render::tool_error(name, self.profile(), joined.as_bytes());
            out.content.extend(binaries);
            return Ok(out);
        }
        let text_gate = Gate::new(GatePolicy {
            kind: OutputKind::Text,
            media_type: None,
            schema: None,
            ..base.clone()
        })
        .map_err(|e| refuse(e.to_string()))?;
        let g = text_gate
            .check(&meta, joined.as_bytes())
            .map_err(|e| refuse(e.to_string()))?;
        let mut out = CallToolResult::success(vec![]).with_meta(Some(render::meta_of(&g)));
        if !joined.is_empty() || binaries.is_empty() {
            out.content.push(ContentBlock::text(g.render_wrapped()));
        }
        out.content.extend(binaries);
        if let Some(sc) = r.structured_content {
            let json_gate = Gate::new(GatePolicy {
                kind: OutputKind::Json,
                media_type: None,
                schema: None,
                ..base
            })
            .map_err(|e| refuse(e.to_string()))?;
            let bytes = serde_json::to_vec(&sc).unwrap_or_default();
            let gj = json_gate
                .check(&meta, &bytes)
                .map_err(|e| refuse(e.to_string()))?;
            if let cordon_gate::Content::Json(v) = gj.content {
                out.structured_content = Some(v);
            }
        }
        Ok(out)
    }

    /// The tool's gate policy with this byte budget.
    fn gate_policy(&self, kind: OutputKind, left: u64) -> Result<GatePolicy, ErrorData> {
        let base = cordon_broker::gate_for(&self.policy).map_err(|e| {
            render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
        })?;
        Ok(GatePolicy {
            kind,
            media_type: None,
            schema: None,
            max_bytes: left,
            ..base.policy().clone()
        })
    }

    fn max_bytes(&self) -> Result<u64, ErrorData> {
        cordon_broker::gate_for(&self.policy)
            .map(|g| g.policy().max_bytes)
            .map_err(|e| {
                render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
            })
    }

    /// Text through the text gate within `left` bytes (`None`: no room
    /// is left for another part; the caller drops it).
    fn gate_text(
        &self,
        label: &str,
        text: &str,
        left: &mut u64,
    ) -> Result<Option<Gated>, ErrorData> {
        if *left < cordon_gate::MIN_MAX_BYTES {
            return Ok(None);
        }
        let gate = Gate::new(self.gate_policy(OutputKind::Text, *left)?)
            .map_err(|e| gate_refused(label, e.to_string()))?;
        let g = gate
            .check(&ToolMeta::new(label, self.profile()), text.as_bytes())
            .map_err(|e| gate_refused(label, e.to_string()))?;
        *left = left.saturating_sub(g.envelope.bytes_out);
        Ok(Some(g))
    }

    /// Base64 content through the binary gate (magic bytes against the
    /// declared media type) within `left` bytes: the bytes re-encoded.
    fn gate_blob(
        &self,
        label: &str,
        mime: Option<&str>,
        b64: &str,
        left: &mut u64,
    ) -> Result<(String, Gated), ErrorData> {
        let mime = mime.unwrap_or("application/octet-stream");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| gate_refused(label, format!("{mime} content is not base64 ({e})")))?;
        if bytes.len() as u64 > *left {
            return Err(gate_refused(
                label,
                format!(
                    "{mime} content of {} bytes is past what is left of the tool's output cap ({} bytes)",
                    bytes.len(),
                    *left
                ),
            ));
        }
        let gate = Gate::new(GatePolicy {
            media_type: Some(mime.to_owned()),
            ..self.gate_policy(OutputKind::Binary, (*left).max(cordon_gate::MIN_MAX_BYTES))?
        })
        .map_err(|e| gate_refused(label, e.to_string()))?;
        let g = gate
            .check(&ToolMeta::new(label, self.profile()), &bytes)
            .map_err(|e| gate_refused(label, e.to_string()))?;
        *left = left.saturating_sub(g.envelope.bytes_out);
        Ok((base64::engine::general_purpose::STANDARD.encode(&bytes), g))
    }

    /// Resource contents through the gate: text as the wrapped untrusted
    /// rendering, blobs checked; each content's `_meta` is its envelope,
    /// the result's `_meta` the whole read's. The tool's size cap bounds
    /// the read as a whole: text past it is cut, parts past it dropped.
    pub(super) fn gate_read(
        &self,
        uri: &str,
        r: rmcp::model::ReadResourceResult,
    ) -> Result<rmcp::model::ReadResourceResult, ErrorData> {
        let label = self.policy.name.clone();
        let mut left = self.max_bytes()?;
        let mut gated = Vec::new();
        let mut contents = Vec::new();
        let mut dropped = 0;
        for c in r.contents {
            match c {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => {
                    let Some(g) = self.gate_text(&label, &text, &mut left)? else {
                        dropped += 1;
                        continue;
                    };
                    contents.push(ResourceContents::TextResourceContents {
                        uri,
                        mime_type,
                        text: g.render_wrapped(),
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let (blob, g) =
                        self.gate_blob(&label, mime_type.as_deref(), &blob, &mut left)?;
                    contents.push(ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                }
                _ => {
                    return Err(gate_refused(
                        &label,
                        format!("resources/read of `{uri}`: a content of an unknown kind"),
                    ));
                }
            }
        }
        let mut out = rmcp::model::ReadResourceResult::new(contents);
        out.meta = Some(self.summary_meta(&label, &gated, dropped)?);
        Ok(out)
    }

    /// One prompt message's content through the gate (`None`: no room
    /// left under the cap).
    fn gate_block(
        &self,
        name: &str,
        block: ContentBlock,
        left: &mut u64,
        gated: &mut Vec<Gated>,
    ) -> Result<Option<ContentBlock>, ErrorData> {
        let text = |t: &str, left: &mut u64, gated: &mut Vec<Gated>| {
            Ok::<_, ErrorData>(self.gate_text(name, t, left)?.map(|g| {
                let c = ContentBlock::text(g.render_wrapped());
                gated.push(g);
                c
            }))
        };
        Ok(match block {
            ContentBlock::Text(t) => text(&t.text, left, gated)?,
            ContentBlock::Image(i) => {
                let (data, g) = self.gate_blob(name, Some(&i.mime_type), &i.data, left)?;
                gated.push(g);
                Some(ContentBlock::image(data, i.mime_type.clone()))
            }
            ContentBlock::Audio(a) => {
                let (data, g) = self.gate_blob(name, Some(&a.mime_type), &a.data, left)?;
                gated.push(g);
                Some(ContentBlock::audio(data, a.mime_type.clone()))
            }
            ContentBlock::Resource(res) => match res.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => self.gate_text(name, &text, left)?.map(|g| {
                    let c = ContentBlock::resource(ResourceContents::TextResourceContents {
                        uri,
                        mime_type,
                        text: g.render_wrapped(),
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                    c
                }),
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let (blob, g) = self.gate_blob(name, mime_type.as_deref(), &blob, left)?;
                    let c = ContentBlock::resource(ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                    Some(c)
                }
                _ => text("[resource content dropped]", left, gated)?,
            },
            ContentBlock::ResourceLink(l) => text(
                &format!("[resource link {} {}]", l.uri, l.name),
                left,
                gated,
            )?,
            other => text(
                &format!("[{} content dropped]", other.kind_name()),
                left,
                gated,
            )?,
        })
    }

    /// Prompt messages through the gate, like a tool result: text as the
    /// wrapped untrusted rendering, images, audio and blobs checked.
    pub(super) fn gate_prompt(
        &self,
        name: &str,
        r: rmcp::model::GetPromptResult,
    ) -> Result<rmcp::model::GetPromptResult, ErrorData> {
        use rmcp::model::PromptMessage;
        let mut left = self.max_bytes()?;
        let mut gated = Vec::new();
        let mut messages = Vec::new();
        let mut dropped = 0;
        for m in r.messages {
            match self.gate_block(name, m.content, &mut left, &mut gated)? {
                Some(c) => messages.push(PromptMessage::new(m.role, c)),
                None => dropped += 1,
            }
        }
        let mut out = rmcp::model::GetPromptResult::new(messages);
        out.description = r.description.map(|d| strip_text(&d));
        out.meta = Some(self.summary_meta(name, &gated, dropped)?);
        Ok(out)
    }

    /// The `_meta` of a whole read or prompt: the gate's envelope with the
    /// byte counts of all its parts; truncated when a part was cut or
    /// dropped under the cap.
    fn summary_meta(
        &self,
        label: &str,
        gated: &[Gated],
        dropped: usize,
    ) -> Result<rmcp::model::MetaObject, ErrorData> {
        let empty;
        let first = match gated.first() {
            Some(g) => g,
            None => {
                let mut room = cordon_gate::MIN_MAX_BYTES;
                empty = self
                    .gate_text(label, "", &mut room)?
                    .ok_or_else(|| gate_refused(label, "no envelope for an empty result".into()))?;
                &empty
            }
        };
        let mut meta = render::meta_of(first);
        let sum = |f: fn(&Gated) -> u64| gated.iter().map(f).sum::<u64>();
        meta.insert(
            "cordon/bytes_in".into(),
            json!(sum(|g| g.envelope.bytes_in)),
        );
        meta.insert(
            "cordon/bytes_out".into(),
            json!(sum(|g| g.envelope.bytes_out)),
        );
        meta.insert(
            "cordon/truncated".into(),
            json!(dropped > 0 || gated.iter().any(|g| g.envelope.truncated)),
        );
        meta.insert("cordon/parts".into(), json!(gated.len()));
        if dropped > 0 {
            meta.insert("cordon/parts_dropped".into(), json!(dropped));
        }
        Ok(meta)
    }
}

fn gate_refused(label: &str, msg: String) -> ErrorData {
    render::refusal(
        Refusal::GateRefused,
        format!("{label}: output refused: {msg}"),
        json!({"tool": label}),
    )
}

trait KindName {
    fn kind_name(&self) -> &'static str;
}

impl KindName for ContentBlock {
    fn kind_name(&self) -> &'static str {
        match self {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            ContentBlock::Resource(_) => "resource",
            ContentBlock::ResourceLink(_) => "resource_link",
            _ => "unknown",
        }
    }
}
