//! Exec, child side: `execve` of each candidate path in turn, with argv and
//! envp as the null-terminated pointer arrays the parent built.

use std::ffi::CString;

use super::ChildStep;
use super::raw::{ck, sc};
use super::step::ErrPipe;

/// argv and envp as `execve` takes them, pointing into the plan's strings
/// (whose heap buffers outlive the child's setup).
#[derive(Debug)]
pub(super) struct Exec {
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Exec {
    /// Parent side.
    pub(super) fn prepare(argv: &[CString], envp: &[zeroize::Zeroizing<CString>]) -> Exec {
        Exec {
            argv: null_terminated(argv.iter().map(|s| s.as_ptr())),
            envp: null_terminated(envp.iter().map(|s| s.as_ptr())),
        }
    }

    /// Try each path in turn. Never returns: any error but ENOENT, ENOTDIR
    /// and EACCES fails at once as [`ChildStep::Exec`]; after the last path
    /// the failure is EACCES if a path had it, ENOENT otherwise.
    ///
    /// # Safety
    /// Child only, last; the strings `prepare` saw must be alive and
    /// unchanged.
    pub(super) unsafe fn install(&self, paths: &[CString], err: ErrPipe) -> ! {
        let mut saved = libc::ENOENT;
        for path in paths {
            // SAFETY: execve reads the C string `path` and the
            // null-terminated arrays of C strings `argv` and `envp` (alive:
            // the contract); on success this process image is gone.
            let r = unsafe {
                sc!(
                    libc::SYS_execve,
                    path.as_ptr(),
                    self.argv.as_ptr(),
                    self.envp.as_ptr()
                )
            };
            match ck(r) {
                Err(libc::ENOENT) | Err(libc::ENOTDIR) => {}
                Err(libc::EACCES) => saved = libc::EACCES,
                Err(e) => err.fail(ChildStep::Exec, e),
                Ok(_) => {}
            }
        }
        err.fail(ChildStep::Exec, saved)
    }
}

fn null_terminated(strings: impl Iterator<Item = *const libc::c_char>) -> Vec<*const libc::c_char> {
    let mut v: Vec<*const libc::c_char> = strings.collect();
    v.push(std::ptr::null());
    v
}
