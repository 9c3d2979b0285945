//! cordon-jail
