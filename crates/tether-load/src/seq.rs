//! Loss and reordering accounting for one subscriber on one channel.
//!
//! Per channel the server numbers messages 1, 2, 3, … (docs/protocol.md). A subscriber that sees
//! every seq in order has lost nothing. A seq above the next expected one opens a gap; the
//! missing seqs are remembered (up to [`MAX_TRACKED_GAPS`]) so that one arriving late counts
//! as **reordered**, not lost. A seq at or below one already seen that was not missing is a
//! **duplicate**. What is still missing at the end, plus everything after the last seq seen
//! up to the channel's final seq, is **lost**.

/// Missing seqs remembered per subscriber; a gap beyond this is counted lost at once (a late
/// arrival from it would then count as a duplicate). Empty in the common case, so a
/// subscriber with no gaps owns no heap.
pub const MAX_TRACKED_GAPS: usize = 4096;

/// Counters for one subscriber's stream of seqs on one channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqTracker {
    /// Highest seq seen, or the channel head at subscribe time before any message.
    last: u64,
    /// Seqs below `last` not yet seen, ascending.
    missing: Vec<u64>,
    /// Seqs given up on because the gap was larger than [`MAX_TRACKED_GAPS`] allows.
    lost_untracked: u64,
    /// Messages that arrived after a higher seq.
    reordered: u64,
    /// Messages whose seq was already seen.
    duplicates: u64,
    /// Messages observed.
    received: u64,
}

/// The final tally of a [`SeqTracker`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTally {
    /// Messages observed (duplicates included).
    pub received: u64,
    /// Seqs never received up to the final seq.
    pub lost: u64,
    /// Messages received after a higher seq.
    pub reordered: u64,
    /// Messages received twice or more.
    pub duplicates: u64,
}

impl SeqTally {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &SeqTally) {
        self.received += other.received;
        self.lost += other.lost;
        self.reordered += other.reordered;
        self.duplicates += other.duplicates;
    }
}

impl SeqTracker {
    /// A tracker that expects `head + 1` next (`head` = `subscribed.seq`, 0 on a new channel).
    pub fn starting_after(head: u64) -> Self {
        SeqTracker { last: head, ..SeqTracker::default() }
    }

    /// Highest seq seen (or the starting head).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Records one received `seq`.
    pub fn observe(&mut self, seq: u64) {
        self.received += 1;
        if seq > self.last {
            let gap = seq - self.last - 1;
            let room = (MAX_TRACKED_GAPS - self.missing.len()) as u64;
            let tracked = gap.min(room);
            self.missing.extend(seq - tracked..seq);
            self.lost_untracked += gap - tracked;
            self.last = seq;
        } else if let Ok(i) = self.missing.binary_search(&seq) {
            self.missing.remove(i);
            self.reordered += 1;
            if self.missing.is_empty() {
                self.missing = Vec::new();
            }
        } else {
            self.duplicates += 1;
        }
    }

    /// The tally once the channel's last published seq is known to be `final_seq` (`None`:
    /// unknown, so nothing after the last seq seen counts as lost).
    pub fn tally(&self, final_seq: Option<u64>) -> SeqTally {
        let tail = final_seq.map_or(0, |f| f.saturating_sub(self.last));
        SeqTally {
            received: self.received,
            lost: self.missing.len() as u64 + self.lost_untracked + tail,
            reordered: self.reordered,
            duplicates: self.duplicates,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(head: u64, seqs: &[u64], final_seq: Option<u64>) -> SeqTally {
        let mut t = SeqTracker::starting_after(head);
        for &s in seqs {
            t.observe(s);
        }
        t.tally(final_seq)
    }

    #[test]
    fn in_order_stream_has_no_loss() {
        let t = run(0, &[1, 2, 3, 4, 5], Some(5));
        assert_eq!(t, SeqTally { received: 5, lost: 0, reordered: 0, duplicates: 0 });
    }

    #[test]
    fn one_drop_and_one_swap_are_counted_once_each() {
        // 3 dropped, 5 and 6 swapped.
        let t = run(0, &[1, 2, 4, 6, 5, 7, 8], Some(8));
        assert_eq!(t, SeqTally { received: 7, lost: 1, reordered: 1, duplicates: 0 });
    }

    #[test]
    fn tail_loss_counts_up_to_the_final_seq() {
        assert_eq!(run(0, &[1, 2], Some(5)).lost, 3);
        assert_eq!(run(0, &[1, 2], None).lost, 0);
    }

    #[test]
    fn starts_after_the_subscribe_head() {
        let t = run(10, &[11, 12], Some(12));
        assert_eq!(t.lost, 0);
        // Seq 10 was already the head at subscribe time: a copy of it is a duplicate.
        assert_eq!(run(10, &[10, 11], Some(11)).duplicates, 1);
    }

    #[test]
    fn duplicates_are_not_reorders() {
        let t = run(0, &[1, 2, 2, 3, 1], Some(3));
        assert_eq!(t, SeqTally { received: 5, lost: 0, reordered: 0, duplicates: 2 });
    }

    #[test]
    fn late_arrival_of_a_whole_gap_is_all_reordered() {
        let t = run(0, &[1, 5, 2, 3, 4], Some(5));
        assert_eq!(t, SeqTally { received: 5, lost: 0, reordered: 3, duplicates: 0 });
    }

    #[test]
    fn huge_gap_is_bounded() {
        let mut t = SeqTracker::starting_after(0);
        t.observe(1_000_000);
        assert!(t.missing.len() <= MAX_TRACKED_GAPS);
        assert_eq!(t.tally(Some(1_000_000)).lost, 999_999);
    }
}
