//! Image indexes, manifests and configs: OCI, and Docker's schema 2
//! manifest list and manifest mapped onto the same types.
//!
//! Refused by name: Docker schema 1 manifests, foreign and non-distributable
//! layers, layer media types other than tar, tar+gzip and tar+zstd (OCI or
//! Docker), and manifests whose config is not a container image config.

use std::collections::HashMap;

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::digest::{Digest, DigestError};

/// Media types this module knows.
pub mod media {
    /// OCI image index.
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// OCI image manifest.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// OCI image config.
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    /// OCI layer, uncompressed tar.
    pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    /// OCI layer, gzip.
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    /// OCI layer, zstd.
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    /// Docker schema 2 manifest list.
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    /// Docker schema 2 manifest.
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    /// Docker schema 1 manifest (refused).
    pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
    /// Docker schema 1 signed manifest (refused).
    pub const DOCKER_SCHEMA1_SIGNED: &str =
        "application/vnd.docker.distribution.manifest.v1+prettyjws";
    /// Docker image config.
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    /// Docker layer, gzip.
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    /// Docker layer, uncompressed tar.
    pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
    /// Docker layer, zstd.
    pub const DOCKER_LAYER_ZSTD: &str = "application/vnd.docker.image.rootfs.diff.tar.zstd";
    /// Docker foreign layer (refused).
    pub const DOCKER_FOREIGN: &str = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";

    /// The manifest and index media types a registry is asked for.
    pub const ACCEPTED: &[&str] = &[OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];
}

/// A document that is not an image this crate accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of the expected shape.
    #[error("{what} is not valid: {why}")]
    Invalid {
        /// What was being parsed.
        what: &'static str,
        /// The parser's message.
        why: String,
    },
    /// Docker image manifest schema 1.
    #[error(
        "Docker image manifest schema 1 is not supported (deprecated and unverifiable); push the image again with schema 2 or OCI"
    )]
    SchemaOne,
    /// Neither an index nor an image manifest.
    #[error("not an image manifest or index: media type `{0}`")]
    NotAnImage(String),
    /// A manifest whose config is not a container image config.
    #[error("not a container image: its config has media type `{0}`")]
    NotAContainerConfig(String),
    /// A foreign or non-distributable layer.
    #[error(
        "layer {digest} is a foreign (non-distributable) layer, media type `{media_type}`: not supported"
    )]
    ForeignLayer {
        /// The layer.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// Any other unsupported layer media type.
    #[error(
        "layer {digest} has media type `{media_type}`: only tar, tar+gzip and tar+zstd layers are supported"
    )]
    UnsupportedLayer {
        /// The layer.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// A digest that is not sha256.
    #[error("{what}: {source}")]
    Digest {
        /// Where the digest is.
        what: String,
        /// What is wrong with it.
        source: DigestError,
    },
    /// No manifest in an index for the host's platform.
    #[error("the image index has no manifest for {wanted} (it has: {available})")]
    NoPlatform {
        /// The host's platform.
        wanted: String,
        /// The platforms the index lists.
        available: String,
    },
    /// A config whose layer list does not fit the manifest, or similar.
    #[error("image config is not usable: {0}")]
    BadConfig(String),
}

/// A reference to a blob: its digest, size and media type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobRef {
    /// The blob's digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Its media type, as the referring document gives it.
    pub media_type: String,
}

/// A layer of an image manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// The compressed blob.
    pub blob: BlobRef,
    /// The OCI media type equivalent to the blob's (Docker's mapped).
    pub oci_media_type: &'static str,
}

/// An image manifest (OCI, or Docker schema 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The manifest's own media type (OCI or Docker).
    pub media_type: String,
    /// The image config.
    pub config: BlobRef,
    /// The layers, bottom first.
    pub layers: Vec<Layer>,
    /// The manifest's annotations.
    pub annotations: HashMap<String, String>,
}

/// One entry of an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The manifest (or nested index) it names.
    pub blob: BlobRef,
    /// Its platform, when the index gives one.
    pub platform: Option<Platform>,
    /// The entry's annotations.
    pub annotations: HashMap<String, String>,
}

/// An image index (OCI) or manifest list (Docker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    /// The index's own media type.
    pub media_type: String,
    /// Its entries.
    pub manifests: Vec<IndexEntry>,
}

/// A parsed manifest-like document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// An index of manifests.
    Index(Index),
    /// An image manifest.
    Manifest(Manifest),
}

/// An operating system and architecture, with the names Go uses (as OCI does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// `linux`, ...
    pub os: String,
    /// `amd64`, `arm64`, ...
    pub architecture: String,
    /// `v8`, `v7`, ... when given.
    pub variant: Option<String>,
}

impl Platform {
    /// Linux on this machine's architecture.
    pub fn host() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "x86" => ("386", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "riscv64" => ("riscv64", None),
            "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
            "s390x" => ("s390x", None),
            "loongarch64" => ("loong64", None),
            "mips64" if cfg!(target_endian = "little") => ("mips64le", None),
            other => (other, None),
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: variant.map(str::to_string),
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    schema_version: Option<u32>,
    media_type: Option<String>,
    manifests: Option<IgnoredAny>,
    config: Option<IgnoredAny>,
    #[serde(rename = "fsLayers")]
    fs_layers: Option<IgnoredAny>,
}

fn invalid(what: &'static str) -> impl Fn(serde_json::Error) -> ManifestError {
    move |e| ManifestError::Invalid {
        what,
        why: e.to_string(),
    }
}

fn digest_of(
    d: &oci_spec::image::Digest,
    what: impl FnOnce() -> String,
) -> Result<Digest, ManifestError> {
    d.to_string()
        .parse()
        .map_err(|source| ManifestError::Digest {
            what: what(),
            source,
        })
}

fn blob_ref(d: &Descriptor, what: impl FnOnce() -> String) -> Result<BlobRef, ManifestError> {
    Ok(BlobRef {
        digest: digest_of(d.digest(), what)?,
        size: d.size(),
        media_type: d.media_type().to_string(),
    })
}

/// Parse an index or an image manifest, telling which by its `mediaType`
/// (or, where an OCI document leaves it out, by its fields).
pub fn parse(bytes: &[u8]) -> Result<Parsed, ManifestError> {
    let probe: Probe = serde_json::from_slice(bytes).map_err(invalid("manifest"))?;
    let media_type = probe.media_type.as_deref();
    if probe.schema_version == Some(1)
        || probe.fs_layers.is_some()
        || matches!(
            media_type,
            Some(media::DOCKER_SCHEMA1 | media::DOCKER_SCHEMA1_SIGNED)
        )
    {
        return Err(ManifestError::SchemaOne);
    }
    let is_index = match media_type {
        Some(media::OCI_INDEX | media::DOCKER_LIST) => true,
        Some(media::OCI_MANIFEST | media::DOCKER_MANIFEST) => false,
        Some(other) => return Err(ManifestError::NotAnImage(other.to_string())),
        None if probe.manifests.is_some() => true,
        None if probe.config.is_some() => false,
        None => return Err(ManifestError::NotAnImage("(none)".into())),
    };
    if probe.schema_version != Some(2) {
        return Err(ManifestError::Invalid {
            what: "manifest",
            why: format!("schemaVersion {:?}, expected 2", probe.schema_version),
        });
    }
    if is_index {
        parse_index(bytes).map(Parsed::Index)
    } else {
        parse_manifest(bytes).map(Parsed::Manifest)
    }
}

/// Parse an index (OCI image index or Docker manifest list).
pub fn parse_index(bytes: &[u8]) -> Result<Index, ManifestError> {
    let index: ImageIndex = serde_json::from_slice(bytes).map_err(invalid("image index"))?;
    let mut manifests = Vec::new();
    for (i, d) in index.manifests().iter().enumerate() {
        let platform = d.platform().as_ref().map(|p| Platform {
            os: p.os().to_string(),
            architecture: p.architecture().to_string(),
            variant: p.variant().clone(),
        });
        manifests.push(IndexEntry {
            blob: blob_ref(d, || format!("index entry {i}"))?,
            platform,
            annotations: d.annotations().clone().unwrap_or_default(),
        });
    }
    Ok(Index {
        media_type: index
            .media_type()
            .as_ref()
            .map_or_else(|| media::OCI_INDEX.to_string(), |m| m.to_string()),
        manifests,
    })
}

/// The OCI equivalent of a supported layer media type.
pub fn layer_media_type(digest: &str, media_type: &str) -> Result<&'static str, ManifestError> {
    match media_type {
        media::OCI_LAYER | media::DOCKER_LAYER => Ok(media::OCI_LAYER),
        media::OCI_LAYER_GZIP | media::DOCKER_LAYER_GZIP => Ok(media::OCI_LAYER_GZIP),
        media::OCI_LAYER_ZSTD | media::DOCKER_LAYER_ZSTD => Ok(media::OCI_LAYER_ZSTD),
        m if m == media::DOCKER_FOREIGN
            || m.starts_with("application/vnd.docker.image.rootfs.foreign.")
            || m.starts_with("application/vnd.oci.image.layer.nondistributable.") =>
        {
            Err(ManifestError::ForeignLayer {
                digest: digest.to_string(),
                media_type: m.to_string(),
            })
        }
        m => Err(ManifestError::UnsupportedLayer {
            digest: digest.to_string(),
            media_type: m.to_string(),
        }),
    }
}

/// Parse an image manifest (OCI, or Docker schema 2).
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let probe: Probe = serde_json::from_slice(bytes).map_err(invalid("image manifest"))?;
    if probe.schema_version == Some(1) || probe.fs_layers.is_some() {
        return Err(ManifestError::SchemaOne);
    }
    let m: ImageManifest = serde_json::from_slice(bytes).map_err(invalid("image manifest"))?;
    let config = blob_ref(m.config(), || "the config".into())?;
    if config.media_type != media::OCI_CONFIG && config.media_type != media::DOCKER_CONFIG {
        return Err(ManifestError::NotAContainerConfig(config.media_type));
    }
    let mut layers = Vec::new();
    for (i, d) in m.layers().iter().enumerate() {
        let blob = blob_ref(d, || format!("layer {i}"))?;
        let oci_media_type = layer_media_type(&blob.digest.to_string(), &blob.media_type)?;
        layers.push(Layer {
            blob,
            oci_media_type,
        });
    }
    Ok(Manifest {
        media_type: m
            .media_type()
            .as_ref()
            .map_or_else(|| media::OCI_MANIFEST.to_string(), |t| t.to_string()),
        config,
        layers,
        annotations: m.annotations().clone().unwrap_or_default(),
    })
}

impl Index {
    /// The entry for `platform`: same os and architecture, preferring the same
    /// variant, then no variant, then the first listed. Entries without a
    /// platform are taken only when no entry names one that fits and only one
    /// entry is an image manifest without a platform.
    pub fn resolve(&self, platform: &Platform) -> Result<&IndexEntry, ManifestError> {
        let fits: Vec<&IndexEntry> = self
            .manifests
            .iter()
            .filter(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == platform.os && p.architecture == platform.architecture)
            })
            .collect();
        let variant = |e: &IndexEntry| e.platform.as_ref().and_then(|p| p.variant.clone());
        if let Some(e) = fits
            .iter()
            .find(|e| platform.variant.is_some() && variant(e) == platform.variant)
            .or_else(|| fits.iter().find(|e| variant(e).is_none()))
            .or_else(|| fits.first())
        {
            return Ok(e);
        }
        let unnamed: Vec<&IndexEntry> = self
            .manifests
            .iter()
            .filter(|e| e.platform.is_none())
            .collect();
        if let [only] = unnamed.as_slice() {
            return Ok(only);
        }
        let available: Vec<String> = self
            .manifests
            .iter()
            .filter_map(|e| e.platform.as_ref().map(ToString::to_string))
            .collect();
        Err(ManifestError::NoPlatform {
            wanted: platform.to_string(),
            available: if available.is_empty() {
                "no platforms".into()
            } else {
                available.join(", ")
            },
        })
    }
}

/// What an image config says about running the image, and its layers'
/// uncompressed digests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageConfig {
    /// `os`.
    pub os: String,
    /// `architecture`.
    pub architecture: String,
    /// `config.Entrypoint`.
    pub entrypoint: Option<Vec<String>>,
    /// `config.Cmd`.
    pub cmd: Option<Vec<String>>,
    /// `config.Env` (`NAME=value` strings).
    pub env: Vec<String>,
    /// `config.WorkingDir`, when set and not empty.
    pub working_dir: Option<String>,
    /// `config.User`, when set and not empty.
    pub user: Option<String>,
    /// `rootfs.diff_ids`: the digest of each layer's uncompressed tar, bottom first.
    pub diff_ids: Vec<Digest>,
}

/// Parse an image config (OCI, or Docker's, which has the same shape).
pub fn parse_config(bytes: &[u8]) -> Result<ImageConfig, ManifestError> {
    let c: ImageConfiguration = serde_json::from_slice(bytes).map_err(invalid("image config"))?;
    if c.rootfs().typ() != "layers" {
        return Err(ManifestError::BadConfig(format!(
            "rootfs.type is `{}`, expected `layers`",
            c.rootfs().typ()
        )));
    }
    let mut diff_ids = Vec::new();
    for (i, d) in c.rootfs().diff_ids().iter().enumerate() {
        diff_ids.push(d.parse().map_err(|source| ManifestError::Digest {
            what: format!("rootfs.diff_ids[{i}]"),
            source,
        })?);
    }
    let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    let run = c.config().as_ref();
    Ok(ImageConfig {
        os: c.os().to_string(),
        architecture: c.architecture().to_string(),
        entrypoint: run.and_then(|r| r.entrypoint().clone()),
        cmd: run.and_then(|r| r.cmd().clone()),
        env: run.and_then(|r| r.env().clone()).unwrap_or_default(),
        working_dir: run.and_then(|r| non_empty(r.working_dir())),
        user: run.and_then(|r| non_empty(r.user())),
        diff_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> String {
        Digest::of(&[n]).to_string()
    }

    fn index(entries: &[(&str, &str, Option<&str>)]) -> Vec<u8> {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .enumerate()
            .map(|(i, (os, arch, variant))| {
                let mut p = serde_json::json!({"os": os, "architecture": arch});
                if let Some(v) = variant {
                    p["variant"] = (*v).into();
                }
                serde_json::json!({
                    "mediaType": media::OCI_MANIFEST,
                    "digest": d(i as u8), "size": 10, "platform": p,
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": media::DOCKER_LIST, "manifests": manifests,
        }))
        .unwrap()
    }

    #[test]
    fn platform_resolution() {
        let Parsed::Index(ix) = parse(&index(&[
            ("linux", "arm", Some("v6")),
            ("linux", "arm64", Some("v8")),
            ("linux", "amd64", None),
            ("unknown", "unknown", None),
            ("linux", "arm", Some("v7")),
        ]))
        .unwrap() else {
            panic!("not an index")
        };
        let pick = |arch: &str, variant: Option<&str>| {
            let p = Platform {
                os: "linux".into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            };
            ix.resolve(&p).map(|e| e.blob.digest.to_string())
        };
        assert_eq!(pick("amd64", None).unwrap(), d(2));
        assert_eq!(pick("arm64", Some("v8")).unwrap(), d(1));
        assert_eq!(pick("arm", Some("v7")).unwrap(), d(4));
        let e = pick("s390x", None).unwrap_err().to_string();
        assert!(
            e.contains("linux/s390x") && e.contains("linux/amd64"),
            "{e}"
        );
        // The host's own platform is among those a real index lists.
        assert!(ix.resolve(&Platform::host()).is_ok() || Platform::host().architecture != "amd64");
    }

    #[test]
    fn refusals_by_name() {
        let s1 = br#"{"schemaVersion":1,"name":"x","tag":"y","fsLayers":[]}"#;
        assert_eq!(parse(s1).unwrap_err(), ManifestError::SchemaOne);
        let manifest = |layer_type: &str| {
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2, "mediaType": media::DOCKER_MANIFEST,
                "config": {"mediaType": media::DOCKER_CONFIG, "digest": d(0), "size": 2},
                "layers": [{"mediaType": layer_type, "digest": d(1), "size": 3}],
            }))
            .unwrap()
        };
        let Parsed::Manifest(m) = parse(&manifest(media::DOCKER_LAYER_GZIP)).unwrap() else {
            panic!()
        };
        assert_eq!(m.layers[0].oci_media_type, media::OCI_LAYER_GZIP);
        let e = parse(&manifest(media::DOCKER_FOREIGN)).unwrap_err();
        assert!(matches!(e, ManifestError::ForeignLayer { .. }), "{e}");
        assert!(e.to_string().contains("foreign"));
        let e = parse(&manifest(
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        ))
        .unwrap_err();
        assert!(matches!(e, ManifestError::ForeignLayer { .. }), "{e}");
        let e = parse(&manifest("application/x-whatever")).unwrap_err();
        assert!(e.to_string().contains("application/x-whatever"), "{e}");
        let wasm = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.wasm.config.v0+json", "digest": d(0), "size": 2},
            "layers": [],
        }))
        .unwrap();
        assert!(matches!(
            parse(&wasm).unwrap_err(),
            ManifestError::NotAContainerConfig(_)
        ));
        let sha512 = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
            "config": {"mediaType": media::OCI_CONFIG, "digest": format!("sha512:{}", "ab".repeat(64)), "size": 2},
            "layers": [],
        }))
        .unwrap();
        let e = parse(&sha512).unwrap_err().to_string();
        assert!(e.contains("sha512"), "{e}");
    }

    #[test]
    fn config_fields() {
        let c = parse_config(
            serde_json::json!({
                "architecture": "amd64", "os": "linux",
                "config": {"Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"], "Env": ["A=1"],
                           "WorkingDir": "/w", "User": "1000:1000"},
                "rootfs": {"type": "layers", "diff_ids": [d(7)]},
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.entrypoint.as_deref(), Some(&["/bin/sh".to_string()][..]));
        assert_eq!(c.cmd.as_ref().map(Vec::len), Some(2));
        assert_eq!(c.env, vec!["A=1"]);
        assert_eq!(c.working_dir.as_deref(), Some("/w"));
        assert_eq!(c.user.as_deref(), Some("1000:1000"));
        assert_eq!(c.diff_ids[0].to_string(), d(7));
    }
}
