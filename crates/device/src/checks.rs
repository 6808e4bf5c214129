//! The argument checks both GPU backends make before a driver call, in one
//! place (the backends only say who they are and their VMM granularity):
//! a handle made by another backend instance, a VMM offset or size off the
//! granularity, a range outside its reservation or host buffer.

use crate::error::{DeviceError, Result};

/// A handle that remembers which backend instance made it.
pub(crate) trait Owned {
    fn owner(&self) -> u64;
}

/// `Owned` for handle types with an `owner: u64` field.
macro_rules! owned {
    ($($t:ty),* $(,)?) => { $(impl $crate::checks::Owned for $t { fn owner(&self) -> u64 { self.owner } })* };
}
pub(crate) use owned;

/// The checks, given the backend's instance id and VMM granularity.
pub(crate) trait ArgChecks {
    /// This backend instance's id (what its handles' `owner` holds).
    fn instance_id(&self) -> u64;
    /// VMM granularity in bytes (0: the device has no VMM).
    fn granularity(&self) -> u64;

    /// `h` was made by this backend instance.
    fn own<T: Owned>(&self, h: &T, what: &str) -> Result<()> {
        if h.owner() == self.instance_id() {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(format!(
                "{what} belongs to another backend instance"
            )))
        }
    }

    /// `v` is a multiple of the VMM granularity.
    fn aligned(&self, what: &str, v: u64) -> Result<()> {
        let g = self.granularity();
        if g == 0 {
            return Err(DeviceError::Unsupported("VMM on this device".into()));
        }
        if !v.is_multiple_of(g) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} = {v} is not a multiple of the VMM granularity {g}"
            )));
        }
        Ok(())
    }

    /// `[offset, offset + bytes)` is non-empty, aligned and inside a range
    /// of `size` bytes.
    fn vmm_range(&self, what: &str, offset: u64, bytes: u64, size: u64) -> Result<()> {
        self.aligned("offset", offset)?;
        self.aligned("size", bytes)?;
        let end = offset.checked_add(bytes);
        if bytes == 0 || end.is_none_or(|e| e > size) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what}: [{offset}, +{bytes}) is empty or outside {size} bytes"
            )));
        }
        Ok(())
    }
}

/// `[offset, offset + bytes)` lies inside a host buffer of `len` bytes.
pub(crate) fn host_range(len: usize, offset: usize, bytes: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(DeviceError::InvalidArgument(format!(
            "host range [{offset}, +{bytes}) outside a {len}-byte buffer"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Be(u64, u64);
    impl ArgChecks for Be {
        fn instance_id(&self) -> u64 {
            self.0
        }
        fn granularity(&self) -> u64 {
            self.1
        }
    }
    struct H {
        owner: u64,
    }
    owned!(H);

    #[test]
    fn each_check_names_what_is_wrong() {
        let be = Be(7, 4096);
        assert!(be.own(&H { owner: 7 }, "stream").is_ok());
        let e = be.own(&H { owner: 8 }, "stream").unwrap_err().to_string();
        assert!(
            e.contains("stream belongs to another backend instance"),
            "{e}"
        );
        assert!(be.aligned("size", 8192).is_ok());
        let e = be.aligned("size", 100).unwrap_err().to_string();
        assert!(
            e.contains("size = 100 is not a multiple of the VMM granularity 4096"),
            "{e}"
        );
        assert!(matches!(
            Be(1, 0).aligned("size", 0),
            Err(DeviceError::Unsupported(_))
        ));
        assert!(be.vmm_range("map", 4096, 4096, 8192).is_ok());
        for (off, bytes) in [(0, 0), (4096, 8192), (u64::MAX - 4095, 4096)] {
            assert!(
                be.vmm_range("map", off, bytes, 8192).is_err(),
                "{off} {bytes}"
            );
        }
        assert!(host_range(16, 8, 8).is_ok());
        assert!(host_range(16, 8, 9).is_err());
        assert!(host_range(16, usize::MAX, 2).is_err());
    }
}
