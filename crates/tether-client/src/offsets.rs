//! The offset file: committed positions per channel that survive a client process restart
//! (docs/protocol.md, the reference client).
//!
//! Format: one JSON object mapping channel → position,
//! `{"news":{"seq":42,"epoch":"9f3c…"},"prices.eur":{"seq":7}}`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A resume point: the last seq the application processed and recorded on a channel, and the
/// channel epoch it belongs to (`None` when the server never told us, e.g. a user-given
/// `--from`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Last processed seq; sent as `from`.
    pub seq: u64,
    /// Epoch of that seq; sent back unchanged as `epoch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

/// A JSON offset file written atomically: a reader (or a restart after a crash or power loss)
/// sees either the previous complete file or the new complete file, never a mix.
#[derive(Debug, Clone)]
pub struct OffsetStore {
    path: PathBuf,
}

impl OffsetStore {
    /// A store at `path`; nothing is read or created until [`load`](Self::load) or
    /// [`save`](Self::save).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads all positions. A missing or empty file is an empty map.
    ///
    /// # Errors
    /// `io::ErrorKind::InvalidData` when the file is not the JSON map described above; other
    /// I/O errors as returned by the OS.
    pub fn load(&self) -> io::Result<BTreeMap<String, Position>> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(e),
        };
        if text.trim().is_empty() {
            return Ok(BTreeMap::new());
        }
        serde_json::from_str(&text).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("offset file {}: {e}", self.path.display()))
        })
    }

    /// Replaces the file with `positions`: write a temporary file in the same directory,
    /// fsync it, rename it over the file, then fsync the directory so the rename itself is
    /// durable. Blocking: call it from `spawn_blocking` in async code.
    ///
    /// # Errors
    /// Any I/O error; the previous file is then left intact.
    pub fn save(&self, positions: &BTreeMap<String, Position>) -> io::Result<()> {
        let json = serde_json::to_vec(positions).map_err(io::Error::other)?;
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset file path has no file name"))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        let written = (|| {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        File::open(&dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tether-offsets-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::create_dir_all(&dir).expect("create temp dir");
        dir
    }

    #[test]
    fn round_trip() {
        let dir = temp_dir("round");
        let store = OffsetStore::new(dir.join("offsets.json"));
        assert!(store.load().expect("missing file").is_empty());
        let mut map = BTreeMap::new();
        map.insert("news".to_string(), Position { seq: 42, epoch: Some("e1".into()) });
        map.insert("prices.eur".to_string(), Position { seq: 0, epoch: None });
        store.save(&map).expect("save");
        assert_eq!(store.load().expect("load"), map);
        let text = fs::read_to_string(store.path()).expect("read");
        assert_eq!(text, r#"{"news":{"seq":42,"epoch":"e1"},"prices.eur":{"seq":0}}"#);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn save_replaces_and_leaves_no_temp_file() {
        let dir = temp_dir("replace");
        let store = OffsetStore::new(dir.join("o.json"));
        let mut map = BTreeMap::new();
        for seq in 1..=20 {
            map.insert("a".to_string(), Position { seq, epoch: Some("e".into()) });
            store.save(&map).expect("save");
        }
        assert_eq!(store.load().expect("load")["a"].seq, 20);
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        assert_eq!(names, vec!["o.json".to_string()]);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn failed_save_keeps_previous_file() {
        let dir = temp_dir("fail");
        let store = OffsetStore::new(dir.join("o.json"));
        let mut map = BTreeMap::new();
        map.insert("a".to_string(), Position { seq: 1, epoch: None });
        store.save(&map).expect("save");
        // A directory where the temporary file must go makes the write fail.
        fs::create_dir(dir.join(format!(".o.json.tmp.{}", std::process::id()))).expect("mkdir");
        map.insert("a".to_string(), Position { seq: 2, epoch: None });
        assert!(store.save(&map).is_err());
        assert_eq!(store.load().expect("load")["a"].seq, 1);
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn corrupt_file_is_invalid_data() {
        let dir = temp_dir("corrupt");
        let path = dir.join("o.json");
        fs::write(&path, "{\"a\":").expect("write");
        let err = OffsetStore::new(&path).load().expect_err("corrupt");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        fs::write(&path, "  \n").expect("write");
        assert!(OffsetStore::new(&path).load().expect("blank").is_empty());
        fs::remove_dir_all(dir).ok();
    }
}
