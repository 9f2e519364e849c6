//! The files API's resolution, as root over a plain directory standing for
//! a container's root: each planted link stays inside, `.ops` is never
//! entered, and archives and copies round-trip.

use std::io::Read;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::*;

const ROOT: crate::RunUser = crate::RunUser { uid: 0, gid: 0 };

/// `<tmp>/outside` (a file of the host that must never be reached) and
/// `<tmp>/root` with `scratch/` and `scratch/.ops/secret`.
fn world() -> (PathBuf, View) {
    let dir = std::env::temp_dir().join(format!("opk-files-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("root/scratch/.ops")).unwrap();
    std::fs::create_dir_all(dir.join("root/etc")).unwrap();
    std::fs::write(dir.join("outside"), "host secret").unwrap();
    std::fs::write(dir.join("root/scratch/.ops/secret"), "ops").unwrap();
    std::fs::write(dir.join("root/etc/passwd"), "root:x:0:0").unwrap();
    let view = View::open_root(
        &dir.join("root").display().to_string(),
        &dir.join("root/scratch/.ops"),
        ROOT,
    )
    .unwrap();
    (dir, view)
}

fn read_all(view: &View, path: &str) -> FileResult<String> {
    let mut s = String::new();
    read(view, path)?.file.read_to_string(&mut s).unwrap();
    Ok(s)
}

#[test]
fn planted_links_never_leave_the_view_nor_enter_ops() {
    let (dir, view) = world();
    let host_outside = dir.join("outside").display().to_string();
    let s = dir.join("root/scratch");
    symlink(&host_outside, s.join("to_host")).unwrap();
    symlink("../../../../../../../../outside", s.join("climb")).unwrap();
    symlink("/etc/passwd", s.join("abs")).unwrap();
    symlink("/scratch/.ops", s.join("to_ops")).unwrap();
    symlink(".ops/secret", s.join("to_secret")).unwrap();
    symlink("loop_b", s.join("loop_a")).unwrap();
    symlink("loop_a", s.join("loop_b")).unwrap();
    // the host path means nothing in the view; climbing stops at its root
    assert!(matches!(
        read_all(&view, "scratch/to_host"),
        Err(FileError::NotFound(_))
    ));
    assert!(matches!(
        read_all(&view, "scratch/climb"),
        Err(FileError::NotFound(_))
    ));
    assert!(matches!(
        read_all(&view, "/../../outside"),
        Err(FileError::NotFound(_))
    ));
    // an absolute link resolves from the view's root
    assert_eq!(read_all(&view, "scratch/abs").unwrap(), "root:x:0:0");
    for p in [
        "scratch/.ops/secret",
        "scratch/to_ops/secret",
        "scratch/to_secret",
        "/scratch/../scratch/./.ops/secret",
    ] {
        assert!(
            matches!(read_all(&view, p), Err(FileError::Refused(_))),
            "{p}"
        );
    }
    assert!(matches!(
        read_all(&view, "scratch/loop_a"),
        Err(FileError::Refused(_))
    ));
    // writes through links land inside the view, never on the host
    write(&view, "scratch/to_host", 0o644, &mut "x".as_bytes(), 10).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("outside")).unwrap(),
        "host secret"
    );
    assert!(dir
        .join("root")
        .join(host_outside.trim_start_matches('/'))
        .exists());
    assert!(matches!(
        write(&view, "scratch/to_ops/new", 0o644, &mut "x".as_bytes(), 10),
        Err(FileError::Refused(_))
    ));
    assert!(matches!(
        remove(&view, "scratch/.ops", true),
        Err(FileError::Refused(_))
    ));
    assert!(dir.join("root/scratch/.ops/secret").exists());
    // a listing leaves .ops out
    let names: Vec<String> = list(&view, "scratch/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(!names.contains(&".ops".to_owned()), "{names:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn writes_are_whole_bounded_and_keep_the_mode() {
    let (dir, view) = world();
    let n = write(
        &view,
        "scratch/a/b/c.txt",
        0o640,
        &mut "hello".as_bytes(),
        5,
    )
    .unwrap();
    assert_eq!(n, 5);
    let meta = std::fs::metadata(dir.join("root/scratch/a/b/c.txt")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    let big = [7u8; 100];
    assert!(matches!(
        write(&view, "scratch/a/b/c.txt", 0o644, &mut &big[..], 50),
        Err(FileError::TooLarge(50))
    ));
    // the failed write left the old file and no temporary one
    assert_eq!(read_all(&view, "scratch/a/b/c.txt").unwrap(), "hello");
    assert_eq!(list(&view, "scratch/a/b").unwrap().len(), 1);
    assert!(matches!(
        remove(&view, "scratch/a", false),
        Err(FileError::NotEmpty(_))
    ));
    remove(&view, "scratch/a", true).unwrap();
    assert!(!dir.join("root/scratch/a").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

fn tree_of(path: &Path) -> Vec<(String, String, u32, String)> {
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(path).unwrap().display().to_string();
            let (kind, body) = if meta.file_type().is_symlink() {
                (
                    "link",
                    std::fs::read_link(&p).unwrap().display().to_string(),
                )
            } else if meta.is_dir() {
                stack.push(p.clone());
                ("dir", String::new())
            } else {
                ("file", std::fs::read_to_string(&p).unwrap())
            };
            out.push((rel, kind.to_owned(), meta.mode() & 0o7777, body));
        }
    }
    out.sort();
    out
}

#[test]
fn archives_and_copies_round_trip_links_modes_and_empty_dirs() {
    let (dir, view) = world();
    let src = dir.join("root/scratch/src");
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        src.join("sub/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(src.join("a.txt"), "a").unwrap();
    std::fs::set_permissions(src.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink("sub/run.sh", src.join("link")).unwrap();
    symlink("/etc/passwd", src.join("abs")).unwrap();
    let mut tar = Vec::new();
    pack(&view, "scratch/src", &mut tar).unwrap();
    let done = unpack(&view, "scratch/dst", &mut &tar[..], 1 << 20).unwrap();
    assert_eq!(done.bytes, 11);
    assert_eq!(tree_of(&src), tree_of(&dir.join("root/scratch/dst")));
    // a copy of the scratch leaves .ops out and keeps the rest
    let copy = dir.join("copy");
    let copied = copy_tree(&dir.join("root/scratch"), &copy).unwrap();
    assert!(!copy.join(".ops").exists());
    assert_eq!(tree_of(&src), tree_of(&copy.join("src")));
    assert_eq!(copied.bytes, 22);
    // bounded: a byte budget refuses before content past it is written,
    // a deadline that has passed stops the copy
    let over = |max_bytes, deadline| {
        let to = dir.join(format!("bounded-{}", uuid::Uuid::new_v4().simple()));
        let bounds = CopyBounds {
            deadline,
            max_bytes,
        };
        copy_tree_within(&dir.join("root/scratch"), &to, bounds).map_err(|e| e.kind())
    };
    assert_eq!(
        over(Some(21), None).err(),
        Some(std::io::ErrorKind::FileTooLarge)
    );
    assert_eq!(over(Some(22), None).map(|c| c.bytes), Ok(22));
    let past = Some(std::time::Instant::now());
    assert_eq!(over(None, past).err(), Some(std::io::ErrorKind::TimedOut));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn archive_entries_that_climb_are_refused_by_name() {
    let (dir, view) = world();
    for bad in ["../x", "/abs", "a/../../x"] {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        // the header's raw name: the builder's own checks are skipped
        h.as_old_mut().name[..bad.len()].copy_from_slice(bad.as_bytes());
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        match unpack(&view, "scratch/in", &mut &tar[..], 100) {
            Err(FileError::Invalid(m)) => assert!(m.contains(bad), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(!dir.join("x").exists() && !dir.join("root/x").exists());
    std::fs::remove_dir_all(dir).unwrap();
}
