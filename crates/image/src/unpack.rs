//! Safe layer unpacking (see the crate docs).
