//! Trace file formats: FIU text (`fiu`) and nodup's binary format (`own`), detected by magic.

pub mod fiu;
pub mod own;
pub mod varint;

use crate::error::{Result, TraceError};
use crate::output::OutputFile;
use crate::record::Record;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// FIU iodedup text lines.
    Fiu,
    /// nodup's compact binary format.
    Own,
}

impl std::str::FromStr for Format {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fiu" => Ok(Format::Fiu),
            "own" => Ok(Format::Own),
            _ => Err(TraceError::Invalid(format!(
                "unknown trace format {s:?} (fiu|own)"
            ))),
        }
    }
}

/// Bytes read to tell the formats apart.
const HEAD: usize = 4096;

/// Detect the format of a file by its first bytes (see [`format_of`]).
pub fn detect(path: &Path) -> Result<Format> {
    let mut f =
        File::open(path).map_err(|e| TraceError::io(format!("opening {}", path.display()), e))?;
    format_of(&read_head(&mut f, path)?)
}

/// Up to [`HEAD`] first bytes of `f` (fewer only at its end).
fn read_head(f: &mut File, path: &Path) -> Result<Vec<u8>> {
    let mut head = vec![0u8; HEAD];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TraceError::io(format!("reading {}", path.display()), e)),
        }
    }
    head.truncate(got);
    Ok(head)
}

/// The format of a trace starting with `head`: own-format magic, else FIU, unless those bytes
/// are binary (a NUL, which FIU text never has): then the file is a damaged own-format trace
/// or no trace at all, and reading it as text would only report every "line" of it as bad,
/// numbered as lines of a file that has none.
fn format_of(head: &[u8]) -> Result<Format> {
    if head.len() >= 8 && &head[..8] == own::MAGIC {
        return Ok(Format::Own);
    }
    if head.contains(&0) {
        return Err(TraceError::Format(
            "bad magic: binary data that is not FIU text either (a damaged nodup trace, or not a trace)"
                .into(),
        ));
    }
    Ok(Format::Fiu)
}

/// A trace's bytes: those read to detect its format, then the rest of the same open file (so
/// a trace read from a pipe loses nothing to the detection).
type Source = BufReader<std::io::Chain<std::io::Cursor<Vec<u8>>, File>>;

/// A streaming reader over either format.
pub enum TraceReader {
    /// FIU text.
    Fiu(fiu::FiuReader<Source>),
    /// Own binary format.
    Own(own::OwnReader<Source>),
}

impl TraceReader {
    /// Open `path` in `format` (detected when `None`).
    pub fn open(path: &Path, format: Option<Format>) -> Result<Self> {
        Ok(Self::open_as(path, format)?.1)
    }

    /// [`TraceReader::open`], also returning the format read. The file is opened once: a
    /// pipe cannot be read again after the detection.
    pub fn open_as(path: &Path, format: Option<Format>) -> Result<(Format, Self)> {
        let mut f = File::open(path)
            .map_err(|e| TraceError::io(format!("opening {}", path.display()), e))?;
        let (format, head) = match format {
            Some(fmt) => (fmt, Vec::new()),
            None => {
                let head = read_head(&mut f, path)?;
                (format_of(&head)?, head)
            }
        };
        let r = BufReader::with_capacity(1 << 20, std::io::Cursor::new(head).chain(f));
        Ok((
            format,
            match format {
                Format::Fiu => TraceReader::Fiu(fiu::FiuReader::new(r)),
                Format::Own => TraceReader::Own(own::OwnReader::new(r)?),
            },
        ))
    }

    /// Bytes consumed so far (for progress reporting).
    pub fn bytes_read(&self) -> u64 {
        match self {
            TraceReader::Fiu(r) => r.bytes_read(),
            TraceReader::Own(r) => r.bytes_read(),
        }
    }
}

impl Iterator for TraceReader {
    type Item = Result<(u64, Record)>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            TraceReader::Fiu(r) => r.next(),
            TraceReader::Own(r) => r.next(),
        }
    }
}

/// How a consumer treats unparsable lines.
pub struct BadLinePolicy<'a> {
    /// Stop at the first bad line with its error.
    pub strict: bool,
    /// Called for every bad line (the CLI prints it on stderr).
    pub report: Option<&'a (dyn Fn(&TraceError) + Sync)>,
}

/// Drive `f` over every good record of `reader`, applying the bad-line policy; returns bad lines.
///
/// Parse errors are skipped and counted unless `strict`; I/O and own-format corruption always stop.
pub fn for_each_record(
    reader: &mut TraceReader,
    policy: &BadLinePolicy<'_>,
    mut progress: impl FnMut(u64),
    mut f: impl FnMut(u64, Record) -> Result<()>,
) -> Result<u64> {
    let mut bad = 0u64;
    let mut n = 0u64;
    while let Some(item) = reader.next() {
        match item {
            Ok((line, rec)) => f(line, rec)?,
            Err(e @ TraceError::Parse { .. }) => {
                if let Some(rep) = policy.report {
                    rep(&e);
                }
                if policy.strict {
                    return Err(e);
                }
                bad += 1;
            }
            Err(e) => return Err(e),
        }
        n += 1;
        if n % 4096 == 0 {
            progress(reader.bytes_read());
        }
    }
    progress(reader.bytes_read());
    Ok(bad)
}

/// Convert `input` to `output` in the other format (or `to`); returns (records, bad lines).
/// `output` is replaced only once the conversion succeeded (see [`OutputFile`]).
pub fn convert(
    input: &Path,
    output: &Path,
    to: Option<Format>,
    policy: &BadLinePolicy<'_>,
) -> Result<(u64, u64)> {
    let (out, n, bad) = convert_pending(input, output, to, policy)?;
    out.commit()?;
    Ok((n, bad))
}

/// [`convert`] without putting the output in place: the caller commits it once it accepts the
/// result (a trace of nothing but bad lines may not be), or drops it to leave `output` as it was.
pub fn convert_pending(
    input: &Path,
    output: &Path,
    to: Option<Format>,
    policy: &BadLinePolicy<'_>,
) -> Result<(OutputFile, u64, u64)> {
    let (from, mut reader) = TraceReader::open_as(input, None)?;
    let to = to.unwrap_or(match from {
        Format::Fiu => Format::Own,
        Format::Own => Format::Fiu,
    });
    // Were the output the input (the same path, or a symlink or hard link to it), one written
    // in place (not a regular file) would be truncated when opened, the conversion would read
    // an empty trace and destroy the original; a regular one would be replaced by its own
    // conversion.
    if same_file(input, output) {
        return Err(TraceError::Refused(format!(
            "output {} is the input trace itself (converting onto it would destroy it)",
            output.display()
        )));
    }
    // Written beside the output and renamed over it only when complete: a conversion that
    // fails midway (a full disk, a corrupt input under --strict) leaves no partial trace that
    // looks like a good one, and the file that was there before as it was.
    let out = OutputFile::create(output)?;
    let (n, bad) = convert_into(&mut reader, out.file(), output, to, policy)?;
    Ok((out, n, bad))
}

/// The body of [`convert`]: every record of `reader` into `out` (the file for `output`).
fn convert_into(
    reader: &mut TraceReader,
    out: &File,
    output: &Path,
    to: Format,
    policy: &BadLinePolicy<'_>,
) -> Result<(u64, u64)> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    let mut count = 0u64;
    let bad = match to {
        Format::Own => {
            let mut w = own::OwnWriter::new(&mut out)?;
            let bad = for_each_record(
                reader,
                policy,
                |_| {},
                |_, r| {
                    count += 1;
                    w.write(&r)
                },
            )?;
            w.finish()?;
            bad
        }
        Format::Fiu => for_each_record(
            reader,
            policy,
            |_| {},
            |_, r| {
                count += 1;
                use std::io::Write;
                writeln!(out, "{}", fiu::format_line(&r))
                    .map_err(|e| TraceError::io(format!("writing {}", output.display()), e))
            },
        )?,
    };
    use std::io::Write;
    out.flush()
        .map_err(|e| TraceError::io(format!("writing {}", output.display()), e))?;
    Ok((count, bad))
}

/// Whether `a` and `b` are the same existing file: the same device and inode once symlinks
/// are followed (so also a hard link, or another spelling of the path).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}
