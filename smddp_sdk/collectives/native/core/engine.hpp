// smddp's core engine: the collectives' shared-memory protocol within a host and the algorithms between
// hosts, on raw bytes. Free of torch, so that it compiles in seconds beside the torch extension
// (smddp_core.cpp), which derives from it, checks the tensors and binds it to Python. Where Python must
// act (a late or disagreeing peer, a failed link) the engine calls the hooks smddp_core.cpp defines.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace smddp {

using BarrierFn = int (*)(char*, int, int, uint32_t, const uint32_t*, long, long);
using AllreduceFn = int (*)(char*, int, int, uint32_t, const uint32_t*, long, long, void*, long, void* const*, int,
                            int, long);
using ReduceFn = int (*)(int, int, void*, void* const*, int, long);

// smddp_native.c's struct smddp_transfer and its exchange loop
struct Transfer {
  int fd;
  int receive;
  char* data;
  long length;
  long done;
  int error;
};
using ExchangeFn = int (*)(Transfer*, int, long);

// Bytes of one buffer, and every peer host's buffers to send or receive (index: host)
struct Span {
  char* data;
  long length;
};
using Spans = std::vector<std::vector<Span>>;

// algorithms.py's inter-host rules, handed over by the Python group so both paths decide alike
struct HostRules {
  long alpha;           // ALPHA_BYTES
  long message;         // MESSAGE_BYTES
  long ring_round;      // RING_ROUND_BYTES
  long oneshot_chunk;   // ONESHOT_CHUNK_BYTES
  long pipeline_chunk;  // InterHostAllreduce.pipeline_chunk_bytes
  long rounds_from;     // ROUNDS_FROM_BYTES
  int forced;           // SMDDP_ALLREDUCE_ALGO as an Algorithm (kAuto: chosen by size)
};

enum Algorithm : int { kAuto = 0, kOneshot, kRecursiveDoubling, kSharded, kHalvingDoubling, kRing };

inline int log2_floor(long n) { return 63 - __builtin_clzl(static_cast<unsigned long>(n)); }

// algorithms.py's allreduce_cost: the model's time, in bytes of link time
inline long allreduce_cost(int algorithm, long nbytes, long hosts, const HostRules& rules) {
  long log = log2_floor(hosts), p = 1L << log, folded = hosts > p ? 1 : 0;
  long rounds, messages, moved;
  if (algorithm == kOneshot) {
    rounds = 1, messages = 2 * (hosts - 1), moved = (hosts - 1) * nbytes;
  } else if (algorithm == kRecursiveDoubling) {
    rounds = log + 2 * folded, messages = 2 * (log + folded), moved = (log + folded) * nbytes;
  } else if (algorithm == kHalvingDoubling) {
    rounds = 2 * (log + folded), messages = 4 * log + 2 * folded, moved = 2 * (p - 1) * nbytes / p + folded * nbytes;
  } else {
    long per_peer = (nbytes + hosts - 1) / hosts;
    rounds = algorithm == kSharded && per_peer < rules.rounds_from ? 2 : 2 * (hosts - 1);
    messages = 4 * (hosts - 1), moved = 2 * (hosts - 1) * nbytes / hosts;
  }
  return rounds * rules.alpha + messages * rules.message + moved;
}

// algorithms.py's inter_host_algorithm
inline int inter_host_algorithm(long nbytes, long hosts, const HostRules& rules) {
  if (rules.forced != kAuto) return rules.forced;
  if (hosts >= 3 && nbytes / hosts >= rules.ring_round) return kRing;
  int best = kOneshot;
  for (int algorithm : {kRecursiveDoubling, kSharded, kHalvingDoubling})
    if (allreduce_cost(algorithm, nbytes, hosts, rules) < allreduce_cost(best, nbytes, hosts, rules)) best = algorithm;
  return best;
}

// selection.py's ceil_log2 and allgather_cost (kOneshot, kBruck or kRing)
constexpr int kBruck = kRing + 1;
inline long ceil_log2(long hosts) { return hosts > 1 ? log2_floor(hosts - 1) + 1 : 0; }
inline long allgather_cost(int algorithm, long block_bytes, long hosts, const HostRules& rules) {
  long latency;
  if (algorithm == kOneshot)
    latency = (block_bytes < rules.rounds_from ? 1 : hosts - 1) * rules.alpha + 2 * (hosts - 1) * rules.message;
  else
    latency = (algorithm == kBruck ? ceil_log2(hosts) : hosts - 1) * (rules.alpha + 2 * rules.message);
  return latency + (hosts - 1) * block_bytes;
}

// selection.py's allgather_algorithm
inline int allgather_algorithm(long block_bytes, long hosts, const HostRules& rules) {
  if (hosts >= 3 && block_bytes >= rules.ring_round) return kRing;
  return allgather_cost(kBruck, block_bytes, hosts, rules) < allgather_cost(kOneshot, block_bytes, hosts, rules) ? kBruck
                                                                                                            : kOneshot;
}

// selection.py's BROADCAST_ALGORITHMS, broadcast_cost and broadcast_algorithm
enum BroadcastAlgorithm : int { kBinomial = 0, kScatterAllgather };
inline long broadcast_cost(int algorithm, long nbytes, long hosts, const HostRules& rules) {
  long rounds = ceil_log2(hosts) * (rules.alpha + 2 * rules.message);
  if (algorithm == kBinomial) return rounds + ceil_log2(hosts) * nbytes;
  long block = (nbytes + hosts - 1) / hosts;
  return rounds + (hosts - 1) * block + allgather_cost(allgather_algorithm(block, hosts, rules), block, hosts, rules);
}
inline int broadcast_algorithm(long nbytes, long hosts, const HostRules& rules) {
  return broadcast_cost(kScatterAllgather, nbytes, hosts, rules) < broadcast_cost(kBinomial, nbytes, hosts, rules)
             ? kScatterAllgather
             : kBinomial;
}

// algorithms.py's folded_rank and host_of_folded: host 2i+1 folds into host 2i for i < hosts - p
inline int folded_rank(int node, int hosts) {
  int extra = hosts - (1 << log2_floor(hosts));
  if (node < 2 * extra) return node % 2 ? -1 : node / 2;
  return node - extra;
}
inline int host_of_folded(int rank, int hosts) {
  int extra = hosts - (1 << log2_floor(hosts));
  return rank < extra ? 2 * rank : rank + extra;
}

// tcp.py's call header ahead of every peer's bytes in an exchange: magic, the call record, the step
using Header = std::array<uint32_t, 8>;
constexpr int kStep = 7;
constexpr long kHeaderWaitNs = 100000000;  // tcp.py's _HEADER_WAIT_S

constexpr uint32_t kNoRoot = 0xFFFFFFFF;
constexpr int kDone = -1;
// shm.py's control line words and counters for single-copy reads
constexpr long kLine = 64;
constexpr int kVerdictWord = 14, kPidWord = 15;
constexpr int kSingleCopyOff = 3;
// op indices of calls.py OPS
enum CallOp : uint32_t {
  kBarrier = 0, kAllReduce = 1, kReduce = 3, kBroadcast = 4, kScatter = 5, kAllGather = 6, kAllGatherIntoTensor = 8,
  kGather = 10, kReduceScatter = 11, kReduceScatterTensor = 12, kAllToAll = 14, kAllToAllSingle = 15
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Set by the Python group once its arena is up (one host, native kernels); addresses are the Python
  // side's counters and record, so both paths number and tag collectives alike.
  void attach(uintptr_t base, int n, int index, long slot_bytes, uintptr_t slots0, uintptr_t slots1,
              uintptr_t counters, uintptr_t record, uintptr_t barrier_fn, uintptr_t allreduce_fn, uintptr_t reduce_fn,
              long calm_spin_ns, long loaded_spin_ns, long blocking_spin_ns, int cores, long slice_ns, long symmetric_limit,
              long single_copy_from, long streamed_from);

  // Set by the Python group of a group across hosts, before attach: every host's group ranks (the leader
  // first), this host's index, whether this rank leads it (and holds the connections: fds[h] to host h's
  // leader, -1 for its own), the mesh's call header (TcpMesh.header; 0 where this rank leads no host),
  // the kernels' exchange loop and reduction, algorithms.py's rules and the check slice.
  void attach_hosts(std::vector<std::vector<int>> nodes, int node, bool leader, std::vector<int> fds, uintptr_t header,
                    uintptr_t exchange_fn, uintptr_t reduce_fn, long alpha, long message, long ring_round,
                    long oneshot_chunk, long pipeline_chunk, long rounds_from, int forced, long slice_ns);

  // mode: 0 off (every call in Python), 1 on, 2 on but reductions with SUM only (SageMaker check active)
  void set_mode(int mode) { mode_.store(mode, std::memory_order_release); }
  int mode() const { return mode_.load(std::memory_order_acquire); }

  // The claim that orders collectives on this rank: a call runs inline only when nothing is queued.
  bool claim_inline() {
    int idle = 0;
    return pending_.compare_exchange_strong(idle, 1, std::memory_order_acq_rel);
  }
  void add_pending() { pending_.fetch_add(1, std::memory_order_acq_rel); }
  void end_job() { pending_.fetch_sub(1, std::memory_order_acq_rel); }

  int64_t calls() const { return calls_; }

 protected:
  // Counts a call the core runs and releases the inline claim however the call ends; while it runs, the
  // caller's thread waits in it (spin(): the blocking budget).
  struct Claim {
    explicit Claim(Engine* core) : core_(core) {
      core_->calls_++;
      core_->blocking_ = true;
    }
    ~Claim() {
      core_->blocking_ = false;
      core_->end_job();
    }
    Engine* core_;
  };

  // The one-host collectives: a one-host group with its arena attached.
  bool usable() const { return base_ != nullptr && hosts_ == 1 && mode() != 0; }
  // all_reduce: those, or any group across hosts.
  bool reduces_here() const { return usable() || across_hosts(); }
  bool across_hosts() const { return hosts_ > 1 && exchange_ != nullptr && mode() != 0; }

  // communicator.py's allgather: every rank's bytes into its target (by group rank; lengths may differ,
  // this rank's is data's): within the host, between the leaders, then the leader hands the other hosts'
  // parts to the host's ranks.
  void gather_everywhere(char* data, const std::vector<Span>& targets, const char* what);

  // local.py's allgather: every local rank's bytes into targets (local order; lengths may differ, this
  // rank's is data's): read from the peers' memory (single copy), or a slot at a time up to the longest,
  // the result written with non-temporal stores once the gathered bytes reach streamed_from_.
  void gather_in_host(char* data, const std::vector<Span>& targets, const char* what);

  // process_group.py's _all_to_all and communicator.py's all_to_all: outs[r] receives what rank r sends
  // this rank, ins[r] goes to rank r; false if not claimed.
  bool to_all(CallOp op, const std::vector<Span>& outs, const std::vector<Span>& ins);

  // The input spans as one stream: in place where they already are one, else copied into scratch.
  char* blob(const std::vector<Span>& spans);

  // algorithms.py's allgather_between_hosts: all-to-all (in rounds when large), bruck, or the ring, every
  // block (blocks[h]: host h's spans, this host's filled in) received straight into its place.
  void allgather_blocks(const Spans& blocks);

  void allreduce_chunks(char* data, long count, long esize, int dtype, int op);

  // One chunk of an all_reduce, by the Python path's rule (local.py): up to symmetric_limit every rank
  // reduces every slot (one barrier); above, rank i reduces shard i for all (two barriers).
  void allreduce_chunk(char* x, long count, long esize, int dtype, int op);

  // local.py's shard_bounds: part i's elements when count is cut into parts (local ranks by default)
  static std::pair<long, long> bounds(long count, int parts, int i);
  std::pair<long, long> shard(long count, int i) const { return bounds(count, n_, i); }

  // Local rank root's spans to every local rank as one stream, a slot at a time (local.py's broadcast
  // packs its buffers into slots the same way).
  void broadcast_spans(int root, const std::vector<Span>& spans, const char* what);

  // shm.py's ShmArena.single_copy_read: every rank's source address out through its slot, a barrier, each
  // rank fills its targets straight from the peers' sources, a second barrier (sources stay untouched
  // until read); false when some rank's read was refused (then copied through the slots, from now on).
  struct Read {
    int peer;
    Span target;
  };
  bool single_copy() const { return counters_[kSingleCopyOff] == 0; }
  uint32_t* line_word(int i, int w) const { return reinterpret_cast<uint32_t*>(base_ + i * kLine) + w; }

  bool single_copy_read(char* source, const std::vector<Read>& reads, const char* what);

  // Bytes start..start+length of the spans' concatenation into the slot (into_slot) or out of it.
  static void copy_stream(const std::vector<Span>& spans, long start, long length, char* slot, bool into_slot);

  // communicator.py's allreduce across hosts, chunk by chunk: the host's ranks reduce over shared memory,
  // the leaders between hosts, and the leader's result goes to the host's ranks.
  void allreduce_hosts(char* data, long count, long esize, int dtype, int op, const char* what);

  int node_of(int rank) const;

  // Group rank root's bytes to every rank: within the host, or across hosts as below.
  void broadcast_everywhere(int root, Span data, const char* what);

  // communicator.py's broadcast across hosts: within the root's host, between the leaders
  // (broadcast_between_hosts), within each other host from its leader.
  void broadcast_hosts(int root, Span data, const char* what);

  // algorithms.py's broadcast_between_hosts: a binomial tree from host root, of the whole message or of
  // each subtree's shards followed by an all_gather of the shards (scatter_allgather).
  void broadcast_between_hosts(int root, Span data);

  // communicator.py's barrier across hosts: the host's ranks, a byte between every two leaders, the host's ranks.
  void barrier_hosts();

  // algorithms.py's reaching_every_peer: a byte to and from every peer the exchange leaves out (inbox: one
  // byte per host), so that every leader hears every other's call header. Rooted calls are checked so.
  void reach_every_peer(Spans& sends, Spans& recvs, std::vector<char>& inbox) const;

  // algorithms.py's checks_calls: false where SMDDP_CHECK_CALLS=0 took the header off (to measure its cost)
  bool checks_calls() const { return header_ != nullptr && header_[0] != 0; }
  // algorithms.py's check_call: the call header alone between every two leaders.
  void check_call();

  // communicator.py's check_between_hosts: reduce and gather, on all_reduce and all_gather that may not reach
  // every host both ways, have their leaders check the call first.
  void check_hosts(const char* what);

  // algorithms.py's InterHostAllreduce.run: the algorithm by size and host count (or forced), the
  // sharded pipeline over the whole buffer, the others in chunks of oneshot_chunk
  void between_hosts(char* x, long count, long esize, int dtype, int op);

  // One span with one peer: mine out, theirs in.
  void exchange_with(int peer, Span send, Span receive);

  // algorithms.py's _combine_pair: mine = the two partial results, the lower host's first (theirs: scratch)
  void combine_pair(char* mine, char* theirs, long count, long esize, int dtype, int op, bool mine_first);

  // algorithms.py's _folded: the extra hosts fold into their partners, among(rank, p) runs on the p hosts
  // left (steps exchanges), the result goes back; hosts count the exchanges they sit out, so that every
  // host numbers the call's steps alike.
  template <typename Among>
  void folded(char* x, long count, long esize, int dtype, int op, int steps, Among among);

  // algorithms.py's recursive_doubling
  void recursive_doubling(char* x, long count, long esize, int dtype, int op);

  // algorithms.py's halving_doubling (Rabenseifner)
  void halving_doubling(char* x, long count, long esize, int dtype, int op);

  void oneshot(char* x, long count, long esize, int dtype, int op);

  // Reduce-scatter + all-gather in pipelined chunks: round k sends chunk k's shards and chunk k-1's result.
  void sharded(char* x, long count, long esize, int dtype, int op);

  // Host h sends to h+1 only: shard j accumulates along the ring in one order, then travels around.
  void ring_allreduce(char* x, long count, long esize, int dtype, int op);

  // Every host's copy reduced in host order into x (x is sources[node_]); the same bits on every host.
  void reduce_in_host_order(char* x, std::vector<void*>& sources, long count, long esize, int dtype, int op);

  // algorithms.py's exchange_in_rounds: large exchanges with several peers as permutation rounds (round r:
  // send to host+r, receive from host-r), so that each link carries one flow per direction.
  void exchange_in_rounds(const Spans& sends, const Spans& recvs);

  static long total(const std::vector<Span>& spans);

  // Every peer's spans out and in at once through the kernels' poll loop, each peer's behind the call
  // header (tcp.py's TcpMesh.exchange: only to and from peers with bytes to move); a peer's header that
  // differs from ours fails the call (`_exchange_mismatch`). Between slices Python checks the deadline and
  // signals (`_exchange_stalled`), and a broken connection fails there (`_exchange_failed`).
  void exchange(const Spans& sends, const Spans& recvs);

  // A slice passed with transfers unfinished: Python fails the call past the deadline.
  void report_stall(const std::vector<Transfer>& transfers, const std::vector<int>& peers);

  // reusable buffers by key, zeroed (faulted in) when first made or grown
  char* scratch(long key, long nbytes);

  // The collective now running across hosts: named in errors, timed from here for the deadline.
  void start_call(const char* what);

  // shm.py's spin rule (ShmArena._refresh_spin_budget, LoadSamples): how long a waiting rank polls before
  // it sleeps. Every 125 ms a sample of "more tasks runnable than cores" goes into the last 8; the machine
  // counts as loaded (poll briefly) while a majority of them say so, so one passing task never does. A
  // blocking call (under a Claim) polls blocking_spin_ns_, whatever the load (shm.py's spin_budgets).
  long spin();

  // specs/processes.py's runnable_tasks: /proc/loadavg's runnable count, else the 1-minute load average.
  static double runnable_tasks();

  // One barrier of the current collective; Python finishes it when a peer is late or disagrees.
  void sync(const char* what);

  // The call record (calls.py's Call.words) of the collective about to run, as Python's begin writes it:
  // into the arena's record (counters_: [0] call sequence number, [1] barrier generation, [2] phase, shared
  // with Python) and into the mesh's call header, which numbers calls itself and restarts the step.
  void tag(uint32_t op, uint32_t dtype, int64_t count, uint32_t root, uint32_t reduce);
  uint32_t next_generation() { return ++counters_[1]; }
  uint32_t next_half() { return counters_[2]++ & 1; }

  // The hooks through which Python speaks (smddp_core.cpp): each raises (as a Python error) when the
  // call must fail, and returns when it may go on.
  virtual int group_rank() const = 0;
  virtual int group_size() const = 0;
  virtual void finish_in_python(const char* what, int status, uint32_t generation) = 0;
  [[noreturn]] virtual void all_to_all_mismatch(int source, int target, int64_t sent, int64_t expected) = 0;
  virtual void single_copy_refused(int error) = 0;
  [[noreturn]] virtual void exchange_mismatch(int peer, const Header& theirs, const Header& mine) = 0;
  [[noreturn]] virtual void exchange_failed(int peer, bool receive, int error) = 0;
  virtual void exchange_stalled(int peer, bool receive, double waited) = 0;

  char* base_ = nullptr;
  int n_ = 0;
  int index_ = 0;
  long slot_bytes_ = 0;
  void* const* slots_[2] = {nullptr, nullptr};
  uint32_t* counters_ = nullptr;
  uint32_t* record_ = nullptr;
  BarrierFn barrier_ = nullptr;
  AllreduceFn allreduce_ = nullptr;
  ReduceFn reduce_ = nullptr;
  long spin_ns_ = 0;
  uint8_t load_samples_ = 0;  // spin(): the last 8 samples, the newest in bit 0
  long calm_spin_ns_ = 0;
  long loaded_spin_ns_ = 0;
  long blocking_spin_ns_ = 0;
  bool blocking_ = false;  // a Claim runs: the caller's thread waits in this call
  int cores_ = 1;
  std::chrono::steady_clock::time_point spin_checked_;
  long slice_ns_ = 0;
  long symmetric_limit_ = 0;
  long single_copy_from_ = 0;
  long streamed_from_ = 0;
  int node_ = 0;
  int hosts_ = 1;
  bool leader_ = true;
  std::vector<int> fds_;
  uint32_t* header_ = nullptr;  // TcpMesh.header: magic, the call record, the step (kStep)
  ExchangeFn exchange_ = nullptr;
  HostRules rules_{};
  std::map<long, std::vector<char>> scratch_;
  std::vector<std::vector<int>> nodes_;
  const char* what_ = "";
  std::chrono::steady_clock::time_point started_;
  std::atomic<int> mode_{0};
  std::atomic<int> pending_{0};
  int64_t calls_ = 0;  // written only under the claim
};

}  // namespace smddp
