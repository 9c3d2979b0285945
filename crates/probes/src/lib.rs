//! cordon-probes
