//! Small OCI image layouts written by hand: blobs and JSON.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use cordon_image::Digest;
use cordon_image::manifest::{Platform, media};
use serde_json::{Value, json};

/// A layer's tar, from `(path, contents)`; a path ending in `/` is a directory.
pub fn tar_layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, path, &[][..]).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, *data).unwrap();
        }
    }
    b.into_inner().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A blob reference as JSON.
pub fn desc(media_type: &str, digest: &Digest, size: usize) -> Value {
    json!({"mediaType": media_type, "digest": digest.to_string(), "size": size})
}

/// One image's parts, as written into a layout.
#[derive(Clone, Debug)]
pub struct Built {
    pub manifest: Digest,
    pub manifest_size: usize,
    pub config: Digest,
    pub layers: Vec<Digest>,
}

/// An OCI image layout being written.
pub struct Layout {
    pub dir: PathBuf,
    pub index: Vec<Value>,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout {
            dir: dir.to_path_buf(),
            index: Vec::new(),
        }
    }

    pub fn blob(&self, bytes: &[u8]) -> Digest {
        let d = Digest::of(bytes);
        std::fs::write(self.blob_path(&d), bytes).unwrap();
        d
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    /// An image of `layers` (`(tar, gzip it?)`), with `config` merged into
    /// the config's `config` object; `diff_ids` overrides the true ones.
    pub fn image_with(
        &self,
        layers: &[(Vec<u8>, bool)],
        arch: &str,
        config: Value,
        diff_ids: Option<Vec<String>>,
    ) -> Built {
        let mut descs = Vec::new();
        let mut digests = Vec::new();
        let mut true_ids = Vec::new();
        for (tar, gz) in layers {
            true_ids.push(Digest::of(tar).to_string());
            let (bytes, mt) = if *gz {
                (gzip(tar), media::OCI_LAYER_GZIP)
            } else {
                (tar.clone(), media::OCI_LAYER)
            };
            let d = self.blob(&bytes);
            descs.push(desc(mt, &d, bytes.len()));
            digests.push(d);
        }
        let cfg = json!({
            "architecture": arch, "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids.unwrap_or(true_ids)},
        });
        let cfg = serde_json::to_vec(&cfg).unwrap();
        let config = self.blob(&cfg);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
            "config": desc(media::OCI_CONFIG, &config, cfg.len()),
            "layers": descs,
        }))
        .unwrap();
        Built {
            manifest: self.blob(&manifest),
            manifest_size: manifest.len(),
            config,
            layers: digests,
        }
    }

    /// A host-platform image of `layers`.
    pub fn image(&self, layers: &[(Vec<u8>, bool)]) -> Built {
        self.image_with(
            layers,
            &Platform::host().architecture,
            json!({"Entrypoint": ["/bin/tool"], "Env": ["PATH=/bin"], "WorkingDir": "/w"}),
            None,
        )
    }

    /// List `d` (of `media_type`, `size`) in index.json, with a ref name.
    pub fn list(&mut self, media_type: &str, d: &Digest, size: usize, ref_name: Option<&str>) {
        let mut e = desc(media_type, d, size);
        if let Some(n) = ref_name {
            e["annotations"] = json!({"org.opencontainers.image.ref.name": n});
        }
        self.index.push(e);
    }

    /// A multi-platform index of `(built, arch)`; returns its digest and size.
    pub fn platform_index(&self, images: &[(&Built, &str)]) -> (Digest, usize) {
        let manifests: Vec<Value> = images
            .iter()
            .map(|(b, arch)| {
                let mut e = desc(media::OCI_MANIFEST, &b.manifest, b.manifest_size);
                e["platform"] = json!({"os": "linux", "architecture": arch});
                e
            })
            .collect();
        let bytes = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": manifests,
        }))
        .unwrap();
        (self.blob(&bytes), bytes.len())
    }

    pub fn finish(&self) {
        let index = json!({
            "schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": self.index,
        });
        std::fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

/// A tar archive of the directory `dir` (regular files and directories).
pub fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
}

/// An architecture that is not the host's.
pub fn other_arch() -> &'static str {
    if Platform::host().architecture == "arm64" {
        "amd64"
    } else {
        "arm64"
    }
}

/// A temporary directory, on tmpfs where there is one (these tests write
/// and remove many small files).
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cordon-image-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}
