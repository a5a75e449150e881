//! placeholder
pub mod capture;
pub mod error;
pub mod gen;
pub mod model;
pub mod report;
pub mod run;
pub mod schemes;
pub mod sim;
pub mod stats;
pub mod trace;
