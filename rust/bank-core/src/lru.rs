//! Intrusive doubly-linked lists over slot ids: O(1) push, unlink and move-to-most-recent.
//!
//! A `Links` holds the prev/next pointers of one family of disjoint lists (each slot is in at
//! most one list of the family): the per-tenant lists share one `Links`, the pool list and the
//! global list each have their own. A `List` is just the head (least recent), tail (most recent)
//! and length of one list.

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    pub head: u32, // least recently used
    pub tail: u32, // most recently used
    pub len: u32,
}

impl List {
    pub const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };
}

#[derive(Clone, Debug)]
pub(crate) struct Links {
    prev: Vec<u32>, // [N]
    next: Vec<u32>, // [N]
}

impl Links {
    pub fn new(capacity: usize) -> Links {
        Links { prev: vec![NIL; capacity], next: vec![NIL; capacity] }
    }

    /// Appends `slot` (not in any list of this family) as the most recent entry of `list`.
    pub fn push_mru(&mut self, list: &mut List, slot: u32) {
        let s = slot as usize;
        self.prev[s] = list.tail;
        self.next[s] = NIL;
        if list.tail == NIL {
            list.head = slot;
        } else {
            self.next[list.tail as usize] = slot;
        }
        list.tail = slot;
        list.len += 1;
    }

    /// Removes `slot` (a member of `list`) from `list`.
    pub fn unlink(&mut self, list: &mut List, slot: u32) {
        let s = slot as usize;
        let (p, n) = (self.prev[s], self.next[s]);
        if p == NIL {
            list.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            list.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        list.len -= 1;
    }

    pub fn move_to_mru(&mut self, list: &mut List, slot: u32) {
        if list.tail != slot {
            self.unlink(list, slot);
            self.push_mru(list, slot);
        }
    }

    /// The members of `list`, least recently used first.
    pub fn iter<'a>(&'a self, list: &List) -> impl Iterator<Item = u32> + 'a {
        let mut cur = list.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let slot = cur;
            cur = self.next[slot as usize];
            Some(slot)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(links: &Links, list: &List) -> Vec<u32> {
        links.iter(list).collect()
    }

    #[test]
    fn push_unlink_move_keep_order_and_length() {
        let mut links = Links::new(5);
        let mut list = List::EMPTY;
        for s in [3, 0, 4] {
            links.push_mru(&mut list, s);
        }
        assert_eq!(order(&links, &list), vec![3, 0, 4]);
        links.move_to_mru(&mut list, 3);
        assert_eq!(order(&links, &list), vec![0, 4, 3]);
        links.unlink(&mut list, 4);
        assert_eq!(order(&links, &list), vec![0, 3]);
        assert_eq!((list.head, list.tail, list.len), (0, 3, 2));
        links.unlink(&mut list, 0);
        links.unlink(&mut list, 3);
        assert_eq!(list, List::EMPTY);
    }
}
