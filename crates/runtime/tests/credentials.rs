//! Admission of a tool that declares secrets: refused without a credential
//! broker or when the broker cannot mint them, admitted when it can; and
//! `tls_passthrough` reaching the egress policy.

use std::path::Path;
use std::sync::Arc;

use cordon_policy::ToolPolicy;
use cordon_runtime::spec::{UpstreamDns, lower};
use cordon_runtime::{Minting, Use};

fn tool(extra: &str) -> ToolPolicy {
    let y = format!(
        "tools:\n  api:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\", \"pin.example:443\"]\n{extra}"
    );
    cordon_policy::load_str(Path::new("m.yaml"), &y)
        .unwrap()
        .policy
        .tools["api"]
        .clone()
}

struct Broker(Result<(), String>);

impl Minting for Broker {
    fn can_mint(&self, _tool: &ToolPolicy) -> Result<(), String> {
        self.0.clone()
    }
}

#[test]
fn secrets_need_a_broker_that_can_mint_them() {
    let t = tool(
        "    secrets: [{name: T, scope: s, ttl: 60, bind: {endpoint: \"api.example:443\"}}]\n",
    );
    let err = lower(&t, Use::Call, None, None, &UpstreamDns::Host).unwrap_err();
    assert!(
        err.contains("declares secrets (T), but no credential broker is configured"),
        "{err}"
    );
    let no = Broker(Err(
        "api: secret `T`: provider `vault` is not defined".into()
    ));
    let err = lower(&t, Use::Call, None, Some(&no), &UpstreamDns::Host).unwrap_err();
    assert!(err.contains("provider `vault` is not defined"), "{err}");
    // Positive control: a broker that can mint them.
    let yes = Broker(Ok(()));
    assert!(lower(&t, Use::Call, None, Some(&yes), &UpstreamDns::Host).is_ok());
    // The registry's admission refuses the same way without one.
    let reg = cordon_runtime::Registry::empty();
    let err = reg.admit(&t, Use::Call).unwrap_err();
    assert!(err.contains("no credential broker"), "{err}");
    let reg = reg.with_credentials(Arc::new(Broker(Err("cannot".into()))));
    assert_eq!(reg.admit(&t, Use::Call).unwrap_err(), "cannot");
    // Admission's one decision, asked directly.
    let err = cordon_runtime::admit_secrets(&t, None).unwrap_err();
    assert_eq!(
        err,
        "api: declares secrets (T), but no credential broker is configured; refusing rather than running without them. Write a provider file (docs/secrets.md) and give it with `--providers FILE` or $CORDON_PROVIDERS, or put it at /etc/cordon/providers.yaml"
    );
    assert_eq!(
        cordon_runtime::admit_secrets(&t, Some(&no)).unwrap_err(),
        "api: secret `T`: provider `vault` is not defined"
    );
    assert!(cordon_runtime::admit_secrets(&t, Some(&yes)).is_ok());
    assert!(cordon_runtime::admit_secrets(&tool(""), None).is_ok());
}

#[test]
fn tls_passthrough_entries_reach_the_egress_policy() {
    let t = tool("    tls_passthrough: [\"pin.example:443\"]\n");
    let spec = lower(&t, Use::Call, None, None, &UpstreamDns::Host).unwrap();
    let ep = spec.egress().unwrap();
    let p: Vec<String> = ep
        .passthrough
        .iter()
        .map(|hp| format!("{}:{}", hp.host, hp.port))
        .collect();
    assert_eq!(p, ["pin.example:443"]);
    let spec = lower(&tool(""), Use::Call, None, None, &UpstreamDns::Host).unwrap();
    assert!(spec.egress().unwrap().passthrough.is_empty());
}
