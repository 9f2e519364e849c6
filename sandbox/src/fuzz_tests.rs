//! Property tests ("fuzz_*") of everything that parses bytes a command or a
//! caller controls. `scripts/fuzz.sh` runs them with many more cases.

use proptest::prelude::*;

use crate::opfiles::{parse_op_result, parse_pid_record, OpResult};
use crate::profile::{scratch_key, validate_run_id};
use crate::shim::{launch_argv, validate_command, validate_op_id, LaunchSpec};

proptest! {
    #[test]
    fn fuzz_pid_file_parser(text in ".{0,600}") {
        if let Ok(rec) = parse_pid_record("p", &text) {
            prop_assert!(rec.pid > 0);
            prop_assert!(rec.hostname.bytes().all(|b| b.is_ascii_graphic()));
            let again = format!("{} {} {}\n", rec.pid, rec.start_ticks, rec.hostname);
            prop_assert_eq!(parse_pid_record("p", &again), Ok(rec));
        }
    }

    #[test]
    fn fuzz_pid_file_parser_near_valid(pid in any::<u64>(), start in any::<u64>(), host in "[ -~]{0,20}", tail in "[\\n ]{0,2}") {
        let _ = parse_pid_record("p", &format!("{pid} {start} {host}{tail}"));
    }

    #[test]
    fn fuzz_pid_file_parser_structured(
        pid in 1u32..,
        start in any::<u64>(),
        host in "[a-z0-9][a-z0-9.-]{0,11}",
        flip in any::<proptest::sample::Index>(),
        with in proptest::sample::select(vec![b' ', b'\n', b'0', b'-', b'+', b'x', b'\t', 0u8]),
    ) {
        let valid = format!("{pid} {start} {host}\n");
        let rec = parse_pid_record("p", &valid);
        prop_assert_eq!(rec, Ok(crate::opfiles::PidRecord { pid, start_ticks: start, hostname: host.clone() }));
        // one byte changed: accepted only if it still reads as the canonical form
        let mut bytes = valid.clone().into_bytes();
        let at = flip.index(bytes.len());
        bytes[at] = with;
        let near = String::from_utf8_lossy(&bytes).into_owned();
        if let Ok(r) = parse_pid_record("p", &near) {
            let host = if r.hostname.is_empty() { String::new() } else { format!(" {}", r.hostname) };
            prop_assert_eq!(near, format!("{} {}{host}\n", r.pid, r.start_ticks));
        }
    }

    #[test]
    fn fuzz_code_file_parser(text in "[0-9 \\n]{0,24}|.{0,80}") {
        if let Ok(rec) = parse_op_result("c", &text) {
            if let OpResult::Exited(e) = &rec {
                prop_assert!((0..=255).contains(&e.code));
            }
            prop_assert_eq!(rec.render(), text);
        }
    }

    #[test]
    fn fuzz_run_ids(id in ".{0,80}") {
        if validate_run_id(&id).is_ok() {
            prop_assert!(!id.contains('/') && !id.contains("..") && id != "." && !id.is_empty());
        }
        prop_assert!(scratch_key(&id).bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn fuzz_op_ids(id in ".{0,50}") {
        if validate_op_id(&id).is_ok() {
            prop_assert!(id.len() == 36 && !id.contains('/') && !id.contains('.'));
        }
    }

    #[test]
    fn fuzz_op_ids_structured(
        id in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        at in 0usize..36,
        with in proptest::sample::select(vec!['a', 'f', 'g', 'A', '0', '9', '-', '/', '.', ' ', '\0', 'é']),
        cut in 0usize..37,
    ) {
        prop_assert!(validate_op_id(&id).is_ok());
        // one character replaced: valid only where it still fits the uuid shape
        let mut chars: Vec<char> = id.chars().collect();
        chars[at] = with;
        let near: String = chars.into_iter().collect();
        let dash = matches!(at, 8 | 13 | 18 | 23);
        let fits = if dash { with == '-' } else { with.is_ascii_digit() || ('a'..='f').contains(&with) };
        prop_assert_eq!(validate_op_id(&near).is_ok(), fits, "{:?}", near);
        // shortened or lengthened: never valid
        prop_assert!(validate_op_id(&id[..cut.min(35)]).is_err());
        let longer = format!("{id}0");
        prop_assert!(validate_op_id(&longer).is_err());
    }

    #[test]
    fn fuzz_commands_pass_verbatim(cmd in proptest::collection::vec(".{0,30}", 0..6)) {
        let spec = LaunchSpec { op_id: "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d", run_as: Some("1000:1000"), log_cap_bytes: 1024, io: crate::shim::Io::Null };
        match launch_argv(&spec, &cmd) {
            Ok(argv) => {
                prop_assert!(validate_command(&cmd).is_ok());
                prop_assert_eq!(&argv[5..], &cmd[..]);
            }
            Err(_) => prop_assert!(validate_command(&cmd).is_err()),
        }
    }
}
