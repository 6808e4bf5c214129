//! Graph-recapture mode (the user's `graph-recapture`): the whole program
//! captured into one graph per set of parameter addresses, replayed each
//! run whose addresses it was captured with. The last [`GRAPHS`] address
//! sets keep their graphs: a loop whose inputs cycle through a few buffers
//! (an allocator handing out the oldest freed block of a size, JAX's
//! asynchronous dispatch keeping several steps' inputs alive) replays them
//! and captures nothing after its first cycle. A new address set past that
//! takes the least recently used graph's place (its exec updated in place
//! where the driver allows).

use xla_vmm_device::{Backend, DevicePtr};

use crate::error::{Result, Teardown};
use crate::exec::{capture_graph, run_program, ExecEnv};
use crate::program::Program;
use crate::slots::SlotTable;

/// Address sets whose graphs are kept.
pub(crate) const GRAPHS: usize = 4;

struct Captured<B: Backend> {
    /// The slot bases the graph was captured with.
    bases: Vec<DevicePtr>,
    graph: B::Graph,
    exec: B::GraphExec,
}

/// The recapture runner: the graphs of the last [`GRAPHS`] address sets,
/// the most recently used last.
pub(crate) struct Recapture<B: Backend> {
    captured: Vec<Captured<B>>,
    /// Captures so far (released graphs included).
    captures: u64,
}

impl<B: Backend> Recapture<B> {
    pub(crate) fn new() -> Self {
        Recapture {
            captured: Vec::new(),
            captures: 0,
        }
    }

    /// Captures so far: one per run whose parameter addresses differ from
    /// the previous run's.
    pub(crate) fn captures(&self) -> u64 {
        self.captures
    }

    /// Launch the program on `stream` with the addresses of `slots`,
    /// capturing it first when no kept graph has them.
    pub(crate) fn execute(
        &mut self,
        program: &Program<B>,
        env: &ExecEnv<'_, B>,
        slots: &SlotTable,
        stream: &B::Stream,
    ) -> Result<()> {
        let be = program.backend();
        match self.captured.iter().position(|c| c.bases == slots.bases()) {
            // Most recently used last.
            Some(i) => {
                let c = self.captured.remove(i);
                self.captured.push(c);
            }
            None => {
                let c = self.capture(program, env, slots, stream)?;
                self.captured.push(c);
            }
        }
        let c = self.captured.last().expect("found or captured above");
        be.graph_launch(&c.exec, stream)?;
        Ok(())
    }

    /// Capture the program with the addresses of `slots`: a new exec while
    /// fewer than [`GRAPHS`] are kept, else the least recently used one's
    /// (updated in place, else instantiated again); on any error no graph
    /// of it is left behind.
    fn capture(
        &mut self,
        program: &Program<B>,
        env: &ExecEnv<'_, B>,
        slots: &SlotTable,
        stream: &B::Stream,
    ) -> Result<Captured<B>> {
        let be = program.backend();
        self.captures += 1;
        let graph = capture_graph(be, stream, || {
            run_program(env, program.ops(), slots, stream)
        })?;
        let mut t = Teardown::new("graph-recapture's previous graph");
        let oldest = (self.captured.len() >= GRAPHS).then(|| self.captured.remove(0));
        let exec = match oldest {
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
        match exec {
            Ok(exec) => Ok(Captured {
                bases: slots.bases().to_vec(),
                graph,
                exec,
            }),
            Err(e) => {
                t.check("graph_destroy", be.graph_destroy(graph));
                Err(e.into())
            }
        }
    }

    /// Destroy the graphs and their execs (the caller has synchronized).
    pub(crate) fn release(&mut self, be: &B) {
        let mut t = Teardown::new("graph-recapture's graphs");
        for c in self.captured.drain(..) {
            t.check("graph_exec_destroy", be.graph_exec_destroy(c.exec));
            t.check("graph_destroy", be.graph_destroy(c.graph));
        }
    }
}
