//! The resolved policy: one plain value per tool with every effective
//! setting after defaults. Runtimes consume this and nothing else; it can be
//! printed (`cordon explain`), diffed (`cordon diff`) and tested without
//! running anything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::manifest::{
    Encoding, InvalidUtf8, Label, Lifetime, Mechanism, MountMode, OutputKind, Overflow,
    PoolSettings, Profile, Runtime,
};

/// All tools of a manifest, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySet {
    pub tools: BTreeMap<String, ToolPolicy>,
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
    pub mounts: Vec<Mount>,
    /// The complete environment the tool sees (PATH, HOME, LANG and the manifest's `env`).
    pub env: BTreeMap<String, String>,
    pub lifetime: Lifetime,
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
        allow: Option<Vec<String>>,
        rename: BTreeMap<String, String>,
        descriptions: BTreeMap<String, String>,
        /// Resource URIs and URI templates exposed (`None`: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resources: Option<Vec<String>>,
        /// Prompts exposed, by the server's names (`None`: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompts: Option<Vec<String>>,
    },
    /// The manifest names no program yet (allowed, e.g. a P3 runtime still
    /// to be given an image); such a tool is refused at run time.
    Unspecified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub wall_seconds: u64,
    pub memory_bytes: u64,
    pub tasks: u64,
    /// Percent of one core: 100 = one core.
    pub cpu_percent: u32,
    pub output_bytes: u64,
    pub stderr_bytes: u64,
    pub nofile: u64,
    pub disk_bytes: u64,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    pub name: String,
    pub scope: String,
    pub ttl_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub src: String,
    pub dst: String,
    /// Read-write (`:rw`); read-only otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable: bool,
}

/// How MCP arguments reach a command tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    /// The argument whose value goes on stdin (none: empty stdin).
    pub stdin: Option<String>,
    pub encoding: Encoding,
    /// Arguments appended to argv, one slot each.
    pub argv: Vec<String>,
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Seccomp {
    /// The default deny list.
    DenyList,
    /// Default deny: the base set plus these syscalls.
    AllowList { extra: Vec<String> },
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
