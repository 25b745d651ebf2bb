/* The compiled free list's containers (mrkit/_engine/_hotc.pyx, FreeList and Boundaries).

   A free list answers, per allocation and per free, a best-fit search over (size, ptr) and a look-up
   of a block's neighbours by address. Red-black trees (std::set, std::map) answer each with a walk of
   data-dependent branches, about half of them mispredicted on a random workload: on RMM's random
   workload that was most of the engine's time. Here each index is a sorted array cut into leaves of
   at most MK_LEAF keys, with the last key of each leaf in its own array: a search is two branch-free
   binary searches (the leaf, then the key in it), an insertion or removal moves at most one leaf's
   keys (1 KiB) and, when a leaf splits, merges or empties, the leaves' arrays (8 bytes a leaf).

   Every operation that can fail (std::bad_alloc, raised to Python as MemoryError by Cython) fails
   before it changes anything: a full leaf is split before a key goes in, and a re-key that moves a
   key inserts the new key before it removes the old one. */
#ifndef MRKIT_FREETREE_H
#define MRKIT_FREETREE_H

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

typedef unsigned long long mk_u64;

/* A key ordered by (hi, lo): (size, ptr) in the size index, (start, size) in the address index. */
struct MkKey {
    mk_u64 hi, lo;
};

static inline bool mk_lt(const MkKey &a, const MkKey &b) {
#ifdef __SIZEOF_INT128__
    /* one 128-bit comparison (cmp, sbb): no branch, where a compiler may branch on the two-part form */
    return (((unsigned __int128)a.hi << 64) | a.lo) < (((unsigned __int128)b.hi << 64) | b.lo);
#else
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo < b.lo));
#endif
}

struct MkKeyLess {
    bool operator()(const MkKey &a, const MkKey &b) const { return mk_lt(a, b); }
};

struct MkU64Less {
    bool operator()(mk_u64 a, mk_u64 b) const { return a < b; }
};

static inline bool mk_eq(const MkKey &a, const MkKey &b) {
    return (a.hi == b.hi) & (a.lo == b.lo);
}

/* The first index in a[0, n) whose key is not below k (n when none): a binary search whose steps
   select with a conditional move, not a branch, and whose number of steps depends on n alone (a loop
   that a CPU predicts). */
template <class T, class Less>
static inline size_t mk_lower(const T *a, size_t n, const T &k, Less less) {
    if (n == 0) {
        return 0;
    }
    const T *base = a;
    while (n > 1) {
        size_t half = n >> 1;
        base += half & (size_t)0 - (size_t)less(base[half - 1], k);  // a mask, not a branch
        n -= half;
    }
    return (size_t)(base - a) + (size_t)less(*base, k);
}

static inline size_t mk_lower_u64(const mk_u64 *a, size_t n, mk_u64 k) {
    return mk_lower(a, n, k, MkU64Less());
}

/* A position in an MkSorted: leaf i, key j. i == leaves() is the end. */
struct MkPos {
    size_t i, j;
};

enum { MK_LEAF = 64 };

/* Sorted unique keys in leaves of at most MK_LEAF keys. */
class MkSorted {
  public:
    size_t size() const { return n_; }
    size_t leaves() const { return leaf_.size(); }
    bool valid(const MkPos &p) const { return p.i < leaf_.size(); }
    const MkKey &at(const MkPos &p) const { return leaf_[p.i][p.j]; }
    MkPos begin() const { return MkPos{0, 0}; }
    MkPos end() const { return MkPos{leaf_.size(), 0}; }

    /* The position of the first key not below k (end() when every key is below it). */
    MkPos lower(const MkKey &k) const {
        MkPos p;
        p.i = mk_lower(last_.data(), last_.size(), k, MkKeyLess());
        p.j = p.i < leaf_.size() ? mk_lower(leaf_[p.i].data(), leaf_[p.i].size(), k, MkKeyLess()) : 0;
        return p;
    }

    /* The position of key k; valid() is false when k is absent. */
    MkPos find(const MkKey &k) const {
        MkPos p = lower(k);
        if (p.i < leaf_.size() && !mk_eq(at(p), k)) {
            p = end();
        }
        return p;
    }

    void next(MkPos &p) const {
        if (++p.j == leaf_[p.i].size()) {
            ++p.i;
            p.j = 0;
        }
    }

    /* Step back: false at the first key (p unchanged). From end(), the last key. */
    bool prev(MkPos &p) const {
        if (p.j) {
            --p.j;
            return true;
        }
        if (p.i == 0) {
            return false;
        }
        --p.i;
        p.j = leaf_[p.i].size() - 1;
        return true;
    }

    const MkKey &back() const { return last_.back(); }

    /* Add k (absent). Fails (bad_alloc) only before any change. */
    void insert(const MkKey &k) {
        if (leaf_.empty()) {
            new_leaf(0);
        }
        size_t i = mk_lower(last_.data(), last_.size(), k, MkKeyLess());
        if (i == leaf_.size()) {
            --i;  // above every key: the last leaf
        }
        if (leaf_[i].size() == MK_LEAF) {  // full: split first (what can fail, before any change)
            split(i);
            if (mk_lt(last_[i], k)) {  // past the lower half: the upper one
                ++i;
            }
        }
        std::vector<MkKey> &l = leaf_[i];
        l.insert(l.begin() + mk_lower(l.data(), l.size(), k, MkKeyLess()), k);  // within capacity: no allocation
        last_[i] = l.back();
        ++n_;
    }

    /* Remove the key at p. Never fails. */
    void erase(const MkPos &p) {
        std::vector<MkKey> &l = leaf_[p.i];
        l.erase(l.begin() + p.j);
        --n_;
        if (l.empty()) {
            drop_leaf(p.i);
            return;
        }
        last_[p.i] = l.back();
        if (l.size() < MK_LEAF / 4) {
            if (p.i + 1 < leaf_.size() && l.size() + leaf_[p.i + 1].size() <= MK_LEAF * 3 / 4) {
                merge(p.i);
            } else if (p.i > 0 && l.size() + leaf_[p.i - 1].size() <= MK_LEAF * 3 / 4) {
                merge(p.i - 1);
            }
        }
    }

    /* Change the key at p to k (absent, or equal to it); true when the key stayed at p (positions
       elsewhere unchanged). Where k belongs in the same leaf, the keys between its old and new place
       shift by one; else k is inserted, then the old key removed. Fails only before any change. */
    bool rekey(const MkPos &p, const MkKey &k) {
        std::vector<MkKey> &l = leaf_[p.i];
        size_t c = l.size();
        bool after_prev = p.j ? mk_lt(l[p.j - 1], k) : (p.i == 0 || mk_lt(last_[p.i - 1], k));
        bool before_next = p.j + 1 < c ? mk_lt(k, l[p.j + 1])
                                       : (p.i + 1 == leaf_.size() || mk_lt(k, leaf_[p.i + 1][0]));
        if (after_prev && before_next) {
            l[p.j] = k;
            if (p.j + 1 == c) {
                last_[p.i] = k;
            }
            return true;
        }
        bool in_leaf = (p.i == 0 || mk_lt(last_[p.i - 1], k)) &&
                       (p.i + 1 == leaf_.size() || mk_lt(k, leaf_[p.i + 1][0]));
        if (in_leaf) {
            MkKey *d = l.data();
            size_t q = mk_lower(d, c, k, MkKeyLess());  // k's place among the leaf's keys (its old one included)
            if (q <= p.j) {  // moves down: the keys in [q, j) shift up
                std::memmove(d + q + 1, d + q, (p.j - q) * sizeof(MkKey));
                d[q] = k;
            } else {  // moves up: the keys in (j, q) shift down
                std::memmove(d + p.j, d + p.j + 1, (q - p.j - 1) * sizeof(MkKey));
                d[q - 1] = k;
            }
            last_[p.i] = d[c - 1];
            return false;
        }
        MkKey old = l[p.j];
        insert(k);
        erase(find(old));
        return false;
    }

  private:
    std::vector<std::vector<MkKey> > leaf_;
    std::vector<MkKey> last_;  // the last key of each leaf (each leaf holds one or more)
    size_t n_ = 0;

    /* Room for one more leaf in both arrays (what can fail, before any change). */
    void reserve_leaf() {
        if (leaf_.size() == leaf_.capacity()) {
            leaf_.reserve(leaf_.size() * 2 + 4);
        }
        if (last_.size() == last_.capacity()) {
            last_.reserve(last_.size() * 2 + 4);
        }
    }

    void new_leaf(size_t i) {
        std::vector<MkKey> l;
        l.reserve(MK_LEAF);
        reserve_leaf();
        leaf_.insert(leaf_.begin() + i, std::move(l));
        last_.insert(last_.begin() + i, MkKey{0, 0});
    }

    /* Leaf i (full) becomes two halves. */
    void split(size_t i) {
        std::vector<MkKey> upper;
        upper.reserve(MK_LEAF);
        reserve_leaf();
        std::vector<MkKey> &l = leaf_[i];
        size_t h = l.size() / 2;
        upper.assign(l.begin() + h, l.end());  // within the reserved capacity
        l.resize(h);
        last_[i] = l.back();
        MkKey up = upper.back();
        leaf_.insert(leaf_.begin() + i + 1, std::move(upper));
        last_.insert(last_.begin() + i + 1, up);
    }

    /* Leaf i + 1 appended to leaf i (their sizes together within MK_LEAF). */
    void merge(size_t i) {
        std::vector<MkKey> &a = leaf_[i];
        std::vector<MkKey> &b = leaf_[i + 1];
        a.insert(a.end(), b.begin(), b.end());  // within capacity
        last_[i] = a.back();
        drop_leaf(i + 1);
    }

    void drop_leaf(size_t i) {
        leaf_.erase(leaf_.begin() + i);
        last_.erase(last_.begin() + i);
    }
};

/* Free blocks of one stream: a size index (size, ptr) for best fit and an address index
   (start, size) for the neighbours of a block being freed; every block is in both. */
class MkFreeList {
  public:
    mk_u64 free_bytes = 0;

    size_t count() const { return by_addr.size(); }

    /* Add a free block without coalescing. */
    void add(mk_u64 ptr, mk_u64 size) {
        by_size.insert(MkKey{size, ptr});
        try {
            by_addr.insert(MkKey{ptr, size});
        } catch (...) {
            by_size.erase(by_size.find(MkKey{size, ptr}));
            throw;
        }
        free_bytes += size;
    }

    /* Whether the free block [ptr, ptr + size) is one; removed if so. */
    bool remove(mk_u64 ptr, mk_u64 size) {
        MkPos a = by_addr.find(MkKey{ptr, size});
        if (!by_addr.valid(a)) {
            return false;
        }
        by_addr.erase(a);
        by_size.erase(by_size.find(MkKey{size, ptr}));
        free_bytes -= size;
        return true;
    }

    /* The neighbours of [ptr, ptr + size) that are free: the block ending at ptr (its start and size
       in prev) and the block starting at ptr + size (its size in next_size); false where none. Their
       places in the address index are kept for the insert() that follows. */
    void neighbours(mk_u64 ptr, mk_u64 size, int *has_prev, MkKey *prev, int *has_next,
                    mk_u64 *next_size) {
        mk_u64 nxt = ptr + size;
        MkPos p = by_addr.lower(MkKey{nxt, 0});
        *has_next = by_addr.valid(p) && by_addr.at(p).hi == nxt;
        if (*has_next) {
            *next_size = by_addr.at(p).lo;
            next_pos_ = p;
        }
        *has_prev = by_addr.prev(p) && by_addr.at(p).hi + by_addr.at(p).lo == ptr;
        if (*has_prev) {
            *prev = by_addr.at(p);
            prev_pos_ = p;
        }
    }

    /* Free [ptr, ptr + size), joined with the neighbours that neighbours() just found, where allowed
       (has_prev: the block ending at ptr, prev; has_next: the block starting at ptr + size, of nsize
       bytes). Nothing may change the list between the two calls. */
    void insert(mk_u64 ptr, mk_u64 size, bool has_prev, MkKey prev, bool has_next, mk_u64 nsize) {
        mk_u64 nxt = ptr + size;
        if (has_prev) {  // the previous block grows upwards (and swallows the next one)
            mk_u64 p = prev.hi, psize = prev.lo;
            mk_u64 total = psize + size + (has_next ? nsize : 0);
            by_size.rekey(by_size.find(MkKey{psize, p}), MkKey{total, p});  // what can fail, first
            if (has_next) {
                by_size.erase(by_size.find(MkKey{nsize, nxt}));
            }
            // the address index: the previous block's start stays, so its key keeps its place (rekey
            // changes it where it is) and the next block's position, found by neighbours(), holds
            by_addr.rekey(prev_pos_, MkKey{p, total});
            if (has_next) {
                by_addr.erase(next_pos_);
            }
        } else if (has_next) {  // the next block grows downwards (keeping its place by address)
            by_size.rekey(by_size.find(MkKey{nsize, nxt}), MkKey{size + nsize, ptr});
            by_addr.rekey(next_pos_, MkKey{ptr, size + nsize});
        } else {
            add(ptr, size);
            return;
        }
        free_bytes += size;
    }

    /* Best fit for n bytes: the position in the size index of the smallest block that holds them, the
       lowest address first among one size (invalid: nothing fits). */
    MkPos best(mk_u64 n) const { return by_size.lower(MkKey{n, 0}); }

    /* Take n bytes from the start of the free block at p in the size index (it holds them); its start. */
    mk_u64 cut_at(const MkPos &p, mk_u64 n) {
        MkKey b = by_size.at(p);
        mk_u64 bsize = b.hi, ptr = b.lo;
        if (bsize > n) {  // the remainder stays: its address key keeps its place
            by_size.rekey(p, MkKey{bsize - n, ptr + n});
            by_addr.rekey(by_addr.find(MkKey{ptr, bsize}), MkKey{ptr + n, bsize - n});
        } else {
            by_addr.erase(by_addr.find(MkKey{ptr, bsize}));
            by_size.erase(p);
        }
        free_bytes -= n;
        return ptr;
    }

    /* Best fit, the block starting at spare taken only when nothing else fits: true and the start in
       out, else false. */
    bool take(mk_u64 n, bool has_spare, mk_u64 spare, mk_u64 *out) {
        MkPos p = best(n);
        if (!by_size.valid(p)) {
            return false;
        }
        if (has_spare && by_size.at(p).lo == spare) {
            MkPos q = p;
            by_size.next(q);
            if (by_size.valid(q)) {
                p = q;
            }
        }
        *out = cut_at(p, n);
        return true;
    }

    /* The size of the free block that starts at ptr: false when none does. */
    bool size_at(mk_u64 ptr, mk_u64 *out) const {
        MkPos p = by_addr.lower(MkKey{ptr, 0});
        if (!by_addr.valid(p) || by_addr.at(p).hi != ptr) {
            return false;
        }
        *out = by_addr.at(p).lo;
        return true;
    }

    /* The start of the free block that ends at e: false when none does. */
    bool ending_at(mk_u64 e, mk_u64 *out) const {
        MkPos p = by_addr.lower(MkKey{e, 0});
        if (!by_addr.prev(p) || by_addr.at(p).hi + by_addr.at(p).lo != e) {
            return false;
        }
        *out = by_addr.at(p).hi;
        return true;
    }

    /* Take [at, at + n) out of the free block that starts at block; the rest stays free. False (nothing
       changed) when no free block starts at block. */
    bool cut(mk_u64 block, mk_u64 at, mk_u64 n) {
        mk_u64 bsize;
        if (!size_at(block, &bsize)) {
            return false;
        }
        mk_u64 end = block + bsize;
        remove(block, bsize);
        try {
            if (at > block) {
                add(block, at - block);
            }
            if (end > at + n) {
                add(at + n, end - at - n);
            }
        } catch (...) {  // put it back as it was
            if (at > block) {
                remove(block, at - block);
            }
            add(block, bsize);
            throw;
        }
        return true;
    }

    /* Up to k blocks (size, ptr) that hold n bytes, best fit first. */
    void candidates(mk_u64 n, size_t k, std::vector<MkKey> &out) const {
        for (MkPos p = best(n); by_size.valid(p) && out.size() < k; by_size.next(p)) {
            out.push_back(by_size.at(p));
        }
    }

    /* Every block (size, ptr), smallest first, the lowest address first within a size. */
    void blocks(std::vector<MkKey> &out) const {
        out.reserve(by_size.size());
        for (MkPos p = by_size.begin(); by_size.valid(p); by_size.next(p)) {
            out.push_back(by_size.at(p));
        }
    }

    /* Every block (ptr, size), the lowest address first. */
    void items(std::vector<MkKey> &out) const {
        out.reserve(by_addr.size());
        for (MkPos p = by_addr.begin(); by_addr.valid(p); by_addr.next(p)) {
            out.push_back(by_addr.at(p));
        }
    }

    mk_u64 largest() const { return by_size.size() ? by_size.back().hi : 0; }

    const MkSorted &sizes() const { return by_size; }

  private:
    MkSorted by_size;  // (size, ptr)
    MkSorted by_addr;  // (start, size)
    MkPos prev_pos_ = MkPos{0, 0}, next_pos_ = MkPos{0, 0};  // what neighbours() found
};

/* Chunk bases (blocks never coalesce across one): a sorted array, searched without branches; chunks
   come and go far less often than blocks, so an insertion moves the array. */
class MkBounds {
  public:
    bool has(mk_u64 b) const {
        size_t i = mk_lower(v_.data(), v_.size(), b, MkU64Less());
        return i < v_.size() && v_[i] == b;
    }
    void add(mk_u64 b) {
        size_t i = mk_lower(v_.data(), v_.size(), b, MkU64Less());
        if (i == v_.size() || v_[i] != b) {
            v_.insert(v_.begin() + i, b);
        }
    }
    void discard(mk_u64 b) {
        size_t i = mk_lower(v_.data(), v_.size(), b, MkU64Less());
        if (i < v_.size() && v_[i] == b) {
            v_.erase(v_.begin() + i);
        }
    }
    size_t size() const { return v_.size(); }
    mk_u64 get(size_t i) const { return v_[i]; }

  private:
    std::vector<mk_u64> v_;
};

#endif
