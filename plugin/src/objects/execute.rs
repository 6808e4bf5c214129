//! `PJRT_LoadedExecutable_Execute`: argument list `i` (and output list
//! `i`, completion event `i`) belongs to the executable's addressable device
//! `i` (or to `execute_device`). Every list is checked before anything
//! runs; one device's step is enqueued inline, several devices' steps on
//! their devices' worker threads (`worker.rs`), all at once.

use std::sync::Arc;

use xla_vmm_ffi::pjrt::*;

use crate::cabi::caller;
use crate::cabi::error::{Error, Result};
use crate::cabi::ffi_state::ExecuteContext;
use crate::cabi::handles::Handle;
use crate::objects::buffer::Buffer;
use crate::objects::device::Device;
use crate::objects::executable::{loaded, DeviceProgram, Executable};
use crate::runtime::event::Event;

/// One device's step: its outputs and the event completing them.
type Step = Result<(Vec<Arc<Buffer>>, Arc<Event>)>;

/// Each device's step on that device's worker thread, all at once; the
/// results in argument-list order.
fn run_on_workers(
    e: &Arc<Executable>,
    parts: &[Arc<DeviceProgram>],
    args: Vec<Vec<Arc<Buffer>>>,
    non_donatable: &[i64],
    context: Option<&Arc<ExecuteContext>>,
) -> Result<Vec<Step>> {
    let n = parts.len();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Step)>();
    {
        let _order = crate::objects::worker::submission();
        for (d, (part, list)) in parts.iter().zip(args).enumerate() {
            let (exe, nd, tx) = (e.clone(), non_donatable.to_vec(), tx.clone());
            let ctx = context.cloned();
            let device = part.device.clone();
            let part = part.clone();
            let job = Box::new(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    exe.execute(&part, &list, &nd, ctx.as_ref())
                }))
                .unwrap_or_else(|_| Err(Error::internal("a device's execution panicked")));
                let _ = tx.send((d, r));
            });
            device
                .worker
                .submit(&format!("xla-vmm-device-{}", device.id()), job)?;
        }
    }
    drop(tx);
    let mut results: Vec<Option<Step>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (d, r) = rx
            .recv()
            .map_err(|_| Error::internal("a device's execution ended without a result"))?;
        results[d] = Some(r);
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::internal("no result"))))
        .collect())
}

/// Execute on `num_devices` devices: argument list `i` (and output list
/// `i`, completion event `i`) belongs to the executable's addressable
/// device `i`. Every list is checked before anything runs; then each
/// device's step is enqueued on its device's worker thread (`worker.rs`:
/// the devices' programs meet in their collectives), one device inline.
pub fn execute(a: &mut PJRT_LoadedExecutable_Execute_Args) -> Result<()> {
    let e = loaded(a.executable)?;
    let n = a.num_devices;
    // The program of each argument list's device.
    let parts: Vec<Arc<DeviceProgram>> = if !a.execute_device.is_null() {
        let d = Device::from_c(a.execute_device)?;
        if n != 1 {
            return Err(Error::invalid(format!(
                "execute_device is set with num_devices {n}: it needs exactly one argument list"
            )));
        }
        vec![e.part_on(&d)?]
    } else {
        if n != e.parts.len() {
            return Err(Error::invalid(format!(
                "{} runs on {} addressable devices ({} replicas x {} partitions over devices \
                 {:?}); Execute was given {n} argument lists (num_devices)",
                e.name,
                e.parts.len(),
                e.assignment.replicas,
                e.assignment.partitions,
                e.assignment.ids
            )));
        }
        e.parts.clone()
    };
    // Counts checked before any list is read (a wrong one would read past
    // the caller's arrays).
    if a.num_args != e.params.len() {
        return Err(Error::invalid(format!(
            "{} takes {} arguments, {} given (num_args)",
            e.name,
            e.params.len(),
            a.num_args
        )));
    }
    let options = caller::slice(a.options.cast_const(), 1, "options")?.first();
    // The FFI user data of this call (host callbacks), for a program that
    // runs on the vendor runtime.
    let context = match options.map(|o| o.context) {
        Some(c) if !c.is_null() => Some(ExecuteContext::from_c(c)?),
        _ => None,
    };
    let non_donatable = match options {
        Some(o) => {
            let idx = caller::vec_at_most(
                o.non_donatable_input_indices,
                o.num_non_donatable_input_indices,
                a.num_args,
                "non_donatable_input_indices",
            )?;
            if let Some(bad) = idx.iter().find(|&&i| i < 0 || i as usize >= a.num_args) {
                return Err(Error::invalid(format!(
                    "non_donatable_input_indices: {bad} is not an argument index (0..{})",
                    a.num_args
                )));
            }
            idx
        }
        None => Vec::new(),
    };
    let lists = caller::slice(a.argument_lists, n, "argument_lists")?;
    let mut args = Vec::with_capacity(n);
    for (d, &list) in lists.iter().enumerate() {
        let ptrs = caller::slice(list, a.num_args, "argument list")?;
        let list = ptrs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                Buffer::from_c(p)
                    .map_err(|err| Error::from(err).context(&format!("device {d} argument {i}")))
            })
            .collect::<Result<Vec<_>>>()?;
        e.check_args(&parts[d], &list, &non_donatable)
            .map_err(|err| err.context(&format!("argument list {d}")))?;
        args.push(list);
    }
    let out_lists = caller::slice(a.output_lists, n, "output_lists")?;
    // A program without outputs gets empty lists, which callers may pass as
    // null (jaxlib does: an empty vector's data).
    if !e.outputs.is_empty() {
        if let Some(d) = out_lists.iter().position(|l| l.is_null()) {
            return Err(Error::invalid(format!("output list {d} is null")));
        }
    }
    let results: Vec<Step> = if n == 1 {
        vec![e.execute(&parts[0], &args[0], &non_donatable, context.as_ref())]
    } else {
        run_on_workers(&e, &parts, args, &non_donatable, context.as_ref())?
    };
    // All or nothing: on any error the other devices' outputs are dropped
    // (their memory is freed after the queued work).
    let mut done_all = Vec::with_capacity(n);
    for (d, r) in results.into_iter().enumerate() {
        done_all.push(r.map_err(|err| {
            if n > 1 {
                err.context(&format!("device {}", parts[d].device.id()))
            } else {
                err
            }
        })?);
    }
    let mut events = Vec::with_capacity(n);
    for (d, (outs, done)) in done_all.into_iter().enumerate() {
        let ptrs: Vec<*mut PJRT_Buffer> = outs.into_iter().map(Handle::into_c).collect();
        caller::write_slice(out_lists[d], &ptrs, "output list")?;
        events.push(done);
    }
    if !a.device_complete_events.is_null() {
        let events: Vec<*mut PJRT_Event> = events.into_iter().map(Handle::into_c).collect();
        caller::write_slice(a.device_complete_events, &events, "device_complete_events")?;
    }
    Ok(())
}
