//! seccomp, child side: the plan's BPF filters installed in order, last
//! before exec. The `sock_fprog` each `seccomp(2)` call takes is built in
//! the parent.

use nix::errno::Errno;

use super::ChildStep;
use super::raw::sc;
use super::step::ErrPipe;

/// The plan's filters as `sock_fprog`s, pointing into the plan's
/// instruction vectors (whose heap buffers outlive the child's setup).
#[derive(Debug)]
pub(super) struct Seccomp {
    progs: Vec<libc::sock_fprog>,
}

impl Seccomp {
    /// Parent side. E2BIG for a filter of more than 65,535 instructions.
    pub(super) fn prepare(filters: &[Vec<libc::sock_filter>]) -> Result<Seccomp, Errno> {
        let mut progs = Vec::with_capacity(filters.len());
        for prog in filters {
            let len = u16::try_from(prog.len()).map_err(|_| Errno::E2BIG)?;
            progs.push(libc::sock_fprog {
                len,
                filter: prog.as_ptr().cast_mut(),
            });
        }
        Ok(Seccomp { progs })
    }

    /// A failure is [`ChildStep::Seccomp`] with the filter's index.
    ///
    /// # Safety
    /// Child only, after `no_new_privs`; the filters `prepare` saw must be
    /// alive and unchanged.
    pub(super) unsafe fn install(&self, err: ErrPipe) {
        for (i, prog) in self.progs.iter().enumerate() {
            // SAFETY: seccomp(SECCOMP_SET_MODE_FILTER) reads the sock_fprog
            // `prog` and its `len` instructions, alive (the contract).
            let r = unsafe {
                sc!(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    prog as *const libc::sock_fprog
                )
            };
            err.check(ChildStep::Seccomp(i as u32), r);
        }
    }
}
