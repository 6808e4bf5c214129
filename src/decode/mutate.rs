//! A small deterministic mutator for the decoder's robustness tests: byte
//! flips, boundary values, huge varints, inserted, deleted, duplicated and
//! truncated ranges, applied to a reassembled `GpuExecutableProto` message
//! (past riegeli's checksums, which reject nearly every mutation of a whole
//! file), and the wrapping of a mutant back into a complete serialized
//! executable (for `PJRT_Executable_DeserializeAndLoad`). Not coverage
//! guided (that is `fuzz/`); it runs in `cargo test`, so in CI.

use prost::Message;

use super::{decode_executable_and_options, read_split_proto, write_split_proto, DecodeError};
use crate::proto::xla::ExecutableAndOptionsProto;

const INNER: &str = "xla.gpu.GpuExecutableProto";
const OUTER: &str = "xla.ExecutableAndOptionsProto";

/// The reassembled inner `GpuExecutableProto` message of a serialized
/// executable.
pub fn inner_message(executable: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let outer = decode_executable_and_options(executable)?;
    read_split_proto(&outer.serialized_executable, INNER)
}

/// A complete serialized executable around the inner message `message`.
pub fn wrap_inner(message: &[u8]) -> Vec<u8> {
    let outer = ExecutableAndOptionsProto {
        serialized_executable: write_split_proto(INNER, message),
        pjrt_client_name: "mutant".into(),
    };
    write_split_proto(OUTER, &outer.encode_to_vec())
}

/// Deterministic mutations (xorshift64*).
pub struct Mutator(u64);

impl Mutator {
    pub fn new(seed: u64) -> Self {
        Mutator(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `bytes` with 1 to 4 mutations.
    pub fn mutate(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        for _ in 0..1 + self.below(4) {
            if b.is_empty() {
                b.push(self.next() as u8);
                continue;
            }
            let at = self.below(b.len());
            match self.below(8) {
                0 => b[at] ^= 1 << self.below(8),
                1 => b[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][self.below(5)],
                // A huge varint (a length or count of 2^35 - 1).
                2 => {
                    b.splice(at..at + 1, [0xff, 0xff, 0xff, 0xff, 0x7f]);
                }
                3 => {
                    let n = 1 + self.below(16);
                    let ins: Vec<u8> = (0..n).map(|_| self.next() as u8).collect();
                    b.splice(at..at, ins);
                }
                4 => {
                    let end = (at + 1 + self.below(64)).min(b.len());
                    b.drain(at..end);
                }
                5 => {
                    let end = (at + 1 + self.below(256)).min(b.len());
                    let dup = b[at..end].to_vec();
                    b.splice(at..at, dup);
                }
                6 => b.truncate(at),
                _ => {
                    // Copy a range over another place (swaps fields around).
                    let end = (at + 1 + self.below(32)).min(b.len());
                    let src = b[at..end].to_vec();
                    let to = self.below(b.len());
                    for (i, v) in src.into_iter().enumerate() {
                        if let Some(x) = b.get_mut(to + i) {
                            *x = v;
                        }
                    }
                }
            }
        }
        b
    }
}
