//! cargo-fuzz target `log_records`: the body lives in `nodup_torture::forged_log::log_records`
//! (shared with the stable mutation test), so both exercise exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nodup_torture::forged_log::log_records(data);
});
