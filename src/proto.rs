//! Prost types generated from our subset of XLA's protos (proto/, compiled by
//! build.rs). Module paths follow the proto packages: `xla`, `xla::gpu`,
//! `xla::buffer_assignment`, `stream_executor`, `stream_executor::gpu`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/xla_protos.rs"));
