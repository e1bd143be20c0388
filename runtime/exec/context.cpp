// The rank's runtime context: heap creation, arenas agreed across ranks, poisoning.
#include "runtime/exec/context.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>

#include "base/log.h"
#include "runtime/exec/buffer_check.h"

namespace weft::runtime {

Status Context::create(bootstrap::Bootstrap& boot, uint64_t heap_bytes, std::unique_ptr<Context>* out) {
  std::unique_ptr<Context> c(new Context());
  c->boot_ = &boot;
  c->rank_ = boot.info().rank;
  c->size_ = boot.info().size;
  cudaError_t e = cudaGetDevice(&c->device_);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->sm_count_, cudaDevAttrMultiProcessorCount, c->device_);
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: no usable GPU for the runtime context: %s", c->rank_, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  // Which ranks share a GPU: node and PCI bus id of every rank.
  char bus[32] = {0};
  e = cudaDeviceGetPCIBusId(bus, sizeof bus - 1, c->device_);
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: cudaDeviceGetPCIBusId: %s", c->rank_, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  const std::string me = std::to_string(boot.info().node) + "/" + bus;
  std::vector<bootstrap::Blob> all;
  // Keys numbered per bootstrap: a second context on the same bootstrap (a benchmark runner's beside
  // the runtime op's) exchanges under keys of its own.
  c->key_ = "weft.context." + std::to_string(boot.next_exchange_id()) + ".";
  WEFT_CHECK(boot.allgather(c->key_ + "gpus", bootstrap::Blob(me.begin(), me.end()), &all));
  for (int r = 0; r < c->size_; ++r)
    if (r != c->rank_ && r < int(all.size()) && std::string(all[r].begin(), all[r].end()) == me) c->shares_gpu_ = true;
  c->heap_bytes_ = heap_bytes;
  WEFT_CHECK(transport::CudaHeap::create(boot, heap_bytes, &c->heap_));
  cudaEvent_t ev = nullptr;
  e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: cudaEventCreate: %s", c->rank_, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  c->last_call_ = ev;
  Context* raw = c.get();
  c->watchdog_ = std::thread([raw] { raw->watchdog(); });
  *out = std::move(c);
  return Status::kOk;
}

Context::~Context() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  fifos_.clear();  // before the transport that owns the rings
  if (transport_) transport_->stop();
  // Nobody frees a heap a peer still maps: a collective close, by every rank, a failed one too. A
  // rank that skipped it would leave its healthy peers waiting in the barrier for a rank that has
  // left, which the PMIx servers of a job across nodes do not always report (test_moe_gpu --stall
  // across 2 emulated nodes: the peer that never called waited out the bootstrap timeout in 3 of 6
  // runs). A peer the launcher already reported as failed ends the barrier at once; the
  // bootstrap's timeout bounds it either way.
  if (heap_) heap_->close(*boot_);
  if (last_call_) cudaEventDestroy(last_call_);
}

namespace {
bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus c = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &c) == cudaSuccess && c != cudaStreamCaptureStatusNone;
}
}  // namespace

Status Context::register_buffer(const void* p, uint64_t bytes, std::string* why) {
  std::string error;
  if (check_device_buffer(p, bytes, device_, "weft::Context::register_buffer's buffer", &error, true) != Status::kOk) {
    WEFT_WARN(kKernel, "rank %d: refused: %s", rank_, error.c_str());
    if (why) *why = error;
    return Status::kInvalidArgument;
  }
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  registered_.emplace_back(a, a + bytes);
  return Status::kOk;
}

void Context::unregister_buffer(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < registered_.size(); ++i)
    if (registered_[i].first == a) {
      registered_.erase(registered_.begin() + long(i));
      return;
    }
}

Status Context::check_buffer(const void* p, uint64_t bytes, const std::string& what, std::string* why) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const auto& r : registered_)
    if (p && a >= r.first && a <= r.second && bytes <= r.second - a) return Status::kOk;
  std::string error;
  if (check_device_buffer(p, bytes, device_, what, &error) == Status::kOk) return Status::kOk;
  WEFT_WARN(kKernel, "rank %d: refused: %s", rank_, error.c_str());
  if (why) *why = error;
  return Status::kInvalidArgument;
}

Status Context::order_call(CUstream_st* stream) {
  // Waited on whatever the stream (stream 0 included, or a new stream with a freed one's handle): on
  // the previous call's own stream the wait is already met.
  if (!order_calls_ || !has_call_ || capturing(stream)) return Status::kOk;
  const cudaError_t e = cudaStreamWaitEvent(stream, last_call_, 0);
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: ordering a call after the previous one (cudaStreamWaitEvent): %s", rank_,
              cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status Context::call_enqueued(CUstream_st* stream) {
  if (capturing(stream)) return Status::kOk;
  const cudaError_t e = cudaEventRecord(last_call_, stream);
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: recording a call's end (cudaEventRecord): %s", rank_, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  has_call_ = true;
  return Status::kOk;
}

Status Context::transport(int channels, const std::string& backend, const std::string& signal_mode,
                          transport::Transport** out) {
  if (!transport_) {
    WEFT_CHECK(check_usable("transport"));
    transport::TransportOptions options;
    options.channels = channels;
    options.workload_backend = backend;          // WEFT_NET_BACKEND still overrides
    options.workload_signal_mode = signal_mode;  // WEFT_SIGNAL_MODE still overrides
    options.fifo_memory = transport::cuda_fifo_memory();
    options.copy_hooks = transport::cuda_copy_hooks(device_);
    std::unique_ptr<transport::Transport> t;
    Status st = transport::Transport::create(*boot_, heap_->region(), options, &t);
    for (int ch = 0; st == Status::kOk && ch < t->channels(); ++ch) {
      std::unique_ptr<transport::DeviceFifoHandle> f;
      st = transport::DeviceFifoHandle::create(t->fifo_ring(ch), t->timeout_s(), &f);
      if (st == Status::kOk) fifos_.push_back(std::move(f));
    }
    if (st != Status::kOk) {
      fifos_.clear();
      if (t) t->stop();
      poison("the transport between the nodes could not be made: " + std::string(to_string(st)));
      return st;
    }
    transport_ = std::move(t);
    transport_mode_ = signal_mode;
  } else if (transport_->channels() != channels || transport_mode_ != signal_mode) {
    WEFT_WARN(kKernel,
              "rank %d: an op asks for %d proxy channels and signal mode '%s'; this context's transport has %d and "
              "'%s' (ops across nodes of one context share it)",
              rank_, channels, signal_mode.c_str(), transport_->channels(), transport_mode_.c_str());
    return Status::kInvalidArgument;
  }
  *out = transport_.get();
  return Status::kOk;
}

Status Context::reserve(uint64_t bytes, const std::string& what, uint64_t* offset) {
  const uint64_t need = (bytes + 4095) / 4096 * 4096;
  uint64_t at = UINT64_MAX;
  size_t slot = arenas_.size();
  for (size_t i = 0; i < arenas_.size(); ++i) {
    if (!arenas_[i].used && arenas_[i].bytes >= need) {
      at = arenas_[i].offset;
      slot = i;
      break;
    }
  }
  bool room = true;
  if (at == UINT64_MAX) {
    at = arenas_.empty() ? 0 : arenas_.back().offset + arenas_.back().bytes;
    if (at + need > heap_bytes_) {
      WEFT_WARN(kKernel,
                "rank %d: %s needs %llu bytes of the symmetric heap, %llu of %llu are free at its end: set "
                "WEFT_HEAP_BYTES larger",
                rank_, what.c_str(), (unsigned long long)need, (unsigned long long)(heap_bytes_ - at),
                (unsigned long long)heap_bytes_);
      room = false;
    } else {
      arenas_.push_back({at, need, true});
    }
  } else {
    // Split the free arena: the rest stays free.
    const uint64_t rest = arenas_[slot].bytes - need;
    arenas_[slot] = {at, need, true};
    if (rest > 0) arenas_.insert(arenas_.begin() + long(slot) + 1, Arena{at + need, rest, false});
  }
  // Every rank must have room, choose the same offset (the same reserve/release order everywhere) and
  // ask for the same bytes; a rank without room still takes part, so none waits.
  const uint64_t mine_words[2] = {room ? at : UINT64_MAX, bytes};
  bootstrap::Blob mine(sizeof mine_words);
  memcpy(mine.data(), mine_words, sizeof mine_words);
  std::vector<bootstrap::Blob> all;
  const Status st = boot_->allgather(key_ + "arena." + std::to_string(exchanges_++), mine, &all);
  if (st != Status::kOk) {
    if (room) release(at);
    return st;
  }
  for (int r = 0; r < size_; ++r) {
    uint64_t theirs[2] = {0, 0};
    const bool sized = r < int(all.size()) && all[r].size() == sizeof theirs;
    if (sized) memcpy(theirs, all[r].data(), sizeof theirs);
    const char* why = !sized                    ? "sent no arena"
                      : theirs[0] == UINT64_MAX ? "has no room for it"
                      : theirs[1] != bytes      ? "asked for another size"
                      : theirs[0] != at         ? "chose another offset"
                                                : nullptr;
    if (!why || (r == rank_ && !room)) continue;
    WEFT_WARN(kKernel,
              "rank %d: %s: %llu bytes at offset %llu here, rank %d %s (%llu bytes at %llu): ops and allocations "
              "must be made and freed alike, in the same order, on every rank",
              rank_, what.c_str(), (unsigned long long)bytes, (unsigned long long)at, r, why,
              (unsigned long long)theirs[1], (unsigned long long)theirs[0]);
    if (room) release(at);
    return Status::kInvalidArgument;
  }
  if (!room) return Status::kInvalidArgument;
  *offset = at;
  return Status::kOk;
}

void Context::release(uint64_t offset) {
  for (size_t i = 0; i < arenas_.size(); ++i) {
    if (arenas_[i].offset != offset) continue;
    arenas_[i].used = false;
    // Merge with free neighbours; a free arena at the end goes back to the heap's tail.
    if (i + 1 < arenas_.size() && !arenas_[i + 1].used) {
      arenas_[i].bytes += arenas_[i + 1].bytes;
      arenas_.erase(arenas_.begin() + long(i) + 1);
    }
    if (i > 0 && !arenas_[i - 1].used) {
      arenas_[i - 1].bytes += arenas_[i].bytes;
      arenas_.erase(arenas_.begin() + long(i));
    }
    while (!arenas_.empty() && !arenas_.back().used) arenas_.pop_back();
    return;
  }
}

uint64_t Context::reserved_bytes() const {
  uint64_t n = 0;
  for (const auto& a : arenas_)
    if (a.used) n += a.bytes;
  return n;
}

int Context::watch(Watch failed, std::function<void()> unstick) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  watched_.push_back({next_watch_, std::move(failed), std::move(unstick)});
  return next_watch_++;
}

void Context::unwatch(int id) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  for (size_t i = 0; i < watched_.size(); ++i)
    if (watched_[i].id == id) {  // ids are unique: one entry
      watched_.erase(watched_.begin() + long(i));
      return;
    }
}

void Context::watchdog() {
  cudaSetDevice(device_);  // unstick() enqueues on this rank's GPU
  // Once poisoned, the ops' waits are released every 100 ms: a call queued behind the stuck one may
  // reset a word the last release raised, and must drain as well.
  bool released = false;
  auto next_release = std::chrono::steady_clock::now();
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(watch_mu_);
    std::string why;
    // Until the first failure: once poisoned the ops' checks (which log) are not asked again.
    for (const auto& w : watched_)
      if (poison_.empty() && why.empty() && w.failed(&why)) break;
    // A peer that aborted (ctx.abort()), crashed or stalled, as the launcher or the liveness ring
    // reported it: this rank's device waits on that peer would only end at their timeout.
    int failed_rank = -1;
    std::string failed_why;
    if (poison_.empty() && why.empty() && boot_->peer_failure(&failed_rank, &failed_why))
      why = failed_rank == -2 ? "the launcher is gone: " + failed_why
            : failed_rank < 0 ? "a peer failed: " + failed_why
                              : "peer rank " + std::to_string(failed_rank) + " failed: " + failed_why;
    if (why.empty() && poison_.empty()) continue;
    if (!why.empty() && poison_.empty()) {
      poison_ = why;
      poisoned_ = true;
      WEFT_WARN(kKernel, "rank %d: runtime context poisoned: %s", rank_, why.c_str());
    }
    if (!released || std::chrono::steady_clock::now() >= next_release) {
      for (const auto& w : watched_) w.unstick();
      released = true;
      next_release = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    }
  }
}

std::string Context::poison_reason() const {
  std::lock_guard<std::mutex> lock(watch_mu_);
  return poison_;
}

void Context::poison(const std::string& why) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (poison_.empty()) {
    poison_ = why;
    poisoned_ = true;
    WEFT_WARN(kKernel, "rank %d: runtime context poisoned: %s", rank_, why.c_str());
  }
}

void Context::abort(const std::string& why) {
  poison(why);
  boot_->abort("rank " + std::to_string(rank_) + ": " + why);
}

Status Context::check_usable(const char* what) const {
  if (!poisoned_) return Status::kOk;
  WEFT_WARN(kKernel, "rank %d: %s refused: the context failed earlier (%s)", rank_, what, poison_reason().c_str());
  return Status::kPeerFailed;
}

}  // namespace weft::runtime
