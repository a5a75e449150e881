//! The CPU's cache-line write-back instructions, for [`super::Pmem`]: which one this CPU has
//! (detected once from CPUID) and issuing it for one line.

use std::sync::OnceLock;

/// The cache-line write-back instruction `flush` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushInstr {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and invalidate, weakly ordered.
    ClflushOpt,
    /// `clflush`: write back and invalidate, strongly ordered.
    Clflush,
    /// No cache-line instruction (other architectures): `fence` msyncs instead.
    Msync,
}

impl FlushInstr {
    /// Name for logs and stats.
    pub fn name(self) -> &'static str {
        match self {
            FlushInstr::Clwb => "clwb",
            FlushInstr::ClflushOpt => "clflushopt",
            FlushInstr::Clflush => "clflush",
            FlushInstr::Msync => "msync",
        }
    }

    /// The instruction this CPU supports, detected once per process from CPUID.
    pub fn detect() -> FlushInstr {
        static DETECTED: OnceLock<FlushInstr> = OnceLock::new();
        *DETECTED.get_or_init(detect_flush_instr)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_flush_instr() -> FlushInstr {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID is available on every x86_64 CPU; leaf 0 reports the highest basic leaf.
    let max_leaf = __cpuid(0).eax;
    if max_leaf >= 7 {
        // SAFETY: leaf 7 exists (checked above).
        let ebx = __cpuid_count(7, 0).ebx;
        if ebx & (1 << 24) != 0 {
            return FlushInstr::Clwb;
        }
        if ebx & (1 << 23) != 0 {
            return FlushInstr::ClflushOpt;
        }
    }
    // SAFETY: leaf 1 exists on every x86_64 CPU.
    let edx = __cpuid(1).edx;
    if edx & (1 << 19) != 0 {
        FlushInstr::Clflush
    } else {
        FlushInstr::Msync
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_flush_instr() -> FlushInstr {
    FlushInstr::Msync
}

/// Write back one cache line with `instr`.
///
/// # Safety
/// `p` must point into a live mapping.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn flush_line(instr: FlushInstr, p: *const u8) {
    use core::arch::asm;
    match instr {
        FlushInstr::Clwb => asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags)),
        FlushInstr::ClflushOpt => {
            asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
        }
        FlushInstr::Clflush => core::arch::x86_64::_mm_clflush(p),
        FlushInstr::Msync => {}
    }
}
