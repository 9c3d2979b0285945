//! Importing images from an OCI image layout directory, an OCI archive (a
//! tar of a layout), or a `docker save` archive (its `manifest.json`, with or
//! without an OCI layout beside it).
//!
//! Every image manifest (or index) listed is imported, each blob verified
//! against its digest and size as it is copied into the store, and each
//! image unpacked before it is recorded (see [`Store`]'s ingest). What an
//! archive import copied into the store goes again when it fails, but for
//! what a record uses. Each image is
//! returned with the pinned reference to name it by: `NAME@sha256:HEX`, the
//! name from the `--name` given, else the `io.containerd.image.name` or
//! `org.opencontainers.image.ref.name` annotation, else docker's `RepoTags`,
//! else `local` (a tag in the name is dropped: the digest is the pin).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use crate::digest::Digest;
use crate::manifest::{self, media};
use crate::reference;
use crate::store::{Fetcher, ImageRecord, Progress, Store, StoreError, Want, io_err};

/// The name of an image that carries none.
pub const DEFAULT_NAME: &str = "local";
const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The largest `manifest.json` or `index.json` read from an archive.
const MAX_JSON: u64 = 16 << 20;

/// An imported image.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The name it was imported as.
    pub name: String,
    /// The pinned digest (the index or manifest the source listed).
    pub digest: Digest,
    /// Its store record.
    pub record: ImageRecord,
    /// Whether any blob was copied (false: the image was complete already).
    pub fetched: bool,
}

impl fmt::Display for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.digest)
    }
}

fn source(msg: impl Into<String>) -> StoreError {
    StoreError::Source(msg.into())
}

/// The image name for a `NAME[:TAG]` string: the name without the tag, when
/// it is a valid reference name.
fn name_of(candidate: &str) -> Option<String> {
    let candidate = candidate.split('@').next().unwrap_or(candidate);
    reference::parse_name(candidate).ok()?;
    let last = candidate.rfind('/').map_or(0, |i| i + 1);
    Some(match candidate[last..].rfind(':') {
        Some(i) => candidate[..last + i].to_string(),
        None => candidate.to_string(),
    })
}

/// Import every image at `path` (a layout directory or an archive) into the
/// store; `name` names them all when given.
pub fn import(
    store: &Store,
    path: &Path,
    name: Option<&str>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<Loaded>, StoreError> {
    let name = match name {
        Some(n) => {
            Some(name_of(n).ok_or_else(|| source(format!("`{n}` is not a valid image name")))?)
        }
        None => None,
    };
    let name = name.as_deref();
    let meta = std::fs::metadata(path).map_err(io_err(format!("stat {}", path.display())))?;
    if meta.is_dir() {
        import_dir(store, path, name, progress)
    } else {
        import_archive(store, path, name, progress)
    }
}

/// Blobs from a layout directory.
struct DirFetcher<'a> {
    root: &'a Path,
}

impl Fetcher for DirFetcher<'_> {
    fn fetch(&mut self, want: &Want, out: &mut dyn Write) -> Result<(), StoreError> {
        let path = self.root.join("blobs/sha256").join(want.digest.hex());
        let mut f = File::open(&path).map_err(io_err(format!(
            "blob {} of the layout ({})",
            want.digest,
            path.display()
        )))?;
        io::copy(&mut f, out).map_err(io_err(format!("copy {}", path.display())))?;
        Ok(())
    }
}

/// Blobs already copied into the store from an archive.
struct NoFetcher;

impl Fetcher for NoFetcher {
    fn fetch(&mut self, want: &Want, _out: &mut dyn Write) -> Result<(), StoreError> {
        Err(source(format!(
            "blob {} is not in the archive (or its size is not what the manifest says)",
            want.digest
        )))
    }
}

/// The images an `index.json` lists, with their names.
fn index_images(index_json: &[u8], name: Option<&str>) -> Result<Vec<(String, Want)>, StoreError> {
    let index =
        manifest::parse_index(index_json).map_err(|e| source(format!("index.json: {e}")))?;
    let mut out = Vec::new();
    for entry in &index.manifests {
        let kind = entry.blob.media_type.as_str();
        if !media::ACCEPTED.contains(&kind) {
            continue;
        }
        let annotated = [CONTAINERD_NAME, REF_NAME]
            .iter()
            .find_map(|k| entry.annotations.get(*k).and_then(|v| name_of(v)));
        let name = name
            .map(str::to_string)
            .or(annotated)
            .unwrap_or_else(|| DEFAULT_NAME.to_string());
        out.push((
            name,
            Want {
                digest: entry.blob.digest,
                size: Some(entry.blob.size),
                is_manifest: true,
            },
        ));
    }
    Ok(out)
}

fn ingest_all(
    store: &Store,
    fetcher: &mut dyn Fetcher,
    images: Vec<(String, Want)>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<Loaded>, StoreError> {
    if images.is_empty() {
        return Err(source("no image manifest found"));
    }
    let mut out: Vec<Loaded> = Vec::new();
    for (name, want) in images {
        if out
            .iter()
            .any(|l| l.name == name && l.digest == want.digest)
        {
            continue;
        }
        let ingested = store.ingest(fetcher, &want.digest, want.size, Some(&name), progress)?;
        out.push(Loaded {
            name,
            digest: want.digest,
            record: ingested.record,
            fetched: ingested.fetched,
        });
    }
    Ok(out)
}

fn check_layout_file(bytes: &[u8]) -> Result<(), StoreError> {
    #[derive(serde::Deserialize)]
    struct Layout {
        #[serde(rename = "imageLayoutVersion")]
        version: String,
    }
    let l: Layout =
        serde_json::from_slice(bytes).map_err(|e| source(format!("oci-layout: {e}")))?;
    if !l.version.starts_with("1.") {
        return Err(source(format!(
            "oci-layout: image layout version {} is not supported",
            l.version
        )));
    }
    Ok(())
}

fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, StoreError> {
    let f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut out = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut out)
        .map_err(io_err(format!("read {}", path.display())))?;
    if out.len() as u64 > max {
        return Err(source(format!(
            "{} is larger than {max} bytes",
            path.display()
        )));
    }
    Ok(out)
}

fn import_dir(
    store: &Store,
    root: &Path,
    name: Option<&str>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<Loaded>, StoreError> {
    let layout = root.join("oci-layout");
    if !layout.is_file() {
        return Err(source(format!(
            "{} is not an OCI image layout (no oci-layout file)",
            root.display()
        )));
    }
    check_layout_file(&read_small(&layout, MAX_JSON)?)?;
    let images = index_images(&read_small(&root.join("index.json"), MAX_JSON)?, name)?;
    ingest_all(store, &mut DirFetcher { root }, images, progress)
}

/// A file of an archive: a blob now in the store, or a link to another path.
enum Member {
    Blob(Digest, u64),
    Link(PathBuf),
}

/// `a/./b/../c` as `a/c`; `None` if it climbs out of the archive root.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn resolve(members: &HashMap<PathBuf, Member>, path: &Path) -> Option<(Digest, u64)> {
    let mut path = normalise(path)?;
    for _ in 0..32 {
        match members.get(&path)? {
            Member::Blob(d, s) => return Some((*d, *s)),
            Member::Link(to) => path = to.clone(),
        }
    }
    None
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn import_archive(
    store: &Store,
    path: &Path,
    name: Option<&str>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<Loaded>, StoreError> {
    // Held across the copy and the ingest so gc cannot take the blobs of an
    // archive before its records exist.
    let _shared = store.lock(false)?;
    let mut written = BTreeSet::new();
    let result = import_archive_locked(store, path, name, progress, &mut written);
    if result.is_err() {
        // Nothing copied from a refused (or unreadable) archive stays, but
        // what a record uses (an image of it imported before the failure,
        // or another image sharing a blob).
        store.remove_unused(&written);
    }
    result
}

fn import_archive_locked(
    store: &Store,
    path: &Path,
    name: Option<&str>,
    progress: &mut dyn FnMut(&Progress),
    written: &mut BTreeSet<Digest>,
) -> Result<Vec<Loaded>, StoreError> {
    let file = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut archive = tar::Archive::new(io::BufReader::new(file));
    let mut members: HashMap<PathBuf, Member> = HashMap::new();
    let what = |e: io::Error| io_err(format!("read archive {}", path.display()))(e);
    for entry in archive.entries().map_err(what)? {
        let mut entry = entry.map_err(what)?;
        let Some(name) = normalise(&entry.path().map_err(what)?) else {
            continue;
        };
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            let Some(target) = entry.link_name().map_err(what)? else {
                continue;
            };
            let target = if kind.is_symlink() {
                name.parent().unwrap_or(Path::new("")).join(target)
            } else {
                target.into_owned()
            };
            if let Some(t) = normalise(&target) {
                members.insert(name, Member::Link(t));
            }
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let size = entry.size();
        let named = name
            .strip_prefix("blobs/sha256")
            .ok()
            .and_then(|h| h.to_str())
            .and_then(|h| Digest::from_hex(h).ok());
        let digest = match named {
            Some(d) => {
                if !store.has_blob(&d, size) {
                    let mut w = store.blob_writer(&d, size)?;
                    io::copy(&mut entry, &mut w)
                        .map_err(io_err(format!("copy {} from the archive", name.display())))?;
                    w.commit()?;
                    written.insert(d);
                }
                d
            }
            None => {
                let mut w = store.blob_writer_unnamed()?;
                io::copy(&mut entry, &mut w)
                    .map_err(io_err(format!("copy {} from the archive", name.display())))?;
                let (d, _) = w.commit()?;
                written.insert(d);
                d
            }
        };
        members.insert(name, Member::Blob(digest, size));
    }
    let read = |p: &str| -> Result<Option<Vec<u8>>, StoreError> {
        match resolve(&members, Path::new(p)) {
            Some((d, size)) if size <= MAX_JSON => store.read_blob(&d, MAX_JSON).map(Some),
            Some(_) => Err(source(format!("{p} in the archive is too large"))),
            None => Ok(None),
        }
    };
    if let Some(index) = read("index.json")? {
        if let Some(layout) = read("oci-layout")? {
            check_layout_file(&layout)?;
        }
        let mut images = index_images(&index, name)?;
        // docker save also writes manifest.json: its RepoTags name images
        // that the index leaves unnamed.
        if name.is_none()
            && let Some(list) = read("manifest.json")?
            && let Ok(entries) = serde_json::from_slice::<Vec<DockerEntry>>(&list)
        {
            name_from_repo_tags(store, &members, &entries, &mut images);
        }
        return ingest_all(store, &mut NoFetcher, images, progress);
    }
    let Some(list) = read("manifest.json")? else {
        return Err(source(format!(
            "{} is neither an OCI archive (no index.json) nor a docker save archive (no manifest.json)",
            path.display()
        )));
    };
    let entries: Vec<DockerEntry> =
        serde_json::from_slice(&list).map_err(|e| source(format!("manifest.json: {e}")))?;
    let mut images = Vec::new();
    for entry in &entries {
        let digest = docker_manifest(store, &members, entry)?;
        let mut names: Vec<String> = match name {
            Some(n) => vec![n.to_string()],
            None => entry
                .repo_tags
                .iter()
                .flatten()
                .filter_map(|t| name_of(t))
                .collect(),
        };
        if names.is_empty() {
            names.push(DEFAULT_NAME.to_string());
        }
        for n in names {
            images.push((
                n,
                Want {
                    digest,
                    size: None,
                    is_manifest: true,
                },
            ));
        }
    }
    ingest_all(store, &mut NoFetcher, images, progress)
}

/// Give the unnamed images of an index the `RepoTags` of the docker
/// `manifest.json` entry with the same config.
fn name_from_repo_tags(
    store: &Store,
    members: &HashMap<PathBuf, Member>,
    entries: &[DockerEntry],
    images: &mut [(String, Want)],
) {
    for (name, want) in images.iter_mut() {
        if name != DEFAULT_NAME {
            continue;
        }
        let Ok(bytes) = store.read_blob(&want.digest, crate::store::MAX_MANIFEST_BYTES) else {
            continue;
        };
        let Ok(m) = manifest::parse_manifest(&bytes) else {
            continue;
        };
        let tag = entries
            .iter()
            .filter(|e| {
                resolve(members, Path::new(&e.config)).map(|c| c.0) == Some(m.config.digest)
            })
            .flat_map(|e| e.repo_tags.iter().flatten())
            .find_map(|t| name_of(t));
        if let Some(t) = tag {
            *name = t;
        }
    }
}

/// The media type of a layer blob by its first bytes.
fn sniff_layer(store: &Store, digest: &Digest, size: u64) -> Result<&'static str, StoreError> {
    let mut head = [0u8; 4];
    let mut r = store.open_blob(digest, size)?;
    let mut n = 0;
    while n < head.len() {
        let k = r
            .read(&mut head[n..])
            .map_err(io_err(format!("read layer {digest}")))?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(match head[..n] {
        [0x1f, 0x8b, ..] => media::DOCKER_LAYER_GZIP,
        [0x28, 0xb5, 0x2f, 0xfd] => media::DOCKER_LAYER_ZSTD,
        _ => media::DOCKER_LAYER,
    })
}

/// Write the Docker schema 2 manifest that a `docker save` entry stands for
/// into the store; returns its digest.
fn docker_manifest(
    store: &Store,
    members: &HashMap<PathBuf, Member>,
    entry: &DockerEntry,
) -> Result<Digest, StoreError> {
    let find = |p: &str| {
        resolve(members, Path::new(p)).ok_or_else(|| {
            source(format!(
                "manifest.json names {p}, which is not in the archive"
            ))
        })
    };
    let (config, config_size) = find(&entry.config)?;
    let mut layers = Vec::new();
    for l in &entry.layers {
        let (d, size) = find(l)?;
        let media_type = sniff_layer(store, &d, size)?;
        layers.push(format!(
            r#"{{"mediaType":"{media_type}","size":{size},"digest":"{d}"}}"#
        ));
    }
    // Written by hand so the bytes, and so the digest, never depend on a
    // serialiser's key order.
    let json = format!(
        r#"{{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"{}","size":{config_size},"digest":"{config}"}},"layers":[{}]}}"#,
        media::DOCKER_MANIFEST,
        media::DOCKER_CONFIG,
        layers.join(",")
    );
    let digest = Digest::of(json.as_bytes());
    if !store.has_blob(&digest, json.len() as u64) {
        store.write_blob(&digest, json.len() as u64, json.as_bytes())?;
    }
    Ok(digest)
}
