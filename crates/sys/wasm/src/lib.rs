//! cordon-sys-wasm: the one unsafe operation of the Wasm runner
//! (`cordon-wasm`), turning compiled code back into a module. Part of
//! `cordon-sys` (every `unsafe` block of the project lives under
//! `crates/sys`), a crate of its own so that only the runner depends on
//! wasmtime.
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::multiple_unsafe_ops_per_block)]

/// A module from `code`, machine code that `cordon-wasm compile` wrote with
/// `engine`'s configuration.
///
/// The caller must have checked that `code` is byte for byte what cordon
/// wrote: its sha256 equals the one recorded when it was compiled (the
/// runner hashes this very buffer, so nothing can change between the check
/// and the load).
pub fn deserialize_verified(
    engine: &wasmtime::Engine,
    code: &[u8],
) -> wasmtime::Result<wasmtime::Module> {
    // SAFETY: `Module::deserialize` trusts its input to be the output of
    // `Engine::precompile_module` (it maps it as executable code). The only
    // caller, cordon-wasm, passes bytes whose sha256 it has just compared
    // with the digest cordon recorded when its own compile step wrote them
    // (from a module whose pinned sha256 it verified); wasmtime itself still
    // refuses code from another wasmtime version or engine configuration.
    unsafe { wasmtime::Module::deserialize(engine, code) }
}
