//! The memory model: parameters, the encrypted PCM contents, on-chip metadata caches, the
//! bank/queue timing and the event counts that give energy.

pub mod config;
pub mod crypt;
pub mod hist;
pub mod meter;
pub mod nvmm;
pub mod setcache;
pub mod timing;

pub use config::{Costs, ModelConfig};
