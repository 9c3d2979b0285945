//! Static bearer tokens for small setups. The token file holds one line
//! per token, never the token itself:
//!
//! ```text
//! # NAME  HASH                      [tenant=T] [groups=a,b]
//! ci      sha256:9f86d081884c7d65…  tenant=build groups=ci,readers
//! ```
//!
//! A token is `cordon_` and 43 characters of base64url (256 random bits),
//! so an unsalted SHA-256 of it cannot be searched for; a presented token
//! is hashed and compared with every entry in constant time. The file must
//! be owned by this user or root and be neither group- nor world-readable.
//! `cordon token add NAME` makes a token, prints it once and stores only
//! its hash ([`add`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::files::{Privacy, read_checked};
use crate::{DEFAULT_TENANT, Method, Principal};

/// The prefix of every static token.
pub const TOKEN_PREFIX: &str = "cordon_";

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    hash: [u8; 32],
    tenant: String,
    groups: Vec<String>,
}

/// The tokens of a token file.
#[derive(Debug, Clone)]
pub struct StaticTokens {
    path: PathBuf,
    entries: Vec<Entry>,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn parse_line(n: usize, line: &str) -> Result<Option<Entry>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let at = |m: String| format!("line {n}: {m}");
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or_default().to_string();
    check_name(&name).map_err(at)?;
    let h = words
        .next()
        .and_then(|w| w.strip_prefix("sha256:"))
        .ok_or_else(|| {
            at(format!(
                "token `{name}`: expected `sha256:HEX` after the name"
            ))
        })?;
    let mut hash = [0u8; 32];
    hex::decode_to_slice(h, &mut hash)
        .map_err(|_| at(format!("token `{name}`: the hash is not 64 hex digits")))?;
    let mut tenant = DEFAULT_TENANT.to_string();
    let mut groups = Vec::new();
    for w in words {
        if let Some(t) = w.strip_prefix("tenant=") {
            crate::claims::check_tenant(t).map_err(at)?;
            tenant = t.to_string();
        } else if let Some(g) = w.strip_prefix("groups=") {
            groups = g
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
        } else {
            return Err(at(format!(
                "token `{name}`: unknown field `{w}` (tenant=, groups=)"
            )));
        }
    }
    Ok(Some(Entry {
        name,
        hash,
        tenant,
        groups,
    }))
}

/// A token name: letters, digits, `.`, `_`, `-`, `@`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
    {
        return Err(format!(
            "token name `{}` is not letters, digits, `.`, `_`, `-` or `@`",
            name.escape_debug()
        ));
    }
    Ok(())
}

impl StaticTokens {
    /// Load and check a token file.
    pub fn load(path: &Path) -> Result<StaticTokens, String> {
        let text = read_checked(path, Privacy::Private)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<StaticTokens, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if let Some(e) =
                parse_line(i + 1, line).map_err(|m| format!("{}: {m}", path.display()))?
            {
                if entries.iter().any(|x| x.name == e.name) {
                    return Err(format!(
                        "{}: line {}: token `{}` is listed twice",
                        path.display(),
                        i + 1,
                        e.name
                    ));
                }
                entries.push(e);
            }
        }
        Ok(StaticTokens {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// How many tokens the file lists.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The principal of `token`, if it is one of the file's. Every entry
    /// is compared (in constant time), whichever matches.
    pub fn check(&self, token: &str) -> Option<Principal> {
        let h = hash(token);
        let mut found: Option<&Entry> = None;
        for e in &self.entries {
            if bool::from(e.hash.ct_eq(&h)) {
                found = Some(e);
            }
        }
        found.map(|e| Principal {
            subject: e.name.clone(),
            client_id: None,
            groups: e.groups.clone(),
            tenant: e.tenant.clone(),
            method: Method::StaticToken,
        })
    }
}

/// A new token: [`TOKEN_PREFIX`] and 256 random bits in base64url.
pub fn generate() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness for a token: {e}"))?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    ))
}

/// Make a token named `name`, append its hash (with `tenant` and `groups`)
/// to the file at `path` (created mode 0600; an existing file must pass
/// the same checks as when it is loaded, and must not list `name` yet),
/// and return the token, which is stored nowhere. The file is never
/// written through a symbolic link.
pub fn add(
    path: &Path,
    name: &str,
    tenant: Option<&str>,
    groups: &[String],
) -> Result<String, String> {
    check_name(name)?;
    if let Some(t) = tenant {
        crate::claims::check_tenant(t)?;
    }
    if let Some(g) = groups
        .iter()
        .find(|g| g.is_empty() || g.contains([',', ' ', '\t']))
    {
        return Err(format!(
            "group `{}` is empty or holds `,` or blanks",
            g.escape_debug()
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(_) => {
            let existing = StaticTokens::load(path)?;
            if existing.entries.iter().any(|e| e.name == name) {
                return Err(format!("{}: token `{name}` exists already", path.display()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: cannot be inspected: {e}", path.display())),
    }
    let token = generate()?;
    let mut line = format!("{name} sha256:{}", hex::encode(hash(&token)));
    if let Some(t) = tenant {
        line.push_str(&format!(" tenant={t}"));
    }
    if !groups.is_empty() {
        line.push_str(&format!(" groups={}", groups.join(",")));
    }
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{}: cannot be opened for writing: {e}", path.display()))?;
    f.write_all(line.as_bytes())
        .map_err(|e| format!("{}: cannot be written: {e}", path.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn added_tokens_check_and_others_do_not() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tokens");
        let t = add(&p, "ci", Some("build"), &["ci".into(), "readers".into()]).unwrap();
        let u = add(&p, "ops", None, &[]).unwrap();
        assert!(t.starts_with(TOKEN_PREFIX) && t.len() == TOKEN_PREFIX.len() + 43);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains(&t[TOKEN_PREFIX.len()..]),
            "the token is not stored"
        );
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let st = StaticTokens::load(&p).unwrap();
        assert_eq!(st.len(), 2);
        let p1 = st.check(&t).unwrap();
        assert_eq!((p1.subject.as_str(), p1.tenant.as_str()), ("ci", "build"));
        assert_eq!(p1.groups, vec!["ci", "readers"]);
        assert_eq!(p1.method, Method::StaticToken);
        assert_eq!(st.check(&u).unwrap().tenant, DEFAULT_TENANT);
        // A wrong token (one character off) and the hash itself are refused.
        let mut wrong = t.clone();
        wrong.pop();
        wrong.push(if t.ends_with('A') { 'B' } else { 'A' });
        assert!(st.check(&wrong).is_none());
        assert!(st.check(text.split_whitespace().nth(1).unwrap()).is_none());
        assert!(
            add(&p, "ci", None, &[])
                .unwrap_err()
                .contains("exists already")
        );
        // Too open: refused, naming the mode.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(StaticTokens::load(&p).unwrap_err().contains("mode 0644"));
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = StaticTokens::parse(Path::new("t"), "# c\n\nci sha256:00\n").unwrap_err();
        assert!(e.contains("line 3") && e.contains("64 hex"), "{e}");
        let e = StaticTokens::parse(
            Path::new("t"),
            &format!("ci sha256:{} x=1\n", "0".repeat(64)),
        )
        .unwrap_err();
        assert!(e.contains("line 1") && e.contains("unknown field"), "{e}");
    }
}
