//! Cache-line encrypted NVMM simulator (FSDedup evaluation model); built by a later issue.
