//! Seeded workload generation: valid operation sequences (against the model) mixing creates,
//! writes of duplicate and unique content at aligned and unaligned offsets, overwrites,
//! truncates, punches, copies, remaps, unlinks, renames, links, syncs and checkpoints.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{FPath, Model, Op};
use nodup_core::BLOCK_SIZE;

const BS: usize = BLOCK_SIZE;

/// Content of pattern block `id` (a small pool of ids makes duplicates across files).
pub fn pattern_block(id: u64) -> Vec<u8> {
    let mut v = vec![0u8; BS];
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ id.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for w in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Shape of a generated workload.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Operations to generate.
    pub ops: usize,
    /// Names per directory.
    pub names: usize,
    /// Largest write, in blocks.
    pub max_blocks: usize,
    /// Largest file offset, in blocks.
    pub max_offset_blocks: u64,
    /// Duplicate pattern pool size (smaller = more dedup).
    pub dup_pool: u64,
    /// Extra share (percent) of background-dedup remap operations, on top of the 3 % every
    /// workload has (0 keeps the seeded workloads as they are).
    pub remap_percent: u32,
    /// Extra share (percent) of `smart` worker steps, on top of the regular mix.
    pub smart_step_percent: u32,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            ops: 60,
            names: 5,
            max_blocks: 6,
            max_offset_blocks: 12,
            dup_pool: 6,
            remap_percent: 0,
            smart_step_percent: 0,
        }
    }
}

impl WorkloadSpec {
    /// Large writes of mostly new data over a few files: enough new blocks (about 1 000 on the
    /// campaigns' 8 MiB image) that the region table grows several times, in batches on a
    /// block file.
    pub fn large() -> WorkloadSpec {
        WorkloadSpec {
            ops: 60,
            names: 8,
            max_blocks: 160,
            max_offset_blocks: 200,
            dup_pool: 64,
            ..WorkloadSpec::default()
        }
    }
}

fn data(rng: &mut StdRng, spec: &WorkloadSpec, len: usize, unique: &mut u64) -> Vec<u8> {
    let nb = len.div_ceil(BS) + 1;
    let mut v = Vec::with_capacity(nb * BS);
    for _ in 0..nb {
        let id = if rng.gen_bool(0.6) {
            rng.gen_range(0..spec.dup_pool)
        } else {
            *unique += 1;
            1_000_000 + *unique
        };
        v.extend(pattern_block(id));
    }
    // An aligned slice keeps whole duplicate blocks; an unaligned one still repeats content.
    let skew = if rng.gen_bool(0.7) {
        0
    } else {
        rng.gen_range(0..BS)
    };
    v[skew..skew + len].to_vec()
}

/// Generate `spec.ops` valid operations from `seed` (the model is advanced along the way).
pub fn generate(seed: u64, spec: &WorkloadSpec) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut m = Model::default();
    let mut ops = Vec::with_capacity(spec.ops);
    let mut unique = seed.wrapping_mul(1_000_003);
    let any_path = |rng: &mut StdRng| FPath {
        sub: rng.gen_bool(0.3),
        name: format!("f{}", rng.gen_range(0..spec.names)),
    };
    while ops.len() < spec.ops {
        let existing = m.paths();
        let pick = |rng: &mut StdRng| existing[rng.gen_range(0..existing.len())].clone();
        let span = spec.max_offset_blocks + spec.max_blocks as u64;
        let extra_remap = spec.remap_percent > 0
            && !existing.is_empty()
            && rng.gen_range(0..100) < spec.remap_percent;
        let extra_smart = spec.smart_step_percent > 0
            && !existing.is_empty()
            && rng.gen_range(0..100) < spec.smart_step_percent;
        let op = match rng.gen_range(0..100) {
            _ if existing.is_empty() => Op::Create(any_path(&mut rng)),
            _ if extra_smart => Op::SmartStep(rng.gen_range(1..64)),
            _ if extra_remap => Op::Remap(
                pick(&mut rng),
                rng.gen_range(0..span),
                existing.clone(),
                span,
            ),
            0..=11 => {
                let p = any_path(&mut rng);
                if m.size(&p).is_some() {
                    continue;
                }
                Op::Create(p)
            }
            12..=44 => {
                let p = pick(&mut rng);
                let aligned = rng.gen_bool(0.6);
                let off = if aligned {
                    rng.gen_range(0..spec.max_offset_blocks) * BS as u64
                } else {
                    rng.gen_range(0..spec.max_offset_blocks * BS as u64)
                };
                let len = if aligned && rng.gen_bool(0.7) {
                    rng.gen_range(1..=spec.max_blocks) * BS
                } else {
                    rng.gen_range(1..=spec.max_blocks * BS)
                };
                Op::Write(p, off, data(&mut rng, spec, len, &mut unique))
            }
            47 => Op::SmartStep(rng.gen_range(1..64)),
            48..=49 => Op::Remap(
                pick(&mut rng),
                rng.gen_range(0..span),
                existing.clone(),
                span,
            ),
            45..=46 => {
                let (a, b) = (pick(&mut rng), pick(&mut rng));
                if m.same_file(&a, &b) {
                    continue;
                }
                let off_in = rng.gen_range(0..spec.max_offset_blocks) * BS as u64;
                let off_out = rng.gen_range(0..spec.max_offset_blocks) * BS as u64;
                let len = (rng.gen_range(1..=spec.max_blocks) * BS) as u64;
                Op::Copy(a, off_in, b, off_out, len)
            }
            50..=59 => {
                let p = pick(&mut rng);
                let size = m.size(&p).unwrap_or(0);
                let new = if rng.gen_bool(0.5) {
                    rng.gen_range(0..=size)
                } else {
                    rng.gen_range(0..=(spec.max_offset_blocks + 2) * BS as u64)
                };
                Op::Truncate(p, new)
            }
            60..=67 => {
                let p = pick(&mut rng);
                let size = m.size(&p).unwrap_or(0).max(1);
                let off = rng.gen_range(0..size);
                let len = rng.gen_range(1..=(3 * BS as u64));
                Op::Punch(p, off, len)
            }
            68..=75 => Op::Unlink(pick(&mut rng)),
            76..=83 => Op::Rename(pick(&mut rng), any_path(&mut rng)),
            84..=89 => {
                let to = any_path(&mut rng);
                if m.size(&to).is_some() {
                    continue;
                }
                Op::Link(pick(&mut rng), to)
            }
            90..=94 => Op::Sync,
            95..=96 => Op::Trim,
            97 => Op::Rebuild,
            _ => Op::Checkpoint,
        };
        m.apply_steps(&op);
        ops.push(op);
    }
    ops
}
