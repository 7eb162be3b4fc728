//! One typed error enum for the whole core; the binding maps each variant to a Python class.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum BankError {
    /// A tenant name that the books do not know (and may not create).
    UnknownTenant(String),
    /// A tenant added twice, or an empty name.
    Tenant(String),
    /// A slot index out of range, or a slot that is free where a used one is required.
    Slot(String),
    /// Quotas exceeding the capacity, a zero quota or pool, a bad capacity.
    Quota(String),
    /// Arrays whose shapes or layouts disagree with each other or with the bank (a caller's bug).
    Shape(String),
    /// Arguments to `save` that cannot form a snapshot (missing arrays, wrong shapes, missing meta).
    SnapshotInput(String),
    /// A snapshot that is truncated, fails its checksum or disagrees with its own metadata.
    SnapshotCorrupt(String),
    /// A snapshot written by a different format version.
    SnapshotVersion { found: String, supported: u32 },
    /// A snapshot made for another draft model.
    SnapshotDraftMismatch { expected: String, found: String },
    /// The file system refused (missing file, permissions, disk full).
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, BankError>;

impl fmt::Display for BankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BankError::UnknownTenant(name) => write!(f, "unknown tenant {name:?}"),
            BankError::Tenant(msg)
            | BankError::Slot(msg)
            | BankError::Quota(msg)
            | BankError::Shape(msg)
            | BankError::SnapshotInput(msg) => f.write_str(msg),
            BankError::SnapshotCorrupt(msg) => write!(f, "corrupt bank snapshot: {msg}"),
            BankError::SnapshotVersion { found, supported } => write!(
                f,
                "bank snapshot format version {found} is not supported (this build reads version {supported})"
            ),
            BankError::SnapshotDraftMismatch { expected, found } => write!(
                f,
                "bank snapshot was made for draft {found}, not for the loaded draft {expected}"
            ),
            BankError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for BankError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BankError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub(crate) fn corrupt(msg: impl Into<String>) -> BankError {
    BankError::SnapshotCorrupt(msg.into())
}
