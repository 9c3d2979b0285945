//! `cordon key`: the host's ed25519 key that signs conformance reports
//! (`cordon probe --report`), and the signing and checking themselves.
//!
//! The private key is a PKCS#8 v1 PEM file (`-----BEGIN PRIVATE KEY-----`,
//! as `openssl genpkey -algorithm ed25519` writes one), mode 0600, created
//! with `O_EXCL` and replaced only with `--force`. Its default place is
//! `report-key.pem` in cordon's configuration directory (`/etc/cordon` as
//! root), never in the state directory. The public key is a PEM
//! SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`), written next to the
//! private key as `FILE.pub`; a key is named by its fingerprint,
//! `sha256:` and the hex of the sha256 of its 32 bytes.
//!
//! ed25519 comes from `ring`, the workspace's crypto provider already.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use base64::Engine as _;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use sha2::Digest as _;

use crate::exit;

/// The DER prefix of an ed25519 SubjectPublicKeyInfo (RFC 8410): the
/// 32 bytes of the key follow it.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The DER of ring's PKCS#8 v2 ed25519 document up to the 32-byte seed.
const RING_V2_PREFIX: [u8; 16] = [
    0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The DER of a PKCS#8 v1 ed25519 private key up to its 32-byte seed
/// (RFC 8410, section 10.3).
const V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A PKCS#8 v1 document of the seed in ring's v2 document `v2`: the form
/// OpenSSL reads and writes (it refuses ring's v2 encoding).
fn pkcs8_v1(v2: &[u8]) -> anyhow::Result<Vec<u8>> {
    let seed = v2
        .strip_prefix(&RING_V2_PREFIX[..])
        .and_then(|rest| rest.get(..32))
        .ok_or_else(|| anyhow!("unexpected PKCS#8 encoding of a new ed25519 key"))?;
    let mut der = V1_PREFIX.to_vec();
    der.extend_from_slice(seed);
    Ok(der)
}

#[derive(clap::Subcommand, Debug)]
pub enum KeyCmd {
    /// Create the ed25519 key pair that signs probe reports: the private
    /// key (PKCS#8 PEM, mode 0600, never overwritten without --force) and
    /// FILE.pub (the public key, PEM). Prints the public key.
    Init {
        /// The private key file. Default: report-key.pem in cordon's
        /// configuration directory ($CORDON_CONFIG_DIR, else /etc/cordon
        /// as root, else $XDG_CONFIG_HOME/cordon or ~/.config/cordon);
        /// never inside the state directory.
        #[arg(long, value_name = "FILE", env = "CORDON_REPORT_KEY")]
        key: Option<PathBuf>,
        /// Replace an existing key (reports it signed then verify only
        /// with its old public key).
        #[arg(long)]
        force: bool,
    },
    /// Print the public key (PEM) of a private key, and its fingerprint on stderr.
    Show {
        /// The private key file (default as for `key init`).
        #[arg(long, value_name = "FILE", env = "CORDON_REPORT_KEY")]
        key: Option<PathBuf>,
    },
}

/// The private key at `given`, else at its default place.
pub fn key_path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => cordon_dirs::Dirs::current()
            .report_key()
            .map_err(|e| anyhow!("{e}, or give --key FILE")),
    }
}

/// `FILE.pub` for the private key `FILE`.
pub fn pub_path(key: &Path) -> PathBuf {
    let mut s = key.as_os_str().to_os_string();
    s.push(".pub");
    PathBuf::from(s)
}

pub fn run(cmd: KeyCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCmd::Init { key, force } => {
            let path = key_path(key.as_deref())?;
            let public = init(&path, force)?;
            let pubfile = pub_path(&path);
            eprintln!(
                "cordon key: wrote the private key {} (mode 0600) and the public key {}",
                path.display(),
                pubfile.display()
            );
            eprintln!("fingerprint {}", public.fingerprint());
            print!("{}", public.to_pem());
        }
        KeyCmd::Show { key } => {
            let path = key_path(key.as_deref())?;
            let public = SigningKey::load(&path)?.public();
            eprintln!("fingerprint {}", public.fingerprint());
            print!("{}", public.to_pem());
        }
    }
    Ok(ExitCode::from(exit::OK))
}

/// Whether `path` lies inside cordon's state directory (where it has no
/// place: the key vouches for what is recorded there).
fn in_state_dir(path: &Path) -> bool {
    let Ok(state) = crate::state::state_dir() else {
        return false;
    };
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    canon(parent).starts_with(canon(&state))
}

/// Make a key pair at `path` (and `path.pub`): its public key.
pub fn init(path: &Path, force: bool) -> anyhow::Result<PublicKey> {
    if in_state_dir(path) {
        return Err(anyhow!(
            "{}: refusing to keep the signing key inside the state directory; choose another --key FILE",
            path.display()
        ));
    }
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| anyhow!("generating an ed25519 key failed"))?;
    let der = pkcs8_v1(pkcs8.as_ref())?;
    let key = SigningKey::from_pkcs8(&der)?;
    if key.public().0 != pkcs8.as_ref()[pkcs8.as_ref().len() - 32..] {
        return Err(anyhow!(
            "a new ed25519 key does not match its own public key"
        ));
    }
    let pem = pem_encode("PRIVATE KEY", &der);
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    if force {
        // A fresh file of mode 0600 renamed over the old key: never a
        // moment where the key is readable by others or half written.
        let tmp = pub_path(path).with_extension(format!("new.{}", std::process::id()));
        write_new(&tmp, pem.as_bytes(), 0o600)?;
        std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    } else {
        write_new(path, pem.as_bytes(), 0o600).map_err(|e| {
            if path.exists() {
                anyhow!(
                    "{}: a key is there already; refusing to overwrite it (--force replaces it)",
                    path.display()
                )
            } else {
                e
            }
        })?;
    }
    let public = key.public();
    let pubfile = pub_path(path);
    let tmp = pubfile.with_extension(format!("pub.new.{}", std::process::id()));
    write_new(&tmp, public.to_pem().as_bytes(), 0o644)?;
    std::fs::rename(&tmp, &pubfile).with_context(|| format!("writing {}", pubfile.display()))?;
    Ok(public)
}

/// Create `path` (never an existing file: `O_EXCL`) with `mode` and `bytes`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// PEM: `-----BEGIN label-----`, base64 in lines of 64, `-----END label-----`.
fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The DER inside the first PEM block labelled `label` in `text`.
fn pem_decode(text: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    let b64: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

/// The private key that signs reports.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.public().fingerprint())
    }
}

impl SigningKey {
    fn from_pkcs8(der: &[u8]) -> anyhow::Result<SigningKey> {
        // Also PKCS#8 v1 (no public key inside), as OpenSSL writes it.
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|e| anyhow!("not an ed25519 PKCS#8 private key: {e}"))?;
        Ok(SigningKey { pair })
    }

    /// The key in `path`, refused when others than its owner may read it.
    pub fn load(path: &Path) -> anyhow::Result<SigningKey> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "reading the report signing key {} (make one with `cordon key init`)",
                path.display()
            )
        })?;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .mode();
        if mode & 0o077 != 0 {
            return Err(anyhow!(
                "{}: the signing key is readable by others (mode {:o}); refusing to use it (chmod 600 it, or make a new one)",
                path.display(),
                mode & 0o777
            ));
        }
        let der = pem_decode(&text, "PRIVATE KEY").ok_or_else(|| {
            anyhow!(
                "{}: no PEM `PRIVATE KEY` block (a key from `cordon key init`)",
                path.display()
            )
        })?;
        SigningKey::from_pkcs8(&der).with_context(|| format!("{}", path.display()))
    }

    pub fn public(&self) -> PublicKey {
        let mut k = [0u8; 32];
        k.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(k)
    }

    /// The ed25519 signature of `msg`.
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.pair.sign(msg).as_ref().to_vec()
    }
}

/// A public key that checks reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

/// A signature that does not verify with the key it was checked with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signature does not verify with key {key}")]
pub struct BadSignature {
    /// The fingerprint of the key.
    pub key: String,
}

impl PublicKey {
    /// `sha256:` and the hex of the sha256 of the key's 32 bytes.
    pub fn fingerprint(&self) -> String {
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(self.0)))
    }

    /// The key as a PEM SubjectPublicKeyInfo.
    pub fn to_pem(self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.0);
        pem_encode("PUBLIC KEY", &der)
    }

    /// A key from a PEM SubjectPublicKeyInfo, or from the base64 of its 32
    /// bytes alone.
    pub fn parse(text: &str) -> Option<PublicKey> {
        let raw = match pem_decode(text, "PUBLIC KEY") {
            Some(der) => der.strip_prefix(&SPKI_PREFIX[..])?.to_vec(),
            None => base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()?,
        };
        Some(PublicKey(raw.try_into().ok()?))
    }

    /// The public key in `path` (a `.pub` file from `cordon key init`).
    pub fn load(path: &Path) -> anyhow::Result<PublicKey> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the public key {}", path.display()))?;
        PublicKey::parse(&text).ok_or_else(|| {
            anyhow!(
                "{}: not an ed25519 public key (PEM `PUBLIC KEY`, or the base64 of its 32 bytes)",
                path.display()
            )
        })
    }

    /// `Ok` when `sig` is this key's signature of `msg`.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), BadSignature> {
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(msg, sig)
            .map_err(|_| BadSignature {
                key: self.fingerprint(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_with_its_key_only_and_for_its_message_only() {
        let dir = cordon_testkit::scratch::scratch();
        let a = dir.path().join("a.pem");
        let b = dir.path().join("b.pem");
        let pa = init(&a, false).unwrap();
        let pb = init(&b, false).unwrap();
        let mode = std::fs::metadata(&a).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let ka = SigningKey::load(&a).unwrap();
        assert_eq!(ka.public(), pa);
        assert_eq!(PublicKey::load(&pub_path(&a)).unwrap(), pa);

        let msg = b"every probe held";
        let sig = ka.sign(msg);
        // Positive control.
        pa.verify(msg, &sig).unwrap();
        // Another key.
        assert_eq!(
            pb.verify(msg, &sig),
            Err(BadSignature {
                key: pb.fingerprint()
            })
        );
        // Another message, one bit off.
        let mut other = msg.to_vec();
        other[3] ^= 1;
        assert!(pa.verify(&other, &sig).is_err());
        // Another signature, one bit off; and a truncated one.
        let mut bad = sig.clone();
        bad[10] ^= 0x40;
        assert!(pa.verify(msg, &bad).is_err());
        assert!(pa.verify(msg, &sig[..63]).is_err());

        // The raw base64 form parses to the same key; other text does not.
        let raw = base64::engine::general_purpose::STANDARD.encode(pa.0);
        assert_eq!(PublicKey::parse(&raw), Some(pa));
        assert_eq!(PublicKey::parse("not a key"), None);
        assert_eq!(PublicKey::parse(&raw[..20]), None);
    }

    #[test]
    fn a_key_is_never_overwritten_without_force_nor_used_when_others_can_read_it() {
        let dir = cordon_testkit::scratch::scratch();
        let a = dir.path().join("k.pem");
        let first = init(&a, false).unwrap();
        let e = init(&a, false).unwrap_err().to_string();
        assert!(e.contains("refusing to overwrite"), "{e}");
        assert_eq!(SigningKey::load(&a).unwrap().public(), first);
        let second = init(&a, true).unwrap();
        assert_ne!(second, first);
        assert_eq!(SigningKey::load(&a).unwrap().public(), second);
        let mode = std::fs::metadata(&a).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);

        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = SigningKey::load(&a).unwrap_err().to_string();
        assert!(e.contains("readable by others"), "{e}");
    }
}
