//! The layer unpacker against hostile and ordinary layers. Layers are
//! built here byte by byte (hostile ones need exact control of names and
//! types). Every case runs next to bait files and directories outside the
//! rootfs that must be unchanged afterwards (content, mode, times, link
//! count, and no new files). As root, the whole suite runs once more as uid
//! 65534 (`unprivileged`): nothing may depend on privilege.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use cordon_image::unpack::{Budget, Caps, Compression, UnpackError, apply_layer};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use cordon_testkit::skip;

const MTIME: u64 = 1_600_000_000;

// ---------------------------------------------------------------- layers

/// A tar stream written header by header.
#[derive(Default)]
struct Layer {
    out: Vec<u8>,
}

impl Layer {
    fn new() -> Layer {
        Layer::default()
    }

    /// One entry with a raw name and link name (each up to 100 bytes).
    fn raw(
        &mut self,
        ty: EntryType,
        name: &[u8],
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) -> &mut Self {
        let mut h = Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(MTIME);
        // Ownership a naive unpacker would copy.
        h.set_uid(1234);
        h.set_gid(1234);
        {
            let old = h.as_old_mut();
            old.name[..name.len()].copy_from_slice(name);
            old.linkname[..link.len()].copy_from_slice(link);
        }
        if matches!(ty, EntryType::Char | EntryType::Block) {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        self.out.extend_from_slice(h.as_bytes());
        self.data(data);
        self
    }

    fn data(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
    }

    /// A PAX extended header for the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut body = Vec::new();
        for (k, v) in records {
            // "LEN key=value\n", LEN counting itself.
            let rest = k.len() + v.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        self.raw(EntryType::XHeader, b"PaxHeaders/x", b"", 0o644, &body)
    }

    fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.raw(EntryType::Directory, name.as_bytes(), b"", mode, b"")
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.raw(EntryType::Regular, name.as_bytes(), b"", mode, data)
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            0o777,
            b"",
        )
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            0o644,
            b"",
        )
    }

    fn tar(&self) -> Vec<u8> {
        let mut t = self.out.clone();
        t.extend(std::iter::repeat_n(0u8, 1024));
        t
    }
}

fn gz(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn zst(b: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(b, 3).unwrap()
}

fn sha256(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

// ------------------------------------------------------------- fixture

/// One file's observable state.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Seen {
    kind: &'static str,
    mode: u32,
    mtime: (i64, i64),
    nlink: u64,
    content: Vec<u8>,
}

fn seen(p: &Path) -> Seen {
    let m = fs::symlink_metadata(p).unwrap();
    let ft = m.file_type();
    let (kind, content) = if ft.is_symlink() {
        (
            "symlink",
            fs::read_link(p)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes(),
        )
    } else if ft.is_dir() {
        ("dir", Vec::new())
    } else if ft.is_file() {
        // Mode 0 files are unreadable without privilege.
        (
            "file",
            fs::read(p).unwrap_or_else(|_| b"(unreadable)".to_vec()),
        )
    } else if ft.is_fifo() {
        ("fifo", Vec::new())
    } else {
        ("other", Vec::new())
    };
    Seen {
        kind,
        mode: m.mode() & 0o7777,
        mtime: (m.mtime(), m.mtime_nsec()),
        nlink: m.nlink(),
        content,
    }
}

/// Everything under `dir` (not following symlinks), by relative path,
/// leaving out `skip`.
fn snapshot(dir: &Path, skip: Option<&Path>) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if Some(p.as_path()) == skip {
                continue;
            }
            let s = seen(&p);
            if s.kind == "dir" {
                todo.push(p.clone());
            }
            out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), s);
        }
    }
    out
}

/// A rootfs in a temporary directory, next to bait: `bait/file`,
/// `bait/exe`, `bait/dir/inner`, `outside` and a symlink `bait/link`, all
/// with an old modification time.
struct Fx {
    _tmp: cordon_testkit::Scratch,
    top: PathBuf,
    bait: PathBuf,
    root: PathBuf,
    before: BTreeMap<PathBuf, Seen>,
}

fn fx() -> Fx {
    let tmp = cordon_testkit::scratch();
    let top = tmp.path().to_path_buf();
    let bait = top.join("bait");
    fs::create_dir_all(bait.join("dir")).unwrap();
    fs::write(bait.join("file"), b"bait\n").unwrap();
    fs::write(bait.join("exe"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(bait.join("exe"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(bait.join("dir/inner"), b"inner\n").unwrap();
    fs::write(top.join("outside"), b"outside\n").unwrap();
    std::os::unix::fs::symlink("file", bait.join("link")).unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    for p in [
        bait.join("file"),
        bait.join("exe"),
        bait.join("dir/inner"),
        top.join("outside"),
    ] {
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_times(fs::FileTimes::new().set_modified(old).set_accessed(old))
            .unwrap();
    }
    for p in [bait.join("dir"), bait.clone()] {
        fs::File::open(&p)
            .unwrap()
            .set_times(fs::FileTimes::new().set_modified(old).set_accessed(old))
            .unwrap();
    }
    let root = top.join("root");
    fs::create_dir(&root).unwrap();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot(&top, Some(&root));
    Fx {
        _tmp: tmp,
        top,
        bait,
        root,
        before,
    }
}

impl Fx {
    /// The bait's absolute path, as a string for entry names and targets.
    fn b(&self) -> String {
        self.bait.to_str().unwrap().to_string()
    }

    /// Nothing outside the rootfs changed.
    #[track_caller]
    fn check(&self) {
        let after = snapshot(&self.top, Some(&self.root));
        assert_eq!(self.before, after, "something outside the rootfs changed");
        // The rootfs itself is still the directory the test made.
        assert!(fs::symlink_metadata(&self.root).unwrap().is_dir());
    }

    fn apply(&self, layer: &Layer) -> Result<String, UnpackError> {
        apply_layer(
            &self.root,
            &layer.tar()[..],
            Compression::None,
            &mut Budget::new(Caps::default()),
        )
    }

    #[track_caller]
    fn ok(&self, layer: &Layer) -> String {
        let r = self.apply(layer);
        self.check();
        r.unwrap_or_else(|e| panic!("layer refused: {e}"))
    }

    /// The layer is refused with a message holding each of `needles`.
    #[track_caller]
    fn refused(&self, layer: &Layer, needles: &[&str]) -> UnpackError {
        let r = self.apply(layer);
        self.check();
        let e = match r {
            Ok(_) => panic!("layer applied, should have been refused"),
            Err(e) => e,
        };
        let msg = e.to_string();
        for n in needles {
            assert!(msg.contains(n), "{msg:?} should mention {n:?}");
        }
        e
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn exists(&self, rel: &str) -> bool {
        fs::symlink_metadata(self.p(rel)).is_ok()
    }

    fn read(&self, rel: &str) -> Vec<u8> {
        fs::read(self.p(rel)).unwrap()
    }

    fn mode(&self, rel: &str) -> u32 {
        fs::symlink_metadata(self.p(rel)).unwrap().mode() & 0o7777
    }

    fn tree(&self) -> BTreeMap<String, String> {
        tree(&self.root)
    }
}

/// The rootfs as `path -> description` (`dir 755`, `file 644 CONTENT`,
/// `link TARGET`, `fifo 644`).
fn tree(root: &Path) -> BTreeMap<String, String> {
    snapshot(root, None)
        .into_iter()
        .map(|(p, s)| {
            let d = match s.kind {
                "file" => format!("file {:o} {}", s.mode, String::from_utf8_lossy(&s.content)),
                "symlink" => format!("link {}", String::from_utf8_lossy(&s.content)),
                k => format!("{k} {:o}", s.mode),
            };
            (p.to_str().unwrap().to_string(), d)
        })
        .collect()
}

fn expect(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(p, d)| (p.to_string(), d.to_string()))
        .collect()
}

// --------------------------------------------------------- hostile names

#[test]
fn dotdot_escape_is_refused() {
    let f = fx();
    for name in [
        "../bait/file",
        "../../../../../../tmp/x",
        "a/../../bait/file",
        "a/b/../../../outside",
        "./..",
    ] {
        let mut l = Layer::new();
        l.file(name, 0o644, b"pwned\n");
        f.refused(&l, &[name, "`..`"]);
    }
    // The same through a PAX path, and in a directory, symlink and hard link
    // name.
    let mut l = Layer::new();
    l.pax(&[("path", b"../bait/file")])
        .file("harmless", 0o644, b"pwned\n");
    f.refused(&l, &["../bait/file", "`..`"]);
    let mut l = Layer::new();
    l.dir("../bait/dir/", 0o777);
    f.refused(&l, &["`..`"]);
    let mut l = Layer::new();
    l.symlink("../bait/new", "x");
    f.refused(&l, &["`..`"]);
    let mut l = Layer::new();
    l.file("t", 0o644, b"t").hardlink("../bait/new", "t");
    f.refused(&l, &["`..`"]);
}

#[test]
fn absolute_names_are_relative_to_the_rootfs() {
    let f = fx();
    let b = f.b();
    let mut l = Layer::new();
    l.file(&format!("{b}/file"), 0o644, b"pwned\n")
        .dir(&format!("{b}/dir/"), 0o777)
        .file(&format!("{b}/dir/inner"), 0o644, b"pwned\n")
        .file("/etc/hostname", 0o644, b"box\n");
    f.ok(&l);
    let rel = b.trim_start_matches('/');
    assert_eq!(f.read(&format!("{rel}/file")), b"pwned\n");
    assert_eq!(f.read(&format!("{rel}/dir/inner")), b"pwned\n");
    assert_eq!(f.read("etc/hostname"), b"box\n");
}

#[test]
fn the_rootfs_itself_is_never_replaced() {
    let f = fx();
    // A directory entry for the root is skipped.
    let mut l = Layer::new();
    l.dir("./", 0o777).dir("/", 0o700).file("a", 0o644, b"a");
    f.ok(&l);
    assert_eq!(f.mode(""), 0o755);
    // A symlink, file or hard link named `.` or `/` (umoci CVE-2021-29136).
    for name in [".", "/", "./", "//."] {
        let mut l = Layer::new();
        l.symlink(name, &f.b());
        f.refused(&l, &["rootfs itself"]);
        let mut l = Layer::new();
        l.file(name, 0o644, b"x");
        f.refused(&l, &["rootfs itself"]);
    }
    assert_eq!(f.read("a"), b"a");
}

// ------------------------------------------------------------- symlinks

#[test]
fn absolute_symlink_then_a_file_through_it() {
    let f = fx();
    let b = f.b();
    let mut l = Layer::new();
    l.symlink("evil", &b).file("evil/file", 0o644, b"pwned\n");
    f.refused(&l, &["evil/file", "symlink to nothing"]);
    let mut l = Layer::new();
    l.symlink("evil2", &format!("{b}/dir"))
        .file("evil2/inner", 0o644, b"pwned\n");
    f.refused(&l, &["evil2/inner"]);
    // Where the target exists inside the rootfs, the file lands there.
    let rel = b.trim_start_matches('/');
    let mut l = Layer::new();
    l.dir(&format!("{rel}/"), 0o755)
        .symlink("evil3", &b)
        .file("evil3/file", 0o644, b"inside\n");
    f.ok(&l);
    assert_eq!(f.read(&format!("{rel}/file")), b"inside\n");
    assert!(
        fs::symlink_metadata(f.p("evil3"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn relative_dotdot_symlink_then_a_file_through_it() {
    let f = fx();
    let mut l = Layer::new();
    l.symlink("up", "../../x")
        .file("up/file", 0o644, b"pwned\n");
    f.refused(&l, &["up/file"]);
    let mut l = Layer::new();
    l.symlink("up2", "../bait")
        .file("up2/file", 0o644, b"pwned\n");
    f.refused(&l, &["up2/file"]);
    let mut l = Layer::new();
    l.dir("d/", 0o755)
        .symlink("d/up3", "../../../../bait/dir")
        .file("d/up3/inner", 0o644, b"pwned\n");
    f.refused(&l, &["d/up3/inner"]);
    // `..` in a target resolves at the rootfs's top, as at `/`.
    let mut l = Layer::new();
    l.dir("bait/", 0o755).file("up2/new", 0o644, b"inside\n");
    f.ok(&l);
    assert_eq!(f.read("bait/new"), b"inside\n");
}

#[test]
fn symlink_planted_in_an_earlier_layer() {
    let f = fx();
    let b = f.b();
    let mut l1 = Layer::new();
    l1.symlink("lib", &b)
        .symlink("rel", "../bait")
        .dir("usr/", 0o755)
        .dir("usr/lib/", 0o755)
        .symlink("lib64", "/usr/lib");
    f.ok(&l1);
    for name in ["lib/file", "lib/dir/inner", "rel/file", "rel/new"] {
        let mut l2 = Layer::new();
        l2.file(name, 0o644, b"pwned\n");
        f.refused(&l2, &[name]);
        let mut l2 = Layer::new();
        l2.dir(&format!("{name}/"), 0o777);
        f.refused(&l2, &[name]);
    }
    // A symlink to a directory inside the rootfs is followed, inside it.
    let mut l2 = Layer::new();
    l2.file("lib64/libc.so.6", 0o755, b"elf\n");
    f.ok(&l2);
    assert_eq!(f.read("usr/lib/libc.so.6"), b"elf\n");
}

#[test]
fn symlink_chains() {
    let f = fx();
    let b = f.b();
    let mut l = Layer::new();
    l.symlink("a", "b")
        .symlink("b", "c/../d")
        .dir("c/", 0o755)
        .symlink("d", "/e")
        .symlink("e", &b)
        .file("a/file", 0o644, b"pwned\n");
    f.refused(&l, &["a/file"]);
    let mut l = Layer::new();
    l.symlink("r1", "r2")
        .symlink("r2", "../../r3")
        .symlink("r3", "../bait")
        .file("r1/file", 0o644, b"pwned\n");
    f.refused(&l, &["r1/file"]);
    // A loop.
    let mut l = Layer::new();
    l.symlink("l1", "l2")
        .symlink("l2", "/l1")
        .file("l1/x", 0o644, b"x");
    f.refused(&l, &["l1/x", "symlinks"]);
    // A chain that stays inside.
    let mut l = Layer::new();
    l.dir("usr/", 0o755)
        .symlink("x", "y")
        .symlink("y", "/usr")
        .file("x/f", 0o644, b"in\n");
    f.ok(&l);
    assert_eq!(f.read("usr/f"), b"in\n");
}

// ----------------------------------------------------------- hard links

#[test]
fn hard_links_only_to_files_in_the_rootfs() {
    let f = fx();
    let b = f.b();
    let mut l = Layer::new();
    l.hardlink("h", &format!("{b}/file"));
    f.refused(&l, &["\"h\"", "not in the rootfs"]);
    let mut l = Layer::new();
    l.hardlink("h", "../bait/file");
    f.refused(&l, &["`..`"]);
    let mut l = Layer::new();
    l.symlink("s", &b).hardlink("h", "s/file");
    f.refused(&l, &["not in the rootfs"]);
    let mut l = Layer::new();
    l.symlink("s2", "../bait").hardlink("h", "s2/exe");
    f.refused(&l, &["not in the rootfs"]);
    // The bait's own symlink followed to the file: a link to a symlink in
    // the rootfs links the symlink itself.
    let mut l = Layer::new();
    l.symlink("sl", &format!("{b}/file")).hardlink("h", "sl");
    f.ok(&l);
    let m = fs::symlink_metadata(f.p("h")).unwrap();
    assert!(m.file_type().is_symlink());
    assert_eq!(m.ino(), fs::symlink_metadata(f.p("sl")).unwrap().ino());
    // A hard link to a directory is refused.
    let mut l = Layer::new();
    l.dir("d/", 0o755).hardlink("hd", "d");
    f.refused(&l, &["directory"]);
}

// ------------------------------------------------------------ whiteouts

#[test]
fn whiteouts_through_symlinks_stay_inside() {
    let f = fx();
    let b = f.b();
    let mut l1 = Layer::new();
    l1.symlink("s", &b)
        .symlink("r", "../bait")
        .symlink("sf", &format!("{b}/file"));
    f.ok(&l1);
    let mut l2 = Layer::new();
    l2.file("s/.wh.file", 0o644, b"")
        .file("r/.wh.file", 0o644, b"")
        .file("s/.wh.dir", 0o644, b"")
        .file("s/.wh..wh..opq", 0o644, b"")
        .file("r/dir/.wh..wh..opq", 0o644, b"")
        .file(".wh.sf", 0o644, b"");
    f.ok(&l2);
    // The symlink itself went; its target stayed.
    assert!(!f.exists("sf"));
    assert!(f.exists("s") && f.exists("r"));
    // No marker is left.
    assert!(!f.tree().keys().any(|k| k.contains(".wh.")));
    // Whiteouts of `.` and `..`.
    for name in [".wh..", ".wh...", "s/.wh...", ".wh."] {
        let mut l = Layer::new();
        l.file(name, 0o644, b"");
        f.refused(&l, &["whiteout"]);
    }
}

#[test]
fn whiteouts_and_opaque_directories() {
    let f = fx();
    let mut l1 = Layer::new();
    l1.dir("a/", 0o755)
        .file("a/x", 0o644, b"x")
        .file("a/y", 0o644, b"y")
        .dir("a/sub/", 0o755)
        .file("a/sub/z", 0o644, b"z")
        .dir("b/", 0o755)
        .file("b/k", 0o644, b"k")
        .dir("b/deep/", 0o755)
        .dir("b/deep/er/", 0o755)
        .file("b/deep/er/f", 0o644, b"f")
        .symlink("b/l", "/a")
        .file("c", 0o644, b"c")
        .dir("d/", 0o755)
        .file("d/e", 0o644, b"e")
        .dir("g/", 0o755)
        .file("g/h", 0o644, b"h")
        .dir("keep/", 0o755)
        .file("keep/k", 0o644, b"k");
    f.ok(&l1);
    let mut l2 = Layer::new();
    l2.file("a/.wh.x", 0o644, b"")
        .file(".wh.c", 0o644, b"")
        .file(".wh.nothing", 0o644, b"")
        .file("nodir/.wh.x", 0o644, b"")
        // Opaque before the new content...
        .dir("b/", 0o750)
        .file("b/.wh..wh..opq", 0o644, b"")
        .file("b/new", 0o644, b"new")
        // ...and after it: the same layer's content stays either way.
        .dir("d/", 0o755)
        .file("d/fresh", 0o644, b"fresh")
        .file("d/.wh..wh..opq", 0o644, b"")
        // A whiteout of a whole directory, then the same name again.
        .file(".wh.g", 0o644, b"")
        .dir("g/", 0o700)
        .file("g/new", 0o644, b"n")
        // A whiteout after the name it whites out, in the same layer:
        // it stays (whiteouts apply to lower layers).
        .dir("keep/", 0o755)
        .file("keep/new", 0o644, b"n")
        .file(".wh.keep", 0o644, b"")
        .file("n1", 0o644, b"n1")
        .file(".wh.n1", 0o644, b"")
        // AUFS metadata is not part of the tree.
        .dir(".wh..wh.plnk/", 0o700)
        .file(".wh..wh.plnk/1.2", 0o644, b"");
    f.ok(&l2);
    assert_eq!(
        f.tree(),
        expect(&[
            ("a", "dir 755"),
            ("a/y", "file 644 y"),
            ("a/sub", "dir 755"),
            ("a/sub/z", "file 644 z"),
            ("b", "dir 750"),
            ("b/new", "file 644 new"),
            ("d", "dir 755"),
            ("d/fresh", "file 644 fresh"),
            ("g", "dir 700"),
            ("g/new", "file 644 n"),
            ("keep", "dir 755"),
            ("keep/k", "file 644 k"),
            ("keep/new", "file 644 n"),
            ("n1", "file 644 n1"),
        ])
    );
    // A third layer: whiteouts now hide what layer 2 made.
    let mut l3 = Layer::new();
    l3.file("d/.wh.fresh", 0o644, b"")
        .file(".wh.keep", 0o644, b"");
    f.ok(&l3);
    assert!(!f.exists("d/fresh") && f.exists("d") && !f.exists("keep"));
}

// ------------------------------------------------------ modes and types

#[test]
fn modes_never_go_through_a_symlink() {
    let f = fx();
    let b = f.b();
    let mut l1 = Layer::new();
    l1.symlink("m", &format!("{b}/file"))
        .symlink("md", &format!("{b}/dir"))
        .symlink("mr", "../bait/exe")
        .symlink("mf", &format!("{b}/file"));
    f.ok(&l1);
    let mut l2 = Layer::new();
    l2.dir("m/", 0o777)
        .dir("md/", 0o777)
        .file("mr", 0o4777, b"new")
        .raw(EntryType::Fifo, b"mf", b"", 0o777, b"");
    f.ok(&l2);
    assert!(fs::symlink_metadata(f.p("m")).unwrap().is_dir());
    assert_eq!(f.mode("m"), 0o777);
    assert_eq!(f.mode("mr"), 0o777);
    assert!(
        fs::symlink_metadata(f.p("mf"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // Within one layer (containerd CVE-2021-32760): a symlink, then a
    // directory entry by the same name, then content.
    let mut l = Layer::new();
    l.symlink("x", &format!("{b}/dir"))
        .dir("x/", 0o777)
        .file("x/inner", 0o666, b"in");
    f.ok(&l);
    assert_eq!(f.read("x/inner"), b"in");
}

#[test]
fn a_file_replaces_an_existing_symlink_or_file() {
    let f = fx();
    let b = f.b();
    let mut l1 = Layer::new();
    l1.symlink("f", &format!("{b}/file"))
        .symlink("g", "../bait/file")
        .symlink("h", &format!("{b}/exe"))
        .file("t", 0o644, b"t")
        .hardlink("hl", "t")
        .dir("dd/", 0o755)
        .file("dd/x", 0o644, b"x");
    f.ok(&l1);
    let mut l2 = Layer::new();
    l2.file("f", 0o644, b"new f\n")
        .file("g", 0o600, b"new g\n")
        .hardlink("h", "t")
        .file("hl", 0o644, b"new hl\n")
        .file("dd", 0o644, b"was a dir\n");
    f.ok(&l2);
    assert_eq!(f.read("f"), b"new f\n");
    assert_eq!(f.read("g"), b"new g\n");
    assert!(fs::symlink_metadata(f.p("f")).unwrap().is_file());
    assert_eq!(f.read("h"), b"t");
    // The hard link was replaced, not written through.
    assert_eq!(f.read("hl"), b"new hl\n");
    assert_eq!(f.read("t"), b"t");
    assert_eq!(f.read("dd"), b"was a dir\n");
    // Same name twice in one layer: the last wins.
    let mut l = Layer::new();
    l.symlink("twice", &format!("{b}/file"))
        .file("twice", 0o644, b"2");
    f.ok(&l);
    assert_eq!(f.read("twice"), b"2");
}

#[test]
fn devices_are_dropped_fifos_kept() {
    let f = fx();
    let mut l1 = Layer::new();
    l1.dir("dev/", 0o755).file("dev/lower", 0o644, b"lower");
    f.ok(&l1);
    let mut l2 = Layer::new();
    l2.raw(EntryType::Char, b"dev/null", b"", 0o666, b"")
        .raw(EntryType::Block, b"dev/sda", b"", 0o660, b"")
        .raw(EntryType::Char, b"dev/lower", b"", 0o666, b"")
        .raw(EntryType::Char, b"nodir/tty", b"", 0o666, b"")
        .raw(EntryType::Fifo, b"dev/fifo", b"", 0o4640, b"");
    f.ok(&l2);
    assert_eq!(
        f.tree(),
        expect(&[("dev", "dir 755"), ("dev/fifo", "fifo 640")])
    );
}

#[test]
fn setuid_setgid_cleared_and_ownership_not_copied() {
    let f = fx();
    let mut l = Layer::new();
    l.file("suid", 0o4755, b"s")
        .file("sgid", 0o2755, b"g")
        .file("both", 0o6777, b"b")
        .file("sticky", 0o1644, b"t")
        .dir("gdir/", 0o2775)
        .dir("tmp/", 0o1777)
        .dir("ro/", 0o555)
        .file("ro/f", 0o000, b"locked");
    f.ok(&l);
    assert_eq!(f.mode("suid"), 0o755);
    assert_eq!(f.mode("sgid"), 0o755);
    assert_eq!(f.mode("both"), 0o777);
    assert_eq!(f.mode("sticky"), 0o644);
    assert_eq!(f.mode("gdir"), 0o775);
    assert_eq!(f.mode("tmp"), 0o1777);
    // Owner rwx on every directory.
    assert_eq!(f.mode("ro"), 0o755);
    assert_eq!(f.mode("ro/f"), 0o000);
    let me = fs::metadata(&f.root).unwrap();
    for (p, s) in snapshot(&f.root, None) {
        let m = fs::symlink_metadata(f.root.join(&p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (me.uid(), me.gid()), "{p:?} {s:?}");
    }
    // Times come from the headers.
    assert_eq!(fs::metadata(f.p("suid")).unwrap().mtime(), MTIME as i64);
    assert_eq!(fs::metadata(f.p("tmp")).unwrap().mtime(), MTIME as i64);
    // A later layer can still write into the read-only directory and
    // replace the unreadable file.
    let mut l2 = Layer::new();
    l2.file("ro/f", 0o644, b"open").file("ro/g", 0o644, b"g");
    f.ok(&l2);
    assert_eq!(f.read("ro/f"), b"open");
}

#[test]
fn other_entry_types_are_refused() {
    let f = fx();
    let mut l = Layer::new();
    l.raw(EntryType::new(b'V'), b"volume", b"", 0o644, b"");
    f.refused(&l, &["\"volume\"", "not unpacked"]);
}

// ------------------------------------------------------------ caps

#[test]
fn decompression_bomb_hits_max_bytes() {
    let f = fx();
    let caps = Caps {
        max_bytes: 1 << 20,
        ..Caps::default()
    };
    // One file of 64 MiB of zeros: a small blob.
    let mut l = Layer::new();
    l.file("ok", 0o644, b"fine")
        .file("bomb", 0o644, &vec![0u8; 64 << 20]);
    let blob = gz(&l.tar());
    assert!(blob.len() < 1 << 20, "{}", blob.len());
    let e = apply_layer(
        &f.root,
        &blob[..],
        Compression::Gzip,
        &mut Budget::new(caps),
    )
    .unwrap_err();
    f.check();
    assert!(
        matches!(
            e,
            UnpackError::Cap {
                cap: "max_bytes",
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("max_bytes") && msg.contains("\"bomb\""),
        "{msg}"
    );
    // Zeros after the end of the archive count too.
    let mut t = Layer::new().file("a", 0o644, b"a").tar();
    t.extend(std::iter::repeat_n(0u8, 32 << 20));
    let e = apply_layer(
        &f.root,
        &zst(&t)[..],
        Compression::Zstd,
        &mut Budget::new(caps),
    )
    .unwrap_err();
    f.check();
    assert!(e.to_string().contains("max_bytes"), "{e}");
    // The budget is the image's: two layers under the cap each, over it
    // together.
    let mut budget = Budget::new(caps);
    let half = Layer::new().file("h", 0o644, &vec![1u8; 600 << 10]).tar();
    apply_layer(&f.root, &half[..], Compression::None, &mut budget).unwrap();
    let e = apply_layer(&f.root, &half[..], Compression::None, &mut budget).unwrap_err();
    assert!(e.to_string().contains("max_bytes"), "{e}");
    f.check();
}

#[test]
fn many_entries_hit_max_entries() {
    let f = fx();
    let caps = Caps {
        max_entries: 100,
        ..Caps::default()
    };
    let mut l = Layer::new();
    for i in 0..200 {
        l.file(&format!("f{i}"), 0o644, b"");
    }
    let e = apply_layer(
        &f.root,
        &gz(&l.tar())[..],
        Compression::Gzip,
        &mut Budget::new(caps),
    )
    .unwrap_err();
    f.check();
    assert!(
        matches!(
            e,
            UnpackError::Cap {
                cap: "max_entries",
                limit: 100,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("max_entries") && msg.contains("\"f100\""),
        "{msg}"
    );
    // Across layers.
    let mut budget = Budget::new(caps);
    let mut l = Layer::new();
    for i in 0..60 {
        l.file(&format!("g{i}"), 0o644, b"");
    }
    apply_layer(&f.root, &l.tar()[..], Compression::None, &mut budget).unwrap();
    assert_eq!(budget.entries(), 60);
    let e = apply_layer(&f.root, &l.tar()[..], Compression::None, &mut budget).unwrap_err();
    assert!(e.to_string().contains("max_entries"), "{e}");
}

#[test]
fn oversized_tar_metadata_is_refused() {
    let f = fx();
    let big = vec![b'a'; 2 << 20];
    let mut l = Layer::new();
    l.file("first", 0o644, b"1")
        .pax(&[("path", &big)])
        .file("x", 0o644, b"x");
    let e = f.apply(&l).unwrap_err();
    f.check();
    assert!(matches!(e, UnpackError::Metadata { .. }), "{e:?}");
    assert!(e.to_string().contains("after \"first\""), "{e}");
}

#[test]
fn a_truncated_layer_fails() {
    let f = fx();
    let t = Layer::new().file("big", 0o644, &vec![7u8; 10_000]).tar();
    let e = apply_layer(
        &f.root,
        &t[..5000],
        Compression::None,
        &mut Budget::new(Caps::default()),
    )
    .unwrap_err();
    f.check();
    assert!(matches!(e, UnpackError::Read { .. }), "{e:?}");
    let g = gz(&t);
    let e = apply_layer(
        &f.root,
        &g[..g.len() / 2],
        Compression::Gzip,
        &mut Budget::new(Caps::default()),
    )
    .unwrap_err();
    assert!(matches!(e, UnpackError::Read { .. }), "{e:?}");
}

// ------------------------------------------------- compression, diff_id

#[test]
fn gzip_zstd_and_plain_layers_and_their_diff_ids() {
    let mut l = Layer::new();
    l.dir("etc/", 0o755)
        .file("etc/os-release", 0o644, b"ID=test\n")
        .symlink("etc/link", "os-release")
        .file(
            "big",
            0o644,
            &(0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        );
    let mut t = l.tar();
    // Trailing padding (as tar's 10 KiB records have) is part of the
    // diff_id.
    t.extend(std::iter::repeat_n(0u8, 8192));
    let want = sha256(&t);
    let mut trees = Vec::new();
    for (c, blob) in [
        (Compression::None, t.clone()),
        (Compression::Gzip, gz(&t)),
        (Compression::Zstd, zst(&t)),
    ] {
        let f = fx();
        let mut budget = Budget::new(Caps::default());
        let got = apply_layer(&f.root, &blob[..], c, &mut budget).unwrap();
        f.check();
        assert_eq!(got, want, "{c:?}");
        assert_eq!(budget.bytes_read(), t.len() as u64);
        assert_eq!(budget.entries(), 4);
        trees.push(f.tree());
    }
    assert_eq!(trees[0], trees[1]);
    assert_eq!(trees[0], trees[2]);
    assert_eq!(trees[0]["etc/link"], "link os-release");
    // Two gzip members back to back are one stream.
    let f = fx();
    let (a, b) = t.split_at(1536);
    let mut two = gz(a);
    two.extend(gz(b));
    assert_eq!(
        apply_layer(
            &f.root,
            &two[..],
            Compression::Gzip,
            &mut Budget::new(Caps::default())
        )
        .unwrap(),
        want
    );
}

#[test]
fn media_types() {
    use Compression::*;
    for (mt, c) in [
        ("application/vnd.oci.image.layer.v1.tar", None),
        ("application/vnd.oci.image.layer.v1.tar+gzip", Gzip),
        ("application/vnd.oci.image.layer.v1.tar+zstd", Zstd),
        ("application/vnd.docker.image.rootfs.diff.tar", None),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", Gzip),
    ] {
        assert_eq!(Compression::from_media_type(mt).unwrap(), c, "{mt}");
    }
    for (mt, why) in [
        (
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
            "non-distributable",
        ),
        (
            "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
            "foreign",
        ),
        (
            "application/vnd.oci.image.layer.v1.tar+gzip+encrypted",
            "encrypted",
        ),
        (
            "application/vnd.oci.image.layer.v1.tar+bzip2",
            "not a layer media type",
        ),
        (
            "application/vnd.oci.image.config.v1+json",
            "not a layer media type",
        ),
        ("", "not a layer media type"),
    ] {
        let e = Compression::from_media_type(mt).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(&format!("{mt:?}")), "{e}");
    }
}

// --------------------------------------------------- ordinary images

#[test]
fn an_ordinary_multi_layer_image() {
    let f = fx();
    let mut l1 = Layer::new();
    l1.dir("./", 0o755)
        .dir("./etc/", 0o755)
        .file("./etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .dir("./usr/", 0o755)
        .dir("./usr/bin/", 0o755)
        .file("./usr/bin/busybox", 0o755, b"ELF busybox")
        .hardlink("./usr/bin/sh", "./usr/bin/busybox")
        .symlink("./bin", "usr/bin")
        .dir("./usr/lib/", 0o755)
        .symlink("./lib", "/usr/lib")
        .dir("./tmp/", 0o1777)
        .dir("./var/", 0o755)
        .dir("./var/cache/", 0o755)
        .file("./var/cache/old", 0o644, b"old");
    let d1 = f.ok(&l1);
    assert_eq!(d1, sha256(&l1.tar()));
    let mut l2 = Layer::new();
    l2.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n",
    )
    .file("lib/libc.so.6", 0o755, b"ELF libc")
    .hardlink("bin/ls", "usr/bin/busybox")
    // No directory entries for opt/ and opt/app/.
    .file("opt/app/run.sh", 0o755, b"#!/bin/sh\nexec ls\n")
    .symlink("usr/bin/env", "busybox")
    .dir("var/cache/", 0o755)
    .file("var/cache/.wh..wh..opq", 0o644, b"")
    .file("var/cache/new", 0o644, b"new");
    f.ok(&l2);
    assert_eq!(
        f.tree(),
        expect(&[
            ("bin", "link usr/bin"),
            ("etc", "dir 755"),
            (
                "etc/passwd",
                "file 644 root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"
            ),
            ("lib", "link /usr/lib"),
            ("opt", "dir 755"),
            ("opt/app", "dir 755"),
            ("opt/app/run.sh", "file 755 #!/bin/sh\nexec ls\n"),
            ("tmp", "dir 1777"),
            ("usr", "dir 755"),
            ("usr/bin", "dir 755"),
            ("usr/bin/busybox", "file 755 ELF busybox"),
            ("usr/bin/env", "link busybox"),
            ("usr/bin/ls", "file 755 ELF busybox"),
            ("usr/bin/sh", "file 755 ELF busybox"),
            ("usr/lib", "dir 755"),
            ("usr/lib/libc.so.6", "file 755 ELF libc"),
            ("var", "dir 755"),
            ("var/cache", "dir 755"),
            ("var/cache/new", "file 644 new"),
        ])
    );
    let ino = |p: &str| fs::metadata(f.p(p)).unwrap().ino();
    assert_eq!(ino("usr/bin/busybox"), ino("usr/bin/sh"));
    assert_eq!(ino("usr/bin/busybox"), ino("usr/bin/ls"));
    assert_eq!(fs::metadata(f.p("usr/bin/busybox")).unwrap().nlink(), 3);
    // Directory times are the headers', set after their content.
    assert_eq!(fs::metadata(f.p("tmp")).unwrap().mtime(), MTIME as i64);
    assert_eq!(
        fs::metadata(f.p("var/cache")).unwrap().mtime(),
        MTIME as i64
    );
}

#[test]
fn long_names_through_gnu_and_pax_headers() {
    let f = fx();
    let deep = format!("{}/file", ["d"; 80].join("/"));
    let long = format!("long-{}", "n".repeat(150));
    let mut l = Layer::new();
    l.raw(
        EntryType::GNULongName,
        b"././@LongLink",
        b"",
        0o644,
        format!("{deep}\0").as_bytes(),
    )
    .file("short", 0o644, b"deep")
    .pax(&[("path", long.as_bytes()), ("linkpath", b"short")])
    .raw(EntryType::Symlink, b"x", b"", 0o777, b"");
    f.ok(&l);
    assert_eq!(f.read(&deep), b"deep");
    assert_eq!(fs::read_link(f.p(&long)).unwrap(), Path::new("short"));
}

#[test]
fn deep_trees_are_removed_without_deep_recursion() {
    let f = fx();
    // 1500 levels (through a symlink, past PATH_MAX): a whiteout removes
    // them all.
    let mut l = Layer::new();
    let chunk = ["d"; 750].join("/");
    l.dir("top/", 0o755);
    l.pax(&[("path", format!("top/{chunk}/").as_bytes())])
        .dir("x", 0o755);
    l.pax(&[("linkpath", format!("/top/{chunk}").as_bytes())])
        .symlink("mid", "");
    l.pax(&[("path", format!("mid/{chunk}/").as_bytes())])
        .dir("x", 0o755);
    l.pax(&[("path", format!("mid/{chunk}/leaf").as_bytes())])
        .file("x", 0o644, b"leaf");
    f.ok(&l);
    let mut l2 = Layer::new();
    l2.file(".wh.top", 0o644, b"");
    f.ok(&l2);
    assert!(!f.exists("top"));
    assert_eq!(f.tree(), expect(&[("mid", &format!("link /top/{chunk}"))]));
}

// ---------------------------------------------------- unprivileged run

const CHILD_ENV: &str = "CORDON_UNPACK_TEST_CHILD";

/// As root, every other test once more as uid 65534.
#[test]
fn unprivileged() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let probe = cordon_testkit::scratch();
    if fs::metadata(probe.path()).unwrap().uid() != 0 {
        // Already unprivileged: the suite itself is the unprivileged run.
        return;
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        skip::skip_or_fail("unprivileged", "needs /usr/bin/setpriv to run as uid 65534");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args(["--skip", "unprivileged", "--test-threads=2"])
        .env(CHILD_ENV, "1")
        .env("TMPDIR", "/tmp")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && so.contains("test result: ok") && !so.contains(" 0 passed"),
        "as uid 65534:\n{so}\n{se}"
    );
}
