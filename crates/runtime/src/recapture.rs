//! Graph-recapture mode (the user's `graph-recapture`): the whole program
//! captured into one graph, replayed each run, re-captured (and the exec
//! updated in place where the driver allows) when a parameter address
//! changes.

use xla_vmm_device::{Backend, DevicePtr};

use crate::error::{Result, Teardown};
use crate::exec::{run_program, ExecEnv};
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
    /// Captures so far (released graphs included).
    captures: u64,
}

impl<B: Backend> Recapture<B> {
    pub(crate) fn new() -> Self {
        Recapture {
            captured: None,
            captures: 0,
        }
    }

    /// Captures so far: one per run whose parameter addresses differ from
    /// the previous run's.
    pub(crate) fn captures(&self) -> u64 {
        self.captures
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
            self.captures += 1;
            // No vendor work while the stream captures (capture_gate).
            let gate = xla_vmm_device::capture_gate::capture();
            be.stream_begin_capture(stream)?;
            let walked = run_program(env, program.ops(), slots, stream);
            let captured = be.stream_end_capture(stream);
            drop(gate);
            walked?;
            let graph = captured?;
            // The old exec updated in place, else a fresh one; on any error
            // neither graph is left behind.
            let mut t = Teardown::new("graph-recapture's previous graph");
            let exec = match self.captured.take() {
                Some(old) => {
                    let updated = be.graph_exec_update(&old.exec, &graph);
                    if matches!(updated, Ok(true)) {
                        t.check("graph_destroy", be.graph_destroy(old.graph));
                        Ok(old.exec)
                    } else {
                        t.check("graph_exec_destroy", be.graph_exec_destroy(old.exec));
                        t.check("graph_destroy", be.graph_destroy(old.graph));
                        updated.and_then(|_| be.graph_instantiate(&graph))
                    }
                }
                None => be.graph_instantiate(&graph),
            };
            let exec = match exec {
                Ok(e) => e,
                Err(e) => {
                    t.check("graph_destroy", be.graph_destroy(graph));
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
            let mut t = Teardown::new("graph-recapture's graph");
            t.check("graph_exec_destroy", be.graph_exec_destroy(c.exec));
            t.check("graph_destroy", be.graph_destroy(c.graph));
        }
    }
}
