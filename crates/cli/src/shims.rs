//! Version managers' shims: `~/.pyenv/shims/python3`, `~/.asdf/shims/node`,
//! `~/.volta/bin/npx`... A shim is not the interpreter: it is a shell
//! script (volta's, a small program) that runs the manager, which picks
//! the real program from files all over the home (`.python-version`,
//! `~/.pyenv/version`, `.tool-versions`...). Inside a sandbox that would
//! need the whole home. `cordon import` resolves a shim to the real
//! program it would run ([`resolve`]), or refuses saying why; `cordon
//! check` refuses a tool whose program (or its `#!` interpreter) is one
//! ([`refusals`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use cordon_policy::policy::{Exec, ToolPolicy};

/// A version manager's shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shim {
    /// `pyenv`, `rbenv`, `nodenv`, `asdf`, `mise` or `volta`.
    pub manager: &'static str,
    /// The manager's root (`~/.pyenv`, `~/.asdf`, `~/.volta`...).
    pub root: PathBuf,
    /// The shim itself.
    pub path: PathBuf,
}

/// The real program a shim runs, and how it was found (for the comment
/// `cordon import` writes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub how: String,
}

/// The first bytes of `path`, when it is a readable file.
fn head(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 4096];
    let n = f.read(&mut buf).ok()?;
    buf.truncate(n);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether `path` is a version manager's shim (by where it is, or, for a
/// `shims` directory elsewhere, by what the script runs).
pub fn detect(path: &Path) -> Option<Shim> {
    let parent = path.parent()?;
    let dir = parent.file_name()?.to_str()?;
    let root = parent.parent()?;
    let above = root.file_name().and_then(|f| f.to_str()).unwrap_or("");
    let shim = |manager, root: &Path| {
        Some(Shim {
            manager,
            root: root.to_path_buf(),
            path: path.to_path_buf(),
        })
    };
    match (dir, above) {
        ("shims", ".pyenv") => return shim("pyenv", root),
        ("shims", ".rbenv") => return shim("rbenv", root),
        ("shims", ".nodenv") => return shim("nodenv", root),
        ("shims", ".asdf") => return shim("asdf", root),
        ("shims", "mise") => return shim("mise", root),
        ("bin", ".volta") => {
            let name = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
            if !name.starts_with("volta") {
                return shim("volta", root);
            }
            return None;
        }
        _ => {}
    }
    if dir != "shims" {
        return None;
    }
    // A manager installed under another root (PYENV_ROOT, ASDF_DATA_DIR):
    // its shims say which manager they run.
    let text = head(path)?;
    if !text.starts_with("#!") {
        return None;
    }
    for (needle, manager) in [
        ("PYENV_ROOT", "pyenv"),
        ("RBENV_ROOT", "rbenv"),
        ("NODENV_ROOT", "nodenv"),
        ("asdf exec", "asdf"),
        ("mise x", "mise"),
    ] {
        if text.contains(needle) {
            return shim(manager, root);
        }
    }
    None
}

/// The version names a `pyenv`-style version file lists (whitespace
/// separated, `#` comments).
fn versions_in(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .flat_map(str::split_whitespace)
        .map(str::to_string)
        .collect()
}

/// `name` in `dir` or the nearest directory above it that has one.
fn find_up(dir: &Path, name: &str) -> Option<PathBuf> {
    dir.ancestors().map(|d| d.join(name)).find(|p| p.is_file())
}

/// `cmd` on `PATH` (from `env`; `/usr/bin:/bin` without one), leaving
/// out the directories in `skip`.
pub fn which_outside(cmd: &str, env: &BTreeMap<String, String>, skip: &[&Path]) -> Option<PathBuf> {
    let path = env
        .get("PATH")
        .map(String::as_str)
        .unwrap_or("/usr/bin:/bin");
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(Path::new)
        .filter(|d| !skip.iter().any(|s| d.starts_with(s)))
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// The program `shim` would run for `cmd` started in `cwd`, with the
/// environment `env` (`HOME`, `PATH`, `PYENV_VERSION`...): read from the
/// manager's own files (pyenv, rbenv, nodenv, asdf), or asked of the
/// manager (`asdf which`, `mise which`, `volta which`). `Err`: why not,
/// and what to write instead.
pub fn resolve(
    shim: &Shim,
    cmd: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Resolved, String> {
    let found = match shim.manager {
        "pyenv" => env_style(shim, cmd, cwd, env, "PYENV_VERSION", ".python-version"),
        "rbenv" => env_style(shim, cmd, cwd, env, "RBENV_VERSION", ".ruby-version"),
        "nodenv" => env_style(shim, cmd, cwd, env, "NODENV_VERSION", ".node-version"),
        "asdf" => {
            asdf(shim, cmd, cwd, env).or_else(|e| ask(shim, cmd, cwd, env, "asdf").map_err(|_| e))
        }
        "mise" | "volta" => ask(shim, cmd, cwd, env, shim.manager),
        _ => Err(format!(
            "{} is not a version manager cordon knows",
            shim.manager
        )),
    }?;
    let real = std::fs::canonicalize(&found.path).map_err(|e| {
        format!(
            "{} resolves to {}, which cannot be resolved ({e})",
            shim.path.display(),
            found.path.display()
        )
    })?;
    if detect(&real).is_some() {
        return Err(format!(
            "{} resolves to {}, another shim",
            shim.path.display(),
            real.display()
        ));
    }
    let how = if real == found.path {
        found.how
    } else {
        format!("{}, which is {}", found.how, found.path.display())
    };
    Ok(Resolved { path: real, how })
}

/// pyenv, rbenv and nodenv: `$<X>_VERSION`, else the nearest version file
/// from `cwd` up, else `<root>/version`, else `system`; each version's
/// `<root>/versions/<v>/bin/<cmd>`, `system` the `PATH` without the shims.
fn env_style(
    shim: &Shim,
    cmd: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    var: &str,
    file: &str,
) -> Result<Resolved, String> {
    let m = shim.manager;
    let (versions, from) = if let Some(v) = env.get(var).filter(|v| !v.trim().is_empty()) {
        (
            v.split(':').map(str::to_string).collect::<Vec<_>>(),
            format!("${var}"),
        )
    } else {
        let f =
            find_up(cwd, file).or_else(|| Some(shim.root.join("version")).filter(|p| p.is_file()));
        match f {
            Some(f) => {
                let text = std::fs::read_to_string(&f)
                    .map_err(|e| format!("reading {}: {e}", f.display()))?;
                (versions_in(&text), f.display().to_string())
            }
            None => (vec!["system".to_string()], "no version file".to_string()),
        }
    };
    if versions.is_empty() {
        return Err(format!(
            "the {m} shim {} runs the version named in {from}, which names none",
            shim.path.display()
        ));
    }
    for v in &versions {
        if v == "system" {
            let shims = shim.root.join("shims");
            if let Some(p) = which_outside(cmd, env, &[&shims, &shim.root]) {
                return Ok(Resolved {
                    how: format!(
                        "the {m} shim {} (version `system`, from {from}: `{cmd}` on PATH)",
                        shim.path.display()
                    ),
                    path: p,
                });
            }
            continue;
        }
        let p = shim.root.join("versions").join(v).join("bin").join(cmd);
        if p.is_file() {
            return Ok(Resolved {
                how: format!(
                    "the {m} shim {} (version {v}, from {from})",
                    shim.path.display()
                ),
                path: p,
            });
        }
    }
    Err(format!(
        "the {m} shim {} would run `{cmd}` of version {} (from {from}), and none of them has it under {}",
        shim.path.display(),
        versions.join(", "),
        shim.root.join("versions").display()
    ))
}

/// asdf: `$ASDF_<PLUGIN>_VERSION` or the nearest `.tool-versions` from
/// `cwd` up (then `$HOME/.tool-versions`): the first install of a listed
/// version that has `bin/<cmd>`.
fn asdf(
    shim: &Shim,
    cmd: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Resolved, String> {
    let home_file = env
        .get("HOME")
        .map(|h| Path::new(h).join(".tool-versions"))
        .filter(|p| p.is_file());
    let Some(f) = find_up(cwd, ".tool-versions").or(home_file) else {
        return Err(format!(
            "the asdf shim {} runs the version named in a .tool-versions file, and there is none above {} nor in $HOME",
            shim.path.display(),
            cwd.display()
        ));
    };
    let text = std::fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?;
    let installs = shim.root.join("installs");
    for line in text.lines() {
        let mut words = versions_in(line).into_iter();
        let Some(plugin) = words.next() else {
            continue;
        };
        let var = format!(
            "ASDF_{}_VERSION",
            plugin.to_ascii_uppercase().replace('-', "_")
        );
        let versions: Vec<String> = match env.get(&var) {
            Some(v) => vec![v.clone()],
            None => words.collect(),
        };
        for v in versions {
            let p = installs.join(&plugin).join(&v).join("bin").join(cmd);
            if p.is_file() {
                return Ok(Resolved {
                    how: format!(
                        "the asdf shim {} ({plugin} {v}, from {})",
                        shim.path.display(),
                        f.display()
                    ),
                    path: p,
                });
            }
        }
    }
    Err(format!(
        "the asdf shim {} would run `{cmd}` of a version {} lists, and no install under {} has it",
        shim.path.display(),
        f.display(),
        installs.display()
    ))
}

/// Ask the manager itself: `<manager> which <cmd>` in `cwd`.
fn ask(
    shim: &Shim,
    cmd: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    manager: &str,
) -> Result<Resolved, String> {
    let own = shim.root.join("bin").join(manager);
    let program = if own.is_file() {
        own
    } else {
        which_outside(manager, env, &[]).ok_or_else(|| {
            format!(
                "the {manager} shim {} runs {manager}, which picks the program, and `{manager}` is not on PATH here to ask (`{manager} which {cmd}`)",
                shim.path.display()
            )
        })?
    };
    let out = std::process::Command::new(&program)
        .args(["which", cmd])
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running `{} which {cmd}`: {e}", program.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let p = PathBuf::from(text.trim());
    if !out.status.success() || !p.is_absolute() || !p.is_file() {
        return Err(format!(
            "the {manager} shim {}: `{manager} which {cmd}` gave no program ({}): {}",
            shim.path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Resolved {
        how: format!(
            "the {manager} shim {} (`{manager} which {cmd}`)",
            shim.path.display()
        ),
        path: p,
    })
}

/// Why a shim cannot run in a sandbox, for messages.
pub fn why_not(shim: &Shim) -> String {
    format!(
        "{} is a {} shim: a script that runs {}, which picks the real program from files in the home (inside the sandbox it would need the whole home)",
        shim.path.display(),
        shim.manager,
        shim.manager
    )
}

/// The program a tool runs and, for a script, its `#!` interpreter: each
/// one that is a version manager's shim, with the line to point at.
pub fn refusals(loaded: &cordon_policy::Loaded, t: &ToolPolicy) -> Vec<cordon_policy::Diagnostic> {
    let argv0 = match &t.exec {
        Exec::Command { argv } => argv.first(),
        Exec::Mcp {
            command: Some(c),
            image: None,
            ..
        } => c.first(),
        _ => None,
    };
    let Some(argv0) = argv0.filter(|a| a.starts_with('/')) else {
        return Vec::new();
    };
    let program = Path::new(argv0);
    let at = loaded.tool_at.get(&t.name).copied().unwrap_or((1, 1));
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let say = |what: String, shim: &Shim, cmd: &str| {
        let hint = match resolve(shim, cmd, &cwd, &env) {
            Ok(r) => format!(
                "write the real program in its place: {} (resolved from {})",
                r.path.display(),
                r.how
            ),
            Err(e) => format!(
                "write the real program in its place (`{} which {cmd}` prints it); here: {e}",
                shim.manager
            ),
        };
        crate::check::diag(
            loaded,
            t,
            at,
            format!("would not start here: {what}{}", why_not(shim)),
            Some(hint),
        )
    };
    let name = |p: &Path| {
        p.file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_string()
    };
    if let Some(shim) = detect(program) {
        return vec![say("program ".into(), &shim, &name(program))];
    }
    // A script: its interpreter.
    let Some(text) = head(program) else {
        return Vec::new();
    };
    let Some(line) = text.strip_prefix("#!").and_then(|t| t.lines().next()) else {
        return Vec::new();
    };
    let Some(interp) = line.split_whitespace().next() else {
        return Vec::new();
    };
    match detect(Path::new(interp)) {
        Some(shim) => vec![say(
            format!("the #! interpreter of {argv0}: "),
            &shim,
            &name(Path::new(interp)),
        )],
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_pyenv_shim_resolves_to_the_version_it_would_run() {
        let home = cordon_testkit::scratch::named("shims-");
        let root = home.path().join(".pyenv");
        let shim = root.join("shims/python3");
        script(
            &shim,
            "#!/usr/bin/env bash\nexec pyenv exec \"$0\" \"$@\"\n",
        );
        let bin = root.join("versions/3.12.1/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink("/usr/bin/env", bin.join("python3")).unwrap();
        std::fs::write(root.join("version"), "3.12.1\n").unwrap();
        let s = detect(&shim).unwrap();
        assert_eq!((s.manager, s.root.as_path()), ("pyenv", root.as_path()));
        let env = BTreeMap::from([("HOME".to_string(), home.path().display().to_string())]);
        let r = resolve(&s, "python3", home.path(), &env).unwrap();
        assert_eq!(r.path, std::fs::canonicalize("/usr/bin/env").unwrap());
        assert!(r.how.contains("version 3.12.1"), "{}", r.how);
        // A project's own version file wins over the global one; a version
        // not installed is refused naming it.
        let proj = home.path().join("proj");
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::write(proj.join(".python-version"), "3.9.0\n").unwrap();
        let e = resolve(&s, "python3", &proj, &env).unwrap_err();
        assert!(
            e.contains("version 3.9.0") && e.contains(".python-version"),
            "{e}"
        );
        // Not a shim: a real program, a directory of programs.
        assert_eq!(detect(Path::new("/usr/bin/python3")), None);
        assert_eq!(detect(&bin.join("python3")), None);
    }

    #[test]
    fn asdf_reads_tool_versions_and_volta_needs_volta() {
        let home = cordon_testkit::scratch::named("shims-");
        let root = home.path().join(".asdf");
        let shim = root.join("shims/node");
        script(
            &shim,
            "#!/usr/bin/env bash\nexec asdf exec \"node\" \"$@\"\n",
        );
        let node = root.join("installs/nodejs/20.1.0/bin/node");
        script(&node, "#!/bin/true\n");
        std::fs::write(
            home.path().join(".tool-versions"),
            "nodejs 20.1.0\npython 3.12.1\n",
        )
        .unwrap();
        let env = BTreeMap::from([
            ("HOME".to_string(), home.path().display().to_string()),
            ("PATH".to_string(), "/nonexistent".to_string()),
        ]);
        let s = detect(&shim).unwrap();
        let r = resolve(&s, "node", Path::new("/"), &env).unwrap();
        assert_eq!(r.path, std::fs::canonicalize(&node).unwrap());
        let volta = home.path().join(".volta/bin/npx");
        script(&volta, "");
        let s = detect(&volta).unwrap();
        assert_eq!(s.manager, "volta");
        let e = resolve(&s, "npx", Path::new("/"), &env).unwrap_err();
        assert!(e.contains("`volta` is not on PATH"), "{e}");
    }
}
