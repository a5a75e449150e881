//! cargo-fuzz target `checkpoint_tree`: the body lives in
//! `nodup_torture::forged_checkpoint::checkpoint_tree` (shared with the stable mutation test),
//! so both exercise exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nodup_torture::forged_checkpoint::checkpoint_tree(data);
});
