//! The one path by which what a server produces reaches the agent.
//!
//! A result (`tools/call`, `resources/read`, `prompts/get`) passes the
//! output gate part by part under one budget: the tool's `output_bytes`
//! bounds the result as a whole, not each part. With `on_overflow: fail`,
//! a result whose parts together pass the cap is refused, and the refusal
//! names the cap. With `truncate`, text is cut to what is left (the gate's
//! marker says so), a part with no room left is dropped, and the result's
//! `_meta` says so (`cordon/truncated`, `cordon/parts_dropped`). Images,
//! audio and blobs are never altered: one larger than the cap by itself is
//! refused under either policy.
//!
//! The result's `_meta` is the summary of the whole: the envelope of its
//! first part with the byte counts of all parts (`cordon/bytes_in`,
//! `cordon/bytes_out`), `cordon/truncated` and `cordon/parts`, and what the
//! secret scans replaced in any part (`cordon/tokens_replaced`: the
//! secrets whose live token, minted for this server's session, was in it;
//! `cordon/secrets_redacted`: the well-known formats redacted, with
//! `block_secrets`).
//!
//! Everything else a server says passes the gate here too: names,
//! descriptions, progress messages and completion values are stripped
//! ([`strip_text`]), its error messages go through the gate's error path
//! ([`server_message`]), and what it lists is labelled ([`listed_meta`]).

use base64::Engine as _;
use std::cell::RefCell;
use std::collections::BTreeMap;

use cordon_gate::{
    Gate, GatePolicy, Gated, LiveTokens, MIN_MAX_BYTES, OutputKind, Overflow, ToolMeta,
};
use cordon_policy::policy::ToolPolicy;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, ContentBlock, GetPromptResult, MetaObject, PromptMessage, ReadResourceResult,
    ResourceContents,
};
use serde_json::json;

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

/// A JSON value the server sent (a log message's `data`) with every string
/// in it through [`strip_text`] and cut to `max_chars`.
pub(super) fn strip_json(v: serde_json::Value, max_chars: usize) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(strip_text(&s).chars().take(max_chars).collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| strip_json(x, max_chars)).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, x)| (strip_text(&k), strip_json(x, max_chars)))
                .collect(),
        ),
        other => other,
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
pub(super) fn listed_meta(policy: &ToolPolicy) -> MetaObject {
    let mut meta = MetaObject::default();
    meta.insert("cordon/server".into(), json!(policy.name));
    meta.insert(
        "cordon/profile".into(),
        json!(cordon_broker::profile_name(policy.profile)),
    );
    meta.insert("cordon/trust".into(), json!("untrusted"));
    meta
}

/// A `tools/call` result: the text blocks and resource links as one
/// wrapped text; each embedded text resource kept as a resource block, its
/// text gated and wrapped, its `_meta` its envelope (folded into the
/// wrapped text instead with `mcp: {fold_resources: true}`, and always in
/// an error result); images, audio and blobs checked against their
/// declared media type and passed on as they are; an `isError` result
/// stays one, its text through the gate's error path.
/// `structuredContent`, the same result as JSON, passes the JSON gate under
/// the cap by itself.
///
/// Binary parts are charged to the cap first (they cannot be cut); the text
/// gets what is left. An error result's text is never refused: it is cut to
/// what is left (at least [`MIN_MAX_BYTES`], at most
/// [`cordon_gate::ERROR_MAX_BYTES`]).
pub(super) fn tool_result(
    policy: &ToolPolicy,
    name: &str,
    r: CallToolResult,
    tokens: &LiveTokens,
) -> Result<CallToolResult, ErrorData> {
    let mut budget = Budget::new(policy, name, tokens)?;
    let fold = r.is_error == Some(true)
        || matches!(
            policy.exec,
            cordon_policy::policy::Exec::Mcp {
                fold_resources: true,
                ..
            }
        );
    let mut texts: Vec<String> = Vec::new();
    let mut binaries: Vec<ContentBlock> = Vec::new();
    let mut gated: Vec<Gated> = Vec::new();
    for block in &r.content {
        match block {
            ContentBlock::Text(t) => texts.push(t.text.clone()),
            ContentBlock::Image(i) => {
                if let Some((data, g)) = budget.blob(&i.mime_type, &i.data)? {
                    binaries.push(ContentBlock::image(data, i.mime_type.clone()));
                    gated.push(g);
                }
            }
            ContentBlock::Audio(a) => {
                if let Some((data, g)) = budget.blob(&a.mime_type, &a.data)? {
                    binaries.push(ContentBlock::audio(data, a.mime_type.clone()));
                    gated.push(g);
                }
            }
            ContentBlock::Resource(res) => match &res.resource {
                ResourceContents::TextResourceContents { uri, text, .. } if fold => {
                    texts.push(format!("[resource {uri}]\n{text}"));
                }
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => {
                    if let Some(g) = budget.text(text)? {
                        binaries.push(ContentBlock::resource(
                            ResourceContents::TextResourceContents {
                                uri: uri.clone(),
                                mime_type: mime_type.clone(),
                                text: g.render_wrapped(),
                                meta: Some(render::meta_of(&g)),
                            },
                        ));
                        gated.push(g);
                    }
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let mime = mime_type.clone().unwrap_or_default();
                    if let Some((data, g)) = budget.blob(&mime, blob)? {
                        binaries.push(ContentBlock::resource(
                            ResourceContents::BlobResourceContents {
                                uri: uri.clone(),
                                mime_type: mime_type.clone(),
                                blob: data,
                                meta: None,
                            },
                        ));
                        gated.push(g);
                    }
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
    let mut out = if r.is_error == Some(true) {
        let g = budget.error_text(joined.as_bytes());
        let out = CallToolResult::error(vec![ContentBlock::text(g.render_wrapped())]);
        gated.insert(0, g);
        out
    } else {
        let mut out = CallToolResult::success(vec![]);
        if let Some(g) = budget.text(&joined)? {
            if !joined.is_empty() || binaries.is_empty() {
                out.content.push(ContentBlock::text(g.render_wrapped()));
            }
            gated.insert(0, g);
        }
        if let Some(sc) = &r.structured_content {
            out.structured_content = Some(budget.json(sc)?);
        }
        out
    };
    out.content.extend(binaries);
    out.meta = Some(budget.summary(&gated)?);
    Ok(out)
}

/// A `resources/read` result: text as the wrapped untrusted rendering,
/// blobs checked (no declared type: `application/octet-stream`, size
/// only); each content's `_meta` is its own envelope, the result's the
/// summary of the whole read.
pub(super) fn read_result(
    policy: &ToolPolicy,
    uri: &str,
    r: ReadResourceResult,
    tokens: &LiveTokens,
) -> Result<ReadResourceResult, ErrorData> {
    let mut budget = Budget::new(policy, &policy.name, tokens)?;
    let mut gated = Vec::new();
    let mut contents = Vec::new();
    for c in r.contents {
        match c {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => {
                let Some(g) = budget.text(&text)? else {
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
                let mime = mime_type.as_deref().unwrap_or("application/octet-stream");
                let Some((blob, g)) = budget.blob(mime, &blob)? else {
                    continue;
                };
                contents.push(ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    meta: Some(render::meta_of(&g)),
                });
                gated.push(g);
            }
            _ => {
                return Err(budget.refused(format!(
                    "output refused: resources/read of `{uri}`: a content of an unknown kind"
                )));
            }
        }
    }
    let mut out = ReadResourceResult::new(contents);
    out.meta = Some(budget.summary(&gated)?);
    Ok(out)
}

/// A `prompts/get` result: each message's content gated like a read's
/// (a resource link becomes text, other kinds a placeholder), the
/// description stripped.
pub(super) fn prompt_result(
    policy: &ToolPolicy,
    name: &str,
    r: GetPromptResult,
    tokens: &LiveTokens,
) -> Result<GetPromptResult, ErrorData> {
    let mut budget = Budget::new(policy, name, tokens)?;
    let mut gated = Vec::new();
    let mut messages = Vec::new();
    for m in r.messages {
        if let Some(c) = budget.block(m.content, &mut gated)? {
            messages.push(PromptMessage::new(m.role, c));
        }
    }
    let mut out = GetPromptResult::new(messages);
    out.description = r.description.map(|d| strip_text(&d));
    out.meta = Some(budget.summary(&gated)?);
    Ok(out)
}

/// One result on its way through the gate: the tool's gate policy and how
/// much of its cap the parts gated so far have used.
struct Budget<'a> {
    /// The tool's gate policy; `max_bytes` is the cap on the whole result.
    base: GatePolicy,
    /// Who the envelopes and refusals name.
    label: &'a str,
    profile: &'static str,
    used: u64,
    /// Parts charged so far.
    parts: usize,
    /// Parts left out for want of room (`on_overflow: truncate`).
    dropped: usize,
    /// The live tokens of the server's session.
    tokens: &'a LiveTokens,
    /// What the secret scans replaced in the parts so far: secret names,
    /// and counts per format rule.
    found: RefCell<(Vec<String>, BTreeMap<String, u64>)>,
}

impl<'a> Budget<'a> {
    fn new(
        policy: &ToolPolicy,
        label: &'a str,
        tokens: &'a LiveTokens,
    ) -> Result<Budget<'a>, ErrorData> {
        let base = cordon_broker::gate_for(policy).map_err(|e| {
            render::refusal(Refusal::PolicyRefused, e, json!({"tool": policy.name}))
        })?;
        Ok(Budget {
            base: base.policy().clone(),
            label,
            profile: cordon_broker::profile_name(policy.profile),
            used: 0,
            parts: 0,
            dropped: 0,
            tokens,
            found: RefCell::new((Vec::new(), BTreeMap::new())),
        })
    }

    /// Remember what the secret scans replaced in one part.
    fn note(&self, g: &Gated) {
        let mut f = self.found.borrow_mut();
        for t in &g.envelope.tokens_replaced {
            if !f.0.contains(t) {
                f.0.push(t.clone());
            }
        }
        for (rule, n) in &g.envelope.secrets_redacted {
            *f.1.entry(rule.clone()).or_insert(0) += n;
        }
    }

    fn cap(&self) -> u64 {
        self.base.max_bytes
    }

    fn left(&self) -> u64 {
        self.cap().saturating_sub(self.used)
    }

    fn meta(&self) -> ToolMeta<'_> {
        ToolMeta::new(self.label, self.profile)
    }

    /// The tool's gate for one kind of part, capped at `max_bytes`.
    fn gate(
        &self,
        kind: OutputKind,
        media_type: Option<&str>,
        max_bytes: u64,
    ) -> Result<Gate, ErrorData> {
        Gate::new(GatePolicy {
            kind,
            media_type: media_type.map(str::to_owned),
            schema: None,
            max_bytes,
            ..self.base.clone()
        })
        .map_err(|e| self.refused(e.to_string()))
    }

    fn check(&self, gate: &Gate, bytes: &[u8]) -> Result<Gated, ErrorData> {
        let g = gate
            .check_scanned(&self.meta(), bytes, self.tokens)
            .map_err(|e| self.refused(e.to_string()))?;
        self.note(&g);
        Ok(g)
    }

    fn refused(&self, msg: String) -> ErrorData {
        gate_refused(self.label, msg)
    }

    /// The result's parts pass the cap together (`on_overflow: fail`).
    fn over_cap(&self, part: u64) -> ErrorData {
        self.refused(format!(
            "output refused: the result's first {} part(s) come to {} bytes, past the cap of {} bytes on the whole result (policy is fail)",
            self.parts + 1,
            self.used + part,
            self.cap()
        ))
    }

    fn charge(&mut self, g: &Gated) {
        self.used += g.envelope.bytes_out;
        self.parts += 1;
    }

    /// Text through the text gate. `None`: dropped (`truncate`, and no room
    /// is left for it).
    fn text(&mut self, text: &str) -> Result<Option<Gated>, ErrorData> {
        let left = self.left();
        let g = match self.base.on_overflow {
            Overflow::Fail => {
                // One part past the cap by itself: the gate's own refusal.
                let g = self.check(
                    &self.gate(OutputKind::Text, None, self.cap())?,
                    text.as_bytes(),
                )?;
                if g.envelope.bytes_out > left {
                    return Err(self.over_cap(g.envelope.bytes_out));
                }
                g
            }
            Overflow::Truncate => {
                let room = left.max(MIN_MAX_BYTES);
                let g = self.check(&self.gate(OutputKind::Text, None, room)?, text.as_bytes())?;
                if g.envelope.bytes_out > left {
                    self.dropped += 1;
                    return Ok(None);
                }
                g
            }
        };
        self.charge(&g);
        Ok(Some(g))
    }

    /// Base64 content through the binary gate (magic bytes against the
    /// declared media type): the bytes re-encoded. Never cut: one larger
    /// than the cap is refused; with `truncate`, one past what is left is
    /// dropped (`None`).
    fn blob(&mut self, mime: &str, b64: &str) -> Result<Option<(String, Gated)>, ErrorData> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| {
                self.refused(format!(
                    "output refused: {mime} content is not base64 ({e})"
                ))
            })?;
        let g = self.check(
            &self.gate(OutputKind::Binary, Some(mime), self.cap())?,
            &bytes,
        )?;
        if g.envelope.bytes_out > self.left() {
            match self.base.on_overflow {
                Overflow::Fail => return Err(self.over_cap(g.envelope.bytes_out)),
                Overflow::Truncate => {
                    self.dropped += 1;
                    return Ok(None);
                }
            }
        }
        self.charge(&g);
        Ok(Some((
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            g,
        )))
    }

    /// An error result's text through the gate's error path (stripped,
    /// wrapped, never refused), cut to what is left of the cap.
    fn error_text(&mut self, msg: &[u8]) -> Gated {
        let room = self.left().max(MIN_MAX_BYTES);
        let g = match Gate::new(GatePolicy {
            max_bytes: room,
            block_secrets: self.base.block_secrets,
            ..GatePolicy::default()
        }) {
            Ok(gate) => gate.gate_error_scanned(&self.meta(), msg, self.tokens),
            // Unreachable (the default policy with a cap of at least the
            // minimum); the error path with its own cap.
            Err(_) => cordon_gate::gate_error(&self.meta(), msg),
        };
        self.note(&g);
        self.charge(&g);
        g
    }

    /// `structuredContent` through the JSON gate, under the cap by itself.
    fn json(&self, value: &serde_json::Value) -> Result<serde_json::Value, ErrorData> {
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        let g = self.check(&self.gate(OutputKind::Json, None, self.cap())?, &bytes)?;
        match g.content {
            cordon_gate::Content::Json(v) => Ok(v),
            _ => Err(self.refused("output refused: structured content is not JSON".into())),
        }
    }

    /// One content block (of a prompt message) through the gate; `None`
    /// when it was dropped.
    fn block(
        &mut self,
        block: ContentBlock,
        gated: &mut Vec<Gated>,
    ) -> Result<Option<ContentBlock>, ErrorData> {
        Ok(match block {
            ContentBlock::Text(t) => self.text_block(&t.text, gated)?,
            ContentBlock::Image(i) => self.blob(&i.mime_type, &i.data)?.map(|(data, g)| {
                gated.push(g);
                ContentBlock::image(data, i.mime_type.clone())
            }),
            ContentBlock::Audio(a) => self.blob(&a.mime_type, &a.data)?.map(|(data, g)| {
                gated.push(g);
                ContentBlock::audio(data, a.mime_type.clone())
            }),
            ContentBlock::Resource(res) => match res.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => self.text(&text)?.map(|g| {
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
                    let mime = mime_type.as_deref().unwrap_or("application/octet-stream");
                    self.blob(mime, &blob)?.map(|(blob, g)| {
                        let c = ContentBlock::resource(ResourceContents::BlobResourceContents {
                            uri,
                            mime_type,
                            blob,
                            meta: Some(render::meta_of(&g)),
                        });
                        gated.push(g);
                        c
                    })
                }
                _ => self.text_block("[resource content dropped]", gated)?,
            },
            ContentBlock::ResourceLink(l) => {
                self.text_block(&format!("[resource link {} {}]", l.uri, l.name), gated)?
            }
            other => self.text_block(&format!("[{} content dropped]", other.kind_name()), gated)?,
        })
    }

    /// Text as a text block (`None`: dropped).
    fn text_block(
        &mut self,
        text: &str,
        gated: &mut Vec<Gated>,
    ) -> Result<Option<ContentBlock>, ErrorData> {
        Ok(self.text(text)?.map(|g| {
            let c = ContentBlock::text(g.render_wrapped());
            gated.push(g);
            c
        }))
    }

    /// The `_meta` of the whole result: the envelope of its first part
    /// with the byte counts of all parts; truncated when a part was cut or
    /// dropped under the cap.
    fn summary(&self, gated: &[Gated]) -> Result<MetaObject, ErrorData> {
        let empty;
        let first = match gated.first() {
            Some(g) => g,
            None => {
                empty = self.check(&self.gate(OutputKind::Text, None, MIN_MAX_BYTES)?, b"")?;
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
            json!(self.dropped > 0 || gated.iter().any(|g| g.envelope.truncated)),
        );
        meta.insert("cordon/parts".into(), json!(gated.len()));
        if self.dropped > 0 {
            meta.insert("cordon/parts_dropped".into(), json!(self.dropped));
        }
        let (tokens, redacted) = &*self.found.borrow();
        if !tokens.is_empty() || !redacted.is_empty() {
            if !tokens.is_empty() {
                meta.insert("cordon/tokens_replaced".into(), json!(tokens));
            }
            if !redacted.is_empty() {
                meta.insert("cordon/secrets_redacted".into(), json!(redacted));
            }
            let mut warnings: Vec<serde_json::Value> = meta
                .get("cordon/warnings")
                .and_then(|w| w.as_array().cloned())
                .unwrap_or_default();
            for w in cordon_gate::secret_warnings(tokens, redacted) {
                let w = json!(w);
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            meta.insert("cordon/warnings".into(), json!(warnings));
        }
        Ok(meta)
    }
}

fn gate_refused(label: &str, msg: String) -> ErrorData {
    render::refusal(
        Refusal::GateRefused,
        format!("{label}: {msg}"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::Role;

    const CAP: u64 = 1024;

    /// An `mcp:` tool capped at [`CAP`] bytes with this overflow policy.
    fn policy(overflow: &str) -> ToolPolicy {
        let yaml = format!(
            r#"version: 1
tools:
  fx:
    profile: P2
    description: A server.
    network: none
    limits: {{wall_seconds: 5, memory: 64M, tasks: 4, output_bytes: {CAP}}}
    output: {{on_overflow: {overflow}}}
    mcp:
      command: ["/bin/true"]
"#
        );
        let loaded = cordon_policy::load_str(std::path::Path::new("cordon.yaml"), &yaml).unwrap();
        loaded.policy.tools["fx"].clone()
    }

    fn text(len: usize) -> ContentBlock {
        ContentBlock::text("a".repeat(len))
    }

    /// A PNG (signature, then zeros) of `len` bytes.
    fn png(len: usize) -> String {
        let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
        b.resize(len, 0);
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn image(len: usize) -> ContentBlock {
        ContentBlock::image(png(len), "image/png")
    }

    fn text_content(len: usize) -> ResourceContents {
        ResourceContents::TextResourceContents {
            uri: "fx://a".into(),
            mime_type: Some("text/plain".into()),
            text: "a".repeat(len),
            meta: None,
        }
    }

    fn prompt(blocks: Vec<ContentBlock>) -> GetPromptResult {
        GetPromptResult::new(
            blocks
                .into_iter()
                .map(|b| PromptMessage::new(Role::User, b))
                .collect(),
        )
    }

    fn num(m: &Option<MetaObject>, key: &str) -> u64 {
        m.as_ref()
            .and_then(|m| m.get(key))
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    }

    fn truncated(m: &Option<MetaObject>) -> bool {
        m.as_ref().and_then(|m| m.get("cordon/truncated")) == Some(&json!(true))
    }

    /// A refusal of the gate whose message names the cap.
    fn refused_naming_the_cap(e: ErrorData) {
        assert_eq!(
            e.data.as_ref().and_then(|d| d.get("cordon/status")),
            Some(&json!("gate_refused")),
            "{e:?}"
        );
        assert!(
            e.message.contains(&format!("cap of {CAP} bytes")),
            "{}",
            e.message
        );
    }

    #[test]
    fn embedded_text_resources_stay_resource_blocks_unless_folded() {
        let r = || {
            CallToolResult::success(vec![
                ContentBlock::text("before"),
                ContentBlock::resource(ResourceContents::TextResourceContents {
                    uri: "fx://doc".into(),
                    mime_type: Some("text/plain".into()),
                    text: "inside\u{200b} the resource".into(),
                    meta: None,
                }),
            ])
        };
        let out = tool_result(&policy("fail"), "fx__t", r(), &LiveTokens::default()).unwrap();
        assert_eq!(out.content.len(), 2, "{out:?}");
        assert!(out.content[0].as_text().unwrap().text.contains("before"));
        let ContentBlock::Resource(res) = &out.content[1] else {
            panic!("{out:?}");
        };
        let ResourceContents::TextResourceContents {
            uri, text, meta, ..
        } = &res.resource
        else {
            panic!("{res:?}");
        };
        assert_eq!(uri, "fx://doc");
        assert!(text.starts_with("<untrusted-output "), "{text}");
        assert!(text.contains("inside the resource"), "stripped: {text}");
        assert_eq!(
            meta.as_ref().and_then(|m| m.get("cordon/trust")),
            Some(&json!("untrusted"))
        );
        // Folded: one wrapped text block.
        let mut p = policy("fail");
        if let cordon_policy::policy::Exec::Mcp { fold_resources, .. } = &mut p.exec {
            *fold_resources = true;
        }
        let out = tool_result(&p, "fx__t", r(), &LiveTokens::default()).unwrap();
        assert_eq!(out.content.len(), 1, "{out:?}");
        let t = &out.content[0].as_text().unwrap().text;
        assert!(t.contains("[resource fx://doc]"), "{t}");
    }

    #[test]
    fn a_tool_result_under_the_cap_passes_whole() {
        for overflow in ["fail", "truncate"] {
            let r = CallToolResult::success(vec![text(300), image(300), image(300)]);
            let out = tool_result(&policy(overflow), "fx__t", r, &LiveTokens::default()).unwrap();
            assert_eq!(out.content.len(), 3, "{overflow}");
            assert!(out.content[0].as_text().is_some());
            assert_eq!(num(&out.meta, "cordon/bytes_out"), 900, "{overflow}");
            assert_eq!(num(&out.meta, "cordon/parts"), 3, "{overflow}");
            assert!(!truncated(&out.meta), "{overflow}");
        }
    }

    #[test]
    fn blocks_each_under_the_cap_are_refused_together_past_it() {
        let p = policy("fail");
        // Images each under the cap, 1,200 bytes together.
        let r = CallToolResult::success(vec![image(400), image(400), image(400)]);
        refused_naming_the_cap(tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap_err());
        // Text blocks likewise, and text with an image.
        let r = CallToolResult::success(vec![text(400), text(400), text(400)]);
        refused_naming_the_cap(tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap_err());
        let r = CallToolResult::success(vec![text(600), image(600)]);
        refused_naming_the_cap(tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap_err());
        // An error result's images count too.
        let r = CallToolResult::error(vec![text(10), image(600), image(600)]);
        refused_naming_the_cap(tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap_err());
    }

    #[test]
    fn truncate_keeps_what_fits_and_marks_the_result() {
        let p = policy("truncate");
        // Images are never cut: the one past what is left is dropped.
        let r = CallToolResult::success(vec![image(400), image(400), image(400)]);
        let out = tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap();
        assert_eq!(out.content.len(), 2, "{out:?}");
        assert_eq!(num(&out.meta, "cordon/bytes_out"), 800);
        assert_eq!(num(&out.meta, "cordon/parts_dropped"), 1);
        assert!(truncated(&out.meta));
        // Text gets what the images left, and is cut with the marker.
        let r = CallToolResult::success(vec![text(600), image(600)]);
        let out = tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap();
        assert_eq!(out.content.len(), 2, "{out:?}");
        let t = &out.content[0].as_text().unwrap().text;
        assert!(t.contains("[cordon: output truncated"), "{t}");
        assert!(num(&out.meta, "cordon/bytes_out") <= CAP, "{:?}", out.meta);
        assert!(truncated(&out.meta));
        // An error result stays one, cut to what is left.
        let r = CallToolResult::error(vec![text(2000), image(800)]);
        let out = tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap();
        assert_eq!(out.is_error, Some(true));
        assert_eq!(out.content.len(), 2, "{out:?}");
        assert!(num(&out.meta, "cordon/bytes_out") <= CAP, "{:?}", out.meta);
        // One image past the cap by itself is refused: it cannot be cut.
        let r = CallToolResult::success(vec![image(2000)]);
        refused_naming_the_cap(tool_result(&p, "fx__t", r, &LiveTokens::default()).unwrap_err());
    }

    #[test]
    fn reads_and_prompts_are_capped_whole() {
        let p = policy("fail");
        let read = |parts: Vec<ResourceContents>| {
            read_result(
                &p,
                "fx://a",
                ReadResourceResult::new(parts),
                &LiveTokens::default(),
            )
        };
        let out = read(vec![text_content(400), text_content(400)]).unwrap();
        assert_eq!(out.contents.len(), 2);
        assert_eq!(num(&out.meta, "cordon/bytes_out"), 800);
        refused_naming_the_cap(
            read(vec![
                text_content(400),
                text_content(400),
                text_content(400),
            ])
            .unwrap_err(),
        );
        let blob = || ResourceContents::BlobResourceContents {
            uri: "fx://b".into(),
            mime_type: Some("image/png".into()),
            blob: png(400),
            meta: None,
        };
        refused_naming_the_cap(read(vec![blob(), blob(), blob()]).unwrap_err());

        let out = prompt_result(
            &p,
            "fx__p",
            prompt(vec![text(400), text(400)]),
            &LiveTokens::default(),
        )
        .unwrap();
        assert_eq!(out.messages.len(), 2);
        refused_naming_the_cap(
            prompt_result(
                &p,
                "fx__p",
                prompt(vec![text(400), text(400), text(400)]),
                &LiveTokens::default(),
            )
            .unwrap_err(),
        );
        refused_naming_the_cap(
            prompt_result(
                &p,
                "fx__p",
                prompt(vec![image(400), image(400), image(400)]),
                &LiveTokens::default(),
            )
            .unwrap_err(),
        );

        // Truncate: the last text is cut to what is left, and marked.
        let p = policy("truncate");
        let r = ReadResourceResult::new(vec![
            text_content(400),
            text_content(400),
            text_content(400),
        ]);
        let out = read_result(&p, "fx://a", r, &LiveTokens::default()).unwrap();
        assert_eq!(out.contents.len(), 3);
        assert!(num(&out.meta, "cordon/bytes_out") <= CAP, "{:?}", out.meta);
        assert!(truncated(&out.meta));
        let out = prompt_result(
            &p,
            "fx__p",
            prompt(vec![image(400), image(400), image(400)]),
            &LiveTokens::default(),
        )
        .unwrap();
        assert_eq!(out.messages.len(), 2);
        assert_eq!(num(&out.meta, "cordon/parts_dropped"), 1);
    }
}
