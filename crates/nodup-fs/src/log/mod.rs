//! The operation log: checksummed, sequence-numbered records appended to a chain of metadata
//! blocks between two checkpoints (see [`record`] for the frame and [`writer`] for appends).

pub mod record;
pub mod writer;
