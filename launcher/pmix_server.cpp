// EmbeddedServer: libpmix's server API driven from weftrun. Upcalls only queue work; replies and
// decisions happen on the launcher's loop (see platform notes in docs/bootstrap.md).
#include "launcher/pmix_server.h"

#include <fcntl.h>
#include <pmix.h>
#include <pmix_server.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "base/log.h"

namespace weft::launcher {
namespace {

EmbeddedServer* g_server = nullptr;

// Waits for a libpmix op callback (register_nspace, register_client run on its progress thread).
struct Sync {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  pmix_status_t status = PMIX_SUCCESS;
  pmix_status_t wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; })) return PMIX_ERR_TIMEOUT;
    return status;
  }
};
void sync_cb(pmix_status_t status, void* cbdata) {
  auto* s = static_cast<Sync*>(cbdata);
  std::lock_guard<std::mutex> lock(s->mu);
  s->status = status;
  s->done = true;
  s->cv.notify_all();
}

pmix_status_t on_client_finalized(const pmix_proc_t* proc, void*, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  if (g_server) {
    g_server->record_finalized(static_cast<int>(proc->rank));
    g_server->post([cbfunc, cbdata] {
      if (cbfunc) cbfunc(PMIX_SUCCESS, cbdata);
    });
  }
  return PMIX_SUCCESS;
}

pmix_status_t on_abort(const pmix_proc_t* proc, void*, int status, const char msg[], pmix_proc_t[], size_t,
                       pmix_op_cbfunc_t cbfunc, void* cbdata) {
  if (!g_server) return PMIX_ERR_NOT_SUPPORTED;
  g_server->record_abort({static_cast<int>(proc->rank), status, msg ? msg : ""});
  g_server->post([cbfunc, cbdata] {
    if (cbfunc) cbfunc(PMIX_SUCCESS, cbdata);
  });
  return PMIX_SUCCESS;
}

// Called only when libpmix thinks some participant is not local (it completes all-local fences
// itself). This server hosts every rank, so the collected data is exactly what it was given.
pmix_status_t on_fence(const pmix_proc_t[], size_t, const pmix_info_t[], size_t, char* data, size_t ndata,
                       pmix_modex_cbfunc_t cbfunc, void* cbdata) {
  if (!g_server) return PMIX_ERR_NOT_SUPPORTED;
  char* copy = nullptr;
  if (ndata) {
    copy = static_cast<char*>(malloc(ndata));
    memcpy(copy, data, ndata);
  }
  g_server->post([copy, ndata, cbfunc, cbdata] {
    cbfunc(
        PMIX_SUCCESS, copy, ndata, cbdata, [](void* p) { free(p); }, copy);
  });
  return PMIX_SUCCESS;
}

// No other server exists to ask: data this one does not hold does not exist.
pmix_status_t on_direct_modex(const pmix_proc_t*, const pmix_info_t[], size_t, pmix_modex_cbfunc_t cbfunc,
                              void* cbdata) {
  if (!g_server) return PMIX_ERR_NOT_SUPPORTED;
  g_server->post([cbfunc, cbdata] { cbfunc(PMIX_ERR_NOT_FOUND, nullptr, 0, cbdata, nullptr, nullptr); });
  return PMIX_SUCCESS;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

void add_u32(void* list, const char* key, uint32_t v) { PMIx_Info_list_add(list, key, &v, PMIX_UINT32); }
void add_u16(void* list, const char* key, uint16_t v) { PMIx_Info_list_add(list, key, &v, PMIX_UINT16); }
void add_str(void* list, const char* key, const std::string& v) {
  PMIx_Info_list_add(list, key, v.c_str(), PMIX_STRING);
}
// Moves `inner` (a list) into `outer` as a data array under `key`.
void add_array(void* outer, const char* key, void* inner) {
  pmix_data_array_t arr;
  PMIx_Info_list_convert(inner, &arr);
  PMIx_Info_list_add(outer, key, &arr, PMIX_DATA_ARRAY);
  PMIx_Data_array_destruct(&arr);
  PMIx_Info_list_release(inner);
}

// The running libpmix's major version ("OpenPMIx 4.2.2rc2 (...)" -> 4), so that one binary does the
// right thing with whichever libpmix it runs against.
int pmix_major_version() {
  const char* v = PMIx_Get_version();
  while (v && *v && !isdigit(static_cast<unsigned char>(*v))) ++v;
  return v && *v ? atoi(v) : 0;
}

}  // namespace

Status make_layout(int ranks, int nodes, const std::string& real_host, JobLayout* out) {
  if (ranks < 1 || nodes < 1 || nodes > ranks) {
    WEFT_WARN(kLaunch, "cannot place %d ranks on %d emulated nodes (need 1 <= nodes <= ranks)", ranks, nodes);
    return Status::kInvalidArgument;
  }
  JobLayout l;
  l.ranks = ranks;
  l.nodes = nodes;
  l.local_size_of.assign(nodes, ranks / nodes);
  for (int k = 0; k < ranks % nodes; ++k) l.local_size_of[k]++;
  for (int k = 0; k < nodes; ++k) {
    l.hostname_of_node.push_back(nodes == 1 ? real_host : real_host + "-node" + std::to_string(k));
    for (int i = 0; i < l.local_size_of[k]; ++i) {
      l.node_of.push_back(k);
      l.local_rank_of.push_back(i);
    }
  }
  *out = std::move(l);
  return Status::kOk;
}

Status EmbeddedServer::start(const JobLayout& layout, std::unique_ptr<EmbeddedServer>* out, const std::string& tcp_if) {
  if (g_server) {
    WEFT_WARN(kLaunch, "internal: a second embedded PMIx server in one process");
    return Status::kInternal;
  }
  std::unique_ptr<EmbeddedServer> s(new EmbeddedServer());
  s->layout_ = layout;
  s->nspace_ = "weft." + std::to_string(getpid());
  s->client_registered_.assign(layout.ranks, false);
  if (pipe2(s->pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    WEFT_WARN(kLaunch, "pipe2 failed: %s", strerror(errno));
    return Status::kSystemError;
  }
  const char* tmp = getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/weftrun.XXXXXX";
  if (!mkdtemp(templ.data())) {
    WEFT_WARN(kLaunch, "cannot create the PMIx server directory %s: %s", templ.c_str(), strerror(errno));
    return Status::kSystemError;
  }
  s->tmpdir_ = templ;
  // Data store, libpmix 4.x (what we saw with 4.2.2, see docs/bootstrap.md): "ds21" alone hangs
  // clients in PMIx_Init; "hash" forced on the ranks makes every get of a peer's data park until
  // the server's 2 s timeout. "ds21,hash" for server and ranks passed every run, SIGKILLed ranks
  // included. libpmix 5 has no ds21: keep its default there. A PMIX_MCA_gds the user set wins.
  if (pmix_major_version() == 4) setenv("PMIX_MCA_gds", "ds21,hash", 0);

  pmix_server_module_t module;
  memset(&module, 0, sizeof module);
  module.client_finalized = on_client_finalized;
  module.abort = on_abort;
  module.fence_nb = on_fence;
  module.direct_modex = on_direct_modex;
  pmix_info_t info[3];
  for (auto& i : info) PMIX_INFO_CONSTRUCT(&i);
  PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, s->tmpdir_.c_str(), PMIX_STRING);
  PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, s->tmpdir_.c_str(), PMIX_STRING);
  if (!tcp_if.empty()) PMIX_INFO_LOAD(&info[2], PMIX_TCP_IF_INCLUDE, tcp_if.c_str(), PMIX_STRING);
  g_server = s.get();
  pmix_status_t rc = PMIx_server_init(&module, info, tcp_if.empty() ? 2 : 3);
  for (auto& i : info) PMIX_INFO_DESTRUCT(&i);
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kLaunch, "PMIx_server_init failed: %s (directory %s)", PMIx_Error_string(rc), s->tmpdir_.c_str());
    return Status::kSystemError;  // the destructor removes the directory and clears g_server
  }
  s->initialized_ = true;
  WEFT_CHECK(s->register_job());
  *out = std::move(s);
  return Status::kOk;
}

Status EmbeddedServer::register_job() {
  const JobLayout& l = layout_;
  void* job = PMIx_Info_list_start();
  add_u32(job, PMIX_UNIV_SIZE, l.ranks);
  add_u32(job, PMIX_JOB_SIZE, l.ranks);
  add_u32(job, PMIX_MAX_PROCS, l.ranks);
  add_str(job, PMIX_JOBID, nspace_);
  add_u32(job, PMIX_NUM_NODES, l.nodes);
  add_u32(job, PMIX_JOB_NUM_APPS, 1);
  char* regex = nullptr;
  char* ppn = nullptr;
  std::vector<std::string> node_ranks(l.nodes);
  for (int r = 0; r < l.ranks; ++r)
    node_ranks[l.node_of[r]] += (node_ranks[l.node_of[r]].empty() ? "" : ",") + std::to_string(r);
  if (PMIx_generate_regex(join(l.hostname_of_node, ",").c_str(), &regex) != PMIX_SUCCESS ||
      PMIx_generate_ppn(join(node_ranks, ";").c_str(), &ppn) != PMIX_SUCCESS) {
    WEFT_WARN(kLaunch, "PMIx could not encode the node map %s / proc map %s", join(l.hostname_of_node, ",").c_str(),
              join(node_ranks, ";").c_str());
    PMIx_Info_list_release(job);
    return Status::kInternal;
  }
  add_str(job, PMIX_NODE_MAP, regex);
  add_str(job, PMIX_PROC_MAP, ppn);
  free(regex);
  free(ppn);
  for (int k = 0; k < l.nodes; ++k) {
    void* node = PMIx_Info_list_start();
    add_u32(node, PMIX_NODEID, k);
    add_str(node, PMIX_HOSTNAME, l.hostname_of_node[k]);
    add_u32(node, PMIX_LOCAL_SIZE, l.local_size_of[k]);
    add_u32(node, PMIX_NODE_SIZE, l.local_size_of[k]);
    add_str(node, PMIX_LOCAL_PEERS, node_ranks[k]);
    add_array(job, PMIX_NODE_INFO_ARRAY, node);
  }
  for (int r = 0; r < l.ranks; ++r) {
    void* proc = PMIx_Info_list_start();
    pmix_rank_t rank = static_cast<pmix_rank_t>(r);
    PMIx_Info_list_add(proc, PMIX_RANK, &rank, PMIX_PROC_RANK);
    add_u16(proc, PMIX_LOCAL_RANK, static_cast<uint16_t>(l.local_rank_of[r]));
    add_u16(proc, PMIX_NODE_RANK, static_cast<uint16_t>(l.local_rank_of[r]));
    add_u32(proc, PMIX_NODEID, l.node_of[r]);
    add_str(proc, PMIX_HOSTNAME, l.hostname_of_node[l.node_of[r]]);
    add_u32(proc, PMIX_APPNUM, 0);
    add_array(job, PMIX_PROC_DATA, proc);
  }
  pmix_data_array_t arr;
  PMIx_Info_list_convert(job, &arr);
  PMIx_Info_list_release(job);
  Sync sync;
  pmix_status_t rc = PMIx_server_register_nspace(nspace_.c_str(), l.ranks, static_cast<pmix_info_t*>(arr.array),
                                                 arr.size, sync_cb, &sync);
  if (rc == PMIX_SUCCESS)
    rc = sync.wait(30);
  else if (rc == PMIX_OPERATION_SUCCEEDED)
    rc = PMIX_SUCCESS;
  PMIx_Data_array_destruct(&arr);
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kLaunch, "PMIx_server_register_nspace(%s, %d ranks) failed: %s", nspace_.c_str(), l.ranks,
              PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  nspace_registered_ = true;
  return Status::kOk;
}

Status EmbeddedServer::client_env(int rank, const std::vector<std::string>& base, std::vector<std::string>* env) {
  pmix_proc_t proc;
  PMIX_PROC_CONSTRUCT(&proc);
  PMIX_LOAD_PROCID(&proc, nspace_.c_str(), static_cast<pmix_rank_t>(rank));
  Sync sync;
  pmix_status_t rc = PMIx_server_register_client(&proc, getuid(), getgid(), nullptr, sync_cb, &sync);
  if (rc == PMIX_SUCCESS)
    rc = sync.wait(30);
  else if (rc == PMIX_OPERATION_SUCCEEDED)
    rc = PMIX_SUCCESS;
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kLaunch, "PMIx_server_register_client(rank %d) failed: %s", rank, PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  client_registered_[rank] = true;
  // setup_fork appends to a malloc'd NULL-terminated array (it may realloc it).
  char** arr = static_cast<char**>(calloc(base.size() + 1, sizeof(char*)));
  for (size_t i = 0; i < base.size(); ++i) arr[i] = strdup(base[i].c_str());
  rc = PMIx_server_setup_fork(&proc, &arr);
  env->clear();
  for (char** e = arr; e && *e; ++e) {
    env->push_back(*e);
    free(*e);
  }
  free(arr);
  if (rc != PMIX_SUCCESS) {
    WEFT_WARN(kLaunch, "PMIx_server_setup_fork(rank %d) failed: %s", rank, PMIx_Error_string(rc));
    return Status::kSystemError;
  }
  return Status::kOk;
}

void EmbeddedServer::post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
  }
  char c = 1;
  (void)!write(pipe_[1], &c, 1);
}

void EmbeddedServer::run_pending() {
  char buf[256];
  while (read(pipe_[0], buf, sizeof buf) > 0) {
  }
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work.swap(work_);
  }
  for (auto& w : work) w();
}

void EmbeddedServer::record_abort(AbortRequest a) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(std::move(a));
}

bool EmbeddedServer::take_abort(AbortRequest* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborts_.empty()) return false;
  *out = aborts_.front();
  aborts_.erase(aborts_.begin());
  return true;
}

void EmbeddedServer::record_finalized(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  finalized_.insert(rank);
}

bool EmbeddedServer::finalized(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return finalized_.count(rank) != 0;
}

namespace {

// A PMIx_Notify_event in flight: libpmix reads the info array on its progress thread after the call
// returns, so the array lives here until the callback (a stack array, destructed at once, crashed
// PMIx_server_finalize later: SIGSEGV after a SIGINT stopped the ranks).
struct Notice {
  pmix_info_t info[3];
  std::atomic<int>* in_flight = nullptr;
  ~Notice() {
    for (auto& i : info) PMIX_INFO_DESTRUCT(&i);
  }
};
void notice_done(pmix_status_t, void* cbdata) {
  auto* n = static_cast<Notice*>(cbdata);
  std::atomic<int>* in_flight = n->in_flight;
  delete n;
  in_flight->fetch_sub(1);
}

}  // namespace

void EmbeddedServer::notify_rank_failed(int rank, int exit_code, const std::string& why) {
  pmix_proc_t affected;
  PMIX_PROC_CONSTRUCT(&affected);
  PMIX_LOAD_PROCID(&affected, nspace_.c_str(), static_cast<pmix_rank_t>(rank));
  auto* n = new Notice();
  for (auto& i : n->info) PMIX_INFO_CONSTRUCT(&i);
  PMIX_INFO_LOAD(&n->info[0], PMIX_EVENT_AFFECTED_PROC, &affected, PMIX_PROC);
  PMIX_INFO_LOAD(&n->info[1], PMIX_EXIT_CODE, &exit_code, PMIX_INT);
  PMIX_INFO_LOAD(&n->info[2], PMIX_EVENT_TEXT_MESSAGE, why.c_str(), PMIX_STRING);
  n->in_flight = &notices_in_flight_;
  notices_in_flight_.fetch_add(1);
  pmix_status_t rc = PMIx_Notify_event(PMIX_PROC_TERMINATED, nullptr, PMIX_RANGE_LOCAL, n->info, 3, notice_done, n);
  if (rc != PMIX_SUCCESS) {  // no callback comes: done (PMIX_OPERATION_SUCCEEDED) or refused
    if (rc != PMIX_OPERATION_SUCCEEDED)
      WEFT_INFO(kLaunch, "could not tell the ranks that rank %d failed: %s", rank, PMIx_Error_string(rc));
    notice_done(rc, n);
  }
}

EmbeddedServer::~EmbeddedServer() {
  if (initialized_) {
    run_pending();
    // Everything handed to libpmix's progress thread completes before the server is finalized
    // (bounded: a Sync whose wait timed out is left to its late callback, never freed under it).
    const auto settle = [](const char* what, const std::function<void(Sync*)>& start) {
      auto* s = new Sync();
      start(s);
      if (s->wait(2) == PMIX_ERR_TIMEOUT) {
        WEFT_INFO(kLaunch, "%s did not complete within 2 s; finalizing the PMIx server anyway", what);
        return;
      }
      delete s;
    };
    for (int r = 0; r < layout_.ranks; ++r) {
      if (!client_registered_[r]) continue;
      pmix_proc_t proc;
      PMIX_LOAD_PROCID(&proc, nspace_.c_str(), static_cast<pmix_rank_t>(r));
      settle("PMIx_server_deregister_client", [&](Sync* s) { PMIx_server_deregister_client(&proc, sync_cb, s); });
    }
    if (nspace_registered_)
      settle("PMIx_server_deregister_nspace",
             [&](Sync* s) { PMIx_server_deregister_nspace(nspace_.c_str(), sync_cb, s); });
    for (int i = 0; i < 2000 && notices_in_flight_.load() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (notices_in_flight_.load() > 0)
      WEFT_INFO(kLaunch, "%d rank-failure notices still in flight; finalizing the PMIx server anyway",
                notices_in_flight_.load());
    pmix_status_t rc = PMIx_server_finalize();
    if (rc != PMIX_SUCCESS) WEFT_INFO(kLaunch, "PMIx_server_finalize: %s", PMIx_Error_string(rc));
  }
  g_server = nullptr;
  if (pipe_[0] >= 0) close(pipe_[0]);
  if (pipe_[1] >= 0) close(pipe_[1]);
  if (!tmpdir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tmpdir_, ec);
  }
}

}  // namespace weft::launcher
