/* The kernel/userspace contract of sitsprobe: every struct that crosses the
 * boundary, every counter index, every constant. Userspace never mirrors these
 * by hand: bcc derives the ctypes layouts from this file.
 *
 * Load-time settings arrive as -D flags (see sitsprobe/probes/net.py):
 *   REQ_CAP, RESP_CAP    bytes of each request / response head captured
 *   MAX_CONNS            connections tracked at once
 *   RINGBUF_PAGES        exchange ring buffer size in pages (power of two)
 *   TCP_SENDMSG_HOOK     1 fentry, 2 kprobe, 3 tracepoint tcp:tcp_sendmsg_locked
 */
#ifndef SITSPROBE_H
#define SITSPROBE_H

#ifndef REQ_CAP
#define REQ_CAP 256
#endif
#ifndef RESP_CAP
#define RESP_CAP 64
#endif
#ifndef MAX_CONNS
#define MAX_CONNS 16384
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 16384
#endif
#ifndef TCP_SENDMSG_HOOK
#define TCP_SENDMSG_HOOK 3
#endif

#define MAX_PIPELINE 4 /* response statuses kept per exchange */

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
#define CF_SEEDED 0x08    /* connection existed before the agent (from /proc) */

/* struct exchange_event.reason: why the exchange was reported */
enum end_reason {
    END_NEXT = 1,  /* the next request began on the connection */
    END_CLOSE = 2, /* the process closed the socket */
    END_FLUSH = 3, /* userspace: the connection went idle (not sent by BPF) */
    END_EXIT = 4,  /* userspace: the process exited (not sent by BPF) */
};

/* index into the `counters` per-CPU array; exported as agent self-metrics */
enum counter {
    C_EXCHANGES = 0,      /* exchange events submitted */
    C_LOST = 1,           /* exchange events lost: ring buffer full */
    C_CONN_OVERFLOW = 2,  /* accepted connections not tracked: conns map full */
    C_NOTICES_LOST = 3,   /* exec/exit notices lost: notice ring full */
    C_INFLIGHT_LOST = 4,  /* syscalls not followed: inflight map full */
    C_COUNTERS = 5,
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
    __u8 flags;
    __u8 reason; /* enum end_reason, set on the reported copy */
    char comm[16];
    __u16 n_responses; /* sends that began with "HTTP/1." in this exchange */
    __u16 statuses[MAX_PIPELINE];
    __u16 req_len;     /* bytes captured in req */
    __u16 resp_len;
    __u8 req[REQ_CAP];
    __u8 resp[RESP_CAP];
};

enum notice_kind { N_EXEC = 1, N_EXIT = 2 };

/* Process lifecycle: lets userspace select new processes and retire dead ones. */
struct notice { /* bcc's ring-event decoder knows u32, not __u32 */
    u32 kind;
    u32 tgid;
    char comm[16];
};

/* Exact in-kernel request count by process and HTTP status. */
struct status_key {
    __u32 tgid;
    __u32 status;
};

#endif /* SITSPROBE_H */
