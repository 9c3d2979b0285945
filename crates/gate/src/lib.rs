//! cordon-gate: the output gate every tool result passes through before it reaches the model.
//!
//! A sandbox limits what a compromised tool can do, not what it says. The gate is the
//! broker's last step on every result (and every tool error message):
//!
//! 1. **Kind.** `text` (default), `json`, or `binary` with a media type. Binary is never
//!    altered: its size and magic bytes are checked against the declared type.
//! 2. **Strip.** Control characters, ANSI/VT escape sequences, bidi overrides, zero-width and
//!    tag characters, invalid UTF-8; optionally HTML and markdown. See [`StripPolicy`].
//! 3. **Schema.** JSON output is validated (after stripping, so what is validated is what is
//!    delivered) against the tool's `output_schema` (JSON Schema 2020-12). A violation names
//!    the instance path and the keyword, never the value.
//! 4. **Size.** The cap applies to what the model receives, after every transformation.
//!    Text is truncated on a char boundary with an explicit marker, or refused; JSON and binary
//!    are always refused when over the cap (a truncated document is not a document).
//! 5. **Secrets.** Every live token of the session (what the credential broker minted for
//!    this session of this tool, given to [`Gate::check_scanned`]) is replaced by the
//!    session's placeholder, in every form the matcher of [`tokens`] knows (as it is,
//!    JSON-escaped, percent-encoded, base64); always on. With `block_secrets`, well-known
//!    secret formats (PEM private keys, AWS access key ids, GitHub and Slack tokens, JWTs) are
//!    replaced by `[REDACTED:RULE]`. Both run on what stripping left (so a token split by
//!    invisible characters is found whole) and before the size cap (so no half token is
//!    kept); the envelope names what was replaced (`tokens_replaced`, `secrets_redacted`).
//!    Binary output is altered by the live-token scan only.
//! 6. **Label.** A structured [`Envelope`], an MCP `_meta` object, and a wrapped text
//!    rendering with a per-result random nonce that the content cannot forge.
//!
//! ```
//! use cordon_gate::{Gate, GatePolicy, ToolMeta};
//! let gate = Gate::new(GatePolicy::default()).unwrap();
//! let gated = gate.check(&ToolMeta::new("pdf_to_text", "P1"), b"\x1b[31mhello\x1b[0m").unwrap();
//! assert_eq!(gated.content.as_text(), Some("hello"));
//! assert_eq!(gated.envelope.stripped.ansi, 2);
//! assert!(gated.render_wrapped().starts_with("<untrusted-output tool=\"pdf_to_text\""));
//! ```
#![forbid(unsafe_code)]

mod binary;
mod formats;
mod label;
mod markup;
mod strip;
pub mod tokens;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use binary::{known_media_types, sniff};
pub use formats::rule_names as secret_rules;
pub use label::{MARKER_CLOSE, MARKER_OPEN, META_PREFIX};
pub use strip::StripCounts;
pub use tokens::Forms as LiveTokens;

/// Default cap on a result: 1 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 1024 * 1024;
/// Smallest cap accepted: room for the truncation marker and some content.
pub const MIN_MAX_BYTES: u64 = 128;
/// Cap on a gated tool error message (the policy's cap applies if it is smaller).
pub const ERROR_MAX_BYTES: u64 = 16 * 1024;
/// Longest instance path reported in a schema violation.
const MAX_POINTER_BYTES: usize = 256;

/// What a tool returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// UTF-8 text (the default).
    #[default]
    Text,
    /// A JSON document, optionally validated against `schema`.
    Json,
    /// Opaque bytes of the declared `media_type`; never altered.
    Binary,
}

impl OutputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Text => "text",
            OutputKind::Json => "json",
            OutputKind::Binary => "binary",
        }
    }
}

impl fmt::Display for OutputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do when a result exceeds `max_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Refuse the result.
    Fail,
    /// Keep a prefix (text only) and mark the cut with the byte counts.
    #[default]
    Truncate,
}

/// What to do with bytes that are not UTF-8 (text kind, JSON kind, and error messages,
/// which always use `replace`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Utf8Policy {
    /// Replace each invalid sequence by U+FFFD and count it.
    #[default]
    Replace,
    /// Refuse the result, naming the byte offset.
    Reject,
}

/// How the result is labelled as untrusted when rendered as text for a prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LabelStyle {
    /// Content inside `<untrusted-output ... nonce="N">` ... `</untrusted-output nonce="N">`.
    #[default]
    Wrapped,
    /// A JSON object `{"envelope": {...}, "content": ...}`.
    Envelope,
    /// The bare content; the envelope carries a warning that the label is off.
    None,
}

/// Which classes of characters and markup the gate removes. Safe defaults: every character
/// class on, markup reduction off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "snake_case")]
pub struct StripPolicy {
    /// C0/C1 controls except `\n` and `\t`; `\r\n` and lone `\r` become `\n`.
    pub control: bool,
    /// ANSI/VT escape sequences (CSI, OSC, DCS, SOS/PM/APC, `ESC x`), removed whole.
    pub ansi: bool,
    /// Bidi embeddings, overrides, isolates and marks.
    pub bidi: bool,
    /// Zero-width and other invisible format characters.
    pub zero_width: bool,
    /// The Unicode tag block U+E0000..U+E007F.
    pub tags: bool,
    /// Remove HTML tags, comments, script/style bodies; decode entities once.
    pub html: bool,
    /// Reduce markdown links/images to their text; remove emphasis markers.
    pub markdown: bool,
}

impl Default for StripPolicy {
    fn default() -> Self {
        StripPolicy {
            control: true,
            ansi: true,
            bidi: true,
            zero_width: true,
            tags: true,
            html: false,
            markdown: false,
        }
    }
}

/// The gate's policy for one tool: what the manifest embeds under a tool's `output:` key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "snake_case")]
pub struct GatePolicy {
    pub kind: OutputKind,
    /// Required for `binary` (e.g. `image/png`), refused otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// JSON Schema 2020-12 for `json` output; refused for other kinds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Cap on what the model receives, in bytes, after every transformation.
    pub max_bytes: u64,
    pub on_overflow: Overflow,
    pub strip: StripPolicy,
    pub invalid_utf8: Utf8Policy,
    pub label: LabelStyle,
    /// Replace well-known secret formats (PEM private keys, AWS access key ids, GitHub and
    /// Slack tokens, JWTs) by `[REDACTED:RULE]`. The session's live tokens are replaced
    /// whatever this says.
    pub block_secrets: bool,
}

impl Default for GatePolicy {
    fn default() -> Self {
        GatePolicy {
            kind: OutputKind::Text,
            media_type: None,
            schema: None,
            max_bytes: DEFAULT_MAX_BYTES,
            on_overflow: Overflow::Truncate,
            strip: StripPolicy::default(),
            invalid_utf8: Utf8Policy::Replace,
            label: LabelStyle::Wrapped,
            block_secrets: false,
        }
    }
}

/// A policy the gate cannot enforce as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GateError {
    #[error("output policy refused: kind `binary` needs a `media_type` (for example image/png)")]
    MissingMediaType,
    #[error(
        "output policy refused: `media_type` is only meaningful for kind `binary`, not `{kind}`"
    )]
    MediaTypeWithoutBinary { kind: OutputKind },
    #[error("output policy refused: media type {media_type:?} is not of the form type/subtype")]
    InvalidMediaType { media_type: String },
    #[error("output policy refused: an output schema needs kind `json`, not `{kind}`")]
    SchemaWithoutJson { kind: OutputKind },
    #[error("output policy refused: the output schema does not compile: {reason}")]
    InvalidSchema { reason: String },
    #[error("output policy refused: max_bytes {max_bytes} is below the minimum of {min}")]
    MaxBytesTooSmall { max_bytes: u64, min: u64 },
}

/// A result the gate refused. Messages never contain the output or a value from it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GateRefusal {
    #[error("output refused: {bytes} bytes exceed the cap of {max_bytes} bytes ({why})")]
    TooLarge {
        bytes: u64,
        max_bytes: u64,
        why: &'static str,
    },
    #[error("output refused: invalid UTF-8 at byte offset {offset} and the policy rejects it")]
    InvalidUtf8 { offset: u64 },
    #[error("output refused: not valid JSON ({category} error at line {line}, column {column})")]
    InvalidJson {
        category: &'static str,
        line: usize,
        column: usize,
    },
    #[error(
        "output refused: schema violation at {instance_path:?}: keyword `{keyword}` (schema {schema_path:?}){}",
        if *more > 0 { format!("; {more} more violation(s)") } else { String::new() }
    )]
    SchemaViolation {
        /// JSON pointer to the failing value (stripped, at most 256 bytes).
        instance_path: String,
        /// The schema keyword that failed (`type`, `required`, `maxLength`, ...).
        keyword: String,
        /// JSON pointer into the schema.
        schema_path: String,
        /// How many other violations were found.
        more: usize,
    },
    #[error("output refused: declared {declared} but the bytes {}", match detected {
        Some(d) => format!("look like {d}"),
        None => "match no known signature".to_owned(),
    })]
    MediaTypeMismatch {
        declared: String,
        detected: Option<&'static str>,
    },
}

impl GateRefusal {
    /// A short stable code for logs and audit records.
    pub fn code(&self) -> &'static str {
        match self {
            GateRefusal::TooLarge { .. } => "too_large",
            GateRefusal::InvalidUtf8 { .. } => "invalid_utf8",
            GateRefusal::InvalidJson { .. } => "invalid_json",
            GateRefusal::SchemaViolation { .. } => "schema_violation",
            GateRefusal::MediaTypeMismatch { .. } => "media_type_mismatch",
        }
    }
}

/// Who produced the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolMeta<'a> {
    pub tool: &'a str,
    pub profile: &'a str,
}

impl<'a> ToolMeta<'a> {
    pub fn new(tool: &'a str, profile: &'a str) -> Self {
        ToolMeta { tool, profile }
    }
}

/// The gated content.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    Json(Value),
    Binary { media_type: String, bytes: Vec<u8> },
}

impl Content {
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The content as text for a prompt: text as is, JSON serialised compactly, binary as a
    /// one-line placeholder (its bytes travel out of band, e.g. as MCP image content).
    pub fn to_text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Json(v) => v.to_string(),
            Content::Binary { media_type, bytes } => {
                format!(
                    "[binary output: {media_type}, {} bytes, not shown as text]",
                    bytes.len()
                )
            }
        }
    }
}

/// The trust level of a result; there is only one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    #[default]
    Untrusted,
}

/// Where a text result was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Truncation {
    /// Bytes of content kept (before the truncation marker).
    pub kept: u64,
    /// Bytes the content had after stripping, before the cut.
    pub total: u64,
}

/// The facts about one gated result, for the caller and the prompt builder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope {
    pub tool: String,
    pub profile: String,
    pub trust: Trust,
    pub kind: OutputKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// True when this is a tool error message rather than a result.
    pub is_error: bool,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    pub stripped: StripCounts,
    /// `Some(true)` when a schema was checked (a violation is a refusal), `None` without one.
    pub schema_valid: Option<bool>,
    pub label: LabelStyle,
    /// The secrets of this session whose live token was in the result, each occurrence
    /// replaced by the session's placeholder (names, never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens_replaced: Vec<String>,
    /// Well-known secret formats replaced by `[REDACTED:RULE]`, counted per rule
    /// (`block_secrets`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets_redacted: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A result that passed the gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Gated {
    pub content: Content,
    pub envelope: Envelope,
    nonce: String,
}

/// A gate compiled for one tool: the schema is compiled once.
pub struct Gate {
    policy: GatePolicy,
    validator: Option<jsonschema::Validator>,
    media_type: Option<String>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// Check the policy and compile the schema (2020-12, linear-time `regex` engine for
    /// `pattern`, no remote `$ref`).
    pub fn new(policy: GatePolicy) -> Result<Gate, GateError> {
        if policy.max_bytes < MIN_MAX_BYTES {
            return Err(GateError::MaxBytesTooSmall {
                max_bytes: policy.max_bytes,
                min: MIN_MAX_BYTES,
            });
        }
        let media_type = match (policy.kind, &policy.media_type) {
            (OutputKind::Binary, None) => return Err(GateError::MissingMediaType),
            (OutputKind::Binary, Some(m)) => Some(binary::normalise_media_type(m)?),
            (kind, Some(_)) => return Err(GateError::MediaTypeWithoutBinary { kind }),
            (_, None) => None,
        };
        let validator = match (&policy.schema, policy.kind) {
            (None, _) => None,
            (Some(schema), OutputKind::Json) => Some(
                jsonschema::draft202012::options()
                    .with_pattern_options(jsonschema::PatternOptions::regex())
                    .build(schema)
                    .map_err(|e| GateError::InvalidSchema {
                        reason: e.to_string(),
                    })?,
            ),
            (Some(_), kind) => return Err(GateError::SchemaWithoutJson { kind }),
        };
        Ok(Gate {
            policy,
            validator,
            media_type,
        })
    }

    pub fn policy(&self) -> &GatePolicy {
        &self.policy
    }

    /// Gate one result of a tool without credentials.
    pub fn check(&self, meta: &ToolMeta<'_>, output: &[u8]) -> Result<Gated, GateRefusal> {
        self.check_scanned(meta, output, &LiveTokens::default())
    }

    /// Gate one result, replacing each of the session's `tokens` by its placeholder.
    pub fn check_scanned(
        &self,
        meta: &ToolMeta<'_>,
        output: &[u8],
        tokens: &LiveTokens,
    ) -> Result<Gated, GateRefusal> {
        let p = &self.policy;
        let bytes_in = output.len() as u64;
        let mut warnings = Vec::new();
        let mut found = Found::default();
        let (content, stripped, truncation, schema_valid, bytes_out) = match p.kind {
            OutputKind::Text => {
                if p.on_overflow == Overflow::Fail && bytes_in > p.max_bytes {
                    return Err(GateRefusal::TooLarge {
                        bytes: bytes_in,
                        max_bytes: p.max_bytes,
                        why: "policy is fail",
                    });
                }
                let (text, counts) = sanitize_text(output, &p.strip, p.invalid_utf8)?;
                let text = match scan_str(&text, tokens, p.block_secrets, &mut found) {
                    Some(t) => t,
                    None => text,
                };
                let (text, truncation) = cap_text(text, p.max_bytes, p.on_overflow)?;
                let out_len = text.len() as u64;
                (Content::Text(text), counts, truncation, None, out_len)
            }
            OutputKind::Json => {
                if bytes_in > p.max_bytes {
                    return Err(GateRefusal::TooLarge {
                        bytes: bytes_in,
                        max_bytes: p.max_bytes,
                        why: "JSON output is never truncated",
                    });
                }
                let (value, counts) = self.check_json(output, tokens, &mut found)?;
                let out_len = json_len(&value);
                if out_len > p.max_bytes {
                    return Err(GateRefusal::TooLarge {
                        bytes: out_len,
                        max_bytes: p.max_bytes,
                        why: "JSON output is never truncated",
                    });
                }
                let valid = self.validator.as_ref().map(|_| true);
                (Content::Json(value), counts, None, valid, out_len)
            }
            OutputKind::Binary => {
                if bytes_in > p.max_bytes {
                    return Err(GateRefusal::TooLarge {
                        bytes: bytes_in,
                        max_bytes: p.max_bytes,
                        why: "binary output is never altered",
                    });
                }
                // Invariant: Gate::new refuses a binary policy without a media type.
                let media_type = self.media_type.clone().unwrap_or_default();
                if let Some(note) = binary::check_magic(&media_type, output)? {
                    warnings.push(note);
                }
                // The one alteration of binary output: a live token does not leave.
                let bytes = match tokens.replace(output) {
                    Some((out, names)) => {
                        found.add_tokens(names);
                        out
                    }
                    None => output.to_vec(),
                };
                let bytes_out = bytes.len() as u64;
                (
                    Content::Binary { media_type, bytes },
                    StripCounts::default(),
                    None,
                    None,
                    bytes_out,
                )
            }
        };
        found.warn(&mut warnings);
        if p.label == LabelStyle::None {
            warnings.push(label::LABEL_OFF_WARNING.to_owned());
        }
        Ok(build(
            meta,
            content,
            Facts {
                bytes_in,
                bytes_out,
                stripped,
                truncation,
                schema_valid,
                is_error: false,
                found,
                warnings,
            },
            p.label,
        ))
    }

    /// Gate a tool error message (stderr excerpt, reason): always text, invalid UTF-8
    /// replaced, stripped with this tool's strip policy, truncated at the smaller of the
    /// policy's cap and [`ERROR_MAX_BYTES`], labelled like a result.
    pub fn gate_error(&self, meta: &ToolMeta<'_>, message: &[u8]) -> Gated {
        self.gate_error_scanned(meta, message, &LiveTokens::default())
    }

    /// [`Gate::gate_error`], replacing each of the session's `tokens` by its placeholder (and
    /// well-known secret formats with `block_secrets`).
    pub fn gate_error_scanned(
        &self,
        meta: &ToolMeta<'_>,
        message: &[u8],
        tokens: &LiveTokens,
    ) -> Gated {
        gate_error_with(
            meta,
            message,
            ErrorGate {
                strip: &self.policy.strip,
                max_bytes: self.policy.max_bytes.min(ERROR_MAX_BYTES),
                label: self.policy.label,
                tokens,
                block_secrets: self.policy.block_secrets,
            },
        )
    }

    fn check_json(
        &self,
        output: &[u8],
        tokens: &LiveTokens,
        found: &mut Found,
    ) -> Result<(Value, StripCounts), GateRefusal> {
        let p = &self.policy;
        let parsed = match strip::utf8(output) {
            Ok(s) => serde_json::from_str::<Value>(s),
            Err(e) => match p.invalid_utf8 {
                Utf8Policy::Reject => {
                    return Err(GateRefusal::InvalidUtf8 {
                        offset: e.valid_up_to() as u64,
                    });
                }
                Utf8Policy::Replace => {
                    serde_json::from_str::<Value>(&String::from_utf8_lossy(output))
                }
            },
        };
        let mut value = parsed.map_err(|e| GateRefusal::InvalidJson {
            category: match e.classify() {
                serde_json::error::Category::Io => "io",
                serde_json::error::Category::Syntax => "syntax",
                serde_json::error::Category::Data => "data",
                serde_json::error::Category::Eof => "unexpected end of input",
            },
            line: e.line(),
            column: e.column(),
        })?;
        let mut counts = StripCounts::default();
        if strip::utf8(output).is_err() {
            // Lossy decoding happened above; count the replacements once.
            counts.invalid_utf8 += output
                .utf8_chunks()
                .filter(|c| !c.invalid().is_empty())
                .count() as u64;
        }
        sanitize_json(&mut value, &p.strip, &mut counts);
        if (!tokens.is_empty() || p.block_secrets) && json_may_hold(&value, tokens, p.block_secrets)
        {
            // Before the schema: what is validated is what is delivered.
            scan_json(&mut value, tokens, p.block_secrets, found);
        }
        if let Some(v) = &self.validator {
            // The boolean check is much cheaper; errors are collected only for the refusal.
            let mut errors = if v.is_valid(&value) {
                None
            } else {
                Some(v.iter_errors(&value))
            };
            if let Some(first) = errors.as_mut().and_then(Iterator::next) {
                let refusal = GateRefusal::SchemaViolation {
                    instance_path: cap_pointer(first.instance_path().as_str()),
                    keyword: first.kind().keyword().to_owned(),
                    schema_path: cap_pointer(first.schema_path().as_str()),
                    more: errors.map_or(0, Iterator::count),
                };
                return Err(refusal);
            }
        }
        Ok((value, counts))
    }
}

/// What `build` needs besides the content.
struct Facts {
    bytes_in: u64,
    bytes_out: u64,
    stripped: StripCounts,
    truncation: Option<Truncation>,
    schema_valid: Option<bool>,
    is_error: bool,
    found: Found,
    warnings: Vec<String>,
}

/// What the secret scans replaced in one result.
#[derive(Default)]
struct Found {
    tokens: Vec<String>,
    redacted: BTreeMap<String, u64>,
}

impl Found {
    fn add_tokens(&mut self, names: Vec<String>) {
        for n in names {
            if !self.tokens.contains(&n) {
                self.tokens.push(n);
            }
        }
    }

    fn warn(&self, warnings: &mut Vec<String>) {
        warnings.extend(secret_warnings(&self.tokens, &self.redacted));
    }
}

/// The warnings that say what the secret scans replaced (names and rules, never values).
pub fn secret_warnings(tokens: &[String], redacted: &BTreeMap<String, u64>) -> Vec<String> {
    let mut out = Vec::new();
    if !tokens.is_empty() {
        out.push(format!(
            "the live token of secret {} was in the output: replaced by its placeholder",
            tokens.join(", ")
        ));
    }
    if !redacted.is_empty() {
        let rules: Vec<String> = redacted.iter().map(|(r, n)| format!("{r} ({n})")).collect();
        out.push(format!(
            "secret formats redacted from the output: {}",
            rules.join(", ")
        ));
    }
    out
}

impl Envelope {
    /// The warnings (also in `warnings`) that say what the secret scans replaced, for an
    /// audit record.
    pub fn secret_warnings(&self) -> Vec<String> {
        secret_warnings(&self.tokens_replaced, &self.secrets_redacted)
    }
}

/// `s` with the session's live tokens replaced by their placeholders and, with `formats`,
/// well-known secret formats redacted; `None` when nothing was found.
fn scan_str(s: &str, tokens: &LiveTokens, formats: bool, found: &mut Found) -> Option<String> {
    let mut cur = Cow::Borrowed(s);
    if !tokens.is_empty()
        && let Some((out, names)) = tokens.replace(s.as_bytes())
    {
        found.add_tokens(names);
        // Forms of a token found in valid UTF-8 start and end on character boundaries and
        // the placeholders are ASCII; a lossy decoding is never expected here.
        cur = Cow::Owned(match String::from_utf8(out) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        });
    }
    if formats && let Some(out) = formats::redact(&cur, &mut found.redacted) {
        cur = Cow::Owned(out);
    }
    match cur {
        Cow::Owned(t) => Some(t),
        Cow::Borrowed(_) => None,
    }
}

/// One scan of the whole document, serialised, before the walk string by string: a token or
/// format inside a string appears in the serialisation as it is or JSON-escaped, both forms
/// the scans know, so a document where this finds nothing has nothing to replace.
fn json_may_hold(value: &Value, tokens: &LiveTokens, formats: bool) -> bool {
    let doc = value.to_string();
    (!tokens.is_empty() && tokens.replace_all(doc.as_bytes()).is_some())
        || (formats && formats::redact(&doc, &mut BTreeMap::new()).is_some())
}

/// [`scan_str`] on every string (keys too) of a JSON value.
fn scan_json(value: &mut Value, tokens: &LiveTokens, formats: bool, found: &mut Found) {
    match value {
        Value::String(s) => {
            if let Some(t) = scan_str(s, tokens, formats, found) {
                *s = t;
            }
        }
        Value::Array(items) => {
            for item in items {
                scan_json(item, tokens, formats, found);
            }
        }
        Value::Object(map) => {
            let keys: Vec<Option<String>> = map
                .keys()
                .map(|k| scan_str(k, tokens, formats, found))
                .collect();
            if keys.iter().all(Option::is_none) {
                for v in map.values_mut() {
                    scan_json(v, tokens, formats, found);
                }
                return;
            }
            let old = std::mem::take(map);
            for ((k, mut v), new) in old.into_iter().zip(keys) {
                scan_json(&mut v, tokens, formats, found);
                map.insert(new.unwrap_or(k), v);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn build(meta: &ToolMeta<'_>, content: Content, facts: Facts, label: LabelStyle) -> Gated {
    let Facts {
        bytes_in,
        bytes_out,
        stripped,
        truncation,
        schema_valid,
        is_error,
        found,
        warnings,
    } = facts;
    let (kind, media_type) = match &content {
        Content::Text(_) => (OutputKind::Text, None),
        Content::Json(_) => (OutputKind::Json, None),
        Content::Binary { media_type, .. } => (OutputKind::Binary, Some(media_type.clone())),
    };
    let envelope = Envelope {
        tool: meta.tool.to_owned(),
        profile: meta.profile.to_owned(),
        trust: Trust::Untrusted,
        kind,
        media_type,
        is_error,
        bytes_in,
        bytes_out,
        truncated: truncation.is_some(),
        truncation,
        stripped,
        schema_valid,
        label,
        tokens_replaced: found.tokens,
        secrets_redacted: found.redacted,
        warnings,
    };
    Gated {
        content,
        envelope,
        nonce: label::new_nonce(),
    }
}

/// Gate a tool error message with the default strip policy and [`ERROR_MAX_BYTES`].
pub fn gate_error(meta: &ToolMeta<'_>, message: &[u8]) -> Gated {
    gate_error_with(
        meta,
        message,
        ErrorGate {
            strip: &StripPolicy::default(),
            max_bytes: ERROR_MAX_BYTES,
            label: LabelStyle::Wrapped,
            tokens: &LiveTokens::default(),
            block_secrets: false,
        },
    )
}

/// How one error message is gated.
struct ErrorGate<'a> {
    strip: &'a StripPolicy,
    max_bytes: u64,
    label: LabelStyle,
    tokens: &'a LiveTokens,
    block_secrets: bool,
}

fn gate_error_with(meta: &ToolMeta<'_>, message: &[u8], g: ErrorGate<'_>) -> Gated {
    let ErrorGate {
        strip,
        max_bytes,
        label,
        tokens,
        block_secrets,
    } = g;
    let bytes_in = message.len() as u64;
    let (text, counts) = match sanitize_text(message, strip, Utf8Policy::Replace) {
        Ok(r) => r,
        // Unreachable with Replace; fall back to saying so rather than passing bytes through.
        Err(e) => (e.to_string(), StripCounts::default()),
    };
    let mut found = Found::default();
    let text = match scan_str(&text, tokens, block_secrets, &mut found) {
        Some(t) => t,
        None => text,
    };
    let (text, truncation) = match cap_text(text, max_bytes.max(MIN_MAX_BYTES), Overflow::Truncate)
    {
        Ok(r) => r,
        Err(e) => (e.to_string(), None),
    };
    let mut warnings = Vec::new();
    found.warn(&mut warnings);
    if label == LabelStyle::None {
        warnings.push(label::LABEL_OFF_WARNING.to_owned());
    }
    let bytes_out = text.len() as u64;
    let facts = Facts {
        bytes_in,
        bytes_out,
        stripped: counts,
        truncation,
        schema_valid: None,
        is_error: true,
        found,
        warnings,
    };
    build(meta, Content::Text(text), facts, label)
}

/// True for every character the default strip policy removes: C0/C1 controls (including
/// `\r`, excluding `\n` and `\t`), bidi controls, zero-width/invisible format characters and
/// tag characters. Other layers (the audit log's escaping) use it to agree with the gate.
pub fn is_stripped_char(c: char) -> bool {
    c == '\r'
        || strip::is_control(c)
        || strip::is_bidi(c)
        || strip::is_zero_width(c)
        || strip::is_tag(c)
}

/// The full text pipeline: optional markup passes, the character sanitiser, marker
/// neutralisation. Public so other layers (e.g. the audit log's stderr excerpts, a CLI's
/// error printing) can reuse exactly the gate's rules.
pub fn sanitize_text(
    bytes: &[u8],
    policy: &StripPolicy,
    utf8: Utf8Policy,
) -> Result<(String, StripCounts), GateRefusal> {
    let mut stripper = strip::Stripper::new(policy, bytes.len());
    if policy.html || policy.markdown {
        // Decode first so the markup passes see text; the sanitiser then runs on their output,
        // so anything an entity decodes to is still subject to stripping.
        let mut invalid = 0u64;
        let text = match strip::utf8(bytes) {
            Ok(s) => std::borrow::Cow::Borrowed(s),
            Err(e) => {
                if utf8 == Utf8Policy::Reject {
                    return Err(GateRefusal::InvalidUtf8 {
                        offset: e.valid_up_to() as u64,
                    });
                }
                invalid = bytes
                    .utf8_chunks()
                    .filter(|c| !c.invalid().is_empty())
                    .count() as u64;
                String::from_utf8_lossy(bytes)
            }
        };
        let mut counts = StripCounts::default();
        let mut text = text.into_owned();
        if policy.html {
            text = markup::strip_html(&text, &mut counts);
        }
        if policy.markdown {
            text = markup::strip_markdown(&text, &mut counts);
        }
        stripper.push_str(&text);
        let (out, mut c) = stripper.finish();
        c.invalid_utf8 += invalid;
        c.html_tags += counts.html_tags;
        c.html_entities += counts.html_entities;
        c.markdown += counts.markdown;
        let out = strip::neutralise_markers(out, &mut c);
        return Ok((out, c));
    }
    stripper.push_bytes(bytes, utf8)?;
    let (out, mut c) = stripper.finish();
    let out = strip::neutralise_markers(out, &mut c);
    Ok((out, c))
}

/// The marker appended to truncated text.
fn truncation_marker(kept: u64, total: u64) -> String {
    format!("\n[cordon: output truncated, kept {kept} of {total} bytes]")
}

fn cap_text(
    text: String,
    max_bytes: u64,
    overflow: Overflow,
) -> Result<(String, Option<Truncation>), GateRefusal> {
    let total = text.len() as u64;
    if total <= max_bytes {
        return Ok((text, None));
    }
    if overflow == Overflow::Fail {
        return Err(GateRefusal::TooLarge {
            bytes: total,
            max_bytes,
            why: "after stripping; policy is fail",
        });
    }
    // The marker for the widest possible `kept` bounds the marker's length.
    let bound = truncation_marker(max_bytes, total).len() as u64;
    let mut kept = max_bytes.saturating_sub(bound) as usize;
    while !text.is_char_boundary(kept) {
        kept -= 1;
    }
    let mut text = text;
    text.truncate(kept);
    text.push_str(&truncation_marker(kept as u64, total));
    debug_assert!(text.len() as u64 <= max_bytes);
    Ok((
        text,
        Some(Truncation {
            kept: kept as u64,
            total,
        }),
    ))
}

/// Strip every string (keys too) in a JSON value.
fn sanitize_json(value: &mut Value, policy: &StripPolicy, counts: &mut StripCounts) {
    let clean = |s: &str, counts: &mut StripCounts| -> String {
        // Strings in a parsed Value are valid UTF-8, so Replace never triggers.
        match sanitize_text(s.as_bytes(), policy, Utf8Policy::Replace) {
            Ok((out, c)) => {
                add_counts(counts, &c);
                out
            }
            Err(_) => String::new(),
        }
    };
    match value {
        Value::String(s) => {
            if needs_work(s, policy) {
                *s = clean(s, counts);
            }
        }
        Value::Array(items) => {
            for item in items {
                sanitize_json(item, policy, counts);
            }
        }
        Value::Object(map) => {
            if map.keys().any(|k| needs_work(k, policy)) {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    sanitize_json(&mut v, policy, counts);
                    map.insert(clean(&k, counts), v);
                }
            } else {
                for v in map.values_mut() {
                    sanitize_json(v, policy, counts);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Cheap pre-check: can `sanitize_text` change this string?
fn needs_work(s: &str, policy: &StripPolicy) -> bool {
    policy.html
        || policy.markdown
        || s.bytes().any(|b| !(0x20..0x7f).contains(&b))
        || strip::contains_marker_name(s.as_bytes())
}

fn add_counts(a: &mut StripCounts, b: &StripCounts) {
    a.control += b.control;
    a.newline += b.newline;
    a.ansi += b.ansi;
    a.bidi += b.bidi;
    a.zero_width += b.zero_width;
    a.tags += b.tags;
    a.invalid_utf8 += b.invalid_utf8;
    a.html_tags += b.html_tags;
    a.html_entities += b.html_entities;
    a.markdown += b.markdown;
    a.marker += b.marker;
}

/// Serialised (compact) length of a JSON value, without building the string.
fn json_len(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a Value to an infallible writer cannot fail (all keys are strings).
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A JSON pointer for an error message: stripped with the default policy and capped.
fn cap_pointer(p: &str) -> String {
    let (mut s, _) = sanitize_text(p.as_bytes(), &StripPolicy::default(), Utf8Policy::Replace)
        .unwrap_or_else(|_| (String::new(), StripCounts::default()));
    if s.len() > MAX_POINTER_BYTES {
        let mut cut = MAX_POINTER_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests;
