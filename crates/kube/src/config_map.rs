//! The manifest, as the broker reads it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::names;

/// The manifest's key (and file name) in the ConfigMap.
pub const MANIFEST_KEY: &str = "cordon.yaml";

pub fn manifest(ns: &str, text: &str) -> ConfigMap {
    ConfigMap {
        metadata: names::meta(names::MANIFEST, ns, names::broker_labels()),
        data: Some(BTreeMap::from([(
            MANIFEST_KEY.to_string(),
            text.to_string(),
        )])),
        ..Default::default()
    }
}
