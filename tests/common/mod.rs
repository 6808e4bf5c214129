//! Helpers shared by the decoder tests: fixture paths, the README table of
//! expected counts, and builders for synthetic split-proto executables.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message;
use riegeli::{RecordWriter, WriterOptions};
use xla_vmm::proto::xla::{self as px};

pub const FIXTURES: [&str; 6] = [
    "small",
    "loop",
    "mlp_adam_donated",
    "llama_scan_bf16",
    "llama_sgd_f32",
    "fft_kinds",
];

pub fn fixtures_dir() -> PathBuf {
    xla_vmm::testdata::require_fixtures_dir()
}

pub fn fixture(name: &str) -> Vec<u8> {
    let p = fixtures_dir().join(format!("{name}.pjrt"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// One row of the counts table in integration/fixtures/README.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub allocations: usize,
    /// parameter, constant, output, temp
    pub roles: [usize; 4],
    pub top_level: usize,
    pub kinds: BTreeMap<String, usize>,
}

/// Parses the counts table (`| name | N (p / c / o / t) | top | kind n, ... |`).
pub fn expected_counts() -> BTreeMap<String, Expected> {
    let text = std::fs::read_to_string(fixtures_dir().join("README.md")).expect("fixtures README");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", name, allocs, top, kinds, ""]
        if cols.len() != 6 {
            continue;
        }
        let Some((total, rest)) = cols[2].split_once('(') else {
            continue;
        };
        let Ok(allocations) = total.trim().parse() else {
            continue;
        };
        let roles: Vec<usize> = rest
            .trim_end_matches(')')
            .split('/')
            .map(|s| s.trim().parse().expect("role count"))
            .collect();
        let kinds = cols[4]
            .split(',')
            .map(|k| {
                let (name, n) = k.trim().rsplit_once(' ').expect("kind count");
                (name.to_string(), n.parse().expect("kind count number"))
            })
            .collect();
        out.insert(
            cols[1].to_string(),
            Expected {
                allocations,
                roles: roles.try_into().expect("four roles"),
                top_level: cols[3].parse().expect("top-level count"),
                kinds,
            },
        );
    }
    out
}

/// A riegeli file holding `records`.
pub fn riegeli_file(records: &[Vec<u8>]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = RecordWriter::new(&mut buf, WriterOptions::new()).expect("riegeli writer");
    for r in records {
        w.write_record(r).expect("write record");
    }
    w.close().expect("close riegeli writer");
    buf
}

/// A split proto of `ty` whose only record after the manifest is a merge
/// record holding `message`.
pub fn split_proto(ty: &str, message: Vec<u8>) -> Vec<u8> {
    xla_vmm::decode::write_split_proto(ty, &message)
}

/// A complete serialized executable (outer split proto around an inner split
/// `GpuExecutableProto`).
pub fn executable(exe: &px::gpu::GpuExecutableProto) -> Vec<u8> {
    let inner = split_proto("xla.gpu.GpuExecutableProto", exe.encode_to_vec());
    let outer = px::ExecutableAndOptionsProto {
        serialized_executable: inner,
        pjrt_client_name: "test".into(),
    };
    split_proto("xla.ExecutableAndOptionsProto", outer.encode_to_vec())
}

/// A `GpuExecutableProto` with one 1024-byte temp allocation (index 0)
/// and the given serialized top-level thunks.
pub fn exe_with_thunks(thunks: Vec<Vec<u8>>) -> px::gpu::GpuExecutableProto {
    px::gpu::GpuExecutableProto {
        buffer_allocations: Some(px::gpu::gpu_executable_proto::RepeatedBufferAllocations {
            values: vec![temp_alloc(0, 1024)],
        }),
        module_name: "synthetic".into(),
        thunks,
        ..Default::default()
    }
}

/// An allocation proto of `size` bytes (a temp).
pub fn temp_alloc(index: i64, size: i64) -> px::BufferAllocationProto {
    px::BufferAllocationProto {
        index,
        size,
        ..Default::default()
    }
}

/// A serialized `ThunkProto`: info (field 1) plus kind field `number`
/// holding `payload`.
pub fn thunk_bytes(annotation: &str, number: u32, payload: &[u8]) -> Vec<u8> {
    let info = px::gpu::ThunkInfoProto {
        profile_annotation: annotation.into(),
        thunk_id: 7,
        concurrent_region_id: None,
    };
    let mut out = Vec::new();
    prost::encoding::message::encode(1, &info, &mut out);
    prost::encoding::bytes::encode(number, &payload.to_vec(), &mut out);
    out
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// The riegeli file signature (first 4 bytes of any riegeli file).
pub const RIEGELI_PREFIX: [u8; 4] = xla_vmm::decode::RIEGELI_SIGNATURE;
