//! Source files, the spans that point into them and the line/column arithmetic diagnostics need.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Identifies one file in a [`Sources`] set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// A byte range in one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Self {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Span {
            file,
            start: clamp(start),
            end: clamp(end.max(start)),
        }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// The smallest span covering both (same file assumed).
    pub fn join(self, other: Span) -> Span {
        Span {
            file: self.file,
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    /// A sub-range of this span, given as offsets relative to its start.
    pub fn within(self, range: std::ops::Range<usize>) -> Span {
        let start = self.start as usize + range.start;
        Span::new(self.file, start, start + range.len())
    }
}

/// The format a spec file is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// Chooses the format from a file extension: `.toml` is TOML, everything else YAML.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("toml") => Format::Toml,
            _ => Format::Yaml,
        }
    }
}

/// One loaded file: its path as the user gave it, its text and a line index.
#[derive(Debug)]
pub struct SourceFile {
    pub id: FileId,
    pub path: PathBuf,
    pub text: String,
    pub format: Format,
    /// Where each line starts, made when a position is first asked for (most files valid, never).
    line_starts: std::sync::OnceLock<Vec<usize>>,
}

impl SourceFile {
    pub fn new(id: FileId, path: PathBuf, text: String, format: Format) -> Self {
        SourceFile {
            id,
            path,
            text,
            format,
            line_starts: std::sync::OnceLock::new(),
        }
    }

    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| {
            let bytes = self.text.as_bytes();
            let mut starts = Vec::with_capacity(1 + bytes.iter().filter(|&&b| b == b'\n').count());
            starts.push(0);
            starts.extend(
                bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'\n')
                    .map(|(i, _)| i + 1),
            );
            starts
        })
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line_starts = self.line_starts();
        let line = line_starts.partition_point(|&s| s <= offset) - 1;
        let start = line_starts[line];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    /// The text a span covers (empty if it falls outside the file).
    pub fn slice(&self, span: Span) -> &str {
        self.text.get(span.range()).unwrap_or("")
    }
}

/// Every file loaded while validating one spec (the spec and its sub-workflows).
#[derive(Debug, Default, Clone)]
pub struct Sources {
    files: Vec<Arc<SourceFile>>,
}

impl Sources {
    pub fn add(&mut self, path: PathBuf, text: String) -> Arc<SourceFile> {
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        let format = Format::from_path(&path);
        let file = Arc::new(SourceFile::new(id, path, text, format));
        self.files.push(file.clone());
        file
    }

    pub fn get(&self, id: FileId) -> Option<&Arc<SourceFile>> {
        self.files.get(id.0 as usize)
    }

    pub fn find(&self, path: &Path) -> Option<&Arc<SourceFile>> {
        self.files.iter().find(|f| f.path == path)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<SourceFile>> {
        self.files.iter()
    }
}

/// Why a file could not be read whole.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// A FIFO, a device, a socket or a folder: reading one could block or never end.
    NotRegular(&'static str),
    /// Larger than the limit, in bytes (at least).
    TooLarge(u64),
}

impl ReadError {
    /// Why, as a user reads it after "cannot read `file`: ".
    pub fn reason(&self) -> String {
        match self {
            ReadError::Io(e) => match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
                _ => e.to_string().to_lowercase(),
            },
            ReadError::NotRegular(kind) => format!("it is {kind}, not a regular file"),
            ReadError::TooLarge(size) => format!("it is more than {size} bytes"),
        }
    }
}

/// Reads a regular file of at most `limit` bytes. Anything else is refused before it is read: a FIFO or a
/// device (`/dev/zero`) could block or never end, even through a symbolic link. The file is opened without
/// blocking and checked again once open, so swapping it for a FIFO in between does not help.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let kind = |t: std::fs::FileType| -> Option<&'static str> {
        if t.is_file() {
            None
        } else if t.is_dir() {
            Some("a folder")
        } else if t.is_fifo() {
            Some("a FIFO")
        } else if t.is_char_device() || t.is_block_device() {
            Some("a device")
        } else if t.is_socket() {
            Some("a socket")
        } else {
            Some("not a file")
        }
    };
    let metadata = std::fs::metadata(path).map_err(ReadError::Io)?;
    if let Some(kind) = kind(metadata.file_type()) {
        return Err(ReadError::NotRegular(kind));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(ReadError::Io)?;
    let metadata = file.metadata().map_err(ReadError::Io)?;
    if let Some(kind) = kind(metadata.file_type()) {
        return Err(ReadError::NotRegular(kind));
    }
    if metadata.len() > limit {
        return Err(ReadError::TooLarge(limit));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(bytes)
}
