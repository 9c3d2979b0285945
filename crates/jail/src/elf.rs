//! Reading ELF files for what a program needs to run, from its headers
//! only (nothing is run): its class and machine, its loader (`PT_INTERP`),
//! and the shared objects (`DT_NEEDED`) and run path (`DT_RUNPATH` or
//! `DT_RPATH`) of its dynamic section. The preflight reads the loader (it
//! must exist inside the sandbox); the probes read the rest too (the
//! libraries a host program takes into an image root).

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
/// The size of the larger (64-bit) ELF header.
const HEADER_BYTES: usize = 64;

/// The parts of an ELF file that say what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elf {
    /// `ELFCLASS64`.
    pub wide: bool,
    /// `e_machine`.
    pub machine: u16,
    /// `PT_INTERP` (the first, as the kernel takes it), if any.
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

/// An ELF file read by its class and byte order.
struct Reader<'f> {
    file: &'f fs::File,
    le: bool,
    wide: bool,
}

impl Reader<'_> {
    /// `len` bytes at `off` of the file.
    fn bytes(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, off)?;
        Ok(b)
    }

    /// The number of `len` bytes at `at` of `b`.
    fn num(&self, b: &[u8], at: usize, len: usize) -> io::Result<u64> {
        let bytes = b.get(at..at + len).ok_or_else(|| bad("truncated header"))?;
        let fold = |acc: u64, x: &u8| (acc << 8) | u64::from(*x);
        Ok(if self.le {
            bytes.iter().rev().fold(0, fold)
        } else {
            bytes.iter().fold(0, fold)
        })
    }

    /// The number `f` of the structure `b`.
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

/// What the ELF header and the program headers of a file say.
struct Headers<'f> {
    r: Reader<'f>,
    machine: u16,
    /// `PT_LOAD` segments: (address, file offset, size in the file).
    loads: Vec<(u64, u64, u64)>,
    /// `PT_DYNAMIC`: (file offset, size).
    dynamic: Option<(u64, u64)>,
    interp: Option<PathBuf>,
}

/// Read the ELF header of `file` from `head` (its first bytes) and its
/// program headers.
fn headers<'f>(file: &'f fs::File, head: &[u8]) -> io::Result<Headers<'f>> {
    if !head.starts_with(b"\x7fELF") {
        return Err(bad("not an ELF file"));
    }
    let le = match head.get(5) {
        Some(1) => true,
        Some(2) => false,
        _ => return Err(bad("unknown byte order")),
    };
    let wide = match head.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err(bad("unknown class")),
    };
    let r = Reader { file, le, wide };
    let machine = r.num(head, 0x12, 2)? as u16;
    let phoff = r.field(head, &E_PHOFF)?;
    let phentsize = r.field(head, &E_PHENTSIZE)? as usize;
    let phnum = r.field(head, &E_PHNUM)? as usize;
    let mut h = Headers {
        r,
        machine,
        loads: Vec::new(),
        dynamic: None,
        interp: None,
    };
    if phnum == 0 {
        return Ok(h);
    }
    let min = if wide { 56 } else { 32 };
    if phentsize < min {
        return Err(bad("program headers too small"));
    }
    if phentsize * phnum > 1 << 16 {
        return Err(bad("program headers too large"));
    }
    let table =
        h.r.bytes(phoff, phentsize * phnum)
            .map_err(|e| bad(&format!("program headers: {e}")))?;
    for ph in table.chunks(phentsize) {
        let ty = h.r.num(ph, 0, 4)?;
        let off = h.r.field(ph, &P_OFFSET)?;
        let vaddr = h.r.field(ph, &P_VADDR)?;
        let size = h.r.field(ph, &P_FILESZ)?;
        match ty {
            PT_LOAD => h.loads.push((vaddr, off, size)),
            PT_DYNAMIC => h.dynamic = Some((off, size)),
            PT_INTERP if h.interp.is_none() => {
                if !(2..=4096).contains(&size) {
                    return Err(bad("bad PT_INTERP size"));
                }
                let s =
                    h.r.bytes(off, size as usize)
                        .map_err(|e| bad(&format!("PT_INTERP: {e}")))?;
                let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
                h.interp = Some(PathBuf::from(OsStr::from_bytes(&s[..end])));
            }
            _ => {}
        }
    }
    Ok(h)
}

/// The `PT_INTERP` loader of the ELF file `file` whose first bytes are
/// `head` (`None`: a static program); only its headers are read.
pub fn loader(file: &fs::File, head: &[u8]) -> io::Result<Option<PathBuf>> {
    Ok(headers(file, head)?.interp)
}

/// Read the header, program headers and dynamic section of `path`.
pub fn read(path: &Path) -> io::Result<Elf> {
    let file = fs::File::open(path)?;
    let mut head = [0u8; HEADER_BYTES];
    let mut n = 0;
    while n < head.len() {
        match file.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut h = headers(&file, &head[..n])?;
    let mut elf = Elf {
        wide: h.r.wide,
        machine: h.machine,
        interp: h.interp.take(),
        needed: Vec::new(),
        runpath: Vec::new(),
    };
    dynamic_section(&h, &mut elf)?;
    Ok(elf)
}

/// `DT_NEEDED` and the run path of the dynamic section, if there is one.
fn dynamic_section(h: &Headers, elf: &mut Elf) -> io::Result<()> {
    let Some((off, size)) = h.dynamic else {
        return Ok(());
    };
    if size > 1 << 20 {
        return Err(bad("dynamic section too large"));
    }
    let r = &h.r;
    let dynsec = r.bytes(off, size as usize)?;
    let entry = if r.wide { 16 } else { 8 };
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
        return Ok(());
    }
    let (Some(strtab), Some(strsz)) = (strtab, strsz) else {
        return Err(bad("dynamic section without a string table"));
    };
    if strsz > 1 << 24 {
        return Err(bad("string table too large"));
    }
    // DT_STRTAB is an address: the file offset is in the segment that
    // loads it.
    let at = h
        .loads
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
    Ok(())
}
