//! `cordon-wasm-componentize`: makes WebAssembly components out of core
//! modules that clang and wasi-libc built (Debian has no component
//! tooling; scripts/build-wasm-example.sh runs this).
//!
//! ```text
//! cordon-wasm-componentize command MODULE OUT
//!     a WASI preview 1 command (`_start`) as a `wasi:cli/command`
//!     component, its preview 1 imports served by wasmtime's adapter
//! cordon-wasm-componentize exports MODULE WIT WORLD OUT
//!     a module that exports the functions of WORLD (in the WIT file) by
//!     the canonical ABI as a component with those typed exports
//! ```
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
    WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};
use wit_component::{ComponentEncoder, StringEncoding, embed_component_metadata};
use wit_parser::Resolve;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["command", module, out] => command(module.as_ref(), out.as_ref()),
        ["exports", module, wit, world, out] => {
            exports(module.as_ref(), wit.as_ref(), world, out.as_ref())
        }
        _ => {
            eprintln!(
                "usage: cordon-wasm-componentize command MODULE OUT | exports MODULE WIT WORLD OUT"
            );
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cordon-wasm-componentize: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

fn write(p: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(p, bytes).with_context(|| format!("writing {}", p.display()))
}

/// Whether the module imports anything of WASI preview 1.
fn imports_preview1(module: &[u8]) -> Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ImportSection(r) = payload? {
            for i in r {
                if i?.module == WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

fn command(module: &Path, out: &Path) -> Result<()> {
    let bytes = read(module)?;
    let component = ComponentEncoder::default()
        .validate(true)
        .module(&bytes)?
        .adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
        )?
        .encode()
        .with_context(|| format!("{}: as a component", module.display()))?;
    write(out, &component)
}

fn exports(module: &Path, wit: &Path, world: &str, out: &Path) -> Result<()> {
    let mut bytes = read(module)?;
    let mut resolve = Resolve::default();
    let pkg = resolve
        .push_path(wit)
        .with_context(|| format!("{}: WIT", wit.display()))?
        .0;
    let world = resolve
        .select_world(&[pkg], Some(world))
        .with_context(|| format!("{}: world {world}", wit.display()))?;
    embed_component_metadata(&mut bytes, &resolve, world, StringEncoding::UTF8)?;
    let mut enc = ComponentEncoder::default().validate(true).module(&bytes)?;
    if imports_preview1(&bytes)? {
        enc = enc.adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    }
    let component = enc
        .encode()
        .with_context(|| format!("{}: as a component", module.display()))?;
    if component.is_empty() {
        bail!("{}: an empty component", module.display());
    }
    write(out, &component)
}
