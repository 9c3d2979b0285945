//! What every configuration file of cordon's operator shares: reading it
//! only when nobody else could have written (or, for secrets, read) it, and
//! pointing a YAML error at the file's line and column with a one-line
//! message. Also the tenant a caller is in when nothing names one.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// The tenant of a caller (and of a sandbox) when no configuration, claim
/// or flag names one.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant or tool name usable as one path component (of the tenant's
/// workspaces and state images) and as one command-line argument: 1 to 64
/// of letters, digits, `_`, `-` and `.`, not starting with `.` or `-`.
pub fn valid_name_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `s` when [`valid_name_component`] holds of it, else why not, naming it
/// as `what` (`tenant`, `tool`).
pub fn check_name_component<'a>(what: &str, s: &'a str) -> Result<&'a str, String> {
    if valid_name_component(s) {
        Ok(s)
    } else {
        Err(format!(
            "{what} `{}` cannot name a directory (1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.` or `-`)",
            s.escape_debug()
        ))
    }
}

/// How private a file must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privacy {
    /// Configuration: nobody but its owner may write it (mode `& 0o022`).
    NotWritableByOthers,
    /// Secrets and token hashes: nobody but its owner may read or write it
    /// (mode `& 0o077`).
    Private,
}

/// Read `path` (a regular file, owned by this user or root, with the mode
/// `privacy` asks for; checked on the open descriptor). The error says what
/// is wrong; it does not name the file (the caller does).
pub fn read_checked(path: &Path, privacy: Privacy) -> Result<Zeroizing<String>, String> {
    let shown = path.display();
    let mut f = File::open(path).map_err(|e| format!("cannot be opened: {e}"))?;
    let md = f
        .metadata()
        .map_err(|e| format!("cannot be inspected: {e}"))?;
    if !md.is_file() {
        return Err("is not a regular file".into());
    }
    let mode = md.mode() & 0o7777;
    match privacy {
        Privacy::NotWritableByOthers if mode & 0o022 != 0 => {
            return Err(format!(
                "is writable by group or others (mode {mode:04o}); refusing to use it: `chmod go-w {shown}`"
            ));
        }
        Privacy::Private if mode & 0o077 != 0 => {
            return Err(format!(
                "is readable or writable by group or others (mode {mode:04o}); refusing to use it: `chmod 600 {shown}`"
            ));
        }
        _ => {}
    }
    let me = cordon_sys::io::geteuid();
    if md.uid() != me && md.uid() != 0 {
        return Err(format!(
            "is owned by uid {}, neither this user (uid {me}) nor root; refusing to use it",
            md.uid()
        ));
    }
    let mut text = Zeroizing::new(String::new());
    f.read_to_string(&mut text)
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(text)
}

/// Where a YAML error is, and what it says in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// 1-based (1 when the parser gave no location).
    pub line: u64,
    /// 1-based (1 when the parser gave no location).
    pub column: u64,
    /// The first line of the parser's message, without its own `error:` and
    /// `line N column M:` prefixes.
    pub message: String,
}

/// Locate a serde-saphyr error and keep the first line of its rendering as
/// the message.
pub fn yaml_error(e: &serde_saphyr::Error) -> YamlError {
    let (line, column) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((1, 1));
    YamlError {
        line,
        column,
        message: first_line(&e.to_string()),
    }
}

/// serde-saphyr renders a snippet; keep its first line, without a leading
/// `error: ` and without a `line N column M:` that duplicates our own
/// prefix.
pub fn first_line(rendered: &str) -> String {
    let first = rendered
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(rendered)
        .trim()
        .trim_start_matches("error: ")
        .to_string();
    match first.find(": ") {
        Some(i) if first.starts_with("line ") => first[i + 2..].to_string(),
        _ => first,
    }
}

/// Why an operator's file cannot be used: the file, and the line and
/// column of the field when the error is about one (both 0 when it is about
/// the whole file). Shown as `FILE:LINE:COLUMN: MESSAGE` or `FILE: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// 1-based; 0 when the error is about the whole file.
    pub line: u64,
    /// 1-based; 0 with `line`.
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.path.display(),
                self.line,
                self.column,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

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
        assert_eq!(read_checked(&p, Privacy::Private).unwrap().as_str(), "x");
        set(0o640);
        let e = read_checked(&p, Privacy::Private).unwrap_err();
        assert!(e.contains("mode 0640"), "{e}");
        assert_eq!(
            read_checked(&p, Privacy::NotWritableByOthers)
                .unwrap()
                .as_str(),
            "x"
        );
        set(0o660);
        let e = read_checked(&p, Privacy::NotWritableByOthers).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
    }

    #[test]
    fn yaml_errors_point_at_line_and_column() {
        let e = serde_saphyr::from_str::<std::collections::BTreeMap<String, u32>>("a: 1\nb: x\n")
            .unwrap_err();
        let y = yaml_error(&e);
        assert_eq!(y.line, 2, "{y:?}");
        assert!(!y.message.starts_with("error: "), "{y:?}");
        assert!(!y.message.starts_with("line "), "{y:?}");
        assert!(!y.message.contains('\n'), "{y:?}");
    }

    #[test]
    fn first_line_drops_the_parsers_prefixes() {
        assert_eq!(
            first_line("\nerror: line 3 column 4: unknown field `x`\n  |\n"),
            "unknown field `x`"
        );
        assert_eq!(first_line("invalid type: string"), "invalid type: string");
    }
}
