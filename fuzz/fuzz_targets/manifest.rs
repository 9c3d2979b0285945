//! Fuzz the manifest loader: any text is parsed (YAML, with its budget) and resolved. Nothing
//! panics; loading is deterministic (the same text gives the same result twice); and a
//! manifest that loads keeps the rules every manifest is held to: a P1 tool has no network
//! and no secrets.
#![no_main]

use std::path::Path;

use cordon_policy::manifest::Profile;
use cordon_policy::policy::Network;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.yaml");
    let first = cordon_policy::load_str(path, text);
    let second = cordon_policy::load_str(path, text);
    assert_eq!(
        format!("{first:?}"),
        format!("{second:?}"),
        "two loads of one text differ"
    );
    if let Ok(loaded) = first {
        for t in loaded.policy.tools.values() {
            if t.profile == Profile::P1 {
                assert!(
                    matches!(t.network, Network::None),
                    "P1 tool {} has a network",
                    t.name
                );
                assert!(t.secrets.is_empty(), "P1 tool {} has secrets", t.name);
            }
        }
    }
});
