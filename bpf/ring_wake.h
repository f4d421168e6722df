/* When a ring event wakes the agent. The agent drains its rings on its own
 * tick (stitch.flush_interval_ms); the kernel wakes it sooner only when a ring
 * could fill before then: once per `every` bytes (a power of two) that one CPU
 * writes to it. Userspace sizes `every` so that with every CPU just short of
 * its next wakeup a quarter of the ring is in use (probes/ring.py:wake_bytes).
 * A wakeup per event would cost the traced process microseconds per call.
 * `written`: this CPU's count of the ring's bytes (a per-CPU array's entry). */
#ifndef SITSPROBE_RING_WAKE_H
#define SITSPROBE_RING_WAKE_H

static __always_inline __u64 ring_wake(__u64 *written, __u64 size, __u64 every)
{
    if (!written)
        return BPF_RB_NO_WAKEUP;
    __u64 before = *written, after = before + size;
    *written = after;
    return (before & ~(every - 1)) != (after & ~(every - 1)) ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

#endif
