"""The constants of bpf/sitsprobe.h that Python reads, in the header's blocks
(net, cuda, cache, markers) and under the header's names.

The one place Python holds them: every other module imports them from here,
and tests/unit/test_abi.py compiles the header to check each value, that every
enum of the header is here whole, and that the ordered name tuples follow
their enum. Structs are not here: bcc derives their layouts from the header.
Imports nothing (no bcc, no torch), so any layer may read it.
"""
from __future__ import annotations


def _in_order(labels: dict[int, str], count: int) -> tuple[str, ...]:
    """``labels`` (enumerator -> name) as a tuple indexed by the enumerator,
    which must run 0..count-1 without a gap."""
    if sorted(labels) != list(range(count)):
        raise ValueError(f"enumerators {sorted(labels)} are not 0..{count - 1}")
    return tuple(labels[i] for i in range(count))


# ---- net ----
# TCP_SENDMSG_HOOK (-D): which hook marks a connection as TCP
TCP_SENDMSG_FENTRY, TCP_SENDMSG_KPROBE, TCP_SENDMSG_TRACEPOINT = 1, 2, 3
# NET_TIER (-D): which hooks read the bytes of socket calls
NET_TIER_SOCK, NET_TIER_SYSCALL = 1, 2

# enum conn_state: struct conn.state
ST_IDLE, ST_READING, ST_RESPONDING = 0, 1, 2

# struct conn.flags
CF_TUPLE, CF_TCP, CF_CHUNK_END, CF_SEEDED, CF_MISSED, CF_INTERIM = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
CF_BODY, CF_BODY_NEXT, CF_CLIENT, CF_BY_PROCESS, CF_STREAM, CF_TLS, CF_TLS_PLAIN, CF_BINNED, CF_CLOSING = (
    0x40, 0x80, 0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000)
CF_ANSWERED = 0x8000
TLS_GRACE = 16

# enum end_reason: struct exchange_event.reason (END_FLUSH and END_EXIT: userspace only)
END_NEXT, END_CLOSE, END_FLUSH, END_EXIT, END_RESPONSE = 1, 2, 3, 4, 5

# enum counter: index into the `counters` per-CPU array
(C_EXCHANGES, C_LOST, C_CONN_OVERFLOW, C_NOTICES_LOST, C_INFLIGHT_LOST, C_UNCOUNTED,
 C_BODIES_FULL, C_WRITES_LOST, C_CHUNKS_LOST, C_BINNED, C_UNSENT, C_BINS_FULL) = range(12)
C_COUNTERS = 12
NET_COUNTERS = _in_order({
    C_EXCHANGES: "exchanges", C_LOST: "lost", C_CONN_OVERFLOW: "conn_overflow",
    C_NOTICES_LOST: "notices_lost", C_INFLIGHT_LOST: "inflight_lost", C_UNCOUNTED: "uncounted",
    C_BODIES_FULL: "bodies_full", C_WRITES_LOST: "writes_lost", C_CHUNKS_LOST: "chunks_lost",
    C_BINNED: "binned", C_UNSENT: "unsent", C_BINS_FULL: "bins_full",
}, C_COUNTERS)

# enum segment: the rows of struct bin.seg, in sitsprobe.stitch.segments' order
SEG_NETWORK, SEG_SCHEDULING, SEG_COMPUTE, SEG_IO, SEG_CACHE = range(5)
SEG_COUNT = 5

# enum call_kind: struct args.kind (the `inflight` map), with SEND and UNTRACKED or-ed in
K_FLAT, K_IOV, K_MSG, K_NOCOPY, K_ACCEPT, K_CONNECT = 1, 2, 3, 4, 5, 6
SEND, UNTRACKED, OTHER_READ = 0x100, 0x200, 0x400

# struct ssl_call.flags
SSL_WRITE, SSL_EX = 0x1, 0x2

# enum chunk_dir: struct chunk.dir
CH_IN, CH_OUT, CH_CLOSE = 1, 2, 3

# enum notice_kind: struct notice.kind
N_EXEC, N_EXIT, N_LISTEN = 1, 2, 3

# ---- cuda ----
# enum cuda_fn: struct cuda_key.fn
(CUDA_LAUNCH_KERNEL, CUDA_MEMCPY, CUDA_MEMCPY_ASYNC, CUDA_STREAM_SYNC, CUDA_DEVICE_SYNC,
 CUDA_MALLOC, CUDA_FREE, CUDA_GRAPH_LAUNCH, CUDA_CU_LAUNCH_KERNEL, CUDA_CU_LAUNCH_KERNEL_EX) = range(10)
CUDA_FUNCTIONS = 10
CUDA_FN_NAMES = _in_order({
    CUDA_LAUNCH_KERNEL: "cudaLaunchKernel", CUDA_MEMCPY: "cudaMemcpy",
    CUDA_MEMCPY_ASYNC: "cudaMemcpyAsync", CUDA_STREAM_SYNC: "cudaStreamSynchronize",
    CUDA_DEVICE_SYNC: "cudaDeviceSynchronize", CUDA_MALLOC: "cudaMalloc", CUDA_FREE: "cudaFree",
    CUDA_GRAPH_LAUNCH: "cudaGraphLaunch", CUDA_CU_LAUNCH_KERNEL: "cuLaunchKernel",
    CUDA_CU_LAUNCH_KERNEL_EX: "cuLaunchKernelEx",
}, CUDA_FUNCTIONS)

# enum cuda_counter: index into the `cuda_counters` per-CPU array
CUDA_C_STATS_FULL, CUDA_C_INFLIGHT_LOST, CUDA_C_ALLOCS_FULL, CUDA_C_WAITS_LOST = 0, 1, 2, 3
CUDA_C_COUNTERS = 4
CUDA_COUNTERS = _in_order({
    CUDA_C_STATS_FULL: "stats_full", CUDA_C_INFLIGHT_LOST: "inflight_lost",
    CUDA_C_ALLOCS_FULL: "allocs_full", CUDA_C_WAITS_LOST: "waits_lost",
}, CUDA_C_COUNTERS)

# ---- cache ----
CACHE_SLOTS = 8  # cache probes one program serves
CACHE_LAT_SLOTS = 65  # log2 latency histogram slots per cache probe

# enum cache_key_kind: struct cache_cfg.key_kind, by the config's `key.read`
CK_CSTR, CK_PTR_LEN, CK_REDIS_ROBJ = 1, 2, 3
CACHE_KEY_KINDS = {"cstr": CK_CSTR, "ptr_len": CK_PTR_LEN, "redis_robj": CK_REDIS_ROBJ}

# enum cache_hit_op: struct cache_cfg.hit_op, by the config's `hit.op`
HO_NE, HO_EQ, HO_GT, HO_GE, HO_LT, HO_LE = 0, 1, 2, 3, 4, 5
CACHE_HIT_OPS = {"!=": HO_NE, "==": HO_EQ, ">": HO_GT, ">=": HO_GE, "<": HO_LT, "<=": HO_LE}

# enum cache_counter: index (slot * CC_COUNTERS + counter) into `cache_counts`
CC_HITS, CC_MISSES, CC_FILTERED, CC_LOST, CC_INFLIGHT_LOST, CC_DURATION_NS = 0, 1, 2, 3, 4, 5
CC_COUNTERS = 6
CACHE_COUNTERS = _in_order({
    CC_HITS: "hits", CC_MISSES: "misses", CC_FILTERED: "filtered", CC_LOST: "lost",
    CC_INFLIGHT_LOST: "inflight_lost", CC_DURATION_NS: "duration_ns",
}, CC_COUNTERS)

# struct cache_event.flags
CE_TRUNCATED, CE_PEER = 0x01, 0x02

# ---- markers ----
MARKER_NAME = 32  # stage, cache or model name bytes, NUL included
MARKER_KEY = 64  # cache key bytes copied
MARKER_IDS = 16  # request ids per batch event

# enum marker_kind: struct marker_event.kind, by the marker library's call
# (a range is one event, its begin and end joined in the kernel)
MK_REQUEST_BEGIN, MK_REQUEST_END, MK_RANGE, MK_BATCH, MK_CACHE_GET, MK_USAGE = range(1, 7)
MARKER_KINDS = {
    MK_REQUEST_BEGIN: "request_begin", MK_REQUEST_END: "request_end", MK_RANGE: "range",
    MK_BATCH: "batch", MK_CACHE_GET: "cache_get", MK_USAGE: "usage",
}

# enum marker_counter: index into the `marker_counters` per-CPU array
MC_EVENTS, MC_LOST, MC_IDS_DROPPED, MC_KEYS_CUT, MC_RANGES_UNMATCHED = 0, 1, 2, 3, 4
MC_COUNTERS = 5
MARKER_COUNTERS = _in_order({
    MC_EVENTS: "events", MC_LOST: "lost", MC_IDS_DROPPED: "batch_ids_dropped", MC_KEYS_CUT: "keys_cut",
    MC_RANGES_UNMATCHED: "ranges_unmatched",
}, MC_COUNTERS)
