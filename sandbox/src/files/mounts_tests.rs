//! The mapped view (gVisor's, SPEC §30) over plain directories: a root
//! file system read but never written, a bind mount at `/scratch` written
//! where the container sees it, a mount inside the sandbox refused by
//! name, and links that cross between them resolved in the container's
//! terms.

use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use crate::files::*;

const ROOT: crate::RunUser = crate::RunUser { uid: 0, gid: 0 };

/// `<tmp>/rootfs` (with `etc/motd`, an empty `scratch/` where the bind
/// mount goes and a `tmp/` under the sandbox's own file system) and
/// `<tmp>/host-scratch` (with `.ops/secret`), mounted at `/scratch`.
fn mapped() -> (PathBuf, View) {
    let dir = std::env::temp_dir().join(format!("opk-mapped-{}", uuid::Uuid::new_v4().simple()));
    for d in [
        "rootfs/etc",
        "rootfs/scratch",
        "rootfs/tmp",
        "host-scratch/.ops",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::write(dir.join("rootfs/etc/motd"), "hello").unwrap();
    std::fs::write(dir.join("rootfs/tmp/stale"), "the host's copy").unwrap();
    std::fs::write(dir.join("host-scratch/.ops/secret"), "ops").unwrap();
    let root = Root::Mapped {
        rootfs: dir.join("rootfs"),
        mounts: vec![
            Mount {
                at: "/tmp".into(),
                reach: Reach::Unreachable("/tmp is inside the sandbox".into()),
            },
            Mount {
                at: "/scratch".into(),
                reach: Reach::Host {
                    dir: dir.join("host-scratch"),
                    writable: true,
                },
            },
            Mount {
                at: "/scratch/.ops".into(),
                reach: Reach::Host {
                    dir: dir.join("host-scratch/.ops"),
                    writable: true,
                },
            },
        ],
    };
    let view = View::open(&root, &dir.join("host-scratch/.ops"), ROOT).unwrap();
    (dir, view)
}

fn read_all(view: &View, path: &str) -> FileResult<String> {
    let mut s = String::new();
    read(view, path)?.file.read_to_string(&mut s).unwrap();
    Ok(s)
}

fn put(view: &View, path: &str, text: &str) -> FileResult<u64> {
    write(view, path, 0o644, &mut text.as_bytes(), 1 << 20)
}

#[test]
fn writes_land_in_the_mount_and_never_in_the_root_file_system() {
    let (dir, view) = mapped();
    assert_eq!(put(&view, "/scratch/a/b.txt", "x").unwrap(), 1);
    let host = dir.join("host-scratch/a/b.txt");
    assert_eq!(std::fs::read_to_string(host).unwrap(), "x");
    assert!(!dir.join("rootfs/scratch/a").exists());
    assert_eq!(read_all(&view, "scratch/a/b.txt").unwrap(), "x");
    // the root file system is read, never written (nor its parents made)
    assert_eq!(read_all(&view, "/etc/motd").unwrap(), "hello");
    let denied = put(&view, "/etc/motd", "changed").unwrap_err();
    assert!(
        matches!(denied, FileError::Denied(ref m) if m.contains("/scratch")),
        "{denied}"
    );
    assert!(matches!(
        put(&view, "/work/new/f", "y"),
        Err(FileError::Denied(_))
    ));
    assert!(!dir.join("rootfs/work").exists());
    assert!(matches!(
        remove(&view, "/etc/motd", false),
        Err(FileError::Denied(_))
    ));
    assert_eq!(
        std::fs::read_to_string(dir.join("rootfs/etc/motd")).unwrap(),
        "hello"
    );
    // listing the mount lists the host directory, not the empty stub
    let names: Vec<String> = list(&view, "/scratch/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unreachable_mounts_and_ops_are_refused_by_name() {
    let (dir, view) = mapped();
    let e = read_all(&view, "/tmp/stale").unwrap_err();
    assert!(
        matches!(e, FileError::Refused(ref m) if m.contains("inside the sandbox")),
        "{e}"
    );
    assert!(matches!(
        put(&view, "/tmp/x", "y"),
        Err(FileError::Refused(_))
    ));
    assert!(matches!(list(&view, "/tmp/"), Err(FileError::Refused(_))));
    assert!(matches!(
        read_all(&view, "/scratch/.ops/secret"),
        Err(FileError::Refused(_))
    ));
    symlink("/scratch/.ops", dir.join("host-scratch/to_ops")).unwrap();
    assert!(matches!(
        read_all(&view, "/scratch/to_ops/secret"),
        Err(FileError::Refused(_))
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn links_cross_between_the_mount_and_the_root_in_the_containers_terms() {
    let (dir, view) = mapped();
    // a link in the mount to the root file system reads it, never writes it
    symlink("/etc", dir.join("host-scratch/etc")).unwrap();
    assert_eq!(read_all(&view, "/scratch/etc/motd").unwrap(), "hello");
    assert!(matches!(
        put(&view, "/scratch/etc/new", "y"),
        Err(FileError::Denied(_))
    ));
    // a link in the root file system into the mount writes the mount
    symlink("/scratch", dir.join("rootfs/work")).unwrap();
    put(&view, "/work/w.txt", "w").unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("host-scratch/w.txt")).unwrap(),
        "w"
    );
    // `..` out of the mount is the root file system's directory
    assert_eq!(read_all(&view, "/scratch/../etc/motd").unwrap(), "hello");
    assert!(matches!(
        read_all(&view, "/scratch/../../../tmp/stale"),
        Err(FileError::Refused(_))
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_archive_of_the_root_holds_the_mount_and_leaves_out_what_it_cannot_reach() {
    let (dir, view) = mapped();
    put(&view, "/scratch/in-mount.txt", "m").unwrap();
    let mut tar = Vec::new();
    pack(&view, "/", &mut tar).unwrap();
    let mut names: Vec<String> = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["etc/", "etc/motd", "scratch/", "scratch/in-mount.txt"]
    );
    // unpacking into the root file system is refused; into the mount works
    let refused = unpack(&view, "/etc/unpacked", &mut tar.as_slice(), 1 << 20);
    assert!(matches!(refused, Err(FileError::Denied(_))));
    assert!(!dir.join("rootfs/etc/unpacked").exists());
    unpack(&view, "/scratch/copy", &mut tar.as_slice(), 1 << 20).unwrap();
    assert!(dir.join("host-scratch/copy/etc/motd").exists());
    std::fs::remove_dir_all(dir).unwrap();
}
