//! placeholder
pub mod error;
pub mod model;
pub mod schemes;
pub mod sim;
pub mod trace;
