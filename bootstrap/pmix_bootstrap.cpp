// PmixBootstrap: every PMIx call is issued non-blocking and waited on with our own deadline, because
// not every PMIx server honours PMIX_TIMEOUT; a dead peer reported by the launcher ends waits early.
#include "bootstrap/pmix_bootstrap.h"

#include <pmix.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {

struct PmixBootstrap::State {
  std::mutex mu;
  int failed_rank = -1;  // -2: the server itself is gone
  std::string failed_why;
  pmix_proc_t me;
};

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kPutKind = 1;
constexpr uint16_t kPutVersion = 1;
constexpr const char* kHowToLaunch =
    "start ranks with 'weftrun check|run' (embedded PMIx server), 'srun --mpi=pmix weftrun ...' under Slurm, "
    "or 'mpirun -n N weftrun ...' with Open MPI";

// How long a rank that gives up waits for its PMIx_Abort to be answered: the request is on its way
// once sent; the answer can take seconds (a launcher cut off by the fault) and nothing depends on it.
constexpr double kAbortWaitS = 0.5;

std::shared_ptr<PmixBootstrap::State> g_state;  // for the event handler, which has no cbdata
PmixBootstrap* g_self = nullptr;

// One outstanding non-blocking PMIx call. The callback may run after the waiter gave up, so the
// callback owns a reference too. libpmix 4.2's PMIx_Get_nb keeps the key and info pointers it is
// given and reads them later on its progress thread, so the Op owns both until the callback ran.
struct Op {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  pmix_status_t status = PMIX_SUCCESS;
  pmix_value_t value;  // for gets, copied in the callback
  bool has_value = false;
  char key[PMIX_MAX_KEYLEN + 1] = {};
  pmix_info_t info[2];
  Op() {
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
  }
  ~Op() {
    if (has_value) PMIx_Value_destruct(&value);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
  }
};

void complete(std::shared_ptr<Op>* holder, pmix_status_t status, pmix_value_t* v) {
  std::shared_ptr<Op> op = *holder;
  delete holder;
  std::lock_guard<std::mutex> lock(op->mu);
  op->status = status;
  if (status == PMIX_SUCCESS && v && PMIx_Value_xfer(&op->value, v) == PMIX_SUCCESS) op->has_value = true;
  op->done = true;
  op->cv.notify_all();
}
void op_cb(pmix_status_t status, void* cbdata) { complete(static_cast<std::shared_ptr<Op>*>(cbdata), status, nullptr); }
void value_cb(pmix_status_t status, pmix_value_t* v, void* cbdata) {
  complete(static_cast<std::shared_ptr<Op>*>(cbdata), status, v);
}

// Runs `fn` on a helper thread and waits at most `seconds`; a blocking PMIx call that never returns
// (no server, a wedged one) then cannot hang the rank.
bool run_bounded(std::function<void()> fn, double seconds) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();
  std::thread([d, fn] {
    fn();
    std::lock_guard<std::mutex> lock(d->mu);
    d->done = true;
    d->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(d->mu);
  return d->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return d->done; });
}

bool to_u64(const pmix_value_t& v, uint64_t* out) {
  switch (v.type) {
    case PMIX_UINT8:
      *out = v.data.uint8;
      return true;
    case PMIX_UINT16:
      *out = v.data.uint16;
      return true;
    case PMIX_UINT32:
      *out = v.data.uint32;
      return true;
    case PMIX_UINT64:
      *out = v.data.uint64;
      return true;
    case PMIX_INT:
      *out = static_cast<uint64_t>(v.data.integer);
      return true;
    case PMIX_INT8:
      *out = static_cast<uint64_t>(v.data.int8);
      return true;
    case PMIX_INT16:
      *out = static_cast<uint64_t>(v.data.int16);
      return true;
    case PMIX_INT32:
      *out = static_cast<uint64_t>(v.data.int32);
      return true;
    case PMIX_INT64:
      *out = static_cast<uint64_t>(v.data.int64);
      return true;
    case PMIX_UINT:
      *out = v.data.uint;
      return true;
    case PMIX_SIZE:
      *out = v.data.size;
      return true;
    case PMIX_PROC_RANK:
      *out = v.data.rank;
      return true;
    default:
      return false;
  }
}

void on_event(size_t, pmix_status_t status, const pmix_proc_t* source, pmix_info_t info[], size_t ninfo, pmix_info_t*,
              size_t, pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata) {
  int rank = source ? static_cast<int>(source->rank) : -1;
  std::string text;
  bool clean_exit = false;
  for (size_t i = 0; i < ninfo; ++i) {
    if (!strcmp(info[i].key, PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC && info[i].value.data.proc)
      rank = static_cast<int>(info[i].value.data.proc->rank);
    else if (!strcmp(info[i].key, PMIX_EVENT_TEXT_MESSAGE) && info[i].value.type == PMIX_STRING &&
             info[i].value.data.string)
      text = info[i].value.data.string;
    else if (!strcmp(info[i].key, PMIX_EXIT_CODE)) {
      uint64_t code = 1;
      clean_exit = to_u64(info[i].value, &code) && code == 0;
    }
  }
  if (status == PMIX_ERR_LOST_CONNECTION) {
    rank = -2;
    if (text.empty()) text = "lost the connection to the PMIx server (the launcher is gone)";
  }
  if (text.empty()) text = std::string("reported ") + PMIx_Error_string(status);
  if (g_self && !clean_exit && (rank == -2 || rank != g_self->info().rank)) g_self->note_peer_failed(rank, text);
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, nullptr, 0, nullptr, nullptr, cbdata);
}

pmix_scope_t to_pmix(Scope s) {
  switch (s) {
    case Scope::kLocal:
      return PMIX_LOCAL;
    case Scope::kRemote:
      return PMIX_REMOTE;
    case Scope::kGlobal:
      break;
  }
  return PMIX_GLOBAL;
}

// PMIx connections this process has made, counted from 0 (see key_prefix_).
std::atomic<int> g_connections{0};

// libpmix counts PMIx_Init calls and disconnects at the last PMIx_Finalize. The first connection
// takes one more, released at exit, so that a bootstrap destroyed and made again (a program's second
// weft::Context) stays connected in between: a rank's disconnect reaching the server after its
// peers had entered the next connection's first fence failed that fence ("a rank left the job",
// 1 run in 12 of three connections in a row under weftrun).
void release_process_connection() {
  run_bounded([] { PMIx_Finalize(nullptr, 0); }, 5.0);  // as a destructor's bound at most
}

}  // namespace

bool started_under_pmix() {
  if (!getenv("PMIX_NAMESPACE") || !getenv("PMIX_RANK")) return false;
  for (char** e = environ; *e; ++e)
    if (!strncmp(*e, "PMIX_SERVER_URI", 15)) return true;
  return false;
}

void PmixBootstrap::note_peer_failed(int rank, const std::string& why) {
  if (rank == -1) rank = -3;  // an event that names no rank: still a failure (-1 means none)
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->failed_rank != -1) return;  // the first report is the cause
  state_->failed_rank = rank;
  state_->failed_why = why;
}

bool PmixBootstrap::peer_failure(int* rank, std::string* why) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->failed_rank == -1) return false;
  *rank = state_->failed_rank;
  *why = state_->failed_why;
  return true;
}

Status PmixBootstrap::wait_peer_failure(const std::string& what) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->failed_rank == -1) return Status::kOk;
  if (state_->failed_rank == -2)
    WEFT_WARN(kBoot, "rank %d: %s while waiting in %s", info_.rank, state_->failed_why.c_str(), what.c_str());
  else
    WEFT_WARN(kBoot, "rank %d: peer rank %d failed (%s) while rank %d waited in %s", info_.rank, state_->failed_rank,
              state_->failed_why.c_str(), info_.rank, what.c_str());
  return Status::kPeerFailed;
}

namespace {
// Waits for `op` until `deadline`, waking every 50 ms to notice a peer failure.
Status wait_op(const std::shared_ptr<Op>& op, Clock::time_point deadline, const std::function<Status()>& failed) {
  std::unique_lock<std::mutex> lock(op->mu);
  while (!op->done) {
    auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(50));
    op->cv.wait_until(lock, slice, [&] { return op->done; });
    if (op->done) break;
    lock.unlock();
    Status s = failed();
    if (s != Status::kOk) return s;
    if (Clock::now() >= deadline) return Status::kTimeout;
    lock.lock();
  }
  return Status::kOk;
}

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Non-blocking get with our deadline. `out` receives a copy the caller destructs (through Op).
std::shared_ptr<Op> start_get(const pmix_proc_t& proc, const std::string& key, bool immediate) {
  auto op = std::make_shared<Op>();
  if (key.size() > PMIX_MAX_KEYLEN) {  // our keys are short; a longer one is a bug here, not a peer's
    op->status = PMIX_ERR_BAD_PARAM;
    op->done = true;
    return op;
  }
  std::memcpy(op->key, key.c_str(), key.size() + 1);
  bool yes = true;
  PMIX_INFO_LOAD(&op->info[0], PMIX_IMMEDIATE, &yes, PMIX_BOOL);
  auto* holder = new std::shared_ptr<Op>(op);
  // PMIX_TIMEOUT is not passed: libpmix 4.2 answers a get carrying it with PMIX_ERR_TIMEOUT at once
  // when the value is not cached yet. Our own deadline bounds the wait instead.
  pmix_status_t rc = PMIx_Get_nb(&proc, op->key, immediate ? op->info : nullptr, immediate ? 1 : 0, value_cb, holder);
  if (rc != PMIX_SUCCESS) {
    delete holder;
    op->status = rc;
    op->done = true;
  }
  return op;
}
}  // namespace

Status PmixBootstrap::connect(std::unique_ptr<PmixBootstrap>* out) {
  double timeout = 60;
  WEFT_CHECK(get_param("WEFT_BOOTSTRAP_TIMEOUT", &timeout));
  if (!started_under_pmix()) {
    WEFT_WARN(kBoot,
              "no PMIx server in this process's environment (PMIX_NAMESPACE/PMIX_RANK/PMIX_SERVER_URI* unset): %s",
              kHowToLaunch);
    return Status::kUnsupported;
  }
  std::unique_ptr<PmixBootstrap> self(new PmixBootstrap());
  self->timeout_s_ = timeout;
  self->state_ = std::make_shared<State>();
  auto state = self->state_;
  auto rc = std::make_shared<pmix_status_t>(PMIX_ERROR);
  if (!run_bounded([state, rc] { *rc = PMIx_Init(&state->me, nullptr, 0); }, timeout)) {
    WEFT_WARN(kBoot,
              "PMIx_Init did not return within WEFT_BOOTSTRAP_TIMEOUT=%.1f s (namespace %s, rank %s): the "
              "PMIx server did not answer; %s",
              timeout, getenv("PMIX_NAMESPACE"), getenv("PMIX_RANK"), kHowToLaunch);
    return Status::kTimeout;
  }
  if (*rc != PMIX_SUCCESS) {
    WEFT_WARN(kBoot, "PMIx_Init failed: %s (namespace %s, rank %s); %s", PMIx_Error_string(*rc),
              getenv("PMIX_NAMESPACE"), getenv("PMIX_RANK"), kHowToLaunch);
    return Status::kSystemError;
  }
  self->initialized_ = true;
  // The job's key space outlives a connection: the PMIx server (and the node's folder) still hold
  // every entry an earlier connection of this rank put, so a rank that connects again (a second
  // weft::Context) names its keys after the connection, never reading the last one's entries.
  // Every rank connects the same number of times, in the same order: the names agree.
  const int connection = g_connections.fetch_add(1);
  if (connection > 0) self->key_prefix_ = "c" + std::to_string(connection) + ".";
  if (connection == 0) {
    pmix_proc_t again;
    if (PMIx_Init(&again, nullptr, 0) == PMIX_SUCCESS) atexit(release_process_connection);
  }
  self->info_.rank = static_cast<int>(state->me.rank);
  self->info_.nspace = state->me.nspace;
  log::set_rank(self->info_.rank);
  g_state = state;
  g_self = self.get();

  pmix_status_t codes[] = {
      PMIX_PROC_TERMINATED,  PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_ERR_LOST_CONNECTION,
#ifdef PMIX_ERR_PROC_ABORTED
      PMIX_ERR_PROC_ABORTED, PMIX_ERR_PROC_ABORTING,
#endif
  };
  pmix_status_t ref =
      PMIx_Register_event_handler(codes, sizeof codes / sizeof codes[0], nullptr, 0, on_event, nullptr, nullptr);
  if (ref < 0)
    WEFT_INFO(kBoot, "rank %d: could not register for peer-failure events (%s); failures surface as timeouts",
              self->info_.rank, PMIx_Error_string(ref));
  WEFT_CHECK(self->query_identity());
  Status s = self->start_liveness();
  if (s != Status::kOk) {
    // Under a launcher that does not stop jobs by itself, a rank that never joined would keep the job
    // (and its allocation) forever: ask the launcher to end it.
    std::string msg = "rank " + std::to_string(self->info_.rank) +
                      ": the job did not assemble (the liveness exchange failed: " + to_string(s) + ")";
    self->node_.leave();  // the launcher may SIGKILL this rank once it acts on the abort
    run_bounded([msg] { PMIx_Abort(1, msg.c_str(), nullptr, 0); }, kAbortWaitS);
    return s;
  }
  *out = std::move(self);
  return Status::kOk;
}

Status PmixBootstrap::query_identity() {
  pmix_proc_t wild;
  PMIX_PROC_CONSTRUCT(&wild);
  PMIX_LOAD_PROCID(&wild, state_->me.nspace, PMIX_RANK_WILDCARD);
  auto get_num = [&](const pmix_proc_t& proc, const char* key, uint64_t* v, bool required) -> Status {
    auto op = start_get(proc, key, false);
    Status s = wait_op(op, deadline_after(timeout_s_), [] { return Status::kOk; });
    if (s == Status::kOk && op->status == PMIX_SUCCESS && op->has_value && to_u64(op->value, v)) return Status::kOk;
    if (!required) return Status::kNotFound;
    WEFT_WARN(kBoot, "rank %d: the PMIx server did not provide %s (%s)", info_.rank, key,
              s != Status::kOk ? "timed out" : PMIx_Error_string(op->status));
    return s != Status::kOk ? s : Status::kNotFound;
  };
  uint64_t v = 0;
  WEFT_CHECK(get_num(wild, PMIX_JOB_SIZE, &v, true));
  info_.size = static_cast<int>(v);
  info_.local_rank = get_num(state_->me, PMIX_LOCAL_RANK, &v, false) == Status::kOk ? static_cast<int>(v) : 0;
  info_.local_size = get_num(wild, PMIX_LOCAL_SIZE, &v, false) == Status::kOk ? static_cast<int>(v) : 1;
  info_.node = get_num(state_->me, PMIX_NODEID, &v, false) == Status::kOk ? static_cast<int>(v) : 0;
  if (get_num(wild, PMIX_NUM_NODES, &v, false) == Status::kOk) {
    info_.num_nodes = static_cast<int>(v);
  } else {
    // Some servers give node ids but not the count: the count is one more than the largest id.
    int max_node = info_.node;
    pmix_proc_t peer = state_->me;
    for (int r = 0; r < info_.size; ++r) {
      peer.rank = static_cast<pmix_rank_t>(r);
      if (get_num(peer, PMIX_NODEID, &v, false) == Status::kOk) max_node = std::max(max_node, static_cast<int>(v));
    }
    info_.num_nodes = max_node + 1;
  }
  auto op = start_get(state_->me, PMIX_HOSTNAME, false);
  if (wait_op(op, deadline_after(timeout_s_), [] { return Status::kOk; }) == Status::kOk && op->has_value &&
      op->value.type == PMIX_STRING && op->value.data.string) {
    info_.hostname = op->value.data.string;
  } else {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    info_.hostname = host;
  }
  WEFT_INFO(kBoot, "rank %d/%d: local rank %d/%d, node %d/%d (%s), namespace %s", info_.rank, info_.size,
            info_.local_rank, info_.local_size, info_.node, info_.num_nodes, info_.hostname.c_str(),
            info_.nspace.c_str());
  return Status::kOk;
}

Status PmixBootstrap::start_liveness() {
  std::string mode = "auto";
  WEFT_CHECK(get_param("WEFT_LIVENESS", &mode));
  const bool events = !strncmp(info_.nspace.c_str(), "weft.", 5) || getenv("OMPI_COMM_WORLD_SIZE");
  if (info_.size < 2 || mode == "off" || (mode == "auto" && events)) return Status::kOk;
  Liveness::Options o;
  WEFT_CHECK(get_param("WEFT_LIVENESS_TIMEOUT", &o.timeout_s));
  WEFT_CHECK(get_param("WEFT_SOCKET_IFNAME", &o.ifname));
  const int me = info_.rank;
  auto on_failure = [this, me](int rank, const std::string& why) {
    WEFT_WARN(kBoot, "rank %d: peer rank %d failed: %s", me, rank, why.c_str());
    note_peer_failed(rank, why);
  };
  // Still running `grace` after a peer failed (stuck in a wait that the failure did not end): leave,
  // so that the job ends within a bound instead of at an outer timeout.
  auto on_give_up = [this, me](int rank, const std::string& why) {
    fprintf(stderr, "weftrun: rank %d: exiting: peer rank %d failed (%s)\n", me, rank, why.c_str());
    fflush(stderr);
    node_.leave();
    std::string msg = "rank " + std::to_string(me) + ": peer rank " + std::to_string(rank) + " failed: " + why;
    run_bounded([msg] { PMIx_Abort(1, msg.c_str(), nullptr, 0); }, kAbortWaitS);
    _exit(1);
  };
  return Liveness::start(*this, o, on_failure, on_give_up, &liveness_);
}

PmixBootstrap::~PmixBootstrap() {
  int failed = -1;
  std::string why;
  if (liveness_ && liveness_->failure(&failed, &why) && failed != info_.rank && initialized_) {
    // A peer died or stalled and this launcher does not stop jobs by itself (srun without
    // --kill-on-bad-exit): ask it to end the job, so that a stopped or hung rank does not outlive it.
    std::string msg =
        "rank " + std::to_string(info_.rank) + ": peer rank " + std::to_string(failed) + " failed: " + why;
    node_.leave();  // the launcher may SIGKILL this rank once it acts on the abort
    run_bounded([msg] { PMIx_Abort(1, msg.c_str(), nullptr, 0); }, kAbortWaitS);
  }
  liveness_.reset();  // goodbye to the neighbours (after no failure) before this rank leaves the job
  if (!initialized_) return;
  initialized_ = false;
  // After a peer failure the server may never answer; do not let finalize hang the exit.
  // The job was aborted above: the server has nothing more to tell this rank.
  const double bound = failed >= 0 && failed != info_.rank ? 1.0 : std::min(timeout_s_, 5.0);
  if (!run_bounded([] { PMIx_Finalize(nullptr, 0); }, bound))
    WEFT_INFO(kBoot, "rank %d: PMIx_Finalize did not return in time; exiting anyway", info_.rank);
  if (g_self == this) g_self = nullptr;
}

Status PmixBootstrap::put(const std::string& key, const Blob& blob, Scope scope) {
  if (blob.size() > kMaxBlobBytes - 8) {  // peers refuse more (open_blob), so fail here, naming it
    WEFT_WARN(kBoot, "rank %d: put of '%s': %zu bytes, more than a blob may hold (%zu)", info_.rank, key.c_str(),
              blob.size(), kMaxBlobBytes - 8);
    return Status::kInvalidArgument;
  }
  BlobWriter w;
  w.u32(static_cast<uint32_t>(info_.rank));
  w.bytes(blob);
  Blob sealed = seal_blob(kPutKind, kPutVersion, w.blob());
  if (node_ready_) WEFT_CHECK(node_.publish(key_prefix_ + key, sealed));
  pmix_value_t val;
  PMIX_VALUE_CONSTRUCT(&val);
  val.type = PMIX_BYTE_OBJECT;
  val.data.bo.bytes = reinterpret_cast<char*>(sealed.data());
  val.data.bo.size = sealed.size();
  pmix_status_t rc = PMIx_Put(to_pmix(scope), pmix_key(key).c_str(), &val);  // copies the value
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kBoot, "rank %d: PMIx_Put of '%s' (%zu bytes) failed: %s", info_.rank, key.c_str(), blob.size(),
              PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  return Status::kOk;
}

std::string PmixBootstrap::missing_ranks(uint64_t seq) {
  // Every rank puts an arrival marker before entering the fence; a peer whose marker its server
  // cannot produce now never reached the fence.
  std::string key = pmix_key("arrive." + std::to_string(seq));
  std::vector<std::shared_ptr<Op>> ops(info_.size);
  pmix_proc_t peer = state_->me;
  for (int r = 0; r < info_.size; ++r) {
    if (r == info_.rank) continue;
    peer.rank = static_cast<pmix_rank_t>(r);
    ops[r] = start_get(peer, key, false);
  }
  auto deadline = deadline_after(std::min(2.0, std::max(0.5, timeout_s_ / 4)));
  std::string missing;
  int count = 0;
  for (int r = 0; r < info_.size; ++r) {
    if (!ops[r]) continue;
    Status s = wait_op(ops[r], deadline, [] { return Status::kOk; });
    if (s == Status::kOk && ops[r]->status == PMIX_SUCCESS) continue;
    if (count++ < 32) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (count > 32) missing += ", ... (" + std::to_string(count) + " in all)";
  return count ? missing : std::string("none found (all ranks arrived; the server did not complete the fence)");
}

Status PmixBootstrap::fence(const std::string& tag, bool collect) {
  uint64_t seq = fence_seq_++;
  std::string what = "fence '" + tag + "'";
  WEFT_CHECK(wait_peer_failure(what));
  pmix_value_t marker;
  PMIX_VALUE_CONSTRUCT(&marker);
  marker.type = PMIX_UINT32;
  marker.data.uint32 = static_cast<uint32_t>(info_.rank);
  PMIx_Put(PMIX_GLOBAL, pmix_key("arrive." + std::to_string(seq)).c_str(), &marker);
  pmix_status_t rc = PMIx_Commit();
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kBoot, "rank %d: PMIx_Commit before %s failed: %s", info_.rank, what.c_str(), PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  int t = static_cast<int>(std::ceil(timeout_s_));
  auto op = std::make_shared<Op>();  // owns the info until the callback, as for gets
  PMIX_INFO_LOAD(&op->info[0], PMIX_TIMEOUT, &t, PMIX_INT);
  PMIX_INFO_LOAD(&op->info[1], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  auto* holder = new std::shared_ptr<Op>(op);
  auto t0 = Clock::now();
  rc = PMIx_Fence_nb(nullptr, 0, op->info, 2, op_cb, holder);
  if (rc != PMIX_SUCCESS) {
    delete holder;
    WEFT_WARN(kBoot, "rank %d: PMIx_Fence_nb for %s failed to start: %s", info_.rank, what.c_str(),
              PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  Status s = wait_op(op, deadline_after(timeout_s_), [&] { return wait_peer_failure(what); });
  if (s == Status::kPeerFailed) return s;
  if (s == Status::kTimeout || op->status == PMIX_ERR_TIMEOUT) {
    double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    WEFT_WARN(kBoot, "rank %d: %s timed out after %.1f s (WEFT_BOOTSTRAP_TIMEOUT=%.1f); ranks that did not arrive: %s",
              info_.rank, what.c_str(), waited, timeout_s_, missing_ranks(seq).c_str());
    return Status::kTimeout;
  }
  if (op->status != PMIX_SUCCESS) {
    // libpmix fails a fence whose participant died (PARTIAL SUCCESS, LOST CONNECTION) before the
    // launcher's event naming the dead rank arrives: wait a moment for the name.
    for (int i = 0; i < 50; ++i) {
      WEFT_CHECK(wait_peer_failure(what));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    WEFT_WARN(kBoot, "rank %d: %s failed: %s (a rank left the job; ranks that had not arrived: %s)", info_.rank,
              what.c_str(), PMIx_Error_string(op->status), missing_ranks(seq).c_str());
    return Status::kPeerFailed;
  }
  return Status::kOk;
}

Status PmixBootstrap::get(int peer, const std::string& key, Blob* out) {
  std::string what = "get of '" + key + "' from rank " + std::to_string(peer);
  pmix_proc_t proc = state_->me;
  proc.rank = static_cast<pmix_rank_t>(peer);
  // libpmix 5.0 answers a get of data that a collecting fence has just delivered with
  // PMIX_ERR_TIMEOUT or NOT_FOUND at once now and then (seen with its own server and with mpirun's):
  // ask again, with a growing pause, until our own deadline.
  const auto deadline = deadline_after(timeout_s_);
  std::shared_ptr<Op> op;
  Status s = Status::kOk;
  for (int attempt = 0;; ++attempt) {
    op = start_get(proc, pmix_key(key), false);
    s = wait_op(op, deadline, [&] { return wait_peer_failure(what); });
    const bool retry = s == Status::kOk && (op->status == PMIX_ERR_TIMEOUT || op->status == PMIX_ERR_NOT_FOUND);
    if (!retry || Clock::now() >= deadline) break;
    WEFT_TRACE(kBoot, "rank %d: %s: attempt %d answered %s; asking again", info_.rank, what.c_str(), attempt + 1,
               PMIx_Error_string(op->status));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 + attempt, 50)));
  }
  if (s == Status::kTimeout || (s == Status::kOk && op->status == PMIX_ERR_TIMEOUT)) {
    WEFT_WARN(kBoot, "rank %d: %s timed out after %.1f s (%s; rank %d did not publish it)", info_.rank, what.c_str(),
              timeout_s_, s == Status::kTimeout ? "no answer" : PMIx_Error_string(op->status), peer);
    return Status::kTimeout;
  }
  WEFT_CHECK(s);
  if (op->status != PMIX_SUCCESS || !op->has_value) {
    WEFT_WARN(kBoot, "rank %d: %s failed: %s", info_.rank, what.c_str(), PMIx_Error_string(op->status));
    return Status::kNotFound;
  }
  if (op->value.type != PMIX_BYTE_OBJECT) {
    WEFT_WARN(kBoot, "rank %d: %s: value of PMIx type %d, not a byte object", info_.rank, what.c_str(), op->value.type);
    return Status::kProtocolError;
  }
  // Checked before the copy: the size is the peer's word.
  if (op->value.data.bo.size > kMaxBlobBytes + 2 * kBlobHeaderBytes + 8) {
    WEFT_WARN(kBoot, "rank %d: %s: %zu bytes, more than a blob may hold (%zu)", info_.rank, what.c_str(),
              op->value.data.bo.size, kMaxBlobBytes);
    return Status::kProtocolError;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(op->value.data.bo.bytes);
  return decode_entry(peer, key, Blob(p, p + op->value.data.bo.size), out);
}

Status PmixBootstrap::decode_entry(int peer, const std::string& key, const Blob& sealed, Blob* out) const {
  Blob payload;
  WEFT_CHECK(open_blob(sealed, kPutKind, kPutVersion, peer, key.c_str(), &payload));
  BlobReader r(payload);
  uint32_t from = 0;
  if (!r.u32(&from) || !r.bytes(out) || !r.done() || static_cast<int>(from) != peer) {
    WEFT_WARN(kBoot, "rank %d: entry '%s' of rank %d is malformed (claims rank %u)", info_.rank, key.c_str(), peer,
              from);
    return Status::kProtocolError;
  }
  return Status::kOk;
}

Status PmixBootstrap::allgather_scoped(const std::string& key, const Blob& mine, Scope scope, std::vector<Blob>* all,
                                       const std::vector<int>* from) {
  if (!node_tried_) {  // once: a refused folder is warned about once, then PMIx serves every exchange
    node_tried_ = true;
    node_ready_ = node_.init(info_.nspace, info_.rank) == Status::kOk;
  }
  WEFT_CHECK(put(key, mine, scope));
  WEFT_CHECK(fence("allgather " + key, true));
  // Every rank has passed this fence, so none still reads the files of earlier exchanges.
  if (node_ready_) node_.retire_all_but(key_prefix_ + key);
  all->assign(info_.size, Blob());
  (*all)[info_.rank] = mine;
  std::vector<int> nodes;
  if (scope != Scope::kGlobal) {
    // Which peers share our node: PMIx's job data, asked once per call (cheap, served locally).
    nodes.assign(info_.size, -1);
    pmix_proc_t peer = state_->me;
    for (int r = 0; r < info_.size; ++r) {
      peer.rank = static_cast<pmix_rank_t>(r);
      auto op = start_get(peer, PMIX_NODEID, false);
      uint64_t v = 0;
      if (wait_op(op, deadline_after(timeout_s_), [] { return Status::kOk; }) == Status::kOk && op->has_value &&
          to_u64(op->value, &v))
        nodes[r] = static_cast<int>(v);
    }
  }
  std::vector<bool> wanted;
  if (from) {
    wanted.assign(info_.size, false);
    for (int r : *from)
      if (r >= 0 && r < info_.size) wanted[r] = true;
  }
  std::string via_files, via_pmix;  // which path each peer's entry took, for the INFO line below
  for (int r = 0; r < info_.size; ++r) {
    if (r == info_.rank || (from && !wanted[r])) continue;
    if (scope == Scope::kLocal && nodes[r] != info_.node) continue;
    if (scope == Scope::kRemote && nodes[r] == info_.node) continue;
    Blob sealed;
    if (node_ready_ && node_.fetch(key_prefix_ + key, r, &sealed)) {
      WEFT_CHECK(decode_entry(r, key, sealed, &(*all)[r]));
      via_files += " " + std::to_string(r);
      continue;
    }
    WEFT_CHECK(get(r, key, &(*all)[r]));
    via_pmix += " " + std::to_string(r);
  }
  WEFT_INFO(kBoot, "rank %d (%s): %s '%s': same-host files from ranks [%s ], PMIx from ranks [%s ]", info_.rank,
            info_.hostname.c_str(), from ? "allgather_from" : "allgather", key.c_str(), via_files.c_str(),
            via_pmix.c_str());
  return Status::kOk;
}

Status PmixBootstrap::allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) {
  return allgather_scoped(key, mine, Scope::kGlobal, all);
}

Status PmixBootstrap::allgather_from(const std::string& key, const Blob& mine, const std::vector<int>& from,
                                     std::vector<Blob>* some) {
  return allgather_scoped(key, mine, Scope::kGlobal, some, &from);
}

Status PmixBootstrap::barrier(const std::string& tag) { return fence("barrier " + tag, false); }

Status PmixBootstrap::subset_allgather(const std::string& scope, const std::string& key,
                                       const std::vector<int>& members, const Blob& mine, std::vector<Blob>* all) {
  for (int peer : members) {
    if (peer < 0 || peer >= info_.size) {
      WEFT_WARN(kBoot, "rank %d: %s.%s: member %d is not a rank of the %d-rank job", info_.rank, scope.c_str(),
                key.c_str(), peer, info_.size);
      return Status::kInvalidArgument;
    }
  }
  // The members' entries come the way every exchange's do: same-host files where the node's folder
  // serves them, else PMIx (libpmix 5 does not serve a peer's put after a fence without data, so a
  // bare put/fence/get is not enough there). Only the members' entries are read.
  std::vector<Blob> job;
  WEFT_CHECK(allgather_scoped(scope + "." + key, mine, Scope::kGlobal, &job, &members));
  all->assign(members.size(), Blob());
  for (size_t i = 0; i < members.size(); ++i) (*all)[i] = std::move(job[static_cast<size_t>(members[i])]);
  return Status::kOk;
}

void PmixBootstrap::abort(const std::string& why) {
  WEFT_WARN(kBoot, "rank %d: aborting the job: %s", info_.rank, why.c_str());
  if (liveness_) liveness_->announce_own_failure(why);
  node_.leave();  // the launcher may SIGKILL this rank once it acts on the abort
  std::string msg = "rank " + std::to_string(info_.rank) + ": " + why;
  // The launcher replies once it has recorded the abort; do not wait forever if it cannot.
  run_bounded([msg] { PMIx_Abort(1, msg.c_str(), nullptr, 0); }, std::min(timeout_s_, 10.0));
}

Status PmixBootstrap::subset_barrier(const std::string&, const std::string& tag, const std::vector<int>&) {
  return fence("group barrier " + tag, false);
}

}  // namespace weft::bootstrap
