//! Property tests ("fuzz_*") of everything that parses bytes a command or a
//! caller controls. `scripts/fuzz.sh` runs them with many more cases.

use proptest::prelude::*;

use crate::opfiles::{parse_exit_code, parse_pid_record};
use crate::profile::{scratch_key, validate_run_id};
use crate::wrapper::{
    parse_probe, parse_signalled, validate_command, validate_op_id, wrapper_argv, WrapperSpec,
};

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
    fn fuzz_code_file_parser(text in ".{0,80}") {
        if let Ok(code) = parse_exit_code("c", &text) {
            prop_assert!((0..=255).contains(&code));
            prop_assert_eq!(text, format!("{code}\n"));
        }
    }

    #[test]
    fn fuzz_probe_and_signal_output(text in "(.{0,40}\n){0,20}") {
        let _ = parse_probe(&text);
        let _ = parse_signalled(&text);
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
    fn fuzz_commands_pass_verbatim(cmd in proptest::collection::vec(".{0,30}", 0..6)) {
        let spec = WrapperSpec { op_id: "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d", run_as: Some("agent"), log_cap_bytes: 1024 };
        match wrapper_argv(&spec, &cmd) {
            Ok(argv) => {
                prop_assert!(validate_command(&cmd).is_ok());
                prop_assert_eq!(&argv[4..], &cmd[..]);
            }
            Err(_) => prop_assert!(validate_command(&cmd).is_err()),
        }
    }
}
