/* The kernel/userspace contract of sitsprobe: every struct that crosses the
 * boundary, every counter index, every constant. Userspace never mirrors these
 * by hand: bcc derives the ctypes layouts from this file, and Python reads the
 * constants from sitsprobe/abi.py, which tests/unit/test_abi.py checks against
 * every enum and #define here.
 *
 * Load-time settings arrive as -D flags (see sitsprobe/probes/net.py):
 *   REQ_CAP, RESP_CAP    bytes of each request / response head captured
 *   HEAD_SCAN            request head bytes searched for trace context headers
 *   MAX_CONNS            connections tracked at once
 *   RINGBUF_PAGES        exchange ring buffer size in pages (power of two)
 *   RING_WAKE_BYTES      bytes one CPU writes to the exchanges or the streams ring
 *                        between two wakeups of the agent (power of two; ring_wake.h)
 *   NET_TIER             where the bytes of socket calls are read: NET_TIER_SOCK (raw
 *                        tracepoints sock:sock_send_length/sock_recv_length, the call's
 *                        arguments from the syscall's registers) or NET_TIER_SYSCALL (the
 *                        data syscalls' enter/exit tracepoints)
 *   TCP_SENDMSG_HOOK     TCP_SENDMSG_FENTRY, _KPROBE or _TRACEPOINT (tcp:tcp_sendmsg_locked);
 *                        NET_TIER_SYSCALL only (the socket tier knows TCP from the socket)
 *   GENAI                1: keep the payload pieces below for POST exchanges (a traced server's
 *                        and a traced client's calls), 0: none
 *   BODY_CAP             first bytes of a POST request's body kept
 *   TAIL_CAP             last bytes of a POST request and of its response kept (power of two)
 *   PEEK_CAP             first bytes of each response write to a POST kept (a client's: each read)
 *   MAX_WRITES           response writes of one exchange reported one by one
 *   MAX_BODIES           POST exchanges in progress whose payload is kept at once
 *   RUNQ                 1: time tracked processes' threads wait to run (sched tracepoints)
 *   OUTGOING             1: follow the TCP connections tracked processes open (connect)
 *   CHUNK_CAP            bytes of each read and write of an HTTP/2 connection copied (power of two)
 *   STREAM_PAGES         `streams` ring buffer size in pages (power of two; userspace gives
 *                        it RINGBUF_PAGES too)
 *   READ_WAITS           1: time tracked threads spend in reads of anything but their
 *                        tracked connections (files, pipes, a dependency's socket),
 *                        and of those, in reads of a Redis reply
 *   BINS                 1: plain HTTP/1.x server exchanges whose route userspace knows
 *                        (`shapes`) are counted and binned in the kernel (`bins`, struct
 *                        bin), and cross the ring only when chosen for a trace
 *                        (`sampling`); 0: every exchange crosses, userspace counts it
 *   MAX_BINS             (process, method, route, status) series `bins` holds
 *   DUR_SLOT(ns), SEG_SLOT(ns)  the histogram bucket of a duration / a latency
 *                        segment: how many of the buckets' upper bounds it is above
 *   DUR_SLOTS, SEG_SLOTS buckets of each, +Inf included
 */
#ifndef SITSPROBE_H
#define SITSPROBE_H

#define TCP_SENDMSG_FENTRY 1
#define TCP_SENDMSG_KPROBE 2
#define TCP_SENDMSG_TRACEPOINT 3
#define NET_TIER_SOCK 1
#define NET_TIER_SYSCALL 2

#ifndef REQ_CAP
#define REQ_CAP 256
#endif
#ifndef RESP_CAP
#define RESP_CAP 256
#endif
#ifndef HEAD_SCAN
#define HEAD_SCAN 8192
#endif
#define HEAD_MIN 16 /* a request's first read shorter than this: its next read goes on in req */
#ifndef MAX_CONNS
#define MAX_CONNS 16384
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 16384
#endif
#ifndef NET_TIER
#define NET_TIER NET_TIER_SYSCALL
#endif
#ifndef TCP_SENDMSG_HOOK
#define TCP_SENDMSG_HOOK TCP_SENDMSG_TRACEPOINT
#endif

#ifndef GENAI
#define GENAI 1
#endif
#ifndef BODY_CAP
#define BODY_CAP 512
#endif
#ifndef TAIL_CAP
#define TAIL_CAP 512
#endif
#ifndef PEEK_CAP
#define PEEK_CAP 384
#endif
#ifndef MAX_WRITES
#define MAX_WRITES 4096
#endif
#ifndef MAX_BODIES
#define MAX_BODIES 4096
#endif
#ifndef RUNQ
#define RUNQ 1
#endif
#ifndef READ_WAITS
#define READ_WAITS 1
#endif
#ifndef OUTGOING
#define OUTGOING 1
#endif
#ifndef BINS
#define BINS 0
#endif
#ifndef MAX_BINS
#define MAX_BINS 4096
#endif
#ifndef DUR_SLOTS
#define DUR_SLOTS 1
#define DUR_SLOT(ns) 0
#endif
#ifndef SEG_SLOTS
#define SEG_SLOTS 1
#define SEG_SLOT(ns) 0
#endif
#ifndef CHUNK_CAP
#define CHUNK_CAP 4096
#endif
#ifndef STREAM_PAGES
#define STREAM_PAGES 4096
#endif
#ifndef RING_WAKE_BYTES
#define RING_WAKE_BYTES (1 << 20)
#endif
/* iovec entries of a vectored call copied a run of send_chunk: 33 runs (the
 * kernel's tail-call limit) copy 396 entries. The verifier's work grows
 * about twofold with each two more: 16 took 747k of its 1M instructions
 * and 0.29 s a load, 12 takes 224k and 0.08 s. */
#define CHUNK_IOVS 12

#define MAX_OVERFLOW 65536 /* connections the full conns table could not take, still counted */
#define SCAN_CHUNK 256     /* HEAD_SCAN is searched this many bytes at a time */
#define TP_CAP 64          /* bytes kept after "traceparent:" (the value is 55) */
#define TS_CAP 128         /* bytes kept after "tracestate:" */
#define WRITE_SCAN 4096    /* bytes of a response write to a POST whose event lines are counted */
#define HEAD_PEEKS 4       /* peeks kept of a response's first write: its head, then its first event */

/* struct conn.state */
enum conn_state {
    ST_IDLE = 0,       /* no exchange in progress */
    ST_READING = 1,    /* request bytes arriving, nothing sent yet */
    ST_RESPONDING = 2, /* response bytes leaving */
};

/* struct conn.flags */
#define CF_TUPLE 0x01     /* laddr/raddr/ports are valid */
#define CF_TCP 0x02       /* tcp_sendmsg saw this socket: it is TCP */
#define CF_CHUNK_END 0x04 /* the last send ended with the chunked terminator */
#define CF_SEEDED 0x08    /* connection existed before the agent (from /proc), no exchange yet */
#define CF_MISSED 0x10    /* the agent saw this exchange's response, not its request */
#define CF_INTERIM 0x20   /* only an interim (1xx) response has been sent so far */
#define CF_BODY 0x40      /* a POST: its payload pieces are kept in `bodies` (struct body) */
#define CF_BODY_NEXT 0x80 /* the request's next read begins where the captured bytes end */
#define CF_CLIENT 0x100   /* the process opened it (connect): it sends the requests, reads the responses */
#define CF_BY_PROCESS 0x200 /* link_key: the process's latest server exchange; the thread served none */
#define CF_STREAM 0x400   /* HTTP/2 (its preface was seen): its bytes go to `streams`, struct chunk */
#define CF_TLS 0x800      /* TLS in a process whose library is hooked: framed from its plaintext */
#define CF_TLS_PLAIN 0x1000 /* ... and the library's plaintext has come (else, after TLS_GRACE
                             * calls, the connection is another library's: ciphertext, opaque) */
#define CF_BINNED 0x2000  /* counted into `bins` when it is reported (BINS): userspace leaves its metrics */
#define CF_CLOSING 0x4000 /* CONN_BY_STATE: TCP closed it inside the process's call on it; closed after that call */
#define CF_ANSWERED 0x8000 /* a client's: a traced server answered its next call before its send was seen */
#define TLS_GRACE 16        /* reads and writes of a CF_TLS connection before its plaintext must come */

/* struct exchange_event.reason: why the exchange was reported */
enum end_reason {
    END_NEXT = 1,  /* the next request began on the connection */
    END_CLOSE = 2, /* the process closed the socket */
    END_FLUSH = 3, /* userspace: the connection went idle (not sent by BPF) */
    END_EXIT = 4,  /* userspace: the process exited (not sent by BPF) */
    END_RESPONSE = 5, /* the next response began: pipelined requests, one event each */
};

/* index into the `counters` per-CPU array; exported as agent self-metrics */
enum counter {
    C_EXCHANGES = 0,      /* exchange events submitted */
    C_LOST = 1,           /* exchange events lost: ring buffer full */
    C_CONN_OVERFLOW = 2,  /* accepted connections not tracked: conns map full */
    C_NOTICES_LOST = 3,   /* exec/exit/listen notices lost: notice ring full */
    C_INFLIGHT_LOST = 4,  /* syscalls not followed: inflight map full */
    C_UNCOUNTED = 5,      /* connections neither tracked nor counted: overflow map full too */
    C_BODIES_FULL = 6,    /* POST exchanges whose payload was not kept: bodies map full (or, never
                           * seen, keep_payload not tail-called) */
    C_WRITES_LOST = 7,    /* response write events lost: ring buffer full */
    C_CHUNKS_LOST = 8,    /* HTTP/2 connection bytes lost: streams ring full */
    C_BINNED = 9,         /* exchanges counted into `bins` */
    C_UNSENT = 10,        /* ... of which not sent: no trace chosen (`sampling`) */
    C_BINS_FULL = 11,     /* exchanges not binned, sent for userspace to count: bins map full */
    C_COUNTERS = 12,
};

struct tuple {
    __u16 family; /* AF_INET or AF_INET6 */
    __u16 lport;  /* host byte order */
    __u16 rport;
    __u8 laddr[16]; /* AF_INET: first 4 bytes */
    __u8 raddr[16];
};

/* One tracked connection, keyed by (tgid << 32 | fd). A copy of it, taken
 * when an exchange ends, is the exchange event on the `exchanges` ring. */
struct conn {
    __u32 tgid;
    __u32 fd;
    __u64 start_ns;     /* first request byte read (recv exit) */
    __u64 last_in_ns;
    __u64 first_out_ns; /* first response byte written (send entry) */
    __u64 last_out_ns;
    __u64 bytes_in;
    __u64 bytes_out;
    __u64 sk; /* struct sock *, for the tuple lookup */
    struct tuple t;
    __u8 state;
    __u8 reason; /* enum end_reason, set on the reported copy */
    __u16 flags;
    char comm[16];
    __u16 status;   /* HTTP/1.x status of the response, 0 if none began with a status line */
    __u16 pipeline; /* responses already reported since this run of reads began */
    __u16 req_len;  /* bytes captured in req */
    __u16 resp_len;
    __u32 seq; /* odd while an exchange is being updated: a reader's torn copy is detectable */
    __u8 tp_len; /* bytes in tp: the request head had a "traceparent:" line past req */
    __u8 ts_len; /* ... and "tracestate:" */
    __u8 peer_ended; /* the peer ended its side while this exchange was under way, before the
                      * process closed (net.c: peer_ended_on). A server's answer cut off after
                      * that is its client's doing (a stop button), not the server's */
    __u64 send_ns;      /* time spent inside the response's send calls */
    __u64 runq_start;   /* the serving thread's run-queue wait (RUNQ) when the exchange began */
    __u64 runq_ns;      /* ... and how much it grew by its last write of the response */
    __u32 runq_tid;     /* that thread: the one that read the request */
    __u64 rwait_start;  /* the same thread's time in other reads (READ_WAITS) then ... */
    __u64 rwait_ns;     /* ... and its growth by the last write */
    __u64 cwait_start;  /* of those reads, the ones of a Redis (RESP) reply: a cache look-up */
    __u64 cwait_ns;
    /* What this exchange belongs to, as far as the kernel can tell (0: nothing).
     * A client exchange: the server exchange (conn key, start_ns) its thread was
     * serving when it began. A server exchange: the traced client connection at
     * the other end of this one (its conn key; link_start 0). */
    __u64 link_key;
    __u64 link_start;
    __u32 calls; /* exchanges linked to this one so far: its outgoing calls, or a traced callee's */
    __u32 tls_calls; /* CF_TLS without CF_TLS_PLAIN yet: its ciphertext reads and writes so far */
    __u64 answered_ns; /* CF_ANSWERED: when the server that answered the next call began reading it */
    __u64 shape;  /* a hash of the request's method and path (0: none), set when the response
                   * begins; userspace tells the kernel which it knows the route of (`shapes`) */
    __u8 req[REQ_CAP];
    __u8 resp[RESP_CAP];
    __u8 tp[TP_CAP]; /* what followed the header name, up to the line end or TP_CAP */
    __u8 ts[TS_CAP];
};

/* What the kernel keeps of a POST exchange's payload, for userspace to read
 * its GenAI meaning (sitsprobe/stitch/genai.py): in the `bodies` map beside
 * the conn, and appended to the conn in its exchange event. Bounded, never
 * exported raw. The tails are rings of TAIL_CAP bytes: byte i of the stream
 * is at i % TAIL_CAP; the second half is room the verifier asks for. */
struct body {
    __u64 start_ns;      /* the exchange it belongs to (conn.start_ns) */
    __u32 req_tail_pos;  /* request bytes appended to req_tail */
    __u32 resp_tail_pos; /* response bytes appended to resp_tail */
    __u32 writes;        /* response writes (beats sent for the first MAX_WRITES) */
    __u16 body_len;      /* bytes in body */
    __u8 body[BODY_CAP]; /* the first bytes after the request head's blank line */
    __u8 req_tail[2 * TAIL_CAP];
    __u8 resp_tail[2 * TAIL_CAP];
};

/* One response write of a POST exchange (its first MAX_WRITES): when, how
 * big, and its first bytes; of a client's call, one read of its answer. On
 * the exchanges ring, before its exchange. */
struct beat {
    __u32 tgid;
    __u32 fd;
    __u64 start_ns; /* the exchange's conn.start_ns */
    __u64 ts_ns;    /* the send began (a client's read: returned) */
    __u32 size;     /* bytes it sent (read) */
    __u16 pipeline;
    __u16 peek_len;
    __u32 data_lines; /* in the first `scanned` bytes of a write longer than its peek: lines */
    __u32 json_lines; /* that begin "data:" (SSE events) and lines that end "}" (NDJSON), */
    __u32 scanned;
    __u32 delta_lines; /* and typed events that carry output: `.delta"` ends the type of a */
                       /* Responses API delta, `k_delta"` that of Anthropic's content_block_delta; */
    __u32 output_lines; /* and output begun: an output key's non-empty string (`"content":"x`, */
    __u32 special_lines; /* write_scan.h); `"special":true`, a token that is no output (TGI's) */
    __u32 peek_at;  /* where in its write the peek begins: 0, or, for the more of a response's */
                    /* first write (HEAD_PEEKS), a multiple of PEEK_CAP; counts and size are the 0's */
    __u8 peek[PEEK_CAP];
};

/* The exchanges ring carries three records, told apart by their size. */
struct conn_body {
    struct conn c;
    struct body b;
};
_Static_assert(sizeof(struct beat) != sizeof(struct conn),
               "capture.genai.write_peek_bytes makes a write event as big as an exchange: change it by 8");

/* How a syscall passes its buffer: the low bits of struct args.kind. Userspace
 * writes these too, for reads that began before the agent (NetProbe.adopt_reads). */
enum call_kind { K_FLAT = 1, K_IOV = 2, K_MSG = 3, K_NOCOPY = 4, K_ACCEPT = 5, K_CONNECT = 6 };
#define SEND 0x100      /* or-ed into args.kind: the call writes */
#define UNTRACKED 0x200 /* or-ed into args.kind: a send on a connection in `overflow` */
#define OTHER_READ 0x400 /* or-ed into args.kind: a read of anything but a tracked connection */

/* A syscall's arguments from its enter half, for its exit: the `inflight` map,
 * keyed by pid_tgid. */
struct args {
    __u64 ptr; /* buffer, iovec array, msghdr or sockaddr, by kind */
    __u64 enter_ns;
    __u32 fd;
    __u32 kind;
};

/* The bytes of one read or write (or the close) of an HTTP/2 connection
 * (CF_STREAM), on the `streams` ring: userspace frames them
 * (sitsprobe/stitch/protocols/http2.py). The first `len` of `size` bytes
 * are copied; the ring record ends there. The second half of data is
 * room the verifier asks for. */
enum chunk_dir { CH_IN = 1, CH_OUT = 2, CH_CLOSE = 3 };
struct chunk_head {
    __u32 tgid;
    __u32 fd;
    __u64 ts_ns; /* a read's return, a write's start */
    __u32 size;  /* bytes the call moved */
    __u16 len;   /* of those, copied into data */
    __u16 flags; /* the conn's: CF_CLIENT, CF_TUPLE */
    __u8 dir;    /* enum chunk_dir: in = the process read them */
    __u8 peer_ended; /* as struct conn's: the peer ended its side before the process closed */
    struct tuple t;
    __u64 link_key;   /* as struct conn.link_key, for the streams this chunk begins: a client's */
    __u64 link_start; /* write, the server exchange its thread serves; a server's read, the */
};                    /* traced client connection at the other end */
struct chunk {
    struct chunk_head h;
    __u8 data[2 * CHUNK_CAP];
};

/* A TLS library call in progress (`ssl_calls`, by pid_tgid), and what an
 * SSL * was found to be (`ssl_conns`). */
#define SSL_WRITE 0x1 /* struct ssl_call.flags: SSL_write(_ex) */
#define SSL_EX 0x2    /* ... the _ex form: 1 or 0, the count through its fourth argument */
struct ssl_call {
    __u64 ssl;
    __u64 buf;
    __u64 done; /* size_t *: the _ex forms' count */
    __u64 enter_ns;
    __u32 flags;
};
struct ssl_conn {
    __u64 key; /* its conn */
    __u64 sk;  /* that conn's socket then: a new connection on the same fd is another */
};

/* The server exchange a thread is serving: the `serving` map, by thread id. */
struct serving {
    __u64 key;      /* its conn key */
    __u64 start_ns; /* its conn.start_ns */
};

/* N_LISTEN: a process began listening on a selected port (`ports`): the
 * kernel tracks it at once, so its first connection is followed */
enum notice_kind { N_EXEC = 1, N_EXIT = 2, N_LISTEN = 3 };

/* Process lifecycle: lets userspace select new processes and retire dead ones. */
struct notice { /* bcc's ring-event decoder knows u32, not __u32 */
    u32 kind;
    u32 tgid;
    char comm[16];
};

/* Exact in-kernel response count by process and HTTP status, tracked
 * connections or not (untracked ones are also counted per process alone). */
struct status_key {
    __u32 tgid;
    __u32 status;
};

/* The latency segments (sitsprobe/stitch/segments.py), in its order. */
enum segment { SEG_NETWORK = 0, SEG_SCHEDULING = 1, SEG_COMPUTE = 2, SEG_IO = 3, SEG_CACHE = 4,
               SEG_COUNT = 5 };

/* One series of exchanges binned in the kernel (BINS): the `bins` map. */
struct bin_key {
    __u64 shape; /* conn.shape: method and path */
    __u32 tgid;
    __u32 status;
};
struct bin {
    __u64 count;
    __u64 sum_ns; /* first byte in to last byte out */
    __u64 bytes_in;
    __u64 bytes_out;
    __u64 dur[DUR_SLOTS];
    __u64 seg_sum_ns[SEG_COUNT];
    __u64 seg[SEG_COUNT * SEG_SLOTS]; /* segment i's buckets from i * SEG_SLOTS (flat: bcc's
                                       * layouts of two-dimensional arrays are wrong) */
};

/* Which binned exchanges still cross the ring: `sampling`[0], set by userspace.
 * Always an error (5xx), one with trace context or linked to another, and one
 * slower than slow_ns; of the rest, `rate` a second (a token bucket). */
struct sampling {
    __u64 all;     /* 1: every one (no trace budget) */
    __u64 rate;    /* a second */
    __u64 slow_ns; /* 0: none is slow */
    __u64 tokens;  /* the bucket, in 1e-9 tokens */
    __u64 last_ns;
};

/* ---- cuda: begin ---- */
/* CUDA runtime and driver API uprobes (bpf/cuda.c), counted in the kernel per
 * (tgid, function, copy direction); userspace reads the map at scrape time.
 *   MAX_CUDA_KEYS     (tgid, function, direction) rows kept
 *   MAX_CUDA_ALLOCS   live cudaMalloc'd pointers remembered, to size cudaFree
 */
#ifndef MAX_CUDA_KEYS
#define MAX_CUDA_KEYS 16384
#endif
#ifndef MAX_CUDA_ALLOCS
#define MAX_CUDA_ALLOCS 65536
#endif

/* struct cuda_key.fn; names in sitsprobe/abi.py CUDA_FN_NAMES, same order */
enum cuda_fn {
    CUDA_LAUNCH_KERNEL = 0,     /* cudaLaunchKernel, cudaLaunchKernel_ptsz */
    CUDA_MEMCPY = 1,            /* cudaMemcpy: bytes, direction, time blocked */
    CUDA_MEMCPY_ASYNC = 2,      /* cudaMemcpyAsync(_ptsz): bytes, direction */
    CUDA_STREAM_SYNC = 3,       /* cudaStreamSynchronize(_ptsz): time blocked */
    CUDA_DEVICE_SYNC = 4,       /* cudaDeviceSynchronize: time blocked */
    CUDA_MALLOC = 5,            /* cudaMalloc: bytes allocated (on success) */
    CUDA_FREE = 6,              /* cudaFree: bytes freed (of pointers seen allocated) */
    CUDA_GRAPH_LAUNCH = 7,      /* cudaGraphLaunch(_ptsz) */
    CUDA_CU_LAUNCH_KERNEL = 8,  /* libcuda cuLaunchKernel(_ptsz) */
    CUDA_CU_LAUNCH_KERNEL_EX = 9, /* libcuda cuLaunchKernelEx(_ptsz) */
    CUDA_FUNCTIONS = 10,
};

/* index into the `cuda_counters` per-CPU array: what the probes could not count */
enum cuda_counter {
    CUDA_C_STATS_FULL = 0,    /* calls not counted: cuda_stats map full */
    CUDA_C_INFLIGHT_LOST = 1, /* return not timed: cuda_inflight map full */
    CUDA_C_ALLOCS_FULL = 2,   /* allocation not remembered: cuda_allocs map full */
    CUDA_C_WAITS_LOST = 3,    /* copy/sync waits not sent: cuda_waits ring full */
    CUDA_C_COUNTERS = 4,
};

struct cuda_key {
    __u32 tgid;
    __u16 fn;   /* enum cuda_fn */
    __u16 kind; /* cudaMemcpyKind for copies (0 host-to-host .. 4 default), else 0 */
};

struct cuda_stat {
    __u64 calls;  /* entries */
    __u64 errors; /* returns with a cudaError_t/CUresult other than 0 (timed functions) */
    __u64 bytes;  /* copies: bytes asked; cudaMalloc: bytes allocated; cudaFree: bytes freed */
    __u64 ns;     /* time inside the call (timed functions) */
};

/* One wait on the device: a cudaMemcpy or a synchronisation, start to
 * return, on the `cuda_waits` ring; userspace counts it in the I/O segment
 * of the requests the process had open meanwhile. */
#define CUDA_WAIT_PAGES 64
struct cuda_wait {
    u32 tgid; /* bcc's ring-event decoder knows u32, not __u32 */
    u32 fn;   /* enum cuda_fn */
    u64 start_ns;
    u64 end_ns;
};
/* ---- cuda: end ---- */

/* ---- cache: begin ---- */
/* Cache-get probes (bpf/cache.c): a uprobe and a uretprobe on a look-up
 * function time each call, read its key and tell hit from miss. Counts and
 * log2 latency histograms are kept here in the kernel, exact even when the
 * look-up ring is full. Load-time settings (-D, see sitsprobe/probes/cache.py):
 *   CACHE_KEY_CAP      key bytes copied per look-up (power of two, 16..256)
 *   CACHE_RING_PAGES   look-up ring buffer size in pages (power of two)
 *   CACHE_MAX_PEERS    client connections remembered, (tgid, fd) -> peer
 *   CACHE_WAKE_BYTES   bytes one CPU writes to the ring between two wakeups of the
 *                      reader (power of two; ring_wake.h): it drains the ring on its
 *                      own tick, so a look-up is not paying for a wake-up each
 */
#ifndef CACHE_KEY_CAP
#define CACHE_KEY_CAP 64
#endif
#ifndef CACHE_RING_PAGES
#define CACHE_RING_PAGES 256
#endif
#ifndef CACHE_MAX_PEERS
#define CACHE_MAX_PEERS 65536
#endif
#ifndef CACHE_WAKE_BYTES
#define CACHE_WAKE_BYTES (1 << 18)
#endif
#define CACHE_SLOTS 8      /* cache probes one program serves: cache_enter_0..7 */
#define CACHE_LAT_SLOTS 65 /* bpf_log2l(ns): slot s holds [2^(s-1), 2^s) ns */

/* struct cache_cfg.key_kind: how the key argument is read */
enum cache_key_kind {
    CK_CSTR = 1,       /* NUL-terminated string */
    CK_PTR_LEN = 2,    /* pointer argument, length in another argument */
    CK_REDIS_ROBJ = 3, /* Redis robj *: ->ptr (offset 8) is an sds string */
};

/* struct cache_cfg.hit_op: hit when (value OP hit_value), compared signed */
enum cache_hit_op { HO_NE = 0, HO_EQ = 1, HO_GT = 2, HO_GE = 3, HO_LT = 4, HO_LE = 5 };

/* index (slot * CC_COUNTERS + counter) into the `cache_counts` per-CPU array */
enum cache_counter {
    CC_HITS = 0,
    CC_MISSES = 1,
    CC_FILTERED = 2,      /* calls the filter left out (Redis: write look-ups) */
    CC_LOST = 3,          /* look-up events lost: ring buffer full */
    CC_INFLIGHT_LOST = 4, /* calls not timed: in-flight table full */
    CC_DURATION_NS = 5,   /* sum of look-up durations, for the histogram's _sum */
    CC_COUNTERS = 6,
};

/* One cache probe's settings, written by userspace into `cache_cfgs[slot]`. */
struct cache_cfg {
    u8 key_kind;  /* enum cache_key_kind */
    u8 key_arg;   /* argument index 0..5 holding the key */
    u8 len_arg;   /* CK_PTR_LEN: argument index holding the length */
    u8 hit_src;   /* 0: the return value; 1 + N: argument N (taken at entry) */
    u8 hit_deref; /* 0, or 1/2/4/8: read that many bytes where the value points, at return */
    u8 hit_op;    /* enum cache_hit_op */
    u8 filter_on; /* 1: count the call only if (arg[filter_arg] & mask) == equals */
    u8 filter_arg;
    s64 hit_value;
    u64 filter_mask;
    u64 filter_equals;
};

/* The client a connection came from, keyed by (tgid << 32 | fd). */
struct cache_peer {
    u16 family; /* AF_INET, AF_INET6, AF_UNIX; 0 unknown */
    u16 port;   /* host byte order */
    u8 addr[16];
};

/* struct cache_event.flags */
#define CE_TRUNCATED 0x01 /* the key is longer than the bytes captured */
#define CE_PEER 0x02      /* the thread's last socket read names a client */

/* One look-up, on the `cache_events` ring (u-types: bcc's ring decoder). */
struct cache_event {
    u64 ts_ns;       /* entry, CLOCK_MONOTONIC */
    u64 duration_ns; /* entry to return */
    u32 tgid;
    u32 tid;
    s32 fd;          /* client socket the thread last read, -1 none */
    u32 key_size;    /* the key's full length where known */
    u16 slot;        /* which cache probe (cache_cfgs index) */
    u16 key_len;     /* bytes captured in key */
    u8 hit;
    u8 flags;        /* CE_* */
    u16 family;      /* the client's, from struct cache_peer */
    u16 port;
    u8 addr[16];
    u8 key[CACHE_KEY_CAP];
};
/* ---- cache: end ---- */

/* ---- markers: begin ---- */
/* Engine markers (bpf/markers.c): one event per call of libsitsprobe_markers.
 * Load-time settings (-D, see sitsprobe/probes/markers.py):
 *   MARKER_RING_PAGES   marker ring buffer size in pages (power of two)
 *   MARKER_MAX_IDS      request ids sent per batch call (a multiple of MARKER_IDS)
 *   MARKER_WAKE_BYTES   bytes one CPU writes to the ring between two wakeups of the
 *                       agent (power of two; ring_wake.h)
 */
#ifndef MARKER_RING_PAGES
#define MARKER_RING_PAGES 1024
#endif
#ifndef MARKER_MAX_IDS
#define MARKER_MAX_IDS 256
#endif
#ifndef MARKER_WAKE_BYTES
#define MARKER_WAKE_BYTES (1 << 19)
#endif
#define MARKER_NAME 32 /* stage, cache or model name, NUL included */
#define MARKER_KEY 64  /* cache key bytes copied (a power of two) */
#define MARKER_IDS 16  /* request ids per batch event (a power of two) */

/* struct marker_event.kind: which call of the marker library */
enum marker_kind {
    MK_REQUEST_BEGIN = 1,
    MK_REQUEST_END = 2,
    MK_RANGE = 3, /* a range_end, joined in the kernel to its range_begin (begin_ts) */
    MK_BATCH = 4,
    MK_CACHE_GET = 5,
    MK_USAGE = 6,
};

/* index into the `marker_counters` per-CPU array of bpf/markers.c */
enum marker_counter {
    MC_EVENTS = 0,      /* marker events submitted */
    MC_LOST = 1,        /* marker events lost: ring buffer full */
    MC_IDS_DROPPED = 2, /* batch request ids past MARKER_MAX_IDS, not sent */
    MC_KEYS_CUT = 3,    /* cache keys longer than MARKER_KEY, sent cut short */
    MC_RANGES_UNMATCHED = 4, /* range ends whose begin the kernel did not keep, not sent */
    MC_COUNTERS = 5,
};

/* One marker call. A batch call of n request ids is sent as ceil(n / MARKER_IDS)
 * events with the same ts, each holding ids[first .. first + n_ids) of the call.
 * bcc's ring-event decoder knows u32, not __u32. */
struct marker_event {
    u64 ts;
    u32 tgid;
    u32 tid;
    u32 kind;          /* enum marker_kind */
    s32 fd;            /* request_begin: the request's socket; else -1 */
    u64 request_id;
    u64 batch_id;
    u64 input_tokens;  /* usage */
    u64 output_tokens;
    u64 kv_bytes;
    u64 begin_ts;      /* range: when its range_begin was called (ts: its end) */
    u32 hit;           /* cache_get: 1 hit, 0 miss */
    u32 key_len;       /* cache_get: bytes in key (longer keys are cut, and counted) */
    u32 n_total;       /* batch: request ids in the call */
    u32 first;         /* batch: index in the call of ids[0] */
    u32 n_ids;         /* batch: ids valid in this event */
    u32 pad;
    u64 ids[MARKER_IDS];
    char name[MARKER_NAME]; /* model, stage or cache name */
    u8 key[MARKER_KEY];
};
/* ---- markers: end ---- */

#endif /* SITSPROBE_H */
