//! Property tests ("fuzz_*") of every parser that reads bytes a command
//! could influence. `scripts/fuzz.sh` runs them with many more cases.

use proptest::prelude::*;

use crate::format::{
    parse_probe, parse_signalled, ExitRecord, OpResult, PidRecord, Request, Usage,
};
use crate::procfs::{environ_marker, stat_start_ticks};
use crate::user::RunAs;

proptest! {
    #[test]
    fn fuzz_code_file_parser(text in "[0-9 \\n+-]{0,30}|(not-started)?[ -~\\t\\n]{0,40}|.{0,80}") {
        if let Ok(rec) = OpResult::parse(&text) {
            if let OpResult::Exited(e) = &rec {
                prop_assert!((0..=255).contains(&e.code));
            }
            prop_assert_eq!(rec.render(), text);
        }
    }

    #[test]
    fn fuzz_code_file_parser_structured(
        code in 0i32..300,
        cpu in any::<u64>(),
        rss in any::<u64>(),
        leftovers in prop_oneof![Just(0u32), any::<u32>()],
        flip in any::<proptest::sample::Index>(),
        with in proptest::sample::select(vec![b' ', b'\n', b'0', b'-', b'+', b'x', b'\t', 0u8]),
    ) {
        let rec = OpResult::Exited(ExitRecord { code, usage: Some(Usage { cpu_ms: cpu, max_rss_kb: rss }), leftovers });
        let text = rec.render();
        prop_assert_eq!(OpResult::parse(&text).is_ok(), code <= 255);
        if code <= 255 {
            prop_assert_eq!(OpResult::parse(&text), Ok(rec));
        }
        // one byte changed: accepted only if it still reads as the canonical form
        let mut bytes = text.into_bytes();
        let at = flip.index(bytes.len());
        bytes[at] = with;
        let near = String::from_utf8_lossy(&bytes).into_owned();
        if let Ok(r) = OpResult::parse(&near) {
            prop_assert_eq!(r.render(), near);
        }
    }

    #[test]
    fn fuzz_pid_file_parser(text in "[0-9a-z \\n]{0,40}|.{0,300}") {
        if let Ok(rec) = PidRecord::parse(&text) {
            prop_assert!(rec.pid > 0);
            // what the shim writes, or (no hostname) without the trailing space
            let bare = format!("{} {}\n", rec.pid, rec.start_ticks);
            prop_assert!(text == rec.render() || (rec.hostname.is_empty() && text == bare), "{:?}", text);
        }
    }

    #[test]
    fn fuzz_probe_and_signaller_output(text in "([0-9a-f -]{0,60}\n){0,10}(end\n)?") {
        if let Ok(procs) = parse_probe(&text) {
            prop_assert!(procs.iter().all(|p| p.pid > 0 && p.op_id.len() == 36));
        }
        let _ = parse_signalled(&text);
    }

    #[test]
    fn fuzz_proc_parsers(stat in ".{0,200}", environ in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = stat_start_ticks(&stat);
        if let Some(id) = environ_marker(&environ) {
            prop_assert_eq!(id.len(), 36);
        }
    }

    #[test]
    fn fuzz_run_as_never_reaches_root_by_accident(spec in "[0-9a-z:._-]{0,14}") {
        if let Ok(run_as) = RunAs::parse(&spec) {
            let passwd = "root:x:0:0::/:/bin/sh\nagent:x:1000:1000::/:/bin/sh\n";
            if let Ok(user) = run_as.resolve(Some(passwd)) {
                prop_assert!(spec == "root" || (user.uid != 0 && user.gid != 0), "{} -> {:?}", spec, user);
            }
        }
    }

    #[test]
    fn fuzz_request_parser(bytes in proptest::collection::vec(any::<u8>(), 0..200), argv in proptest::collection::vec("[^\\x00]{0,12}", 1..5)) {
        if let Ok(req) = Request::parse(&bytes) {
            prop_assert_eq!(req.render(), bytes);
        }
        let req = Request { host: "h".into(), op_id: "0b6f1c2e-8a47-4c1e-9d3a-5f2b7c9e1a0d".into(), run_as: "1000:1000".into(), log_cap: 1, io: crate::Io::Null, argv };
        let ok = !req.argv[0].is_empty();
        prop_assert_eq!(Request::parse(&req.render()).ok(), ok.then_some(req));
    }
}
