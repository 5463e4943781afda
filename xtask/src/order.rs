//! The order of the measurements of one benchmark round, shared by the
//! xtask benchmarks (`bench-ab`, `bench-serve`) and `cargo xtask bench`'s
//! binary (`tests/src/bin/bench.rs`, which includes this file by path:
//! xtask has no dependency on the test crate, nor it on xtask).

/// The order of `slots` measurements in round `round`: a permutation
/// that changes every round (xorshift from the round number; the same
/// every run). A plain rotation keeps each measurement right after the
/// same other one: a served turn's warm sandbox, built in the background
/// after its reply, then always weighs on the same neighbour (3.7 % on the
/// cold turn after it, measured: the build compared second lost either
/// way round).
pub fn round_order(round: usize, slots: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..slots).collect();
    let mut x = (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..slots).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::round_order;

    /// Every round is a permutation of the slots, and no slot always runs
    /// right after the same one (what a rotation did).
    #[test]
    fn rounds_are_permutations_whose_neighbours_change() {
        let slots = 5;
        let mut after = vec![std::collections::BTreeSet::new(); slots];
        for round in 0..200 {
            let order = round_order(round, slots);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..slots).collect::<Vec<_>>(),
                "round {round}: {order:?}"
            );
            for w in order.windows(2) {
                after[w[1]].insert(w[0]);
            }
        }
        for (slot, before) in after.iter().enumerate() {
            assert!(
                before.len() >= slots - 1,
                "slot {slot} only ever follows {before:?}"
            );
        }
    }
}
