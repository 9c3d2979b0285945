//! Descriptor passing over a unix socket (`SCM_RIGHTS`), one descriptor
//! with a one-byte payload per message: the child's [`send_fd`] (raw, no
//! errno, no allocation) and the parent's [`recv_fd`].

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

use super::raw::sc;

/// Room for the control message of one descriptor, aligned:
/// `CMSG_SPACE(sizeof(int))` is 24 bytes.
type ControlBuf = [u64; 4];

/// Send one descriptor with a one-byte payload over a unix socket; the raw
/// result of `sendmsg` (`-errno` on failure).
///
/// # Safety
/// Child-safe (no allocation, no errno): `fd` must be a descriptor of the
/// caller's.
pub(super) unsafe fn send_fd(sock: RawFd, fd: RawFd) -> isize {
    let mut byte = [b'd'; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cbuf: ControlBuf = [0; 4];
    // SAFETY: msghdr is plain data; all-zero is valid (no name, no iov).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: CMSG_FIRSTHDR reads `msg`'s control fields, which describe
    // `cbuf`.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: `cmsg` is the start of `cbuf` (not null, checked), which has
    // room and alignment for a cmsghdr.
    let hdr = unsafe { &mut *cmsg };
    hdr.cmsg_level = libc::SOL_SOCKET;
    hdr.cmsg_type = libc::SCM_RIGHTS;
    // SAFETY: CMSG_LEN only computes a size.
    hdr.cmsg_len = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: CMSG_DATA only computes the address after the header, inside
    // `cbuf`.
    let data = unsafe { libc::CMSG_DATA(cmsg) };
    // SAFETY: `data` has room for one int inside `cbuf` (CMSG_SPACE above);
    // the write does not need alignment.
    unsafe { std::ptr::write_unaligned(data.cast::<RawFd>(), fd) };
    // SAFETY: sendmsg reads `msg`, `iov`, `byte` and `cbuf`, all on this
    // stack and alive for the call.
    unsafe {
        sc!(
            libc::SYS_sendmsg,
            sock,
            &msg as *const libc::msghdr,
            libc::MSG_NOSIGNAL
        )
    }
}

/// Receive one descriptor sent by the child. `Ok(None)` at end of stream.
pub fn recv_fd(sock: &impl AsRawFd) -> Result<Option<OwnedFd>, Errno> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cbuf: ControlBuf = [0; 4];
    // SAFETY: msghdr is plain data; all-zero is valid (no name, no iov).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: recvmsg writes into `byte` and `cbuf` through `msg` and
        // `iov`, at most the lengths they give; all are on this stack.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(Errno::last());
    }
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: CMSG_FIRSTHDR reads `msg`'s control fields, which the kernel
    // set to within `cbuf`.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Err(Errno::EPROTO);
    }
    // SAFETY: `cmsg` (not null) points at a cmsghdr the kernel wrote inside
    // `cbuf`.
    let ty = unsafe { (*cmsg).cmsg_type };
    if ty != libc::SCM_RIGHTS {
        return Err(Errno::EPROTO);
    }
    // SAFETY: CMSG_DATA only computes the address after the header, inside
    // `cbuf`.
    let data = unsafe { libc::CMSG_DATA(cmsg) };
    // SAFETY: an SCM_RIGHTS message carries at least one int after its
    // header, inside `cbuf`; the read does not need alignment.
    let fd = unsafe { std::ptr::read_unaligned(data.cast::<RawFd>()) };
    // SAFETY: the kernel installed `fd` as a new descriptor of this process
    // that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}
