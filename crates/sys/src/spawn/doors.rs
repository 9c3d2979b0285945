//! Network doors, child side: `lo` up, the local addresses added to it
//! over rtnetlink, then each door socket made, bound (and listening, for
//! stream sockets) and sent to the parent over the doors socket (fd 5),
//! then, if asked, an rtnetlink socket of the namespace.
//! See the jail crate for what the parent does with them.

use std::os::fd::RawFd;

use super::ChildStep;
use super::fdpass::send_fd;
use super::plan::DoorsPlan;
use super::raw::{ck, exit, read_byte, sc};
use super::step::ErrPipe;

/// The doors socket after the descriptors are moved.
const DOORS_FD: RawFd = 5;

/// The plan's doors.
#[derive(Debug, Clone, Copy)]
pub(super) struct Doors<'a> {
    plan: &'a DoorsPlan,
}

impl<'a> Doors<'a> {
    pub(super) fn of(plan: &'a DoorsPlan) -> Self {
        Doors { plan }
    }

    /// Failures are [`ChildStep::DoorsLoopback`],
    /// [`ChildStep::DoorsAddress`], [`ChildStep::DoorsSocket`] (with the
    /// address's or socket's index) and [`ChildStep::DoorsSend`].
    ///
    /// # Safety
    /// Child only, in its new network namespace, with the doors socket on
    /// fd 5.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        // SAFETY: child only (the function contract), as for each call
        // below.
        unsafe { loopback_up(err) };
        if !self.plan.addr_messages.is_empty() {
            // SAFETY: child only.
            unsafe { add_addresses(&self.plan.addr_messages, err) };
        }
        // SAFETY: child only, fd 5 is the doors socket.
        unsafe { send_sockets(&self.plan.sockets, err) };
        if self.plan.route_socket {
            // SAFETY: child only, fd 5 is the doors socket.
            unsafe { send_route_socket(self.plan.sockets.len(), err) };
        }
        // Wait until the parent has handed the sockets over.
        // SAFETY: child only.
        if !unsafe { read_byte(DOORS_FD) } {
            // SAFETY: child only.
            unsafe { exit(126) }
        }
        // SAFETY: close takes no pointers; fd 5 is the child's, used no more.
        unsafe { sc!(libc::SYS_close, DOORS_FD) };
    }
}

/// `lo` up: SIOCSIFFLAGS with IFF_UP | IFF_RUNNING on an AF_INET datagram
/// socket (any family works for the ioctl).
///
/// # Safety
/// Child only.
unsafe fn loopback_up(err: ErrPipe) {
    // SAFETY: socket takes no pointers; the descriptor is new and ours.
    let s = unsafe {
        sc!(
            libc::SYS_socket,
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0
        )
    };
    err.check(ChildStep::DoorsLoopback, s);
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0".iter()) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: ioctl(SIOCSIFFLAGS) reads the ifreq `ifr`, on this stack.
    let r = unsafe {
        sc!(
            libc::SYS_ioctl,
            s,
            libc::SIOCSIFFLAGS,
            &ifr as *const libc::ifreq
        )
    };
    err.check(ChildStep::DoorsLoopback, r);
    // SAFETY: closes `s`, opened above and used no more.
    unsafe { sc!(libc::SYS_close, s) };
}

/// Add the addresses to `lo`: each complete `RTM_NEWADDR` message sent over
/// rtnetlink, and its acknowledgement checked.
///
/// # Safety
/// Child only.
unsafe fn add_addresses(messages: &[Vec<u8>], err: ErrPipe) {
    // SAFETY: socket takes no pointers; the descriptor is new and ours.
    let nl = unsafe {
        sc!(
            libc::SYS_socket,
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE
        )
    };
    err.check(ChildStep::DoorsAddress(0), nl);
    for (i, msg) in messages.iter().enumerate() {
        let step = ChildStep::DoorsAddress(i as u32);
        // SAFETY: sockaddr_nl is plain data; all-zero is valid.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: sendto reads `msg.len()` bytes of `msg` (built by the
        // parent) and the sockaddr_nl `sa` on this stack, of the size
        // passed.
        let n = unsafe {
            sc!(
                libc::SYS_sendto,
                nl,
                msg.as_ptr(),
                msg.len(),
                0,
                &sa as *const libc::sockaddr_nl,
                std::mem::size_of::<libc::sockaddr_nl>()
            )
        };
        err.check(step, n);
        // The ack: struct nlmsghdr followed by struct nlmsgerr whose
        // first field is the (negative) errno, 0 for success.
        let mut buf = [0u8; 512];
        // SAFETY: recvfrom writes at most `buf.len()` bytes into `buf`, on
        // this stack; no source address is asked for.
        let n = unsafe {
            sc!(
                libc::SYS_recvfrom,
                nl,
                buf.as_mut_ptr(),
                buf.len(),
                0,
                0usize,
                0usize
            )
        };
        let n = err.check(step, n);
        if n >= 20 {
            let ty = u16::from_ne_bytes([buf[4], buf[5]]);
            let e = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            if ty == libc::NLMSG_ERROR as u16 && e != 0 {
                err.fail(step, -e);
            }
        }
    }
    // SAFETY: closes `nl`, opened above and used no more.
    unsafe { sc!(libc::SYS_close, nl) };
}

/// Make a `NETLINK_ROUTE` socket in the namespace and send it to the
/// parent over fd 5 (its failures are door socket `index`).
///
/// # Safety
/// Child only, with the doors socket on fd 5.
unsafe fn send_route_socket(index: usize, err: ErrPipe) {
    let step = ChildStep::DoorsSocket(index as u32);
    // SAFETY: socket takes no pointers; the descriptor is new and ours.
    let nl = unsafe {
        sc!(
            libc::SYS_socket,
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE
        )
    };
    err.check(step, nl);
    // SAFETY: `nl` is ours; child-safe as `send_fd` asks.
    if let Err(e) = ck(unsafe { send_fd(DOORS_FD, nl as RawFd) }) {
        err.fail(ChildStep::DoorsSend, e);
    }
    // SAFETY: closes `nl`, which the parent now has a copy of.
    unsafe { sc!(libc::SYS_close, nl) };
}

/// Make each door socket and send it to the parent, one per message, over
/// fd 5.
///
/// # Safety
/// Child only, with the doors socket on fd 5.
unsafe fn send_sockets(sockets: &[(libc::c_int, libc::c_int, Vec<u8>)], err: ErrPipe) {
    let one: libc::c_int = 1;
    let one_ptr = &one as *const libc::c_int;
    let int_len = std::mem::size_of::<libc::c_int>();
    for (i, (domain, ty, addr)) in sockets.iter().enumerate() {
        let step = ChildStep::DoorsSocket(i as u32);
        // SAFETY: socket takes no pointers; the descriptor is new and ours.
        let fd = unsafe { sc!(libc::SYS_socket, *domain, *ty | libc::SOCK_CLOEXEC, 0) };
        err.check(step, fd);
        // SAFETY: setsockopt reads the int `one`, on this stack.
        unsafe {
            sc!(
                libc::SYS_setsockopt,
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                one_ptr,
                int_len
            )
        };
        if *domain == libc::AF_INET6 {
            // SAFETY: setsockopt reads the int `one`, on this stack.
            unsafe {
                sc!(
                    libc::SYS_setsockopt,
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_V6ONLY,
                    one_ptr,
                    int_len
                )
            };
        }
        // IP_FREEBIND: bind to addresses of a local range (e.g.
        // 198.18.0.0/15 on lo) without the exact address configured.
        // SAFETY: setsockopt reads the int `one`, on this stack.
        unsafe {
            sc!(
                libc::SYS_setsockopt,
                fd,
                libc::IPPROTO_IP,
                libc::IP_FREEBIND,
                one_ptr,
                int_len
            )
        };
        // SAFETY: bind reads `addr.len()` bytes of the sockaddr `addr`,
        // built by the parent.
        let r = unsafe { sc!(libc::SYS_bind, fd, addr.as_ptr(), addr.len()) };
        err.check(step, r);
        if *ty == libc::SOCK_STREAM {
            // SAFETY: listen takes no pointers.
            let r = unsafe { sc!(libc::SYS_listen, fd, 128) };
            err.check(step, r);
        }
        // SAFETY: `fd` is ours; child-safe as `send_fd` asks.
        if let Err(e) = ck(unsafe { send_fd(DOORS_FD, fd as RawFd) }) {
            err.fail(ChildStep::DoorsSend, e);
        }
        // SAFETY: closes `fd`, which the parent now has a copy of.
        unsafe { sc!(libc::SYS_close, fd) };
    }
}
