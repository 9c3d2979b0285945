//! The resolved policy: one plain value per tool with every effective
//! setting after defaults. Runtimes consume this and nothing else; it can be
//! printed (`cordon explain`), diffed (`cordon diff`) and tested without
//! running anything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::manifest::{
    Boot, Deliver, Encoding, Expose, InvalidUtf8, Label, Lifetime, Mechanism, MountMode,
    NAME_SEPARATOR, OutputKind, Overflow, PoolSettings, Profile, Runtime,
};
/// A tool's limits and system-call filter are the sandbox's own.
pub use cordon_sandbox::{Limits, Seccomp};

/// All tools of a manifest, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySet {
    pub tools: BTreeMap<String, ToolPolicy>,
    /// Session lifetime and caps of `cordon serve`.
    #[serde(default)]
    pub gateway: crate::gateway::GatewayPolicy,
    /// The manifest's grants (`None`: no `access:` section, every caller
    /// may use everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access::Access>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolPolicy {
    pub name: String,
    pub profile: Profile,
    pub description: String,
    pub runtime: Runtime,
    pub exec: Exec,
    /// Absent only for P0 (no sandbox, so nothing enforces a limit).
    pub limits: Option<Limits>,
    pub network: Network,
    pub secrets: Vec<Secret>,
    /// Egress entries (`host:port`) whose TLS is tunnelled untouched: never
    /// intercepted, never given a secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_passthrough: Vec<String>,
    pub mounts: Vec<Mount>,
    /// The session workspace mounted read-write in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Workspace>,
    /// The tool's per-tenant state mounted read-write in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// The complete environment the tool sees (PATH, HOME, LANG and the manifest's `env`).
    pub env: BTreeMap<String, String>,
    pub lifetime: Lifetime,
    /// How a `runtime: microvm` task's guest starts (`None` for every
    /// other runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<Boot>,
    /// The warm pool's settings (`lifetime: pool` only).
    pub pool: Option<PoolSettings>,
    pub input: Input,
    pub input_schema: Option<serde_json::Value>,
    pub output_schema: Option<serde_json::Value>,
    pub output: Output,
    pub seccomp: Seccomp,
    /// Mechanisms the runtime must fully enforce on the host, else the
    /// tool is refused: the profile's defaults
    /// ([`crate::resolve::default_requirements`]) and the manifest's and
    /// tool's `require`, less what is accepted.
    #[serde(default)]
    pub require: Vec<Mechanism>,
    /// Degradations accepted: these may be partial or missing (each call
    /// says so).
    #[serde(default)]
    pub accept: Vec<Mechanism>,
    /// Calls in flight at once and how long one beyond waits (`None`: no
    /// bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::gateway::Concurrency>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exec {
    Command {
        argv: Vec<String>,
    },
    /// An OCI image pinned by digest; `command` (when given) replaces the
    /// image's `Entrypoint` and `Cmd`.
    Image {
        reference: String,
        digest: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<Vec<String>>,
    },
    Mcp {
        command: Option<Vec<String>>,
        image: Option<String>,
        /// How the server's tools and prompts are named to the agent.
        #[serde(default)]
        expose: Expose,
        /// Seconds the server has to initialize and list its tools.
        #[serde(default = "default_startup_seconds")]
        startup_seconds: u64,
        /// The server may ask the client's model (`sampling/createMessage`).
        #[serde(default)]
        allow_sampling: bool,
        /// The server may ask the client's user (`elicitation/create`).
        #[serde(default)]
        allow_elicitation: bool,
        /// A result's text resources folded into its wrapped text.
        #[serde(default)]
        fold_resources: bool,
        /// Sandboxes kept ready with the server started and listed
        /// (`lifetime: session` only; 0: none).
        #[serde(default)]
        warm: u32,
        /// The call a warm server gets before it is pooled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        warm_up: Option<WarmUpCall>,
        /// The server's tools exposed, by the server's names (`None`: all).
        allow: Option<Vec<String>>,
        /// Full exposed names of server tools (no prefix added).
        rename: BTreeMap<String, String>,
        descriptions: BTreeMap<String, String>,
        /// Resource URIs and URI templates exposed (`None`: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resources: Option<Vec<String>>,
        /// Prompts exposed, by the server's names (`None`: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompts: Option<Vec<String>>,
    },
    /// A WASI preview 1 module or a component (`runtime: wasm`), pinned
    /// by sha256, run with `argv` (`argv[0]`: its name).
    Wasm {
        module: String,
        sha256: String,
        argv: Vec<String>,
        /// Calls served by a warm worker (`module: {worker: true}`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        worker: bool,
        /// The component's typed function each call calls, its arguments
        /// as JSON on stdin (`module: {function: NAME}`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        function: Option<String>,
    },
    /// The manifest names no program yet (allowed, e.g. a P3 runtime still
    /// to be given an image); such a tool is refused at run time.
    Unspecified,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Network {
    /// An empty network namespace: no route anywhere.
    None,
    /// Only these `host:port` destinations, through the broker's doors.
    Allowlist {
        allow: Vec<String>,
        resolve: BTreeMap<String, String>,
        allow_cidrs: Vec<String>,
    },
    /// Any public destination on ports 80 and 443, through the filtering proxy.
    Proxy {
        resolve: BTreeMap<String, String>,
        allow_cidrs: Vec<String>,
    },
    /// P0: the host's network, unfiltered.
    Host,
}

/// A credential the broker mints for each session of the tool. The policy
/// holds what it is and where it goes, never a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    /// The variable the tool sees.
    pub name: String,
    pub scope: String,
    pub ttl_seconds: u64,
    /// The provider by name; `None`: the provider file's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The token's audience (token exchange), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    pub deliver: Deliver,
    /// Where the door substitutes it: always set for `deliver: proxy`,
    /// never for `env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<SecretBinding>,
}

/// The endpoint a proxy-delivered secret is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBinding {
    /// Lower case, no trailing dot.
    pub host: String,
    pub port: u16,
    /// Path prefix; `None`: any path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub placement: Placement,
}

/// Where the token goes in a request to the bound endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// `name: template` with `{token}` replaced.
    Header { name: String, template: String },
    /// Basic authentication: this user, the token as password.
    Basic { username: String },
    /// A query parameter.
    Query { param: String },
}

impl SecretBinding {
    /// `host:port/path` and the placement, for summaries.
    pub fn describe(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let place = match &self.placement {
            Placement::Header { name, template } => format!("header {name}: {template}"),
            Placement::Basic { username } => format!("basic user {username}"),
            Placement::Query { param } => format!("query {param}"),
        };
        format!(
            "{host}:{}{} {place}",
            self.port,
            self.path.as_deref().unwrap_or("")
        )
    }
}

/// Variables that name a trust bundle for the usual TLS stacks (OpenSSL,
/// Python `requests`, curl, Node, git, cargo, Deno): where a sandbox whose
/// secrets are substituted at its egress door finds the session CA, on
/// every runtime and in a rendered Pod alike.
pub const TRUST_BUNDLE_ENV: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub src: String,
    pub dst: String,
    /// Read-write (`:rw`); read-only otherwise. Always printed, so that
    /// `cordon explain` says which.
    #[serde(default)]
    pub writable: bool,
}

/// A session workspace: the session's own directory, read-write at
/// `mount`, of at most `size_bytes`, kept `retain_seconds` after the
/// session ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    /// Absolute path inside the sandbox.
    pub mount: String,
    pub size_bytes: u64,
    /// Seconds it outlives its session (0: destroyed when it ends).
    #[serde(default)]
    pub retain_seconds: u64,
}

/// A tool's state: one directory per tenant, kept across sessions,
/// read-write at `mount`, of at most `size_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Absolute path inside the sandbox.
    pub mount: String,
    pub size_bytes: u64,
}

/// How MCP arguments reach a command tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    /// The argument whose value goes on stdin (none: empty stdin).
    pub stdin: Option<String>,
    pub encoding: Encoding,
    /// Arguments appended to argv, one slot each.
    pub argv: Vec<String>,
    /// The whole arguments object, as JSON, on stdin (a component's typed
    /// function: `module: {function: NAME}`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub json: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub kind: OutputKind,
    pub media_type: Option<String>,
    pub on_overflow: Overflow,
    pub strip_html: bool,
    pub strip_markdown: bool,
    pub strip: StripClasses,
    pub label: Label,
    pub invalid_utf8: InvalidUtf8,
    /// Well-known secret formats redacted by the gate (the session's live
    /// tokens always are).
    #[serde(default)]
    pub block_secrets: bool,
}

/// Character classes the gate removes (all on by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripClasses {
    pub control: bool,
    pub ansi: bool,
    pub bidi: bool,
    pub zero_width: bool,
    pub tags: bool,
}

impl Default for StripClasses {
    fn default() -> Self {
        StripClasses {
            control: true,
            ansi: true,
            bidi: true,
            zero_width: true,
            tags: true,
        }
    }
}

impl Output {
    /// Text output, every default of the gate.
    pub fn text() -> Output {
        Output {
            kind: OutputKind::Text,
            media_type: None,
            on_overflow: Overflow::Fail,
            strip_html: false,
            strip_markdown: false,
            strip: StripClasses::default(),
            label: Label::Wrapped,
            invalid_utf8: InvalidUtf8::Replace,
            block_secrets: false,
        }
    }
}

/// Seconds an `mcp:` server has to start when the manifest does not say.
pub const DEFAULT_STARTUP_SECONDS: u64 = 20;

/// The call a warm server gets before it is pooled, its result discarded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmUpCall {
    /// The server's own name of the tool.
    pub tool: String,
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// The most sandboxes `mcp: {warm: N}` keeps ready per tenant.
pub const MAX_WARM: u32 = 8;

fn default_startup_seconds() -> u64 {
    DEFAULT_STARTUP_SECONDS
}

/// The longest tool name model APIs accept.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` is one model APIs accept as a tool name:
/// `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_exposed_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why `name` is not a valid exposed name (for messages), or `None`.
pub fn invalid_name_reason(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("it is empty".into())
    } else if name.len() > MAX_NAME_LEN {
        Some(format!(
            "it is {} characters long, past the {MAX_NAME_LEN} model APIs accept",
            name.len()
        ))
    } else if !valid_exposed_name(name) {
        Some("model APIs accept only letters, digits, `_` and `-` (`^[a-zA-Z0-9_-]{1,64}$`)".into())
    } else {
        None
    }
}

/// The name a server's tool is exposed under: its `rename` entry as is,
/// else `<tool>__<name>` (prefixed) or the server's name (as-is).
pub fn exposed_tool_name(
    tool: &str,
    expose: Expose,
    rename: &BTreeMap<String, String>,
    server_name: &str,
) -> String {
    match rename.get(server_name) {
        Some(r) => r.clone(),
        None => exposed_prompt_name(tool, expose, server_name),
    }
}

/// The name a server's prompt is exposed under: `<tool>__<name>`
/// (prefixed) or the server's name (as-is).
pub fn exposed_prompt_name(tool: &str, expose: Expose, server_name: &str) -> String {
    match expose {
        Expose::Prefixed => format!("{tool}{NAME_SEPARATOR}{server_name}"),
        Expose::AsIs => server_name.to_owned(),
    }
}

impl ToolPolicy {
    /// Limits, or an error naming the tool when the profile has none (P0).
    pub fn require_limits(&self) -> Result<Limits, String> {
        self.limits
            .ok_or_else(|| format!("{}: profile P0 has no sandbox and no limits", self.name))
    }
}

impl PolicySet {
    pub fn get(&self, tool: &str) -> Option<&ToolPolicy> {
        self.tools.get(tool)
    }
}
