fn main() {
    println!("runr-tick {}", env!("CARGO_PKG_VERSION"));
}
