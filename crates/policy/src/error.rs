//! The policy's error type: every bad input becomes one of these, never a panic.

/// What was wrong with the data handed to the policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A device cost is missing, negative, not finite, or inconsistent
    /// (e.g. more free memory than total memory).
    #[error("invalid device costs: {0}")]
    InvalidDevice(String),
    /// A slot description is out of range (churn outside [0, 1], ...).
    #[error("invalid slot {index}: {reason}")]
    InvalidSlot {
        /// Slot index.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A residency input is malformed (a use of a missing buffer, a rate
    /// that is not positive, ...).
    #[error("invalid residency input: {0}")]
    InvalidResidency(String),
    /// A thunk's staged buffers do not fit the staging area (too small, or
    /// too fragmented by what it holds): the caller stages less
    /// ([`crate::residency::demote`]).
    #[error("thunk {thunk} ({name}): its staged buffers do not fit a {area_bytes}-byte area")]
    AreaTooSmall {
        /// The thunk's index in the step.
        thunk: usize,
        /// Its name.
        name: String,
        /// The area's bytes.
        area_bytes: u64,
    },
    /// A tuning knob is out of range.
    #[error("invalid policy knob: {0}")]
    InvalidKnob(String),
    /// The threshold text (environment variable or option) is not a number.
    #[error(
        "invalid copy threshold {text:?}: expected 0 (remap all), 1 (auto) or a byte count > 1"
    )]
    InvalidThreshold {
        /// The text given.
        text: String,
    },
    /// The per-step binding list does not match the executable's slots.
    #[error("binding mismatch: expected {expected} slots, got {got}")]
    BindingMismatch {
        /// Slots of the executable.
        expected: usize,
        /// Bindings given.
        got: usize,
    },
    /// A reservation index outside the executable's reservations.
    #[error("reservation {index} out of range (executable has {len})")]
    NoSuchReservation {
        /// Index given.
        index: usize,
        /// Reservations of the executable.
        len: usize,
    },
    /// `fallback_to_copy` was asked for a slot whose binding this step was
    /// not a remap (a skip makes no driver call; a failed shadow mapping has
    /// nothing left to fall back to).
    #[error("slot {index}: no copy fallback: {reason}")]
    FallbackUnavailable {
        /// Slot index.
        index: usize,
        /// Why not.
        reason: String,
    },
    /// A slot index outside the executable's slot list.
    #[error("slot index {index} out of range (executable has {len} slots)")]
    NoSuchSlot {
        /// Index given.
        index: usize,
        /// Slots of the executable.
        len: usize,
    },
}

/// Result alias for the policy crate.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;
