//! `cordon image`: the content-addressed image store. Images are always
//! named by digest (`NAME@sha256:HEX`); every blob is verified while it is
//! read, and an image is unpacked (every layer's diff_id and every entry
//! checked) when it is pulled or loaded: one that could never run is
//! refused there, naming the layer and the entry, and nothing of it kept.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use cordon_image::digest::Digest;
use cordon_image::reference::ImageRef;
use cordon_image::store::{Progress, Store};
use cordon_runtime::wasm::{Keep, gc_cache};

use crate::exit;

#[derive(clap::Args)]
pub struct ImageArgs {
    /// The store (default: /var/lib/cordon as root, else
    /// ~/.local/share/cordon).
    #[arg(long, env = "CORDON_STORE", global = true)]
    pub store: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: ImageCmd,
}

#[derive(clap::Subcommand)]
pub enum ImageCmd {
    /// Pull NAME@sha256:HEX from its registry (HTTPS; Docker's config.json
    /// credentials) into the store, verified and unpacked; a tag alone is
    /// refused.
    Pull {
        reference: String,
        /// A registry (host or host:port) that may be reached over plain
        /// HTTP (loopback registries always may). Repeatable.
        #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
        insecure: Vec<String>,
    },
    /// Import every image of an OCI layout directory, an OCI archive or a
    /// `docker save` archive, each verified and unpacked; prints the pinned
    /// reference of each.
    Load {
        path: PathBuf,
        /// Name them all NAME (default: the names the source gives).
        #[arg(long)]
        name: Option<String>,
    },
    /// The images in the store.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// One image's record and config.
    Inspect { reference: String },
    /// Remove an image's record (its blobs go at the next `gc`).
    Rm { reference: String },
    /// Remove what no record references, nor any image the named manifests
    /// use, and every temporary left by an interrupted pull; and from the
    /// wasm cache (`wasm-cache` in the state directory) the compiled code
    /// of every module the named manifests do not pin (without a manifest:
    /// not used for more than --wasm-max-age days).
    Gc {
        /// Keep the images and wasm modules this manifest names. Repeatable.
        #[arg(short = 'm', long = "manifest")]
        manifests: Vec<PathBuf>,
        /// Without a manifest: remove wasm code not used (run, or
        /// compiled) for more than this many days.
        #[arg(long, value_name = "DAYS", default_value_t = 30)]
        wasm_max_age: u64,
    },
}

fn open(dir: &Option<PathBuf>) -> anyhow::Result<Store> {
    let dir = match dir {
        Some(d) => d.clone(),
        None => Store::default_dir().map_err(|e| anyhow!("{e}"))?,
    };
    Store::open(&dir).map_err(|e| anyhow!("{e}"))
}

/// Remove what `keep` does not keep from the wasm cache, saying each entry
/// removed and the bytes freed.
fn wasm_gc(keep: &Keep) -> anyhow::Result<()> {
    let cache = cordon_dirs::Dirs::current()
        .wasm_cache()
        .map_err(|e| anyhow!("the wasm cache: {e}"))?;
    let g = gc_cache(&cache, keep).with_context(|| format!("wasm cache {}", cache.display()))?;
    for (name, bytes) in &g.removed {
        println!("removed wasm-cache/{name} ({bytes} bytes)");
    }
    println!(
        "wasm cache {}: removed {} compiled modules, {} leftovers ({} bytes)",
        cache.display(),
        g.removed.len(),
        g.leftovers,
        g.bytes
    );
    Ok(())
}

/// `NAME@sha256:HEX` or a bare `sha256:HEX`.
fn digest_of(reference: &str) -> anyhow::Result<Digest> {
    if let Ok(d) = reference.parse::<Digest>() {
        return Ok(d);
    }
    let r: ImageRef = reference.parse().map_err(|e| anyhow!("{e}"))?;
    Ok(r.digest)
}

/// Progress on a terminal, nothing otherwise.
fn progress() -> impl FnMut(&Progress) + Send {
    let tty = std::io::stderr().is_terminal();
    move |p: &Progress| {
        if tty {
            eprint!(
                "\r{}/{} layers, {}/{} bytes",
                p.layers_done, p.layers_total, p.bytes_done, p.bytes_total
            );
        }
    }
}

fn end_progress() {
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}

pub fn run(a: ImageArgs) -> anyhow::Result<ExitCode> {
    let store = open(&a.store)?;
    match a.cmd {
        ImageCmd::Pull {
            reference,
            insecure,
        } => {
            let r: ImageRef = reference.parse().map_err(|e| anyhow!("{e}"))?;
            let opts = cordon_image::registry::PullOptions {
                insecure,
                ..Default::default()
            };
            let mut p = progress();
            let got = cordon_image::registry::pull(&store, &r, &opts, &mut p);
            end_progress();
            let got = got.map_err(|e| anyhow!("{e}"))?;
            println!("{}@{}", r.name(), got.record.digest);
        }
        ImageCmd::Load { path, name } => {
            let mut p = progress();
            let loaded = cordon_image::layout::import(&store, &path, name.as_deref(), &mut p);
            end_progress();
            let loaded = loaded.map_err(|e| anyhow!("{}: {e}", path.display()))?;
            if loaded.is_empty() {
                return Err(anyhow!("{}: no image manifest found", path.display()));
            }
            for l in loaded {
                println!("{l}");
            }
        }
        ImageCmd::Ls { json } => {
            let all = store.ls().map_err(|e| anyhow!("{e}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                for r in all {
                    for name in r.references() {
                        println!(
                            "{name}  {} layers, {} bytes",
                            r.layers.len(),
                            r.layers_size()
                        );
                    }
                }
            }
        }
        ImageCmd::Inspect { reference } => {
            let d = digest_of(&reference)?;
            let i = store.inspect(&d).map_err(|e| anyhow!("{e}"))?;
            let c = &i.config;
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "record": i.record,
                    "config": {
                        "os": c.os, "architecture": c.architecture,
                        "entrypoint": c.entrypoint, "cmd": c.cmd, "env": c.env,
                        "working_dir": c.working_dir, "user": c.user,
                        "diff_ids": c.diff_ids,
                    },
                    "rootfs": i.rootfs,
                }))?
            );
        }
        ImageCmd::Rm { reference } => {
            let d = digest_of(&reference)?;
            let n = store.rm(&d).map_err(|e| anyhow!("{e}"))?;
            if n == 0 {
                eprintln!("cordon: image {reference} is not in the store");
                return Ok(ExitCode::from(exit::FINDING));
            }
            println!("removed {reference}; `cordon image gc` frees its blobs");
        }
        ImageCmd::Gc {
            manifests,
            wasm_max_age,
        } => {
            let mut keep = Vec::new();
            let mut pins = std::collections::BTreeSet::new();
            for m in &manifests {
                let loaded = cordon_policy::load(m).map_err(|e| anyhow!("{e}"))?;
                for t in loaded.policy.tools.values() {
                    if let cordon_policy::policy::Exec::Wasm { sha256, .. } = &t.exec {
                        pins.insert(sha256.trim().to_ascii_lowercase());
                    }
                    let r = match &t.exec {
                        cordon_policy::policy::Exec::Image {
                            reference, digest, ..
                        } => Some(format!("{reference}@{digest}")),
                        cordon_policy::policy::Exec::Mcp { image: Some(i), .. } => Some(i.clone()),
                        _ => None,
                    };
                    if let Some(r) = r {
                        keep.push(digest_of(&r).with_context(|| format!("{}", m.display()))?);
                    }
                }
            }
            let g = store.gc(&keep).map_err(|e| anyhow!("{e}"))?;
            // The microVM disks, snapshots and initramfs of what is left
            // (an image kept here has its unpacked tree, named by its
            // manifest digest).
            let kept: std::collections::BTreeSet<String> =
                std::fs::read_dir(store.dir().join("rootfs"))
                    .map(|d| {
                        d.flatten()
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .filter(|n| !n.starts_with('.'))
                            .collect()
                    })
                    .unwrap_or_default();
            let vm = cordon_runtime::microvm::artifacts::gc(&store.dir().join("vm"), &kept);
            println!(
                "removed {} blobs ({} bytes), {} unpacked trees, {} temporaries; microVM: {} disks, {} snapshots, {} initramfs ({} bytes)",
                g.blobs,
                g.bytes,
                g.rootfs,
                g.temporary,
                vm.disks,
                vm.snapshots,
                vm.initramfs,
                vm.bytes
            );
            let wasm_keep = if manifests.is_empty() {
                Keep::NewerThan(std::time::Duration::from_secs(
                    wasm_max_age.saturating_mul(86400),
                ))
            } else {
                Keep::Pinned(pins)
            };
            wasm_gc(&wasm_keep)?;
        }
    }
    Ok(ExitCode::from(exit::OK))
}
