//! What a dynamically linked host program needs to run where the host's
//! libraries are not (an image root): its ELF loader (`PT_INTERP`) and the
//! shared libraries its `DT_NEEDED` entries name, transitively, found as
//! the loader would find them on this host (`DT_RUNPATH`/`DT_RPATH` with
//! `$ORIGIN`, the directories of `/etc/ld.so.conf`, the loader's own
//! directory, then the usual system directories), each the first file of
//! that name that is an ELF object of the program's class and machine.
//!
//! Read from the files only: nothing is run.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const PT_LOAD: u64 = 1;
const PT_DYNAMIC: u64 = 2;
const PT_INTERP: u64 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;
/// More shared objects than any real program loads.
const MAX_OBJECTS: usize = 256;

/// The parts of an ELF file that say what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elf {
    /// `ELFCLASS64`.
    pub wide: bool,
    /// `e_machine`.
    pub machine: u16,
    /// `PT_INTERP`, if any.
    pub interp: Option<PathBuf>,
    /// `DT_NEEDED`, in order.
    pub needed: Vec<String>,
    /// `DT_RUNPATH` (or `DT_RPATH` without it), split on `:`.
    pub runpath: Vec<String>,
}

/// Where a number sits in a structure, by class: (offset, width).
struct Field(usize, usize, usize, usize);

impl Field {
    fn at(&self, wide: bool) -> (usize, usize) {
        if wide {
            (self.2, self.3)
        } else {
            (self.0, self.1)
        }
    }
}

const E_PHOFF: Field = Field(0x1c, 4, 0x20, 8);
const E_PHENTSIZE: Field = Field(0x2a, 2, 0x36, 2);
const E_PHNUM: Field = Field(0x2c, 2, 0x38, 2);
const P_OFFSET: Field = Field(4, 4, 8, 8);
const P_VADDR: Field = Field(8, 4, 16, 8);
const P_FILESZ: Field = Field(16, 4, 32, 8);

struct Reader {
    file: fs::File,
    le: bool,
    wide: bool,
}

impl Reader {
    fn bytes(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, off)?;
        Ok(b)
    }

    fn num(&self, b: &[u8], at: usize, len: usize) -> io::Result<u64> {
        let bytes = b
            .get(at..at + len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "truncated ELF structure"))?;
        let fold = |acc: u64, x: &u8| (acc << 8) | u64::from(*x);
        Ok(if self.le {
            bytes.iter().rev().fold(0, fold)
        } else {
            bytes.iter().fold(0, fold)
        })
    }

    fn field(&self, b: &[u8], f: &Field) -> io::Result<u64> {
        let (at, len) = f.at(self.wide);
        self.num(b, at, len)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A NUL-terminated string at `at` of `table`.
fn string_at(table: &[u8], at: u64) -> io::Result<String> {
    let rest = usize::try_from(at)
        .ok()
        .and_then(|a| table.get(a..))
        .ok_or_else(|| bad("string outside the string table"))?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| bad("unterminated string"))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Read the header, program headers and dynamic section of `path`.
pub(crate) fn read(path: &Path) -> io::Result<Elf> {
    let file = fs::File::open(path)?;
    let mut ident = [0u8; 64];
    let n = file.read_at(&mut ident, 0)?;
    if n < 52 || &ident[..4] != b"\x7fELF" {
        return Err(bad("not an ELF file"));
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(bad("unknown ELF class")),
    };
    let le = match ident[5] {
        1 => true,
        2 => false,
        _ => return Err(bad("unknown ELF byte order")),
    };
    let r = Reader { file, le, wide };
    let head = &ident[..n];
    let machine = r.num(head, 0x12, 2)? as u16;
    let phoff = r.field(head, &E_PHOFF)?;
    let phentsize = r.field(head, &E_PHENTSIZE)? as usize;
    let phnum = r.field(head, &E_PHNUM)? as usize;
    let min = if wide { 56 } else { 32 };
    if phnum > 0 && phentsize < min {
        return Err(bad("program headers too small"));
    }
    if phentsize * phnum > 1 << 16 {
        return Err(bad("program headers too large"));
    }
    let table = r.bytes(phoff, phentsize * phnum)?;
    let mut loads = Vec::new();
    let mut dynamic = None;
    let mut interp = None;
    for ph in table.chunks(phentsize.max(1)).take(phnum) {
        let ty = r.num(ph, 0, 4)?;
        let off = r.field(ph, &P_OFFSET)?;
        let vaddr = r.field(ph, &P_VADDR)?;
        let size = r.field(ph, &P_FILESZ)?;
        match ty {
            PT_LOAD => loads.push((vaddr, off, size)),
            PT_DYNAMIC => dynamic = Some((off, size)),
            PT_INTERP => {
                if !(2..=4096).contains(&size) {
                    return Err(bad("bad PT_INTERP size"));
                }
                let s = r.bytes(off, size as usize)?;
                let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
                interp = Some(PathBuf::from(OsStr::from_bytes(&s[..end])));
            }
            _ => {}
        }
    }
    let mut elf = Elf {
        wide,
        machine,
        interp,
        needed: Vec::new(),
        runpath: Vec::new(),
    };
    let Some((off, size)) = dynamic else {
        return Ok(elf);
    };
    if size > 1 << 20 {
        return Err(bad("dynamic section too large"));
    }
    let dynsec = r.bytes(off, size as usize)?;
    let entry = if wide { 16 } else { 8 };
    let word = entry / 2;
    let (mut strtab, mut strsz) = (None, None);
    let (mut needed, mut runpath, mut rpath) = (Vec::new(), None, None);
    for d in dynsec.chunks(entry) {
        if d.len() < entry {
            break;
        }
        let tag = r.num(d, 0, word)?;
        let val = r.num(d, word, word)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed.push(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            DT_RUNPATH => runpath = Some(val),
            DT_RPATH => rpath = Some(val),
            _ => {}
        }
    }
    if needed.is_empty() && runpath.is_none() && rpath.is_none() {
        return Ok(elf);
    }
    let (Some(strtab), Some(strsz)) = (strtab, strsz) else {
        return Err(bad("dynamic section without a string table"));
    };
    if strsz > 1 << 24 {
        return Err(bad("string table too large"));
    }
    // DT_STRTAB is an address: the file offset is in the segment that
    // loads it.
    let at = loads
        .iter()
        .find(|(vaddr, _, size)| strtab >= *vaddr && strtab < vaddr + size)
        .map(|(vaddr, off, _)| strtab - vaddr + off)
        .ok_or_else(|| bad("string table outside every loaded segment"))?;
    let strings = r.bytes(at, strsz as usize)?;
    for n in needed {
        elf.needed.push(string_at(&strings, n)?);
    }
    if let Some(p) = runpath.or(rpath) {
        elf.runpath = string_at(&strings, p)?
            .split(':')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
    }
    Ok(elf)
}

/// A program's loader and libraries on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closure {
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
pub(crate) fn closure(exe: &Path) -> Result<Closure, String> {
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
