/* Cache-get probes: time each call of a cache look-up function, read its key,
 * tell hit from miss, and name the client that asked.
 *
 * Each configured cache takes a slot 0..CACHE_SLOTS-1: userspace writes its
 * settings into `cache_cfgs[slot]` and attaches cache_enter_<slot> (uprobe)
 * and cache_return_<slot> (uretprobe) to the symbol. Hits, misses and a log2
 * latency histogram are counted here, exact even when the ring is full; one
 * event per look-up carries the key head and the client to userspace.
 *
 * The client: a single-threaded server (Redis) reads the command from the
 * client's socket on the same thread just before it looks the key up. So the
 * last read(2)/recvfrom(2) on a known client connection is remembered per
 * thread, and connections are known from accept(2) (peer from its sockaddr)
 * or seeded by userspace from /proc. Cache processes are known by their comm
 * at exec, by userspace's scan, or by their first look-up.
 */
#include <uapi/linux/ptrace.h>
#include "sitsprobe.h"
#include "user_read.h"
#include "ring_wake.h"

#define AF_INET_ 2
#define AF_INET6_ 10
#define AF_UNIX_ 1

struct cache_call {
    u64 ts_ns;
    u64 key_ptr;
    u64 key_len; /* CK_CSTR: unknown, 0 */
    s64 hit_arg; /* hit_src != 0: the argument's value at entry */
    u32 kind;    /* enum cache_key_kind */
};

struct comm_key {
    char comm[16];
};

BPF_ARRAY(cache_cfgs, struct cache_cfg, CACHE_SLOTS);
BPF_PERCPU_ARRAY(cache_counts, u64, CACHE_SLOTS * CC_COUNTERS);
BPF_PERCPU_ARRAY(cache_latency, u64, CACHE_SLOTS * CACHE_LAT_SLOTS);
BPF_HASH(cache_inflight, u64, struct cache_call, 16384); /* deleted at return */
BPF_TABLE("lru_hash", u64, struct cache_peer, cache_peers, CACHE_MAX_PEERS);
BPF_TABLE("lru_hash", u64, s32, cache_thread_fd, 16384);
BPF_HASH(cache_accepting, u64, u64, 1024);
BPF_HASH(cache_procs, u32, u8, 4096);
BPF_HASH(cache_comms, struct comm_key, u8, 64);
BPF_PERCPU_ARRAY(cache_written, u64, 1); /* bytes this CPU wrote to cache_events */
BPF_RINGBUF_OUTPUT(cache_events, CACHE_RING_PAGES);

static __always_inline void cache_count(u32 slot, u32 idx, u64 n)
{
    u32 i = slot * CC_COUNTERS + idx;
    u64 *v = cache_counts.lookup(&i);
    if (v)
        *v += n;
}

/* The register arguments, copied out of ctx once: the verifier allows only
 * constant offsets into ctx, so they are indexed here, on the stack. */
struct regs6 {
    u64 a[6];
};

static __always_inline void load_args(struct pt_regs *ctx, struct regs6 *r)
{
    r->a[0] = PT_REGS_PARM1(ctx);
    r->a[1] = PT_REGS_PARM2(ctx);
    r->a[2] = PT_REGS_PARM3(ctx);
    r->a[3] = PT_REGS_PARM4(ctx);
    r->a[4] = PT_REGS_PARM5(ctx);
    r->a[5] = PT_REGS_PARM6(ctx);
}

static __always_inline u64 arg_of(struct regs6 *r, u32 n)
{
    return n < 6 ? r->a[n] : 0;
}

/* The length of an sds string from its header, whose type is the byte before
 * the string (Redis sds.h: sdshdr5 keeps it in that byte, sdshdr8/16/32/64
 * in a packed field 3/5/9/17 bytes before the string). */
static __always_inline int sds_len(u64 s, u64 *len)
{
    u8 flags = 0;
    if (read_user(&flags, 1, (void *)(s - 1)))
        return -1;
    switch (flags & 7) {
    case 0:
        *len = flags >> 3;
        return 0;
    case 1: {
        u8 l = 0;
        if (read_user(&l, 1, (void *)(s - 3)))
            return -1;
        *len = l;
        return 0;
    }
    case 2: {
        u16 l = 0;
        if (read_user(&l, 2, (void *)(s - 5)))
            return -1;
        *len = l;
        return 0;
    }
    case 3: {
        u32 l = 0;
        if (read_user(&l, 4, (void *)(s - 9)))
            return -1;
        *len = l;
        return 0;
    }
    case 4:
        return read_user(len, 8, (void *)(s - 17)) ? -1 : 0;
    }
    return -1;
}

/* In-flight calls are keyed by thread and slot: two caches on one symbol
 * (or nested probed calls) keep apart. A tgid fits in 22 bits, so bits 56..63
 * of pid_tgid are free for the slot. */
static __always_inline u64 call_key(u64 pid_tgid, u32 slot)
{
    return pid_tgid | ((u64)slot << 56);
}

static __always_inline int on_enter(struct pt_regs *ctx, u32 slot)
{
    struct cache_cfg *cfg = cache_cfgs.lookup(&slot);
    if (!cfg || !cfg->key_kind)
        return 0;
    struct regs6 r;
    load_args(ctx, &r);
    if (cfg->filter_on && (arg_of(&r, cfg->filter_arg) & cfg->filter_mask) != cfg->filter_equals) {
        cache_count(slot, CC_FILTERED, 1);
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    struct cache_call c = {.kind = cfg->key_kind};
    u64 key = arg_of(&r, cfg->key_arg);
    if (cfg->key_kind == CK_REDIS_ROBJ) {
        u64 s = 0;
        if (key && read_user(&s, sizeof(s), (void *)(key + 8)) == 0 && s &&
            sds_len(s, &c.key_len) == 0)
            c.key_ptr = s;
    } else {
        c.key_ptr = key;
        if (cfg->key_kind == CK_PTR_LEN)
            c.key_len = arg_of(&r, cfg->len_arg);
    }
    if (cfg->hit_src)
        c.hit_arg = arg_of(&r, cfg->hit_src - 1);
    c.ts_ns = bpf_ktime_get_ns();
    u64 ck = call_key(id, slot);
    if (cache_inflight.update(&ck, &c))
        cache_count(slot, CC_INFLIGHT_LOST, 1);
    return 0;
}

static __always_inline int is_hit(struct cache_cfg *cfg, s64 v)
{
    if (cfg->hit_deref) {
        u64 p = v, x = 0;
        u32 n = cfg->hit_deref;
        if (n > 8)
            n = 8;
        if (read_user(&x, n, (void *)p))
            x = 0;
        v = x;
    }
    s64 w = cfg->hit_value;
    switch (cfg->hit_op) {
    case HO_EQ: return v == w;
    case HO_GT: return v > w;
    case HO_GE: return v >= w;
    case HO_LT: return v < w;
    case HO_LE: return v <= w;
    default: return v != w;
    }
}

static __always_inline void copy_key(struct cache_event *e, struct cache_call *c)
{
    e->key_len = 0;
    e->key_size = 0;
    if (!c->key_ptr)
        return;
    if (c->kind == CK_CSTR) {
        long n = read_user_str(e->key, CACHE_KEY_CAP, (void *)c->key_ptr);
        if (n > 0) {
            e->key_len = n - 1;
            e->key_size = n - 1;
            if (n == CACHE_KEY_CAP) /* filled: the string may go on */
                e->flags |= CE_TRUNCATED;
        }
        return;
    }
    u64 n = c->key_len;
    e->key_size = n > 0xffffffff ? 0xffffffff : n;
    if (n > CACHE_KEY_CAP) {
        n = CACHE_KEY_CAP;
        e->flags |= CE_TRUNCATED;
    }
    if (n && read_user(e->key, n, (void *)c->key_ptr) == 0)
        e->key_len = n;
}

static __always_inline int on_return(struct pt_regs *ctx, u32 slot)
{
    s64 rc = PT_REGS_RC(ctx); /* first: a later, conditional ctx read fails the verifier */
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u64 ck = call_key(id, slot);
    struct cache_call *c = cache_inflight.lookup(&ck);
    if (!c)
        return 0;
    struct cache_cfg *cfg = cache_cfgs.lookup(&slot);
    if (!cfg)
        goto out;
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - c->ts_ns;
    u8 hit = is_hit(cfg, cfg->hit_src ? c->hit_arg : rc);
    cache_count(slot, hit ? CC_HITS : CC_MISSES, 1);
    cache_count(slot, CC_DURATION_NS, dur);
    u32 b = bpf_log2l(dur);
    if (b >= CACHE_LAT_SLOTS)
        b = CACHE_LAT_SLOTS - 1;
    b += slot * CACHE_LAT_SLOTS;
    u64 *h = cache_latency.lookup(&b);
    if (h)
        (*h)++;
    u8 one = 1;
    if (!cache_procs.lookup(&tgid)) /* a cache process we had not met */
        cache_procs.update(&tgid, &one);

    struct cache_event *e = cache_events.ringbuf_reserve(sizeof(struct cache_event));
    if (!e) {
        cache_count(slot, CC_LOST, 1);
        goto out;
    }
    e->ts_ns = c->ts_ns;
    e->duration_ns = dur;
    e->tgid = tgid;
    e->tid = (u32)id;
    e->slot = slot;
    e->hit = hit;
    e->flags = 0;
    e->fd = -1;
    e->family = 0;
    e->port = 0;
    __builtin_memset(e->addr, 0, sizeof(e->addr));
    copy_key(e, c);
    s32 *fd = cache_thread_fd.lookup(&id);
    if (fd) {
        u64 pk = ((u64)tgid << 32) | (u32)*fd;
        struct cache_peer *p = cache_peers.lookup(&pk);
        if (p) {
            e->fd = *fd;
            e->family = p->family;
            e->port = p->port;
            __builtin_memcpy(e->addr, p->addr, sizeof(e->addr));
            e->flags |= CE_PEER;
        }
    }
    u32 zero = 0;
    cache_events.ringbuf_submit(e, ring_wake(cache_written.lookup(&zero), sizeof(*e), CACHE_WAKE_BYTES));
out:
    cache_inflight.delete(&ck);
    return 0;
}

#define CACHE_SLOT(i)                                                       \
    int cache_enter_##i(struct pt_regs *ctx) { return on_enter(ctx, i); }   \
    int cache_return_##i(struct pt_regs *ctx) { return on_return(ctx, i); }

CACHE_SLOT(0)
CACHE_SLOT(1)
CACHE_SLOT(2)
CACHE_SLOT(3)
CACHE_SLOT(4)
CACHE_SLOT(5)
CACHE_SLOT(6)
CACHE_SLOT(7)

/* ---- the client of each look-up ------------------------------------------- */

/* A read on a known client connection: that client is the thread's current one. */
static __always_inline int note_read(u32 fd)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 pk = (id & 0xffffffff00000000ULL) | fd;
    if (!cache_peers.lookup(&pk))
        return 0;
    s32 v = fd;
    cache_thread_fd.update(&id, &v);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_read) { return note_read(args->fd); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return note_read(args->fd); }

static __always_inline int accept_enter(u64 sockaddr)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!cache_procs.lookup(&tgid))
        return 0;
    cache_accepting.update(&id, &sockaddr);
    return 0;
}

static __always_inline int accept_exit(long fd)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 *sa = cache_accepting.lookup(&id);
    if (!sa)
        return 0;
    u64 addr = *sa;
    cache_accepting.delete(&id);
    if (fd < 0)
        return 0;
    struct cache_peer p = {};
    if (addr) {
        read_user(&p.family, 2, (void *)addr);
        if (p.family == AF_INET_) {
            read_user(&p.port, 2, (void *)(addr + 2));
            read_user(p.addr, 4, (void *)(addr + 4));
        } else if (p.family == AF_INET6_) {
            read_user(&p.port, 2, (void *)(addr + 2));
            read_user(p.addr, 16, (void *)(addr + 8));
        } else if (p.family != AF_UNIX_) {
            p.family = 0;
        }
        p.port = ntohs(p.port);
    }
    u64 pk = (id & 0xffffffff00000000ULL) | (u32)fd;
    cache_peers.update(&pk, &p);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept) { return accept_enter((u64)args->upeer_sockaddr); }
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return accept_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { return accept_enter((u64)args->upeer_sockaddr); }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return accept_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!cache_procs.lookup(&tgid))
        return 0;
    u64 pk = (id & 0xffffffff00000000ULL) | (u32)args->fd;
    cache_peers.delete(&pk);
    return 0;
}

/* A process that execs a cache binary (by comm) is a cache process at once:
 * its first accept, before any look-up, already names the client. */
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct comm_key k = {};
    bpf_get_current_comm(&k.comm, sizeof(k.comm));
    if (!cache_comms.lookup(&k))
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u8 one = 1;
    cache_procs.update(&tgid, &one);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!args->group_dead || !cache_procs.lookup(&tgid))
        return 0;
    cache_procs.delete(&tgid);
    return 0;
}
