//! cordon-audit
