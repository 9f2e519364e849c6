//! Typed views of every body the API sends: the handlers return them, the
//! CLI and MCP read them back, the panel displays them. Field names are the
//! SPEC's (§8, §14–§16); the server derives what clients only display (an
//! op's `live`, a schedule's `state` and `when`). `golden_tests.rs` pins
//! each view's wire format. Error bodies are `api::error`'s.

mod containers;
mod daemon;
mod events;
mod interactive;
mod nodes;
mod ops;
mod reports;
mod runs;
mod schedules;
mod workspaces;

pub use crate::report_text::rfc3339;
pub use crate::runtime::probes::ProbeCounts;
pub use containers::{
    ContainerInspect, ContainerList, ContainerView, InspectOp, InspectProcess, ProfileView,
    ReapList, ReaperVerdict, UnreachableNode,
};
pub use daemon::{
    ClockStepped, DrillFault, DrillWoken, Health, PrincipalKind, ToolDefinition, ToolsView, WhoAmI,
};
pub use events::{Event, EventKind, EventsPage};
pub use interactive::{OutputView, StdinAnswer};
pub use nodes::{NodeDrained, NodeList, NodeView};
pub use ops::{ApprovalView, ConsoleDone, ConsoleOutput, FinishView, OpList, OpView};
pub use reports::{NoteAdded, Report, ReportAck, ReportList, ReportSummary};
pub use runs::{
    Amounts, ChildView, RunChangeAnswer, RunCreated, RunList, RunSummary, RunView, UsageAnswer,
};
pub use schedules::{ScheduleCreated, ScheduleDeleted, ScheduleList, ScheduleView};
pub use workspaces::{
    FileContent, FileEntry, FileList, FileType, FileWrittenView, ImageList, ImageView, NetworkView,
    SnapshotList, SnapshotView,
};

#[cfg(test)]
mod golden_tests;

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_910_400_000), "2026-11-29T00:00:00.000Z");
    }
}
