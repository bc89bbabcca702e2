//! Journal durable-update benchmark (placeholder until the journal lands).
fn main() {}
