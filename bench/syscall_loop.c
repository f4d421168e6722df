/* A syscall-heavy process that no agent traces: bench_cost.py's last row.

     cc -O2 -o syscall_loop bench/syscall_loop.c
     ./syscall_loop pipe SECONDS        write(2) 1 byte into a pipe, read(2) it back
     ./syscall_loop socketpair SECONDS  send(2) 1 byte on an AF_UNIX socketpair, recv(2) it on the other end

   One thread, one byte, two syscalls an iteration, for SECONDS (the clock is
   read through the vDSO every 1024 iterations: no syscall). Prints
   "ITERATIONS SECONDS ITERATIONS_PER_SECOND". The agent's syscall tracepoints
   (sys_enter/exit of read, write, sendto, recvfrom, and sock:sock_*_length)
   fire for every process on the node; their programs return early for a
   process the agent does not follow, and this measures what that costs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "pipe") && strcmp(argv[1], "socketpair"))) {
        fprintf(stderr, "usage: %s pipe|socketpair SECONDS\n", argv[0]);
        return 2;
    }
    int sock = strcmp(argv[1], "socketpair") == 0;
    double seconds = atof(argv[2]);
    int fd[2];
    if (sock ? socketpair(AF_UNIX, SOCK_STREAM, 0, fd) : pipe(fd)) {
        perror(argv[1]);
        return 1;
    }
    char c = 'x';
    unsigned long n = 0;
    double t0 = now(), t = t0;
    while (t - t0 < seconds) {
        for (int i = 0; i < 1024; i++, n++) {
            if (sock) {
                if (send(fd[0], &c, 1, 0) != 1 || recv(fd[1], &c, 1, 0) != 1) {
                    perror("send/recv");
                    return 1;
                }
            } else if (write(fd[1], &c, 1) != 1 || read(fd[0], &c, 1) != 1) {
                perror("write/read");
                return 1;
            }
        }
        t = now();
    }
    printf("%lu %.6f %.1f\n", n, t - t0, n / (t - t0));
    return 0;
}
