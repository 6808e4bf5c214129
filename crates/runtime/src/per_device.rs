//! Values measured once per device per process (the binding's cost probe,
//! staging's host link): the first caller for a device measures, every
//! later one reads the cached result (a failure too: it is not retried).

use std::collections::BTreeMap;
use std::sync::Mutex;

use xla_vmm_device::Backend;

/// A device of this process: backend, ordinal, name.
type Key = (&'static str, usize, String);

/// One cached value per device.
pub(crate) struct PerDevice<T>(Mutex<BTreeMap<Key, T>>);

impl<T: Clone> PerDevice<T> {
    pub(crate) const fn new() -> Self {
        PerDevice(Mutex::new(BTreeMap::new()))
    }

    /// `be`'s device's value: `measure()` the first time (under the cache's
    /// lock, so that two threads never measure one device at once), the
    /// cached one after.
    pub(crate) fn get_or_measure<B: Backend>(&self, be: &B, measure: impl FnOnce() -> T) -> T {
        let info = be.info();
        self.get((info.backend, info.ordinal, info.name.clone()), measure)
    }

    fn get(&self, key: Key, measure: impl FnOnce() -> T) -> T {
        let mut cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        cache.entry(key).or_insert_with(measure).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_once_per_device_failures_included() {
        let cache: PerDevice<Option<u32>> = PerDevice::new();
        let a = || ("cuda", 0, "one".to_string());
        let mut calls = 0;
        for _ in 0..3 {
            let got = cache.get(a(), || {
                calls += 1;
                None
            });
            assert_eq!(got, None);
        }
        assert_eq!(calls, 1, "a failed measurement is not retried");
        let b = || ("cuda", 1, "one".to_string());
        assert_eq!(cache.get(b(), || Some(7)), Some(7));
        assert_eq!(cache.get(b(), || Some(8)), Some(7));
        assert_eq!(cache.get(a(), || Some(9)), None);
    }
}
