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
    // (Addresses, offsets and sizes are the file's: any u64, so no sum may overflow.)
    let at = h
        .loads
        .iter()
        .find(|(vaddr, _, size)| strtab >= *vaddr && strtab - vaddr < *size)
        .and_then(|(vaddr, off, _)| (strtab - vaddr).checked_add(*off))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit little-endian ELF file: one `PT_LOAD` at `load_vaddr` (the whole file), a
    /// `PT_INTERP`, and a `PT_DYNAMIC` naming `libc.so.6` and a run path, its `DT_STRTAB`
    /// at `strtab_vaddr` (`None`: where the load puts the string table).
    fn elf(load_vaddr: u64, load_size: Option<u64>, strtab_vaddr: Option<u64>) -> Vec<u8> {
        let interp = b"/lib64/ld-linux-x86-64.so.2\0";
        let strtab = b"\0libc.so.6\0/opt/lib:$ORIGIN\0";
        let phoff = 64u64;
        let interp_off = phoff + 3 * 56;
        let str_off = interp_off + interp.len() as u64;
        let dyn_off = str_off + strtab.len() as u64;
        let dynamic: [(u64, u64); 5] = [
            (DT_NEEDED, 1),
            (DT_RUNPATH, 11),
            (
                DT_STRTAB,
                strtab_vaddr.unwrap_or(load_vaddr.wrapping_add(str_off)),
            ),
            (DT_STRSZ, strtab.len() as u64),
            (DT_NULL, 0),
        ];
        let total = dyn_off + 16 * dynamic.len() as u64;
        let mut f = b"\x7fELF\x02\x01\x01".to_vec();
        f.resize(16, 0);
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&0x3eu16.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        f.extend_from_slice(&phoff.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        for v in [64u16, 56, 3, 64, 0, 0] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        let mut ph = |ty: u64, off: u64, vaddr: u64, size: u64| {
            f.extend_from_slice(&(ty as u32).to_le_bytes());
            f.extend_from_slice(&5u32.to_le_bytes());
            for v in [off, vaddr, vaddr, size, size, 0x1000] {
                f.extend_from_slice(&v.to_le_bytes());
            }
        };
        ph(PT_LOAD, 0, load_vaddr, load_size.unwrap_or(total));
        ph(PT_INTERP, interp_off, 0, interp.len() as u64);
        ph(PT_DYNAMIC, dyn_off, 0, 16 * dynamic.len() as u64);
        f.extend_from_slice(interp);
        f.extend_from_slice(strtab);
        for (t, v) in dynamic {
            f.extend_from_slice(&t.to_le_bytes());
            f.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(f.len() as u64, total);
        f
    }

    fn read_bytes(b: &[u8]) -> io::Result<Elf> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("prog");
        fs::write(&p, b).unwrap();
        read(&p)
    }

    #[test]
    fn a_dynamic_program() {
        let e = read_bytes(&elf(0x40_0000, None, None)).unwrap();
        assert!(e.wide);
        assert_eq!(e.machine, 0x3e);
        assert_eq!(e.interp, Some(PathBuf::from("/lib64/ld-linux-x86-64.so.2")));
        assert_eq!(e.needed, ["libc.so.6"]);
        assert_eq!(e.runpath, ["/opt/lib", "$ORIGIN"]);
    }

    #[test]
    fn a_segment_at_the_top_of_the_address_space_is_no_overflow() {
        // The load's end is past u64::MAX: the string table is found in it all the same.
        let top = u64::MAX - 0x1000;
        let e = read_bytes(&elf(top, Some(0x2000), None)).unwrap();
        assert_eq!(e.needed, ["libc.so.6"]);
        // Below it: in no loaded segment.
        let e = read_bytes(&elf(top, Some(0x2000), Some(top - 1))).unwrap_err();
        assert_eq!(e.to_string(), "string table outside every loaded segment");
    }
}
