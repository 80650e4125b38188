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
// A send or receive of one contiguous CPU tensor to or from a rank of this host runs here too,
// over the pair's shared-memory ring, when p2p.py's matching state allows it (fast_send, fast_recv).
// Everything else goes to the Python implementation (`_python_<method>`); a call whose peers are late
// past one check slice waits in Python (`_finish_barrier`, `_exchange_stalled`) with the deadline, abort
// and liveness checks and the hang warning.
//
// The collectives' protocol and algorithms on bytes are engine.cpp's (free of torch, compiled beside
// this file); this file holds what needs torch: the ProcessGroup, the tensors' checks and the binding.
//
// Built on first use by smddp_sdk/collectives/native/__init__.py; see docs/collectives.md ("Native hot path").
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <pybind11/stl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/uio.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace smddp {
namespace {

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

// One end of a point-to-point ring (ring.py; smddp_native.c's "point-to-point rings" has the layout):
// counters as 32-bit words in the header, then capacity bytes of data (a power of two, from Python,
// never from the shared words; counters further apart than capacity are refused).
constexpr long kRingHeader = 256;
constexpr int kRingHead = 16, kRingReaders = 17, kRingTail = 32, kRingWriters = 33;
constexpr long kEnvelope = 32;   // p2p.py's ENVELOPE
constexpr size_t kEnvelopeSeq = 2;  // its word a receive does not know in advance
constexpr long kPauseNs = 30000;  // smddp_native.c's PAUSE_NS
constexpr long kSingleCopyFrom = 256 << 10;  // p2p.py's SINGLE_COPY_FROM

struct RingView {
  char* base;
  long capacity;
  uint32_t* word(int w) const { return reinterpret_cast<uint32_t*>(base) + w; }
  char* data() const { return base + kRingHeader; }
  // Bytes in the ring, or -1 when its counters make no sense.
  long used() const {
    uint32_t used = __atomic_load_n(word(kRingHead), __ATOMIC_ACQUIRE) - __atomic_load_n(word(kRingTail), __ATOMIC_ACQUIRE);
    return used > static_cast<uint32_t>(capacity) ? -1 : static_cast<long>(used);
  }
  void copy_in(uint32_t at, const char* src, long n) const {
    if (n == 0) return;  // an empty tensor's data may be null
    long offset = at & (capacity - 1), first = std::min(n, capacity - offset);
    std::memcpy(data() + offset, src, first);
    std::memcpy(data(), src + first, n - first);
  }
  void copy_out(uint32_t at, char* dst, long n) const {
    if (n == 0) return;
    long offset = at & (capacity - 1), first = std::min(n, capacity - offset);
    std::memcpy(dst, data() + offset, first);
    std::memcpy(dst + first, data(), n - first);
  }
  // Advance a counter and wake whoever sleeps on it (counted as a sleeper).
  void publish(int counter, int sleepers, uint32_t value) const {
    __atomic_store_n(word(counter), value, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word(sleepers), __ATOMIC_SEQ_CST)) syscall(SYS_futex, word(counter), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
  }
};

// A collective's Work made in Python, kept with its Python object (what torch's
// PyProcessGroup::PyWorkHolder does; PyProcessGroup.hpp itself would pull in torch's JIT bindings, a
// third of this file's compile time).
class PythonWork : public c10d::Work {
 public:
  explicit PythonWork(pybind11::object work)
      : work_(work.cast<c10::intrusive_ptr<c10d::Work>>()), object_(std::move(work)) {}
  ~PythonWork() override {
    pybind11::gil_scoped_acquire gil;  // a Python object is released under the GIL
    object_ = pybind11::object();
  }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }
  // torch's own holder forwards only the two above; a Work's state is its Python methods' answer
  bool isCompleted() override { return ask<bool>("is_completed"); }
  bool isSuccess() const override { return ask<bool>("is_success"); }
  int sourceRank() const override { return ask<int>("_source_rank"); }

 private:
  template <typename T>
  T ask(const char* method) const {
    pybind11::gil_scoped_acquire gil;
    return object_.attr(method)().template cast<T>();
  }

  c10::intrusive_ptr<c10d::Work> work_;
  pybind11::object object_;
};

}  // namespace

class SmddpCore : public c10d::ProcessGroup, public Engine {
 public:
  using c10d::ProcessGroup::ProcessGroup;

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

  // This class is its own trampoline (torch's PyProcessGroup finds Python overrides only on instances of
  // ProcessGroup itself, and its header costs a third of this file's compile): every method the Python
  // group defines is forwarded here.
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
    if (tensors.size() == 1 && small(tensors[0]) && fast_send(tensors[0], dst, tag))
      return c10::make_intrusive<DoneWork>(tensors);
    return python("_python_send", tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    if (tensors.size() == 1 && small(tensors[0]) && fast_recv(tensors[0], src, tag))
      return c10::make_intrusive<DoneWork>(tensors);
    return python("_python_recv", tensors, src, tag);
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
  // The Python implementation of a collective, as torch's trampoline would call an override.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> python(const char* method, Args&... args) {
    pybind11::gil_scoped_acquire gil;
    pybind11::function implementation = pybind11::get_override(static_cast<const SmddpCore*>(this), method);
    TORCH_CHECK(implementation, "smddp: the Python group defines no ", method);
    return c10::make_intrusive<PythonWork>(implementation(args...));
  }

  // A message for point-to-point's fast path: larger ones are read from the sender's memory (p2p.py's
  // SINGLE_COPY_FROM), which the Python path does, so they do not ask it for the fast path first.
  static bool small(const at::Tensor& t) { return plain_cpu(t) && nbytes_of(t) < kSingleCopyFrom; }

  // Point-to-point's fast path: the whole message (envelope, then its bytes) into the peer's ring, when
  // p2p.py's fast_send says it fits now and no other send writes there; written under the GIL, so that
  // no Python send to that peer starts meanwhile. The Work is done once written, as the Python path's.
  bool fast_send(const at::Tensor& t, int dst, int tag) {
    pybind11::gil_scoped_acquire gil;
    pybind11::function hook = python_override("_p2p_fast_send");
    pybind11::object lane = hook ? hook(t, dst, tag) : pybind11::none();
    if (lane.is_none()) return false;
    auto [address, capacity, envelope] = lane.cast<std::tuple<uintptr_t, long, std::string>>();
    TORCH_CHECK(envelope.size() == kEnvelope, "smddp: an envelope of ", envelope.size(), " bytes");
    RingView ring{reinterpret_cast<char*>(address), capacity};
    uint32_t head = __atomic_load_n(ring.word(kRingHead), __ATOMIC_RELAXED);
    ring.copy_in(head, envelope.data(), kEnvelope);
    ring.copy_in(head + kEnvelope, static_cast<const char*>(t.data_ptr()), nbytes_of(t));
    ring.publish(kRingHead, kRingReaders, head + static_cast<uint32_t>(kEnvelope + nbytes_of(t)));
    return true;
  }

  // A receive from src when p2p.py's fast_recv says the next message from src is its to take: polls src's
  // ring without the GIL for the spin budget (short: an irecv comes here too, and must not wait for its
  // message) and takes the message if it is the one expected (tag, dtype, size; its bytes in the ring).
  // Anything else -- nothing yet, another tag, a mismatch, a message read from the sender's memory --
  // stays in the ring for the Python path.
  bool fast_recv(at::Tensor& t, int src, int tag) {
    pybind11::gil_scoped_acquire gil;
    pybind11::function hook = python_override("_p2p_fast_recv");
    pybind11::object lane = hook ? hook(t, src, tag) : pybind11::none();
    if (lane.is_none()) return false;
    auto [address, capacity, expected, spin_s, give_back] =
        lane.cast<std::tuple<uintptr_t, long, std::string, double, pybind11::function>>();
    bool taken = false;
    if (expected.size() == kEnvelope) {
      pybind11::gil_scoped_release nogil;
      taken = take_message({reinterpret_cast<char*>(address), capacity}, expected, t, static_cast<long>(spin_s * 1e9));
    }
    give_back(taken);
    return taken;
  }

  static bool take_message(RingView ring, const std::string& expected, at::Tensor& t, long spin_ns) {
    long nbytes = nbytes_of(t);
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      long used = ring.used();
      if (used < 0) return false;  // the Python path reports the corrupt ring
      if (used >= kEnvelope) {
        uint32_t tail = __atomic_load_n(ring.word(kRingTail), __ATOMIC_RELAXED);
        std::array<uint32_t, kEnvelope / 4> envelope;
        ring.copy_out(tail, reinterpret_cast<char*>(envelope.data()), kEnvelope);
        const auto* want = reinterpret_cast<const uint32_t*>(expected.data());
        for (size_t k = 0; k < envelope.size(); k++)
          if (k != kEnvelopeSeq && envelope[k] != want[k]) return false;
        if (used >= kEnvelope + nbytes) {
          ring.copy_out(tail + kEnvelope, static_cast<char*>(t.data_ptr()), nbytes);
          ring.publish(kRingTail, kRingWriters, tail + static_cast<uint32_t>(kEnvelope + nbytes));
          return true;
        }
      }
      long elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      if (elapsed >= spin_ns) return false;
      if (elapsed >= kPauseNs) sched_yield();  // smddp_native.c's poll_once
#if defined(__x86_64__) || defined(__i386__)
      else __builtin_ia32_pause();
#endif
    }
  }

  // A Python override of a non-collective method, if the group defines one.
  pybind11::function python_override(const char* method) const {
    return pybind11::get_override(static_cast<const SmddpCore*>(this), method);
  }

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

  void reduce_everywhere(at::Tensor& x, int dtype, int op, const char* what = "all_reduce") {
    if (hosts_ == 1) {
      allreduce_chunks(static_cast<char*>(x.data_ptr()), x.numel(), x.element_size(), dtype, op);
      return;
    }
    bool average = op == kAverage;  // communicator.py: AVG is a SUM divided once, where it is rounded
    int combine = average ? kernel_op(c10d::ReduceOp::SUM) : op;
    bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
    if (half && (combine == kernel_op(c10d::ReduceOp::SUM) || combine == kernel_op(c10d::ReduceOp::PRODUCT))) {
      // communicator.py: partial results cross hosts in fp32, so the result is rounded once
      at::Tensor wide = x.to(at::kFloat);
      allreduce_hosts(static_cast<char*>(wide.data_ptr()), wide.numel(), wide.element_size(), kFloatKernel, combine, what);
      if (average) divide_by_group(wide);
      x.copy_(wide);
    } else {
      allreduce_hosts(static_cast<char*>(x.data_ptr()), x.numel(), x.element_size(), dtype, combine, what);
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

  static pybind11::bytes header_bytes(const Header& header) {
    return pybind11::bytes(reinterpret_cast<const char*>(header.data()), sizeof(Header));
  }

  template <typename... Args>
  void call_python(const char* method, Args... args) {
    pybind11::function hook = pybind11::get_override(static_cast<const SmddpCore*>(this), method);
    TORCH_CHECK(hook, "smddp: the Python group defines no ", method);
    hook(what_, args...);  // raises (as a Python error) past the deadline or when the peer failed
  }

  int group_rank() const override { return getRank(); }
  int group_size() const override { return getSize(); }

  // A peer is late (or disagrees): Python waits out the rest with the deadline, abort and liveness checks,
  // the hang warning and the errors of the slow path, then finishes the collective.
  void finish_in_python(const char* what, int status, uint32_t generation) override {
    pybind11::gil_scoped_acquire gil;
    pybind11::function finish = pybind11::get_override(static_cast<const SmddpCore*>(this), "_finish_barrier");
    TORCH_CHECK(finish, "smddp: the Python group defines no _finish_barrier");
    finish(what, status, generation);  // raises (as a Python error) when the peers fail or disagree
  }

  void all_to_all_mismatch(int source, int target, int64_t sent, int64_t expected) override {
    pybind11::gil_scoped_acquire gil;
    call_python("_all_to_all_mismatch", source, target, sent, expected);
    TORCH_CHECK(false, "smddp: _all_to_all_mismatch returned");
  }

  void single_copy_refused(int error) override {
    pybind11::gil_scoped_acquire gil;
    call_python("_single_copy_refused", error);
  }

  void exchange_mismatch(int peer, const Header& theirs, const Header& mine) override {
    pybind11::gil_scoped_acquire gil;
    call_python("_exchange_mismatch", peer, header_bytes(theirs), header_bytes(mine));
    TORCH_CHECK(false, "smddp: _exchange_mismatch returned");
  }

  void exchange_failed(int peer, bool receive, int error) override {
    pybind11::gil_scoped_acquire gil;
    call_python("_exchange_failed", peer, receive, error);
    TORCH_CHECK(false, "smddp: _exchange_failed returned");
  }

  void exchange_stalled(int peer, bool receive, double waited) override {
    pybind11::gil_scoped_acquire gil;
    call_python("_exchange_stalled", peer, receive, waited);
  }

  mutable std::string group_name_;
  mutable std::string group_desc_;
};

}  // namespace smddp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::module_::import("torch.distributed");  // registers c10d::ProcessGroup, the base below
  using namespace smddp;
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
