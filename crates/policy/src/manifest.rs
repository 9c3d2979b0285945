//! The manifest as written: YAML, parsed into typed structs with unknown
//! keys refused, so that a typo can never silently weaken a policy.
//!
//! These types mirror the file. They are not consumed by runtimes: see
//! [`crate::policy`] for the resolved value that is.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// A cordon manifest: every tool an agent may call, and the boundary each runs in.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "cordon manifest")]
pub struct Manifest {
    /// Manifest format version. Only 1 exists; omit it or write 1.
    #[serde(default)]
    pub version: Option<u32>,
    /// Mechanisms every tool requires on top of its profile's defaults
    /// (a tool whose runtime cannot fully enforce one here is refused).
    #[serde(default)]
    pub require: Vec<Mechanism>,
    /// Degradations accepted for every tool: these mechanisms may be
    /// partial or missing on the host (the call then says so).
    #[serde(default)]
    pub accept: Vec<Mechanism>,
    /// Session lifetime and caps of `cordon serve`: idle timeout, live
    /// sandboxes, per-principal rates and sessions.
    #[serde(default)]
    pub gateway: Option<crate::gateway::GatewaySettings>,
    /// The tools, by name. A name is what the agent calls.
    #[schemars(with = "BTreeMap<String, Tool>")]
    pub tools: BTreeMap<String, Spanned<Tool>>,
    /// Who may list and call which tools, prompts and resources. Absent:
    /// every caller may use everything; present: only what a grant names.
    #[serde(default)]
    #[schemars(with = "Option<Access>")]
    pub access: Option<Spanned<Access>>,
}

/// Authorization: the grants of a manifest. Anything no grant gives a
/// caller is invisible in its listings and refused when called, got or
/// read.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Access {
    /// Each grant names principals and what they may use.
    #[schemars(with = "Vec<Grant>")]
    pub grants: Vec<Spanned<Grant>>,
}

/// One grant: the principals it is for (every given field must match) and
/// the exposed names they may list and use. Names are exact or simple
/// globs, `*` standing for any run of characters (`scratch__*`, `*`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The principal's subject (a token's `sub`, a static token's name,
    /// `local:<uid>` on stdio, `anonymous` without authentication).
    #[serde(default)]
    pub subject: Option<String>,
    /// The OAuth client the principal's token was issued to.
    #[serde(default)]
    pub client: Option<String>,
    /// A group or role claim the principal carries.
    #[serde(default)]
    pub group: Option<String>,
    /// The principal's tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Exposed tool names (command tools by their key, server tools as
    /// exposed, e.g. `scratch__*`).
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub tools: Vec<Spanned<String>>,
    /// Exposed prompt names.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub prompts: Vec<Spanned<String>>,
    /// Resource URIs, as the server lists them or in their
    /// `cordon://<tool>/...` form (`cordon://scratch/*`: every resource of
    /// `scratch`); resource templates likewise.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub resources: Vec<Spanned<String>>,
}

/// An isolation mechanism a runtime enforces, partly enforces or lacks on
/// a host (`cordon doctor` lists them).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Fresh user, mount, pid, ipc, uts and cgroup namespaces.
    Namespaces,
    /// A read-only root, every bind read-only including its submounts.
    ReadonlyRoot,
    /// Only the sandbox's own descriptors cross into it.
    Descriptors,
    /// A network namespace with no route but the broker's doors.
    Network,
    /// A seccomp filter.
    Seccomp,
    /// Landlock file-system rules as a second layer.
    Landlock,
    /// Memory, task and CPU limits through cgroups (not rlimits).
    Cgroup,
    /// Hardware virtualization for a microVM guest (missing: QEMU's TCG
    /// emulation, slow). Required by `runtime: microvm` unless accepted.
    Kvm,
}

impl Mechanism {
    pub const ALL: [Mechanism; 8] = [
        Mechanism::Namespaces,
        Mechanism::ReadonlyRoot,
        Mechanism::Descriptors,
        Mechanism::Network,
        Mechanism::Seccomp,
        Mechanism::Landlock,
        Mechanism::Cgroup,
        Mechanism::Kvm,
    ];

    /// The name used in manifests and messages.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Namespaces => "namespaces",
            Mechanism::ReadonlyRoot => "readonly_root",
            Mechanism::Descriptors => "descriptors",
            Mechanism::Network => "network",
            Mechanism::Seccomp => "seccomp",
            Mechanism::Landlock => "landlock",
            Mechanism::Cgroup => "cgroup",
            Mechanism::Kvm => "kvm",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tool: its profile, what runs, and the allowances inside the profile.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Isolation profile. P0: no sandbox (must be explicit); P1: parser jail;
    /// P2: MCP server with an egress allowlist and scoped secrets; P3: fresh
    /// gVisor or microVM runtime per task.
    #[schemars(with = "Profile")]
    pub profile: Spanned<Profile>,
    /// What the tool does, shown to the agent.
    #[serde(default)]
    pub description: Option<String>,
    /// Command line, argv form (never passed through a shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// OCI image reference, pinned by digest: `name@sha256:<64 hex digits>`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub image: Option<Spanned<String>>,
    /// A third-party MCP server started inside the sandbox.
    #[serde(default)]
    pub mcp: Option<McpServer>,
    /// Sandbox runtime. native (default): namespaces, seccomp, Landlock, cgroups.
    /// wasm: a WASI preview 1 `module` or a component run by wasmtime inside the native jail.
    #[serde(default)]
    #[schemars(with = "Option<Runtime>")]
    pub runtime: Option<Spanned<Runtime>>,
    /// With `runtime: microvm`: how each task's guest starts. `snapshot`
    /// (default): restored from a template snapshot of the image, booted
    /// once on first use and kept in the store; `cold`: booted from
    /// nothing for every task, and no snapshot is made or kept.
    #[serde(default)]
    #[schemars(with = "Option<Boot>")]
    pub boot: Option<Spanned<Boot>>,
    /// With `runtime: wasm`: the WASI preview 1 module or WebAssembly
    /// component to run, pinned by sha256 (`command`, when given, is the
    /// argv it sees).
    #[serde(default)]
    #[schemars(with = "Option<WasmModule>")]
    pub module: Option<Spanned<WasmModule>>,
    /// Resource limits; absent fields take the profile's defaults.
    #[serde(default)]
    #[schemars(with = "Option<Limits>")]
    pub limits: Option<Spanned<Limits>>,
    /// `none`: no network at all. Mutually exclusive with `egress`.
    #[serde(default)]
    #[schemars(with = "Option<NetworkNone>")]
    pub network: Option<Spanned<NetworkNone>>,
    /// `[host:port, ...]` (an explicit allowlist) or `proxy` (any public
    /// destination on ports 80 and 443 through the filtering proxy).
    #[serde(default)]
    #[schemars(with = "Option<Egress>")]
    pub egress: Option<Spanned<Egress>>,
    /// Pin names to addresses, skipping DNS (private services, tests).
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
    /// Private ranges the egress door may connect to (refused by default).
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Credentials minted per session by the credential broker.
    #[serde(default)]
    #[schemars(with = "Option<Vec<Secret>>")]
    pub secrets: Option<Spanned<Vec<Spanned<Secret>>>>,
    /// `[host:port, ...]` of the egress allowlist whose TLS the door never
    /// intercepts (pinned certificates, mutual TLS): tunnelled untouched,
    /// and no secret is ever substituted on them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub tls_passthrough: Vec<Spanned<String>>,
    /// Extra binds: `/host/path`, `/host/path:/sandbox/path` or
    /// `/host/path:/sandbox/path:ro` (`:rw` for read-write); read-only
    /// unless `rw` is written.
    #[serde(default)]
    #[schemars(with = "Vec<Mount>")]
    pub mounts: Vec<Spanned<Mount>>,
    /// The session's workspace, read-write at `mount` in every sandbox of
    /// this tool, shared with the session's other tools that declare one;
    /// its size is enforced; destroyed when the session ends (or `retain`
    /// later).
    #[serde(default)]
    #[schemars(with = "Option<Workspace>")]
    pub workspace: Option<Spanned<Workspace>>,
    /// A directory of this tool's that outlives sessions, read-write at
    /// `mount`: one per tenant, never shared between tenants, its size
    /// enforced; removed with `cordon state rm`.
    #[serde(default)]
    #[schemars(with = "Option<State>")]
    pub state: Option<Spanned<State>>,
    /// Mechanisms this tool requires on top of its profile's defaults and
    /// the manifest's `require`.
    #[serde(default)]
    pub require: Vec<Mechanism>,
    /// Degradations accepted for this tool: these mechanisms may be
    /// partial or missing on the host (the call then says so).
    #[serde(default)]
    pub accept: Vec<Mechanism>,
    /// The only environment variables passed in, besides PATH, HOME and LANG.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How long a sandbox lives: one call (default), one agent session, or a pool.
    #[serde(default)]
    pub lifetime: Option<Lifetime>,
    /// With `lifetime: pool`: how many never-used sandboxes are kept ready,
    /// and whether the pool refills after each task.
    #[serde(default)]
    pub pool: Option<PoolSettings>,
    /// How an MCP call's arguments reach the tool: one argument's bytes on
    /// stdin, others as argv slots (never passed through a shell).
    #[serde(default)]
    pub input: Option<Input>,
    /// JSON Schema of the tool's arguments (MCP exposure).
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    pub input_schema: Option<serde_json::Value>,
    /// JSON Schema the tool's output must satisfy (output gate).
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    pub output_schema: Option<serde_json::Value>,
    /// How the output gate treats this tool's results.
    #[serde(default)]
    pub output: Option<Output>,
    /// Seccomp mode. Absent: the default deny list. `allow: [...]`: default
    /// deny, with a base set plus these syscalls.
    #[serde(default)]
    pub seccomp: Option<Seccomp>,
    /// Calls of this tool running at once, all sessions together (an
    /// `mcp:` tool: calls to its server's tools); a call beyond it waits
    /// up to `queue_seconds`, then is refused as busy (absent: no bound).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub max_concurrent: Option<Spanned<u32>>,
    /// How long a call beyond `max_concurrent` waits for a slot (default 10).
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub queue_seconds: Option<Spanned<u64>>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum Profile {
    P0,
    P1,
    P2,
    P3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Native,
    Gvisor,
    Microvm,
    Wasm,
}

/// A WebAssembly module (`runtime: wasm`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WasmModule {
    /// The `.wasm` file: absolute, or relative to the manifest's directory.
    pub path: String,
    /// Its sha256, 64 hex digits: a module with other bytes is refused.
    pub sha256: String,
    /// Serve calls from a warm worker: one runner in one jail kept
    /// between calls, each call a fresh instance of the module (nothing of
    /// one call's memory or WASI state is kept for the next; the jail
    /// around them is shared). Default false: a jail per call.
    #[serde(default)]
    pub worker: bool,
    /// A component's exported function this tool calls: its parameters
    /// are the tool's arguments (their JSON Schema, from the function's
    /// types, is the tool's input schema), its result the tool's output,
    /// as JSON. Absent: the module or component is a command (`_start`,
    /// `wasi:cli/run`) with stdin and stdout.
    #[serde(default)]
    pub function: Option<String>,
}

/// The only value `network:` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkNone {
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Egress {
    /// The literal `proxy`.
    Proxy(EgressProxy),
    /// `host:port` entries.
    Allow(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressProxy {
    Proxy,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock seconds before the whole sandbox is killed.
    pub wall_seconds: Option<u64>,
    /// Memory cap, e.g. `512M`, `2G` (no swap).
    pub memory: Option<Size>,
    /// Maximum number of tasks (processes and threads).
    pub tasks: Option<u64>,
    /// CPU quota, `100%` = one core.
    pub cpu: Option<String>,
    /// Bytes of stdout accepted.
    pub output_bytes: Option<Size>,
    /// Bytes of stderr kept.
    pub stderr_bytes: Option<Size>,
    /// Open file descriptors.
    pub nofile: Option<u64>,
    /// Size of the writable `/tmp`, e.g. `64M`.
    pub disk: Option<Size>,
}

/// A byte size: an integer, or a string with a K/M/G/T suffix (powers of 1024).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// Variable name the tool receives it under.
    pub name: String,
    /// What the credential may do, e.g. `read:issues`.
    pub scope: String,
    /// Lifetime in seconds.
    pub ttl: u64,
    /// The provider that mints it, by its name in the broker's provider
    /// file (default: that file's `default`).
    #[serde(default)]
    pub provider: Option<String>,
    /// The audience the token is for (OAuth2 token exchange), when the
    /// provider asks for one.
    #[serde(default)]
    pub audience: Option<String>,
    /// How the tool gets it: `proxy` (the default; the sandbox sees a
    /// placeholder that the egress door replaces with the token only on
    /// requests to the bound endpoint) or `env` (the token itself in the
    /// variable: weaker, `cordon check` and `cordon diff` flag it).
    #[serde(default)]
    pub deliver: Option<Deliver>,
    /// Where the door puts the token (proxy delivery). Default: the tool's
    /// single egress entry, as `Authorization: Bearer {token}`.
    #[serde(default)]
    pub bind: Option<Bind>,
}

/// How a secret reaches the tool.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Deliver {
    /// A placeholder in the variable; the egress door substitutes the token.
    Proxy,
    /// The token itself in the variable.
    Env,
}

/// The one endpoint a proxy-delivered secret is used on, and where the
/// token goes in a request there. At most one of `header`, `basic` and
/// `query`; none: `Authorization: Bearer {token}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    /// `host:port`, one of the tool's egress entries (default: its only one).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Only requests whose path starts with this prefix, e.g. `/rest/`.
    #[serde(default)]
    pub path: Option<String>,
    /// A header line with `{token}` once, e.g. `Authorization: Bearer {token}`.
    #[serde(default)]
    pub header: Option<String>,
    /// HTTP Basic authentication with this user name, the token as password.
    #[serde(default)]
    pub basic: Option<String>,
    /// A query parameter carrying the token.
    #[serde(default)]
    pub query: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Mount {
    /// `/host/path` (same path inside), `/host/path:/sandbox/path`, or
    /// either followed by `:ro` or `:rw`.
    Short(String),
    Long(MountLong),
}

/// A mount in long form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountLong {
    /// Host path.
    pub src: String,
    /// Path inside the sandbox (default: the same as `src`).
    #[serde(default)]
    pub dst: Option<String>,
    /// `ro` (default) or `rw`.
    #[serde(default)]
    pub mode: Option<MountMode>,
}

/// How a host path is bound.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// Read-only (the default).
    Ro,
    /// Read-write: the tool can change the host's files.
    Rw,
}

/// A session workspace (`workspace:`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    /// Absolute path inside the sandbox, e.g. `/work`.
    pub mount: String,
    /// Its size, e.g. `512M`: a write beyond it fails with ENOSPC.
    pub size: Size,
    /// How long it is kept after its session ends, e.g. `10m`, `30s`, `1h`
    /// or a number of seconds (default: destroyed when the session ends).
    #[serde(default)]
    pub retain: Option<Duration>,
}

/// A tool's persistent state (`state:`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Absolute path inside the sandbox, e.g. `/data`.
    pub mount: String,
    /// Its size, e.g. `256M`: a write beyond it fails with ENOSPC.
    pub size: Size,
}

/// A duration: seconds, or a string with an s/m/h/d suffix.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Duration {
    Seconds(u64),
    Text(String),
}

/// A tool's warm pool (`lifetime: pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    /// Sandboxes kept ready (default 2).
    #[serde(default = "default_pool_size")]
    pub size: u32,
    /// Start a new one after each task (default true).
    #[serde(default = "default_true")]
    pub refill: bool,
}

fn default_pool_size() -> u32 {
    2
}

fn default_true() -> bool {
    true
}

impl Default for PoolSettings {
    fn default() -> PoolSettings {
        PoolSettings {
            size: default_pool_size(),
            refill: true,
        }
    }
}

/// The call a warm server gets before it is pooled (`mcp: {warm_up:}`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmUp {
    /// The server's own name of the tool.
    pub tool: String,
    /// Its arguments (an object).
    #[serde(default)]
    pub arguments: Option<serde_json::Value>,
}

/// How a microVM task's guest starts (`boot:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Boot {
    /// Restored from the image's template snapshot (made on first use).
    #[default]
    Snapshot,
    /// Booted from nothing; no snapshot made or kept.
    Cold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Lifetime {
    Call,
    Session,
    Pool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The server's command line.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The server's image, pinned by digest.
    #[serde(default)]
    pub image: Option<String>,
    /// How the server's tools and prompts are named to the agent:
    /// `prefixed` (default, `<tool>__<name>`) or `as-is` (the server's own
    /// names). Every exposed name must match `^[a-zA-Z0-9_-]{1,64}$` and
    /// belong to one server only.
    #[serde(default)]
    #[schemars(with = "Option<Expose>")]
    pub expose: Option<Spanned<Expose>>,
    /// Seconds the server has to start (initialize and list its tools)
    /// before it is stopped and reported as failed; default 20.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub startup_seconds: Option<Spanned<u64>>,
    /// The server may ask the agent's client to sample its model
    /// (`sampling/createMessage`), the request's text gated; default false.
    #[serde(default)]
    pub allow_sampling: Option<bool>,
    /// The server may ask the agent's user for input
    /// (`elicitation/create`), the request's text gated; default false.
    #[serde(default)]
    pub allow_elicitation: Option<bool>,
    /// Fold a tool result's embedded text resources into its one wrapped
    /// text block instead of keeping them as resource blocks (each gated
    /// and labelled); default false.
    #[serde(default)]
    pub fold_resources: Option<bool>,
    /// `lifetime: session` only: how many sandboxes whose server has
    /// already answered `initialize` and `tools/list` are kept ready, each
    /// handed to one session and never reused; default 0 (each session's
    /// server starts when first needed).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub warm: Option<Spanned<u32>>,
    /// With `warm`: a call the server gets before it is pooled (e.g. a
    /// browser server's `browser_navigate` to `about:blank`, so that the
    /// browser has launched); its result is discarded, and a server whose
    /// warm-up fails is never pooled.
    #[serde(default)]
    #[schemars(with = "Option<WarmUp>")]
    pub warm_up: Option<Spanned<WarmUp>>,
    /// Which of the server's tools are exposed.
    #[serde(default)]
    pub tools: Option<McpTools>,
    /// Only these resources are exposed: URIs and URI templates exactly as
    /// the server lists them (absent: all; `[]`: none).
    #[serde(default)]
    pub resources: Option<Vec<String>>,
    /// Only these prompts are exposed, by the server's names (absent: all;
    /// `[]`: none).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub prompts: Option<Vec<Spanned<String>>>,
}

/// What goes between an `mcp:` tool's name and a server's name in the
/// prefixed form (`scratch__read_text_file`): inside the set of characters
/// model APIs accept in a tool name.
pub const NAME_SEPARATOR: &str = "__";

/// How an `mcp:` server's tools and prompts are named to the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Expose {
    /// `<tool>__<server name>`: the manifest tool's name, two underscores,
    /// the server's name.
    #[default]
    #[serde(rename = "prefixed")]
    Prefixed,
    /// The server's own names, as a local MCP client would see them.
    #[serde(rename = "as-is")]
    AsIs,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpTools {
    /// Only these tools are exposed, by the server's names (absent: all).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub allow: Option<Vec<Spanned<String>>>,
    /// The full exposed name of a server tool, `{server_name: exposed_name}`
    /// (no prefix is added, whatever `expose` says).
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub rename: BTreeMap<String, Spanned<String>>,
    /// Pinned descriptions: a server whose description differs is refused.
    #[serde(default)]
    pub descriptions: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    Text,
    Json,
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    Fail,
    Truncate,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// text (default), json or binary.
    pub kind: Option<OutputKind>,
    /// For binary output: the media type, e.g. `image/png`.
    pub media_type: Option<String>,
    /// What happens past `output_bytes`: fail (default) or truncate.
    pub on_overflow: Option<Overflow>,
    /// Remove HTML markup from text output.
    pub strip_html: Option<bool>,
    /// Remove markdown markup from text output.
    pub strip_markdown: Option<bool>,
    /// Character classes the gate removes; every class is on unless turned
    /// off here (turning one off is a weakening `cordon diff` flags).
    pub strip: Option<StripClasses>,
    /// How results are labelled untrusted: wrapped (default), envelope, or
    /// none (the envelope then carries a warning).
    pub label: Option<Label>,
    /// Bytes that are not UTF-8: replace (default, with U+FFFD) or reject.
    pub invalid_utf8: Option<InvalidUtf8>,
    /// Replace well-known secret formats in results and error messages (PEM
    /// private keys, AWS access key ids, GitHub and Slack tokens, JWTs) by
    /// `[REDACTED:RULE]` (default false). The live tokens minted for the
    /// tool's session are replaced by their placeholder whatever this says.
    pub block_secrets: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StripClasses {
    /// C0 and C1 control characters except newline and tab.
    pub control: Option<bool>,
    /// ANSI/VT escape sequences.
    pub ansi: Option<bool>,
    /// Unicode bidi overrides, embeddings and isolates.
    pub bidi: Option<bool>,
    /// Zero-width and other invisible format characters.
    pub zero_width: Option<bool>,
    /// The Unicode tag block (U+E0000..U+E007F).
    pub tags: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    Wrapped,
    Envelope,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InvalidUtf8 {
    Replace,
    Reject,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Seccomp {
    /// Default-deny allowlist: the base set plus these syscall names.
    pub allow: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The argument is a string whose UTF-8 bytes go on stdin.
    Text,
    /// The argument is base64; the decoded bytes go on stdin.
    Base64,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The argument whose value goes on the tool's stdin.
    pub stdin: Option<String>,
    /// How that argument is encoded (default text).
    pub encoding: Option<Encoding>,
    /// Arguments appended to the command, one argv slot each, in this order.
    #[serde(default)]
    pub argv: Vec<String>,
}
