//! On-media dedup metadata: three layouts behind one trait, plus the reverse map (block → entry).

use serde::{Deserialize, Serialize};

/// Metadata layouts selectable at mkfs; the numeric value is stored on the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum MetaLayoutKind {
    /// Light-Meta-Table: 4 KiB regions of 32-byte entries, region queue, GC-free (default).
    Region = 1,
    /// Fixed entries allocated through a free list (NV-Dedup / LO-Dedup).
    Entry = 2,
    /// Static open-addressing hash table on the medium (DeNOVA-style).
    Hashtable = 3,
}

impl MetaLayoutKind {
    /// Name used on the command line and in stats.
    pub fn name(self) -> &'static str {
        match self {
            MetaLayoutKind::Region => "region",
            MetaLayoutKind::Entry => "entry",
            MetaLayoutKind::Hashtable => "hashtable",
        }
    }
    const ALL: [MetaLayoutKind; 3] = [
        MetaLayoutKind::Region,
        MetaLayoutKind::Entry,
        MetaLayoutKind::Hashtable,
    ];
    /// Parse a command-line name.
    pub fn from_name(s: &str) -> Option<MetaLayoutKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
    /// Decode the on-media value.
    pub fn from_u32(v: u32) -> Option<MetaLayoutKind> {
        Self::ALL.into_iter().find(|k| *k as u32 == v)
    }
}
