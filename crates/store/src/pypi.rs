//! PyPI packages: a virtual environment on the host's interpreter
//! (`/usr/bin/python3 -m venv`, never a pyenv, conda or uv interpreter
//! under a home directory the sandbox does not have), `pip install
//! --only-binary :all: NAME==VERSION` into it, run through the
//! environment's own `python3`.
//!
//! The environment is relocatable for this use: its `python3` is a symlink
//! to `/usr/bin/python3`, which is in every sandbox, and Python finds the
//! environment from the `pyvenv.cfg` beside the path it was started by.
//! Console scripts are run as `python3 <script>`: their `#!` lines name the
//! host path they were installed at.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Built, HOST_PYTHON, PackageRef, Source, StoreError, io, network_failed, run, tail};

pub(crate) const LOCK: &str = "cordon-lock.txt";

/// PEP 508 names: letters, digits, `.`, `-`, `_`, starting and ending with
/// a letter or digit.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` as one `-`.
fn normalize(name: &str) -> String {
    let mut out = String::new();
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

pub(crate) fn build(dir: &Path, pkg: &PackageRef, source: &Source) -> Result<Built, StoreError> {
    if !Path::new(HOST_PYTHON).is_file() {
        return Err(StoreError::Refused(format!(
            "{pkg}: {HOST_PYTHON} is not installed (Debian: apt install python3 python3-venv)"
        )));
    }
    let wheels = match source {
        Source::Network => None,
        Source::Offline { from: Some(d) } => Some(d.clone()),
        Source::Offline { from: None } => {
            return Err(StoreError::Refused(format!(
                "{pkg}: an offline PyPI install needs --from DIR, a directory of wheels (`pip download --only-binary :all: -d DIR {}`)",
                spec(pkg)
            )));
        }
    };
    let venv = dir;
    let python = venv.join("bin/python3");
    // The host's pip, run for the environment (`--python`, pip 22.3 and
    // later), saves installing pip into each one; else the environment's
    // own, from ensurepip.
    let host_pip = Command::new(HOST_PYTHON)
        .args(["-m", "pip", "--python"])
        .arg(HOST_PYTHON)
        .args(["--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut mkvenv = Command::new(HOST_PYTHON);
    mkvenv.args(["-m", "venv"]);
    if host_pip {
        mkvenv.arg("--without-pip");
    }
    if let Err(out) = run(mkvenv.arg("--").arg(venv), "python3 -m venv")? {
        return Err(StoreError::Refused(format!(
            "{pkg}: {HOST_PYTHON} -m venv failed (Debian: apt install python3-venv):\n{}",
            tail(&out)
        )));
    }
    let pip = || {
        let mut c;
        if host_pip {
            c = Command::new(HOST_PYTHON);
            c.args(["-m", "pip", "--python"]).arg(&python);
        } else {
            c = Command::new(&python);
            c.args(["-m", "pip"]);
        }
        c.env("PYTHONNOUSERSITE", "1")
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env_remove("VIRTUAL_ENV");
        c
    };
    let mut cmd = pip();
    cmd.args([
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--no-warn-script-location",
        "--root-user-action=ignore",
        "--only-binary",
        ":all:",
    ]);
    if let Some(w) = &wheels {
        cmd.arg("--no-index").arg("--find-links").arg(w);
    }
    cmd.arg("--").arg(spec(pkg));
    if let Err(out) = run(&mut cmd, "pip install")? {
        return Err(StoreError::Refused(explain_failure(
            pkg,
            wheels.as_deref(),
            &out,
        )));
    }
    let freeze = match run(
        pip().args(["freeze", "--disable-pip-version-check"]),
        "pip freeze",
    )? {
        Ok(f) => f,
        Err(out) => {
            return Err(StoreError::Refused(format!(
                "{pkg}: pip freeze failed in its environment:\n{}",
                tail(&out)
            )));
        }
    };
    std::fs::write(venv.join(LOCK), &freeze).map_err(io(format!("write {LOCK}")))?;
    let want = normalize(&pkg.name);
    let version = freeze
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once("==")?;
            (normalize(n) == want).then(|| v.trim().to_string())
        })
        .ok_or_else(|| {
            StoreError::Refused(format!(
                "{pkg}: pip installed it, but pip freeze does not list it"
            ))
        })?;
    let run = entry(venv, pkg, &want)?;
    Ok(Built {
        version,
        lock_file: LOCK,
        run,
    })
}

fn spec(pkg: &PackageRef) -> String {
    match &pkg.version {
        Some(v) => format!("{}=={v}", pkg.name),
        None => pkg.name.clone(),
    }
}

/// The distribution's `.dist-info` directory in the environment.
fn dist_info(venv: &Path, want: &str) -> Result<Option<PathBuf>, StoreError> {
    let lib = venv.join("lib");
    for py in std::fs::read_dir(&lib).map_err(io(format!("read {}", lib.display())))? {
        let site = py
            .map_err(io("read the environment"))?
            .path()
            .join("site-packages");
        let Ok(entries) = std::fs::read_dir(&site) else {
            continue;
        };
        for e in entries {
            let p = e.map_err(io("read site-packages"))?.path();
            let Some(n) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = n.strip_suffix(".dist-info") else {
                continue;
            };
            let dist = stem.split_once('-').map_or(stem, |(d, _)| d);
            if normalize(dist) == want {
                return Ok(Some(p));
            }
        }
    }
    Ok(None)
}

/// How to start the server: its console script (the one named like the
/// package, else the only one) through the environment's interpreter, else
/// `-m MODULE` for a top-level module with a `__main__`.
fn entry(venv: &Path, pkg: &PackageRef, want: &str) -> Result<Vec<String>, StoreError> {
    let info = dist_info(venv, want)?.ok_or_else(|| {
        StoreError::Refused(format!("{pkg}: no .dist-info of it in the environment"))
    })?;
    let scripts = console_scripts(
        &std::fs::read_to_string(info.join("entry_points.txt")).unwrap_or_default(),
    );
    let chosen = match scripts.iter().find(|s| normalize(s) == want) {
        Some(s) => Some(s.clone()),
        None if scripts.len() == 1 => scripts.first().cloned(),
        None if scripts.is_empty() => None,
        None => {
            return Err(StoreError::Refused(format!(
                "{pkg}: it has several console scripts ({}), none named like the package",
                scripts.join(", ")
            )));
        }
    };
    if let Some(s) = chosen {
        if venv.join("bin").join(&s).is_file() {
            return Ok(vec![format!("@/bin/{s}")]);
        }
        return Err(StoreError::Refused(format!(
            "{pkg}: its console script {s} was not installed"
        )));
    }
    let tops = std::fs::read_to_string(info.join("top_level.txt")).unwrap_or_default();
    let mut modules: Vec<String> = tops.lines().map(|l| l.trim().to_string()).collect();
    modules.push(want.replace('-', "_"));
    for m in modules.iter().filter(|m| !m.is_empty()) {
        let found = std::fs::read_dir(venv.join("lib"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|py| {
                py.path()
                    .join("site-packages")
                    .join(m)
                    .join("__main__.py")
                    .is_file()
            });
        if found {
            return Ok(vec!["-m".into(), m.clone()]);
        }
    }
    Err(StoreError::Refused(format!(
        "{pkg}: it has no console script and no module with a __main__: it names no server to run"
    )))
}

/// The names in the `[console_scripts]` section of an `entry_points.txt`.
fn console_scripts(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for l in text.lines().map(str::trim) {
        if l.starts_with('[') {
            inside = l == "[console_scripts]";
        } else if inside && let Some((name, _)) = l.split_once('=') {
            let name = name.trim();
            if valid_name(name) {
                out.push(name.to_string());
            }
        }
    }
    out
}

fn explain_failure(pkg: &PackageRef, wheels: Option<&Path>, out: &str) -> String {
    // Before the missing distribution it causes.
    if network_failed(out) {
        return format!(
            "{pkg}: PyPI cannot be reached (network unavailable?); install from a directory of wheels with --from DIR\n{}",
            tail(out)
        );
    }
    if out.contains("No matching distribution found") || out.contains("Could not find a version") {
        let missing = out
            .lines()
            .find_map(|l| l.split_once("No matching distribution found for "))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| spec(pkg));
        return match wheels {
            Some(w) => format!(
                "{pkg}: no wheel of {missing} in {} (offline; cordon add installs wheels only, never building an sdist, which runs its setup code and may need a compiler): add it with `pip download --only-binary :all: -d {} {}`",
                w.display(),
                w.display(),
                spec(pkg)
            ),
            None => format!(
                "{pkg}: PyPI has no wheel of {missing} for this host's Python (no such package or version, or only an sdist: cordon add installs wheels only, never building one, which runs its setup code and may need a compiler)"
            ),
        };
    }
    format!("{pkg}: pip install failed:\n{}", tail(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_scripts() {
        assert_eq!(normalize("Mcp_Server..Time"), "mcp-server-time");
        assert!(valid_name("markitdown-mcp") && valid_name("a") && !valid_name("-r"));
        assert!(!valid_name("x[all]") && !valid_name("x y") && !valid_name("x_"));
        let ep = "[console_scripts]\nmcp-server-time = mcp_server_time:main\n\n[other]\nz = y:z\n";
        assert_eq!(console_scripts(ep), vec!["mcp-server-time".to_string()]);
    }
}
