//! The contract's types and the link's, converted here and nowhere else: the init's wire
//! stays behind the link, so a change to the protocol is not a change of the public API.

use crate::contract::{PriorOutput, Report, ReportKind, SandboxReport};
use stevedore_init::report::{self as wire_report, ReportKind as K};
use stevedore_init::wire;

/// A report as the init sent it, in the contract's words.
pub(crate) fn report_in(r: wire_report::Report) -> Report {
    let kind = match r.kind {
        K::Progress => ReportKind::Progress,
        K::Heartbeat => ReportKind::Heartbeat,
        K::Note => ReportKind::Note,
        K::Data => ReportKind::Data,
    };
    Report { kind, percent: r.percent, text: r.text, value: r.value }
}

/// A report a handler makes, as the link carries it.
pub(crate) fn report_out(r: Report) -> wire_report::Report {
    let kind = match r.kind {
        ReportKind::Progress => K::Progress,
        ReportKind::Heartbeat => K::Heartbeat,
        ReportKind::Note => K::Note,
        ReportKind::Data => K::Data,
        #[expect(unreachable_patterns, reason = "non_exhaustive in the contract")]
        _ => K::Note,
    };
    wire_report::Report { kind, percent: r.percent, text: r.text, value: r.value, job_id: None, attempt: None }
}

/// A report the init forwarded, numbered and timed.
pub(crate) fn sandbox_report(f: wire_report::Forwarded) -> SandboxReport {
    SandboxReport::new(f.seq, f.at_ms, report_in(f.report))
}

/// A prior output, as the Start frame carries it.
pub(crate) fn prior_out(p: &PriorOutput) -> wire::PriorOutput {
    wire::PriorOutput { name: p.name.clone(), reference: p.reference.clone() }
}

/// A prior output, as a handler gets it.
pub(crate) fn prior_in(p: wire::PriorOutput) -> PriorOutput {
    PriorOutput { name: p.name, reference: p.reference }
}
