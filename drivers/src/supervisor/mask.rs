//! Secret masking of captured logs (`[capture] mask_secrets = true`, off by default): every
//! occurrence of one of the Run's Secret values in the user's output is replaced by `***` before
//! it reaches the spool, including a value split across two reads of the pipe.
//!
//! Streaming rule (leftmost, then longest): a position is decided once every Secret value
//! starting there would fit in what has been read (`position + longest ≤ buffered`); bytes from
//! the first undecided position on are carried over to the next read. At end of file the rest is
//! decided with what there is. So the output is exactly what masking the whole stream at once
//! would give, whatever the read boundaries (tested against a one-shot reference below).
//!
//! The values live only in this process's memory, in buffers wiped on drop (the patterns, the
//! carry-over, the output block); nothing is written anywhere but the masked log. A matcher
//! crate would keep its own unwiped copies of the values in its automaton, so the matcher is
//! hand-written: candidates are indexed by first byte and tried longest first.

use zeroize::Zeroizing;

/// What replaces a Secret value.
pub const MASK: &[u8] = b"***";

/// A streaming masker over a fixed set of Secret values.
pub struct Masker {
    /// Distinct non-empty values, longest first.
    patterns: Vec<Zeroizing<Vec<u8>>>,
    /// For each first byte, the indices into `patterns` (longest first).
    by_first: Vec<Vec<usize>>,
    longest: usize,
    carry: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masker")
            .field("patterns", &self.patterns.len())
            .finish_non_exhaustive()
    }
}

impl Masker {
    /// A masker for `values` (empty values are ignored; duplicates count once). `block` is the
    /// largest input one [`Masker::feed`] receives (the carry-over buffer is reserved once, so it
    /// never reallocates and leaves no unwiped copy behind).
    #[must_use]
    pub fn new<'a>(values: impl IntoIterator<Item = &'a [u8]>, block: usize) -> Self {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for value in values {
            if !value.is_empty() && !patterns.iter().any(|p| p.as_slice() == value) {
                patterns.push(Zeroizing::new(value.to_vec()));
            }
        }
        patterns.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let mut by_first = vec![Vec::new(); 256];
        for (i, p) in patterns.iter().enumerate() {
            by_first[usize::from(p[0])].push(i);
        }
        let longest = patterns.first().map_or(0, |p| p.len());
        Self {
            patterns,
            by_first,
            longest,
            carry: Zeroizing::new(Vec::with_capacity(block + longest)),
        }
    }

    /// Whether there is anything to mask.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The longest value matching at `buf[at..]`, fully inside `buf`.
    fn match_at(&self, buf: &[u8], at: usize) -> Option<usize> {
        self.by_first[usize::from(buf[at])]
            .iter()
            .map(|&i| self.patterns[i].as_slice())
            .find(|p| buf[at..].starts_with(p))
            .map(<[u8]>::len)
    }

    /// Masks `input` (appended to what was carried over) into `out`; keeps the undecided tail.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.is_empty() {
            out.extend_from_slice(input);
            return;
        }
        self.carry.extend_from_slice(input);
        let decided = self.carry.len().saturating_sub(self.longest - 1);
        let consumed = self.scan(decided, out);
        self.carry.drain(..consumed);
    }

    /// Masks what is left at end of file into `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let all = self.carry.len();
        self.scan(all, out);
        self.carry.clear();
    }

    /// Emits the masked bytes of every position before `decided`; returns how many bytes of the
    /// carry-over they consumed (a match may reach past `decided`).
    fn scan(&self, decided: usize, out: &mut Vec<u8>) -> usize {
        let buf = self.carry.as_slice();
        let (mut at, mut from) = (0, 0);
        while at < decided {
            match self.match_at(buf, at) {
                Some(len) => {
                    out.extend_from_slice(&buf[from..at]);
                    out.extend_from_slice(MASK);
                    at += len;
                    from = at;
                }
                None => at += 1,
            }
        }
        out.extend_from_slice(&buf[from..at]);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-shot reference: leftmost, then longest, over the whole input.
    fn reference(values: &[&[u8]], input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let best = values
                .iter()
                .filter(|v| !v.is_empty() && input[at..].starts_with(v))
                .map(|v| v.len())
                .max();
            match best {
                Some(len) => {
                    out.extend_from_slice(MASK);
                    at += len;
                }
                None => {
                    out.push(input[at]);
                    at += 1;
                }
            }
        }
        out
    }

    fn streamed(values: &[&[u8]], input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut masker = Masker::new(values.iter().copied(), input.len());
        let mut out = Vec::new();
        let mut last = 0;
        for &cut in cuts {
            masker.feed(&input[last..cut], &mut out);
            last = cut;
        }
        masker.feed(&input[last..], &mut out);
        masker.finish(&mut out);
        out
    }

    #[test]
    fn a_value_split_at_every_point_and_every_pair_of_points_is_masked() {
        let values: [&[u8]; 3] = [b"s3cr3t", b"s3c", b"t0ken-abc"];
        let input = b"x s3cr3t y s3c3 t0ken-abcs3cr3ts3c z t0ken-ab";
        let want = reference(&values, input);
        assert_eq!(
            want,
            b"x *** y ***3 ********* z t0ken-ab".to_vec(),
            "leftmost-longest: s3cr3t before s3c; a partial value stays"
        );
        for a in 0..=input.len() {
            assert_eq!(streamed(&values, input, &[a]), want, "cut at {a}");
            for b in a..=input.len() {
                assert_eq!(streamed(&values, input, &[a, b]), want, "cuts {a},{b}");
            }
        }
    }

    #[test]
    fn random_streams_match_the_one_shot_reference() {
        // A small deterministic generator over a 3-letter alphabet, so values overlap often.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..3000 {
            let mut values: Vec<Vec<u8>> = Vec::new();
            for _ in 0..1 + next(4) {
                values.push((0..1 + next(5)).map(|_| b"abc"[next(3) as usize]).collect());
            }
            let input: Vec<u8> = (0..next(60)).map(|_| b"abc"[next(3) as usize]).collect();
            let mut cuts: Vec<usize> = (0..next(6))
                .map(|_| next(input.len() as u64 + 1) as usize)
                .collect();
            cuts.sort_unstable();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            assert_eq!(
                streamed(&refs, &input, &cuts),
                reference(&refs, &input),
                "values {values:?} input {input:?} cuts {cuts:?}"
            );
        }
    }

    #[test]
    fn without_values_the_stream_is_unchanged_and_the_debug_output_hides_them() {
        let mut masker = Masker::new([b"".as_slice()], 16);
        assert!(masker.is_empty());
        let mut out = Vec::new();
        masker.feed(b"byte exact", &mut out);
        masker.finish(&mut out);
        assert_eq!(out, b"byte exact");
        let masker = Masker::new([b"hunter2".as_slice()], 16);
        assert!(!format!("{masker:?}").contains("hunter2"));
    }
}
