fn main() {
    println!("runr-wrapper {}", env!("CARGO_PKG_VERSION"));
}
