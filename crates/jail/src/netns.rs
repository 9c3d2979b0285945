//! A pool of empty network namespaces for sandboxes without network.
//!
//! Creating a network namespace and tearing it down (in a kernel worker,
//! after an RCU grace period) is the largest single cost of a sandbox
//! start on hosts measured so far. A sandbox with no network needs only an
//! *exclusive*, *empty* namespace, not a new one, so a root broker keeps
//! idle ones and hands each to one sandbox at a time:
//!
//! - the namespace is owned by the broker's user namespace, not by the
//!   sandbox's: the tool has no capability over it and cannot bring `lo`
//!   up, add an address, a route, a rule or change a sysctl, so it stays
//!   exactly as it was made (one loopback device, down);
//! - it is returned only after every process of the sandbox is gone (the
//!   sandbox's PID 1 has been reaped, which the kernel allows only once the
//!   rest of its PID namespace is gone), so no socket survives into the
//!   next call; abstract unix sockets, the one kind of name a no-network
//!   sandbox can create, are per namespace and die with their owners;
//! - never two sandboxes at once.
//!
//! An unprivileged broker cannot enter a namespace its sandboxes could not
//! also enter, so it keeps creating one per call.

use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use cordon_sys::Errno;

/// Idle namespaces kept at most; more are closed on release.
const MAX_IDLE: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct NetPool {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    idle: Vec<OwnedFd>,
    /// The first namespace, still being made on its own thread (started
    /// with the jail, or before it by `start_early`, so a one-shot run
    /// overlaps it with its other setup).
    pending: Option<JoinHandle<Result<OwnedFd, Errno>>>,
    /// Why this broker cannot make namespaces itself (root without
    /// CAP_SYS_ADMIN, e.g. in a restricted container), for `cordon
    /// doctor`; sandboxes then get a new namespace each, made inside their
    /// own user namespace.
    unusable: Option<String>,
}

impl State {
    /// Wait for the first namespace, if it is still being made.
    fn settle(&mut self) {
        let Some(h) = self.pending.take() else {
            return;
        };
        match h.join() {
            Ok(Ok(fd)) => self.idle.push(fd),
            Ok(Err(e)) => self.give_up(e),
            Err(_) => self.give_up(Errno::EIO),
        }
    }

    fn give_up(&mut self, e: Errno) {
        self.unusable.get_or_insert_with(|| {
            format!("cannot create network namespaces ({e}): each sandbox makes its own")
        });
    }
}

impl NetPool {
    /// An idle namespace, or a new one; `None` when this broker cannot
    /// make them (the caller then has the sandbox make its own).
    pub(crate) fn acquire(&self) -> Option<OwnedFd> {
        {
            let mut st = self.lock();
            st.settle();
            if st.unusable.is_some() {
                return None;
            }
            if let Some(fd) = st.idle.pop() {
                return Some(fd);
            }
        }
        match cordon_sys::spawn::new_net_namespace() {
            Ok(fd) => Some(fd),
            Err(e) => {
                self.lock().give_up(e);
                None
            }
        }
    }

    /// A pool whose first namespace is being made on its own thread; a
    /// failure shows in [`NetPool::status`] and turns the pool off.
    pub(crate) fn start() -> NetPool {
        let mut st = State::default();
        match cordon_sys::spawn::start_net_namespace(true) {
            Ok(h) => st.pending = Some(h),
            Err(e) => st.give_up(e),
        }
        NetPool {
            state: Mutex::new(st),
        }
    }

    /// Whether this broker can make namespaces, or why not (waits for the
    /// first one).
    pub(crate) fn status(&self) -> Result<(), String> {
        let mut st = self.lock();
        st.settle();
        st.unusable.clone().map_or(Ok(()), Err)
    }

    /// Give a namespace back once nothing of its sandbox is left.
    pub(crate) fn release(&self, fd: OwnedFd) {
        let mut st = self.lock();
        if st.idle.len() < MAX_IDLE {
            st.idle.push(fd);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another call panicked while pushing or
        // popping a descriptor or taking the pending handle; the state
        // itself is still valid.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Lends a namespace for one call; returns it on drop.
pub(crate) struct NetLease<'a> {
    pub(crate) pool: &'a NetPool,
    pub(crate) fd: Option<OwnedFd>,
}

impl Drop for NetLease<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            self.pool.release(fd);
        }
    }
}
