// Implementation of node_exchange.h.
#include "bootstrap/node_exchange.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/log.h"

namespace weft::bootstrap {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string safe(const std::string& key) {
  std::string out;
  for (char c : key) out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return out;
}

}  // namespace

std::string NodeExchange::job_dir(const std::string& nspace, const char* (*env)(const char*, void*), void* ctx) {
  // The server's URI (address, port, pid) makes the folder unique to this job's server instance.
  std::string id = nspace;
  for (const char* v : {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2"})
    if (const char* u = env(v, ctx)) {
      id += u;
      break;
    }
  const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  char name[64];
  snprintf(name, sizeof name, "/weft-%016llx", static_cast<unsigned long long>(fnv1a(id)));
  return std::string(base) + name;
}

Status NodeExchange::init(const std::string& nspace, int rank) {
  rank_ = rank;
  dir_ = job_dir(
      nspace, [](const char* name, void*) -> const char* { return getenv(name); }, nullptr);
  if (mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    WEFT_WARN(kBoot, "rank %d: cannot create %s for the node-local exchange: %s", rank, dir_.c_str(), strerror(errno));
    dir_.clear();
    return Status::kSystemError;
  }
  // Membership marker: the folder goes once every member has marked itself done (~NodeExchange).
  std::string member = dir_ + "/@member." + std::to_string(rank);  // keys never contain '@' (safe())
  int fd = open(member.c_str(), O_WRONLY | O_CREAT, 0600);
  if (fd < 0) {
    WEFT_WARN(kBoot, "rank %d: cannot create %s: %s", rank, member.c_str(), strerror(errno));
    dir_.clear();
    return Status::kSystemError;
  }
  close(fd);
  return Status::kOk;
}

std::string NodeExchange::path(const std::string& key, int rank) const {
  return dir_ + "/" + safe(key) + "." + std::to_string(rank);
}

Status NodeExchange::publish(const std::string& key, const Blob& sealed) {
  const std::string final_path = path(key, rank_), tmp = final_path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  bool ok = fd >= 0;
  size_t done = 0;
  while (ok && done < sealed.size()) {
    ssize_t n = write(fd, sealed.data() + done, sealed.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += size_t(n);
  }
  if (fd >= 0) ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) {
    WEFT_WARN(kBoot, "rank %d: cannot write %s: %s", rank_, final_path.c_str(), strerror(errno));
    unlink(tmp.c_str());
    return Status::kSystemError;
  }
  published_.push_back(key);
  return Status::kOk;
}

bool NodeExchange::fetch(const std::string& key, int peer, Blob* sealed) const {
  FILE* f = fopen(path(key, peer).c_str(), "rb");
  if (!f) return false;
  sealed->clear();
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) sealed->insert(sealed->end(), buf, buf + n);
  fclose(f);
  return true;
}

void NodeExchange::retire_all_but(const std::string& keep) {
  std::vector<std::string> still;
  for (const auto& k : published_) {
    if (k == keep)
      still.push_back(k);
    else
      unlink(path(k, rank_).c_str());
  }
  published_.swap(still);
}

NodeExchange::~NodeExchange() {
  if (dir_.empty()) return;
  // Deleting this rank's last files here raced with slower peers still reading them (they then fell
  // back to a PMIx get of an exited rank's data, which does not answer on libpmix 4's hash store).
  // Mark done instead; whoever sees every member done removes the folder.
  std::string done = dir_ + "/@done." + std::to_string(rank_);
  int fd = open(done.c_str(), O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) close(fd);
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  int members = 0, finished = 0;
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    members += n.rfind("@member.", 0) == 0;
    finished += n.rfind("@done.", 0) == 0;
    names.push_back(n);
  }
  closedir(d);
  if (finished < members) return;
  for (const auto& n : names) unlink((dir_ + "/" + n).c_str());
  rmdir(dir_.c_str());
}

}  // namespace weft::bootstrap
