//! Output files that replace what was at their path only once complete.
//!
//! A trace written straight into its path empties whatever file was there first, so a run that
//! fails midway (a full disk, a bad line under `--strict`) loses the old file as well as the new
//! one. A regular file (or a path where nothing is yet) is therefore written to a temporary file
//! beside it, renamed over the path on [`OutputFile::commit`], and removed if never committed.
//! Anything else (`/dev/null`, a FIFO, a terminal) cannot be replaced by a rename and has no
//! old content to keep: it is written in place, as before.

use crate::error::{Result, TraceError};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// A file being written for `path`; see the module documentation.
#[derive(Debug)]
pub struct OutputFile {
    /// The path as the caller named it (for messages).
    path: PathBuf,
    /// Where the written file goes: the path itself, or the regular file a symbolic link there
    /// points to (the link stays a link); `None` when written in place.
    target: Option<PathBuf>,
    /// The temporary file until it is committed (then `None`: nothing to remove).
    tmp: Option<PathBuf>,
    file: File,
}

impl OutputFile {
    /// Start writing `path`: a temporary file beside a regular file or a missing one, the path
    /// itself (truncated) otherwise. A replaced file's permissions carry over. A file with
    /// other hard links, or in a directory where no file can be made (no write permission, a
    /// read-only file system), is written in place as before: a rename would cut the links,
    /// and could not be done at all.
    pub fn create(path: &Path) -> Result<OutputFile> {
        let creating = |e| TraceError::io(format!("creating {}", path.display()), e);
        let (target, mode) = match std::fs::metadata(path) {
            Ok(m) if m.is_file() && std::os::unix::fs::MetadataExt::nlink(&m) > 1 => (None, None),
            // Through a symbolic link, the file it names is the one replaced.
            Ok(m) if m.is_file() => (
                Some(std::fs::canonicalize(path).map_err(creating)?),
                Some(m.permissions()),
            ),
            Ok(_) => (None, None),
            // Nothing there: created by the rename. A dangling symbolic link is left to the
            // in-place open, which creates the file it names, as it always did.
            Err(e)
                if e.kind() == ErrorKind::NotFound && std::fs::symlink_metadata(path).is_err() =>
            {
                (Some(path.to_path_buf()), None)
            }
            Err(_) => (None, None),
        };
        let in_place = || -> Result<OutputFile> {
            let file = File::create(path).map_err(creating)?;
            Ok(OutputFile {
                path: path.to_path_buf(),
                target: None,
                tmp: None,
                file,
            })
        };
        let Some(target) = target else {
            return in_place();
        };
        if mode.is_some() {
            // A file this user could not write in place is not replaced either (the rename
            // needs only the directory's permission): opened for writing, without truncation.
            OpenOptions::new()
                .write(true)
                .open(&target)
                .map_err(creating)?;
        }
        let (tmp, file) = match create_beside(&target) {
            Ok(made) => made,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
                ) =>
            {
                return in_place();
            }
            Err(e) => return Err(creating(e)),
        };
        let out = OutputFile {
            path: path.to_path_buf(),
            target: Some(target),
            tmp: Some(tmp),
            file,
        };
        if let Some(p) = mode {
            out.file.set_permissions(p).map_err(creating)?;
        }
        Ok(out)
    }

    /// The path as given to [`OutputFile::create`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file to write into (`&File` is a `Write`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Put the written file in place: flushed to the disk first (a full disk may only say so
    /// now), then renamed over the path. Without this the temporary file is removed on drop.
    pub fn commit(mut self) -> Result<()> {
        let (Some(tmp), Some(target)) = (self.tmp.take(), self.target.as_ref()) else {
            return Ok(());
        };
        let writing = |e| TraceError::io(format!("writing {}", self.path.display()), e);
        let done = self
            .file
            .sync_all()
            .map_err(writing)
            .and_then(|()| std::fs::rename(&tmp, target).map_err(writing));
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        done
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// A new file in `target`'s directory, hidden and named after it: `.NAME.nodup-PID-N`.
fn create_beside(target: &Path) -> std::io::Result<(PathBuf, File)> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target.file_name().unwrap_or(target.as_os_str());
    let mut n = 0u32;
    loop {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".nodup-{}-{n}", std::process::id()));
        let tmp = dir.join(tmp_name);
        // create_new: never a file another run (or anyone) already has there.
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A file with another hard link is written in place: both names see the new trace.
    #[test]
    fn a_hard_linked_file_keeps_its_links() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.fiu");
        let other = dir.path().join("link.fiu");
        std::fs::write(&p, b"old").unwrap();
        std::fs::hard_link(&p, &other).unwrap();
        let out = OutputFile::create(&p).unwrap();
        out.file().write_all(b"new").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read(&other).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&p).unwrap().nlink(), 2);
        assert_eq!(names(dir.path()), ["link.fiu", "t.fiu"]);
    }

    #[test]
    fn an_old_file_stays_until_commit_and_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.fiu");
        std::fs::write(&p, b"old").unwrap();
        let out = OutputFile::create(&p).unwrap();
        out.file().write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        drop(out);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["t.fiu"]);
        let out = OutputFile::create(&p).unwrap();
        out.file().write_all(b"new").unwrap();
        out.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["t.fiu"]);
    }

    #[test]
    fn a_link_stays_a_link_and_a_device_is_written_in_place() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let out = OutputFile::create(&link).unwrap();
        out.file().write_all(b"new").unwrap();
        out.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        let mode = std::fs::metadata(&real).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let null = OutputFile::create(Path::new("/dev/null")).unwrap();
        null.file().write_all(b"x").unwrap();
        null.commit().unwrap();
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        // A new file appears only at commit.
        let new = dir.path().join("new");
        let out = OutputFile::create(&new).unwrap();
        assert!(!new.exists());
        out.commit().unwrap();
        assert!(new.exists());
    }
}
