//! cargo-fuzz target `smart_image`: the body lives in `nodup_torture::fuzzing::smart_image`
//! (shared with the stable mutation test), so both exercise exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nodup_torture::fuzzing::smart_image(data);
});
