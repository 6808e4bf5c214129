//! Writes fuzz seeds: `cargo run --manifest-path fuzz/Cargo.toml --bin seed`
//! copies the fixtures into fuzz/corpus/decode and their reassembled
//! `GpuExecutableProto` messages into fuzz/corpus/decode_message.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixtures = xla_vmm::testdata::fixtures_dir().ok_or("no integration/fixtures in this checkout")?;
    let whole = root.join("corpus/decode");
    let message = root.join("corpus/decode_message");
    std::fs::create_dir_all(&whole)?;
    std::fs::create_dir_all(&message)?;
    for entry in std::fs::read_dir(&fixtures)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "pjrt") {
            continue;
        }
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(&path)?;
        std::fs::write(whole.join(&name), &bytes)?;
        let outer = xla_vmm::decode::decode_executable_and_options(&bytes)?;
        let msg = xla_vmm::decode::read_split_proto(
            &outer.serialized_executable,
            "xla.gpu.GpuExecutableProto",
        )?;
        std::fs::write(message.join(&name), msg)?;
        println!("seeded {name}");
    }
    Ok(())
}
