//! node-semver, as the reference pins it (`semver` 7.7.4): `validRange` for placement ranges and a
//! strict SemVer 2.0.0 check for the Worker's own capability versions.
//!
//! The reference keeps a `placement.required.protocolVersionRange` or a
//! `runtimes[].versionRange` when node-semver's `validRange(text)` (non-loose, no options) is not
//! `null`, and keeps the text verbatim for the digest. [`valid_range`] reproduces that function,
//! including its normalized output, step by step: whitespace collapsing with JavaScript's
//! whitespace set, the `||` split, the hyphen-range rewrite, the operator/tilde/caret whitespace
//! trims, build-metadata stripping, the caret, tilde, x-range and star rewrites (with JavaScript's
//! `+n + 1` on numbers), the `>=0.0.0` rule, each comparator's strict parse, the 2^53-1 bound, and
//! the null-set / any-set / duplicate rules. Every regular expression of node-semver's pipeline is
//! matched here by a small hand-written matcher that follows JavaScript's backtracking order; where
//! a later step only needs the extent of an unanchored match, the extent is the one JavaScript's
//! greedy first match gives.
//!
//! Exactness is shown by `core/tests/wire_semver.rs` against vectors made by node-semver itself
//! (`tests/fixtures/semver-ranges/`, plus the reference's own verdicts in
//! `tests/fixtures/conformance/semver-ranges.json`). Both reference callers refuse texts longer
//! than 128 UTF-16 code units before calling `validRange`, so node-semver's internal repetition
//! caps (256 digits, 250 identifier characters, 256-character versions) never bind; the version
//! length cap is applied anyway.

use alloc::string::String;
use alloc::vec::Vec;

/// `Number.MAX_SAFE_INTEGER`, the largest version number node-semver accepts.
const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;
/// node-semver `MAX_LENGTH`: the longest version text a comparator may hold.
const MAX_VERSION_LENGTH: usize = 256;
/// The comparator value of the null set (`<0.0.0-0`).
const NULL_SET: &str = "<0.0.0-0";

// ---------------------------------------------------------------------------------------------
// Characters
// ---------------------------------------------------------------------------------------------

/// JavaScript's `\s` (and `String.prototype.trim`): WhiteSpace and LineTerminator.
fn is_js_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

/// The length of the run of bytes from `i` that `class` accepts.
fn run(b: &[u8], i: usize, class: fn(&u8) -> bool) -> usize {
    b[i.min(b.len())..].iter().take_while(|c| class(c)).count()
}

fn digits(b: &[u8], i: usize) -> usize {
    run(b, i, u8::is_ascii_digit)
}

/// `[a-zA-Z0-9-]`
fn is_ident(c: &u8) -> bool {
    c.is_ascii_alphanumeric() || *c == b'-'
}

/// `[v=\s]*` (only `' '` remains as whitespace once the text is collapsed).
fn prefix_run(b: &[u8], i: usize) -> usize {
    run(b, i, |c| matches!(c, b'v' | b'=' | b' '))
}

/// JavaScript `text.trim()` followed by `.replace(/\s+/g, ' ')`: the non-space pieces joined by
/// single spaces.
fn collapse(text: &str) -> String {
    let pieces: Vec<&str> = text.split(is_js_space).filter(|p| !p.is_empty()).collect();
    pieces.join(" ")
}

/// JavaScript `text.split(/\s+/)` where `' '` is the only whitespace left: `text.split(' ')`
/// without the empty pieces between two spaces (an empty first or last piece is kept).
fn split_ws(text: &str) -> Vec<&str> {
    let last = text.matches(' ').count();
    text.split(' ')
        .enumerate()
        .filter(|(i, piece)| !piece.is_empty() || *i == 0 || *i == last)
        .map(|(_, piece)| piece)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Numbers (JavaScript `+text` and `+text + 1` as they reach a version)
// ---------------------------------------------------------------------------------------------

/// Whether a digit string (no leading zeros) is at most `Number.MAX_SAFE_INTEGER`.
fn is_safe(number: &str) -> bool {
    number.len() < 16 || (number.len() == 16 && number <= "9007199254740991")
}

/// `String(+number + 1)` for a digit string, as far as it matters: any result above
/// `MAX_SAFE_INTEGER` makes the comparator that receives it invalid, so every such result is
/// written as `2^53`, which is refused the same way.
fn plus_one(number: &str) -> String {
    match number.parse::<u64>() {
        Ok(n) if n < MAX_SAFE_INTEGER => alloc::format!("{}", n + 1),
        _ => String::from("9007199254740992"),
    }
}

// ---------------------------------------------------------------------------------------------
// Anchored grammar pieces
// ---------------------------------------------------------------------------------------------

/// `XRANGEIDENTIFIER` = `0|[1-9]\d*|x|X|\*` at `i` (unanchored, greedy): its length.
fn xrange_id(b: &[u8], i: usize) -> Option<usize> {
    numeric_id(b, i).or_else(|| matches!(at(b, i), b'x' | b'X' | b'*').then_some(1))
}

/// `NUMERICIDENTIFIER` = `0|[1-9]\d*` at `i`: its length.
fn numeric_id(b: &[u8], i: usize) -> Option<usize> {
    match at(b, i) {
        b'0' => Some(1),
        b'1'..=b'9' => Some(digits(b, i)),
        _ => None,
    }
}

/// `\d*[a-zA-Z-][a-zA-Z0-9-]*` at `i`, the first alternative of both prerelease identifiers:
/// its length.
fn alphanumeric_id(b: &[u8], i: usize) -> Option<usize> {
    let d = digits(b, i);
    let c = at(b, i + d);
    (c.is_ascii_alphabetic() || c == b'-').then(|| d + 1 + run(b, i + d + 1, is_ident))
}

/// `PRERELEASEIDENTIFIER` = `\d*[a-zA-Z-][a-zA-Z0-9-]*|0|[1-9]\d*` at `i`: its length.
fn prerelease_id(b: &[u8], i: usize) -> Option<usize> {
    alphanumeric_id(b, i).or_else(|| numeric_id(b, i))
}

/// `PRERELEASEIDENTIFIERLOOSE` = `\d*[a-zA-Z-][a-zA-Z0-9-]*|\d+` at `i`: its length.
fn prerelease_id_loose(b: &[u8], i: usize) -> Option<usize> {
    alphanumeric_id(b, i).or_else(|| Some(digits(b, i)).filter(|d| *d > 0))
}

/// Whether the whole of `text` is `id(\.id)*` for an identifier rule (matched greedily).
fn dotted_full(text: &[u8], id: fn(&[u8], usize) -> Option<usize>) -> bool {
    id(text, 0).is_some_and(|n| n > 0 && dotted_tail(text, n, id) == text.len())
}

fn build_id(b: &[u8], i: usize) -> Option<usize> {
    let n = run(b, i, is_ident);
    (n > 0).then_some(n)
}

/// Greedy extent of `(?:\.id)*` after an identifier that ended at `i`.
fn dotted_tail(b: &[u8], mut i: usize, id: fn(&[u8], usize) -> Option<usize>) -> usize {
    while at(b, i) == b'.' {
        match id(b, i + 1) {
            Some(n) if n > 0 => i += 1 + n,
            _ => break,
        }
    }
    i
}

/// The captures of an anchored `XRANGEPLAIN` (`[v=\s]*M(.m(.p(-pre)?(+build)?)?)?`).
#[derive(Clone, Copy)]
struct XPlain<'a> {
    /// The whole match (prefix included).
    text: &'a str,
    major: &'a str,
    minor: Option<&'a str>,
    patch: Option<&'a str>,
    pre: Option<&'a str>,
}

/// `isX`: absent, `x`/`X` or `*`.
fn is_x(part: Option<&str>) -> bool {
    matches!(part, None | Some("x" | "X" | "*"))
}

/// `(?:-(pre))?(?:\+(build))?$` from `i`, matched whole: the prerelease's byte range, if any.
fn pre_build_full(b: &[u8], mut i: usize) -> Option<Option<(usize, usize)>> {
    let mut pre = None;
    if at(b, i) == b'-' {
        let end = b[i..]
            .iter()
            .position(|c| *c == b'+')
            .map_or(b.len(), |p| i + p);
        if !dotted_full(&b[i + 1..end], prerelease_id) {
            return None;
        }
        pre = Some((i + 1, end));
        i = end;
    }
    if at(b, i) == b'+' {
        if !dotted_full(&b[i + 1..], build_id) {
            return None;
        }
        i = b.len();
    }
    (i == b.len()).then_some(pre)
}

/// `M(.m(.p…)?)?` from `i` with each part matched by `part`: the parts found and where they end.
/// After a part comes the end of the text or a `.` and the next part; after the third, `None`
/// is left for the caller to match.
fn dotted_parts(
    text: &str,
    mut i: usize,
    part: fn(&[u8], usize) -> Option<usize>,
) -> Option<([Option<&str>; 3], usize)> {
    let b = text.as_bytes();
    let mut parts = [None; 3];
    for (k, slot) in parts.iter_mut().enumerate() {
        if k > 0 {
            if i == b.len() {
                break;
            }
            if b[i] != b'.' {
                return None;
            }
            i += 1;
        }
        let n = part(b, i)?;
        *slot = Some(&text[i..i + n]);
        i += n;
    }
    Some((parts, i))
}

/// Matches the whole of `text` as `XRANGEPLAIN`. Its parts cannot overlap (an identifier never
/// holds a `.`, a prerelease never a `+`), so the only parse is the greedy one.
fn xrange_plain_full(text: &str) -> Option<XPlain<'_>> {
    let b = text.as_bytes();
    let (parts, end) = dotted_parts(text, prefix_run(b, 0), xrange_id)?;
    let pre = match parts[2] {
        Some(_) => pre_build_full(b, end)?,
        None if end == b.len() => None,
        None => return None,
    };
    Some(XPlain {
        text,
        major: parts[0]?,
        minor: parts[1],
        patch: parts[2],
        pre: pre.map(|(from, to)| &text[from..to]),
    })
}

/// A comparator's version: `FULLPLAIN` (`v?M.m.p(-pre)?(+build)?`) matched whole, numbers within
/// 2^53-1 — the `SemVer` constructor. Returns `M.m.p[-pre]`.
fn full_version(text: &str) -> Option<&str> {
    if text.len() > MAX_VERSION_LENGTH {
        return None;
    }
    let b = text.as_bytes();
    let start = usize::from(at(b, 0) == b'v');
    let (parts, end) = dotted_parts(text, start, numeric_id)?;
    let [Some(major), Some(minor), Some(patch)] = parts else {
        return None;
    };
    let pre = pre_build_full(b, end)?;
    if ![major, minor, patch].iter().all(|p| is_safe(p)) {
        return None;
    }
    Some(&text[start..pre.map_or(end, |(_, to)| to)])
}

/// `GTLT` = `((?:<|>)?=?)` at `i`, greedy: its length.
fn gtlt_len(b: &[u8], i: usize) -> usize {
    let n = usize::from(matches!(at(b, i), b'<' | b'>'));
    n + usize::from(at(b, i + n) == b'=')
}

/// `GTLT` at the start of `text`, greedy, then one optional space:
/// `(operator, the text after both)`.
fn gtlt(text: &str) -> (&str, &str) {
    let b = text.as_bytes();
    let i = gtlt_len(b, 0);
    (&text[..i], &text[i + usize::from(at(b, i) == b' ')..])
}

/// `new Comparator(text).value`, or `None` when the constructor throws.
fn comparator(text: &str) -> Option<String> {
    if text.is_empty() {
        return Some(String::new());
    }
    let (op, rest) = gtlt(text);
    // `=` is dropped; `<=` and `>=` are kept.
    Some([op.trim_start_matches('='), full_version(rest)?].concat())
}

// ---------------------------------------------------------------------------------------------
// Rewrites of one comparator set (`Range.parseRange`)
// ---------------------------------------------------------------------------------------------

/// `HYPHENRANGE`: `^\s*(XRANGEPLAIN)\s+-\s+(XRANGEPLAIN)\s*$` → `>=from <=to` forms.
fn hyphen(range: &str) -> Option<String> {
    let b = range.as_bytes();
    let body = prefix_run(b, 0);
    let space = body + b[body..].iter().position(|c| *c == b' ')?;
    if !b[space..].starts_with(b" - ") {
        return None;
    }
    let from = xrange_plain_full(&range[..space])?;
    let to = xrange_plain_full(&range[space + 3..])?;
    let from = if is_x(Some(from.major)) {
        String::new()
    } else if is_x(from.minor) || is_x(from.patch) {
        alloc::format!(">={}", bounds(&from, false).0)
    } else {
        alloc::format!(">={}", from.text)
    };
    let to = if is_x(Some(to.major)) {
        String::new()
    } else if is_x(to.minor) || is_x(to.patch) {
        alloc::format!("<{}-0", bounds(&to, false).1)
    } else if to.pre.is_some() {
        alloc::format!("<={}", bounds(&to, false).0)
    } else {
        alloc::format!("<={}", to.text)
    };
    Some(String::from(
        alloc::format!("{from} {to}").trim_matches(' '),
    ))
}

/// Greedy extent of an unanchored `LOOSEPLAIN` at `i`.
fn loose_plain_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + prefix_run(b, i);
    for k in 0..3 {
        if k > 0 {
            if at(b, j) != b'.' {
                return None;
            }
            j += 1;
        }
        let n = digits(b, j);
        if n == 0 {
            return None;
        }
        j += n;
    }
    // `(?:-?(id(?:\.id)*))?`: with the hyphen first, then without it.
    let dash = usize::from(at(b, j) == b'-');
    let pre = prerelease_id_loose(b, j + dash)
        .map(|n| (j + dash, n))
        .or_else(|| (dash == 1).then(|| prerelease_id_loose(b, j).map(|n| (j, n)))?);
    if let Some((start, n)) = pre {
        j = dotted_tail(b, start + n, prerelease_id_loose);
    }
    Some(build_end(b, j))
}

/// Greedy extent of an optional `BUILD` at `i`.
fn build_end(b: &[u8], i: usize) -> usize {
    match build_id(b, i + 1) {
        Some(n) if at(b, i) == b'+' => dotted_tail(b, i + 1 + n, build_id),
        _ => i,
    }
}

/// Greedy extent of an unanchored `XRANGEPLAIN` at `i`.
fn xrange_plain_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + prefix_run(b, i);
    j += xrange_id(b, j)?;
    // `.m` and `.p`, each only with its leading `.`.
    for _ in 0..2 {
        match xrange_id(b, j + 1) {
            Some(n) if at(b, j) == b'.' => j += 1 + n,
            _ => return Some(j),
        }
    }
    if at(b, j) == b'-'
        && let Some(n) = prerelease_id(b, j + 1)
    {
        j = dotted_tail(b, j + 1 + n, prerelease_id);
    }
    Some(build_end(b, j))
}

/// `COMPARATORTRIM` (global): `(\s*)(GTLT)\s*(LOOSEPLAIN|XRANGEPLAIN)` → `$1$2$3`, i.e. the
/// whitespace between an operator and its version is dropped.
fn comparator_trim(range: &str) -> String {
    let b = range.as_bytes();
    let mut out = String::with_capacity(range.len());
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        if let Some((keep_to, plain_from, end)) = comparator_trim_at(b, i) {
            out.push_str(&range[copied..keep_to]);
            out.push_str(&range[plain_from..end]);
            copied = end;
            i = end;
        } else {
            i += 1;
        }
    }
    out.push_str(&range[copied..]);
    out
}

/// The first match of `COMPARATORTRIM` starting at `i`, in JavaScript's backtracking order
/// (each optional piece longest first, then shorter): `(end of $1$2, start of $3, end of match)`.
fn comparator_trim_at(b: &[u8], i: usize) -> Option<(usize, usize, usize)> {
    for p in (i..=i + usize::from(at(b, i) == b' ')).rev() {
        for q in (p..=p + gtlt_len(b, p)).rev() {
            for r in (q..=q + usize::from(at(b, q) == b' ')).rev() {
                if let Some(end) = loose_plain_end(b, r).or_else(|| xrange_plain_end(b, r)) {
                    return Some((q, r, end));
                }
            }
        }
    }
    None
}

/// `comp.replace(re, '')`: the first match removed, `end_of(i)` being where the match that
/// starts at byte `i` ends, if there is one.
fn remove_first(comp: &str, end_of: impl Fn(usize) -> Option<usize>) -> String {
    match (0..comp.len()).find_map(|i| Some((i, end_of(i)?))) {
        Some((i, end)) => [&comp[..i], &comp[end..]].concat(),
        None => String::from(comp),
    }
}

/// `comp.replace(BUILD, '')`: the first `+id(.id)*` is removed.
fn strip_build(comp: &str) -> String {
    let b = comp.as_bytes();
    remove_first(comp, |i| Some(build_end(b, i)).filter(|end| *end > i))
}

/// The versions `low` and `high` of the range `>=low <high-0` an x-range covers (its major not
/// an X): `M.0.0` to `M+1.0.0` for an X minor, `M.m.0` to `M.m+1.0` for an X patch, else from
/// `M.m.p[-pre]` to `M.m+1.0`. The caret's `high` is instead the next version of the left-most
/// non-zero part (`M+1.0.0`, `0.m+1.0`, `0.0.p+1`).
fn bounds(x: &XPlain<'_>, caret: bool) -> (String, String) {
    let (major, minor, patch) = (x.major, x.minor.unwrap_or(""), x.patch.unwrap_or(""));
    let low = if is_x(x.minor) {
        alloc::format!("{major}.0.0")
    } else if is_x(x.patch) {
        alloc::format!("{major}.{minor}.0")
    } else if let Some(pre) = x.pre {
        alloc::format!("{major}.{minor}.{patch}-{pre}")
    } else {
        alloc::format!("{major}.{minor}.{patch}")
    };
    let high = if is_x(x.minor) || (caret && major != "0") {
        alloc::format!("{}.0.0", plus_one(major))
    } else if caret && minor == "0" && !is_x(x.patch) {
        alloc::format!("{major}.{minor}.{}", plus_one(patch))
    } else {
        alloc::format!("{major}.{}.0", plus_one(minor))
    };
    (low, high)
}

/// `replaceCaret` (`^`) or, when `caret` is false, `replaceTilde` (`~`, `~>`) of one word.
fn replace_caret_tilde(comp: &str, caret: bool) -> String {
    let plain = if caret {
        comp.strip_prefix('^')
    } else {
        comp.strip_prefix("~>").or_else(|| comp.strip_prefix('~'))
    };
    match plain.and_then(xrange_plain_full) {
        Some(x) if is_x(Some(x.major)) => String::new(),
        Some(x) => {
            let (low, high) = bounds(&x, caret);
            alloc::format!(">={low} <{high}-0")
        }
        None => String::from(comp),
    }
}

fn replace_xrange(comp: &str) -> String {
    let (op, rest) = gtlt(comp);
    let Some(x) = xrange_plain_full(rest) else {
        return String::from(comp);
    };
    if is_x(Some(x.major)) {
        return String::from(if op == ">" || op == "<" {
            NULL_SET
        } else {
            "*"
        });
    }
    if !is_x(x.minor) && !is_x(x.patch) {
        return String::from(comp);
    }
    let (low, high) = bounds(&x, false);
    match op {
        "" | "=" => alloc::format!(">={low} <{high}-0"),
        ">" => alloc::format!(">={high}"),
        "<=" => alloc::format!("<{high}-0"),
        "<" => alloc::format!("<{low}-0"),
        // `>=`
        _ => alloc::format!(">={low}"),
    }
}

/// `comp.replace(STAR, '')`: the first `(<|>)?=?\s*\*` is removed.
fn strip_star(comp: &str) -> String {
    remove_first(comp, |i| {
        let after = gtlt(comp.get(i..)?).1.strip_prefix('*')?;
        Some(comp.len() - after.len())
    })
}

/// `comp.trim().split(/\s+/).map(rewrite).join(' ')`. (node-semver splits the x-range step's
/// input untrimmed; an empty end piece only adds an end space, which `strip_star`'s trim drops.)
fn each_word(comp: &str, rewrite: fn(&str) -> String) -> String {
    let words: Vec<String> = split_ws(comp.trim_matches(' '))
        .into_iter()
        .map(rewrite)
        .collect();
    words.join(" ")
}

/// `parseComparator`: build stripped, then carets, tildes, x-ranges and stars rewritten.
fn parse_comparator(comp: &str) -> String {
    let comp = each_word(&strip_build(comp), |word| replace_caret_tilde(word, true));
    let comp = each_word(&comp, |word| replace_caret_tilde(word, false));
    strip_star(each_word(&comp, replace_xrange).trim_matches(' '))
}

/// `Range.parseRange` for one `||` alternative: its comparator values, or `None` on a throw.
fn parse_range(range: &str) -> Option<Vec<String>> {
    let range = hyphen(range).unwrap_or_else(|| String::from(range));
    // `TILDETRIM` (`(\s*)~>?\s+` → `$1~`), then `CARETTRIM` (`(\s*)\^\s+` → `$1^`), global: each
    // keeps its leading space, so each only drops the space (single here) after a `~`, `~>` (and
    // the `>`) or `^`. No two matches overlap, so the order of the passes is free.
    let range = comparator_trim(&range)
        .replace("~> ", "~")
        .replace("~ ", "~")
        .replace("^ ", "^");
    let parsed: Vec<String> = range.split(' ').map(parse_comparator).collect();
    let joined = parsed.join(" ");
    // Duplicates dropped, first occurrence kept.
    let mut unique: Vec<String> = Vec::new();
    for comp in split_ws(&joined) {
        let value = comparator(if comp == ">=0.0.0" { "" } else { comp })?;
        if !unique.contains(&value) {
            unique.push(value);
        }
    }
    if unique.iter().any(|v| v == NULL_SET) {
        return Some(alloc::vec![String::from(NULL_SET)]);
    }
    if unique.len() > 1 {
        unique.retain(|v| !v.is_empty());
    }
    Some(unique)
}

/// node-semver 7.7.4 `validRange(text)` (non-loose, no options): the normalized range, `"*"`
/// for any version, or `None` where node-semver returns `null`. Exact for texts of at most 128
/// UTF-16 code units (the reference's callers refuse longer ones first).
#[must_use]
pub fn valid_range(text: &str) -> Option<String> {
    let raw = collapse(text);
    let mut sets: Vec<Vec<String>> = Vec::new();
    for part in raw.split("||") {
        let set = parse_range(part.trim_matches(' '))?;
        if !set.is_empty() {
            sets.push(set);
        }
    }
    let first = sets.first()?.clone();
    if sets.len() > 1 {
        sets.retain(|set| set[0] != NULL_SET);
        if sets.is_empty() {
            sets.push(first);
        } else if sets.len() > 1
            && let Some(any) = sets.iter().find(|set| set.len() == 1 && set[0].is_empty())
        {
            sets = alloc::vec![any.clone()];
        }
    }
    let formatted = sets
        .iter()
        .map(|set| set.join(" "))
        .collect::<Vec<_>>()
        .join("||");
    Some(if formatted.is_empty() {
        String::from("*")
    } else {
        formatted
    })
}

// ---------------------------------------------------------------------------------------------
// Strict versions (capabilities the Worker sends)
// ---------------------------------------------------------------------------------------------

/// A strict SemVer 2.0.0 version of 1..=64 bytes (node-semver `valid` accepts it unchanged).
#[must_use]
pub(crate) fn is_version(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && !text.starts_with('v')
        && full_version(text).is_some_and(|v| {
            // `full_version` drops build metadata; a strict version keeps all of it.
            text.strip_prefix(v)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('+'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        for (text, normalized) in [
            (">=1.0.0 <2.0.0", ">=1.0.0 <2.0.0"),
            ("^1.2.3", ">=1.2.3 <2.0.0-0"),
            ("~1.0", ">=1.0.0 <1.1.0-0"),
            ("v1.0.0", "1.0.0"),
            (">= 1.0.0", ">=1.0.0"),
            ("~>1.2", ">=1.2.0 <1.3.0-0"),
            ("1 ||", "*"),
            ("1.2.3 - 2", ">=1.2.3 <3.0.0-0"),
            ("\u{a0}1.0.0", "1.0.0"),
            ("+1.0.0", "*"),
            (">*", "<0.0.0-0"),
        ] {
            assert_eq!(valid_range(text).as_deref(), Some(normalized), "{text:?}");
        }
        for bad in [
            "",
            "01.2.3",
            "1.2.3.4",
            "latest",
            ">=",
            "1.2.3 - 2.3.4 - 3",
            "9007199254740992.0.0",
        ] {
            if bad.is_empty() {
                // `validRange('')` is `"*"`; the reference refuses it by length first.
                assert_eq!(valid_range(bad).as_deref(), Some("*"));
            } else {
                assert_eq!(valid_range(bad), None, "{bad:?}");
            }
        }
        assert!(is_version("1.0.0-rc.1+b.2") && !is_version("1.0") && !is_version("1.0.0-01"));
        assert!(!is_version("v1.0.0") && !is_version("1.0.0+"));
    }
}
