//! cordon-sys-wasm: the unsafe operations of the Wasm runner
//! (`cordon-wasm`), turning compiled code back into a module or a component. Part of
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

/// A component from `code`, machine code that `cordon-wasm compile` wrote
/// with `engine`'s configuration from a WebAssembly component.
///
/// The caller must have checked that `code` is byte for byte what cordon
/// wrote, as for [`deserialize_verified`].
pub fn deserialize_component_verified(
    engine: &wasmtime::Engine,
    code: &[u8],
) -> wasmtime::Result<wasmtime::component::Component> {
    // SAFETY: as for `deserialize_verified`: `Component::deserialize`
    // trusts its input to be the output of `Engine::precompile_component`;
    // the only caller, cordon-wasm, passes bytes whose sha256 it has just
    // compared with the digest cordon recorded when its own compile step
    // wrote them, and wasmtime still refuses code of another version or
    // configuration, or code of a core module.
    unsafe { wasmtime::component::Component::deserialize(engine, code) }
}
