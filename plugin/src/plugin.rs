//! `PJRT_Plugin_*`: initialization and the plugin's attributes.

use std::sync::LazyLock;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::{NamedValues, Value};
use crate::error::Result;

static ATTRIBUTES: LazyLock<NamedValues> = LazyLock::new(|| {
    NamedValues::new(vec![
        (
            "xla_vmm_version",
            Value::Str(env!("CARGO_PKG_VERSION").into()),
        ),
        (
            "pjrt_c_api_version",
            Value::Ints(vec![PJRT_API_MAJOR as i64, PJRT_API_MINOR as i64]),
        ),
    ])
});

pub fn initialize(_a: &mut PJRT_Plugin_Initialize_Args) -> Result<()> {
    crate::init_logging();
    Ok(())
}

pub fn attributes(a: &mut PJRT_Plugin_Attributes_Args) -> Result<()> {
    a.attributes = ATTRIBUTES.as_ptr();
    a.num_attributes = ATTRIBUTES.len();
    Ok(())
}
