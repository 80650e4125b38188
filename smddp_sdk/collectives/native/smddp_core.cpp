// smddp's C++ core: the torch ProcessGroup that SmddpProcessGroup (Python) derives from.
//
// Blocking collectives of a one-host group run here, on the caller's thread and without the GIL:
// all_reduce, reduce, broadcast, scatter, all_gather (list and into-tensor), gather, reduce_scatter_tensor
// and barrier of contiguous CPU tensors; the Python group's communication thread runs its all_reduces here
// too. They use the same shared-memory protocol, kernels (smddp_native.c, passed in as function pointers),
// counters and call records as the Python path, so ranks may take either path for any call. A group across
// hosts runs its all_reduces (fp16/bf16 widened to fp32 and rounded once, AVG divided before that rounding,
// as communicator.py does) and reduces, all_gathers and gathers, broadcasts and scatters, reduce_scatters
// (tensor, or a list), all_to_alls and barriers here as well, and the step between hosts of smddp's DDP
// (`_core_between_hosts`): the host's ranks over shared memory, the host leaders over the TCP mesh (the
// kernels' poll loop) with algorithms.py's algorithms, byte for byte (same order, same chunks, same
// reduction order), each exchange behind tcp.py's call header (the check between hosts).
// Everything else goes to the Python implementation (`_python_<method>`); a call whose peers are late
// past one check slice waits in Python (`_finish_barrier`, `_exchange_stalled`) with the deadline, abort
// and liveness checks and the hang warning.
//
// Built on first use by smddp_sdk/collectives/native/__init__.py; see docs/collectives.md ("Native hot path").
#include <torch/csrc/distributed/c10d/PyProcessGroup.hpp>
#include <pybind11/stl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <torch/csrc/utils/pybind.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace {

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

// algorithms.py's ALGORITHMS, in its order
enum Algorithm : int { kAuto = 0, kOneshot, kRecursiveDoubling, kSharded, kHalvingDoubling, kRing };

int log2_floor(long n) { return 63 - __builtin_clzl(static_cast<unsigned long>(n)); }

// algorithms.py's allreduce_cost: the model's time, in bytes of link time
long allreduce_cost(int algorithm, long nbytes, long hosts, const HostRules& rules) {
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
int inter_host_algorithm(long nbytes, long hosts, const HostRules& rules) {
  if (rules.forced != kAuto) return rules.forced;
  if (hosts >= 3 && nbytes / hosts >= rules.ring_round) return kRing;
  int best = kOneshot;
  for (int algorithm : {kRecursiveDoubling, kSharded, kHalvingDoubling})
    if (allreduce_cost(algorithm, nbytes, hosts, rules) < allreduce_cost(best, nbytes, hosts, rules)) best = algorithm;
  return best;
}

// selection.py's ceil_log2 and allgather_cost (kOneshot, kBruck or kRing)
constexpr int kBruck = kRing + 1;
long ceil_log2(long hosts) { return hosts > 1 ? log2_floor(hosts - 1) + 1 : 0; }
long allgather_cost(int algorithm, long block_bytes, long hosts, const HostRules& rules) {
  long latency;
  if (algorithm == kOneshot)
    latency = (block_bytes < rules.rounds_from ? 1 : hosts - 1) * rules.alpha + 2 * (hosts - 1) * rules.message;
  else
    latency = (algorithm == kBruck ? ceil_log2(hosts) : hosts - 1) * (rules.alpha + 2 * rules.message);
  return latency + (hosts - 1) * block_bytes;
}

// selection.py's allgather_algorithm
int allgather_algorithm(long block_bytes, long hosts, const HostRules& rules) {
  if (hosts >= 3 && block_bytes >= rules.ring_round) return kRing;
  return allgather_cost(kBruck, block_bytes, hosts, rules) < allgather_cost(kOneshot, block_bytes, hosts, rules) ? kBruck
                                                                                                            : kOneshot;
}

// selection.py's BROADCAST_ALGORITHMS, broadcast_cost and broadcast_algorithm
enum BroadcastAlgorithm : int { kBinomial = 0, kScatterAllgather };
long broadcast_cost(int algorithm, long nbytes, long hosts, const HostRules& rules) {
  long rounds = ceil_log2(hosts) * (rules.alpha + 2 * rules.message);
  if (algorithm == kBinomial) return rounds + ceil_log2(hosts) * nbytes;
  long block = (nbytes + hosts - 1) / hosts;
  return rounds + (hosts - 1) * block + allgather_cost(allgather_algorithm(block, hosts, rules), block, hosts, rules);
}
int broadcast_algorithm(long nbytes, long hosts, const HostRules& rules) {
  return broadcast_cost(kScatterAllgather, nbytes, hosts, rules) < broadcast_cost(kBinomial, nbytes, hosts, rules)
             ? kScatterAllgather
             : kBinomial;
}

// algorithms.py's folded_rank and host_of_folded: host 2i+1 folds into host 2i for i < hosts - p
int folded_rank(int node, int hosts) {
  int extra = hosts - (1 << log2_floor(hosts));
  if (node < 2 * extra) return node % 2 ? -1 : node / 2;
  return node - extra;
}
int host_of_folded(int rank, int hosts) {
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

// calls.py DTYPES index (the record) and smddp_native.c's dtype code (the kernels; -1: not reduced here)
struct DtypeCodes {
  uint32_t record;
  int kernel;
};

bool dtype_codes(at::ScalarType type, DtypeCodes& out) {
  switch (type) {
    case at::kFloat: out = {1, 0}; return true;
    case at::kDouble: out = {2, 1}; return true;
    case at::kHalf: out = {3, 2}; return true;
    case at::kBFloat16: out = {4, 3}; return true;
    case at::kByte: out = {5, 6}; return true;
    case at::kChar: out = {6, 7}; return true;
    case at::kShort: out = {7, 8}; return true;
    case at::kInt: out = {8, 4}; return true;
    case at::kLong: out = {9, 5}; return true;
    case at::kBool: out = {10, -1}; return true;
    default: return false;
  }
}

// smddp_native.c's op code for a ReduceOp, or -1 where the Python path reduces (bitwise ops)
constexpr int kFloatKernel = 0;  // smddp_native.c's code of float32
constexpr int kAverage = 4;  // OP_AVG: the sum divided by the sources, in the same pass (floats only)
int kernel_op(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MIN: return 2;
    case c10d::ReduceOp::MAX: return 3;
    case c10d::ReduceOp::AVG: return kAverage;
    default: return -1;
  }
}

bool plain_cpu(const at::Tensor& t) { return t.device().is_cpu() && t.is_contiguous() && !t.is_sparse(); }

long nbytes_of(const at::Tensor& t) { return static_cast<long>(t.numel()) * static_cast<long>(t.element_size()); }

bool overlap(const at::Tensor& a, const at::Tensor& b) {
  auto* a0 = static_cast<char*>(a.data_ptr());
  auto* b0 = static_cast<char*>(b.data_ptr());
  return a0 < b0 + nbytes_of(b) && b0 < a0 + nbytes_of(a);
}

// Fills length bytes at target from address in process pid (process_vm_readv, one copy); 0 or the errno
// (memory.py's read_process).
int read_process(pid_t pid, char* target, const char* address, long length) {
  while (length > 0) {
    iovec local{target, static_cast<size_t>(length)};
    iovec remote{const_cast<char*>(address), static_cast<size_t>(length)};
    ssize_t moved = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (moved <= 0) {
      int error = moved < 0 ? errno : EFAULT;
      if (error != EINTR) return error;
      continue;
    }
    target += moved;
    address += moved;
    length -= moved;
  }
  return 0;
}

void plain_copy(char* target, const char* source, long length) { std::memmove(target, source, length); }

// memcpy with non-temporal stores (x86-64) for results larger than the caches: the destination's lines are
// written without first being read for ownership, and evict nothing (32 MB here: 2.3 ms of CPU, memcpy 3.8).
// kAlsoToSlot: source also goes to slot (plain stores) in the same pass, so that an all_gather's own piece is
// read once for the rank's slot and its own part of the result (64 MB, 2 ranks: 9.4 against 14.9 ms).
template <bool kAlsoToSlot>
void stream_copy_lines(char* target, [[maybe_unused]] char* slot, const char* source, long length) {
  auto copy = [&](long at, long bytes) {
    std::memcpy(target + at, source + at, bytes);
    if constexpr (kAlsoToSlot) std::memcpy(slot + at, source + at, bytes);
  };
#if defined(__x86_64__)
  long head = std::min(length, static_cast<long>((16 - reinterpret_cast<uintptr_t>(target) % 16) % 16));
  copy(0, head);
  long at = head;
  for (; at + 64 <= length; at += 64) {
    auto* from = reinterpret_cast<const __m128i*>(source + at);
    __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1), c = _mm_loadu_si128(from + 2),
            d = _mm_loadu_si128(from + 3);
    if constexpr (kAlsoToSlot) {
      auto* copy_to = reinterpret_cast<__m128i*>(slot + at);
      _mm_storeu_si128(copy_to, a);
      _mm_storeu_si128(copy_to + 1, b);
      _mm_storeu_si128(copy_to + 2, c);
      _mm_storeu_si128(copy_to + 3, d);
    }
    auto* to = reinterpret_cast<__m128i*>(target + at);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  _mm_sfence();  // the streamed lines are visible to the peers (and ordered) before the next barrier
  copy(at, length - at);
#else
  copy(0, length);
#endif
}

void stream_copy(char* target, const char* source, long length) { stream_copy_lines<false>(target, nullptr, source, length); }

// A finished collective: its future (DDP's reducer reads the value) is made only when asked for.
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> result) : result_(std::move(result)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(result_));
    return future;
  }

 private:
  std::vector<at::Tensor> result_;
};

}  // namespace

class SmddpCore : public c10d::PyProcessGroup {
 public:
  using c10d::PyProcessGroup::PyProcessGroup;

  // Set by the Python group once its arena is up (one host, native kernels); addresses are the Python
  // side's counters and record, so both paths number and tag collectives alike.
  void attach(uintptr_t base, int n, int index, long slot_bytes, uintptr_t slots0, uintptr_t slots1,
              uintptr_t counters, uintptr_t record, uintptr_t barrier_fn, uintptr_t allreduce_fn, uintptr_t reduce_fn,
              long calm_spin_ns, long loaded_spin_ns, long blocking_spin_ns, int cores, long slice_ns, long symmetric_limit,
              long single_copy_from, long streamed_from) {
    base_ = reinterpret_cast<char*>(base);
    n_ = n;
    index_ = index;
    slot_bytes_ = slot_bytes;
    slots_[0] = reinterpret_cast<void* const*>(slots0);
    slots_[1] = reinterpret_cast<void* const*>(slots1);
    counters_ = reinterpret_cast<uint32_t*>(counters);
    record_ = reinterpret_cast<uint32_t*>(record);
    barrier_ = reinterpret_cast<BarrierFn>(barrier_fn);
    allreduce_ = reinterpret_cast<AllreduceFn>(allreduce_fn);
    reduce_ = reinterpret_cast<ReduceFn>(reduce_fn);
    calm_spin_ns_ = spin_ns_ = calm_spin_ns;
    loaded_spin_ns_ = loaded_spin_ns;
    blocking_spin_ns_ = blocking_spin_ns;
    cores_ = cores;
    slice_ns_ = slice_ns;
    symmetric_limit_ = symmetric_limit;
    single_copy_from_ = single_copy_from;
    streamed_from_ = streamed_from;
  }

  // Set by the Python group of a group across hosts, before attach: every host's group ranks (the leader
  // first), this host's index, whether this rank leads it (and holds the connections: fds[h] to host h's
  // leader, -1 for its own), the mesh's call header (TcpMesh.header; 0 where this rank leads no host),
  // the kernels' exchange loop and reduction, algorithms.py's rules and the check slice.
  void attach_hosts(std::vector<std::vector<int>> nodes, int node, bool leader, std::vector<int> fds, uintptr_t header,
                    uintptr_t exchange_fn, uintptr_t reduce_fn, long alpha, long message, long ring_round,
                    long oneshot_chunk, long pipeline_chunk, long rounds_from, int forced, long slice_ns) {
    nodes_ = std::move(nodes);
    node_ = node;
    hosts_ = static_cast<int>(nodes_.size());
    leader_ = leader;
    fds_ = std::move(fds);
    header_ = reinterpret_cast<uint32_t*>(header);
    exchange_ = reinterpret_cast<ExchangeFn>(exchange_fn);
    reduce_ = reinterpret_cast<ReduceFn>(reduce_fn);
    rules_ = {alpha, message, ring_round, oneshot_chunk, pipeline_chunk, rounds_from, forced};
    slice_ns_ = slice_ns;
  }

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

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    DtypeCodes codes;
    if (tensors.size() == 1 && !opts.asyncOp && reduces_here() && plain_cpu(tensors[0])) {
      at::Tensor& x = tensors[0];
      int op = reducible(x, opts.reduceOp, codes);
      if (op >= 0 && x.numel() > 0 && claim_inline()) {
        Claim claim(this);
        tag(kAllReduce, codes.record, x.numel(), kNoRoot, static_cast<uint32_t>(opts.reduceOp.op_) + 1);
        reduce_everywhere(x, codes.kernel, op);
        return c10::make_intrusive<DoneWork>(tensors);
      }
    }
    return python("_python_allreduce", tensors, opts);
  }

  // The Python group's worker (async calls, and calls queued behind one) runs its all_reduces here too;
  // the call is numbered and tagged already. False where the Python path must run it.
  bool run_allreduce(at::Tensor& x, int64_t reduce_op) {
    DtypeCodes codes;
    int op = reducible(x, c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(reduce_op)), codes);
    if (op < 0 || !reduces_here() || !plain_cpu(x) || x.numel() == 0) return false;
    pybind11::gil_scoped_release no_gil;
    reduce_everywhere(x, codes.kernel, op);
    return true;
  }

  // communicator.py's allreduce_shared calls this on a host leader for the step between hosts (smddp's
  // DDP), numbered and tagged already: InterHostAllreduce.run on x as it is. False where Python must run it.
  bool run_between_hosts(at::Tensor& x, int64_t reduce_op) {
    DtypeCodes codes;
    int op = reducible(x, c10d::ReduceOp(static_cast<c10d::ReduceOp::RedOpType>(reduce_op)), codes);
    if (op < 0 || !across_hosts() || !leader_ || !plain_cpu(x) || x.numel() == 0) return false;
    pybind11::gil_scoped_release no_gil;
    start_call("all_reduce (shared buffer)");
    between_hosts(static_cast<char*>(x.data_ptr()), x.numel(), x.element_size(), codes.kernel, op);
    return true;
  }

  // This rank's segment of the reduction of input (n segments), in chunks that fit a slot: peers'
  // segments staged in the own slot, one barrier, the own segment reduced from every slot into output.
  // Across hosts as communicator.py's reduce_scatter: all_reduce a copy, keep the own segment.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override {
    DtypeCodes codes;
    int op = reducible(input, opts.reduceOp, codes);
    if (op >= 0 && !opts.asyncOp && across_hosts() && plain_cpu(input) && output.scalar_type() == input.scalar_type() &&
        input.numel() == output.numel() * getSize() &&
        reduce_scatter_hosts(kReduceScatterTensor, output, [&] { return input.clone(); }, output.numel(),
                             output.numel() * getRank(), codes, op, opts))
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output});
    if (op >= 0 && !opts.asyncOp && usable() && plain_cpu(input) && plain_cpu(output) &&
        output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * n_ && output.numel() > 0 &&
        !overlap(input, output) && claim_inline()) {
      Claim claim(this);
      tag(kReduceScatterTensor, codes.record, output.numel(), kNoRoot, static_cast<uint32_t>(opts.reduceOp.op_) + 1);
      long esize = output.element_size();
      long k = output.numel();
      long step = std::max(1L, slot_bytes_ / (n_ * esize));
      auto* in = static_cast<char*>(input.data_ptr());
      auto* out = static_cast<char*>(output.data_ptr());
      std::vector<void*> sources(n_);
      for (long c = 0; c < k; c += step) {
        long length = std::min(step, k - c);
        long bytes = length * esize;
        uint32_t half = next_half();
        auto* mine = static_cast<char*>(slots_[half][index_]);
        for (int j = 0; j < n_; j++)
          if (j != index_) std::memcpy(mine + j * bytes, in + (j * k + c) * esize, bytes);
        sync("reduce_scatter_tensor");
        for (int i = 0; i < n_; i++)
          sources[i] = i == index_ ? in + (index_ * k + c) * esize : static_cast<char*>(slots_[half][i]) + index_ * bytes;
        reduce_(codes.kernel, op, out + c * esize, sources.data(), n_, length);
      }
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output});
    }
    return python("_python_reduce_scatter_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    if (!opts.asyncOp && (usable() || across_hosts()) && claim_inline()) {
      Claim claim(this);
      tag(kBarrier, 0, 0, kNoRoot, 0);
      if (hosts_ == 1)
        sync("barrier");
      else
        barrier_hosts();
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>());
    }
    return python("_python_barrier", opts);
  }

  // The root's bytes through its slot, a slot at a time; across hosts from the root's host leader too.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    DtypeCodes codes;
    if (tensors.size() == 1 && !opts.asyncOp && (usable() || across_hosts()) && plain_cpu(tensors[0]) &&
        dtype_codes(tensors[0].scalar_type(), codes) && rooted(opts.rootRank) &&
        tensors[0].numel() > 0 && claim_inline()) {
      Claim claim(this);
      at::Tensor& x = tensors[0];
      int root = static_cast<int>(opts.rootRank);
      tag(kBroadcast, codes.record, x.numel(), static_cast<uint32_t>(root), 0);
      broadcast_everywhere(root, {static_cast<char*>(x.data_ptr()), nbytes_of(x)}, "broadcast");
      return c10::make_intrusive<DoneWork>(tensors);
    }
    return python("_python_broadcast", tensors, opts);
  }

  // process_group.py's reduce: an all_reduce, in place on the root and of a copy elsewhere. Not while
  // SageMaker's check is on (mode 2): AWS's SMDDP offers no reduce, gather or scatter, and Python says so.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    DtypeCodes codes;
    if (tensors.size() == 1 && !opts.asyncOp && mode() == 1 && reduces_here() && plain_cpu(tensors[0]) &&
        rooted(opts.rootRank)) {
      at::Tensor& x = tensors[0];
      int op = reducible(x, opts.reduceOp, codes);
      if (op >= 0 && x.numel() > 0 && claim_inline()) {
        Claim claim(this);
        tag(kReduce, codes.record, x.numel(), static_cast<uint32_t>(opts.rootRank), static_cast<uint32_t>(opts.reduceOp.op_) + 1);
        at::Tensor work = opts.rootRank == getRank() ? x : x.clone();
        check_hosts("reduce");
        reduce_everywhere(work, codes.kernel, op, "reduce");
        return c10::make_intrusive<DoneWork>(tensors);
      }
    }
    return python("_python_reduce", tensors, opts);
  }

  // process_group.py's scatter: the root's inputs, concatenated, broadcast; each rank keeps its row.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    DtypeCodes codes;
    bool is_root = opts.rootRank == getRank();
    if (outputs.size() == 1 && !opts.asyncOp && mode() == 1 && (usable() || across_hosts()) && plain_cpu(outputs[0]) &&
        dtype_codes(outputs[0].scalar_type(), codes) && outputs[0].numel() > 0 && rooted(opts.rootRank) &&
        (!is_root || (inputs.size() == 1 && one_per_rank(inputs[0], outputs[0]))) && claim_inline()) {
      Claim claim(this);
      at::Tensor& out = outputs[0];
      tag(kScatter, codes.record, out.numel(), static_cast<uint32_t>(opts.rootRank), 0);
      at::Tensor whole = is_root ? flat_cat(inputs[0]) : at::empty({out.numel() * getSize()}, out.options());
      broadcast_everywhere(static_cast<int>(opts.rootRank), {static_cast<char*>(whole.data_ptr()), nbytes_of(whole)}, "scatter");
      std::memcpy(out.data_ptr(), static_cast<char*>(whole.data_ptr()) + getRank() * nbytes_of(out), nbytes_of(out));
      return c10::make_intrusive<DoneWork>(outputs);
    }
    return python("_python_scatter", outputs, inputs, opts);
  }

  // process_group.py's gather: an all_gather whose result only the root keeps.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    bool is_root = opts.rootRank == getRank();
    if (inputs.size() == 1 && mode() == 1 && gatherable(inputs[0], opts.asyncOp) && rooted(opts.rootRank) &&
        (!is_root || (outputs.size() == 1 && one_per_rank(outputs[0], inputs[0])))) {
      const at::Tensor& x = inputs[0];
      at::Tensor discarded = is_root ? at::Tensor() : at::empty({x.numel() * getSize()}, x.options());
      std::vector<char*> targets;
      for (int i = 0; i < getSize(); i++)
        targets.push_back(is_root ? static_cast<char*>(outputs[0][i].data_ptr())
                                  : static_cast<char*>(discarded.data_ptr()) + i * nbytes_of(x));
      if (gather(kGather, x, targets, static_cast<uint32_t>(opts.rootRank)))
        return c10::make_intrusive<DoneWork>(is_root ? outputs[0] : std::vector<at::Tensor>());
    }
    return python("_python_gather", outputs, inputs, opts);
  }

  // torch's trampoline (PyProcessGroup) finds Python overrides only on instances of ProcessGroup itself,
  // not of a C++ subclass such as this one; so every method it forwards is forwarded again here.
  const std::string getBackendName() const override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("getBackendName")) return method().cast<std::string>();
    return c10d::ProcessGroup::getBackendName();
  }
  void abort() override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("abort")) method();
  }
  const std::string& getGroupName() const override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("getGroupName")) {
      group_name_ = method().cast<std::string>();  // returned by reference: kept here
      return group_name_;
    }
    return c10d::ProcessGroup::getGroupName();
  }
  void setGroupName(const std::string& name) override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("setGroupName")) method(name);
  }
  const std::string& getGroupDesc() const override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("getGroupDesc")) {
      group_desc_ = method().cast<std::string>();
      return group_desc_;
    }
    return c10d::ProcessGroup::getGroupDesc();
  }
  void setGroupDesc(const std::string& desc) override {
    pybind11::gil_scoped_acquire gil;
    if (auto method = python_override("setGroupDesc")) method(desc);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return python("allreduce_coalesced", tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override {
    return python("all_gather_single_coalesced", outputs, inputs, opts);
  }
  // Across hosts: communicator.py's all_to_all (sizes to every rank, then the bytes; the leaders pairwise).
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& output_splits,
                                                   std::vector<int64_t>& input_splits,
                                                   const c10d::AllToAllOptions& opts) override {
    std::vector<Span> outs, ins;
    if (!opts.asyncOp && across_hosts() && plain_cpu(output) && plain_cpu(input) &&
        output.scalar_type() == input.scalar_type() && split_rows(output, output_splits, outs) &&
        split_rows(input, input_splits, ins) && to_all(kAllToAllSingle, outs, ins))
      return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output});
    return python("_python_all_to_all_single", output, input, output_splits, input_splits, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    auto spans = [](const std::vector<at::Tensor>& tensors, std::vector<Span>& out) {
      for (const at::Tensor& t : tensors) {
        if (!plain_cpu(t)) return false;
        out.push_back({static_cast<char*>(t.data_ptr()), nbytes_of(t)});
      }
      return true;
    };
    std::vector<Span> outs, ins;
    size_t size = static_cast<size_t>(getSize());
    if (!opts.asyncOp && across_hosts() && outputs.size() == size && inputs.size() == size && spans(outputs, outs) &&
        spans(inputs, ins) && to_all(kAllToAll, outs, ins))
      return c10::make_intrusive<DoneWork>(outputs);
    return python("_python_alltoall", outputs, inputs, opts);
  }
  // The list form across hosts: one output, one input per rank of the output's dtype (this rank's of its
  // size, the others' of any), concatenated and reduced as process_group.py does.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    DtypeCodes codes;
    if (outputs.size() == 1 && inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()) &&
        !opts.asyncOp && across_hosts()) {
      at::Tensor& output = outputs[0];
      std::vector<at::Tensor>& parts = inputs[0];
      long total = 0, before = 0;  // elements of all inputs, and of those ahead of this rank's segment
      bool alike = true;
      for (int i = 0; i < getSize(); i++) {
        const at::Tensor& part = parts[i];
        alike = alike && part.device().is_cpu() && !part.is_sparse() && part.scalar_type() == output.scalar_type();
        before += i < getRank() ? part.numel() : 0;
        total += part.numel();
      }
      int op = alike && parts[getRank()].numel() == output.numel() ? reducible(output, opts.reduceOp, codes) : -1;
      if (op >= 0 && reduce_scatter_hosts(kReduceScatter, output, [&] { return flat_cat(parts); }, total, before, codes, op, opts))
        return c10::make_intrusive<DoneWork>(outputs);
    }
    return python("_python_reduce_scatter", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    return python("reduce_scatter_single_coalesced", outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return python("send", tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return python("recv", tensors, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    if (inputs.size() == 1 && outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()) &&
        gatherable(inputs[0], opts.asyncOp)) {
      const at::Tensor& x = inputs[0];
      std::vector<char*> targets;
      for (auto& out : outputs[0]) {
        if (!plain_cpu(out) || out.scalar_type() != x.scalar_type() || out.numel() != x.numel())
          return python("_python_allgather", outputs, inputs, opts);
        targets.push_back(static_cast<char*>(out.data_ptr()));
      }
      if (gather(kAllGather, x, targets)) return c10::make_intrusive<DoneWork>(outputs[0]);
    }
    return python("_python_allgather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override {
    if (gatherable(input, opts.asyncOp) && plain_cpu(output) && output.scalar_type() == input.scalar_type() &&
        output.numel() == input.numel() * getSize()) {
      std::vector<char*> targets;
      long nbytes = nbytes_of(input);
      for (int i = 0; i < getSize(); i++) targets.push_back(static_cast<char*>(output.data_ptr()) + i * nbytes);
      if (gather(kAllGatherIntoTensor, input, targets)) return c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output});
    }
    return python("_python_all_gather_single", output, input, opts);
  }

 private:
  // Counts a call the core runs and releases the inline claim however the call ends; while it runs, the
  // caller's thread waits in it (spin(): the blocking budget).
  struct Claim {
    explicit Claim(SmddpCore* core) : core_(core) {
      core_->calls_++;
      core_->blocking_ = true;
    }
    ~Claim() {
      core_->blocking_ = false;
      core_->end_job();
    }
    SmddpCore* core_;
  };

  // The Python implementation of a collective, as torch's trampoline would call an override.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> python(const char* method, Args&... args) {
    pybind11::gil_scoped_acquire gil;
    pybind11::function implementation = pybind11::get_override(static_cast<const SmddpCore*>(this), method);
    TORCH_CHECK(implementation, "smddp: the Python group defines no ", method);
    return c10::make_intrusive<c10d::PyProcessGroup::PyWorkHolder>(implementation(args...));
  }

  // A Python override of a non-collective method, if the group defines one.
  pybind11::function python_override(const char* method) const {
    return pybind11::get_override(static_cast<const SmddpCore*>(this), method);
  }

  // The one-host collectives: a one-host group with its arena attached.
  bool usable() const { return base_ != nullptr && hosts_ == 1 && mode() != 0; }
  // all_reduce: those, or any group across hosts.
  bool reduces_here() const { return usable() || across_hosts(); }

  // The kernel op for reducing x with op here (dtype codes in codes), or -1 where Python reduces: bitwise
  // ops, bool and other dtypes the kernels lack, anything but SUM while SageMaker's rules apply, and AVG
  // of integers on one host (there the kernels divide by the host's ranks, which are then the whole
  // group, as they sum floats; across hosts reduce_everywhere sums and divides once).
  int reducible(const at::Tensor& x, const c10d::ReduceOp& op, DtypeCodes& codes) const {
    if (mode() != 1 && op.op_ != c10d::ReduceOp::SUM) return -1;
    if (!dtype_codes(x.scalar_type(), codes) || codes.kernel < 0) return -1;
    int kernel = kernel_op(op.op_);
    if (kernel == kAverage && hosts_ == 1 && !at::isFloatingType(x.scalar_type())) return -1;
    return kernel;
  }

  bool across_hosts() const { return hosts_ > 1 && exchange_ != nullptr && mode() != 0; }

  bool gatherable(const at::Tensor& x, bool async_op) const {
    DtypeCodes codes;
    long nbytes = nbytes_of(x);
    return !async_op && (usable() || across_hosts()) && plain_cpu(x) && dtype_codes(x.scalar_type(), codes) &&
           nbytes > 0;
  }

  bool rooted(int64_t root) const { return root >= 0 && root < getSize(); }

  // One contiguous CPU tensor per group rank, each of like's dtype and size.
  bool one_per_rank(const std::vector<at::Tensor>& tensors, const at::Tensor& like) const {
    return tensors.size() == static_cast<size_t>(getSize()) && std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
             return plain_cpu(t) && t.scalar_type() == like.scalar_type() && t.numel() == like.numel();
           });
  }

  static at::Tensor flat_cat(const std::vector<at::Tensor>& parts) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& part : parts) flat.push_back(part.reshape(-1));
    return at::cat(flat);
  }

  // communicator.py's reduce_scatter across hosts: the whole input reduced everywhere (on a copy made by
  // flat), this rank's segment (from element start) kept; false where it is not for the core or not
  // claimed. count: the call record's elements (process_group.py's: the output's, or a list's inputs').
  template <typename Flat>
  bool reduce_scatter_hosts(CallOp call, at::Tensor& output, Flat flat, long count, long start, const DtypeCodes& codes,
                            int op, const c10d::ReduceScatterOptions& opts) {
    if (!plain_cpu(output) || output.numel() == 0 || !claim_inline()) return false;
    Claim claim(this);
    tag(call, codes.record, count, kNoRoot, static_cast<uint32_t>(opts.reduceOp.op_) + 1);
    at::Tensor whole = flat();
    reduce_everywhere(whole, codes.kernel, op, call == kReduceScatter ? "reduce_scatter" : "reduce_scatter_tensor");
    std::memcpy(output.data_ptr(), static_cast<char*>(whole.data_ptr()) + start * output.element_size(), nbytes_of(output));
    return true;
  }

  // Every rank's input into its target (targets by group rank, this rank's included); false if not claimed.
  // Across hosts as communicator.py's allgather: within the host, between leaders, then the leader hands
  // the other hosts' parts to the host's ranks.
  bool gather(CallOp op, const at::Tensor& x, const std::vector<char*>& targets, uint32_t root = kNoRoot) {
    if (!claim_inline()) return false;
    Claim claim(this);
    DtypeCodes codes;
    dtype_codes(x.scalar_type(), codes);
    tag(op, codes.record, x.numel(), root, 0);
    const char* what = op == kAllGather ? "all_gather" : op == kGather ? "gather" : "all_gather_into_tensor";
    if (op == kGather) check_hosts(what);
    start_call(what);
    std::vector<Span> spans;
    for (char* target : targets) spans.push_back({target, nbytes_of(x)});
    gather_everywhere(static_cast<char*>(x.data_ptr()), spans, what);
    return true;
  }

  // communicator.py's allgather: every rank's bytes into its target (by group rank; lengths may differ,
  // this rank's is data's): within the host, between the leaders, then the leader hands the other hosts'
  // parts to the host's ranks.
  void gather_everywhere(char* data, const std::vector<Span>& targets, const char* what) {
    if (hosts_ == 1) {
      gather_in_host(data, targets, what);
      return;
    }
    std::vector<Span> mine;  // this host's ranks' targets, in local order
    for (int rank : nodes_[node_]) mine.push_back(targets[rank]);
    gather_in_host(data, mine, what);
    if (leader_) {
      Spans blocks(hosts_);
      for (int h = 0; h < hosts_; h++)
        for (int rank : nodes_[h]) blocks[h].push_back(targets[rank]);
      allgather_blocks(blocks);
    }
    if (base_) {  // the other hosts' parts, in group rank order
      std::vector<bool> here(targets.size(), false);
      for (int rank : nodes_[node_]) here[rank] = true;
      std::vector<Span> remote;
      for (size_t rank = 0; rank < targets.size(); rank++)
        if (!here[rank]) remote.push_back(targets[rank]);
      broadcast_spans(0, remote, what);
    }
  }

  // local.py's allgather: every local rank's bytes into targets (local order; lengths may differ, this
  // rank's is data's): read from the peers' memory (single copy), or a slot at a time up to the longest,
  // the result written with non-temporal stores once the gathered bytes reach streamed_from_.
  void gather_in_host(char* data, const std::vector<Span>& targets, const char* what) {
    const Span& own = targets[index_];
    bool apart = data + own.length <= own.data || own.data + own.length <= data;
    if (!apart && own.data != data) std::memmove(own.data, data, own.length);  // overlapping: once, up front
    bool copy_own = apart && base_;  // else done: in place, moved above, or alone on the host
    if (!base_) {
      if (apart) std::memcpy(own.data, data, own.length);
      return;
    }
    long longest = 0, gathered = 0;
    for (const Span& target : targets) {
      longest = std::max(longest, target.length);
      gathered += target.length;
    }
    bool streamed = gathered >= streamed_from_;  // local.py's allgather: the same rule
    auto copy = streamed ? stream_copy : plain_copy;
    if (longest >= single_copy_from_ && !streamed && single_copy()) {
      if (copy_own) copy(own.data, data, own.length);
      std::vector<Read> reads;
      for (int i = 0; i < n_; i++)
        if (i != index_ && targets[i].length > 0) reads.push_back({i, targets[i]});
      if (single_copy_read(data, reads, what)) return;
    }
    for (long start = 0; start < longest; start += slot_bytes_) {
      uint32_t half = next_half();
      long piece = std::clamp(own.length - start, 0L, slot_bytes_);
      char* slot = static_cast<char*>(slots_[half][index_]);
      if (piece > 0 && copy_own && streamed) {
        stream_copy_lines<true>(own.data + start, slot, data + start, piece);
      } else if (piece > 0) {
        std::memcpy(slot, data + start, piece);
        if (copy_own) copy(own.data + start, data + start, piece);  // rereads the piece from cache
      }
      sync(what);
      for (int i = 0; i < n_; i++) {
        long length = std::clamp(targets[i].length - start, 0L, slot_bytes_);
        if (i != index_ && length > 0) copy(targets[i].data + start, static_cast<const char*>(slots_[half][i]), length);
      }
    }
  }

  // process_group.py's _all_to_all and communicator.py's all_to_all: outs[r] receives what rank r sends
  // this rank, ins[r] goes to rank r; false if not claimed.
  bool to_all(CallOp op, const std::vector<Span>& outs, const std::vector<Span>& ins) {
    if (mode() != 1 || !claim_inline()) return false;  // as reduce: SageMaker's check speaks for each call
    Claim claim(this);
    tag(op, 0, 0, kNoRoot, 0);  // sizes may differ between ranks: count 0 (calls.py)
    const char* what = op == kAllToAll ? "all_to_all" : "all_to_all_single";
    start_call(what);
    int size = getSize(), me = getRank();
    // every rank's sizes (what it sends each rank, then what it expects from each), checked alike everywhere
    std::vector<int64_t> table(2L * size * size), sizes;
    for (const std::vector<Span>* side : {&ins, &outs})
      for (const Span& span : *side) sizes.push_back(span.length);
    std::vector<Span> rows;
    for (int r = 0; r < size; r++) rows.push_back({reinterpret_cast<char*>(&table[2L * size * r]), 2L * size * 8});
    gather_everywhere(reinterpret_cast<char*>(sizes.data()), rows, what);
    auto bytes = [&](int source, int target) { return table[2L * size * source + target]; };
    for (int s = 0; s < size; s++)
      for (int t = 0; t < size; t++)
        if (bytes(s, t) != table[2L * size * t + size + s]) {
          pybind11::gil_scoped_acquire gil;
          call_python("_all_to_all_mismatch", s, t, bytes(s, t), table[2L * size * t + size + s]);
          TORCH_CHECK(false, "smddp: _all_to_all_mismatch returned");
        }
    // within the host: every rank's whole input to every local rank
    std::vector<char*> blobs(size, nullptr);
    std::vector<Span> local;
    for (int r : nodes_[node_]) {
      long length = 0;
      for (int t = 0; t < size; t++) length += bytes(r, t);
      blobs[r] = r == me ? blob(ins) : scratch(-2 - r, length);
      local.push_back({blobs[r], length});
    }
    gather_in_host(blobs[me], local, what);
    auto part = [&](int source, int target) {
      long start = 0;
      for (int t = 0; t < target; t++) start += bytes(source, t);
      return Span{blobs[source] + start, bytes(source, target)};
    };
    for (int s : nodes_[node_]) std::memcpy(outs[s].data, part(s, me).data, outs[s].length);
    if (hosts_ == 1) return true;
    // between hosts: the leaders pairwise (round k: to host h+k, from h-k), what this host's ranks send
    // the other's in (source, target) order; the leader's inbox (from each host in order) to the host
    std::vector<long> box(hosts_ + 1, 0);  // inbox offsets by host (this host's: empty)
    for (int h = 0; h < hosts_; h++) {
      box[h + 1] = box[h];
      if (h != node_)
        for (int s : nodes_[h])
          for (int d : nodes_[node_]) box[h + 1] += bytes(s, d);
    }
    char* inbox = scratch(-1 - size - 2, box[hosts_]);
    if (leader_)
      for (int shift = 1; shift < hosts_; shift++) {
        int to = (node_ + shift) % hosts_, from = (node_ - shift + hosts_) % hosts_;
        Spans sends(hosts_), recvs(hosts_);
        for (int s : nodes_[node_])
          for (int d : nodes_[to]) sends[to].push_back(part(s, d));
        recvs[from] = {{inbox + box[from], box[from + 1] - box[from]}};
        exchange(sends, recvs);
      }
    if (base_) broadcast_spans(0, {{inbox, box[hosts_]}}, what);
    for (int h = 0; h < hosts_; h++) {
      long at = box[h];
      if (h != node_)
        for (int s : nodes_[h])
          for (int d : nodes_[node_]) {
            if (d == me) std::memcpy(outs[s].data, inbox + at, outs[s].length);
            at += bytes(s, d);
          }
    }
    return true;
  }

  // The input spans as one stream: in place where they already are one, else copied into scratch.
  char* blob(const std::vector<Span>& spans) {
    bool consecutive = true;
    for (size_t i = 1; i < spans.size(); i++) consecutive = consecutive && spans[i].data == spans[i - 1].data + spans[i - 1].length;
    if (consecutive && !spans.empty()) return spans[0].data;
    char* stream = scratch(-2 - getRank(), total(spans));
    copy_stream(spans, 0, total(spans), stream, true);
    return stream;
  }

  // all_to_all_single's rows per rank (the given splits, else dim 0 cut evenly) as spans of t; false where
  // the splits do not fit (the Python path reports it).
  bool split_rows(const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<Span>& spans) const {
    int size = getSize();
    if (t.dim() == 0) return false;
    int64_t rows = t.size(0), row_bytes = rows ? nbytes_of(t) / rows : 0;
    std::vector<int64_t> counts = splits;
    if (counts.empty()) {
      if (rows % size) return false;
      counts.assign(size, rows / size);
    }
    int64_t sum = 0;
    for (int64_t count : counts) sum += count < 0 ? rows + 1 : count;
    if (static_cast<int>(counts.size()) != size || sum != rows) return false;
    auto* at = static_cast<char*>(t.data_ptr());
    for (int64_t count : counts) {
      spans.push_back({at, count * row_bytes});
      at += count * row_bytes;
    }
    return true;
  }

  // algorithms.py's allgather_between_hosts: all-to-all (in rounds when large), bruck, or the ring, every
  // block (blocks[h]: host h's spans, this host's filled in) received straight into its place.
  void allgather_blocks(const Spans& blocks) {
    long largest = 0;
    for (int h = 0; h < hosts_; h++) largest = std::max(largest, total(blocks[h]));
    auto block = [&](int h) -> const std::vector<Span>& { return blocks[((h % hosts_) + hosts_) % hosts_]; };
    int algorithm = allgather_algorithm(largest, hosts_, rules_);
    if (algorithm == kOneshot) {
      Spans sends(hosts_), recvs(hosts_);
      for (int h = 0; h < hosts_; h++)
        if (h != node_) {
          sends[h] = blocks[node_];
          recvs[h] = blocks[h];
        }
      exchange_in_rounds(sends, recvs);
    } else if (algorithm == kBruck) {
      for (int distance = 1; distance < hosts_; distance *= 2) {  // this host holds node .. node+distance-1
        int count = std::min(distance, hosts_ - distance);
        Spans sends(hosts_), recvs(hosts_);
        std::vector<Span>& out = sends[(node_ - distance + hosts_) % hosts_];
        std::vector<Span>& in = recvs[(node_ + distance) % hosts_];
        for (int i = 0; i < count; i++) {
          out.insert(out.end(), block(node_ + i).begin(), block(node_ + i).end());
          in.insert(in.end(), block(node_ + distance + i).begin(), block(node_ + distance + i).end());
        }
        exchange(sends, recvs);
      }
    } else {
      int to = (node_ + 1) % hosts_, from = (node_ + hosts_ - 1) % hosts_;
      for (int s = 0; s < hosts_ - 1; s++) {
        Spans sends(hosts_), recvs(hosts_);
        sends[to] = block(node_ - s);
        recvs[from] = block(node_ - s - 1);
        exchange(sends, recvs);
      }
    }
  }

  void allreduce_chunks(at::Tensor& x, int dtype, int op) {
    long esize = x.element_size();
    long step = std::max(1L, slot_bytes_ / esize);
    auto* data = static_cast<char*>(x.data_ptr());
    for (long start = 0; start < x.numel(); start += step)
      allreduce_chunk(data + start * esize, std::min(step, x.numel() - start), esize, dtype, op);
  }

  // One chunk of an all_reduce, by the Python path's rule (local.py): up to symmetric_limit every rank
  // reduces every slot (one barrier); above, rank i reduces shard i for all (two barriers).
  void allreduce_chunk(char* x, long count, long esize, int dtype, int op) {
    long nbytes = count * esize;
    void* const* slots = slots_[next_half()];
    if (nbytes <= symmetric_limit_ || count < n_) {  // local.py: a forced algorithm may ask either way
      uint32_t generation = next_generation();
      int status = allreduce_(base_, n_, index_, generation, record_, spin(), slice_ns_, x, nbytes, slots, dtype, op,
                              count);
      if (status != kDone) {  // the kernel stopped at the barrier: Python waits, then we reduce
        finish_in_python("all_reduce", status, generation);
        reduce_(dtype, op, x, slots, n_, count);
      }
      return;
    }
    auto* mine = static_cast<char*>(slots[index_]);
    for (int i = 0; i < n_; i++) {
      if (i == index_) continue;
      auto [lo, hi] = shard(count, i);
      std::memcpy(mine + lo * esize, x + lo * esize, (hi - lo) * esize);
    }
    sync("all_reduce");
    auto [start, stop] = shard(count, index_);
    std::vector<void*> sources(n_);
    for (int i = 0; i < n_; i++) sources[i] = (i == index_ ? x : static_cast<char*>(slots[i])) + start * esize;
    char* result = mine + start * esize;  // not staged above: free to hold this shard's result for the peers
    reduce_(dtype, op, result, sources.data(), n_, stop - start);
    std::memcpy(x + start * esize, result, (stop - start) * esize);
    sync("all_reduce");
    for (int i = 0; i < n_; i++) {
      if (i == index_) continue;
      auto [lo, hi] = shard(count, i);
      std::memcpy(x + lo * esize, static_cast<char*>(slots[i]) + lo * esize, (hi - lo) * esize);
    }
  }

  // local.py's shard_bounds: part i's elements when count is cut into parts (local ranks by default)
  static std::pair<long, long> bounds(long count, int parts, int i) {
    long base = count / parts, extra = count % parts;
    long start = i * base + std::min<long>(i, extra);
    return {start, start + base + (i < extra ? 1 : 0)};
  }
  std::pair<long, long> shard(long count, int i) const { return bounds(count, n_, i); }

  // Local rank root's spans to every local rank as one stream, a slot at a time (local.py's broadcast
  // packs its buffers into slots the same way).
  void broadcast_spans(int root, const std::vector<Span>& spans, const char* what) {
    long length = total(spans);
    if (spans.size() == 1 && length >= single_copy_from_ && single_copy()) {
      std::vector<Read> reads;
      if (index_ != root) reads.push_back({root, spans[0]});
      if (single_copy_read(spans[0].data, reads, what)) return;
    }
    for (long start = 0; start < length; start += slot_bytes_) {
      long piece = std::min(slot_bytes_, length - start);
      auto* slot = static_cast<char*>(slots_[next_half()][root]);
      if (index_ == root) copy_stream(spans, start, piece, slot, true);
      sync(what);
      if (index_ != root) copy_stream(spans, start, piece, slot, false);
    }
  }

  // shm.py's ShmArena.single_copy_read: every rank's source address out through its slot, a barrier, each
  // rank fills its targets straight from the peers' sources, a second barrier (sources stay untouched
  // until read); false when some rank's read was refused (then copied through the slots, from now on).
  struct Read {
    int peer;
    Span target;
  };
  bool single_copy() const { return counters_[kSingleCopyOff] == 0; }
  uint32_t* line_word(int i, int w) const { return reinterpret_cast<uint32_t*>(base_ + i * kLine) + w; }

  bool single_copy_read(char* source, const std::vector<Read>& reads, const char* what) {
    uint32_t half = next_half();
    std::memcpy(slots_[half][index_], &source, sizeof source);
    sync(what);
    int error = 0;
    for (const Read& read : reads) {
      char* address;
      std::memcpy(&address, slots_[half][read.peer], sizeof address);
      auto pid = static_cast<pid_t>(__atomic_load_n(line_word(read.peer, kPidWord), __ATOMIC_RELAXED));
      if ((error = read_process(pid, read.target.data, address, read.target.length))) break;
    }
    __atomic_store_n(line_word(index_, kVerdictWord), static_cast<uint32_t>(error), __ATOMIC_RELAXED);
    sync(what);
    for (int i = 0; i < n_; i++) {
      uint32_t refused = __atomic_load_n(line_word(i, kVerdictWord), __ATOMIC_RELAXED);
      if (refused) {
        pybind11::gil_scoped_acquire gil;
        call_python("_single_copy_refused", static_cast<int>(refused));
        return false;
      }
    }
    return true;
  }

  // Bytes start..start+length of the spans' concatenation into the slot (into_slot) or out of it.
  static void copy_stream(const std::vector<Span>& spans, long start, long length, char* slot, bool into_slot) {
    long at = 0;  // stream offset of the current span
    for (const Span& span : spans) {
      long lo = std::max(start, at), hi = std::min(start + length, at + span.length);
      if (lo < hi) {
        char* mine = span.data + (lo - at);
        char* there = slot + (lo - start);
        std::memcpy(into_slot ? there : mine, into_slot ? mine : there, hi - lo);
      }
      at += span.length;
    }
  }

  void reduce_everywhere(at::Tensor& x, int dtype, int op, const char* what = "all_reduce") {
    if (hosts_ == 1) {
      allreduce_chunks(x, dtype, op);
      return;
    }
    bool average = op == kAverage;  // communicator.py: AVG is a SUM divided once, where it is rounded
    int combine = average ? kernel_op(c10d::ReduceOp::SUM) : op;
    bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
    if (half && (combine == kernel_op(c10d::ReduceOp::SUM) || combine == kernel_op(c10d::ReduceOp::PRODUCT))) {
      // communicator.py: partial results cross hosts in fp32, so the result is rounded once
      at::Tensor wide = x.to(at::kFloat);
      allreduce_hosts(wide, kFloatKernel, combine, what);
      if (average) divide_by_group(wide);
      x.copy_(wide);
    } else {
      allreduce_hosts(x, dtype, combine, what);
      if (average) divide_by_group(x);
    }
  }

  // reduce.py's finish_average: the sum divided by the group size, integers by floor division
  void divide_by_group(at::Tensor& x) {
    if (at::isFloatingType(x.scalar_type()))
      x.div_(getSize());
    else
      x.div_(getSize(), "floor");
  }

  // communicator.py's allreduce across hosts, chunk by chunk: the host's ranks reduce over shared memory,
  // the leaders between hosts, and the leader's result goes to the host's ranks.
  void allreduce_hosts(at::Tensor& x, int dtype, int op, const char* what) {
    start_call(what);
    long esize = x.element_size(), count = x.numel();
    long step = base_ ? std::max(1L, slot_bytes_ / esize) : count;
    auto* data = static_cast<char*>(x.data_ptr());
    for (long start = 0; start < count; start += step) {
      long length = std::min(step, count - start);
      char* piece = data + start * esize;
      if (base_) allreduce_chunk(piece, length, esize, dtype, op);
      if (leader_) between_hosts(piece, length, esize, dtype, op);
      if (base_) broadcast_spans(0, {{piece, length * esize}}, what);
    }
  }

  int node_of(int rank) const {
    for (int h = 0; h < hosts_; h++)
      if (std::find(nodes_[h].begin(), nodes_[h].end(), rank) != nodes_[h].end()) return h;
    TORCH_CHECK(false, "smddp: rank ", rank, " is on no host of the group");
  }

  // Group rank root's bytes to every rank: within the host, or across hosts as below.
  void broadcast_everywhere(int root, Span data, const char* what) {
    if (hosts_ == 1)
      broadcast_spans(root, {data}, what);
    else
      broadcast_hosts(root, data, what);
  }

  // communicator.py's broadcast across hosts: within the root's host, between the leaders
  // (broadcast_between_hosts), within each other host from its leader.
  void broadcast_hosts(int root, Span data, const char* what) {
    start_call(what);
    int root_node = node_of(root);
    bool in_root_node = root_node == node_;
    if (in_root_node && base_) {
      const std::vector<int>& here = nodes_[node_];
      broadcast_spans(static_cast<int>(std::find(here.begin(), here.end(), root) - here.begin()), {data}, what);
    }
    if (leader_) broadcast_between_hosts(root_node, data);
    if (!in_root_node && base_) broadcast_spans(0, {data}, what);
    if (in_root_node && base_) sync(what);  // the leader's check with the other hosts: a mismatch fails every rank
  }

  // algorithms.py's broadcast_between_hosts: a binomial tree from host root, of the whole message or of
  // each subtree's shards followed by an all_gather of the shards (scatter_allgather).
  void broadcast_between_hosts(int root, Span data) {
    bool whole = broadcast_algorithm(data.length, hosts_, rules_) == kBinomial;
    auto part = [&](int first, int stop) -> std::vector<Span> {  // what hosts first..stop-1 from the root get
      if (whole) return {data};
      long lo = bounds(data.length, hosts_, first).first, hi = bounds(data.length, hosts_, stop - 1).second;
      return {{data.data + lo, hi - lo}};
    };
    int v = (node_ - root + hosts_) % hosts_;
    std::vector<char> inbox(hosts_);
    bool first = true;
    for (int m = 1 << ceil_log2(hosts_); m > 1;) {
      m /= 2;
      Spans sends(hosts_), recvs(hosts_);
      if (v % (2 * m) == 0 && v + m < hosts_)
        sends[(node_ + m) % hosts_] = part(v + m, std::min(v + 2 * m, hosts_));
      else if (v % (2 * m) == m)
        recvs[(node_ - m + hosts_) % hosts_] = part(v, std::min(v + m, hosts_));
      if (first && checks_calls()) reach_every_peer(sends, recvs, inbox);  // the call's check rides on the first round
      first = false;
      exchange(sends, recvs);
    }
    if (whole) return;
    Spans blocks(hosts_);
    for (int h = 0; h < hosts_; h++) {
      int distance = (h - root + hosts_) % hosts_;
      blocks[h] = part(distance, distance + 1);
    }
    allgather_blocks(blocks);
  }

  // communicator.py's barrier across hosts: the host's ranks, a byte between every two leaders, the host's ranks.
  void barrier_hosts() {
    start_call("barrier");
    if (base_) sync("barrier");
    if (leader_) check_call();
    if (base_) sync("barrier");
  }

  // algorithms.py's reaching_every_peer: a byte to and from every peer the exchange leaves out (inbox: one
  // byte per host), so that every leader hears every other's call header. Rooted calls are checked so.
  void reach_every_peer(Spans& sends, Spans& recvs, std::vector<char>& inbox) const {
    static char token = 1;
    for (int h = 0; h < hosts_; h++)
      if (h != node_) {
        if (total(sends[h]) == 0) sends[h] = {{&token, 1}};
        if (total(recvs[h]) == 0) recvs[h] = {{&inbox[h], 1}};
      }
  }

  // algorithms.py's checks_calls: false where SMDDP_CHECK_CALLS=0 took the header off (to measure its cost)
  bool checks_calls() const { return header_ != nullptr && header_[0] != 0; }

  // algorithms.py's check_call: the call header alone between every two leaders.
  void check_call() {
    Spans sends(hosts_), recvs(hosts_);
    std::vector<char> inbox(hosts_);
    reach_every_peer(sends, recvs, inbox);
    exchange(sends, recvs);
  }

  // communicator.py's check_between_hosts: reduce and gather, on all_reduce and all_gather that may not reach
  // every host both ways, have their leaders check the call first.
  void check_hosts(const char* what) {
    if (hosts_ == 1 || !leader_ || !checks_calls()) return;
    start_call(what);
    check_call();
  }

  // algorithms.py's InterHostAllreduce.run: the algorithm by size and host count (or forced), the
  // sharded pipeline over the whole buffer, the others in chunks of oneshot_chunk
  void between_hosts(char* x, long count, long esize, int dtype, int op) {
    int algorithm = inter_host_algorithm(count * esize, hosts_, rules_);
    if (algorithm == kSharded) {
      sharded(x, count, esize, dtype, op);
      return;
    }
    long step = std::max(1L, rules_.oneshot_chunk / esize);
    for (long start = 0; start < count; start += step) {
      long length = std::min(step, count - start);
      char* piece = x + start * esize;
      if (algorithm == kOneshot) oneshot(piece, length, esize, dtype, op);
      else if (algorithm == kRing) ring_allreduce(piece, length, esize, dtype, op);
      else if (algorithm == kRecursiveDoubling) recursive_doubling(piece, length, esize, dtype, op);
      else halving_doubling(piece, length, esize, dtype, op);
    }
  }

  // One span with one peer: mine out, theirs in.
  void exchange_with(int peer, Span send, Span receive) {
    Spans sends(hosts_), recvs(hosts_);
    sends[peer] = {send};
    recvs[peer] = {receive};
    exchange(sends, recvs);
  }

  // algorithms.py's _combine_pair: mine = the two partial results, the lower host's first (theirs: scratch)
  void combine_pair(char* mine, char* theirs, long count, long esize, int dtype, int op, bool mine_first) {
    void* sources[2] = {mine_first ? mine : theirs, mine_first ? theirs : mine};
    char* target = mine_first ? mine : theirs;
    reduce_(dtype, op, target, sources, 2, count);
    if (!mine_first) std::memcpy(mine, theirs, count * esize);
  }

  // algorithms.py's _folded: the extra hosts fold into their partners, among(rank, p) runs on the p hosts
  // left (steps exchanges), the result goes back; hosts count the exchanges they sit out, so that every
  // host numbers the call's steps alike.
  template <typename Among>
  void folded(char* x, long count, long esize, int dtype, int op, int steps, Among among) {
    long nbytes = count * esize;
    int rank = folded_rank(node_, hosts_), p = 1 << log2_floor(hosts_);
    Spans none(hosts_), one(hosts_);
    if (rank < 0) {
      one[node_ - 1] = {{x, nbytes}};
      exchange(one, none);
      header_[kStep] += steps;
      exchange(none, one);
      return;
    }
    bool partnered = node_ < 2 * (hosts_ - p);
    if (partnered) {
      char* staged = scratch(1, nbytes);
      one[node_ + 1] = {{staged, nbytes}};
      exchange(none, one);
      void* sources[2] = {x, staged};  // host order: the pair's lower host first
      reduce_(dtype, op, x, sources, 2, count);
    } else if (hosts_ > p) {
      header_[kStep]++;
    }
    among(rank, p);
    if (partnered) {
      one[node_ + 1] = {{x, nbytes}};
      exchange(one, none);
    } else if (hosts_ > p) {
      header_[kStep]++;
    }
  }

  // algorithms.py's recursive_doubling
  void recursive_doubling(char* x, long count, long esize, int dtype, int op) {
    long nbytes = count * esize;
    folded(x, count, esize, dtype, op, log2_floor(hosts_), [&](int rank, int p) {
      char* staged = scratch(1, nbytes);
      for (int distance = 1; distance < p; distance *= 2) {
        int partner = rank ^ distance;
        exchange_with(host_of_folded(partner, hosts_), {x, nbytes}, {staged, nbytes});
        combine_pair(x, staged, count, esize, dtype, op, rank < partner);
      }
    });
  }

  // algorithms.py's halving_doubling (Rabenseifner)
  void halving_doubling(char* x, long count, long esize, int dtype, int op) {
    int parts = 1 << log2_floor(hosts_);
    auto span = [&](int first, int stop) {  // shards first..stop-1 of parts
      long lo = bounds(count, parts, first).first, hi = bounds(count, parts, stop - 1).second;
      return Span{x + lo * esize, (hi - lo) * esize};
    };
    folded(x, count, esize, dtype, op, 2 * log2_floor(hosts_), [&](int rank, int p) {
      int first = 0, stop = p;
      for (int half = p / 2; half > 0; half /= 2) {  // keep the half that rank's bit selects
        int partner = rank ^ half, middle = first + half;
        bool upper = rank & half;
        Span kept = upper ? span(middle, stop) : span(first, middle);
        Span give = upper ? span(first, middle) : span(middle, stop);
        char* staged = scratch(1, kept.length);
        exchange_with(host_of_folded(partner, hosts_), give, {staged, kept.length});
        combine_pair(kept.data, staged, kept.length / esize, esize, dtype, op, rank < partner);
        if (upper) first = middle; else stop = middle;
      }
      for (int size = 1; size < p; size *= 2) {  // all-gather: swap the finished ranges, doubling them
        int partner = rank ^ size, their_first = first ^ size;
        exchange_with(host_of_folded(partner, hosts_), span(first, stop), span(their_first, their_first + size));
        first = std::min(first, their_first);
        stop = first + 2 * size;
      }
    });
  }

  void oneshot(char* x, long count, long esize, int dtype, int op) {
    long nbytes = count * esize;
    Spans sends(hosts_), recvs(hosts_);
    std::vector<void*> sources(hosts_, x);
    for (int h = 0; h < hosts_; h++) {
      if (h == node_) continue;
      char* received = scratch(h, nbytes);
      sends[h].push_back({x, nbytes});
      recvs[h].push_back({received, nbytes});
      sources[h] = received;
    }
    exchange_in_rounds(sends, recvs);
    reduce_in_host_order(x, sources, count, esize, dtype, op);
  }

  // Reduce-scatter + all-gather in pipelined chunks: round k sends chunk k's shards and chunk k-1's result.
  void sharded(char* x, long count, long esize, int dtype, int op) {
    long step = std::max<long>(hosts_, rules_.pipeline_chunk / esize);
    long chunks = (count + step - 1) / step;
    auto shard_of = [&](long k, int h) {
      long first = k * step, length = std::min(step, count - first);
      auto [lo, hi] = bounds(length, hosts_, h);
      return Span{x + (first + lo) * esize, (hi - lo) * esize};
    };
    std::vector<void*> sources(hosts_);
    for (long k = 0; k <= chunks; k++) {
      Spans sends(hosts_), recvs(hosts_);
      for (int h = 0; h < hosts_; h++) {
        if (h == node_) continue;
        if (k > 0) {  // all-gather of the previous chunk: my reduced shard out, theirs in
          sends[h].push_back(shard_of(k - 1, node_));
          recvs[h].push_back(shard_of(k - 1, h));
        }
        if (k < chunks) {  // reduce-scatter of this chunk: their part of my shard in
          Span mine = shard_of(k, node_);
          sends[h].push_back(shard_of(k, h));
          sources[h] = scratch(2 * hosts_ * (k & 1) + h + 1, mine.length);
          recvs[h].push_back({static_cast<char*>(sources[h]), mine.length});
        }
      }
      exchange_in_rounds(sends, recvs);
      if (k < chunks) {
        Span mine = shard_of(k, node_);
        sources[node_] = mine.data;
        reduce_in_host_order(mine.data, sources, mine.length / esize, esize, dtype, op);
      }
    }
  }

  // Host h sends to h+1 only: shard j accumulates along the ring in one order, then travels around.
  void ring_allreduce(char* x, long count, long esize, int dtype, int op) {
    int to = (node_ + 1) % hosts_, from = (node_ + hosts_ - 1) % hosts_;
    auto shard_of = [&](int j) {
      auto [lo, hi] = bounds(count, hosts_, ((j % hosts_) + hosts_) % hosts_);
      return Span{x + lo * esize, (hi - lo) * esize};
    };
    for (int s = 0; s < hosts_ - 1; s++) {  // reduce-scatter
      Span incoming = shard_of(node_ - s - 1);
      char* staged = scratch(1, incoming.length);
      Spans sends(hosts_), recvs(hosts_);
      sends[to] = {shard_of(node_ - s)};
      recvs[from] = {{staged, incoming.length}};
      exchange(sends, recvs);
      void* sources[2] = {staged, incoming.data};  // the ring's order: earlier hosts first, then this one
      reduce_(dtype, op, staged, sources, 2, incoming.length / esize);
      std::memcpy(incoming.data, staged, incoming.length);
    }
    for (int s = 0; s < hosts_ - 1; s++) {  // all-gather: pass the finished shards on
      Spans sends(hosts_), recvs(hosts_);
      sends[to] = {shard_of(node_ + 1 - s)};
      recvs[from] = {shard_of(node_ - s)};
      exchange(sends, recvs);
    }
  }

  // Every host's copy reduced in host order into x (x is sources[node_]); the same bits on every host.
  void reduce_in_host_order(char* x, std::vector<void*>& sources, long count, long esize, int dtype, int op) {
    if (node_ == 0) {  // x is sources[0]: in place
      reduce_(dtype, op, x, sources.data(), hosts_, count);
      return;
    }
    char* result = scratch(-1, count * esize);
    reduce_(dtype, op, result, sources.data(), hosts_, count);
    std::memcpy(x, result, count * esize);
  }

  // algorithms.py's exchange_in_rounds: large exchanges with several peers as permutation rounds (round r:
  // send to host+r, receive from host-r), so that each link carries one flow per direction.
  void exchange_in_rounds(const Spans& sends, const Spans& recvs) {
    long largest = 0;
    for (int h = 0; h < hosts_; h++) largest = std::max({largest, total(sends[h]), total(recvs[h])});
    if (hosts_ <= 2 || largest < rules_.rounds_from) {
      exchange(sends, recvs);
      return;
    }
    for (int shift = 1; shift < hosts_; shift++) {
      int to = (node_ + shift) % hosts_, from = (node_ + hosts_ - shift) % hosts_;
      Spans round_sends(hosts_), round_recvs(hosts_);
      round_sends[to] = sends[to];
      round_recvs[from] = recvs[from];
      exchange(round_sends, round_recvs);
    }
  }

  static long total(const std::vector<Span>& spans) {
    long sum = 0;
    for (const Span& span : spans) sum += span.length;
    return sum;
  }

  // Every peer's spans out and in at once through the kernels' poll loop, each peer's behind the call
  // header (tcp.py's TcpMesh.exchange: only to and from peers with bytes to move); a peer's header that
  // differs from ours fails the call (`_exchange_mismatch`). Between slices Python checks the deadline and
  // signals (`_exchange_stalled`), and a broken connection fails there (`_exchange_failed`).
  void exchange(const Spans& sends, const Spans& recvs) {
    Header mine{};
    std::memcpy(mine.data(), header_, sizeof(Header));
    header_[kStep]++;  // every exchange of a call counts a step, with transfers or not
    std::vector<Header> theirs(hosts_);
    std::vector<std::pair<int, size_t>> headers;  // (peer, index of its header's transfer)
    std::vector<Transfer> transfers;
    std::vector<int> peers;
    for (int receive = 0; receive < 2; receive++)
      for (int h = 0; h < hosts_; h++) {
        const std::vector<Span>& spans = (receive ? recvs : sends)[h];
        if (total(spans) == 0) continue;
        if (mine[0] != 0) {  // magic 0: calls unchecked, no header (tcp.py's CHECK_CALLS_ENV, benchmarks only)
          char* header = reinterpret_cast<char*>(receive ? theirs[h].data() : mine.data());
          if (receive) headers.push_back({h, transfers.size()});
          transfers.push_back({fds_[h], receive, header, static_cast<long>(sizeof(Header)), 0, 0});
          peers.push_back(h);
        }
        for (const Span& span : spans)
          if (span.length > 0) {
            transfers.push_back({fds_[h], receive, span.data, span.length, 0, 0});
            peers.push_back(h);
          }
      }
    for (;;) {
      int status = exchange_(transfers.data(), static_cast<int>(transfers.size()), slice_ns_);
      if (status >= 0)  // a peer that left may have said why first (a header, such as its farewell)
        for (auto [h, i] : headers) exchange_(&transfers[i], 1, kHeaderWaitNs);
      int differs = -1;
      for (auto [h, i] : headers)
        if (transfers[i].done == transfers[i].length && theirs[h] != mine) {
          differs = h;
          break;
        }
      if (status == kDone && differs < 0) return;
      pybind11::gil_scoped_acquire gil;
      try {
        if (differs >= 0) {
          call_python("_exchange_mismatch", differs, header_bytes(theirs[differs]), header_bytes(mine));
          TORCH_CHECK(false, "smddp: _exchange_mismatch returned");
        }
        if (status >= 0) {
          call_python("_exchange_failed", peers[status], transfers[status].receive != 0, transfers[status].error);
          TORCH_CHECK(false, "smddp: _exchange_failed returned");
        }
        report_stall(transfers, peers);
      } catch (...) {
        // Python fails the group (core off, connections closed) for errors; a signal handler's exception
        // can escape before it does: then the connections, left mid-message, are cut here.
        if (mode() != 0) {
          set_mode(0);
          for (int fd : fds_)
            if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
        }
        throw;
      }
    }
  }

  static pybind11::bytes header_bytes(const Header& header) {
    return pybind11::bytes(reinterpret_cast<const char*>(header.data()), sizeof(Header));
  }

  // A slice passed with transfers unfinished: Python fails the call past the deadline.
  void report_stall(const std::vector<Transfer>& transfers, const std::vector<int>& peers) {
    size_t waiting = transfers.size();  // the first unfinished receive names the late peer best, else a send
    for (size_t i = 0; i < transfers.size(); i++) {
      if (transfers[i].done >= transfers[i].length) continue;
      if (waiting == transfers.size()) waiting = i;
      if (transfers[i].receive) {
        waiting = i;
        break;
      }
    }
    std::chrono::duration<double> waited = std::chrono::steady_clock::now() - started_;
    call_python("_exchange_stalled", peers[waiting], transfers[waiting].receive != 0, waited.count());
  }

  // reusable buffers by key, zeroed (faulted in) when first made or grown
  char* scratch(long key, long nbytes) {
    std::vector<char>& buffer = scratch_[key];
    if (static_cast<long>(buffer.size()) < nbytes) buffer.assign(nbytes, 0);
    return buffer.data();
  }

  template <typename... Args>
  void call_python(const char* method, Args... args) {
    pybind11::function hook = pybind11::get_override(static_cast<const SmddpCore*>(this), method);
    TORCH_CHECK(hook, "smddp: the Python group defines no ", method);
    hook(what_, args...);  // raises (as a Python error) past the deadline or when the peer failed
  }

  // The collective now running across hosts: named in errors, timed from here for the deadline.
  void start_call(const char* what) {
    what_ = what;
    started_ = std::chrono::steady_clock::now();
  }

  // shm.py's spin rule (ShmArena._refresh_spin_budget, LoadSamples): how long a waiting rank polls before
  // it sleeps. Every 125 ms a sample of "more tasks runnable than cores" goes into the last 8; the machine
  // counts as loaded (poll briefly) while a majority of them say so, so one passing task never does. A
  // blocking call (under a Claim) polls blocking_spin_ns_, whatever the load (shm.py's spin_budgets).
  long spin() {
    auto now = std::chrono::steady_clock::now();
    if (now - spin_checked_ >= std::chrono::milliseconds(125)) {
      spin_checked_ = now;
      load_samples_ = static_cast<uint8_t>((load_samples_ << 1) | (runnable_tasks() > cores_ ? 1 : 0));
      spin_ns_ = __builtin_popcount(load_samples_) > 4 ? loaded_spin_ns_ : calm_spin_ns_;
    }
    return blocking_ ? blocking_spin_ns_ : spin_ns_;
  }

  // specs/processes.py's runnable_tasks: /proc/loadavg's runnable count, else the 1-minute load average.
  static double runnable_tasks() {
    if (FILE* file = std::fopen("/proc/loadavg", "r")) {
      int running = 0;
      int parsed = std::fscanf(file, "%*f %*f %*f %d/", &running);
      std::fclose(file);
      if (parsed == 1) return running;
    }
    double load = 0;
    return getloadavg(&load, 1) == 1 ? load : 0;
  }

  // One barrier of the current collective; Python finishes it when a peer is late or disagrees.
  void sync(const char* what) {
    uint32_t generation = next_generation();
    int status = barrier_(base_, n_, index_, generation, record_, spin(), slice_ns_);
    if (status != kDone) finish_in_python(what, status, generation);
  }

  // The call record (calls.py's Call.words) of the collective about to run, as Python's begin writes it:
  // into the arena's record (counters_: [0] call sequence number, [1] barrier generation, [2] phase, shared
  // with Python) and into the mesh's call header, which numbers calls itself and restarts the step.
  void tag(uint32_t op, uint32_t dtype, int64_t count, uint32_t root, uint32_t reduce) {
    uint64_t n = static_cast<uint64_t>(count);
    uint32_t words[6] = {0, op << 4 | reduce, dtype, static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), root};
    if (base_) {
      words[0] = ++counters_[0];
      std::memcpy(record_, words, sizeof(words));
    }
    if (header_) {
      words[0] = header_[1] + 1;
      std::memcpy(header_ + 1, words, sizeof(words));
      header_[kStep] = 0;
    }
  }
  uint32_t next_generation() { return ++counters_[1]; }
  uint32_t next_half() { return counters_[2]++ & 1; }

  // A peer is late (or disagrees): Python waits out the rest with the deadline, abort and liveness checks,
  // the hang warning and the errors of the slow path, then finishes the collective.
  void finish_in_python(const char* what, int status, uint32_t generation) {
    pybind11::gil_scoped_acquire gil;
    pybind11::function finish = pybind11::get_override(static_cast<const SmddpCore*>(this), "_finish_barrier");
    TORCH_CHECK(finish, "smddp: the Python group defines no _finish_barrier");
    finish(what, status, generation);  // raises (as a Python error) when the peers fail or disagree
  }

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
  mutable std::string group_name_;
  mutable std::string group_desc_;

 public:
  int64_t calls() const { return calls_; }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::module_::import("torch.distributed");  // registers c10d::ProcessGroup, the base below
  pybind11::class_<SmddpCore, c10d::ProcessGroup, c10::intrusive_ptr<SmddpCore>>(m, "SmddpCore")
      .def(pybind11::init<int, int>(), pybind11::arg("rank"), pybind11::arg("size"))
      .def("_core_attach", &SmddpCore::attach)
      .def("_core_attach_hosts", &SmddpCore::attach_hosts)
      .def("_core_mode", &SmddpCore::set_mode)
      .def("_claim_inline", &SmddpCore::claim_inline)
      .def("_add_pending", &SmddpCore::add_pending)
      .def("_end_job", &SmddpCore::end_job)
      .def("_core_allreduce", &SmddpCore::run_allreduce)
      .def("_core_between_hosts", &SmddpCore::run_between_hosts)
      .def("_core_calls", &SmddpCore::calls, "collectives the core has run itself (diagnostics, tests)")
      .def_static(
          "_inter_host_algorithms",
          [](long nbytes, long hosts, long alpha, long message, long ring_round, long rounds_from) {
            HostRules rules{alpha, message, ring_round, 0, 0, rounds_from, kAuto};
            return std::make_tuple(inter_host_algorithm(nbytes, hosts, rules), allgather_algorithm(nbytes, hosts, rules),
                                   broadcast_algorithm(nbytes, hosts, rules));
          },
          "the core's choice of all_reduce, all_gather and broadcast algorithm between hosts (indices; tests compare "
          "them with selection.py's)");
}
