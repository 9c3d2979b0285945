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
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use cordon_sys::Errno;

/// Idle namespaces kept at most; more are closed on release.
const MAX_IDLE: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct NetPool {
    idle: Mutex<Vec<OwnedFd>>,
    /// The first namespace, still being made on its own thread (started
    /// with the jail, so a one-shot run overlaps it with its other setup).
    pending: Mutex<Option<JoinHandle<Result<OwnedFd, Errno>>>>,
    /// Set when this broker cannot make namespaces itself (root without
    /// CAP_SYS_ADMIN, e.g. in a restricted container): sandboxes then get
    /// a new namespace each, made inside their own user namespace.
    unusable: AtomicBool,
    /// Why, for `cordon doctor`.
    why_unusable: Mutex<Option<String>>,
}

impl NetPool {
    /// An idle namespace, or a new one; `None` when this broker cannot
    /// make them (the caller then has the sandbox make its own).
    pub(crate) fn acquire(&self) -> Option<OwnedFd> {
        self.settle();
        if self.unusable.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(fd) = self.lock().pop() {
            return Some(fd);
        }
        match cordon_sys::spawn::new_net_namespace() {
            Ok(fd) => Some(fd),
            Err(e) => {
                self.give_up(e);
                None
            }
        }
    }

    /// A pool whose first namespace is being made on its own thread; a
    /// failure shows in [`NetPool::status`] and turns the pool off.
    pub(crate) fn start() -> NetPool {
        let pool = NetPool::default();
        match cordon_sys::spawn::start_net_namespace(true) {
            Ok(h) => *pool.pending_lock() = Some(h),
            Err(e) => pool.give_up(e),
        }
        pool
    }

    /// Whether this broker can make namespaces, or why not (waits for the
    /// first one).
    pub(crate) fn status(&self) -> Result<(), String> {
        self.settle();
        match self.why_unusable.lock() {
            Ok(w) => w.clone().map_or(Ok(()), Err),
            Err(p) => p.into_inner().clone().map_or(Ok(()), Err),
        }
    }

    /// Wait for the first namespace, if it is still being made.
    fn settle(&self) {
        let Some(h) = self.pending_lock().take() else {
            return;
        };
        match h.join() {
            Ok(Ok(fd)) => self.release(fd),
            Ok(Err(e)) => self.give_up(e),
            Err(_) => self.give_up(Errno::EIO),
        }
    }

    fn give_up(&self, e: Errno) {
        self.unusable.store(true, Ordering::Relaxed);
        let mut w = self.why_unusable.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some(format!(
                "cannot create network namespaces ({e}): each sandbox makes its own"
            ));
        }
    }

    fn pending_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<JoinHandle<Result<OwnedFd, Errno>>>> {
        // Poisoning only means a panic while taking or storing the handle.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Give a namespace back once nothing of its sandbox is left.
    pub(crate) fn release(&self, fd: OwnedFd) {
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE {
            idle.push(fd);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<OwnedFd>> {
        // A poisoned lock only means another call panicked while pushing or
        // popping a descriptor; the vector itself is still valid.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
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
