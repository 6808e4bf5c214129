//! `PJRT_Plugin_*`: initialization and the plugin's attributes.
//!
//! The attributes are the vendor plugin's (its XLA and StableHLO versions:
//! it is the compiler) when it is loaded, plus ours (`xla_vmm_version`).

use std::sync::OnceLock;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::{NamedValues, Value};
use crate::error::Result;
use crate::vendor::VendorPlugin;

/// Built once: with the vendor's attributes if the vendor plugin was loaded
/// before the first call (clients on the CUDA backend load it at creation).
static ATTRIBUTES: OnceLock<NamedValues> = OnceLock::new();

fn build() -> NamedValues {
    let mut items: Vec<(String, Value)> = Vec::new();
    if let Some(v) = VendorPlugin::loaded() {
        match v.attributes() {
            Ok(a) => items.extend(a),
            Err(e) => tracing::warn!("vendor plugin attributes: {e}"),
        }
    }
    items.retain(|(n, _)| n != "xla_vmm_version");
    items.push((
        "xla_vmm_version".into(),
        Value::Str(env!("CARGO_PKG_VERSION").into()),
    ));
    NamedValues::new(items.iter().map(|(n, v)| (n.as_str(), v.clone())).collect())
}

pub fn initialize(_a: &mut PJRT_Plugin_Initialize_Args) -> Result<()> {
    let process = crate::options::ProcessOptions::from_env();
    crate::init_logging(&process);
    crate::crash::install_if(process.crash_report);
    Ok(())
}

pub fn attributes(a: &mut PJRT_Plugin_Attributes_Args) -> Result<()> {
    let attrs = ATTRIBUTES.get_or_init(build);
    a.attributes = attrs.as_ptr();
    a.num_attributes = attrs.len();
    Ok(())
}
