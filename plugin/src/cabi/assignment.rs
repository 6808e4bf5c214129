//! Device assignments: which global device runs which replica / partition
//! of an executable, and the serialized `xla.DeviceAssignmentProto`
//! (xla/xla_data.proto, XLA as of jax 0.11: `replica_count` = 1,
//! `computation_count` = 2, `computation_devices` = 3, each
//! `{ replica_device_ids = 1 (packed int64) }`, one per computation, i.e.
//! per partition) that JAX reads from `GetDeviceAssignment`.
//!
//! Encoded and decoded here by hand (a handful of varints) so the plugin
//! needs no generated code for it.

use crate::cabi::error::{Error, Result};

/// The device assignment (one type for the plugin and the runtime):
/// `ids[r * partitions + p]` is the global device id of replica `r`,
/// partition `p`.
pub use xla_vmm_runtime::DeviceAssignment;

/// What a program loaded on one device of a multi-device executable needs
/// to know: the whole assignment and which device it is (global id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDevice {
    pub assignment: DeviceAssignment,
    pub device_id: i64,
}

/// The assignment as JAX reads and writes it: a serialized
/// `DeviceAssignmentProto`.
pub trait AssignmentProto: Sized {
    fn to_proto(&self) -> Vec<u8>;
    fn from_proto(bytes: &[u8]) -> Result<Self>;
}

impl AssignmentProto for DeviceAssignment {
    /// The serialized `DeviceAssignmentProto`.
    fn to_proto(&self) -> Vec<u8> {
        let mut out = Vec::new();
        key(1, 0, &mut out);
        varint(self.replicas as u64, &mut out);
        key(2, 0, &mut out);
        varint(self.partitions as u64, &mut out);
        for p in 0..self.partitions {
            let mut ids = Vec::new();
            for r in 0..self.replicas {
                varint(self.ids[r * self.partitions + p] as u64, &mut ids);
            }
            let mut computation = Vec::new();
            key(1, 2, &mut computation);
            varint(ids.len() as u64, &mut computation);
            computation.extend(ids);
            key(3, 2, &mut out);
            varint(computation.len() as u64, &mut out);
            out.extend(computation);
        }
        out
    }

    /// Parse a serialized `DeviceAssignmentProto` (packed or unpacked ids).
    fn from_proto(bytes: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::invalid(format!("DeviceAssignmentProto: {what}"));
        let mut replicas = 0u64;
        let mut partitions = 0u64;
        let mut computations: Vec<Vec<i64>> = Vec::new();
        let mut r = Reader(bytes);
        while !r.0.is_empty() {
            let (field, wire) = r.key()?;
            match (field, wire) {
                (1, 0) => replicas = r.varint()?,
                (2, 0) => partitions = r.varint()?,
                (3, 2) => {
                    let mut c = Reader(r.bytes()?);
                    let mut ids = Vec::new();
                    while !c.0.is_empty() {
                        match c.key()? {
                            (1, 0) => ids.push(c.varint()? as i64),
                            (1, 2) => {
                                let mut packed = Reader(c.bytes()?);
                                while !packed.0.is_empty() {
                                    ids.push(packed.varint()? as i64);
                                }
                            }
                            (_, w) => c.skip(w)?,
                        }
                    }
                    computations.push(ids);
                }
                (_, w) => r.skip(w)?,
            }
        }
        let (replicas, partitions) = (replicas as usize, partitions as usize);
        if computations.len() != partitions {
            return Err(bad(&format!(
                "computation_count {partitions} but {} computation_devices",
                computations.len()
            )));
        }
        if replicas == 0 || partitions == 0 {
            return Err(bad(&format!(
                "{replicas} replicas x {partitions} partitions"
            )));
        }
        // Every count is checked against the ids actually present before
        // anything is sized from it.
        for (p, c) in computations.iter().enumerate() {
            if c.len() != replicas {
                return Err(bad(&format!(
                    "computation {p} has {} devices, replica_count is {replicas}",
                    c.len()
                )));
            }
        }
        let mut ids = vec![0i64; replicas * partitions];
        for (p, c) in computations.iter().enumerate() {
            for (r, &id) in c.iter().enumerate() {
                ids[r * partitions + p] = id;
            }
        }
        Ok(DeviceAssignment {
            replicas,
            partitions,
            ids,
        })
    }
}

fn key(field: u32, wire: u32, out: &mut Vec<u8>) {
    varint(((field << 3) | wire) as u64, out);
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| Error::invalid("DeviceAssignmentProto: truncated varint"))?;
            self.0 = rest;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::invalid("DeviceAssignmentProto: varint too long"))
    }

    fn key(&mut self) -> Result<(u64, u64)> {
        let k = self.varint()?;
        Ok((k >> 3, k & 7))
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.varint()? as usize;
        if n > self.0.len() {
            return Err(Error::invalid("DeviceAssignmentProto: length past the end"));
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(b)
    }

    fn skip(&mut self, wire: u64) -> Result<()> {
        let n = match wire {
            0 => return self.varint().map(|_| ()),
            1 => 8,
            2 => return self.bytes().map(|_| ()),
            5 => 4,
            w => {
                return Err(Error::invalid(format!(
                    "DeviceAssignmentProto: wire type {w}"
                )))
            }
        };
        if n > self.0.len() {
            return Err(Error::invalid("DeviceAssignmentProto: truncated field"));
        }
        self.0 = &self.0[n..];
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_device_bytes_are_the_proto_encoding() {
        assert_eq!(
            DeviceAssignment::single(0).to_proto(),
            vec![0x08, 0x01, 0x10, 0x01, 0x1A, 0x03, 0x0A, 0x01, 0x00]
        );
        // a two-byte varint id (300 = 0xAC 0x02)
        assert_eq!(
            DeviceAssignment::single(300).to_proto(),
            vec![0x08, 0x01, 0x10, 0x01, 0x1A, 0x04, 0x0A, 0x02, 0xAC, 0x02]
        );
    }

    #[test]
    fn round_trip_and_errors() {
        let a = DeviceAssignment {
            replicas: 2,
            partitions: 3,
            ids: vec![5, 4, 3, 2, 1, 0],
        };
        assert_eq!(DeviceAssignment::from_proto(&a.to_proto()).unwrap(), a);
        // Unpacked ids are read too: one replica, one partition, id 7.
        let unpacked = [0x08, 0x01, 0x10, 0x01, 0x1A, 0x02, 0x08, 0x07];
        assert_eq!(
            DeviceAssignment::from_proto(&unpacked).unwrap(),
            DeviceAssignment::single(7)
        );
        let e = DeviceAssignment::from_proto(&a.to_proto()[..5]).unwrap_err();
        assert!(e.message.contains("DeviceAssignmentProto"), "{}", e.message);
        let e = DeviceAssignment::from_proto(&[0x08, 0x02, 0x10, 0x01, 0x1A, 0x02, 0x0A, 0x00])
            .unwrap_err();
        assert!(e.message.contains("replica_count is 2"), "{}", e.message);
    }
}
