//! The rootfs being written: every operation on it by descriptor, parents
//! resolved inside it, final components never followed.

use std::collections::HashSet;
use std::fs::{File, FileTimes, Permissions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime};

use cordon_sys::Errno;
use cordon_sys::fsat::{self, DirOpen, Kind, Name};

/// Why one entry could not be applied.
pub(super) enum Fail {
    /// The entry is refused (hostile or unusable), with why.
    Refuse(String),
    /// A file system call failed.
    Sys {
        what: &'static str,
        source: io::Error,
    },
    /// Reading the entry's data from the layer failed.
    Stream(io::Error),
    /// The file content written for the image passed `max_bytes`.
    Written,
}

pub(super) fn sys(what: &'static str) -> impl FnOnce(Errno) -> Fail {
    move |e| Fail::Sys {
        what,
        source: e.into(),
    }
}

pub(super) fn sys_io(what: &'static str) -> impl FnOnce(io::Error) -> Fail {
    move |source| Fail::Sys { what, source }
}

/// A resolved parent directory and its identity.
struct Parent {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

impl Parent {
    fn new(fd: OwnedFd) -> Result<Parent, Fail> {
        let st = fsat::stat(fd.as_fd()).map_err(sys("fstat of a parent directory"))?;
        Ok(Parent {
            fd,
            dev: st.dev,
            ino: st.ino,
        })
    }

    fn key(&self, name: &Name) -> (u64, u64, Name) {
        (self.dev, self.ino, name.clone())
    }
}

/// A directory whose times are set when the layer is done (creating its
/// children would change them again).
pub(super) struct PendingDir {
    pub(super) path: Vec<Name>,
    dev: u64,
    ino: u64,
    mtime: i64,
}

/// The latest modification time set, 9999-12-31T23:59:59Z: beyond it a
/// header's time is clamped.
const MAX_MTIME: i64 = 253_402_300_799;

pub(super) fn clamp_mtime(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX).min(MAX_MTIME)
}

fn times(mtime: i64) -> FileTimes {
    let t = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(mtime.max(0).unsigned_abs()))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    FileTimes::new().set_accessed(t).set_modified(t)
}

fn set_mode(f: &File, mode: u32, what: &'static str) -> Result<(), Fail> {
    f.set_permissions(Permissions::from_mode(mode))
        .map_err(sys_io(what))
}

fn set_times(f: &File, mtime: i64) -> Result<(), Fail> {
    f.set_times(times(mtime)).map_err(sys_io("setting times"))
}

/// Why resolving a parent path inside the rootfs failed.
fn resolve_fail(e: Errno) -> Fail {
    match e {
        Errno::ENOTDIR => Fail::Refuse("a parent on the way is not a directory".into()),
        Errno::ELOOP => Fail::Refuse("too many levels of symlinks on the way".into()),
        Errno::EXDEV => Fail::Refuse("the path crosses a mount point".into()),
        Errno::ENAMETOOLONG => Fail::Refuse("the path is too long".into()),
        Errno::ENOSYS => Fail::Sys {
            what: "openat2 (Linux 5.6 or later is needed)",
            source: e.into(),
        },
        e => Fail::Sys {
            what: "resolving the parent inside the rootfs",
            source: e.into(),
        },
    }
}

pub(super) struct Tree {
    root: OwnedFd,
    /// Names this layer created (or kept, for a directory it names), by
    /// the identity of their parent directory: a whiteout or an opaque
    /// marker of the same layer leaves them (they apply to lower layers
    /// only).
    layer: HashSet<(u64, u64, Name)>,
    dirs: Vec<PendingDir>,
}

impl Tree {
    pub(super) fn new(root: OwnedFd) -> Tree {
        Tree {
            root,
            layer: HashSet::new(),
            dirs: Vec::new(),
        }
    }

    fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The directory `comps` inside the rootfs, created (mode 0755) where
    /// missing.
    fn parent(&mut self, comps: &[Name]) -> Result<Parent, Fail> {
        match fsat::open_dir_in_root(self.root(), comps, DirOpen::Path) {
            Ok(fd) => return Parent::new(fd),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(resolve_fail(e)),
        }
        let mut cur = Parent::new(
            fsat::open_dir_in_root(self.root(), &[], DirOpen::Path).map_err(resolve_fail)?,
        )?;
        // Find the first component missing...
        let mut i = 0;
        while i < comps.len() {
            match fsat::open_dir_in_root(self.root(), &comps[..=i], DirOpen::Path) {
                Ok(fd) => cur = Parent::new(fd)?,
                Err(Errno::ENOENT) => break,
                Err(e) => return Err(resolve_fail(e)),
            }
            i += 1;
        }
        // ...and create it and the rest, each in the new (empty) directory
        // before it.
        for name in &comps[i..] {
            match fsat::mkdir_at(cur.fd.as_fd(), name, 0o700) {
                Ok(()) => {}
                Err(Errno::EEXIST) => {
                    return Err(Fail::Refuse(format!(
                        "the parent {:?} is a symlink to nothing",
                        String::from_utf8_lossy(name.as_bytes())
                    )));
                }
                Err(e) => return Err(sys("creating a parent directory")(e)),
            }
            self.layer.insert(cur.key(name));
            let fd =
                fsat::open_dir_at(cur.fd.as_fd(), name).map_err(sys("opening a new parent"))?;
            let f = File::from(fd);
            set_mode(&f, 0o755, "setting a new parent's mode")?;
            cur = Parent::new(OwnedFd::from(f))?;
        }
        Ok(cur)
    }

    /// The directory `comps` inside the rootfs if it exists.
    fn existing(&self, comps: &[Name]) -> Result<Option<Parent>, Fail> {
        match fsat::open_dir_in_root(self.root(), comps, DirOpen::Path) {
            Ok(fd) => Parent::new(fd).map(Some),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
            Err(e) => Err(resolve_fail(e)),
        }
    }

    /// Remove whatever `name` in `p` is (never following it; a directory
    /// with all it holds); nothing if it does not exist.
    fn clear(&self, p: &Parent, name: &Name) -> Result<(), Fail> {
        match fsat::stat_at(p.fd.as_fd(), name) {
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(sys("lstat of the existing name")(e)),
            Ok(st) if st.kind == Kind::Dir => {
                remove_tree(p.fd.as_fd(), name).map_err(sys("removing the existing directory"))
            }
            Ok(_) => fsat::unlink_at(p.fd.as_fd(), name, false)
                .map_err(sys("removing the existing name")),
        }
    }

    /// Run `make` (an exclusive create of `name` in `p`); if the name is
    /// taken, remove what is there and run it once more.
    fn replace<T>(
        &mut self,
        p: &Parent,
        name: &Name,
        what: &'static str,
        mut make: impl FnMut(BorrowedFd<'_>) -> Result<T, Errno>,
    ) -> Result<T, Fail> {
        let out = match make(p.fd.as_fd()) {
            Ok(v) => v,
            Err(Errno::EEXIST) => {
                self.clear(p, name)?;
                make(p.fd.as_fd()).map_err(sys(what))?
            }
            Err(e) => return Err(sys(what)(e)),
        };
        self.layer.insert(p.key(name));
        Ok(out)
    }

    /// A new regular file (mode 0600 until [`finish_file`]).
    pub(super) fn file(&mut self, parent: &[Name], name: &Name) -> Result<File, Fail> {
        let p = self.parent(parent)?;
        self.replace(&p, name, "creating the file", |d| {
            fsat::create_file_at(d, name)
        })
    }

    /// A directory: created, or kept (and its mode set) when one is there.
    pub(super) fn dir(
        &mut self,
        parent: &[Name],
        name: &Name,
        mode: u32,
        mtime: i64,
    ) -> Result<(), Fail> {
        let p = self.parent(parent)?;
        match fsat::mkdir_at(p.fd.as_fd(), name, 0o700) {
            Ok(()) => {}
            Err(Errno::EEXIST) => {
                let st =
                    fsat::stat_at(p.fd.as_fd(), name).map_err(sys("lstat of the existing name"))?;
                if st.kind != Kind::Dir {
                    self.clear(&p, name)?;
                    fsat::mkdir_at(p.fd.as_fd(), name, 0o700)
                        .map_err(sys("creating the directory"))?;
                }
            }
            Err(e) => return Err(sys("creating the directory")(e)),
        }
        self.layer.insert(p.key(name));
        let fd = fsat::open_dir_at(p.fd.as_fd(), name).map_err(sys("opening the directory"))?;
        let st = fsat::stat(fd.as_fd()).map_err(sys("fstat of the directory"))?;
        set_mode(&File::from(fd), mode, "setting the directory's mode")?;
        let mut path = parent.to_vec();
        path.push(name.clone());
        self.dirs.push(PendingDir {
            path,
            dev: st.dev,
            ino: st.ino,
            mtime,
        });
        Ok(())
    }

    pub(super) fn symlink(
        &mut self,
        parent: &[Name],
        name: &Name,
        target: &[u8],
        mtime: i64,
    ) -> Result<(), Fail> {
        if target.is_empty() {
            return Err(Fail::Refuse("a symlink to an empty target".into()));
        }
        if target.contains(&0) {
            return Err(Fail::Refuse("a symlink target holds a NUL byte".into()));
        }
        let p = self.parent(parent)?;
        self.replace(&p, name, "creating the symlink", |d| {
            fsat::symlink_at(target, d, name)
        })?;
        fsat::set_times_at(p.fd.as_fd(), name, mtime).map_err(sys("setting the symlink's times"))
    }

    /// A hard link to `target` (components from the rootfs), which must be
    /// a non-directory already in the rootfs.
    pub(super) fn hardlink(
        &mut self,
        parent: &[Name],
        name: &Name,
        target: &[Name],
    ) -> Result<(), Fail> {
        let Some((tname, tdir)) = target.split_last() else {
            return Err(Fail::Refuse("a hard link to the rootfs itself".into()));
        };
        let missing = || Fail::Refuse("the hard link's target is not in the rootfs".into());
        let tp = self.existing(tdir)?.ok_or_else(missing)?;
        let tst = match fsat::stat_at(tp.fd.as_fd(), tname) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Err(missing()),
            Err(e) => return Err(sys("lstat of the hard link's target")(e)),
        };
        if tst.kind == Kind::Dir {
            return Err(Fail::Refuse("a hard link to a directory".into()));
        }
        let p = self.parent(parent)?;
        if let Ok(st) = fsat::stat_at(p.fd.as_fd(), name)
            && (st.dev, st.ino) == (tst.dev, tst.ino)
        {
            self.layer.insert(p.key(name));
            return Ok(());
        }
        self.replace(&p, name, "creating the hard link", |d| {
            fsat::link_at(tp.fd.as_fd(), tname, d, name)
        })
    }

    pub(super) fn fifo(
        &mut self,
        parent: &[Name],
        name: &Name,
        mode: u32,
        mtime: i64,
    ) -> Result<(), Fail> {
        let p = self.parent(parent)?;
        self.replace(&p, name, "creating the FIFO", |d| fsat::mkfifo_at(d, name))?;
        let f = fsat::open_fifo_at(p.fd.as_fd(), name).map_err(sys("opening the FIFO"))?;
        set_mode(&f, mode, "setting the FIFO's mode")?;
        set_times(&f, mtime)
    }

    /// A device node is not created; what the name held in lower layers
    /// goes, as it would under the node.
    pub(super) fn device(&mut self, parent: &[Name], name: &Name) -> Result<(), Fail> {
        match self.existing(parent)? {
            Some(p) => self.clear(&p, name),
            None => Ok(()),
        }
    }

    /// `DIR/.wh.NAME`: remove NAME unless this layer made it.
    pub(super) fn whiteout(&mut self, dir: &[Name], name: &Name) -> Result<(), Fail> {
        let Some(p) = self.existing(dir)? else {
            return Ok(());
        };
        if self.layer.contains(&p.key(name)) {
            return Ok(());
        }
        self.clear(&p, name)
    }

    /// `DIR/.wh..wh..opq`: remove what DIR holds from lower layers.
    pub(super) fn opaque(&mut self, dir: &[Name]) -> Result<(), Fail> {
        let Some(p) = self.existing(dir)? else {
            return Ok(());
        };
        let children = fsat::list_dir(p.fd.as_fd()).map_err(sys("listing the directory"))?;
        for (child, _) in children {
            if !self.layer.contains(&p.key(&child)) {
                self.clear(&p, &child)?;
            }
        }
        Ok(())
    }

    /// Set the times of this layer's directories, where each still is the
    /// directory the layer made; the layer is done. On failure, the path of
    /// the directory and why.
    pub(super) fn finish(&mut self) -> Result<(), (Vec<Name>, Fail)> {
        self.layer.clear();
        for d in std::mem::take(&mut self.dirs) {
            let fd = match fsat::open_dir_in_root(self.root(), &d.path, DirOpen::ReadNoFollow) {
                Ok(fd) => fd,
                // Replaced or removed later in the layer.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err((d.path, resolve_fail(e))),
            };
            match fsat::stat(fd.as_fd()) {
                Ok(st) if (st.dev, st.ino) == (d.dev, d.ino) => {}
                Ok(_) => continue,
                Err(e) => return Err((d.path, sys("fstat of the directory")(e))),
            }
            if let Err(e) = set_times(&File::from(fd), d.mtime) {
                return Err((d.path, e));
            }
        }
        Ok(())
    }
}

/// Give a finished regular file its mode and times.
pub(super) fn finish_file(f: &File, mode: u32, mtime: i64) -> Result<(), Fail> {
    set_mode(f, mode, "setting the file's mode")?;
    set_times(f, mtime)
}

/// One directory on the way down in [`remove_tree`].
struct Level {
    /// Its name in its parent.
    name: Name,
    /// Identity of its parent, checked on the way back up.
    up: (u64, u64),
    /// Subdirectories still to remove.
    pending: Vec<Name>,
}

/// Remove the directory `name` in `parent` and everything in it, by
/// descriptor, never following a symlink, holding one descriptor at a time
/// however deep the tree is (the walk back up is by `..` of a directory
/// reached by descriptor, checked against the identity seen on the way
/// down).
fn remove_tree(parent: BorrowedFd<'_>, name: &Name) -> Result<(), Errno> {
    let pst = fsat::stat(parent)?;
    let mut cur = fsat::open_dir_at(parent, name)?;
    let mut stack = vec![Level {
        name: name.clone(),
        up: (pst.dev, pst.ino),
        pending: sweep(cur.as_fd())?,
    }];
    while let Some(top) = stack.last_mut() {
        if let Some(child) = top.pending.pop() {
            match fsat::open_dir_at(cur.as_fd(), &child) {
                Ok(fd) => {
                    let st = fsat::stat(cur.as_fd())?;
                    let pending = sweep(fd.as_fd())?;
                    stack.push(Level {
                        name: child,
                        up: (st.dev, st.ino),
                        pending,
                    });
                    cur = fd;
                }
                Err(Errno::ENOENT) => {}
                Err(Errno::ENOTDIR | Errno::ELOOP) => fsat::unlink_at(cur.as_fd(), &child, false)?,
                Err(e) => return Err(e),
            }
            continue;
        }
        let Some(done) = stack.pop() else { break };
        if stack.is_empty() {
            return fsat::unlink_at(parent, &done.name, true);
        }
        let up = fsat::parent_dir(cur.as_fd())?;
        let st = fsat::stat(up.as_fd())?;
        if (st.dev, st.ino) != done.up {
            // Something moved the tree while it was being removed.
            return Err(Errno::ESTALE);
        }
        cur = up;
        fsat::unlink_at(cur.as_fd(), &done.name, true)?;
    }
    Ok(())
}

/// Unlink every non-directory in `dir`; return its subdirectories.
fn sweep(dir: BorrowedFd<'_>) -> Result<Vec<Name>, Errno> {
    let mut dirs = Vec::new();
    for (name, kind) in fsat::list_dir(dir)? {
        let kind = match kind {
            Some(k) => k,
            None => fsat::stat_at(dir, &name)?.kind,
        };
        if kind == Kind::Dir {
            dirs.push(name);
        } else {
            fsat::unlink_at(dir, &name, false)?;
        }
    }
    Ok(dirs)
}
