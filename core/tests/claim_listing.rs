//! Pending-claim create/replace/clear rules (reference §3.4) and the pure listing and capacity
//! rules (reference §3.8–§3.9).

use ql_worker_core::claim::{
    ClaimCreate, ClaimError, PendingClaim, check_clear, check_create, check_replace,
};
use ql_worker_core::ids::{OfferId, Revision};
use ql_worker_core::listing::{Capacity, Page, PageLimit, page};
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn claim() -> PendingClaim {
    PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(1),
        testkit::lease_token(1),
        ms(1000),
    )
}

fn attempted(c: &PendingClaim) -> PendingClaim {
    let mut next = c.clone();
    next.revision = c.revision.next().unwrap();
    next.attempt_count += 1;
    next.last_attempt_at_ms = Some(ms(1000));
    next
}

#[test]
fn claim_create_is_idempotent_only_for_the_identical_claim() {
    let c = claim();
    assert_eq!(check_create(None, &c), Ok(ClaimCreate::Publish));
    assert_eq!(check_create(Some(&c), &c), Ok(ClaimCreate::AlreadyExists));
    let other = PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(2),
        testkit::lease_token(1),
        ms(1000),
    );
    assert_eq!(check_create(Some(&c), &other), Err(ClaimError::Conflict));
    let mut at_one = c.clone();
    at_one.revision = Revision::new(1).unwrap();
    assert!(matches!(
        check_create(None, &at_one),
        Err(ClaimError::Invalid {
            field: "revision",
            ..
        })
    ));
}

#[test]
fn claim_replace_requires_the_revision_cas_and_the_same_identity() {
    let c = claim();
    let next = attempted(&c);
    assert_eq!(check_replace(&c, &next, Revision::FIRST), Ok(()));
    assert!(matches!(
        check_replace(&c, &next, Revision::new(1).unwrap()),
        Err(ClaimError::RevisionConflict { .. })
    ));
    let mut skip = next.clone();
    skip.revision = Revision::new(2).unwrap();
    assert!(matches!(
        check_replace(&c, &skip, Revision::FIRST),
        Err(ClaimError::RevisionConflict { .. })
    ));
    let mut other_token = next.clone();
    other_token.lease_token = testkit::lease_token(7);
    assert!(matches!(
        check_replace(&c, &other_token, Revision::FIRST),
        Err(ClaimError::RevisionConflict { .. })
    ));
    // A caller that expects revision 1 while revision 0 is stored is refused even when its
    // proposal is the successor of what it expected (each rule holds on its own).
    let mut after_expected = next.clone();
    after_expected.revision = Revision::new(2).unwrap();
    assert!(matches!(
        check_replace(&c, &after_expected, Revision::new(1).unwrap()),
        Err(ClaimError::RevisionConflict { .. })
    ));
}

#[test]
fn claim_clear_requires_offer_id_and_revision() {
    let c = attempted(&claim());
    assert_eq!(
        check_clear(&c, &testkit::offer_id(1), Revision::new(1).unwrap()),
        Ok(())
    );
    assert!(check_clear(&c, &testkit::offer_id(1), Revision::FIRST).is_err());
    assert!(check_clear(&c, &testkit::offer_id(2), Revision::new(1).unwrap()).is_err());
}

#[test]
fn claim_field_bounds() {
    let mut c = claim();
    c.attempt_count = 16;
    c.last_attempt_at_ms = Some(ms(1000));
    assert_eq!(
        c.validate(),
        Ok(()),
        "16 attempts is the budget, not past it"
    );
    c.attempt_count = 17;
    assert!(matches!(
        c.validate(),
        Err(ClaimError::Invalid {
            field: "attemptCount",
            ..
        })
    ));
    let mut c = claim();
    c.last_attempt_at_ms = Some(ms(2000));
    assert!(matches!(
        c.validate(),
        Err(ClaimError::Invalid {
            field: "lastAttemptAtMs",
            ..
        })
    ));
    let mut c = claim();
    c.next_attempt_at_ms = ms(999);
    assert!(matches!(
        c.validate(),
        Err(ClaimError::Invalid {
            field: "nextAttemptAtMs",
            ..
        })
    ));
    let mut c = claim();
    c.updated_at_ms = ms(999);
    assert!(matches!(
        c.validate(),
        Err(ClaimError::Invalid {
            field: "updatedAtMs",
            ..
        })
    ));
}

fn ids(names: &[&str]) -> Vec<OfferId> {
    names.iter().map(|n| OfferId::new(*n).unwrap()).collect()
}

#[test]
fn listing_pages_with_a_stable_bounded_cursor() {
    // Reference scenario 6.1.3: three offers, limit 2 → [a, b] + cursor b, then [c], no cursor.
    let all = ids(&["c", "a", "b"]);
    let limit = PageLimit::new(2).unwrap();
    let first = page(all.clone(), None, limit);
    assert_eq!(
        first,
        Page {
            offer_ids: ids(&["a", "b"]),
            next_after: Some(OfferId::new("b").unwrap())
        }
    );
    let second = page(all.clone(), first.next_after.as_ref(), limit);
    assert_eq!(
        second,
        Page {
            offer_ids: ids(&["c"]),
            next_after: None
        }
    );
    let exact = page(ids(&["a", "b"]), None, limit);
    assert_eq!(exact.next_after, None, "no cursor when nothing remains");
    let past = page(all, Some(&OfferId::new("z").unwrap()), limit);
    assert!(past.offer_ids.is_empty());
}

#[test]
fn listing_limit_and_capacity_bounds() {
    assert!(PageLimit::new(0).is_err());
    assert!(PageLimit::new(65).is_err());
    assert_eq!(PageLimit::new(64).unwrap().get(), 64);
    assert_eq!(PageLimit::default().get(), 16);
    assert!(Capacity::new(0).is_err());
    assert!(Capacity::new(1025).is_err());
    assert_eq!(Capacity::default().get(), 64);
    let two = Capacity::new(2).unwrap();
    assert!(two.admits_one_more(1));
    assert!(!two.admits_one_more(2));
}

#[test]
fn listing_a_full_inbox_visits_every_id_once() {
    let all: Vec<OfferId> = (0..1024)
        .map(|n| OfferId::new(format!("o{n:04}")).unwrap())
        .collect();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let p = page(all.clone(), cursor.as_ref(), PageLimit::new(64).unwrap());
        assert!(p.offer_ids.len() <= 64);
        seen.extend(p.offer_ids);
        match p.next_after {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, all);
}
