//! Why a spec would not start on this host, found without starting it.
//!
//! [`preflight`] builds the sandbox's setup program with `plan::program`,
//! the one the sandbox runs, and reads its steps instead of running them:
//! which host path each mount shows where, the directories, files and
//! symlinks the jail makes, the spec's binds included. In that view it
//! looks argv[0] up as the sandbox's `execve` would (`plan::exec_paths`),
//! follows symlinks as the sandbox sees them (an absolute target is
//! resolved from the sandbox's root, so a link out of everything bound
//! dangles), and follows a `#!` interpreter (and the program of
//! `#!/usr/bin/env NAME`) and an ELF program's `PT_INTERP` loader the same
//! way. Permissions are checked for the identity the tool has on the host
//! with the default [`JailOptions`](crate::JailOptions): uid and gid 65534
//! without groups when the broker is root, else the broker's own (the
//! spec's inner `user` maps to the same).
//!
//! An image root ([`Root::Image`]) is read the same way: the setup
//! program binds the image's top-level entries, so the lookups go into
//! the image's rootfs on the host, and its symlinks (an image's
//! `/bin/sh -> busybox`, an absolute `/lib64/ld-linux-x86-64.so.2 ->
//! /lib/...`) are followed inside it, never on the host.
//!
//! What is not looked at: mount flags of the host (a `noexec` host mount
//! still refuses exec inside), ACLs, binfmt_misc, and the contents of the
//! fresh /proc.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use cordon_sys::spawn::Op;

use crate::{JailError, JailOptions, JailSpec, Root, elf, host, plan};

/// Where the setup program is built to mount the root: a prefix stripped
/// from its paths, never touched.
const ROOT: &str = "/cordon-preflight-root";
/// Symlinks followed in one lookup before ELOOP (the kernel's limit).
const MAX_LINKS: usize = 40;
/// `#!` levels below the program (the kernel rewrites an exec at most
/// this often before ELOOP).
const MAX_DEPTH: usize = 5;
/// The sandbox's working directory unless the spec names one; relative
/// interpreter paths are resolved against it.
const CWD: &str = "/tmp";
const EXEC: u32 = 0o1;
const READ: u32 = 0o4;

/// Every reason `spec` would not start on this host, one message a user
/// can act on each (empty: nothing found). Checks, in the sandbox's view
/// of its root: every bind source exists on the host and can be reached
/// by the sandbox's uid; the setup steps would not fail (a bind onto a
/// file the jail writes, a directory that cannot be made in a read-only
/// bind...); argv[0] (absolute or looked up in `PATH`) is a regular,
/// executable file, its symlinks pointing at something the sandbox sees;
/// a script's `#!` interpreter (and for `#!/usr/bin/env NAME`, NAME in
/// `PATH`) and an ELF program's dynamic loader pass the same checks.
pub fn preflight(spec: &JailSpec) -> Vec<String> {
    preflight_on(spec, &host::system_dirs().0)
}

/// [`preflight`] with the host's system directories already detected
/// (`HostFacts::system_dirs`), as a jail has them.
pub fn preflight_on(spec: &JailSpec, system_dirs: &[host::SystemDir]) -> Vec<String> {
    problems_on(spec, system_dirs)
        .into_iter()
        .map(|p| p.message)
        .collect()
}

/// One reason a spec would not start: the message, and the bind whose
/// source it is about, when it is about one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What a user can act on (`{tool}: ...`).
    pub message: String,
    /// The host path of the bind that cannot be made (missing, or not
    /// reachable by the sandbox's uid).
    pub bind_source: Option<PathBuf>,
}

impl Problem {
    /// A reason about the bind of host path `src`.
    pub fn at_bind(src: &Path, message: String) -> Problem {
        Problem {
            message,
            bind_source: Some(src.to_path_buf()),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Read, joined and compared as its message.
impl std::ops::Deref for Problem {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

impl std::borrow::Borrow<str> for Problem {
    fn borrow(&self) -> &str {
        &self.message
    }
}

impl PartialEq<&str> for Problem {
    fn eq(&self, other: &&str) -> bool {
        self.message == *other
    }
}

impl PartialEq<String> for Problem {
    fn eq(&self, other: &String) -> bool {
        &self.message == other
    }
}

/// Written as its message (what `cordon doctor --json` and the like show).
impl serde::Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.message)
    }
}

impl From<String> for Problem {
    fn from(message: String) -> Problem {
        Problem {
            message,
            bind_source: None,
        }
    }
}

/// [`preflight_on`], each reason with what it is about.
pub fn problems_on(spec: &JailSpec, system_dirs: &[host::SystemDir]) -> Vec<Problem> {
    preflight_by(spec, system_dirs, plan::BindBy::for_this_broker())
}

/// [`problems_on`] for binds made `by` paths or cloned trees.
fn preflight_by(
    spec: &JailSpec,
    system_dirs: &[host::SystemDir],
    by: plan::BindBy,
) -> Vec<Problem> {
    let tool = spec.tool.as_str();
    let id = Identity::of_sandbox();
    let mut out = Vec::new();
    let mut usable = spec.clone();
    usable.binds.clear();
    for b in &spec.binds {
        if let Err(e) = plan::check_dst(&b.dst) {
            out.push(format!("{tool}: {}", spec_message(e)).into());
            continue;
        }
        // A root broker binds cloned trees: the directories above the
        // source need not be searchable by the sandbox's uid.
        let reach = match by {
            plan::BindBy::Tree => id.exists(&b.src),
            plan::BindBy::Path => id.reach(&b.src),
        };
        match reach {
            Ok(()) => usable.binds.push(b.clone()),
            Err(why) => out.push(Problem::at_bind(
                &b.src,
                format!(
                    "{tool}: bind source {} (for {}) {why}",
                    b.src.display(),
                    b.dst.display()
                ),
            )),
        }
    }
    let image = match &spec.root {
        Root::HostBinds => false,
        Root::Image { rootfs, .. } => {
            // Its entries are bound one by one: the rootfs itself must be
            // searchable too.
            if let Err(why) = id.reach(rootfs).and_then(|()| id.search(rootfs)) {
                out.push(format!("{tool}: image root {} {why}", rootfs.display()).into());
                return out;
            }
            true
        }
    };
    let opts = JailOptions::default();
    let (uid, gid) = spec.user.unwrap_or((opts.inner_uid, opts.inner_gid));
    let program = match plan::program(Path::new(ROOT), system_dirs, &usable, uid, gid) {
        Ok(p) => p,
        Err(e) => {
            out.push(format!("{tool}: {}", spec_message(e)).into());
            return out;
        }
    };
    let cwd = spec.cwd.clone().unwrap_or_else(|| PathBuf::from(CWD));
    let (view, setup) = View::build(&program, id, cwd);
    for (step, why) in setup {
        out.push(format!("{tool}: sandbox setup would fail: {step}: {why}").into());
    }
    let checker = Checker {
        view: &view,
        tool,
        search: plan::search_path(spec),
        image,
    };
    out.extend(checker.argv(spec).into_iter().map(Problem::from));
    out
}

fn spec_message(e: JailError) -> String {
    match e {
        JailError::Spec(m) => m,
        other => other.to_string(),
    }
}

/// The host identity file permissions are checked for.
#[derive(Debug, Clone)]
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Identity {
    /// The tool's host uid and gid under the default options (see
    /// `Jail::run`: a root broker maps the tool to `host_uid_when_root`
    /// and clears its groups; an unprivileged one maps its own uid and
    /// keeps its groups).
    fn of_sandbox() -> Identity {
        let euid = cordon_sys::io::geteuid();
        if euid == 0 {
            let o = JailOptions::default();
            return Identity {
                uid: o.host_uid_when_root,
                gid: o.host_gid_when_root,
                groups: Vec::new(),
            };
        }
        let groups = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("Groups:").map(|g| {
                        g.split_whitespace()
                            .filter_map(|x| x.parse().ok())
                            .collect()
                    })
                })
            })
            .unwrap_or_default();
        Identity {
            uid: euid,
            gid: cordon_sys::io::getegid(),
            groups,
        }
    }

    /// Whether the owner, group or other bits of `p` that apply grant
    /// `bit` (READ or EXEC).
    fn allows(&self, p: &Perm, bit: u32) -> bool {
        let shift = if p.uid == self.uid {
            6
        } else if p.gid == self.gid || self.groups.contains(&p.gid) {
            3
        } else {
            0
        };
        (p.mode >> shift) & bit != 0
    }

    /// A bind source exists (the broker clones its tree: nothing above it
    /// is walked by the sandbox).
    fn exists(&self, src: &Path) -> Result<(), String> {
        match fs::metadata(src) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err("does not exist on the host".into())
            }
            Err(e) => Err(format!("cannot be read on the host ({e})")),
        }
    }

    /// A bind source exists and every directory above it is searchable
    /// (the sandbox mounts it as this identity).
    fn reach(&self, src: &Path) -> Result<(), String> {
        match fs::metadata(src) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err("does not exist on the host".into());
            }
            Err(e) => return Err(format!("cannot be read on the host ({e})")),
        }
        let canon =
            fs::canonicalize(src).map_err(|e| format!("cannot be resolved on the host ({e})"))?;
        for dir in canon.ancestors().skip(1) {
            let m = fs::metadata(dir)
                .map(|m| Perm::of(&m))
                .map_err(|e| format!("cannot be checked ({}: {e})", dir.display()))?;
            if !self.allows(&m, EXEC) {
                return Err(format!(
                    "cannot be reached by the sandbox's uid {}: {} is not searchable by it (mode {:04o})",
                    self.uid,
                    dir.display(),
                    m.mode & 0o7777
                ));
            }
        }
        Ok(())
    }

    /// A host directory can be searched by this identity.
    fn search(&self, dir: &Path) -> Result<(), String> {
        let m = fs::metadata(dir)
            .map(|m| Perm::of(&m))
            .map_err(|e| format!("cannot be checked ({}: {e})", dir.display()))?;
        if self.allows(&m, EXEC) {
            Ok(())
        } else {
            Err(format!(
                "cannot be searched by the sandbox's uid {} (mode {:04o})",
                self.uid,
                m.mode & 0o7777
            ))
        }
    }
}

/// Owner, group and mode of a host file.
#[derive(Debug, Clone, Copy)]
struct Perm {
    mode: u32,
    uid: u32,
    gid: u32,
}

impl Perm {
    fn of(m: &fs::Metadata) -> Perm {
        Perm {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
        }
    }
}

/// One path of the sandbox's root as the setup program leaves it.
#[derive(Debug, Clone)]
enum Node {
    /// A directory the jail made (on the root's tmpfs or a tmpfs of its
    /// own): nothing is in it but what the view lists below it.
    Dir,
    /// A file the jail wrote.
    File { mode: u32 },
    /// A symlink the jail made.
    Link(PathBuf),
    /// A bind of this host path (resolved on the host, as mount(2) does).
    Host(PathBuf),
    /// A filesystem whose contents are not known here (/proc).
    Opaque,
}

/// What one sandbox path is.
#[derive(Debug)]
enum Entry {
    /// A directory; its host permissions when it is in a bind.
    Dir(Option<Perm>),
    /// A regular file: its mode, and its host path and permissions when it
    /// is in a bind.
    File {
        mode: u32,
        host: Option<(PathBuf, Perm)>,
    },
    /// A device, socket or fifo.
    Special,
    /// A symlink with this target.
    Link(PathBuf),
    /// Nothing; `unbound` when no bind covers the path.
    Missing { unbound: bool },
    /// Inside a filesystem not known here.
    Unknown,
    /// The host refused to say.
    Error(String),
}

/// Where a lookup ended.
#[derive(Debug)]
enum End {
    /// This canonical sandbox path, which is this.
    Found(PathBuf, Entry),
    /// Nothing at `at`.
    Missing { at: PathBuf, unbound: bool },
    /// `at` is not a directory but the path goes on below it.
    NotDir(PathBuf),
    /// The directory (with this mode) cannot be searched by the identity.
    NoSearch(PathBuf, u32),
    /// Too many symlinks.
    Loop,
    /// Inside a filesystem not known here.
    Unknown,
    /// The host refused to say.
    Error(String),
}

/// A lookup: where it ended, and where the path's last component led,
/// hop by hop, when it is a symlink.
#[derive(Debug)]
struct Resolved {
    links: Vec<PathBuf>,
    end: End,
}

enum Part {
    Root,
    Up,
    Name(OsString),
}

/// Push the components of `p` so that popping yields them in order.
fn push_parts(stack: &mut Vec<Part>, p: &Path) {
    let mut v = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir => v.push(Part::Root),
            Component::ParentDir => v.push(Part::Up),
            Component::Normal(n) => v.push(Part::Name(n.to_os_string())),
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    stack.extend(v.into_iter().rev());
}

/// `p` with `.` and `..` folded away, for messages.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

fn host_entry(path: &Path, meta: io::Result<fs::Metadata>) -> Entry {
    match meta {
        Ok(m) if m.is_dir() => Entry::Dir(Some(Perm::of(&m))),
        Ok(m) if m.is_file() => Entry::File {
            mode: m.mode(),
            host: Some((path.to_path_buf(), Perm::of(&m))),
        },
        Ok(_) => Entry::Special,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Entry::Missing { unbound: false }
        }
        Err(e) => Entry::Error(format!("{}: {e}", path.display())),
    }
}

/// The sandbox's root as its setup program leaves it.
struct View {
    nodes: BTreeMap<PathBuf, Node>,
    id: Identity,
    /// The working directory.
    cwd: PathBuf,
}

impl View {
    /// Read the steps of `program` (built for `ROOT`); also the steps
    /// that would fail, by name, with why. A failing step is taken as done
    /// (the directory made, the file mounted on) so that one mistake is
    /// reported once.
    fn build(program: &plan::Program, id: Identity, cwd: PathBuf) -> (View, Vec<(String, String)>) {
        let mut view = View {
            nodes: BTreeMap::from([(PathBuf::from("/"), Node::Dir)]),
            id,
            cwd,
        };
        let mut failed = Vec::new();
        for (step, name) in program.steps.iter().zip(&program.names) {
            let r = match &step.op {
                Op::Mkdir { path, .. } => match sandbox_path(path) {
                    Some(p) => view.create(&p, Node::Dir, true),
                    None => Ok(()),
                },
                Op::WriteFile { path, mode, .. } => match sandbox_path(path) {
                    Some(p) => view.create(&p, Node::File { mode: *mode }, false),
                    None => Ok(()),
                },
                Op::Symlink { target, link } => match sandbox_path(link) {
                    Some(p) => view.create(&p, Node::Link(cpath(target)), false),
                    None => Ok(()),
                },
                Op::BindReadOnly { src, target, .. } => {
                    match (sandbox_path(src), sandbox_path(target)) {
                        // A bind of a sandbox path onto itself (the /proc
                        // masks) shows nothing new.
                        (Some(_), _) | (None, None) => Ok(()),
                        (None, Some(t)) => view.mount(&t, Node::Host(host_src(&cpath(src)))),
                    }
                }
                Op::Mount {
                    src,
                    target,
                    fstype,
                    flags,
                    ..
                } => match sandbox_path(target) {
                    None => Ok(()),
                    Some(t) => match fstype.as_ref().map(|f| f.as_bytes()) {
                        Some(b"proc") => view.mount(&t, Node::Opaque),
                        Some(b"tmpfs") => view.mount(&t, Node::Dir),
                        None if flags & libc::MS_BIND != 0 => match src {
                            Some(s) if sandbox_path(s).is_none() => {
                                view.mount(&t, Node::Host(host_src(&cpath(s))))
                            }
                            _ => Ok(()),
                        },
                        _ => Ok(()),
                    },
                },
                // After pivot_root: a sandbox path.
                Op::Chdir { path } => view.enter(&cpath(path)),
                _ => Ok(()),
            };
            if let Err(why) = r
                && !step.skip_if_missing
            {
                failed.push((name.clone(), why));
            }
        }
        (view, failed)
    }

    /// A path the sandbox resolves: relative ones from its working
    /// directory.
    fn in_sandbox(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cwd.join(p)
        }
    }

    /// The `chdir` into `dir` after `pivot_root`.
    fn enter(&self, dir: &Path) -> Result<(), String> {
        match self.resolve(dir, true).end {
            End::Found(_, Entry::Dir(m)) => match m {
                Some(m) if !self.id.allows(&m, EXEC) => Err(format!(
                    "{} is not searchable by uid {} (mode {:04o})",
                    dir.display(),
                    self.id.uid,
                    m.mode & 0o7777
                )),
                _ => Ok(()),
            },
            End::Unknown => Ok(()),
            other => Err(self.unusable(dir, other)),
        }
    }

    /// What `p` (whose parent is canonical) is.
    fn lookup(&self, p: &Path) -> Entry {
        if let Some(n) = self.nodes.get(p) {
            return match n {
                Node::Dir => Entry::Dir(None),
                Node::File { mode } => Entry::File {
                    mode: *mode,
                    host: None,
                },
                Node::Link(t) => Entry::Link(t.clone()),
                Node::Host(src) => host_entry(src, fs::metadata(src)),
                Node::Opaque => Entry::Unknown,
            };
        }
        for anc in p.ancestors().skip(1) {
            let (Some(n), Ok(rest)) = (self.nodes.get(anc), p.strip_prefix(anc)) else {
                continue;
            };
            return match n {
                Node::Host(src) => {
                    let h = src.join(rest);
                    match fs::symlink_metadata(&h) {
                        Ok(m) if m.file_type().is_symlink() => match fs::read_link(&h) {
                            Ok(t) => Entry::Link(t),
                            Err(e) => Entry::Error(format!("{}: {e}", h.display())),
                        },
                        r => host_entry(&h, r),
                    }
                }
                Node::Dir => Entry::Missing { unbound: true },
                Node::Opaque => Entry::Unknown,
                Node::File { .. } | Node::Link(_) => Entry::Missing { unbound: false },
            };
        }
        Entry::Missing { unbound: true }
    }

    /// Look `path` up from the sandbox's root as the kernel would,
    /// following symlinks (the last one only with `follow_last`).
    fn resolve(&self, path: &Path, follow_last: bool) -> Resolved {
        let mut stack = Vec::new();
        push_parts(&mut stack, &self.in_sandbox(path));
        let mut cur = PathBuf::from("/");
        let mut cur_meta: Option<Perm> = None;
        let mut links = Vec::new();
        let mut followed = 0;
        let end = loop {
            let Some(part) = stack.pop() else {
                break End::Found(cur, Entry::Dir(cur_meta));
            };
            match part {
                Part::Root => {
                    cur = PathBuf::from("/");
                    cur_meta = None;
                }
                Part::Up => {
                    cur.pop();
                    cur_meta = match self.lookup(&cur) {
                        Entry::Dir(m) => m,
                        _ => None,
                    };
                }
                Part::Name(n) => {
                    if let Some(m) = &cur_meta
                        && !self.id.allows(m, EXEC)
                    {
                        break End::NoSearch(cur, m.mode);
                    }
                    let next = cur.join(&n);
                    let last = stack.is_empty();
                    match self.lookup(&next) {
                        Entry::Link(t) if !last || follow_last => {
                            followed += 1;
                            if followed > MAX_LINKS {
                                break End::Loop;
                            }
                            if last {
                                links.push(normalize(&cur.join(&t)));
                            }
                            push_parts(&mut stack, &t);
                        }
                        Entry::Dir(m) => {
                            cur = next;
                            cur_meta = m;
                        }
                        Entry::Missing { unbound } => break End::Missing { at: next, unbound },
                        Entry::Unknown => break End::Unknown,
                        Entry::Error(e) => break End::Error(e),
                        e if last => break End::Found(next, e),
                        _ => break End::NotDir(next),
                    }
                }
            }
        };
        Resolved { links, end }
    }

    /// Why a path a setup step needs is not there.
    fn unusable(&self, path: &Path, end: End) -> String {
        match end {
            End::Found(p, _) => format!("{} is not a directory", p.display()),
            End::Missing { at, .. } => format!("{} does not exist", at.display()),
            End::NotDir(at) => format!("{} is not a directory", at.display()),
            End::NoSearch(dir, mode) => format!(
                "{} is not searchable by uid {} (mode {:04o})",
                dir.display(),
                self.id.uid,
                mode & 0o7777
            ),
            End::Loop => format!("{}: too many levels of symbolic links", path.display()),
            End::Unknown => format!("{} cannot be checked", path.display()),
            End::Error(e) => e,
        }
    }

    /// The read-only bind `dir` is in, if any (else it is the jail's own,
    /// writable during setup).
    fn read_only_bind(&self, dir: &Path) -> Option<&Path> {
        for anc in dir.ancestors() {
            match self.nodes.get(anc) {
                Some(Node::Host(src)) => return Some(src),
                Some(_) => return None,
                None => {}
            }
        }
        None
    }

    /// A mkdir (`dir`: an existing entry is fine), an exclusive create or
    /// a symlink at `path`.
    fn create(&mut self, path: &Path, node: Node, dir: bool) -> Result<(), String> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(());
        };
        let parent = match self.resolve(parent, true).end {
            End::Found(p, Entry::Dir(_)) => p,
            End::Unknown => return Ok(()),
            other => return Err(self.unusable(parent, other)),
        };
        let target = parent.join(name);
        match self.lookup(&target) {
            Entry::Missing { .. } => {}
            Entry::Unknown => return Ok(()),
            Entry::Error(e) => return Err(e),
            _ if dir => return Ok(()),
            _ => return Err(format!("{} already exists", target.display())),
        }
        let ro = self
            .read_only_bind(&parent)
            .map(|src| (parent.clone(), src.to_path_buf()));
        self.nodes.insert(target.clone(), node);
        match ro {
            Some((parent, src)) => Err(format!(
                "{} cannot be created: {} is in the read-only bind of {}",
                target.display(),
                parent.display(),
                src.display()
            )),
            None => Ok(()),
        }
    }

    /// A mount of `node` on `target`.
    fn mount(&mut self, target: &Path, node: Node) -> Result<(), String> {
        let (t, entry) = match self.resolve(target, true).end {
            End::Found(p, e) => (p, e),
            End::Unknown => return Ok(()),
            other => return Err(self.unusable(target, other)),
        };
        let mismatch = match &node {
            Node::Host(src) => match fs::metadata(src) {
                Ok(m) if m.is_dir() != matches!(entry, Entry::Dir(_)) => Some(format!(
                    "cannot bind {} {} on {}",
                    if m.is_dir() {
                        "the directory"
                    } else {
                        "the file"
                    },
                    src.display(),
                    t.display()
                )),
                _ => None,
            },
            _ => None,
        };
        self.nodes.retain(|k, _| !k.starts_with(&t));
        self.nodes.insert(t, node);
        match mismatch {
            Some(m) => Err(m),
            None => Ok(()),
        }
    }
}

fn cpath(c: &std::ffi::CStr) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(c.to_bytes()))
}

/// The sandbox path of a path of the setup program, when it is one.
fn sandbox_path(c: &std::ffi::CStr) -> Option<PathBuf> {
    let p = cpath(c);
    p.strip_prefix(ROOT).ok().map(|r| Path::new("/").join(r))
}

/// A bind source as mount(2) resolves it.
fn host_src(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// How a program would be run.
#[derive(Debug, PartialEq, Eq)]
enum Format {
    /// `#!interp arg`.
    Script {
        interp: PathBuf,
        arg: Option<String>,
    },
    /// ELF, with its `PT_INTERP` loader if it has one.
    Elf(Option<PathBuf>),
    /// ELF the kernel would refuse.
    BadElf(String),
    /// Anything else (or unreadable here): not inspected.
    Other,
}

/// Read the start of the host file `path`.
fn format_of(path: &Path) -> Format {
    let Ok(f) = fs::File::open(path) else {
        return Format::Other;
    };
    let mut head = [0u8; 256];
    let mut n = 0;
    while n < head.len() {
        match f.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Format::Other,
        }
    }
    let head = &head[..n];
    if let Some(rest) = head.strip_prefix(b"#!") {
        parse_shebang(rest)
    } else if head.starts_with(b"\x7fELF") {
        match elf::loader(&f, head) {
            Ok(i) => Format::Elf(i),
            Err(e) => Format::BadElf(e.to_string()),
        }
    } else {
        Format::Other
    }
}

/// The rest of a `#!` line as the kernel splits it: the interpreter up to
/// a space, tab or NUL, then one argument, the rest of the line without
/// the blanks around it.
fn parse_shebang(rest: &[u8]) -> Format {
    let line = rest.split(|&b| b == b'\n').next().unwrap_or(rest);
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let line = &line[start..];
    let end = line
        .iter()
        .position(|b| blank(b) || *b == 0)
        .unwrap_or(line.len());
    let interp = PathBuf::from(OsStr::from_bytes(&line[..end]));
    let arg = &line[end..];
    let a = arg.iter().position(|b| !blank(b)).unwrap_or(arg.len());
    let z = arg.iter().rposition(|b| !blank(b)).map_or(a, |i| i + 1);
    let arg = arg.get(a..z).unwrap_or(&[]);
    Format::Script {
        interp,
        arg: (!arg.is_empty()).then(|| String::from_utf8_lossy(arg).into_owned()),
    }
}

/// The program `env` would run for the argument of a `#!/usr/bin/env`
/// line, when that can be told: the whole argument (the kernel passes
/// one), or with `-S` the first word that is not an option or an
/// assignment. None: no program, or options that are not followed here.
fn env_program(arg: &str) -> Option<&str> {
    if !arg.starts_with('-') {
        return (!arg.contains('=')).then_some(arg);
    }
    let mut words = arg.split_whitespace();
    let first = words.next()?;
    let split = first == "--split-string"
        || first.starts_with("--split-string=")
        || (!first.starts_with("--") && first.contains('S'));
    if !split {
        return None;
    }
    if let Some(rest) = first
        .strip_prefix("--split-string=")
        .or_else(|| first.strip_prefix("-S").filter(|r| !r.is_empty()))
        && !rest.starts_with('-')
        && !rest.contains('=')
    {
        return Some(rest);
    }
    let mut takes_value = false;
    for w in words {
        if takes_value {
            takes_value = false;
            continue;
        }
        if matches!(w, "-u" | "-C" | "--unset" | "--chdir") {
            takes_value = true;
            continue;
        }
        if w.starts_with('-') || w.contains('=') {
            continue;
        }
        return Some(w);
    }
    None
}

/// What an exec check found.
#[derive(Debug)]
enum Verdict {
    /// It would run (or cannot be told apart from running here).
    Ok,
    /// The path names nothing (no symlink on the way); a `PATH` lookup
    /// goes on to the next entry.
    Absent { unbound: bool },
    /// It would fail with ENOENT or EACCES: a `PATH` lookup goes on.
    Refused(Vec<String>),
    /// The exec would fail with another errno, or work and the program
    /// fail at once (`env` not finding its program): a `PATH` lookup stops
    /// there.
    Fatal(Vec<String>),
}

struct Checker<'a> {
    view: &'a View,
    tool: &'a str,
    search: &'a str,
    /// The root is an image's: a path outside every bind is one the image
    /// does not have.
    image: bool,
}

impl Checker<'_> {
    /// Why a path outside everything bound is not there.
    fn not_bound(&self) -> &'static str {
        if self.image {
            "not in the image"
        } else {
            "not bound"
        }
    }

    fn absent(&self, unbound: bool) -> String {
        if unbound {
            format!("does not exist inside the sandbox ({})", self.not_bound())
        } else {
            "does not exist inside the sandbox".to_string()
        }
    }

    /// `what` (with the symlinks its last component led through) `why`.
    fn say(&self, what: &str, links: &[PathBuf], why: &str) -> String {
        if links.is_empty() {
            return format!("{}: {what} {why}", self.tool);
        }
        let chain: Vec<String> = links.iter().map(|l| l.display().to_string()).collect();
        format!(
            "{}: {what} is a symlink to {}, which {why}",
            self.tool,
            chain.join(", a symlink to ")
        )
    }

    /// argv[0], as the sandbox's exec finds it.
    fn argv(&self, spec: &JailSpec) -> Vec<String> {
        let candidates = match plan::exec_paths(spec) {
            Ok(c) => c,
            Err(e) => return vec![format!("{}: {}", self.tool, spec_message(e))],
        };
        let arg0 = spec.argv.first().map(String::as_str).unwrap_or("");
        if arg0.contains('/') {
            let what = format!("program {arg0}");
            return self.must(self.exec(Path::new(arg0), &what, 0, true), &what);
        }
        let candidates: Vec<PathBuf> = candidates.iter().map(|c| cpath(c)).collect();
        self.search(
            &candidates,
            |p| format!("program {}", p.display()),
            format!("program {arg0}"),
            0,
        )
    }

    /// A verdict for a path that must be there: its messages.
    fn must(&self, v: Verdict, what: &str) -> Vec<String> {
        match v {
            Verdict::Ok => Vec::new(),
            Verdict::Absent { unbound } => vec![self.say(what, &[], &self.absent(unbound))],
            Verdict::Refused(m) | Verdict::Fatal(m) => m,
        }
    }

    /// A `PATH` lookup over `candidates`, as exec's: the first that would
    /// run wins; ENOENT and EACCES go on to the next, other outcomes stop
    /// there. Messages: those of the candidate it stops at, else of the
    /// first that exists, else that `name` is not found.
    fn search(
        &self,
        candidates: &[PathBuf],
        what: impl Fn(&Path) -> String,
        name: String,
        depth: usize,
    ) -> Vec<String> {
        let mut first = None;
        for c in candidates {
            match self.exec(c, &what(c), depth, true) {
                Verdict::Ok => return Vec::new(),
                Verdict::Absent { .. } => {}
                Verdict::Refused(m) => {
                    first.get_or_insert(m);
                }
                Verdict::Fatal(m) => return m,
            }
        }
        first.unwrap_or_else(|| {
            vec![format!(
                "{}: {name} is not found in PATH ({}) inside the sandbox",
                self.tool, self.search
            )]
        })
    }

    /// Whether `path` would be exec'd: a regular file the sandbox's uid
    /// may execute, reached through symlinks the sandbox sees; with
    /// `inspect`, its `#!` interpreter or ELF loader as well.
    fn exec(&self, path: &Path, what: &str, depth: usize, inspect: bool) -> Verdict {
        let id = &self.view.id;
        let r = self.view.resolve(path, true);
        let refuse = |why: &str| Verdict::Refused(vec![self.say(what, &r.links, why)]);
        let fatal = |why: &str| Verdict::Fatal(vec![self.say(what, &r.links, why)]);
        let (mode, host) = match r.end {
            End::Found(_, Entry::File { mode, host }) => (mode, host),
            End::Found(_, Entry::Dir(_)) => return refuse("is a directory"),
            End::Found(..) => return refuse("is not a regular file"),
            End::Missing { unbound, .. } if r.links.is_empty() => {
                return Verdict::Absent { unbound };
            }
            End::Missing { unbound: true, .. } => {
                return refuse(&format!("the sandbox does not see ({})", self.not_bound()));
            }
            End::Missing { .. } => return refuse("does not exist inside the sandbox"),
            End::NotDir(ref at) => {
                return refuse(&format!(
                    "does not exist inside the sandbox ({} is not a directory)",
                    at.display()
                ));
            }
            End::NoSearch(ref dir, m) => {
                return refuse(&format!(
                    "cannot be reached by uid {}: {} is not searchable by it (mode {:04o})",
                    id.uid,
                    dir.display(),
                    m & 0o7777
                ));
            }
            End::Loop => return fatal("cannot be resolved (too many levels of symbolic links)"),
            End::Unknown => return Verdict::Ok,
            End::Error(ref e) => return refuse(&format!("cannot be checked ({e})")),
        };
        let runs = match &host {
            Some((_, m)) => id.allows(m, EXEC),
            None => mode & 0o100 != 0,
        };
        if !runs {
            return refuse(&format!(
                "is not executable by uid {} (mode {:04o})",
                id.uid,
                mode & 0o7777
            ));
        }
        let Some((h, m)) = host.filter(|_| inspect) else {
            return Verdict::Ok;
        };
        match format_of(&h) {
            Format::Script { interp, arg } => {
                // The exec works; the interpreter then fails to open it.
                if !id.allows(&m, READ) {
                    return fatal(&format!(
                        "is a script its interpreter cannot read as uid {} (mode {:04o})",
                        id.uid,
                        m.mode & 0o7777
                    ));
                }
                if interp.as_os_str().is_empty() {
                    return fatal("has an empty #! line");
                }
                if depth >= MAX_DEPTH {
                    return fatal("has too many levels of #! interpreters");
                }
                let ip = self.view.in_sandbox(&interp);
                let label = format!("interpreter {} of {}", interp.display(), path.display());
                match self.exec(&ip, &label, depth + 1, true) {
                    Verdict::Ok => {}
                    Verdict::Fatal(m) => return Verdict::Fatal(m),
                    v => return Verdict::Refused(self.must(v, &label)),
                }
                if ip.file_name() != Some(OsStr::new("env")) {
                    return Verdict::Ok;
                }
                let Some(name) = arg.as_deref().and_then(env_program) else {
                    return Verdict::Ok;
                };
                let run_by = format!(
                    "(run by {} in the #! line of {})",
                    interp.display(),
                    path.display()
                );
                let m = if name.contains('/') {
                    let what = format!("program {name} {run_by}");
                    let v = self.exec(
                        &self.view.in_sandbox(Path::new(name)),
                        &what,
                        depth + 1,
                        true,
                    );
                    self.must(v, &what)
                } else {
                    let candidates: Vec<PathBuf> = plan::path_candidates(self.search, name)
                        .into_iter()
                        .map(PathBuf::from)
                        .collect();
                    if candidates.is_empty() {
                        vec![format!(
                            "{}: program {name} {run_by}: no absolute PATH entry to look it up in",
                            self.tool
                        )]
                    } else {
                        self.search(
                            &candidates,
                            |p| format!("program {} {run_by}", p.display()),
                            format!("program {name} {run_by}"),
                            depth + 1,
                        )
                    }
                };
                // env itself runs; what it cannot find ends the tool with
                // 127, not the exec.
                if m.is_empty() {
                    Verdict::Ok
                } else {
                    Verdict::Fatal(m)
                }
            }
            Format::Elf(Some(loader)) => {
                let label = format!("dynamic loader {} of {}", loader.display(), path.display());
                match self.exec(&self.view.in_sandbox(&loader), &label, depth, false) {
                    Verdict::Ok => Verdict::Ok,
                    Verdict::Fatal(m) => Verdict::Fatal(m),
                    v => Verdict::Refused(self.must(v, &label)),
                }
            }
            Format::BadElf(why) => fatal(&format!("is not a valid ELF file ({why})")),
            Format::Elf(None) | Format::Other => Verdict::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::Bind;

    const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

    /// A directory under /tmp the sandbox's uid can enter.
    fn dir() -> tempfile::TempDir {
        let d = tempfile::Builder::new()
            .prefix("cordon-preflight")
            .tempdir_in("/tmp")
            .unwrap();
        fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn file(path: &Path, body: &[u8], mode: u32) {
        fs::write(path, body).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn bound(argv: &[&str], src: &Path, dst: &str) -> JailSpec {
        let mut spec = JailSpec::new("t", argv.iter().copied());
        spec.binds.push(Bind {
            src: src.to_path_buf(),
            dst: dst.into(),
        });
        spec
    }

    /// A 64-bit little-endian ELF header with one PT_INTERP program header
    /// naming `interp`.
    fn elf_with_interp(interp: &str) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // little-endian
        b[6] = 1; // EV_CURRENT
        b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let ph = 64;
        b[ph..ph + 4].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        let off = b.len() as u64;
        let size = interp.len() as u64 + 1;
        b[ph + 8..ph + 16].copy_from_slice(&off.to_le_bytes()); // p_offset
        b[ph + 32..ph + 40].copy_from_slice(&size.to_le_bytes()); // p_filesz
        b.extend_from_slice(interp.as_bytes());
        b.push(0);
        b
    }

    #[test]
    fn existing_programs_pass() {
        for argv in [
            &["/bin/true"][..],
            &["/usr/bin/env"],
            &["true"],
            &["env", "true"],
            &["sh", "-c", "true"],
        ] {
            let spec = JailSpec::new("t", argv.iter().copied());
            assert_eq!(preflight(&spec), Vec::<String>::new(), "{argv:?}");
        }
    }

    #[test]
    fn bound_scripts_pass() {
        let d = dir();
        file(&d.path().join("run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
        file(&d.path().join("run-env"), b"#!/usr/bin/env sh\n", 0o755);
        file(
            &d.path().join("run-split"),
            b"#!/usr/bin/env -S sh -e\n",
            0o755,
        );
        for name in ["run.sh", "run-env", "run-split"] {
            let spec = bound(&[&format!("/opt/tool/{name}")], d.path(), "/opt/tool");
            assert_eq!(preflight(&spec), Vec::<String>::new(), "{name}");
        }
        // Through PATH too.
        let mut spec = bound(&["run.sh"], d.path(), "/opt/tool");
        spec.env[0].1 = format!("/opt/tool:{PATH}");
        assert_eq!(preflight(&spec), Vec::<String>::new());
    }

    #[test]
    fn missing_command() {
        let spec = JailSpec::new("t", ["nosuch-cordon-command"]);
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program nosuch-cordon-command is not found in PATH ({PATH}) inside the sandbox"
            )]
        );
        let spec = JailSpec::new("pdf_to_text", ["/usr/bin/nosuch-cordon-command"]);
        assert_eq!(
            preflight(&spec),
            [
                "pdf_to_text: program /usr/bin/nosuch-cordon-command does not exist inside the sandbox"
            ]
        );
        // A path under nothing bound.
        let spec = JailSpec::new("t", ["/home/someone/bin/tool"]);
        assert_eq!(
            preflight(&spec),
            ["t: program /home/someone/bin/tool does not exist inside the sandbox (not bound)"]
        );
        // A host file the sandbox does not see.
        let d = dir();
        file(&d.path().join("tool"), b"#!/bin/sh\n", 0o755);
        let host = d.path().join("tool");
        let spec = JailSpec::new("t", [host.to_str().unwrap()]);
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program {} does not exist inside the sandbox (not bound)",
                host.display()
            )]
        );
        // Bad argv.
        let spec = JailSpec::new("t", ["bin/tool"]);
        assert_eq!(
            preflight(&spec),
            ["t: argv[0] \"bin/tool\" must be absolute or a bare name"]
        );
    }

    #[test]
    fn missing_interpreter() {
        let d = dir();
        file(&d.path().join("run.py"), b"#!/opt/nope/python -u\n", 0o755);
        file(
            &d.path().join("other.py"),
            b"#!/usr/bin/nosuch-cordon-python\n",
            0o755,
        );
        let spec = bound(&["/opt/tool/run.py"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [
                "t: interpreter /opt/nope/python of /opt/tool/run.py does not exist inside the sandbox (not bound)"
            ]
        );
        let spec = bound(&["/opt/tool/other.py"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [
                "t: interpreter /usr/bin/nosuch-cordon-python of /opt/tool/other.py does not exist inside the sandbox"
            ]
        );
    }

    #[test]
    fn interpreter_symlink_into_an_unbound_directory() {
        // A virtualenv's python, a symlink to an interpreter that exists on
        // the host, in a directory that is not bound.
        let pyenv = dir();
        file(&pyenv.path().join("python3"), b"#!/bin/sh\n", 0o755);
        let d = dir();
        fs::create_dir_all(d.path().join("venv/bin")).unwrap();
        fs::set_permissions(d.path().join("venv"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(d.path().join("venv/bin"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink(
            pyenv.path().join("python3"),
            d.path().join("venv/bin/python3"),
        )
        .unwrap();
        symlink("python3", d.path().join("venv/bin/python")).unwrap();
        file(
            &d.path().join("run.py"),
            b"#!/opt/tool/venv/bin/python\n",
            0o755,
        );
        let mut spec = bound(&["/opt/tool/run.py"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: interpreter /opt/tool/venv/bin/python of /opt/tool/run.py is a symlink to \
                 /opt/tool/venv/bin/python3, a symlink to {}/python3, which the sandbox does \
                 not see (not bound)",
                pyenv.path().display()
            )]
        );
        // The same link as argv[0].
        spec.argv = vec!["/opt/tool/venv/bin/python3".into()];
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program /opt/tool/venv/bin/python3 is a symlink to {}/python3, which the \
                 sandbox does not see (not bound)",
                pyenv.path().display()
            )]
        );
        // Bound at the path the link names, the interpreter is there.
        spec.argv = vec!["/opt/tool/run.py".into()];
        spec.binds.push(Bind {
            src: pyenv.path().to_path_buf(),
            dst: pyenv.path().to_path_buf(),
        });
        assert_eq!(preflight(&spec), Vec::<String>::new());
    }

    #[test]
    fn missing_bind_source() {
        let mut spec = JailSpec::new("t", ["/bin/true"]);
        spec.binds.push(Bind {
            src: "/nonexistent/cordon-source".into(),
            dst: "/opt/data".into(),
        });
        assert_eq!(
            preflight(&spec),
            [
                "t: bind source /nonexistent/cordon-source (for /opt/data) does not exist on the host"
            ]
        );
        spec.binds[0] = Bind {
            src: "/usr".into(),
            dst: "/proc/x".into(),
        };
        assert_eq!(
            preflight(&spec),
            ["t: bind destination /proc/x is inside /proc or /dev"]
        );
    }

    #[test]
    fn bind_source_out_of_the_sandbox_uids_reach() {
        if cordon_sys::io::geteuid() != 0 {
            // An unprivileged broker's sandbox has its own uid: it owns the
            // directory.
            return;
        }
        let d = tempfile::Builder::new()
            .prefix("cordon-preflight")
            .tempdir_in("/tmp")
            .unwrap();
        fs::set_permissions(d.path(), fs::Permissions::from_mode(0o700)).unwrap();
        fs::create_dir(d.path().join("inner")).unwrap();
        let spec = bound(&["/bin/true"], &d.path().join("inner"), "/opt/inner");
        // A root broker clones the source's tree itself: the 0700 parent
        // is not in the sandbox's way.
        assert_eq!(preflight(&spec), Vec::<String>::new());
        // Bound by path, it would be.
        assert_eq!(
            preflight_by(&spec, &host::system_dirs().0, plan::BindBy::Path),
            [Problem {
                message: format!(
                    "t: bind source {0}/inner (for /opt/inner) cannot be reached by the sandbox's \
                     uid 65534: {0} is not searchable by it (mode 0700)",
                    d.path().display()
                ),
                bind_source: Some(d.path().join("inner")),
            }]
        );
    }

    #[test]
    fn env_program_not_found() {
        let d = dir();
        file(&d.path().join("run"), b"#!/usr/bin/env nosuchprog\n", 0o755);
        let spec = bound(&["/opt/tool/run"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program nosuchprog (run by /usr/bin/env in the #! line of /opt/tool/run) is \
                 not found in PATH ({PATH}) inside the sandbox"
            )]
        );
        // The kernel passes one argument: `env` looks for "sh -e".
        file(&d.path().join("two"), b"#!/usr/bin/env sh -e\n", 0o755);
        let spec = bound(&["/opt/tool/two"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program sh -e (run by /usr/bin/env in the #! line of /opt/tool/two) is not \
                 found in PATH ({PATH}) inside the sandbox"
            )]
        );
    }

    #[test]
    fn elf_loader_must_resolve() {
        let d = dir();
        file(
            &d.path().join("prog"),
            &elf_with_interp("/nope/ld.so"),
            0o755,
        );
        let spec = bound(&["/opt/tool/prog"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [
                "t: dynamic loader /nope/ld.so of /opt/tool/prog does not exist inside the sandbox (not bound)"
            ]
        );
        // The loader of a real program is found (and is what the sandbox
        // uses).
        let f = fs::File::open("/usr/bin/env").unwrap();
        let mut head = [0u8; 64];
        f.read_exact_at(&mut head, 0).unwrap();
        if let Some(loader) = elf::loader(&f, &head).unwrap() {
            file(
                &d.path().join("real"),
                &elf_with_interp(loader.to_str().unwrap()),
                0o755,
            );
            let spec = bound(&["/opt/tool/real"], d.path(), "/opt/tool");
            assert_eq!(preflight(&spec), Vec::<String>::new(), "{loader:?}");
        }
    }

    #[test]
    fn not_executable_and_not_a_file() {
        let d = dir();
        file(&d.path().join("data"), b"#!/bin/sh\n", 0o644);
        let id = Identity::of_sandbox();
        let spec = bound(&["/opt/tool/data"], d.path(), "/opt/tool");
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program /opt/tool/data is not executable by uid {} (mode 0644)",
                id.uid
            )]
        );
        let spec = JailSpec::new("t", ["/usr"]);
        assert_eq!(preflight(&spec), ["t: program /usr is a directory"]);
        let spec = JailSpec::new("t", ["/dev/null"]);
        assert_eq!(
            preflight(&spec),
            ["t: program /dev/null is not a regular file"]
        );
        // A name found in PATH only as something that cannot run: the
        // first such entry is named.
        let mut spec = bound(&["data"], d.path(), "/opt/tool");
        spec.env[0].1 = format!("/opt/tool:{PATH}");
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: program /opt/tool/data is not executable by uid {} (mode 0644)",
                id.uid
            )]
        );
    }

    #[test]
    fn setup_steps_that_would_fail() {
        let d = dir();
        file(&d.path().join("data"), b"x", 0o644);
        // The jail writes /etc/passwd itself.
        let spec = bound(&["/bin/true"], &d.path().join("data"), "/etc/passwd");
        assert_eq!(
            preflight(&spec),
            ["t: sandbox setup would fail: create /etc/passwd: /etc/passwd already exists"]
        );
        // /usr is a read-only bind: nothing new can be made in it.
        let spec = bound(&["/bin/true"], d.path(), "/usr/cordon-nonexistent/x");
        assert_eq!(
            preflight(&spec),
            [
                "t: sandbox setup would fail: mkdir /usr/cordon-nonexistent: /usr/cordon-nonexistent \
                 cannot be created: /usr is in the read-only bind of /usr"
            ]
        );
        // A directory on a file.
        let mut spec = bound(&["/bin/true"], &d.path().join("data"), "/opt/x");
        spec.binds.push(Bind {
            src: d.path().to_path_buf(),
            dst: "/opt/x".into(),
        });
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: sandbox setup would fail: mount {} on /opt/x read-only: cannot bind the \
                 directory {} on /opt/x",
                d.path().display(),
                d.path().display()
            )]
        );
    }

    fn image(argv: &[&str], rootfs: &Path) -> JailSpec {
        let mut spec = JailSpec::new("t", argv.iter().copied());
        spec.root = Root::Image {
            rootfs: rootfs.to_path_buf(),
            digest: String::new(),
        };
        spec.env[0].1 = "/bin".into();
        spec
    }

    #[test]
    fn image_roots() {
        let d = dir();
        let img = d.path();
        for sub in ["bin", "etc", "lib"] {
            fs::create_dir(img.join(sub)).unwrap();
            fs::set_permissions(img.join(sub), fs::Permissions::from_mode(0o755)).unwrap();
        }
        file(&img.join("bin/busybox"), b"not a script", 0o755);
        file(&img.join("lib/ld.so"), b"loader", 0o755);
        file(&img.join("bin/dyn"), &elf_with_interp("/lib/ld.so"), 0o755);
        file(
            &img.join("bin/hostdyn"),
            &elf_with_interp("/usr/lib/ld.so.1"),
            0o755,
        );
        file(&img.join("bin/script"), b"#!/bin/sh\n", 0o755);
        file(&img.join("bin/pyscript"), b"#!/usr/bin/python3\n", 0o755);
        symlink("busybox", img.join("bin/sh")).unwrap();
        // Absolute targets resolve inside the image.
        symlink("/bin/busybox", img.join("bin/abs")).unwrap();
        symlink("/usr/bin/env", img.join("bin/hostenv")).unwrap();
        symlink("/etc", img.join("etclink")).unwrap();
        for argv in [
            &["/bin/sh"][..],
            &["sh", "-c", "true"],
            &["/bin/abs"],
            &["/bin/dyn"],
            &["/bin/script"],
            &["/etclink/../bin/sh"],
        ] {
            assert_eq!(
                preflight(&image(argv, img)),
                Vec::<String>::new(),
                "{argv:?}"
            );
        }
        let cases: [(&[&str], &str); 7] = [
            (
                &["/usr/bin/env"],
                "t: program /usr/bin/env does not exist inside the sandbox (not in the image)",
            ),
            (
                &["/bin/nosuch"],
                "t: program /bin/nosuch does not exist inside the sandbox",
            ),
            (
                &["env"],
                "t: program env is not found in PATH (/bin) inside the sandbox",
            ),
            (
                &["/bin/hostenv"],
                "t: program /bin/hostenv is a symlink to /usr/bin/env, which the sandbox \
                 does not see (not in the image)",
            ),
            (
                &["/bin/hostdyn"],
                "t: dynamic loader /usr/lib/ld.so.1 of /bin/hostdyn does not exist inside \
                 the sandbox (not in the image)",
            ),
            (
                &["/bin/pyscript"],
                "t: interpreter /usr/bin/python3 of /bin/pyscript does not exist inside the \
                 sandbox (not in the image)",
            ),
            (&["/etc"], "t: program /etc is a directory"),
        ];
        for (argv, msg) in cases {
            assert_eq!(preflight(&image(argv, img)), [msg], "{argv:?}");
        }
        // The working directory, and relative interpreters from it.
        let mut spec = image(&["/bin/sh"], img);
        spec.cwd = Some("/bin".into());
        assert_eq!(preflight(&spec), Vec::<String>::new());
        file(&img.join("bin/rel"), b"#!busybox\n", 0o755);
        spec.argv = vec!["/bin/rel".into()];
        assert_eq!(preflight(&spec), Vec::<String>::new());
        spec.cwd = None;
        assert_eq!(
            preflight(&spec),
            [
                "t: interpreter busybox of /bin/rel does not exist inside the sandbox (not in the image)"
            ]
        );
        spec.cwd = Some("/nope".into());
        spec.argv = vec!["/bin/sh".into()];
        assert_eq!(
            preflight(&spec),
            ["t: sandbox setup would fail: chdir /nope: /nope does not exist"]
        );
        // A bind through a symlink of the image.
        let spec = bound(&["/bin/sh"], img, "/etclink/x");
        let spec = JailSpec {
            root: image(&[], img).root,
            ..spec
        };
        assert_eq!(
            preflight(&spec),
            ["t: bind destination /etclink/x passes through /etclink, a symlink in the image"]
        );
        // A rootfs the sandbox's uid cannot enter (a root broker's
        // sandbox is uid 65534; an unprivileged one owns the directory).
        if cordon_sys::io::geteuid() == 0 {
            fs::set_permissions(img, fs::Permissions::from_mode(0o700)).unwrap();
            assert_eq!(
                preflight(&image(&["/bin/sh"], img)),
                [format!(
                    "t: image root {} cannot be searched by the sandbox's uid 65534 (mode 0700)",
                    img.display()
                )]
            );
            fs::set_permissions(img, fs::Permissions::from_mode(0o755)).unwrap();
        }
        // A rootfs that is not there.
        let spec = image(&["/bin/sh"], &img.join("nonexistent"));
        assert_eq!(
            preflight(&spec),
            [format!(
                "t: image root {}/nonexistent does not exist on the host",
                img.display()
            )]
        );
    }

    #[test]
    fn shebang_lines() {
        let s = |l: &[u8]| parse_shebang(l.strip_prefix(b"#!").unwrap());
        assert_eq!(
            s(b"#!/bin/sh\n"),
            Format::Script {
                interp: "/bin/sh".into(),
                arg: None
            }
        );
        assert_eq!(
            s(b"#! /usr/bin/env  python3 -u \t\nrest"),
            Format::Script {
                interp: "/usr/bin/env".into(),
                arg: Some("python3 -u".into())
            }
        );
        assert_eq!(
            s(b"#!\n"),
            Format::Script {
                interp: "".into(),
                arg: None
            }
        );
        assert_eq!(env_program("python3"), Some("python3"));
        assert_eq!(env_program("python3 -u"), Some("python3 -u"));
        assert_eq!(env_program("-S python3 -u"), Some("python3"));
        assert_eq!(env_program("-S -u HOME A=1 python3"), Some("python3"));
        assert_eq!(env_program("-Spython3"), Some("python3"));
        assert_eq!(env_program("-i python3"), None);
        assert_eq!(env_program("A=1"), None);
    }
}
