//! cordon-gate
