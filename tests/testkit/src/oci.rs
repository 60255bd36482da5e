//! Small test images as OCI layouts on disk, for skopeo to push into a registry: one config and
//! any number of layers, each layer a tar archive holding one file of random bytes.

use std::path::Path;

use ring::rand::SecureRandom;

/// The OCI media types the images use.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The config's media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// A layer's media type (uncompressed tar).
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// One content-addressed blob of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Its media type.
    pub media_type: &'static str,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its bytes.
    pub data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, data: Vec<u8>) -> Blob {
        Blob {
            media_type,
            digest: sha256_digest(&data),
            data,
        }
    }

    fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "mediaType": self.media_type, "digest": self.digest, "size": self.data.len()
        })
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A linux/amd64 image in an OCI layout in a temporary directory (removed on drop).
pub struct TestImage {
    dir: tempfile::TempDir,
    /// The tag it has in the layout.
    pub tag: String,
    /// The image manifest.
    pub manifest: Blob,
    /// The config.
    pub config: Blob,
    /// The layers, in order.
    pub layers: Vec<Blob>,
}

impl TestImage {
    /// An image tagged `tag` with one layer per entry of `layer_sizes`, each a tar archive of
    /// one file holding that many random bytes (so no two images share a layer).
    pub fn random(tag: &str, layer_sizes: &[usize]) -> TestImage {
        let rng = ring::rand::SystemRandom::new();
        let layers: Vec<Blob> = layer_sizes
            .iter()
            .map(|&n| {
                let mut data = vec![0u8; n];
                rng.fill(&mut data).expect("system randomness");
                Blob::new(OCI_LAYER, tar_of_one_file("data.bin", &data))
            })
            .collect();
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
            "config": {}
        });
        let config = Blob::new(OCI_CONFIG, config.to_string().into_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": config.descriptor(),
            "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        });
        let manifest = Blob::new(OCI_MANIFEST, manifest.to_string().into_bytes());
        let dir = tempfile::Builder::new()
            .prefix("runr-test-image-")
            .tempdir()
            .expect("tempdir");
        let blobs = dir.path().join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("mkdir blobs");
        for b in layers.iter().chain([&config, &manifest]) {
            let hex = b.digest.strip_prefix("sha256:").expect("sha256");
            std::fs::write(blobs.join(hex), &b.data).expect("write blob");
        }
        std::fs::write(
            dir.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .expect("write oci-layout");
        let mut top = manifest.descriptor();
        top["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [top]});
        std::fs::write(dir.path().join("index.json"), index.to_string()).expect("write index");
        TestImage {
            dir,
            tag: tag.to_string(),
            manifest,
            config,
            layers,
        }
    }

    /// The layout's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `oci:<dir>:<tag>`, the skopeo source of this image.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", self.dir.path().display(), self.tag)
    }

    /// The config and the layers: every blob a pull reads.
    pub fn blobs(&self) -> Vec<&Blob> {
        std::iter::once(&self.config).chain(&self.layers).collect()
    }

    /// Total size of [`TestImage::blobs`].
    pub fn blob_bytes(&self) -> u64 {
        self.blobs().iter().map(|b| b.data.len() as u64).sum()
    }
}

/// A POSIX ustar archive holding one regular file.
fn tar_of_one_file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], data.len() as u64);
    octal(&mut header[136..148], 0);
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    // The checksum is computed with its own field as spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(text.as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GNU tar reads the archive back: one file, the same bytes.
    #[test]
    fn layers_are_tar_archives() {
        let img = TestImage::random("t", &[1000]);
        let dir = tempfile::tempdir().unwrap();
        let tarball = dir.path().join("layer.tar");
        std::fs::write(&tarball, &img.layers[0].data).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let data = std::fs::read(dir.path().join("data.bin")).unwrap();
        assert_eq!(data.len(), 1000);
        assert_eq!(&img.layers[0].data[512..1512], data.as_slice());
        assert_eq!(img.layers[0].digest, sha256_digest(&img.layers[0].data));
        assert_eq!(
            img.blob_bytes(),
            (img.config.data.len() + img.layers[0].data.len()) as u64
        );
    }
}
