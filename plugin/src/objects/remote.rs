//! The memory of a device of another process (multi-process runs): listed
//! by `PJRT_Client_Devices` so JAX sees the global topology, never
//! addressable here. Every operation is an error naming the device and its
//! process.

use std::sync::Arc;

use xla_vmm_device::vmm::VmmStats;
use xla_vmm_device::{DeviceInfo, DevicePtr};

use crate::cabi::assignment::MultiDevice;
use crate::cabi::error::{Error, Result};
use crate::runtime::context::{Allocation, DeviceContext, Memory};
use crate::runtime::event::Event;
use crate::runtime::program::Program;

pub struct RemoteDevice {
    info: DeviceInfo,
    id: i32,
    process: i32,
}

impl RemoteDevice {
    /// Device `id` of process `process`, described like `like` (processes
    /// of one job run on the same kind of GPU).
    pub fn new(like: &DeviceInfo, id: i32, process: i32) -> Self {
        RemoteDevice {
            info: like.clone(),
            id,
            process,
        }
    }

    fn refuse(&self) -> Error {
        Error::invalid(format!(
            "device {} belongs to process {}: it is not addressable from this process",
            self.id, self.process
        ))
    }
}

impl Memory for RemoteDevice {
    fn alloc(&self, _bytes: u64) -> Result<Allocation> {
        Err(self.refuse())
    }
    fn upload(&self, _dst: DevicePtr, _data: &[u8]) -> Result<Option<Arc<Event>>> {
        Err(self.refuse())
    }
    fn download(&self, _out: &mut [u8], _src: DevicePtr) -> Result<()> {
        Err(self.refuse())
    }
    fn copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: u64) -> Result<()> {
        Err(self.refuse())
    }
}

impl DeviceContext for RemoteDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn complete_after(&self, done: Arc<Event>) {
        done.set(Err(self.refuse()));
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_sync(&self) -> bool {
        true
    }
    fn shutdown(&self) {}
    fn stats(&self) -> VmmStats {
        VmmStats::default()
    }
    fn mem_info(&self) -> Result<(u64, u64)> {
        Err(self.refuse())
    }
    fn load_program(
        &self,
        _plan: xla_vmm::Plan,
        _multi: Option<&MultiDevice>,
    ) -> Result<Box<dyn Program>> {
        Err(self.refuse())
    }
}
