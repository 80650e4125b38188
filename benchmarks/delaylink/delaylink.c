/* delaylink: one simulated host's network link with a fixed one-way delay, in user space.

   This kernel has no netem qdisc, so a link that delays frames is a process: it creates two TAP devices,
   OUTSIDE in its own network namespace (simhosts.py attaches it to the hosts' bridge) and INSIDE in the
   namespace at NETNS (the host's eth0), and copies every Ethernet frame from one to the other. A frame
   read at time t is written at t + delay, in the order frames arrived (FIFO); UP_US delays the host's
   sends (INSIDE -> OUTSIDE), DOWN_US what it receives. Rate shaping stays in the kernel: a tbf qdisc on
   each TAP's egress, before the frame reaches this process, i.e. serialization then propagation.

   A queue that would exceed QUEUE_BYTES drops the frame, as a router's full buffer would. The devices
   are not persistent: they vanish when this process exits, and it exits with its parent (PDEATHSIG).
   The process asks for real-time scheduling (SCHED_FIFO, when allowed): a link is hardware, and its
   frames should not wait behind the simulated hosts' own processes for a CPU. Its CPU time is bounded by
   the traffic (about 13% of a core per Gbit/s of 64000-byte frames).

   usage: delaylink OUTSIDE NETNS INSIDE UP_US DOWN_US
   prints "ready" on stdout once both devices exist, then runs until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAX 65550            /* the largest TAP MTU (65535) plus the Ethernet header */
#define QUEUE_BYTES (32u << 20)    /* per direction: ~0.27 s of traffic at 1 Gbit/s */
#define BATCH 64                   /* frames read per wake-up and fd, so one busy side cannot starve the other */

typedef struct {
    uint64_t due_ns;
    uint32_t len;
} record;

typedef struct {            /* a byte ring of (record, frame) entries, FIFO */
    unsigned char *buf;
    size_t head, tail, used; /* head: next to release; tail: next free byte */
    uint64_t delay_ns;
    uint64_t dropped;
} queue;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "delaylink: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int open_tap(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) die("open /dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) die(name);
    return fd;
}

/* Copies n bytes into the ring at offset pos, wrapping; returns the offset after them. */
static size_t ring_put(queue *q, size_t pos, const void *src, size_t n) {
    size_t first = n < QUEUE_BYTES - pos ? n : QUEUE_BYTES - pos;
    memcpy(q->buf + pos, src, first);
    memcpy(q->buf, (const unsigned char *)src + first, n - first);
    return (pos + n) % QUEUE_BYTES;
}

static size_t ring_get(queue *q, size_t pos, void *dst, size_t n) {
    size_t first = n < QUEUE_BYTES - pos ? n : QUEUE_BYTES - pos;
    memcpy(dst, q->buf + pos, first);
    memcpy((unsigned char *)dst + first, q->buf, n - first);
    return (pos + n) % QUEUE_BYTES;
}

/* Reads up to BATCH frames from fd into q, each due delay_ns after now. */
static void receive(int fd, queue *q, unsigned char *frame) {
    for (int i = 0; i < BATCH; i++) {
        ssize_t n = read(fd, frame, FRAME_MAX);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            die("read");
        }
        if (q->used + sizeof(record) + (size_t)n > QUEUE_BYTES) {
            q->dropped++;
            continue;
        }
        record r = {now_ns() + q->delay_ns, (uint32_t)n};
        q->tail = ring_put(q, q->tail, &r, sizeof r);
        q->tail = ring_put(q, q->tail, frame, (size_t)n);
        q->used += sizeof r + (size_t)n;
    }
}

/* Writes every frame of q that is due to fd; returns the next frame's due time, or 0 when q is empty. */
static uint64_t release(int fd, queue *q, unsigned char *frame) {
    while (q->used) {
        record r;
        ring_get(q, q->head, &r, sizeof r);
        if (r.due_ns > now_ns()) return r.due_ns;
        size_t pos = ring_get(q, (q->head + sizeof r) % QUEUE_BYTES, frame, r.len);
        if (write(fd, frame, r.len) < 0 && errno != EAGAIN && errno != EIO) die("write");
        q->head = pos;
        q->used -= sizeof r + r.len;
    }
    return 0;
}

static uint64_t parse_us(const char *text) {
    char *end;
    unsigned long long us = strtoull(text, &end, 10);
    if (*text == '\0' || *end != '\0') {
        fprintf(stderr, "delaylink: %s is not a whole number of microseconds\n", text);
        exit(2);
    }
    return (uint64_t)us * 1000u;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: delaylink OUTSIDE NETNS INSIDE UP_US DOWN_US\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_TIMERSLACK, 1UL);  /* wake-ups within microseconds of the due time, not 50 us late */
    struct sched_param fifo = {.sched_priority = 10};
    if (sched_setscheduler(0, SCHED_FIFO, &fifo) < 0)
        fprintf(stderr, "delaylink: no real-time scheduling (%s); frames may wait for a CPU\n", strerror(errno));
    queue up = {malloc(QUEUE_BYTES), 0, 0, 0, parse_us(argv[4]), 0};
    queue down = {malloc(QUEUE_BYTES), 0, 0, 0, parse_us(argv[5]), 0};
    unsigned char *frame = malloc(FRAME_MAX);
    if (!up.buf || !down.buf || !frame) die("malloc");

    int outside = open_tap(argv[1]);
    int ns = open(argv[2], O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) die(argv[2]);
    int inside = open_tap(argv[3]);
    printf("ready\n");
    fflush(stdout);

    struct pollfd fds[2] = {{inside, POLLIN, 0}, {outside, POLLIN, 0}};
    for (;;) {
        uint64_t next_up = release(outside, &up, frame);
        uint64_t next_down = release(inside, &down, frame);
        uint64_t next = next_up && next_down ? (next_up < next_down ? next_up : next_down) : next_up | next_down;
        struct timespec wait, *timeout = NULL;
        if (next) {
            uint64_t now = now_ns(), left = next > now ? next - now : 0;
            wait.tv_sec = (time_t)(left / 1000000000u);
            wait.tv_nsec = (long)(left % 1000000000u);
            timeout = &wait;
        }
        if (ppoll(fds, 2, timeout, NULL) < 0 && errno != EINTR) die("ppoll");
        if (fds[0].revents & POLLIN) receive(inside, &up, frame);
        if (fds[1].revents & POLLIN) receive(outside, &down, frame);
    }
}
