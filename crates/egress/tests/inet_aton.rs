//! Differential test of the IPv4 literal parser against glibc's `inet_aton`, reached through
//! python3's `socket.inet_aton` (which calls it), on random strings over the alphabet that
//! matters: digits, hex letters, `x`/`X`, dots and whitespace.

use std::process::Command;

use cordon_egress::parse_ipv4_literal;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use cordon_testkit::skip;

const ORACLE: &str = r#"
import json, socket, sys
out = []
for s in json.load(sys.stdin):
    try:
        out.append(socket.inet_ntoa(socket.inet_aton(s)))
    except OSError:
        out.append(None)
print(json.dumps(out))
"#;

fn libc_inet_aton(inputs: &[String]) -> Option<Vec<Option<String>>> {
    use std::io::Write;
    let mut child = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(ORACLE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()?
        .write_all(serde_json::to_string(inputs).ok()?.as_bytes())
        .ok()?;
    let out = child.wait_with_output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

fn check(inputs: Vec<String>) -> Result<(), TestCaseError> {
    let Some(want) = libc_inet_aton(&inputs) else {
        return Err(TestCaseError::fail("python3 oracle did not run"));
    };
    for (s, w) in inputs.iter().zip(want) {
        let got = parse_ipv4_literal(s).map(|a| a.to_string());
        prop_assert_eq!(got, w, "input {:?}", s);
    }
    Ok(())
}

#[test]
fn agrees_with_libc_inet_aton() {
    if !std::path::Path::new("/usr/bin/python3").exists() {
        skip::skip_or_fail("agrees_with_libc_inet_aton", "/usr/bin/python3 not found");
        return;
    }
    // Fixed cases first: the encodings of the metadata address and the edge cases.
    let fixed: Vec<String> = [
        "169.254.169.254",
        "2852039166",
        "0251.0376.0251.0376",
        "0xa9fea9fe",
        "169.254.43518",
        "169.16689662",
        "0",
        "0x",
        "0x.1",
        "08",
        "1.2.3.4 x",
        "1.2.3.4\tx",
        " 1.2.3.4",
        "1.2.3.4.",
        "4294967295",
        "4294967296",
        "0xffffffff",
        "0x100000000",
        "1.0xffffff",
        "1.0x1000000",
        "1.2.0xffff",
        "1.2.0x10000",
        "00000000000000000000001",
        "0X1",
        "1.2.3.",
        "99999999999999999999999",
        "1.2.3.4\n",
        "1.2.3.4\x0b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    check(fixed).unwrap();

    let mut runner = TestRunner::new(Config {
        cases: 16,
        ..Config::default()
    });
    let strategy = proptest::collection::vec("[0-9a-fxX. \t]{0,24}", 400);
    runner
        .run(&strategy, check)
        .unwrap_or_else(|e| panic!("{e}"));
    // Numeric-looking strings, where the interesting disagreements would be.
    let strategy = proptest::collection::vec(
        "(0x|0X|0)?[0-9a-f]{1,11}(\\.(0x|0)?[0-9a-f]{1,9}){0,4}",
        400,
    );
    runner
        .run(&strategy, check)
        .unwrap_or_else(|e| panic!("{e}"));
}
