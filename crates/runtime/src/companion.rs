//! Files cordon runs beside itself (the Wasm runner, the Wasm probe
//! module, the microVM guest's init): given by an option, else by a variable, else looked for at
//! fixed places relative to the running program.

use std::path::{Path, PathBuf};

/// `opt`, else `$env`, else the first of `beside` (relative to the
/// directory of this program) that is a file; canonical. The error names
/// `what`, every place looked at, and `hint`.
pub fn find(
    opt: Option<&Path>,
    env: &str,
    beside: &[PathBuf],
    what: &str,
    hint: &str,
) -> Result<PathBuf, String> {
    find_where(opt, env, beside, |_| true, what, hint)
}

/// [`find`] of a file `fits` accepts (a file that does not is passed
/// over, as one that does not exist is).
pub fn find_where(
    opt: Option<&Path>,
    env: &str,
    beside: &[PathBuf],
    fits: impl Fn(&Path) -> bool,
    what: &str,
    hint: &str,
) -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = opt
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(env).map(PathBuf::from))
    {
        candidates.push(p);
    } else if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.extend(beside.iter().map(|b| dir.join(b)));
    }
    let found = candidates
        .iter()
        .find(|p| p.is_file() && fits(p))
        .ok_or_else(|| {
            format!(
                "no {what} (looked at {}); {hint}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    std::fs::canonicalize(found).map_err(|e| format!("{}: {e}", found.display()))
}
