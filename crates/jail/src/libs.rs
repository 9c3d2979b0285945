//! What a dynamically linked host program needs to run where the host's
//! libraries are not (an image root): its ELF loader (`PT_INTERP`) and the
//! shared libraries its `DT_NEEDED` entries name, transitively, found as
//! the loader would find them on this host (`DT_RUNPATH`/`DT_RPATH` with
//! `$ORIGIN`, the directories of `/etc/ld.so.conf`, the loader's own
//! directory, then the usual system directories), each the first file of
//! that name that is an ELF object of the program's class and machine.
//!
//! Read from the files only ([`crate::elf`]): nothing is run.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::elf::read;

/// More shared objects than any real program loads.
const MAX_OBJECTS: usize = 256;

/// A program's loader and libraries on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closure {
    /// The loader (`PT_INTERP`, resolved on the host), or `None` for a
    /// static program.
    pub loader: Option<PathBuf>,
    /// Each shared object by the name the program or another object asks
    /// for it, and the host file that is.
    pub libs: Vec<(String, PathBuf)>,
}

/// Directories of `/etc/ld.so.conf`, following `include` lines (a `*` in
/// the last component of a pattern is a wildcard).
fn ld_so_conf(path: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(pat) = line.strip_prefix("include").map(str::trim) {
            if depth > 4 {
                continue;
            }
            let pat = Path::new(pat);
            let pat = if pat.is_absolute() {
                pat.to_path_buf()
            } else {
                path.parent().unwrap_or(Path::new("/")).join(pat)
            };
            for f in glob_last(&pat) {
                ld_so_conf(&f, depth + 1, out);
            }
        } else if line.starts_with('/') {
            out.push(PathBuf::from(line));
        }
    }
}

/// The files matching `pat`, whose last component may hold `*`s, sorted.
fn glob_last(pat: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (pat.parent(), pat.file_name().and_then(OsStr::to_str)) else {
        return Vec::new();
    };
    if !name.contains('*') {
        return vec![pat.to_path_buf()];
    }
    let parts: Vec<&str> = name.split('*').collect();
    let matches = |n: &str| {
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if !n.starts_with(first) || n.len() < first.len() + last.len() || !n.ends_with(last) {
            return false;
        }
        let mut rest = &n[first.len()..n.len() - last.len()];
        for p in &parts[1..parts.len() - 1] {
            match rest.find(p) {
                Some(i) => rest = &rest[i + p.len()..],
                None => return false,
            }
        }
        true
    };
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(matches))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The directories searched after an object's own run path.
fn system_dirs(loader: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    ld_so_conf(Path::new("/etc/ld.so.conf"), 0, &mut dirs);
    if let Some(d) = fs::canonicalize(loader)
        .ok()
        .and_then(|l| l.parent().map(Path::to_path_buf))
    {
        dirs.push(d);
    }
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    for base in ["/lib", "/usr/lib"] {
        dirs.push(Path::new(base).join(&triple));
    }
    for d in ["/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
        dirs.push(PathBuf::from(d));
    }
    let mut seen = BTreeSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The loader and shared libraries `exe` needs, found on this host.
pub fn closure(exe: &Path) -> Result<Closure, String> {
    let top = read(exe).map_err(|e| format!("read {}: {e}", exe.display()))?;
    let Some(interp) = top.interp.clone() else {
        return Ok(Closure {
            loader: None,
            libs: Vec::new(),
        });
    };
    let loader = fs::canonicalize(&interp)
        .map_err(|e| format!("the loader {} of {}: {e}", interp.display(), exe.display()))?;
    let loader_name = interp
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let system = system_dirs(&interp);
    let mut libs: Vec<(String, PathBuf)> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::from([loader_name]);
    let mut queue: VecDeque<(String, PathBuf, Vec<String>)> = top
        .needed
        .iter()
        .map(|n| (n.clone(), exe.to_path_buf(), top.runpath.clone()))
        .collect();
    while let Some((name, from, runpath)) = queue.pop_front() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if libs.len() >= MAX_OBJECTS {
            return Err(format!(
                "{}: more than {MAX_OBJECTS} shared objects",
                exe.display()
            ));
        }
        let origin = from.parent().unwrap_or(Path::new("/")).to_path_buf();
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![PathBuf::from(&name)]
        } else {
            runpath
                .iter()
                .map(|d| {
                    let d = d
                        .replace("${ORIGIN}", &origin.to_string_lossy())
                        .replace("$ORIGIN", &origin.to_string_lossy());
                    PathBuf::from(d).join(&name)
                })
                .chain(system.iter().map(|d| d.join(&name)))
                .collect()
        };
        let found = candidates.into_iter().find_map(|c| match read(&c) {
            Ok(e) if e.wide == top.wide && e.machine == top.machine => Some((c, e)),
            _ => None,
        });
        let Some((path, lib)) = found else {
            return Err(format!(
                "{}: shared library {name} (needed by {}) not found on this host",
                exe.display(),
                from.display()
            ));
        };
        let host = fs::canonicalize(&path).unwrap_or(path);
        for n in &lib.needed {
            queue.push_back((n.clone(), host.clone(), lib.runpath.clone()));
        }
        // A name with a slash is opened as that path; in the sandbox it is
        // offered by its file name in the library directory.
        let name = Path::new(&name)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(name);
        libs.push((name, host));
    }
    Ok(Closure {
        loader: Some(loader),
        libs,
    })
}

/// The directories, by every path the loader may take to them, that hold
/// `exe`'s loader and libraries on this host: their own (canonical)
/// directories, the directory of the loader's path as `exe` names it
/// (`/lib64` for `/lib64/ld-linux-x86-64.so.2`), and each system library
/// directory that is one of them by another path (`/lib/x86_64-linux-gnu`
/// where `/lib` links to `/usr/lib`). Bound read-only at those paths with
/// `/etc/ld.so.cache`, they are all a program's loader needs (QEMU's root
/// in a microVM's helper).
pub fn dirs(exe: &Path) -> Result<Vec<PathBuf>, String> {
    let c = closure(exe)?;
    let own: BTreeSet<PathBuf> = c
        .libs
        .iter()
        .map(|(_, p)| p)
        .chain(c.loader.iter())
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect();
    let top = read(exe).map_err(|e| format!("read {}: {e}", exe.display()))?;
    let mut out: Vec<PathBuf> = own.iter().cloned().collect();
    if let Some(interp) = &top.interp {
        if let Some(d) = interp.parent() {
            out.push(d.to_path_buf());
        }
        for d in system_dirs(interp) {
            if let Ok(real) = fs::canonicalize(&d)
                && own.contains(&real)
            {
                out.push(d);
            }
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|d| seen.insert(d.clone()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_program_and_its_libraries() {
        let exe = std::env::current_exe().unwrap();
        let elf = read(&exe).unwrap();
        let Some(interp) = elf.interp.clone() else {
            // A static test binary needs nothing.
            assert_eq!(closure(&exe).unwrap().loader, None);
            return;
        };
        assert!(elf.needed.iter().any(|n| n.starts_with("libc.")), "{elf:?}");
        let c = closure(&exe).unwrap();
        assert_eq!(c.loader, Some(fs::canonicalize(&interp).unwrap()));
        let libc = c
            .libs
            .iter()
            .find(|(n, _)| n.starts_with("libc."))
            .expect("libc in the closure");
        assert!(libc.1.is_file(), "{c:?}");
        // Each library once, the loader not among them.
        let names: BTreeSet<&String> = c.libs.iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), c.libs.len());
        let ln = interp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!names.contains(&ln), "{c:?}");
        // The loader itself is static: no loader, no libraries.
        let l = read(c.loader.as_ref().unwrap()).unwrap();
        assert_eq!(l.interp, None);
    }

    #[test]
    fn not_elf_and_missing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("script");
        fs::write(&p, "#!/bin/sh\n").unwrap();
        assert!(read(&p).is_err());
        assert!(closure(&p).unwrap_err().contains("not an ELF file"));
        assert!(read(&d.path().join("nope")).is_err());
    }

    #[test]
    fn include_patterns() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("conf.d")).unwrap();
        fs::write(d.path().join("conf.d/a.conf"), "/opt/a # comment\n").unwrap();
        fs::write(d.path().join("conf.d/b.conf"), "include ../more\n/opt/b\n").unwrap();
        fs::write(d.path().join("conf.d/c.txt"), "/opt/c\n").unwrap();
        fs::write(d.path().join("more"), "/opt/more\n").unwrap();
        fs::write(
            d.path().join("ld.so.conf"),
            format!("include {}/conf.d/*.conf\n", d.path().display()),
        )
        .unwrap();
        let mut out = Vec::new();
        ld_so_conf(&d.path().join("ld.so.conf"), 0, &mut out);
        assert_eq!(
            out,
            [PathBuf::from("/opt/a"), "/opt/more".into(), "/opt/b".into()]
        );
    }
}
