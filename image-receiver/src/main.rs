fn main() {
    println!("runr-image-upload {}", env!("CARGO_PKG_VERSION"));
}
