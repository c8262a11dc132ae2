//! The users file for Basic authentication: one `name:<argon2 PHC string>` per line, written by
//! `switchboard user add NAME`. Blank lines and lines starting with `#` are ignored.
//!
//! Verification costs one Argon2id computation (tens of milliseconds by design), so callers
//! run it on a blocking thread, and the per-address handshake rate bounds how much of it a
//! client can ask for. Unknown users cost the same as wrong passwords (a dummy hash is
//! verified), so response times do not reveal which names exist.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// Longest user name.
pub const MAX_NAME_LEN: usize = 64;

/// The loaded users file: name → PHC hash string.
pub struct Users {
    hashes: HashMap<String, String>,
    /// Verified for unknown names, so they take as long as known ones.
    dummy: String,
}

/// Whether `name` may be a user name: 1–64 bytes of `[A-Za-z0-9_.@-]`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
}

impl Users {
    /// Reads and checks a users file; `Err` says which line is wrong (never a hash).
    pub fn load(path: &Path) -> Result<Users, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut hashes = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, hash) =
                line.split_once(':').ok_or_else(|| format!("{} line {}: expected NAME:HASH", path.display(), n + 1))?;
            if !valid_name(name) {
                return Err(format!("{} line {}: invalid user name", path.display(), n + 1));
            }
            PasswordHash::new(hash)
                .map_err(|_| format!("{} line {}: not an argon2 PHC hash", path.display(), n + 1))?;
            if hashes.insert(name.to_string(), hash.to_string()).is_some() {
                return Err(format!("{} line {}: user {name} appears twice", path.display(), n + 1));
            }
        }
        let dummy = hash_password("not a password").map_err(|e| format!("argon2: {e}"))?;
        Ok(Users { hashes, dummy })
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Checks a password. Slow on purpose: call it from a blocking thread.
    pub fn verify(&self, name: &str, password: &str) -> bool {
        let (hash, known) = match self.hashes.get(name) {
            Some(h) => (h.as_str(), true),
            None => (self.dummy.as_str(), false),
        };
        let ok = match PasswordHash::new(hash) {
            Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
            Err(_) => false,
        };
        ok && known
    }
}

/// Hashes a password with Argon2id (default parameters: 19 MiB, 2 passes) and a random salt.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default().hash_password(password.as_bytes(), &salt)?.to_string())
}

/// Adds or replaces a user in the users file (created if missing), keeping every other line.
/// The file is written to a temporary file and renamed into place, readable by the owner only.
/// Returns whether the user existed before.
pub fn add_user(path: &Path, name: &str, password: &str) -> Result<bool, String> {
    if !valid_name(name) {
        return Err(format!("user name {name:?} is invalid: use 1-64 of A-Z a-z 0-9 _ . @ -"));
    }
    if password.is_empty() {
        return Err("the password is empty".into());
    }
    let hash = hash_password(password).map_err(|e| format!("argon2: {e}"))?;
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut existed = false;
    let mut out = String::with_capacity(old.len() + 128);
    for line in old.lines() {
        if line.trim().split_once(':').is_some_and(|(n, _)| n == name) {
            existed = true;
            out.push_str(&format!("{name}:{hash}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !existed {
        if old.is_empty() {
            out.push_str("# Switchboard users: NAME:ARGON2-HASH, written by `switchboard user add NAME`.\n");
        }
        out.push_str(&format!("{name}:{hash}\n"));
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|f| f.to_str()).unwrap_or("users"),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(out.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })?;
    Ok(existed)
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Users({} entries)", self.hashes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_users_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("sbusers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("users");
        let _ = std::fs::remove_file(&path);
        assert!(!add_user(&path, "alice", "wonderland").unwrap());
        assert!(!add_user(&path, "bob", "builder").unwrap());
        assert!(add_user(&path, "alice", "changed").unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("changed") && !text.contains("builder"), "passwords are never stored");
        let users = Users::load(&path).unwrap();
        assert_eq!(users.len(), 2);
        assert!(users.verify("alice", "changed"));
        assert!(!users.verify("alice", "wonderland"));
        assert!(users.verify("bob", "builder"));
        assert!(!users.verify("carol", "builder"));
        assert!(add_user(&path, "bad name", "x").is_err());
        std::fs::write(&path, "alice:not-a-hash\n").unwrap();
        assert!(Users::load(&path).unwrap_err().contains("line 1"));
    }
}
