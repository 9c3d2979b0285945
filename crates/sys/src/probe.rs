//! Raw system calls made by the conformance probe agent.
//!
//! The probe agent runs inside a sandbox and asks the kernel for things the
//! sandbox should refuse. Most of that goes through nix's safe wrappers; the
//! three calls below have no safe wrapper (bpf, io_uring_setup, keyctl), so
//! they live here. Each returns the kernel's answer unchanged: `Ok` means the
//! kernel granted the request, `Err(errno)` is the refusal.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `BPF_MAP_CREATE` command number (include/uapi/linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
/// `BPF_MAP_TYPE_ARRAY` map type.
const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `KEYCTL_GET_KEYRING_ID` operation (include/uapi/linux/keyctl.h).
const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;

/// Which special keyring `keyctl_get_keyring_id` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyring {
    /// `KEY_SPEC_SESSION_KEYRING` (-3).
    Session,
    /// `KEY_SPEC_USER_KEYRING` (-4): shared by every process of the uid,
    /// across namespaces.
    User,
}

impl Keyring {
    fn spec(self) -> libc::c_long {
        match self {
            Keyring::Session => -3,
            Keyring::User => -4,
        }
    }
}

/// Turn a raw `syscall(2)` return that yields a new descriptor into an
/// `OwnedFd`, or the errno the kernel set.
fn fd_result(rc: libc::c_long) -> Result<OwnedFd, Errno> {
    if rc < 0 {
        return Err(Errno::last());
    }
    let fd = libc::c_int::try_from(rc).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else in this process owns, so handing its ownership to `OwnedFd` (which
    // closes it exactly once on drop) is sound.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ask the kernel to create a one-entry BPF array map (`bpf(BPF_MAP_CREATE)`).
///
/// Success means the bpf(2) surface is reachable from the caller.
pub fn bpf_map_create_array() -> Result<OwnedFd, Errno> {
    // The map-create part of `union bpf_attr`: map_type, key_size,
    // value_size, max_entries, then zeros (flags, inner map, numa node, name,
    // ifindex, btf ids...). 72 bytes is within every kernel's union size; the
    // kernel copies min(size, its size) and requires nothing beyond.
    let mut attr = [0u32; 18];
    attr[0] = BPF_MAP_TYPE_ARRAY;
    attr[1] = 4;
    attr[2] = 4;
    attr[3] = 1;
    // SAFETY: `attr` is a live, initialised, properly aligned buffer of
    // exactly the size passed; the kernel only reads it for BPF_MAP_CREATE.
    // The call has no effect on Rust-visible memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    fd_result(rc)
}

/// Ask the kernel for an io_uring instance with `entries` submission slots
/// (`io_uring_setup(2)`). Success means the io_uring surface is reachable.
pub fn io_uring_setup(entries: u32) -> Result<OwnedFd, Errno> {
    // `struct io_uring_params` is 120 bytes: ten u32 fields, then the
    // 40-byte sq and cq offset structs. All zero asks for defaults; the
    // kernel writes the offsets back into it.
    let mut params = [0u32; 30];
    // SAFETY: `params` is a live, writable, aligned buffer of the 120 bytes
    // the kernel reads and writes for io_uring_setup; nothing else aliases
    // it during the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            libc::c_long::from(entries),
            params.as_mut_ptr(),
        )
    };
    fd_result(rc)
}

/// `keyctl(KEYCTL_GET_KEYRING_ID, keyring, create = 0)`: the serial number of
/// one of the caller's special keyrings. Success means the kernel keyring
/// surface (which is not namespaced) is reachable.
pub fn keyctl_get_keyring_id(keyring: Keyring) -> Result<i64, Errno> {
    // SAFETY: KEYCTL_GET_KEYRING_ID takes only integer arguments and touches
    // no memory of the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_GET_KEYRING_ID,
            keyring.spec(),
            0 as libc::c_long,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(rc) }
}

#[cfg(test)]
mod tests {
    use super::*;

    // These run unconfined, as the test process: the answers depend on the
    // host, so they only check that a refusal is a real errno and a grant is
    // a real descriptor.

    #[test]
    fn bpf_answers_with_fd_or_errno() {
        match bpf_map_create_array() {
            Ok(fd) => assert!(std::os::fd::AsRawFd::as_raw_fd(&fd) > 2),
            Err(e) => assert!(matches!(e, Errno::EPERM | Errno::EACCES | Errno::ENOSYS)),
        }
    }

    #[test]
    fn io_uring_answers_with_fd_or_errno() {
        match io_uring_setup(4) {
            Ok(fd) => assert!(std::os::fd::AsRawFd::as_raw_fd(&fd) > 2),
            Err(e) => assert!(matches!(e, Errno::EPERM | Errno::ENOSYS)),
        }
    }

    #[test]
    fn io_uring_rejects_zero_entries() {
        // Negative control: the kernel refuses 0 entries with EINVAL, which
        // shows the call really reaches io_uring_setup (or is filtered).
        let r = io_uring_setup(0);
        assert!(
            matches!(r, Err(Errno::EINVAL | Errno::EPERM | Errno::ENOSYS)),
            "{r:?}"
        );
    }

    #[test]
    fn keyctl_answers() {
        match keyctl_get_keyring_id(Keyring::Session) {
            Ok(id) => assert!(id > 0),
            Err(e) => assert!(matches!(
                e,
                Errno::EPERM | Errno::EACCES | Errno::ENOSYS | Errno::ENOKEY
            )),
        }
    }
}
