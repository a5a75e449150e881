//! Encryption at rest: two media over one image file, one for data blocks and one for
//! metadata, so that deduplication (on plaintext, above them) still finds duplicates while
//! nothing derived from plaintext reaches the image in the clear.
//!
//! - **Data blocks** ([`DataCrypt`]): AES-256-XTS with the 4 KiB block as the data unit and its
//!   block number as the tweak, the disk-encryption standard (IEEE 1619) for whole-block
//!   writes. The engine writes data blocks whole and never in place (a referenced block is
//!   never rewritten), so the mode's known limit — an observer of two snapshots sees which
//!   16-byte units of a block kept their value — only shows that a freed block was reused.
//! - **Metadata** ([`MetaCrypt`]): AES-256 in counter mode with the keystream indexed by the
//!   byte's position in the image (counter = offset / 16). Every byte is encrypted on its own,
//!   so the engine's and the file system's persistence rules stay exactly as they are: an
//!   8-byte atomic store stays one 8-byte atomic store, a torn write tears at the same bytes.
//!   XTS over metadata would turn those small stores into read-modify-writes of whole units,
//!   which a crash can tear. The price is the same as XTS's across snapshots (a position
//!   rewritten leaks the XOR of its old and new bytes to someone who saw both), and no more
//!   against a single stolen image. Fingerprints in dedup entries, file names, the log and the
//!   checkpoints are all metadata: they are encrypted with it.
//! - **In the clear**: the ranges the caller names (the engine superblock with the key-derivation
//!   parameters and the key check, and the file system's superblock pair, which must be found
//!   before any key is at hand); none holds anything derived from plaintext.
//!
//! Keys: a 32-byte master key (the key file, or argon2id of a passphrase) and the image's random
//! 16-byte salt derive, with BLAKE3's key derivation, two XTS keys, the metadata key and a key
//! check value stored in the superblock (so a wrong key is refused before anything is read or
//! written). Two images under one master key get unrelated keystreams.

use super::Medium;
use crate::{Error, Result, BLOCK_SIZE};
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes256;
use std::ops::Range;
use std::sync::Arc;

/// Contexts of BLAKE3's key derivation (fixed strings: changing one changes every key).
const CTX_DATA1: &str = "nodup 2026-11 data xts key 1";
const CTX_DATA2: &str = "nodup 2026-11 data xts key 2";
const CTX_META: &str = "nodup 2026-11 metadata ctr key";
const CTX_CHECK: &str = "nodup 2026-11 key check value";

/// The keys of one image, derived from the master key and the image's salt.
pub struct ImageKeys {
    /// XTS key of the data units.
    data: Aes256,
    /// XTS key of the tweaks (block numbers).
    tweak: Aes256,
    /// CTR key of the metadata.
    meta: Aes256,
    /// The data key's round keys for the fused XTS, where the CPU has AES-NI.
    #[cfg(target_arch = "x86_64")]
    ni: Option<super::xts_ni::NiXts>,
}

/// Multiply an XTS tweak by the primitive element of GF(2^128) (IEEE 1619: little endian,
/// reduction polynomial x^128 + x^7 + x^2 + x + 1).
fn gf_double(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 }
}

fn derive(ctx: &str, master: &[u8; 32], salt: &[u8; 16]) -> [u8; 32] {
    let mut material = [0u8; 48];
    material[..32].copy_from_slice(master);
    material[32..].copy_from_slice(salt);
    blake3::derive_key(ctx, &material)
}

impl ImageKeys {
    /// The keys of the image with `salt` under `master`.
    pub fn derive(master: &[u8; 32], salt: &[u8; 16]) -> ImageKeys {
        let k1 = derive(CTX_DATA1, master, salt);
        let k2 = derive(CTX_DATA2, master, salt);
        let km = derive(CTX_META, master, salt);
        ImageKeys {
            data: Aes256::new(&k1.into()),
            tweak: Aes256::new(&k2.into()),
            meta: Aes256::new(&km.into()),
            #[cfg(target_arch = "x86_64")]
            ni: super::xts_ni::NiXts::new(&k1),
        }
    }

    /// XTS-AES-256 of data block `block` in place (IEEE 1619 with a 4 KiB data unit and the
    /// block number as the tweak).
    fn xts(&self, buf: &mut [u8], block: u64, encrypt: bool) {
        let mut tmp = [0u8; BLOCK_SIZE];
        self.xts_to(buf, &mut tmp, block, encrypt);
        buf.copy_from_slice(&tmp);
    }

    /// [`ImageKeys::xts`] from `src` into `dst` (both one block): the units are read from one
    /// and written to the other, with no copy in between. Fused on AES-NI where the CPU has
    /// it (`xts_ni`), else through the `aes` crate.
    fn xts_to(&self, src: &[u8], dst: &mut [u8], block: u64, encrypt: bool) {
        #[cfg(target_arch = "x86_64")]
        if let Some(ni) = &self.ni {
            ni.xts(self.first_tweak(block).into(), src, dst, encrypt);
            return;
        }
        self.xts_to_portable(src, dst, block, encrypt)
    }

    /// The tweak of a block's first unit: its block number encrypted under the tweak key.
    fn first_tweak(&self, block: u64) -> aes::Block {
        let mut t = aes::Block::from((block as u128).to_le_bytes());
        self.tweak.encrypt_block(&mut t);
        t
    }

    /// [`ImageKeys::xts_to`] through the `aes` crate's batches: the units go through AES
    /// `CHUNK` at a time, so AES-NI pipelines them (one unit at a time costs several times
    /// more), with the whitening in passes around each batch.
    fn xts_to_portable(&self, src: &[u8], dst: &mut [u8], block: u64, encrypt: bool) {
        use aes::cipher::BlockDecrypt;
        /// Units per AES call: enough for AES-NI's pipeline, small enough to stay in registers
        /// and L1 between the three steps.
        const CHUNK: usize = 32;
        debug_assert!(src.len() == BLOCK_SIZE && dst.len() == BLOCK_SIZE);
        let mut tw = u128::from_le_bytes(self.first_tweak(block).into());
        let mut tweaks = [0u128; CHUNK];
        let mut units = [aes::Block::default(); CHUNK];
        for (sp, dp) in src
            .chunks_exact(CHUNK * 16)
            .zip(dst.chunks_exact_mut(CHUNK * 16))
        {
            for ((u, c), t) in units.iter_mut().zip(sp.chunks_exact(16)).zip(&mut tweaks) {
                *t = tw;
                let x = u128::from_le_bytes(c.try_into().expect("16-byte unit")) ^ tw;
                *u = aes::Block::from(x.to_le_bytes());
                tw = gf_double(tw);
            }
            if encrypt {
                self.data.encrypt_blocks(&mut units);
            } else {
                self.data.decrypt_blocks(&mut units);
            }
            for ((u, c), t) in units.iter().zip(dp.chunks_exact_mut(16)).zip(&tweaks) {
                let x = u128::from_le_bytes((*u).into()) ^ t;
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
    }

    /// The value stored to recognise the right key (16 bytes of an independent derivation:
    /// it reveals nothing about the other keys).
    pub fn check_value(master: &[u8; 32], salt: &[u8; 16]) -> [u8; 16] {
        let d = derive(CTX_CHECK, master, salt);
        let mut out = [0u8; 16];
        out.copy_from_slice(&d[..16]);
        out
    }

    /// XOR the metadata keystream for image offset `off` into `buf`.
    fn meta_xor(&self, off: u64, buf: &mut [u8]) {
        const BATCH: usize = 16;
        let mut pos = off;
        let mut done = 0usize;
        let mut blocks = [aes::Block::default(); BATCH];
        let mut stream = [0u8; BATCH * 16];
        while done < buf.len() {
            let first = pos / 16;
            let skip = (pos % 16) as usize;
            let need = (skip + buf.len() - done).div_ceil(16).min(BATCH);
            for (i, b) in blocks[..need].iter_mut().enumerate() {
                // A distinct counter per 16-byte unit of the image (its offset / 16).
                *b = aes::Block::from(u128::from(first + i as u64).to_le_bytes());
            }
            self.meta.encrypt_blocks(&mut blocks[..need]);
            for (s, b) in stream.chunks_exact_mut(16).zip(&blocks[..need]) {
                s.copy_from_slice(b);
            }
            let n = (need * 16 - skip).min(buf.len() - done);
            // Plain slices, so the XOR vectorises (a byte iterator over the blocks did not).
            for (d, k) in buf[done..done + n].iter_mut().zip(&stream[skip..skip + n]) {
                *d ^= k;
            }
            done += n;
            pos += n as u64;
        }
    }
}

/// The data-block medium of an encrypted image (see the module doc). Whole-block writes
/// only are crash-atomic at block granularity: a partial one is an unlocked read-modify-write
/// of its block (no engine or file-system path issues one; the torture mutant does).
pub struct DataCrypt {
    inner: Arc<dyn Medium>,
    keys: Arc<ImageKeys>,
}

impl DataCrypt {
    /// Encrypt data blocks of `inner` with `keys`.
    pub fn new(inner: Arc<dyn Medium>, keys: Arc<ImageKeys>) -> Self {
        DataCrypt { inner, keys }
    }

    /// Encrypt `data` (at `off`, widened to whole blocks) into this thread's scratch buffer
    /// and hand the ciphertext and its offset to `out` (no allocation per block written).
    fn with_ciphertext<R>(
        &self,
        off: u64,
        data: &[u8],
        out: impl FnOnce(u64, &[u8]) -> Result<R>,
    ) -> Result<R> {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let (start, len) = Self::span(off, data.len());
        let mut whole = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        whole.clear();
        if start != off || len != data.len() {
            // A partial block (never on the engine's data path): read, patch, write whole.
            whole.resize(len, 0);
            self.read(start, &mut whole)?;
            let at = (off - start) as usize;
            whole[at..at + data.len()].copy_from_slice(data);
        } else {
            whole.extend_from_slice(data);
        }
        let first = start / BLOCK_SIZE as u64;
        for (i, b) in whole.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            self.keys.xts(b, first + i as u64, true);
        }
        let r = out(start, &whole);
        SCRATCH.with(|s| *s.borrow_mut() = whole);
        r
    }

    /// On a mapped medium, encrypt whole blocks `data` at `off` straight into the mapping
    /// (durable after the next fence, as `write_stream`); false when the medium has no mapping
    /// or the range is not whole blocks.
    fn encrypt_in_place_of(&self, off: u64, data: &[u8]) -> Result<bool> {
        let bs = BLOCK_SIZE as u64;
        if !off.is_multiple_of(bs) || data.is_empty() || !data.len().is_multiple_of(BLOCK_SIZE) {
            return Ok(false);
        }
        let first = off / bs;
        self.inner.fill_with(off, data.len(), &mut |dst| {
            for (i, src) in data.chunks_exact(BLOCK_SIZE).enumerate() {
                let p = dst.ptr.wrapping_add(i * BLOCK_SIZE);
                if dst.streaming {
                    // Non-temporal stores only: encrypt on the stack, then stream it out.
                    let mut tmp = [0u8; BLOCK_SIZE];
                    self.keys.xts_to(src, &mut tmp, first + i as u64, true);
                    // SAFETY: `p` is this block's place in the range the medium handed us
                    // (line-aligned, BLOCK_SIZE bytes, written by no one else meanwhile).
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        super::stream_copy(&tmp, p)
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    unsafe {
                        std::ptr::copy_nonoverlapping(tmp.as_ptr(), p, BLOCK_SIZE)
                    };
                } else {
                    // SAFETY: as above; ordinary stores, which the medium flushes after.
                    let out = unsafe { std::slice::from_raw_parts_mut(p, BLOCK_SIZE) };
                    self.keys.xts_to(src, out, first + i as u64, true);
                }
            }
        })
    }

    /// The whole blocks around `[off, off+len)`.
    fn span(off: u64, len: usize) -> (u64, usize) {
        let bs = BLOCK_SIZE as u64;
        let start = off / bs * bs;
        let end = (off + len as u64).div_ceil(bs) * bs;
        (start, (end - start) as usize)
    }
}

impl Medium for DataCrypt {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let (start, len) = Self::span(off, buf.len());
        if start == off && len == buf.len() {
            let first = off / BLOCK_SIZE as u64;
            if let Some(src) = self.inner.direct(off, buf.len()) {
                // Decrypt straight out of the mapping: one pass instead of copy + decrypt.
                for (i, (s, d)) in src
                    .chunks_exact(BLOCK_SIZE)
                    .zip(buf.chunks_exact_mut(BLOCK_SIZE))
                    .enumerate()
                {
                    self.keys.xts_to(s, d, first + i as u64, false);
                }
                return Ok(());
            }
            self.inner.read(off, buf)?;
            for (i, b) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
                self.keys.xts(b, first + i as u64, false);
            }
            return Ok(());
        }
        let mut whole = vec![0u8; len];
        self.read(start, &mut whole)?;
        let at = (off - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.with_ciphertext(off, data, |start, c| self.inner.write(start, c))
    }
    fn write_stream(&self, off: u64, data: &[u8]) -> Result<()> {
        if self.encrypt_in_place_of(off, data)? {
            return Ok(());
        }
        // The ciphertext goes out with the inner medium's streaming stores (no flush after).
        self.with_ciphertext(off, data, |start, c| self.inner.write_stream(start, c))
    }
    fn flush(&self, off: u64, len: u64) {
        let (start, l) = Self::span(off, len as usize);
        self.inner.flush(start, l as u64)
    }
    fn fence(&self) -> Result<()> {
        self.inner.fence()
    }
    fn sync_all(&self) -> Result<()> {
        self.inner.sync_all()
    }
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        self.inner.discard(off, len)
    }
    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        self.inner.reserve(off, len)
    }
    fn write_back_failed(&self) -> Option<String> {
        self.inner.write_back_failed()
    }
    fn prefetch(&self, off: u64, len: usize, stride: usize) {
        self.inner.prefetch(off, len, stride)
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

/// The metadata medium of an encrypted image (see the module doc).
pub struct MetaCrypt {
    inner: Arc<dyn Medium>,
    keys: Arc<ImageKeys>,
    /// Byte ranges left in the clear, sorted and disjoint.
    clear: Vec<Range<u64>>,
}

impl MetaCrypt {
    /// Encrypt `inner` with `keys`, except the byte ranges `clear`.
    pub fn new(inner: Arc<dyn Medium>, keys: Arc<ImageKeys>, mut clear: Vec<Range<u64>>) -> Self {
        clear.sort_by_key(|r| r.start);
        MetaCrypt { inner, keys, clear }
    }

    /// Apply the keystream to `buf` (at image offset `off`), skipping the clear ranges.
    fn apply(&self, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        let mut pos = off;
        for r in self.clear.iter().filter(|r| r.end > off && r.start < end) {
            if r.start > pos {
                let (a, b) = ((pos - off) as usize, (r.start - off) as usize);
                self.keys.meta_xor(pos, &mut buf[a..b]);
            }
            pos = pos.max(r.end.min(end));
        }
        if pos < end {
            let a = (pos - off) as usize;
            self.keys.meta_xor(pos, &mut buf[a..]);
        }
    }
}

impl Medium for MetaCrypt {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(off, buf)?;
        self.apply(off, buf);
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        let mut c = data.to_vec();
        self.apply(off, &mut c);
        self.inner.write(off, &c)
    }
    fn write_stream(&self, off: u64, data: &[u8]) -> Result<()> {
        let mut c = data.to_vec();
        self.apply(off, &mut c);
        self.inner.write_stream(off, &c)
    }
    fn flush(&self, off: u64, len: u64) {
        self.inner.flush(off, len)
    }
    fn fence(&self) -> Result<()> {
        self.inner.fence()
    }
    fn sync_all(&self) -> Result<()> {
        self.inner.sync_all()
    }
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        self.inner.discard(off, len)
    }
    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        self.inner.reserve(off, len)
    }
    fn write_back_failed(&self) -> Option<String> {
        self.inner.write_back_failed()
    }
    fn prefetch(&self, off: u64, len: usize, stride: usize) {
        self.inner.prefetch(off, len, stride)
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

/// A master key from a key file's bytes, as the image's `params` say: the 32-byte key, or a
/// passphrase (trailing newline removed) stretched with argon2id over `salt`.
pub fn master_key(file: &[u8], salt: &[u8; 16], params: &KdfParams) -> Result<[u8; 32]> {
    let mut key = [0u8; 32];
    match params.kind {
        KdfKind::Raw => {
            if file.len() != 32 {
                return Err(Error::Invalid(format!(
                    "the image takes a 32-byte key file, this one has {} bytes",
                    file.len()
                )));
            }
            key.copy_from_slice(file);
        }
        KdfKind::Argon2id => {
            let pass = file.strip_suffix(b"\n").unwrap_or(file);
            let pass = pass.strip_suffix(b"\r").unwrap_or(pass);
            if pass.is_empty() {
                return Err(Error::Invalid("the passphrase is empty".into()));
            }
            let p = argon2::Params::new(params.m_kib, params.t, params.p, Some(32))
                .map_err(|e| Error::Invalid(format!("argon2id parameters: {e}")))?;
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, p)
                .hash_password_into(pass, salt, &mut key)
                .map_err(|e| Error::Invalid(format!("argon2id: {e}")))?;
        }
    }
    Ok(key)
}

crate::named_enum! {
    /// How the master key comes from the key file.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum KdfKind {
        /// The file is the 32-byte key.
        Raw = 1 => "raw",
        /// The file is a passphrase, stretched with argon2id.
        Argon2id = 2 => "argon2id",
    }
}

/// Key-derivation parameters recorded in the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfParams {
    /// Raw key or passphrase.
    pub kind: KdfKind,
    /// argon2id memory in KiB.
    pub m_kib: u32,
    /// argon2id passes.
    pub t: u32,
    /// argon2id lanes.
    pub p: u32,
}

impl KdfParams {
    /// The parameters for a new image whose key file holds `file`: 32 bytes of binary are the
    /// key; text of any length is a passphrase (argon2id with 64 MiB and 3 passes as in RFC
    /// 9106's second recommended option, with 1 lane instead of 4 for this 2-core class of
    /// machine; about 0.2 s here).
    pub fn for_key_file(file: &[u8]) -> KdfParams {
        // 32 bytes of text (a 32-character passphrase, or 31 and a newline) are a passphrase:
        // a random key is all printable with probability (95/256)^32, about 1e-14.
        let text = file
            .iter()
            .all(|&b| b.is_ascii_graphic() || b == b' ' || b == b'\n' || b == b'\r' || b == b'\t');
        if file.len() == 32 && !text {
            KdfParams {
                kind: KdfKind::Raw,
                m_kib: 0,
                t: 0,
                p: 0,
            }
        } else {
            KdfParams {
                kind: KdfKind::Argon2id,
                m_kib: 64 << 10,
                t: 3,
                p: 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemMedium;

    fn keys() -> Arc<ImageKeys> {
        Arc::new(ImageKeys::derive(&[7u8; 32], &[9u8; 16]))
    }

    #[test]
    fn data_blocks_round_trip_and_hide_their_bytes() {
        let raw = Arc::new(MemMedium::new(64 << 10));
        let d = DataCrypt::new(raw.clone(), keys());
        let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
        d.write(4096, &block).unwrap();
        d.write(8192, &block).unwrap();
        let mut back = vec![0u8; BLOCK_SIZE];
        d.read(4096, &mut back).unwrap();
        assert_eq!(back, block);
        let img = raw.snapshot();
        // Same plaintext in two blocks: different ciphertext (the tweak is the block number).
        assert_ne!(img[4096..8192], img[8192..12288]);
        assert!(!img.windows(16).any(|w| w == &block[..16]));
        // A partial write is a read-modify-write of the whole block.
        d.write(4096 + 100, b"hello").unwrap();
        d.read(4096, &mut back).unwrap();
        assert_eq!(&back[100..105], b"hello");
        assert_eq!(back[..100], block[..100]);
        let mut part = [0u8; 5];
        d.read(4196, &mut part).unwrap();
        assert_eq!(&part, b"hello");
    }

    #[test]
    fn mapped_media_encrypt_into_the_mapping_in_both_store_modes() {
        use crate::media::pmem::{Pmem, PmemOptions};
        // In memory: on a disk's file system the mapping syncs by msync and never streams.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let block: Vec<u8> = (0..2 * BLOCK_SIZE).map(|i| (i % 241) as u8).collect();
        for stream_data in [false, true] {
            let p = dir.path().join(format!("img-{stream_data}"));
            let opts = PmemOptions {
                stream_data,
                sync_on_fence: false,
                populate: false,
            };
            let pm = Pmem::create_with(&p, 64 << 10, opts).unwrap();
            assert_eq!(
                pm.streams_data(),
                stream_data && cfg!(target_arch = "x86_64")
            );
            let raw: Arc<dyn Medium> = Arc::new(pm);
            let d = DataCrypt::new(raw.clone(), keys());
            d.write_stream(8192, &block).unwrap();
            d.fence().unwrap();
            let mut back = vec![0u8; block.len()];
            d.read(8192, &mut back).unwrap();
            assert!(back == block, "stream_data {stream_data}");
            // What the mapping holds is the same ciphertext the copying path writes.
            let mut on_media = vec![0u8; block.len()];
            raw.read(8192, &mut on_media).unwrap();
            let mem = Arc::new(MemMedium::new(64 << 10));
            DataCrypt::new(mem.clone(), keys())
                .write(8192, &block)
                .unwrap();
            assert!(on_media[..] == mem.snapshot()[8192..8192 + block.len()]);
        }
    }

    #[test]
    fn batched_xts_equals_the_reference_implementation() {
        use xts_mode::{get_tweak_default, Xts128};
        let (master, salt) = ([7u8; 32], [9u8; 16]);
        let k = ImageKeys::derive(&master, &salt);
        let reference = Xts128::new(
            Aes256::new(&derive(CTX_DATA1, &master, &salt).into()),
            Aes256::new(&derive(CTX_DATA2, &master, &salt).into()),
        );
        let plain: Vec<u8> = (0..3 * BLOCK_SIZE).map(|i| (i * 7 % 253) as u8).collect();
        let mut ours = plain.clone();
        for (i, b) in ours.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            k.xts(b, 1000 + i as u64, true);
        }
        let mut theirs = plain.clone();
        reference.encrypt_area(&mut theirs, BLOCK_SIZE, 1000, get_tweak_default);
        assert!(ours == theirs, "not XTS");
        for (i, b) in ours.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            k.xts(b, 1000 + i as u64, false);
        }
        assert!(ours == plain);
        // The tweak chain crosses the top bit (reduction) within a block.
        assert_eq!(gf_double(1 << 127), 0x87);
    }

    #[test]
    fn fused_xts_equals_the_portable_one() {
        let k = keys();
        #[cfg(target_arch = "x86_64")]
        if k.ni.is_none() {
            eprintln!("no AES-NI here: only the portable path runs");
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let plain: Vec<u8> = (0..BLOCK_SIZE)
            .map(|_| {
                x = x.rotate_left(13).wrapping_mul(0x2545_F491_4F6C_DD1D);
                (x >> 56) as u8
            })
            .collect();
        // Block numbers whose tweak chains differ widely, the top bit among them.
        for block in [0, 1, 77, 1 << 40, u64::MAX - 3, u64::MAX] {
            for encrypt in [true, false] {
                let mut fused = vec![0u8; BLOCK_SIZE];
                let mut portable = vec![0u8; BLOCK_SIZE];
                k.xts_to(&plain, &mut fused, block, encrypt);
                k.xts_to_portable(&plain, &mut portable, block, encrypt);
                assert!(fused == portable, "block {block} encrypt {encrypt}");
            }
        }
    }

    #[test]
    fn metadata_is_encrypted_byte_by_byte_except_the_clear_ranges() {
        let raw = Arc::new(MemMedium::new(64 << 10));
        let m = MetaCrypt::new(raw.clone(), keys(), vec![0..4096, 16384..20480]);
        let text = b"file-name-marker-0123456789abcdef";
        for off in [0u64, 100, 4090, 5000, 16380, 20470, 30001] {
            m.write(off, text).unwrap();
            let mut back = vec![0u8; text.len()];
            m.read(off, &mut back).unwrap();
            assert_eq!(&back, text, "offset {off}");
        }
        // Byte granularity: writing 8 bytes inside changes only those bytes on the image.
        let before = raw.snapshot();
        m.write(5008, &[1u8; 8]).unwrap();
        let after = raw.snapshot();
        let changed: Vec<usize> = (0..after.len())
            .filter(|&i| after[i] != before[i])
            .collect();
        assert!(
            changed.iter().all(|&i| (5008..5016).contains(&i)),
            "{changed:?}"
        );
        // Clear ranges hold the bytes as written; elsewhere the marker never shows.
        assert_eq!(&after[100..100 + text.len()], text);
        let img = raw.snapshot();
        let hits: Vec<usize> = img
            .windows(text.len())
            .enumerate()
            .filter(|(_, w)| *w == text)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(hits, vec![0, 100], "plaintext outside the clear ranges");
        // Different keys, different bytes.
        let raw2 = Arc::new(MemMedium::new(64 << 10));
        let other = Arc::new(ImageKeys::derive(&[7u8; 32], &[10u8; 16]));
        MetaCrypt::new(raw2.clone(), other, vec![])
            .write(5000, text)
            .unwrap();
        assert_ne!(raw2.snapshot()[5000..5033], img[5000..5033]);
    }

    #[test]
    fn key_files_and_passphrases() {
        let salt = [3u8; 16];
        let raw = KdfParams::for_key_file(&[5u8; 32]);
        assert_eq!(raw.kind, KdfKind::Raw);
        // 32 bytes of text are a passphrase, not a key.
        assert_eq!(
            KdfParams::for_key_file(b"0123456789abcdef0123456789abcde\n").kind,
            KdfKind::Argon2id
        );
        assert_eq!(KdfParams::for_key_file(&[b'k'; 32]).kind, KdfKind::Argon2id);
        assert_eq!(master_key(&[5u8; 32], &salt, &raw).unwrap(), [5u8; 32]);
        assert!(master_key(&[5u8; 31], &salt, &raw).is_err());
        let fast = KdfParams {
            kind: KdfKind::Argon2id,
            m_kib: 64,
            t: 1,
            p: 1,
        };
        let a = master_key(b"correct horse\n", &salt, &fast).unwrap();
        assert_eq!(a, master_key(b"correct horse", &salt, &fast).unwrap());
        assert_ne!(a, master_key(b"correct horse", &[4u8; 16], &fast).unwrap());
        assert_ne!(a, master_key(b"wrong horse", &salt, &fast).unwrap());
        assert!(master_key(b"\n", &salt, &fast).is_err());
        assert_ne!(
            ImageKeys::check_value(&a, &salt),
            ImageKeys::check_value(&[0u8; 32], &salt)
        );
    }
}
