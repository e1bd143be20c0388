// A Bootstrap that presents one rank group of the job as its own job, its exchanges kept to the group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/rank_group.h"

namespace weft::bootstrap {

// A parent bootstrap that can exchange among a subset of the job's ranks. `scope` names the subset
// (unique per group in the job, the same string on all its members) and keeps its keys apart from
// every other subset's; `members` are job ranks in the order `all` is filled, this rank among them.
// Every rank of the job calls it for the same `key` in the same order (the groups run the same op),
// so a parent whose synchronisation is job-wide (PMIx's fence) may rely on that; the data moved is
// the members' blobs only.
class SubsetExchange {
 public:
  virtual ~SubsetExchange() = default;
  virtual Status subset_allgather(const std::string& scope, const std::string& key, const std::vector<int>& members,
                                  const Blob& mine, std::vector<Blob>* all) = 0;
  // Returns once every member has entered it with the same tag (called like subset_allgather). The
  // default is an exchange of empty blobs; a parent whose fence spans the job anyway fences.
  virtual Status subset_barrier(const std::string& scope, const std::string& tag, const std::vector<int>& members) {
    std::vector<Blob> all;
    return subset_allgather(scope, "barrier:" + tag, members, Blob(), &all);
  }
};

// Rank group `group_position(shape, parent.info().rank).group` of the parent's job, seen as a job:
// info() is the rank's place in the group (rank, size, node, local rank, nodes) with the parent's
// hostname and the namespace "<parent nspace>/group<g>". allgather and barrier involve the group's
// members only; their keys are namespaced by the group ("group<g>/<key>").
//
// Cost: where the parent implements SubsetExchange (PmixBootstrap; the in-process test bootstrap),
// each exchange moves O(group members) blobs (PMIx still fences the whole job: its fence has no
// cheaper form under every launcher). Otherwise every exchange is one job-wide allgather under a
// key common to all groups, O(world) blobs per rank, each framed with its group and job rank: a
// rank keeps its own group's and refuses (kProtocolError) a blob that claims another place.
class GroupBootstrap final : public Bootstrap {
 public:
  // The parent must number its ranks in block placement for `shape` (placement.h checks that; this
  // re-checks the rank's own info and refuses with kInvalidArgument and a message naming it).
  static Status create(Bootstrap* parent, const GroupShape& shape, std::unique_ptr<GroupBootstrap>* out,
                       std::string* error);

  const RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) override;
  Status barrier(const std::string& tag) override;
  void abort(const std::string& why) override;  // stops the whole job (the parent's abort)
  // The parent's: a failure anywhere in the job (rank: the job's).
  bool peer_failure(int* rank, std::string* why) const override { return parent_->peer_failure(rank, why); }

  int group() const { return pos_.group; }
  const std::vector<int>& members() const { return members_; }  // job ranks, in group-rank order
  const GroupShape& shape() const { return shape_; }
  const std::string& scope() const { return scope_; }
  // True when exchanges cost O(group members) (the parent implements SubsetExchange).
  bool subset_exchange() const { return subset_ != nullptr; }

 private:
  GroupBootstrap() = default;
  Status allgather_job_wide(const std::string& key, const Blob& mine, std::vector<Blob>* all);

  Bootstrap* parent_ = nullptr;
  SubsetExchange* subset_ = nullptr;
  GroupShape shape_;
  GroupPosition pos_;
  std::vector<int> members_;
  std::string scope_;
  RankInfo info_;
};

}  // namespace weft::bootstrap
