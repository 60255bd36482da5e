//! The run's result: one report per image, the summary line on stderr and the JSON document on
//! stdout that the control plane reads from the Job's log.

use serde::Serialize;

/// How an image ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The cache holds every blob of the selected platforms.
    Warmed,
    /// It does not; `error` says why.
    Failed,
}

/// One image's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ImageReport {
    /// The reference as given in RUNR_PREWARM_IMAGES.
    pub image: String,
    /// Warmed or failed.
    pub status: Status,
    /// The digest the reference resolved to (the index's, for a multi-platform image).
    pub digest: Option<String>,
    /// Config and layer blobs of the selected platforms.
    pub blobs: usize,
    /// Their total size.
    pub bytes: u64,
    /// Bytes this run read in full (blobs the cache did not hold yet; twice a blob's size when a
    /// cache that ignores Range had to be confirmed by reading it again).
    pub fetched_bytes: u64,
    /// Wall time for the image.
    pub seconds: f64,
    /// Attempts made.
    pub attempts: u32,
    /// The last attempt's error, for a failed image.
    pub error: Option<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The cache registry.
    pub registry: String,
    /// Images warmed.
    pub warmed: usize,
    /// Images failed.
    pub failed: usize,
    /// Wall time of the run.
    pub seconds: f64,
    /// Per image, in the order given.
    pub images: Vec<ImageReport>,
}

impl Summary {
    /// Builds the summary from the reports.
    pub fn new(registry: &str, images: Vec<ImageReport>, seconds: f64) -> Summary {
        let warmed = images.iter().filter(|i| i.status == Status::Warmed).count();
        Summary {
            registry: registry.to_string(),
            warmed,
            failed: images.len() - warmed,
            seconds: (seconds * 1000.0).round() / 1000.0,
            images,
        }
    }

    /// True when every image was warmed.
    pub fn success(&self) -> bool {
        self.failed == 0
    }

    /// The one-line JSON document.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Logs the summary line.
    pub fn log(&self) {
        let bytes: u64 = self.images.iter().map(|i| i.bytes).sum();
        let fetched: u64 = self.images.iter().map(|i| i.fetched_bytes).sum();
        if self.success() {
            tracing::info!(
                registry = %self.registry,
                warmed = self.warmed,
                failed = self.failed,
                bytes,
                fetched,
                seconds = self.seconds,
                "prewarm done"
            );
        } else {
            let failed: Vec<&str> = self
                .images
                .iter()
                .filter(|i| i.status == Status::Failed)
                .map(|i| i.image.as_str())
                .collect();
            tracing::error!(
                registry = %self.registry,
                warmed = self.warmed,
                failed = self.failed,
                failed_images = %failed.join(","),
                bytes,
                fetched,
                seconds = self.seconds,
                "prewarm done with failures"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let report = |image: &str, status, error: Option<&str>| ImageReport {
            image: image.into(),
            status,
            digest: None,
            blobs: 2,
            bytes: 10,
            fetched_bytes: 4,
            seconds: 0.5,
            attempts: 1,
            error: error.map(str::to_string),
        };
        let s = Summary::new(
            "r:5000",
            vec![
                report("a:1", Status::Warmed, None),
                report("b:1", Status::Failed, Some("x: HTTP 404")),
            ],
            1.23456,
        );
        assert!(!s.success());
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(v["warmed"], 1);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["seconds"], 1.235);
        assert_eq!(v["images"][0]["status"], "warmed");
        assert_eq!(v["images"][1]["status"], "failed");
        assert_eq!(v["images"][1]["error"], "x: HTTP 404");
        assert_eq!(v["images"][0]["error"], serde_json::Value::Null);
    }
}
