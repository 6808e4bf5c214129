//! ELF GPU code images (CUDA cubins, AMDGPU code objects): the initial
//! bytes of a global variable, and what an image holds (its machine, its
//! kernels), for the load check.
//!
//! XLA may leave a constant's value only inside the module binary, as the
//! initializer of the global `symbol_name` (`ConstantInfoProto.content`
//! empty). We read it from the ELF symbol table: the symbol's section holds
//! the initializer. A symbol in a `SHT_NOBITS` section has no initializer in
//! the image (XLA then takes the value from the HLO module, which the
//! decoder does: `xla_vmm::decode`), so it yields `None`.

use crate::error::{Result, RuntimeError};

fn u16le(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32le(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64le(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn sections(elf: &[u8]) -> Option<Vec<Section>> {
    if elf.get(0..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None; // not little-endian ELF64
    }
    let shoff = u64le(elf, 0x28)? as usize;
    let shentsize = u16le(elf, 0x3a)? as usize;
    let shnum = u16le(elf, 0x3c)? as usize;
    (0..shnum)
        .map(|i| {
            let o = shoff.checked_add(i.checked_mul(shentsize)?)?;
            Some(Section {
                kind: u32le(elf, o + 4)?,
                offset: u64le(elf, o + 0x18)?,
                size: u64le(elf, o + 0x20)?,
                link: u32le(elf, o + 0x28)?,
                entsize: u64le(elf, o + 0x38)?,
            })
        })
        .collect()
}

fn cstr(b: &[u8], o: usize) -> Option<&[u8]> {
    let s = b.get(o..)?;
    Some(&s[..s.iter().position(|&c| c == 0)?])
}

/// The initial bytes of global `name` in `elf`; `Ok(None)` when the image
/// has no such initialized symbol (or is not an ELF64 image).
pub fn global_bytes(elf: &[u8], name: &str) -> Result<Option<Vec<u8>>> {
    let bad = |m: &str| RuntimeError::invalid(format!("ELF image: {m} (symbol {name})"));
    let Some(secs) = sections(elf) else {
        return Ok(None);
    };
    const SHT_NOBITS: u32 = 8;
    let syms = symbol_table(elf, &secs, &[SHT_SYMTAB])?;
    let Some(sym) = syms.iter().find(|s| s.name == name.as_bytes()) else {
        return Ok(None);
    };
    let sec = secs
        .get(sym.shndx)
        .ok_or_else(|| bad("symbol section index"))?;
    if sec.kind == SHT_NOBITS {
        // Declared but not initialized in the image (XLA's `.nv.global`):
        // the value is set by the loader, not here.
        return Ok(None);
    }
    let start = sec
        .offset
        .checked_add(sym.value)
        .ok_or_else(|| bad("offset"))?;
    let end = start.checked_add(sym.size).ok_or_else(|| bad("size"))?;
    let data = elf
        .get(start as usize..end as usize)
        .ok_or_else(|| bad("symbol data out of range"))?;
    Ok(Some(data.to_vec()))
}

/// `e_machine` of NVIDIA cubins.
pub const EM_CUDA: u16 = 190;
/// `e_machine` of AMDGPU code objects (hsaco).
pub const EM_AMDGPU: u16 = 224;
const STT_FUNC: u8 = 2;
const STT_OBJECT: u8 = 1;
/// Size of an AMDGPU kernel descriptor (`<kernel>.kd`, amd_kernel_code_t's
/// successor): 64 bytes in every code object version.
const AMDGPU_KERNEL_DESCRIPTOR_BYTES: u64 = 64;

/// `(e_machine, e_flags)` of a little-endian ELF64 image.
pub fn machine(elf: &[u8]) -> Option<(u16, u32)> {
    if elf.get(0..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None;
    }
    Some((u16le(elf, 0x12)?, u32le(elf, 0x30)?))
}

/// The AMDGPU target of a code object: `gfx` + `EF_AMDGPU_MACH` as XLA
/// names it (gfx90a, gfx942, ...), for the targets we know.
pub fn amdgpu_target(e_flags: u32) -> Option<&'static str> {
    Some(match e_flags & 0xff {
        0x3f => "gfx90a",
        0x4c => "gfx942",
        0x4b => "gfx941",
        0x4a => "gfx940",
        0x4f => "gfx950",
        0x41 => "gfx1100",
        0x36 => "gfx1030",
        _ => return None,
    })
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;

/// One symbol: name, `st_info` type, section index, value, size.
struct Symbol<'a> {
    name: &'a [u8],
    kind: u8,
    shndx: usize,
    value: u64,
    size: u64,
}

/// Every symbol of the symbol tables of the given section types
/// (`SHT_SYMTAB`, `SHT_DYNSYM`).
fn symbol_table<'a>(elf: &'a [u8], secs: &[Section], tables: &[u32]) -> Result<Vec<Symbol<'a>>> {
    let bad = |m: &str| RuntimeError::invalid(format!("ELF image: {m}"));
    let mut out = Vec::new();
    for tab in secs.iter().filter(|s| tables.contains(&s.kind)) {
        let strtab = secs
            .get(tab.link as usize)
            .ok_or_else(|| bad("bad strtab link"))?;
        let strs = elf
            .get(strtab.offset as usize..strtab.offset.saturating_add(strtab.size) as usize)
            .ok_or_else(|| bad("strtab out of range"))?;
        let ent = if tab.entsize == 0 {
            24
        } else {
            tab.entsize as usize
        };
        for i in 0..(tab.size as usize / ent) {
            let o = tab.offset as usize + i * ent;
            let field = |v: Option<u64>| v.ok_or_else(|| bad("symbol table out of range"));
            let name_off = field(u32le(elf, o).map(u64::from))?;
            let info = field(elf.get(o + 4).map(|&b| u64::from(b)))?;
            let shndx = field(u16le(elf, o + 6).map(u64::from))?;
            let value = field(u64le(elf, o + 8))?;
            let size = field(u64le(elf, o + 16))?;
            if let Some(name) = cstr(strs, name_off as usize) {
                out.push(Symbol {
                    name,
                    kind: (info & 0xf) as u8,
                    shndx: shndx as usize,
                    value,
                    size,
                });
            }
        }
    }
    Ok(out)
}

/// Every symbol of `.symtab` and `.dynsym` (code objects keep their
/// kernels in the dynamic table).
fn symbols(elf: &[u8]) -> Result<Vec<Symbol<'_>>> {
    let secs = sections(elf)
        .ok_or_else(|| RuntimeError::invalid("ELF image: not a little-endian ELF64 image"))?;
    symbol_table(elf, &secs, &[SHT_SYMTAB, SHT_DYNSYM])
}

/// Does `elf` define kernel `name` as its machine's loader expects? A
/// cubin: a function symbol `name`. An AMDGPU code object: the function
/// `name` and its 64-byte kernel descriptor `name.kd` (what hipModuleGetFunction
/// looks up). Other machines are refused by name.
pub fn check_kernel(elf: &[u8], name: &str) -> Result<()> {
    let (em, _) = machine(elf)
        .ok_or_else(|| RuntimeError::invalid(format!("kernel {name}: not an ELF64 image")))?;
    let syms = symbols(elf)?;
    let has = |n: &str, kind: u8| {
        syms.iter()
            .any(|s| s.name == n.as_bytes() && s.kind == kind)
    };
    match em {
        EM_CUDA => {
            if !has(name, STT_FUNC) {
                return Err(RuntimeError::invalid(format!("cubin has no kernel {name}")));
            }
        }
        EM_AMDGPU => {
            if !has(name, STT_FUNC) {
                return Err(RuntimeError::invalid(format!("code object has no kernel {name}")));
            }
            let kd = format!("{name}.kd");
            let desc = syms.iter().find(|s| s.name == kd.as_bytes() && s.kind == STT_OBJECT);
            match desc {
                Some(d) if d.size == AMDGPU_KERNEL_DESCRIPTOR_BYTES => {}
                Some(d) => {
                    return Err(RuntimeError::invalid(format!(
                        "kernel descriptor {kd} has {} bytes, not {AMDGPU_KERNEL_DESCRIPTOR_BYTES}",
                        d.size
                    )))
                }
                None => {
                    return Err(RuntimeError::invalid(format!(
                        "code object has no kernel descriptor {kd}"
                    )))
                }
            }
        }
        other => {
            return Err(RuntimeError::unsupported(format!(
                "kernel {name}: ELF machine {other} is neither CUDA ({EM_CUDA}) nor AMDGPU ({EM_AMDGPU})"
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with sections: null, .strtab, .symtab, .data.
    fn tiny_elf() -> Vec<u8> {
        let strtab = b"\0konst\0".to_vec();
        let data = vec![1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut sym = vec![0u8; 48]; // null symbol + one symbol
        sym[24..28].copy_from_slice(&1u32.to_le_bytes()); // name "konst"
        sym[30..32].copy_from_slice(&3u16.to_le_bytes()); // section 3
        sym[32..40].copy_from_slice(&2u64.to_le_bytes()); // value (offset)
        sym[40..48].copy_from_slice(&4u64.to_le_bytes()); // size
        let mut elf = vec![0u8; 64];
        elf[0..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let (s_off, y_off, d_off) = (64, 64 + strtab.len(), 64 + strtab.len() + sym.len());
        elf.extend(&strtab);
        elf.extend(&sym);
        elf.extend(&data);
        let shoff = elf.len();
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        let sh = |kind: u32, off: usize, size: usize, link: u32, ent: u64| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            h[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
            h[0x38..0x40].copy_from_slice(&ent.to_le_bytes());
            h
        };
        elf.extend(sh(0, 0, 0, 0, 0));
        elf.extend(sh(3, s_off, strtab.len(), 0, 0));
        elf.extend(sh(2, y_off, sym.len(), 1, 24));
        elf.extend(sh(1, d_off, data.len(), 0, 0));
        elf
    }

    #[test]
    fn reads_a_symbols_initializer() {
        let elf = tiny_elf();
        assert_eq!(global_bytes(&elf, "konst").unwrap(), Some(vec![3, 4, 5, 6]));
        assert_eq!(global_bytes(&elf, "other").unwrap(), None);
        assert_eq!(global_bytes(b"not an elf", "konst").unwrap(), None);
    }
}
