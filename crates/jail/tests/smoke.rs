use cordon_jail::*;

#[test]
fn smoke() {
    let jail = Jail::new().unwrap();
    eprintln!("{:#?}", jail.host().cgroup_layout);
    eprintln!("notes {:?}", jail.notes());
    let spec = JailSpec::new(
        "echo",
        [
            "/bin/sh",
            "-c",
            "echo hi; id; cat /proc/self/status | grep -E 'Cap|Seccomp|NoNew'; ls / /dev; cat; echo err >&2",
        ],
    );
    let out = jail.run(&spec, Stdin::Bytes(b"input\n".to_vec()));
    match out {
        Ok(o) => eprintln!(
            "{:?}\n{}\n{}",
            o,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("{e}"),
    }
}
