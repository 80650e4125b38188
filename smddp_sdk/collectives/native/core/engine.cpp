// smddp's core engine (engine.hpp): no torch headers, so it compiles in seconds beside smddp_core.cpp.
#include "engine.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace smddp {
namespace {

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

}  // namespace


// Set by the Python group once its arena is up (one host, native kernels); addresses are the Python
// side's counters and record, so both paths number and tag collectives alike.
void Engine::attach(uintptr_t base, int n, int index, long slot_bytes, uintptr_t slots0, uintptr_t slots1,
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
void Engine::attach_hosts(std::vector<std::vector<int>> nodes, int node, bool leader, std::vector<int> fds, uintptr_t header,
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

// communicator.py's allgather: every rank's bytes into its target (by group rank; lengths may differ,
// this rank's is data's): within the host, between the leaders, then the leader hands the other hosts'
// parts to the host's ranks.
void Engine::gather_everywhere(char* data, const std::vector<Span>& targets, const char* what) {
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
void Engine::gather_in_host(char* data, const std::vector<Span>& targets, const char* what) {
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
bool Engine::to_all(CallOp op, const std::vector<Span>& outs, const std::vector<Span>& ins) {
  if (mode() != 1 || !claim_inline()) return false;  // as reduce: SageMaker's check speaks for each call
  Claim claim(this);
  tag(op, 0, 0, kNoRoot, 0);  // sizes may differ between ranks: count 0 (calls.py)
  const char* what = op == kAllToAll ? "all_to_all" : "all_to_all_single";
  start_call(what);
  int size = group_size(), me = group_rank();
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
      if (bytes(s, t) != table[2L * size * t + size + s]) all_to_all_mismatch(s, t, bytes(s, t), table[2L * size * t + size + s]);
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
char* Engine::blob(const std::vector<Span>& spans) {
  bool consecutive = true;
  for (size_t i = 1; i < spans.size(); i++) consecutive = consecutive && spans[i].data == spans[i - 1].data + spans[i - 1].length;
  if (consecutive && !spans.empty()) return spans[0].data;
  char* stream = scratch(-2 - group_rank(), total(spans));
  copy_stream(spans, 0, total(spans), stream, true);
  return stream;
}

// algorithms.py's allgather_between_hosts: all-to-all (in rounds when large), bruck, or the ring, every
// block (blocks[h]: host h's spans, this host's filled in) received straight into its place.
void Engine::allgather_blocks(const Spans& blocks) {
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

void Engine::allreduce_chunks(char* data, long count, long esize, int dtype, int op) {
  long step = std::max(1L, slot_bytes_ / esize);
  for (long start = 0; start < count; start += step)
    allreduce_chunk(data + start * esize, std::min(step, count - start), esize, dtype, op);
}

// One chunk of an all_reduce, by the Python path's rule (local.py): up to symmetric_limit every rank
// reduces every slot (one barrier); above, rank i reduces shard i for all (two barriers).
void Engine::allreduce_chunk(char* x, long count, long esize, int dtype, int op) {
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
std::pair<long, long> Engine::bounds(long count, int parts, int i) {
  long base = count / parts, extra = count % parts;
  long start = i * base + std::min<long>(i, extra);
  return {start, start + base + (i < extra ? 1 : 0)};
}

// Local rank root's spans to every local rank as one stream, a slot at a time (local.py's broadcast
// packs its buffers into slots the same way).
void Engine::broadcast_spans(int root, const std::vector<Span>& spans, const char* what) {
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

bool Engine::single_copy_read(char* source, const std::vector<Read>& reads, const char* what) {
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
      single_copy_refused(static_cast<int>(refused));
      return false;
    }
  }
  return true;
}

// Bytes start..start+length of the spans' concatenation into the slot (into_slot) or out of it.
void Engine::copy_stream(const std::vector<Span>& spans, long start, long length, char* slot, bool into_slot) {
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

// communicator.py's allreduce across hosts, chunk by chunk: the host's ranks reduce over shared memory,
// the leaders between hosts, and the leader's result goes to the host's ranks.
void Engine::allreduce_hosts(char* data, long count, long esize, int dtype, int op, const char* what) {
  start_call(what);
  long step = base_ ? std::max(1L, slot_bytes_ / esize) : count;
  for (long start = 0; start < count; start += step) {
    long length = std::min(step, count - start);
    char* piece = data + start * esize;
    if (base_) allreduce_chunk(piece, length, esize, dtype, op);
    if (leader_) between_hosts(piece, length, esize, dtype, op);
    if (base_) broadcast_spans(0, {{piece, length * esize}}, what);
  }
}

int Engine::node_of(int rank) const {
  for (int h = 0; h < hosts_; h++)
    if (std::find(nodes_[h].begin(), nodes_[h].end(), rank) != nodes_[h].end()) return h;
  throw std::logic_error("smddp: rank " + std::to_string(rank) + " is on no host of the group");
}

// Group rank root's bytes to every rank: within the host, or across hosts as below.
void Engine::broadcast_everywhere(int root, Span data, const char* what) {
  if (hosts_ == 1)
    broadcast_spans(root, {data}, what);
  else
    broadcast_hosts(root, data, what);
}

// communicator.py's broadcast across hosts: within the root's host, between the leaders
// (broadcast_between_hosts), within each other host from its leader.
void Engine::broadcast_hosts(int root, Span data, const char* what) {
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
void Engine::broadcast_between_hosts(int root, Span data) {
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
void Engine::barrier_hosts() {
  start_call("barrier");
  if (base_) sync("barrier");
  if (leader_) check_call();
  if (base_) sync("barrier");
}

// algorithms.py's reaching_every_peer: a byte to and from every peer the exchange leaves out (inbox: one
// byte per host), so that every leader hears every other's call header. Rooted calls are checked so.
void Engine::reach_every_peer(Spans& sends, Spans& recvs, std::vector<char>& inbox) const {
  static char token = 1;
  for (int h = 0; h < hosts_; h++)
    if (h != node_) {
      if (total(sends[h]) == 0) sends[h] = {{&token, 1}};
      if (total(recvs[h]) == 0) recvs[h] = {{&inbox[h], 1}};
    }
}

// algorithms.py's check_call: the call header alone between every two leaders.
void Engine::check_call() {
  Spans sends(hosts_), recvs(hosts_);
  std::vector<char> inbox(hosts_);
  reach_every_peer(sends, recvs, inbox);
  exchange(sends, recvs);
}

// communicator.py's check_between_hosts: reduce and gather, on all_reduce and all_gather that may not reach
// every host both ways, have their leaders check the call first.
void Engine::check_hosts(const char* what) {
  if (hosts_ == 1 || !leader_ || !checks_calls()) return;
  start_call(what);
  check_call();
}

// algorithms.py's InterHostAllreduce.run: the algorithm by size and host count (or forced), the
// sharded pipeline over the whole buffer, the others in chunks of oneshot_chunk
void Engine::between_hosts(char* x, long count, long esize, int dtype, int op) {
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
void Engine::exchange_with(int peer, Span send, Span receive) {
  Spans sends(hosts_), recvs(hosts_);
  sends[peer] = {send};
  recvs[peer] = {receive};
  exchange(sends, recvs);
}

// algorithms.py's _combine_pair: mine = the two partial results, the lower host's first (theirs: scratch)
void Engine::combine_pair(char* mine, char* theirs, long count, long esize, int dtype, int op, bool mine_first) {
  void* sources[2] = {mine_first ? mine : theirs, mine_first ? theirs : mine};
  char* target = mine_first ? mine : theirs;
  reduce_(dtype, op, target, sources, 2, count);
  if (!mine_first) std::memcpy(mine, theirs, count * esize);
}

// algorithms.py's _folded: the extra hosts fold into their partners, among(rank, p) runs on the p hosts
// left (steps exchanges), the result goes back; hosts count the exchanges they sit out, so that every
// host numbers the call's steps alike.
template <typename Among>
void Engine::folded(char* x, long count, long esize, int dtype, int op, int steps, Among among) {
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
void Engine::recursive_doubling(char* x, long count, long esize, int dtype, int op) {
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
void Engine::halving_doubling(char* x, long count, long esize, int dtype, int op) {
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

void Engine::oneshot(char* x, long count, long esize, int dtype, int op) {
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
void Engine::sharded(char* x, long count, long esize, int dtype, int op) {
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
void Engine::ring_allreduce(char* x, long count, long esize, int dtype, int op) {
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
void Engine::reduce_in_host_order(char* x, std::vector<void*>& sources, long count, long esize, int dtype, int op) {
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
void Engine::exchange_in_rounds(const Spans& sends, const Spans& recvs) {
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

long Engine::total(const std::vector<Span>& spans) {
  long sum = 0;
  for (const Span& span : spans) sum += span.length;
  return sum;
}

// Every peer's spans out and in at once through the kernels' poll loop, each peer's behind the call
// header (tcp.py's TcpMesh.exchange: only to and from peers with bytes to move); a peer's header that
// differs from ours fails the call (`_exchange_mismatch`). Between slices Python checks the deadline and
// signals (`_exchange_stalled`), and a broken connection fails there (`_exchange_failed`).
void Engine::exchange(const Spans& sends, const Spans& recvs) {
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
    try {
      if (differs >= 0) exchange_mismatch(differs, theirs[differs], mine);
      if (status >= 0) exchange_failed(peers[status], transfers[status].receive != 0, transfers[status].error);
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

// A slice passed with transfers unfinished: Python fails the call past the deadline.
void Engine::report_stall(const std::vector<Transfer>& transfers, const std::vector<int>& peers) {
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
  exchange_stalled(peers[waiting], transfers[waiting].receive != 0, waited.count());
}

// reusable buffers by key, zeroed (faulted in) when first made or grown
char* Engine::scratch(long key, long nbytes) {
  std::vector<char>& buffer = scratch_[key];
  if (static_cast<long>(buffer.size()) < nbytes) buffer.assign(nbytes, 0);
  return buffer.data();
}

// The collective now running across hosts: named in errors, timed from here for the deadline.
void Engine::start_call(const char* what) {
  what_ = what;
  started_ = std::chrono::steady_clock::now();
}

// shm.py's spin rule (ShmArena._refresh_spin_budget, LoadSamples): how long a waiting rank polls before
// it sleeps. Every 125 ms a sample of "more tasks runnable than cores" goes into the last 8; the machine
// counts as loaded (poll briefly) while a majority of them say so, so one passing task never does. A
// blocking call (under a Claim) polls blocking_spin_ns_, whatever the load (shm.py's spin_budgets).
long Engine::spin() {
  auto now = std::chrono::steady_clock::now();
  if (now - spin_checked_ >= std::chrono::milliseconds(125)) {
    spin_checked_ = now;
    load_samples_ = static_cast<uint8_t>((load_samples_ << 1) | (runnable_tasks() > cores_ ? 1 : 0));
    spin_ns_ = __builtin_popcount(load_samples_) > 4 ? loaded_spin_ns_ : calm_spin_ns_;
  }
  return blocking_ ? blocking_spin_ns_ : spin_ns_;
}

// specs/processes.py's runnable_tasks: /proc/loadavg's runnable count, else the 1-minute load average.
double Engine::runnable_tasks() {
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
void Engine::sync(const char* what) {
  uint32_t generation = next_generation();
  int status = barrier_(base_, n_, index_, generation, record_, spin(), slice_ns_);
  if (status != kDone) finish_in_python(what, status, generation);
}

// The call record (calls.py's Call.words) of the collective about to run, as Python's begin writes it:
// into the arena's record (counters_: [0] call sequence number, [1] barrier generation, [2] phase, shared
// with Python) and into the mesh's call header, which numbers calls itself and restarts the step.
void Engine::tag(uint32_t op, uint32_t dtype, int64_t count, uint32_t root, uint32_t reduce) {
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

}  // namespace smddp
