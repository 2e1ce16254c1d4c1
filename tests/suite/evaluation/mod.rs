//! Scoring captions: the metrics against pycocoevalcap and by hand, and
//! the HTML report.

mod fluency;
mod metrics;
mod report;
