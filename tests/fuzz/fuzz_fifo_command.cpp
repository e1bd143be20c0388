// Fuzz target: FIFO commands as a GPU would push them (any op byte, peer, offsets, sizes), drained by
// a real Proxy in each signal mode into a backend that checks what reaches it and completes it at once.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "transport/fifo.h"
#include "transport/proxy.h"

using namespace weft;
using namespace weft::transport;

namespace {

constexpr int kWorld = 4;
constexpr int kSelf = 1;

// Every post the proxy makes must name a real peer other than this rank; the region bounds are
// the backend's to check (the real ones refuse out-of-region posts), so here they are only counted.
class CheckingBackend final : public NetBackend {
 public:
  const char* name() const override { return "fuzz"; }
  Status register_region(const Region&) override { return Status::kOk; }
  Status local_info(PeerInfo*) override { return Status::kOk; }
  Status connect(int, const PeerInfo&) override { return Status::kOk; }
  bool can_post(int peer) const override {
    FUZZ_ASSERT(peer >= 0 && peer < kWorld && peer != kSelf);
    return pending_.size() < 256;
  }
  Status post_put(int peer, uint64_t, uint64_t, uint64_t bytes, PostFlags, uint64_t wr_id) override {
    FUZZ_ASSERT(peer >= 0 && peer < kWorld && peer != kSelf);
    FUZZ_ASSERT(bytes > 0);  // the proxy drops empty puts
    pending_.push_back({wr_id, peer});
    return Status::kOk;
  }
  Status post_signal(int peer, uint64_t, uint64_t, PostFlags, uint64_t wr_id) override {
    FUZZ_ASSERT(peer >= 0 && peer < kWorld && peer != kSelf);
    pending_.push_back({wr_id, peer});
    return Status::kOk;
  }
  Status poll(std::vector<Completion>* done) override {
    done->insert(done->end(), pending_.begin(), pending_.end());
    pending_.clear();
    return Status::kOk;
  }
  void wait_activity(double) override {}
  Status close(const std::string&) override { return Status::kOk; }
  std::string error_message() const override { return ""; }

 private:
  std::vector<Completion> pending_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: signal mode; then up to 64 commands of 64 bytes each, in the documented layout.
  const SignalMode modes[] = {SignalMode::kSerial, SignalMode::kFenced, SignalMode::kBatched};
  ProxyConfig cfg;
  cfg.rank = kSelf;
  cfg.world_size = kWorld;
  cfg.mode = modes[data[0] % 3];
  cfg.timeout_s = 2;
  cfg.batch_max = 1 + data[0] / 3 % 8;
  ++data, --size;
  std::unique_ptr<Fifo> fifo;
  FUZZ_ASSERT(Fifo::create(64, kSelf, 0, {}, &fifo) == Status::kOk);
  const size_t n = std::min<size_t>(size / sizeof(FifoCommand), 64);
  for (size_t i = 0; i < n; ++i) {
    FifoCommand cmd;
    memcpy(static_cast<void*>(&cmd), data + i * sizeof(FifoCommand), sizeof cmd);
    uint64_t ticket = 0;
    FUZZ_ASSERT(fifo_push(fifo->ring(), fifo->host_producer_state(), cmd, 1.0, &ticket) == Status::kOk);
    FUZZ_ASSERT(ticket == i);
  }
  CheckingBackend backend;
  Proxy proxy(cfg, fifo->ring(), &backend);
  FUZZ_ASSERT(proxy.start() == Status::kOk);
  const Status s = proxy.stop();  // bounded: every command is taken, then the thread joins
  // A failed proxy names its rank and channel; a good one posted every command (nothing is pending).
  if (s != Status::kOk) FUZZ_ASSERT(proxy.error_message().find("rank 1") != std::string::npos);
  return 0;
}
