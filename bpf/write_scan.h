/* The lines of a long response write, counted a byte at a time (net.c's
 * count_chunk, over the bytes past a write's peek): SSE events ("\ndata:"),
 * NDJSON objects ("}\n"), typed deltas (`.delta"`, `k_delta"`), output begun
 * (an output key's non-empty string: `"content":"x`) and special tokens
 * (`"special":true`). Every step is arithmetic, no jump: a compare is a
 * branch in BPF, and the verifier would follow both ways of each, byte after
 * byte. Plain C, so that tests/unit/test_write_scan.py builds it with gcc and
 * holds stitch/write_scan.py (the same count, for what the agent frames
 * itself) to it. */
#ifndef SITSPROBE_WRITE_SCAN_H
#define SITSPROBE_WRITE_SCAN_H

struct scan {
    __u64 w; /* the last bytes, newest lowest */
    __u64 o; /* ... but spaces: "content": "x" is "content":"x" (a string's first byte kept) */
    __u32 data, json, delta, output, special;
};

/* 1 if v is 0, else 0 */
static __always_inline __u64 is_0(__u64 v)
{
    __u64 n = -v;
    asm volatile("" : "+r"(n)); /* not folded back into a compare */
    return ((v | n) >> 63) ^ 1;
}

#define DATA_LINE 0x0a646174613aULL /* "\ndata:" */
#define DOT_DELTA 0x2e64656c746122ULL /* `.delta"` */
#define K_DELTA 0x6b5f64656c746122ULL /* `k_delta"` */
/* An output key's string begun: `"key":"` (its last 8 bytes), then a byte
 * that is no `"`: content (and reasoning_content), text, response, reasoning,
 * thinking, refusal, a tool call's arguments; as the APIs' partial_content
 * reads an event cut short (stitch/genai_shapes.py) */
#define OUT8(a, b, c, d, e) (((__u64)(a) << 56) | ((__u64)(b) << 48) | ((__u64)(c) << 40) | \
                             ((__u64)(d) << 32) | ((__u64)(e) << 24) | 0x223a22ULL)
#define OUT_KEY(p) (is_0((p) ^ OUT8('n', 't', 'e', 'n', 't')) | is_0((p) ^ OUT8('"', 't', 'e', 'x', 't')) | \
                    is_0((p) ^ OUT8('p', 'o', 'n', 's', 'e')) | is_0((p) ^ OUT8('o', 'n', 'i', 'n', 'g')) | \
                    is_0((p) ^ OUT8('n', 'k', 'i', 'n', 'g')) | is_0((p) ^ OUT8('f', 'u', 's', 'a', 'l')) | \
                    is_0((p) ^ OUT8('m', 'e', 'n', 't', 's')))
#define SPECIAL 0x616c223a74727565ULL /* `al":true`: TGI's "special":true, a token that is no output */

/* A write begins a line. */
static __always_inline void scan_start(struct scan *s)
{
    s->w = s->o = '\n';
    s->data = s->json = s->delta = s->output = s->special = 0;
}

/* Byte c (of type __u64), counted where `in` is 1 (0: past what was read,
 * nothing moves), into a struct scan's fields held in locals: w, o, then the
 * counts. A macro, not a function of a struct scan *: with the counts in
 * registers, not on the stack, net.c's send_beat verified in 0.68M
 * instructions; through the struct it ran past the verifier's 1M (both
 * before gather's FORGET, net.c). */
#define SCAN_BYTE(c, in, w, o, data, json, delta, output, special)                                  \
    do {                                                                                            \
        __u64 all_ = -(in), c_ = (c) & all_;                                                        \
        w = ((((w) << 8) | c_) & all_) | ((w) & ~all_);                                             \
        data += (in) & is_0(((w) & 0xffffffffffffULL) ^ DATA_LINE);                                \
        json += (in) & is_0(((w) & 0xffff) ^ 0x7d0a); /* "}\n" */                                  \
        delta += (in) & (is_0(((w) & 0xffffffffffffffULL) ^ DOT_DELTA) | is_0((w) ^ K_DELTA));     \
        __u64 hit_ = (in) & (is_0(c_ ^ '"') ^ 1) & OUT_KEY(o);                                      \
        output += hit_;                                                                             \
        __u64 keep_ = (in) & ((is_0(c_ ^ ' ') ^ 1) | hit_);                                         \
        o = ((o) << (keep_ << 3)) | (c_ & -keep_);                                                  \
        special += keep_ & is_0((o) ^ SPECIAL);                                                     \
    } while (0)

#endif
