//! DRAM fingerprint index: fingerprint → metadata-entry location, with exact memory accounting.
