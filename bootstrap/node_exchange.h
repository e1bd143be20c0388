// Node-local blob exchange through shared memory files, beside the PMIx modex (see allgather).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// Ranks on the same host publish a sealed blob per key as a file under /dev/shm (or TMPDIR), in a
// folder named after this user and the job's namespace and PMIx server, so two jobs never share
// one. A PMIx fence orders the writes before the reads; peers whose file is not there (other hosts)
// are read through the PMIx modex instead. This is also what makes allgather work with libpmix 5.0,
// whose collecting fence was seen to leave peers' data unavailable (docs/bootstrap.md).
//
// Other users share /dev/shm, so nothing in it is trusted: the folder must be a real directory
// (not a symlink) owned by this user with mode 0700, or init refuses it (the caller then uses PMIx
// alone); every file is opened relative to the folder's descriptor with O_NOFOLLOW, new ones with
// O_EXCL. Each member holds a shared flock on the folder's `lock` file for as long as it uses the
// folder; the kernel drops it when the process dies, however it dies. So a folder whose lock
// nobody holds is stale (its ranks were killed): init removes this user's stale folders, and the
// last member to leave (destructor or exit()) removes its own. Age and pids are never consulted.
class NodeExchange {
 public:
  NodeExchange() = default;
  NodeExchange(const NodeExchange&) = delete;
  NodeExchange& operator=(const NodeExchange&) = delete;
  ~NodeExchange();

  // The folder a job's ranks on one host share; `env` looks up PMIX_SERVER_URI* as the rank sees them
  // (the launcher uses it to remove the folder of a job whose ranks died before cleaning up).
  // "<base>/weft-<uid>-<hash>", base /dev/shm when writable, else TMPDIR or /tmp. The hash also
  // covers the host name (`host`, "" = this process's gethostname()): ranks of one job on emulated
  // hosts that have hostnames of their own (a UTS namespace each) never share a folder, even where
  // they share /dev/shm and one PMIx server.
  static std::string job_dir(const std::string& nspace, const char* (*env)(const char*, void*), void* ctx,
                             const std::string& host = "");
  // Removes this user's exchange folders under `base` whose lock no process holds; returns how many.
  // Folders of other users, symlinks and folders in use are left alone.
  static int remove_stale(const std::string& base);

  // Joins (or creates) the job's folder. kUnsupported, with one warning, when the folder exists
  // but is not ours to use (wrong owner or mode, a symlink, not a directory).
  Status init(const std::string& nspace, int rank);
  // Writes the file atomically (a new temporary name, then rename).
  Status publish(const std::string& key, const Blob& sealed);
  // True and the blob when `peer` published `key` on this host (a regular file of ours, bounded).
  bool fetch(const std::string& key, int peer, Blob* sealed) const;
  // Removes this rank's files for every key published before `keep` (call after a fence that
  // every reader of them has passed).
  void retire_all_but(const std::string& keep);
  // Keeps the files of the last exchange (a slower peer may still be reading them) and drops this
  // rank's lock; the last member to leave removes the whole folder. Called by the destructor and,
  // for exchanges still open, at exit().
  void leave();

 private:
  std::string name(const std::string& key, int rank) const;
  Status join(int* dir_fd, int* lock_fd, std::string* why);
  std::string dir_;
  int dir_fd_ = -1;   // the folder, opened O_DIRECTORY | O_NOFOLLOW and checked
  int lock_fd_ = -1;  // its lock file, held LOCK_SH while this rank is a member
  int rank_ = -1;
  std::vector<std::string> published_;
};

}  // namespace weft::bootstrap
