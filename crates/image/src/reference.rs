//! Image references, always pinned by digest: `NAME@sha256:HEX`.
//!
//! `NAME` follows the distribution reference grammar: an optional registry
//! host (`host[:port]`, recognised as such when the first `/`-separated
//! component contains a `.` or a `:`, is `localhost`, or has an upper-case
//! letter), then a repository path of lower-case components. Without a
//! registry the name is on `docker.io`, and a single-component repository
//! there is under `library/` (`busybox` is `docker.io/library/busybox`).
//! A tag alone (`busybox:1.36`) is refused, with the digest form in the
//! message; a tag beside a digest (`busybox:1.36@sha256:...`) is accepted
//! and ignored: the digest is the pin.

use std::fmt;
use std::str::FromStr;

use crate::digest::{Digest, DigestError};

/// The registry of names without one.
pub const DEFAULT_REGISTRY: &str = "docker.io";
const LEGACY_DEFAULT_REGISTRY: &str = "index.docker.io";
const MAX_NAME_LEN: usize = 255;

/// An image named by its manifest (or index) digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// The registry host, with its port if any (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// The repository path inside the registry (`library/busybox`).
    pub repository: String,
    /// The pinned digest.
    pub digest: Digest,
}

/// Why a string is not an accepted image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Named by tag (or by nothing) instead of by digest.
    #[error(
        "image `{given}` is not pinned: name it by its manifest digest, as `{name}@sha256:<64 hex digits>`"
    )]
    NotPinned {
        /// The text given.
        given: String,
        /// Its name, without the tag.
        name: String,
    },
    /// The digest part is not a sha256 digest.
    #[error("image `{given}`: {source}")]
    Digest {
        /// The text given.
        given: String,
        /// What is wrong with the digest.
        source: DigestError,
    },
    /// The name part does not follow the reference grammar.
    #[error("image `{given}`: {why}")]
    Name {
        /// The text given.
        given: String,
        /// What is wrong.
        why: String,
    },
}

impl ImageRef {
    /// `registry/repository`, without the digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.registry, self.repository, self.digest)
    }
}

impl FromStr for ImageRef {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<ImageRef, ReferenceError> {
        let (name_and_tag, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (s, None),
        };
        let (registry, repository, _tag) =
            parse_name(name_and_tag).map_err(|why| ReferenceError::Name {
                given: s.to_string(),
                why,
            })?;
        let Some(digest) = digest else {
            return Err(ReferenceError::NotPinned {
                given: s.to_string(),
                name: strip_tag(name_and_tag).to_string(),
            });
        };
        let digest = digest.parse().map_err(|source| ReferenceError::Digest {
            given: s.to_string(),
            source,
        })?;
        Ok(ImageRef {
            registry,
            repository,
            digest,
        })
    }
}

/// `NAME[:TAG]` without the tag.
fn strip_tag(name_and_tag: &str) -> &str {
    let last = name_and_tag.rfind('/').map_or(0, |i| i + 1);
    match name_and_tag[last..].rfind(':') {
        Some(i) => &name_and_tag[..last + i],
        None => name_and_tag,
    }
}

/// Split `NAME[:TAG]` (no digest) into the normalised registry, repository
/// and tag, following the distribution reference grammar.
pub fn parse_name(name_and_tag: &str) -> Result<(String, String, Option<String>), String> {
    if name_and_tag.is_empty() {
        return Err("the name is empty".into());
    }
    let name = strip_tag(name_and_tag);
    let tag = (name.len() < name_and_tag.len()).then(|| &name_and_tag[name.len() + 1..]);
    if let Some(tag) = tag
        && !valid_tag(tag)
    {
        return Err(format!("`{tag}` is not a valid tag"));
    }
    let (mut registry, mut repository) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_REGISTRY.to_string(), name.to_string()),
    };
    if registry == LEGACY_DEFAULT_REGISTRY {
        registry = DEFAULT_REGISTRY.to_string();
    }
    if !valid_registry(&registry) {
        return Err(format!("`{registry}` is not a valid registry host[:port]"));
    }
    if repository.is_empty() || !repository.split('/').all(valid_path_component) {
        return Err(format!(
            "`{repository}` is not a valid repository (lower-case letters, digits and . _ - separators, components separated by /)"
        ));
    }
    if registry == DEFAULT_REGISTRY && !repository.contains('/') {
        repository = format!("library/{repository}");
    }
    if registry.len() + 1 + repository.len() > MAX_NAME_LEN {
        return Err(format!("the name is longer than {MAX_NAME_LEN} characters"));
    }
    Ok((registry, repository, tag.map(str::to_string)))
}

fn valid_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
}

/// `alnum+ (separator alnum+)*`, separator `.`, `_`, `__` or `-+`.
fn valid_path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let mut i = 0;
    let mut need_alnum = true;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            need_alnum = false;
            i += 1;
            continue;
        }
        if need_alnum {
            return false;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
        need_alnum = true;
    }
    !need_alnum
}

/// `host[:port]`: a DNS name, an IPv4 address, or `[IPv6]`.
fn valid_registry(registry: &str) -> bool {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(p) => ("", Some(p)),
                None => return false,
            },
        }
    } else {
        match registry.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (registry, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    if host.is_empty() {
        return registry.starts_with('[');
    }
    host.split('.').all(|c| {
        let b = c.as_bytes();
        !b.is_empty()
            && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn r(s: &str) -> ImageRef {
        s.parse().unwrap()
    }

    #[test]
    fn normalisation() {
        let x = r(&format!("busybox@{D}"));
        assert_eq!(
            (x.registry.as_str(), x.repository.as_str()),
            ("docker.io", "library/busybox")
        );
        let x = r(&format!("index.docker.io/foo/bar@{D}"));
        assert_eq!(x.name(), "docker.io/foo/bar");
        let x = r(&format!("127.0.0.1:5000/mcp/jira@{D}"));
        assert_eq!(x.registry, "127.0.0.1:5000");
        assert_eq!(x.repository, "mcp/jira");
        let x = r(&format!("localhost/a@{D}"));
        assert_eq!(x.registry, "localhost");
        let x = r(&format!("[::1]:5000/a@{D}"));
        assert_eq!(x.registry, "[::1]:5000");
        let x = r(&format!("registry.internal/mcp/jira:1.2@{D}"));
        assert_eq!(x.to_string(), format!("registry.internal/mcp/jira@{D}"));
        // Not a registry: no dot, colon or upper case in the first component.
        let x = r(&format!("foo/bar@{D}"));
        assert_eq!(x.name(), "docker.io/foo/bar");
    }

    #[test]
    fn refusals() {
        let e = "busybox:1.36".parse::<ImageRef>().unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ReferenceError::NotPinned { .. }));
        assert!(msg.contains("busybox@sha256:"), "{msg}");
        let e = "localhost:5000/a/b".parse::<ImageRef>().unwrap_err();
        assert!(e.to_string().contains("localhost:5000/a/b@sha256:"), "{e}");
        assert!("Busybox@sha256:00".parse::<ImageRef>().is_err());
        assert!(format!("UPPER@{D}").parse::<ImageRef>().is_err());
        assert!(format!("a//b@{D}").parse::<ImageRef>().is_err());
        assert!(format!("a/-b@{D}").parse::<ImageRef>().is_err());
        let e = "a@sha512:00".parse::<ImageRef>().unwrap_err();
        assert!(e.to_string().contains("sha512"), "{e}");
        assert!(format!("bad host!/a@{D}").parse::<ImageRef>().is_err());
    }

    #[test]
    fn components() {
        for ok in ["a", "a.b", "a_b", "a__b", "a---b", "a1-2.3_4"] {
            assert!(valid_path_component(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a..b", "a___b", "A", "a.-b"] {
            assert!(!valid_path_component(bad), "{bad}");
        }
    }
}
