/* smddp's native hot path: the shared-memory barrier (spin, then futex) with the cross-rank call check,
 * reductions over several sources, the whole small all_reduce in one call, and the progress loop that
 * moves an exchange's bytes over the TCP connections between hosts.
 *
 * Loaded through ctypes (smddp_sdk/collectives/native/__init__.py), which compiles this file on first use.
 * Control line of local rank i (64 bytes at base + i*LINE), as 32-bit words:
 *   [0] barrier generation  [1] sleeping waiters  [2..7] call record for even generations
 *   [8..13] call record for odd generations
 * A call record is (seq, op, dtype, count low, count high, root). A peer that has reached generation g
 * cannot be past g+1 (that needs us), so the record slot of g's parity still holds its record for g.
 * After the ranks' lines come the abort line and message (shm.py), then one 32-bit word per local rank:
 * the CPU it last waited on, plus one (cpu_word).
 *
 * Links between hosts are protected as tcp.py's docstring lays out (records with an AES-256-GCM tag);
 * the cipher comes from OpenSSL's libcrypto, opened at run time (smddp_crypto_load) with the few EVP
 * calls declared below, so building needs no OpenSSL headers and loading no libcrypto: without it only
 * plain links work, and tcp.py refuses a protected one with the reason.
 */
#define _GNU_SOURCE /* sched_getaffinity, sched_getcpu, CPU_COUNT */
#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define LINE 64
#define REC_WORDS 6
#define PAUSE_NS 30000L /* shm.py's _SPIN_S_UNDERSUBSCRIBED */

enum { DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_BF16 = 3, DT_I32 = 4, DT_I64 = 5, DT_U8 = 6, DT_I8 = 7, DT_I16 = 8 };
enum { OP_SUM = 0, OP_PROD = 1, OP_MIN = 2, OP_MAX = 3, OP_AVG = 4 }; /* AVG: the sum divided by the sources (floats) */

static inline uint32_t *word(char *base, int index, int w) { return (uint32_t *)(base + (long)index * LINE) + w; }
#define ABORT_MESSAGE_BYTES 1024 /* shm.py's */
static inline uint32_t *cpu_word(char *base, int n, int index) {
    return (uint32_t *)(base + (long)(n + 1) * LINE + ABORT_MESSAGE_BYTES) + index;
}

static inline long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline int arrived(uint32_t seen, uint32_t generation) { return (uint32_t)(seen - generation) < (1u << 31); }

/* Publish this rank's record and generation, wake sleepers on its line. */
static void publish(char *base, int index, uint32_t generation, const uint32_t *record) {
    uint32_t *rec = word(base, index, 2 + (generation & 1) * REC_WORDS);
    for (int k = 0; k < REC_WORDS; k++) __atomic_store_n(rec + k, record[k], __ATOMIC_RELAXED);
    __atomic_store_n(word(base, index, 0), generation, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word(base, index, 1), __ATOMIC_SEQ_CST))
        syscall(SYS_futex, word(base, index, 0), FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* The cores this process may run on (shm.py's ShmArena.cores), counted once. */
static int cores_here(void) {
    static int cores;
    if (!cores) {
        cpu_set_t set;
        int count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
        __atomic_store_n(&cores, count > 0 ? count : 1, __ATOMIC_RELAXED);
    }
    return cores;
}

/* Where the rank waited for runs, as far as this rank knows: on this rank's core (or the host's ranks
 * outnumber its cores), on another core, or unknown. */
enum peer_place { PEER_HERE, PEER_ELSEWHERE, PEER_UNKNOWN };

/* One poll of a wait. A peer on this core gets it through sched_yield (no sleep and wake-up); a peer on
 * another core is waited for with pause alone, as Open MPI's ranks do when each has a core: a yield
 * would hand this core to whatever else is runnable (another session's task) for a whole slice. Not
 * knowing, pause up to PAUSE_NS, then yield (a wake-up may have put the peer on this core). */
static inline void poll_once(long elapsed, enum peer_place peer) {
    if (peer == PEER_HERE || (peer == PEER_UNKNOWN && elapsed >= PAUSE_NS)) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
    else __builtin_ia32_pause();
#endif
}

/* Wait for every peer to reach generation; compare their records with ours. Polls for spin_ns first
 * (poll_once), then sleeps on the peer's futex. Each rank notes the CPU it waits on (cpu_word), so a
 * waiter knows where its peer ran last: on this CPU (the scheduler put both there; or the host's ranks
 * outnumber its cores), it yields at once instead of holding the core the peer needs (4 KB all_reduce of
 * 2 ranks while a busy task holds the other core: 78-87 -> 16-25 us); elsewhere, it pauses throughout.
 * Returns -1 when all arrived and agree, i (>= 0) when peer i is still missing after slice_ns,
 * -2 - i when peer i arrived with a different call record. */
int smddp_wait(char *base, int n, int index, uint32_t generation, const uint32_t *record, long spin_ns, long slice_ns) {
    long start = now_ns();
    int crowded = n > cores_here();
    uint32_t here = (uint32_t)sched_getcpu() + 1;
    if (__atomic_load_n(cpu_word(base, n, index), __ATOMIC_RELAXED) != here) /* written on a move only */
        __atomic_store_n(cpu_word(base, n, index), here, __ATOMIC_RELAXED);
    for (int peer = 0; peer < n; peer++) {
        if (peer == index) continue;
        uint32_t *counter = word(base, peer, 0);
        for (;;) {
            uint32_t seen = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
            if (arrived(seen, generation)) break;
            long elapsed = now_ns() - start;
            if (elapsed >= slice_ns) return peer;
            if (elapsed < spin_ns) {
                uint32_t there = __atomic_load_n(cpu_word(base, n, peer), __ATOMIC_RELAXED);
                poll_once(elapsed, crowded || there == here ? PEER_HERE : there ? PEER_ELSEWHERE : PEER_UNKNOWN);
                continue;
            }
            long left = slice_ns - elapsed;
            struct timespec ts = {left / 1000000000L, left % 1000000000L};
            uint32_t *waiters = word(base, peer, 1);
            __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
            seen = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
            if (!arrived(seen, generation)) syscall(SYS_futex, counter, FUTEX_WAIT, seen, &ts, NULL, 0);
            __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
        }
        const uint32_t *theirs = word(base, peer, 2 + (generation & 1) * REC_WORDS);
        for (int k = 0; k < REC_WORDS; k++)
            if (__atomic_load_n(theirs + k, __ATOMIC_RELAXED) != record[k]) return -2 - peer;
    }
    return -1;
}

int smddp_barrier(char *base, int n, int index, uint32_t generation, const uint32_t *record, long spin_ns, long slice_ns) {
    publish(base, index, generation, record);
    return smddp_wait(base, n, index, generation, record, spin_ns, slice_ns);
}

/* dst = srcs[0] op srcs[1] op ... ; dst may alias any one source at the same element (a block of every
 * source is read before the block is stored). Half types accumulate in fp32, round once;
 * FINISH(a) maps the accumulator before the store (AVG divides there, so no second pass). */
#define REDUCE_LOOP(T, ACC, LOAD, STORE, COMBINE, FINISH)                             \
    do {                                                                              \
        T *d = (T *)dst;                                                              \
        for (long j0 = 0; j0 < count; j0 += 1024) {                                   \
            long j1 = j0 + 1024 < count ? j0 + 1024 : count;                          \
            ACC acc[1024];                                                            \
            const T *s0 = (const T *)srcs[0];                                         \
            for (long j = j0; j < j1; j++) acc[j - j0] = LOAD(s0[j]);                 \
            for (int s = 1; s < nsrc; s++) {                                          \
                const T *sp = (const T *)srcs[s];                                     \
                for (long j = j0; j < j1; j++) {                                      \
                    ACC a = acc[j - j0], b = LOAD(sp[j]);                             \
                    acc[j - j0] = COMBINE;                                            \
                }                                                                     \
            }                                                                         \
            for (long j = j0; j < j1; j++) d[j] = STORE(FINISH(acc[j - j0]));         \
        }                                                                             \
    } while (0)

#define ID(x) (x)
static inline float bf16_load(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even, as torch does */
    return (uint16_t)(u >> 16);
}
static inline float f16_load(_Float16 v) { return (float)v; }
static inline _Float16 f16_store(float f) { return (_Float16)f; }

#define MEAN(a) ((a) / nsrc)
#define BY_OP(T, ACC, LOAD, STORE)                                                          \
    switch (op) {                                                                           \
    case OP_SUM: REDUCE_LOOP(T, ACC, LOAD, STORE, a + b, ID); return 0;                     \
    case OP_PROD: REDUCE_LOOP(T, ACC, LOAD, STORE, a * b, ID); return 0;                    \
    case OP_MIN: REDUCE_LOOP(T, ACC, LOAD, STORE, (b < a || b != b) ? b : a, ID); return 0; \
    case OP_MAX: REDUCE_LOOP(T, ACC, LOAD, STORE, (b > a || b != b) ? b : a, ID); return 0; \
    default: return 1;                                                                      \
    }
#define BY_FLOAT_OP(T, ACC, LOAD, STORE)                                                    \
    if (op == OP_AVG) {                                                                     \
        REDUCE_LOOP(T, ACC, LOAD, STORE, a + b, MEAN);                                      \
        return 0;                                                                           \
    }                                                                                       \
    BY_OP(T, ACC, LOAD, STORE)

/* Returns 0, or 1 when the dtype/op pair is not handled here (the caller uses torch). */
int smddp_reduce(int dtype, int op, void *dst, void *const *srcs, int nsrc, long count) {
    switch (dtype) {
    case DT_F32: BY_FLOAT_OP(float, float, ID, ID)
    case DT_F64: BY_FLOAT_OP(double, double, ID, ID)
    case DT_F16: BY_FLOAT_OP(_Float16, float, f16_load, f16_store)
    case DT_BF16: BY_FLOAT_OP(uint16_t, float, bf16_load, bf16_store)
    case DT_I32: BY_OP(int32_t, int32_t, ID, ID)
    case DT_I64: BY_OP(int64_t, int64_t, ID, ID)
    case DT_I16: BY_OP(int16_t, int16_t, ID, ID)
    case DT_I8: BY_OP(int8_t, int8_t, ID, ID)
    case DT_U8: BY_OP(uint8_t, uint8_t, ID, ID)
    default: return 1;
    }
}

/* Zero-copy reduction of this rank's shard over the host's copies of one tensor (local.py's
 * allreduce_views): copies[i] points at the shard's first element in local rank i's copy, own at this
 * rank's data for it (its copy, or a tensor not yet staged). Block by block, so that the result is still
 * in cache when it is written into every other copy: copies[index] = own op peers (rank order), then
 * copied out. Returns smddp_reduce's code. */
int smddp_reduce_shard(int dtype, int op, void *const *copies, int n, int index, void *own, long count, long esize,
                       long block) {
    void *srcs[n];
    for (long lo = 0; lo < count; lo += block) {
        long length = lo + block < count ? block : count - lo;
        long at = lo * esize;
        srcs[0] = (char *)own + at;
        for (int i = 0, k = 1; i < n; i++)
            if (i != index) srcs[k++] = (char *)copies[i] + at;
        char *result = (char *)copies[index] + at;
        if (smddp_reduce(dtype, op, result, srcs, n, length)) return 1;
        for (int i = 0; i < n; i++)
            if (i != index) memcpy((char *)copies[i] + at, result, length * esize);
    }
    return 0;
}

/* The whole one-shot all_reduce of a small buffer: copy into this rank's slot, barrier, every rank
 * reduces every slot (same order everywhere, so identical bits) into x, its own part read from x (the
 * same bytes, still in this core's cache: the peers' slots are the only lines that cross cores; 4 KB of
 * 2 ranks here, 0.6-0.9 -> 0.5-0.6 us when the cores are far apart). Returns smddp_wait's code; on
 * anything but -1 the caller finishes the barrier (or raises) and then calls smddp_reduce itself. */
int smddp_allreduce_small(char *base, int n, int index, uint32_t generation, const uint32_t *record,
                          long spin_ns, long slice_ns, void *x, long nbytes, void *const *slots,
                          int dtype, int op, long count) {
    memcpy(slots[index], x, nbytes);
    int status = smddp_barrier(base, n, index, generation, record, spin_ns, slice_ns);
    if (status != -1) return status;
    void *sources[n];
    for (int i = 0; i < n; i++) sources[i] = i == index ? x : slots[i];
    if (smddp_reduce(dtype, op, x, sources, n, count)) return -100;
    return -1;
}

/* One buffer of a TCP exchange: sent on fd, or received from it, after the fd's earlier buffers of the
 * same direction (array order). done counts the bytes moved so far and survives between calls. */
struct smddp_transfer {
    int fd;
    int receive;
    char *data;
    long length;
    long done;
    int error; /* set on failure: an errno, or -1 when the peer closed the connection */
};

/* The first transfer of its fd and direction still unfinished? Only that one may move bytes. */
static int is_next(const struct smddp_transfer *t, int i) {
    for (int j = 0; j < i; j++)
        if (t[j].fd == t[i].fd && t[j].receive == t[i].receive && t[j].done < t[j].length) return 0;
    return 1;
}

/* Move what the socket takes or has now, without blocking, for transfer i and the unfinished transfers of
 * the same fd and direction after it, gathered into one sendmsg/recvmsg (a call header and its data leave
 * in one segment and arrive in one wake-up). 0 when it would block or they are done, 1 on failure
 * (t[i].error says why). */
#define GATHER_MAX 16
static int advance_plain(struct smddp_transfer *t, int count, int i) {
    for (;;) {
        struct iovec iov[GATHER_MAX];
        int index[GATHER_MAX], n = 0;
        for (int j = i; j < count && n < GATHER_MAX; j++) {
            if (t[j].fd != t[i].fd || t[j].receive != t[i].receive || t[j].done >= t[j].length) continue;
            iov[n] = (struct iovec){.iov_base = t[j].data + t[j].done, .iov_len = (size_t)(t[j].length - t[j].done)};
            index[n++] = j;
        }
        if (n == 0) return 0;
        struct msghdr message = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t moved = t[i].receive ? recvmsg(t[i].fd, &message, MSG_DONTWAIT)
                                     : sendmsg(t[i].fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (moved > 0) {
            for (int k = 0; k < n && moved > 0; k++) {
                long step = t[index[k]].length - t[index[k]].done;
                if (step > moved) step = (long)moved;
                t[index[k]].done += step;
                moved -= step;
            }
        } else if (moved == 0 && t[i].receive) {
            t[i].error = -1;
            return 1;
        } else if (errno != EINTR) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            t[i].error = errno;
            return 1;
        }
    }
}


/* --- links: one registered per connection (smddp_link_open), found by fd ----------------------------- */
#define RECORD_BYTES (64L << 10) /* tcp.py's RECORD_BYTES */
#define TAG_BYTES 16
#define INTEGRITY_FAILED -2 /* a transfer's error: a record failed its check */
enum { LINK_PLAIN = 0, LINK_INTEGRITY = 1, LINK_ENCRYPT = 2 };

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct evp_cipher_st EVP_CIPHER;
#define EVP_CTRL_GCM_GET_TAG 0x10
#define EVP_CTRL_GCM_SET_TAG 0x11
typedef int (*evp_init_fn)(EVP_CIPHER_CTX *, const EVP_CIPHER *, void *, const unsigned char *, const unsigned char *);
typedef int (*evp_update_fn)(EVP_CIPHER_CTX *, unsigned char *, int *, const unsigned char *, int);
typedef int (*evp_final_fn)(EVP_CIPHER_CTX *, unsigned char *, int *);
static struct {
    EVP_CIPHER_CTX *(*ctx_new)(void);
    const EVP_CIPHER *(*aes_256_gcm)(void);
    int (*ctrl)(EVP_CIPHER_CTX *, int, int, void *);
    evp_init_fn encrypt_init, decrypt_init;
    evp_update_fn encrypt_update, decrypt_update;
    evp_final_fn encrypt_final, decrypt_final;
} evp;
static int crypto_loaded;

/* Open libcrypto at path (tcp.py passes the one Python's hashlib uses). 0 when loaded, else 1. */
int smddp_crypto_load(const char *path) {
    if (crypto_loaded) return 0;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 1;
    const char *names[] = {"EVP_CIPHER_CTX_new", "EVP_aes_256_gcm", "EVP_CIPHER_CTX_ctrl", "EVP_EncryptInit_ex", "EVP_DecryptInit_ex",
                           "EVP_EncryptUpdate", "EVP_DecryptUpdate", "EVP_EncryptFinal_ex", "EVP_DecryptFinal_ex"};
    void *found[9];
    for (int k = 0; k < 9; k++)
        if (!(found[k] = dlsym(lib, names[k]))) return 1;
    memcpy(&evp, found, sizeof(found)); /* the struct's members in the order of names */
    crypto_loaded = 1;
    return 0;
}

/* One direction of a link: its cipher (keyed once), nonce base and record counter, and the record now
 * moving: its payload length (0: none) and the bytes of payload, then tag, moved so far. */
struct direction {
    EVP_CIPHER_CTX *ctx;
    unsigned char iv[12];
    uint64_t seq;
    long length;
    long at;
    unsigned char tag[TAG_BYTES];
    unsigned char *stage; /* encrypt, sending: the record's ciphertext */
};
struct link {
    int fd;
    int mode;
    long header; /* the call header's bytes, a record of their own at the start of each message */
    struct direction out, in;
};
#define MAX_LINKS 4096
static struct link *links[MAX_LINKS]; /* never freed: an exchange may still hold one being closed */

static struct link *link_of(int fd) {
    for (int k = 0; k < MAX_LINKS; k++) {
        struct link *l = __atomic_load_n(&links[k], __ATOMIC_ACQUIRE);
        if (!l) return NULL;
        if (__atomic_load_n(&l->fd, __ATOMIC_ACQUIRE) == fd) return l;
    }
    return NULL;
}

/* Register the connection fd (tcp.py, after the handshake): mode, the header's bytes and its keys
 * (send key 32, send nonce base 12, receive key 32, receive nonce base 12). 0 when registered, 1 when
 * a protected mode needs libcrypto and it is not loaded, 2 when out of memory or slots. */
static char links_lock; /* held while a slot is chosen and filled: meshes may connect from several threads */

static int link_open(int fd, int mode, long header, const unsigned char *keys);
int smddp_link_open(int fd, int mode, long header, const unsigned char *keys) {
    if (mode != LINK_PLAIN && !crypto_loaded) return 1;
    while (__atomic_test_and_set(&links_lock, __ATOMIC_ACQUIRE)) {
    }
    int status = link_open(fd, mode, header, keys);
    __atomic_clear(&links_lock, __ATOMIC_RELEASE);
    return status;
}

static int link_open(int fd, int mode, long header, const unsigned char *keys) {
    int slot = 0;
    while (slot < MAX_LINKS && links[slot] && links[slot]->fd != fd && links[slot]->fd != -1) slot++;
    if (slot == MAX_LINKS) return 2;
    struct link *l = links[slot] ? links[slot] : calloc(1, sizeof(struct link));
    if (!l) return 2;
    l->fd = -1;
    if (mode != LINK_PLAIN) {
        if (!l->out.ctx) l->out.ctx = evp.ctx_new();
        if (!l->in.ctx) l->in.ctx = evp.ctx_new();
        if (!l->out.stage) l->out.stage = malloc(RECORD_BYTES);
        if (!l->out.ctx || !l->in.ctx || !l->out.stage) return 2;
        if (evp.encrypt_init(l->out.ctx, evp.aes_256_gcm(), NULL, keys, NULL) != 1 ||
            evp.decrypt_init(l->in.ctx, evp.aes_256_gcm(), NULL, keys + 44, NULL) != 1)
            return 2;
        memcpy(l->out.iv, keys + 32, 12);
        memcpy(l->in.iv, keys + 76, 12);
    }
    l->mode = mode;
    l->header = header;
    l->out.seq = l->in.seq = 0;
    l->out.length = l->in.length = 0;
    __atomic_store_n(&l->fd, fd, __ATOMIC_RELEASE);
    __atomic_store_n(&links[slot], l, __ATOMIC_RELEASE);
    return 0;
}

/* The connection fd closes: its slot may serve another. */
void smddp_link_close(int fd) {
    struct link *l = link_of(fd);
    if (l) __atomic_store_n(&l->fd, -1, __ATOMIC_RELEASE);
}

/* The fd's message in transfer i's direction: bytes moved so far (whole records) and in all. */
static void message(const struct smddp_transfer *t, int count, int i, long *moved, long *total) {
    *moved = *total = 0;
    for (int j = 0; j < count; j++)
        if (t[j].fd == t[i].fd && t[j].receive == t[i].receive) {
            *moved += t[j].done;
            *total += t[j].length;
        }
}

/* The message's bytes [skip, skip + length) past what is moved, from transfer i (the first unfinished
 * of its fd and direction) on, as at most max pieces; returns how many, *covered their bytes. */
static int pieces(const struct smddp_transfer *t, int count, int i, long skip, long length, struct iovec *iov, int max,
                  long *covered) {
    int n = 0;
    *covered = 0;
    for (int j = i; j < count && length > 0 && n < max; j++) {
        if (t[j].fd != t[i].fd || t[j].receive != t[i].receive) continue;
        long start = t[j].done, left = t[j].length - start;
        if (skip >= left) {
            skip -= left;
            continue;
        }
        start += skip;
        left -= skip;
        skip = 0;
        long take = left < length ? left : length;
        iov[n++] = (struct iovec){.iov_base = t[j].data + start, .iov_len = (size_t)take};
        length -= take;
        *covered += take;
    }
    return n;
}

/* The record's payload is moved (with its tag): count it in the transfers it spans. */
static void credit(struct smddp_transfer *t, int count, int i, long length) {
    for (int j = i; j < count && length > 0; j++) {
        if (t[j].fd != t[i].fd || t[j].receive != t[i].receive) continue;
        long take = t[j].length - t[j].done < length ? t[j].length - t[j].done : length;
        t[j].done += take;
        length -= take;
    }
}

static void nonce_of(unsigned char nonce[12], const struct direction *d) {
    memcpy(nonce, d->iv, 12);
    for (int k = 0; k < 8; k++) nonce[4 + k] ^= (unsigned char)(d->seq >> (56 - 8 * k));
}

/* Run the direction's cipher over the record's payload (length bytes from transfer i on): sending, the
 * tag (and for encrypt the ciphertext into stage); receiving, the check of the tag (encrypt: the
 * plaintext in place). 0 when it holds. */
static int cipher_record(struct link *l, struct smddp_transfer *t, int count, int i, long length) {
    int sending = !t[i].receive, encrypt = l->mode == LINK_ENCRYPT;
    struct direction *d = sending ? &l->out : &l->in;
    unsigned char nonce[12], end[32];
    int outl;
    nonce_of(nonce, d);
    d->seq++;
    if ((sending ? evp.encrypt_init : evp.decrypt_init)(d->ctx, NULL, NULL, NULL, nonce) != 1) return 1;
    evp_update_fn update = sending ? evp.encrypt_update : evp.decrypt_update;
    for (long at = 0; at < length;) {
        struct iovec iov[GATHER_MAX];
        long covered;
        int n = pieces(t, count, i, at, length - at, iov, GATHER_MAX, &covered);
        for (int k = 0; k < n; k++) {
            unsigned char *in = iov[k].iov_base, *out = !encrypt ? NULL : sending ? d->stage + at : in;
            if (update(d->ctx, out, &outl, in, (int)iov[k].iov_len) != 1) return 1; /* NULL out: the bytes are AAD */
            at += (long)iov[k].iov_len;
        }
    }
    if (sending) return evp.encrypt_final(d->ctx, end, &outl) != 1 || evp.ctrl(d->ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, d->tag) != 1;
    return evp.ctrl(d->ctx, EVP_CTRL_GCM_SET_TAG, TAG_BYTES, d->tag) != 1 || evp.decrypt_final(d->ctx, end, &outl) != 1;
}

/* advance_plain's work on a protected link: record by record (the call header's bytes one, then the
 * data in RECORD_BYTES), each payload followed by its tag; a record counts in the transfers' done once
 * its tag is out (sending) or in and checked (receiving). */
static int advance_records(struct link *l, struct smddp_transfer *t, int count, int i) {
    struct direction *d = t[i].receive ? &l->in : &l->out;
    for (;;) {
        if (d->length == 0) {
            long moved, total;
            message(t, count, i, &moved, &total);
            if (moved >= total) return 0;
            long length = moved < l->header ? (l->header < total ? l->header : total) - moved
                                            : (RECORD_BYTES < total - moved ? RECORD_BYTES : total - moved);
            if (!t[i].receive && cipher_record(l, t, count, i, length)) {
                t[i].error = EIO;
                return 1;
            }
            d->length = length;
            d->at = 0;
        }
        struct iovec iov[GATHER_MAX + 1];
        int n = 0;
        long covered = 0;
        if (d->at < d->length) {
            if (l->mode == LINK_ENCRYPT && !t[i].receive) {
                iov[n++] = (struct iovec){.iov_base = d->stage + d->at, .iov_len = (size_t)(d->length - d->at)};
                covered = d->length - d->at;
            } else {
                n = pieces(t, count, i, d->at, d->length - d->at, iov, GATHER_MAX, &covered);
            }
        }
        if (d->at + covered == d->length) { /* the whole payload is in the list: its tag follows */
            long tag_at = d->at > d->length ? d->at - d->length : 0;
            iov[n++] = (struct iovec){.iov_base = d->tag + tag_at, .iov_len = (size_t)(TAG_BYTES - tag_at)};
        }
        struct msghdr message_ = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t moved = t[i].receive ? recvmsg(t[i].fd, &message_, MSG_DONTWAIT)
                                     : sendmsg(t[i].fd, &message_, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (moved > 0) {
            d->at += (long)moved;
            if (d->at < d->length + TAG_BYTES) continue;
            if (t[i].receive && cipher_record(l, t, count, i, d->length)) {
                t[i].error = INTEGRITY_FAILED;
                return 1;
            }
            credit(t, count, i, d->length);
            d->length = 0;
        } else if (moved == 0 && t[i].receive) {
            t[i].error = -1;
            return 1;
        } else if (errno != EINTR) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            t[i].error = errno;
            return 1;
        }
    }
}

/* Move what the socket takes or has now for transfer i and the unfinished ones of its fd and direction
 * after it: 0 when it would block or they are done, 1 on failure (t[i].error says why: an errno, -1 when
 * the peer closed, INTEGRITY_FAILED). An fd without a link fails (ENOTCONN): nothing leaves unprotected
 * by mistake. */
static int advance(struct smddp_transfer *t, int count, int i) {
    struct link *l = link_of(t[i].fd);
    if (!l) {
        t[i].error = ENOTCONN;
        return 1;
    }
    return l->mode == LINK_PLAIN ? advance_plain(t, count, i) : advance_records(l, t, count, i);
}

/* Every peer's sends and receives progress together from this one thread (no GIL, no thread hand-offs):
 * move whatever each socket allows, then poll the unfinished ones. Returns -1 when every transfer is
 * done, -2 when slice_ns passed first (call again: progress is kept in done), or the index of a transfer
 * that failed. */
int smddp_exchange(struct smddp_transfer *t, int count, long slice_ns) {
    long start = now_ns();
    struct pollfd fds[count > 0 ? count : 1];
    for (;;) {
        int waiting = 0;
        for (int i = 0; i < count; i++) {
            if (t[i].done >= t[i].length || !is_next(t, i)) continue;
            if (advance(t, count, i)) return i;
            if (t[i].done >= t[i].length) continue;
            short events = t[i].receive ? POLLIN : POLLOUT;
            int k = 0;
            while (k < waiting && fds[k].fd != t[i].fd) k++;
            if (k == waiting) fds[waiting++] = (struct pollfd){.fd = t[i].fd, .events = 0};
            fds[k].events |= events;
        }
        if (!waiting) return -1; /* a buffer is skipped only behind an unfinished one, which waits */
        long left_ns = slice_ns - (now_ns() - start);
        if (left_ns <= 0) return -2;
        if (poll(fds, waiting, (int)((left_ns + 999999) / 1000000)) < 0 && errno != EINTR) {
            for (int i = 0;; i++)
                if (t[i].done < t[i].length) {
                    t[i].error = errno;
                    return i;
                }
        }
    }
}


/* --- point-to-point rings (ring.py): one per ordered pair of ranks on a host, a byte stream ----------
 * The ring's first RING_HEADER bytes hold its counters as 32-bit words, each on a line of its own:
 *   [16] head: bytes written so far (mod 2^32), advanced by the writer only  [17] readers asleep on it
 *   [32] tail: bytes consumed so far, advanced by the reader only           [33] writers asleep on it
 * then capacity bytes of data (a power of two); byte k of the stream is at data[k & (capacity - 1)].
 * capacity comes from the caller, never from the shared words, and a head and tail further apart than
 * capacity (a corrupted ring) is an error, so nothing outside the mapping is ever touched. */
#define RING_HEADER 256
#define RING_HEAD 16
#define RING_READERS 17
#define RING_TAIL 32
#define RING_WRITERS 33

static inline uint32_t *ring_word(char *ring, int w) { return (uint32_t *)ring + w; }

/* Bytes in the ring, or -1 when head and tail make no sense. */
static long ring_used(char *ring, long capacity) {
    uint32_t used = __atomic_load_n(ring_word(ring, RING_HEAD), __ATOMIC_ACQUIRE) -
                    __atomic_load_n(ring_word(ring, RING_TAIL), __ATOMIC_ACQUIRE);
    return used > (uint32_t)capacity ? -1 : (long)used;
}

/* Advance a counter and wake whoever sleeps on it. */
static void ring_publish(char *ring, int counter, int sleepers, uint32_t value) {
    __atomic_store_n(ring_word(ring, counter), value, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(ring_word(ring, sleepers), __ATOMIC_SEQ_CST))
        syscall(SYS_futex, ring_word(ring, counter), FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* Write what fits of src's n bytes; returns the bytes written (0: full), -1 when the ring is corrupt. */
long smddp_ring_put(char *ring, long capacity, const char *src, long n) {
    long used = ring_used(ring, capacity);
    if (used < 0) return -1;
    if (n > capacity - used) n = capacity - used;
    if (n <= 0) return 0;
    uint32_t head = __atomic_load_n(ring_word(ring, RING_HEAD), __ATOMIC_RELAXED);
    char *data = ring + RING_HEADER;
    long at = head & (capacity - 1), first = n < capacity - at ? n : capacity - at;
    memcpy(data + at, src, first);
    memcpy(data, src + first, n - first);
    ring_publish(ring, RING_HEAD, RING_READERS, head + (uint32_t)n);
    return n;
}

/* Take up to n bytes into dst; returns the bytes taken (0: empty), -1 when the ring is corrupt. */
long smddp_ring_take(char *ring, long capacity, char *dst, long n) {
    long used = ring_used(ring, capacity);
    if (used < 0) return -1;
    if (n > used) n = used;
    if (n <= 0) return 0;
    uint32_t tail = __atomic_load_n(ring_word(ring, RING_TAIL), __ATOMIC_RELAXED);
    const char *data = ring + RING_HEADER;
    long at = tail & (capacity - 1), first = n < capacity - at ? n : capacity - at;
    memcpy(dst, data + at, first);
    memcpy(dst + first, data, n - first);
    ring_publish(ring, RING_TAIL, RING_WRITERS, tail + (uint32_t)n);
    return n;
}

/* Until want bytes are in the ring (space == 0: the reader) or free (space == 1: the writer): poll for
 * spin_ns, then sleep on the other end's counter. Returns how many there are, 0 when slice_ns passed
 * first, -1 when the ring is corrupt. */
long smddp_ring_wait(char *ring, long capacity, int space, long want, long spin_ns, long slice_ns) {
    int counter = space ? RING_TAIL : RING_HEAD, sleepers = space ? RING_WRITERS : RING_READERS;
    if (want > capacity) want = capacity;
    long start = now_ns();
    for (;;) {
        long used = ring_used(ring, capacity);
        if (used < 0) return -1;
        long have = space ? capacity - used : used;
        if (have >= want && have > 0) return have;
        long elapsed = now_ns() - start;
        if (elapsed >= slice_ns) return 0;
        if (elapsed < spin_ns) {  /* as smddp_wait */
            poll_once(elapsed, PEER_UNKNOWN);
            continue;
        }
        long left = slice_ns - elapsed;
        struct timespec ts = {left / 1000000000L, left % 1000000000L};
        __atomic_fetch_add(ring_word(ring, sleepers), 1, __ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(ring_word(ring, counter), __ATOMIC_SEQ_CST);
        used = ring_used(ring, capacity);
        have = space ? capacity - used : used;
        if (used >= 0 && (have < want || have == 0))
            syscall(SYS_futex, ring_word(ring, counter), FUTEX_WAIT, seen, &ts, NULL, 0);
        __atomic_fetch_sub(ring_word(ring, sleepers), 1, __ATOMIC_SEQ_CST);
    }
}
