//! The kernel random generator's ioctls on `/dev/random`, for a guest
//! restored from a memory snapshot: every sibling restored from one snapshot
//! starts with the same generator state, so the guest init mixes in fresh
//! bytes from the host and forces a reseed before it runs a task.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// `_IOW('R', 0x03, int[2])`: add bytes to the input pool and credit them.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// The most bytes one call adds (the kernel accepts more; a task needs less).
pub const MAX_ENTROPY_BYTES: usize = 256;

/// `struct rand_pool_info` with room for [`MAX_ENTROPY_BYTES`].
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; MAX_ENTROPY_BYTES],
}

/// `RNDADDENTROPY`: mix `bytes` into the input pool, crediting 8 bits of
/// entropy per byte (the caller vouches for them: they come from the host's
/// generator). Needs `CAP_SYS_ADMIN`. At most [`MAX_ENTROPY_BYTES`].
pub fn add_entropy(random: BorrowedFd<'_>, bytes: &[u8]) -> Result<(), Errno> {
    if bytes.is_empty() || bytes.len() > MAX_ENTROPY_BYTES {
        return Err(Errno::EINVAL);
    }
    let len = libc::c_int::try_from(bytes.len()).map_err(|_| Errno::EINVAL)?;
    let mut info = RandPoolInfo {
        entropy_count: len.saturating_mul(8),
        buf_size: len,
        buf: [0; MAX_ENTROPY_BYTES],
    };
    info.buf[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: RNDADDENTROPY reads a `struct rand_pool_info` whose `buf`
    // holds `buf_size` bytes; `info` is that layout and lives across the
    // call.
    let rc = unsafe {
        libc::ioctl(
            random.as_raw_fd(),
            RNDADDENTROPY,
            &info as *const RandPoolInfo,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `RNDRESEEDCRNG`: reseed the kernel's CRNG from the input pool now, so the
/// next read of `/dev/urandom` depends on what [`add_entropy`] added.
pub fn reseed_crng(random: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: RNDRESEEDCRNG takes no argument.
    let rc = unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}
