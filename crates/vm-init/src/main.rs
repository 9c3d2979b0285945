//! `cordon-vm-init`: PID 1 of a cordon microVM guest (see `guest.rs`).
//! Built statically (`scripts/build-vm-init.sh`) and put alone, with the
//! kernel modules it loads, into the guest's initramfs.
#![forbid(unsafe_code)]

mod guest;

fn main() {
    if rustix::process::getpid() != rustix::process::Pid::INIT {
        eprintln!("cordon-vm-init: runs only as PID 1 of a cordon microVM guest");
        std::process::exit(2);
    }
    guest::main()
}
