//! cordon-store: MCP servers from npm and PyPI, installed once at an exact
//! version into cordon's own store (a `node_modules` tree, or a relocatable
//! virtual environment on the host's interpreter), keyed by package,
//! version and the lock of its dependencies, so that a sandbox starts them
//! without the network.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a package comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecosystem {
    Npm,
    Pypi,
}

/// A package as asked for: `npm:NAME@VERSION`, `pypi:NAME==VERSION`
/// (version `None`: the newest, resolved and recorded at install).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRef {
    pub ecosystem: Ecosystem,
    pub name: String,
    pub version: Option<String>,
}

/// A bind mount the installed server needs (read-only unless `rw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub rw: bool,
}

/// A package in the store, and how a sandbox runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub package: PackageRef,
    /// The exact version installed.
    pub version: String,
    /// The store directory of this install.
    pub root: PathBuf,
    /// The server's argv as seen inside the sandbox.
    pub command: Vec<String>,
    /// Host paths the sandbox needs (the install, the interpreter).
    pub mounts: Vec<Mount>,
    /// Environment the server needs (e.g. `NODE_PATH`, `PYTHONHOME`).
    pub env: BTreeMap<String, String>,
    /// Digest of the dependency lock the install was keyed by.
    pub lock_digest: String,
}

/// Why a package could not be installed or found.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The store, rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    pub root: PathBuf,
}

impl Store {
    /// The store at `root`.
    pub fn at(root: PathBuf) -> Store {
        Store { root }
    }

    /// Install `pkg` (once: an install already in the store is reused).
    pub fn install(&self, pkg: &PackageRef) -> Result<Installed, StoreError> {
        Err(StoreError::Refused(format!(
            "{}: installing packages is not available in this build",
            pkg.name
        )))
    }
}
