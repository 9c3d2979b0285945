//! Files the authentication reads: who may have written them, and who may
//! read the ones that hold secrets (checked by `cordon-config`).

use std::path::Path;

pub(crate) use cordon_config::Privacy;
use zeroize::Zeroizing;

/// Read `path` with the privacy it needs; the error names the file and says
/// what is wrong.
pub(crate) fn read_checked(path: &Path, privacy: Privacy) -> Result<Zeroizing<String>, String> {
    cordon_config::read_checked(path, privacy).map_err(|m| format!("{}: {m}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_refusal_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_checked(&p, Privacy::Private).unwrap_err();
        assert!(e.starts_with(&format!("{}: ", p.display())), "{e}");
        assert!(e.contains("mode 0640"), "{e}");
    }
}
