//! `debubble`: rewrite a file with bubbles (a FAWN data log, a write-ahead log or an SSTable)
//! into the plain compact layout, byte-identical to what the store writes with freewrite off,
//! for tools that do not know about bubbles (Freewrite §3.2).

use crate::error::{Error, IoContext, Result};
use crate::logfile::{scan_log, LogHeader, LOG_HEADER};
use crate::lsm::table::{Table, TableBuilder};
use crate::record::Entry;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// What a debubble did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DebubbleReport {
    /// "data log", "write-ahead log" or "sstable".
    pub kind: &'static str,
    /// Records kept.
    pub records: u64,
    /// Bubbles removed.
    pub bubbles: u64,
    /// Their bytes.
    pub bubble_bytes: u64,
    /// Bytes of the input.
    pub in_bytes: u64,
    /// Bytes of the output.
    pub out_bytes: u64,
}

/// The temporary name the output is written under before it is renamed into place.
fn temp_for(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".debubble.tmp");
    PathBuf::from(s)
}

/// Rewrite `input` without its bubbles into `output` (which must not exist). The output
/// appears whole or not at all; the input is not changed.
pub fn debubble(input: &Path, output: &Path) -> Result<DebubbleReport> {
    if output.exists() {
        return Err(Error::Invalid(format!(
            "{} exists; give a new output file",
            output.display()
        )));
    }
    let mut file = File::open(input).ctx(|| format!("open {}", input.display()))?;
    let mut magic = [0u8; 8];
    file.read_exact(&mut magic)
        .map_err(|_| Error::corrupt(input, "too short for a log or table"))?;
    let tmp = temp_for(output);
    crate::fsutil::remove(&tmp)?;
    let res = if &magic == b"NDFWLOG\0" {
        debubble_log(input, &file, &tmp)
    } else if &magic == b"NDFWSST\0" {
        debubble_table(input, &tmp)
    } else {
        Err(Error::corrupt(
            input,
            "not a nodup-freewrite log or table (bad magic)",
        ))
    };
    match res {
        Ok(rep) => {
            std::fs::rename(&tmp, output)
                .ctx(|| format!("rename {} to {}", tmp.display(), output.display()))?;
            Ok(rep)
        }
        Err(e) => {
            let _ = crate::fsutil::remove(&tmp);
            Err(e)
        }
    }
}

fn debubble_log(input: &Path, file: &File, tmp: &Path) -> Result<DebubbleReport> {
    let head = crate::fsutil::read_exact_at(file, input, 0, LOG_HEADER)?;
    let header = LogHeader::decode(input, &head)?;
    let out = File::create(tmp).ctx(|| format!("create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, out);
    let wctx = || format!("write {}", tmp.display());
    w.write_all(&head).ctx(wctx)?;
    let mut rep = DebubbleReport {
        kind: match header.kind {
            crate::logfile::LogKind::Data => "data log",
            crate::logfile::LogKind::Wal => "write-ahead log",
        },
        out_bytes: LOG_HEADER as u64,
        ..Default::default()
    };
    let end = scan_log(input, file, header.kind, |_, raw, e| {
        if e == Entry::Bubble {
            rep.bubbles += 1;
            rep.bubble_bytes += raw.len() as u64;
        } else {
            rep.records += 1;
            rep.out_bytes += raw.len() as u64;
            w.write_all(raw).ctx(wctx)?;
        }
        Ok(())
    })?;
    if end.valid_end != end.file_len {
        return Err(Error::corrupt(
            input,
            format!(
                "unreadable record at offset {} (torn tail or damage)",
                end.valid_end
            ),
        ));
    }
    rep.in_bytes = end.file_len;
    let f = w
        .into_inner()
        .map_err(|e| Error::io(format!("write {}", tmp.display()), e.into_error()))?;
    f.sync_all().ctx(|| format!("fsync {}", tmp.display()))?;
    Ok(rep)
}

fn debubble_table(input: &Path, tmp: &Path) -> Result<DebubbleReport> {
    let t = Table::open_file(input)?;
    let (buf, recs) = t.read_all()?;
    let mut b = TableBuilder::new();
    for r in &recs {
        b.add(&buf[r.key.clone()], &buf[r.range.clone()]);
    }
    let meta = b.finish(tmp, 0)?;
    let bubbles = crate::record::records(&buf, 0)
        .filter(|r| matches!(r, Ok((_, _, Entry::Bubble))))
        .count() as u64;
    Ok(DebubbleReport {
        kind: "sstable",
        records: recs.len() as u64,
        bubbles,
        bubble_bytes: t.meta.bubble_bytes,
        in_bytes: t.meta.file_size,
        out_bytes: meta.file_size,
    })
}
