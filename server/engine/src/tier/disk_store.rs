//! The disk tier's files: one a block, named by its hash, written whole to a
//! temporary name and renamed into place, so a reader sees a whole file or
//! none; each carries its hash, length and CRC-32, checked on every read,
//! so a torn, truncated or corrupt file is a miss, never wrong KV. The
//! directory outlives the process: a new one lists it and serves its
//! blocks.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ferrox_core::BlockHash;

use super::store::{BlockStore, Found, Miss};
use crate::EngineError;

/// The first bytes of every block file (the format's version with them).
const MAGIC: &[u8; 8] = b"FXKVBLK1";
/// Magic, hash, payload length, CRC-32.
const HEADER: usize = 8 + 32 + 8 + 4;
/// Block files end so.
const EXT: &str = "kvb";
/// A temporary file this old was left by a writer that died.
const ABANDONED: std::time::Duration = std::time::Duration::from_secs(60);

/// A directory of block files.
#[derive(Debug)]
pub(crate) struct DiskStore {
    dir: PathBuf,
}

impl DiskStore {
    /// The store in `dir` (created if absent), refused with the reason when
    /// it cannot be written or its file system has less than `size` bytes.
    pub fn open(dir: &Path, size: u64) -> Result<Self, EngineError> {
        let refuse = |why: String| {
            EngineError::Config(format!("the disk KV tier at {}: {why}", dir.display()))
        };
        fs::create_dir_all(dir.join("tmp"))
            .map_err(|e| refuse(format!("cannot create it: {e}")))?;
        let probe = dir.join("tmp").join("probe");
        fs::write(&probe, b"ferrox").map_err(|e| refuse(format!("is not writable: {e}")))?;
        let _ = fs::remove_file(&probe);
        let room = total_bytes(dir).map_err(|e| refuse(format!("cannot read its size: {e}")))?;
        if size > room {
            return Err(refuse(format!(
                "a tier of {size} bytes is larger than its file system ({room} bytes)"
            )));
        }
        Ok(DiskStore {
            dir: dir.to_path_buf(),
        })
    }

    /// Removes the temporary files a killed writer left: those older than
    /// [`ABANDONED`] (a replica sharing the directory may be writing the
    /// newer ones).
    pub fn clean(&self) {
        let Ok(tmp) = fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        for e in tmp.flatten() {
            let age =
                (e.metadata().and_then(|m| m.modified())).map(|t| t.elapsed().unwrap_or_default());
            if age.is_ok_and(|a| a >= ABANDONED) {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Every block file the directory holds, oldest first.
    pub fn scan(&self) -> Vec<Found> {
        let mut found = Vec::new();
        let shards = fs::read_dir(&self.dir).into_iter().flatten().flatten();
        for shard in shards.filter(|s| s.file_name() != "tmp") {
            for file in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                let path = file.path();
                let hash = path
                    .extension()
                    .filter(|e| *e == EXT)
                    .and_then(|_| path.file_stem()?.to_str()?.parse().ok());
                let (Some(hash), Ok(meta)) = (hash, file.metadata()) else {
                    continue;
                };
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.push(Found {
                    hash,
                    bytes: meta.len(),
                    modified,
                });
            }
        }
        found.sort_by_key(|f| f.modified);
        found
    }

    fn path(&self, hash: &BlockHash) -> PathBuf {
        let name = hash.to_string();
        self.dir.join(&name[..2]).join(format!("{name}.{EXT}"))
    }
}

impl BlockStore for DiskStore {
    fn scan(&self) -> Vec<Found> {
        DiskStore::scan(self)
    }

    fn put(&self, hash: &BlockHash, bytes: &[u8]) -> std::io::Result<()> {
        let path = self.path(hash);
        if let Some(shard) = path.parent() {
            fs::create_dir_all(shard)?;
        }
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{hash}.{}", rand::random::<u32>()));
        let mut file = fs::File::create(&tmp)?;
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(hash.as_bytes());
        head.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        head.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        let written = file.write_all(&head).and_then(|()| file.write_all(bytes));
        drop(file);
        match written.and_then(|()| fs::rename(&tmp, &path)) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    fn get(&self, hash: &BlockHash) -> Result<Vec<u8>, Miss> {
        let data = match fs::read(self.path(hash)) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Miss::Corrupt("its file is gone".into()));
            }
            Err(e) => return Err(Miss::Corrupt(format!("cannot read its file: {e}"))),
        };
        check(hash, data)
    }

    fn delete(&self, hash: &BlockHash) {
        let _ = fs::remove_file(self.path(hash));
    }

    fn stored_bytes(&self, payload: usize) -> u64 {
        (HEADER + payload) as u64
    }
}

/// The payload of a block file's `data`, if it is `hash`'s, whole and
/// unchanged.
fn check(hash: &BlockHash, mut data: Vec<u8>) -> Result<Vec<u8>, Miss> {
    let bad = |why: &str| Err(Miss::Corrupt(why.to_string()));
    if data.len() < HEADER || &data[..8] != MAGIC {
        return bad("not a block file, or torn before its header");
    }
    if data[8..40] != hash.as_bytes()[..] {
        return bad("the file holds another block");
    }
    let len = u64::from_le_bytes(data[40..48].try_into().unwrap_or_default());
    if len != (data.len() - HEADER) as u64 {
        return bad("truncated, or longer than its header says");
    }
    let crc = u32::from_le_bytes(data[48..52].try_into().unwrap_or_default());
    if crc32fast::hash(&data[HEADER..]) != crc {
        return bad("its checksum does not match");
    }
    Ok(data.split_off(HEADER))
}

/// The size of the file system holding `dir`, in bytes.
fn total_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid C string and `s` room for one statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs filled it.
    let s = unsafe { s.assume_init() };
    Ok(s.f_blocks.saturating_mul(s.f_frsize))
}
