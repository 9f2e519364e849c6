//! Where the control plane lives: the home's SQLite file or a PostgreSQL
//! server (SPEC §19), and how its URL is shown (never its password).

/// Where the control plane lives.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `<home>/kernel.db` (the default: nothing to install for one host).
    Sqlite,
    /// A PostgreSQL 15+ server: its `postgres://` URL.
    Postgres(String),
}

impl StoreLocation {
    /// `sqlite` (or nothing), or a `postgres://`/`postgresql://` URL.
    pub fn parse(value: &str) -> Result<StoreLocation, String> {
        match value.trim() {
            "" | "sqlite" => Ok(StoreLocation::Sqlite),
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(StoreLocation::Postgres(url.to_owned()))
            }
            other => Err(format!(
                "OPKERNEL_STORE: {:?} is neither `sqlite` nor a postgres:// URL",
                redacted(other)
            )),
        }
    }

    /// What logs and errors may show: the URL without its password.
    pub fn shown(&self) -> String {
        match self {
            StoreLocation::Sqlite => "sqlite (the home's kernel.db)".to_owned(),
            StoreLocation::Postgres(url) => redacted(url),
        }
    }
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// A URL with its password hidden: between `:` and `@` after the scheme,
/// and a `password=` parameter.
fn redacted(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some(("password", _)) => "password=…".to_owned(),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => url.to_owned(),
    };
    hide_userinfo_password(&url)
}

fn hide_userinfo_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            let hidden = if userinfo.contains(':') { ":…" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_setting_is_sqlite_or_a_postgres_url_and_never_shows_a_password() {
        assert_eq!(StoreLocation::parse(""), Ok(StoreLocation::Sqlite));
        assert_eq!(StoreLocation::parse("sqlite"), Ok(StoreLocation::Sqlite));
        let pg = StoreLocation::parse("postgres://op:s3cret@db:5432/opk").unwrap();
        assert_eq!(
            pg,
            StoreLocation::Postgres("postgres://op:s3cret@db:5432/opk".into())
        );
        assert_eq!(pg.shown(), "postgres://op:…@db:5432/opk");
        assert!(!format!("{pg:?}").contains("s3cret"));
        let bad = StoreLocation::parse("mysql://u:pw@h/db").unwrap_err();
        assert!(
            bad.contains("OPKERNEL_STORE") && !bad.contains("pw"),
            "{bad}"
        );
    }
}
