/* Engine markers: one event per call of libsitsprobe_markers (see
 * sitsprobe/markers/markers.c), from uprobes on its exported functions.
 *
 * The probes attach by library path for every process (pid -1): only an engine
 * that loaded the library calls these, so nothing is filtered. Arguments come
 * from the ABI registers at function entry; strings and keys are copied from
 * user memory, bounded. Every loss is counted in `marker_counters`.
 */
#include <uapi/linux/ptrace.h>
#include "sitsprobe.h"
#include "user_read.h"
#include "ring_wake.h"

BPF_RINGBUF_OUTPUT(marker_events, MARKER_RING_PAGES);
BPF_PERCPU_ARRAY(marker_counters, u64, MC_COUNTERS);
BPF_PERCPU_ARRAY(marker_written, u64, 1); /* bytes this CPU wrote to marker_events */

static __always_inline void count(int idx, u64 n)
{
    u64 *v = marker_counters.lookup(&idx);
    if (v)
        *v += n;
}

/* A reserved event with every scalar field set, or NULL (counted). */
static __always_inline struct marker_event *start(u32 kind, u64 ts)
{
    struct marker_event *e = marker_events.ringbuf_reserve(sizeof(struct marker_event));
    if (!e) {
        count(MC_LOST, 1);
        return NULL;
    }
    u64 id = bpf_get_current_pid_tgid();
    e->ts = ts;
    e->tgid = id >> 32;
    e->tid = (u32)id;
    e->kind = kind;
    e->fd = -1;
    e->request_id = e->batch_id = 0;
    e->input_tokens = e->output_tokens = e->kv_bytes = e->begin_ts = 0;
    e->hit = e->key_len = e->n_total = e->first = e->n_ids = e->pad = 0;
    e->name[0] = 0;
    return e;
}

/* Wake the agent only once per MARKER_WAKE_BYTES a CPU writes (ring_wake.h);
 * otherwise it drains the ring on its own tick. A wakeup per event (flags 0,
 * whenever the agent has caught up) cost an engine making a call every 20 us
 * 8-14 us per call here, instead of 1.4 us. */
static __always_inline void submit(struct marker_event *e)
{
    int idx = MC_EVENTS;
    u64 *n = marker_counters.lookup(&idx);
    if (n)
        ++*n;
    idx = 0;
    marker_events.ringbuf_submit(e, ring_wake(marker_written.lookup(&idx), sizeof(*e), MARKER_WAKE_BYTES));
}

/* k in [1, cap], in a form the verifier can bound (cap: a power of two) */
static __always_inline u32 bounded(u32 k, u32 cap)
{
    return ((k - 1) & (cap - 1)) + 1;
}

static __always_inline void copy_name(struct marker_event *e, const void *s)
{
    if (!s || read_user_str(e->name, sizeof(e->name), s) < 0)
        e->name[0] = 0;
}

/* sitsprobe_request_begin(u64 id, s32 fd, const char *model) */
int on_request_begin(struct pt_regs *ctx)
{
    struct marker_event *e = start(MK_REQUEST_BEGIN, bpf_ktime_get_ns());
    if (!e)
        return 0;
    e->request_id = PT_REGS_PARM1(ctx);
    e->fd = (s32)PT_REGS_PARM2(ctx);
    copy_name(e, (void *)PT_REGS_PARM3(ctx));
    submit(e);
    return 0;
}

/* sitsprobe_request_end(u64 id) */
int on_request_end(struct pt_regs *ctx)
{
    struct marker_event *e = start(MK_REQUEST_END, bpf_ktime_get_ns());
    if (!e)
        return 0;
    e->request_id = PT_REGS_PARM1(ctx);
    submit(e);
    return 0;
}

/* sitsprobe_range_{begin,end}(u64 id, u64 batch_id, const char *name): the
 * begin is kept here, by its thread group, ids and name, and the end sends
 * one MK_RANGE event with both times: half the events of the many ranges of a
 * request (a decode step each). An end with no begin kept (it began before the
 * probe attached, or more ranges were open at once than MARKER_OPEN_RANGES,
 * which an LRU map sheds oldest first) is counted, not sent. */
struct range_key {
    u32 tgid;
    u32 pad;
    u64 request_id;
    u64 batch_id;
    char name[MARKER_NAME];
};
BPF_TABLE("lru_hash", struct range_key, u64, range_begins, MARKER_OPEN_RANGES);

static __always_inline void range_key(struct pt_regs *ctx, struct range_key *k)
{
    __builtin_memset(k, 0, sizeof(*k)); /* the name's bytes past its NUL are the key's too */
    k->tgid = bpf_get_current_pid_tgid() >> 32;
    k->request_id = PT_REGS_PARM1(ctx);
    k->batch_id = PT_REGS_PARM2(ctx);
    const void *name = (void *)PT_REGS_PARM3(ctx);
    if (!name || read_user_str(k->name, sizeof(k->name), name) < 0)
        k->name[0] = 0;
}

int on_range_begin(struct pt_regs *ctx)
{
    u64 ts = bpf_ktime_get_ns();
    struct range_key k;
    range_key(ctx, &k);
    range_begins.update(&k, &ts);
    return 0;
}

int on_range_end(struct pt_regs *ctx)
{
    u64 ts = bpf_ktime_get_ns();
    struct range_key k;
    range_key(ctx, &k);
    u64 *begin = range_begins.lookup(&k);
    if (!begin) {
        count(MC_RANGES_UNMATCHED, 1);
        return 0;
    }
    u64 begin_ts = *begin;
    range_begins.delete(&k);
    struct marker_event *e = start(MK_RANGE, ts);
    if (!e)
        return 0;
    e->request_id = k.request_id;
    e->batch_id = k.batch_id;
    e->begin_ts = begin_ts;
    __builtin_memcpy(e->name, k.name, sizeof(e->name));
    submit(e);
    return 0;
}

/* sitsprobe_batch(u64 batch_id, const u64 *ids, u32 n): MARKER_IDS ids per event */
int on_batch(struct pt_regs *ctx)
{
    u64 ts = bpf_ktime_get_ns();
    u64 batch_id = PT_REGS_PARM1(ctx);
    u64 ids = PT_REGS_PARM2(ctx);
    u32 n = PT_REGS_PARM3(ctx);
    u32 sent = n < MARKER_MAX_IDS ? n : MARKER_MAX_IDS;
    if (n > sent)
        count(MC_IDS_DROPPED, n - sent);
    for (u32 first = 0; first < MARKER_MAX_IDS; first += MARKER_IDS) {
        if (first && first >= sent)
            break; /* an empty batch still sends one event */
        struct marker_event *e = start(MK_BATCH, ts);
        if (!e)
            return 0;
        u32 k = sent - first;
        if (k > MARKER_IDS)
            k = MARKER_IDS;
        e->batch_id = batch_id;
        e->n_total = n;
        e->first = first;
        e->n_ids = k;
        if (k && read_user(e->ids, bounded(k, MARKER_IDS) * sizeof(u64),
                                     (void *)(ids + first * sizeof(u64))))
            e->n_ids = 0;
        submit(e);
    }
    return 0;
}

/* sitsprobe_cache_get(u64 id, const char *cache, const char *key, u32 key_len, s32 hit) */
int on_cache_get(struct pt_regs *ctx)
{
    struct marker_event *e = start(MK_CACHE_GET, bpf_ktime_get_ns());
    if (!e)
        return 0;
    e->request_id = PT_REGS_PARM1(ctx);
    copy_name(e, (void *)PT_REGS_PARM2(ctx));
    u32 len = PT_REGS_PARM4(ctx);
    u32 k = len;
    if (k > MARKER_KEY) {
        k = MARKER_KEY;
        count(MC_KEYS_CUT, 1);
    }
    e->key_len = k;
    if (k && read_user(e->key, bounded(k, MARKER_KEY), (void *)PT_REGS_PARM3(ctx)))
        e->key_len = 0;
    e->hit = (s32)PT_REGS_PARM5(ctx) != 0;
    submit(e);
    return 0;
}

/* sitsprobe_usage(u64 id, u64 in_tokens, u64 out_tokens, u64 kv_bytes) */
int on_usage(struct pt_regs *ctx)
{
    struct marker_event *e = start(MK_USAGE, bpf_ktime_get_ns());
    if (!e)
        return 0;
    e->request_id = PT_REGS_PARM1(ctx);
    e->input_tokens = PT_REGS_PARM2(ctx);
    e->output_tokens = PT_REGS_PARM3(ctx);
    e->kv_bytes = PT_REGS_PARM4(ctx);
    submit(e);
    return 0;
}
