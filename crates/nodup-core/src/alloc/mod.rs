//! Block allocator: persistent free-space tracking with per-thread pools, free, punch hole and aging.
