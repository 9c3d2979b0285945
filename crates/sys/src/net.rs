//! Network helpers of the broker: addresses added to a sandbox's `lo` over
//! an rtnetlink socket made inside its namespace, and `splice(2)` between
//! sockets through a pipe (the egress doors' tunnels); and `lo` brought up
//! (a microVM guest's init).

use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// One `RTM_NEWADDR` request adding `ip/prefix` to `lo` (ifindex 1 in a
/// new network namespace).
pub fn newaddr_message(ip: IpAddr, prefix: u8, seq: u32) -> Vec<u8> {
    const RTM_NEWADDR: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_ACK: u16 = 0x4;
    const NLM_F_EXCL: u16 = 0x200;
    const NLM_F_CREATE: u16 = 0x400;
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    let (family, octets): (u8, Vec<u8>) = match ip {
        IpAddr::V4(v) => (libc::AF_INET as u8, v.octets().to_vec()),
        IpAddr::V6(v) => (libc::AF_INET6 as u8, v.octets().to_vec()),
    };
    let mut m = Vec::with_capacity(64);
    m.extend_from_slice(&0u32.to_ne_bytes()); // length, patched below
    m.extend_from_slice(&RTM_NEWADDR.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: kernel
    // struct ifaddrmsg
    m.push(family);
    m.push(prefix);
    m.push(0); // flags
    m.push(0); // scope: universe
    m.extend_from_slice(&1u32.to_ne_bytes()); // ifindex of lo
    for ty in [IFA_LOCAL, IFA_ADDRESS] {
        let len = 4 + octets.len() as u16;
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&octets);
        while m.len() % 4 != 0 {
            m.push(0);
        }
    }
    let len = (m.len() as u32).to_ne_bytes();
    m[..4].copy_from_slice(&len);
    m
}

/// Add `ip/prefix` to `lo` of the namespace `nl` (a `NETLINK_ROUTE`
/// socket) was made in, and wait for the kernel's answer. An address that
/// is already there is not an error. Callers sharing one socket must not
/// call this concurrently (the answers would cross).
pub fn add_local_address(
    nl: BorrowedFd<'_>,
    ip: IpAddr,
    prefix: u8,
    seq: u32,
) -> Result<(), Errno> {
    let msg = newaddr_message(ip, prefix, seq);
    // SAFETY: send reads `msg.len()` bytes of `msg`; a netlink socket with
    // no destination sends to the kernel.
    let n = unsafe { libc::send(nl.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(Errno::last());
    }
    loop {
        let mut buf = [0u8; 512];
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(nl.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = Errno::last();
            if e == Errno::EINTR {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        // The ack: struct nlmsghdr followed by struct nlmsgerr whose first
        // field is the (negative) errno, 0 for success.
        if n < 20 {
            return Err(Errno::EPROTO);
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let got_seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if got_seq != seq {
            // An answer to an earlier request that gave up: not ours.
            continue;
        }
        if ty != libc::NLMSG_ERROR as u16 {
            return Err(Errno::EPROTO);
        }
        let e = -i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        return match e {
            0 => Ok(()),
            e if e == libc::EEXIST => Ok(()),
            e => Err(Errno::from_raw(e)),
        };
    }
}

/// Brings `lo` of the calling thread's network namespace up
/// (`SIOCSIFFLAGS` with `IFF_UP | IFF_RUNNING` on a datagram socket, as the
/// sandbox child does for its doors): a microVM guest's kernel starts with
/// its loopback down. Needs `CAP_NET_ADMIN` in the namespace.
pub fn loopback_up() -> Result<(), Errno> {
    // SAFETY: socket takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else in this process owns; the OwnedFd closes it.
    let sock: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0".iter()) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: ioctl(SIOCSIFFLAGS) reads the ifreq `ifr`, which lives on this
    // stack across the call.
    let rc = unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS,
            &ifr as *const libc::ifreq,
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// A close-on-exec `NETLINK_ROUTE` socket in the calling thread's network
/// namespace (for [`add_local_address`]).
pub fn route_socket() -> Result<std::os::fd::OwnedFd, Errno> {
    // SAFETY: socket takes no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else in this process owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// `splice(2)` up to `len` bytes from `from` to `to` (one of them a pipe),
/// non-blocking, pages moved where the kernel can. `Ok(0)` is end of file
/// on `from`.
pub fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> Result<usize, Errno> {
    // SAFETY: splice with null offsets takes no pointers into our memory;
    // both descriptors are borrowed from the caller.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// `recv(fd, buf, MSG_PEEK | MSG_DONTWAIT)`: the bytes queued on a socket,
/// left there. `Ok(0)` is end of file; EAGAIN when nothing is queued.
pub fn peek(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which the
    // caller lends us.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// `shutdown(fd, SHUT_WR)`: end of file for the peer, reading goes on.
pub fn shutdown_write(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: shutdown takes no pointers, on a descriptor the caller borrows.
    let rc = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// A close-on-exec, non-blocking pipe for [`splice`]: (read end, write
/// end).
pub fn splice_pipe() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), Errno> {
    let (r, w) = crate::io::pipe()?;
    crate::io::set_nonblocking(std::os::fd::AsFd::as_fd(&r), true)?;
    crate::io::set_nonblocking(std::os::fd::AsFd::as_fd(&w), true)?;
    Ok((r, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn loopback_up_in_a_new_network_namespace() {
        // unshare(CLONE_NEWNET) moves only the calling thread: a thread of
        // its own, so the test process keeps its namespace.
        std::thread::spawn(|| {
            // SAFETY: unshare takes no pointers; it changes this thread's
            // network namespace only.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            if rc != 0 {
                eprintln!("skipped: unshare(CLONE_NEWNET): {}", Errno::last());
                return;
            }
            // A new namespace's lo is down: nothing answers on 127.0.0.1.
            assert!(
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| std::net::TcpStream::connect(l.local_addr()?))
                    .is_err()
            );
            loopback_up().unwrap();
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn newaddr_layout() {
        let m = newaddr_message("198.18.0.0".parse().unwrap(), 15, 7);
        assert_eq!(m.len(), 16 + 8 + 8 + 8);
        assert_eq!(
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(&m[16..18], &[libc::AF_INET as u8, 15]);
        assert_eq!(&m[28..32], &[198, 18, 0, 0]);
    }

    #[test]
    fn splice_moves_bytes_between_sockets() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (c, mut d) = std::os::unix::net::UnixStream::pair().unwrap();
        let (r, w) = splice_pipe().unwrap();
        a.write_all(b"through the pipe").unwrap();
        let n = splice(b.as_fd(), w.as_fd(), 1 << 16).unwrap();
        assert_eq!(n, 16);
        assert_eq!(splice(r.as_fd(), c.as_fd(), n).unwrap(), 16);
        let mut got = [0u8; 16];
        d.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"through the pipe");
        // Nothing more to read: non-blocking, EAGAIN.
        assert_eq!(splice(b.as_fd(), w.as_fd(), 1 << 16), Err(Errno::EAGAIN));
    }
}
