//! The execution mode of a program: eager, VA-stable graph or
//! graph-recapture (a leaf: the configuration, the guard and the executable
//! name it).

use crate::error::{Result, RuntimeError};

/// How [`crate::Executable::run`] executes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Thunk by thunk on the stream: the reference.
    Eager,
    /// The user's `graph` (the default): VA-stable graph mode (see
    /// [`crate::vastable`]): one graph per fixed VA reservation (two, used
    /// alternately), recorded once and never re-captured; parameters bound
    /// per step by skip / remap / copy.
    Graph,
    /// The user's `graph-recapture`: the whole executable captured into a
    /// graph, replayed each run, re-captured when parameter addresses change.
    GraphRecapture,
}

impl Mode {
    /// The mode as users name it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Graph => "graph",
            Mode::GraphRecapture => "graph-recapture",
            Mode::Eager => "eager",
        }
    }

    /// The mode as users name it (`XLA_VMM_EXEC_MODE`, `--mode`): `graph`
    /// (also empty: the default), `graph-recapture` or `eager`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "graph" | "" => Ok(Mode::Graph),
            "graph-recapture" => Ok(Mode::GraphRecapture),
            "eager" => Ok(Mode::Eager),
            other => Err(RuntimeError::arg(format!(
                "execution mode {other:?}: expected graph, graph-recapture or eager"
            ))),
        }
    }
}
