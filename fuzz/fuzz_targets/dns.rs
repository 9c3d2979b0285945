//! Fuzz the DNS door: any UDP payload. The door never panics; what it sends back is a DNS
//! message that parses, answers the query's id, and carries A records only for allowlisted
//! names, each a door address (this harness has no way to make real addresses local, so the
//! door never resolves a name) and never the metadata address.
#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use cordon_egress::harness::Harness;
use cordon_egress::{DOOR_RANGE, EgressPolicy, EventSink, METADATA};
use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::RData;
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

static H: LazyLock<(Runtime, Harness)> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let policy = EgressPolicy::allowlist("fuzz", ["api.example.com:443", "*.allowed.test:443"])
        .expect("policy");
    let h = Harness::new(Arc::new(policy), EventSink::discard(), None).expect("harness");
    (rt, h)
});

fn allowed(name: &str) -> bool {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    n == "api.example.com" || n.ends_with(".allowed.test")
}

fuzz_target!(|data: &[u8]| {
    let (rt, h) = &*H;
    let Some(resp) = rt.block_on(h.dns(data)) else {
        return;
    };
    let query = Message::from_vec(data).expect("the door answered a packet that does not parse");
    let m = Message::from_vec(&resp).expect("the door's answer does not parse");
    assert_eq!(m.metadata.id, query.metadata.id, "answer id");
    assert!(m.queries.len() <= 1, "more than one question in the answer");
    for r in &m.answers {
        let name = r.name.to_ascii();
        assert!(allowed(&name), "an answer for {name}");
        if let RData::A(a) = &r.data {
            let ip = a.0;
            assert!(
                DOOR_RANGE.contains(&ip),
                "{ip} for {name} is not a door address"
            );
            assert_ne!(IpAddr::V4(ip), IpAddr::V4(METADATA));
        }
    }
    if m.metadata.response_code == ResponseCode::NXDomain {
        assert!(m.answers.is_empty(), "NXDOMAIN with answers");
    }
});
