//! `PJRT_Plugin_*`: initialization and the plugin's attributes.
//!
//! The attributes are the vendor plugin's (its XLA and StableHLO versions:
//! it is the compiler) when it is loaded, plus ours (`xla_vmm_version`).

use std::sync::OnceLock;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller::{NamedValues, Value};
use crate::cabi::error::Result;
use crate::vendor_plugin::compiler::VendorPlugin;

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
    let process = crate::cabi::options::ProcessOptions::from_env();
    init_logging(&process);
    crate::cabi::crash::install_if(process.crash_report);
    Ok(())
}

pub fn attributes(a: &mut PJRT_Plugin_Attributes_Args) -> Result<()> {
    let attrs = ATTRIBUTES.get_or_init(build);
    a.attributes = attrs.as_ptr();
    a.num_attributes = attrs.len();
    Ok(())
}

/// Install a `tracing` subscriber with `process`'s filter (`XLA_VMM_LOG`,
/// e.g. `info`, `xla_vmm_plugin=debug`; default `warn`, so fallbacks and
/// hangs are reported), once, unless the host process installed one. Colour
/// only on a terminal (not in a log file or a CI log), and never under
/// `NO_COLOR` (no-color.org).
fn init_logging(process: &crate::cabi::options::ProcessOptions) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(&process.log_filter))
            .with_writer(std::io::stderr)
            .with_ansi(process.color)
            .try_init();
    });
}
