//! Fuzz both ELF readers on any file: the jail's (`cordon_jail::elf`: the loader, the needed
//! libraries and run path) and the probes' closure of a host program
//! (`cordon_probes::elf::closure`, which follows what the file names on this host). Nothing
//! panics, and what they return is consistent: the loader `read` reports is the one `loader`
//! reports, and a closure's loader is `read`'s, resolved.
#![no_main]

use std::io::Read;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().expect("tempdir"));

fuzz_target!(|data: &[u8]| {
    let path = DIR.path().join("prog");
    std::fs::write(&path, data).expect("write");
    let read = cordon_jail::elf::read(&path);
    let file = std::fs::File::open(&path).expect("open");
    let mut head = Vec::new();
    (&file).take(64).read_to_end(&mut head).expect("head");
    let loader = cordon_jail::elf::loader(&file, &head);
    if let Ok(e) = &read {
        assert_eq!(
            loader.as_ref().ok(),
            Some(&e.interp),
            "loader and read disagree"
        );
        assert!(e.needed.iter().all(|n| !n.contains('\0')));
        assert!(e.runpath.iter().all(|p| !p.is_empty() && !p.contains(':')));
    }
    match cordon_probes::elf::closure(&path) {
        Ok(c) => {
            let e = read.as_ref().expect("a closure of a file read refuses");
            assert_eq!(c.loader.is_some(), e.interp.is_some());
        }
        Err(why) => assert!(!why.is_empty()),
    }
});
