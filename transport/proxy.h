// The proxy thread of one NIC channel: drains the GPU->proxy FIFO into a net backend under a Perseus signal mode.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "transport/fifo.h"
#include "transport/net_backend.h"
#include "transport/signal_plan.h"

namespace weft::transport {

// The signal mode (runtime/signal_mode.h, via signal_plan.h) from its spelling; logs a bad one.
Status parse_signal_mode(const std::string& text, SignalMode* out);

struct ProxyCounters {
  uint64_t puts = 0;     // put work requests posted
  uint64_t signals = 0;  // signal work requests posted (after batching)
  uint64_t fences = 0;   // signals posted with a fence flag
  uint64_t batches = 0;  // per-destination signal batches (batched mode)
  uint64_t stalls = 0;   // times the proxy blocked: serial waits, full send queues, flushes
  ProxyCounters& operator+=(const ProxyCounters& o);
};
// "puts 12 signals 12 fences 3 batches 3 stalls 0", for the line a runner prints after each run.
std::string to_string(const ProxyCounters& c);

struct ProxyConfig {
  int rank = 0;
  int channel = 0;
  int world_size = 1;
  SignalMode mode = SignalMode::kBatched;
  double timeout_s = 30;                    // WEFT_PROXY_TIMEOUT: bound on every proxy wait
  std::string cpuset;                       // "0-15,32-47" (hwloc list form) from the topology mapping; "" = not pinned
  int batch_max = 64;                       // signals per destination before a batch is posted regardless
  uint64_t batch_max_bytes = ~uint64_t{0};  // put bytes a batch may have behind it (WEFT_SIGNAL_BATCH_BYTES)
};

// Parses an hwloc list string ("0-3,8,10-11") into CPU numbers.
Status parse_cpu_list(const std::string& text, std::vector<int>* cpus);

// Owns nothing but its thread: the FIFO and backend outlive it. Never throws; the first error is
// kept (status(), error_message()) and published in the ring so producers stop waiting.
class Proxy {
 public:
  Proxy(const ProxyConfig& config, FifoRingHeader* ring, NetBackend* backend);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  Status start();
  // Completes every command pushed before the call (bounded), then joins the thread.
  Status stop();
  // Host-side flush, for rings with host or device producers: the proxy drains the FIFO, posts
  // pending batches and waits for every completion, then answers. Bounded by the proxy timeout.
  Status flush();
  Status status() const { return static_cast<Status>(status_.load(std::memory_order_acquire)); }
  std::string error_message() const;
  ProxyCounters counters() const;

 private:
  void run();
  void loop();
  Status handle(const FifoCommand& cmd);
  Status post_put(int peer, uint64_t src, uint64_t dst, uint64_t bytes);
  Status post_signal(int peer, uint64_t flag, uint64_t value);
  Status flush_batch(int peer);
  Status flush_all_batches();
  Status poll_backend();
  Status wait_room(int peer);
  Status wait_puts_done(int peer);
  Status wait_all_done(const char* why);
  // "N to rank P": the peer with the most ops posted and not completed (for timeout messages).
  std::string busiest_outstanding() const;
  Status fail(Status s, const std::string& what);
  void pin();

  ProxyConfig cfg_;
  FifoRingHeader* ring_;
  NetBackend* backend_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> flush_requested_{0}, flush_done_{0};
  // When the thread last polled its backend (every loop and every wait does): a stale value in a
  // timeout message means it is stuck inside one call (a copy hook waiting on CUDA), not idle.
  std::atomic<double> loop_seen_s_{0};
  std::atomic<int> status_{0};
  mutable std::mutex error_mutex_;
  std::string error_;

  // Thread-private state.
  std::vector<Completion> done_;
  std::vector<uint64_t> outstanding_;       // per peer: posted, not completed
  std::vector<uint64_t> outstanding_puts_;  // per peer: puts among them
  uint64_t outstanding_total_ = 0;
  uint64_t next_wr_ = 0;
  double last_completion_s_ = 0;
  SignalBatcher batcher_;

  std::atomic<uint64_t> puts_{0}, signals_{0}, fences_{0}, batches_{0}, stalls_{0};
};

}  // namespace weft::transport
