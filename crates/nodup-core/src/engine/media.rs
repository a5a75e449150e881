//! The media handles of an engine: data and metadata (see [`Media`]), and the access meter
//! metadata I/O goes through when one is asked for.

use std::sync::Arc;

use super::options::KeyFile;
use super::superblock::{Superblock, CIPHER_NONE};
use crate::media::crypt::{master_key, DataCrypt, ImageKeys, MetaCrypt};
use crate::media::{AccessMeter, Medium, MeterConfig};
use crate::{Error, Result, BLOCK_SIZE};

/// The two media handles the engine works on: one for data blocks, one for everything else
/// (superblock, entries, reverse map, save area, and the caller's metadata). Both address the
/// same image (offsets are image offsets, lengths must be equal); by default they are the same
/// medium. Separate handles let a wrapper act on one side only: encryption of data blocks after
/// fingerprinting, or a meter or simulator on either.
#[derive(Clone)]
pub struct Media {
    /// Data blocks: copies of new data, comparisons, reads.
    pub data: Arc<dyn Medium>,
    /// Metadata: the engine's and the caller's.
    pub meta: Arc<dyn Medium>,
    /// True when the two are the encrypting media of an encrypted image ([`Media::unlock`]).
    pub encrypted: bool,
}

impl Media {
    /// One medium for both.
    pub fn single(m: Arc<dyn Medium>) -> Media {
        Media {
            data: m.clone(),
            meta: m,
            encrypted: false,
        }
    }

    /// Separate data and metadata handles over one plain image.
    pub fn split(data: Arc<dyn Medium>, meta: Arc<dyn Medium>) -> Media {
        Media {
            data,
            meta,
            encrypted: false,
        }
    }

    /// `media` wrapped to encrypt with `keys` (`media::crypt`), the engine superblock (block 0)
    /// and the caller's superblock pair (the first two blocks of the client area at
    /// `client_start`, which must have at least 2 blocks) left in the clear.
    pub fn encrypted(media: Media, keys: ImageKeys, client_start: u64) -> Media {
        let keys = Arc::new(keys);
        let bs = BLOCK_SIZE as u64;
        let clear = vec![0..bs, client_start * bs..(client_start + 2) * bs];
        Media {
            data: Arc::new(DataCrypt::new(media.data, keys.clone())),
            meta: Arc::new(MetaCrypt::new(media.meta, keys, clear)),
            encrypted: true,
        }
    }

    /// The media of the image on `raw`: for an encrypted image (its superblock says so, in the
    /// clear) the key file is required, checked against the superblock's key check value and
    /// turned into the encrypting media; a plain image takes no key. Nothing is written.
    pub fn unlock(raw: Arc<dyn Medium>, key: Option<&KeyFile>) -> Result<Media> {
        let sb = Superblock::load(&*raw)?;
        let p = sb.params;
        match (p.cipher != CIPHER_NONE, key) {
            (false, None) => Ok(Media::single(raw)),
            (false, Some(_)) => Err(Error::Invalid(
                "the image is not encrypted: it takes no key file".into(),
            )),
            (true, None) => Err(Error::Invalid(
                "the image is encrypted: give its key file (--encrypt-key-file)".into(),
            )),
            (true, Some(k)) => {
                if sb.client_blocks < 2 {
                    return Err(Error::Corrupt(
                        "engine superblock: an encrypted image needs a client area of 2 blocks"
                            .into(),
                    ));
                }
                let kdf = p.kdf.ok_or_else(|| {
                    Error::Corrupt("engine superblock: cipher without key derivation".into())
                })?;
                let master = master_key(&k.0, &p.salt, &kdf)?;
                if ImageKeys::check_value(&master, &p.salt) != p.key_check {
                    return Err(Error::Invalid(
                        "wrong key: the key file does not open this image".into(),
                    ));
                }
                Ok(Media::encrypted(
                    Media::single(raw),
                    ImageKeys::derive(&master, &p.salt),
                    sb.client_start,
                ))
            }
        }
    }

    pub(super) fn check(&self) -> Result<()> {
        if self.data.len() != self.meta.len() {
            return Err(Error::Invalid(format!(
                "data medium is {} bytes, metadata medium {}: both must address the same image",
                self.data.len(),
                self.meta.len()
            )));
        }
        Ok(())
    }
}

/// The metadata medium and, when it is one, the meter itself.
pub(super) type MetaMedium = (Arc<dyn Medium>, Option<Arc<AccessMeter>>);

/// The medium to use for metadata: an access meter over `m` when a granularity is asked.
pub(super) fn meta_medium(m: &Arc<dyn Medium>, granularity: Option<usize>) -> Result<MetaMedium> {
    match granularity {
        None => Ok((m.clone(), None)),
        Some(g) => {
            let meter = Arc::new(AccessMeter::new(
                m.clone(),
                MeterConfig::with_granularity(g),
            )?);
            Ok((meter.clone(), Some(meter)))
        }
    }
}
