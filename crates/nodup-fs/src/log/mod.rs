//! The operation log: checksummed, sequence-numbered records appended to a chain of metadata
//! blocks between two checkpoints (see [`record`] for the frame, [`writer`] for appends and
//! [`replay`] for reading it back; [`check`] is what a record may ask of the inode table).

pub mod check;
pub mod held;
pub mod record;
pub mod replay;
pub mod writer;
