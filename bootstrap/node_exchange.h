// Node-local blob exchange through shared memory files, beside the PMIx modex (see allgather).
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "runtime/status.h"

namespace weft::bootstrap {

// Ranks on the same host publish a sealed blob per key as a file under /dev/shm (or TMPDIR), in a
// folder named after the job's namespace and its PMIx server, so two jobs never share one. A PMIx
// fence orders the writes before the reads; peers whose file is not there (other hosts) are read
// through the PMIx modex instead. This is also what makes allgather work with libpmix 5.0, whose
// collecting fence was seen to leave peers' data unavailable (docs/bootstrap.md).
class NodeExchange {
 public:
  NodeExchange() = default;
  NodeExchange(const NodeExchange&) = delete;
  NodeExchange& operator=(const NodeExchange&) = delete;
  ~NodeExchange();

  // The folder a job's ranks on one host share; `env` looks up PMIX_SERVER_URI* as the rank sees them
  // (the launcher uses it to remove the folder of a job whose ranks died before cleaning up).
  static std::string job_dir(const std::string& nspace, const char* (*env)(const char*, void*), void* ctx);

  Status init(const std::string& nspace, int rank);
  // Writes the file atomically (temporary name, then rename).
  Status publish(const std::string& key, const Blob& sealed);
  // True and the blob when `peer` published `key` on this host.
  bool fetch(const std::string& key, int peer, Blob* sealed) const;
  // Removes this rank's files for every key published before `keep` (call after a fence that
  // every reader of them has passed).
  void retire_all_but(const std::string& keep);
  // The destructor keeps the files of the last exchange (a slower peer may still be reading them)
  // and marks this rank done; the last rank of the host to finish removes the whole folder.

 private:
  std::string path(const std::string& key, int rank) const;
  std::string dir_;
  int rank_ = -1;
  std::vector<std::string> published_;
};

}  // namespace weft::bootstrap
