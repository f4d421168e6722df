/* Network probes: turn the socket syscalls of tracked processes into one
 * compact event per request/response exchange, matched here in the kernel.
 *
 * A connection enters the `conns` map when a tracked process accepts it (or
 * when userspace seeds it from /proc). Reads and writes on it drive a small
 * state machine: the first read after a response starts a new exchange (and
 * reports the previous one); the first write after reads starts the
 * response; a write that begins the next HTTP response (pipelined requests)
 * reports the one before. Only the first REQ_CAP / RESP_CAP bytes are
 * copied, once each; a longer request head is searched for its trace
 * context headers. A connection the full `conns` table cannot take is still
 * counted: its HTTP responses, per process. Every loss (ring full, map full)
 * is counted in `counters`.
 */
#include <uapi/linux/ptrace.h>
#include <asm/unistd.h>
#include "sitsprobe.h"
#include "user_read.h"
#include "ring_wake.h"
#include "write_scan.h"
#include "bounds.h"

#define AF_UNIX_ 1
#define AF_INET_ 2
#define AF_INET6_ 10
#define SOCK_STREAM_ 1
#define EINPROGRESS_ 115
#define EPIPE_ 32
#define ECONNRESET_ 104
#define MSG_PEEK_ 2
#define IPPROTO_TCP_ 6

struct sock;

/* ::ffff:a.b.c.d */
static __always_inline int is_v4_mapped(const __u8 *a)
{
    for (int i = 0; i < 10; i++)
        if (a[i])
            return 0;
    return a[10] == 0xff && a[11] == 0xff;
}

struct uiovec {
    __u64 base;
    __u64 len;
};

/* CONN_BY_STATE (the socket tier, where the kernel's BTF gives struct sock's
 * family and type and struct unix_sock's address): no syscall tracepoint at all. An enabled one sends every
 * syscall of every task on the node through the kernel's tracing slow path
 * (bench/bench_floor.py: a pipe loop x0.94 for one that never fires), so a
 * connection is taken at its first call instead of its accept or connect
 * (sock_io, adopt), and let go when its TCP state says the process closed it
 * (inet_sock_set_state) or its fd comes back on another socket. */
#if NET_TIER == NET_TIER_SOCK && defined(SOCK_FAMILY_OFF) && defined(SOCK_TYPE_OFF) && defined(UNIX_ADDR_OFF)
#define CONN_BY_STATE 1
#else
#define CONN_BY_STATE 0
#endif

/* Two programs' worth of maps: this file is compiled once for the kernel's
 * hooks and, once a traced process maps a libssl, again with -DTLS_MODULE
 * for the library's (its calls' returns go through the same dispatch, on
 * the same maps): a start where no TLS is traced compiles none of the
 * library's, a third of the code (ssl_leave and the uprobe tail calls each
 * inline dispatch again). For the second compile userspace pins each of
 * the first one's maps under TLS_PINS (a fresh directory in the BPF file
 * system) and unpins them after: there each map is opened from its pin. */
#ifdef TLS_MODULE
#define NET_MAP_F(type, key, leaf, name, size, flags)                                             \
    BPF_TABLE_PINNED7(type, key, leaf, name, size, TLS_PINS "/" #name, flags)
/* BPF_RINGBUF_OUTPUT's table, opened from its pin (bcc has no macro for one) */
#define NET_RINGBUF(name, pages)                                                                  \
    struct name##_table_t {                                                                       \
        int key;                                                                                  \
        u32 leaf;                                                                                 \
        int (*ringbuf_output)(void *, u64, u64);                                                  \
        void *(*ringbuf_reserve)(u64);                                                            \
        void (*ringbuf_discard)(void *, u64);                                                     \
        void (*ringbuf_submit)(void *, u64);                                                      \
        u32 max_entries;                                                                          \
    };                                                                                            \
    __attribute__((section("maps/ringbuf:" TLS_PINS "/" #name))) struct name##_table_t name = {   \
        .max_entries = (pages) * PAGE_SIZE}
#else
#define NET_MAP_F(type, key, leaf, name, size, flags) BPF_F_TABLE(type, key, leaf, name, NET_ENTRIES(size), flags)
#define NET_RINGBUF(name, pages) BPF_RINGBUF_OUTPUT(name, NET_ENTRIES(pages))
#endif
#define NET_MAP(type, key, leaf, name, size) NET_MAP_F(type, key, leaf, name, size, 0)

/* The programs a compile makes. LLVM's work is most of the agent's start and
 * bcc's compiler runs one compile at a time in a process, so userspace
 * (probes/apart.py) compiles the tail-called programs (NET_PART 2) in a
 * second process while this one compiles those put on hooks (NET_PART 1), and
 * moves the second's programs onto the first's maps. NET_PART 3: no program,
 * the maps alone, for programs kept from an earlier start (probes/kept.py);
 * with TLS_MODULE too, the TLS module's.
 * Unset: every program. */
#ifndef NET_PART
#define NET_PART 0
#endif
#define ATTACHED (NET_PART == 0 || NET_PART == 1)
#define TAILED (NET_PART == 0 || NET_PART == 2)
/* The second half's own maps are never used (its programs are moved onto the
 * first's): each is made with one entry, a ring with one page. A map's size
 * is in none of the code, only in what the kernel allocates for it: about
 * 90 MiB less for that second process while it runs. */
#if NET_PART == 2
#define NET_ENTRIES(n) 1
#else
#define NET_ENTRIES(n) (n)
#endif
/* A per-CPU count by a key that is seldom new (a process's, a status's):
 * its entries made as keys come (BPF_F_NO_PREALLOC), not all at the start,
 * where the kernel makes every entry's value once per possible CPU, one
 * allocation each: http_status's 65,536 were 70 ms of the start on this
 * machine's 2 CPUs and would be 100 MB on a node of 192. */
#define NET_COUNTS(key, name, size) NET_MAP_F("percpu_hash", key, __u64, name, size, BPF_F_NO_PREALLOC)

NET_MAP("hash", __u32, __u8, tracked, 4096);
/* tgid -> maybe tracked, a bit each, PID_WORDS words (pid_max at the start): the
 * first test of every socket call and context switch of the node, paid by
 * every process, where a hash look-up was a quarter of an untraced call's
 * cost (array look-ups are inlined). A clear bit says "not tracked"; a set
 * one sends the test on to `tracked`, the authority, so a stale bit costs
 * a look-up, never a request. Userspace alone writes user_bits (its
 * track/untrack); the kernel alone writes kernel_bits (a listener on
 * select.ports), by atomic add and never clearing, so neither writer can
 * undo the other's bit. */
NET_MAP("array", int, __u64, user_bits, PID_WORDS);
NET_MAP("array", int, __u64, kernel_bits, PID_WORDS);
NET_MAP("hash", __u16, __u8, ports, 1024); /* select.ports: a process listening on one is tracked */
NET_MAP("hash", __u64, struct conn, conns, MAX_CONNS);
/* accepted while conns was full -> its socket (CONN_BY_STATE; else 1). LRU: CONN_BY_STATE sees no
 * close of those, and tells a later socket on the fd by the socket */
NET_MAP("lru_hash", __u64, __u64, overflow, MAX_OVERFLOW);
NET_COUNTS(__u32, untracked, 4096); /* tgid -> responses sent on them */
NET_MAP("hash", __u64, struct args, inflight, 16384);
NET_MAP("lru_hash", __u64, struct tuple, socks, 65536);
/* sk -> its conn's key: one entry per conn with a socket (learn_sock), so never full, and no
 * LRU: one that small evicts live entries early (its free lists are per CPU), losing closes */
NET_MAP("hash", __u64, __u64, sk_conns, MAX_CONNS);
#if CONN_BY_STATE
NET_MAP("lru_hash", __u64, __u8, dialed, 65536);    /* sk -> it connected (a client's) */
/* sk -> DRAIN_WAIT: a client's socket TCP closed after the client shut only
 * its sending side (the peer's FIN came): the answer queued is still read,
 * and its end-of-file read ends its conn (ended, drained). DRAIN_READ: the
 * client read to the end before it shut its side (Node's, after the server's
 * close): its conn ends when TCP closes. */
NET_MAP("lru_hash", __u64, __u8, draining, 4096);
#define DRAIN_WAIT 1
#define DRAIN_READ 2
/* A conn to end in a tail call (end_later), per CPU */
struct end_state {
    __u64 key;
    __u8 pending;
    __u8 again; /* the program that asked stopped there: its event is seen again after */
    __u8 late;  /* after the call's own work on it (end_after_call) */
};
NET_MAP("percpu_array", int, struct end_state, end_states, 1);
/* inet_sock_set_state's tail calls: 0 end_conn_tp, 1 inet_sock_set_state itself */
NET_MAP("prog", u32, u32, state_prog, 2);
#else
NET_MAP("lru_hash", __u64, __u64, dialing, 4096); /* pid_tgid -> the socket its connect() made (dialed_now) */
#endif
NET_MAP("percpu_array", int, __u64, counters, C_COUNTERS);
NET_COUNTS(struct status_key, http_status, 65536);
NET_MAP("percpu_array", int, struct conn, zero_conn, 1);
NET_MAP("lru_hash", __u32, __u64, runq, 65536); /* tid -> ns it waited to run, since tracked */
NET_MAP("lru_hash", __u32, __u64, rwaits, 65536); /* tid -> ns in other reads (OTHER_READ) */
NET_MAP("lru_hash", __u32, __u64, cwaits, 65536); /* ... of those, reads of a Redis reply */
NET_MAP("hash", __u64, struct body, bodies, MAX_BODIES); /* keyed like conns, for CF_BODY exchanges */
NET_MAP("lru_hash", __u32, struct serving, serving, 16384); /* tid -> the server exchange it serves */
NET_MAP("lru_hash", __u32, struct serving, serving_proc, 4096); /* tgid -> its latest server exchange */
NET_MAP("lru_hash", __u64, struct serving, dialed_for, 16384); /* a client conn -> what its thread served
                                                                  * when it dialled (dialed_for_now) */
NET_MAP("hash", struct tuple, __u64, clients, MAX_CONNS); /* a tracked TCP client connection's tuple -> its key */
NET_MAP("percpu_array", int, struct body, zero_body, 1);
NET_MAP("hash", struct bin_key, struct bin, bins, MAX_BINS);
NET_MAP("percpu_array", int, struct bin, zero_bin, 1);
NET_MAP("percpu_array", int, struct bin_key, bin_keys, 1);
NET_MAP("hash", __u64, __u8, shapes, MAX_BINS);                 /* shapes userspace knows the route of */
NET_MAP("lru_hash", __u64, __u64, taken, 16384);      /* conn key -> start_ns of an exchange
                                                         * userspace counted itself (an idle flush) */
NET_MAP("array", int, struct sampling, sampling, 1);
NET_MAP("array", int, struct beat, beat_layout, 1);   /* never used: gives userspace struct beat's layout */
struct scan_buf {
    __u8 b[SCAN_CHUNK + 16];
};
NET_MAP("percpu_array", int, struct scan_buf, scan_bufs, 1);
/* Tail calls: 0 scan_head, 1 send_beat, 2 send_chunk, 3 keep_payload, 4 split_body, 5 find_shape,
 * 6 end_conn, 7 sock_io, 8 send_more; the same programs once as tracepoints (the syscalls' exits),
 * once as uprobes (the TLS library's returns): a program may only tail-call programs of its own type. */
NET_MAP("prog", u32, u32, scan_prog, 9); /* 5 find_shape: syscalls and socket tier only (no TLS is
                                          * binned); 6 and 7: CONN_BY_STATE only */
NET_MAP("prog", u32, u32, uscan_prog, 9); /* 0-4 and 8 */
static __always_inline void tail(void *ctx, int user, int i)
{
    if (user)
        uscan_prog.call(ctx, i);
    else
        scan_prog.call(ctx, i);
}

/* The end end_after_call asked for, where the call's tails are done: by
 * end_conn, which goes on to the tails left (the call's chunk). */
static __always_inline void end_late(void *ctx, int user)
{
#if CONN_BY_STATE
    int zero = 0;
    struct end_state *es = user ? NULL : end_states.lookup(&zero);
    if (es && es->pending && es->late) {
        tail(ctx, 0, 6);
        es->pending = 0; /* the tail call failed: forgotten, as end_now's */
    }
#endif
}

NET_RINGBUF(exchanges, RINGBUF_PAGES);
NET_RINGBUF(notices, 64);
NET_RINGBUF(streams, STREAM_PAGES);
NET_MAP("percpu_array", int, __u64, ring_written, 2); /* bytes this CPU wrote to exchanges, streams */
NET_MAP("percpu_array", int, struct chunk, chunk_bufs, 1);
NET_MAP("hash", __u32, __u8, tls_procs, 4096);                   /* tgid -> its TLS library is hooked */
NET_MAP("lru_hash", __u32, __u64, tls_threads, 16384);  /* tid -> the CF_TLS conn it last read or wrote */

static __always_inline void count(int idx)
{
    __u64 *v = counters.lookup(&idx);
    if (v)
        (*v)++;
}

/* The submit flags of `size` bytes to ring `ring` (0 exchanges, 1 streams):
 * drained on the agent's tick, sooner when a quarter full (ring_wake.h). */
static __always_inline __u64 wake(int ring, __u64 size)
{
    return ring_wake(ring_written.lookup(&ring), size, RING_WAKE_BYTES);
}

static __always_inline __u64 conn_key(__u32 tgid, __u32 fd)
{
    return ((__u64)tgid << 32) | fd;
}

static __always_inline int is_tracked(__u32 tgid)
{
    int word = tgid / 64;
    if (word < PID_WORDS) { /* a pid past pid_max as it was at the start asks the hash */
        __u64 bit = 1ULL << (tgid % 64), *u = user_bits.lookup(&word), *k = kernel_bits.lookup(&word);
        if (!(((u ? *u : 0) | (k ? *k : 0)) & bit))
            return 0;
    }
    return tracked.lookup(&tgid) != NULL;
}

/* The kernel tracked tgid (the one winner of its insert into `tracked`). */
static __always_inline void kernel_tracked(__u32 tgid)
{
    int word = tgid / 64;
    __u64 bit = 1ULL << (tgid % 64), *k = kernel_bits.lookup(&word);
    if (k && !(*k & bit)) /* set: never cleared, so only this insert's winner adds it */
        __sync_fetch_and_add(k, bit);
}

/* The run-queue wait of the calling thread so far (RUNQ). */
static __always_inline __u64 runq_now(void)
{
    __u32 tid = bpf_get_current_pid_tgid();
    __u64 *v = RUNQ ? runq.lookup(&tid) : NULL;
    return v ? *v : 0;
}

/* The calling thread's time in other reads so far (READ_WAITS), and in
 * those of them that read a Redis reply. */
static __always_inline __u64 rwait_now(void)
{
    __u32 tid = bpf_get_current_pid_tgid();
    __u64 *v = READ_WAITS ? rwaits.lookup(&tid) : NULL;
    return v ? *v : 0;
}

static __always_inline __u64 cwait_now(void)
{
    __u32 tid = bpf_get_current_pid_tgid();
    __u64 *v = READ_WAITS ? cwaits.lookup(&tid) : NULL;
    return v ? *v : 0;
}

/* A RESP (Redis) reply begins with its type: + - : $ * (RESP2), _ , # % ~ (RESP3). */
static __always_inline int is_resp_reply(__u8 b)
{
    return b == '+' || b == '-' || b == ':' || b == '$' || b == '*' || b == '_' || b == ',' ||
           b == '#' || b == '%' || b == '~';
}

/* Enter half of every data syscall: remember the arguments for the exit. */
static __always_inline int enter(__u32 fd, const void *ptr, __u32 kind)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (!is_tracked(tgid))
        return 0;
    if (kind != K_ACCEPT && kind != K_CONNECT) {
        __u64 key = conn_key(tgid, fd);
        if (!conns.lookup(&key)) {
            if (kind & SEND) {
                if (!overflow.lookup(&key))
                    return 0;
                kind |= UNTRACKED;
            } else if (READ_WAITS) {
                kind |= OTHER_READ; /* only timed */
            } else {
                return 0;
            }
        }
    }
    struct args a = {.ptr = (__u64)ptr, .enter_ns = bpf_ktime_get_ns(), .fd = fd, .kind = kind};
    if (inflight.update(&id, &a))
        count(C_INFLIGHT_LOST);
    return 0;
}

/* A vectored call's array of entries (readv/writev, recvmsg/sendmsg); 0 for a flat one. */
static __always_inline __u64 iov_array(struct args *a)
{
    __u64 iovp = a->ptr;
    __u32 kind = a->kind & 0xff;
    if (kind == K_MSG) /* struct user_msghdr: msg_iov at offset 16 */
        read_user(&iovp, sizeof(iovp), (void *)(a->ptr + 16));
    return kind == K_IOV || kind == K_MSG ? iovp : 0;
}

/* The first user buffer of a call and its length (iov[0] for vectored calls). */
static __always_inline __u64 first_buffer(struct args *a, __u64 *len)
{
    struct uiovec iov = {};
    if ((a->kind & 0xff) == K_FLAT) {
        *len = (__u64)-1;
        return a->ptr;
    }
    __u64 iovp = iov_array(a);
    if (!iovp)
        return 0;
    read_user(&iov, sizeof(iov), (void *)iovp);
    *len = iov.len;
    return iov.base;
}

/* The payload pieces kept for this exchange, if any. */
static __always_inline struct body *body_of(struct conn *c)
{
    if (!GENAI || !(c->flags & CF_BODY))
        return NULL;
    __u64 key = conn_key(c->tgid, c->fd);
    struct body *b = bodies.lookup(&key);
    if (b && b->start_ns != c->start_ns)
        b = NULL;
    /* the callers test b itself, not the comparison the compiler would
     * reuse for it: the verifier cannot see that the two agree */
    asm volatile("" : "+r"(b));
    return b;
}

static __always_inline void bin_segment(struct bin *v, int i, __u64 ns)
{
    __u32 slot = SEG_SLOT(ns);
    __sync_fetch_and_add(&v->seg_sum_ns[i], ns);
    if (slot < SEG_SLOTS)
        __sync_fetch_and_add(&v->seg[i * SEG_SLOTS + slot], 1);
}

/* Count a finished CF_BINNED exchange into its series: its duration and
 * latency segments as sitsprobe/stitch/segments.py makes them for a request
 * without engine stages or device waits. 0: the bins map is full. */
static __always_inline int add_to_bin(struct conn *c)
{
    int zero = 0;
    struct bin_key *k = bin_keys.lookup(&zero); /* not on the stack: report's callers fill it */
    if (!k)
        return 0;
    k->shape = c->shape;
    k->tgid = c->tgid;
    k->status = c->status;
    struct bin *v = bins.lookup(k);
    if (!v) {
        struct bin *z = zero_bin.lookup(&zero);
        if (!z)
            return 0;
        bins.insert(k, z);
        v = bins.lookup(k);
        if (!v)
            return 0;
    }
    __u64 start = c->start_ns, end = c->last_out_ns;
    __u64 dur = 0, net = 0, sched = 0, compute = 0, io = 0, cache = 0;
    if (end > start) {
        dur = end - start;
        __u64 last_in = c->last_in_ns ? c->last_in_ns : start;
        last_in = last_in < start ? start : (last_in > end ? end : last_in);
        compute = end - last_in;
        __u64 sent = c->send_ns < compute ? c->send_ns : compute;
        compute -= sent;
        net = last_in - start + sent;
        __u64 reads = c->rwait_ns > c->cwait_ns ? c->rwait_ns - c->cwait_ns : 0;
        sched = c->runq_ns < compute ? c->runq_ns : compute;
        compute -= sched;
        cache = c->cwait_ns < compute ? c->cwait_ns : compute;
        compute -= cache;
        io = reads < compute ? reads : compute;
        compute -= io;
    }
    __sync_fetch_and_add(&v->count, 1);
    __sync_fetch_and_add(&v->sum_ns, dur);
    __sync_fetch_and_add(&v->bytes_in, c->bytes_in);
    __sync_fetch_and_add(&v->bytes_out, c->bytes_out);
    __u32 slot = DUR_SLOT(dur);
    if (slot < DUR_SLOTS)
        __sync_fetch_and_add(&v->dur[slot], 1);
    bin_segment(v, SEG_NETWORK, net);
    bin_segment(v, SEG_SCHEDULING, sched);
    bin_segment(v, SEG_COMPUTE, compute);
    bin_segment(v, SEG_IO, io);
    bin_segment(v, SEG_CACHE, cache);
    count(C_BINNED);
    return 1;
}

/* Whether a binned exchange crosses the ring for a trace (struct sampling). */
static __always_inline int wanted(struct conn *c)
{
    int zero = 0;
    struct sampling *s = sampling.lookup(&zero);
    if (!s || s->all || c->status >= 500 || c->tp_len || c->ts_len || c->link_key || c->calls)
        return 1;
    if (s->slow_ns && c->last_out_ns - c->start_ns >= s->slow_ns)
        return 1;
    /* a bucket of one second's tokens; two CPUs may race on it: the rate is approximate,
     * and userspace's sampler has the last word on what is exported */
    __u64 now = bpf_ktime_get_ns(), full = s->rate * 1000000000ULL, elapsed = now - s->last_ns;
    __u64 tokens = elapsed >= 1000000000ULL ? full : s->tokens + elapsed * s->rate;
    if (tokens > full)
        tokens = full;
    s->last_ns = now;
    if (tokens >= 1000000000ULL) {
        s->tokens = tokens - 1000000000ULL;
        return 1;
    }
    s->tokens = tokens;
    return 0;
}

/* A CF_BINNED exchange at its end (the entry's seq already moved: see
 * NetProbe.claim): binned, unless userspace took it in an idle flush and
 * counted it itself (`taken`). Whether it still goes out: 1 to submit it. */
static __always_inline int settle_bin(struct conn *c, __u8 reason)
{
    __u64 key = conn_key(c->tgid, c->fd);
    __u64 *t = taken.lookup(&key);
    if (t && *t == c->start_ns) {
        taken.delete(&key); /* userspace has it whole */
        return 0;
    }
    /* pipelined: userspace's framing tells each request's own bytes */
    if (reason == END_RESPONSE || !add_to_bin(c)) {
        if (reason != END_RESPONSE)
            count(C_BINS_FULL);
        c->flags &= ~CF_BINNED; /* userspace counts it */
        return 1;
    }
    if (wanted(c))
        return 1;
    count(C_UNSENT);
    return 0;
}

/* A response's exchange whose shape is to be found (find_shape), per CPU. */
struct shape_state {
    __u64 key;
    __u64 start_ns;
    __u8 pending;
};
NET_MAP("percpu_array", int, struct shape_state, shape_states, 1);

/* Bytes of a request head that one program walks a byte at a time (shape_of,
 * request_end). Each pass is a few branches, and one path through a program
 * may take 8192 at most: a walk of 1,792 bytes or more is refused (E2BIG,
 * "the sequence of 8193 jumps is too complex"), so a capture.request_bytes
 * past this keeps its bytes for the agent, and these walks stop here. */
#define HEAD_WALK (REQ_CAP < 1024 ? REQ_CAP : 1024)

/* FNV-1a over the method and path of the request head ("GET /a/b?q HTTP/1.1":
 * "GET /a/b"), 0 when the bytes kept (or walked) do not reach the path's end. */
static __always_inline __u64 shape_of(const struct conn *c)
{
    __u64 h = 0xcbf29ce484222325ULL;
    int spaces = 0;
    for (int i = 0; i < HEAD_WALK; i++) {
        if (i >= c->req_len)
            return 0;
        __u8 b = c->req[i];
        if (b == '?' || b == '\r' || b == '\n' || (b == ' ' && ++spaces == 2))
            return h | 1;
        h = (h ^ b) * 0x100000001b3ULL;
    }
    return 0;
}

/* A server's response begins: whether its exchange can be counted in the
 * kernel. Only a plain one is: no payload kept, no stream, no TLS, its request
 * seen and alone, and its method and path ones userspace knows the route of. */
static __always_inline void choose_bin(struct conn *c)
{
    c->flags &= ~CF_BINNED;
    c->shape = 0;
    if (c->flags & (CF_BODY | CF_STREAM | CF_TLS | CF_MISSED | CF_CLIENT) || c->pipeline)
        return;
    int zero = 0;
    struct shape_state *st = shape_states.lookup(&zero);
    if (!st)
        return;
    st->key = conn_key(c->tgid, c->fd);
    st->start_ns = c->start_ns;
    st->pending = 1; /* the hash's loop is a tail call's: the verifier walks it once, not per path */
}

#if !defined(TLS_MODULE) && TAILED
/* The tail call choose_bin asked for: the shape, and whether it is binned. */
int find_shape(void *ctx)
{
    int zero = 0;
    struct shape_state *st = shape_states.lookup(&zero);
    if (!st || !st->pending)
        return 0;
    st->pending = 0;
    struct conn *c = conns.lookup(&st->key);
    if (!c || c->start_ns != st->start_ns || c->state != ST_RESPONDING)
        return 0;
    __u64 shape = shape_of(c);
    __sync_fetch_and_add(&c->seq, 1);
    c->shape = shape;
    if (shape && shapes.lookup(&shape))
        c->flags |= CF_BINNED;
    __sync_fetch_and_add(&c->seq, 1);
    return 0;
}
#endif

/* Submit a copy of the connection's finished exchange, its payload pieces
 * after it when it has them. */
static __always_inline void report(struct conn *c, __u8 reason)
{
    struct conn *e;
    if (c->flags & CF_CLIENT && !(c->flags & CF_TCP))
        return; /* a connected UDP socket (a DNS query, most likely) */
    if (BINS && c->flags & CF_BINNED && !settle_bin(c, reason))
        return;
    struct body *b = body_of(c);
    if (b) {
        struct conn_body *eb = exchanges.ringbuf_reserve(sizeof(struct conn_body));
        if (eb)
            bpf_probe_read_kernel(&eb->b, sizeof(struct body), b);
        e = (struct conn *)eb;
    } else {
        e = exchanges.ringbuf_reserve(sizeof(struct conn));
    }
    if (!e) {
        count(C_LOST);
        return;
    }
    bpf_probe_read_kernel(e, sizeof(struct conn), c);
    e->reason = reason;
    if (bpf_get_current_pid_tgid() >> 32 == c->tgid) /* else a TCP state change's softirq: its comm stays */
        bpf_get_current_comm(&e->comm, sizeof(e->comm));
    exchanges.ringbuf_submit(e, wake(0, b ? sizeof(struct conn_body) : sizeof(struct conn)));
    count(C_EXCHANGES);
}

/* Append the last bytes of a call's buffer to a tail ring (struct body). */
static __always_inline void tail_append(__u8 *ring, __u32 *pos, __u64 buf, __u64 n)
{
    __u64 skip = 0;
    if (n > TAIL_CAP) {
        skip = n - TAIL_CAP;
        n = TAIL_CAP;
    }
    __u32 off = *pos & (TAIL_CAP - 1);
    __u64 first = TAIL_CAP - off;
    if (first > n)
        first = n;
    if (first > TAIL_CAP) /* it is not: but the verifier needs to see it */
        first = TAIL_CAP;
    if (first && read_user(ring + off, first, (void *)(buf + skip)))
        return;
    __u64 rest = n - first;
    if (rest > TAIL_CAP)
        rest = TAIL_CAP;
    if (rest && read_user(ring, rest, (void *)(buf + skip + first)))
        return;
    *pos += n;
}

/* A vectored write's bytes appended, entry by entry, from its first
 * TAIL_IOVS (nginx writes a chunk as three: its size line, its data, its
 * CRLF): the response's last bytes are the last bytes of its last entries,
 * not of its first. A write of more entries forgets the tail: what it ends
 * with is not known, and a tail that is not the response's end would say
 * the response ended elsewhere (or not at all). */
#define TAIL_IOVS 16
static __always_inline void tail_append_iov(__u8 *ring, __u32 *pos, __u64 iovp, __u64 n)
{
#pragma unroll
    for (int i = 0; i < TAIL_IOVS; i++) {
        struct uiovec iov = {};
        if (!n || read_user(&iov, sizeof(iov), (void *)(iovp + i * sizeof(iov))))
            break;
        __u64 take = iov.len < n ? iov.len : n;
        tail_append(ring, pos, iov.base, take);
        n -= take;
    }
    if (n)
        *pos = 0;
}

/* Copy the first bytes of the request body, from buf. */
static __always_inline void body_copy(struct body *b, __u64 buf, __u64 n)
{
    if (n > BODY_CAP)
        n = BODY_CAP;
    if (n && read_user(b->body, n, (void *)buf) == 0)
        b->body_len = n;
}

/* A POST begins: its payload pieces are kept from here on. */
static __always_inline void start_body(struct conn *c, __u64 key, int whole)
{
    int zero = 0;
    struct body *z = zero_body.lookup(&zero);
    if (!z || bodies.update(&key, z)) {
        count(C_BODIES_FULL);
        return;
    }
    struct body *b = bodies.lookup(&key);
    if (!b)
        return;
    b->start_ns = c->start_ns;
    c->flags |= CF_BODY;
    if (whole) /* the read is all in req: the body goes on in the next one */
        c->flags |= CF_BODY_NEXT;
}

/* A response write of a POST exchange: when, how big, its first bytes. Sent
 * by `send_beat`, tail-called once the syscall's exit is done: counting a
 * long write's lines is a loop the exit program has no room for. */
struct beat_state {
    struct beat b; /* all but peek and peek_len */
    __u32 index;  /* which of its response's writes, from 1 */
    __u64 buf;    /* a flat write's; 0 for a vectored one */
    __u64 iovp;   /* a vectored write's entries: its peek is gathered from them */
    __u64 iov_off; /* ... and where its lines' count goes on: this byte of */
    __u32 iov_i;   /* this entry */
    __u64 n;      /* bytes written (of buf); 0: no beat pending */
    struct scan scan; /* its lines counted so far (write_scan.h) */
    __u32 first;  /* 1: its response's first write */
    __u64 more;   /* bytes of a first write sent, whose more peeks are send_more's */
};
NET_MAP("percpu_array", int, struct beat_state, beat_states, 1);
/* Write events sent, and read: the agent writes its count after each drain.
 * Those unread may fill five eighths of the ring; a response's first
 * FIRST_WRITES (its head and first tokens: the time to first token) three
 * quarters; the last quarter is the exchanges'. So a flood of stream writes
 * the agent is late to drain never costs a request its record, nor a stream
 * its first token (bcc has no ringbuf_query method to ask the ring itself). */
NET_MAP("array", int, __u64, beats_sent, 1);
NET_MAP("array", int, __u64, beats_read, 1);
#define BEAT_EIGHTHS(n) (RINGBUF_PAGES * 4096ULL / 8 * (n) / ((sizeof(struct beat) + 15) & ~7ULL))
#define FIRST_WRITES 4

static __always_inline void beat(struct conn *c, struct body *b, __u64 ts_ns, __u64 buf,
                                 __u64 len, __u64 iovp, long ret)
{
    int zero = 0;
    struct beat_state *st = beat_states.lookup(&zero);
    if (++b->writes > MAX_WRITES || !st)
        return;
    st->b.tgid = c->tgid;
    st->b.fd = c->fd;
    st->b.start_ns = c->start_ns;
    st->b.ts_ns = ts_ns;
    st->b.size = ret;
    st->b.pipeline = c->pipeline;
    st->b.scanned = 0;
    st->index = b->writes;
    scan_start(&st->scan);
    st->buf = iovp ? 0 : buf;
    st->iovp = iovp;
    st->iov_i = st->iov_off = 0;
    st->first = b->writes == 1;
    st->n = iovp || ret < len ? ret : len;
}

/* Scratch for a write's bytes gathered from its entries (a vectored write:
 * nginx writes a chunk as three, its size line, its data, its CRLF) and for
 * the lines counted of any: an entry's copy may begin anywhere below the
 * most copied at once and be as long, each bounded by its mask (gather). */
#define GATHER_MOST (PEEK_CAP > SCAN_CHUNK ? PEEK_CAP : SCAN_CHUNK)
struct gather_buf {
    __u8 b[2 * (MASK_OF(GATHER_MOST) + 1)];
    __u64 cell; /* FORGET's */
};
NET_MAP("percpu_array", int, struct gather_buf, gather_bufs, 1);

/* Up to `want` (at most `most`) bytes of a vectored call's entries from entry
 * *i's byte *off on, from `iovs` entries at most, into `to` (2 * (MASK_OF(most)
 * + 1) bytes; `cell` is FORGET's); how many. *i and *off move past them. A
 * write's peek is gathered from its first PEEK_IOVS (nginx, catching up,
 * writes several chunks at once); its lines are counted SCAN_IOVS entries a
 * run. Each copy's place and size are forgotten and masked: bounded by
 * tests, every entry's ways out were followed apart through the rest of the
 * program (send_beat verified in 830k of the verifier's 1M instructions,
 * 0.9 s of every start; 225k so). */
#define PEEK_IOVS 16
#define SCAN_IOVS 8
static __always_inline __u64 gather(__u64 iovp, __u32 *i, __u64 *off, __u8 *to, __u64 *cell, __u64 want,
                                    const __u64 most, const int iovs)
{
    __u64 at = 0;
#pragma unroll
    for (int k = 0; k < iovs; k++) {
        struct uiovec iov = {};
        if (at >= want || read_user(&iov, sizeof(iov), (void *)(iovp + *i * sizeof(iov))))
            break;
        __u64 n = iov.len > *off ? iov.len - *off : 0, o = at;
        if (n > want - at)
            n = want - at;
        FORGET(n, cell);
        FORGET(o, cell);
        n &= MASK_OF(most); /* no-ops: n <= want - at, o = at <= want <= most */
        o &= MASK_OF(most);
        if (n && read_user(to + o, n, (void *)(iov.base + *off)))
            break;
        at += n;
        *off += n;
        if (*off >= iov.len) {
            *i += 1;
            *off = 0;
        }
    }
    return at;
}

/* Count the event lines of the next SCAN_CHUNK bytes of a write longer than
 * its peek, or of any vectored write (its peek holds its first PEEK_IOVS
 * pieces only); 1 while more are to be counted. The verifier follows a loop
 * only so far: one chunk per run of send_beat, which tail-calls itself. */
static __always_inline int count_chunk(struct beat_state *st)
{
    int zero = 0;
    struct gather_buf *s = gather_bufs.lookup(&zero);
    __u64 off = st->b.scanned;
    if (!s || !(st->buf || st->iovp) || (st->n <= PEEK_CAP && !st->iovp) || off >= st->n || off >= WRITE_SCAN)
        return 0;
    __u64 want = st->n - off;
    if (want > SCAN_CHUNK)
        want = SCAN_CHUNK;
    if (st->iovp)
        want = gather(st->iovp, &st->iov_i, &st->iov_off, s->b, &s->cell, want, SCAN_CHUNK, SCAN_IOVS);
    else if (read_user(s->b, want, (void *)(st->buf + off)))
        return 0;
    FORGET(want, &s->cell); /* the loop is followed once, whichever way came to it */
    if (!want)
        return 0;
    /* every byte of the chunk, those past `want` masked out: no branch on
     * it, so each way into the loop (the gather's many) is followed as one */
    __u64 w = st->scan.w, o = st->scan.o;
    __u32 data = 0, json = 0, delta = 0, output = 0, special = 0;
    for (__u64 i = 0; i < SCAN_CHUNK; i++)
        SCAN_BYTE((__u64)s->b[i], (i - want) >> 63, w, o, data, json, delta, output, special);
    st->scan.w = w;
    st->scan.o = o;
    st->scan.data += data;
    st->scan.json += json;
    st->scan.delta += delta;
    st->scan.output += output;
    st->scan.special += special;
    st->b.scanned += want;
    return st->b.scanned < st->n && st->b.scanned < WRITE_SCAN;
}

/* A response's first write longer than its peek: its head and its first
 * event together (a client's read that took both, as it reads what has come;
 * a server that writes them at once, as Node's http does). Its peek shows
 * the head, and the first event not at all (Anthropic's message_start, the
 * one event that tells the input tokens), so its next HEAD_PEEKS - 1 peeks
 * follow it, each an event of its own (beat.peek_at), sent by send_beat's
 * tail call. */
struct more_buf {
    __u8 b[2 * (MASK_OF(HEAD_PEEKS * PEEK_CAP) + 1)]; /* as gather copies */
    __u64 cell;
};
NET_MAP("percpu_array", int, struct more_buf, more_bufs, 1);

static __always_inline void send_peek(struct beat_state *st, __u64 *sent, const __u8 *b, __u64 got, __u64 at)
{
    struct beat *e = exchanges.ringbuf_reserve(sizeof(struct beat));
    if (!e) {
        count(C_WRITES_LOST);
        return;
    }
    __sync_fetch_and_add(sent, 1);
    bpf_probe_read_kernel(e, sizeof(struct beat), &st->b);
    __u64 n = got - at;
    BOUND(n, PEEK_CAP);
    e->peek_at = at;
    e->peek_len = n;
    bpf_probe_read_kernel(e->peek, PEEK_CAP, b + at);
    exchanges.ringbuf_submit(e, wake(0, sizeof(struct beat)));
}

static __always_inline void more_out(void *ctx, int user)
{
    int zero = 0;
    struct beat_state *st = beat_states.lookup(&zero);
    struct more_buf *s = more_bufs.lookup(&zero);
    __u64 *sent = beats_sent.lookup(&zero), *read = beats_read.lookup(&zero);
    if (!st || !st->more)
        return;
    __u64 got = st->more;
    st->more = 0;
    if (!s || !sent || !read || *sent - *read >= BEAT_EIGHTHS(6)) {
        count(C_WRITES_LOST);
        return;
    }
    BOUND(got, HEAD_PEEKS * PEEK_CAP);
    if (st->iovp) {
        __u32 i = 0;
        __u64 off = 0;
        got = gather(st->iovp, &i, &off, s->b, &s->cell, got, HEAD_PEEKS * PEEK_CAP, PEEK_IOVS);
    } else if (!st->buf || read_user(s->b, got, (void *)st->buf)) {
        return;
    }
#pragma unroll
    for (int k = 1; k < HEAD_PEEKS; k++)
        if (got > k * PEEK_CAP)
            send_peek(st, sent, s->b, got, k * PEEK_CAP);
}

static __always_inline int send_more_(void *ctx, int user)
{
    more_out(ctx, user);
    end_late(ctx, user); /* the last of a write's events is out */
    return 0;
}
#if defined(TLS_MODULE) && TAILED
int usend_more(void *ctx) { return send_more_(ctx, 1); }
#elif TAILED
int send_more(void *ctx) { return send_more_(ctx, 0); }
#endif

static __always_inline void beat_out(void *ctx, int user)
{
    int zero = 0;
    struct beat_state *st = beat_states.lookup(&zero);
    if (!st || !st->n)
        return;
    if (count_chunk(st))
        tail(ctx, user, 1); /* the next chunk; if the call failed, send what is counted */
    __u64 n = st->n, buf = st->buf, iovp = st->iovp;
    st->n = 0;
    __u64 *sent = beats_sent.lookup(&zero), *read = beats_read.lookup(&zero);
    if (!sent || !read || *sent - *read >= (st->index <= FIRST_WRITES ? BEAT_EIGHTHS(6) : BEAT_EIGHTHS(5))) {
        count(C_WRITES_LOST); /* they give way: what is left of the ring is for the exchanges */
        return;
    }
    struct beat *e = exchanges.ringbuf_reserve(sizeof(struct beat));
    if (!e) {
        count(C_WRITES_LOST);
        return;
    }
    __sync_fetch_and_add(sent, 1);
    bpf_probe_read_kernel(e, sizeof(struct beat), &st->b);
    e->peek_at = 0;
    e->data_lines = st->scan.data;
    e->json_lines = st->scan.json;
    e->delta_lines = st->scan.delta;
    e->output_lines = st->scan.output;
    e->special_lines = st->scan.special;
    __u64 peek = n > PEEK_CAP ? PEEK_CAP : n;
    e->peek_len = 0;
    if (buf && peek && read_user(e->peek, peek, (void *)buf) == 0)
        e->peek_len = peek;
    else if (iovp && peek) { /* gathered from the write's entries */
        struct gather_buf *s = gather_bufs.lookup(&zero);
        __u32 i = 0;
        __u64 off = 0;
        peek = s ? gather(iovp, &i, &off, s->b, &s->cell, peek, PEEK_CAP, PEEK_IOVS) : 0;
        if (s && peek && bpf_probe_read_kernel(e->peek, PEEK_CAP, s->b) == 0)
            e->peek_len = peek;
    }
    exchanges.ringbuf_submit(e, wake(0, sizeof(struct beat)));
    if (st->first && n > PEEK_CAP) {
        st->more = n;
        tail(ctx, user, 8); /* send_more */
    }
}

static __always_inline int send_beat_(void *ctx, int user)
{
    beat_out(ctx, user);
    end_late(ctx, user); /* reached where no more of the write's events follow */
    return 0;
}
#if defined(TLS_MODULE) && TAILED /* for the library's returns */
int usend_beat(void *ctx) { return send_beat_(ctx, 1); }
#elif TAILED
int send_beat(void *ctx) { return send_beat_(ctx, 0); }
#endif

/* Parse "HTTP/1.x NNN" at the start of b; 0 when it is not a status line. */
static __always_inline __u16 status_of(const __u8 *b)
{
    if (b[0] != 'H' || b[1] != 'T' || b[2] != 'T' || b[3] != 'P' || b[4] != '/' ||
        b[5] != '1' || b[6] != '.' || b[8] != ' ')
        return 0;
    if (b[9] < '1' || b[9] > '5' || b[10] < '0' || b[10] > '9' || b[11] < '0' || b[11] > '9')
        return 0;
    return (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
}

static __always_inline void count_status(__u32 tgid, __u16 status)
{
    struct status_key k = {.tgid = tgid, .status = status};
    __u64 one = 1, *v = http_status.lookup(&k);
    if (v)
        (*v)++;
    else
        http_status.update(&k, &one);
}

/* An interim response (100 Continue, 103 Early Hints) precedes the real one;
 * 101 Switching Protocols is final. */
static __always_inline int is_final(__u16 status)
{
    return status >= 200 || status == 101;
}

/* The status of a send that begins with an HTTP/1.x status line, else 0. */
static __always_inline __u16 status_sent(struct args *a, long ret)
{
    __u8 head[12] = {};
    __u64 len = 0, buf = first_buffer(a, &len);
    if (!buf || len < sizeof(head) || ret < (long)sizeof(head))
        return 0;
    read_user(head, sizeof(head), (void *)buf);
    return status_of(head);
}

/* A send on a connection the table had no room for: counted, not stitched. */
static __always_inline void on_untracked_send(struct args *a, __u32 tgid, long ret)
{
    __u16 status = status_sent(a, ret);
    if (!is_final(status))
        return;
    count_status(tgid, status);
    __u64 one = 1, *v = untracked.lookup(&tgid);
    if (v)
        (*v)++;
    else
        untracked.update(&tgid, &one);
}

/* "traceparent:" (n = 12) or "tracestate:" (11) at l, any case. */
static __always_inline int is_header(const __u8 *l, const char *name, int n)
{
#pragma unroll
    for (int k = 0; k < 12; k++)
        if (k < n && (l[k] | 0x20) != name[k])
            return 0;
    return 1;
}

/* A request head longer than the bytes captured may carry its trace context
 * past them (real clients send many headers first): the first HEAD_SCAN
 * bytes of the read, up to the blank line, are searched for the two header
 * lines, and what follows their names is kept. Paid only by requests longer
 * than REQ_CAP, and only for their head. The verifier allows a loop only so
 * long, so each SCAN_CHUNK is one run of `scan_head`, which tail-calls
 * itself for the next. */
struct scan_state {
    __u64 key; /* the conns entry */
    __u64 buf; /* the read's user buffer */
    __u64 n;   /* bytes to search; 0: no search pending */
    __u64 off; /* where this chunk starts */
    __u64 len; /* bytes the read returned */
};
NET_MAP("percpu_array", int, struct scan_state, scan_states, 1);

/* One chunk; 1 when the search is over (the head ended, both found). */
static __always_inline int scan_chunk(struct conn *c, struct scan_buf *s, struct scan_state *st)
{
    __u64 off = st->off, n = st->n, want = n - off;
    if (want > sizeof(s->b))
        want = sizeof(s->b);
    if (read_user(s->b, want, (void *)(st->buf + off)))
        return 1;
    for (int i = 0; i < SCAN_CHUNK; i++) {
        if (off + i + 1 >= n)
            return 1;
        if (s->b[i] != '\n')
            continue;
        const __u8 *l = &s->b[i + 1];
        if (l[0] == '\r' || l[0] == '\n') { /* the blank line: the head ends here */
            struct body *b = body_of(c);
            __u64 at = off + i + 1 + (l[0] == '\r' ? 2 : 1);
            if (b && at < st->len)
                body_copy(b, st->buf + at, st->len - at);
            else if (b)
                c->flags |= CF_BODY_NEXT;
            return 1;
        }
        if ((l[0] | 0x20) != 't')
            continue;
        __u64 value = st->buf + off + i + 1;
        if (!c->tp_len && is_header(l, "traceparent:", 12)) {
            if (read_user(c->tp, TP_CAP, (void *)(value + 12)) == 0)
                c->tp_len = TP_CAP;
        } else if (!c->ts_len && is_header(l, "tracestate:", 11)) {
            if (read_user(c->ts, TS_CAP, (void *)(value + 11)) == 0)
                c->ts_len = TS_CAP;
        }
        if (c->tp_len && c->ts_len && !(c->flags & CF_BODY))
            return 1;
    }
    return 0;
}

static __always_inline int scan_head_(void *ctx, int user)
{
    int zero = 0;
    struct scan_state *st = scan_states.lookup(&zero);
    struct scan_buf *s = scan_bufs.lookup(&zero);
    if (!st || !s || !st->n)
        return 0;
    struct conn *c = conns.lookup(&st->key);
    if (c && !scan_chunk(c, s, st) && st->off + SCAN_CHUNK < st->n) {
        st->off += SCAN_CHUNK;
        tail(ctx, user, 0);
    }
    st->n = 0; /* done, or the tail call failed */
    end_late(ctx, user);
    return 0;
}
#if defined(TLS_MODULE) && TAILED /* for the library's returns */
int uscan_head(void *ctx) { return scan_head_(ctx, 1); }
#elif TAILED
int scan_head(void *ctx) { return scan_head_(ctx, 0); }
#endif

/* A POST exchange's payload work for this call (struct body: its pieces),
 * asked for by on_recv and on_send and done by `keep_payload`, tail-called
 * first once the call is done. Inline, its copies multiplied the paths the
 * verifier follows through the programs that call dispatch: sock_io took
 * 614k of the 1M instructions it allows (0.6 s of every start), 300k without. */
#define P_START 1      /* a POST begins: its body entry is made (start_body) */
#define P_WHOLE 2      /* ... and its read was all in req: the body goes on in the next */
#define P_BODY 4       /* the body's first bytes, from this read */
#define P_REQ_TAIL 8   /* the request's last bytes, appended */
#define P_BEAT 16      /* a response write's event (beat) */
#define P_RESP_TAIL 32 /* the response's last bytes, appended (with P_BEAT) */
struct payload_state {
    __u64 key;     /* the connection's */
    struct args a; /* the call's */
    __s64 ret;     /* the bytes it moved */
    __u32 ops;     /* P_*; 0: nothing asked */
};
NET_MAP("percpu_array", int, struct payload_state, payload_states, 1);

/* Only stores: a test here of the call's bytes (their count, their buffer)
 * would split every path the verifier follows through what comes after. */
static __always_inline void want_payload(__u64 key, __u32 ops, struct args *a, long ret)
{
    int zero = 0;
    struct payload_state *ps = payload_states.lookup(&zero);
    if (!ps)
        return;
    ps->key = key;
    ps->a = *a;
    ps->ret = ret;
    ps->ops = ops;
}

static __always_inline void tails(void *ctx, int user);

static __always_inline int keep_payload_(void *ctx, int user)
{
    int zero = 0;
    struct payload_state *ps = payload_states.lookup(&zero);
    if (!GENAI || !ps || !ps->ops)
        return 0;
    __u32 ops = ps->ops;
    ps->ops = 0;
    __u64 len = 0, buf = first_buffer(&ps->a, &len), n = ps->ret < len ? ps->ret : len;
    struct conn *c = conns.lookup(&ps->key);
    if (c) {
        if (ops & P_START)
            start_body(c, ps->key, ops & P_WHOLE);
        struct body *b = body_of(c);
        if (b && ops & P_BODY && buf)
            body_copy(b, buf, n);
        if (b && ops & P_REQ_TAIL && buf)
            tail_append(b->req_tail, &b->req_tail_pos, buf, n);
        __u64 iovp = ops & (P_BEAT | P_RESP_TAIL) ? iov_array(&ps->a) : 0;
        if (b && ops & P_BEAT)
            beat(c, b, ps->a.enter_ns, buf, len, iovp, ps->ret);
        if (b && ops & P_RESP_TAIL && iovp)
            tail_append_iov(b->resp_tail, &b->resp_tail_pos, iovp, ps->ret);
        else if (b && ops & P_RESP_TAIL && buf)
            tail_append(b->resp_tail, &b->resp_tail_pos, buf, n);
    }
    tails(ctx, user); /* what else the call asked for: the head's scan, the write's event */
    return 0;
}
#if defined(TLS_MODULE) && TAILED /* for the library's returns */
int ukeep_payload(void *ctx) { return keep_payload_(ctx, 1); }
#elif TAILED
int keep_payload(void *ctx) { return keep_payload_(ctx, 0); }
#endif

/* Ask for a search of this read's head, run when the syscall's exit is done. */
static __always_inline void want_scan(__u64 key, __u64 buf, __u64 n)
{
    int zero = 0;
    struct scan_state *st = scan_states.lookup(&zero);
    if (!st)
        return;
    st->key = key;
    st->buf = buf;
    st->n = n < HEAD_SCAN ? n : HEAD_SCAN;
    st->off = 0;
    st->len = n;
}

static __always_inline int is_post(const __u8 *r)
{
    return r[0] == 'P' && r[1] == 'O' && r[2] == 'S' && r[3] == 'T' && r[4] == ' ';
}

/* A connection's tuple as the `clients` map keys it: IPv4 between IPv4-mapped
 * addresses of a dual-stack socket (either end may have one, the other not);
 * with `swap`, as the other end sees it. */
static __always_inline void canonical(const struct tuple *t, struct tuple *p, int swap)
{
    p->family = t->family;
    p->lport = swap ? t->rport : t->lport;
    p->rport = swap ? t->lport : t->rport;
    const __u8 *l = swap ? t->raddr : t->laddr, *r = swap ? t->laddr : t->raddr;
    if (t->family == AF_INET6_ && is_v4_mapped(l) && is_v4_mapped(r)) {
        p->family = AF_INET_;
        __builtin_memcpy(p->laddr, l + 12, 4);
        __builtin_memcpy(p->raddr, r + 12, 4);
        return;
    }
    __builtin_memcpy(p->laddr, l, 16);
    __builtin_memcpy(p->raddr, r, 16);
}

/* The server exchange the current thread serves (from a thread that read
 * no request, its process's latest: CF_BY_PROCESS in *flags). */
static __always_inline struct serving *serving_now(__u16 *flags)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = id, tgid = id >> 32;
    struct serving *s = serving.lookup(&tid);
    if (!s) {
        s = serving_proc.lookup(&tgid);
        if (s)
            *flags |= CF_BY_PROCESS;
    }
    return s;
}

/* A client connection (key) is dialled: what its thread serves now is what
 * its first call is for. An event loop (nginx's proxy_pass) dials right
 * after it read the request, and writes the call once the connection is
 * ready, when it may have read others. */
static __always_inline void dialed_for_now(__u64 key)
{
    __u16 flags = 0;
    struct serving *s = serving_now(&flags);
    if (s && !(flags & CF_BY_PROCESS)) {
        struct serving me = *s;
        dialed_for.update(&key, &me);
    }
}

/* The server exchange a call that begins now belongs to, while it is open:
 * for a connection's first call (conn), the one its thread served when it
 * dialled, if still open; else the one its thread serves now. */
static __always_inline void served(__u64 *key, __u64 *start, __u16 *flags, __u64 conn)
{
    struct serving first = {}, *s = NULL;
    struct serving *d = conn ? dialed_for.lookup(&conn) : NULL;
    if (d) {
        first = *d;
        dialed_for.delete(&conn);
        struct conn *p = conns.lookup(&first.key);
        if (p && p->start_ns == first.start_ns && p->state != ST_IDLE)
            s = &first;
    }
    if (!s)
        s = serving_now(flags);
    struct conn *p = s ? conns.lookup(&s->key) : NULL;
    if (p && p->start_ns == s->start_ns && p->state != ST_IDLE) {
        *key = s->key;
        *start = s->start_ns;
        p->calls++;
    }
}

/* The traced client connection at the other end of server connection c, if any. */
static __always_inline __u64 caller_of(struct conn *c)
{
    if (!(c->flags & CF_TUPLE))
        return 0;
    struct tuple peer = {};
    canonical(&c->t, &peer, 1);
    __u64 *k = clients.lookup(&peer);
    struct conn *caller = k ? conns.lookup(k) : NULL;
    if (!caller)
        return 0;
    /* A caller that is not sending a request has not been seen to begin the
     * call this answers: its send moved the bytes, and the server read and
     * answered them, before the send's hook ran (the caller waited for a CPU
     * in between, or was still sending a body the server answered early).
     * The answer is its next call's (link_exchange). */
    if (caller->state == ST_READING || caller->flags & CF_STREAM) {
        caller->calls++;
    } else if (!(caller->flags & CF_ANSWERED)) { /* the first answer's read is the earliest */
        caller->answered_ns = c->start_ns;
        caller->flags |= CF_ANSWERED;
    }
    return *k;
}

/* An exchange begins: what it belongs to (struct conn.link_key). A server
 * exchange is what its thread (and its process) serves from now on. A client
 * exchange is linked to the server exchange its thread is serving, while
 * that one is open; from a thread that read no request (a worker pool's),
 * to its process's latest (CF_BY_PROCESS): userspace checks it was open. */
static __always_inline void link_exchange(struct conn *c, __u64 key)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = id, tgid = id >> 32;
    c->link_key = c->link_start = 0;
    c->calls = 0;
    if (c->flags & CF_ANSWERED) { /* a client's call a traced server answered already (caller_of) */
        c->calls = 1;
        if (c->answered_ns < c->start_ns)
            c->start_ns = c->answered_ns; /* it began before that server read it */
    }
    c->flags &= ~(CF_BY_PROCESS | CF_ANSWERED);
    if (c->flags & CF_CLIENT) {
        if (c->flags & CF_TCP)
            served(&c->link_key, &c->link_start, &c->flags, key);
        return;
    }
    /* in place where the thread (the process) is known: an LRU map's update
     * takes a free node and frees the old one, a third of the map work of a
     * request; a reader (served) checks the pair against the conn anyway */
    struct serving me = {.key = key, .start_ns = c->start_ns};
    struct serving *s = serving.lookup(&tid);
    if (s) {
        s->key = key;
        s->start_ns = me.start_ns;
    } else {
        serving.update(&tid, &me);
    }
    s = serving_proc.lookup(&tgid);
    if (s) {
        s->key = key;
        s->start_ns = me.start_ns;
    } else {
        serving_proc.update(&tgid, &me); /* its caller is looked for when it answers (on_send) */
    }
}

/* A TLS handshake record (a ClientHello) begins the connection, in a process
 * whose TLS library is hooked (`tls_procs`, filled by userspace). */
static __always_inline int is_tls_hello(const struct conn *c, __u32 tgid)
{
    return c->req_len >= 3 && c->req[0] == 0x16 && c->req[1] == 0x03 && c->req[2] <= 0x04 &&
           tls_procs.lookup(&tgid);
}

/* "PRI * HTTP/2.0\r\n": an HTTP/2 connection with prior knowledge (h2c), or after ALPN */
static __always_inline int is_h2_preface(const struct conn *c)
{
    const __u8 *r = c->req;
    return c->req_len >= 16 && r[0] == 'P' && r[1] == 'R' && r[2] == 'I' && r[3] == ' ' && r[4] == '*' &&
           r[5] == ' ' && r[6] == 'H' && r[7] == 'T' && r[8] == 'T' && r[9] == 'P' && r[10] == '/' &&
           r[11] == '2' && r[12] == '.' && r[13] == '0' && r[14] == '\r' && r[15] == '\n';
}

/* A connection older than the agent reads what looks like an HTTP/2 frame
 * header: a length within the default maximum frame size, a known type, the
 * reserved bit clear (an HTTP/1.x method's letters make a length in the
 * millions). Userspace checks more before it decodes a byte of it. */
static __always_inline int is_h2_frame(const struct conn *c)
{
    const __u8 *r = c->req;
    return c->req_len >= 9 && r[0] == 0 && r[1] <= 0x40 && r[3] <= 9 && !(r[5] & 0x80);
}

/* A server's first write on a new connection is an HTTP/2 SETTINGS frame:
 * 9-byte header, type 4 on stream 0, a whole number of 6-byte settings. */
static __always_inline int is_h2_settings(const struct conn *c)
{
    const __u8 *r = c->resp;
    return c->resp_len >= 9 && !(c->flags & CF_SEEDED) && r[0] == 0 && ((r[1] << 8 | r[2]) % 6) == 0 && r[3] == 4 &&
           (r[4] & ~1) == 0 && r[5] == 0 && r[6] == 0 && r[7] == 0 && r[8] == 0;
}

/* A read or write (or the close) of an HTTP/2 connection, to go to `streams`
 * once the syscall's exit is done: `send_chunk`, tail-called, copies its
 * bytes (a loop over iovec entries the exit program has no room for). */
struct chunk_state {
    struct chunk_head h;
    struct args a;
    __u8 pending; /* 1: a chunk to send; 2: being copied, `next` iovec entry on */
    __u32 next;   /* the iovec entry the next run of send_chunk copies from */
    __u64 left;   /* bytes of the call not copied yet */
    __u64 iovp;
    __u64 iovlen;
    __u64 cell;   /* FORGET's */
};
NET_MAP("percpu_array", int, struct chunk_state, chunk_states, 1);

/* What the streams a chunk begins belong to, found as link_exchange finds it
 * for an exchange (gRPC's own threads write a channel's calls: CF_BY_PROCESS). */
static __always_inline void link_chunk(struct conn *c, struct chunk_head *h)
{
    if (c->flags & CF_CLIENT)
        served(&h->link_key, &h->link_start, &h->flags, 0);
    else
        h->link_key = caller_of(c);
}

static __always_inline void want_chunk(struct conn *c, struct args *a, long ret, __u8 dir, __u64 ts)
{
    int zero = 0;
    struct chunk_state *st = chunk_states.lookup(&zero);
    if (!st)
        return;
    st->h.tgid = c->tgid;
    st->h.fd = c->fd;
    st->h.ts_ns = ts;
    st->h.size = ret > 0 ? ret : 0;
    st->h.flags = c->flags;
    st->h.dir = dir;
    st->h.peer_ended = c->peer_ended;
    st->h.t = c->t;
    st->h.link_key = st->h.link_start = 0;
    st->a = *a;
    st->pending = 1;
    if (OUTGOING && (c->flags & CF_CLIENT ? dir == CH_OUT : dir == CH_IN))
        link_chunk(c, &st->h);
}

/* Its first CHUNK_CAP bytes. A vectored call's entries are copied
 * CHUNK_IOVS a run (gRPC writes a header block as many small slices); the
 * program tail-calls itself for the next ones, as far as tail calls go. */
static __always_inline int send_chunk_(void *ctx, int user)
{
    int zero = 0;
    struct chunk_state *st = chunk_states.lookup(&zero);
    struct chunk *ch = chunk_bufs.lookup(&zero);
    if (!st || !ch || !st->pending)
        return 0;
    struct args *a = &st->a;
    __u32 kind = a->kind & 0xff;
    if (st->pending == 1) { /* the first run */
        ch->h = st->h;
        ch->h.len = 0;
        st->left = ch->h.size;
        st->next = 0;
        st->iovp = a->ptr;
        st->iovlen = CHUNK_IOVS * 33; /* readv/writev: the bytes moved end the walk first */
        if (kind == K_MSG) { /* struct user_msghdr: msg_iov at 16, msg_iovlen at 24 */
            read_user(&st->iovp, sizeof(st->iovp), (void *)(a->ptr + 16));
            read_user(&st->iovlen, sizeof(st->iovlen), (void *)(a->ptr + 24));
        }
        st->pending = 2;
    }
    __u32 off = ch->h.len;
    if (kind == K_FLAT) {
        __u64 n = st->left < CHUNK_CAP ? st->left : CHUNK_CAP;
        BOUND(n, CHUNK_CAP);
        if (n && read_user(ch->data, n, (void *)a->ptr) == 0)
            off = ch->h.len = n;
    } else if (kind == K_IOV || kind == K_MSG) {
        __u32 first = st->next;
#pragma unroll
        for (int i = 0; i < CHUNK_IOVS; i++) {
            struct uiovec iov = {};
            __u64 left = st->left;
            if (first + i >= st->iovlen || !left || off >= CHUNK_CAP)
                break;
            if (read_user(&iov, sizeof(iov), (void *)(st->iovp + (first + i) * sizeof(iov))))
                break;
            __u64 n = iov.len < left ? iov.len : left;
            if (n > CHUNK_CAP - off)
                n = CHUNK_CAP - off;
            FORGET(n, &st->cell); /* 158k instructions to verify, not 223k */
            BOUND(n, CHUNK_CAP);
            /* reloaded, so the compiler keeps the mask the verifier needs to see */
            __u32 at = *(volatile __u16 *)&ch->h.len & (CHUNK_CAP - 1);
            if (n && read_user(ch->data + at, n, (void *)iov.base))
                break;
            off += n;
            st->left = left - n;
            st->next = first + i + 1;
            ch->h.len = off;
        }
        if (st->next == first + CHUNK_IOVS && st->next < st->iovlen && st->left && off < CHUNK_CAP)
            tail(ctx, user, 2); /* the next entries; if the call failed, send what is copied */
    }
    st->pending = 0;
    __u64 size = sizeof(struct chunk_head) + (off & (2 * CHUNK_CAP - 1));
    if (size > sizeof(struct chunk))
        size = sizeof(struct chunk);
    if (streams.ringbuf_output(ch, size, wake(1, size)))
        count(C_CHUNKS_LOST);
    return 0;
}
#if defined(TLS_MODULE) && TAILED /* for the library's returns */
int usend_chunk(void *ctx) { return send_chunk_(ctx, 1); }
#elif TAILED
int send_chunk(void *ctx) { return send_chunk_(ctx, 0); }
#endif

/* The connection closed: a chunk with no bytes. */
static __always_inline void close_chunk(struct conn *c)
{
    struct chunk_head h = {.tgid = c->tgid, .fd = c->fd, .ts_ns = bpf_ktime_get_ns(), .flags = c->flags,
                           .dir = CH_CLOSE, .peer_ended = c->peer_ended, .t = c->t};
    if (streams.ringbuf_output(&h, sizeof(h), wake(1, sizeof(h))))
        count(C_CHUNKS_LOST);
}

/* Whether the chunk this call is about to send (the tails') is c's, made when
 * TCP had ended c during the call (CF_CLOSING): userspace takes it as the
 * close too, so no close chunk comes before the call's last bytes. */
static __always_inline int chunk_closes(struct conn *c)
{
    int zero = 0;
    struct chunk_state *st = chunk_states.lookup(&zero);
    return st && st->pending && st->h.flags & CF_CLOSING && st->h.tgid == c->tgid && st->h.fd == c->fd;
}

/* Whether the `n` user bytes at `buf` begin a request line: a method in
 * capitals, then a space, within their first 8. */
static __always_inline int begins_request(__u64 buf, __u64 n)
{
    __u8 b[8] = {};
    if (n > 8)
        n = 8;
    BOUND(n, 8);
    if (!buf || n < 1 || read_user(b, n, (void *)buf))
        return 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n)
            return 0;
        if (b[i] == ' ')
            return i >= 3;
        if (b[i] < 'A' || b[i] > 'Z')
            return 0;
    }
    return 0;
}

/* Whether request bytes that come once the answer has begun are more of the
 * request's body, not the next request: a server may answer from the head
 * (nginx's 413 or `return`, a 401 before an upload) and read the body after,
 * and a client may read that answer before it has sent all the body. So when
 * the request is a POST, PUT or PATCH and these bytes begin no request line. */
static __always_inline int body_goes_on(const struct conn *c, struct args *a, long ret)
{
    if (c->req_len < 4 || c->req[0] != 'P' || (c->req[1] != 'O' && c->req[1] != 'U' && c->req[1] != 'A'))
        return 0;
    __u64 len = 0, buf = first_buffer(a, &len);
    return !begins_request(buf, ret < len ? ret : len);
}

/* A read of a POST, PUT or PATCH's body once its answer has begun may hold
 * the body's end and the next request after it: a keep-alive server that
 * answered from the head (Node's http and gunicorn's threads do, with an
 * error) reads what is left of the body and what the client sent next at
 * once. on_recv takes such a read for the body, as it must where the
 * request's length is not known, and asks `split_body`, tail-called once
 * the call is done, to look for the next request in it: the loop over the
 * head that finds its length would be verified on every path to on_recv.
 * Only a flat read is looked at (a vectored one's bytes stay the body's). */
struct split_state {
    __u64 key;      /* the conns entry */
    __u64 start_ns; /* its exchange's */
    __u64 before;   /* the request's bytes before the read */
    __u64 t;        /* the read's time, as on_recv had it */
    struct args a;  /* the read's */
    __s64 ret;      /* 0: no look pending */
    __u32 head;     /* request_end's findings: the head's length (0: its end not in req) */
    __u32 value_at; /* ... and where its Content-Length's value begins (0: none) */
};
NET_MAP("percpu_array", int, struct split_state, split_states, 1);

/* "Content-Length:" at l, any case. Without a branch a byte: each would be
 * a path of its own through request_end's loop for the verifier to walk. */
static __always_inline int is_content_length(const __u8 *l)
{
    const char name[] = "content-length:";
    __u8 differ = 0;
#pragma unroll
    for (int k = 0; k < 15; k++)
        differ |= (l[k] | 0x20) ^ name[k]; /* '-' and ':' are themselves with 0x20 (as are CR and
                                            * 0x1a, in no header's name) */
    return !differ;
}

/* The request's length, head and body, where the bytes captured of it show
 * its head's end and a Content-Length in it (0: not known; a chunked body,
 * or a head longer than req or HEAD_WALK). What the loop finds goes to
 * `st`, not to variables: values that differ from one pass to the next
 * would have the verifier walk what follows once for each. */
static __always_inline __u64 request_end(const struct conn *c, struct split_state *st)
{
    st->head = st->value_at = 0;
    for (int i = 0; i < HEAD_WALK - 2; i++) {
        if (i + 2 >= *(volatile __u16 *)&c->req_len) /* volatile: a register kept from it would */
            break;                                      /* carry each pass's bounds past the loop */
        if (c->req[i] != '\n')
            continue;
        const __u8 *l = &c->req[i + 1]; /* a line's first byte; what follows may run past req into resp */
        if (l[0] == '\r' || l[0] == '\n') { /* the blank line */
            st->head = i + 1 + (l[0] == '\r' ? 2 : 1);
            break;
        }
        if ((l[0] | 0x20) == 'c' && is_content_length(l))
            st->value_at = i + 16;
    }
    /* read back (volatile: else the compiler forwards the stores' values) */
    __u32 head = *(volatile __u32 *)&st->head, at = *(volatile __u32 *)&st->value_at & (REQ_CAP - 1);
    if (!head || !at)
        return 0;
    at += c->req[at] == ' ' || c->req[at] == '\t'; /* one space, if any */
    __u64 length = 0;
#pragma unroll
    for (int k = 0; k < 12; k++) { /* up to a terabyte */
        __u8 d = c->req[at + k];
        if (d < '0' || d > '9')
            break;
        length = length * 10 + d - '0';
    }
    return head + length;
}

static __always_inline void want_split(struct conn *c, struct args *a, long ret, __u64 t)
{
    int zero = 0;
    struct split_state *st = split_states.lookup(&zero);
    if (!st || (a->kind & 0xff) != K_FLAT)
        return;
    st->key = conn_key(c->tgid, c->fd);
    st->start_ns = c->start_ns;
    st->before = c->bytes_in;
    st->t = t;
    st->a = *a;
    st->ret = ret;
}

static __always_inline void on_recv(struct conn *c, struct args *a, __u32 tgid, long ret, __u64 t,
                                    int client);

/* The look want_split asked for: where the request's Content-Length is
 * known and its end lies inside the read (or the body was all read before
 * it), and a method's first letter comes there, the exchange ends at the
 * body's end and the next one begins with the rest of the read (Go's
 * servers read a kept-alive connection's next request's first byte alone);
 * else the read stays the body's (the next answer is then a pipelined one's,
 * its request unknown). */
static __always_inline int split_body_(void *ctx, int user)
{
    int zero = 0;
    struct split_state *st = split_states.lookup(&zero);
    if (!st || st->ret <= 0)
        return 0;
    long ret = st->ret;
    st->ret = 0;
    struct conn *c = conns.lookup(&st->key);
    if (c && c->start_ns == st->start_ns && c->state == ST_RESPONDING) {
        __u64 end = request_end(c, st), at = end - st->before;
        __u8 first = 0;
        if (end && end >= st->before && at < ret && read_user(&first, 1, (void *)(st->a.ptr + at)) == 0 &&
            first >= 'A' && first <= 'Z') {
            struct args next = st->a;
            next.ptr += at;
            __sync_fetch_and_add(&c->seq, 1); /* as framed() does */
            c->bytes_in = end;
            report(c, END_NEXT);
            c->state = ST_IDLE;
            on_recv(c, &next, c->tgid, ret - at, st->t, c->flags & CF_CLIENT);
            __sync_fetch_and_add(&c->seq, 1);
        }
    }
    tails(ctx, user); /* what the next request's read asked for */
    return 0;
}
#if defined(TLS_MODULE) && TAILED /* for the library's returns */
int usplit_body(void *ctx) { return split_body_(ctx, 1); }
#elif TAILED
int split_body(void *ctx) { return split_body_(ctx, 0); }
#endif

/* A request whose first read was too short to show its request line (Go's
 * servers read a kept-alive connection's next request's first byte alone,
 * then the rest): this read's bytes go on in req, and what on_recv decides
 * from a head's first read is decided now. The payload's work, as on_recv's. */
static __always_inline __u32 more_head(struct conn *c, struct args *a, long ret)
{
    __u64 len = 0, buf = first_buffer(a, &len);
    __u64 all = ret < len ? ret : len, have = c->req_len, n = all;
    BOUND(have, HEAD_MIN - 1);
    if (n > REQ_CAP - have)
        n = REQ_CAP - have;
    BOUND(n, REQ_CAP);
    if (!buf || !n || read_user(c->req + have, n, (void *)buf))
        return 0;
    c->req_len = have + n;
    if (have + all > REQ_CAP)
        want_scan(conn_key(c->tgid, c->fd), buf, all);
    if (GENAI && c->req_len >= 5 && is_post(c->req))
        return P_START | (have + all <= REQ_CAP ? P_WHOLE : 0);
    return 0;
}

/* Request bytes: read by a server, written by a client (from `t`, the
 * read's return or the write's start). */
static __always_inline void on_recv(struct conn *c, struct args *a, __u32 tgid, long ret, __u64 t,
                                    int client)
{
    __u64 now = t;
    __u32 ops = 0; /* the payload's work (keep_payload) */
    /* after only "100 Continue" the client sends the body: the same request */
    if (c->state == ST_RESPONDING && !(c->flags & CF_INTERIM)) {
        if (body_goes_on(c, a, ret)) { /* its network time still ends where its answer began */
            want_split(c, a, ret, t);
            c->bytes_in += ret;
            return;
        }
        report(c, END_NEXT);
        c->state = ST_IDLE;
    }
    if (c->state == ST_IDLE) {
        __u64 len = 0, buf = first_buffer(a, &len);
        __u64 all = ret < len ? ret : len, n = all;
        __u16 seeded = c->flags & CF_SEEDED;
        if (n > REQ_CAP)
            n = REQ_CAP;
        /* A traced server's read from before this client read its last answer
         * was the last call's (caller_of): the caller's hook for that call
         * had not yet shown it sending (its program and the server's run at
         * once, the bytes moved before its hook). Not this call's. */
        if (c->answered_ns < c->last_out_ns)
            c->flags &= ~CF_ANSWERED;
        c->start_ns = now;
        c->first_out_ns = c->last_out_ns = 0;
        c->bytes_in = c->bytes_out = 0;
        c->send_ns = c->runq_ns = c->rwait_ns = c->cwait_ns = 0;
        c->runq_tid = bpf_get_current_pid_tgid();
        c->runq_start = runq_now();
        c->rwait_start = rwait_now();
        c->cwait_start = cwait_now();
        c->status = c->pipeline = 0;
        c->resp_len = 0;
        c->tp_len = c->ts_len = c->peer_ended = 0;
        c->flags &= ~(CF_CHUNK_END | CF_SEEDED | CF_MISSED | CF_INTERIM | CF_BODY | CF_BODY_NEXT |
                      CF_BINNED);
        c->req_len = 0;
        if (buf && n > 0 && read_user(c->req, n, (void *)buf) == 0)
            c->req_len = n;
        if (is_tls_hello(c, tgid)) { /* no exchanges from ciphertext: the library's calls make them */
            c->flags |= CF_TLS;
            c->tls_calls = 0;
            return;
        }
        if (is_h2_preface(c) || (seeded && is_h2_frame(c))) { /* its bytes go to `streams` */
            c->flags |= CF_STREAM | seeded; /* seeded: userspace knows its start was missed */
            return;
        }
        __u64 key = conn_key(tgid, c->fd);
        link_exchange(c, key);
        if (GENAI && c->req_len >= 5 && is_post(c->req))
            ops = P_START | (all <= REQ_CAP ? P_WHOLE : 0);
        if (buf && all > REQ_CAP)
            want_scan(key, buf, all);
        c->state = ST_READING;
    } else if (c->req_len < HEAD_MIN) {
        ops = more_head(c, a, ret);
    } else if (GENAI && (c->flags & CF_BODY_NEXT)) {
        ops = P_BODY;
        c->flags &= ~CF_BODY_NEXT;
    }
    if (GENAI && (ops || c->flags & CF_BODY))
        want_payload(conn_key(tgid, c->fd), ops | P_REQ_TAIL, a, ret);
    c->bytes_in += ret;
    c->last_in_ns = now;
}

/* Response bytes: written by a server (`t` is the write's start), read by
 * a client (`t` is the read's return). */
static __always_inline void on_send(struct conn *c, struct args *a, __u32 tgid, long ret, __u64 t,
                                    __u64 now, int client)
{
    __u64 len = 0, buf = first_buffer(a, &len);
    __u16 status = status_sent(a, ret);
    int final = is_final(status), begun = 0;
    if (c->state == ST_RESPONDING && final && c->status) {
        /* the next response begins: the requests were pipelined, and each
         * is reported on its own, with the start of their common read */
        report(c, END_RESPONSE);
        c->pipeline++;
        c->status = 0;
        c->tp_len = c->ts_len = 0;
        c->flags &= ~(CF_BODY | CF_BODY_NEXT | CF_BINNED); /* the pieces were the first request's */
        c->state = ST_READING;
    }
    if (c->state != ST_RESPONDING) {
        if (c->state == ST_IDLE) { /* the server spoke first, or we missed the request */
            c->start_ns = t;
            c->peer_ended = 0;
            c->send_ns = c->runq_ns = c->rwait_ns = c->cwait_ns = 0;
            c->runq_tid = bpf_get_current_pid_tgid();
            c->runq_start = runq_now();
            c->rwait_start = rwait_now();
            c->cwait_start = cwait_now();
            if (c->flags & CF_SEEDED)
                c->flags |= CF_MISSED;
            c->flags &= ~CF_SEEDED;
        }
        __u64 n = ret < len ? ret : len;
        if (n > RESP_CAP)
            n = RESP_CAP;
        c->resp_len = 0;
        if (buf && n > 0 && read_user(c->resp, n, (void *)buf) == 0)
            c->resp_len = n;
        if (c->state == ST_IDLE && !client && !c->bytes_in && is_h2_settings(c)) {
            c->flags |= CF_STREAM; /* an HTTP/2 server that speaks first (gRPC's SETTINGS) */
            return;
        }
        c->first_out_ns = t;
        c->bytes_out = 0;
        c->state = ST_RESPONDING;
        begun = 1;
    }
    /* The status and the size move together, before any helper call: another
     * thread may read the next request meanwhile and report this exchange
     * (Go's server: a background read takes the next request's first byte),
     * and this program may be preempted at a helper's end (the peer it just
     * woke): a report between the two gave a 404 of 0 bytes. */
    if (final) {
        c->status = status;
        c->flags &= ~CF_INTERIM;
    } else if (status && !c->status) {
        c->flags |= CF_INTERIM;
    }
    c->bytes_out += ret;
    c->last_out_ns = t;
    if (begun && BINS && !client && final)
        choose_bin(c);
    /* Its caller, if traced: looked for now, not when the request came. On
     * loopback the request can be read before the caller's send has even
     * returned, let alone indexed its connection (learn_sock). */
    if (begun && OUTGOING && !client)
        c->link_key = caller_of(c);
    if (final && !client)
        count_status(tgid, status);
    /* chunked terminator "0\r\n\r\n" at the end of a flat write */
    __u8 tail[5] = {};
    if ((a->kind & 0xff) == K_FLAT && ret >= 5 &&
        read_user(tail, sizeof(tail), (void *)(buf + ret - 5)) == 0 &&
        tail[0] == '0' && tail[1] == '\r' && tail[2] == '\n' && tail[3] == '\r' && tail[4] == '\n')
        c->flags |= CF_CHUNK_END;
    else
        c->flags &= ~CF_CHUNK_END;
    if (GENAI && c->flags & CF_BODY)
        want_payload(conn_key(tgid, c->fd), P_BEAT | P_RESP_TAIL, a, ret);
    if (!client)
        c->send_ns += now - a->enter_ns;
    if (c->runq_tid == (__u32)bpf_get_current_pid_tgid()) {
        c->runq_ns = runq_now() - c->runq_start;
        c->rwait_ns = rwait_now() - c->rwait_start;
        c->cwait_ns = cwait_now() - c->cwait_start;
    }
}

/* A connection to follow: accepted (its peer's address in the sockaddr
 * accept wrote) or opened (the address connect was given). */
static __always_inline void new_conn(struct args *a, __u32 tgid, long fd, __u16 flags)
{
    __u64 key = conn_key(tgid, fd);
    int zero = 0;
    struct conn *c = zero_conn.lookup(&zero); /* a zeroed conn, too big for the stack */
    if (!c)
        return;
    if (conns.update(&key, c)) {
        __u64 one = 1;
        count(C_CONN_OVERFLOW);
        if (overflow.update(&key, &one))
            count(C_UNCOUNTED);
        return;
    }
    c = conns.lookup(&key);
    if (!c)
        return;
    c->tgid = tgid;
    c->fd = fd;
    c->flags = flags;
    bpf_get_current_comm(&c->comm, sizeof(c->comm));
    if (!a->ptr)
        return;
    __u16 family = 0;
    read_user(&family, sizeof(family), (void *)a->ptr);
    c->t.family = family;
    if (family == AF_INET_) {
        read_user(&c->t.rport, 2, (void *)(a->ptr + 2));
        read_user(c->t.raddr, 4, (void *)(a->ptr + 4));
    } else if (family == AF_INET6_) {
        read_user(&c->t.rport, 2, (void *)(a->ptr + 2));
        read_user(c->t.raddr, 16, (void *)(a->ptr + 8));
    }
    c->t.rport = ntohs(c->t.rport);
}

/* A read of anything but a connection the thread serves, waited on since
 * `since`: timed, and when its reply begins like a Redis one, timed as a
 * cache look-up too. */
static __always_inline void time_read(struct args *a, __u64 id, __u64 since)
{
    __u32 tid = id;
    __u64 took = since ? bpf_ktime_get_ns() - since : 0, len = 0, buf = first_buffer(a, &len);
    __u8 first = 0;
    __u64 *total = rwaits.lookup(&tid);
    if (total)
        *total += took;
    else
        rwaits.update(&tid, &took);
    if (buf && read_user(&first, 1, (void *)buf) == 0 && is_resp_reply(first)) {
        total = cwaits.lookup(&tid);
        if (total)
            *total += took;
        else
            cwaits.update(&tid, &took);
    }
}

/* connect() on an IP socket, done or in progress: followed as a client. */
static __always_inline void on_connect(struct args *a, __u32 tgid)
{
    __u16 family = 0;
    if (!OUTGOING || read_user(&family, sizeof(family), (void *)a->ptr) ||
        (family != AF_INET_ && family != AF_INET6_))
        return;
    new_conn(a, tgid, a->fd, CF_CLIENT);
    dialed_for_now(conn_key(tgid, a->fd));
}

static __always_inline void dispatch(struct conn *c, struct args *a, long ret, __u64 id, __u64 now);
static __always_inline void learn_sock(struct conn *c, __u64 sk);

#if !CONN_BY_STATE && !defined(TLS_MODULE) /* (the library's programs make no connect: no learn_sock there) */
/* connect() returned: the socket its handshake made, if that completed
 * inside it (dialed_now), is its connection's from now on. */
static __always_inline void learn_dialed(struct args *a, __u64 id)
{
    __u64 *sk = dialing.lookup(&id);
    if (!sk)
        return;
    __u64 key = conn_key(id >> 32, a->fd);
    struct conn *c = conns.lookup(&key);
    if (c)
        learn_sock(c, *sk);
    dialing.delete(&id);
}
#endif

/* ret > 0 bytes moved by a data call on tracked connection c (key). */
static __always_inline void moved(struct conn *c, __u64 key, struct args *a, long ret, __u64 id,
                                  __u64 now)
{
    if (c->flags & CF_TLS && !(c->flags & CF_TLS_PLAIN) && ++c->tls_calls > TLS_GRACE)
        c->flags &= ~CF_TLS; /* no plaintext came: not the hooked library's; framed as it is */
    if (!(c->flags & CF_TLS))
        dispatch(c, a, ret, id, now);
    if (c->flags & CF_TLS) { /* ciphertext: the plaintext comes through the library (ssl_leave) */
        __u32 tid = id;
        tls_threads.update(&tid, &key); /* the library's next call on this thread is for it */
    }
}

/* Exit half: the syscall's result decides what happened. On the socket
 * tier only accept and connect come here: data calls come to sock_call. */
static __always_inline int leave(void *ctx, long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct args *a = inflight.lookup(&id);
    if (!a)
        return 0;
    if (a->kind == K_CONNECT) {
        if (ret == 0 || ret == -EINPROGRESS_)
            on_connect(a, tgid);
#if !CONN_BY_STATE && !defined(TLS_MODULE)
        learn_dialed(a, id);
#endif
    } else if (ret > 0 && a->kind == K_ACCEPT) {
        new_conn(a, tgid, ret, 0);
    } else if (ret > 0) {
#if NET_TIER == NET_TIER_SYSCALL
        __u64 key = conn_key(tgid, a->fd);
        struct conn *c = conns.lookup(&key);
        if (a->kind & OTHER_READ)
            time_read(a, id, a->enter_ns);
        else if (a->kind & UNTRACKED)
            on_untracked_send(a, tgid, ret);
        else if (c)
            moved(c, key, a, ret, id, bpf_ktime_get_ns());
#endif
    }
    inflight.delete(&id);
#if NET_TIER == NET_TIER_SYSCALL
    tails(ctx, 0);
#endif
    return 0;
}

/* The tail calls a dispatch asked for; `user`: from a uprobe. */
static __always_inline void tails(void *ctx, int user)
{
    int zero = 0;
#if CONN_BY_STATE
    struct end_state *es = user ? NULL : end_states.lookup(&zero);
    if (es && es->pending && !es->late) {
        tail(ctx, 0, 6); /* end_conn, which goes on to the others; returns only if it failed */
        es->pending = 0;
    }
#endif
    struct split_state *sp = split_states.lookup(&zero);
    if (sp && sp->ret > 0) {
        tail(ctx, user, 4); /* split_body, which goes on to the others; returns only if it failed */
        sp->ret = 0;
    }
    struct payload_state *ps = GENAI ? payload_states.lookup(&zero) : NULL;
    if (ps && ps->ops) {
        tail(ctx, user, 3); /* keep_payload, which goes on to the others; returns only if it failed */
        ps->ops = 0;
        count(C_BODIES_FULL);
    }
    struct scan_state *st = scan_states.lookup(&zero);
    if (st && st->n) {
        tail(ctx, user, 0); /* does not return unless it failed */
        st->n = 0;
    }
    struct beat_state *bs = GENAI ? beat_states.lookup(&zero) : NULL;
    if (bs && bs->n) {
        tail(ctx, user, 1); /* send_beat, which ends with end_late */
        bs->n = 0;
        count(C_WRITES_LOST);
    }
    end_late(ctx, user); /* end_conn, which goes on to the call's chunk */
    struct chunk_state *cs = chunk_states.lookup(&zero);
    if (cs && cs->pending) {
        tail(ctx, user, 2); /* send_chunk */
        cs->pending = 0;
        count(C_CHUNKS_LOST);
    }
    struct shape_state *ss = BINS && !user ? shape_states.lookup(&zero) : NULL;
    if (ss && ss->pending) {
        tail(ctx, 0, 5); /* find_shape */
        ss->pending = 0; /* not binned: it crosses the ring */
    }
}

/* dispatch's exchange framing, for a connection that is not a stream (yet). */
static __always_inline void framed(struct conn *c, struct args *a, long ret, __u64 id, __u64 now)
{
    __u32 tgid = id >> 32;
    /* Userspace reads this entry while we write it (the idle flush): the
     * count is odd during the update, and moves on every update. */
    __sync_fetch_and_add(&c->seq, 1);
    /* a server's read and a client's write are the request's bytes; the
     * others the response's. One call site each: each inlines once. */
    int client = c->flags & CF_CLIENT, send = a->kind & SEND;
    if (client == 0 ? !send : send) {
        on_recv(c, a, tgid, ret, client ? a->enter_ns : now, client);
    } else {
        /* a client waits on a dependency, as reads of other things are: since
         * the read began, or where the socket tier cannot see that, since the
         * connection's last write or read (its request, its last reply bytes) */
        __u64 since = NET_TIER == NET_TIER_SOCK ? (c->last_out_ns > c->last_in_ns ? c->last_out_ns
                                                                                  : c->last_in_ns)
                                                : a->enter_ns;
        on_send(c, a, tgid, ret, client ? now : a->enter_ns, now, client);
        if (client && READ_WAITS)
            time_read(a, id, since);
    }
    __sync_fetch_and_add(&c->seq, 1);
}

/* ret bytes moved on a tracked connection, in plaintext: a syscall's, or a
 * TLS library call's (a->kind K_FLAT, a->ptr its buffer), at `now` (the
 * socket tier's a->enter_ns: its program runs when the bytes have moved;
 * a clock read is a tenth of that program's time on a traced request). */
static __always_inline void dispatch(struct conn *c, struct args *a, long ret, __u64 id, __u64 now)
{
    __u8 dir = a->kind & SEND ? CH_OUT : CH_IN;
    if (!(c->flags & CF_STREAM))
        framed(c, a, ret, id, now);
    if (c->flags & CF_STREAM) /* a stream's bytes, or its preface just framed */
        want_chunk(c, a, ret, dir, dir == CH_OUT ? a->enter_ns : now);
}

/* ---- The kernel's hooks (none of them are the TLS module's) ---- */
#ifndef TLS_MODULE

#if ATTACHED && NET_TIER == NET_TIER_SYSCALL
/* Field names differ between the syscalls' enters; each names its own. */
TRACEPOINT_PROBE(syscalls, sys_enter_read) { return enter(args->fd, args->buf, K_FLAT); }
/* A peek (nginx's, telling TLS from plain HTTP) reads nothing: the next read has the bytes. */
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom)
{
    return args->flags & MSG_PEEK_ ? 0 : enter(args->fd, args->ubuf, K_FLAT);
}
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { return enter(args->fd, args->vec, K_IOV); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg)
{
    return args->flags & MSG_PEEK_ ? 0 : enter(args->fd, args->msg, K_MSG);
}
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return enter(args->fd, args->buf, K_FLAT | SEND); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return enter(args->fd, args->buff, K_FLAT | SEND); }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { return enter(args->fd, args->vec, K_IOV | SEND); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return enter(args->fd, args->msg, K_MSG | SEND); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) { return enter(args->out_fd, 0, K_NOCOPY | SEND); }

/* Every sys_exit_* tracepoint has the one format (the kernel's sys_exit
 * event class), so the exits of the calls above share one program, which
 * userspace attaches to each (probes/net.py, SHARED_EXITS): one copy of
 * leave() to compile and verify, where a copy for each syscall made this
 * tier's compile 5.7 s. */
int sys_exit_io(struct tracepoint__syscalls__sys_exit_read *args) { return leave(args, args->ret); }
#endif
#if ATTACHED && !CONN_BY_STATE
TRACEPOINT_PROBE(syscalls, sys_enter_accept) { return enter(args->fd, args->upeer_sockaddr, K_ACCEPT); }
/* An accept that was already blocked when the process became tracked has no
 * entry half to remember; take its connection anyway (peer from the tuple). */
static __always_inline int leave_accept(void *ctx, long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct args none = {.kind = K_ACCEPT};
    if (ret < 0 || inflight.lookup(&id) || !is_tracked(id >> 32))
        return leave(ctx, ret);
    new_conn(&none, id >> 32, ret, 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { return enter(args->fd, args->upeer_sockaddr, K_ACCEPT); }
/* accept's and accept4's exits (SHARED_EXITS) */
int sys_exit_accepted(struct tracepoint__syscalls__sys_exit_accept *args)
{
    return leave_accept(args, args->ret);
}

TRACEPOINT_PROBE(syscalls, sys_enter_connect) { return enter(args->fd, args->uservaddr, K_CONNECT); }
TRACEPOINT_PROBE(syscalls, sys_exit_connect) { return leave(args, args->ret); }
#endif

/* Connection c (key) is closed: its exchange reported, its entries gone. */
static __always_inline void close_conn(struct conn *c, __u64 key)
{
    if (c->state != ST_IDLE) {
        __sync_fetch_and_add(&c->seq, 1); /* a reader of the entry sees it changed (`taken`) */
        report(c, END_CLOSE);
    }
    if (c->flags & CF_STREAM && !chunk_closes(c))
        close_chunk(c);
    if (c->flags & CF_CLIENT && c->flags & CF_TUPLE) {
        struct tuple t = {};
        canonical(&c->t, &t, 0);
        clients.delete(&t);
    }
    sk_conns.delete(&c->sk);
#if CONN_BY_STATE
    draining.delete(&c->sk);
#endif
    conns.delete(&key);
    bodies.delete(&key);
    dialed_for.delete(&key);
}

#if CONN_BY_STATE
/* close_conn is the largest thing these programs inline (its report, its
 * close chunk): it is inlined once for each program type, in end_conn and
 * end_conn_tp, which a program asks for where a connection ends, instead of
 * at each of the seven places one can (a fifth of net.c's compile and two thirds
 * of sock_io's verifying). `again`: the asking program stops there and sees
 * its event again once the conn is gone; else the tail call goes on to the
 * call's other tails. */
static __always_inline void end_later(__u64 key, __u8 again)
{
    int zero = 0;
    struct end_state *es = end_states.lookup(&zero);
    if (es) {
        es->key = key;
        es->again = again;
        es->late = 0;
        es->pending = 1;
    }
}

/* End the conn TCP ended inside the call on it (CF_CLOSING), once that
 * call's own tails are done: its payload kept, its head scanned, its
 * write's event sent, all before the exchange they belong to is reported
 * (end_late). Its chunk, if any, still comes after the end and says so
 * (chunk_closes). */
static __always_inline void end_after_call(__u64 key)
{
    int zero = 0;
    struct end_state *es = end_states.lookup(&zero);
    if (es) {
        es->key = key;
        es->again = 0;
        es->late = 1;
        es->pending = 1;
    }
}

/* What end_later asked, forgotten (a tail call for it failed) */
static __always_inline void end_cancel(void)
{
    int zero = 0;
    struct end_state *es = end_states.lookup(&zero);
    if (es)
        es->pending = 0;
}

/* The conn end_later asked to end, ended; whether its event is to be seen again. */
static __always_inline int end_pending(void)
{
    int zero = 0;
    struct end_state *es = end_states.lookup(&zero);
    if (!es || !es->pending)
        return 0;
    es->pending = 0;
    __u64 key = es->key;
    struct conn *c = conns.lookup(&key);
    if (c)
        close_conn(c, key);
    return es->again;
}

#if TAILED
/* The tail call of sock_io's ends */
int end_conn(struct bpf_raw_tracepoint_args *ctx)
{
    if (end_pending())
        tail(ctx, 0, 7); /* sock_io again: the call is on its fd's new socket */
    else
        tails(ctx, 0);
    return 0;
}

/* ... and of inet_sock_set_state's */
int end_conn_tp(void *args)
{
    end_pending();
    state_prog.call(args, 1); /* the state change again, past the conn ended */
    return 0;
}
#endif

/* The end end_later asked for, now: sock_io's (end_conn) and
 * inet_sock_set_state's (end_conn_tp, then that program again), which
 * return this. A tail call fails only where the agent has not filled the
 * program arrays yet, before it has a connection; the end it asked for is
 * then forgotten, not left for a later call on this CPU. */
static __always_inline int end_now(void *ctx)
{
    tail(ctx, 0, 6);
    end_cancel();
    return 0;
}

static __always_inline int end_then_again(void *args)
{
    state_prog.call(args, 0);
    end_cancel();
    return 0;
}
#endif

#if ATTACHED && !CONN_BY_STATE
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return 0;
    __u64 key = conn_key(tgid, args->fd);
    struct conn *c = conns.lookup(&key);
    if (c)
        close_conn(c, key);
    else
        overflow.delete(&key);
    return 0;
}
#endif

/* A TCP client connection whose tuple is known: findable by the server at its
 * other end (link_exchange). Either may come first: a client's first call may
 * be a read (gRPC's), which tells the tuple before any send tells TCP. */
static __always_inline void index_client(struct conn *c)
{
    __u16 want = CF_CLIENT | CF_TCP | CF_TUPLE;
    if (OUTGOING && (c->flags & want) == want) {
        __u64 key = conn_key(c->tgid, c->fd);
        struct tuple t = {};
        canonical(&c->t, &t, 0);
        clients.update(&t, &key);
    }
}

/* c's socket is a TCP one with tuple t (`socks`). */
static __always_inline void knows_tuple(struct conn *c, const struct tuple *t)
{
    c->t = *t;
    c->flags |= CF_TUPLE;
    if (NET_TIER == NET_TIER_SOCK) /* `socks` holds TCP sockets only: no tcp_sendmsg hook needed */
        c->flags |= CF_TCP;
    index_client(c);
}

/* The socket under a call on c: learnt once per connection, with its tuple
 * when it is a TCP socket that connected while we watched (`socks`). */
static __always_inline void learn_sock(struct conn *c, __u64 sk)
{
    if (c->sk == sk)
        return;
    c->sk = sk;
    __u64 key = conn_key(c->tgid, c->fd);
    sk_conns.update(&sk, &key);
#if CONN_BY_STATE
    draining.delete(&sk); /* an earlier socket's at this address, whose end-of-file read never came */
#endif
    struct tuple *t = socks.lookup(&sk);
    if (t)
        knows_tuple(c, t);
}

/* The peer of a followed connection on socket sk ended its side while an
 * exchange was under way: its FIN came before the process closed (TCP's
 * CLOSE_WAIT), or a call failed on its reset (ECONNRESET; EPIPE, a write
 * after it). A server's answer cut off after that is its client's doing (a
 * stop button, a timeout), not the server's (conn.peer_ended; an HTTP/2
 * connection's, whatever its streams, goes with its chunks). An
 * end-of-file read is no such sign: it also ends a lingering close, where
 * the process shut its side first (gunicorn's sync worker). seq moves, so a
 * copy read before is not kept. */
static __always_inline void peer_ended_on(__u64 sk)
{
    __u64 *key = sk_conns.lookup(&sk);
    struct conn *c = key ? conns.lookup(key) : NULL;
    if (c && c->sk == sk && (c->state != ST_IDLE || c->flags & CF_STREAM) && !c->peer_ended) {
        c->peer_ended = 1;
        __sync_fetch_and_add(&c->seq, 2);
    }
}

static __always_inline int is_reset(long ret)
{
    return ret == -ECONNRESET_ || ret == -EPIPE_;
}

#if NET_TIER == NET_TIER_SYSCALL
/* The socket under the current call: learn it once per connection. */
static __always_inline struct conn *current_conn(void)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct args *a = inflight.lookup(&id);
    if (!a || a->kind == K_ACCEPT)
        return NULL;
    __u64 key = conn_key(id >> 32, a->fd);
    return conns.lookup(&key);
}

/* tcp_sendmsg ran for the current call's connection. */
static __always_inline void mark_tcp(void)
{
    struct conn *c = current_conn();
    if (c && !(c->flags & CF_TCP)) {
        c->flags |= CF_TCP;
        index_client(c);
    }
}

static __always_inline void learn_current_sock(__u64 sk)
{
    struct conn *c = current_conn();
    if (c)
        learn_sock(c, sk);
}

#if ATTACHED
TRACEPOINT_PROBE(sock, sock_recv_length)
{
    if (is_reset(args->ret))
        peer_ended_on((__u64)args->sk);
    learn_current_sock((__u64)args->sk);
    return 0;
}
TRACEPOINT_PROBE(sock, sock_send_length)
{
    if (is_reset(args->ret))
        peer_ended_on((__u64)args->sk);
    learn_current_sock((__u64)args->sk);
    return 0;
}
#endif
#else
/* ---- the socket tier: one raw tracepoint per direction, after the socket
 * layer moved the bytes, inside the syscall that asked: its arguments are in
 * the registers it entered with (bpf_task_pt_regs). Only the data syscalls
 * the syscall tier hooks are followed (io_uring, sendmmsg, splice, the
 * kernel's own sends are not); a read's start is not seen here, so reads of
 * untracked sockets are not timed, and a client's reads wait since its
 * connection's last call (dispatch). */
#if defined(__TARGET_ARCH_x86) || defined(__x86_64__)
#define SYSCALL_NR(r) ((r)->orig_ax)
#define SYSCALL_ARG1(r) ((r)->di)
#define SYSCALL_ARG2(r) ((r)->si)
#elif defined(__TARGET_ARCH_arm64) || defined(__aarch64__)
#define SYSCALL_NR(r) ((r)->syscallno)
#define SYSCALL_ARG1(r) ((r)->orig_x0)
#define SYSCALL_ARG2(r) ((r)->regs[1])
#else
#error "NET_TIER_SOCK: no syscall register layout for this architecture"
#endif

/* The kind of the data syscall nr (as struct args.kind), 0: not one we follow. */
static __always_inline __u32 syscall_kind(__u64 nr)
{
    switch (nr) {
    case __NR_read: case __NR_recvfrom: return K_FLAT;
    case __NR_readv: return K_IOV;
    case __NR_recvmsg: return K_MSG;
    case __NR_write: case __NR_sendto: return K_FLAT | SEND;
    case __NR_writev: return K_IOV | SEND;
    case __NR_sendmsg: return K_MSG | SEND;
    case __NR_sendfile: return K_NOCOPY | SEND;
    }
    return 0;
}

/* CONN_BY_STATE: the connection of a tracked process's first call on socket
 * sk, where its accept or connect would have made one: a TCP socket seen
 * connecting while we watched (`dialed`) is a client's, followed with
 * stitch.outgoing; one seen established otherwise (`socks`) was accepted;
 * a Unix stream socket with an address is one a listener accepted (the
 * child takes the listener's; a socketpair, such as asyncio's wake-up pair,
 * or a connecting client has none). Taken at a send, a server's connection
 * is one whose request was missed (CF_SEEDED, as one userspace seeds). */
#if CONN_BY_STATE
/* The system call the current thread is in on c's fd, if it is a thread
 * of c's process and that call's first argument is c's fd; else -1. A TCP
 * state change taken inside a call on the connection is the call's doing,
 * or the peer's handled inside it (loopback delivers the peer's answer to
 * a send, a reset, an acknowledgement, in the very call that drew it). */
static __always_inline long call_on(struct conn *c)
{
    if (bpf_get_current_pid_tgid() >> 32 != c->tgid)
        return -1;
    struct pt_regs regs = {};
    bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(bpf_get_current_task_btf()));
    return (__u32)SYSCALL_ARG1(&regs) == c->fd ? (long)SYSCALL_NR(&regs) : -1;
}

/* Whether a socket in TCP state `old` had shut its sending side, before the
 * close now: its FIN sent, and the peer's come (TIME_WAIT), or acknowledged
 * after the peer's (LAST_ACK), or a reset. */
static __always_inline int shut_before(int old)
{
    return old == BPF_TCP_FIN_WAIT1 || old == BPF_TCP_FIN_WAIT2 || old == BPF_TCP_CLOSING ||
           old == BPF_TCP_LAST_ACK;
}

/* The end-of-file read on socket sk (a call that returned 0) by a traced
 * process: a draining client's conn (see `draining`) has read all there
 * was, and ends; any other client's is marked as read to its end. */
static __always_inline int drained(__u64 sk)
{
    __u64 *key = sk_conns.lookup(&sk);
    __u64 k = key ? *key : 0;
    struct conn *c = key ? conns.lookup(&k) : NULL;
    if (!c || c->sk != sk || !(c->flags & CF_CLIENT))
        return 0;
    __u8 *d = draining.lookup(&sk), read = DRAIN_READ;
    if (d && *d == DRAIN_WAIT) {
        end_later(k, 0);
        return 1;
    }
    draining.update(&sk, &read);
    return 0;
}

/* TCP state `to` from `from` on c's socket sk, as the process or the peer
 * ended it. shutdown(SHUT_WR) moves it as a close does (FIN_WAIT1, or
 * LAST_ACK after the peer's FIN), but the process still reads: a server's
 * lingering close (gunicorn's sync worker answers a request before reading
 * its body, shuts its side, then reads what the client still sends), a
 * client's answer after it shut its side. So the connection goes on. When
 * a client's socket then closes other than in its close() (the peer's FIN
 * or acknowledgement, in a softirq or inside the client's own call on it),
 * the answer still queued is read, and the end-of-file read ends it
 * (`draining`). A server's ends then: one that reads no more makes no
 * end-of-file read, and its close() of a closed socket shows no state
 * (Python's http.server, and so the reference engine, shuts its side and
 * closes); what a lingering close still reads of a body is counted until
 * its client's FIN. 1: end_later was asked. */
static __always_inline int ended(struct conn *c, __u64 key, __u64 sk, int from, int to)
{
    long nr = call_on(c);
    if (nr == __NR_shutdown && to != BPF_TCP_CLOSE)
        return 0; /* only its sending side */
    __u8 *d = draining.lookup(&sk), wait = DRAIN_WAIT;
    if (to == BPF_TCP_CLOSE && shut_before(from) && (nr < 0 || nr == __NR_shutdown || syscall_kind(nr)) &&
        c->flags & CF_CLIENT && !(d && *d == DRAIN_READ)) {
        draining.update(&sk, &wait);
    } else if (nr >= 0 && syscall_kind(nr)) {
        c->flags |= CF_CLOSING; /* its sock_io comes next, with this call's bytes */
    } else {
        end_later(key, 1);
        return 1;
    }
    return 0;
}
#endif

static __always_inline struct conn *adopt(__u64 key, __u32 tgid, __u32 fd, __u64 sk, __u32 send)
{
#if CONN_BY_STATE
    __u16 flags = send ? CF_SEEDED : 0;
    if (dialed.lookup(&sk)) {
        if (!OUTGOING)
            return NULL;
        flags = CF_CLIENT;
    } else if (!socks.lookup(&sk)) {
        __u16 family = 0, type = 0;
        __u64 addr = 0;
        bpf_probe_read_kernel(&family, sizeof(family), (void *)(sk + SOCK_FAMILY_OFF));
        bpf_probe_read_kernel(&type, sizeof(type), (void *)(sk + SOCK_TYPE_OFF));
        if (family != AF_UNIX_ || type != SOCK_STREAM_)
            return NULL;
        bpf_probe_read_kernel(&addr, sizeof(addr), (void *)(sk + UNIX_ADDR_OFF));
        if (!addr)
            return NULL;
    }
    struct args none = {.kind = K_ACCEPT}; /* no address to read: the tuple comes from `socks` */
    new_conn(&none, tgid, fd, flags);
    struct conn *c = conns.lookup(&key);
    if (!c && overflow.lookup(&key))
        overflow.update(&key, &sk); /* refused: known by its socket from now on */
    return c;
#else
    return NULL; /* accept and connect make them */
#endif
}

#if ATTACHED
/* One program for both directions (attached to sock_send_length and
 * sock_recv_length: their arguments are alike), so the state machine is
 * compiled and verified once: the syscall says which way the bytes went. */
int sock_io(struct bpf_raw_tracepoint_args *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    long ret = (int)ctx->args[1];
    if (ret <= 0) {
        if (is_reset(ret) && is_tracked(tgid))
            peer_ended_on(ctx->args[0]);
#if CONN_BY_STATE
        if (ret == 0 && is_tracked(tgid) && drained(ctx->args[0]))
            return end_now(ctx);
#endif
        return 0;
    }
    if (!is_tracked(tgid))
        return 0;
    struct pt_regs regs = {};
    bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(bpf_get_current_task_btf()));
    __u32 kind = syscall_kind(SYSCALL_NR(&regs)), send = kind & SEND;
    if (!kind || (!send && ctx->args[2] & MSG_PEEK_)) /* a peek reads nothing: the next read has the bytes */
        return 0;
    struct args a = {.ptr = SYSCALL_ARG2(&regs), .enter_ns = bpf_ktime_get_ns(),
                     .fd = SYSCALL_ARG1(&regs), .kind = kind};
    __u64 key = conn_key(tgid, a.fd), sk = ctx->args[0];
    struct conn *c = conns.lookup(&key);
#if CONN_BY_STATE
    if (c && c->sk && c->sk != sk) { /* its fd is another socket's now: closed, then this call seen again */
        end_later(key, 1);
        return end_now(ctx);
    }
#endif
    if (!c) {
        /* refused by a full table at its first call: counted (untracked) for
         * as long as it lives, as one refused at its accept is */
        __u64 *refused = overflow.lookup(&key);
        if (CONN_BY_STATE && refused && *refused != sk) {
            overflow.delete(&key); /* that one is gone: its fd is this socket's */
            refused = NULL;
        }
        if (refused) {
            if (send)
                on_untracked_send(&a, tgid, ret);
            return 0;
        }
        c = adopt(key, tgid, a.fd, sk, send);
    }
    if (c) {
        learn_sock(c, sk);
        moved(c, key, &a, ret, id, a.enter_ns);
#if CONN_BY_STATE
        if (c->flags & CF_CLOSING) /* TCP ended it inside this call (see ended): after the call's tails */
            end_after_call(key);
#endif
        tails(ctx, 0);
    }
    return 0;
}
#endif
#endif

static __always_inline void notify(__u32 kind, __u32 tgid);

/* Whether the sockaddr a connect() was given (user memory at ptr) is t's far end. */
static __always_inline int connects_to(__u64 ptr, const struct tuple *t)
{
    __u16 sa[2] = {}; /* family, port (network order) */
    return read_user(sa, sizeof(sa), (void *)ptr) == 0 && sa[0] == t->family && ntohs(sa[1]) == t->rport;
}

#if CONN_BY_STATE
/* A socket is made once: a conn still on this address is an earlier
 * socket's (the kernel reuses a freed socket's memory) whose end went unseen. */
static __always_inline int unbind_stale(__u64 sk)
{
    __u64 *was = sk_conns.lookup(&sk);
    __u64 w = was ? *was : 0;
    struct conn *stale = was ? conns.lookup(&w) : NULL;
    if (stale && stale->sk == sk) {
        end_later(w, 1);
        return 1;
    }
    if (was)
        sk_conns.delete(&sk);
    return 0;
}

/* A tracked process's connect() begins a TCP handshake (t: its far end):
 * its connection is known by its socket from now on, not from its first
 * call, whose hook runs once the bytes have moved, when a traced server may
 * have read and answered them: the server finds its caller (caller_of) once
 * the handshake tells the tuple (dialed_now), in whatever context that comes.
 * 1: end_later was asked. */
static __always_inline int dialing_now(__u64 sk, const struct tuple *t)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (!OUTGOING || !is_tracked(tgid))
        return 0;
    struct pt_regs regs = {};
    bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(bpf_get_current_task_btf()));
    if (SYSCALL_NR(&regs) != __NR_connect || !connects_to(SYSCALL_ARG2(&regs), t))
        return 0;
    __u32 fd = SYSCALL_ARG1(&regs);
    __u64 key = conn_key(tgid, fd);
    struct conn *c = conns.lookup(&key);
    if (c && c->sk != sk) { /* its fd was another socket's: closed */
        end_later(key, 1);
        return 1;
    }
    if (!c)
        c = adopt(key, tgid, fd, sk, 0);
    if (c) {
        learn_sock(c, sk);
        dialed_for_now(key);
    }
    return 0;
}
#endif

/* A TCP handshake completed on a socket that connected (t: its tuple). The
 * socket tier's conn, made when its connect() began, learns its tuple; the
 * syscall tier's is made when connect() returns, with the socket it is told
 * here when this runs inside that connect() (in a softirq the current task
 * is whoever it interrupted). */
static __always_inline void dialed_now(__u64 sk, const struct tuple *t)
{
#if CONN_BY_STATE
    __u64 *key = sk_conns.lookup(&sk);
    __u64 k = key ? *key : 0;
    struct conn *c = key ? conns.lookup(&k) : NULL;
    if (c && c->sk == sk && !(c->flags & CF_TUPLE))
        knows_tuple(c, t);
#else
    __u64 id = bpf_get_current_pid_tgid();
    if (!OUTGOING || !is_tracked(id >> 32))
        return;
    struct args *a = inflight.lookup(&id);
    if (a && a->kind == K_CONNECT && connects_to(a->ptr, t))
        dialing.update(&id, &sk); /* its conn is made when connect() returns (learn_dialed) */
#endif
}

#if ATTACHED
TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    __u64 sk = (__u64)args->skaddr;
    if (args->protocol != IPPROTO_TCP_)
        return 0;
    if (args->newstate == BPF_TCP_LISTEN) { /* listen(): in the listening process */
        __u16 port = args->sport;
        __u32 tgid = bpf_get_current_pid_tgid() >> 32;
        __u8 one = 1;
        if (ports.lookup(&port) && !is_tracked(tgid)) {
            if (!tracked.insert(&tgid, &one)) /* 0: this call made the entry */
                kernel_tracked(tgid);
            notify(N_LISTEN, tgid);
        }
        return 0;
    }
    if (args->newstate == BPF_TCP_CLOSE_WAIT) { /* the peer's FIN, before the process closed */
        peer_ended_on(sk);
        return 0;
    }
#if CONN_BY_STATE
    if (args->newstate == BPF_TCP_FIN_WAIT1 || args->newstate == BPF_TCP_LAST_ACK ||
        args->newstate == BPF_TCP_CLOSE) {
        /* the process closed it or shut its side, or the peer ended it */
        __u64 *key = sk_conns.lookup(&sk);
        __u64 k = key ? *key : 0;
        struct conn *c = key ? conns.lookup(&k) : NULL;
        if (c && c->sk == sk) {
            if (ended(c, k, sk, args->oldstate, args->newstate))
                return end_then_again(args);
        } else if (key)
            sk_conns.delete(&sk);
    }
#endif
    if (args->newstate == BPF_TCP_CLOSE) {
        socks.delete(&sk);
#if CONN_BY_STATE
        dialed.delete(&sk);
#endif
        return 0;
    }
#if CONN_BY_STATE
    if (args->newstate == BPF_TCP_SYN_SENT) { /* connect(), in the connecting process */
        __u8 one = 1;
        struct tuple far = {.family = args->family, .rport = args->dport}; /* its own port is not chosen yet */
        if (unbind_stale(sk))
            return end_then_again(args);
        dialed.update(&sk, &one);
        if (dialing_now(sk, &far))
            return end_then_again(args);
        return 0;
    }
#endif
    if (args->newstate != BPF_TCP_ESTABLISHED)
        return 0;
#if CONN_BY_STATE
    if (args->oldstate != BPF_TCP_SYN_SENT && unbind_stale(sk)) /* accepted: a socket new to us */
        return end_then_again(args);
#endif
    struct tuple t = {.family = args->family, .lport = args->sport, .rport = args->dport};
    if (args->family == AF_INET_) {
        __builtin_memcpy(t.laddr, args->saddr, 4);
        __builtin_memcpy(t.raddr, args->daddr, 4);
    } else {
        __builtin_memcpy(t.laddr, args->saddr_v6, 16);
        __builtin_memcpy(t.raddr, args->daddr_v6, 16);
    }
    socks.update(&sk, &t);
    if (args->oldstate == BPF_TCP_SYN_SENT)
        dialed_now(sk, &t);
    return 0;
}
#endif

/* tcp_sendmsg: marks the connection as TCP, through the best hook this kernel has. */
#if NET_TIER == NET_TIER_SOCK || !ATTACHED
#elif TCP_SENDMSG_HOOK == TCP_SENDMSG_FENTRY
KFUNC_PROBE(tcp_sendmsg, struct sock *sk)
{
    mark_tcp();
    return 0;
}
#elif TCP_SENDMSG_HOOK == TCP_SENDMSG_KPROBE
int kprobe__tcp_sendmsg(struct pt_regs *ctx, struct sock *sk)
{
    mark_tcp();
    return 0;
}
#else
TRACEPOINT_PROBE(tcp, tcp_sendmsg_locked)
{
    mark_tcp();
    return 0;
}
#endif

static __always_inline void notify(__u32 kind, __u32 tgid)
{
    struct notice *n = notices.ringbuf_reserve(sizeof(struct notice));
    if (!n) {
        count(C_NOTICES_LOST);
        return;
    }
    n->kind = kind;
    n->tgid = tgid;
    bpf_get_current_comm(&n->comm, sizeof(n->comm));
    notices.ringbuf_submit(n, 0);
}

#if ATTACHED
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    notify(N_EXEC, bpf_get_current_pid_tgid() >> 32);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!args->group_dead || !is_tracked(tgid))
        return 0;
    tracked.delete(&tgid);
    notify(N_EXIT, tgid);
    return 0;
}
#endif

#if RUNQ
/* Run-queue wait of tracked processes' threads: from a thread becoming
 * runnable (woken, or preempted while running) to it running again, summed
 * per thread. An exchange takes the growth of its serving thread's (the one
 * that read the request, while it is the one writing the response). These
 * hooks fire on every context switch and wake-up of the node: an untracked
 * thread must cost as little as a call of an untracked process in sock_io. */
NET_MAP("hash", __u32, __u64, runnable, 16384); /* tid -> since when it waits to run */

#ifdef TASK_PID_OFF
/* Raw tracepoints (a fraction of a perf-event tracepoint's cost): their
 * arguments are task pointers, and a task's pid and tgid sit at
 * TASK_PID_OFF and TASK_TGID_OFF, read from the running kernel's BTF
 * (probes/net_plan.py), not from headers that may be another kernel's. So
 * whether a woken or next thread is tracked is its process's bit
 * (is_tracked). A thread still in `runnable` when its process is untracked
 * is taken out by userspace (NetProbe.untrack). */
struct task_ids {
    __u32 pid, tgid;
};

static __always_inline struct task_ids ids_of(__u64 task)
{
    struct task_ids t = {};
#if TASK_TGID_OFF == TASK_PID_OFF + 4
    bpf_probe_read_kernel(&t, sizeof(t), (void *)(task + TASK_PID_OFF));
#else
    bpf_probe_read_kernel(&t.pid, sizeof(t.pid), (void *)(task + TASK_PID_OFF));
    bpf_probe_read_kernel(&t.tgid, sizeof(t.tgid), (void *)(task + TASK_TGID_OFF));
#endif
    return t;
}
static __always_inline int waits_to_run(struct task_ids t) { return is_tracked(t.tgid); }
#else
/* The perf-event tracepoints give a thread's id only: tracked threads are
 * those seen leaving a CPU while their process was tracked. */
NET_MAP("lru_hash", __u32, __u32, threads, 16384); /* tid -> tgid */
struct task_ids {
    __u32 pid;
};
static __always_inline int waits_to_run(struct task_ids t) { return threads.lookup(&t.pid) != NULL; }
#endif

/* The current thread leaves the CPU (still runnable, or not) and `next` takes it. */
static __always_inline int on_switch(struct task_ids next, int runnable_still)
{
    __u64 id = bpf_get_current_pid_tgid(), now = 0; /* the clock only when needed */
    __u32 tgid = id >> 32, tid = id;
    if (tid && is_tracked(tgid)) {
#ifndef TASK_PID_OFF
        if (!threads.lookup(&tid))
            threads.update(&tid, &tgid);
#endif
        if (runnable_still) {
            now = bpf_ktime_get_ns();
            runnable.update(&tid, &now);
        }
    }
#ifdef TASK_PID_OFF
    if (!is_tracked(next.tgid))
        return 0;
#endif
    __u64 *since = runnable.lookup(&next.pid);
    if (!since)
        return 0;
    __u64 waited = (now ? now : bpf_ktime_get_ns()) - *since;
    runnable.delete(&next.pid);
    __u64 *total = runq.lookup(&next.pid);
    if (total)
        __sync_fetch_and_add(total, waited);
    else
        runq.update(&next.pid, &waited);
    return 0;
}

static __always_inline int on_wakeup(struct task_ids woken)
{
    if (!waits_to_run(woken))
        return 0;
    __u64 now = bpf_ktime_get_ns();
    runnable.update(&woken.pid, &now);
    return 0;
}

#if !ATTACHED
#elif defined(TASK_PID_OFF)
/* (bool preempt, struct task_struct *prev, *next, unsigned int prev_state): 5.18+ */
RAW_TRACEPOINT_PROBE(sched_switch)
{
    return on_switch(ids_of(ctx->args[2]), (ctx->args[0] & 1) || (__u32)ctx->args[3] == 0);
}
RAW_TRACEPOINT_PROBE(sched_wakeup) { return on_wakeup(ids_of(ctx->args[0])); }
#else
/* TASK_RUNNING, or preempted (reported as TASK_REPORT_MAX): still runnable */
TRACEPOINT_PROBE(sched, sched_switch)
{
    struct task_ids next = {.pid = args->next_pid};
    return on_switch(next, (args->prev_state & 0xff) == 0);
}
TRACEPOINT_PROBE(sched, sched_wakeup)
{
    struct task_ids woken = {.pid = args->pid};
    return on_wakeup(woken);
}
#endif
#endif

#else /* TLS_MODULE */

/* ---- TLS: the plaintext, from the library (OpenSSL's SSL_read/SSL_write
 * and their _ex forms, attached by userspace to each libssl a traced process
 * maps). An SSL * is tied to its connection by the thread's last read or
 * write of a CF_TLS connection before the call returns (inside the call for
 * a socket BIO; just before it for a memory BIO, as Python's asyncio does),
 * and checked against the connection's socket on every later call. */
BPF_TABLE("lru_hash", __u64, struct ssl_conn, ssl_conns, MAX_CONNS); /* SSL * -> its conn */
BPF_HASH(ssl_calls, __u64, struct ssl_call, 16384);                  /* pid_tgid -> a library call in progress */

static __always_inline int ssl_enter(struct pt_regs *ctx, __u32 flags)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_tracked(id >> 32))
        return 0;
    struct ssl_call call = {.ssl = PT_REGS_PARM1(ctx), .buf = PT_REGS_PARM2(ctx),
                            .done = flags & SSL_EX ? PT_REGS_PARM4(ctx) : 0,
                            .enter_ns = bpf_ktime_get_ns(), .flags = flags};
    ssl_calls.update(&id, &call);
    return 0;
}

static __always_inline struct conn *ssl_conn_of(__u64 ssl, __u64 id)
{
    struct ssl_conn *known = ssl_conns.lookup(&ssl);
    if (known) {
        struct conn *c = conns.lookup(&known->key);
        if (c && c->sk == known->sk && c->flags & CF_TLS) {
            c->flags |= CF_TLS_PLAIN;
            return c;
        }
    }
    __u32 tid = id;
    __u64 *key = tls_threads.lookup(&tid);
    struct conn *c = key ? conns.lookup(key) : NULL;
    if (!c || !(c->flags & CF_TLS))
        return NULL;
    struct ssl_conn learned = {.key = *key, .sk = c->sk};
    ssl_conns.update(&ssl, &learned);
    c->flags |= CF_TLS_PLAIN;
    return c;
}

#if ATTACHED /* NET_PART 3: the TLS module's maps alone */
int ssl_leave(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct ssl_call *call = ssl_calls.lookup(&id);
    if (!call)
        return 0;
    long n = (int)PT_REGS_RC(ctx);
    if (call->flags & SSL_EX) { /* 1 and the count in *done, or 0 */
        __u64 done = 0;
        if (n != 1 || read_user(&done, sizeof(done), (void *)call->done))
            done = 0;
        n = done;
    }
    struct conn *c = n > 0 ? ssl_conn_of(call->ssl, id) : NULL;
    if (c) {
        struct args a = {.ptr = call->buf, .enter_ns = call->enter_ns, .fd = c->fd,
                         .kind = K_FLAT | (call->flags & SSL_WRITE ? SEND : 0)};
        dispatch(c, &a, n, id, bpf_ktime_get_ns());
    }
    ssl_calls.delete(&id);
    tails(ctx, 1);
    return 0;
}

int ssl_read_enter(struct pt_regs *ctx) { return ssl_enter(ctx, 0); }
int ssl_read_ex_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_EX); }
int ssl_write_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_WRITE); }
int ssl_write_ex_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_WRITE | SSL_EX); }
#endif
#endif /* TLS_MODULE */
