//! Memory limits without a memory cgroup: the rlimits that stand in for
//! `memory.max`, and how a tool that died of them is told apart.
//!
//! `RLIMIT_DATA` caps each process's private writable memory (heap, `brk`,
//! private anonymous and copy-on-write mappings, thread stacks): what a
//! runaway allocation grows. It does not count address space that is only
//! reserved (`PROT_NONE`) or mapped read-only, so V8, the JVM and Go, which
//! reserve large ranges they never touch, run under it as they would under
//! `memory.max`; under an `RLIMIT_AS` of the same size they die at start
//! (Node.js with a 1 GiB `RLIMIT_AS` runs out of heap at about 12 MB).
//!
//! `RLIMIT_AS` stays, far looser (see [`as_backstop`]), for what
//! `RLIMIT_DATA` does not count: shared writable mappings
//! (`MAP_SHARED|MAP_ANONYMOUS`, System V shared memory once attached). It is
//! a backstop against runaway address space, not a memory limit: it has to
//! leave room for a few WebAssembly memories (V8 reserves 10 GiB for each).
//!
//! Both are per process, not per sandbox: a tool that forks can use up to
//! the task limit times the memory limit. Only a cgroup bounds the
//! sandbox as a whole.
//!
//! A tool whose allocation fails under `RLIMIT_DATA` is not killed by the
//! kernel: it sees `ENOMEM` and ends the way its runtime ends on it. Where
//! it says so on stderr (Python's `MemoryError`, V8's and the JVM's
//! out-of-memory reports, Go's, Rust's and C++'s allocation failures,
//! `strerror(ENOMEM)`), the call is reported as the memory limit
//! ([`oom_line`]). That is the tool's own word, so a tool can also claim it;
//! it changes only how a failed call is reported.

/// The smallest `RLIMIT_AS` backstop: room for the reservations of common
/// runtimes (a V8 WebAssembly memory takes 10 GiB of address space, a JVM
/// reserves a quarter of the host's memory for its heap).
pub const AS_BACKSTOP_MIN: u64 = 64 << 30;

/// The `RLIMIT_AS` set beside an `RLIMIT_DATA` of `memory` bytes: 16 times
/// the memory limit, and at least [`AS_BACKSTOP_MIN`].
pub fn as_backstop(memory: u64) -> u64 {
    memory.saturating_mul(16).max(AS_BACKSTOP_MIN)
}

/// Markers of a failed allocation on stderr, lower case, each matched
/// within one line.
const MARKERS: &[&str] = &[
    // Python.
    "memoryerror",
    // V8 (Node.js): "FATAL ERROR: ... Allocation failed - JavaScript heap
    // out of memory", "Fatal process out of memory: ...".
    "javascript heap out of memory",
    "allocation failed - ",
    "fatal process out of memory",
    "fatal process oom",
    // V8 failing to make its code space writable: mprotect refused with
    // ENOMEM once RLIMIT_DATA is reached ("# Check failed:
    // reservation_.SetPermissions(unprotect_start, ...").
    "reservation_.setpermissions(",
    // The JVM.
    "java.lang.outofmemoryerror",
    "insufficient memory for the java runtime environment",
    // Go: "fatal error: runtime: out of memory".
    "runtime: out of memory",
    "runtime: cannot allocate memory",
    // C++.
    "std::bad_alloc",
    // Ruby: "failed to allocate memory (NoMemoryError)".
    "failed to allocate memory",
    // strerror(ENOMEM), and the words of perl, busybox and many C programs.
    "cannot allocate memory",
    "out of memory",
];

/// The first line of `text` that says an allocation failed (trimmed, at
/// most 200 bytes), if any.
pub fn oom_line(text: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(text);
    text.lines().find_map(|l| {
        let low = l.to_ascii_lowercase();
        // Rust: "memory allocation of N bytes failed".
        let rust = low.contains("memory allocation of") && low.contains("failed");
        (rust || MARKERS.iter().any(|m| low.contains(m))).then(|| {
            let l = l.trim();
            let mut end = l.len().min(200);
            while !l.is_char_boundary(end) {
                end -= 1;
            }
            l[..end].to_string()
        })
    })
}

/// Signals a process dies of when a failed allocation is not handled: a
/// null or bad pointer used (SIGSEGV, SIGBUS), `abort()` (SIGABRT), V8's
/// and other runtimes' fatal traps (SIGTRAP, SIGILL).
pub fn crash_signal(sig: i32) -> Option<&'static str> {
    match sig {
        libc::SIGSEGV => Some("SIGSEGV"),
        libc::SIGABRT => Some("SIGABRT"),
        libc::SIGBUS => Some("SIGBUS"),
        libc::SIGTRAP => Some("SIGTRAP"),
        libc::SIGILL => Some("SIGILL"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backstop_is_far_looser() {
        assert_eq!(as_backstop(64 << 20), 64 << 30);
        assert_eq!(as_backstop(1 << 30), 64 << 30);
        assert_eq!(as_backstop(8 << 30), 128 << 30);
        assert_eq!(as_backstop(u64::MAX), u64::MAX);
    }

    #[test]
    fn allocation_failures_are_recognised() {
        for (text, want) in [
            (
                &b"Traceback (most recent call last):\n  File \"<string>\", line 1\nMemoryError\n"[..],
                "MemoryError",
            ),
            (
                b"<--- JS stacktrace --->\n\nFATAL ERROR: MarkCompactCollector: young object promotion failed Allocation failed - JavaScript heap out of memory\n",
                "FATAL ERROR: MarkCompactCollector: young object promotion failed Allocation failed - JavaScript heap out of memory",
            ),
            (
                b"\n#\n# Fatal process out of memory: Zone\n#\n",
                "# Fatal process out of memory: Zone",
            ),
            (
                b"\n#\n# Fatal error in , line 0\n# Check failed: reservation_.SetPermissions( unprotect_start, unprotect_size, MemoryChunk::GetCodeModificationPermission()).\n#\n",
                "# Check failed: reservation_.SetPermissions( unprotect_start, unprotect_size, MemoryChunk::GetCodeModificationPermission()).",
            ),
            (
                b"Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n",
                "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
            ),
            (
                b"fatal error: runtime: out of memory\n\ngoroutine 1 [running]:\n",
                "fatal error: runtime: out of memory",
            ),
            (
                b"memory allocation of 1073741824 bytes failed\n",
                "memory allocation of 1073741824 bytes failed",
            ),
            (
                b"terminate called after throwing an instance of 'std::bad_alloc'\n",
                "terminate called after throwing an instance of 'std::bad_alloc'",
            ),
            (b"sh: out of memory\n", "sh: out of memory"),
            (
                b"bash: xmalloc: cannot allocate 1024 bytes (Cannot allocate memory)\n",
                "bash: xmalloc: cannot allocate 1024 bytes (Cannot allocate memory)",
            ),
        ] {
            assert_eq!(oom_line(text).as_deref(), Some(want), "{text:?}");
        }
    }

    #[test]
    fn other_failures_are_not() {
        for text in [
            &b""[..],
            b"Traceback (most recent call last):\nValueError: bad input\n",
            b"Segmentation fault\n",
            b"[0.1 ms] Scavenge 11.3 -> 8.7 MB allocation failure;\n",
            b"error: memory allocation of 12 bytes succeeded\n",
        ] {
            assert_eq!(oom_line(text), None, "{text:?}");
        }
    }

    #[test]
    fn long_lines_are_cut_on_a_character() {
        let mut t = "é".repeat(150);
        t.push_str(" MemoryError");
        let l = oom_line(t.as_bytes()).unwrap();
        assert!(l.len() <= 200 && l.starts_with('é'), "{l}");
    }
}
