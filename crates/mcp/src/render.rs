//! Gated results as MCP results, and refusals as MCP errors.

use base64::Engine as _;
use cordon_gate::{Content, Gated, ToolMeta};
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, MetaObject, ResourceContents};
use serde_json::{Value, json};

/// The `_meta` of a result: the gate's envelope as `cordon/*` keys.
pub fn meta_of(g: &Gated) -> MetaObject {
    match g.envelope.to_mcp_meta() {
        Value::Object(m) => MetaObject(m),
        _ => MetaObject::default(),
    }
}

/// The content blocks of a gated result: text and JSON as the nonce-wrapped
/// untrusted rendering, images and audio as MCP image/audio content, other
/// binary output as an embedded blob resource.
pub fn blocks_of(g: &Gated) -> Vec<ContentBlock> {
    match &g.content {
        Content::Text(_) | Content::Json(_) => vec![ContentBlock::text(g.render_wrapped())],
        Content::Binary { media_type, bytes } => {
            let data = base64::engine::general_purpose::STANDARD.encode(bytes);
            if media_type.starts_with("image/") {
                vec![ContentBlock::image(data, media_type.clone())]
            } else if media_type.starts_with("audio/") {
                vec![ContentBlock::audio(data, media_type.clone())]
            } else {
                vec![ContentBlock::resource(
                    ResourceContents::BlobResourceContents {
                        uri: format!("cordon://output/{}", g.envelope.tool),
                        mime_type: Some(media_type.clone()),
                        blob: data,
                        meta: None,
                    },
                )]
            }
        }
    }
}

/// A successful, gated result.
pub fn success(g: &Gated) -> CallToolResult {
    let mut r = CallToolResult::success(blocks_of(g)).with_meta(Some(meta_of(g)));
    if let Content::Json(v) = &g.content {
        r.structured_content = Some(v.clone());
    }
    r
}

/// `result` with `_meta["cordon/warnings"]`: every mechanism of its
/// sandbox that was not fully enforced (cordon's own text, not the tool's).
pub fn with_warnings(mut result: CallToolResult, warnings: &[String]) -> CallToolResult {
    if warnings.is_empty() {
        return result;
    }
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert("cordon/warnings".into(), json!(warnings));
    result.meta = Some(meta);
    result
}

/// A tool failure as an `isError` result: the message passed through the
/// gate's error path (stripped, capped, wrapped as untrusted).
pub fn tool_error(tool: &str, profile: &str, message: &[u8]) -> CallToolResult {
    let g = cordon_gate::gate_error(&ToolMeta::new(tool, profile), message);
    CallToolResult::error(vec![ContentBlock::text(g.render_wrapped())]).with_meta(Some(meta_of(&g)))
}

/// What kind of refusal an MCP error reports, in its `data.cordon/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownTool,
    InvalidArguments,
    PolicyRefused,
    SandboxFailed,
    LimitHit,
    GateRefused,
    ServerFailed,
    DescriptionChanged,
    /// An exposed name that model APIs do not accept, or that belongs to
    /// another tool.
    NameRefused,
    UnknownPrompt,
    UnknownResource,
    AmbiguousResource,
    NotOffered,
    /// The `access:` grants give the session's principal no such name.
    NotGranted,
    /// The request's principal is not the one that opened the session.
    SessionRefused,
    /// The audit record could not be written: the result is withheld.
    AuditFailed,
    /// A cap at the door: the tool's `max_concurrent` (after its
    /// `queue_seconds`), the gateway's `max_sandboxes` or a tenant's fair
    /// share of it, or a principal's or tenant's calls in flight or
    /// sandboxes.
    Busy,
    /// The principal's `calls_per_minute`.
    RateLimited,
    /// The principal's `sessions`.
    TooManySessions,
    /// The tool was taken out of service: a probe run of `cordon serve`
    /// did not hold (`data`: `tool`, `probes`, `failed_at`).
    OutOfService,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::UnknownTool => "unknown_tool",
            Refusal::InvalidArguments => "invalid_arguments",
            Refusal::PolicyRefused => "policy_refused",
            Refusal::SandboxFailed => "sandbox_failed",
            Refusal::LimitHit => "limit_hit",
            Refusal::GateRefused => "gate_refused",
            Refusal::ServerFailed => "server_failed",
            Refusal::DescriptionChanged => "description_changed",
            Refusal::NameRefused => "name_refused",
            Refusal::UnknownPrompt => "unknown_prompt",
            Refusal::UnknownResource => "unknown_resource",
            Refusal::AmbiguousResource => "ambiguous_resource",
            Refusal::NotOffered => "not_offered",
            Refusal::NotGranted => "not_granted",
            Refusal::SessionRefused => "session_refused",
            Refusal::AuditFailed => "audit_failed",
            Refusal::Busy => "busy",
            Refusal::RateLimited => "rate_limited",
            Refusal::TooManySessions => "too_many_sessions",
            Refusal::OutOfService => "out_of_service",
        }
    }

    fn code(self) -> ErrorCode {
        match self {
            Refusal::UnknownTool
            | Refusal::InvalidArguments
            | Refusal::UnknownPrompt
            | Refusal::AmbiguousResource
            | Refusal::NotOffered => ErrorCode::INVALID_PARAMS,
            // The code the MCP specification gives an unknown resource.
            Refusal::UnknownResource => ErrorCode::RESOURCE_NOT_FOUND,
            Refusal::PolicyRefused
            | Refusal::DescriptionChanged
            | Refusal::NameRefused
            | Refusal::NotGranted
            | Refusal::SessionRefused
            | Refusal::OutOfService => ErrorCode::INVALID_REQUEST,
            _ => ErrorCode::INTERNAL_ERROR,
        }
    }
}

/// An MCP error with `data: {"cordon/status": ..., ...extra}`.
pub fn refusal(kind: Refusal, message: impl Into<String>, extra: Value) -> ErrorData {
    let mut data = json!({ "cordon/status": kind.as_str() });
    if let (Value::Object(d), Value::Object(e)) = (&mut data, extra) {
        d.extend(e);
    }
    ErrorData::new(kind.code(), message.into(), Some(data))
}
