//! nodup-core: the inline-deduplicating block engine.
//!
//! Start from `examples/block_store.rs` (`cargo run -p nodup-core --example block_store`):
//! format an image, [`Engine::write`] blocks (identical content comes back as one physical
//! block), [`Engine::read`], [`Engine::release`] a reference, [`Engine::stats`], shut down
//! cleanly and reopen. Every write call takes a [`WriteCtx`] (per-stream state; keep one per
//! writer thread).
//!
//! Layers, bottom up (see `../../shared/DESIGN.md` in the checkout's sibling):
//! - [`media`]: the persistent medium (mapped pmem image, block file, crash simulator, access meter).
//! - [`alloc`]: persistent free-space tracking with per-thread pools.
//! - [`cache`]: FSDedup's LRCU fingerprint cache (with refresh) and prefetch cache, shared by `selective` and `nodup sim`.
//! - [`fingerprint`]: block fingerprints (xxh3-64 default, crc32c, ecc, sha256, blake3).
//! - [`store`]: the fingerprint store a policy looks blocks up in; [`index`]: the complete DRAM index, the store of `light`, `strong` and `weak-verify`.
//! - [`meta`]: on-media dedup metadata layouts (`region` = Light-Meta-Table, `entry`, `hashtable`) and the reverse map.
//! - [`policy`]: dedup policies behind one trait (`light`, `none`, `strong`, `weak-verify`, later `smart`, `selective`).
//! - [`engine`]: the write path — one call takes the blocks of one write and returns a physical block for each.

pub mod alloc;
pub mod cache;
pub mod codec;
pub mod engine;
pub mod error;
pub mod fingerprint;
pub mod index;
pub mod media;
pub mod meta;
pub mod policy;
pub mod stats;
pub mod store;

pub use engine::{
    Engine, FormatOptions, KeyFile, Media, OpenOptions, OpenState, SplitOptions, WriteCtx,
};
pub use error::{Error, Result};
pub use stats::EngineStats;

/// Size of a data block in bytes; the only block size nodup supports.
pub const BLOCK_SIZE: usize = 4096;

/// Physical block number on the medium (block 0 is the superblock, never a data block).
pub type BlockNr = u64;
