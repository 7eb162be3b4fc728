//! Intrusive doubly-linked lists over slot ids: O(1) push, unlink and move-to-most-recent.
//!
//! The links live inside the caller's per-slot records (anything that is `AsMut<Link>`), so a
//! touched slot's link, owner and stamp share one cache line. Lists of one family are disjoint
//! (a slot is in at most one). A `List` is the head (least recent), tail (most recent) and length.

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub prev: u32,
    pub next: u32,
}

impl Link {
    pub const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

impl AsRef<Link> for Link {
    fn as_ref(&self) -> &Link {
        self
    }
}

impl AsMut<Link> for Link {
    fn as_mut(&mut self) -> &mut Link {
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    pub head: u32, // least recently used
    pub tail: u32, // most recently used
    pub len: u32,
}

impl List {
    pub const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// Appends `slot` (in no list) as the most recent entry of `list`.
pub(crate) fn push_mru<T: AsMut<Link>>(nodes: &mut [T], list: &mut List, slot: u32) {
    *nodes[slot as usize].as_mut() = Link {
        prev: list.tail,
        next: NIL,
    };
    if list.tail == NIL {
        list.head = slot;
    } else {
        nodes[list.tail as usize].as_mut().next = slot;
    }
    list.tail = slot;
    list.len += 1;
}

/// Removes `slot` (a member of `list`) from `list`.
pub(crate) fn unlink<T: AsMut<Link>>(nodes: &mut [T], list: &mut List, slot: u32) {
    let Link { prev, next } = *nodes[slot as usize].as_mut();
    if prev == NIL {
        list.head = next;
    } else {
        nodes[prev as usize].as_mut().next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        nodes[next as usize].as_mut().prev = prev;
    }
    *nodes[slot as usize].as_mut() = Link::NONE;
    list.len -= 1;
}

pub(crate) fn move_to_mru<T: AsMut<Link>>(nodes: &mut [T], list: &mut List, slot: u32) {
    if list.tail != slot {
        unlink(nodes, list, slot);
        push_mru(nodes, list, slot);
    }
}

/// The members of `list`, least recently used first.
pub(crate) fn iter<'a, T: AsRef<Link>>(
    nodes: &'a [T],
    list: &List,
) -> impl Iterator<Item = u32> + 'a {
    let mut cur = list.head;
    std::iter::from_fn(move || {
        if cur == NIL {
            return None;
        }
        let slot = cur;
        cur = nodes[slot as usize].as_ref().next;
        Some(slot)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(nodes: &[Link], list: &List) -> Vec<u32> {
        iter(nodes, list).collect()
    }

    #[test]
    fn push_unlink_move_keep_order_and_length() {
        let mut nodes = vec![Link::NONE; 5];
        let mut list = List::EMPTY;
        for s in [3, 0, 4] {
            push_mru(&mut nodes, &mut list, s);
        }
        assert_eq!(order(&nodes, &list), vec![3, 0, 4]);
        move_to_mru(&mut nodes, &mut list, 3);
        assert_eq!(order(&nodes, &list), vec![0, 4, 3]);
        move_to_mru(&mut nodes, &mut list, 3);
        assert_eq!(order(&nodes, &list), vec![0, 4, 3]);
        unlink(&mut nodes, &mut list, 4);
        assert_eq!(order(&nodes, &list), vec![0, 3]);
        assert_eq!((list.head, list.tail, list.len), (0, 3, 2));
        unlink(&mut nodes, &mut list, 0);
        unlink(&mut nodes, &mut list, 3);
        assert_eq!(list, List::EMPTY);
        assert!(nodes.iter().all(|n| *n == Link::NONE));
    }
}
