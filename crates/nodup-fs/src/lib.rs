//! nodup-fs: the file system over the nodup engine (built by issue 3).
