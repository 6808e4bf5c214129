//! `impl Backend for HostBackend`.

use std::sync::Arc;

use super::exec::{Capture, EventEntry, Op, StreamEntry};
use super::kernel::parse_image;
use super::pinned::PinnedStorage;
use super::{
    stale, HostBackend, HostEvent, HostFunction, HostGraph, HostGraphExec, HostGraphNode,
    HostModule, HostPhys, HostPinned, HostStream, HostVa,
};
use crate::backend::{Backend, DeviceInfo, DevicePtr, EventStatus, ImageKind, LaunchConfig};
use crate::budget::{MemLocation, MemoryBudget};
use crate::error::{DeviceError, Result};

fn invalid(msg: impl Into<String>) -> DeviceError {
    DeviceError::InvalidArgument(msg.into())
}

fn capturing_error(call: &str) -> DeviceError {
    invalid(format!(
        "{call} is not permitted while the stream is capturing"
    ))
}

impl HostBackend {
    /// Result of a consuming call: the release already happened; report an
    /// injected failure (if due) after it.
    fn finish_release(&self, injected: Option<DeviceError>, r: Result<()>) -> Result<()> {
        r?;
        match injected {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A new event (counted as `call`), untimed or not.
    fn new_event(&self, call: &'static str, untimed: bool) -> Result<HostEvent> {
        let mut st = self.enter(call)?;
        let id = self.new_handle();
        st.events.insert(
            id,
            EventEntry {
                untimed,
                ..Default::default()
            },
        );
        Ok(HostEvent {
            backend: self.id,
            id,
        })
    }

    /// Edit node `node` of `exec` (a counted `call`): `edit` gets the op at
    /// the node's path (`None`: the exec has none there). Copy on write:
    /// launches already submitted keep the ops they had.
    fn edit_exec_node<T>(
        &self,
        call: &'static str,
        exec: &HostGraphExec,
        node: &HostGraphNode,
        edit: impl FnOnce(Option<&mut Op>) -> Result<T>,
    ) -> Result<T> {
        self.check(exec.backend)?;
        self.check(node.backend)?;
        let mut st = self.enter(call)?;
        let ops = st
            .execs
            .get_mut(&exec.id)
            .ok_or_else(|| stale("graph exec"))?;
        edit(Op::at_path_mut(
            Arc::make_mut(ops).as_mut_slice(),
            &node.path,
        ))
    }

    fn enqueue(&self, call: &'static str, stream: &HostStream, op: Op) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.enter(call)?;
        st.submit(stream.id, op)
    }

    /// The ops `record` captures on `stream` (which must be capturing) into
    /// a frame of their own: a conditional node's body.
    fn capture_nested(
        &self,
        stream: &HostStream,
        what: &'static str,
        record: impl FnOnce() -> Result<()>,
    ) -> Result<Vec<Op>> {
        self.check(stream.backend)?;
        let cap = {
            let mut st = self.enter(what)?;
            let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
            let cap = s
                .capture
                .ok_or_else(|| invalid(format!("{what}: the stream is not capturing")))?;
            st.captures
                .get_mut(&cap)
                .expect("live capture")
                .frames
                .push(Vec::new());
            cap
        };
        // The body calls back into the backend: run it unlocked.
        let r = record();
        let mut st = self.lock();
        let c = st
            .captures
            .get_mut(&cap)
            .ok_or_else(|| invalid(format!("{what}: the capture ended inside the body")))?;
        if c.frames.len() < 2 {
            return Err(invalid(format!("{what}: frames unbalanced")));
        }
        let ops = c.frames.pop().expect("checked");
        r.map(|()| ops)
    }

    /// Append `op` to the frame `stream`'s capture records into.
    fn push_captured(&self, stream: &HostStream, op: Op) -> Result<()> {
        let mut st = self.lock();
        let cap = st
            .streams
            .get(&stream.id)
            .ok_or_else(|| stale("stream"))?
            .capture
            .ok_or_else(|| invalid("the stream's capture ended"))?;
        st.captures
            .get_mut(&cap)
            .ok_or_else(|| invalid("the stream's capture ended"))?
            .frames
            .last_mut()
            .ok_or_else(|| invalid("a capture without its graph frame"))?
            .push(op);
        Ok(())
    }
}

impl Backend for HostBackend {
    type PhysMem = HostPhys;
    type VaRange = HostVa;
    type Stream = HostStream;
    type Event = HostEvent;
    type HostBuffer = HostPinned;
    type Module = HostModule;
    type Function = HostFunction;
    type Graph = HostGraph;
    type GraphExec = HostGraphExec;
    type GraphNode = HostGraphNode;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let st = self.enter("mem_info")?;
        let total = st.mem.capacity();
        Ok((total - st.mem.phys_bytes(), total))
    }

    // ---- VMM -----------------------------------------------------------------
    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// Host-located memory is emulated as device memory that does not count
    /// against the emulated device's capacity (the host has room).
    fn mem_create_raw(&self, bytes: u64, location: MemLocation) -> Result<HostPhys> {
        let mut st = self.enter("mem_create")?;
        let id = self.new_handle();
        st.mem
            .phys_create(id, bytes, location == MemLocation::Host)?;
        Ok(HostPhys {
            backend: self.id,
            id,
            size: bytes,
            location,
        })
    }

    fn mem_location(&self, mem: &HostPhys) -> MemLocation {
        mem.location
    }

    fn mem_release_raw(&self, mem: HostPhys) -> Result<()> {
        self.check(mem.backend)?;
        let injected = self.count("mem_release");
        let r = self.lock().mem.phys_release(mem.id);
        self.finish_release(injected, r)
    }

    fn mem_size(&self, mem: &HostPhys) -> u64 {
        mem.size
    }

    fn va_reserve(&self, bytes: u64, align: u64) -> Result<HostVa> {
        let mut st = self.enter("va_reserve")?;
        let id = self.new_handle();
        let base = st.mem.va_reserve(id, bytes, align)?;
        self.budget().note_va(true, bytes);
        Ok(HostVa {
            backend: self.id,
            id,
            base,
            size: bytes,
        })
    }

    fn va_free(&self, va: HostVa) -> Result<()> {
        self.check(va.backend)?;
        let injected = self.count("va_free");
        let r = self.lock().mem.va_free(va.id);
        if r.is_ok() {
            self.budget().note_va(false, va.size);
        }
        self.finish_release(injected, r)
    }

    fn va_base(&self, va: &HostVa) -> DevicePtr {
        DevicePtr(va.base)
    }

    fn va_size(&self, va: &HostVa) -> u64 {
        va.size
    }

    fn map(
        &self,
        va: &HostVa,
        va_offset: u64,
        mem: &HostPhys,
        mem_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        self.check(va.backend)?;
        self.check(mem.backend)?;
        let mut st = self.enter("map")?;
        st.mem.map(va.id, va_offset, mem.id, mem_offset, bytes)?;
        self.budget().note_mapping(true);
        Ok(())
    }

    fn unmap(&self, va: &HostVa, va_offset: u64, bytes: u64) -> Result<()> {
        self.check(va.backend)?;
        let mut st = self.enter("unmap")?;
        st.mem.unmap(va.id, va_offset, bytes)?;
        self.budget().note_mapping(false);
        Ok(())
    }

    fn set_access(&self, va: &HostVa, va_offset: u64, bytes: u64) -> Result<()> {
        self.check(va.backend)?;
        let mut st = self.enter("set_access")?;
        st.mem.set_access(va.id, va_offset, bytes)
    }

    // ---- streams and events ----------------------------------------------------
    fn stream_create(&self) -> Result<HostStream> {
        let mut st = self.enter("stream_create")?;
        let id = self.new_handle();
        st.streams.insert(id, StreamEntry::default());
        Ok(HostStream {
            backend: self.id,
            id,
        })
    }

    fn stream_destroy(&self, stream: HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let injected = self.count("stream_destroy");
        let mut st = self.lock();
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_some() {
            // Leave the capture (its graph loses this stream's work).
            if let Some(cap) = s.capture {
                if st.captures.get(&cap).is_some_and(|c| c.origin == stream.id) {
                    st.captures.remove(&cap);
                    for s in st.streams.values_mut() {
                        if s.capture == Some(cap) {
                            s.capture = None;
                        }
                    }
                }
            }
        }
        // Like cuStreamDestroy: queued work still completes.
        if let Some(s) = st.streams.get_mut(&stream.id) {
            s.held = false;
        }
        st.pump();
        st.streams.remove(&stream.id);
        drop(st);
        self.finish_release(injected, Ok(()))
    }

    fn stream_native(&self, stream: &HostStream) -> usize {
        stream.id as usize
    }
    fn stream_synchronize(&self, stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.enter("stream_synchronize")?;
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_some() {
            return Err(capturing_error("stream_synchronize"));
        }
        if let Some(e) = st.drain_error(stream.id) {
            return Err(e);
        }
        match st.streams.get_mut(&stream.id).and_then(|s| s.error.take()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stream_wait_event(&self, stream: &HostStream, event: &HostEvent) -> Result<()> {
        self.check(stream.backend)?;
        self.check(event.backend)?;
        let mut st = self.enter("stream_wait_event")?;
        let e = st.events.get(&event.id).ok_or_else(|| stale("event"))?;
        let (seq, captured_in) = (e.recorded, e.captured_in);
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        match (captured_in, s.capture) {
            // Fork: the stream joins the capture the event was recorded in.
            (Some(cap), None) => {
                st.streams.get_mut(&stream.id).expect("checked").capture = Some(cap);
                Ok(())
            }
            // Join inside one capture: ops of a capture run in issue order.
            (Some(a), Some(b)) if a == b => Ok(()),
            (_, Some(_)) => Err(invalid(
                "stream_wait_event: a capturing stream may only wait on events recorded in its capture",
            )),
            (None, None) => st.submit(stream.id, Op::Wait { event: event.id, seq }),
        }
    }

    fn event_create(&self) -> Result<HostEvent> {
        self.new_event("event_create", false)
    }

    fn event_create_untimed(&self) -> Result<HostEvent> {
        self.new_event("event_create_untimed", true)
    }

    fn event_destroy(&self, event: HostEvent) -> Result<()> {
        self.check(event.backend)?;
        let injected = self.count("event_destroy");
        let r = match self.lock().events.remove(&event.id) {
            Some(_) => Ok(()),
            None => Err(stale("event")),
        };
        self.finish_release(injected, r)
    }

    fn event_record(&self, event: &HostEvent, stream: &HostStream) -> Result<()> {
        self.check(event.backend)?;
        self.check(stream.backend)?;
        let mut st = self.enter("event_record")?;
        if !st.events.contains_key(&event.id) {
            return Err(stale("event"));
        }
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if let Some(cap) = s.capture {
            st.events.get_mut(&event.id).expect("checked").captured_in = Some(cap);
            return Ok(());
        }
        let e = st.events.get_mut(&event.id).expect("checked");
        e.recorded += 1;
        e.captured_in = None;
        let seq = e.recorded;
        st.submit(
            stream.id,
            Op::Record {
                event: event.id,
                seq,
            },
        )
    }

    fn event_record_in_graph(&self, event: &HostEvent, stream: &HostStream) -> Result<()> {
        self.check(event.backend)?;
        self.check(stream.backend)?;
        let mut st = self.enter("event_record_in_graph")?;
        if !st.events.contains_key(&event.id) {
            return Err(stale("event"));
        }
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_none() {
            return Err(invalid(
                "event_record_in_graph: the stream is not capturing".to_string(),
            ));
        }
        st.submit(stream.id, Op::RecordInGraph { event: event.id })
    }

    fn event_query(&self, event: &HostEvent) -> Result<EventStatus> {
        self.check(event.backend)?;
        let st = self.enter("event_query")?;
        let e = st.events.get(&event.id).ok_or_else(|| stale("event"))?;
        Ok(if e.complete() {
            EventStatus::Complete
        } else {
            EventStatus::Pending
        })
    }

    fn event_synchronize(&self, event: &HostEvent) -> Result<()> {
        self.check(event.backend)?;
        let st = self.enter("event_synchronize")?;
        let e = st.events.get(&event.id).ok_or_else(|| stale("event"))?;
        if e.complete() {
            Ok(())
        } else {
            Err(DeviceError::Driver {
                call: "event_synchronize",
                code: 2,
                name: "HOST_WOULD_BLOCK_FOREVER".into(),
                message: "the event waits on a held stream (HostBackend::hold_stream)".into(),
            })
        }
    }

    fn event_elapsed_ms(&self, start: &HostEvent, end: &HostEvent) -> Result<f32> {
        self.check(start.backend)?;
        self.check(end.backend)?;
        let st = self.enter("event_elapsed_ms")?;
        let time = |e: &HostEvent| {
            st.events
                .get(&e.id)
                .ok_or_else(|| stale("event"))
                .and_then(|e| {
                    if e.untimed {
                        return Err(invalid("event_elapsed_ms: an event made without timing"));
                    }
                    e.time
                        .filter(|_| e.complete())
                        .ok_or_else(|| invalid("event_elapsed_ms: event not completed"))
                })
        };
        let (a, b) = (time(start)?, time(end)?);
        Ok(if b >= a {
            (b - a).as_secs_f32() * 1e3
        } else {
            -((a - b).as_secs_f32() * 1e3)
        })
    }

    // ---- copies and fills ----------------------------------------------------------
    fn copy_d2d(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: &HostStream,
    ) -> Result<()> {
        self.enqueue("copy_d2d", stream, Op::Copy { dst, src, bytes })
    }

    /// One counted call (`copy_d2d_batch`) for the whole batch, so tests can
    /// assert how many batches a step enqueues; the copies run in order.
    fn copy_d2d_batch(
        &self,
        copies: &[(DevicePtr, DevicePtr, u64)],
        stream: &HostStream,
    ) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.enter("copy_d2d_batch")?;
        for &(dst, src, bytes) in copies.iter().filter(|c| c.2 > 0) {
            st.submit(stream.id, Op::Copy { dst, src, bytes })?;
        }
        Ok(())
    }

    fn copy_h2d(
        &self,
        dst: DevicePtr,
        host: &HostPinned,
        host_offset: usize,
        bytes: usize,
        stream: &HostStream,
    ) -> Result<()> {
        self.check(host.backend)?;
        let op = Op::H2D {
            dst,
            host: host.storage.clone(),
            offset: host_offset,
            bytes,
        };
        self.enqueue("copy_h2d", stream, op)
    }

    fn copy_d2h(
        &self,
        host: &HostPinned,
        host_offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: &HostStream,
    ) -> Result<()> {
        self.check(host.backend)?;
        let op = Op::D2H {
            host: host.storage.clone(),
            offset: host_offset,
            src,
            bytes,
        };
        self.enqueue("copy_d2h", stream, op)
    }

    fn write_sync(&self, dst: DevicePtr, data: &[u8], stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.enter("write_sync")?;
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_some() {
            return Err(capturing_error("write_sync"));
        }
        if let Some(e) = st.drain_error(stream.id) {
            return Err(e);
        }
        st.mem.write(dst, data)
    }

    fn read_sync(&self, out: &mut [u8], src: DevicePtr, stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let st = self.enter("read_sync")?;
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_some() {
            return Err(capturing_error("read_sync"));
        }
        if let Some(e) = st.drain_error(stream.id) {
            return Err(e);
        }
        st.mem.read(src, out)
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64, stream: &HostStream) -> Result<()> {
        let op = Op::Fill {
            dst,
            bytes,
            pattern: vec![value],
        };
        self.enqueue("memset_d8", stream, op)
    }

    fn memset_d32(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: &HostStream,
    ) -> Result<()> {
        if !dst.0.is_multiple_of(4) {
            return Err(invalid(format!(
                "memset_d32 destination {:#x} is not 4-byte aligned",
                dst.0
            )));
        }
        let bytes = count
            .checked_mul(4)
            .ok_or_else(|| invalid("memset_d32 count overflows"))?;
        let op = Op::Fill {
            dst,
            bytes,
            pattern: value.to_le_bytes().to_vec(),
        };
        self.enqueue("memset_d32", stream, op)
    }

    // ---- pinned host memory -------------------------------------------------------
    fn host_alloc(&self, bytes: usize) -> Result<HostPinned> {
        let mut st = self.enter("host_alloc")?;
        let id = self.new_handle();
        st.host_bufs.insert(id, bytes);
        Ok(HostPinned {
            backend: self.id,
            id,
            storage: Arc::new(PinnedStorage::new(bytes)),
        })
    }

    fn host_free(&self, buf: HostPinned) -> Result<()> {
        self.check(buf.backend)?;
        let injected = self.count("host_free");
        // Queued copies keep the storage alive through their own Arc.
        let r = {
            let mut st = self.lock();
            st.mem.drop_window(buf.id);
            match st.host_bufs.remove(&buf.id) {
                Some(_) => Ok(()),
                None => Err(stale("host buffer")),
            }
        };
        self.finish_release(injected, r)
    }

    fn host_bytes<'a>(&self, buf: &'a HostPinned) -> &'a [u8] {
        buf.storage.as_bytes()
    }

    fn host_bytes_mut<'a>(&self, buf: &'a mut HostPinned) -> &'a mut [u8] {
        buf.storage.as_bytes_mut()
    }

    /// A window in the fake address space: device accesses there (kernels,
    /// copies) read and write the buffer's bytes.
    fn host_device_ptr(&self, buf: &HostPinned) -> Result<DevicePtr> {
        self.check(buf.backend)?;
        let mut st = self.enter("host_device_ptr")?;
        if !st.host_bufs.contains_key(&buf.id) {
            return Err(stale("host buffer"));
        }
        Ok(DevicePtr(st.mem.window(buf.id, &buf.storage)?))
    }

    // ---- modules and kernels -----------------------------------------------------
    fn module_load(&self, image: &[u8], kind: ImageKind) -> Result<HostModule> {
        let mut st = self.enter("module_load")?;
        if kind != ImageKind::Host {
            return Err(DeviceError::Unsupported(format!(
                "the host backend loads only ImageKind::Host modules, not {kind:?}"
            )));
        }
        let names = parse_image(image)?;
        if let Some(missing) = names.iter().find(|n| !st.kernels.contains_key(n.as_str())) {
            return Err(invalid(format!(
                "host kernel {missing:?} is not registered"
            )));
        }
        let id = self.new_handle();
        st.modules.insert(id, names);
        Ok(HostModule {
            backend: self.id,
            id,
        })
    }

    fn module_unload(&self, module: HostModule) -> Result<()> {
        self.check(module.backend)?;
        let injected = self.count("module_unload");
        let r = match self.lock().modules.remove(&module.id) {
            Some(_) => Ok(()),
            None => Err(stale("module")),
        };
        self.finish_release(injected, r)
    }

    fn module_function(&self, module: &HostModule, name: &str) -> Result<HostFunction> {
        self.check(module.backend)?;
        let st = self.enter("module_function")?;
        let names = st.modules.get(&module.id).ok_or_else(|| stale("module"))?;
        if !names.iter().any(|n| n == name) {
            return Err(invalid(format!("module has no kernel {name:?}")));
        }
        let kernel = st
            .kernels
            .get(name)
            .ok_or_else(|| invalid(format!("host kernel {name:?} is not registered")))?
            .clone();
        Ok(HostFunction {
            backend: self.id,
            module: module.id,
            name: name.into(),
            kernel,
        })
    }

    fn launch(
        &self,
        function: &HostFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
        stream: &HostStream,
    ) -> Result<()> {
        self.check(function.backend)?;
        if config.grid.contains(&0) || config.block.contains(&0) {
            return Err(invalid(format!(
                "launch of {}: grid {:?} / block {:?} has a zero dimension",
                function.name, config.grid, config.block
            )));
        }
        let op = Op::Launch {
            module: function.module,
            name: function.name.clone(),
            kernel: function.kernel.clone(),
            config: *config,
            args: args.iter().map(|a| a.to_vec()).collect(),
            enabled: true,
        };
        self.enqueue("launch", stream, op)
    }

    // ---- graphs -------------------------------------------------------------------
    fn stream_begin_capture(&self, stream: &HostStream) -> Result<()> {
        self.check(stream.backend)?;
        let mut st = self.enter("stream_begin_capture")?;
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        if s.capture.is_some() {
            return Err(invalid(
                "stream_begin_capture: the stream is already capturing",
            ));
        }
        if !s.queue.is_empty() {
            // Our ops would be ordered after queued work in the graph
            // position-wise only; keep the model simple and honest.
            tracing::debug!("host backend: capture begins on a stream with queued work");
        }
        let cap = self.new_handle();
        st.captures.insert(
            cap,
            Capture {
                origin: stream.id,
                frames: vec![Vec::new()],
            },
        );
        st.streams.get_mut(&stream.id).expect("checked").capture = Some(cap);
        Ok(())
    }

    fn stream_end_capture(&self, stream: &HostStream) -> Result<HostGraph> {
        self.check(stream.backend)?;
        let mut st = self.enter("stream_end_capture")?;
        let s = st.streams.get(&stream.id).ok_or_else(|| stale("stream"))?;
        let cap = s
            .capture
            .ok_or_else(|| invalid("stream_end_capture: the stream is not capturing"))?;
        let c = &st.captures[&cap];
        if c.origin != stream.id {
            return Err(invalid(
                "stream_end_capture must be called on the stream that began the capture",
            ));
        }
        if c.frames.len() != 1 {
            return Err(invalid("stream_end_capture inside an open WHILE body"));
        }
        let mut c = st.captures.remove(&cap).expect("checked");
        for s in st.streams.values_mut() {
            if s.capture == Some(cap) {
                s.capture = None;
            }
        }
        for e in st.events.values_mut() {
            if e.captured_in == Some(cap) {
                e.captured_in = None;
            }
        }
        let id = self.new_handle();
        st.graphs
            .insert(id, Arc::new(c.frames.pop().expect("one frame")));
        Ok(HostGraph {
            backend: self.id,
            id,
        })
    }

    fn graph_instantiate(&self, graph: &HostGraph) -> Result<HostGraphExec> {
        self.check(graph.backend)?;
        let mut st = self.enter("graph_instantiate")?;
        let ops = st
            .graphs
            .get(&graph.id)
            .ok_or_else(|| stale("graph"))?
            .clone();
        let id = self.new_handle();
        st.execs.insert(id, ops);
        Ok(HostGraphExec {
            backend: self.id,
            id,
        })
    }

    fn graph_launch(&self, exec: &HostGraphExec, stream: &HostStream) -> Result<()> {
        self.check(exec.backend)?;
        self.check(stream.backend)?;
        let mut st = self.enter("graph_launch")?;
        let ops = st
            .execs
            .get(&exec.id)
            .ok_or_else(|| stale("graph exec"))?
            .clone();
        st.submit(stream.id, Op::Graph(ops))
    }

    fn graph_kernel_nodes(
        &self,
        graph: &HostGraph,
        function: &HostFunction,
    ) -> Result<Vec<HostGraphNode>> {
        self.check(graph.backend)?;
        self.check(function.backend)?;
        let st = self.enter("graph_kernel_nodes")?;
        let ops = st.graphs.get(&graph.id).ok_or_else(|| stale("graph"))?;
        let mut paths = Vec::new();
        Op::find_launches(
            ops,
            function.module,
            &function.name,
            &mut Vec::new(),
            &mut paths,
        );
        Ok(paths
            .into_iter()
            .map(|path| HostGraphNode {
                backend: self.id,
                path,
            })
            .collect())
    }

    fn graph_exec_kernel_update(
        &self,
        exec: &HostGraphExec,
        node: &HostGraphNode,
        function: &HostFunction,
        config: &LaunchConfig,
        args: &[&[u8]],
    ) -> Result<()> {
        self.check(exec.backend)?;
        self.check(node.backend)?;
        self.check(function.backend)?;
        config.check_node_update()?;
        self.edit_exec_node("graph_exec_kernel_update", exec, node, |op| {
            match op
                .ok_or_else(|| invalid("kernel node update: no such node in this graph exec"))?
            {
                Op::Launch {
                    module,
                    name,
                    config: c,
                    args: a,
                    ..
                } if *module == function.module && **name == *function.name => {
                    if c.shared_mem_bytes != config.shared_mem_bytes {
                        return Err(invalid("kernel node update: shared memory cannot change"));
                    }
                    *c = *config;
                    *a = args.iter().map(|x| x.to_vec()).collect();
                    Ok(())
                }
                _ => Err(invalid(format!(
                    "kernel node update: the node does not launch {}",
                    function.name
                ))),
            }
        })
    }

    fn graph_exec_node_set_enabled(
        &self,
        exec: &HostGraphExec,
        node: &HostGraphNode,
        enabled: bool,
    ) -> Result<()> {
        self.edit_exec_node("graph_exec_node_set_enabled", exec, node, |op| match op {
            Some(Op::Launch { enabled: e, .. }) => {
                *e = enabled;
                Ok(())
            }
            _ => Err(invalid(
                "node enable: no such kernel node in this graph exec",
            )),
        })
    }

    fn graph_exec_update(&self, exec: &HostGraphExec, graph: &HostGraph) -> Result<bool> {
        self.check(exec.backend)?;
        self.check(graph.backend)?;
        let mut st = self.enter("graph_exec_update")?;
        let new = st
            .graphs
            .get(&graph.id)
            .ok_or_else(|| stale("graph"))?
            .clone();
        let old = st.execs.get(&exec.id).ok_or_else(|| stale("graph exec"))?;
        if !Op::same_topology(old, &new) {
            return Ok(false);
        }
        st.execs.insert(exec.id, new);
        Ok(true)
    }

    fn graph_destroy(&self, graph: HostGraph) -> Result<()> {
        self.check(graph.backend)?;
        let injected = self.count("graph_destroy");
        let r = match self.lock().graphs.remove(&graph.id) {
            Some(_) => Ok(()),
            None => Err(stale("graph")),
        };
        self.finish_release(injected, r)
    }

    fn graph_exec_destroy(&self, exec: HostGraphExec) -> Result<()> {
        self.check(exec.backend)?;
        let injected = self.count("graph_exec_destroy");
        let r = match self.lock().execs.remove(&exec.id) {
            Some(_) => Ok(()),
            None => Err(stale("graph exec")),
        };
        self.finish_release(injected, r)
    }

    fn capture_while(
        &self,
        stream: &HostStream,
        predicate: DevicePtr,
        body: &mut dyn FnMut(&HostStream) -> Result<()>,
    ) -> Result<()> {
        let body = Arc::new(self.capture_nested(stream, "capture_while", || body(stream))?);
        self.push_captured(stream, Op::While { predicate, body })
    }

    fn capture_case(
        &self,
        stream: &HostStream,
        index: DevicePtr,
        is_pred: bool,
        branches: usize,
        body: &mut dyn FnMut(usize, &HostStream) -> Result<()>,
    ) -> Result<()> {
        let branches = (0..branches)
            .map(|b| {
                let ops = self.capture_nested(stream, "capture_case", || body(b, stream))?;
                Ok(Arc::new(ops))
            })
            .collect::<Result<Vec<_>>>()?;
        self.push_captured(
            stream,
            Op::Case {
                index,
                is_pred,
                branches,
            },
        )
    }

    // ---- collectives (in-process emulation, see `collective`) -------------------
    fn clique_id(&self) -> Result<crate::collective::CliqueId> {
        super::collective::clique_id(self)
    }

    fn comm_init_rank(
        &self,
        id: &crate::collective::CliqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Box<dyn crate::collective::Communicator<Self::Stream>>> {
        super::collective::comm_init_rank(self, id, nranks, rank)
    }

    fn enable_peer_access(&self, _peer: usize) -> Result<()> {
        // Host "devices" share the process' memory: nothing to enable.
        match self.count("enable_peer_access") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
