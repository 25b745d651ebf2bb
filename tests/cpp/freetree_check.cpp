// A randomized check of mrkit/_engine/_freetree.h against the standard library, built and run by
// tests/test_freetree_cpp.py (with AddressSanitizer and UBSan where the compiler has them):
// MkSorted against std::set on inserts, removals, re-keys and searches across many leaves; MkBounds
// against std::set; MkFreeList (best fit, coalescing, boundaries) against a plain model. Exit 0 and
// "ok" when every answer agrees; a message and exit 1 at the first disagreement.
#include "_freetree.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            std::printf("FAILED line %d: %s (seed %llu, step %d)\n", __LINE__, #cond, \
                        (unsigned long long)seed, step);                     \
            std::exit(1);                                                    \
        }                                                                    \
    } while (0)

typedef std::pair<mk_u64, mk_u64> P;

static void sorted_vs_set(mk_u64 seed) {
    std::mt19937_64 r(seed);
    MkSorted s;
    std::set<P> ref;
    int range = 1 + (int)(r() % 4000), steps = 20000;
    for (int step = 0; step < steps; step++) {
        mk_u64 a = r() % range, b = r() % 4;
        int op = (int)(r() % 5);
        if (op <= 1) {
            if (!ref.count(P(a, b))) {
                s.insert(MkKey{a, b});
                ref.insert(P(a, b));
            }
        } else if (op == 2) {
            MkPos p = s.find(MkKey{a, b});
            CHECK(s.valid(p) == (ref.count(P(a, b)) != 0));
            if (s.valid(p)) {
                s.erase(p);
                ref.erase(P(a, b));
            }
        } else if (op == 3 && !ref.empty()) {
            MkPos p = s.lower(MkKey{a, b});
            if (s.valid(p)) {
                MkKey old = s.at(p), k{r() % range, r() % 4};
                if (!ref.count(P(k.hi, k.lo))) {
                    s.rekey(p, k);
                    ref.erase(P(old.hi, old.lo));
                    ref.insert(P(k.hi, k.lo));
                }
            }
        }
        mk_u64 qa = r() % range, qb = r() % 4;
        MkPos p = s.lower(MkKey{qa, qb});
        std::set<P>::iterator it = ref.lower_bound(P(qa, qb));
        CHECK(s.valid(p) == (it != ref.end()));
        if (it != ref.end()) {
            CHECK(s.at(p).hi == it->first && s.at(p).lo == it->second);
        }
        MkPos q = p;
        bool has_prev = s.prev(q);
        CHECK(has_prev == (it != ref.begin()));
        if (has_prev) {
            std::set<P>::iterator pit = std::prev(it);
            CHECK(s.at(q).hi == pit->first && s.at(q).lo == pit->second);
        }
        CHECK(s.size() == ref.size());
        if (step % 500 == 0 || step == steps - 1) {
            std::set<P>::iterator e = ref.begin();
            for (MkPos w = s.begin(); s.valid(w); s.next(w), ++e) {
                CHECK(e != ref.end() && s.at(w).hi == e->first && s.at(w).lo == e->second);
            }
            CHECK(e == ref.end());
            if (!ref.empty()) {
                CHECK(s.back().hi == ref.rbegin()->first && s.back().lo == ref.rbegin()->second);
            }
        }
    }
}

static void bounds_vs_set(mk_u64 seed) {
    std::mt19937_64 r(seed);
    MkBounds b;
    std::set<mk_u64> ref;
    for (int step = 0; step < 20000; step++) {
        mk_u64 v = r() % 700;
        int op = (int)(r() % 3);
        if (op == 0) {
            b.add(v);
            ref.insert(v);
        } else if (op == 1) {
            b.discard(v);
            ref.erase(v);
        }
        CHECK(b.has(v) == (ref.count(v) != 0) && b.size() == ref.size());
    }
}

// The model: free blocks start -> size, coalesced unless a boundary lies between.
static void freelist_vs_model(mk_u64 seed) {
    std::mt19937_64 r(seed);
    const mk_u64 G = 256, base = 1ULL << 40, chunk = 4096 * G;
    MkFreeList fl;
    MkBounds bounds;
    std::map<mk_u64, mk_u64> model;
    for (int c = 0; c < 4; c++) {
        bounds.add(base + c * chunk);
        fl.add(base + c * chunk, chunk);
        model[base + c * chunk] = chunk;
    }
    std::vector<P> live;
    size_t peak = 0;
    int step = 0;
    for (; step < 10000; step++) {
        peak = fl.count() > peak ? fl.count() : peak;
        bool take = step < 3000 || (r() % 20) < 9 || live.empty();
        if (take) {
            mk_u64 n = (1 + r() % ((r() % 4) ? 4 : 64)) * G;
            // best fit in the model: the smallest size that holds n, the lowest address among them
            mk_u64 best = 0, bsize = ~0ULL;
            for (std::map<mk_u64, mk_u64>::iterator it = model.begin(); it != model.end(); ++it) {
                if (it->second >= n && it->second < bsize) {
                    best = it->first;
                    bsize = it->second;
                }
            }
            mk_u64 got = 0;
            bool ok = fl.take(n, false, 0, &got);
            CHECK(ok == (bsize != ~0ULL));
            if (!ok) {
                continue;
            }
            CHECK(got == best);
            model.erase(best);
            if (bsize > n) {
                model[best + n] = bsize - n;
            }
            live.push_back(P(got, n));
        } else {
            size_t i = (size_t)(r() % live.size());
            P b = live[i];
            live[i] = live.back();
            live.pop_back();
            mk_u64 ptr = b.first, size = b.second;
            int hp = 0, hn = 0;
            MkKey prev{0, 0};
            mk_u64 nsize = 0;
            fl.neighbours(ptr, size, &hp, &prev, &hn, &nsize);
            std::map<mk_u64, mk_u64>::iterator nx = model.find(ptr + size);
            std::map<mk_u64, mk_u64>::iterator pv = model.lower_bound(ptr);
            bool mp = pv != model.begin() && (--pv, pv->first + pv->second == ptr);
            CHECK((hn != 0) == (nx != model.end()) && (hp != 0) == mp);
            if (hp && bounds.has(ptr)) {
                hp = 0;
                mp = false;
            }
            if (hn && bounds.has(ptr + size)) {
                hn = 0;
                nx = model.end();
            }
            fl.insert(ptr, size, hp != 0, prev, hn != 0, nsize);
            mk_u64 start = ptr, total = size;
            if (nx != model.end()) {
                total += nx->second;
                model.erase(nx);
            }
            if (mp) {
                start = pv->first;
                total += pv->second;
                model.erase(pv);
            }
            model[start] = total;
        }
        if (step % 101 == 0) {
            std::vector<MkKey> items;
            fl.items(items);
            CHECK(items.size() == model.size() && fl.count() == model.size());
            size_t k = 0;
            mk_u64 total = 0;
            for (std::map<mk_u64, mk_u64>::iterator it = model.begin(); it != model.end(); ++it, ++k) {
                CHECK(items[k].hi == it->first && items[k].lo == it->second);
                total += it->second;
            }
            CHECK(fl.free_bytes == total);
        }
    }
    CHECK(peak > 3 * MK_LEAF);  // the blocks spread over many leaves
    for (size_t i = 0; i < live.size(); i++) {  // every byte back: one block a chunk
        int hp = 0, hn = 0;
        MkKey prev{0, 0};
        mk_u64 nsize = 0;
        fl.neighbours(live[i].first, live[i].second, &hp, &prev, &hn, &nsize);
        if (hp && bounds.has(live[i].first)) hp = 0;
        if (hn && bounds.has(live[i].first + live[i].second)) hn = 0;
        fl.insert(live[i].first, live[i].second, hp != 0, prev, hn != 0, nsize);
    }
    std::vector<MkKey> items;
    fl.items(items);
    CHECK(items.size() == 4);
    for (int c = 0; c < 4; c++) {
        CHECK(items[c].hi == base + c * chunk && items[c].lo == chunk);
    }
}

int main() {
    for (mk_u64 seed = 1; seed <= 6; seed++) {
        sorted_vs_set(seed);
        bounds_vs_set(seed);
        freelist_vs_model(seed);
    }
    std::printf("ok\n");
    return 0;
}
