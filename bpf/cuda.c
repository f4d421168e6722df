/* CUDA probes: uprobes on the CUDA runtime (libcudart.so*) and driver
 * (libcuda.so*) API entry points of tracked processes, counted here in the
 * kernel per (tgid, function, copy direction): userspace reads `cuda_stats`
 * when it is scraped. Only the waits on the device (blocking copies and
 * synchronisations: a few per step, not per kernel launch) cross a ring,
 * one small record each, for the requests' I/O time.
 *
 * Each probe is attached once per library file (for every process mapping
 * it) and filters on `cuda_pids`. Functions that block or allocate also get
 * a return probe: it times the call, counts failures, and learns the pointer
 * cudaMalloc wrote so that cudaFree can be sized.
 */
#include <uapi/linux/ptrace.h>
#include "sitsprobe.h"
#include "user_read.h"

struct cuda_call { /* a call in progress on one thread */
    __u64 id;      /* pid_tgid */
    __u32 fn;
    __u32 pad;
};

struct cuda_entry {
    __u64 ts;
    __u64 arg;  /* cudaMalloc: the devPtr out-parameter; cudaFree: the pointer */
    __u64 size; /* cudaMalloc: bytes asked */
    __u32 kind; /* the cuda_key.kind the entry counted under */
    __u32 pad;
};

struct cuda_alloc {
    __u32 tgid;
    __u32 pad;
    __u64 ptr;
};

BPF_HASH(cuda_pids, __u32, __u8, 4096);
/* its entries made as keys come, not all at the start: preallocated, each of
 * MAX_CUDA_KEYS would take its 32 bytes once per possible CPU (100 MB on a
 * node of 192) */
BPF_F_TABLE("percpu_hash", struct cuda_key, struct cuda_stat, cuda_stats, MAX_CUDA_KEYS, BPF_F_NO_PREALLOC);
BPF_HASH(cuda_inflight, struct cuda_call, struct cuda_entry, 16384);
BPF_HASH(cuda_allocs, struct cuda_alloc, __u64, MAX_CUDA_ALLOCS);
BPF_PERCPU_ARRAY(cuda_counters, __u64, CUDA_C_COUNTERS);
BPF_RINGBUF_OUTPUT(cuda_waits, CUDA_WAIT_PAGES);

static __always_inline void lost(int idx)
{
    __u64 *v = cuda_counters.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline struct cuda_stat *stat_of(__u32 tgid, __u16 fn, __u16 kind)
{
    struct cuda_key k = {.tgid = tgid, .fn = fn, .kind = kind};
    struct cuda_stat *s = cuda_stats.lookup(&k);
    if (s)
        return s;
    struct cuda_stat zero = {};
    cuda_stats.insert(&k, &zero);
    s = cuda_stats.lookup(&k);
    if (!s)
        lost(CUDA_C_STATS_FULL);
    return s;
}

/* The calling process, or 0 when it is not tracked. */
static __always_inline __u32 tracked_tgid(void)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    return cuda_pids.lookup(&tgid) ? tgid : 0;
}

/* Count one call of a tracked process; its tgid, or 0 when untracked. */
static __always_inline __u32 counted(__u16 fn, __u16 kind, __u64 bytes)
{
    __u32 tgid = tracked_tgid();
    if (!tgid)
        return 0;
    struct cuda_stat *s = stat_of(tgid, fn, kind);
    if (s) {
        s->calls++;
        s->bytes += bytes;
    }
    return tgid;
}

static __always_inline int count_call(__u16 fn, __u16 kind, __u64 bytes)
{
    counted(fn, kind, bytes);
    return 0;
}

/* Entry of a timed function: count it, remember when (and what) for the return. */
static __always_inline int enter_timed(__u16 fn, __u16 kind, __u64 bytes, __u64 arg, __u64 size)
{
    if (!counted(fn, kind, bytes))
        return 0;
    struct cuda_call c = {.id = bpf_get_current_pid_tgid(), .fn = fn};
    struct cuda_entry e = {.ts = bpf_ktime_get_ns(), .arg = arg, .size = size, .kind = kind};
    if (cuda_inflight.update(&c, &e))
        lost(CUDA_C_INFLIGHT_LOST);
    return 0;
}

/* Return of a timed function: add the time blocked to the row the entry
 * counted, and count a failure. */
static __always_inline int leave_timed(struct pt_regs *ctx, __u16 fn)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct cuda_call c = {.id = id, .fn = fn};
    struct cuda_entry *e = cuda_inflight.lookup(&c);
    if (!e)
        return 0;
    __u32 tgid = id >> 32;
    int rc = (int)PT_REGS_RC(ctx);
    __u64 now = bpf_ktime_get_ns();
    struct cuda_stat *s = stat_of(tgid, fn, e->kind);
    if (s) {
        s->ns += now - e->ts;
        if (rc != 0)
            s->errors++;
    }
    if (fn == CUDA_MEMCPY || fn == CUDA_STREAM_SYNC || fn == CUDA_DEVICE_SYNC) {
        struct cuda_wait *w = cuda_waits.ringbuf_reserve(sizeof(struct cuda_wait));
        if (w) {
            w->tgid = tgid;
            w->fn = fn;
            w->start_ns = e->ts;
            w->end_ns = now;
            cuda_waits.ringbuf_submit(w, BPF_RB_NO_WAKEUP); /* drained as requests end */
        } else {
            lost(CUDA_C_WAITS_LOST);
        }
    }
    if (rc == 0 && fn == CUDA_MALLOC) {
        struct cuda_alloc a = {.tgid = tgid};
        if (read_user(&a.ptr, sizeof(a.ptr), (void *)e->arg) == 0 && a.ptr) {
            __u64 size = e->size;
            if (cuda_allocs.update(&a, &size))
                lost(CUDA_C_ALLOCS_FULL);
            else if (s)
                s->bytes += size;
        }
    } else if (rc == 0 && fn == CUDA_FREE && e->arg) {
        struct cuda_alloc a = {.tgid = tgid, .ptr = e->arg};
        __u64 *size = cuda_allocs.lookup(&a);
        if (size) {
            if (s)
                s->bytes += *size;
            cuda_allocs.delete(&a);
        }
    }
    cuda_inflight.delete(&c);
    return 0;
}

/* cudaMemcpyKind is in [0, 4]; anything else is kept apart as 5. */
static __always_inline __u16 copy_kind(__u64 kind)
{
    return kind <= 4 ? kind : 5;
}

/* Launches: counted on entry only (the hot path: one hash update). */
int cuda_launch_kernel(struct pt_regs *ctx) { return count_call(CUDA_LAUNCH_KERNEL, 0, 0); }
int cuda_graph_launch(struct pt_regs *ctx) { return count_call(CUDA_GRAPH_LAUNCH, 0, 0); }
int cuda_cu_launch_kernel(struct pt_regs *ctx) { return count_call(CUDA_CU_LAUNCH_KERNEL, 0, 0); }
int cuda_cu_launch_kernel_ex(struct pt_regs *ctx) { return count_call(CUDA_CU_LAUNCH_KERNEL_EX, 0, 0); }

/* cudaMemcpyAsync(dst, src, count, kind, stream): returns before the copy ends. */
int cuda_memcpy_async(struct pt_regs *ctx)
{
    return count_call(CUDA_MEMCPY_ASYNC, copy_kind(PT_REGS_PARM4(ctx)), PT_REGS_PARM3(ctx));
}

/* cudaMemcpy(dst, src, count, kind): the thread waits for the copy. */
int cuda_memcpy(struct pt_regs *ctx)
{
    return enter_timed(CUDA_MEMCPY, copy_kind(PT_REGS_PARM4(ctx)), PT_REGS_PARM3(ctx), 0, 0);
}
int cuda_memcpy_ret(struct pt_regs *ctx) { return leave_timed(ctx, CUDA_MEMCPY); }

int cuda_stream_sync(struct pt_regs *ctx) { return enter_timed(CUDA_STREAM_SYNC, 0, 0, 0, 0); }
int cuda_stream_sync_ret(struct pt_regs *ctx) { return leave_timed(ctx, CUDA_STREAM_SYNC); }
int cuda_device_sync(struct pt_regs *ctx) { return enter_timed(CUDA_DEVICE_SYNC, 0, 0, 0, 0); }
int cuda_device_sync_ret(struct pt_regs *ctx) { return leave_timed(ctx, CUDA_DEVICE_SYNC); }

/* cudaMalloc(void **devPtr, size_t size) */
int cuda_malloc(struct pt_regs *ctx)
{
    return enter_timed(CUDA_MALLOC, 0, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
}
int cuda_malloc_ret(struct pt_regs *ctx) { return leave_timed(ctx, CUDA_MALLOC); }

/* cudaFree(void *devPtr) */
int cuda_free(struct pt_regs *ctx) { return enter_timed(CUDA_FREE, 0, 0, PT_REGS_PARM1(ctx), 0); }
int cuda_free_ret(struct pt_regs *ctx) { return leave_timed(ctx, CUDA_FREE); }
