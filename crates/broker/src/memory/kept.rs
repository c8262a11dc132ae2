//! The memory broker's tables and logs ([`crate::kept`]): in memory, and in files under the
//! directory it was given so that they outlive the process.
//!
//! - A table is `tables/<name>.jsonl`: one line per change, `["key", "value"]` for a put and
//!   `["key"]` for a removal, read back in order at start. When the file holds more than
//!   twice the live entries (and at least [`COMPACT_AT`] lines), it is rewritten with the live
//!   ones only (a temporary file renamed over it, so a crash leaves one or the other).
//! - A log is a directory `logs/<name>/` of parts, `<first cursor>.jsonl`, each holding up to
//!   [`PART_ENTRIES`] lines `<cursor>\t<entry>`. Whole parts leave when the log holds more
//!   than its `max_entries` without them, or when their newest entry is older than its
//!   `max_age_ms`: a log keeps up to one part more than asked. Only the parts' bounds are
//!   held in memory; a read loads the parts it crosses.
//!
//! Every change is written (unbuffered) before the call returns, so a process killed at any
//! moment keeps what was answered; the files are not synced to the disk on every change.
//! Without a directory the same structures live in memory only.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::kept::{valid_name, Cursor, LogEntry, LogKeep};
use crate::{now_ms, BrokerError};

/// Lines a table file holds at least before it is compacted.
const COMPACT_AT: usize = 1000;
/// Entries in one log part.
pub(crate) const PART_ENTRIES: usize = 10_000;

#[derive(Default)]
pub(crate) struct Kept {
    dir: Option<PathBuf>,
    tables: Mutex<HashMap<String, Table>>,
    logs: Mutex<HashMap<String, Log>>,
}

#[derive(Default)]
struct Table {
    live: BTreeMap<String, String>,
    /// Lines in the file (puts and removals).
    lines: usize,
    /// The file, open for appending once written (a put costs one write, not an open).
    file: Option<File>,
}

struct Part {
    first: Cursor,
    last: Cursor,
    count: usize,
    /// The entries, when there is no directory; else they are in the part's file.
    entries: Vec<(Cursor, String)>,
}

#[derive(Default)]
struct Log {
    /// Oldest first.
    parts: Vec<Part>,
    loaded: bool,
    /// The newest part's file, open for appending.
    open: Option<(Cursor, File)>,
}

fn io(what: &str, e: std::io::Error) -> BrokerError {
    BrokerError::Unavailable(format!("{what}: {e}"))
}

fn check_name(name: &str) -> Result<(), BrokerError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(BrokerError::Unavailable(format!("{name:?} cannot name a table or log")))
    }
}

impl Kept {
    pub(crate) fn in_dir(dir: PathBuf) -> Kept {
        Kept { dir: Some(dir), ..Kept::default() }
    }

    fn table_path(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("tables").join(format!("{name}.jsonl")))
    }

    fn log_dir(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("logs").join(name))
    }

    /// The table `name`, read from its file on first use.
    fn with_table<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Table) -> Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        check_name(name)?;
        let mut tables = self.tables.lock();
        if !tables.contains_key(name) {
            let mut t = Table::default();
            if let Some(path) = self.table_path(name) {
                match fs::read_to_string(&path) {
                    Ok(text) => t.replay(&text),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("reading a table", e)),
                }
            }
            tables.insert(name.to_string(), t);
        }
        f(tables.get_mut(name).expect("inserted above"))
    }

    pub(crate) fn table_put(&self, name: &str, key: &str, value: &str) -> Result<(), BrokerError> {
        let path = self.table_path(name);
        self.with_table(name, |t| {
            if let Some(path) = &path {
                t.write(path, &serde_json::json!([key, value]).to_string())?;
            }
            t.live.insert(key.to_string(), value.to_string());
            t.compact(path.as_deref())
        })
    }

    pub(crate) fn table_remove(&self, name: &str, key: &str) -> Result<(), BrokerError> {
        let path = self.table_path(name);
        self.with_table(name, |t| {
            if t.live.remove(key).is_none() {
                return Ok(());
            }
            if let Some(path) = &path {
                t.write(path, &serde_json::json!([key]).to_string())?;
            }
            t.compact(path.as_deref())
        })
    }

    pub(crate) fn table_all(&self, name: &str) -> Result<Vec<(String, String)>, BrokerError> {
        self.with_table(name, |t| Ok(t.live.iter().map(|(k, v)| (k.clone(), v.clone())).collect()))
    }

    /// The log `name`, its parts listed from its directory on first use.
    fn with_log<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Log, Option<&Path>) -> Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        check_name(name)?;
        let dir = self.log_dir(name);
        let mut logs = self.logs.lock();
        let log = logs.entry(name.to_string()).or_default();
        if !log.loaded {
            if let Some(dir) = &dir {
                log.parts = list_parts(dir)?;
            }
            log.loaded = true;
        }
        f(log, dir.as_deref())
    }

    pub(crate) fn log_append(&self, name: &str, entry: &str, keep: LogKeep) -> Result<String, BrokerError> {
        if entry.contains('\n') {
            return Err(BrokerError::Unavailable("a log entry is one line".into()));
        }
        self.with_log(name, |log, dir| {
            let now = now_ms();
            let cursor = log.parts.last().map_or(Cursor { ms: now, seq: 0 }, |p| p.last.next(now));
            if log.parts.last().is_none_or(|p| p.count >= PART_ENTRIES) {
                log.parts.push(Part { first: cursor, last: cursor, count: 0, entries: Vec::new() });
            }
            let part = log.parts.last_mut().expect("pushed above");
            match dir {
                Some(dir) => {
                    if log.open.as_ref().is_none_or(|(first, _)| *first != part.first) {
                        fs::create_dir_all(dir).map_err(|e| io("creating a log", e))?;
                        let path = dir.join(format!("{}.jsonl", part.first));
                        let f = OpenOptions::new().create(true).append(true).open(path);
                        log.open = Some((part.first, f.map_err(|e| io("opening a log part", e))?));
                    }
                    let (_, f) = log.open.as_mut().expect("opened above");
                    f.write_all(format!("{cursor}\t{entry}\n").as_bytes()).map_err(|e| io("writing a log", e))?;
                }
                None => part.entries.push((cursor, entry.to_string())),
            }
            part.last = cursor;
            part.count += 1;
            log.trim(dir, keep, now);
            Ok(cursor.to_string())
        })
    }

    /// Up to `count` entries older than `before` (all: `None`), newest first.
    pub(crate) fn log_read(
        &self,
        name: &str,
        before: Option<&str>,
        count: usize,
    ) -> Result<Vec<LogEntry>, BrokerError> {
        let before = match before {
            Some(b) => Some(Cursor::parse(b).ok_or_else(|| BrokerError::BadCursor(b.to_string()))?),
            None => None,
        };
        self.with_log(name, |log, dir| {
            let mut out = Vec::new();
            for part in log.parts.iter().rev() {
                if out.len() >= count {
                    break;
                }
                if before.is_some_and(|b| part.first >= b) {
                    continue;
                }
                let entries = match dir {
                    Some(dir) => read_part(&dir.join(format!("{}.jsonl", part.first)))?,
                    None => part.entries.clone(),
                };
                for (c, e) in entries.into_iter().rev() {
                    if out.len() >= count {
                        break;
                    }
                    if before.is_none_or(|b| c < b) {
                        out.push(LogEntry { cursor: c.to_string(), entry: e });
                    }
                }
            }
            Ok(out)
        })
    }
}

impl Table {
    fn replay(&mut self, text: &str) {
        for line in text.lines() {
            // A line cut by a crash (the last one) is skipped.
            match serde_json::from_str::<Vec<String>>(line).as_deref() {
                Ok([k, v]) => {
                    self.live.insert(k.clone(), v.clone());
                }
                Ok([k]) => {
                    self.live.remove(k);
                }
                _ => continue,
            }
            self.lines += 1;
        }
    }

    /// Appends one change's line to the file at `path`.
    fn write(&mut self, path: &Path, line: &str) -> Result<(), BrokerError> {
        if self.file.is_none() {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| io("creating the store directory", e))?;
            }
            let f = OpenOptions::new().create(true).append(true).open(path);
            self.file = Some(f.map_err(|e| io("opening a store file", e))?);
        }
        let f = self.file.as_mut().expect("opened above");
        f.write_all(format!("{line}\n").as_bytes()).map_err(|e| io("writing a store file", e))?;
        self.lines += 1;
        Ok(())
    }

    fn compact(&mut self, path: Option<&Path>) -> Result<(), BrokerError> {
        let Some(path) = path else { return Ok(()) };
        if self.lines < COMPACT_AT || self.lines <= 2 * self.live.len() {
            return Ok(());
        }
        let tmp = path.with_extension("jsonl.tmp");
        let mut text = String::new();
        for (k, v) in &self.live {
            text.push_str(&serde_json::json!([k, v]).to_string());
            text.push('\n');
        }
        let mut f = File::create(&tmp).map_err(|e| io("compacting a table", e))?;
        f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| io("compacting a table", e))?;
        fs::rename(&tmp, path).map_err(|e| io("compacting a table", e))?;
        // The open file is the replaced one: the next write opens the new.
        self.file = None;
        self.lines = self.live.len();
        Ok(())
    }
}

impl Log {
    /// Drops whole parts, oldest first, past the log's bounds; the newest part stays.
    fn trim(&mut self, dir: Option<&Path>, keep: LogKeep, now: u64) {
        let mut total: usize = self.parts.iter().map(|p| p.count).sum();
        while self.parts.len() > 1 {
            let oldest = &self.parts[0];
            let too_many = total - oldest.count >= keep.max_entries;
            let too_old = keep.max_age_ms > 0 && oldest.last.ms < now.saturating_sub(keep.max_age_ms);
            if !too_many && !too_old {
                break;
            }
            if let Some(dir) = dir {
                let _ = fs::remove_file(dir.join(format!("{}.jsonl", oldest.first)));
            }
            total -= oldest.count;
            self.parts.remove(0);
        }
    }
}

fn read_part(path: &Path) -> Result<Vec<(Cursor, String)>, BrokerError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("reading a log part", e)),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let (c, e) = line.split_once('\t')?;
            Some((Cursor::parse(c)?, e.to_string()))
        })
        .collect())
}

/// The parts in `dir`, oldest first, with their bounds read from their files.
fn list_parts(dir: &Path) -> Result<Vec<Part>, BrokerError> {
    let names = match fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("listing a log", e)),
    };
    let mut parts = Vec::new();
    for name in names {
        let Some(first) = name.strip_suffix(".jsonl").and_then(Cursor::parse) else { continue };
        let entries = read_part(&dir.join(&name))?;
        let Some(last) = entries.last().map(|(c, _)| *c) else { continue };
        parts.push(Part { first, last, count: entries.len(), entries: Vec::new() });
    }
    parts.sort_by_key(|p| p.first);
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sb-kept-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn kept_tables_outlive_the_process_and_compact() {
        let d = dir("table");
        let k = Kept::in_dir(d.clone());
        for i in 0..3000 {
            k.table_put("states", &format!("a{}", i % 10), &format!("v{i}")).unwrap();
        }
        k.table_remove("states", "a0").unwrap();
        let lines = fs::read_to_string(d.join("tables/states.jsonl")).unwrap().lines().count();
        assert!(lines < 1100, "compacted: {lines} lines");
        let again = Kept::in_dir(d.clone());
        let all = again.table_all("states").unwrap();
        assert_eq!(all.len(), 9);
        assert_eq!(all[0], ("a1".to_string(), "v2991".to_string()));
        assert!(k.table_put("../x", "a", "b").is_err());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn kept_logs_read_newest_first_by_cursor_and_drop_whole_old_parts() {
        let d = dir("log");
        let keep = LogKeep { max_entries: 15_000, max_age_ms: 0 };
        for k in [Kept::in_dir(d.clone()), Kept::default()] {
            let mut cursors = Vec::new();
            for i in 0..25_000 {
                cursors.push(k.log_append("journal", &format!("{{\"i\":{i}}}"), keep).unwrap());
            }
            let newest = k.log_read("journal", None, 3).unwrap();
            assert_eq!(
                newest.iter().map(|e| e.entry.as_str()).collect::<Vec<_>>(),
                ["{\"i\":24999}", "{\"i\":24998}", "{\"i\":24997}"]
            );
            let page = k.log_read("journal", Some(&cursors[20_000]), 2).unwrap();
            assert_eq!(page[0].entry, "{\"i\":19999}");
            assert_eq!(page[0].cursor, cursors[19_999]);
            let all = k.log_read("journal", None, usize::MAX).unwrap();
            assert!((15_000..25_000).contains(&all.len()), "whole parts left: {}", all.len());
            assert_eq!(all.last().unwrap().entry, "{\"i\":10000}");
        }
        let again = Kept::in_dir(d.clone());
        assert_eq!(again.log_read("journal", None, 1).unwrap()[0].entry, "{\"i\":24999}");
        let c = again.log_append("journal", "{}", keep).unwrap();
        assert!(Cursor::parse(&c) > Cursor::parse(&again.log_read("journal", None, 2).unwrap()[1].cursor));
        assert!(matches!(again.log_read("journal", Some("nope"), 1), Err(BrokerError::BadCursor(_))));
        fs::remove_dir_all(d).unwrap();
    }
}
