// A rank's runtime context: the bootstrap, the bound GPU, the symmetric heap and its arenas, poisoning.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/cuda_transport.h"
#include "transport/transport.h"

struct CUstream_st;
struct CUevent_st;

namespace weft::runtime {

// One per rank, created after the rank has joined the job (weftrun, srun --mpi=pmix or mpirun) and
// bound its GPU (the current CUDA device). Ops take their buffers and flags from its symmetric heap:
// an op's arena has the same offset on every rank, so a peer's buffer is (rank, offset).
//
// After a timeout or a CUDA error the context is poisoned: every later call fails fast with the
// first reason, and abort() tells the peers.
class Context {
 public:
  // Collective. heap_bytes: the symmetric heap on every rank (equal everywhere, checked).
  static Status create(bootstrap::Bootstrap& boot, uint64_t heap_bytes, std::unique_ptr<Context>* out);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  bootstrap::Bootstrap& boot() { return *boot_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  uint64_t heap_bytes() const { return heap_bytes_; }
  // Another rank of this node runs on this rank's GPU (weftrun run --oversubscribe): copies between
  // such ranks stay on one GPU and may then need SMs.
  bool shares_gpu() const { return shares_gpu_; }
  // Ranks of the job outside this context's bootstrap (other rank groups) share GPUs with it.
  void note_shared_gpu() { shares_gpu_ = true; }

  // Collective: an arena of `bytes` for an op (first fit, 4 KiB aligned). Every rank reserves and
  // releases in the same order, so the offsets agree; that is checked across ranks here.
  // Every rank must ask for the same bytes too (with first fit, different sizes would place the
  // next arena at different offsets).
  Status reserve(uint64_t bytes, const std::string& what, uint64_t* offset);
  void release(uint64_t offset);
  uint64_t reserved_bytes() const;

  void* local(uint64_t offset) const { return static_cast<char*>(heap_->local()) + offset; }
  // Every rank's heap base as mapped here (nullptr for other nodes), a device array (kernels' peers).
  void* const* device_peers() const { return heap_->device_peer_table(); }
  // nullptr for ranks on other nodes.
  void* peer(int rank, uint64_t offset) const {
    void* base = heap_->peer(rank);
    return base ? static_cast<char*>(base) + offset : nullptr;
  }

  // Collective on its first call: the transport between this context's nodes over its heap (a proxy
  // thread per channel, the rail peers connected through the plan's backend, its signal mode) and a
  // device FIFO per channel. Later calls get the same one; they must ask for the same channels and
  // mode. It stops before the heap goes.
  Status transport(int channels, const std::string& backend, const std::string& signal_mode,
                   transport::Transport** out);
  const transport::DeviceFifo& fifo(int channel) const { return fifos_[size_t(channel)]->get(); }

  // A caller's buffer an op is handed (runtime/exec/buffer_check.h): kInvalidArgument, logged with this
  // rank and the reason, when it is not device memory of this GPU with `bytes` in one allocation.
  Status check_buffer(const void* p, uint64_t bytes, const std::string& what, std::string* error = nullptr);
  // A buffer the caller vouches for (weft::Context::register_buffer): checked once, allowing pieces of
  // a virtual-memory mapping; check_buffer() then accepts any range inside it without a lookup.
  Status register_buffer(const void* p, uint64_t bytes, std::string* error);
  void unregister_buffer(const void* p);

  // One op call in flight per context: the public ops call these around every call. A call first
  // waits on the device (no host synchronisation) for the previous call to end (on another stream;
  // on the same stream the order holds already), so two ops' persistent kernels never run at once and their waits on
  // peers keep the order every rank made the calls in. Inside a stream capture nothing is waited on or recorded: a
  // graph's calls are ordered by the graph and its launches by the caller's streams.
  Status order_call(CUstream_st* stream);
  Status call_enqueued(CUstream_st* stream);
  // Tests only (test_api_order_gpu --no-order): calls no longer wait for the previous one, to show
  // the order is needed. Nothing in weft turns it off.
  void set_call_order_for_testing(bool on) { order_calls_ = on; }

  // The first failure of any op on this context; later calls fail fast with it.
  bool poisoned() const { return poisoned_.load(); }
  std::string poison_reason() const;
  void poison(const std::string& why);
  // Poisons and tells every peer (through the bootstrap), so no peer waits on this rank forever.
  void abort(const std::string& why);
  // The check every op call makes first: kPeerFailed when poisoned.
  Status check_usable(const char* what) const;

  // The watchdog: a thread that polls every registered op's `failed` (a device wait timed out: its
  // host-mapped error record) every millisecond; on the first failure it poisons the context and
  // calls every op's `unstick` (then again every 100 ms: it must be idempotent), which releases the
  // stream waits that no SM bounds, so the caller's streams drain instead of hanging, calls queued
  // behind the stuck one included. An op registers at creation and unregisters before it goes.
  using Watch = std::function<bool(std::string* why)>;
  int watch(Watch failed, std::function<void()> unstick);
  void unwatch(int id);

 private:
  Context() = default;
  struct Arena {
    uint64_t offset = 0, bytes = 0;
    bool used = false;
  };
  bootstrap::Bootstrap* boot_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0, sm_count_ = 0;
  bool shares_gpu_ = false;
  uint64_t heap_bytes_ = 0;
  std::unique_ptr<transport::CudaHeap> heap_;
  std::unique_ptr<transport::Transport> transport_;                  // made by the first transport() call
  std::vector<std::unique_ptr<transport::DeviceFifoHandle>> fifos_;  // its rings, mapped for the device
  std::string transport_mode_;                                       // the signal mode it was made with
  std::vector<Arena> arenas_;
  CUevent_st* last_call_ = nullptr;                          // recorded after each call made outside a capture
  bool has_call_ = false;                                    // a call has been recorded
  bool order_calls_ = true;                                  // off only in a test (set_call_order_for_testing)
  std::vector<std::pair<uintptr_t, uintptr_t>> registered_;  // [begin, end) of registered buffers
  int exchanges_ = 0;
  std::string key_;  // "weft.context.<n>.": this context's exchange keys (n numbered per bootstrap)
  std::string poison_;
  struct Watched {
    int id;
    Watch failed;
    std::function<void()> unstick;
  };
  void watchdog();
  mutable std::mutex watch_mu_;  // guards watched_ and poison_ against the watchdog thread
  std::atomic<bool> poisoned_{false};
  std::vector<Watched> watched_;
  int next_watch_ = 0;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace weft::runtime
