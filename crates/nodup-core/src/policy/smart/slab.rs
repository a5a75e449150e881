//! The in-memory fingerprints of `smart`: a fixed-capacity slab of nodes (allocated once from
//! the budget), each in its prefix's sorted group list and, for the per-fingerprint eviction
//! policies, in one recency or reference-count list.

use super::tree::NIL;

/// One in-memory fingerprint (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    /// Mixed fingerprint (`index::mix`), the sort key of the groups.
    pub(crate) h: u64,
    /// Entry location on the medium.
    pub(crate) loc: u64,
    /// Next node of the same group (ascending `h`), [`NIL`] at the end; the free list's link
    /// for a free node.
    pub(crate) gnext: u32,
    /// Neighbours in the recency or reference-count list (per-fingerprint eviction only).
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// References last heard of (reference-count eviction); the top bit marks a provisional
    /// entry (see [`PROVISIONAL`]).
    pub(crate) refs: u32,
}

/// Flag in [`Node::refs`]: the entry was created by an inline miss and the worker has not
/// yet looked for an older copy on the medium.
pub(crate) const PROVISIONAL: u32 = 1 << 31;

/// A doubly linked list of nodes through `prev`/`next`; `head` is the most recent end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
        }
    }
}

/// The node slab.
#[derive(Debug)]
pub(crate) struct Slab {
    nodes: Vec<Node>,
    free: u32,
    live: u32,
    cap: u32,
}

impl Slab {
    /// A slab of at most `cap` nodes, reserved at once; an error when the system refuses the
    /// reservation (a budget beyond this machine), where `Vec::with_capacity` would abort.
    pub(crate) fn with_capacity(cap: u32) -> Result<Slab, std::collections::TryReserveError> {
        let mut nodes = Vec::new();
        nodes.try_reserve_exact(cap as usize)?;
        Ok(Slab {
            nodes,
            free: NIL,
            live: 0,
            cap,
        })
    }

    /// Nodes in use.
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// True when no node is free.
    pub(crate) fn is_full(&self) -> bool {
        self.live >= self.cap
    }

    /// Heap bytes (the reserved array).
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.nodes.capacity() * std::mem::size_of::<Node>()) as u64
    }

    /// Take a node for `h`/`loc`; `None` when the slab is full.
    pub(crate) fn alloc(&mut self, h: u64, loc: u64) -> Option<u32> {
        let n = Node {
            h,
            loc,
            gnext: NIL,
            prev: NIL,
            next: NIL,
            refs: 1,
        };
        if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].gnext;
            self.nodes[i as usize] = n;
            self.live += 1;
            return Some(i);
        }
        if self.nodes.len() as u32 >= self.cap {
            return None;
        }
        self.nodes.push(n);
        self.live += 1;
        Some(self.nodes.len() as u32 - 1)
    }

    /// Give node `i` back (it must be unlinked from every list).
    pub(crate) fn free(&mut self, i: u32) {
        self.nodes[i as usize].gnext = self.free;
        self.free = i;
        self.live -= 1;
    }

    /// Forget every node.
    pub(crate) fn clear(&mut self) {
        self.nodes.clear();
        self.free = NIL;
        self.live = 0;
    }

    #[inline]
    pub(crate) fn get(&self, i: u32) -> &Node {
        &self.nodes[i as usize]
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize]
    }

    /// Put node `i` at the head of `l`.
    pub(crate) fn push_front(&mut self, l: &mut List, i: u32) {
        let old = l.head;
        {
            let n = self.get_mut(i);
            n.prev = NIL;
            n.next = old;
        }
        if old != NIL {
            self.get_mut(old).prev = i;
        } else {
            l.tail = i;
        }
        l.head = i;
    }

    /// Take node `i` out of `l`.
    pub(crate) fn unlink(&mut self, l: &mut List, i: u32) {
        let (p, n) = {
            let x = self.get(i);
            (x.prev, x.next)
        };
        if p != NIL {
            self.get_mut(p).next = n;
        } else {
            l.head = n;
        }
        if n != NIL {
            self.get_mut(n).prev = p;
        } else {
            l.tail = p;
        }
        let x = self.get_mut(i);
        x.prev = NIL;
        x.next = NIL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_32_bytes_and_the_slab_keeps_its_capacity() {
        assert_eq!(std::mem::size_of::<Node>(), 32);
        let mut s = Slab::with_capacity(2).unwrap();
        let a = s.alloc(1, 10).unwrap();
        let b = s.alloc(2, 20).unwrap();
        assert!(s.alloc(3, 30).is_none());
        assert!(s.is_full());
        s.free(a);
        let c = s.alloc(3, 30).unwrap();
        assert_eq!(c, a);
        assert_eq!(s.get(b).loc, 20);
        assert_eq!(s.memory_bytes(), 64);
    }

    #[test]
    fn list_order() {
        let mut s = Slab::with_capacity(4).unwrap();
        let mut l = List::default();
        let ids: Vec<u32> = (0..3).map(|i| s.alloc(i, i).unwrap()).collect();
        for &i in &ids {
            s.push_front(&mut l, i);
        }
        assert_eq!((l.head, l.tail), (ids[2], ids[0]));
        s.unlink(&mut l, ids[1]);
        assert_eq!(s.get(ids[2]).next, ids[0]);
        s.unlink(&mut l, ids[0]);
        assert_eq!(l.tail, ids[2]);
        s.unlink(&mut l, ids[2]);
        assert_eq!(l, List::default());
    }
}
