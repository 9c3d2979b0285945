//! One client server -> one proposed manifest entry, or a refusal naming
//! the server and the field that cannot be mapped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cordon_store::{Ecosystem, PackageRef, Store};

use super::emit::{Entry, MountEntry, Network, SecretEntry};
use super::formats::{ClientServer, Transport};
use super::known::{self, Known, Net, Paths};

/// Why a server is not imported: its name, where it is, which field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub server: String,
    pub file: PathBuf,
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: server `{}`: `{}`: {}",
            self.file.display(),
            self.server,
            self.field,
            self.why
        )
    }
}

/// What cannot be inferred is asked here (a terminal), or defaulted.
pub trait Ask {
    /// The answer to `question`, `default` when none is given.
    fn ask(&mut self, question: &str, default: &str) -> String;
}

/// Every default taken (`--yes`, or not on a terminal).
pub struct Defaults;

impl Ask for Defaults {
    fn ask(&mut self, _question: &str, default: &str) -> String {
        default.to_string()
    }
}

/// How a server is mapped.
pub struct Ctx<'a> {
    /// The package store, with npm's source.
    pub store: &'a Store,
    /// The same store, with PyPI's source.
    pub pypi_store: &'a Store,
    /// The process environment (for `${VAR}` expansions).
    pub env: &'a BTreeMap<String, String>,
    pub ask: &'a mut dyn Ask,
    /// The package resolutions of earlier imports, reused unless `refresh`.
    pub resolutions: &'a mut super::resolutions::Resolutions,
    pub refresh: bool,
}

/// A manifest tool name for a server name: letters, digits, `_` and `-`
/// (the rest become `_`), at most 32 characters so that prefixed names
/// (`<tool>__<server tool>`) stay within MCP's 64.
pub fn tool_name(server: &str) -> String {
    let mut s: String = server
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    if s.is_empty() {
        s.push_str("server");
    }
    s
}

/// Environment names that hold credentials.
pub fn credential_name(name: &str) -> bool {
    let u = name.to_ascii_uppercase();
    const ANYWHERE: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "COOKIE",
    ];
    // Whole words only: not `PATH`, `KEYBOARD`, `GIT_AUTHOR_NAME`.
    const WORDS: &[&str] = &["KEY", "PAT", "AUTH", "OAUTH", "AUTHORIZATION", "PASS"];
    ANYWHERE.iter().any(|w| u.contains(w))
        || u.split('_').any(|part| {
            WORDS.contains(&part)
                || (part.ends_with("KEY") && part != "KEY" && !part.starts_with("KEYB"))
        })
}

/// Values shaped like tokens: well-known prefixes, or a long run of
/// letters and digits with no spaces.
pub fn credential_value(v: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "ghp_",
        "gho_",
        "ghs_",
        "ghu_",
        "github_pat_",
        "glpat-",
        "xoxb-",
        "xoxp-",
        "xoxa-",
        "sk-",
        "sk_live_",
        "sk_test_",
        "rk_live_",
        "AKIA",
        "ASIA",
        "AIza",
        "ya29.",
        "Bearer ",
        "eyJ",
    ];
    if PREFIXES.iter().any(|p| v.starts_with(p)) {
        return true;
    }
    let long = v.len() >= 24 && !v.contains(char::is_whitespace) && !v.contains('/');
    let digits = v.chars().filter(char::is_ascii_digit).count();
    let letters = v.chars().filter(char::is_ascii_alphabetic).count();
    long && digits >= 4 && letters >= 8 && !v.contains("://")
}

fn refuse(s: &ClientServer, field: impl Into<String>, why: impl Into<String>) -> Refusal {
    Refusal {
        server: s.name.clone(),
        file: s.file.clone(),
        field: field.into(),
        why: why.into(),
    }
}

/// Windows paths: a drive letter or backslashes.
fn windows_path(v: &str) -> bool {
    let b = v.as_bytes();
    (b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && (b[2] == b'\\' || b[2] == b'/'))
        || v.contains('\\')
}

/// The directory relative paths are taken from: the project directory of
/// a project file (`.vscode/mcp.json` -> the project), a project of
/// `~/.claude.json`, else the file's own directory.
fn base_dir(s: &ClientServer) -> PathBuf {
    if let Some(rest) = s.at.strip_prefix("projects.")
        && let Some(dir) = rest.strip_suffix(&format!(".mcpServers.{}", s.name))
        && dir.starts_with('/')
    {
        return PathBuf::from(dir);
    }
    let dir = s.file.parent().map(Path::to_path_buf).unwrap_or_default();
    let inner = dir.file_name().and_then(|f| f.to_str()).unwrap_or("");
    if matches!(
        inner,
        ".vscode" | ".cursor" | ".gemini" | ".continue" | ".zed"
    ) {
        return dir.parent().map(Path::to_path_buf).unwrap_or(dir);
    }
    dir
}

/// Expand the `${...}` forms clients support: `${VAR}`, `${VAR:-default}`,
/// `${env:VAR}`, `${workspaceFolder}`, `${userHome}`, and a leading `~/`.
/// `${input:x}` is left to the caller (`Err(Some(id))`); anything else
/// unresolvable is `Err(None)` with the name in `missing`.
fn expand(
    v: &str,
    base: &Path,
    env: &BTreeMap<String, String>,
    missing: &mut String,
) -> Result<String, Option<String>> {
    let home = env.get("HOME").cloned();
    let mut out = String::new();
    let mut rest = v;
    if let Some(r) = rest.strip_prefix("~/") {
        match &home {
            Some(h) => {
                out.push_str(h);
                out.push('/');
                rest = r;
            }
            None => {
                *missing = "HOME".into();
                return Err(None);
            }
        }
    }
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(j) = after.find('}') else {
            *missing = after.to_string();
            return Err(None);
        };
        let inner = &after[..j];
        rest = &after[j + 1..];
        if let Some(id) = inner.strip_prefix("input:") {
            return Err(Some(id.to_string()));
        }
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        let name = name.strip_prefix("env:").unwrap_or(name);
        let val = match name {
            "workspaceFolder" | "workspaceRoot" | "CLAUDE_PROJECT_DIR" => {
                Some(base.display().to_string())
            }
            "userHome" => home.clone(),
            _ => env.get(name).cloned(),
        };
        match val.or(default.map(str::to_string)) {
            Some(x) => out.push_str(&x),
            None => {
                *missing = name.to_string();
                return Err(None);
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The system directories every sandbox already has read-only.
fn in_system_dir(p: &str) -> bool {
    [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ]
    .iter()
    .any(|d| p == *d || p.starts_with(&format!("{d}/")))
}

/// Paths inside a sandbox that cordon builds itself (a mount there is refused).
fn in_reserved_dir(p: &str) -> Option<&'static str> {
    ["/tmp", "/proc", "/dev", "/sys", "/etc"]
        .into_iter()
        .find(|d| p == *d || p.starts_with(&format!("{d}/")))
}

/// The host path a script needs mounted: its package tree when it lies in
/// a `node_modules` (so that its dependencies resolve), else its directory.
fn script_root(p: &Path) -> PathBuf {
    let s = p.display().to_string();
    if let Some(i) = s.find("/node_modules/") {
        return PathBuf::from(&s[..i + "/node_modules".len()]);
    }
    if let Some(i) = s.find("/site-packages/") {
        return PathBuf::from(&s[..i + "/site-packages".len()]);
    }
    p.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| p.to_path_buf())
}

/// Host:port of a URL (`scheme://[user@]host[:port]/...`).
fn url_host(u: &str) -> Option<(String, u16)> {
    let (scheme, rest) = u.split_once("://")?;
    let auth = rest.split(['/', '?', '#']).next()?;
    let auth = auth.rsplit_once('@').map(|(_, h)| h).unwrap_or(auth);
    let default = match scheme {
        "http" | "ws" => 80,
        "https" | "wss" => 443,
        "postgres" | "postgresql" => 5432,
        "mysql" => 3306,
        "redis" => 6379,
        "mongodb" => 27017,
        _ => return None,
    };
    let (host, port) = match auth.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || auth.starts_with('[') => {
            (h.to_string(), p.parse().ok()?)
        }
        _ => (auth.to_string(), default),
    };
    if host.is_empty() {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

fn local_host(h: &str) -> bool {
    h == "localhost"
        || h.ends_with(".localhost")
        || h.parse::<std::net::IpAddr>().is_ok()
        || h.starts_with('[')
}

/// A package launcher (`npx`, `uvx`) and what it would fetch at every start.
struct Launch {
    pkg: PackageRef,
    /// The arguments after the package (the server's own).
    rest: Vec<String>,
}

fn launcher(s: &ClientServer, cmd: &str, args: &[String]) -> Result<Option<Launch>, Refusal> {
    let base = Path::new(cmd)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(cmd);
    let eco = match base {
        "npx" | "bunx" | "pnpx" => Ecosystem::Npm,
        "uvx" => Ecosystem::Pypi,
        _ => return Ok(None),
    };
    let mut i = 0;
    let mut from: Option<String> = None;
    while i < args.len() && args[i].starts_with('-') {
        let a = args[i].as_str();
        match (eco, a) {
            (_, "-y" | "--yes" | "-q" | "--quiet" | "--silent") => {}
            (Ecosystem::Pypi, "--from") => {
                i += 1;
                from = args.get(i).cloned();
            }
            _ => {
                return Err(refuse(
                    s,
                    format!("args[{i}]"),
                    format!(
                        "`{base} {a}`: cordon installs the package itself and does not know this option; write the package and its arguments alone"
                    ),
                ));
            }
        }
        i += 1;
    }
    let Some(first) = args.get(i) else {
        return Err(refuse(s, "args", format!("`{base}` without a package")));
    };
    let spec = from.unwrap_or_else(|| first.clone());
    // uvx --from PKG CMD: the command is PKG's console script.
    let rest = args[i + 1..].to_vec();
    let (name, version) = match eco {
        Ecosystem::Npm => match spec.rfind('@') {
            Some(j) if j > 0 => (spec[..j].to_string(), Some(spec[j + 1..].to_string())),
            _ => (spec.clone(), None),
        },
        Ecosystem::Pypi => match spec.split_once("==").or_else(|| spec.split_once('@')) {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (spec.clone(), None),
        },
    };
    let version = version.filter(|v| !v.is_empty() && v != "latest");
    Ok(Some(Launch {
        pkg: PackageRef {
            ecosystem: eco,
            name,
            version,
        },
        rest,
    }))
}

/// The proposed entry for one local server.
pub fn map(s: &ClientServer, cx: &mut Ctx<'_>) -> Result<Entry, Refusal> {
    let Stdio {
        command,
        args,
        cwd,
        env,
    } = stdio(s)?;
    let name = tool_name(&s.name);
    let mut base = base_dir(s);
    let mut got = Gathered {
        notes: vec![format!(
            "From {} ({}), `{}`.",
            s.file.display(),
            s.format.name(),
            s.at
        )],
        ..Gathered::default()
    };
    let prog = refuse_shells(s, command, args, cwd)?;

    // Expansions.
    if let Some(c) = cwd {
        let c = expand_field(s, cx.env, "cwd", c, &base)?;
        let c = if c.starts_with('/') {
            PathBuf::from(c)
        } else {
            base.join(c)
        };
        got.notes.push(format!(
            "The client starts it in {}; the manifest has no working directory, so relative paths in its arguments were made absolute from there.",
            c.display()
        ));
        base = c;
    }
    let command = expand_field(s, cx.env, "command", command, &base)?;
    let mut args: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| expand_field(s, cx.env, &format!("args[{i}]"), a, &base))
        .collect::<Result<_, _>>()?;

    let known =
        known::lookup(std::iter::once(command.as_str()).chain(args.iter().map(String::as_str)));
    let (mut argv, interpreter) = match launcher(s, &command, &args)? {
        Some(l) => {
            let (argv, interpreter) = installed(s, cx, &command, &args, &l, &mut got)?;
            args = l.rest;
            (argv, interpreter)
        }
        None => host_program(s, cx, &command, &base, prog, &mut got)?,
    };

    // Paths and URLs in the arguments.
    arg_paths(s, &mut args, &base, known, interpreter, &mut got)?;
    argv.extend(args);

    // The environment: credentials become secrets.
    let secrets = env_entries(s, cx, env, &base, known, &name, &mut got)?;
    // What the server needs in a sandbox that its configuration does not set.
    for (k, v, why) in known.map_or(&[][..], |k| k.env) {
        if !env.contains_key(*k) {
            got.env
                .push(((*k).to_string(), (*v).to_string(), Some((*why).to_string())));
        }
    }
    if !got.skipped_hosts.is_empty() {
        got.notes.push(format!(
            "Not allowed: {}: a sandbox has its own loopback and the egress door refuses private addresses; add `allow_cidrs` and `resolve` by hand if the server must reach one.",
            got.skipped_hosts.join(", ")
        ));
    }

    // Profile and network.
    let mut entry = Entry {
        name,
        notes: got.notes,
        command: argv,
        command_note: got.command_note,
        mounts: dedup(got.mounts),
        env: got.env,
        ..Entry::default()
    };
    profile_and_network(&mut entry, known, got.hosts);
    entry.secrets = deliveries(secrets, &entry.network);
    entry.limits = known::memory(known, interpreter)
        .map(|(m, why)| (vec![("memory".to_string(), m.to_string())], why));
    entry.startup = known.map(|k| k.startup);
    Ok(entry)
}

/// What mapping a server gathers on the way.
#[derive(Default)]
struct Gathered {
    notes: Vec<String>,
    mounts: Vec<MountEntry>,
    /// The manifest's `env`, each with why when it is not the server's own.
    env: Vec<(String, String, Option<String>)>,
    /// Hosts to allow, each with where it was named.
    hosts: Vec<(String, String)>,
    /// Local hosts named, not allowed.
    skipped_hosts: Vec<String>,
    /// What the program was resolved from (a version manager's shim).
    command_note: Option<String>,
}

/// A server's environment, as its client gives it.
type EnvMap = BTreeMap<String, String>;

/// A stdio server as its client starts it.
struct Stdio<'a> {
    command: &'a String,
    args: &'a [String],
    cwd: Option<&'a String>,
    env: &'a EnvMap,
}

/// A stdio server's command, arguments, working directory and environment;
/// a remote server, one without a command, or an `envFile` is refused.
fn stdio(s: &ClientServer) -> Result<Stdio<'_>, Refusal> {
    let (command, args, cwd, env, env_file) = match &s.transport {
        Transport::Stdio {
            command,
            args,
            cwd,
            env,
            env_file,
        } => (command, args, cwd, env, env_file),
        Transport::Remote { url, field } => {
            return Err(refuse(
                s,
                field.clone(),
                format!(
                    "`{url}` is a remote MCP server (streamable HTTP or SSE): remote servers are not yet supported by cordon's manifest; leave it in the client's configuration"
                ),
            ));
        }
        Transport::Nothing => {
            return Err(refuse(
                s,
                "command",
                "no command or URL (a server provided by a client extension): nothing to sandbox",
            ));
        }
    };
    if let Some(f) = env_file {
        return Err(refuse(
            s,
            "envFile",
            format!(
                "`{f}` is read by the client at start: write its variables in `env` (credentials become secrets)"
            ),
        ));
    }
    Ok(Stdio {
        command,
        args,
        cwd: cwd.as_ref(),
        env,
    })
}

/// Windows paths and shells, refused before anything is expanded. Returns
/// the program's file name.
fn refuse_shells<'c>(
    s: &ClientServer,
    command: &'c str,
    args: &[String],
    cwd: Option<&String>,
) -> Result<&'c str, Refusal> {
    for (field, v) in std::iter::once(("command".to_string(), command))
        .chain(
            args.iter()
                .enumerate()
                .map(|(i, a)| (format!("args[{i}]"), a.as_str())),
        )
        .chain(cwd.iter().map(|c| ("cwd".to_string(), c.as_str())))
    {
        if windows_path(v) {
            return Err(refuse(
                s,
                field,
                format!("`{v}` is a Windows path: cordon sandboxes Linux processes"),
            ));
        }
    }
    let prog = Path::new(command)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(command);
    if matches!(
        prog,
        "sh" | "bash" | "zsh" | "dash" | "fish" | "ksh" | "cmd" | "cmd.exe" | "powershell" | "pwsh"
    ) {
        return Err(refuse(
            s,
            "command",
            format!(
                "`{command}` is a shell: cordon runs one program with its arguments, never a shell command line; name the server's program in `command`"
            ),
        ));
    }
    if command.contains(|c: char| c.is_whitespace() || "|&;<>()$`*?".contains(c))
        && !command.contains("${")
    {
        return Err(refuse(
            s,
            "command",
            format!(
                "`{command}` is a shell command line (spaces or shell operators): give the program alone in `command` and its arguments in `args`"
            ),
        ));
    }
    Ok(prog)
}

/// `v` of `field` expanded, or the refusal saying what cannot be.
fn expand_field(
    s: &ClientServer,
    env: &EnvMap,
    field: &str,
    v: &str,
    base: &Path,
) -> Result<String, Refusal> {
    let mut missing = String::new();
    expand(v, base, env, &mut missing).map_err(|input| match input {
        Some(id) => refuse(
            s,
            field,
            format!("`${{input:{id}}}` is asked by the client at every start; cordon cannot prompt there: pass it through `env` (it becomes a secret) or write the value"),
        ),
        None => refuse(
            s,
            field,
            format!("`{v}`: `{missing}` is not set here, so the expansion cannot be resolved; set it or write the value"),
        ),
    })
}

/// A package a launcher (`npx`, `uvx`...) would fetch at every start,
/// installed once into cordon's store. Returns the argv and the
/// interpreter.
fn installed(
    s: &ClientServer,
    cx: &mut Ctx<'_>,
    command: &str,
    args: &[String],
    l: &Launch,
    got: &mut Gathered,
) -> Result<(Vec<String>, Option<&'static str>), Refusal> {
    let what = match l.pkg.ecosystem {
        Ecosystem::Npm => "npm",
        Ecosystem::Pypi => "pypi",
    };
    let store = match l.pkg.ecosystem {
        Ecosystem::Npm => cx.store,
        Ecosystem::Pypi => cx.pypi_store,
    };
    let runner = Path::new(command)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(command);
    let key = super::resolutions::Key::new(runner, &l.pkg, store);
    // A stored resolution whose install still verifies: no resolving.
    let stored = match cx.resolutions.find(&key) {
        Some(r) if !cx.refresh => match store.verify(&l.pkg, &r.install) {
            Ok(inst) => {
                eprintln!(
                    "cordon import: `{}`: reused the stored resolution of {} from {}: {} in {} (its install verified; --refresh resolves again)",
                    s.name,
                    key.shown(),
                    r.at,
                    inst.version,
                    inst.root.display()
                );
                Some(inst)
            }
            Err(e) => {
                eprintln!(
                    "cordon import: `{}`: the stored resolution of {} no longer holds ({e}); resolving again",
                    s.name,
                    key.shown()
                );
                None
            }
        },
        _ => None,
    };
    let inst = match stored {
        Some(inst) => inst,
        None => {
            let inst = store.install(&l.pkg).map_err(|e| {
                refuse(
                    s,
                    "command",
                    format!(
                        "`{command} {}` would download {what}:{} at every start; cordon installs it once into its store ({}) and that failed: {e}",
                        args.join(" "),
                        l.pkg.name,
                        store.root.display()
                    ),
                )
            })?;
            eprintln!(
                "cordon import: `{}`: resolved {} to {} in {}",
                s.name,
                key.shown(),
                inst.version,
                inst.root.display()
            );
            cx.resolutions.record(key, &inst);
            inst
        }
    };
    got.notes.push(format!(
        "{what}:{}@{} from cordon's store ({}; lock {}), in place of `{command}` fetching it at every start.",
        l.pkg.name,
        inst.version,
        inst.root.display(),
        inst.lock_digest
    ));
    for m in &inst.mounts {
        got.mounts.push(MountEntry {
            src: m.src.display().to_string(),
            dst: (m.dst != m.src).then(|| m.dst.display().to_string()),
            rw: m.rw,
            reason: "the installed package".into(),
        });
    }
    for (k, v) in &inst.env {
        got.env.push((
            k.clone(),
            v.clone(),
            Some("the installed package's environment".into()),
        ));
    }
    let interpreter = Some(match l.pkg.ecosystem {
        Ecosystem::Npm => "node",
        Ecosystem::Pypi => "python",
    });
    Ok((inst.command.clone(), interpreter))
}

/// A program on this host: absolute, relative to the base, or on PATH,
/// with its prefix mounted when it is not in a system directory. Returns
/// the argv and the interpreter.
fn host_program(
    s: &ClientServer,
    cx: &Ctx<'_>,
    command: &str,
    base: &Path,
    prog: &str,
    got: &mut Gathered,
) -> Result<(Vec<String>, Option<&'static str>), Refusal> {
    // The program: absolute, relative to the base, or on PATH.
    let path = if command.contains('/') {
        let p = Path::new(command);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    } else {
        crate::shims::which_outside(command, cx.env, &[]).ok_or_else(|| {
            refuse(
                s,
                "command",
                format!("`{command}` is not on this host's PATH"),
            )
        })?
    };
    if !path.is_file() {
        return Err(refuse(
            s,
            "command",
            format!("`{}` does not exist on this host", path.display()),
        ));
    }
    let path = real_program(s, cx, &path, base, prog, got)?;
    let p = path.display().to_string();
    if let Some(d) = in_reserved_dir(&p) {
        return Err(refuse(
            s,
            "command",
            format!(
                "`{p}` is under {d}, which each sandbox builds itself: install the program elsewhere"
            ),
        ));
    }
    if !in_system_dir(&p) {
        // A program in `<prefix>/bin` needs its prefix (nvm, pyenv).
        let parent = path.parent().unwrap_or(Path::new("/"));
        let root = if parent.file_name().and_then(|f| f.to_str()) == Some("bin") {
            parent.parent().unwrap_or(parent).to_path_buf()
        } else {
            script_root(&path)
        };
        got.mounts.push(MountEntry {
            src: root.display().to_string(),
            dst: None,
            rw: false,
            reason: format!("the server's program, {p}, read-only"),
        });
    }
    let interpreter = match prog {
        p if p.starts_with("node") || p == "bun" || p == "deno" => Some("node"),
        p if p.starts_with("python") => Some("python"),
        _ => None,
    };
    Ok((vec![p], interpreter))
}

/// The program a sandbox can run in place of `path`: a version manager's
/// shim resolved to the program it would run (or refused, saying why); a
/// virtualenv's interpreter that is a symlink into a home, the real
/// interpreter, with the virtualenv's site-packages mounted and on
/// `PYTHONPATH`. Anything else is `path` itself.
fn real_program(
    s: &ClientServer,
    cx: &Ctx<'_>,
    path: &Path,
    base: &Path,
    prog: &str,
    got: &mut Gathered,
) -> Result<PathBuf, Refusal> {
    if let Some(shim) = crate::shims::detect(path) {
        let r = crate::shims::resolve(&shim, prog, base, cx.env).map_err(|e| {
            refuse(
                s,
                "command",
                format!(
                    "{}; it cannot be resolved to the real program: {e}. Write the real program's path in `command` (`{} which {prog}` prints it), or install the version it names",
                    crate::shims::why_not(&shim),
                    shim.manager
                ),
            )
        })?;
        got.command_note = Some(format!(
            "{}: resolved from {}. The shim is a script that runs {}, which would need the whole home inside the sandbox.",
            r.path.display(),
            r.how,
            shim.manager
        ));
        return Ok(r.path);
    }
    if !prog.starts_with("python") {
        return Ok(path.to_path_buf());
    }
    // A virtualenv: <venv>/bin/python, with <venv>/pyvenv.cfg.
    let Some(venv) = path
        .parent()
        .filter(|b| b.file_name().and_then(|f| f.to_str()) == Some("bin"))
        .and_then(Path::parent)
        .filter(|v| v.join("pyvenv.cfg").is_file())
    else {
        return Ok(path.to_path_buf());
    };
    let Ok(real) = std::fs::canonicalize(path) else {
        return Ok(path.to_path_buf());
    };
    let shown = real.display().to_string();
    if in_system_dir(&shown) || real.starts_with(venv) {
        // The link is followed inside the sandbox as well: nothing to do.
        return Ok(path.to_path_buf());
    }
    let real = match crate::shims::detect(&real) {
        Some(shim) => {
            let name = real.file_name().and_then(|f| f.to_str()).unwrap_or(prog);
            crate::shims::resolve(&shim, name, base, cx.env)
                .map_err(|e| {
                    refuse(
                        s,
                        "command",
                        format!(
                            "the virtualenv's {} is a symlink to {}; it cannot be resolved to the real interpreter: {e}",
                            path.display(),
                            crate::shims::why_not(&shim)
                        ),
                    )
                })?
                .path
        }
        None => real,
    };
    let site: Vec<PathBuf> = ["lib", "lib64"]
        .iter()
        .filter_map(|l| std::fs::read_dir(venv.join(l)).ok())
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    for p in &site {
        got.mounts.push(MountEntry {
            src: p.display().to_string(),
            dst: None,
            rw: false,
            reason: format!(
                "the virtualenv's packages ({}), read-only: the real interpreter runs in its place",
                venv.display()
            ),
        });
    }
    if !site.is_empty() {
        let joined: Vec<String> = site.iter().map(|p| p.display().to_string()).collect();
        got.env.push((
            "PYTHONPATH".into(),
            joined.join(":"),
            Some(format!(
                "the virtualenv's packages: {} is not run as the virtualenv's own interpreter",
                real.display()
            )),
        ));
    }
    got.command_note = Some(format!(
        "{}: resolved from the virtualenv's {}, a symlink into a directory the sandbox does not have; its site-packages are mounted and on PYTHONPATH.",
        real.display(),
        path.display()
    ));
    Ok(real)
}

/// Paths and URLs in the arguments: a relative path made absolute, a host
/// path mounted read-only, a URL's host allowed.
fn arg_paths(
    s: &ClientServer,
    args: &mut [String],
    base: &Path,
    known: Option<&Known>,
    interpreter: Option<&'static str>,
    got: &mut Gathered,
) -> Result<(), Refusal> {
    let writes = known.map(|k| k.paths == Paths::Write);
    for (i, a) in args.iter_mut().enumerate() {
        let (prefix, val) = match a.split_once('=') {
            Some((k, v)) if k.starts_with('-') => (format!("{k}="), v.to_string()),
            _ => (String::new(), a.clone()),
        };
        if let Some((h, port)) = url_host(&val) {
            if local_host(&h) {
                got.skipped_hosts.push(format!("{h}:{port} (args[{i}])"));
            } else {
                got.hosts
                    .push((format!("{h}:{port}"), format!("named in args[{i}]")));
            }
            continue;
        }
        let looks_relative = !val.starts_with('-')
            && !val.starts_with('/')
            && (val.contains('/')
                || [".js", ".mjs", ".cjs", ".ts", ".py"]
                    .iter()
                    .any(|e| val.ends_with(e)))
            && base.join(&val).exists();
        let abs = if val.starts_with('/') {
            PathBuf::from(&val)
        } else if looks_relative {
            let p = base.join(&val);
            *a = format!("{prefix}{}", p.display());
            p
        } else {
            continue;
        };
        let shown = abs.display().to_string();
        if in_system_dir(&shown) {
            continue;
        }
        if shown == "/" || shown.contains(':') {
            return Err(refuse(
                s,
                format!("args[{i}]"),
                format!(
                    "`{shown}` cannot be mounted (the whole root, or a path with `:`): give the server a directory of its own"
                ),
            ));
        }
        if let Some(d) = in_reserved_dir(&shown) {
            return Err(refuse(
                s,
                format!("args[{i}]"),
                format!(
                    "`{shown}` is under {d}, which each sandbox builds itself (its own /tmp, /etc, /proc): a host path there cannot be mounted at the same place; move it elsewhere"
                ),
            ));
        }
        if !abs.exists() {
            got.notes.push(format!(
                "args[{i}] `{shown}` looks like a path but does not exist here: not mounted."
            ));
            continue;
        }
        if abs.is_file() && i == 0 && interpreter.is_some() {
            got.mounts.push(MountEntry {
                src: script_root(&abs).display().to_string(),
                dst: None,
                rw: false,
                reason: format!("the server's script, args[{i}], read-only"),
            });
            continue;
        }
        // Every runtime binds host paths read-only only: a server that
        // writes is told so by its errors (EROFS), never given the host.
        let reason = match writes {
            Some(true) => format!(
                "args[{i}], read-only: {} writes here, but cordon binds host paths read-only only (its writes fail with EROFS)",
                known.map(|k| k.names[0]).unwrap_or("the server")
            ),
            Some(false) => format!("args[{i}], read-only (the known server only reads)"),
            None => format!("args[{i}], read-only"),
        };
        got.mounts.push(MountEntry {
            src: abs.display().to_string(),
            dst: None,
            rw: false,
            reason,
        });
    }
    Ok(())
}

/// The environment: credentials become secrets (their scope asked), the
/// rest is expanded and passed on, with hosts allowed and paths mounted as
/// in the arguments.
fn env_entries(
    s: &ClientServer,
    cx: &mut Ctx<'_>,
    env: &EnvMap,
    base: &Path,
    known: Option<&Known>,
    name: &str,
    got: &mut Gathered,
) -> Result<Vec<SecretEntry>, Refusal> {
    let mut secrets: Vec<SecretEntry> = Vec::new();
    for (k, v) in env {
        let field = format!("env.{k}");
        if k.starts_with("LD_") {
            return Err(refuse(
                s,
                field,
                "changes how every program is loaded; cordon refuses it",
            ));
        }
        let input = expand(v, base, cx.env, &mut String::new()).err().flatten();
        let reason = if let Some(id) = &input {
            let desc = s
                .inputs
                .get(id)
                .and_then(|i| i.description.clone())
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            Some(format!(
                "env {k}: the client prompts for it (input `{id}`{desc}); the credential broker supplies it"
            ))
        } else if credential_name(k) {
            Some(format!(
                "env {k}: its name says it is a credential; the value was not copied"
            ))
        } else if credential_value(v) {
            Some(format!(
                "env {k}: its value is shaped like a token; the value was not copied"
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => {
                let default_scope = known
                    .and_then(|kn| kn.scope)
                    .map(str::to_string)
                    .unwrap_or_else(|| name.to_string());
                let scope = cx.ask.ask(
                    &format!("server `{}`: scope of the credential {k}?", s.name),
                    &default_scope,
                );
                secrets.push(SecretEntry {
                    name: k.clone(),
                    scope,
                    ttl: 3600,
                    deliver: None,
                    reason,
                });
            }
            None => {
                let val = expand_field(s, cx.env, &field, v, base)?;
                if let Some((h, port)) = url_host(&val) {
                    if local_host(&h) {
                        got.skipped_hosts.push(format!("{h}:{port} (env {k})"));
                    } else {
                        got.hosts
                            .push((format!("{h}:{port}"), format!("named in env {k}")));
                    }
                }
                // A host path in a variable: mounted read-only, as in args.
                let p = Path::new(&val);
                if p.is_absolute()
                    && p.exists()
                    && !in_system_dir(&val)
                    && in_reserved_dir(&val).is_none()
                    && val != "/"
                    && !val.contains(':')
                {
                    got.mounts.push(MountEntry {
                        src: val.clone(),
                        dst: None,
                        rw: false,
                        reason: format!("env {k}, read-only"),
                    });
                }
                got.env.push((k.clone(), val, None));
            }
        }
    }
    Ok(secrets)
}

/// The profile, runtime and network of a server: P3 on gVisor for one
/// whose worst input is a hostile page, else P2; its known hosts and those
/// its arguments and environment name.
fn profile_and_network(entry: &mut Entry, known: Option<&Known>, hosts: Vec<(String, String)>) {
    if let Some(k) = known {
        entry
            .notes
            .push(format!("Known server {}: {}.", k.names[0], k.what));
    } else {
        entry.notes.push(
            "Not a server cordon knows: its network and mounts are what its arguments name; review them.".into(),
        );
    }
    let net = known.map(|k| k.net).unwrap_or(Net::FromArgs);
    let hostile = known.is_some_and(|k| k.hostile_content);
    entry.profile = if hostile {
        ("P3".into(), "P3: it opens or renders content from anywhere (its worst input is a hostile page): a fresh runtime with its own kernel.".into())
    } else {
        (
            "P2".into(),
            "P2: a third-party MCP server, with an explicit egress allowlist and scoped secrets."
                .into(),
        )
    };
    if hostile {
        entry.runtime = Some((
            "gvisor".into(),
            "P3 needs a separate kernel (gVisor; `microvm` also fits).".into(),
        ));
    }
    entry.network = match net {
        Net::Any if hostile => Network::Proxy(
            "It fetches what the agent names: any public destination on ports 80 and 443 through the filtering proxy.".into(),
        ),
        Net::Hosts(h) => Network::Allow(
            h.iter()
                .map(|x| (x.to_string(), known_reason(known)))
                .chain(hosts)
                .collect(),
        ),
        _ if hosts.is_empty() => Network::None(if known.is_some() {
            "No network: the known server needs none.".into()
        } else {
            "No network: no URL in its arguments or environment.".into()
        }),
        _ => {
            let mut seen = std::collections::BTreeSet::new();
            Network::Allow(hosts.into_iter().filter(|(h, _)| seen.insert(h.clone())).collect())
        }
    };
}

/// How each secret is delivered: by the egress door on the one egress
/// entry, else in the environment (and why).
fn deliveries(mut secrets: Vec<SecretEntry>, network: &Network) -> Vec<SecretEntry> {
    let allow_count = match network {
        Network::Allow(h) => h.len(),
        _ => 0,
    };
    for sec in &mut secrets {
        if allow_count != 1 {
            sec.deliver = Some("env".into());
            sec.reason.push_str(&format!(
                "\n`deliver: env` (the server holds the token itself, and `cordon check` warns): {}",
                if allow_count == 0 {
                    "it has no egress endpoint the door could put the token on"
                } else {
                    "it has several egress entries; add `bind: {endpoint: host:port}` and drop `deliver: env` to keep the token in the door"
                }
            ));
        } else {
            sec.reason
                .push_str("\nDelivered by the egress door on its one egress entry: the sandbox sees a placeholder.");
        }
    }
    secrets
}

/// More memory than the default for the interpreters that need it.
fn known_reason(k: Option<&Known>) -> String {
    match k {
        Some(k) => format!("{} reaches this API", k.names[0]),
        None => String::new(),
    }
}

/// Mounts with no duplicate and none inside another of the same or a
/// stronger mode.
fn dedup(mut v: Vec<MountEntry>) -> Vec<MountEntry> {
    v.sort_by(|a, b| a.src.cmp(&b.src).then(b.rw.cmp(&a.rw)));
    let mut out: Vec<MountEntry> = Vec::new();
    for m in v {
        let covered = out.iter().any(|o| {
            o.dst.is_none()
                && m.dst.is_none()
                && (o.src == m.src || m.src.starts_with(&format!("{}/", o.src)))
                && (o.rw || !m.rw)
        });
        if !covered {
            out.push(m);
        }
    }
    out
}

/// The servers that are the same in several places (kept once), and the
/// names that mean different servers (refused), by tool name.
pub fn group(servers: Vec<ClientServer>) -> (Vec<(ClientServer, Vec<String>)>, Vec<Refusal>) {
    let mut by: BTreeMap<String, Vec<ClientServer>> = BTreeMap::new();
    for s in servers {
        by.entry(tool_name(&s.name)).or_default().push(s);
    }
    let mut keep = Vec::new();
    let mut refused = Vec::new();
    for (_, list) in by {
        let first = &list[0];
        let same = list.iter().all(|x| x.transport == first.transport);
        if same {
            let also: Vec<String> = list[1..]
                .iter()
                .map(|x| format!("{} (`{}`)", x.file.display(), x.at))
                .collect();
            keep.push((first.clone(), also));
        } else {
            let places: Vec<String> = list
                .iter()
                .map(|x| format!("{} (`{}`)", x.file.display(), x.at))
                .collect();
            refused.push(Refusal {
                server: first.name.clone(),
                file: first.file.clone(),
                field: "name".into(),
                why: format!(
                    "defined differently in {}: rename one in its client configuration, or import the files separately",
                    places.join(" and ")
                ),
            });
        }
    }
    (keep, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names_and_values() {
        for n in [
            "GITHUB_TOKEN",
            "API_KEY",
            "OPENAI_APIKEY",
            "DB_PASSWORD",
            "CLIENT_SECRET",
            "DB_PASS",
            "OAUTH_CLIENT",
            "GITHUB_PAT",
        ] {
            assert!(credential_name(n), "{n}");
        }
        for n in [
            "PATH",
            "KEYBOARD_LAYOUT",
            "LOG_LEVEL",
            "ROOT_DIR",
            "GIT_AUTHOR_NAME",
            "PWD_DIR_X",
        ] {
            assert!(!credential_name(n), "{n}");
        }
        assert!(credential_value("ghp_abcdefghijklmnopqrstuvwxyz0123456789"));
        assert!(credential_value("q8Zr2vKx9Lm4Np7Ts1Wy6Bc3Df5Gh0Jk"));
        assert!(!credential_value("info"));
        assert!(!credential_value("/var/lib/data/some/long/path/2024"));
        assert!(!credential_value("https://api.example.com/v1/2024/items"));
    }

    #[test]
    fn expansions() {
        let env: BTreeMap<String, String> = [
            ("HOME".to_string(), "/home/u".to_string()),
            ("A".into(), "x".into()),
        ]
        .into();
        let base = Path::new("/proj");
        let e = |v: &str| expand(v, base, &env, &mut String::new());
        assert_eq!(e("${A}/b").unwrap(), "x/b");
        assert_eq!(e("${env:A}").unwrap(), "x");
        assert_eq!(e("${NOPE:-d}").unwrap(), "d");
        assert_eq!(e("~/x").unwrap(), "/home/u/x");
        assert_eq!(e("${workspaceFolder}/s").unwrap(), "/proj/s");
        assert_eq!(e("${input:tok}"), Err(Some("tok".into())));
        assert_eq!(e("${NOPE}"), Err(None));
    }

    #[test]
    fn urls_give_host_and_port() {
        assert_eq!(
            url_host("https://api.x.com/v1"),
            Some(("api.x.com".into(), 443))
        );
        assert_eq!(
            url_host("postgresql://u:p@db.x.com:6543/app"),
            Some(("db.x.com".into(), 6543))
        );
        assert_eq!(
            url_host("postgres://db.x.com/app"),
            Some(("db.x.com".into(), 5432))
        );
        assert_eq!(url_host("file:///x"), None);
    }

    #[test]
    fn windows_paths() {
        assert!(windows_path("C:\\Users\\me"));
        assert!(windows_path("D:/data"));
        assert!(!windows_path("/home/me"));
    }
}
