// Proxy thread: FIFO drain, signal ordering (serial / fenced / batched), completion accounting, bounded waits.
#include "transport/proxy.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "base/backoff.h"
#include "base/log.h"

namespace weft::transport {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr uint64_t kPutBit = 1;  // wr_id = (sequence << 1) | is_put

}  // namespace

Status parse_signal_mode(const std::string& text, SignalMode* out) {
  if (text == "serial") return *out = SignalMode::kSerial, Status::kOk;
  if (text == "fenced") return *out = SignalMode::kFenced, Status::kOk;
  if (text == "batched") return *out = SignalMode::kBatched, Status::kOk;
  WEFT_WARN(kTransport, "signal mode '%s' is not one of serial, fenced, batched (WEFT_SIGNAL_MODE)", text.c_str());
  return Status::kInvalidArgument;
}

ProxyCounters& ProxyCounters::operator+=(const ProxyCounters& o) {
  puts += o.puts;
  signals += o.signals;
  fences += o.fences;
  batches += o.batches;
  stalls += o.stalls;
  return *this;
}

std::string to_string(const ProxyCounters& c) {
  return "puts " + std::to_string(c.puts) + " signals " + std::to_string(c.signals) + " fences " +
         std::to_string(c.fences) + " batches " + std::to_string(c.batches) + " stalls " + std::to_string(c.stalls);
}

Status parse_cpu_list(const std::string& text, std::vector<int>* cpus) {
  cpus->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string tok = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    if (tok.empty()) continue;
    char* end = nullptr;
    long a = strtol(tok.c_str(), &end, 10);
    long b = a;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    if (*end || a < 0 || b < a || b >= CPU_SETSIZE) {
      WEFT_WARN(kProxy, "cpu list '%s': '%s' is not N or N-M", text.c_str(), tok.c_str());
      return Status::kInvalidArgument;
    }
    for (long c = a; c <= b; ++c) cpus->push_back(static_cast<int>(c));
  }
  return Status::kOk;
}

Proxy::Proxy(const ProxyConfig& config, FifoRingHeader* ring, NetBackend* backend)
    : cfg_(config),
      ring_(ring),
      backend_(backend),
      outstanding_(config.world_size, 0),
      outstanding_puts_(config.world_size, 0),
      batcher_(config.world_size, config.batch_max, config.batch_max_bytes) {}

Proxy::~Proxy() {
  if (thread_.joinable()) stop();
}

Status Proxy::start() {
  if (thread_.joinable()) return Status::kOk;
  stop_.store(false);
  loop_seen_s_.store(now_s(), std::memory_order_relaxed);
  thread_ = std::thread([this] { run(); });
  return Status::kOk;
}

Status Proxy::stop() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    thread_.join();
  }
  return status();
}

Status Proxy::flush() {
  const uint64_t seq = flush_requested_.fetch_add(1) + 1;
  const double deadline = now_s() + cfg_.timeout_s;
  Backoff backoff;  // the proxy thread may need this core to answer (base/backoff.h)
  while (flush_done_.load(std::memory_order_acquire) < seq) {
    if (status() != Status::kOk) return status();
    if (!thread_.joinable()) return Status::kInternal;
    if (now_s() > deadline) {
      const double stuck = now_s() - loop_seen_s_.load(std::memory_order_relaxed);
      const std::string state = stuck > 1
                                    ? "its thread has been inside one backend call for " +
                                          std::to_string(static_cast<int>(stuck)) + "s: a copy hook blocked in CUDA?"
                                    : std::string("its thread is running");
      WEFT_WARN(kProxy, "rank %d channel %d: flush not completed by the proxy within %.1fs (%s; ring tail %llu)",
                cfg_.rank, cfg_.channel, cfg_.timeout_s, state.c_str(),
                (unsigned long long)__atomic_load_n(&ring_->tail, __ATOMIC_ACQUIRE));
      return Status::kTimeout;
    }
    backoff.pause();
  }
  return Status::kOk;
}

std::string Proxy::error_message() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

ProxyCounters Proxy::counters() const {
  ProxyCounters c;
  c.puts = puts_.load(std::memory_order_relaxed);
  c.signals = signals_.load(std::memory_order_relaxed);
  c.fences = fences_.load(std::memory_order_relaxed);
  c.batches = batches_.load(std::memory_order_relaxed);
  c.stalls = stalls_.load(std::memory_order_relaxed);
  return c;
}

// The message is stored before the status is published: a thread that sees the failure (status(), the
// ring's error word) and asks why always gets the reason, never an empty string.
Status Proxy::fail(Status s, const std::string& what) {
  const std::string backend_err = what.empty() ? backend_->error_message() : std::string();
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (status_.load(std::memory_order_acquire) != 0) return s;  // the first failure is the cause
  error_ = what.empty() ? backend_err : what;
  if (!what.empty()) WEFT_WARN(kProxy, "%s", error_.c_str());
  status_.store(static_cast<int>(s), std::memory_order_release);
  int32_t zero = 0;
  __atomic_compare_exchange_n(&ring_->error, &zero, static_cast<int32_t>(s), false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  return s;
}

void Proxy::pin() {
  if (cfg_.cpuset.empty()) return;  // no mapping (no NIC, or topology unknown): the OS places us
  std::vector<int> cpus;
  if (parse_cpu_list(cfg_.cpuset, &cpus) != Status::kOk || cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc)
    WEFT_INFO(kProxy, "rank %d channel %d: cannot pin the proxy to cpus %s (%s); running unpinned", cfg_.rank,
              cfg_.channel, cfg_.cpuset.c_str(), strerror(rc));
  else
    WEFT_INFO(kProxy, "rank %d channel %d: proxy pinned to cpus %s", cfg_.rank, cfg_.channel, cfg_.cpuset.c_str());
}

void Proxy::run() {
  try {
    pin();
    backend_->on_proxy_thread();
    loop();
  } catch (const std::exception& e) {
    fail(Status::kInternal, "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) +
                                ": proxy: unexpected exception: " + e.what());
  } catch (...) {
    fail(Status::kInternal, "rank " + std::to_string(cfg_.rank) + ": proxy: unexpected exception");
  }
}

void Proxy::loop() {
  FifoConsumer fifo(ring_);
  last_completion_s_ = now_s();
  double idle_since = 0;
  for (;;) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    int n = 0;
    FifoCommand cmd;
    while (n < 64 && fifo.peek(&cmd)) {
      ++n;
      if (command_op(cmd.word) == FifoOp::kFlush) {
        fifo.release();
        if (handle(cmd) != Status::kOk) return;
        fifo.publish_flushed(command_ticket(cmd.word));
        continue;
      }
      if (handle(cmd) != Status::kOk) return;
    }
    if (n) fifo.release();
    // A host flush is answered once the FIFO ran dry (n < 64: everything pushed before it is taken).
    const uint64_t want = flush_requested_.load(std::memory_order_acquire);
    if (want > flush_done_.load(std::memory_order_relaxed) && n < 64) {
      if (flush_all_batches() != Status::kOk || wait_all_done("flush") != Status::kOk) return;
      flush_done_.store(want, std::memory_order_release);
    }
    const uint64_t before = outstanding_total_;
    if (poll_backend() != Status::kOk) return;
    // A batch closes when the FIFO has nothing more for now: signals wait at most one drain round.
    if (n == 0 && batcher_.pending() && flush_all_batches() != Status::kOk) return;
    if (n || outstanding_total_ != before) {
      idle_since = 0;
      continue;
    }
    if (stopping && outstanding_total_ == 0 && batcher_.pending() == 0) return;
    if (outstanding_total_ && now_s() - last_completion_s_ > cfg_.timeout_s) {
      fail(Status::kTimeout, "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) +
                                 ": proxy: no completion for " + std::to_string((int)cfg_.timeout_s) + "s with " +
                                 std::to_string(outstanding_total_) + " ops outstanding (e.g. " +
                                 busiest_outstanding() + ") (WEFT_PROXY_TIMEOUT)");
      return;
    }
    // Idle: spin (yielding) briefly, since the next command usually follows soon, then sleep in the
    // backend (woken by network traffic; FIFO commands wait at most the sleep), longer after 20 ms.
    const double t = now_s();
    if (idle_since == 0) idle_since = t;
    if (t - idle_since < 200e-6)
      sched_yield();
    else
      backend_->wait_activity(outstanding_total_ || t - idle_since < 20e-3 ? 20e-6 : 500e-6);
  }
}

Status Proxy::handle(const FifoCommand& cmd) {
  const FifoOp op = command_op(cmd.word);
  const int peer = static_cast<int>(cmd.peer);
  if (op != FifoOp::kFlush && (peer < 0 || peer >= cfg_.world_size || peer == cfg_.rank))
    return fail(Status::kInvalidArgument, "rank " + std::to_string(cfg_.rank) + " channel " +
                                              std::to_string(cfg_.channel) + ": FIFO command for invalid peer " +
                                              std::to_string(peer));
  switch (op) {
    case FifoOp::kPut:
      return post_put(peer, cmd.src_offset, cmd.dst_offset, cmd.bytes);
    case FifoOp::kSignal:
      return post_signal(peer, cmd.flag_offset, cmd.signal_value);
    case FifoOp::kPutSignal:
      WEFT_CHECK(post_put(peer, cmd.src_offset, cmd.dst_offset, cmd.bytes));
      return post_signal(peer, cmd.flag_offset, cmd.signal_value);
    case FifoOp::kFlush:
      WEFT_CHECK(flush_all_batches());
      return wait_all_done("flush");
    default:
      return fail(Status::kProtocolError, "rank " + std::to_string(cfg_.rank) + " channel " +
                                              std::to_string(cfg_.channel) + ": FIFO command with unknown op " +
                                              std::to_string(static_cast<int>(op)));
  }
}

Status Proxy::post_put(int peer, uint64_t src, uint64_t dst, uint64_t bytes) {
  if (bytes == 0) return Status::kOk;
  // Batched signals already waiting for this peer go out before a put that would delay them too much.
  if (cfg_.mode == SignalMode::kBatched && batcher_.close_before_put(peer, bytes)) WEFT_CHECK(flush_batch(peer));
  WEFT_CHECK(wait_room(peer));
  PostFlags f;
  f.need_completion = cfg_.mode == SignalMode::kSerial;
  Status s = backend_->post_put(peer, src, dst, bytes, f, (next_wr_++ << 1) | kPutBit);
  if (s != Status::kOk) return fail(s, "");
  ++outstanding_[peer];
  ++outstanding_puts_[peer];
  ++outstanding_total_;
  puts_.fetch_add(1, std::memory_order_relaxed);
  return Status::kOk;
}

Status Proxy::post_signal(int peer, uint64_t flag, uint64_t value) {
  if (cfg_.mode == SignalMode::kBatched) {
    if (batcher_.add(peer, flag, value)) return flush_batch(peer);
    return Status::kOk;
  }
  if (proxy_waits_before_signal(cfg_.mode)) WEFT_CHECK(wait_puts_done(peer));
  WEFT_CHECK(wait_room(peer));
  PostFlags f;
  f.fence = signal_fence(cfg_.mode, true);
  Status s = backend_->post_signal(peer, flag, value, f, next_wr_++ << 1);
  if (s != Status::kOk) return fail(s, "");
  ++outstanding_[peer];
  ++outstanding_total_;
  signals_.fetch_add(1, std::memory_order_relaxed);
  if (f.fence) fences_.fetch_add(1, std::memory_order_relaxed);
  return Status::kOk;
}

Status Proxy::flush_batch(int peer) {
  if (!batcher_.pending(peer)) return Status::kOk;
  // One fence (on the first signal) orders the whole batch after every earlier put to this peer.
  for (const SignalPost& sp : batcher_.take(peer)) {
    WEFT_CHECK(wait_room(peer));
    PostFlags f;
    f.fence = sp.fence;
    Status s = backend_->post_signal(peer, sp.flag, sp.value, f, next_wr_++ << 1);
    if (s != Status::kOk) return fail(s, "");
    ++outstanding_[peer];
    ++outstanding_total_;
    signals_.fetch_add(1, std::memory_order_relaxed);
    if (f.fence) fences_.fetch_add(1, std::memory_order_relaxed);
  }
  batches_.fetch_add(1, std::memory_order_relaxed);
  return Status::kOk;
}

Status Proxy::flush_all_batches() {
  for (int p = 0; p < cfg_.world_size; ++p) WEFT_CHECK(flush_batch(p));
  return Status::kOk;
}

Status Proxy::poll_backend() {
  loop_seen_s_.store(now_s(), std::memory_order_relaxed);  // every loop and every bounded wait comes here
  done_.clear();
  Status s = backend_->poll(&done_);
  if (s != Status::kOk) return fail(s, "");
  for (const Completion& c : done_) {
    if (c.peer < 0 || c.peer >= cfg_.world_size || !outstanding_[c.peer]) continue;
    --outstanding_[c.peer];
    --outstanding_total_;
    if (c.wr_id & kPutBit) --outstanding_puts_[c.peer];
  }
  if (!done_.empty()) last_completion_s_ = now_s();
  return Status::kOk;
}

Status Proxy::wait_room(int peer) {
  if (backend_->can_post(peer)) return Status::kOk;
  stalls_.fetch_add(1, std::memory_order_relaxed);
  const double deadline = now_s() + cfg_.timeout_s;
  while (!backend_->can_post(peer)) {
    WEFT_CHECK(poll_backend());
    if (now_s() > deadline)
      return fail(Status::kTimeout, "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) +
                                        ": proxy: send queue to rank " + std::to_string(peer) + " full for " +
                                        std::to_string((int)cfg_.timeout_s) + "s (WEFT_PROXY_TIMEOUT)");
    backend_->wait_activity(20e-6);
  }
  return Status::kOk;
}

Status Proxy::wait_puts_done(int peer) {
  if (!outstanding_puts_[peer]) return Status::kOk;
  stalls_.fetch_add(1, std::memory_order_relaxed);  // the serialisation Perseus removes
  const double deadline = now_s() + cfg_.timeout_s;
  while (outstanding_puts_[peer]) {
    WEFT_CHECK(poll_backend());
    if (!outstanding_puts_[peer]) break;
    if (now_s() > deadline)
      return fail(Status::kTimeout, "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) +
                                        ": proxy (serial mode): " + std::to_string(outstanding_puts_[peer]) +
                                        " puts to rank " + std::to_string(peer) + " not completed within " +
                                        std::to_string((int)cfg_.timeout_s) + "s before a signal");
    backend_->wait_activity(5e-6);
  }
  return Status::kOk;
}

std::string Proxy::busiest_outstanding() const {
  size_t peer = 0;
  for (size_t p = 0; p < outstanding_.size(); ++p)
    if (outstanding_[p] > outstanding_[peer]) peer = p;
  return std::to_string(outstanding_.empty() ? 0 : outstanding_[peer]) + " to rank " + std::to_string(peer);
}

Status Proxy::wait_all_done(const char* why) {
  if (!outstanding_total_) return Status::kOk;
  stalls_.fetch_add(1, std::memory_order_relaxed);
  const double deadline = now_s() + cfg_.timeout_s;
  while (outstanding_total_) {
    WEFT_CHECK(poll_backend());
    if (!outstanding_total_) break;
    if (now_s() > deadline)
      return fail(Status::kTimeout, "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) +
                                        ": proxy: " + why + ": " + std::to_string(outstanding_total_) +
                                        " ops not completed within " + std::to_string((int)cfg_.timeout_s) +
                                        "s (e.g. " + busiest_outstanding() + ") (WEFT_PROXY_TIMEOUT)");
    backend_->wait_activity(5e-6);
  }
  return Status::kOk;
}

}  // namespace weft::transport
