//! Tokens: the operator token (created at first start, mode 0600) acts on
//! everything; a run token acts on its own run alone. Tokens are compared in
//! constant time and stored only as sha256.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator token: may act on every run.
    Operator,
    /// A run token: acts for this run (and, where the API allows, its
    /// descendants).
    Run(String),
}

impl Principal {
    /// Whether the caller may act on `run_id` itself: the operator always, a
    /// run token only on its own run.
    pub fn may_act_on(&self, run_id: &str) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Run(own) => own == run_id,
        }
    }
}

/// A fresh 256-bit token, hex encoded.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Hex sha256 of a token: the only form a token is stored in.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Constant-time equality of two byte strings (length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads `<home>/operator.token`, creating it (mode 0600) on first start.
pub fn load_or_create_operator_token(home: &Path) -> std::io::Result<String> {
    let path = home.join("operator.token");
    match std::fs::read_to_string(&path) {
        Ok(token) if token.trim().len() >= 64 => return Ok(token.trim().to_owned()),
        Ok(_) => {
            return Err(std::io::Error::other(format!(
                "{} is too short to be an operator token; remove it to get a new one",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = new_token();
    let tmp = home.join("operator.token.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn operator_token_is_created_once_with_mode_0600() {
        let home = std::env::temp_dir().join(format!("opk-auth-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&home).unwrap();
        let a = load_or_create_operator_token(&home).unwrap();
        let b = load_or_create_operator_token(&home).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        let mode = std::fs::metadata(home.join("operator.token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn comparison_and_scope() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(Principal::Operator.may_act_on("x"));
        assert!(Principal::Run("x".into()).may_act_on("x"));
        assert!(!Principal::Run("x".into()).may_act_on("y"));
        assert_ne!(new_token(), new_token());
    }
}
