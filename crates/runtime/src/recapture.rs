//! Graph-recapture mode (the user's `graph-recapture`): the whole program
//! captured into one graph, replayed each run, re-captured (and the exec
//! updated in place where the driver allows) when a parameter address
//! changes.

use xla_vmm_device::{Backend, DevicePtr};

use crate::error::Result;
use crate::exec::{run_seq, ExecEnv};
use crate::program::Program;
use crate::slots::SlotTable;

struct Captured<B: Backend> {
    /// The slot bases the graph was captured with.
    bases: Vec<DevicePtr>,
    graph: B::Graph,
    exec: B::GraphExec,
}

/// The recapture runner: the last captured graph and its exec.
pub(crate) struct Recapture<B: Backend> {
    captured: Option<Captured<B>>,
}

impl<B: Backend> Recapture<B> {
    pub(crate) fn new() -> Self {
        Recapture { captured: None }
    }

    /// Launch the program on `stream` with the addresses of `slots`,
    /// capturing it first when they differ from the last capture's.
    pub(crate) fn execute(
        &mut self,
        program: &Program<B>,
        env: &ExecEnv<'_, B>,
        slots: &SlotTable,
        stream: &B::Stream,
    ) -> Result<()> {
        let be = program.backend();
        let fresh = self
            .captured
            .as_ref()
            .is_none_or(|c| c.bases != slots.bases());
        if fresh {
            // No vendor work while the stream captures (capture_gate).
            let gate = xla_vmm_device::capture_gate::capture();
            be.stream_begin_capture(stream)?;
            let walked = run_seq(env, program.ops(), slots, stream, &mut Vec::new());
            let captured = be.stream_end_capture(stream);
            drop(gate);
            walked?;
            let graph = captured?;
            // The old exec updated in place, else a fresh one; on any error
            // neither graph is left behind.
            let exec = match self.captured.take() {
                Some(old) => {
                    let updated = be.graph_exec_update(&old.exec, &graph);
                    if matches!(updated, Ok(true)) {
                        be.graph_destroy(old.graph).ok();
                        Ok(old.exec)
                    } else {
                        be.graph_exec_destroy(old.exec).ok();
                        be.graph_destroy(old.graph).ok();
                        updated.and_then(|_| be.graph_instantiate(&graph))
                    }
                }
                None => be.graph_instantiate(&graph),
            };
            let exec = match exec {
                Ok(e) => e,
                Err(e) => {
                    be.graph_destroy(graph).ok();
                    return Err(e.into());
                }
            };
            self.captured = Some(Captured {
                bases: slots.bases().to_vec(),
                graph,
                exec,
            });
        }
        let c = self.captured.as_ref().expect("captured above");
        be.graph_launch(&c.exec, stream)?;
        Ok(())
    }

    /// Destroy the graph and its exec (the caller has synchronized).
    pub(crate) fn release(&mut self, be: &B) {
        if let Some(c) = self.captured.take() {
            be.graph_exec_destroy(c.exec).ok();
            be.graph_destroy(c.graph).ok();
        }
    }
}
