/* Bounds the verifier can see on a value a helper gets or an address is
 * made from, for bpf/net.c. Plain C, so that tests/unit/test_bounds.py
 * builds it with gcc and holds MASK_OF and FORGET to what they say. */
#ifndef SITSPROBE_BOUNDS_H
#define SITSPROBE_BOUNDS_H

/* v = min(v, most), in a register the compiler may not fold the test away
 * from (libbpf's barrier_var): the verifier sees the bound on the very
 * value the helper gets. */
#define BOUND(v, most)                                   \
    do {                                                 \
        asm volatile("" : "=r"(v) : "0"(v));             \
        if ((v) > (most))                                \
            (v) = (most);                                \
        asm volatile("" : "=r"(v) : "0"(v));             \
    } while (0)

/* v's value, read back from a map value's cell: the verifier forgets what it
 * knew of v (its range, and which earlier values it came from), so the
 * paths into a piece of code that differ only in v are followed once, not
 * each apart. Mask it with MASK_OF afterwards to bound it again. */
#define FORGET(v, cell)                          \
    do {                                         \
        *(volatile __u64 *)(cell) = (v);         \
        (v) = *(volatile __u64 *)(cell);         \
    } while (0)
/* The least 2^k - 1 that is at least x (a constant below 2^32): a bound by
 * mask, which no path splits on, where a test (BOUND) is two paths. Each
 * step copies every bit set so far into the bits below it. */
#define SMEAR_(x, k) ((x) | (x) >> (k))
#define MASK_OF(x) SMEAR_(SMEAR_(SMEAR_(SMEAR_(SMEAR_(x, 1), 2), 4), 8), 16)

#endif
