//! The media handles of an engine: data and metadata (see [`Media`]), and the access meter
//! metadata I/O goes through when one is asked for.

use std::sync::Arc;

use crate::media::{AccessMeter, Medium, MeterConfig};
use crate::{Error, Result};

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
}

impl Media {
    /// One medium for both.
    pub fn single(m: Arc<dyn Medium>) -> Media {
        Media {
            data: m.clone(),
            meta: m,
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
