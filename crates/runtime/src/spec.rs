//! The neutral sandbox specification: what every runtime is asked to
//! build, lowered once from a resolved policy ([`lower`]). It names no
//! mechanism of any one runtime.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use cordon_egress::EgressPolicy;
pub use cordon_policy::policy::Boot;
use cordon_policy::policy::{Exec, Network as PolicyNetwork, Profile};
use cordon_policy::{ToolPolicy, policy};
pub use cordon_sandbox::{Limits, Mount, Root, Seccomp};
use serde::Serialize;

use crate::images::ResolvedImage;

/// One sandbox: root, program, mounts, limits, network.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SandboxSpec {
    /// The tool's name, for messages and audit records.
    pub tool: String,
    /// The profile the policy claims.
    pub profile: Profile,
    /// What the sandbox's `/` is made of.
    pub root: Root,
    /// `argv[0]`: an absolute path inside the sandbox, or a name looked up
    /// in the `PATH` of `env`.
    pub argv: Vec<String>,
    /// The complete environment (the network doors may add to it).
    pub env: Vec<(String, String)>,
    /// Binds of host paths.
    pub mounts: Vec<Mount>,
    /// Resource limits of the whole sandbox.
    pub limits: Limits,
    /// Network.
    pub network: Network,
    /// System-call filter.
    pub seccomp: Seccomp,
    /// Landlock (or the runtime's file-access layer) as a second layer.
    pub landlock: bool,
    /// The working directory, an absolute path inside the sandbox (an
    /// image's `WorkingDir`); `None`: the runtime's default (`/tmp` for
    /// the native runtime).
    pub cwd: Option<String>,
    /// The session workspace the tool declares (its directory is made
    /// per call or server start: [`crate::Placement::volumes`]).
    pub workspace: Option<policy::Workspace>,
    /// The per-tenant state the tool declares.
    pub state: Option<policy::State>,
    /// uid and gid inside the sandbox (an image's `User`); `None`: the
    /// runtime's default (1000 for the native runtime). Whatever they are,
    /// the tool has an unprivileged identity on the host and no
    /// capabilities: uid 0 is root of the sandbox's own namespace only.
    pub user: Option<(u32, u32)>,
    /// The WASI module a `runtime: wasm` tool runs (`argv` is what it
    /// sees); `None` for every other runtime.
    pub wasm: Option<WasmModule>,
    /// How a microVM's guest starts: restored from its image's template
    /// snapshot, or booted cold (every other runtime ignores it).
    pub boot: Boot,
}

/// A WASI preview 1 module or a component pinned by sha256 (`runtime: wasm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WasmModule {
    /// The `.wasm` file on the host.
    pub path: std::path::PathBuf,
    /// Its pinned sha256 (lowercase hex).
    pub sha256: String,
    /// Calls served by a warm worker ([`crate::wasm_worker`]).
    pub worker: bool,
    /// A component's typed function to call (arguments as JSON on
    /// stdin, the result as JSON on stdout); `None`: a command.
    pub function: Option<String>,
}

/// The longest message a spawned sandbox may write when its results are
/// capped at `output_bytes`: room for a result within the cap after JSON
/// escaping (at most six bytes per byte) and framing. A longer message
/// could never carry a result the gate would pass: the sandbox is killed.
pub fn message_cap(output_bytes: u64) -> u64 {
    output_bytes.saturating_mul(6).saturating_add(64 << 10)
}

/// The sandbox's network.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No route anywhere.
    None,
    /// Only the broker's doors, serving this egress policy.
    Doors(#[serde(skip)] Box<EgressPolicy>),
}

/// What the sandbox is for: one call, or a long-lived server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// One call: input in, output out (`cordon run`, a command tool over MCP).
    Call,
    /// A long-lived server speaking on its stdio (an `mcp:` tool).
    Serve,
}

impl Use {
    /// How a tool is used: an `mcp:` server for a session, anything else
    /// (a command, an image) once per call.
    pub fn of(p: &ToolPolicy) -> Use {
        match p.exec {
            Exec::Mcp { .. } => Use::Serve,
            _ => Use::Call,
        }
    }
}

/// Lower a resolved policy into the neutral specification, or say why it
/// cannot be (nothing to run, P0, the wrong use of an MCP server, secrets
/// that no credential broker here can mint). Which runtime builds it, and
/// whether it can here, is decided by admission.
pub fn lower(
    p: &ToolPolicy,
    use_: Use,
    images: Option<&dyn crate::images::Images>,
    credentials: Option<&dyn crate::Minting>,
    upstream_dns: &UpstreamDns,
) -> Result<SandboxSpec, String> {
    if p.profile == Profile::P0 {
        return Err(format!(
            "{}: profile P0 has no sandbox; cordon runs only sandboxed tools",
            p.name
        ));
    }
    let image_ref = image_reference(p, use_)?;
    let image = resolve_image(p, image_ref.as_deref(), images)?;
    let argv = program(p, use_, image_ref.as_deref(), image.as_ref())?;
    crate::admit_secrets(p, credentials)?;
    let l = p.require_limits()?;
    let network = network_of(p, upstream_dns)?;
    let Rooted {
        root,
        env,
        cwd,
        user,
    } = root_of(p, image)?;
    Ok(SandboxSpec {
        tool: p.name.clone(),
        profile: p.profile,
        root,
        argv,
        env,
        mounts: p
            .mounts
            .iter()
            .map(|m| Mount {
                src: m.src.clone().into(),
                dst: m.dst.clone().into(),
                writable: m.writable,
            })
            .collect(),
        limits: l,
        network,
        seccomp: p.seccomp.clone(),
        landlock: true,
        cwd,
        workspace: p.workspace.clone(),
        state: p.state.clone(),
        user,
        wasm: match &p.exec {
            Exec::Wasm {
                module,
                sha256,
                worker,
                function,
                ..
            } => Some(WasmModule {
                path: module.into(),
                sha256: sha256.clone(),
                worker: *worker,
                function: function.clone(),
            }),
            _ => None,
        },
        boot: p.boot.unwrap_or_default(),
    })
}

/// The image the tool runs from, if any (`reference@digest` for an image tool, the server's
/// image for an `mcp:` one); an image tool used as a server is refused.
fn image_reference(p: &ToolPolicy, use_: Use) -> Result<Option<String>, String> {
    // An image: its rootfs is the root; its config gives the program,
    // environment, working directory and user unless the manifest says.
    Ok(match (&p.exec, use_) {
        (
            Exec::Image {
                reference, digest, ..
            },
            Use::Call,
        ) => Some(format!("{reference}@{digest}")),
        (Exec::Image { .. }, Use::Serve) => {
            return Err(format!(
                "{}: an image tool runs once per call, not as a server (use `mcp: {{image: ...}}`)",
                p.name
            ));
        }
        (
            Exec::Mcp {
                image: Some(reference),
                ..
            },
            Use::Serve,
        ) => Some(reference.clone()),
        _ => None,
    })
}

/// The image `image_ref` names, resolved in the image store.
fn resolve_image(
    p: &ToolPolicy,
    image_ref: Option<&str>,
    images: Option<&dyn crate::images::Images>,
) -> Result<Option<ResolvedImage>, String> {
    let Some(r) = image_ref else {
        return Ok(None);
    };
    let Some(images) = images else {
        return Err(format!(
            "{}: image {r} needs the image store, which this broker was not given",
            p.name
        ));
    };
    Ok(Some(
        images
            .resolve(r)
            .map_err(|e| format!("{}: image {r}: {e}", p.name))?,
    ))
}

/// The program to run (`argv`): the manifest's command, or the image's entrypoint and
/// command; refused when the exec does not fit the use or names no program.
fn program(
    p: &ToolPolicy,
    use_: Use,
    image_ref: Option<&str>,
    image: Option<&ResolvedImage>,
) -> Result<Vec<String>, String> {
    let argv = match (&p.exec, use_) {
        (Exec::Command { argv }, Use::Call) | (Exec::Wasm { argv, .. }, Use::Call) => argv.clone(),
        (Exec::Wasm { .. }, Use::Serve) => {
            return Err(format!(
                "{}: a wasm tool runs once per call, not as a server",
                p.name
            ));
        }
        (Exec::Command { .. }, Use::Serve) => {
            return Err(format!(
                "{}: a command tool runs once per call, not as a server",
                p.name
            ));
        }
        (
            Exec::Mcp {
                command: Some(argv),
                ..
            },
            Use::Serve,
        ) => argv.clone(),
        (
            Exec::Image {
                command: Some(argv),
                ..
            },
            Use::Call,
        ) => argv.clone(),
        (Exec::Image { .. }, Use::Call) | (Exec::Mcp { image: Some(_), .. }, Use::Serve) => {
            let img = image.ok_or_else(|| format!("{}: no image", p.name))?;
            img.entrypoint.iter().chain(&img.cmd).cloned().collect()
        }
        (Exec::Mcp { .. }, Use::Call) => {
            return Err(format!(
                "{}: an MCP server tool is called through `cordon serve`, not `cordon run`",
                p.name
            ));
        }
        (Exec::Mcp { .. }, Use::Serve)
        | (Exec::Unspecified, _)
        | (Exec::Image { .. }, Use::Serve) => {
            return Err(format!(
                "{}: the manifest gives nothing to run (no `command`, `image` or `mcp`)",
                p.name
            ));
        }
    };
    if argv.is_empty() || argv[0].is_empty() {
        return Err(match image_ref {
            Some(r) => format!(
                "{}: image {r} names no program (no Entrypoint or Cmd); give `command`",
                p.name
            ),
            None => format!("{}: the command is empty", p.name),
        });
    }
    Ok(argv)
}

/// The sandbox's network: none, or the doors serving the tool's egress policy with its TLS
/// passthrough destinations.
fn network_of(p: &ToolPolicy, upstream_dns: &UpstreamDns) -> Result<Network, String> {
    Ok(
        match egress_policy_for(&p.name, &p.network, upstream_dns)? {
            None => Network::None,
            Some(mut ep) => {
                for e in &p.tls_passthrough {
                    ep.passthrough.push(
                        cordon_egress::HostPort::parse(e)
                            .map_err(|err| format!("{}: tls_passthrough {e}: {err}", p.name))?,
                    );
                }
                Network::Doors(Box::new(ep))
            }
        },
    )
}

/// A sandbox's root with the environment, working directory and user that go with it.
struct Rooted {
    root: Root,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    user: Option<(u32, u32)>,
}

/// What the sandbox's root is made of, with what goes with it: the host's binds and the
/// policy's environment, or the image's.
fn root_of(p: &ToolPolicy, image: Option<ResolvedImage>) -> Result<Rooted, String> {
    Ok(match image {
        None => Rooted {
            root: Root::HostBinds,
            env: p.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            cwd: None,
            user: None,
        },
        Some(img) => {
            let user = crate::images::image_user(&img.rootfs, img.user.as_deref())
                .map_err(|e| format!("{}: {e}", p.name))?;
            Rooted {
                root: Root::Image {
                    rootfs: img.rootfs.clone(),
                    digest: img.digest.clone(),
                },
                env: image_env(&img.env, &p.env),
                cwd: img.working_dir.clone().filter(|d| !d.is_empty()),
                user: Some(user),
            }
        }
    })
}

/// An image tool's environment: the image's `Env`, then the policy's,
/// except cordon's default `PATH`, which yields to the image's own (the
/// image knows where its programs are); a `PATH` the manifest sets wins.
fn image_env(image: &[String], policy: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = image
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let image_has_path = env.iter().any(|(k, _)| k == "PATH");
    for (k, v) in policy {
        if k == "PATH" && v == cordon_policy::resolve::SANDBOX_PATH && image_has_path {
            continue;
        }
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// The DNS server the egress doors forward names to: the host's resolver,
/// or the one `CORDON_UPSTREAM_DNS` names. The variable is read by whoever
/// builds the registry (the CLI) and given to lowering, never read here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UpstreamDns {
    /// The host's resolver.
    #[default]
    Host,
    /// This server.
    At(SocketAddr),
    /// A value that is not an `address:port`: every tool with egress is
    /// refused, naming it.
    Invalid(String),
}

impl UpstreamDns {
    /// The variable that sets it.
    pub const VAR: &'static str = "CORDON_UPSTREAM_DNS";

    /// From the value of [`UpstreamDns::VAR`] (`None`: unset).
    pub fn from_var(value: Option<String>) -> UpstreamDns {
        match value {
            None => UpstreamDns::Host,
            Some(v) => match v.parse() {
                Ok(a) => UpstreamDns::At(a),
                Err(_) => UpstreamDns::Invalid(v),
            },
        }
    }

    /// The server, `None` for the host's, or why the setting is refused.
    pub fn server(&self) -> Result<Option<SocketAddr>, String> {
        match self {
            UpstreamDns::Host => Ok(None),
            UpstreamDns::At(a) => Ok(Some(*a)),
            UpstreamDns::Invalid(v) => Err(format!("{}={v}: not an address:port", Self::VAR)),
        }
    }
}

/// The egress policy of a network setting (`None`: no network), refusals
/// naming `name`, its doors' names resolved through `upstream_dns`.
pub fn egress_policy_for(
    name: &str,
    network: &PolicyNetwork,
    upstream_dns: &UpstreamDns,
) -> Result<Option<EgressPolicy>, String> {
    let (mut ep, resolve, cidrs): (EgressPolicy, &BTreeMap<String, String>, &Vec<String>) =
        match network {
            PolicyNetwork::None => return Ok(None),
            PolicyNetwork::Host => {
                return Err(format!("{name}: host network is never given to a sandbox"));
            }
            PolicyNetwork::Allowlist {
                allow,
                resolve,
                allow_cidrs,
            } => (
                EgressPolicy::allowlist(name, allow).map_err(|e| format!("{name}: {e}"))?,
                resolve,
                allow_cidrs,
            ),
            PolicyNetwork::Proxy {
                resolve,
                allow_cidrs,
            } => (EgressPolicy::public_web(name), resolve, allow_cidrs),
        };
    for (host, ip) in resolve {
        let ip = ip
            .parse()
            .map_err(|_| format!("{name}: resolve {host}: `{ip}` is not an IP address"))?;
        ep.resolve.insert(host.to_ascii_lowercase(), ip);
    }
    for c in cidrs {
        ep.allow_cidrs.push(
            c.parse::<ipnet::IpNet>()
                .map_err(|_| format!("{name}: allow_cidrs: `{c}` is not a CIDR"))?,
        );
    }
    if let Some(ns) = upstream_dns.server()? {
        ep.upstream_dns = Some(ns);
    }
    ep.validate().map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(ep))
}

impl SandboxSpec {
    /// A spec with the P1 defaults running `argv` (tests, `cordon exec`,
    /// probes of a bare profile).
    pub fn new<I, S>(tool: &str, argv: I) -> SandboxSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SandboxSpec {
            tool: tool.to_string(),
            profile: Profile::P1,
            root: Root::HostBinds,
            argv: argv.into_iter().map(Into::into).collect(),
            env: vec![
                ("PATH".into(), cordon_policy::resolve::SANDBOX_PATH.into()),
                ("HOME".into(), "/tmp".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            mounts: Vec::new(),
            limits: Limits::P1,
            network: Network::None,
            seccomp: Seccomp::DenyList,
            landlock: true,
            cwd: None,
            workspace: None,
            state: None,
            user: None,
            wasm: None,
            boot: Boot::Snapshot,
        }
    }

    /// Why the spec cannot run as it is: a declared workspace or state
    /// whose directory was not prepared for it (it never runs without).
    pub fn unprepared_volumes(&self, volumes: &[crate::volume::Volume]) -> Option<String> {
        let declared = self
            .workspace
            .as_ref()
            .map(|w| ("workspace", &w.mount))
            .into_iter()
            .chain(self.state.as_ref().map(|s| ("state", &s.mount)));
        for (what, mount) in declared {
            if !volumes.iter().any(|v| v.dst == Path::new(mount)) {
                return Some(format!(
                    "{}: its {what} at {mount} was not prepared for this sandbox",
                    self.tool
                ));
            }
        }
        None
    }

    /// The egress policy, when the sandbox has doors.
    pub fn egress(&self) -> Option<&EgressPolicy> {
        match &self.network {
            Network::None => None,
            Network::Doors(ep) => Some(ep),
        }
    }
}
