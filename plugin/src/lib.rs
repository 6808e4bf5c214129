//! PJRT plugin (issue "PJRT plugin"): not built yet; this crate exports nothing.
