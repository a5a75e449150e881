//! cargo-fuzz target `crypt_image`: the body lives in `nodup_torture::fuzzing::crypt_image`
//! (shared with the stable mutation test), so both exercise exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nodup_torture::fuzzing::crypt_image(data);
});
