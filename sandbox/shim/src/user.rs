//! Who an op's command runs as: `OPKERNEL_RUN_AS` is `uid:gid` (default
//! `1000:1000`, whether or not the image has such a user), a bare `uid`
//! (gid the same), a user name looked up in the image's `/etc/passwd`, or
//! the explicit word `root`. No other spelling reaches uid or gid 0: the
//! drop to an unprivileged user is never turned off by accident.

/// The run-as setting, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    /// Run commands as root (only the explicit word `root`): the command can
    /// then forge its own result.
    Root,
    /// A numeric `uid:gid` (or a bare uid, the gid the same); never 0.
    Ids(RunUser),
    /// A user name, looked up in the image's `/etc/passwd` at launch.
    Name(String),
}

/// A numeric identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunUser {
    /// The user id the command runs as.
    pub uid: u32,
    /// The group id (supplementary groups are cleared).
    pub gid: u32,
}

impl RunUser {
    /// uid 0, gid 0.
    pub const ROOT: RunUser = RunUser { uid: 0, gid: 0 };
}

fn unprivileged(user: RunUser, said: &str) -> Result<RunUser, String> {
    if user.uid == 0 || user.gid == 0 {
        Err(format!(
            "run-as {said:?} is uid {} gid {}: say `root` to run commands as root",
            user.uid, user.gid
        ))
    } else {
        Ok(user)
    }
}

impl RunAs {
    /// Parses `OPKERNEL_RUN_AS`: `root`, `uid:gid`, a bare uid or a user name;
    /// uid or gid 0 only by `root`.
    pub fn parse(spec: &str) -> Result<RunAs, String> {
        if spec == "root" {
            return Ok(RunAs::Root);
        }
        let number = |s: &str| -> Option<u32> {
            (!s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let ids = match spec.split_once(':') {
            Some((u, g)) => number(u).zip(number(g)),
            None => number(spec).map(|u| (u, u)),
        };
        if let Some((uid, gid)) = ids {
            return unprivileged(RunUser { uid, gid }, spec).map(RunAs::Ids);
        }
        let name_ok = !spec.is_empty()
            && spec.len() <= 32
            && !spec.starts_with('-')
            && spec
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if name_ok {
            Ok(RunAs::Name(spec.to_owned()))
        } else {
            Err(format!(
                "run-as {spec:?} is neither uid:gid, a user name nor `root`"
            ))
        }
    }

    /// The spelling [`RunAs::parse`] reads back.
    pub fn spec(&self) -> String {
        match self {
            RunAs::Root => "root".to_owned(),
            RunAs::Ids(u) => format!("{}:{}", u.uid, u.gid),
            RunAs::Name(n) => n.clone(),
        }
    }

    /// The numeric identity; a name is looked up in `passwd` (the image's
    /// `/etc/passwd`, `None` when it has none). A name that maps to uid or
    /// gid 0 is refused like `0:0` is.
    pub fn resolve(&self, passwd: Option<&str>) -> Result<RunUser, String> {
        match self {
            RunAs::Root => Ok(RunUser::ROOT),
            RunAs::Ids(user) => Ok(*user),
            RunAs::Name(name) => {
                let passwd = passwd.ok_or_else(|| {
                    format!("the image has no /etc/passwd to look up user {name:?} in")
                })?;
                let user = passwd_lookup(passwd, name)
                    .ok_or_else(|| format!("the image's /etc/passwd has no user {name:?}"))?;
                unprivileged(user, name)
            }
        }
    }
}

/// uid and gid of `user` in `/etc/passwd` text.
pub fn passwd_lookup(passwd: &str, user: &str) -> Option<RunUser> {
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != user {
            return None;
        }
        let _password = f.next()?;
        Some(RunUser {
            uid: f.next()?.parse().ok()?,
            gid: f.next()?.parse().ok()?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_as_spellings() {
        let ids = |uid, gid| Ok(RunAs::Ids(RunUser { uid, gid }));
        assert_eq!(RunAs::parse("1000:1000"), ids(1000, 1000));
        assert_eq!(RunAs::parse("1000:50"), ids(1000, 50));
        assert_eq!(RunAs::parse("1001"), ids(1001, 1001));
        assert_eq!(RunAs::parse("root"), Ok(RunAs::Root));
        assert_eq!(RunAs::parse("agent"), Ok(RunAs::Name("agent".into())));
        for bad in [
            "0:0", "0", "1000:0", "0:1000", "", "a b", "-x", "1:2:3", ":1", "a;b",
        ] {
            assert!(RunAs::parse(bad).is_err(), "{bad:?}");
        }
        for spec in ["root", "12:34", "agent"] {
            assert_eq!(RunAs::parse(spec).map(|r| r.spec()), Ok(spec.to_owned()));
        }
    }

    #[test]
    fn names_resolve_in_passwd_and_never_to_root() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1001::/scratch:/bin/sh\n\
                      toor:x:0:5::/:/bin/sh\nbad:x:zz:1::/:/bin/sh\n";
        let name = |n: &str| RunAs::Name(n.into());
        assert_eq!(
            name("agent").resolve(Some(passwd)),
            Ok(RunUser {
                uid: 1000,
                gid: 1001
            })
        );
        assert!(name("toor").resolve(Some(passwd)).is_err());
        assert!(name("bad").resolve(Some(passwd)).is_err());
        assert!(name("age").resolve(Some(passwd)).is_err());
        assert!(name("agent").resolve(None).is_err());
        assert_eq!(RunAs::Root.resolve(None), Ok(RunUser::ROOT));
    }
}
