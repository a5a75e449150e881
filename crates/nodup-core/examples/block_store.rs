//! The engine as an embedded deduplicating block store over an image file: format, write
//! blocks (two of them identical), read them back, release one, look at the counters, shut
//! down cleanly and reopen.
//!
//! Run: `cargo run --release -p nodup-core --example block_store [IMAGE]`
//! (default image: a temporary file, removed at the end).

use std::sync::Arc;

use nodup_core::media::blockfile::{BlockFile, BlockFileOptions};
use nodup_core::media::Medium;
use nodup_core::{Engine, FormatOptions, OpenOptions, OpenState, WriteCtx, BLOCK_SIZE};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("nodup-example-{}.img", std::process::id()))
        });
    let keep = std::env::args().nth(1).is_some();

    // A 64 MiB image in a plain file (durable at fence, like a disk).
    let medium: Arc<dyn Medium> = Arc::new(BlockFile::create(
        &path,
        64 << 20,
        BlockFileOptions::default(),
    )?);
    let engine = Engine::format(medium, &FormatOptions::default(), &OpenOptions::default())?;

    // One call stores the blocks of one write; each gets a physical block number back.
    let a = vec![0xA5u8; BLOCK_SIZE];
    let b = vec![0x5Au8; BLOCK_SIZE];
    let mut ctx = WriteCtx::default();
    let blocks = engine.write(&mut ctx, &[&a, &b, &a])?;
    println!("stored 3 blocks at {blocks:?}");
    assert_eq!(
        blocks[0], blocks[2],
        "identical content shares one physical block"
    );

    let mut buf = vec![0u8; BLOCK_SIZE];
    engine.read(blocks[1], &mut buf)?;
    assert_eq!(buf, b);

    // Each returned block is one reference; giving one back keeps the shared block alive.
    engine.release(blocks[2])?;
    engine.read(blocks[0], &mut buf)?;
    assert_eq!(buf, a);

    let s = engine.stats();
    println!(
        "written {} blocks, {} deduplicated, {} physical bytes in use",
        s.blocks_written, s.dedup_hits, s.physical_bytes
    );

    // A clean shutdown lets the next open skip failure recovery.
    engine.shutdown()?;
    drop(engine);
    let medium: Arc<dyn Medium> = Arc::new(BlockFile::open(&path, BlockFileOptions::default())?);
    let (engine, state) = Engine::open(medium, &OpenOptions::default())?;
    assert_eq!(state, OpenState::Clean);
    engine.read(blocks[0], &mut buf)?;
    assert_eq!(buf, a);
    println!("reopened clean; block {} still reads back", blocks[0]);
    engine.shutdown()?;
    if !keep {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
