//! The broker's PodDisruptionBudget: a drain keeps one broker serving.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names;

pub fn pod_disruption_budget(ns: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: names::meta(names::BROKER, ns, names::broker_labels()),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(names::broker_selector()),
            ..Default::default()
        }),
        status: None,
    }
}
