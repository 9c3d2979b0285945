//! cordon-policy
