//! The PJRT objects (client, devices, topology, buffers, executables) in safe Rust; what they read from or
//! write to the caller goes through `cabi`.
#![forbid(unsafe_code)]

pub mod buffer;
pub mod client;
pub mod device;
pub mod exec_queries;
pub mod executable;
pub mod execute;
pub mod remote;
pub mod topology;
pub mod worker;
