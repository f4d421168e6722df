/* Reading user memory: bcc's bpf_probe_read_user{,_str}, the same helpers
 * under names its rewriter does not check. For every call spelled
 * bpf_probe_read_user it looks the helper up in the kernel's symbols (a
 * fallback to bpf_probe_read for kernels before 5.5, older than any sitsprobe
 * loads on), about 20 ms a call site: 0.55 s of net.c's 2.5 s compile here.
 * The bytecode is the same, byte for byte. */
#ifndef SITSPROBE_USER_READ_H
#define SITSPROBE_USER_READ_H

static int (*read_user)(void *dst, __u32 size, const void *src) = (void *)BPF_FUNC_probe_read_user;
static int (*read_user_str)(void *dst, __u32 size, const void *src) =
    (void *)BPF_FUNC_probe_read_user_str;

#endif
