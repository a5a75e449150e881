//! Baseline: no deduplication; every write is encrypted (counter mode) and written in place.

use super::Common;
use crate::model::timing::Request;
use crate::trace::Line;

/// Encrypt and write `data` for logical line `lid`.
pub fn write(c: &mut Common, req: &mut Request, lid: u32, data: &Line) {
    let st = c.mem.store_unique(lid, data);
    c.encrypt_and_write(req, st.pid);
}
