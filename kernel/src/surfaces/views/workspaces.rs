//! Views of workspaces (SPEC §26): the operator's images, snapshots and
//! directory listings.

use serde::{Deserialize, Serialize};

/// One image runs may be created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageView {
    /// Its name, what `"image"` at run creation names.
    pub name: String,
    /// The Docker reference its containers are made from.
    pub reference: String,
    /// The image id the engine has for it; null when it has none.
    pub digest: Option<String>,
    /// Whether runs that name no image get it.
    pub default: bool,
}

/// `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageList {
    /// Every image, in the operator's order.
    pub images: Vec<ImageView>,
}

/// A kept snapshot of a run's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnapshotView {
    /// Its name (`"fork_from": "RUN@NAME"`).
    pub name: String,
    /// Bytes it holds (counted against the tree's `disk_bytes`).
    pub bytes: u64,
    /// When it was made (unix ms).
    pub created_at: i64,
}

/// `GET /v1/runs/{run}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnapshotList {
    /// Oldest first.
    pub snapshots: Vec<SnapshotView>,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed in a listing).
    Symlink,
    /// A FIFO, a socket or a device.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// Its name in the directory.
    pub name: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: FileType,
    /// Size in bytes (a link's: the length of its target).
    pub size: u64,
    /// Permission bits in octal (`"644"`).
    pub mode: String,
    /// Last modification (unix seconds).
    pub modified: i64,
}

/// A directory listing (`GET /v1/runs/{run}/files/{dir}/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileList {
    /// The container path listed.
    pub path: String,
    /// Its entries by name (`.ops` never among them).
    pub entries: Vec<FileEntry>,
}

/// What a write through the files API did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileWrittenView {
    /// The container path written.
    pub path: String,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Entries written (1 for a file; an archive's count).
    pub entries: u64,
}

/// `read_file`'s answer: a bounded slice of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileContent {
    /// The container path read.
    pub path: String,
    /// The file's size, bytes.
    pub size: u64,
    /// Where the slice starts.
    pub offset: u64,
    /// Where the next slice starts (the size once all is read).
    pub next_offset: u64,
    /// Whether the slice reaches the end of the file.
    pub eof: bool,
    /// `text` or `base64`.
    pub encoding: String,
    /// The slice.
    pub content: String,
}

/// `POST /v1/runs/{run}/network`: the run's allow list as it now is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetworkView {
    /// The run.
    pub run_id: String,
    /// Its allow list now (entries as the kernel spells them).
    pub allow: Vec<String>,
    /// Descendants whose lists lost entries with it.
    pub narrowed: Vec<String>,
}
