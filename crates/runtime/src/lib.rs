//! xla-vmm runtime (crate root; built by the runtime work).
#![deny(unsafe_code)]
