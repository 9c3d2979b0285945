//! Files the authentication reads: who may have written them, and who may
//! read the ones that hold secrets.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How private a file must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privacy {
    /// Configuration: nobody but its owner may write it (mode `& 0o022`).
    NotWritableByOthers,
    /// Secrets and token hashes: nobody but its owner may read or write it
    /// (mode `& 0o077`).
    Private,
}

/// Read `path` (a regular file, owned by this user or root, with the
/// mode `privacy` asks for; checked on the open descriptor). The error
/// names the file and says what is wrong.
pub(crate) fn read_checked(path: &Path, privacy: Privacy) -> Result<String, String> {
    let shown = path.display();
    let mut f = File::open(path).map_err(|e| format!("{shown}: cannot be opened: {e}"))?;
    let md = f
        .metadata()
        .map_err(|e| format!("{shown}: cannot be inspected: {e}"))?;
    if !md.is_file() {
        return Err(format!("{shown}: is not a regular file"));
    }
    let mode = md.mode() & 0o7777;
    match privacy {
        Privacy::NotWritableByOthers if mode & 0o022 != 0 => {
            return Err(format!(
                "{shown}: is writable by group or others (mode {mode:04o}); refusing to use it: `chmod go-w {shown}`"
            ));
        }
        Privacy::Private if mode & 0o077 != 0 => {
            return Err(format!(
                "{shown}: is readable or writable by group or others (mode {mode:04o}); refusing to use it: `chmod 600 {shown}`"
            ));
        }
        _ => {}
    }
    let me = cordon_sys::io::geteuid();
    if md.uid() != me && md.uid() != 0 {
        return Err(format!(
            "{shown}: is owned by uid {}, neither this user (uid {me}) nor root; refusing to use it",
            md.uid()
        ));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(|e| format!("{shown}: cannot be read: {e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn modes_are_checked_per_privacy() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "x").unwrap();
        let set = |m| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        set(0o600);
        assert_eq!(read_checked(&p, Privacy::Private).unwrap(), "x");
        set(0o640);
        let e = read_checked(&p, Privacy::Private).unwrap_err();
        assert!(e.contains("mode 0640"), "{e}");
        assert_eq!(read_checked(&p, Privacy::NotWritableByOthers).unwrap(), "x");
        set(0o660);
        let e = read_checked(&p, Privacy::NotWritableByOthers).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
    }
}
