//! How a kernel's parameters are built at launch (a leaf: the loaded ops,
//! the select-k kernels and the walk name it).

use xla_vmm::Slice;
use xla_vmm_device::TensorMapDesc;

/// How one kernel parameter is built at launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamSpec {
    /// The 8-byte address of a slice.
    Address(Slice),
    /// Constant bytes.
    Bytes(Vec<u8>),
    /// A 128-byte TMA descriptor of a slice (encoded per launch, since it
    /// embeds the address).
    Tma(Slice, TensorMapDesc),
}
