//! `cordon-vm-init`: PID 1 of a cordon microVM guest (see `guest.rs`),
//! and, as `cordon-vm-init host DIR`, the host side of one sandbox
//! (`cordon_vm_init::host`).
//! Built statically (`scripts/build-vm-init.sh`) and put alone, with the
//! kernel modules it loads, into the guest's initramfs.
#![forbid(unsafe_code)]

mod guest;

fn main() {
    // The host side of a sandbox (`cordon-vm-init host DIR`): the same
    // static binary, so that one file serves both sides.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == "host" {
        std::process::exit(cordon_vm_init::host::main(std::path::Path::new(&args[2])));
    }
    if rustix::process::getpid() != rustix::process::Pid::INIT {
        eprintln!("cordon-vm-init: runs only as PID 1 of a cordon microVM guest");
        std::process::exit(2);
    }
    guest::main()
}
