//! Slot binding policy (placeholder crate root; built by the policy work).
#![deny(unsafe_code)]
