//! The broker's ServiceAccount. Its token is mounted in the broker's pods
//! only (the Deployment asks for it); no other pod gets it by default.

use k8s_openapi::api::core::v1::ServiceAccount;

use crate::names;

pub fn service_account(ns: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: names::meta(names::BROKER, ns, names::broker_labels()),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}
