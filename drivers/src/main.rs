#![forbid(unsafe_code)]

fn main() {
    println!("ql-worker");
}
