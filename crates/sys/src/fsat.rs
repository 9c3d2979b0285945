//! Descriptor-relative file system calls for building a tree inside one
//! directory that must never be left (an image's rootfs).
//!
//! Paths inside the tree are resolved only by [`open_dir_in_root`]
//! (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`: `..` and symlinks, absolute or relative, resolve as if
//! the tree's top were `/`). Every other call takes a directory descriptor
//! and one [`Name`], a single path component, and never follows a symlink
//! at that name: creation is exclusive (`O_EXCL`, `mkdirat`, `symlinkat`,
//! `linkat` without `AT_SYMLINK_FOLLOW`, `mknodat`), opening uses
//! `O_NOFOLLOW`, `stat` and `utimensat` use `AT_SYMLINK_NOFOLLOW`.
//!
//! Nothing here is `unsafe`: nix's safe wrappers cover `openat2`, the
//! `*at` calls and `readdir`, so raw calls would only duplicate them.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::UnlinkatFlags;

/// One path component: not empty, no `/` or NUL byte, not `.` or `..`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Name(CString);

impl Name {
    /// `None` when `bytes` is not a single component.
    pub fn new(bytes: &[u8]) -> Option<Name> {
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return None;
        }
        CString::new(bytes).ok().map(Name)
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// The type of a file, as `lstat` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    /// Sockets and device nodes.
    Other,
}

/// What `lstat` (or `fstat`) says about a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    pub dev: u64,
    pub ino: u64,
    /// Permission bits and setuid, setgid and sticky (`& 0o7777`).
    pub mode: u32,
    pub nlink: u64,
}

impl Stat {
    fn from(st: FileStat) -> Stat {
        let fmt = st.st_mode & libc::S_IFMT;
        let kind = match fmt {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            _ => Kind::Other,
        };
        Stat {
            kind,
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode & 0o7777,
            nlink: st.st_nlink,
        }
    }
}

/// Open the top of the tree (`O_PATH | O_DIRECTORY`). The path is the
/// caller's and is resolved as usual.
pub fn open_root(path: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// How [`open_dir_in_root`] opens the directory it resolves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirOpen {
    /// `O_PATH`: enough for the `*at` calls; a symlink at the last
    /// component is followed (inside the root).
    Path,
    /// `O_RDONLY`, for listing, `fchmod` and `futimens`; a symlink at the
    /// last component is followed (inside the root).
    Read,
    /// `O_RDONLY | O_NOFOLLOW`: fails with `ELOOP` when the last component
    /// is a symlink.
    ReadNoFollow,
}

/// Resolve `path` (components joined by `/`; empty is `root` itself) inside
/// `root` as if `root` were `/`, and open the directory it names.
/// `openat2(2)` needs Linux 5.6; older kernels give `ENOSYS`.
pub fn open_dir_in_root(
    root: BorrowedFd<'_>,
    path: &[Name],
    how: DirOpen,
) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_DIRECTORY
        | OFlag::O_CLOEXEC
        | match how {
            DirOpen::Path => OFlag::O_PATH,
            DirOpen::Read => OFlag::O_RDONLY,
            DirOpen::ReadNoFollow => OFlag::O_RDONLY | OFlag::O_NOFOLLOW,
        };
    open_in_root(root, path, flags)
}

/// Resolve `path` inside `root` as [`open_dir_in_root`] does and open the
/// regular file it names for reading: opened without blocking (a FIFO or a
/// device does not hang the open) and refused with `EINVAL` unless it is a
/// regular file; the descriptor is then made blocking again for reading.
pub fn open_file_in_root(root: BorrowedFd<'_>, path: &[Name]) -> Result<File, Errno> {
    if path.is_empty() {
        return Err(Errno::EINVAL);
    }
    let fd = open_in_root(
        root,
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
    )?;
    if stat(fd.as_fd())?.kind != Kind::File {
        return Err(Errno::EINVAL);
    }
    crate::io::set_nonblocking(fd.as_fd(), false)?;
    Ok(File::from(fd))
}

/// `openat2(root, path, flags)` resolved in the root (see the module docs).
fn open_in_root(root: BorrowedFd<'_>, path: &[Name], flags: OFlag) -> Result<OwnedFd, Errno> {
    let mut joined = Vec::with_capacity(path.iter().map(|n| n.as_bytes().len() + 1).sum());
    for (i, n) in path.iter().enumerate() {
        if i > 0 {
            joined.push(b'/');
        }
        joined.extend_from_slice(n.as_bytes());
    }
    if joined.is_empty() {
        joined.push(b'.');
    }
    // Components hold no NUL byte, so neither does their join.
    let joined = CString::new(joined).map_err(|_| Errno::EINVAL)?;
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_IN_ROOT
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    );
    // EAGAIN: a rename elsewhere raced the lookup; the kernel asks for a
    // retry.
    let mut tries = 0;
    loop {
        match nix::fcntl::openat2(root, joined.as_c_str(), how) {
            Err(Errno::EAGAIN) | Err(Errno::EINTR) if tries < 32 => tries += 1,
            r => return r,
        }
    }
}

/// `fstat`.
pub fn stat(fd: BorrowedFd<'_>) -> Result<Stat, Errno> {
    nix::sys::stat::fstat(fd).map(Stat::from)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &Name) -> Result<Stat, Errno> {
    nix::sys::stat::fstatat(dir, name.0.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map(Stat::from)
}

/// `mkdirat` (the umask applies to `mode`).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &Name, mode: u32) -> Result<(), Errno> {
    nix::sys::stat::mkdirat(dir, name.0.as_c_str(), Mode::from_bits_truncate(mode))
}

/// Open the directory `name` in `dir` for reading, never through a symlink
/// (`O_RDONLY | O_DIRECTORY | O_NOFOLLOW`).
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &Name) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat(
        dir,
        name.0.as_c_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The parent of the directory `dir` (`openat(dir, "..")`), for walking
/// back up a tree that was walked down by descriptor.
pub fn parent_dir(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat(
        dir,
        c"..",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Create the regular file `name` in `dir`, which must not exist yet
/// (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, opened for writing).
pub fn create_file_at(dir: BorrowedFd<'_>, name: &Name) -> Result<File, Errno> {
    nix::fcntl::openat(
        dir,
        name.0.as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map(File::from)
}

/// Create the FIFO `name` in `dir` (mode 0600).
pub fn mkfifo_at(dir: BorrowedFd<'_>, name: &Name) -> Result<(), Errno> {
    nix::sys::stat::mknodat(
        dir,
        name.0.as_c_str(),
        SFlag::S_IFIFO,
        Mode::from_bits_truncate(0o600),
        0,
    )
}

/// Open the FIFO `name` in `dir` without blocking and without following a
/// symlink (`O_RDONLY | O_NONBLOCK | O_NOFOLLOW`), for `fchmod` and
/// `futimens`; `EINVAL` if it is not a FIFO.
pub fn open_fifo_at(dir: BorrowedFd<'_>, name: &Name) -> Result<File, Errno> {
    let fd = nix::fcntl::openat(
        dir,
        name.0.as_c_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if stat(fd.as_fd())?.kind != Kind::Fifo {
        return Err(Errno::EINVAL);
    }
    Ok(File::from(fd))
}

/// `symlinkat(target, dir, name)`; `target` is stored as is (never
/// resolved here). `EINVAL` if it is empty or holds a NUL byte.
pub fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &Name) -> Result<(), Errno> {
    if target.is_empty() {
        return Err(Errno::EINVAL);
    }
    let target = CString::new(target).map_err(|_| Errno::EINVAL)?;
    nix::unistd::symlinkat(target.as_c_str(), dir, name.0.as_c_str())
}

/// `linkat(old_dir, old, new_dir, new, 0)`: a symlink at `old` is linked
/// itself, never followed.
pub fn link_at(
    old_dir: BorrowedFd<'_>,
    old: &Name,
    new_dir: BorrowedFd<'_>,
    new: &Name,
) -> Result<(), Errno> {
    nix::unistd::linkat(
        old_dir,
        old.0.as_c_str(),
        new_dir,
        new.0.as_c_str(),
        AtFlags::empty(),
    )
}

/// `unlinkat`; `dir_entry` removes an (empty) directory.
pub fn unlink_at(dir: BorrowedFd<'_>, name: &Name, dir_entry: bool) -> Result<(), Errno> {
    let flag = if dir_entry {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    nix::unistd::unlinkat(dir, name.0.as_c_str(), flag)
}

/// Set the access and modification times of `name` in `dir` to `secs`
/// since the epoch, never following a symlink there.
pub fn set_times_at(dir: BorrowedFd<'_>, name: &Name, secs: i64) -> Result<(), Errno> {
    let t = TimeSpec::new(secs, 0);
    nix::sys::stat::utimensat(
        dir,
        name.0.as_c_str(),
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
}

/// The entries of the directory `dir` (any descriptor of it, `O_PATH`
/// included), without `.` and `..`, each with its type when the file system
/// reports one in the listing.
pub fn list_dir(dir: BorrowedFd<'_>) -> Result<Vec<(Name, Option<Kind>)>, Errno> {
    let mut d = Dir::openat(
        dir,
        c".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let Some(name) = Name::new(e.file_name().to_bytes()) else {
            continue;
        };
        let kind = e.file_type().map(|t| match t {
            Type::Directory => Kind::Dir,
            Type::File => Kind::File,
            Type::Symlink => Kind::Symlink,
            Type::Fifo => Kind::Fifo,
            _ => Kind::Other,
        });
        out.push((name, kind));
    }
    Ok(out)
}
