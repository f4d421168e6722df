/* Network probes: turn the socket syscalls of tracked processes into one
 * compact event per request/response exchange, matched here in the kernel.
 *
 * A connection enters the `conns` map when a tracked process accepts it (or
 * when userspace seeds it from /proc). Reads and writes on it drive a small
 * state machine: the first read after a response starts a new exchange (and
 * reports the previous one); the first write after reads starts the
 * response. Only the first REQ_CAP / RESP_CAP bytes are copied, once each.
 * Every loss (ring full, map full) is counted in `counters`.
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <linux/socket.h>
#include <linux/in.h>
#include <linux/in6.h>
#include "sitsprobe.h"

#define AF_INET_ 2
#define AF_INET6_ 10

/* How a call passes its buffer: the low bits of args.kind. */
enum call_kind { K_FLAT = 1, K_IOV = 2, K_MSG = 3, K_NOCOPY = 4, K_ACCEPT = 5 };
#define SEND 0x100 /* or-ed into args.kind: the call writes */

struct args {
    __u64 ptr; /* buffer, iovec array, msghdr or sockaddr, by kind */
    __u64 enter_ns;
    __u32 fd;
    __u32 kind;
};

struct uiovec {
    __u64 base;
    __u64 len;
};

BPF_HASH(tracked, __u32, __u8, 4096);
BPF_HASH(conns, __u64, struct conn, MAX_CONNS);
BPF_HASH(inflight, __u64, struct args, 16384);
BPF_TABLE("lru_hash", __u64, struct tuple, socks, 65536);
BPF_PERCPU_ARRAY(counters, __u64, C_COUNTERS);
BPF_PERCPU_HASH(http_status, struct status_key, __u64, 65536);
BPF_PERCPU_ARRAY(zero_conn, struct conn, 1);
BPF_RINGBUF_OUTPUT(exchanges, RINGBUF_PAGES);
BPF_RINGBUF_OUTPUT(notices, 64);

static __always_inline void count(int idx)
{
    __u64 *v = counters.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline __u64 conn_key(__u32 tgid, __u32 fd)
{
    return ((__u64)tgid << 32) | fd;
}

static __always_inline int is_tracked(__u32 tgid)
{
    return tracked.lookup(&tgid) != NULL;
}

/* Enter half of every data syscall: remember the arguments for the exit. */
static __always_inline int enter(__u32 fd, const void *ptr, __u32 kind)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (!is_tracked(tgid))
        return 0;
    if (kind != K_ACCEPT) {
        __u64 key = conn_key(tgid, fd);
        if (!conns.lookup(&key))
            return 0;
    }
    struct args a = {.ptr = (__u64)ptr, .enter_ns = bpf_ktime_get_ns(), .fd = fd, .kind = kind};
    if (inflight.update(&id, &a))
        count(C_INFLIGHT_LOST);
    return 0;
}

/* The first user buffer of a call and its length (iov[0] for vectored calls). */
static __always_inline __u64 first_buffer(struct args *a, __u64 *len)
{
    struct uiovec iov = {};
    __u64 iovp = a->ptr;
    __u32 kind = a->kind & ~SEND;
    if (kind == K_FLAT) {
        *len = (__u64)-1;
        return a->ptr;
    }
    if (kind == K_MSG) /* struct user_msghdr: msg_iov at offset 16 */
        bpf_probe_read_user(&iovp, sizeof(iovp), (void *)(a->ptr + 16));
    if (kind != K_IOV && kind != K_MSG)
        return 0;
    bpf_probe_read_user(&iov, sizeof(iov), (void *)iovp);
    *len = iov.len;
    return iov.base;
}

/* Submit a copy of the connection's finished exchange. */
static __always_inline void report(struct conn *c, __u8 reason)
{
    struct conn *e = exchanges.ringbuf_reserve(sizeof(struct conn));
    if (!e) {
        count(C_LOST);
        return;
    }
    bpf_probe_read_kernel(e, sizeof(struct conn), c);
    e->reason = reason;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    exchanges.ringbuf_submit(e, BPF_RB_NO_WAKEUP); /* drained on the agent's tick */
    count(C_EXCHANGES);
}

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

static __always_inline void on_recv(struct conn *c, struct args *a, __u32 tgid, long ret, __u64 now)
{
    if (c->state == ST_RESPONDING) {
        report(c, END_NEXT);
        c->state = ST_IDLE;
    }
    if (c->state == ST_IDLE) {
        __u64 len = 0, buf = first_buffer(a, &len);
        __u64 n = ret < len ? ret : len;
        if (n > REQ_CAP)
            n = REQ_CAP;
        c->start_ns = now;
        c->first_out_ns = c->last_out_ns = 0;
        c->bytes_in = c->bytes_out = 0;
        c->n_responses = 0;
        c->resp_len = 0;
        c->flags &= ~CF_CHUNK_END;
        c->req_len = 0;
        if (buf && n > 0 && bpf_probe_read_user(c->req, n, (void *)buf) == 0)
            c->req_len = n;
        c->state = ST_READING;
    }
    c->bytes_in += ret;
    c->last_in_ns = now;
}

static __always_inline void on_send(struct conn *c, struct args *a, __u32 tgid, long ret)
{
    __u8 head[12] = {};
    __u64 len = 0, buf = first_buffer(a, &len);
    if (buf && len >= sizeof(head) && ret >= sizeof(head))
        bpf_probe_read_user(head, sizeof(head), (void *)buf);
    if (c->state != ST_RESPONDING) {
        if (c->state == ST_IDLE) /* the server spoke first: no request */
            c->start_ns = a->enter_ns;
        __u64 n = ret < len ? ret : len;
        if (n > RESP_CAP)
            n = RESP_CAP;
        c->resp_len = 0;
        if (buf && n > 0 && bpf_probe_read_user(c->resp, n, (void *)buf) == 0)
            c->resp_len = n;
        c->first_out_ns = a->enter_ns;
        c->state = ST_RESPONDING;
    }
    __u16 status = status_of(head);
    if (status) {
        if (c->n_responses < MAX_PIPELINE)
            c->statuses[c->n_responses & (MAX_PIPELINE - 1)] = status;
        c->n_responses++;
        count_status(tgid, status);
    }
    /* chunked terminator "0\r\n\r\n" at the end of a flat write */
    __u8 tail[5] = {};
    if (a->kind == (K_FLAT | SEND) && ret >= 5 &&
        bpf_probe_read_user(tail, sizeof(tail), (void *)(buf + ret - 5)) == 0 &&
        tail[0] == '0' && tail[1] == '\r' && tail[2] == '\n' && tail[3] == '\r' && tail[4] == '\n')
        c->flags |= CF_CHUNK_END;
    else
        c->flags &= ~CF_CHUNK_END;
    c->bytes_out += ret;
    c->last_out_ns = a->enter_ns;
}

static __always_inline void on_accept(struct args *a, __u32 tgid, long fd)
{
    __u64 key = conn_key(tgid, fd);
    int zero = 0;
    struct conn *c = zero_conn.lookup(&zero); /* a zeroed conn, too big for the stack */
    if (!c)
        return;
    if (conns.update(&key, c)) {
        count(C_CONN_OVERFLOW);
        return;
    }
    c = conns.lookup(&key);
    if (!c)
        return;
    c->tgid = tgid;
    c->fd = fd;
    bpf_get_current_comm(&c->comm, sizeof(c->comm));
    if (!a->ptr)
        return;
    __u16 family = 0;
    bpf_probe_read_user(&family, sizeof(family), (void *)a->ptr);
    c->t.family = family;
    if (family == AF_INET_) {
        bpf_probe_read_user(&c->t.rport, 2, (void *)(a->ptr + 2));
        bpf_probe_read_user(c->t.raddr, 4, (void *)(a->ptr + 4));
    } else if (family == AF_INET6_) {
        bpf_probe_read_user(&c->t.rport, 2, (void *)(a->ptr + 2));
        bpf_probe_read_user(c->t.raddr, 16, (void *)(a->ptr + 8));
    }
    c->t.rport = ntohs(c->t.rport);
}

/* Exit half: the syscall's result decides what happened. */
static __always_inline int leave(long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct args *a = inflight.lookup(&id);
    if (!a)
        return 0;
    if (ret <= 0)
        goto out;
    if (a->kind == K_ACCEPT) {
        on_accept(a, tgid, ret);
        goto out;
    }
    __u64 key = conn_key(tgid, a->fd);
    struct conn *c = conns.lookup(&key);
    if (!c)
        goto out;
    /* Userspace reads this entry while we write it (the idle flush): the
     * count is odd during the update, and moves on every update. */
    __sync_fetch_and_add(&c->seq, 1);
    if (a->kind & SEND)
        on_send(c, a, tgid, ret);
    else
        on_recv(c, a, tgid, ret, bpf_ktime_get_ns());
    __sync_fetch_and_add(&c->seq, 1);
out:
    inflight.delete(&id);
    return 0;
}

/* Field names differ between syscalls; each pair names its own. */
TRACEPOINT_PROBE(syscalls, sys_enter_read) { return enter(args->fd, args->buf, K_FLAT); }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return enter(args->fd, args->ubuf, K_FLAT); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { return enter(args->fd, args->vec, K_IOV); }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { return enter(args->fd, args->msg, K_MSG); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return enter(args->fd, args->buf, K_FLAT | SEND); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return enter(args->fd, args->buff, K_FLAT | SEND); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { return enter(args->fd, args->vec, K_IOV | SEND); }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return enter(args->fd, args->msg, K_MSG | SEND); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) { return enter(args->out_fd, 0, K_NOCOPY | SEND); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { return leave(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_accept) { return enter(args->fd, args->upeer_sockaddr, K_ACCEPT); }
/* An accept that was already blocked when the process became tracked has no
 * entry half to remember; take its connection anyway (peer from the tuple). */
static __always_inline int leave_accept(long ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct args none = {.kind = K_ACCEPT};
    if (ret < 0 || inflight.lookup(&id) || !is_tracked(id >> 32))
        return leave(ret);
    on_accept(&none, id >> 32, ret);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return leave_accept(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { return enter(args->fd, args->upeer_sockaddr, K_ACCEPT); }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return leave_accept(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_tracked(tgid))
        return 0;
    __u64 key = conn_key(tgid, args->fd);
    struct conn *c = conns.lookup(&key);
    if (!c)
        return 0;
    if (c->state != ST_IDLE)
        report(c, END_CLOSE);
    conns.delete(&key);
    return 0;
}

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

static __always_inline void learn_sock(__u64 sk)
{
    struct conn *c = current_conn();
    if (!c || c->sk == sk)
        return;
    c->sk = sk;
    struct tuple *t = socks.lookup(&sk);
    if (t) {
        c->t = *t;
        c->flags |= CF_TUPLE;
    }
}

TRACEPOINT_PROBE(sock, sock_recv_length) { learn_sock((__u64)args->sk); return 0; }
TRACEPOINT_PROBE(sock, sock_send_length) { learn_sock((__u64)args->sk); return 0; }

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    __u64 sk = (__u64)args->skaddr;
    if (args->protocol != IPPROTO_TCP)
        return 0;
    if (args->newstate == BPF_TCP_CLOSE) {
        socks.delete(&sk);
        return 0;
    }
    if (args->newstate != BPF_TCP_ESTABLISHED)
        return 0;
    struct tuple t = {.family = args->family, .lport = args->sport, .rport = args->dport};
    if (args->family == AF_INET_) {
        __builtin_memcpy(t.laddr, args->saddr, 4);
        __builtin_memcpy(t.raddr, args->daddr, 4);
    } else {
        __builtin_memcpy(t.laddr, args->saddr_v6, 16);
        __builtin_memcpy(t.raddr, args->daddr_v6, 16);
    }
    socks.update(&sk, &t);
    return 0;
}

/* tcp_sendmsg: marks the connection as TCP, through the best hook this kernel has. */
#if TCP_SENDMSG_HOOK == 1
KFUNC_PROBE(tcp_sendmsg, struct sock *sk)
{
    struct conn *c = current_conn();
    if (c)
        c->flags |= CF_TCP;
    return 0;
}
#elif TCP_SENDMSG_HOOK == 2
int kprobe__tcp_sendmsg(struct pt_regs *ctx, struct sock *sk)
{
    struct conn *c = current_conn();
    if (c)
        c->flags |= CF_TCP;
    return 0;
}
#else
TRACEPOINT_PROBE(tcp, tcp_sendmsg_locked)
{
    struct conn *c = current_conn();
    if (c)
        c->flags |= CF_TCP;
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
