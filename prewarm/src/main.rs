fn main() {
    println!("runr-prewarm {}", env!("CARGO_PKG_VERSION"));
}
