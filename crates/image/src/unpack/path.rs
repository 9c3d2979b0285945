//! Entry names: split into components, and whiteout markers recognised.

use cordon_sys::fsat::Name;

/// The prefix of a whiteout name (`.wh.NAME` removes `NAME`).
pub(super) const WHITEOUT: &[u8] = b".wh.";
/// The name of an opaque-directory marker.
pub(super) const OPAQUE: &[u8] = b".wh..wh..opq";
/// The prefix of AUFS metadata (`.wh..wh.plnk`, `.wh..wh.aufs`), never
/// part of an image's tree.
const AUFS_META: &[u8] = b".wh..wh.";

/// Split an entry name (or a hard link's target) into components. A
/// leading `/` is ignored, as are empty and `.` components: an absolute
/// name is relative to the rootfs. Any `..` component is refused, wherever
/// it is (tar writers never produce one; a name with one is hostile or
/// broken). An empty result names the rootfs itself.
pub(super) fn split(raw: &[u8]) -> Result<Vec<Name>, String> {
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("the name has a `..` component".into()),
            c => match Name::new(c) {
                Some(n) => out.push(n),
                None => return Err("the name holds a NUL byte".into()),
            },
        }
    }
    Ok(out)
}

/// What an entry's name says about whiteouts.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Marker {
    /// An ordinary name.
    None,
    /// AUFS metadata (a name, or a directory on the way, starting with
    /// `.wh..wh.` other than the opaque marker): skipped.
    AufsMeta,
    /// `DIR/.wh..wh..opq`: DIR's content from lower layers goes.
    Opaque,
    /// `DIR/.wh.NAME`: NAME goes.
    Whiteout(Name),
}

/// Classify `comps` (from [`split`]). A directory on the way whose name
/// starts with `.wh.` (other than AUFS metadata) is refused, as is a
/// whiteout of `.`, `..` or of nothing.
pub(super) fn marker(comps: &[Name]) -> Result<Marker, String> {
    let Some((last, dirs)) = comps.split_last() else {
        return Ok(Marker::None);
    };
    for d in dirs {
        let d = d.as_bytes();
        if d.starts_with(AUFS_META) {
            return Ok(Marker::AufsMeta);
        }
        if d.starts_with(WHITEOUT) {
            return Err("a directory on the way is a whiteout name".into());
        }
    }
    let last = last.as_bytes();
    if last == OPAQUE {
        return Ok(Marker::Opaque);
    }
    if last.starts_with(AUFS_META) {
        return Ok(Marker::AufsMeta);
    }
    match last.strip_prefix(WHITEOUT) {
        None => Ok(Marker::None),
        Some(rest) => match Name::new(rest) {
            Some(n) => Ok(Marker::Whiteout(n)),
            None => Err("a whiteout of `.`, `..` or of no name".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(raw: &str) -> Vec<String> {
        split(raw.as_bytes())
            .unwrap()
            .iter()
            .map(|n| String::from_utf8(n.as_bytes().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn split_names() {
        assert_eq!(names("a/b/c"), ["a", "b", "c"]);
        assert_eq!(names("./a//b/./"), ["a", "b"]);
        assert_eq!(names("/etc/passwd"), ["etc", "passwd"]);
        assert_eq!(names("///"), Vec::<String>::new());
        assert_eq!(names("."), Vec::<String>::new());
        assert!(split(b"../x").is_err());
        assert!(split(b"a/../b").is_err());
        assert!(split(b"/..").is_err());
        assert!(split(b"a/..").is_err());
        assert!(split(b"a\0b").is_err());
        // `...` and `..x` are ordinary names.
        assert_eq!(names(".../..x"), ["...", "..x"]);
    }

    fn m(raw: &str) -> Result<Marker, String> {
        marker(&split(raw.as_bytes()).unwrap())
    }

    #[test]
    fn markers() {
        assert_eq!(m("a/b").unwrap(), Marker::None);
        assert_eq!(m("").unwrap(), Marker::None);
        assert_eq!(m("a/.wh..wh..opq").unwrap(), Marker::Opaque);
        assert_eq!(m(".wh..wh..opq").unwrap(), Marker::Opaque);
        assert_eq!(
            m("a/.wh.b").unwrap(),
            Marker::Whiteout(Name::new(b"b").unwrap())
        );
        assert_eq!(
            m(".wh..b").unwrap(),
            Marker::Whiteout(Name::new(b".b").unwrap())
        );
        assert_eq!(m(".wh..wh.plnk").unwrap(), Marker::AufsMeta);
        assert_eq!(m(".wh..wh.plnk/123.456").unwrap(), Marker::AufsMeta);
        assert!(m(".wh.").is_err());
        assert!(m("a/.wh..").is_err());
        assert!(m("a/.wh...").is_err());
        assert!(m(".wh.a/b").is_err());
        assert_eq!(m("a.wh.b").unwrap(), Marker::None);
    }
}
