//! npm packages: `npm install --ignore-scripts NAME@VERSION` into the
//! install's own `node_modules`, run as `node <bin script>`.
//!
//! Install scripts are not run: they would run the package's code on the
//! host, as whoever runs `cordon add`. The MCP servers this is made for are
//! plain JavaScript and need none; a package that does (a native addon
//! built by `node-gyp`) fails when its server starts, and is better built
//! into an image (`image:`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Built, Mount, PackageRef, Source, StoreError, io, network_failed, run, tail};

pub(crate) const LOCK: &str = "package-lock.json";

/// npm's rules for new package names: lower case, URL-safe, at most 214
/// characters, an optional `@scope/`, not starting with `.` or `_`.
pub(crate) fn valid_name(name: &str) -> bool {
    let part = |s: &str| {
        !s.is_empty()
            && !s.starts_with(['.', '_', '-'])
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '_' | '~')
            })
    };
    if name.len() > 214 {
        return false;
    }
    match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, n)) => part(scope) && part(n),
            None => false,
        },
        None => part(name),
    }
}

pub(crate) fn build(dir: &Path, pkg: &PackageRef, source: &Source) -> Result<Built, StoreError> {
    std::fs::write(
        dir.join("package.json"),
        "{\"name\": \"cordon-store-install\", \"private\": true}\n",
    )
    .map_err(io("write the install's package.json"))?;
    let spec = match &pkg.version {
        Some(v) => format!("{}@{v}", pkg.name),
        None => pkg.name.clone(),
    };
    let mut cmd = Command::new("npm");
    cmd.current_dir(dir)
        .args([
            "install",
            "--ignore-scripts",
            "--save-exact",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--loglevel=error",
        ])
        .env("npm_config_update_notifier", "false");
    if let Source::Offline { from } = source {
        cmd.arg("--offline");
        if let Some(cache) = from {
            cmd.arg("--cache").arg(cache);
        }
    }
    cmd.arg("--").arg(&spec);
    let out = match run(&mut cmd, "npm") {
        Err(StoreError::Io { source: e, .. }) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::Refused(format!(
                "{pkg}: npm is not installed on this host (Debian: apt install npm)"
            )));
        }
        r => r?,
    };
    if let Err(out) = out {
        return Err(StoreError::Refused(explain_failure(pkg, source, &out)));
    }
    let manifest_path = dir
        .join("node_modules")
        .join(&pkg.name)
        .join("package.json");
    let text = std::fs::read(&manifest_path).map_err(io(format!(
        "{pkg}: npm installed no {}",
        manifest_path.display()
    )))?;
    let meta: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| StoreError::Refused(format!("{pkg}: its package.json is not JSON: {e}")))?;
    let version = meta
        .get("version")
        .and_then(|v| v.as_str())
        .ok_or_else(|| StoreError::Refused(format!("{pkg}: its package.json has no version")))?
        .to_string();
    let script = entry_script(pkg, &meta)?;
    let rel = Path::new("node_modules").join(&pkg.name).join(&script);
    if !dir.join(&rel).is_file() {
        return Err(StoreError::Refused(format!(
            "{pkg}: its `bin` names {script}, which the package does not contain"
        )));
    }
    Ok(Built {
        version,
        lock_file: LOCK,
        run: vec![format!("@/{}", rel.to_string_lossy())],
    })
}

/// The script the package's `bin` names: the only one, or the one named
/// like the package.
fn entry_script(pkg: &PackageRef, meta: &serde_json::Value) -> Result<String, StoreError> {
    let unscoped = pkg.name.rsplit('/').next().unwrap_or(&pkg.name);
    let script = match meta.get("bin") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(m)) if m.len() == 1 => m
            .values()
            .next()
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        Some(serde_json::Value::Object(m)) => match m.get(unscoped).and_then(|v| v.as_str()) {
            Some(s) => s.to_string(),
            None => {
                let names: Vec<&str> = m.keys().map(String::as_str).collect();
                return Err(StoreError::Refused(format!(
                    "{pkg}: its `bin` names several commands ({}), none named {unscoped}",
                    names.join(", ")
                )));
            }
        },
        _ => {
            return Err(StoreError::Refused(format!(
                "{pkg}: its package.json has no `bin`: it names no server to run"
            )));
        }
    };
    let clean = script.trim_start_matches("./");
    if clean.is_empty()
        || clean.starts_with('/')
        || Path::new(clean)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(StoreError::Refused(format!(
            "{pkg}: its `bin` entry `{script}` is not a path inside the package"
        )));
    }
    Ok(clean.to_string())
}

fn explain_failure(pkg: &PackageRef, source: &Source, out: &str) -> String {
    let offline = matches!(source, Source::Offline { .. });
    // Offline, a version the cache lacks is ETARGET when the cache has
    // other versions of the package: the cache, not the registry, lacks it.
    if out.contains("ENOTCACHED") || (offline && (out.contains("E404") || out.contains("ETARGET")))
    {
        let cache = match source {
            Source::Offline { from: Some(d) } => d.display().to_string(),
            _ => "npm's cache".to_string(),
        };
        return format!(
            "{pkg}: not in {cache} (offline): fill it where the network is, e.g. `npm install --cache DIR {}` in a scratch directory",
            match &pkg.version {
                Some(v) => format!("{}@{v}", pkg.name),
                None => pkg.name.clone(),
            }
        );
    }
    if out.contains("E404") {
        return format!("{pkg}: no such package on the npm registry");
    }
    if out.contains("ETARGET") {
        return format!("{pkg}: the npm registry has no such version of it");
    }
    if network_failed(out) {
        return format!(
            "{pkg}: the npm registry cannot be reached (network unavailable?); install from a cache with --from DIR\n{}",
            tail(out)
        );
    }
    format!("{pkg}: npm install failed:\n{}", tail(out))
}

/// The node the sandbox runs: `node` on `$PATH`. One under `/usr` is in
/// every sandbox already; one elsewhere (e.g. `/opt/node/bin/node`) is
/// mounted read-only with its installation prefix, at the same path.
pub(crate) fn interpreter() -> Result<(String, Option<Mount>), StoreError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            StoreError::Refused(
                "node is not installed on this host (Debian: apt install nodejs)".into(),
            )
        })?;
    let real = found
        .canonicalize()
        .map_err(io(format!("resolve {}", found.display())))?;
    if real.starts_with("/usr") {
        let shown = if found.starts_with("/usr") {
            &found
        } else {
            &real
        };
        return Ok((shown.to_string_lossy().into_owned(), None));
    }
    // <prefix>/bin/node
    let prefix: PathBuf = real
        .parent()
        .and_then(Path::parent)
        .filter(|p| p.parent().is_some())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            StoreError::Refused(format!(
                "node at {} has no installation prefix",
                real.display()
            ))
        })?;
    let first = prefix
        .components()
        .nth(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    if matches!(first.as_str(), "tmp" | "proc" | "dev" | "sys" | "etc") {
        return Err(StoreError::Refused(format!(
            "node at {} cannot be mounted into a sandbox at the same path ({}): install node under /usr or /opt",
            real.display(),
            prefix.display()
        )));
    }
    Ok((
        real.to_string_lossy().into_owned(),
        Some(Mount {
            src: prefix.clone(),
            dst: prefix,
            rw: false,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "x",
            "server-memory",
            "@modelcontextprotocol/server-memory",
            "a.b_c~d",
        ] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "", "X", "-x", ".x", "@x", "@x/", "a/b", "x y", "file:x", "../x", "@a/b/c",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn bin_entries() {
        let pkg = PackageRef::parse("npm:@s/server-x@1.0.0").unwrap();
        let e = |v: serde_json::Value| entry_script(&pkg, &serde_json::json!({ "bin": v }));
        assert_eq!(
            e(serde_json::json!("./dist/index.js")).unwrap(),
            "dist/index.js"
        );
        assert_eq!(
            e(serde_json::json!({"mcp-x": "dist/a.js"})).unwrap(),
            "dist/a.js"
        );
        assert_eq!(
            e(serde_json::json!({"a": "a.js", "server-x": "x.js"})).unwrap(),
            "x.js"
        );
        assert!(e(serde_json::json!({"a": "a.js", "b": "b.js"})).is_err());
        assert!(e(serde_json::json!("../../etc/passwd")).is_err());
        assert!(e(serde_json::json!("/usr/bin/env")).is_err());
        let none = entry_script(&pkg, &serde_json::json!({})).unwrap_err();
        assert!(none.to_string().contains("no `bin`"), "{none}");
    }
}
