// Transport: two-phase wiring through the bootstrap, host producers, flag waits, status and counters.
#include "transport/transport.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "base/backoff.h"
#include "base/log.h"
#include "base/params.h"
#include "transport/ibverbs_backend.h"

namespace weft::transport {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int next_exchange_id(bootstrap::Bootstrap* boot) { return boot->next_exchange_id(); }

namespace {

uint64_t fresh_secret() {
  std::random_device rd;
  uint64_t s = (uint64_t{rd()} << 32) ^ rd();
  s ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
  return s ? s : 1;
}

// Every rank's `failure` ("" = none) gathered; *first = the lowest rank's, as "rank R: why" ("" if none).
Status agree(bootstrap::Bootstrap& boot, const std::string& key, const std::string& failure, std::string* first) {
  std::vector<bootstrap::Blob> all;
  bootstrap::Blob mine(failure.begin(), failure.end());
  WEFT_CHECK(boot.allgather(key, mine, &all));
  first->clear();
  for (size_t r = 0; r < all.size() && first->empty(); ++r)
    if (!all[r].empty()) {
      const std::string why(all[r].begin(), all[r].end());  // backend messages already name the rank
      *first = why.rfind("rank " + std::to_string(r) + " ", 0) == 0 ? why : "rank " + std::to_string(r) + ": " + why;
    }
  return Status::kOk;
}

// auto: each rank's candidate (resolve_backend_name) gathered; one backend only if every rank named it.
// *why_socket says why sockets were chosen ("" when another backend was).
Status agree_auto_choice(bootstrap::Bootstrap& boot, const std::string& prefix, std::string* name,
                         std::string* why_socket) {
  std::string local_why;
  if (*name == "socket") auto_backend_here(&local_why);  // no verbs device, no RDMA-capable libfabric provider
  const std::string text = *name + "|" + local_why;
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(prefix + "auto", bootstrap::Blob(text.begin(), text.end()), &all));
  std::string lacking;
  bool all_same = true;
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string theirs(all[r].begin(), all[r].end());
    const std::string their_name = theirs.substr(0, theirs.find('|'));
    all_same = all_same && their_name == *name;
    if (their_name == "socket" && lacking.empty())
      lacking =
          "rank " + std::to_string(r) + " has no usable RDMA device (" + theirs.substr(theirs.find('|') + 1) + ")";
  }
  if (all_same && *name != "socket") return Status::kOk;
  *why_socket = lacking.empty() ? "not every rank named the same backend" : lacking;
  if (!all_same && boot.info().rank == 0)
    WEFT_WARN(kTransport, "WEFT_NET_BACKEND=auto: socket on every rank: %s", why_socket->c_str());
  else if (all_same && boot.info().rank == 0)
    WEFT_INFO(kTransport, "WEFT_NET_BACKEND=auto: socket on every rank: %s", why_socket->c_str());
  *name = "socket";
  return Status::kOk;
}

// One zero-length WRITE to every connected peer on every channel, each completed within the bound:
// a QP connection that cannot carry a packet (wrong GID, route, MTU or a dead peer) fails here,
// before the first op. Returns this rank's failure ("" if none).
std::string preflight(std::vector<std::unique_ptr<NetBackend>>& backends, const std::vector<bool>& connected,
                      double timeout_s) {
  // pending[ch][p]: the zero-length WRITE to rank p on channel ch has not completed yet.
  std::vector<std::vector<bool>> pending(backends.size(), std::vector<bool>(connected.size(), false));
  size_t left = 0;
  for (size_t ch = 0; ch < backends.size(); ++ch)
    for (int p = 0; p < static_cast<int>(connected.size()); ++p) {
      if (!connected[p]) continue;
      PostFlags f;
      f.need_completion = true;
      f.delivered = true;  // ofi: FI_DELIVERY_COMPLETE, so the target's provider has processed it
      if (backends[ch]->post_put(p, 0, 0, 0, f, static_cast<uint64_t>(p)) != Status::kOk)
        return "preflight to rank " + std::to_string(p) + ": " + backends[ch]->error_message();
      pending[ch][p] = true;
      ++left;
    }
  const size_t expected = left;
  const double deadline = now_s() + timeout_s;
  std::vector<Completion> c;
  while (left > 0) {
    for (size_t ch = 0; ch < backends.size(); ++ch) {
      c.clear();
      if (backends[ch]->poll(&c) != Status::kOk) return "preflight: " + backends[ch]->error_message();
      for (const Completion& x : c)
        if (x.peer >= 0 && x.peer < static_cast<int>(connected.size()) && pending[ch][x.peer])
          pending[ch][x.peer] = false, --left;
    }
    if (left == 0) break;
    if (now_s() > deadline) {
      std::string who;
      for (size_t ch = 0; ch < backends.size(); ++ch)
        for (size_t p = 0; p < connected.size(); ++p)
          if (pending[ch][p] && who.size() < 200)
            who += (who.empty() ? "" : ", ") + ("rank " + std::to_string(p) + " (channel " + std::to_string(ch) + ")");
      return "preflight: " + std::to_string(left) + " of " + std::to_string(expected) +
             " zero-length RDMA WRITEs not completed after " + std::to_string(int(timeout_s)) +
             "s (WEFT_PROXY_TIMEOUT); no answer from " + who;
    }
    for (auto& b : backends) b->wait_activity(1e-3);
  }
  return "";
}

// agree() on a thread of its own while this one keeps every backend progressing: a rank whose own
// preflight writes completed must still drive its endpoint for its peers' writes (with manual
// progress, as tcp;ofi_rxm and efa have, their delivery needs the target to read its queue) until
// every rank is done.
Status agree_progressing(bootstrap::Bootstrap& boot, const std::string& key, const std::string& failure,
                         std::string* first, std::vector<std::unique_ptr<NetBackend>>& backends) {
  std::atomic<bool> done{false};
  Status st = Status::kOk;
  std::thread agreeing([&] {
    st = agree(boot, key, failure, first);
    done.store(true, std::memory_order_release);
  });
  std::vector<Completion> ignored;  // a straggling preflight write's completion, nothing else yet
  while (!done.load(std::memory_order_acquire)) {
    bool idle = true;
    for (auto& b : backends) {
      if (!b) continue;
      ignored.clear();
      if (b->poll(&ignored) == Status::kOk) {
        b->wait_activity(1e-3);
        idle = false;
      }
    }
    if (idle) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // failed backends: nothing to drive
  }
  agreeing.join();
  return st;
}

}  // namespace

Status resolve_signal_mode(const std::string& explicit_mode, const std::string& workload_mode, SignalMode* out) {
  std::string env;
  WEFT_CHECK(get_param("WEFT_SIGNAL_MODE", &env));
  const std::string& m = !explicit_mode.empty()   ? explicit_mode
                         : !env.empty()           ? env
                         : !workload_mode.empty() ? workload_mode
                                                  : std::string("batched");
  return parse_signal_mode(m, out);
}

Status Transport::create(bootstrap::Bootstrap& boot, const Region& heap, const TransportOptions& options,
                         std::unique_ptr<Transport>* out) {
  const bootstrap::RankInfo& me = boot.info();
  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = me.rank;
  t->size_ = me.size;
  t->heap_ = heap;
  t->connected_.assign(me.size, false);
  if (!heap.base || heap.bytes < 8) {
    WEFT_WARN(kTransport, "rank %d: transport needs a symmetric heap (got %llu bytes)", me.rank,
              (unsigned long long)heap.bytes);
    return Status::kInvalidArgument;
  }
  if (options.channels < 1 || options.channels > 64) {
    WEFT_WARN(kTransport, "rank %d: %d channels requested (1..64)", me.rank, options.channels);
    return Status::kInvalidArgument;
  }

  // Precedence: the caller's explicit choice, then the environment, then the workload, then auto.
  std::string requested = options.backend;
  const char* env_backend = getenv("WEFT_NET_BACKEND");
  if (requested.empty() && !(env_backend && *env_backend)) requested = options.workload_backend;
  if (requested.empty()) WEFT_CHECK(get_param("WEFT_NET_BACKEND", &requested));
  WEFT_CHECK(resolve_backend_name(requested, &t->backend_name_));  // auto: this rank's candidate, agreed below
  WEFT_CHECK(resolve_signal_mode(options.signal_mode, options.workload_signal_mode, &t->mode_));
  t->timeout_s_ = options.timeout_s > 0 ? options.timeout_s : 0;
  if (t->timeout_s_ == 0) WEFT_CHECK(get_param("WEFT_PROXY_TIMEOUT", &t->timeout_s_));
  int64_t depth = options.fifo_depth;
  if (depth == 0) WEFT_CHECK(get_param("WEFT_FIFO_DEPTH", &depth));
  if (depth <= 0 || depth > (1 << 24) || !is_power_of_two(static_cast<uint64_t>(depth))) {
    WEFT_WARN(kTransport, "rank %d: FIFO depth %lld is not a power of two in [2, 2^24] (WEFT_FIFO_DEPTH)", me.rank,
              (long long)depth);
    return Status::kInvalidArgument;
  }
  std::string ifname;
  WEFT_CHECK(get_param("WEFT_SOCKET_IFNAME", &ifname));
  int64_t batch_bytes = 0;
  WEFT_CHECK(get_param("WEFT_SIGNAL_BATCH_BYTES", &batch_bytes));

  // The job secret and the layout, in one exchange of 16 bytes per rank: rank 0 draws the secret,
  // every rank takes rank 0's. Only processes that took part in this job's bootstrap know it; socket
  // streams carrying anything else are refused. Each rank's (node, local index) gives every rank the
  // layout its peer set is computed from (the same answer on both ends of every connection).
  const std::string prefix = "weft.transport." + std::to_string(next_exchange_id(&boot)) + ".";
  std::vector<bootstrap::Blob> all;
  uint64_t secret = me.rank == 0 ? fresh_secret() : 0;
  const int32_t where[2] = {me.node, me.local_rank};
  bootstrap::Blob mine(sizeof secret + sizeof where);
  memcpy(mine.data(), &secret, sizeof secret);
  memcpy(mine.data() + sizeof secret, where, sizeof where);
  WEFT_CHECK(boot.allgather(prefix + "secret", mine, &all));
  bool well_formed = all.size() == static_cast<size_t>(me.size);
  for (size_t r = 0; r < all.size() && well_formed; ++r) well_formed = all[r].size() == mine.size();
  if (!well_formed) {
    WEFT_WARN(kTransport, "rank %d: the job secret and layout exchange returned malformed blobs", me.rank);
    return Status::kProtocolError;
  }
  memcpy(&secret, all[0].data(), sizeof secret);
  for (const auto& b : all) {
    int32_t w[2];
    memcpy(w, b.data() + sizeof secret, sizeof w);
    t->layout_.node_of.push_back(w[0]);
    t->layout_.local_of.push_back(w[1]);
  }
  if (normalize_layout(&t->layout_) && me.rank == 0)
    WEFT_INFO(kTransport,
              "the launcher's node ids or local ranks are not dense; numbered in rank order for the peer set");
  std::string why_peers;
  if (transport::peer_set(t->layout_, me.rank, options.peers, &t->peer_set_, &why_peers) != Status::kOk) {
    WEFT_WARN(kTransport, "rank %d: cannot choose the peers to connect (%s): %s", me.rank, to_string(options.peers),
              why_peers.c_str());
    return Status::kInvalidArgument;
  }
  const std::vector<int>& peers = t->peer_set_.net;

  // Placement: the caller's, else the topology mapping's for this rank's GPU.
  const bool place = options.use_topology && options.channel_nics.empty() && options.channel_cpusets.empty();
  if (place) t->placement_ = rank_placement(me, options.gpu_pci_bus_id, options.channels);
  t->placement_.channels.resize(options.channels);
  for (int ch = 0; ch < options.channels; ++ch) {
    topology::ChannelPlacement& cp = t->placement_.channels[ch];
    if (ch < static_cast<int>(options.channel_nics.size())) cp.nic_name = options.channel_nics[ch];
    if (ch < static_cast<int>(options.channel_ports.size())) cp.port = options.channel_ports[ch];
    if (ch < static_cast<int>(options.channel_cpusets.size())) cp.cpuset = options.channel_cpusets[ch];
    ChannelUse use;
    use.nic = cp.nic_name;
    use.port = cp.port;
    use.port_state = cp.port_state;
    use.cpus_wanted = cp.cpuset;
    use.cpus_used = usable_cpus(cp.cpuset);  // a topology from another machine may name CPUs we lack
    if (!use.cpus_wanted.empty() && use.cpus_used != use.cpus_wanted)
      WEFT_INFO(kTransport, "rank %d channel %d: proxy CPUs %s from the mapping; usable here: %s", me.rank, ch,
                use.cpus_wanted.c_str(), use.cpus_used.empty() ? "none (unpinned)" : use.cpus_used.c_str());
    t->channel_use_.push_back(use);
  }

  // Backends: open every channel, connect, and (RDMA) preflight each connection -- every step agreed
  // by all ranks, so the job either runs on one backend everywhere or fails here, before any op.
  // With auto, a backend that fails on any rank gives way to sockets on every rank.
  const bool is_auto = requested.empty() || requested == "auto";
  std::string why_socket;
  if (is_auto) WEFT_CHECK(agree_auto_choice(boot, prefix, &t->backend_name_, &why_socket));
  std::vector<std::unique_ptr<NetBackend>> backends;
  for (int attempt = 0;; ++attempt) {
    const std::string key = prefix + std::to_string(attempt) + ".";
    std::string failure;  // this rank's, "" if none
    Status mine_status = Status::kOk;
    backends.clear();
    t->connected_.assign(me.size, false);
    t->connections_opened_ = 0;
    for (int ch = 0; ch < options.channels && failure.empty(); ++ch) {
      BackendConfig bc;
      bc.rank = me.rank;
      bc.size = me.size;
      bc.channel = ch;
      bc.secret = secret;
      bc.timeout_s = t->timeout_s_;
      bc.socket_ifname = ifname;
      bc.copy_hooks = options.copy_hooks;
      bc.nic_name = t->placement_.channels[ch].nic_name;
      bc.nic_port = t->placement_.channels[ch].port;
      bc.peers = peers;
      std::unique_ptr<NetBackend> backend;
      std::string why;  // ibverbs says why a device did not open
      Status s = t->backend_name_ == "ibverbs" ? make_ibverbs_backend(bc, &backend, &why)
                                               : make_backend(t->backend_name_, bc, &backend);
      if (s == Status::kOk) s = backend->register_region(heap);
      mine_status = s;
      if (s != Status::kOk)
        failure = backend && !backend->error_message().empty() ? backend->error_message()
                  : !why.empty()                               ? why
                                                               : t->backend_name_ + ": " + to_string(s);
      backends.push_back(std::move(backend));
    }
    std::string first;
    WEFT_CHECK(agree(boot, key + "open", failure, &first));
    for (int ch = 0; ch < options.channels && first.empty(); ++ch) {
      // Endpoints: every rank takes part in every exchange; a rank that failed sends an empty blob.
      PeerInfo info;
      bootstrap::Blob blob;
      if (failure.empty()) {
        Status s = backends[ch]->local_info(&info);
        if (s == Status::kOk)
          blob = encode_peer_info(me.rank, me.node, info);
        else
          failure = backends[ch]->error_message();
      }
      // Every rank publishes; this rank reads its peers' blobs only (PMIx: O(peers) gets).
      WEFT_CHECK(boot.allgather_from(key + "ep." + std::to_string(ch), blob, peers, &all));
      if (all.size() != static_cast<size_t>(me.size)) {  // a broken bootstrap must not be read past its end
        WEFT_WARN(kTransport, "rank %d channel %d: the bootstrap returned %zu endpoint blobs for %d ranks", me.rank, ch,
                  all.size(), me.size);
        return Status::kProtocolError;
      }
      // Only the peer set's blobs are decoded: O(peers) work per rank.
      for (size_t i = 0; i < peers.size() && failure.empty(); ++i) {
        const int peer = peers[i];
        if (all[peer].empty()) continue;  // that rank failed; the agreement below says so
        int node = -1;
        PeerInfo pinfo;
        Status s = decode_peer_info(all[peer], peer, &node, &pinfo);
        if (s == Status::kOk && node != t->layout_.node_of[peer]) {
          WEFT_WARN(kTransport, "rank %d: rank %d's endpoint names node %d, its layout entry node %d", me.rank, peer,
                    node, t->layout_.node_of[peer]);
          s = Status::kProtocolError;
        }
        if (s == Status::kOk) s = backends[ch]->connect(peer, pinfo);
        if (s == Status::kOk)
          t->connected_[peer] = true, ++t->connections_opened_;
        else
          failure = backends[ch]->error_message().empty()
                        ? "connecting to rank " + std::to_string(peer) + ": " + to_string(s)
                        : backends[ch]->error_message();
      }
    }
    if (first.empty()) WEFT_CHECK(agree(boot, key + "connect", failure, &first));
    if (first.empty() && (t->backend_name_ == "ibverbs" || t->backend_name_ == "ofi")) {
      failure = preflight(backends, t->connected_, t->timeout_s_);
      WEFT_CHECK(agree_progressing(boot, key + "preflight", failure, &first, backends));
    }
    if (first.empty()) break;
    backends.clear();
    if (is_auto && t->backend_name_ != "socket") {
      why_socket = first;
      if (me.rank == 0)  // the same decision on every rank: said once
        WEFT_WARN(kTransport, "WEFT_NET_BACKEND=auto: socket on every rank, because %s failed: %s",
                  t->backend_name_.c_str(), first.c_str());
      t->backend_name_ = "socket";
      continue;
    }
    if (me.rank == 0)
      WEFT_WARN(kTransport, "the %s backend is not usable on every rank, so no rank uses it: %s",
                t->backend_name_.c_str(), first.c_str());
    return mine_status != Status::kOk ? mine_status : Status::kUnsupported;
  }
  t->backend_reason_ = is_auto ? (why_socket.empty() ? "auto: every rank can use " + t->backend_name_
                                                     : "auto chose socket: " + why_socket)
                               : "requested";
  for (auto& use : t->channel_use_) use.nic_used = t->backend_name_ == "ibverbs" && !use.nic.empty();
  if (place || !options.channel_nics.empty())
    WEFT_INFO(kTransport, "rank %d: %s", me.rank, t->placement_summary().c_str());
  for (int ch = 0; ch < options.channels; ++ch) {
    std::unique_ptr<NetBackend>& backend = backends[ch];
    std::unique_ptr<Fifo> fifo;
    WEFT_CHECK(Fifo::create(static_cast<uint32_t>(depth), me.rank, ch, options.fifo_memory, &fifo));
    ProxyConfig pc;
    pc.rank = me.rank;
    pc.channel = ch;
    pc.world_size = me.size;
    pc.mode = t->mode_;
    pc.timeout_s = t->timeout_s_;
    pc.batch_max_bytes = batch_bytes > 0 ? static_cast<uint64_t>(batch_bytes) : ~uint64_t{0};
    pc.cpuset = t->channel_use_[ch].cpus_used;
    auto proxy = std::make_unique<Proxy>(pc, fifo->ring(), backend.get());
    WEFT_CHECK(proxy->start());
    t->fifos_.push_back(std::move(fifo));
    t->backends_.push_back(std::move(backend));
    t->proxies_.push_back(std::move(proxy));
  }
  WEFT_INFO(kTransport,
            "rank %d: transport up: backend %s, signal mode %s, %d channel(s), FIFO depth %lld, %zu peer(s) (%s), "
            "%d connection(s)",
            me.rank, t->backend_name_.c_str(), to_string(t->mode_), options.channels, (long long)depth, peers.size(),
            to_string(options.peers), t->connections_opened_);
  *out = std::move(t);
  return Status::kOk;
}

Transport::~Transport() { stop(); }

std::string Transport::placement_summary() const { return describe_placement(placement_, channel_use_, backend_name_); }

Status Transport::push(int channel, const FifoCommand& cmd) {
  if (channel < 0 || channel >= channels()) {
    WEFT_WARN(kTransport, "rank %d: push on channel %d of %d", rank_, channel, channels());
    return Status::kInvalidArgument;
  }
  if (stopped_) return Status::kInternal;
  return fifo_push(fifos_[channel]->ring(), fifos_[channel]->host_producer_state(), cmd, timeout_s_);
}

Status Transport::put(int channel, int peer, uint64_t src_offset, uint64_t dst_offset, uint64_t bytes) {
  return push(channel, make_fifo_command(FifoOp::kPut, peer, src_offset, dst_offset, bytes, 0, 0));
}

Status Transport::signal(int channel, int peer, uint64_t flag_offset, uint64_t value) {
  return push(channel, make_fifo_command(FifoOp::kSignal, peer, 0, 0, 0, flag_offset, value));
}

Status Transport::put_signal(int channel, int peer, uint64_t src_offset, uint64_t dst_offset, uint64_t bytes,
                             uint64_t flag_offset, uint64_t value) {
  return push(channel, make_fifo_command(FifoOp::kPutSignal, peer, src_offset, dst_offset, bytes, flag_offset, value));
}

Status Transport::flush() {
  // Through the proxies, not the FIFO: works whether host or device threads feed a ring.
  for (auto& p : proxies_) WEFT_CHECK(p->flush());
  return Status::kOk;
}

Status Transport::wait_flag(uint64_t flag_offset, uint64_t at_least, const char* what) const {
  if (heap_.kind != MemKind::kHost || flag_offset % 8 || flag_offset + 8 > heap_.bytes) {
    WEFT_WARN(kTransport, "rank %d: wait_flag(%llu) needs an aligned flag in a host heap", rank_,
              (unsigned long long)flag_offset);
    return Status::kInvalidArgument;
  }
  const uint64_t* flag = reinterpret_cast<const uint64_t*>(static_cast<const char*>(heap_.base) + flag_offset);
  if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) >= at_least) return Status::kOk;
  const double deadline = now_s() + timeout_s_;
  Backoff backoff;  // a wait for another rank may last: never hold the CPU it needs (base/backoff.h)
  for (;;) {
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) >= at_least) return Status::kOk;
    Status s = status();
    if (s != Status::kOk) return s;
    if (now_s() > deadline) {
      WEFT_WARN(kTransport,
                "rank %d: timed out after %.0fs waiting for %s (flag at offset %llu to reach %llu, it is %llu)", rank_,
                timeout_s_, what, (unsigned long long)flag_offset, (unsigned long long)at_least,
                (unsigned long long)__atomic_load_n(flag, __ATOMIC_ACQUIRE));
      return Status::kTimeout;
    }
    backoff.pause();
  }
}

Status Transport::status() const {
  for (const auto& p : proxies_) {
    Status s = p->status();
    if (s != Status::kOk) return s;
  }
  return Status::kOk;
}

std::string Transport::error_message() const {
  for (const auto& p : proxies_)
    if (p->status() != Status::kOk) return p->error_message();
  return "";
}

TransportCounters Transport::counters() const {
  TransportCounters c;
  for (const auto& p : proxies_) c += p->counters();
  return c;
}

uint64_t Transport::producer_stalls() const {
  uint64_t n = 0;
  for (const auto& f : fifos_) n += __atomic_load_n(&f->host_producer_state()->stalls, __ATOMIC_RELAXED);
  return n;
}

Status Transport::stop() {
  if (stopped_) return status();
  stopped_ = true;
  Status result = Status::kOk;
  for (auto& p : proxies_) {
    Status s = p->stop();
    if (result == Status::kOk) result = s;
  }
  const std::string failure = result == Status::kOk ? "" : error_message();
  for (auto& b : backends_) {
    // A failed proxy already logged why; closing still releases sockets and queue pairs, and tells
    // peers why this rank is leaving.
    Status s = b->close(failure);
    if (result == Status::kOk) result = s;
  }
  return result;
}

}  // namespace weft::transport
