//! xla-vmm decoder (crate root; built by the decoder work).
#![deny(unsafe_code)]
