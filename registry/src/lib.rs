//! OCI registry access shared by image-receiver and prewarm: configuration, client, retries
