//! The crate's error type.

/// Why a Plan could not be turned into a bundle.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The Plan names something the runtime spec cannot express.
    #[error("plan field `{field}`: {reason}")]
    Unrepresentable { field: String, reason: String },
    /// The config does not parse as oci-spec's `Spec`, or serializing failed.
    #[error("config.json: {0}")]
    Json(#[source] serde_json::Error),
}
