//! A template's RAM file with its zero pages made holes.
//!
//! QEMU's file-backed guest memory holds every page the guest touched,
//! including the many it only zeroed (the kernel clears memory it hands
//! out, and frees it again). Those pages read as zeros from a hole just as
//! well, so once the template has stopped each run of all-zero pages in
//! the file's data extents is punched out (`fallocate(PUNCH_HOLE |
//! KEEP_SIZE)`): the file keeps its size and content, takes less disk and
//! page cache, and its sparse digest covers only the pages that hold
//! something. Done before the file is hashed and recorded, never after.

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{FallocateFlags, SeekFrom};

/// The unit punched: the guest's page size, a multiple of every file
/// system block size QEMU's memory files live on.
pub const PAGE: usize = 4096;

/// What [`punch_zero_pages`] made holes of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Punched {
    /// All-zero pages found in data extents and punched.
    pub pages: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Punch every page-aligned, all-zero page of `path`'s data extents into a
/// hole, keeping the file's size and content. A file system that cannot
/// tell holes from data or cannot punch them leaves the file as it was
/// (`Ok` with nothing punched: a smaller file is an economy, not a
/// guarantee).
pub fn punch_zero_pages(path: &Path) -> io::Result<Punched> {
    let f = fs::OpenOptions::new().read(true).write(true).open(path)?;
    let len = f.metadata()?.len();
    let zero = [0u8; PAGE];
    let mut buf = vec![0u8; 256 * PAGE];
    let mut out = Punched::default();
    let mut pos = 0u64;
    while pos < len {
        let data = match rustix::fs::seek(&f, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(&f, SeekFrom::Hole(data))
            .map_err(io::Error::from)?
            .min(len);
        // A run of zero pages not yet punched: (start, bytes).
        let mut run: Option<(u64, u64)> = None;
        let mut at = data;
        while at < hole {
            let want = usize::try_from((hole - at).min(buf.len() as u64)).unwrap_or(buf.len());
            f.read_exact_at(&mut buf[..want], at)?;
            for (i, page) in buf[..want].chunks(PAGE).enumerate() {
                let offset = at + (i * PAGE) as u64;
                let whole = page.len() == PAGE && offset.is_multiple_of(PAGE as u64);
                if whole && page == zero {
                    run = Some(match run {
                        Some((start, n)) => (start, n + PAGE as u64),
                        None => (offset, PAGE as u64),
                    });
                } else if let Some(r) = run.take()
                    && !punch(&f, r, &mut out)?
                {
                    return Ok(out);
                }
            }
            at += want as u64;
        }
        if let Some(r) = run.take()
            && !punch(&f, r, &mut out)?
        {
            return Ok(out);
        }
        pos = hole;
    }
    Ok(out)
}

/// Punch `(start, bytes)`; `false` when the file system cannot.
fn punch(f: &fs::File, (start, bytes): (u64, u64), out: &mut Punched) -> io::Result<bool> {
    match rustix::fs::fallocate(
        f,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        start,
        bytes,
    ) {
        Ok(()) => {
            out.pages += bytes / PAGE as u64;
            out.bytes += bytes;
            Ok(true)
        }
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn allocated(p: &Path) -> u64 {
        fs::metadata(p).unwrap().blocks() * 512
    }

    #[test]
    fn zero_pages_become_holes_and_the_content_stays() {
        let d = cordon_testkit::scratch();
        let p = d.path().join("ram");
        // 64 pages written: pages 0-9 zero, 10 data, 11-39 zero, 40 data
        // with a single non-zero byte at its end, 41-63 zero; then a hole
        // of 64 pages and a partial page of zeros at the end.
        let mut bytes = vec![0u8; 64 * PAGE];
        bytes[10 * PAGE..11 * PAGE].fill(0xab);
        bytes[41 * PAGE - 1] = 1;
        fs::write(&p, &bytes).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[0u8; 100], 128 * PAGE as u64).unwrap();
        drop(f);
        let before = fs::read(&p).unwrap();
        let used = allocated(&p);
        assert!(
            used >= 64 * PAGE as u64,
            "the control: written, not sparse ({used})"
        );

        let got = punch_zero_pages(&p).unwrap();
        assert_eq!(got.pages, 62, "{got:?}");
        assert_eq!(got.bytes, 62 * PAGE as u64);
        assert_eq!(fs::read(&p).unwrap(), before, "the content is the same");
        assert_eq!(fs::metadata(&p).unwrap().len(), before.len() as u64);
        let after = allocated(&p);
        assert!(
            after <= used - 62 * PAGE as u64,
            "allocated {used} -> {after}"
        );
        // Nothing left to punch the second time.
        assert_eq!(punch_zero_pages(&p).unwrap(), Punched::default());
    }
}
